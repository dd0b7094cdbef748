//! The hand-off, the gcsfuse drop-in's default (issue #34), through GKE's real sidecar mounter
//! (gcs-fuse-csi-driver v1.24.4, uid 65534, no capabilities, the fd over its socket) and the
//! real gcsfuse v3.11.2 on fake-gcs-server: drainfs starts gcsfuse on the kernel's `/dev/fd/N`
//! untouched, is not in the data path, and ends gcsfuse once its I/O counters stood still for
//! the idle window after the sidecar mounter's SIGTERM. And the relay, opted into per volume
//! through the mount option `drainfs-mode=relay` (argv) or `drainfs-mode:relay` (config file).
//!
//! Keyed on state only: exit statuses (as the sidecar mounter reported them through
//! `fake-node-driver`), the volume's error file, the objects read back from the server, the
//! summary's fields, `/proc`. Every file whose `close()` returned 0 must be complete in the
//! bucket.

use std::path::Path;
use std::time::{Duration, Instant};

use fuse_tests::csi::{CsiEnding, CsiSidecar, Gcsfuse, Stop};
use fuse_tests::driver::sidecar_dir;
use fuse_tests::fileops::{pattern, write_file};
use fuse_tests::harness::scratch_dir;
use fuse_tests::holder::Holder;
use fuse_tests::lowers::{Kind, Object, Server, object_of};
use fuse_tests::process::Proc;
use fuse_tests::process::{cmdline, pid_exists, proc_status_field};
use fuse_tests::wait::{read_json, summary_at, wait_until};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The drop-in with no mode option: the hand-off.
fn dropin() -> Gcsfuse {
    Gcsfuse::DropIn(Vec::new())
}

/// The drop-in's default idle window.
const IDLE_WINDOW: Duration = Duration::from_millis(500);

/// The longest gcsfuse's last exchange can keep it from counting as idle: a tie (its answer in
/// the request's 4 ms timestamp step, common on loopback) is held 2 s in all.
const TIE_PROTECT: Duration = Duration::from_secs(2);

/// Asserts that each `(key, object)` whose close returned 0 is complete in the bucket.
fn assert_in_bucket(server: &Server, closed: &[(&str, &Object)]) {
    let objects = server.objects();
    for (key, want) in closed {
        assert_eq!(
            objects.get(*key),
            Some(*want),
            "{key} was closed with 0 but is not complete in the bucket: {objects:#?}"
        );
    }
}

/// How many open `/dev/fuse` fds process `pid` holds.
fn dev_fuse_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == Path::new("/dev/fuse")))
                .count()
        })
        .unwrap_or(0)
}

/// Whether process `pid` holds an open `/dev/fuse`.
fn holds_dev_fuse(pid: i32) -> bool {
    dev_fuse_fds(pid) > 0
}

/// The stop of a hand-off with gcsfuse idle, as the sidecar mounter must see it: drainfs ended
/// by SIGTERM ("gcsfuse was terminated"), nothing in the error file (drainfs writes nothing
/// on stderr; an exit 0 after the cancel would have been "context canceled"), no SIGKILL.
fn assert_clean_handoff_stop(e: &CsiEnding) {
    assert_eq!(e.code, Some(0), "{e}");
    assert!(!e.sigkill_sent, "{e}");
    assert_eq!(e.gcsfuse_exit, "signal SIGTERM", "{e}");
    assert!(e.error_lines.is_empty(), "{e}");
}

/// The drop-in runs the hand-off by default: drainfs is the sidecar mounter's child and
/// gcsfuse's parent, both unprivileged; gcsfuse gets the sidecar mounter's argv (the kernel's
/// `/dev/fd/3` last) and holds the connection, drainfs no longer does. A native stop with
/// gcsfuse idle for longer than the idle window ends everything within a fraction of a second
/// (stock gcsfuse: the sidecar mounter's SIGKILL at 5 s), with every closed file in the bucket,
/// the summary `idle`, and nothing on stderr.
#[test]
fn handoff_is_the_default_and_an_idle_native_stop_exits_fast() {
    let server = Server::start(Kind::Gcsfuse);
    let debug = vec![(
        "DRAINFS_LOG_LEVEL".to_string(),
        "info,drainfs=debug".to_string(),
    )];
    let mut s = CsiSidecar::start(&server, Gcsfuse::DropIn(debug), Stop::Native, &[]);
    let (drainfs, gcsfuse) = (s.child_pid(), s.gcsfuse_pid());
    assert_ne!(drainfs, gcsfuse, "drainfs must run gcsfuse");
    assert_eq!(
        proc_status_field(gcsfuse, "PPid").unwrap(),
        drainfs.to_string()
    );
    for pid in [s.mounter_pid(), drainfs, gcsfuse] {
        assert_eq!(
            proc_status_field(pid, "Uid").unwrap(),
            "65534\t65534\t65534\t65534"
        );
        assert_eq!(
            proc_status_field(pid, "CapEff").unwrap(),
            "0000000000000000"
        );
    }
    assert!(
        holds_dev_fuse(gcsfuse),
        "gcsfuse does not hold the connection"
    );
    assert!(
        !holds_dev_fuse(drainfs),
        "drainfs kept its copy of the connection: {:?}",
        std::fs::read_dir(format!("/proc/{drainfs}/fd"))
            .unwrap()
            .flatten()
            .map(|e| (e.file_name(), std::fs::read_link(e.path())))
            .collect::<Vec<_>>()
    );
    let argv = cmdline(gcsfuse);
    assert_eq!(
        argv.last().map(String::as_str),
        Some("/dev/fd/3"),
        "{argv:?}"
    );
    assert!(argv.iter().any(|a| a == "--foreground"), "{argv:?}");
    assert!(!argv.iter().any(|a| a.contains("drainfs-mode")), "{argv:?}");
    let a = pattern(3 << 20, 21);
    write_file(&s.path("a.bin"), &a).unwrap();
    std::fs::create_dir(s.path("dir")).unwrap();
    write_file(&s.path("dir/b.txt"), b"b").unwrap();
    // gcsfuse idle for longer than the window, and a tie's hold, before the stop (a Job that
    // ended a while ago).
    std::thread::sleep(TIE_PROTECT + Duration::from_millis(500));
    let e = s.stop(Duration::from_secs(20));
    eprintln!("handoff, idle native stop: {e}");
    assert_clean_handoff_stop(&e);
    let ms = e.ms_after_stop.unwrap();
    assert!(ms < 1500, "the stop took {ms} ms: {e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["data_path"], "handoff", "{summary:#}");
    assert_eq!(summary["outcome"], "idle", "{summary:#}");
    assert_eq!(summary["exit_code"], 0, "{summary:#}");
    assert_eq!(summary["idle"], true, "{summary:#}");
    assert_eq!(summary["ends_by_signal"], "SIGTERM", "{summary:#}");
    assert_eq!(summary["cause"]["cause"], "sigterm", "{summary:#}");
    assert!(
        summary["still_ms"].as_u64().unwrap() >= IDLE_WINDOW.as_millis() as u64,
        "{summary:#}"
    );
    assert!(summary.get("counts").is_none(), "{summary:#}");
    assert_in_bucket(
        &server,
        &[("a.bin", &object_of(&a)), ("dir/b.txt", &object_of(b"b"))],
    );
    s.assert_nothing_left();
}

/// A stop right after the workload's last close: gcsfuse's counters moved a moment ago, so
/// drainfs waits until they have stood still for the idle window (less the time already
/// still; when the last exchange was a tie, 2 s after it), and no longer: still idle, clean,
/// and well before the sidecar mounter's 5 s.
#[test]
fn handoff_stop_right_after_the_last_close_waits_out_the_window() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, dropin(), Stop::Native, &[]);
    let a = pattern(8 << 20, 22);
    write_file(&s.path("a.bin"), &a).unwrap();
    let e = s.stop(Duration::from_secs(20));
    eprintln!("handoff, stop right after the last close: {e}");
    assert_clean_handoff_stop(&e);
    let ms = e.ms_after_stop.unwrap();
    let window = IDLE_WINDOW.as_millis() as u64;
    assert!(
        (window - 400..4500).contains(&ms),
        "the stop took {ms} ms: {e}"
    );
    let summary = summary_at(&s.summary);
    assert_eq!(summary["outcome"], "idle", "{summary:#}");
    assert_in_bucket(&server, &[("a.bin", &object_of(&a))]);
    s.assert_nothing_left();
}

/// The case the idle window is for: the stop comes while a large file's `close()` is still
/// uploading inside gcsfuse's FLUSH (a workload SIGKILLed in `close()` when the grace period
/// ran out looks the same to gcsfuse). The upload moves gcsfuse's counters, and while the
/// server commits the object its connection waits for the answer: drainfs waits for it (it
/// sees gcsfuse idle only after the close returned), the close returns 0 and the object is
/// complete. The stop is clean (`idle`) when the close and the window fit before the sidecar
/// mounter's SIGKILL at 5 s; a close returning later than that less 2 s (a tie's protection) is left, as
/// under the stock sidecar, to that SIGKILL (the object complete all the same), and the
/// termination log keeps drainfs's provisional summary (75): accepted here and printed.
#[test]
fn handoff_stop_during_a_large_close_waits_for_the_upload() {
    let server = Server::start(Kind::Gcsfuse);
    let (_tl, log, env) = termination_log();
    let mut s = CsiSidecar::start(&server, Gcsfuse::DropIn(env), Stop::Native, &[]);
    let mut w = Holder::open(&s.path("large.bin"));
    w.cmd("write 100663296 23").unwrap();
    w.send("close");
    let t0 = Instant::now();
    kill(Pid::from_raw(s.mounter_pid()), Signal::SIGTERM).unwrap();
    let closed = w.reply_within(Duration::from_secs(30));
    let close_ms = t0.elapsed().as_millis();
    assert_eq!(closed, Some(Ok(())), "close of the large file");
    let e = s.wait(Duration::from_secs(20));
    eprintln!(
        "handoff, stop during a 96 MiB close: close returned {close_ms} ms after the SIGTERM; {e}"
    );
    assert!(!e.sigkill_sent, "{e}");
    if e.gcsfuse_exit == "signal SIGKILL" {
        eprintln!(
            "the close returned {close_ms} ms after the stop: too late for the window to fit before the sidecar mounter's SIGKILL"
        );
        assert!(
            close_ms + TIE_PROTECT.as_millis() > 5000 - 100,
            "SIGKILLed at 5 s, although the close returned at {close_ms} ms"
        );
        let t = summary_at(&log);
        assert_eq!(
            (&t["outcome"], &t["exit_code"]),
            (&"stopping".into(), &75.into()),
            "{t:#}"
        );
    } else {
        assert_clean_handoff_stop(&e);
        let summary = summary_at(&s.summary);
        assert_eq!(summary["outcome"], "idle", "{summary:#}");
        let idle_ms = summary["timings"]["idle_ms"].as_u64().unwrap();
        assert!(
            u128::from(idle_ms) >= close_ms,
            "idle at {idle_ms} ms, before the close returned ({close_ms} ms): {summary:#}"
        );
    }
    assert_in_bucket(&server, &[("large.bin", &w.written)]);
    s.assert_nothing_left();
}

/// gcsfuse SIGKILLed (no stop): drainfs ends by the same signal, so the sidecar mounter reports
/// "gcsfuse was killed" as for gcsfuse itself; the summary says gcsfuse ended by itself.
#[test]
fn handoff_gcsfuse_killed_ends_drainfs_by_the_same_signal() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, dropin(), Stop::Native, &[]);
    kill(Pid::from_raw(s.gcsfuse_pid()), Signal::SIGKILL).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || !pid_exists(s.child_pid())),
        "drainfs did not end after gcsfuse's death"
    );
    let e = s.stop(Duration::from_secs(30));
    eprintln!("handoff, gcsfuse SIGKILLed: {e}");
    assert!(!e.sigkill_sent, "{e}");
    assert_eq!(e.gcsfuse_exit, "signal SIGKILL", "{e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["outcome"], "gcsfuse_exited", "{summary:#}");
    assert_eq!(summary["gcsfuse_exit"], "signal SIGKILL", "{summary:#}");
    assert_eq!(summary["ends_by_signal"], "SIGKILL", "{summary:#}");
    assert_eq!(summary["cause"]["cause"], "lower_died", "{summary:#}");
    s.assert_nothing_left();
}

/// gcsfuse exiting by itself with a status (0 here: its mount was detached, the end of its
/// connection): drainfs exits with the same status, so the sidecar mounter says "exited
/// normally", as for gcsfuse itself.
#[test]
fn handoff_gcsfuse_exit_status_is_drainfs_exit_status() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, dropin(), Stop::Native, &[]);
    nix::mount::umount2(&s.mnt, nix::mount::MntFlags::MNT_DETACH).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || !pid_exists(s.child_pid())),
        "drainfs did not end after gcsfuse's exit"
    );
    let e = s.stop(Duration::from_secs(30));
    eprintln!("handoff, gcsfuse exited by itself: {e}");
    assert_eq!(e.gcsfuse_exit, "0", "{e}");
    assert!(e.error_lines.is_empty(), "{e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["outcome"], "gcsfuse_exited", "{summary:#}");
    assert_eq!(summary["gcsfuse_exit"], "exit 0", "{summary:#}");
    assert_eq!(summary["exit_code"], 0, "{summary:#}");
    s.assert_nothing_left();
}

/// drainfs SIGKILLed (what the sidecar mounter's own SIGKILL at 5 s does): gcsfuse dies with
/// it (PR_SET_PDEATHSIG), so no gcsfuse is left holding the sidecar's stderr pipe.
#[test]
fn handoff_gcsfuse_does_not_outlive_a_sigkilled_drainfs() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, dropin(), Stop::Native, &[]);
    let gcsfuse = s.gcsfuse_pid();
    kill(Pid::from_raw(s.child_pid()), Signal::SIGKILL).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || !pid_exists(gcsfuse)),
        "gcsfuse outlived drainfs"
    );
    let e = s.stop(Duration::from_secs(30));
    eprintln!("handoff, drainfs SIGKILLed: {e}");
    assert_eq!(e.gcsfuse_exit, "signal SIGKILL", "{e}");
    s.assert_nothing_left();
}

/// The relay is opted into per volume through a mount option, in either of the forms GKE's
/// sidecar mounter carries: `drainfs-mode=relay` (an argv flag) and `drainfs-mode:relay` (a
/// key of the config file it writes). drainfs consumes it: gcsfuse's argv and the config file
/// gcsfuse reads lack it (gcsfuse would refuse the mount otherwise), and the stop is the
/// relay's (its summary, `clean`). gcsfuse holds no copy of the kernel's connection (it held
/// the sidecar mounter's leaked fd 9 before).
#[test]
fn relay_opt_in_through_the_mount_option_in_argv_or_config_file() {
    for option in ["drainfs-mode=relay", "drainfs-mode:relay"] {
        let server = Server::start(Kind::Gcsfuse);
        let mut s = CsiSidecar::start(&server, dropin(), Stop::Native, &[option]);
        let argv = cmdline(s.gcsfuse_pid());
        assert!(!argv.iter().any(|a| a.contains("drainfs-mode")), "{argv:?}");
        // The relay holds the connection once; gcsfuse only its socket (the sidecar
        // mounter's leaked copy, fd 9, is closed before gcsfuse starts).
        assert_eq!(dev_fuse_fds(s.child_pid()), 1, "{option}");
        assert_eq!(dev_fuse_fds(s.gcsfuse_pid()), 0, "{option}");
        let config = argv
            .iter()
            .find_map(|a| a.strip_prefix("--config-file="))
            .expect("gcsfuse has a --config-file");
        let text = std::fs::read_to_string(config).unwrap();
        assert!(!text.contains("drainfs-mode"), "{option}: {config}: {text}");
        assert!(text.contains("logging"), "{option}: {config}: {text}");
        let a = pattern(2 << 20, 24);
        write_file(&s.path("a.bin"), &a).unwrap();
        let e = s.stop(Duration::from_secs(20));
        eprintln!("relay by {option}: {e}");
        assert_eq!(e.code, Some(0), "{e}");
        assert_eq!(e.gcsfuse_exit, "signal SIGTERM", "{e}");
        assert!(e.error_lines.is_empty(), "{e}");
        let summary = summary_at(&s.summary);
        assert_eq!(summary["data_path"], "relay", "{option}: {summary:#}");
        assert_eq!(summary["outcome"], "clean", "{option}: {summary:#}");
        assert_in_bucket(&server, &[("a.bin", &object_of(&a))]);
        s.assert_nothing_left();
    }
}

/// An unknown mode is a usage error: the drop-in exits 2 before starting gcsfuse, its message
/// reaches the volume's error file (the node driver's mount error), and the mount never serves.
/// The same option on the stock gcsfuse (a rollback that left it set) fails the mount too.
#[test]
fn an_unknown_mode_or_the_option_on_stock_gcsfuse_fails_the_mount() {
    for (gcsfuse, option, want) in [
        (dropin(), "drainfs-mode=fast", "exit status 2"),
        (Gcsfuse::Stock, "drainfs-mode=relay", "exit status 1"),
    ] {
        let server = Server::start(Kind::Gcsfuse);
        let mut s = CsiSidecar::spawn(&server, gcsfuse.clone(), Stop::Native, &[option]);
        let failed = wait_until(Duration::from_secs(30), || {
            s.error_file().iter().any(|l| l.contains(want))
        });
        assert!(
            failed,
            "{gcsfuse:?} {option}: error file {:?}",
            s.error_file()
        );
        let lines = s.error_file();
        let e = s.stop(Duration::from_secs(30));
        eprintln!("{gcsfuse:?} with {option}: {e}; error file {lines:?}");
        assert_eq!(e.gcsfuse_exit, want, "{e}");
        if gcsfuse.is_dropin() {
            assert!(
                lines.iter().any(|l| l.contains("drainfs-mode=fast")),
                "{lines:?}"
            );
        }
    }
}

/// Regular-container mode: the exit file stops the sidecar mounter (it polls every 5 s), which
/// SIGTERMs drainfs; gcsfuse idle, the stop is the same clean one.
#[test]
fn handoff_exit_file_mode() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, dropin(), Stop::ExitFile, &[]);
    let a = pattern(3 << 20, 25);
    write_file(&s.path("a.bin"), &a).unwrap();
    let e = s.stop(Duration::from_secs(30));
    eprintln!("handoff, exit file: {e}");
    assert_clean_handoff_stop(&e);
    // The sidecar mounter polls the exit file every 5 s.
    assert!(e.ms_after_stop.unwrap() < 9000, "{e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["outcome"], "idle", "{summary:#}");
    assert_in_bucket(&server, &[("a.bin", &object_of(&a))]);
    s.assert_nothing_left();
}

/// A termination log the sidecar (uid 65534) can write, in a scratch directory (kept while
/// the first value lives), and the drop-in's environment that names it.
fn termination_log() -> (tempfile::TempDir, std::path::PathBuf, Vec<(String, String)>) {
    let dir = scratch_dir("/tmp", "drainfs-tl-");
    sidecar_dir(dir.path());
    let log = dir.path().join("termination-log");
    let env = vec![(
        "DRAINFS_TERMINATION_LOG".to_string(),
        log.display().to_string(),
    )];
    (dir, log, env)
}

/// A writer that never stops (python3, writing 64 KiB at a time until killed) on `path`.
fn endless_writer(path: &Path) -> Proc {
    let mut cmd = std::process::Command::new("python3");
    cmd.arg("-c")
        .arg("import os,sys\nfd=os.open(sys.argv[1],os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o644)\nb=b'x'*65536\nwhile True: os.write(fd,b)")
        .arg(path);
    Proc::spawn(cmd)
}

/// Two volumes (one drop-in each) stopped together, sharing one termination log, as in a
/// pod: one idle, one whose gcsfuse keeps doing I/O (a writer that never stops). The busy one
/// is not cut short: drainfs leaves gcsfuse to the sidecar mounter's SIGKILL 5 s after its
/// SIGTERM, as the stock sidecar does, and gcsfuse dies with drainfs. Its provisional summary
/// (`stopping`, 75: an upload may have been cut) stays in the termination log, whatever the
/// idle one wrote (a clean summary never hides another volume's stop that is not clean); the
/// idle one stops clean.
#[test]
fn handoff_busy_until_the_sidecar_mounters_sigkill_leaves_75_in_the_shared_termination_log() {
    let (_shared, log, env) = termination_log();
    let server = Server::start(Kind::Gcsfuse);
    let mut idle = CsiSidecar::start(&server, Gcsfuse::DropIn(env.clone()), Stop::Native, &[]);
    let mut busy = CsiSidecar::start(&server, Gcsfuse::DropIn(env), Stop::Native, &[]);
    let busy_pid = busy.child_pid();
    let writer = endless_writer(&busy.path("endless.bin"));
    std::thread::sleep(TIE_PROTECT + Duration::from_millis(500));
    let t0 = Instant::now();
    kill(Pid::from_raw(idle.mounter_pid()), Signal::SIGTERM).unwrap();
    kill(Pid::from_raw(busy.mounter_pid()), Signal::SIGTERM).unwrap();
    // While the busy one waits, the log shows its provisional summary, whatever the idle one
    // wrote meanwhile.
    let provisional = wait_until(Duration::from_secs(4), || {
        read_json(&log).is_ok_and(|t| t["outcome"] == "stopping" && t["pid"] == busy_pid)
    });
    assert!(
        provisional,
        "no provisional summary of the busy volume: {:?}",
        read_json(&log)
    );
    let (ei, eb) = (
        idle.wait(Duration::from_secs(20)),
        busy.wait(Duration::from_secs(20)),
    );
    let took = t0.elapsed();
    drop(writer);
    eprintln!("handoff, two volumes: idle {ei}; busy {eb}; {took:?}");
    assert_clean_handoff_stop(&ei);
    assert!(!eb.sigkill_sent, "{eb}");
    assert_eq!(eb.gcsfuse_exit, "signal SIGKILL", "{eb}");
    assert!(
        took >= Duration::from_millis(4900) && took < Duration::from_secs(8),
        "{took:?}"
    );
    assert!(
        !busy.summary.exists(),
        "the busy drainfs was SIGKILLed, yet wrote a final summary"
    );
    let i = summary_at(&idle.summary);
    assert_eq!(i["outcome"], "idle", "{i:#}");
    let t = summary_at(&log);
    assert_eq!(t["data_path"], "handoff", "{t:#}");
    assert_eq!(t["outcome"], "stopping", "{t:#}");
    assert_eq!(t["exit_code"], 75, "{t:#}");
    assert_eq!(t["pid"], busy_pid, "{t:#}");
    idle.assert_nothing_left();
    busy.assert_nothing_left();
}

/// GKE's shared-mount mode: the mount point is a directory, not `/dev/fd/N`, so there is no
/// connection to hand off: the drop-in execs the real gcsfuse (same pid, drainfs's options
/// removed), which mounts the directory itself and serves it.
#[test]
fn a_directory_mount_point_execs_gcsfuse() {
    let server = Server::start(Kind::Gcsfuse);
    let dir = scratch_dir("/tmp", "drainfs-shared-");
    let (mnt, dropin) = (dir.path().join("mnt"), dir.path().join("gcsfuse"));
    std::fs::create_dir(&mnt).unwrap();
    fuse_tests::bound::own_dir(&mnt);
    // Dropped after the process: whatever happened, no mount is left behind.
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            fuse_tests::mounts::force_unmount(&self.0);
        }
    }
    let _unmount = Unmount(mnt.clone());
    std::os::unix::fs::symlink(fuse_tests::harness::bin("drainfs"), &dropin).unwrap();
    let argv = server.mount_cmd_with(&mnt, &["--drainfs-mode=relay"]);
    let mut cmd = std::process::Command::new(&dropin);
    cmd.args(&argv[1..]).env("DRAINFS_REAL_GCSFUSE", &argv[0]);
    let mut p = Proc::spawn(cmd);
    assert!(
        wait_until(Duration::from_secs(30), || fuse_tests::mounts::is_mounted(
            &mnt
        )),
        "gcsfuse did not mount {}: {}",
        mnt.display(),
        p.stderr_text()
    );
    let exe = std::fs::read_link(format!("/proc/{}/exe", p.pid())).unwrap();
    assert_eq!(exe, std::fs::canonicalize(&argv[0]).unwrap(), "not exec'ed");
    assert!(!cmdline(p.pid()).iter().any(|a| a.contains("drainfs-mode")));
    let a = pattern(1 << 20, 26);
    write_file(&mnt.join("a.bin"), &a).unwrap();
    assert_in_bucket(&server, &[("a.bin", &object_of(&a))]);
    nix::mount::umount(&mnt).unwrap();
    let st = p.wait_exit(Duration::from_secs(30), "gcsfuse");
    assert_eq!(st.code(), Some(0), "{st}");
}

/// A second SIGTERM while gcsfuse is busy (a writer that never stops) ends it at once (SIGKILL),
/// not at the sidecar mounter's SIGKILL: `forced`, 75.
#[test]
fn handoff_second_signal_while_busy_is_75_at_once() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, dropin(), Stop::Native, &[]);
    let writer = endless_writer(&s.path("endless.bin"));
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    kill(Pid::from_raw(s.mounter_pid()), Signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    kill(Pid::from_raw(s.child_pid()), Signal::SIGTERM).unwrap();
    let e = s.wait(Duration::from_secs(20));
    let took = t0.elapsed();
    drop(writer);
    eprintln!("handoff, second signal while busy: {e}; {took:?}");
    assert_eq!(e.gcsfuse_exit, "exit status 75", "{e}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["outcome"], "forced", "{summary:#}");
    assert_eq!(summary["exit_code"], 75, "{summary:#}");
    s.assert_nothing_left();
}

/// The server stalls (fake-gcs-server SIGSTOPped) while a `close()` waits for its answer,
/// longer than the idle window (1 s here, by the mount option `drainfs-idle-window=1s`): no
/// counter of gcsfuse moves, but its connection has sent the request and received nothing
/// since, so drainfs does not take it for idle. The server resumes, the close returns 0, the
/// object is complete, and only then is gcsfuse idle.
#[test]
fn handoff_a_server_stall_longer_than_the_window_is_not_idle() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, dropin(), Stop::Native, &["drainfs-idle-window=1s"]);
    let mut w = Holder::open(&s.path("stalled.bin"));
    w.cmd("write 8388608 27").unwrap();
    let stopped = fuse_tests::holder::Stopped::stop(&server);
    w.send("close");
    let t0 = Instant::now();
    kill(Pid::from_raw(s.mounter_pid()), Signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_millis(2000));
    assert!(
        pid_exists(s.gcsfuse_pid()),
        "gcsfuse was ended during the stall"
    );
    drop(stopped);
    let closed = w.reply_within(Duration::from_secs(20));
    let close_ms = t0.elapsed().as_millis();
    assert_eq!(closed, Some(Ok(())), "close after the stall");
    let e = s.wait(Duration::from_secs(20));
    eprintln!(
        "handoff, a 2 s server stall in a close: close returned {close_ms} ms after the SIGTERM; {e}"
    );
    assert_clean_handoff_stop(&e);
    let summary = summary_at(&s.summary);
    assert_eq!(summary["outcome"], "idle", "{summary:#}");
    assert_eq!(summary["idle_window_ms"], 1000, "{summary:#}");
    let idle_ms = summary["timings"]["idle_ms"].as_u64().unwrap();
    assert!(u128::from(idle_ms) >= close_ms, "{summary:#}");
    assert_in_bucket(&server, &[("stalled.bin", &w.written)]);
    s.assert_nothing_left();
}

/// What stands in for gcsfuse in [`handoff_computing_without_io_is_not_idle`]: it runs the
/// real gcsfuse as its child on the same argv and kernel fd (which it closes itself), and on
/// SIGUSR1 computes for `BURN` seconds without a system call, then writes `done` into `DIR`.
const COMPUTING_STAND_IN: &str = r#"import ctypes, os, signal, subprocess, sys, time
REAL, DIR, BURN = sys.argv[1], sys.argv[2], float(sys.argv[3])
fd = int(sys.argv[-1].rsplit("/", 1)[1])
libc = ctypes.CDLL(None, use_errno=True)
child = subprocess.Popen([REAL] + sys.argv[4:], pass_fds=(fd,),
                         preexec_fn=lambda: libc.prctl(1, signal.SIGKILL))
os.close(fd)
burn = []
signal.signal(signal.SIGUSR1, lambda *a: burn.append(1))
while child.poll() is None:
    if burn:
        burn.clear()
        end = time.monotonic() + BURN
        n = 0
        while time.monotonic() < end:
            n += 1
        with open(os.path.join(DIR, "done"), "w") as f:
            f.write(str(n))
    time.sleep(0.02)
sys.exit(child.returncode)
"#;

/// gcsfuse computing without a system call (a checksum; a thread waiting for a CPU under
/// load) moves none of its I/O counters and none of its connections: drainfs sees its threads
/// run (`/proc/PID/task/*/schedstat` and `stat`) and does not take it for idle. A stand-in
/// for gcsfuse (the real one as its child) idle for longer than the window (500 ms) computes
/// for 1.5 s from 100 ms before the stop, then writes a file: drainfs ends it only after that.
#[test]
fn handoff_computing_without_io_is_not_idle() {
    let server = Server::start(Kind::Gcsfuse);
    let dir = scratch_dir("/tmp", "drainfs-burn-");
    sidecar_dir(dir.path());
    let stand_in = dir.path().join("gcsfuse-stand-in");
    let paths: serde_json::Value =
        serde_json::from_str(&fuse_tests::lowers::lowers_py(&["paths"]).unwrap()).unwrap();
    let real = paths["gcsfuse"].as_str().expect("gcsfuse is installed");
    std::fs::write(
        &stand_in,
        format!(
            "#!/bin/sh\nexec python3 -c '{}' {real} {} 1.5 \"$@\"\n",
            COMPUTING_STAND_IN.replace('\'', "'\\''"),
            dir.path().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &stand_in,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let env = vec![(
        "DRAINFS_REAL_GCSFUSE".to_string(),
        stand_in.display().to_string(),
    )];
    let mut s = CsiSidecar::start(
        &server,
        Gcsfuse::DropIn(env),
        Stop::Native,
        &["drainfs-idle-window=500ms"],
    );
    let a = pattern(1 << 20, 31);
    write_file(&s.path("a.bin"), &a).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    kill(Pid::from_raw(s.gcsfuse_pid()), Signal::SIGUSR1).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    kill(Pid::from_raw(s.mounter_pid()), Signal::SIGTERM).unwrap();
    let e = s.wait(Duration::from_secs(20));
    eprintln!("handoff, gcsfuse computing at the stop: {e}");
    assert!(
        dir.path().join("done").exists(),
        "drainfs ended gcsfuse while it computed: {e}"
    );
    assert_clean_handoff_stop(&e);
    let summary = summary_at(&s.summary);
    assert_eq!(summary["outcome"], "idle", "{summary:#}");
    assert_in_bucket(&server, &[("a.bin", &object_of(&a))]);
    s.assert_nothing_left();
}

//! The relay over the real gcsfuse (v3.11.2, on fake-gcs-server), and gcsfuse's own behaviour
//! on a `/dev/fd/N` connection, which the README relies on.
//!
//! Two arrangements, both unprivileged (uid 65534, no capabilities, 212992-byte socket
//! buffers):
//! - the node-driver stand-in (`fake-node-driver`, [`Sidecar`]) hands the connection as fd 3
//!   to gcsfuse itself (the baseline) or to `drainfs relay -- gcsfuse ... /dev/fd/3`;
//! - GKE's real sidecar mounter (gcs-fuse-csi-driver v1.24.4, [`CsiSidecar`]) gets the fd over
//!   its socket and execs gcsfuse, or drainfs as the gcsfuse drop-in with the real gcsfuse
//!   behind it.
//!
//! Invariant checked throughout: every file whose `close()` returned 0 is complete in the
//! bucket (read back from the server, never through a mount), and drainfs's exit code and
//! summary name what is not. Files that must stay open across a stop are held by a separate
//! process ([`Holder`]): any fork+exec in the test process would close a copy of the fd, and
//! each close is a FLUSH, which makes gcsfuse finalize the object.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use fuse_tests::csi::{CsiSidecar, Gcsfuse, Stop};
use fuse_tests::fileops::{StuckReader, close, names, pattern, show, write_file};
use fuse_tests::harness::wait_until;
use fuse_tests::holder::{Holder, Stopped};
use fuse_tests::lowers::{Kind, Object, Server, object_of};
use fuse_tests::mounts::Fusectl;
use fuse_tests::relay::{Daemon, Sidecar, Via, pid_exists, proc_status_field};
use fuse_tests::wait::{summary_at, summary_names};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

// ------------------------------------------------------------------------------------------
// Helpers.

/// The stock gcsfuse command on `/dev/fd/3` against `server`, with extra flags.
fn gcsfuse(server: &Server, extra: &[&str]) -> Daemon {
    Daemon::Command(server.mount_cmd_with(Path::new("/dev/fd/3"), extra))
}

/// Waits until the relay's `/status` says its door is closed: what a create refused with
/// ESHUTDOWN, or a second SIGTERM (one sent while the first is still pending is merged with
/// it), must come after; a fixed sleep after the SIGTERM is outrun by a loaded machine.
fn wait_door_closed(s: &Sidecar) {
    assert!(
        wait_until(Duration::from_secs(10), || s.status()["phase"]
            == "door_closed"),
        "the door did not close: {:#}",
        s.status()
    );
}

/// The relay with no extra options (its defaults: 5 s grace period, SIGTERM = workload gone).
fn relay() -> Via {
    Via::Relay(Vec::new())
}

/// Asserts the invariant: each `(key, object)` whose close returned 0 is in the bucket,
/// complete.
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

/// One workload over gcsfuse, one result line per step (values or the errno name); inode
/// numbers, owners and times left out.
fn script(root: &Path) -> Vec<String> {
    let d = root.join("d");
    let f = d.join("f");
    let g = d.join("g");
    let h = d.join("h");
    let big = pattern(5 << 20, 7);
    let mut out = Vec::new();
    let mut step = |name: &str, r: String| out.push(format!("{name}: {r}"));
    step("mkdir d", show(fs::create_dir(&d)));
    step("mkdir d again", show(fs::create_dir(&d)));
    step("write f", show(write_file(&f, b"hello world")));
    step("read f", show(fs::read_to_string(&f)));
    step(
        "stat f",
        show(fs::metadata(&f).map(|m| (m.is_file(), m.len(), m.mode() & 0o170000))),
    );
    step(
        "append f",
        show(
            OpenOptions::new()
                .append(true)
                .open(&f)
                .and_then(|mut x| x.write_all(b", again").and_then(|()| close(x))),
        ),
    );
    step("read f again", show(fs::read_to_string(&f)));
    step("rename f g", show(fs::rename(&f, &g)));
    step("read f after rename", show(fs::read(&f)));
    step("read g", show(fs::read_to_string(&g)));
    step("write h (5 MiB)", show(write_file(&h, &big)));
    step("read h equals", show(fs::read(&h).map(|x| x == big)));
    step(
        "fsync then write then close",
        show(File::create(d.join("s")).and_then(|mut x| {
            x.write_all(b"before fsync;")?;
            x.sync_all()?;
            x.write_all(b" after")?;
            close(x)
        })),
    );
    step("read s", show(fs::read_to_string(d.join("s"))));
    step(
        "truncate h",
        show(
            OpenOptions::new()
                .write(true)
                .open(&h)
                .and_then(|x| x.set_len(1000).and_then(|()| close(x))),
        ),
    );
    step("stat h", show(fs::metadata(&h).map(|m| m.len())));
    step(
        "symlink",
        show(std::os::unix::fs::symlink("g", d.join("link"))),
    );
    step("readlink", show(fs::read_link(d.join("link"))));
    step("readdir d", show(names(&d)));
    step("hard link", show(fs::hard_link(&g, d.join("g2"))));
    step("unlink g", show(fs::remove_file(&g)));
    step("unlink g again", show(fs::remove_file(&g)));
    step("rmdir d (not empty)", show(fs::remove_dir(&d)));
    step("open missing", show(File::open(root.join("missing"))));
    step(
        "mkdir e/x (no parent)",
        show(fs::create_dir(root.join("e/x"))),
    );
    step("readdir root", show(names(root)));
    step(
        "statfs",
        show(
            nix::sys::statvfs::statvfs(root)
                .map(|_| ())
                .map_err(io::Error::from),
        ),
    );
    out
}

/// Bucket contents keyed by name (the server's view).
fn bucket(server: &Server) -> BTreeMap<String, Object> {
    server.objects()
}

// ------------------------------------------------------------------------------------------
// gcsfuse's own behaviour on /dev/fd/N (stock gcsfuse, the connection as its fd 3).

/// SIGTERM on a `/dev/fd/N` mount is in effect ignored (gcsfuse keeps serving, a second one
/// too), and its watchdog exits 0 thirty seconds after the first; a file still open then
/// never reaches the bucket.
#[test]
fn gcsfuse_ignores_sigterm_on_dev_fd_and_its_watchdog_exits_0_after_30s() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = Sidecar::start(gcsfuse(&server, &[]), Via::Direct);
    let mut held = Holder::open(&s.path("held.bin"));
    held.cmd("write 2097152 5").unwrap();
    let daemon = Pid::from_raw(s.daemon_pid());
    let t0 = Instant::now();
    kill(daemon, Signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert!(pid_exists(daemon.as_raw()), "gcsfuse exited on SIGTERM");
    let after = pattern(300_000, 6);
    assert_eq!(
        show(write_file(&s.path("after.bin"), &after)),
        "()",
        "gcsfuse stopped serving after SIGTERM"
    );
    kill(daemon, Signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(fs::read(s.path("after.bin")).unwrap(), after);
    assert_in_bucket(&server, &[("after.bin", &object_of(&after))]);

    // The watchdog: exit 0, by itself (the driver never had to stop it), ~30 s after SIGTERM.
    let e = s.wait(Duration::from_secs(60));
    let took = t0.elapsed();
    eprintln!("gcsfuse exited {took:?} after the first SIGTERM: {e}");
    assert_eq!(e.code, Some(0), "{e}");
    assert_eq!(e.ms_after_stop, None, "{e}");
    assert!(
        (Duration::from_secs(29)..Duration::from_secs(45)).contains(&took),
        "{took:?}"
    );
    assert!(
        !bucket(&server).contains_key("held.bin"),
        "a file never closed reached the bucket"
    );
    drop(held);
    s.assert_nothing_left();
}

/// End of stream on the connection (the mount removed) is gcsfuse's clean exit 0.
#[test]
fn gcsfuse_exits_0_at_end_of_stream() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = Sidecar::start(gcsfuse(&server, &[]), Via::Direct);
    let data = pattern(100_000, 8);
    write_file(&s.path("a.bin"), &data).unwrap();
    fuse_tests::mounts::umount_when_free(&s.mnt, Duration::from_secs(10)).unwrap();
    let e = s.wait(Duration::from_secs(15));
    eprintln!("after umount: {e}");
    assert_eq!(e.code, Some(0), "{e}");
    assert_eq!(e.ms_after_stop, None, "gcsfuse did not stop by itself: {e}");
    assert_in_bucket(&server, &[("a.bin", &object_of(&data))]);
    s.assert_nothing_left();
}

/// Streaming writes (gcsfuse's default): blocks upload while the file is written, but the
/// object appears only at close; fsync neither finalizes nor creates it; a file still open
/// when gcsfuse is killed never appears.
#[test]
fn gcsfuse_streaming_writes_finalize_only_on_close_not_on_fsync() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = Sidecar::start(gcsfuse(&server, &["--write-block-size-mb=1"]), Via::Direct);
    let mut f = Holder::open(&s.path("s.bin"));
    f.cmd("write 3145728 1").unwrap();
    assert!(
        !bucket(&server).contains_key("s.bin"),
        "visible before close"
    );
    f.cmd("fsync").unwrap();
    assert!(
        !bucket(&server).contains_key("s.bin"),
        "fsync made the object appear"
    );
    f.cmd("write 1000 2").unwrap();
    f.cmd("fsync").unwrap();
    assert!(!bucket(&server).contains_key("s.bin"));
    f.cmd("write 5000 3").unwrap();
    f.cmd("close").unwrap();
    let closed = f.written.clone();
    assert_eq!(closed.size, 3_145_728 + 1000 + 5000);
    assert_in_bucket(&server, &[("s.bin", &closed)]);

    let mut open = Holder::open(&s.path("open.bin"));
    open.cmd("write 3145728 4").unwrap();
    open.cmd("fsync").unwrap();
    // The stand-in stops it as GKE does: SIGTERM (ignored), SIGKILL 5 s later.
    let e = s.stop(Duration::from_secs(20));
    assert!(e.sigkill_sent, "{e}");
    assert_eq!(e.signal.as_deref(), Some("SIGKILL"), "{e}");
    let objects = bucket(&server);
    assert!(
        !objects.contains_key("open.bin"),
        "an unclosed file reached the bucket: {objects:#?}"
    );
    assert_eq!(objects.get("s.bin"), Some(&closed));
    drop(open);
    s.assert_nothing_left();
}

// ------------------------------------------------------------------------------------------
// The relay over gcsfuse, through the node-driver stand-in.

/// The same workload gives the same results and the same bucket through the relay as on a
/// direct connection.
#[test]
fn parity_with_a_direct_connection() {
    let run = |via: Via| {
        let server = Server::start(Kind::Gcsfuse);
        let mut s = Sidecar::start(gcsfuse(&server, &[]), via);
        let lines = script(&s.mnt);
        let e = s.stop(Duration::from_secs(20));
        (lines, bucket(&server), e)
    };
    let (direct, direct_bucket, _) = run(Via::Direct);
    let (relayed, relayed_bucket, e) = run(relay());
    assert!(
        direct
            .iter()
            .any(|l| l == "read f again: \"hello world, again\""),
        "the workload itself failed on the direct connection: {direct:#?}"
    );
    for (a, b) in direct.iter().zip(&relayed) {
        assert_eq!(a, b, "direct vs relay differ");
    }
    assert_eq!(direct.len(), relayed.len());
    assert_eq!(direct_bucket, relayed_bucket, "the buckets differ");
    assert_eq!(e.code, Some(0), "relay: {e}");
    assert!(!e.sigkill_sent, "relay: {e}");
}

/// An idle stop through the relay: fast, gcsfuse exits 0 by end-of-stream (no SIGKILL),
/// drainfs exits 0, everything written is in the bucket, nothing is left.
#[test]
fn relay_stop_ends_gcsfuse_by_end_of_stream_with_exit_0() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = Sidecar::start(gcsfuse(&server, &[]), relay());
    let (relay_pid, daemon) = (s.sidecar_pid(), s.daemon_pid());
    assert_ne!(relay_pid, daemon);
    for pid in [relay_pid, daemon] {
        assert_eq!(
            proc_status_field(pid, "Uid").unwrap(),
            "65534\t65534\t65534\t65534"
        );
        assert_eq!(
            proc_status_field(pid, "CapEff").unwrap(),
            "0000000000000000"
        );
    }
    let a = pattern(40 << 20, 1);
    write_file(&s.path("a.bin"), &a).unwrap();
    assert!(fs::read(s.path("a.bin")).unwrap() == a, "read back differs");
    let e = s.stop(Duration::from_secs(20));
    eprintln!("relay stop: {e}");
    assert_eq!(e.code, Some(0), "{e}");
    assert!(!e.sigkill_sent, "{e}");
    assert!(e.ms_after_stop.unwrap() < 3000, "{e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["exit_code"], 0, "{summary:#}");
    assert_eq!(summary["lower_exit"], "exit 0", "{summary:#}");
    assert_in_bucket(&server, &[("a.bin", &object_of(&a))]);
    s.assert_nothing_left();
}

/// SIGTERM while an application is still writing: its writes on the open file keep working,
/// new creates get ESHUTDOWN, its close returns 0 and the object is complete; drainfs exits 0.
#[test]
fn relay_sigterm_with_an_app_still_writing() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = Sidecar::start(gcsfuse(&server, &[]), relay());
    let mut w = Holder::open(&s.path("w.bin"));
    w.cmd("write 4194304 1").unwrap();
    kill(Pid::from_raw(s.sidecar_pid()), Signal::SIGTERM).unwrap();
    wait_door_closed(&s);
    assert_eq!(
        show(File::create(s.path("late.bin"))),
        "ESHUTDOWN",
        "a new create while draining"
    );
    w.cmd("write 2097152 2").unwrap();
    w.cmd("close").unwrap();
    let e = s.wait(Duration::from_secs(20));
    eprintln!("after the writer closed: {e}");
    assert_eq!(e.code, Some(0), "{e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["exit_code"], 0, "{summary:#}");
    assert_eq!(summary["lower_exit"], "exit 0", "{summary:#}");
    let objects = bucket(&server);
    assert_eq!(objects.get("w.bin"), Some(&w.written), "{objects:#?}");
    assert!(!objects.contains_key("late.bin"));
    s.assert_nothing_left();
}

/// A second SIGTERM while a file is still open: drainfs stops at once with 75 and names the
/// file; the object, never closed, is not in the bucket; a file closed before is.
#[test]
fn relay_second_sigterm_is_75_and_names_the_open_file() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = Sidecar::start(gcsfuse(&server, &[]), relay());
    let done = pattern(1 << 20, 3);
    write_file(&s.path("done.bin"), &done).unwrap();
    let mut w = Holder::open(&s.path("open.bin"));
    w.cmd("write 2097152 4").unwrap();
    let relay_pid = Pid::from_raw(s.sidecar_pid());
    kill(relay_pid, Signal::SIGTERM).unwrap();
    wait_door_closed(&s);
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        pid_exists(relay_pid.as_raw()),
        "the relay did not wait for the open file"
    );
    kill(relay_pid, Signal::SIGTERM).unwrap();
    let e = s.wait(Duration::from_secs(10));
    eprintln!("after the second SIGTERM: {e}");
    assert_eq!(e.code, Some(75), "{e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["exit_code"], 75, "{summary:#}");
    assert_eq!(
        summary["open_paths"],
        serde_json::json!(["open.bin"]),
        "{summary:#}"
    );
    assert!(w.cmd("close").is_err(), "close after the forced stop");
    let objects = bucket(&server);
    assert!(!objects.contains_key("open.bin"), "{objects:#?}");
    assert_eq!(objects.get("done.bin"), Some(&object_of(&done)));
    s.assert_nothing_left();
}

/// The deadline with the bucket unreachable (fake-gcs-server SIGSTOPped while a close is
/// uploading): drainfs forces its exit before the sidecar's SIGKILL, 75, naming the file;
/// the close does not return 0.
#[test]
fn relay_deadline_with_the_server_stopped_is_75_and_names_the_file() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = Sidecar::start(gcsfuse(&server, &[]), relay());
    let mut w = Holder::open(&s.path("stuck.bin"));
    w.cmd("write 2097152 9").unwrap();
    let stopped = Stopped::stop(&server);
    w.send("close");
    assert!(
        w.reply_within(Duration::from_millis(500)).is_none(),
        "close returned with the server stopped"
    );
    let t0 = Instant::now();
    kill(Pid::from_raw(s.sidecar_pid()), Signal::SIGTERM).unwrap();
    let e = s.wait(Duration::from_secs(15));
    eprintln!("{:?} after SIGTERM: {e}", t0.elapsed());
    assert_eq!(e.code, Some(75), "{e}");
    let closed = w.reply_within(Duration::from_secs(5));
    eprintln!("close: {closed:?}");
    assert!(
        matches!(closed, Some(Err(_))),
        "close after the forced stop: {closed:?}"
    );
    let summary = summary_at(&s.summary);
    assert_eq!(summary["exit_code"], 75, "{summary:#}");
    let named = |k: &str| summary_names(&summary, k, "stuck.bin");
    assert!(
        named("open_paths") || named("failed_flushes"),
        "the summary does not name stuck.bin: {summary:#}"
    );
    drop(stopped);
    s.assert_nothing_left();
}

/// gcsfuse SIGKILLed while a file is open: drainfs reports the dead daemon (outcome
/// `lower_failed`, and it ends by SIGKILL as gcsfuse would have), the open file's close fails, and
/// nothing is left mounted.
#[test]
fn relay_gcsfuse_sigkilled_is_lower_failed_and_names_the_open_file() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = Sidecar::start(gcsfuse(&server, &[]), relay());
    let mut w = Holder::open(&s.path("w.bin"));
    w.cmd("write 2097152 2").unwrap();
    kill(Pid::from_raw(s.daemon_pid()), Signal::SIGKILL).unwrap();
    assert!(w.cmd("close").is_err(), "close after gcsfuse died");
    let exited = wait_until(Duration::from_secs(5), || s.stdout_has_status());
    let e = if exited {
        s.wait(Duration::from_secs(5))
    } else {
        s.stop(Duration::from_secs(15))
    };
    eprintln!("after gcsfuse's death: {e}");
    assert!(!e.sigkill_sent, "{e}");
    assert_eq!(e.signal.as_deref(), Some("SIGKILL"), "{e}");
    // The summary keeps exit code 69 and its outcome (the process ends by the signal), and
    // names the file: among the failed flushes when the close's FLUSH reached the relay
    // before its summary, else among the files still open (the relay ends at once once the
    // daemon is dead; a loaded machine can run the test's close after that).
    let summary = summary_at(&s.summary);
    assert_eq!(summary["outcome"], "lower_failed", "{summary:#}");
    assert_eq!(summary["exit_code"], 69, "{summary:#}");
    assert_eq!(summary["forced"], "lower_died", "{summary:#}");
    let named = |key: &str| {
        summary[key]
            .as_array()
            .is_some_and(|v| v.iter().any(|p| p == "w.bin"))
    };
    assert!(
        named("failed_flushes") || named("open_paths"),
        "{summary:#}"
    );
    assert!(!bucket(&server).contains_key("w.bin"));
    s.assert_nothing_left();
}

// ------------------------------------------------------------------------------------------
// Through GKE's real sidecar mounter.

/// The baseline: stock gcsfuse under the real sidecar mounter is SIGKILLed 5 s after the
/// SIGTERM; the sidecar mounter itself exits 0.
#[test]
fn sidecar_mounter_stock_gcsfuse_is_killed_after_5s() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, Gcsfuse::Stock, Stop::Native, &[]);
    for pid in [s.mounter_pid(), s.gcsfuse_pid()] {
        assert_eq!(
            proc_status_field(pid, "Uid").unwrap(),
            "65534\t65534\t65534\t65534"
        );
        assert_eq!(
            proc_status_field(pid, "CapEff").unwrap(),
            "0000000000000000"
        );
    }
    let data = pattern(1 << 20, 1);
    write_file(&s.path("a.bin"), &data).unwrap();
    let e = s.stop(Duration::from_secs(30));
    eprintln!("stock: {e}");
    assert_eq!(e.code, Some(0), "{e}");
    assert!(!e.sigkill_sent, "{e}");
    assert_eq!(e.gcsfuse_exit, "signal SIGKILL", "{e}");
    let ms = e.ms_after_stop.unwrap();
    assert!((4900..9000).contains(&ms), "{e}");
    assert!(e.error_lines.is_empty(), "{e}");
    assert_in_bucket(&server, &[("a.bin", &object_of(&data))]);
    s.assert_nothing_left();
}

/// drainfs as the drop-in under the real sidecar mounter, native sidecar: the SIGTERM comes
/// while an application is still writing; new creates get ESHUTDOWN, its close returns 0,
/// the object is complete, gcsfuse exits 0 by end-of-stream and the sidecar mounter exits
/// long before its 5 s SIGKILL.
#[test]
fn sidecar_mounter_relay_native_drains_a_writer_and_exits_fast() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, Gcsfuse::Relay(Vec::new()), Stop::Native, &[]);
    for pid in [s.mounter_pid(), s.child_pid(), s.gcsfuse_pid()] {
        assert_eq!(
            proc_status_field(pid, "Uid").unwrap(),
            "65534\t65534\t65534\t65534"
        );
        assert_eq!(
            proc_status_field(pid, "CapEff").unwrap(),
            "0000000000000000"
        );
    }
    assert_ne!(s.child_pid(), s.gcsfuse_pid(), "drainfs must run gcsfuse");
    let mut w = Holder::open(&s.path("w.bin"));
    w.cmd("write 4194304 1").unwrap();
    let t0 = Instant::now();
    kill(Pid::from_raw(s.mounter_pid()), Signal::SIGTERM).unwrap();
    // The create comes once drainfs's door has closed (its `/status`), not a fixed 300 ms
    // after the mounter's SIGTERM, which it passes on: a loaded machine can outrun that.
    let admin = s.admin.clone().expect("drainfs's admin server");
    assert!(
        wait_until(Duration::from_secs(4), || {
            fuse_tests::relay::http_get(&format!("{admin}/status"))
                .ok()
                .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
                .is_some_and(|v| v["phase"] == "door_closed")
        }),
        "drainfs's door did not close after the mounter's SIGTERM"
    );
    assert_eq!(show(File::create(s.path("late.bin"))), "ESHUTDOWN");
    w.cmd("write 1048576 2").unwrap();
    w.cmd("close").unwrap();
    let e = s.wait(Duration::from_secs(20));
    eprintln!(
        "relay under the sidecar mounter: {e}, {:?} after SIGTERM",
        t0.elapsed()
    );
    assert_eq!(e.code, Some(0), "{e}");
    // Drained and stopped before the sidecar mounter's SIGKILL at 5 s (which would show as
    // "signal SIGKILL" and leave no summary).
    assert!(t0.elapsed() < Duration::from_secs(5), "{e}");
    // The sidecar mounter would read a child's exit 0 after its SIGTERM as Go's "context
    // canceled" (exec.CommandContext) and write that into the error file; the drop-in ends a
    // clean stop by SIGTERM instead, which it only logs ("gcsfuse was terminated").
    assert_eq!(e.gcsfuse_exit, "signal SIGTERM", "{e}");
    assert!(e.error_lines.is_empty(), "{e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["exit_code"], 0, "{summary:#}");
    assert_eq!(summary["lower_exit"], "exit 0", "{summary:#}");
    let objects = bucket(&server);
    assert_eq!(objects.get("w.bin"), Some(&w.written), "{objects:#?}");
    assert!(!objects.contains_key("late.bin"));
    s.assert_nothing_left();
}

/// A large file (96 MiB: three of gcsfuse's 32 MiB streaming-write blocks) whose close is
/// in progress when the native sidecar's SIGTERM comes: the close returns 0, the object is
/// complete, drainfs exits 0 before the sidecar mounter's SIGKILL.
#[test]
fn sidecar_mounter_relay_large_file_closed_at_the_sigterm() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, Gcsfuse::Relay(Vec::new()), Stop::Native, &[]);
    let mut w = Holder::open(&s.path("large.bin"));
    w.cmd("write 100663296 11").unwrap();
    w.send("close");
    kill(Pid::from_raw(s.mounter_pid()), Signal::SIGTERM).unwrap();
    let closed = w.reply_within(Duration::from_secs(20));
    assert_eq!(closed, Some(Ok(())), "close of the large file");
    let e = s.wait(Duration::from_secs(20));
    eprintln!("large file closed at the SIGTERM: {e}");
    assert_eq!(e.code, Some(0), "{e}");
    assert_eq!(e.gcsfuse_exit, "signal SIGTERM", "{e}");
    assert!(e.error_lines.is_empty(), "{e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["exit_code"], 0, "{summary:#}");
    assert_in_bucket(&server, &[("large.bin", &w.written)]);
    s.assert_nothing_left();
}

/// The threads pump (`DRAINFS_PUMP=threads`) through GKE's real sidecar mounter: a 24 MiB
/// file written in 1 MiB WRITEs (split into parts by the relay) reads back whole, a large file
/// closed at the SIGTERM is drained, uploaded and the stop is clean.
#[test]
fn sidecar_mounter_relay_threads_pump_drains_a_large_file() {
    let server = Server::start(Kind::Gcsfuse);
    let pump = vec![("DRAINFS_PUMP".to_string(), "threads".to_string())];
    let mut s = CsiSidecar::start(&server, Gcsfuse::Relay(pump), Stop::Native, &[]);
    let a = pattern(24 << 20, 5);
    write_file(&s.path("a.bin"), &a).unwrap();
    assert!(fs::read(s.path("a.bin")).unwrap() == a, "read back differs");
    let mut w = Holder::open(&s.path("large.bin"));
    w.cmd("write 67108864 13").unwrap();
    w.send("close");
    kill(Pid::from_raw(s.mounter_pid()), Signal::SIGTERM).unwrap();
    let closed = w.reply_within(Duration::from_secs(20));
    assert_eq!(closed, Some(Ok(())), "close of the large file");
    let e = s.wait(Duration::from_secs(20));
    eprintln!("threads pump, large file closed at the SIGTERM: {e}");
    assert_eq!(e.code, Some(0), "{e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["exit_code"], 0, "{summary:#}");
    assert_eq!(summary["relay"]["pump"], "threads", "{summary:#}");
    assert!(
        summary["relay"]["counts"]["split_requests"]
            .as_u64()
            .unwrap()
            > 0,
        "{summary:#}"
    );
    assert_in_bucket(
        &server,
        &[("a.bin", &object_of(&a)), ("large.bin", &w.written)],
    );
    s.assert_nothing_left();
}

/// Regular-container mode: the exit file stops the sidecar mounter (it polls every 5 s), and
/// the relay behind it stops gcsfuse cleanly.
#[test]
fn sidecar_mounter_relay_exit_file_mode() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, Gcsfuse::Relay(Vec::new()), Stop::ExitFile, &[]);
    let data = pattern(3 << 20, 2);
    write_file(&s.path("a.bin"), &data).unwrap();
    let e = s.stop(Duration::from_secs(30));
    eprintln!("exit file: {e}");
    assert_eq!(e.code, Some(0), "{e}");
    assert!(!e.sigkill_sent, "{e}");
    // The sidecar mounter polls the exit file every 5 s.
    assert!(e.ms_after_stop.unwrap() < 9000, "{e}");
    assert_eq!(e.gcsfuse_exit, "signal SIGTERM", "{e}");
    assert!(e.error_lines.is_empty(), "{e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["exit_code"], 0, "{summary:#}");
    assert_eq!(summary["lower_exit"], "exit 0", "{summary:#}");
    assert!(
        !s.base.join("exit").exists(),
        "the sidecar removes the exit file"
    );
    assert_in_bucket(&server, &[("a.bin", &object_of(&data))]);
    s.assert_nothing_left();
}

/// A file still open when the native sidecar's SIGTERM comes: drainfs gives up at its own
/// deadline (before the sidecar mounter's SIGKILL at 5 s), exits 75 naming the file, and the
/// sidecar mounter records that status in the error file.
#[test]
fn sidecar_mounter_relay_open_file_at_the_deadline_is_75() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, Gcsfuse::Relay(Vec::new()), Stop::Native, &[]);
    let mut w = Holder::open(&s.path("open.bin"));
    w.cmd("write 2097152 3").unwrap();
    let e = s.stop(Duration::from_secs(30));
    eprintln!("open file at the deadline: {e}");
    assert_eq!(e.code, Some(0), "{e}");
    // drainfs's own exit status below, so the sidecar mounter did not SIGKILL it at 5 s.
    assert_eq!(e.gcsfuse_exit, "exit status 75", "{e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["exit_code"], 75, "{summary:#}");
    assert_eq!(
        summary["open_paths"],
        serde_json::json!(["open.bin"]),
        "{summary:#}"
    );
    assert!(w.cmd("close").is_err());
    assert!(!bucket(&server).contains_key("open.bin"));
    s.assert_nothing_left();
}

/// gcsfuse SIGKILLed under the real sidecar mounter, behind drainfs: drainfs ends by the same
/// signal after writing its summary, so the sidecar mounter reports "gcsfuse was killed" as it
/// would for gcsfuse itself; the open file's close fails and is named; nothing is left.
#[test]
fn sidecar_mounter_relay_gcsfuse_sigkilled() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, Gcsfuse::Relay(Vec::new()), Stop::Native, &[]);
    let mut w = Holder::open(&s.path("w.bin"));
    w.cmd("write 2097152 5").unwrap();
    kill(Pid::from_raw(s.gcsfuse_pid()), Signal::SIGKILL).unwrap();
    assert!(w.cmd("close").is_err(), "close after gcsfuse died");
    let e = s.stop(Duration::from_secs(30));
    eprintln!("gcsfuse killed under the sidecar mounter: {e}");
    assert_eq!(e.code, Some(0), "{e}");
    assert!(!e.sigkill_sent, "{e}");
    assert_eq!(e.gcsfuse_exit, "signal SIGKILL", "{e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["outcome"], "lower_failed", "{summary:#}");
    assert_eq!(
        summary["failed_flushes"],
        serde_json::json!(["w.bin"]),
        "{summary:#}"
    );
    assert!(!bucket(&server).contains_key("w.bin"));
    s.assert_nothing_left();
}

/// The deadline under the real sidecar mounter with the bucket unreachable (fake-gcs-server
/// SIGSTOPped during a close's upload): drainfs exits 75 before the sidecar mounter's SIGKILL,
/// naming the file, and the close does not return 0.
#[test]
fn sidecar_mounter_relay_deadline_with_the_server_stopped() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, Gcsfuse::Relay(Vec::new()), Stop::Native, &[]);
    let mut w = Holder::open(&s.path("stuck.bin"));
    w.cmd("write 2097152 9").unwrap();
    let stopped = Stopped::stop(&server);
    w.send("close");
    assert!(
        w.reply_within(Duration::from_millis(500)).is_none(),
        "close returned with the server stopped"
    );
    let e = s.stop(Duration::from_secs(30));
    eprintln!("deadline under the sidecar mounter: {e}");
    assert_eq!(e.code, Some(0), "{e}");
    // drainfs's own exit status below, so the sidecar mounter did not SIGKILL it at 5 s.
    assert_eq!(e.gcsfuse_exit, "exit status 75", "{e}");
    let closed = w.reply_within(Duration::from_secs(5));
    assert!(matches!(closed, Some(Err(_))), "close: {closed:?}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["exit_code"], 75, "{summary:#}");
    let named = |k: &str| summary_names(&summary, k, "stuck.bin");
    assert!(
        named("open_paths") || named("failed_flushes"),
        "the summary does not name stuck.bin: {summary:#}"
    );
    drop(stopped);
    s.assert_nothing_left();
}

/// The same workload through the real sidecar mounter, stock gcsfuse vs the relay: the same
/// results and the same bucket.
#[test]
fn sidecar_mounter_parity_stock_vs_relay() {
    let run = |g: Gcsfuse| {
        let server = Server::start(Kind::Gcsfuse);
        let mut s = CsiSidecar::start(&server, g, Stop::Native, &[]);
        let lines = script(&s.mnt);
        let e = s.stop(Duration::from_secs(30));
        s.assert_nothing_left();
        (lines, bucket(&server), e)
    };
    let (stock, stock_bucket, _) = run(Gcsfuse::Stock);
    let (relayed, relayed_bucket, e) = run(Gcsfuse::Relay(Vec::new()));
    assert!(
        stock
            .iter()
            .any(|l| l == "read f again: \"hello world, again\""),
        "the workload itself failed on stock gcsfuse: {stock:#?}"
    );
    for (a, b) in stock.iter().zip(&relayed) {
        assert_eq!(a, b, "stock vs relay differ");
    }
    assert_eq!(stock.len(), relayed.len());
    assert_eq!(stock_bucket, relayed_bucket, "the buckets differ");
    assert_eq!(e.code, Some(0), "relay: {e}");
}

/// With gcsfuse's streaming writes a successful fsync does not put the object in the bucket
/// (see `gcsfuse_streaming_writes_finalize_only_on_close_not_on_fsync`), so a connection that
/// is aborted while an fsynced file is still open loses it: the outcome must be 75 with the
/// file named, never clean.
#[test]
fn relay_abort_after_fsync_with_a_file_still_open_is_not_clean() {
    let _fusectl = Fusectl::ensure();
    let server = Server::start(Kind::Gcsfuse);
    let mut s = Sidecar::start(gcsfuse(&server, &[]), relay());
    let mut w = Holder::open(&s.path("synced.bin"));
    w.cmd("write 2097152 1").unwrap();
    w.cmd("fsync").unwrap();
    assert!(!bucket(&server).contains_key("synced.bin"));
    Fusectl::abort(&s.mnt);
    let e = s.wait(Duration::from_secs(10));
    eprintln!("after the abort: {e}");
    let objects = bucket(&server);
    assert!(!objects.contains_key("synced.bin"), "{objects:#?}");
    let summary = summary_at(&s.summary);
    assert_eq!(
        summary["failed_flushes"],
        serde_json::json!(["synced.bin"]),
        "the lost file is not named: {summary:#}"
    );
    assert_eq!(e.code, Some(75), "{e}");
    drop(w);
    s.assert_nothing_left();
}

/// Issue 17.7 over the real gcsfuse: a READ that gcsfuse cannot answer (the bucket is
/// unreachable: fake-gcs-server SIGSTOPped while the read waits for it) when the workload is
/// gone. gcsfuse waits for its in-flight ops before it exits at end-of-stream, so drainfs has to
/// SIGKILL it; with nothing written since the last successful close that loses nothing. The
/// stop ends before the sidecar's SIGKILL with outcome clean (not 75), the summary says that
/// gcsfuse was killed and that a read was cut off, and the object is intact.
#[test]
fn relay_read_stuck_in_gcsfuse_at_the_stop_is_clean() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = Sidecar::start(gcsfuse(&server, &[]), relay());
    let data = pattern(4 << 20, 17);
    write_file(&s.path("r.bin"), &data).unwrap();
    assert_in_bucket(&server, &[("r.bin", &object_of(&data))]);
    let stopped = Stopped::stop(&server);
    let reader = StuckReader::start(&s.path("r.bin"));
    // A READ in gcsfuse's hands (not the LOOKUP or OPEN before it, which gcsfuse answers from
    // its caches), still there a moment later. Other requests may be awaiting gcsfuse beside
    // it (a loaded run saw the READ in flight with the count of requests awaiting gcsfuse not
    // exactly 1 at the second look, and 1 again a moment later): at least one, not one.
    let read_in_gcsfuse = || {
        let st = s.status();
        st["relay"]["awaiting_daemon"].as_u64() >= Some(1)
            && st["in_flight_by_op"].as_array().is_some_and(|ops| {
                ops.iter()
                    .any(|o| o[0] == "read" && o[1].as_i64() > Some(0))
            })
    };
    assert!(
        wait_until(Duration::from_secs(10), read_in_gcsfuse),
        "no READ in flight in gcsfuse: {:#}",
        s.status()
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        read_in_gcsfuse(),
        "the READ did not stay in gcsfuse: {:#}",
        s.status()
    );
    let e = s.stop(Duration::from_secs(30));
    eprintln!("stop with a READ stuck in gcsfuse: {e}");
    assert!(!e.sigkill_sent, "the sidecar's SIGKILL came first: {e}");
    let summary = summary_at(&s.summary);
    assert_eq!(summary["exit_code"], 0, "{summary:#}");
    assert_eq!(summary["outcome"], "clean", "{summary:#}");
    assert_eq!(summary["forced"], "lower_sigkill", "{summary:#}");
    assert!(
        summary["notes"].as_array().is_some_and(|n| n
            .iter()
            .any(|n| n.as_str().is_some_and(|n| n.contains("read-only")))),
        "the summary does not note the cut-off read: {summary:#}"
    );
    assert!(
        e.code == Some(0) || e.signal.as_deref() == Some("SIGTERM"),
        "{e}"
    );
    assert!(reader.join().is_err(), "the cut-off READ fails");
    drop(stopped);
    assert_in_bucket(&server, &[("r.bin", &object_of(&data))]);
    s.assert_nothing_left();
}

/// The same through GKE's real sidecar mounter (v1.24.4, uid 65534, the fd over its socket):
/// a READ stuck in gcsfuse at the native sidecar's SIGTERM. drainfs SIGKILLs gcsfuse and ends
/// clean before the sidecar mounter's own SIGKILL at 5 s: the drop-in's clean stop by SIGTERM
/// ("signal SIGTERM", no error file line), summary 0 with `forced: lower_sigkill`.
#[test]
fn sidecar_mounter_relay_read_stuck_in_gcsfuse_at_the_stop_is_clean() {
    let server = Server::start(Kind::Gcsfuse);
    let mut s = CsiSidecar::start(&server, Gcsfuse::Relay(Vec::new()), Stop::Native, &[]);
    let data = pattern(4 << 20, 18);
    write_file(&s.path("r.bin"), &data).unwrap();
    assert_in_bucket(&server, &[("r.bin", &object_of(&data))]);
    let stopped = Stopped::stop(&server);
    let reader = StuckReader::start(&s.path("r.bin")).assert_stuck();
    let e = s.stop(Duration::from_secs(30));
    eprintln!("sidecar mounter, a READ stuck in gcsfuse: {e}");
    assert!(
        !e.sigkill_sent,
        "the sidecar mounter's SIGKILL came first: {e}"
    );
    assert_eq!(e.code, Some(0), "{e}");
    assert_eq!(e.gcsfuse_exit, "signal SIGTERM", "{e}");
    assert!(e.error_lines.is_empty(), "{e}");
    let summary = s.summary();
    assert_eq!(summary["exit_code"], 0, "{summary:#}");
    assert_eq!(summary["forced"], "lower_sigkill", "{summary:#}");
    assert_eq!(summary["lower_exit"], "signal SIGKILL", "{summary:#}");
    assert!(reader.join().is_err(), "the cut-off READ fails");
    drop(stopped);
    assert_in_bucket(&server, &[("r.bin", &object_of(&data))]);
    s.assert_nothing_left();
}

/// 1 MiB WRITEs and 1 MiB O_DIRECT READs through the relay over gcsfuse: the kernel keeps
/// gcsfuse's 1 MiB `max_write`, the relay splits each into parts (WRITEs one after another,
/// READs in offset order, the last one short at the end of the file), and what is read back,
/// and what is in the bucket, is what was written.
#[test]
fn large_writes_and_o_direct_reads_are_split_and_come_back_whole() {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let server = Server::start(Kind::Gcsfuse);
    let mut s = Sidecar::start(gcsfuse(&server, &[]), relay());
    let data = pattern((8 << 20) + 12_345, 7);
    let path = s.path("big.bin");
    let mut f = File::create(&path).unwrap();
    for chunk in data.chunks(1 << 20) {
        f.write_all(chunk).unwrap();
    }
    close(f).unwrap();
    // O_DIRECT needs an aligned buffer: a 4 KiB-aligned window of a larger Vec.
    let mut raw = vec![0u8; (1 << 20) + 4096];
    let skew = raw.as_ptr().align_offset(4096);
    let buf = &mut raw[skew..skew + (1 << 20)];
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .unwrap();
    let mut back = Vec::with_capacity(data.len());
    loop {
        let n = f.read(buf).unwrap();
        if n == 0 {
            break;
        }
        back.extend_from_slice(&buf[..n]);
    }
    drop(f);
    assert!(back == data, "O_DIRECT read back through the relay differs");
    let e = s.stop(Duration::from_secs(20));
    assert_eq!(e.code, Some(0), "{e}");
    let summary = summary_at(&s.summary);
    let r = &summary["relay"];
    assert_eq!(r["init"]["max_write"], 1 << 20, "{summary:#}");
    // 9 WRITEs and 9 READs of up to 1 MiB: each of the 8 full WRITEs is 3 parts (408 KiB at
    // most), each full READ 8 parts of 128 KiB.
    let split = r["counts"]["split_requests"].as_u64().unwrap();
    let parts = r["counts"]["split_parts"].as_u64().unwrap();
    assert!(split >= 16, "{summary:#}");
    assert!(parts >= 8 * 3 + 8 * 8, "{summary:#}");
    assert_eq!(r["counts"]["answered_send_failed"], 0, "{summary:#}");
    assert!(
        r["profile"]["read_sizes"]["le_1MiB"].as_u64().unwrap() >= 8,
        "{summary:#}"
    );
    assert_in_bucket(&server, &[("big.bin", &object_of(&data))]);
    s.assert_nothing_left();
}

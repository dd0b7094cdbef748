//! Real-mount smoke tests of `drainfs relay`: the test plays the node driver (opens
//! `/dev/fuse`, mounts with `fd=N`, hands fd N to `drainfs relay -- bucketfs ... /dev/fd/N`),
//! then checks data, the drain, the door, daemon death and INIT failure through the mount.
//! Socket buffers are forced to the kernel's default wmem_max (212992), as in production.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use fuse_tests::harness::{Proc, bin, force_unmount, is_mounted, make_dirs, wait_until};
use fuse_tests::mounts::Unmount;
use nix::sys::signal::Signal;

const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;

/// A mount whose connection is served by `drainfs relay`; unmounted and killed on drop.
struct RelayMount {
    dir: tempfile::TempDir,
    drainfs: Proc,
}

impl RelayMount {
    fn mnt(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
    fn bucket(&self) -> PathBuf {
        self.dir.path().join("bucket")
    }
    fn summary(&self) -> serde_json::Value {
        let t = std::fs::read_to_string(self.dir.path().join("summary.json")).expect("summary");
        serde_json::from_str(&t).expect("summary json")
    }
    fn wait_exit(&mut self, t: Duration) -> ExitStatus {
        self.drainfs.wait_timeout(t).expect("drainfs did not exit")
    }
}

impl Drop for RelayMount {
    fn drop(&mut self) {
        self.drainfs.signal(Signal::SIGKILL);
        let _ = self.drainfs.wait_timeout(Duration::from_secs(5));
        force_unmount(&self.mnt());
    }
}

fn serving(mnt: &Path) -> bool {
    nix::sys::statfs::statfs(mnt).is_ok_and(|s| s.filesystem_type().0 == FUSE_SUPER_MAGIC)
}

/// Mounts a fresh FUSE connection and starts the relay over bucketfs on it. `wait`: wait
/// until the mount answers statfs.
/// Opens /dev/fuse and mounts `mnt` with `fd=N` as the CSI node driver does. The fd is not
/// CLOEXEC: the process spawned next inherits it.
fn mount_fd(mnt: &Path) -> OwnedFd {
    let fuse: OwnedFd = nix::fcntl::open(
        "/dev/fuse",
        nix::fcntl::OFlag::O_RDWR,
        nix::sys::stat::Mode::empty(),
    )
    .expect("open /dev/fuse (run as root)");
    let n = fuse.as_raw_fd();
    nix::mount::mount(
        Some("relay-test"),
        mnt,
        Some("fuse"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(
            format!("fd={n},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions")
                .as_str(),
        ),
    )
    .expect("mount fd=N");
    fuse
}

fn start(relay_args: &[&str], bucketfs_args: &[&str], wait: bool) -> RelayMount {
    start_with(relay_args, bucketfs_args, wait, |_| {})
}

/// [`start`], with `setup` applied to drainfs's command before it is spawned.
fn start_with(
    relay_args: &[&str],
    bucketfs_args: &[&str],
    wait: bool,
    setup: impl FnOnce(&mut Command),
) -> RelayMount {
    let dir = tempfile::tempdir().unwrap();
    let [mnt, bucket] = make_dirs(dir.path(), ["mnt", "bucket"]);
    let fuse = mount_fd(&mnt);
    let n = fuse.as_raw_fd();
    let mut cmd = Command::new(bin("drainfs"));
    cmd.arg("relay").args(["--grace-period", "5s"]);
    if !relay_args.contains(&"--socket-buffer") {
        cmd.args(["--socket-buffer", "212992"]);
    }
    cmd.arg("--summary-file")
        .arg(dir.path().join("summary.json"))
        .args(relay_args)
        .arg("--")
        .arg(bin("bucketfs"))
        .arg("--bucket")
        .arg(&bucket)
        .args(bucketfs_args)
        .arg("--mountpoint")
        .arg(format!("/dev/fd/{n}"))
        .stdin(Stdio::null());
    setup(&mut cmd);
    let drainfs = Proc::spawn(cmd);
    drop(fuse);
    let m = RelayMount { dir, drainfs };
    if wait {
        assert!(
            wait_until(Duration::from_secs(10), || serving(&m.mnt())),
            "the relayed mount never answered"
        );
    }
    m
}

fn write_file(p: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(p)?;
    f.write_all(data)?;
    // close(2) sends FLUSH; bucketfs uploads on it and returns its result.
    let fd = std::os::fd::IntoRawFd::into_raw_fd(f);
    // SAFETY: `fd` was just released from the File, so it is closed exactly once here.
    if unsafe { libc::close(fd) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
fn relay_serves_data_and_stops_cleanly_on_sigterm() {
    let mut m = start(&[], &[], true);
    let data: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i % 251) as u8).collect();
    write_file(&m.mnt().join("obj.bin"), &data).unwrap();
    assert_eq!(std::fs::read(m.mnt().join("obj.bin")).unwrap(), data);
    assert_eq!(std::fs::read(m.bucket().join("obj.bin")).unwrap(), data);
    std::fs::create_dir(m.mnt().join("d")).unwrap();
    std::fs::rename(m.mnt().join("obj.bin"), m.mnt().join("d/obj2.bin")).unwrap();
    let names: Vec<_> = std::fs::read_dir(m.mnt().join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("obj2.bin")]);

    let t = Instant::now();
    m.drainfs.signal(Signal::SIGTERM);
    let st = m.wait_exit(Duration::from_secs(10));
    let took = t.elapsed();
    assert_eq!(st.code(), Some(0), "{}", m.drainfs.stderr_text());
    // Milliseconds when idle; nothing is outstanding, so anything near the deadline (4.5 s)
    // is a defect. The bound leaves room for a loaded machine, which runs the relay and
    // bucketfs's exit late.
    assert!(
        took < Duration::from_secs(3),
        "SIGTERM to exit took {took:?}"
    );
    let s = m.summary();
    assert_eq!(s["outcome"], "clean");
    assert_eq!(s["data_path"], "relay");
    assert_eq!(s["lower_exit"], "exit 0");
    let r = &s["relay"];
    // 212992 doubled by the kernel, minus 32 + 4096, in whole pages: 408 KiB; the message cap
    // defaults to 128 KiB.
    assert_eq!(r["buffer_cap"], 408 * 1024);
    assert_eq!(r["cap"], 128 * 1024);
    // The kernel keeps the daemon's 1 MiB; the relay splits what is larger than the cap.
    assert_eq!(r["kernel_cap"], 1 << 20);
    assert_eq!(r["init"]["max_write"], 1 << 20);
    assert_eq!(r["write_part"], 408 * 1024);
    assert_eq!(r["counts"]["protocol_errors"], 0);
    assert_eq!(r["counts"]["answered_send_failed"], 0);
    assert!(s["counts"]["requests"].as_u64().unwrap() > 10, "{s:#}");
}

/// Once bucketfs (its `--events` log at `events`) has begun an upload, SIGTERMs drainfs and
/// waits until its `/status` (admin server at `addr`) shows the door closed: a state, not a
/// fixed sleep, so that a signal after this one is a second signal, never merged with it.
fn sigterm_once_uploading(m: &mut RelayMount, events: &std::path::Path, addr: &str) {
    assert!(
        wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(events).is_ok_and(|t| t.contains("upload_start"))
        }),
        "the FLUSH never reached the daemon"
    );
    m.drainfs.signal(Signal::SIGTERM);
    let closed = fuse_tests::wait::wait_status(addr, Duration::from_secs(10), |v| {
        v["phase"] == "door_closed"
    });
    assert!(
        closed.is_some(),
        "the door did not close: {:?}",
        fuse_tests::wait::status_from(addr)
    );
}

/// The trigger waits for the FLUSH to reach the daemon (bucketfs's event log) and the create
/// for the door to close (`/status`), not for fixed sleeps (400 ms, then 100 ms), which a
/// loaded machine can outrun. The upload takes 3 s so that the drain still has more than the
/// 500 ms asserted below to wait when the trigger comes late.
#[test]
fn drain_waits_for_a_slow_flush_and_the_door_refuses_new_creates() {
    let events = tempfile::NamedTempFile::new().unwrap();
    let ev = events.path().display().to_string();
    let addr = format!("127.0.0.1:{}", fuse_tests::wait::free_port());
    let mut m = start(
        &["--admin-addr", &addr],
        &["--upload-delay", "3s", "--events", &ev],
        true,
    );
    let p = m.mnt().join("slow.txt");
    let app = std::thread::spawn(move || write_file(&p, b"slow data"));
    sigterm_once_uploading(&mut m, events.path(), &addr);
    let e = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.mnt().join("new.txt"))
        .expect_err("create after the trigger must be refused");
    assert_eq!(e.raw_os_error(), Some(libc::ESHUTDOWN), "{e}");
    app.join().unwrap().expect("the in-flight close succeeds");
    let st = m.wait_exit(Duration::from_secs(10));
    assert_eq!(st.code(), Some(0), "{}", m.drainfs.stderr_text());
    assert_eq!(
        std::fs::read(m.bucket().join("slow.txt")).unwrap(),
        b"slow data"
    );
    let s = m.summary();
    assert_eq!(s["outcome"], "clean");
    assert!(s["relay"]["counts"]["door_refused"].as_u64().unwrap() >= 1);
    assert!(s["timings"]["drained_ms"].as_u64().unwrap() >= 500, "{s:#}");
}

#[test]
fn daemon_killed_mid_flush_fails_the_request_with_eio_at_once() {
    let events = tempfile::NamedTempFile::new().unwrap();
    let ev = events.path().display().to_string();
    let mut m = start(&[], &["--hang-upload", "stuck", "--events", &ev], true);
    let p = m.mnt().join("stuck.txt");
    let app = std::thread::spawn(move || write_file(&p, b"never uploaded"));
    // Kill the daemon once the FLUSH is in its hands (its upload started).
    assert!(
        wait_until(Duration::from_secs(5), || {
            std::fs::read_to_string(events.path()).is_ok_and(|t| t.contains("upload_start"))
        }),
        "the FLUSH never reached the daemon"
    );
    let daemon = m.drainfs.child_pid();
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon), Signal::SIGKILL);
    let t = Instant::now();
    let r = app.join().unwrap();
    assert_eq!(
        r.as_ref().map_err(|e| e.raw_os_error()),
        Err(Some(libc::EIO)),
        "{r:?} {}",
        m.drainfs.stderr_text()
    );
    // At once when idle; a hang would be unbounded. Loose for a loaded machine.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let st = m.wait_exit(Duration::from_secs(10));
    // drainfs ends by the daemon's signal, as the daemon would have without it.
    assert_eq!(st.signal(), Some(9), "{st:?} {}", m.drainfs.stderr_text());
    let s = m.summary();
    assert_eq!(s["lower_exit"], "signal SIGKILL");
    assert_eq!(s["outcome"], "lower_failed");
    // The summary keeps the outcome's code; the process's status is the signal.
    assert_eq!(s["exit_code"], 69);
    assert!(
        s["relay"]["counts"]["answered_daemon_gone"]
            .as_u64()
            .unwrap()
            >= 1,
        "{s:#} {}",
        m.drainfs.stderr_text()
    );
}

#[test]
fn a_socket_too_small_for_one_message_fails_init_loudly() {
    let mut m = start(&["--socket-buffer", "2048"], &[], false);
    let st = m.wait_exit(Duration::from_secs(5));
    assert_eq!(st.code(), Some(1), "{}", m.drainfs.stderr_text());
    assert!(!serving(&m.mnt()));
    assert_eq!(m.summary()["outcome"], "failed");
}

/// The kernel side goes away (lazy unmount, or a sysfs abort): the relay sends EOF to the
/// daemon, which exits cleanly, and the relay exits with the daemon's status.
fn kernel_gone(how: impl FnOnce(&Path)) {
    let mut m = start(&[], &[], true);
    write_file(&m.mnt().join("before.txt"), b"x").unwrap();
    how(&m.mnt());
    let st = m.wait_exit(Duration::from_secs(4));
    assert_eq!(st.code(), Some(0), "{}", m.drainfs.stderr_text());
    assert_eq!(m.summary()["lower_exit"], "exit 0");
    assert_eq!(std::fs::read(m.bucket().join("before.txt")).unwrap(), b"x");
}

#[test]
fn lazy_unmount_stops_the_daemon_cleanly() {
    kernel_gone(|mnt| {
        nix::mount::umount2(mnt, nix::mount::MntFlags::MNT_DETACH).unwrap();
    });
}

#[test]
fn connection_abort_stops_the_daemon_cleanly() {
    // fusectl must be mounted (scripts/test.sh mounts it up front, or the guard does).
    let _fusectl = fuse_tests::mounts::Fusectl::ensure();
    kernel_gone(fuse_tests::mounts::Fusectl::abort);
}

/// Runs `f` on another thread; `None` if it does not finish within `t`.
fn within<T: Send + 'static>(t: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(t).ok()
}

/// `drainfs relay --socket-buffer 212992 EXTRA` on the connection `fd` (mounted in `dir`),
/// with a "daemon" that never reads its socket (nor exits on EOF).
fn relay_over_a_silent_daemon(dir: tempfile::TempDir, fd: i32, extra: &[&str]) -> RelayMount {
    let mut cmd = Command::new(bin("drainfs"));
    cmd.args(["relay", "--socket-buffer", "212992"])
        .args(extra)
        .arg("--summary-file")
        .arg(dir.path().join("summary.json"))
        .args(["--", "sh", "-c", "sleep 30", "sh"])
        .arg(format!("/dev/fd/{fd}"))
        .stdin(Stdio::null());
    RelayMount {
        drainfs: Proc::spawn(cmd),
        dir,
    }
}

#[test]
fn a_daemon_that_never_answers_init_fails_the_mount_and_exits_69() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let fuse: OwnedFd = nix::fcntl::open(
        "/dev/fuse",
        nix::fcntl::OFlag::O_RDWR,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    let n = fuse.as_raw_fd();
    nix::mount::mount(
        Some("relay-test"),
        &mnt,
        Some("fuse"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(format!("fd={n},rootmode=40000,user_id=0,group_id=0").as_str()),
    )
    .unwrap();
    // A "daemon" that never reads its socket (nor exits on EOF).
    let mut m = relay_over_a_silent_daemon(dir, n, &["--init-timeout", "300ms"]);
    drop(fuse);
    let t = Instant::now();
    let st = m.wait_exit(Duration::from_secs(5));
    assert_eq!(st.code(), Some(69), "{}", m.drainfs.stderr_text());
    // Well before INIT's default 30 s wait: the 300 ms timeout acted (0.3-0.8 s measured, idle
    // and under load).
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let s = m.summary();
    assert_eq!(s["outcome"], "lower_failed");
    assert_eq!(s["lower_exit"], "signal SIGKILL", "{s:#}");
    // The kernel's INIT was answered with an error: the mount fails at once, never hangs.
    let mp = m.mnt();
    let r = within(Duration::from_secs(2), move || {
        nix::sys::statfs::statfs(&mp).map(drop)
    })
    .expect("statfs on the mount hangs");
    assert!(r.is_err(), "the mount answered statfs");
}

/// A stop that comes while the daemon has not answered INIT yet (gcsfuse still starting):
/// the daemon is SIGKILLed at the relay's budget, and nothing was ever served, so the exit is
/// not 75 "incomplete" (INIT counted as a request that may change data, which made it so).
#[test]
fn a_stop_before_the_daemon_answered_init_is_not_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let fuse = mount_fd(&mnt);
    let n = fuse.as_raw_fd();
    // INIT waits 30 s by default.
    let mut m = relay_over_a_silent_daemon(dir, n, &["--grace-period", "2s"]);
    drop(fuse);
    // The stop comes once the relay takes SIGTERM itself (blocked, for its signal thread) and
    // has started the daemon, whose INIT answer it then waits for; a fixed 300 ms was a guess
    // that a loaded machine can outrun (a SIGTERM before the mask kills drainfs outright).
    let pid = m.drainfs.pid();
    assert!(
        wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("SigBlk:"))
                    .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
                    .is_some_and(|m| m & (1 << (libc::SIGTERM - 1)) != 0)
            }) && fuse_tests::process::first_child(pid).is_some()
        }),
        "the relay did not start the daemon: {}",
        m.drainfs.stderr_text()
    );
    m.drainfs.signal(Signal::SIGTERM);
    let st = m.wait_exit(Duration::from_secs(10));
    let s = m.summary();
    assert_ne!(st.code(), Some(75), "{s:#}\n{}", m.drainfs.stderr_text());
    assert_ne!(s["outcome"], "incomplete", "{s:#}");
    assert_eq!(s["lower_exit"], "signal SIGKILL", "{s:#}");
    assert_eq!(s["counts"]["opened_write"], 0, "{s:#}");
}

#[test]
fn run_relay_mounts_relays_and_stops_on_an_exit_file() {
    let dir = tempfile::tempdir().unwrap();
    let [mnt, bucket] = make_dirs(dir.path(), ["mnt", "bucket"]);
    let exit_file = dir.path().join("exit");
    let ready = dir.path().join("ready");
    let mut cmd = Command::new(bin("drainfs"));
    cmd.args(["run", "--relay", "--socket-buffer", "212992"])
        .arg("--mountpoint")
        .arg(&mnt)
        .arg("--exit-file")
        .arg(&exit_file)
        .arg("--ready-file")
        .arg(&ready)
        .arg("--summary-file")
        .arg(dir.path().join("summary.json"))
        .arg("--")
        .arg(bin("bucketfs"))
        .arg("--bucket")
        .arg(&bucket)
        .args(["--mountpoint", "/dev/fd/3"])
        .stdin(Stdio::null());
    let mut m = RelayMount {
        drainfs: Proc::spawn(cmd),
        dir,
    };
    assert!(
        wait_until(Duration::from_secs(10), || ready.exists()),
        "no ready file: {}",
        m.drainfs.stderr_text()
    );
    assert!(serving(&mnt));
    let files: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| {
            let data: Vec<u8> = (0..(i + 1) * 700_000)
                .map(|j| ((j + i) % 253) as u8)
                .collect();
            (format!("f{i}.bin"), data)
        })
        .collect();
    std::fs::create_dir(mnt.join("dir")).unwrap();
    for (name, data) in &files {
        write_file(&mnt.join("dir").join(name), data).unwrap();
    }
    std::fs::write(&exit_file, b"").unwrap();
    let st = m.wait_exit(Duration::from_secs(20));
    assert_eq!(st.code(), Some(0), "{}", m.drainfs.stderr_text());
    for (name, data) in &files {
        let got = std::fs::read(bucket.join("dir").join(name)).unwrap();
        assert!(got == *data, "object {name} differs ({} bytes)", got.len());
    }
    let s = m.summary();
    assert_eq!(s["outcome"], "clean", "{s:#}");
    assert_eq!(s["data_path"], "relay");
    assert_eq!(s["cause"]["cause"], "exit_file");
    assert_eq!(s["lower_exit"], "exit 0");
    assert!(!is_mounted(&mnt), "the mount is left behind");
    assert!(!ready.exists());
}

fn http(method: &str, url: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let mut r = match method {
        "POST" => agent.post(url).send_empty(),
        _ => agent.get(url).call(),
    }
    .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    (
        r.status().as_u16(),
        r.body_mut().read_to_string().unwrap_or_default(),
    )
}

#[test]
fn status_probes_metrics_and_control_socket_work_in_relay_mode() {
    let port = fuse_tests::wait::free_port();
    let base = format!("http://127.0.0.1:{port}");
    let sock_dir = tempfile::tempdir().unwrap();
    let sock = sock_dir.path().join("control.sock");
    let addr = format!("127.0.0.1:{port}");
    let sock_arg = sock.display().to_string();
    let mut m = start(
        &["--admin-addr", &addr, "--control-socket", &sock_arg],
        &["--upload-delay", "1500ms"],
        true,
    );
    assert!(wait_until(Duration::from_secs(5), || {
        std::net::TcpStream::connect(&addr).is_ok()
    }));
    assert_eq!(http("GET", &format!("{base}/startupz")).0, 200);
    assert_eq!(http("GET", &format!("{base}/readyz")).0, 200);
    let (code, body) = http("GET", &format!("{base}/livez?verbose"));
    assert_eq!(code, 200, "{body}");
    let p = m.mnt().join("slow.txt");
    let app = std::thread::spawn(move || write_file(&p, b"slow"));
    let mut st = serde_json::Value::Null;
    let seen = wait_until(Duration::from_secs(10), || {
        st = serde_json::from_str(&http("GET", &format!("{base}/status")).1).unwrap();
        st["in_flight_by_op"]
            .as_array()
            .is_some_and(|ops| ops.iter().any(|o| o[0] == "flush"))
    });
    assert!(seen, "no flush in flight in /status: {st:#}");
    assert_eq!(st["data_path"], "relay");
    assert_eq!(st["phase"], "serving");
    assert!(st["outstanding"]["in_flight"].as_i64().unwrap() >= 1);
    assert_eq!(st["outstanding"]["open_write"], 1, "{st:#}");
    assert_eq!(st["relay"]["init"]["max_write"], 1 << 20);
    assert_eq!(st["relay"]["sndbuf_relay"], 2 * 212_992);
    let (_, metrics) = http("GET", &format!("{base}/metrics"));
    assert!(
        metrics.contains("drainfs_relay_message_cap_bytes 131072"),
        "{metrics}"
    );
    // The FLUSH is in flight; beside it, a FLUSH of a copy of slow.txt's fd that a child
    // forked by another test thread closed at its exec (each is uploaded, 1.5 s), or a
    // request of the kernel's own, may be too: at least 1, not exactly.
    let in_flight = metrics
        .lines()
        .find_map(|l| l.strip_prefix("drainfs_requests_in_flight "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert!(
        in_flight.is_some_and(|n| n >= 1.0),
        "drainfs_requests_in_flight {in_flight:?}: {metrics}"
    );
    // The control socket answers the same document.
    let out = Command::new(bin("drainfs"))
        .args(["status", "--json", "--control-socket", &sock_arg])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["data_path"], "relay");
    // A quit request drains: the in-flight close completes, then the daemon stops.
    assert_eq!(http("POST", &format!("{base}/quitquitquit")).0, 200);
    app.join().unwrap().expect("the in-flight close succeeds");
    let st = m.wait_exit(Duration::from_secs(5));
    assert_eq!(st.code(), Some(0), "{}", m.drainfs.stderr_text());
    let s = m.summary();
    assert_eq!(s["cause"]["cause"], "quit_request");
    assert_eq!(std::fs::read(m.bucket().join("slow.txt")).unwrap(), b"slow");
}

#[test]
fn a_second_sigterm_forces_the_stop_with_the_flush_outstanding() {
    let events = tempfile::NamedTempFile::new().unwrap();
    let ev = events.path().display().to_string();
    let addr = format!("127.0.0.1:{}", fuse_tests::wait::free_port());
    let mut m = start(
        &["--admin-addr", &addr],
        &["--upload-delay", "6s", "--events", &ev],
        true,
    );
    std::fs::create_dir(m.mnt().join("dir")).unwrap();
    let p = m.mnt().join("dir/slow.txt");
    let app = std::thread::spawn(move || write_file(&p, b"slow"));
    // The FLUSH is in the daemon's upload before the first SIGTERM, and the first is taken
    // (the door closed) before the second: two SIGTERMs sent while the first is still pending
    // are one signal.
    sigterm_once_uploading(&mut m, events.path(), &addr);
    let t = Instant::now();
    m.drainfs.signal(Signal::SIGTERM);
    let st = m.wait_exit(Duration::from_secs(10));
    // Forced with the FLUSH in flight: incomplete. The daemon got EOF but waits for its
    // upload (6 s, begun just before the first signal) beyond the second signal's budget for
    // it (2 s), so drainfs SIGKILLs it; a death drainfs caused is reported by the exit code,
    // not raised on drainfs.
    assert_eq!(st.code(), Some(75), "{st:?} {}", m.drainfs.stderr_text());
    let s = m.summary();
    assert_eq!(s["forced"], "second_signal", "{s:#}");
    // The FLUSH was outstanding: a request that can change data (not only read-only ones) and
    // the file open for writing. Other requests may be in flight beside it at that instant (a
    // GETATTR, or under load a FLUSH from a forked child's copy of the fd), so not exactly 1.
    let at_force = &s["outstanding_at_force"];
    let (all, reads) = (&at_force["in_flight"], &at_force["in_flight_read"]);
    assert!(
        all.as_i64().zip(reads.as_i64()).is_some_and(|(a, r)| a > r),
        "{s:#}"
    );
    assert_eq!(at_force["open_write"], 1, "{s:#}");
    assert_eq!(s["lower_exit"], "signal SIGKILL", "{s:#}");
    // The relay names the file whose close was cut short, from the names it relayed.
    assert_eq!(
        s["open_paths"],
        serde_json::json!(["dir/slow.txt"]),
        "{s:#}"
    );
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    let _ = app.join();
}

/// Invoked as `gcsfuse` (the CSI sidecar's binary name) with `--drainfs-mode=relay`, drainfs relays to the real binary
/// (`DRAINFS_REAL_GCSFUSE`) and keeps stderr for what the node driver must see: a clean run
/// writes its logs to stdout and nothing to stderr, which GKE's sidecar copies into the error
/// file that the node driver turns into a mount error. Its clean stop after SIGTERM ends by
/// SIGTERM (the summary says exit 0, clean), so that GKE's sidecar mounter reports "gcsfuse was
/// terminated" and writes no "context canceled" error.
#[test]
fn gcsfuse_drop_in_logs_to_stdout_and_keeps_stderr_clean() {
    let dir = tempfile::tempdir().unwrap();
    let (mnt, bucket) = (dir.path().join("mnt"), dir.path().join("bucket"));
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&bucket).unwrap();
    let gcsfuse = dir.path().join("gcsfuse");
    std::os::unix::fs::symlink(bin("drainfs"), &gcsfuse).unwrap();
    let fuse = mount_fd(&mnt);
    let n = fuse.as_raw_fd();
    let _guard = Unmount(mnt.clone());
    let child = Command::new(&gcsfuse)
        .env("DRAINFS_REAL_GCSFUSE", bin("bucketfs"))
        .env("DRAINFS_SOCKET_BUFFER", "212992")
        .env("DRAINFS_LOG_FORMAT", "json")
        .env("DRAINFS_SUMMARY_FILE", dir.path().join("summary.json"))
        // The relay is the drop-in's opt-in (the hand-off is its default).
        .args(["--drainfs-mode=relay", "--bucket"])
        .arg(&bucket)
        .arg("--mountpoint")
        .arg(format!("/dev/fd/{n}"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(fuse);
    assert!(wait_until(Duration::from_secs(10), || serving(&mnt)));
    write_file(&mnt.join("a.txt"), b"through the drop-in").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{out:?}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["exit_code"], 0, "{summary}");
    assert_eq!(summary["outcome"], "clean", "{summary}");
    assert_eq!(
        std::fs::read(bucket.join("a.txt")).unwrap(),
        b"through the drop-in"
    );
    // drainfs's own lines are JSON (DRAINFS_LOG_FORMAT=json); the daemon's stderr is its own.
    let json_lines = |b: &[u8]| {
        String::from_utf8_lossy(b)
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .is_ok_and(|v| v["severity"].is_string())
            })
            .count()
    };
    assert!(
        json_lines(&out.stdout) > 0,
        "drainfs logged nothing on stdout"
    );
    assert_eq!(
        json_lines(&out.stderr),
        0,
        "drainfs logged on stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CPU-limited cgroup (v2 `cpu.max`, or v1 `cpu.cfs_quota_us` where cgroup v2 is not the
/// only hierarchy) for one test; removed on drop, once its processes are gone.
struct CpuLimitedCgroup {
    dir: PathBuf,
}

impl CpuLimitedCgroup {
    /// A cgroup limited to `quota_us` per 100 ms period.
    fn new(quota_us: u32) -> CpuLimitedCgroup {
        let name = format!("drainfs-test-{}", std::process::id());
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
        let dir = if v2 {
            // The cpu controller must be enabled for the root's children.
            std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+cpu")
                .expect("enable the cpu controller");
            Path::new("/sys/fs/cgroup").join(&name)
        } else {
            Path::new("/sys/fs/cgroup/cpu").join(&name)
        };
        std::fs::create_dir(&dir).expect("create a cgroup (run as root)");
        let g = CpuLimitedCgroup { dir };
        if v2 {
            std::fs::write(g.dir.join("cpu.max"), format!("{quota_us} 100000")).unwrap();
        } else {
            std::fs::write(g.dir.join("cpu.cfs_period_us"), "100000").unwrap();
            std::fs::write(g.dir.join("cpu.cfs_quota_us"), quota_us.to_string()).unwrap();
        }
        g
    }

    /// Makes `cmd`'s process join the cgroup before it runs (its children follow).
    fn enter(&self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        let procs = std::ffi::CString::new(
            self.dir
                .join("cgroup.procs")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: between fork and exec only async-signal-safe calls are made (open, write,
        // close), on a path built before the fork; "0" names the writing process itself.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                let err = std::io::Error::last_os_error();
                libc::close(fd);
                if ok { Ok(()) } else { Err(err) }
            });
        }
    }
}

impl Drop for CpuLimitedCgroup {
    fn drop(&mut self) {
        // rmdir fails (EBUSY) until the last process has left.
        let gone = wait_until(Duration::from_secs(5), || {
            std::fs::remove_dir(&self.dir).is_ok()
        });
        if !gone {
            eprintln!("cgroup {} left behind", self.dir.display());
        }
    }
}

/// `--spin auto`: the pump spins (50 µs) when drainfs may use 2 CPUs or more, and never under
/// a cgroup CPU limit below 2 CPUs, such as the managed sidecar's, where spinning would take
/// the daemon's CPU time.
#[test]
fn spin_auto_is_off_under_a_cpu_limit_below_two_cpus() {
    let cpus = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| {
            (0..nix::sched::CpuSet::count())
                .filter(|&i| set.is_set(i).unwrap_or(false))
                .count()
        })
        .unwrap();
    let spin_of = |m: &mut RelayMount| {
        write_file(&m.mnt().join("f"), b"x").unwrap();
        m.drainfs.signal(Signal::SIGTERM);
        assert_eq!(m.wait_exit(Duration::from_secs(5)).code(), Some(0));
        m.summary()["relay"]["spin_us"].as_u64().unwrap()
    };
    let mut free = start(&[], &[], true);
    assert_eq!(spin_of(&mut free), if cpus >= 2 { 50 } else { 0 });
    let cgroup = CpuLimitedCgroup::new(50_000);
    let mut limited = start_with(&[], &[], true, |cmd| cgroup.enter(cmd));
    assert_eq!(spin_of(&mut limited), 0, "half a CPU: no spinning");
    drop(limited);
    drop(cgroup);
}

/// A FLUSH the daemon fails (its upload failed: the application's close() gets the error) is
/// a failed flush: exit 75, named in the summary and counted, as in mount mode.
#[test]
fn a_failed_upload_is_a_failed_flush_exit_75() {
    let mut m = start(&[], &["--fail-upload", "bad"], true);
    std::fs::create_dir(m.mnt().join("d")).unwrap();
    let r = write_file(&m.mnt().join("d/bad1"), &[1u8; 1000]);
    assert_eq!(r.map_err(|e| e.raw_os_error()), Err(Some(libc::EIO)));
    write_file(&m.mnt().join("good"), b"fine").unwrap();
    m.drainfs.signal(Signal::SIGTERM);
    let st = m.wait_exit(Duration::from_secs(5));
    assert_eq!(st.code(), Some(75), "{st:?}");
    let s = m.summary();
    assert_eq!(s["outcome"], "incomplete", "{s:#}");
    assert_eq!(s["failed_flushes"], serde_json::json!(["d/bad1"]), "{s:#}");
    // At least the close's FLUSH failed. Not exactly one: a child that another test thread
    // forks while d/bad1 is open closes its copy of the fd at exec, a FLUSH of its own, which
    // fails too (bucketfs keeps a file whose upload failed dirty).
    assert!(
        s["counts"]["lower_flush_errors"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{s:#}"
    );
    assert!(s["counts"]["lower_flushes"].as_u64().unwrap() >= 2, "{s:#}");
    assert!(
        s["counts"]["bytes_written"].as_u64().unwrap() >= 1004,
        "{s:#}"
    );
    assert_eq!(std::fs::read(m.bucket().join("good")).unwrap(), b"fine");
}

/// A daemon that exits 1 at once is a failed start (69) however its exit and a SIGTERM race:
/// `--eof-exit-codes` covers only a daemon that served and then ended at the relay's
/// end-of-stream.
#[test]
fn a_daemon_that_exits_at_start_is_never_a_clean_stop() {
    for delay_us in (0..=40u64).map(|i| i * 100) {
        let dir = tempfile::tempdir().unwrap();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let fuse = mount_fd(&mnt);
        let _guard = Unmount(mnt.clone());
        let mut cmd = Command::new(bin("drainfs"));
        cmd.args(["relay", "--socket-buffer", "212992", "--"])
            .args(["/bin/sh", "-c", "exit 1", "sh"])
            .arg(format!("/dev/fd/{}", fuse.as_raw_fd()))
            .stdin(Stdio::null());
        let mut p = Proc::spawn(cmd);
        drop(fuse);
        // From the moment drainfs blocks SIGTERM (its signalfd takes it from then on).
        let status = format!("/proc/{}/status", p.pid());
        assert!(wait_until(Duration::from_secs(5), || {
            std::fs::read_to_string(&status).is_ok_and(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("SigBlk:"))
                    .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
                    .is_some_and(|m| m & (1 << (libc::SIGTERM - 1)) != 0)
            })
        }));
        std::thread::sleep(Duration::from_micros(delay_us));
        p.signal(Signal::SIGTERM);
        let st = p
            .wait_timeout(Duration::from_secs(10))
            .expect("drainfs did not exit");
        assert_eq!(st.code(), Some(69), "after {delay_us} us: {st:?}");
    }
}

/// The connection fd must be an open /dev/fuse: a file, a pipe or another device there is a
/// usage error (2), not requests read from garbage.
#[test]
fn a_kernel_fd_that_is_not_dev_fuse_is_a_usage_error() {
    use std::os::fd::AsFd;
    let file = tempfile::NamedTempFile::new().unwrap();
    let (pipe_r, _pipe_w) = nix::unistd::pipe().unwrap();
    let zero = std::fs::File::open("/dev/zero").unwrap();
    for fd in [file.as_file().as_fd(), pipe_r.as_fd(), zero.as_fd()] {
        // A dup without FD_CLOEXEC at a known number, inherited by drainfs.
        let dup = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD(100)).unwrap();
        let out = Command::new(bin("drainfs"))
            .args(["relay", "--", "/bin/true"])
            .arg(format!("/dev/fd/{dup}"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        nix::unistd::close(dup).unwrap();
        assert_eq!(out.status.code(), Some(2), "{fd:?}: {out:?}");
    }
}

/// A reply the kernel refuses: bucketfs answers READs of `bad*` one byte longer than asked.
/// The kernel fails that READ with EIO itself and ends the request (fuse_dev_do_write: the
/// write gives EINVAL), so the relay's own EIO answer finds no request and gives ENOENT. The
/// relay counts both and keeps serving: the pump must not hold the state lock while it writes
/// that answer, or counting the ENOENT would deadlock it and every later request would hang.
#[test]
fn a_reply_the_kernel_refuses_fails_the_read_and_the_relay_keeps_serving() {
    let mut m = start(&[], &["--oversized-read", "bad"], true);
    std::fs::write(m.bucket().join("bad.txt"), b"refused").unwrap();
    std::fs::write(m.bucket().join("good.txt"), b"served").unwrap();
    let bad = m.mnt().join("bad.txt");
    let r = within(Duration::from_secs(10), move || {
        std::fs::read(bad).map_err(|e| e.raw_os_error())
    });
    assert_eq!(r, Some(Err(Some(libc::EIO))), "{}", m.drainfs.stderr_text());
    let good = m.mnt().join("good.txt");
    let r = within(Duration::from_secs(10), move || std::fs::read(good).ok());
    assert_eq!(
        r,
        Some(Some(b"served".to_vec())),
        "the relay stopped serving after the refused reply: {}",
        m.drainfs.stderr_text()
    );
    m.drainfs.signal(Signal::SIGTERM);
    let st = m.wait_exit(Duration::from_secs(5));
    assert_eq!(st.code(), Some(0), "{}", m.drainfs.stderr_text());
    let counts = &m.summary()["relay"]["counts"];
    assert!(
        counts["protocol_errors"].as_u64().unwrap() >= 1,
        "{counts:#}"
    );
    assert!(counts["kernel_enoent"].as_u64().unwrap() >= 1, "{counts:#}");
}

//! Real-mount smoke tests of `drainfs relay`: the test plays the node driver (opens
//! `/dev/fuse`, mounts with `fd=N`, hands fd N to `drainfs relay -- bucketfs ... /dev/fd/N`),
//! then checks data, the drain, the door, daemon death and INIT failure through the mount.
//! Socket buffers are forced to the kernel's default wmem_max (212992), as in production.

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use fuse_tests::harness::{Proc, bin, force_unmount, wait_until};
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
fn start(relay_args: &[&str], bucketfs_args: &[&str], wait: bool) -> RelayMount {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("mnt");
    let bucket = dir.path().join("bucket");
    std::fs::create_dir(&mnt).unwrap();
    std::fs::create_dir(&bucket).unwrap();
    // Not CLOEXEC: drainfs inherits it.
    let fuse: OwnedFd = nix::fcntl::open(
        "/dev/fuse",
        nix::fcntl::OFlag::O_RDWR,
        nix::sys::stat::Mode::empty(),
    )
    .expect("open /dev/fuse (run as root)");
    let n = fuse.as_raw_fd();
    nix::mount::mount(
        Some("relay-test"),
        &mnt,
        Some("fuse"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(
            format!("fd={n},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions")
                .as_str(),
        ),
    )
    .expect("mount fd=N");
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
    let st = m.wait_exit(Duration::from_secs(4));
    let took = t.elapsed();
    assert_eq!(st.code(), Some(0), "{}", m.drainfs.stderr_text());
    assert!(
        took < Duration::from_secs(1),
        "SIGTERM to exit took {took:?}"
    );
    let s = m.summary();
    assert_eq!(s["outcome"], "clean");
    assert_eq!(s["daemon_exit"], "exit 0");
    // 212992 doubled by the kernel, minus 32 + 4096, in whole pages: 408 KiB.
    assert_eq!(s["init"]["cap"], 408 * 1024);
    assert!(s["init"]["max_write"].as_u64().unwrap() <= 408 * 1024);
    assert_eq!(s["counts"]["protocol_errors"], 0);
    assert_eq!(s["counts"]["answered_send_failed"], 0);
}

#[test]
fn drain_waits_for_a_slow_flush_and_the_door_refuses_new_creates() {
    let mut m = start(&[], &["--upload-delay", "1500ms"], true);
    let p = m.mnt().join("slow.txt");
    let app = std::thread::spawn(move || write_file(&p, b"slow data"));
    // Let the FLUSH reach the daemon, then trigger.
    std::thread::sleep(Duration::from_millis(400));
    m.drainfs.signal(Signal::SIGTERM);
    std::thread::sleep(Duration::from_millis(100));
    let e = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.mnt().join("new.txt"))
        .expect_err("create after the trigger must be refused");
    assert_eq!(e.raw_os_error(), Some(libc::ESHUTDOWN), "{e}");
    app.join().unwrap().expect("the in-flight close succeeds");
    let st = m.wait_exit(Duration::from_secs(4));
    assert_eq!(st.code(), Some(0), "{}", m.drainfs.stderr_text());
    assert_eq!(
        std::fs::read(m.bucket().join("slow.txt")).unwrap(),
        b"slow data"
    );
    let s = m.summary();
    assert_eq!(s["outcome"], "clean");
    assert!(s["counts"]["door_refused"].as_u64().unwrap() >= 1);
    assert!(s["timings_ms"]["drained"].as_u64().unwrap() >= 500);
}

#[test]
fn daemon_killed_mid_flush_fails_the_request_with_eio_at_once() {
    let mut m = start(&[], &["--hang-upload", "stuck"], true);
    let p = m.mnt().join("stuck.txt");
    let app = std::thread::spawn(move || write_file(&p, b"never uploaded"));
    std::thread::sleep(Duration::from_millis(400));
    let daemon = m.drainfs.child_pid();
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon), Signal::SIGKILL);
    let t = Instant::now();
    let r = app.join().unwrap();
    assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::EIO));
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let st = m.wait_exit(Duration::from_secs(4));
    assert_eq!(st.code(), Some(128 + 9), "{}", m.drainfs.stderr_text());
    let s = m.summary();
    assert_eq!(s["daemon_exit"], "signal SIGKILL");
    assert!(s["counts"]["answered_daemon_gone"].as_u64().unwrap() >= 1);
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
    assert_eq!(m.summary()["daemon_exit"], "exit 0");
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
    kernel_gone(|mnt| {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata(mnt).unwrap().dev();
        let minor = nix::sys::stat::minor(dev);
        let conns = Path::new("/sys/fs/fuse/connections");
        if std::fs::read_dir(conns).map(|d| d.count()).unwrap_or(0) == 0 {
            // fusectl is not mounted here; it is a per-system singleton, left mounted.
            let _ = nix::mount::mount(
                Some("fusectl"),
                conns,
                Some("fusectl"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            );
        }
        let abort = format!("/sys/fs/fuse/connections/{minor}/abort");
        std::fs::write(&abort, b"1").unwrap_or_else(|e| panic!("{abort}: {e}"));
    });
}

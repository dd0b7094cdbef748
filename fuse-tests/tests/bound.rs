//! The bound (`fuse_tests::bound`) ends a wedged test: this test runs a wedged test in a child
//! process (this binary again, with `wedge DIR`) under a 3 s bound and checks what is left.
//!
//! The wedged test mounts `bucketfs` (started outside the harness, so the bound does not know
//! it and cannot kill it) whose READ of `stuck.bin` sleeps for an hour, and reads that file on
//! its main thread: the read is in the daemon's hands, the reader waits in the kernel. Only
//! the connection's abort can free it. After the read the wedged test parks forever, like a
//! test stuck on a wait with no deadline.
//!
//! Checked: the child exits 101 within its bound plus the grace after the cut-off (not never),
//! its read ended with an error (the abort reached it), its mount is gone, and once the
//! daemon is killed nothing of the child is left.
//!
//! Its own `main` (`harness = false`): the child must be a plain process whose main thread is
//! the test.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fuse_tests::bound;
use fuse_tests::harness::{Proc, bin, is_mounted, make_dirs, scratch_dir, wait_until};
use fuse_tests::process::{pid_exists, send};
use nix::sys::signal::Signal;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("wedge") {
        wedge(Path::new(&args[2]));
        unreachable!("the wedged test parks forever");
    }
    // `cargo test` passes libtest's flags (`--test-threads=2`...): they mean nothing here.
    a_wedged_test_fails_within_its_bound_and_leaves_nothing();
    println!("bound: 1 passed, 0 failed");
}

/// The wedged test (in the child).
fn wedge(dir: &Path) {
    bound::own_dir(dir);
    let [bucket, mnt] = [dir.join("bucket"), dir.join("mnt")];
    std::fs::write(bucket.join("stuck.bin"), vec![7u8; 64 << 10]).unwrap();
    #[allow(clippy::zombie_processes)]
    let daemon = Command::new(bin("bucketfs"))
        .arg("--bucket")
        .arg(&bucket)
        .arg("--mountpoint")
        .arg(&mnt)
        .args(["--slow-read", "stuck", "--read-delay", "3600s"])
        .spawn()
        .expect("bucketfs");
    std::fs::write(dir.join("daemon.pid"), daemon.id().to_string()).unwrap();
    // Never waited for here: the parent test ends it by PID once this process is gone.
    std::mem::forget(daemon);
    assert!(
        wait_until(Duration::from_secs(20), || is_mounted(&mnt)),
        "bucketfs did not mount"
    );
    let r = std::fs::read(mnt.join("stuck.bin"));
    let what = match r {
        Ok(_) => "read".to_string(),
        Err(e) => format!("error {}", e.raw_os_error().unwrap_or(0)),
    };
    std::fs::write(dir.join("read.result"), what).unwrap();
    loop {
        std::thread::park();
    }
}

fn a_wedged_test_fails_within_its_bound_and_leaves_nothing() {
    let scratch = scratch_dir("/tmp", "drainfs-bound-");
    let dir: PathBuf = scratch.path().to_path_buf();
    let [_, mnt] = make_dirs(&dir, ["bucket", "mnt"]);
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.arg("wedge").arg(&dir).env("DRAINFS_TEST_BOUND", "3");
    let t0 = Instant::now();
    let mut child = Proc::spawn(cmd);
    let status = child.wait_timeout(Duration::from_secs(90));
    let took = t0.elapsed();
    let daemon: Option<i32> = std::fs::read_to_string(dir.join("daemon.pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok());
    // The daemon is this test's to end (the child's bound did not know it): by PID, once it
    // is sure to be bucketfs still.
    let end_daemon = || {
        if let Some(pid) = daemon {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.trim() == "bucketfs" {
                send(pid, Signal::SIGKILL);
            }
        }
    };
    let Some(status) = status else {
        end_daemon();
        panic!(
            "the wedged test did not end within 90 s:\n{}",
            child.stderr_text()
        );
    };
    end_daemon();
    let result = std::fs::read_to_string(dir.join("read.result")).unwrap_or_default();
    assert_eq!(
        status.code(),
        Some(101),
        "exit status of the wedged test:\n{}",
        child.stderr_text()
    );
    assert!(
        took < Duration::from_secs(30),
        "the wedged test took {took:?} (its bound is 3 s, then 3 s of grace)"
    );
    assert!(
        result.starts_with("error "),
        "the stuck read was not ended by the abort: {result:?}\n{}",
        child.stderr_text()
    );
    assert!(!is_mounted(&mnt), "the wedged test's mount is still there");
    if let Some(pid) = daemon {
        assert!(
            wait_until(Duration::from_secs(10), || !pid_exists(pid)
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))),
            "bucketfs {pid} is still there after its SIGKILL"
        );
    }
}

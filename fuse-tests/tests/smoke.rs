//! Smoke test of the harness itself: mount, a round trip, clean stop.

use std::time::Duration;

use fuse_tests::harness::Mounted;

#[test]
fn mount_write_read_stop() {
    for mode in ["always", "never"] {
        let mut m = Mounted::new(mode);
        std::fs::write(m.path("hello.txt"), b"hi").unwrap();
        assert_eq!(std::fs::read(m.lower_path("hello.txt")).unwrap(), b"hi");
        let st = m.stop(Duration::from_secs(20));
        assert_eq!(st.code(), Some(0), "mode {mode}");
    }
}

/// bucketfs stages files in one shared `$TMPDIR/bucketfs-staging`, mode 1777, whose files are
/// anonymous: a bucketfs killed with a file open for writing (as most mount tests end their
/// daemons) leaves that directory empty and nothing else in `$TMPDIR`. A directory per
/// process, removed at exit, left one behind per SIGKILL (681 in `/tmp` after two days).
#[test]
fn a_killed_bucketfs_leaves_nothing_in_its_tmpdir() {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    use std::process::Command;

    use fuse_tests::harness::{bin, make_dirs, scratch_dir};
    use fuse_tests::mounts::{force_unmount, is_mounted};
    use fuse_tests::process::Proc;
    use fuse_tests::wait::wait_until;
    use nix::sys::signal::Signal;

    let dir = scratch_dir("/tmp", "drainfs-staging-");
    let [tmp, bucket, mnt] = make_dirs(dir.path(), ["tmp", "bucket", "mnt"]);
    let mut cmd = Command::new(bin("bucketfs"));
    cmd.arg("--bucket")
        .arg(&bucket)
        .arg("--mountpoint")
        .arg(&mnt)
        .env("TMPDIR", &tmp);
    let mut daemon = Proc::spawn(cmd);
    assert!(
        wait_until(Duration::from_secs(20), || is_mounted(&mnt)),
        "bucketfs did not mount: {}",
        daemon.stderr_text()
    );
    let mut f = std::fs::File::create(mnt.join("open.bin")).unwrap();
    f.write_all(&[5u8; 64 << 10]).unwrap();
    daemon.signal(Signal::SIGKILL);
    let st = daemon.wait_timeout(Duration::from_secs(20));
    drop(f);
    force_unmount(&mnt);
    assert!(st.is_some(), "bucketfs outlived its SIGKILL");
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["bucketfs-staging"], "left in TMPDIR");
    let staging = tmp.join("bucketfs-staging");
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);
    let mode = std::fs::metadata(&staging).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o1777, "{mode:o}");
}

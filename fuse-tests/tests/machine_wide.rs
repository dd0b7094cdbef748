//! Tests that depend on machine-wide state no test owns, and so run alone (see
//! `fuse_tests::bound`, "Machine-wide state"): each takes [`alone`] first, and `cargo test`
//! runs one test binary at a time, so no other test of the suite mounts anything meanwhile.
//!
//! - A lower whose process outlives its mount never gets drainfs to abort the newer mount that
//!   took its connection number (the kernel hands out the lowest free number, anywhere on the
//!   machine: another test's mount would take it first).

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use fuse_tests::harness::{MountOpts, Mounted, bin, make_dirs, scratch_dir, wait_until};
use fuse_tests::mounts::{BareFuse, Fusectl, mount_id_at, mountinfo_of, top_at};
use fuse_tests::wait::summary_at;
use nix::sys::signal::Signal;

/// The lock every test of this file takes first: one at a time, whatever `--test-threads`.
fn alone() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A world-traversable scratch directory with `lower/` and `mnt/`.
fn layout() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = scratch_dir("/tmp", "drainfs-machine-wide-");
    let [lower, mnt] = make_dirs(dir.path(), ["lower", "mnt"]);
    (dir, lower, mnt)
}

/// How often the scenario is tried when something outside the suite (another process on the
/// machine) took the freed connection number before the test's own mounts could: the
/// scenario did not happen then, so it is tried again; any other outcome is final.
const TRIES: usize = 3;

/// A lower whose process outlives its mount (a wrapper script that goes on after its FUSE
/// daemon exited). At the stop drainfs unmounts the lower, and when the process has not exited
/// 500 ms later it ends the lower's connection. The lower's superblock went with the unmount,
/// so its connection number was free, and here a new FUSE mount (another pod's, on a node)
/// has it by then: that mount keeps its connection. drainfs used to write the number it
/// remembered from the start to `/sys/fs/fuse/connections/<N>/abort`, which aborted the
/// newcomer.
#[test]
fn a_lower_outliving_its_mount_never_aborts_a_newer_mount_with_its_number() {
    let _alone = alone();
    for _ in 0..TRIES {
        if lower_outliving_its_mount() {
            return;
        }
    }
    panic!(
        "in {TRIES} tries, the lower's freed connection number went to a mount outside the test first"
    );
}

/// One try: `false` when the freed number went elsewhere first (nothing was tested), else the
/// assertions hold.
fn lower_outliving_its_mount() -> bool {
    // Where connections are aborted (scripts/test.sh mounts it; a bare VM may not have it).
    let _fusectl = Fusectl::ensure();
    let (dir, lower, mnt) = layout();
    let [bucket, decoys] = make_dirs(dir.path(), ["bucket", "decoys"]);
    let sum = dir.path().join("summary.json");
    let script = r#"b="$1"; shift; "$b" "$@"; sleep 4"#;
    let mut m = Mounted::start_in(
        dir,
        lower.clone(),
        mnt,
        MountOpts {
            args: vec!["--summary-file".into(), sum.display().to_string()],
            lower_cmd: vec![
                "/bin/sh".into(),
                "-c".into(),
                script.into(),
                "sh".into(),
                bin("bucketfs").display().to_string(),
                "--bucket".into(),
                bucket.display().to_string(),
                "--mountpoint".into(),
                "{lower}".into(),
            ],
            no_wait: false,
        },
    );
    let table = mountinfo_of("self");
    let lower_mount = top_at(&table, &lower).expect("the lower's mount");
    assert!(lower_mount.is_fuse(), "{lower_mount:?}");
    let minor: u32 = lower_mount
        .devno
        .split(':')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();

    m.proc.signal(Signal::SIGTERM);
    assert!(
        wait_until(Duration::from_secs(5), || mount_id_at(&lower)
            != Some(lower_mount.id)),
        "drainfs did not unmount the lower:\n{}",
        m.proc.stderr_text()
    );
    // The kernel hands out the lowest free number: mount until one of ours has the lower's.
    let mut held = Vec::new();
    let heir = (0..64).find_map(|i| {
        let at = decoys.join(i.to_string());
        std::fs::create_dir(&at).unwrap();
        let b = BareFuse::mount(&at);
        let hit = b.minor == minor;
        held.push(b);
        hit.then(|| held.len() - 1)
    });
    let Some(heir) = heir else {
        eprintln!(
            "no new mount got connection number {minor} (taken elsewhere first): {:?}",
            held.iter().map(|b| b.minor).collect::<Vec<_>>()
        );
        return false;
    };
    let st = m.proc.wait_exit(Duration::from_secs(30), "drainfs");
    assert!(
        held[heir].connected(),
        "the new mount with number {minor} was aborted by drainfs:\n{}",
        m.proc.stderr_text()
    );
    let s = summary_at(&sum);
    assert_eq!(
        s["lower_unmount"],
        "drainfs",
        "{s}\n{}",
        m.proc.stderr_text()
    );
    assert_eq!(
        st.code(),
        Some(s["exit_code"].as_i64().unwrap() as i32),
        "{s}"
    );
    true
}

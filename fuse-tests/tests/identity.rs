//! Identity on a real mount, in both passthrough modes. Inodes are keyed by
//! the lower's `(st_dev, st_ino)` (hard links share one nodeid, renames keep it, even when
//! made on the lower behind drainfs's back), unlinked-but-open files keep working after their
//! O_PATH fd was evicted, and the fd budget holds 100,000 files within RLIMIT_NOFILE 20,000.

#[macro_use]
mod common;

use std::fs::{self, File, OpenOptions, Permissions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;

both_modes!(
    hard_links_share_one_nodeid,
    rename_keeps_the_inode,
    unlinked_but_open_files_keep_working,
    fd_budget_holds_100k_files_under_rlimit_20k,
);

/// Evicts drainfs's O_PATH cache (capacity 16 in these tests) by looking up `n` other files.
fn churn(m: &Mounted, n: usize) {
    fs::create_dir_all(m.path("churn")).unwrap();
    for i in 0..n {
        let p = m.path(&format!("churn/{i}"));
        fs::write(&p, b"").unwrap();
        fs::metadata(&p).unwrap();
    }
}

fn hard_links_share_one_nodeid(mode: &str) {
    // TTL 0: every stat below is a fresh LOOKUP answered by drainfs, not the kernel's cache.
    let m = mount(mode, &["--ttl", "0", "--max-lower-fds", "16"]);
    fs::create_dir(m.path("d")).unwrap();
    fs::write(m.path("f"), b"shared").unwrap();
    fs::hard_link(m.path("f"), m.path("d/through-mount")).unwrap();
    // A link made on the lower, unknown to drainfs until looked up.
    fs::hard_link(m.lower_path("f"), m.lower_path("d/on-lower")).unwrap();

    let ino = fs::metadata(m.path("f")).unwrap().ino();
    for name in ["d/through-mount", "d/on-lower"] {
        let st = fs::metadata(m.path(name)).unwrap();
        assert_eq!(st.ino(), ino, "{name}: one nodeid per lower inode");
        assert_eq!(st.nlink(), 3, "{name}");
    }
    // Still one identity after drainfs lost its cached fds.
    churn(&m, 100);
    for name in ["f", "d/through-mount", "d/on-lower"] {
        assert_eq!(fs::metadata(m.path(name)).unwrap().ino(), ino, "{name}");
    }
    // Distinct files have distinct numbers.
    fs::write(m.path("other"), b"").unwrap();
    assert_ne!(fs::metadata(m.path("other")).unwrap().ino(), ino);

    // Opens through different names share data.
    let a = OpenOptions::new()
        .write(true)
        .open(m.path("d/on-lower"))
        .unwrap();
    let b = File::open(m.path("d/through-mount")).unwrap();
    a.write_all_at(b"SHARED", 0).unwrap();
    assert_eq!(pread(&b, 0, 100), b"SHARED");
    assert_eq!(fs::read(m.lower_path("f")).unwrap(), b"SHARED");
    // Removing names leaves the others working.
    fs::remove_file(m.path("f")).unwrap();
    fs::remove_file(m.lower_path("d/through-mount")).unwrap();
    let st = fs::metadata(m.path("d/on-lower")).unwrap();
    assert_eq!((st.ino(), st.nlink()), (ino, 1));
    assert_eq!(fs::read(m.path("d/on-lower")).unwrap(), b"SHARED");
    assert_errno(
        fs::metadata(m.path("d/through-mount")),
        libc::ENOENT,
        "gone",
    );
}

fn rename_keeps_the_inode(mode: &str) {
    let m = mount(mode, &["--ttl", "0", "--max-lower-fds", "16"]);
    fs::create_dir_all(m.path("a/b")).unwrap();
    fs::create_dir(m.path("c")).unwrap();
    fs::write(m.path("a/b/f"), b"payload").unwrap();
    let ino = fs::metadata(m.path("a/b/f")).unwrap().ino();
    let dir_ino = fs::metadata(m.path("a/b")).unwrap().ino();
    // An fd kept open across every rename below.
    let held = File::open(m.path("a/b/f")).unwrap();

    // Through the mount: same directory, another directory, then the parent itself moves.
    fs::rename(m.path("a/b/f"), m.path("a/b/g")).unwrap();
    assert_eq!(fs::metadata(m.path("a/b/g")).unwrap().ino(), ino);
    fs::rename(m.path("a/b/g"), m.path("c/h")).unwrap();
    assert_eq!(fs::metadata(m.path("c/h")).unwrap().ino(), ino);
    fs::rename(m.path("c"), m.path("a/b/c2")).unwrap();
    assert_eq!(fs::metadata(m.path("a/b/c2/h")).unwrap().ino(), ino);
    assert_eq!(fs::metadata(m.path("a/b")).unwrap().ino(), dir_ino);
    churn(&m, 100);
    assert_eq!(fs::metadata(m.path("a/b/c2/h")).unwrap().ino(), ino);
    assert_eq!(fs::read(m.path("a/b/c2/h")).unwrap(), b"payload");

    // On the lower, behind drainfs's back: the new name resolves to the same nodeid and the
    // old one is gone.
    fs::rename(m.lower_path("a/b/c2/h"), m.lower_path("moved")).unwrap();
    assert_eq!(fs::metadata(m.path("moved")).unwrap().ino(), ino);
    assert_errno(fs::metadata(m.path("a/b/c2/h")), libc::ENOENT, "old name");
    fs::rename(m.lower_path("a"), m.lower_path("a-renamed")).unwrap();
    assert_eq!(fs::metadata(m.path("a-renamed/b")).unwrap().ino(), dir_ino);
    churn(&m, 100);
    assert_eq!(fs::metadata(m.path("moved")).unwrap().ino(), ino);
    assert_eq!(fs::read(m.path("moved")).unwrap(), b"payload");
    // Writes through the new name land in the lower file.
    fs::write(m.path("moved"), b"rewritten").unwrap();
    assert_eq!(fs::read(m.lower_path("moved")).unwrap(), b"rewritten");

    // The fd opened under the first name followed the inode all along.
    assert_eq!(held.metadata().unwrap().ino(), ino);
    assert_eq!(pread(&held, 0, 100), b"rewritten");
}

fn unlinked_but_open_files_keep_working(mode: &str) {
    let m = mount(mode, &["--max-lower-fds", "16"]);
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.path("f"))
        .unwrap();
    f.write_all_at(b"before unlink", 0).unwrap();
    let ino = f.metadata().unwrap().ino();
    fs::remove_file(m.path("f")).unwrap();
    assert!(!m.lower_path("f").exists(), "unlinked on the lower");
    assert_errno(fs::metadata(m.path("f")), libc::ENOENT, "name gone");

    // The name is reused by a new file: a different inode; the open one is untouched.
    fs::write(m.path("f"), b"a new file").unwrap();
    assert_ne!(fs::metadata(m.path("f")).unwrap().ino(), ino);

    // Let drainfs lose every cached O_PATH fd.
    churn(&m, 200);

    f.write_all_at(b" and after", 13).unwrap();
    assert_eq!(pread(&f, 0, 100), b"before unlink and after");
    let st = f.metadata().unwrap();
    assert_eq!(st.ino(), ino);
    assert_eq!(st.len(), 23);
    assert_eq!(st.nlink(), 0);
    f.set_permissions(Permissions::from_mode(0o600)).unwrap();
    assert_eq!(f.metadata().unwrap().mode() & 0o777, 0o600);
    f.set_len(6).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 6);
    f.sync_all().unwrap();
    assert_eq!(pread(&f, 0, 100), b"before");

    // Reopening the unlinked file through /proc/self/fd (an OPEN of a nameless inode).
    let again = File::open(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
    assert_eq!(again.metadata().unwrap().ino(), ino);
    assert_eq!(pread(&again, 0, 100), b"before");
    churn(&m, 50);
    assert_eq!(f.metadata().unwrap().len(), 6);
    drop(again);
    drop(f);
    assert_eq!(fs::read(m.path("f")).unwrap(), b"a new file");
    assert_eq!(fs::read(m.lower_path("f")).unwrap(), b"a new file");
}

/// Panics with the errno (EMFILE would show here) when a libc call returned -1; otherwise
/// owns the fd (`i32::MAX` stands for "success without an fd").
fn owned_or_panic(
    fd: i32,
    dir: &std::path::Path,
    name: &std::ffi::CStr,
) -> Option<std::os::fd::OwnedFd> {
    if fd < 0 {
        panic!(
            "{}/{name:?}: {}",
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    (fd != i32::MAX).then(|| owned(fd))
}

/// 100,000 files created, chmod'ed and stat'ed through the mount while drainfs runs with
/// `--max-lower-fds 64` under RLIMIT_NOFILE 20,000: no EMFILE, and drainfs never holds more
/// than a few hundred fds (one O_PATH fd per known inode would need 100,000).
fn fd_budget_holds_100k_files_under_rlimit_20k(mode: &str) {
    const DIRS: usize = 100;
    const PER_DIR: usize = 1000;
    const WORKERS: usize = 4;
    let m = mount_on_tmpfs(mode, &["--max-lower-fds", "64", "--ttl", "0"]);
    let pid = m.proc.pid();
    set_nofile(pid, 20_000, 20_000);
    assert_eq!(get_nofile(pid), (20_000, 20_000));

    let stop = Arc::new(AtomicBool::new(false));
    let max_fds = Arc::new(AtomicUsize::new(0));
    let monitor = {
        let (stop, max_fds) = (Arc::clone(&stop), Arc::clone(&max_fds));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                max_fds.fetch_max(fd_count(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let started = Instant::now();
    let mnt = m.mnt.clone();
    let run = |phase: &'static str| {
        std::thread::scope(|s| {
            for w in 0..WORKERS {
                let mnt = &mnt;
                s.spawn(move || {
                    for d in (w..DIRS).step_by(WORKERS) {
                        let dir = mnt.join(format!("d{d:03}"));
                        if phase == "create" {
                            fs::create_dir(&dir).unwrap();
                        }
                        // Names are resolved from a directory fd, so each file costs drainfs
                        // LOOKUP + CREATE + RELEASE, then LOOKUP + SETATTR (+ GETATTR).
                        let dfd = open(&dir, libc::O_RDONLY | libc::O_DIRECTORY, 0).unwrap();
                        for i in 0..PER_DIR {
                            let name = std::ffi::CString::new(format!("f{i:04}")).unwrap();
                            if phase == "create" {
                                // SAFETY: valid dirfd and NUL-terminated name.
                                let fd = unsafe {
                                    libc::openat(
                                        dfd.as_raw_fd(),
                                        name.as_ptr(),
                                        libc::O_CREAT | libc::O_RDONLY | libc::O_CLOEXEC,
                                        0o644,
                                    )
                                };
                                let fd = owned_or_panic(fd, &dir, &name);
                                drop(fd);
                            } else {
                                // chmod is a SETATTR without a file handle: drainfs needs an
                                // O_PATH fd of the file itself for it.
                                // SAFETY: valid dirfd and NUL-terminated name.
                                let r = unsafe {
                                    libc::fchmodat(dfd.as_raw_fd(), name.as_ptr(), 0o600, 0)
                                };
                                owned_or_panic(if r == 0 { i32::MAX } else { r }, &dir, &name);
                                let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
                                // SAFETY: valid dirfd, name and out-pointer.
                                let r = unsafe {
                                    libc::fstatat(
                                        dfd.as_raw_fd(),
                                        name.as_ptr(),
                                        st.as_mut_ptr(),
                                        libc::AT_SYMLINK_NOFOLLOW,
                                    )
                                };
                                owned_or_panic(if r == 0 { i32::MAX } else { r }, &dir, &name);
                                // SAFETY: fstatat succeeded.
                                let st = unsafe { st.assume_init() };
                                assert_eq!(st.st_mode, libc::S_IFREG | 0o600);
                                assert_eq!(st.st_size, 0);
                            }
                        }
                    }
                });
            }
        });
    };
    run("create");
    let created = started.elapsed();
    run("stat");
    stop.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    let max = max_fds.load(Ordering::Relaxed);
    eprintln!(
        "{mode}: 100k creates in {created:?}, stats in {:?}; drainfs peak fds {max}",
        started.elapsed() - created
    );
    assert!(max > 0, "the monitor saw drainfs");
    assert!(max < 2_000, "drainfs held {max} fds");
    let on_lower: usize = (0..DIRS)
        .map(|d| {
            fs::read_dir(m.lower_path(&format!("d{d:03}")))
                .unwrap()
                .count()
        })
        .sum();
    assert_eq!(on_lower, DIRS * PER_DIR);
    // Still serving, with the limit in place.
    assert_eq!(get_nofile(pid), (20_000, 20_000));
    fs::write(m.path("after"), b"ok").unwrap();
    assert_eq!(fs::read(m.path("after")).unwrap(), b"ok");
}

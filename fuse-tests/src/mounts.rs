//! Mount checks for the mount tests: the mount table (proc(5) mountinfo) of any mount
//! namespace, whether and what is mounted at a path, which mount ID sits on top, and the
//! cleanup that detaches what a test left mounted: by path ([`force_unmount`], the
//! [`Unmount`] guard) or down to a known mount ID ([`detach_down_to`]).

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One line of a mountinfo table (proc(5)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mnt {
    /// Mount ID.
    pub id: u64,
    /// Parent mount ID.
    pub parent: u64,
    /// `major:minor` of the mounted file system (for FUSE the minor is the connection number).
    pub devno: String,
    /// Mount point (octal escapes left as they are; test paths have none).
    pub mount_point: PathBuf,
    /// Optional fields (`shared:N`, `master:N`...), space-separated.
    pub propagation: String,
    /// File system type (`fuse` for a FUSE file system mounted directly by root, which has no
    /// subtype then; `fuse.<subtype>` through fusermount3).
    pub fstype: String,
    /// Mount source (a FUSE file system's fsname: `drainfs`, `bucketfs:<bucket>`).
    pub source: String,
}

impl Mnt {
    /// Whether it is a FUSE mount.
    pub fn is_fuse(&self) -> bool {
        self.fstype == "fuse" || self.fstype.starts_with("fuse.") || self.fstype == "fuseblk"
    }
}

/// Parses mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<Mnt> {
    text.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let f: Vec<&str> = left.split(' ').collect();
            Some(Mnt {
                id: f.first()?.parse().ok()?,
                parent: f.get(1)?.parse().ok()?,
                devno: f.get(2)?.to_string(),
                mount_point: PathBuf::from(*f.get(4)?),
                propagation: f.get(6..).map(|o| o.join(" ")).unwrap_or_default(),
                fstype: right.split(' ').next()?.to_string(),
                source: right.split(' ').nth(1)?.to_string(),
            })
        })
        .collect()
}

/// The mount table of the mount namespace `pid` is in (`self` for the test's own).
pub fn mountinfo_of(pid: &str) -> Vec<Mnt> {
    parse_mountinfo(&std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default())
}

/// The mounts at `path`, bottom first (in table order).
pub fn mounts_at(table: &[Mnt], path: &Path) -> Vec<Mnt> {
    table
        .iter()
        .filter(|m| m.mount_point == path)
        .cloned()
        .collect()
}

/// The topmost mount at `path`: the one no other mount at `path` is stacked on.
pub fn top_at(table: &[Mnt], path: &Path) -> Option<Mnt> {
    let here = mounts_at(table, path);
    here.iter()
        .rev()
        .find(|m| !here.iter().any(|o| o.parent == m.id))
        .cloned()
}

/// The mount ID on top at `path` in the test's own mount namespace, if anything is mounted
/// there.
pub fn mount_id_at(path: &Path) -> Option<u64> {
    top_at(&mountinfo_of("self"), path).map(|m| m.id)
}

/// Whether `path` (absolute) is a mount point right now.
pub fn is_mounted(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = path.to_string_lossy().replace(' ', "\\040");
    text.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_str()))
}

/// The file system type mounted at `path` (the top of the stack), if any.
pub fn fstype_at(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = path.to_string_lossy().replace(' ', "\\040");
    // The last matching line is the top of the stack.
    text.lines().rev().find_map(|l| {
        if l.split(' ').nth(4) != Some(p.as_str()) {
            return None;
        }
        let (_, after) = l.split_once(" - ")?;
        after.split(' ').next().map(str::to_string)
    })
}

/// `fusermount3 -u -z -q path`: the lazy unmount of a FUSE mount (errors ignored).
fn fusermount_lazy(path: &Path) {
    let _ = Command::new("fusermount3")
        .args(["-u", "-z", "-q"])
        .arg(path)
        .stderr(Stdio::null())
        .status();
}

/// `umount -l path` (errors ignored).
fn umount_lazy(path: &Path) {
    let _ = Command::new("umount")
        .arg("-l")
        .arg(path)
        .stderr(Stdio::null())
        .status();
}

/// Detaches anything still mounted at `path`, lazily (`fusermount3 -u -z`, then `umount -l`),
/// up to 8 tries: the mount leaves the tree even when its FUSE daemon is wedged (the
/// connection itself is not aborted; [`Fusectl::abort`] does that).
pub fn force_unmount(path: &Path) {
    for _ in 0..8 {
        if !is_mounted(path) {
            return;
        }
        fusermount_lazy(path);
        if is_mounted(path) {
            umount_lazy(path);
        }
    }
}

/// `umount2(path)` (not lazy), retried every 50 ms while it fails with `EBUSY`, for up to
/// `within`; the last error otherwise. `EBUSY` right after a test closed its own files can be
/// another test thread's spawn: a child between its fork and its exec holds a copy of every fd
/// the test process had open at the fork (`O_CLOEXEC` closes them only at the exec), and on a
/// loaded machine that window is long enough to meet (seen under
/// `scripts/test-under-load.sh`).
pub fn umount_when_free(path: &Path, within: std::time::Duration) -> nix::Result<()> {
    let deadline = std::time::Instant::now() + within;
    loop {
        match nix::mount::umount2(path, nix::mount::MntFlags::empty()) {
            Err(nix::errno::Errno::EBUSY) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// Detaches, top first, every mount stacked at `path` on the node (the test's namespace) down
/// to and including the mount `id` (a volume's bind mount); mounts below `id` stay.
pub fn detach_down_to(path: &Path, id: u64) {
    for _ in 0..16 {
        let Some(top) = top_at(&mountinfo_of("self"), path) else {
            return;
        };
        if top.is_fuse() {
            fusermount_lazy(path);
        }
        if top_at(&mountinfo_of("self"), path).is_some_and(|t| t.id == top.id) {
            umount_lazy(path);
        }
        if top.id == id {
            return;
        }
    }
}

/// Detaches whatever is still mounted at its path when dropped ([`force_unmount`]), also when
/// the test panicked.
pub struct Unmount(pub PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        force_unmount(&self.0);
    }
}

/// Where the FUSE control file system lives.
pub const FUSECTL: &str = "/sys/fs/fuse/connections";

/// The FUSE control file system at [`FUSECTL`], mounted for as long as any of these lives in
/// this test process when it was not mounted already (a bare VM or container may not have it;
/// `scripts/test.sh` mounts it up front). The guards of concurrent tests share one count, so
/// one test's guard never unmounts it under another's.
pub struct Fusectl(());

/// How many [`Fusectl`] guards live, and whether the first of them mounted it.
static FUSECTL_USERS: std::sync::Mutex<(usize, bool)> = std::sync::Mutex::new((0, false));

impl Fusectl {
    /// Mounts the control file system unless it is mounted already.
    ///
    /// # Panics
    /// If mounting it fails.
    pub fn ensure() -> Fusectl {
        let mut users = FUSECTL_USERS.lock().unwrap_or_else(|e| e.into_inner());
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
        if !mounts.lines().any(|l| l.split(' ').nth(1) == Some(FUSECTL)) {
            nix::mount::mount(
                Some("fusectl"),
                FUSECTL,
                Some("fusectl"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .unwrap_or_else(|e| panic!("mount fusectl on {FUSECTL}: {e}"));
            users.1 = true;
        }
        users.0 += 1;
        Fusectl(())
    }

    /// Aborts the FUSE connection of the mount at `mnt`, found in mountinfo (no `stat` of the
    /// mount, which would wait on a wedged daemon) and aborted only while it is still that
    /// mount's ([`crate::bound::abort_connection`]).
    ///
    /// # Panics
    /// If no FUSE mount is at `mnt`, or the abort file refuses the write.
    pub fn abort(mnt: &Path) {
        let m = crate::bound::fuse_mounts_under(&[mnt.to_path_buf()])
            .into_iter()
            .rfind(|m| m.path == mnt)
            .unwrap_or_else(|| panic!("no FUSE mount at {}", mnt.display()));
        assert!(
            crate::bound::abort_connection(&m),
            "{FUSECTL}/{}/abort: the connection of {} did not take the abort",
            m.minor,
            mnt.display()
        );
    }
}

impl Drop for Fusectl {
    fn drop(&mut self) {
        let mut users = FUSECTL_USERS.lock().unwrap_or_else(|e| e.into_inner());
        users.0 -= 1;
        if users.0 == 0 && users.1 {
            let _ = nix::mount::umount2(FUSECTL, nix::mount::MntFlags::MNT_DETACH);
            users.1 = false;
        }
    }
}

/// A FUSE mount with no daemon: the test holds its `/dev/fuse` fd (non-blocking) and never
/// answers, so it costs a millisecond to make and sends nothing anywhere. It stands for
/// another pod's FUSE mount on the node. Detached (and its fd closed) when dropped.
pub struct BareFuse {
    fd: std::os::fd::OwnedFd,
    /// Where it is mounted.
    pub path: PathBuf,
    /// Its connection number (the minor of its device number).
    pub minor: u32,
}

impl BareFuse {
    /// Mounts a bare FUSE file system (type `fuse`, source `bare`) at the directory `path`.
    ///
    /// # Panics
    /// When `/dev/fuse` cannot be opened, `mount(2)` fails, or the mount is not in mountinfo.
    pub fn mount(path: &Path) -> BareFuse {
        use std::os::fd::AsRawFd;
        crate::bound::own_dir(path);
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/fuse")
            .expect("open /dev/fuse");
        let fd: std::os::fd::OwnedFd = dev.into();
        let data = format!("fd={},rootmode=40000,user_id=0,group_id=0", fd.as_raw_fd());
        nix::mount::mount(
            Some("bare"),
            path,
            Some("fuse"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(data.as_str()),
        )
        .unwrap_or_else(|e| panic!("mount a bare FUSE file system at {}: {e}", path.display()));
        let m = top_at(&mountinfo_of("self"), path).expect("the bare mount in mountinfo");
        let minor = m
            .devno
            .split(':')
            .nth(1)
            .and_then(|n| n.parse().ok())
            .expect("minor");
        BareFuse {
            fd,
            path: path.to_path_buf(),
            minor,
        }
    }

    /// Whether its connection is still up: a read of its `/dev/fuse` fd gives a request (the
    /// INIT it was never answered) or EAGAIN, not ENODEV (ended by an abort).
    pub fn connected(&self) -> bool {
        let mut buf = vec![0u8; 1 << 21];
        !matches!(
            nix::unistd::read(&self.fd, &mut buf),
            Err(nix::errno::Errno::ENODEV)
        )
    }
}

impl Drop for BareFuse {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.path, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    use std::time::Duration;

    /// What [`umount_when_free`] waits out, made on purpose: a thread spawns a child that
    /// says (over a pipe) when it is between its fork and its exec and stays there 2 s, while
    /// the test's own file on a tmpfs is open; the test then closes its file, and a plain
    /// unmount still gets `EBUSY` (the child's copy of the fd); `umount_when_free` succeeds
    /// once the child has exec'd.
    #[test]
    fn umount_when_free_waits_out_a_spawning_child_holding_a_copy_of_an_fd() {
        let dir = crate::harness::scratch_dir("/tmp", "drainfs-umount-free-");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &mnt,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount tmpfs (the test runs as root)");
        let _unmount = Unmount(mnt.clone());
        let f = std::fs::File::create(mnt.join("f")).unwrap();
        // O_CLOEXEC: the other tests' children must not inherit the pipe.
        let (forked_r, forked_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        let w = forked_w.as_raw_fd();
        let spawner = std::thread::spawn(move || {
            let mut cmd = Command::new("true");
            // SAFETY: only write(2) and nanosleep(2), async-signal-safe, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    libc::write(w, b"x".as_ptr().cast(), 1);
                    std::thread::sleep(Duration::from_secs(2));
                    Ok(())
                });
            }
            cmd.status().unwrap()
        });
        let mut pfd = [nix::poll::PollFd::new(
            std::os::fd::AsFd::as_fd(&forked_r),
            nix::poll::PollFlags::POLLIN,
        )];
        let n = nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(30_000u16)).unwrap();
        assert_eq!(n, 1, "the child never reached its pre-exec step");
        drop(f);
        assert_eq!(
            nix::mount::umount2(&mnt, nix::mount::MntFlags::empty()),
            Err(nix::errno::Errno::EBUSY),
            "the child's copy of the closed fd did not hold the mount"
        );
        umount_when_free(&mnt, Duration::from_secs(30)).unwrap();
        assert!(!is_mounted(&mnt));
        assert!(spawner.join().unwrap().success());
        drop(forked_w);
    }
}

//! Thin, safe wrappers over the Linux syscalls the core issues on the lower.
//!
//! Each returns the lower's errno unchanged on failure. Paths are `CStr` names relative to a
//! directory fd (the `*at` family), never absolute paths, so renames of ancestors on the lower
//! cannot redirect an operation.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

/// `struct stat` of the lower.
pub type Stat = libc::stat;

fn cvt(ret: libc::c_int) -> Result<libc::c_int, Errno> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

fn cvt_ssize(ret: libc::ssize_t) -> Result<usize, Errno> {
    if ret < 0 {
        Err(Errno::last())
    } else {
        Ok(ret as usize)
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; with an empty name, `AT_EMPTY_PATH` (stat the
/// fd itself).
pub fn fstatat(dir: BorrowedFd<'_>, name: &CStr) -> Result<Stat, Errno> {
    let mut st = std::mem::MaybeUninit::<Stat>::uninit();
    let flags = if name.is_empty() {
        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW
    } else {
        libc::AT_SYMLINK_NOFOLLOW
    };
    // SAFETY: `st` is a valid out-pointer for one `struct stat`; `name` is NUL-terminated.
    cvt(unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), flags) })?;
    // SAFETY: fstatat succeeded, so it initialised `st`.
    Ok(unsafe { st.assume_init() })
}

/// `fstat(fd)`.
pub fn fstat(fd: BorrowedFd<'_>) -> Result<Stat, Errno> {
    fstatat(fd, c"")
}

/// `openat(dir, name, flags, mode)` with `O_CLOEXEC` added.
pub fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> Result<OwnedFd, Errno> {
    // SAFETY: `name` is NUL-terminated; the returned fd is owned by nobody else.
    let fd = cvt(unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    })?;
    // SAFETY: `fd` was just returned by openat and is owned by us alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The `/proc/self/fd/N` path of an fd: reopening through it gives a new open file
/// description of the same inode (used for O_PATH fds and unlinked files).
pub fn proc_fd_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a formatted path")
}

/// Reopens an fd with new flags through `/proc/self/fd/N`.
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> Result<OwnedFd, Errno> {
    let path = proc_fd_path(fd.as_raw_fd());
    // SAFETY: `path` is NUL-terminated; the fd is owned by us alone.
    let nfd = cvt(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) })?;
    // SAFETY: `nfd` was just returned by open.
    Ok(unsafe { OwnedFd::from_raw_fd(nfd) })
}

/// `mkdirat`.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Result<(), Errno> {
    // SAFETY: plain syscall on a NUL-terminated name.
    cvt(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) }).map(drop)
}

/// `mknodat`.
pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> Result<(), Errno> {
    // SAFETY: plain syscall on a NUL-terminated name.
    cvt(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), mode, rdev) }).map(drop)
}

/// `symlinkat(target, dir, name)`.
pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    // SAFETY: plain syscall on NUL-terminated strings.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) }).map(drop)
}

/// `unlinkat(dir, name, flags)` (`AT_REMOVEDIR` for rmdir).
pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, flags: i32) -> Result<(), Errno> {
    // SAFETY: plain syscall on a NUL-terminated name.
    cvt(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) }).map(drop)
}

/// `renameat2` (flags: RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT as given).
pub fn renameat2(
    olddir: BorrowedFd<'_>,
    oldname: &CStr,
    newdir: BorrowedFd<'_>,
    newname: &CStr,
    flags: u32,
) -> Result<(), Errno> {
    // SAFETY: plain syscall on NUL-terminated names.
    cvt(unsafe {
        libc::renameat2(
            olddir.as_raw_fd(),
            oldname.as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            flags,
        )
    })
    .map(drop)
}

/// `linkat(fd, "", newdir, newname, AT_EMPTY_PATH)`: a hard link to the inode behind `fd`.
pub fn link_fd(fd: BorrowedFd<'_>, newdir: BorrowedFd<'_>, newname: &CStr) -> Result<(), Errno> {
    // SAFETY: plain syscall; AT_EMPTY_PATH with "" names the fd itself.
    let r = cvt(unsafe {
        libc::linkat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            newdir.as_raw_fd(),
            newname.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    });
    match r {
        // Without CAP_DAC_READ_SEARCH, AT_EMPTY_PATH is refused: go through /proc instead.
        Err(Errno::ENOENT) | Err(Errno::EPERM) => {
            let path = proc_fd_path(fd.as_raw_fd());
            // SAFETY: plain syscall on NUL-terminated names.
            cvt(unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    newdir.as_raw_fd(),
                    newname.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            })
            .map(drop)
        }
        other => other.map(drop),
    }
}

/// `readlinkat(dir, name)`.
pub fn readlinkat(dir: BorrowedFd<'_>, name: &CStr) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `buf` is writable for its length.
    let n = cvt_ssize(unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    })?;
    buf.truncate(n);
    Ok(buf)
}

/// `pread`.
pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
    // SAFETY: `buf` is writable for its length.
    cvt_ssize(unsafe {
        libc::pread(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            offset as i64,
        )
    })
}

/// `pwrite`, repeated until everything is written or an error occurs.
pub fn pwrite_all(fd: BorrowedFd<'_>, mut data: &[u8], mut offset: u64) -> Result<usize, Errno> {
    let total = data.len();
    while !data.is_empty() {
        // SAFETY: `data` is readable for its length.
        let n = cvt_ssize(unsafe {
            libc::pwrite(
                fd.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                offset as i64,
            )
        })?;
        if n == 0 {
            break;
        }
        data = &data[n..];
        offset += n as u64;
    }
    Ok(total - data.len())
}

/// FLUSH on the lower: `close(dup(fd))`, so the lower sees a FLUSH (gcsfuse uploads there)
/// and its error comes back to us, while our fd stays open for RELEASE. This is what
/// libfuse's passthrough_hp and virtiofsd do.
pub fn flush(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: dup of a valid fd.
    let dup = cvt(unsafe { libc::dup(fd.as_raw_fd()) })?;
    // SAFETY: `dup` is ours alone; close reports the lower's FLUSH error.
    cvt(unsafe { libc::close(dup) }).map(drop)
}

/// `close(fd)` with its result: closing a lower fd is the lower's FLUSH (and, for the last
/// reference, its RELEASE), so this is where an upload started by late writes reports its
/// error. The fd is closed whatever the result (Linux never keeps it open after close).
pub fn close(fd: OwnedFd) -> Result<(), Errno> {
    use std::os::fd::IntoRawFd;
    // SAFETY: we own `fd` and close it exactly once.
    cvt(unsafe { libc::close(fd.into_raw_fd()) }).map(drop)
}

/// `fsync` or `fdatasync`.
pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> Result<(), Errno> {
    // SAFETY: plain syscall on a valid fd.
    cvt(unsafe {
        if datasync {
            libc::fdatasync(fd.as_raw_fd())
        } else {
            libc::fsync(fd.as_raw_fd())
        }
    })
    .map(drop)
}

/// `fallocate`.
pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> Result<(), Errno> {
    // SAFETY: plain syscall on a valid fd.
    cvt(unsafe { libc::fallocate(fd.as_raw_fd(), mode, offset as i64, len as i64) }).map(drop)
}

/// `lseek` (used for SEEK_DATA / SEEK_HOLE; drainfs never relies on the fd position).
pub fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> Result<i64, Errno> {
    // SAFETY: plain syscall on a valid fd.
    let r = unsafe { libc::lseek(fd.as_raw_fd(), offset, whence) };
    if r < 0 { Err(Errno::last()) } else { Ok(r) }
}

/// `copy_file_range` between two lower fds at explicit offsets.
pub fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    off_in: u64,
    fd_out: BorrowedFd<'_>,
    off_out: u64,
    len: u64,
    flags: u32,
) -> Result<usize, Errno> {
    let mut oi = off_in as i64;
    let mut oo = off_out as i64;
    // SAFETY: the offset pointers are valid for the call.
    cvt_ssize(unsafe {
        libc::copy_file_range(
            fd_in.as_raw_fd(),
            &mut oi,
            fd_out.as_raw_fd(),
            &mut oo,
            len as usize,
            flags,
        )
    })
}

/// `fstatvfs`.
pub fn fstatvfs(fd: BorrowedFd<'_>) -> Result<libc::statvfs, Errno> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `st` is a valid out-pointer.
    cvt(unsafe { libc::fstatvfs(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: initialised by the successful call.
    Ok(unsafe { st.assume_init() })
}

/// `fchmodat(AT_FDCWD, /proc/self/fd/N)` (works for O_PATH fds).
pub fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> Result<(), Errno> {
    let path = proc_fd_path(fd.as_raw_fd());
    // SAFETY: NUL-terminated path.
    cvt(unsafe { libc::fchmodat(libc::AT_FDCWD, path.as_ptr(), mode, 0) }).map(drop)
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH)`; `u32::MAX` leaves an id unchanged.
pub fn chown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> Result<(), Errno> {
    // SAFETY: plain syscall; "" with AT_EMPTY_PATH names the fd.
    cvt(unsafe {
        libc::fchownat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
    .map(drop)
}

/// `truncate(/proc/self/fd/N, size)`.
pub fn truncate_fd_path(fd: BorrowedFd<'_>, size: u64) -> Result<(), Errno> {
    let path = proc_fd_path(fd.as_raw_fd());
    // SAFETY: NUL-terminated path.
    cvt(unsafe { libc::truncate(path.as_ptr(), size as i64) }).map(drop)
}

/// `ftruncate(fd, size)`.
pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> Result<(), Errno> {
    // SAFETY: plain syscall.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), size as i64) }).map(drop)
}

/// `utimensat(dir, name, times, flags)`; an empty name with `AT_EMPTY_PATH` names the fd.
pub fn utimensat(
    dir: BorrowedFd<'_>,
    name: &CStr,
    times: &[libc::timespec; 2],
    flags: i32,
) -> Result<(), Errno> {
    // SAFETY: `times` points at two timespecs.
    cvt(unsafe { libc::utimensat(dir.as_raw_fd(), name.as_ptr(), times.as_ptr(), flags) }).map(drop)
}

/// The four xattr calls, through `/proc/self/fd/N` so they work on O_PATH fds.
pub mod xattr {
    use super::*;

    /// `getxattr`; an empty `buf` asks for the size.
    pub fn get(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
        let path = proc_fd_path(fd.as_raw_fd());
        // SAFETY: buffer valid for its length (or null with 0).
        cvt_ssize(unsafe {
            libc::getxattr(
                path.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        })
    }

    /// `listxattr`; an empty `buf` asks for the size.
    pub fn list(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
        let path = proc_fd_path(fd.as_raw_fd());
        // SAFETY: buffer valid for its length.
        cvt_ssize(unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })
    }

    /// `setxattr`.
    pub fn set(fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> Result<(), Errno> {
        let path = proc_fd_path(fd.as_raw_fd());
        // SAFETY: value valid for its length.
        cvt(unsafe {
            libc::setxattr(
                path.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        })
        .map(drop)
    }

    /// `removexattr`.
    pub fn remove(fd: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
        let path = proc_fd_path(fd.as_raw_fd());
        // SAFETY: NUL-terminated strings.
        cvt(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) }).map(drop)
    }
}

/// Reads directory entries with `getdents64` into `buf`; returns the bytes filled (0 at end).
pub fn getdents64(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: buffer valid for its length; the kernel writes whole dirent64 records.
    let n = unsafe {
        libc::syscall(
            libc::SYS_getdents64,
            fd.as_raw_fd(),
            buf.as_mut_ptr(),
            buf.len(),
        )
    };
    if n < 0 {
        Err(Errno::last())
    } else {
        Ok(n as usize)
    }
}

/// One record of a `getdents64` buffer.
#[derive(Debug)]
pub struct Dirent<'a> {
    /// Lower inode number.
    pub ino: u64,
    /// Cookie to seek to the entry after this one.
    pub off: i64,
    /// `DT_*` type.
    pub typ: u8,
    /// Name bytes (no NUL).
    pub name: &'a [u8],
    /// Length of the record.
    pub reclen: usize,
}

/// Parses the record at the start of `buf` (`struct linux_dirent64`).
pub fn parse_dirent(buf: &[u8]) -> Option<Dirent<'_>> {
    if buf.len() < 19 {
        return None;
    }
    let ino = u64::from_ne_bytes(buf[0..8].try_into().ok()?);
    let off = i64::from_ne_bytes(buf[8..16].try_into().ok()?);
    let reclen = u16::from_ne_bytes(buf[16..18].try_into().ok()?) as usize;
    let typ = buf[18];
    if reclen < 19 || reclen > buf.len() {
        return None;
    }
    let raw = &buf[19..reclen];
    let len = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    Some(Dirent {
        ino,
        off,
        typ,
        name: &raw[..len],
        reclen,
    })
}

/// The process a request that creates an inode comes from (FUSE request header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// The caller's fsuid.
    pub uid: u32,
    /// The caller's fsgid.
    pub gid: u32,
    /// The calling thread's id (0 when the kernel itself sends the request), used to read its
    /// supplementary groups.
    pub pid: u32,
}

impl Caller {
    /// Root, as for requests made by drainfs itself (and in tests).
    pub const ROOT: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
    };
}

/// Supplementary groups of thread/process `pid`, from the `Groups:` line of
/// `/proc/<pid>/status` (what libfuse's `fuse_req_getgroups` reads). Empty when unreadable
/// (pid 0, or the caller is gone): the least privilege.
pub fn caller_groups(pid: u32) -> Vec<libc::gid_t> {
    if pid == 0 {
        return Vec::new();
    }
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Groups:").map(|g| {
                    g.split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect()
                })
            })
        })
        .unwrap_or_default()
}

/// drainfs's own supplementary groups, captured once before any thread switches.
fn own_groups() -> &'static [libc::gid_t] {
    static GROUPS: std::sync::OnceLock<Vec<libc::gid_t>> = std::sync::OnceLock::new();
    GROUPS.get_or_init(|| {
        // SAFETY: a size query, then a buffer of that size.
        unsafe {
            let n = libc::getgroups(0, std::ptr::null_mut());
            let mut v = vec![0; n.max(0) as usize];
            let got = libc::getgroups(n.max(0), v.as_mut_ptr());
            v.truncate(got.max(0) as usize);
            v
        }
    })
}

/// `setgroups(2)` for the calling thread only. The raw syscall is per-thread on Linux;
/// glibc's `setgroups()` would change every thread of the process.
fn set_thread_groups(groups: &[libc::gid_t]) -> Result<(), Errno> {
    // SAFETY: `groups` is valid for its length.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// Per-thread credentials for operations that create inodes: the lower then checks
/// permissions and assigns the caller's uid/gid (and applies set-group-ID directories)
/// exactly as for a local caller. The caller's supplementary groups are switched to as well:
/// a user allowed by the kernel through a supplementary group (a pod's fsGroup on a
/// group-writable directory) must not be refused by the lower. `setfsuid`, `setfsgid` and the
/// raw `setgroups` syscall are per-thread on Linux. A no-op when drainfs is not root or the
/// caller is root with group 0; a root caller with another group gets only its fsgid
/// switched (new inodes get that group, as on the lower; root's permission checks do not
/// depend on its groups).
pub struct CallerCreds {
    switched: bool,
}

impl CallerCreds {
    /// Switches this thread's fsuid, fsgid and supplementary groups to the caller's until
    /// dropped. If the groups cannot be read or set, the thread keeps drainfs's groups.
    pub fn switch(caller: Caller) -> Self {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 || (caller.uid == 0 && caller.gid == 0) {
            return CallerCreds { switched: false };
        }
        if caller.uid == 0 {
            // SAFETY: setfsgid only changes this thread's filesystem gid.
            unsafe { libc::setfsgid(caller.gid) };
            return CallerCreds { switched: true };
        }
        let _ = own_groups();
        // Before setfsuid: setgroups needs CAP_SETGID, which a non-zero fsuid does not drop,
        // but keep the privileged step first anyway.
        let _ = set_thread_groups(&caller_groups(caller.pid));
        // SAFETY: setfsgid/setfsuid only change this thread's filesystem ids.
        unsafe {
            libc::setfsgid(caller.gid);
            libc::setfsuid(caller.uid);
        }
        CallerCreds { switched: true }
    }
}

impl Drop for CallerCreds {
    fn drop(&mut self) {
        if self.switched {
            // SAFETY: restores this thread's filesystem ids to root.
            unsafe {
                libc::setfsuid(0);
                libc::setfsgid(0);
            }
            let _ = set_thread_groups(own_groups());
        }
    }
}

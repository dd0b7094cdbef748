//! The Linux syscalls the core issues on the lower, as functions that return the lower's
//! errno unchanged on failure.
//!
//! Almost all are [`rustix`] calls (nix for `close` with its result, path `truncate` and the
//! per-thread `setfsuid`/`setfsgid`); what neither crate offers is written here over libc:
//! `getdents64` into a buffer that outlives one READDIR (rustix's `RawDir` borrows its buffer
//! for one iteration only). Paths are `CStr` names relative to a directory fd (the `*at`
//! family), never absolute paths, so renames of ancestors on the lower cannot redirect an
//! operation; the only absolute paths are `/proc/self/fd/N` names of fds drainfs holds.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::errno::Errno;
use rustix::fs::{AtFlags, CWD, Mode, OFlags};
use rustix::process::{Gid, Uid};

/// `struct stat` of the lower.
pub type Stat = rustix::fs::Stat;

/// `struct statvfs` of the lower.
pub type StatVfs = rustix::fs::StatVfs;

/// Access and modification times for [`utimens_fd`]; a `tv_nsec` of
/// [`rustix::fs::UTIME_NOW`] or [`rustix::fs::UTIME_OMIT`] means "now" or "leave as is".
pub type Timestamps = rustix::fs::Timestamps;

/// The lower's errno from a rustix error.
fn errno(e: rustix::io::Errno) -> Errno {
    Errno::from_raw(e.raw_os_error())
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`; with an empty name, `AT_EMPTY_PATH` (stat the
/// fd itself).
pub fn fstatat(dir: BorrowedFd<'_>, name: &CStr) -> Result<Stat, Errno> {
    let flags = if name.is_empty() {
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW
    } else {
        AtFlags::SYMLINK_NOFOLLOW
    };
    rustix::fs::statat(dir, name, flags).map_err(errno)
}

/// `fstat(fd)` (through `fstatat(fd, "", AT_EMPTY_PATH)`, which works on O_PATH fds).
pub fn fstat(fd: BorrowedFd<'_>) -> Result<Stat, Errno> {
    fstatat(fd, c"")
}

/// `openat(dir, name, flags, mode)` with `O_CLOEXEC` added; `flags` and `mode` as in
/// `open(2)`.
pub fn openat(dir: BorrowedFd<'_>, name: &CStr, flags: i32, mode: u32) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(dir, name, oflags(flags), Mode::from_raw_mode(mode)).map_err(errno)
}

/// `open(path, flags)` relative to the working directory (absolute paths), with `O_CLOEXEC`.
pub fn open_path(path: &CStr, flags: i32) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(CWD, path, oflags(flags), Mode::empty()).map_err(errno)
}

fn oflags(flags: i32) -> OFlags {
    OFlags::from_bits_retain(flags as u32) | OFlags::CLOEXEC
}

/// The `/proc/self/fd/N` path of an fd: reopening through it gives a new open file
/// description of the same inode (used for O_PATH fds and unlinked files).
pub fn proc_fd_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a formatted path")
}

/// Reopens an fd with new flags through `/proc/self/fd/N`.
pub fn reopen(fd: BorrowedFd<'_>, flags: i32) -> Result<OwnedFd, Errno> {
    open_path(&proc_fd_path(fd.as_raw_fd()), flags)
}

/// `mkdirat`.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> Result<(), Errno> {
    rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(mode)).map_err(errno)
}

/// `mknodat`; `mode` carries the file type as in `mknod(2)` (none means a regular file).
///
/// # Errors
/// `EINVAL` for a mode whose type bits name no file type; else the lower's errno.
pub fn mknodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32, rdev: u64) -> Result<(), Errno> {
    use rustix::fs::FileType;
    let typ = match mode & libc::S_IFMT {
        0 => FileType::RegularFile,
        t => match FileType::from_raw_mode(t) {
            FileType::Unknown => return Err(Errno::EINVAL),
            t => t,
        },
    };
    rustix::fs::mknodat(dir, name, typ, Mode::from_raw_mode(mode), rdev).map_err(errno)
}

/// `symlinkat(target, dir, name)`.
pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    rustix::fs::symlinkat(target, dir, name).map_err(errno)
}

/// `unlinkat(dir, name)`, or with `AT_REMOVEDIR` when `rmdir`.
pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, rmdir: bool) -> Result<(), Errno> {
    let flags = if rmdir {
        AtFlags::REMOVEDIR
    } else {
        AtFlags::empty()
    };
    rustix::fs::unlinkat(dir, name, flags).map_err(errno)
}

/// `renameat2` (flags: RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT as given).
pub fn renameat2(
    olddir: BorrowedFd<'_>,
    oldname: &CStr,
    newdir: BorrowedFd<'_>,
    newname: &CStr,
    flags: u32,
) -> Result<(), Errno> {
    let flags = rustix::fs::RenameFlags::from_bits_retain(flags);
    rustix::fs::renameat_with(olddir, oldname, newdir, newname, flags).map_err(errno)
}

/// `linkat(fd, "", newdir, newname, AT_EMPTY_PATH)`: a hard link to the inode behind `fd`.
pub fn link_fd(fd: BorrowedFd<'_>, newdir: BorrowedFd<'_>, newname: &CStr) -> Result<(), Errno> {
    match rustix::fs::linkat(fd, c"", newdir, newname, AtFlags::EMPTY_PATH).map_err(errno) {
        // Without CAP_DAC_READ_SEARCH, AT_EMPTY_PATH is refused: go through /proc instead.
        Err(Errno::ENOENT | Errno::EPERM) => {
            let path = proc_fd_path(fd.as_raw_fd());
            rustix::fs::linkat(CWD, &path, newdir, newname, AtFlags::SYMLINK_FOLLOW).map_err(errno)
        }
        other => other,
    }
}

/// `readlinkat(dir, name)`.
pub fn readlinkat(dir: BorrowedFd<'_>, name: &CStr) -> Result<Vec<u8>, Errno> {
    rustix::fs::readlinkat(dir, name, Vec::new())
        .map(CString::into_bytes)
        .map_err(errno)
}

/// `pread`.
pub fn pread(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
    rustix::io::pread(fd, buf, offset).map_err(errno)
}

/// `pwrite`, repeated until everything is written or an error occurs.
pub fn pwrite_all(fd: BorrowedFd<'_>, mut data: &[u8], mut offset: u64) -> Result<usize, Errno> {
    let total = data.len();
    while !data.is_empty() {
        let n = rustix::io::pwrite(fd, data, offset).map_err(errno)?;
        if n == 0 {
            break;
        }
        data = &data[n..];
        offset += n as u64;
    }
    Ok(total - data.len())
}

/// Memory alignment of the buffers of I/O on an O_DIRECT lower fd ([`pread_direct`],
/// [`pwrite_all_direct`]): a page, enough for any file system's direct I/O.
const DIRECT_ALIGN: usize = 4096;

/// Sets or clears O_DIRECT on `fd`'s open file description (`fcntl(F_SETFL)`).
///
/// # Errors
/// The lower's errno (`EINVAL` when its file system has no direct I/O).
pub fn set_direct(fd: BorrowedFd<'_>, on: bool) -> Result<(), Errno> {
    let mut flags = rustix::fs::fcntl_getfl(fd).map_err(errno)?;
    flags.set(OFlags::DIRECT, on);
    rustix::fs::fcntl_setfl(fd, flags).map_err(errno)
}

/// A zeroed buffer of `len` bytes at a [`DIRECT_ALIGN`]ed address: the storage and the
/// offset of the buffer in it.
fn aligned(len: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; len + DIRECT_ALIGN];
    let off = v.as_ptr().align_offset(DIRECT_ALIGN);
    (v, off)
}

/// [`pread`] on an O_DIRECT fd: through a page-aligned buffer when `buf` is not aligned.
pub fn pread_direct(fd: BorrowedFd<'_>, buf: &mut [u8], offset: u64) -> Result<usize, Errno> {
    if buf.as_ptr().align_offset(DIRECT_ALIGN) == 0 {
        return pread(fd, buf, offset);
    }
    let (mut v, off) = aligned(buf.len());
    let n = pread(fd, &mut v[off..off + buf.len()], offset)?;
    buf[..n].copy_from_slice(&v[off..off + n]);
    Ok(n)
}

/// [`pwrite_all`] on an O_DIRECT fd: from a page-aligned copy when `data` is not aligned.
pub fn pwrite_all_direct(fd: BorrowedFd<'_>, data: &[u8], offset: u64) -> Result<usize, Errno> {
    if data.as_ptr().align_offset(DIRECT_ALIGN) == 0 {
        return pwrite_all(fd, data, offset);
    }
    let (mut v, off) = aligned(data.len());
    v[off..off + data.len()].copy_from_slice(data);
    pwrite_all(fd, &v[off..off + data.len()], offset)
}

/// FLUSH on the lower: `close(dup(fd))`, so the lower sees a FLUSH (gcsfuse uploads there)
/// and its error comes back to us, while our fd stays open for RELEASE. This is what
/// libfuse's passthrough_hp and virtiofsd do.
pub fn flush(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    close(rustix::io::dup(fd).map_err(errno)?)
}

/// `close(fd)` with its result: closing a lower fd is the lower's FLUSH (and, for the last
/// reference, its RELEASE), so this is where an upload started by late writes reports its
/// error. The fd is closed whatever the result (Linux never keeps it open after close).
pub fn close(fd: OwnedFd) -> Result<(), Errno> {
    nix::unistd::close(fd)
}

/// `fsync` or `fdatasync`.
pub fn fsync(fd: BorrowedFd<'_>, datasync: bool) -> Result<(), Errno> {
    if datasync {
        rustix::fs::fdatasync(fd).map_err(errno)
    } else {
        rustix::fs::fsync(fd).map_err(errno)
    }
}

/// `fallocate(fd, mode, offset, len)`; `mode` as in `fallocate(2)`.
pub fn fallocate(fd: BorrowedFd<'_>, mode: i32, offset: u64, len: u64) -> Result<(), Errno> {
    let mode = rustix::fs::FallocateFlags::from_bits_retain(mode as u32);
    rustix::fs::fallocate(fd, mode, offset, len).map_err(errno)
}

/// `lseek` with `whence` one of `SEEK_SET`, `SEEK_CUR`, `SEEK_END`, `SEEK_DATA`, `SEEK_HOLE`
/// (drainfs never relies on the fd position of a file).
///
/// # Errors
/// `EINVAL` for another `whence`, or a negative offset with an absolute one; else the lower's
/// errno (`ENXIO` past the end for `SEEK_DATA`/`SEEK_HOLE`).
pub fn lseek(fd: BorrowedFd<'_>, offset: i64, whence: i32) -> Result<i64, Errno> {
    use rustix::fs::SeekFrom;
    let absolute = || u64::try_from(offset).map_err(|_| Errno::EINVAL);
    let pos = match whence {
        libc::SEEK_SET => SeekFrom::Start(absolute()?),
        libc::SEEK_CUR => SeekFrom::Current(offset),
        libc::SEEK_END => SeekFrom::End(offset),
        libc::SEEK_DATA => SeekFrom::Data(absolute()?),
        libc::SEEK_HOLE => SeekFrom::Hole(absolute()?),
        _ => return Err(Errno::EINVAL),
    };
    let at = rustix::fs::seek(fd, pos).map_err(errno)?;
    i64::try_from(at).map_err(|_| Errno::EOVERFLOW)
}

/// `copy_file_range` between two lower fds at explicit offsets.
///
/// # Errors
/// `EINVAL` for non-zero `flags` (as `copy_file_range(2)` answers); else the lower's errno.
pub fn copy_file_range(
    fd_in: BorrowedFd<'_>,
    mut off_in: u64,
    fd_out: BorrowedFd<'_>,
    mut off_out: u64,
    len: u64,
    flags: u32,
) -> Result<usize, Errno> {
    if flags != 0 {
        return Err(Errno::EINVAL);
    }
    let len = usize::try_from(len).unwrap_or(usize::MAX);
    rustix::fs::copy_file_range(fd_in, Some(&mut off_in), fd_out, Some(&mut off_out), len)
        .map_err(errno)
}

/// `fstatvfs`.
pub fn fstatvfs(fd: BorrowedFd<'_>) -> Result<StatVfs, Errno> {
    rustix::fs::fstatvfs(fd).map_err(errno)
}

/// `fchmod(fd, mode)` on an fd open for I/O.
pub fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> Result<(), Errno> {
    rustix::fs::fchmod(fd, Mode::from_raw_mode(mode)).map_err(errno)
}

/// `fchmodat(AT_FDCWD, /proc/self/fd/N)` (works for O_PATH fds).
pub fn chmod_fd(fd: BorrowedFd<'_>, mode: u32) -> Result<(), Errno> {
    let path = proc_fd_path(fd.as_raw_fd());
    rustix::fs::chmodat(CWD, &path, Mode::from_raw_mode(mode), AtFlags::empty()).map_err(errno)
}

/// `fchownat(fd, "", uid, gid, AT_EMPTY_PATH)`; `None` leaves an id unchanged.
pub fn chown_fd(fd: BorrowedFd<'_>, uid: Option<u32>, gid: Option<u32>) -> Result<(), Errno> {
    rustix::fs::chownat(
        fd,
        c"",
        uid.map(Uid::from_raw),
        gid.map(Gid::from_raw),
        AtFlags::EMPTY_PATH | AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(errno)
}

/// `truncate(/proc/self/fd/N, size)` (works for O_PATH fds).
pub fn truncate_fd_path(fd: BorrowedFd<'_>, size: u64) -> Result<(), Errno> {
    let size = i64::try_from(size).map_err(|_| Errno::EFBIG)?;
    nix::unistd::truncate(proc_fd_path(fd.as_raw_fd()).as_c_str(), size)
}

/// `ftruncate(fd, size)`.
pub fn ftruncate(fd: BorrowedFd<'_>, size: u64) -> Result<(), Errno> {
    rustix::fs::ftruncate(fd, size).map_err(errno)
}

/// Sets the times of the inode behind `fd`: `utimensat(fd, "", AT_EMPTY_PATH)` when
/// `symlink` (a symlink's own times; `fd` is then its O_PATH fd), else
/// `utimensat(AT_FDCWD, /proc/self/fd/N, 0)`, which follows to the file and works for O_PATH
/// fds.
pub fn utimens_fd(fd: BorrowedFd<'_>, times: &Timestamps, symlink: bool) -> Result<(), Errno> {
    if symlink {
        rustix::fs::utimensat(fd, c"", times, AtFlags::EMPTY_PATH).map_err(errno)
    } else {
        let path = proc_fd_path(fd.as_raw_fd());
        rustix::fs::utimensat(CWD, &path, times, AtFlags::empty()).map_err(errno)
    }
}

/// `access(/proc/self/fd/N, mask)` with drainfs's credentials.
pub fn access_fd(fd: BorrowedFd<'_>, mask: i32) -> Result<(), Errno> {
    let path = proc_fd_path(fd.as_raw_fd());
    let mask = rustix::fs::Access::from_bits_retain(mask as u32);
    rustix::fs::accessat(CWD, &path, mask, AtFlags::empty()).map_err(errno)
}

/// The four xattr calls, through `/proc/self/fd/N` so they work on O_PATH fds (the `f*xattr`
/// calls refuse them with `EBADF`).
pub mod xattr {
    use super::*;

    /// `getxattr`; an empty `buf` asks for the size.
    pub fn get(fd: BorrowedFd<'_>, name: &CStr, buf: &mut [u8]) -> Result<usize, Errno> {
        let path = proc_fd_path(fd.as_raw_fd());
        if buf.is_empty() {
            rustix::fs::getxattr_query(&path, name).map_err(errno)
        } else {
            rustix::fs::getxattr(&path, name, buf).map_err(errno)
        }
    }

    /// `listxattr`; an empty `buf` asks for the size.
    pub fn list(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
        let path = proc_fd_path(fd.as_raw_fd());
        if buf.is_empty() {
            rustix::fs::listxattr_query(&path).map_err(errno)
        } else {
            rustix::fs::listxattr(&path, buf).map_err(errno)
        }
    }

    /// `setxattr`; `flags` is `XATTR_CREATE`, `XATTR_REPLACE` or 0.
    pub fn set(fd: BorrowedFd<'_>, name: &CStr, value: &[u8], flags: i32) -> Result<(), Errno> {
        let path = proc_fd_path(fd.as_raw_fd());
        let flags = rustix::fs::XattrFlags::from_bits_retain(flags as u32);
        rustix::fs::setxattr(&path, name, value, flags).map_err(errno)
    }

    /// `removexattr`.
    pub fn remove(fd: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
        let path = proc_fd_path(fd.as_raw_fd());
        rustix::fs::removexattr(&path, name).map_err(errno)
    }
}

/// Reads directory entries with `getdents64` into `buf`; returns the bytes filled (0 at end).
///
/// Written over libc because the records must stay in a buffer that outlives one READDIR
/// request (a reply that fills up leaves the rest for the next one without seeking the
/// lower), which rustix's `RawDir` does not allow and nix does not offer.
pub fn getdents64(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole call, and the
    // kernel writes at most that many bytes of whole `linux_dirent64` records into it; `fd`
    // is borrowed, so it stays open during the call.
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
pub fn caller_groups(pid: u32) -> Vec<u32> {
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

/// drainfs's own supplementary groups, captured once before any thread switches (empty if
/// `getgroups` fails, which it does not for a valid call).
fn own_groups() -> &'static [Gid] {
    static GROUPS: std::sync::OnceLock<Vec<Gid>> = std::sync::OnceLock::new();
    GROUPS.get_or_init(|| rustix::process::getgroups().unwrap_or_default())
}

/// Sets this thread's filesystem id with `set` (`setfsuid`/`setfsgid`, which return the
/// previous id and report no error) and checks it took: the id in effect is read back with
/// `set(-1)`, which changes nothing. `EPERM` if it did not change.
fn set_fs_id(set: fn(u32) -> u32, id: u32) -> Result<(), Errno> {
    set(id);
    if set(u32::MAX) == id {
        Ok(())
    } else {
        Err(Errno::EPERM)
    }
}

/// `setfsuid(uid)` for this thread, checked ([`set_fs_id`]).
fn set_fsuid(uid: u32) -> Result<(), Errno> {
    set_fs_id(
        |id| nix::unistd::setfsuid(nix::unistd::Uid::from_raw(id)).as_raw(),
        uid,
    )
}

/// `setfsgid(gid)` for this thread, checked ([`set_fs_id`]).
fn set_fsgid(gid: u32) -> Result<(), Errno> {
    set_fs_id(
        |id| nix::unistd::setfsgid(nix::unistd::Gid::from_raw(id)).as_raw(),
        gid,
    )
}

/// Per-thread credentials for operations that create inodes: the lower then checks
/// permissions and assigns the caller's uid/gid (and applies set-group-ID directories)
/// exactly as for a local caller. The caller's supplementary groups are switched to as well:
/// a user allowed by the kernel through a supplementary group (a pod's fsGroup on a
/// group-writable directory) must not be refused by the lower. `setfsuid`, `setfsgid` and the
/// raw `setgroups` syscall ([`rustix::thread::set_thread_groups`]; glibc's `setgroups()` would
/// change every thread) are per-thread on Linux. A no-op when drainfs is not root or the
/// caller is root with group 0; a root caller with another group gets only its fsgid
/// switched (new inodes get that group, as on the lower; root's permission checks do not
/// depend on its groups).
///
/// Dropping it switches back to root and drainfs's own groups; a failure there is logged at
/// error level and the thread goes on (virtiofsd's `credentials.rs` does the same).
#[derive(Debug)]
pub struct CallerCreds {
    groups: bool,
    fsgid: bool,
    fsuid: bool,
}

impl CallerCreds {
    /// Switches this thread's fsuid, fsgid and supplementary groups to the caller's until
    /// dropped.
    ///
    /// # Errors
    /// The errno of the first switch that fails (`setgroups`: `EPERM` without CAP_SETGID,
    /// `EINVAL` for more than `NGROUPS_MAX` groups; `setfsgid`/`setfsuid`: `EPERM`); whatever
    /// was switched before it is switched back, and the operation must not run.
    pub fn switch(caller: Caller) -> Result<Self, Errno> {
        if !rustix::process::geteuid().is_root() || (caller.uid == 0 && caller.gid == 0) {
            return Ok(CallerCreds {
                groups: false,
                fsgid: false,
                fsuid: false,
            });
        }
        let groups: Option<Vec<Gid>> = (caller.uid != 0).then(|| {
            caller_groups(caller.pid)
                .into_iter()
                .map(Gid::from_raw)
                .collect()
        });
        Self::switch_to(caller.uid, caller.gid, groups.as_deref())
    }

    /// Switches to `groups` (if given), then `gid`, then `uid`: the privileged step first.
    fn switch_to(uid: u32, gid: u32, groups: Option<&[Gid]>) -> Result<Self, Errno> {
        let mut creds = CallerCreds {
            groups: false,
            fsgid: false,
            fsuid: false,
        };
        if let Some(groups) = groups {
            let _ = own_groups();
            rustix::thread::set_thread_groups(groups).map_err(errno)?;
            creds.groups = true;
        }
        set_fsgid(gid)?;
        creds.fsgid = true;
        if uid != 0 {
            set_fsuid(uid)?;
            creds.fsuid = true;
        }
        Ok(creds)
    }
}

impl Drop for CallerCreds {
    fn drop(&mut self) {
        let mut failed = Vec::new();
        if self.fsuid
            && let Err(e) = set_fsuid(0)
        {
            failed.push(("setfsuid", e));
        }
        if self.fsgid
            && let Err(e) = set_fsgid(0)
        {
            failed.push(("setfsgid", e));
        }
        if self.groups
            && let Err(e) = rustix::thread::set_thread_groups(own_groups())
        {
            failed.push(("setgroups", errno(e)));
        }
        for (call, e) in failed {
            tracing::error!(call, error = %e, "could not switch this thread's credentials back to drainfs's own");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `setgroups` that fails (here: more groups than `NGROUPS_MAX`) fails the switch with
    /// its errno, and the thread keeps drainfs's ids. The suite runs as root.
    #[test]
    fn a_failed_setgroups_fails_the_switch() {
        assert!(
            rustix::process::geteuid().is_root(),
            "this test switches credentials and must run as root"
        );
        let too_many: Vec<Gid> = (0..70_000).map(Gid::from_raw).collect();
        let err = CallerCreds::switch_to(4242, 4343, Some(&too_many)).unwrap_err();
        assert_eq!(err, Errno::EINVAL);
        assert_eq!(
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(u32::MAX)).as_raw(),
            0
        );
        assert_eq!(
            nix::unistd::setfsgid(nix::unistd::Gid::from_raw(u32::MAX)).as_raw(),
            0
        );
        // A switch that succeeds is undone on drop.
        let creds = CallerCreds::switch_to(4242, 4343, Some(&[Gid::from_raw(5151)])).unwrap();
        assert_eq!(
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(u32::MAX)).as_raw(),
            4242
        );
        drop(creds);
        assert_eq!(
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(u32::MAX)).as_raw(),
            0
        );
        assert_eq!(rustix::process::getgroups().unwrap(), own_groups());
    }
}

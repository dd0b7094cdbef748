//! The fuser adapter: implements `fuser::Filesystem` on top of the core ([`crate::fs::Fs`]).
//!
//! Every handler has the same shape (mountpoint-s3's `fuse.rs`): count the request with an
//! [`OpGuard`], call the core, reply; on error `fail!` adds the
//! request's context to the error (op, nodeid, fh, name, the lower's path), logs it once at
//! the error's own level inside a span carrying the request's `unique`, counts it and replies
//! with its errno. No handler writes an errno literal. Handlers are synchronous on fuser's
//! worker threads and never wait for the control plane.
//!
//! Connection settings chosen in [`DrainFs::init`], each for a reason:
//! - `FUSE_PASSTHROUGH` + `max_stack_depth = 1` (kernel passthrough onto a lower that may itself
//!   be FUSE, Documentation/filesystems/fuse-passthrough.rst), with `FUSE_HANDLE_KILLPRIV_V2`:
//!   without it the kernel asks for `security.capability` before every passthrough write.
//! - No `FUSE_WRITEBACK_CACHE`: it silently disables passthrough, and it would acknowledge
//!   writes before the lower has them.
//! - `FUSE_PARALLEL_DIROPS` (lookups and readdirs in one directory run concurrently),
//!   `FUSE_DO_READDIRPLUS` + `FUSE_READDIRPLUS_AUTO` (one round trip fills `ls -l`),
//!   `FUSE_ATOMIC_O_TRUNC` (O_TRUNC rides on OPEN instead of a second SETATTR round trip),
//!   `FUSE_AUTO_INVAL_DATA` (the page cache is dropped when the lower's mtime or size changes),
//!   `FUSE_CACHE_SYMLINKS`, `FUSE_DIRECT_IO_ALLOW_MMAP` (shared mmap of the direct-io writable
//!   opens of `--passthrough reads`), `FUSE_ASYNC_DIO` (an application's large direct-io read
//!   or write is sent as several requests at once).
//! - Read-only opens get `FOPEN_NOFLUSH`: their close() costs no FLUSH round trip, and there is
//!   nothing to upload.

use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, FileType,
    Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
    WriteFlags,
};
use parking_lot::Mutex;

use crate::accounting::{Op, OpGuard};
use crate::config::PassthroughMode;
use crate::error::{Error, Kind};
use crate::fs::sys::{Stat, Timestamps};
use crate::fs::{Backing, Caller, Entry, Fs, Opened, Passthrough, RegisterBacking, XattrReply};
pub use crate::mount::has_cap_sys_admin;

/// Largest WRITE the kernel sends (`max_write`) and the readahead window (`max_readahead`):
/// 1 MiB.
pub const MAX_IO: u32 = 1 << 20;

/// Largest READ served at once from a worker thread's buffer (4 MiB): a bigger READ is
/// answered with the first 4 MiB (a short read). The buffer grows to the largest READ seen
/// and is kept for the thread's life.
const MAX_READ: usize = 4 * MAX_IO as usize;

/// What INIT negotiated, for the start-up log line and `/status`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct InitInfo {
    /// Kernel passthrough is in effect.
    pub passthrough: bool,
    /// Why passthrough is off, when it is.
    pub passthrough_off_reason: Option<String>,
    /// Kernel FUSE ABI, `major.minor`.
    pub kernel_abi: String,
    /// Writable opens use kernel passthrough (otherwise drainfs serves them).
    pub writes_passthrough: bool,
    /// Why the data path is what it is ([`crate::write_path::decide`]).
    pub data_path_reason: String,
    /// The lower's mount as the decision saw it: `fstype from source`.
    pub lower_fs: Option<String>,
}

/// The fuser filesystem.
pub struct DrainFs {
    core: Arc<Fs>,
    ttl: Duration,
    mode: PassthroughMode,
    passthrough: bool,
    init: Arc<Mutex<Option<InitInfo>>>,
    /// The lower's mount (fstype, source), for the data path decision.
    lower_fs: Option<(String, String)>,
}

impl DrainFs {
    /// Wraps the core. `init` receives what INIT negotiated.
    pub fn new(
        core: Arc<Fs>,
        ttl: Duration,
        mode: PassthroughMode,
        init: Arc<Mutex<Option<InitInfo>>>,
    ) -> Self {
        DrainFs {
            core,
            ttl,
            mode,
            passthrough: false,
            init,
            lower_fs: None,
        }
    }

    /// Sets the lower's file system (mountinfo fstype and source) that `--passthrough auto`
    /// decides on ([`crate::write_path::decide`]).
    pub fn with_lower(mut self, fstype: &str, source: &str) -> Self {
        self.lower_fs = Some((fstype.to_string(), source.to_string()));
        self
    }
}

/// A backing id registered for passthrough, type-erased for the core.
fn backing(id: std::io::Result<fuser::BackingId>) -> std::io::Result<Backing> {
    Ok(Arc::new(id?))
}

/// What an OPEN or CREATE replies with (see [`DrainFs::open_reply`]).
struct OpenReply {
    fh: FileHandle,
    flags: FopenFlags,
    /// Fuser's backing id, for a passthrough open.
    backing: Option<Arc<fuser::BackingId>>,
}

/// Who sent a request that creates an inode (credentials are switched to it on the lower).
fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

/// Whether `pid`, a request's sender (the calling thread's id, in drainfs's pid namespace),
/// is a thread of drainfs itself.
fn is_own_thread(pid: u32) -> bool {
    pid != 0 && (pid == std::process::id() || Path::new(&format!("/proc/self/task/{pid}")).exists())
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.raw_errno())
}

/// What a failed request was about, as the kernel named it.
struct At<'a> {
    nodeid: u64,
    fh: Option<u64>,
    name: Option<&'a OsStr>,
}

/// The one way a handler fails a request: `fail!(self, req, guard, reply, error, ino = N)`
/// with `fh = ...` (a `u64` or an `Option<u64>`) and `name = ...` where the request has
/// them. It counts the failure, logs it once at the error's level with the request's context
/// ([`DrainFs::failed`]) and replies with the error's errno.
macro_rules! fail {
    ($self:ident, $req:ident, $guard:ident, $reply:ident, $err:expr, ino = $ino:expr $(, fh = $fh:expr)? $(, name = $name:expr)?) => {{
        #[allow(unused_mut)]
        let mut at = At { nodeid: $ino, fh: None, name: None };
        $( at.fh = Option::<u64>::from($fh); )?
        $( at.name = Some($name); )?
        $reply.error($self.failed($req, &mut $guard, at, $err))
    }};
}

fn to_time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn kind_of_dtype(t: u8) -> FileType {
    match t {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// Converts the lower's `struct stat` into FUSE attributes; `st_ino` becomes the nodeid.
pub fn attr(nodeid: u64, st: &Stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(nodeid),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: to_time(st.st_atime, st.st_atime_nsec as i64),
        mtime: to_time(st.st_mtime, st.st_mtime_nsec as i64),
        ctime: to_time(st.st_ctime, st.st_ctime_nsec as i64),
        crtime: UNIX_EPOCH,
        kind: kind_of(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

fn timespec(t: Option<TimeOrNow>) -> rustix::fs::Timespec {
    use rustix::fs::{Timespec, UTIME_NOW, UTIME_OMIT};
    match t {
        None => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: i64::from(d.subsec_nanos()),
            },
            Err(e) => {
                let d = e.duration();
                let (mut s, mut n) = (-(d.as_secs() as i64), -i64::from(d.subsec_nanos()));
                if n < 0 {
                    s -= 1;
                    n += 1_000_000_000;
                }
                Timespec {
                    tv_sec: s,
                    tv_nsec: n,
                }
            }
        },
    }
}

thread_local! {
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl DrainFs {
    /// Counts a failed request, logs it once at the error's level (debug for a filesystem's
    /// ordinary answers, warn for failures; see [`Error::level`]) inside a span carrying the
    /// request's `unique`, op, nodeid and name, with the error's context (op, nodeid, fh,
    /// name, the lower's path), and returns the errno to reply with. The span and the path
    /// are made only when the line is logged, so a failure costs nothing more when its level
    /// is filtered out, and a request that succeeds never pays for a span.
    fn failed(&self, req: &Request, guard: &mut OpGuard<'_>, at: At<'_>, e: Error) -> Errno {
        guard.fail();
        let errno = errno(&e);
        let warn = e.level() <= tracing::Level::WARN;
        let enabled = if warn {
            tracing::enabled!(tracing::Level::WARN)
        } else {
            tracing::enabled!(tracing::Level::DEBUG)
        };
        if !enabled {
            return errno;
        }
        let op = guard.op().name();
        let mut e = e.at(op, at.nodeid);
        if let Some(fh) = at.fh {
            e = e.fh(fh);
        }
        if let Some(name) = at.name {
            e = e.name(name);
        }
        if let Some(path) = self.core.path_of(at.nodeid) {
            e = e.path(at.name.map_or_else(|| path.clone(), |n| path.join(n)));
        }
        let unique = req.unique().0;
        let name = at.name.map(OsStr::to_string_lossy);
        let name = name.as_deref();
        if warn {
            let span = tracing::warn_span!("request", unique, op, nodeid = at.nodeid, name);
            let _entered = span.enter();
            tracing::warn!(errno = ?e.errno(), error = %e, "request failed");
        } else {
            let span = tracing::debug_span!("request", unique, op, nodeid = at.nodeid, name);
            let _entered = span.enter();
            tracing::debug!(errno = ?e.errno(), error = %e, "request failed");
        }
        errno
    }

    fn entry(&self, reply: ReplyEntry, e: &Entry) {
        reply.entry(&self.ttl, &attr(e.nodeid, &e.st), Generation(0));
    }

    /// The passthrough request for an open with these flags: any open in `auto` and `always`;
    /// in `reads`, read-only opens, and writable ones only to join readers that already hold
    /// the inode's backing id.
    fn passthrough_for<'a>(
        &self,
        flags: i32,
        register: &'a dyn Fn(BorrowedFd<'_>) -> std::io::Result<Backing>,
    ) -> RegisterBacking<'a> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        self.passthrough.then_some(Passthrough {
            register,
            only_if_shared: writable && self.mode == PassthroughMode::Reads,
        })
    }

    /// What to reply to an OPEN or CREATE the core accepted: its fh, FOPEN flags and, for a
    /// passthrough open, fuser's backing id.
    ///
    /// # Errors
    /// `EIO` ([`Kind::Passthrough`]) when the backing id is not fuser's `BackingId`: the core
    /// has listed the open as a passthrough open of its inode, and the kernel requires every
    /// open of an inode with a backing file to be one (fs/fuse/iomode.c), so it must not be
    /// served without passthrough. The open is released first (the kernel sends no RELEASE
    /// for a failed open); a CREATE's caller also drops the entry's lookup reference.
    fn open_reply(&self, nodeid: u64, flags: i32, o: Opened) -> Result<OpenReply, Error> {
        let fopen = self.open_flags(flags, o.backing.is_some());
        let backing = match o.backing.map(|b| b.downcast::<fuser::BackingId>()) {
            None => None,
            Some(Ok(id)) => Some(id),
            Some(Err(_)) => {
                let released = self.core.release(nodeid, o.fh);
                return Err(
                    Error::from(Kind::Passthrough).with_source(std::io::Error::other(format!(
                        "the backing id is not fuser's BackingId; the open is released ({})",
                        released.map_or_else(|e| e.to_string(), |()| "ok".to_string())
                    ))),
                );
            }
        };
        Ok(OpenReply {
            fh: FileHandle(o.fh),
            flags: fopen,
            backing,
        })
    }

    /// FOPEN flags for an open served as `passthrough` or not:
    /// - read-only opens need no FLUSH round trip (`FOPEN_NOFLUSH`);
    /// - write-only opens served by drainfs get `FOPEN_DIRECT_IO`: the kernel then hands the
    ///   application's pages to drainfs instead of first copying them into the page cache
    ///   (one copy of three saved; nothing is read back through such a handle). In `reads`
    ///   mode every writable open served by drainfs gets it, because direct io takes no inode io
    ///   mode, so passthrough readers may still open the inode (fs/fuse/iomode.c).
    fn open_flags(&self, flags: i32, passthrough: bool) -> FopenFlags {
        let acc = flags & libc::O_ACCMODE;
        if acc == libc::O_RDONLY {
            FopenFlags::FOPEN_NOFLUSH
        } else if !passthrough
            && (acc == libc::O_WRONLY || (self.passthrough && self.mode == PassthroughMode::Reads))
        {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }
}

impl Filesystem for DrainFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let caps = config.capabilities();
        let mut info = InitInfo {
            kernel_abi: format!("{}.{}", config.kernel_abi().0, config.kernel_abi().1),
            ..InitInfo::default()
        };
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_ATOMIC_O_TRUNC
            | InitFlags::FUSE_AUTO_INVAL_DATA
            | InitFlags::FUSE_CACHE_SYMLINKS
            | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_ASYNC_DIO;
        let _ = config.add_capabilities(wanted & caps);
        let _ = config.set_max_write(MAX_IO);
        let _ = config.set_max_readahead(MAX_IO);
        let _ = config.set_max_background(64);
        let kernel = if self.mode == PassthroughMode::Never {
            None
        } else if !caps.contains(InitFlags::FUSE_PASSTHROUGH) {
            Some("the kernel does not offer FUSE_PASSTHROUGH (Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH)".to_string())
        } else if !has_cap_sys_admin() {
            Some("drainfs lacks CAP_SYS_ADMIN, which backing files need".to_string())
        } else if config.set_max_stack_depth(1).is_err() {
            Some("the kernel refused max_stack_depth 1".to_string())
        } else {
            match config.add_capabilities(InitFlags::FUSE_PASSTHROUGH) {
                Ok(()) => None,
                Err(_) => Some("the kernel refused FUSE_PASSTHROUGH".to_string()),
            }
        };
        let lower = self
            .lower_fs
            .as_ref()
            .map(|(t, s)| (t.as_str(), s.as_str()));
        info.lower_fs = lower.map(|(t, s)| format!("{t} from {s}"));
        match crate::write_path::decide(self.mode, lower, kernel.as_deref().map_or(Ok(()), Err)) {
            Ok(d) => {
                self.passthrough = d.reads_passthrough;
                if d.reads_passthrough && !d.writes_passthrough {
                    // Served exactly as `--passthrough reads`.
                    self.mode = PassthroughMode::Reads;
                }
                info.writes_passthrough = d.writes_passthrough;
                info.data_path_reason = d.reason.clone();
                if !d.reads_passthrough {
                    info.passthrough_off_reason = Some(kernel.unwrap_or_else(|| d.reason.clone()));
                }
            }
            Err(e) => {
                *self.init.lock() = Some(InitInfo {
                    passthrough_off_reason: kernel,
                    data_path_reason: e.clone(),
                    ..info
                });
                return Err(std::io::Error::other(e));
            }
        }
        info.passthrough = self.passthrough;
        *self.init.lock() = Some(info);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut g = self.core.acct.op(Op::Lookup);
        match self.core.lookup(parent.0, name) {
            Ok(e) => self.entry(reply, &e),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _g = self.core.acct.op(Op::Forget);
        self.core.forget(ino.0, nlookup);
    }

    // BATCH_FORGET: fuser 0.18 does not export `ForgetOne`, so the trait's default, which
    // calls `forget` for each node, is used.

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut g = self.core.acct.op(Op::Getattr);
        match self.core.getattr(ino.0, fh.map(|f| f.0)) {
            Ok(st) => reply.attr(&self.ttl, &attr(ino.0, &st)),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.map(|f| f.0)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut g = self.core.acct.op(Op::Setattr);
        let times = (atime.is_some() || mtime.is_some()).then(|| Timestamps {
            last_access: timespec(atime),
            last_modification: timespec(mtime),
        });
        // KILLPRIV_V2: a truncate by a caller without CAP_FSETID must clear suid/sgid; fuser
        // does not pass FATTR_KILL_SUIDGID through, so non-root callers stand for it.
        let kill = (size.is_some() && req.uid() != 0).then(|| caller(req));
        match self
            .core
            .setattr(ino.0, fh.map(|f| f.0), mode, uid, gid, size, times, kill)
        {
            Ok(st) => reply.attr(&self.ttl, &attr(ino.0, &st)),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.map(|f| f.0)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let mut g = self.core.acct.op(Op::Readlink);
        match self.core.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let mut g = self.core.acct.op(Op::Mknod);
        match self.core.mknod(parent.0, name, mode, rdev, caller(req)) {
            Ok(e) => self.entry(reply, &e),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let mut g = self.core.acct.op(Op::Mkdir);
        match self.core.mkdir(parent.0, name, mode, caller(req)) {
            Ok(e) => self.entry(reply, &e),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut g = self.core.acct.op(Op::Unlink);
        match self.core.unlink(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut g = self.core.acct.op(Op::Rmdir);
        match self.core.unlink(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let mut g = self.core.acct.op(Op::Symlink);
        match self.core.symlink(parent.0, link_name, target, caller(req)) {
            Ok(e) => self.entry(reply, &e),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = link_name),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Rename);
        match self
            .core
            .rename(parent.0, name, newparent.0, newname, flags.bits())
        {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut g = self.core.acct.op(Op::Link);
        match self.core.link(ino.0, newparent.0, newname) {
            Ok(e) => self.entry(reply, &e),
            Err(e) => fail!(self, req, g, reply, e, ino = newparent.0, name = newname),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut g = self.core.acct.op(Op::Open);
        let register = |fd: BorrowedFd<'_>| backing(reply.open_backing(fd));
        let reg = self.passthrough_for(flags.0, &register);
        let opened = self.core.open(ino.0, flags.0, caller(req), reg);
        match opened.and_then(|o| self.open_reply(ino.0, flags.0, o)) {
            Ok(OpenReply { fh, flags, backing }) => match backing.as_deref() {
                Some(id) => reply.opened_passthrough(fh, flags, id),
                None => reply.opened(fh, flags),
            },
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut g = self.core.acct.op(Op::Read);
        READ_BUF.with_borrow_mut(|buf| {
            let size = (size as usize).min(MAX_READ);
            if buf.len() < size {
                buf.resize(size, 0);
            }
            match self.core.read(ino.0, fh.0, offset, &mut buf[..size]) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut g = self.core.acct.op(Op::Write);
        let kill = write_flags
            .contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            .then(|| caller(req));
        match self.core.write(ino.0, fh.0, offset, data, kill) {
            Ok(n) => reply.written(n as u32),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Flush);
        match self.core.flush(ino.0, fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Release);
        match self.core.release(ino.0, fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Fsync);
        match self.core.fsync(ino.0, fh.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut g = self.core.acct.op(Op::Opendir);
        match self.core.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut g = self.core.acct.op(Op::Readdir);
        let dev = self.core.root_dev();
        let res = self
            .core
            .readdir(ino.0, fh.0, offset as i64, |d_ino, off, typ, name| {
                let ino = self.core.dirent_nodeid(dev, d_ino);
                !reply.add(
                    INodeNo(ino),
                    off as u64,
                    kind_of_dtype(typ),
                    OsStr::from_bytes(name),
                )
            });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut g = self.core.acct.op(Op::Readdirplus);
        let mut dir_attr: Option<FileAttr> = None;
        let dev = self.core.root_dev();
        let res = self
            .core
            .readdir(ino.0, fh.0, offset as i64, |d_ino, off, _typ, name| {
                if name == b"." || name == b".." {
                    // The kernel does not link dot entries (fuse_direntplus_link skips them),
                    // so no lookup is made and no reference taken; only the entry's inode
                    // number counts: the directory's own nodeid for `.`, and for `..` the
                    // parent's, as READDIR reports it (the root's `..` is the root itself).
                    let mut a = *dir_attr.get_or_insert_with(|| {
                        match self.core.getattr(ino.0, Some(fh.0)) {
                            Ok(st) => attr(ino.0, &st),
                            // Only the inode number and type of a dot entry are used.
                            Err(_) => FileAttr {
                                ino,
                                size: 0,
                                blocks: 0,
                                atime: UNIX_EPOCH,
                                mtime: UNIX_EPOCH,
                                ctime: UNIX_EPOCH,
                                crtime: UNIX_EPOCH,
                                kind: FileType::Directory,
                                perm: 0,
                                nlink: 0,
                                uid: 0,
                                gid: 0,
                                rdev: 0,
                                blksize: 0,
                                flags: 0,
                            },
                        }
                    });
                    if name == b".." {
                        a.ino = if ino.0 == crate::fs::ROOT_ID {
                            INodeNo(crate::fs::ROOT_ID)
                        } else {
                            INodeNo(self.core.dirent_nodeid(dev, d_ino))
                        };
                    }
                    return !reply.add(
                        a.ino,
                        off as u64,
                        OsStr::from_bytes(name),
                        &Duration::ZERO,
                        &a,
                        Generation(0),
                    );
                }
                match self.core.lookup_in_dir(ino.0, fh.0, name) {
                    Ok(e) => {
                        let full = reply.add(
                            INodeNo(e.nodeid),
                            off as u64,
                            OsStr::from_bytes(name),
                            &self.ttl,
                            &attr(e.nodeid, &e.st),
                            Generation(0),
                        );
                        if full {
                            self.core.forget(e.nodeid, 1);
                        }
                        !full
                    }
                    // Removed between getdents and fstatat: skip it, as a concurrent unlink would.
                    Err(_) => true,
                }
            });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Releasedir);
        match self.core.release(ino.0, fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Fsyncdir);
        match self.core.fsync(ino.0, fh.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        // drainfs's own probes (`/livez` statfs's the mountpoint) are not workload activity.
        let mut g = if is_own_thread(req.pid()) {
            self.core.acct.own_op(Op::Statfs)
        } else {
            self.core.acct.op(Op::Statfs)
        };
        match self.core.statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Setxattr);
        match self.core.setxattr(ino.0, name, value, flags) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, name = name),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let mut g = self.core.acct.op(Op::Getxattr);
        match self.core.getxattr(ino.0, name, size) {
            Ok(XattrReply::Size(n)) => reply.size(n),
            Ok(XattrReply::Data(d)) => reply.data(&d),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, name = name),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let mut g = self.core.acct.op(Op::Listxattr);
        match self.core.listxattr(ino.0, size) {
            Ok(XattrReply::Size(n)) => reply.size(n),
            Ok(XattrReply::Data(d)) => reply.data(&d),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut g = self.core.acct.op(Op::Removexattr);
        match self.core.removexattr(ino.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, name = name),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let mut g = self.core.acct.op(Op::Access);
        match self.core.access(ino.0, mask.bits()) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut g = self.core.acct.op(Op::Create);
        let register = |fd: BorrowedFd<'_>| backing(reply.open_backing(fd));
        let reg = self.passthrough_for(flags, &register);
        let created = self
            .core
            .create(parent.0, name, mode, flags, caller(req), reg)
            .and_then(|(e, o)| {
                self.open_reply(e.nodeid, flags, o)
                    .inspect_err(|_| self.core.forget(e.nodeid, 1))
                    .map(|r| (e, r))
            });
        match created {
            Ok((e, OpenReply { fh, flags, backing })) => {
                let a = attr(e.nodeid, &e.st);
                match backing.as_deref() {
                    Some(id) => {
                        reply.created_passthrough(&self.ttl, &a, Generation(0), fh, flags, id)
                    }
                    None => reply.created(&self.ttl, &a, Generation(0), fh, flags),
                }
            }
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Fallocate);
        // KILLPRIV_V2: the kernel leaves clearing suid/sgid to drainfs; a non-root caller
        // stands for "without CAP_FSETID", as for truncate.
        let kill = (req.uid() != 0).then(|| caller(req));
        match self.core.fallocate(ino.0, fh.0, offset, length, mode, kill) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let mut g = self.core.acct.op(Op::Lseek);
        match self.core.lseek(ino.0, fh.0, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let mut g = self.core.acct.op(Op::CopyFileRange);
        match self.core.copy_file_range(
            ino_in.0,
            fh_in.0,
            offset_in,
            ino_out.0,
            fh_out.0,
            offset_out,
            len,
            flags.bits() as u32,
            (req.uid() != 0).then(|| caller(req)),
        ) {
            Ok(n) => reply.written(n as u32),
            Err(e) => fail!(self, req, g, reply, e, ino = ino_in.0, fh = fh_in.0),
        }
    }
}

/// A tracing layer that drops fuser's "Failed to send FUSE reply" error when the write
/// failed with `ENOENT`: the kernel no longer waits for that request, which is what happens
/// to fuser's `ENOSYS` answer to every FUSE_INTERRUPT (an application's `close()` interrupted
/// by a signal): with one cloned `/dev/fuse` fd per worker thread, the interrupted request is
/// in another fd's processing queue, so the kernel finds nothing to answer. Nothing failed,
/// so no ERROR line. Any other reply failure is kept.
#[derive(Debug, Clone, Copy, Default)]
pub struct StaleReplyFilter;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StaleReplyFilter {
    fn event_enabled(
        &self,
        event: &tracing::Event<'_>,
        _ctx: tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        if *event.metadata().level() != tracing::Level::ERROR {
            return true;
        }
        struct Fields {
            fuser_reply: bool,
            enoent: bool,
        }
        impl tracing::field::Visit for Fields {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "log.target" {
                    self.fuser_reply = value == "fuser::reply";
                }
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    let text = format!("{value:?}");
                    let enoent = format!("(os error {})", libc::ENOENT);
                    self.enoent =
                        text.starts_with("Failed to send FUSE reply") && text.ends_with(&enoent);
                }
            }
        }
        let mut f = Fields {
            fuser_reply: event.metadata().target() == "fuser::reply",
            enoent: false,
        };
        event.record(&mut f);
        !(f.fuser_reply && f.enoent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::accounting::Accounting;
    use crate::fs::{Admission, CoreConfig, ROOT_ID};

    /// A backing id that is not fuser's fails the open with `EIO` and releases it in the
    /// core, instead of replying without passthrough for an open the core counts as one.
    #[test]
    fn a_backing_id_of_another_type_fails_the_open_and_releases_it() {
        let dir = tempfile::tempdir().unwrap();
        let acct = Accounting::new();
        let core = Arc::new(
            Fs::new(
                dir.path(),
                CoreConfig { max_lower_fds: 64 },
                Arc::clone(&acct),
                Admission::new(&acct),
            )
            .unwrap(),
        );
        let register = |_: BorrowedFd<'_>| -> std::io::Result<Backing> { Ok(Arc::new(7u32)) };
        let reg = Some(Passthrough {
            register: &register,
            only_if_shared: false,
        });
        let (e, o) = core
            .create(
                ROOT_ID,
                OsStr::new("f"),
                0o644,
                libc::O_RDWR,
                Caller::ROOT,
                reg,
            )
            .unwrap();
        assert!(o.backing.is_some(), "the core took the passthrough path");
        let fh = o.fh;
        let fs = DrainFs::new(
            Arc::clone(&core),
            Duration::from_secs(1),
            PassthroughMode::Auto,
            Arc::default(),
        );
        let err = fs.open_reply(e.nodeid, libc::O_RDWR, o).err().unwrap();
        assert_eq!(err.kind, Kind::Passthrough);
        assert_eq!(err.raw_errno(), libc::EIO);
        assert_eq!(core.open_paths(10).len(), 0, "the open was released");
        assert_eq!(
            core.release(e.nodeid, fh).unwrap_err().raw_errno(),
            libc::EBADF
        );
    }
}

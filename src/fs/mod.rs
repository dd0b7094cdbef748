//! The filesystem core: a passthrough of a lower directory, free of fuser so it can be
//! unit-tested on a temp dir without mounting.
//!
//! Identity follows virtiofsd and fuse-backend-rs: an inode is keyed by the lower's
//! `(st_dev, st_ino)`, so hard links share one nodeid and renames keep identity; nodeids are
//! never reused; the root is pinned. Unlike virtiofsd, an inode does not hold an O_PATH fd for
//! its whole life: O_PATH fds live in a bounded LRU cache ([`crate::config::FsConfig::max_lower_fds`]) and an
//! inode that lost its fd is found again through its last known location (parent inode + name),
//! verified against its key (a mismatch is `ESTALE`). That keeps 100,000 known inodes within a
//! 20,000 RLIMIT_NOFILE (gcsfuse's inode numbers are not usable with `name_to_handle_at`).
//! Open files need no path at all: every operation on an open file uses its handle's lower fd,
//! which is why unlinked-but-open files keep working.
//!
//! Admission ([`Admission`]) gates opens, creates and namespace changes once shutdown has
//! closed the door (`ESHUTDOWN`), and turns everything into `EIO` once the lower is gone.

pub mod sys;

use std::any::Any;
use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

use nix::errno::Errno;
use parking_lot::{Mutex, RwLock};

use crate::accounting::{Accounting, HandleGuard, HandleMode, LowerCall};
use crate::error::{Error, Kind, Result};
pub use sys::Caller;
use sys::Stat;

/// How many READDIR-reserved nodeids are remembered (about 64 bytes each).
const RESERVED_NODEIDS: usize = 65_536;

/// The root's nodeid (FUSE_ROOT_ID).
pub const ROOT_ID: u64 = 1;

/// A backing id registered with the kernel for passthrough (fuser's `BackingId`, type-erased
/// so the core stays fuser-free). Dropping the last reference closes it.
pub type Backing = Arc<dyn Any + Send + Sync>;

/// The lower's identity of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InodeKey {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl InodeKey {
    fn of(st: &Stat) -> Self {
        InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

#[derive(Debug)]
struct Location {
    parent: Arc<Inode>,
    name: CString,
}

#[derive(Default)]
struct OpenState {
    /// Open handles of this inode (files only).
    opens: u32,
    /// One lower fd of an open handle, for operations that arrive without a fh while the
    /// file may be unlinked (fstat sends GETATTR without fh).
    fds: Vec<(u64, Arc<OwnedFd>)>,
    /// The backing id shared by every passthrough open of this inode (one per inode, as the
    /// kernel requires), dropped with the last passthrough open.
    backing: Option<Backing>,
    passthrough_opens: u32,
}

/// An inode the kernel knows (lookup count > 0) or that an open handle still refers to.
pub struct Inode {
    /// FUSE nodeid; never reused.
    pub nodeid: u64,
    /// Lower identity.
    pub key: InodeKey,
    /// `st_mode & S_IFMT`.
    pub fmt: u32,
    lookups: AtomicU64,
    loc: Mutex<Option<Location>>,
    open: Mutex<OpenState>,
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode")
            .field("nodeid", &self.nodeid)
            .field("key", &self.key)
            .finish()
    }
}

impl Inode {
    fn set_location(&self, parent: &Arc<Inode>, name: &CStr) {
        let mut loc = self.loc.lock();
        match &mut *loc {
            Some(l) if l.parent.nodeid == parent.nodeid && l.name.as_c_str() == name => {}
            _ => {
                *loc = Some(Location {
                    parent: Arc::clone(parent),
                    name: name.to_owned(),
                })
            }
        }
    }

    fn open_fd(&self) -> Option<Arc<OwnedFd>> {
        self.open.lock().fds.first().map(|(_, fd)| Arc::clone(fd))
    }

    /// The inode's path relative to the lower root, as last known (for logs and the shutdown
    /// summary only; never used to reach the lower).
    pub fn path(&self) -> PathBuf {
        let mut parts: Vec<CString> = Vec::new();
        let mut cur = self
            .loc
            .lock()
            .as_ref()
            .map(|l| (Arc::clone(&l.parent), l.name.clone()));
        let mut depth = 0;
        while let Some((parent, name)) = cur {
            parts.push(name);
            depth += 1;
            if depth > 4096 {
                break;
            }
            cur = parent
                .loc
                .lock()
                .as_ref()
                .map(|l| (Arc::clone(&l.parent), l.name.clone()));
        }
        let mut p = PathBuf::new();
        for n in parts.iter().rev() {
            p.push(OsStr::from_bytes(n.as_bytes()));
        }
        p
    }
}

/// What kind of handle.
pub enum HandleKind {
    /// A regular file (or anything opened with OPEN).
    File {
        /// Opened for writing.
        writable: bool,
        /// Data goes through kernel passthrough (drainfs sees no READ/WRITE).
        passthrough: bool,
    },
    /// A directory stream.
    Dir(Mutex<DirStream>),
}

/// The state of a directory stream between READDIR calls.
pub struct DirStream {
    buf: Vec<u8>,
    pos: usize,
    len: usize,
    /// The offset the next READDIR is expected at (the cookie of the last entry returned).
    next_off: i64,
}

/// An open file or directory: the lower fd opened with the application's flags.
pub struct Handle {
    /// The inode it belongs to.
    pub inode: Arc<Inode>,
    /// The lower fd. Closing it (dropping the last reference) is the lower RELEASE.
    pub fd: Arc<OwnedFd>,
    /// File or directory.
    pub kind: HandleKind,
    /// `open(2)` flags as given by the application.
    pub flags: i32,
    guard: HandleGuard,
}

impl Handle {
    /// Read-only, write or directory.
    pub fn mode(&self) -> HandleMode {
        self.guard.mode()
    }
}

/// The shutdown gate shared with the lifecycle: the door (kept in the accounting's
/// [`crate::gate::Gate`], beside the in-flight count) and whether the lower is gone.
#[derive(Debug)]
pub struct Admission {
    acct: Arc<Accounting>,
    lower_gone: AtomicBool,
    /// Signalled once when an operation first sees the lower's connection gone.
    pub lower_gone_notify: tokio::sync::Notify,
}

impl Admission {
    /// New, open, sharing `acct`'s door.
    pub fn new(acct: &Arc<Accounting>) -> Arc<Self> {
        Arc::new(Admission {
            acct: Arc::clone(acct),
            lower_gone: AtomicBool::new(false),
            lower_gone_notify: tokio::sync::Notify::new(),
        })
    }

    /// Closes the door: new opens, creates and namespace changes fail with `ESHUTDOWN`.
    pub fn close(&self) {
        self.acct.close_door();
    }

    /// Whether the door is closed.
    pub fn is_closed(&self) -> bool {
        !self.acct.door_open()
    }

    /// Marks the lower as gone: every operation fails with `EIO` from now on.
    pub fn set_lower_gone(&self) {
        if !self.lower_gone.swap(true, SeqCst) {
            self.lower_gone_notify.notify_one();
        }
    }

    #[inline]
    fn check_alive(&self) -> Result<()> {
        if self.lower_gone.load(Relaxed) {
            Err(Kind::LowerGone.into())
        } else {
            Ok(())
        }
    }

    /// For a request already counted in flight: `ESHUTDOWN` once the door is closed.
    #[inline]
    fn check_admit(&self) -> Result<()> {
        self.check_alive()?;
        if self.acct.door_open() {
            Ok(())
        } else {
            Err(Kind::Shutdown.into())
        }
    }
}

/// Configuration of the core (the subset of [`crate::config::FsConfig`] it needs).
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Capacity of the O_PATH fd cache.
    pub max_lower_fds: usize,
}

/// The passthrough filesystem core.
pub struct Fs {
    root: Arc<Inode>,
    root_fd: Arc<OwnedFd>,
    inodes: RwLock<Inodes>,
    next_nodeid: AtomicU64,
    handles: RwLock<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
    fd_cache: Mutex<lru::LruCache<u64, Arc<OwnedFd>>>,
    failed_flushes: Mutex<Vec<String>>,
    /// Nodeids handed out as READDIR `d_ino` before any LOOKUP (see [`Fs::dirent_nodeid`]).
    reserved: Mutex<lru::LruCache<InodeKey, u64>>,
    /// Counters shared with the lifecycle and metrics.
    pub acct: Arc<Accounting>,
    /// Shutdown gate shared with the lifecycle.
    pub admission: Arc<Admission>,
}

impl std::fmt::Debug for Fs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fs")
            .field("inodes", &self.inode_count())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Inodes {
    by_id: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<InodeKey, u64>,
}

/// An answer carrying an inode and its attributes (LOOKUP, MKDIR, CREATE...).
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// The nodeid (also reported as `st_ino`).
    pub nodeid: u64,
    /// The lower's attributes.
    pub st: Stat,
}

/// The answer to OPEN / CREATE.
pub struct Opened {
    /// The fh to give the kernel.
    pub fh: u64,
    /// The backing id to reply with, when the open uses kernel passthrough.
    pub backing: Option<Backing>,
}

/// How an OPEN should set up passthrough: `None` serves data in drainfs; `Some` may use
/// kernel passthrough (see [`Passthrough`]).
pub type RegisterBacking<'a> = Option<Passthrough<'a>>;

/// A passthrough request for one OPEN/CREATE.
#[derive(Clone, Copy)]
pub struct Passthrough<'a> {
    /// Registers a backing fd with the kernel (`FUSE_DEV_IOC_BACKING_OPEN`).
    pub register: &'a dyn Fn(BorrowedFd<'_>) -> std::io::Result<Backing>,
    /// Use passthrough only if the inode already has a backing id (`--passthrough reads` for a
    /// writable open): the kernel requires every open of an inode with a backing file to be
    /// passthrough too (fs/fuse/iomode.c), so such a writer joins; otherwise drainfs serves it.
    pub only_if_shared: bool,
}

fn cname(name: &OsStr) -> Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| Kind::BadName.into())
}

/// The privilege bits a write, truncate, fallocate or copy by `caller`, who lacks
/// CAP_FSETID, removes from a file of mode `mode` owned by group `file_gid`, as Linux's VFS
/// does (`should_remove_suid`, `setattr_should_drop_sgid`) and FUSE_HANDLE_KILLPRIV_V2 leaves
/// to the server: S_ISUID always; S_ISGID when the file is group-executable, or else when the
/// caller is not in the file's group (its supplementary groups are read only then). Regular
/// files only.
pub fn privs_to_kill(mode: u32, file_gid: u32, caller: &Caller) -> u32 {
    if mode & libc::S_IFMT != libc::S_IFREG {
        return 0;
    }
    let mut kill = mode & libc::S_ISUID;
    if mode & libc::S_ISGID != 0
        && (mode & libc::S_IXGRP != 0
            || (caller.gid != file_gid && !sys::caller_groups(caller.pid).contains(&file_gid)))
    {
        kill |= libc::S_ISGID;
    }
    kill
}

impl Fs {
    /// Opens the lower root and builds an empty inode table.
    ///
    /// # Errors
    /// The lower's errno if the root cannot be opened or is not a directory (`ENOTDIR`).
    pub fn new(
        lower: &Path,
        cfg: CoreConfig,
        acct: Arc<Accounting>,
        admission: Arc<Admission>,
    ) -> Result<Self> {
        let path =
            CString::new(lower.as_os_str().as_bytes()).map_err(|_| Error::from(Kind::BadName))?;
        let root_fd = sys::openat(
            // SAFETY-free: AT_FDCWD is a valid dirfd for an absolute or relative path.
            unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) },
            &path,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )?;
        let st = sys::fstat(root_fd.as_fd())?;
        let root = Arc::new(Inode {
            nodeid: ROOT_ID,
            key: InodeKey::of(&st),
            fmt: st.st_mode & libc::S_IFMT,
            lookups: AtomicU64::new(1),
            loc: Mutex::new(None),
            open: Mutex::new(OpenState::default()),
        });
        let mut inodes = Inodes::default();
        inodes.by_id.insert(ROOT_ID, Arc::clone(&root));
        inodes.by_key.insert(root.key, ROOT_ID);
        let cap = NonZeroUsize::new(cfg.max_lower_fds.max(16)).expect("max(16) is non-zero");
        Ok(Fs {
            root,
            root_fd: Arc::new(root_fd),
            inodes: RwLock::new(inodes),
            next_nodeid: AtomicU64::new(ROOT_ID + 1),
            handles: RwLock::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            fd_cache: Mutex::new(lru::LruCache::new(cap)),
            failed_flushes: Mutex::new(Vec::new()),
            reserved: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(RESERVED_NODEIDS).expect("non-zero"),
            )),
            acct,
            admission,
        })
    }

    /// Number of inodes known (including the root).
    pub fn inode_count(&self) -> usize {
        self.inodes.read().by_id.len()
    }

    /// Number of O_PATH fds cached.
    pub fn cached_fds(&self) -> usize {
        self.fd_cache.lock().len()
    }

    fn inode(&self, nodeid: u64) -> Result<Arc<Inode>> {
        if nodeid == ROOT_ID {
            return Ok(Arc::clone(&self.root));
        }
        self.inodes
            .read()
            .by_id
            .get(&nodeid)
            .cloned()
            .ok_or_else(|| Kind::UnknownInode.into())
    }

    /// The handle `fh`, checked to belong to `nodeid`.
    ///
    /// # Errors
    /// `EBADF` for an unknown fh or one of another inode.
    pub fn handle(&self, nodeid: u64, fh: u64) -> Result<Arc<Handle>> {
        let h = self
            .handles
            .read()
            .get(&fh)
            .cloned()
            .ok_or(Error::from(Kind::UnknownHandle))?;
        if h.inode.nodeid != nodeid {
            return Err(Kind::UnknownHandle.into());
        }
        Ok(h)
    }

    /// Maps an error from the lower: a dead lower connection marks the lower gone and becomes
    /// `EIO`; anything else passes through unchanged.
    fn lower_err(&self, e: Errno) -> Error {
        let err = Error::lower(e);
        if err.is_lower_disconnect() {
            self.admission.set_lower_gone();
            return Kind::LowerGone.into();
        }
        err
    }

    /// An fd usable as a directory fd / O_PATH fd for `inode`: the root, a cached fd, an open
    /// handle's fd, or a fresh O_PATH open through the inode's location (verified, then cached).
    fn inode_fd(&self, inode: &Arc<Inode>) -> Result<Arc<OwnedFd>> {
        if inode.nodeid == ROOT_ID {
            return Ok(Arc::clone(&self.root_fd));
        }
        if let Some(fd) = self.fd_cache.lock().get(&inode.nodeid) {
            return Ok(Arc::clone(fd));
        }
        if let Some(fd) = inode.open_fd() {
            return Ok(fd);
        }
        let (parent, name) = {
            let loc = inode.loc.lock();
            let l = loc.as_ref().ok_or(Error::from(Kind::Stale))?;
            (Arc::clone(&l.parent), l.name.clone())
        };
        let pfd = self.inode_fd(&parent)?;
        let fd = sys::openat(pfd.as_fd(), &name, libc::O_PATH | libc::O_NOFOLLOW, 0)
            .map_err(|e| self.lower_err(e))?;
        let st = sys::fstat(fd.as_fd()).map_err(|e| self.lower_err(e))?;
        if InodeKey::of(&st) != inode.key {
            return Err(Kind::Stale.into());
        }
        let fd = Arc::new(fd);
        let evicted = self.fd_cache.lock().push(inode.nodeid, Arc::clone(&fd));
        drop(evicted); // closes outside the lock
        Ok(fd)
    }

    /// Attributes of `inode` without allocating an fd when it has none: `fstatat` through its
    /// location, verified against its key.
    fn stat_inode(&self, inode: &Arc<Inode>) -> Result<Stat> {
        let cached = if inode.nodeid == ROOT_ID {
            Some(Arc::clone(&self.root_fd))
        } else {
            self.fd_cache
                .lock()
                .get(&inode.nodeid)
                .cloned()
                .or_else(|| inode.open_fd())
        };
        if let Some(fd) = cached {
            return sys::fstat(fd.as_fd()).map_err(|e| self.lower_err(e));
        }
        let (parent, name) = {
            let loc = inode.loc.lock();
            let l = loc.as_ref().ok_or(Error::from(Kind::Stale))?;
            (Arc::clone(&l.parent), l.name.clone())
        };
        let pfd = self.inode_fd(&parent)?;
        let st = sys::fstatat(pfd.as_fd(), &name).map_err(|e| self.lower_err(e))?;
        if InodeKey::of(&st) != inode.key {
            return Err(Kind::Stale.into());
        }
        Ok(st)
    }

    /// Finds or creates the inode for `st` at `parent/name` and takes one lookup reference.
    fn remember(&self, parent: &Arc<Inode>, name: &CStr, st: &Stat) -> Entry {
        let key = InodeKey::of(st);
        {
            let map = self.inodes.read();
            if let Some(id) = map.by_key.get(&key) {
                let inode = &map.by_id[id];
                inode.lookups.fetch_add(1, SeqCst);
                if inode.nodeid != ROOT_ID {
                    inode.set_location(parent, name);
                }
                return Entry {
                    nodeid: *id,
                    st: *st,
                };
            }
        }
        let mut map = self.inodes.write();
        if let Some(id) = map.by_key.get(&key).copied() {
            let inode = Arc::clone(&map.by_id[&id]);
            drop(map);
            inode.lookups.fetch_add(1, SeqCst);
            inode.set_location(parent, name);
            return Entry {
                nodeid: id,
                st: *st,
            };
        }
        let reserved = self.reserved.lock().pop(&key);
        let nodeid = reserved.unwrap_or_else(|| self.next_nodeid.fetch_add(1, Relaxed));
        let inode = Arc::new(Inode {
            nodeid,
            key,
            fmt: st.st_mode & libc::S_IFMT,
            lookups: AtomicU64::new(1),
            loc: Mutex::new(Some(Location {
                parent: Arc::clone(parent),
                name: name.to_owned(),
            })),
            open: Mutex::new(OpenState::default()),
        });
        map.by_id.insert(nodeid, inode);
        map.by_key.insert(key, nodeid);
        Entry { nodeid, st: *st }
    }

    /// Clears the bits [`privs_to_kill`] names for `caller` on the file behind `fd` (any fd,
    /// O_PATH too), as the lower would for that unprivileged writer.
    fn kill_privs(&self, fd: BorrowedFd<'_>, caller: &Caller) -> Result<()> {
        let st = sys::fstat(fd).map_err(|e| self.lower_err(e))?;
        let kill = privs_to_kill(st.st_mode, st.st_gid, caller);
        if kill != 0 {
            sys::chmod_fd(fd, st.st_mode & 0o7777 & !kill).map_err(|e| self.lower_err(e))?;
        }
        Ok(())
    }

    /// LOOKUP: `parent/name` on the lower; takes one lookup reference.
    ///
    /// # Errors
    /// The lower's errno (`ENOENT`...); `EIO` when the lower is gone.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Entry> {
        self.admission.check_alive()?;
        let parent = self.inode(parent)?;
        let name = cname(name)?;
        let pfd = self.inode_fd(&parent)?;
        let st = sys::fstatat(pfd.as_fd(), &name).map_err(|e| self.lower_err(e))?;
        Ok(self.remember(&parent, &name, &st))
    }

    /// FORGET / BATCH_FORGET: drops `nlookup` references; the inode is removed at zero
    /// (saturating: a count never goes below zero).
    pub fn forget(&self, nodeid: u64, nlookup: u64) {
        if nodeid == ROOT_ID {
            return;
        }
        let mut map = self.inodes.write();
        let Some(inode) = map.by_id.get(&nodeid) else {
            return;
        };
        let prev = inode.lookups.load(SeqCst);
        let now = prev.saturating_sub(nlookup);
        inode.lookups.store(now, SeqCst);
        if now == 0 {
            let key = inode.key;
            map.by_id.remove(&nodeid);
            if map.by_key.get(&key) == Some(&nodeid) {
                map.by_key.remove(&key);
            }
            drop(map);
            let evicted = self.fd_cache.lock().pop(&nodeid);
            drop(evicted);
        }
    }

    /// GETATTR: through the handle's fd when `fh` is given, else through the inode.
    ///
    /// # Errors
    /// The lower's errno; `ESTALE` when the name now names another inode.
    pub fn getattr(&self, nodeid: u64, fh: Option<u64>) -> Result<Stat> {
        self.admission.check_alive()?;
        if let Some(fh) = fh
            && let Ok(h) = self.handle(nodeid, fh)
        {
            return sys::fstat(h.fd.as_fd()).map_err(|e| self.lower_err(e));
        }
        let inode = self.inode(nodeid)?;
        self.stat_inode(&inode)
    }

    /// SETATTR. `mode`, `uid`/`gid`, `size`, `atime`/`mtime` (`None` = leave, timespec with
    /// `UTIME_NOW`/`UTIME_OMIT` semantics as in utimensat(2)). `kill_suidgid` clears set-user-ID
    /// and set-group-ID bits on a size change (FUSE_HANDLE_KILLPRIV_V2 semantics for callers
    /// without CAP_FSETID).
    ///
    /// # Errors
    /// The lower's errno of the first failing change.
    #[allow(clippy::too_many_arguments)]
    pub fn setattr(
        &self,
        nodeid: u64,
        fh: Option<u64>,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        times: Option<[libc::timespec; 2]>,
        kill_privs: Option<Caller>,
    ) -> Result<Stat> {
        self.admission.check_alive()?;
        let inode = self.inode(nodeid)?;
        let handle = fh.and_then(|fh| self.handle(nodeid, fh).ok());
        let fd = match &handle {
            Some(h) => Arc::clone(&h.fd),
            None => self.inode_fd(&inode)?,
        };
        let fd = fd.as_fd();
        let le = |e| self.lower_err(e);
        if let Some(mode) = mode {
            if handle.is_some() {
                nix::sys::stat::fchmod(fd, nix::sys::stat::Mode::from_bits_truncate(mode))
                    .map_err(le)?;
            } else {
                sys::chmod_fd(fd, mode).map_err(le)?;
            }
        }
        if uid.is_some() || gid.is_some() {
            sys::chown_fd(fd, uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX)).map_err(le)?;
        }
        if let Some(size) = size {
            match &handle {
                Some(h) if matches!(h.kind, HandleKind::File { writable: true, .. }) => {
                    sys::ftruncate(fd, size).map_err(le)?
                }
                _ => sys::truncate_fd_path(fd, size).map_err(le)?,
            }
            if let Some(caller) = &kill_privs {
                self.kill_privs(fd, caller)?;
            }
        }
        if let Some(times) = times {
            if inode.fmt == libc::S_IFLNK && handle.is_none() {
                sys::utimensat(fd, c"", &times, libc::AT_EMPTY_PATH).map_err(le)?;
            } else {
                let path = sys::proc_fd_path(fd.as_raw_fd());
                // SAFETY: AT_FDCWD with an absolute path.
                sys::utimensat(
                    unsafe { BorrowedFd::borrow_raw(libc::AT_FDCWD) },
                    &path,
                    &times,
                    0,
                )
                .map_err(le)?;
            }
        }
        sys::fstat(fd).map_err(le)
    }

    /// READLINK.
    ///
    /// # Errors
    /// The lower's errno (`EINVAL` for a non-symlink).
    pub fn readlink(&self, nodeid: u64) -> Result<Vec<u8>> {
        self.admission.check_alive()?;
        let inode = self.inode(nodeid)?;
        let fd = self.inode_fd(&inode)?;
        sys::readlinkat(fd.as_fd(), c"").map_err(|e| self.lower_err(e))
    }

    fn new_entry(&self, parent: &Arc<Inode>, pfd: &OwnedFd, name: &CStr) -> Result<Entry> {
        let st = sys::fstatat(pfd.as_fd(), name).map_err(|e| self.lower_err(e))?;
        Ok(self.remember(parent, name, &st))
    }

    /// MKNOD (regular files, fifos, sockets; devices if the lower allows), as the caller.
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; else the lower's errno.
    pub fn mknod(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        rdev: u32,
        caller: Caller,
    ) -> Result<Entry> {
        self.admission.check_admit()?;
        let parent = self.inode(parent)?;
        let name = cname(name)?;
        let pfd = self.inode_fd(&parent)?;
        {
            let _creds = sys::CallerCreds::switch(caller);
            sys::mknodat(pfd.as_fd(), &name, mode, u64::from(rdev))
                .map_err(|e| self.lower_err(e))?;
        }
        self.new_entry(&parent, &pfd, &name)
    }

    /// MKDIR, as the caller.
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; else the lower's errno.
    pub fn mkdir(&self, parent: u64, name: &OsStr, mode: u32, caller: Caller) -> Result<Entry> {
        self.admission.check_admit()?;
        let parent = self.inode(parent)?;
        let name = cname(name)?;
        let pfd = self.inode_fd(&parent)?;
        {
            let _creds = sys::CallerCreds::switch(caller);
            sys::mkdirat(pfd.as_fd(), &name, mode).map_err(|e| self.lower_err(e))?;
        }
        self.new_entry(&parent, &pfd, &name)
    }

    /// SYMLINK, as the caller.
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; else the lower's errno.
    pub fn symlink(
        &self,
        parent: u64,
        name: &OsStr,
        target: &Path,
        caller: Caller,
    ) -> Result<Entry> {
        self.admission.check_admit()?;
        let parent = self.inode(parent)?;
        let name = cname(name)?;
        let target = cname(target.as_os_str())?;
        let pfd = self.inode_fd(&parent)?;
        {
            let _creds = sys::CallerCreds::switch(caller);
            sys::symlinkat(&target, pfd.as_fd(), &name).map_err(|e| self.lower_err(e))?;
        }
        self.new_entry(&parent, &pfd, &name)
    }

    /// UNLINK (`rmdir` = false) or RMDIR.
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; else the lower's errno.
    pub fn unlink(&self, parent: u64, name: &OsStr, rmdir: bool) -> Result<()> {
        self.admission.check_admit()?;
        let parent = self.inode(parent)?;
        let name = cname(name)?;
        let pfd = self.inode_fd(&parent)?;
        let flags = if rmdir { libc::AT_REMOVEDIR } else { 0 };
        sys::unlinkat(pfd.as_fd(), &name, flags).map_err(|e| self.lower_err(e))
    }

    fn known_at(&self, dir: &OwnedFd, name: &CStr) -> Option<Arc<Inode>> {
        let st = sys::fstatat(dir.as_fd(), name).ok()?;
        let map = self.inodes.read();
        map.by_key
            .get(&InodeKey::of(&st))
            .and_then(|id| map.by_id.get(id))
            .cloned()
    }

    /// RENAME with renameat2 flags (RENAME_NOREPLACE, RENAME_EXCHANGE); the moved inodes keep
    /// their nodeids and learn their new location.
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; else the lower's errno (`EINVAL` when the lower
    /// does not support the flags).
    pub fn rename(
        &self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        self.admission.check_admit()?;
        let parent = self.inode(parent)?;
        let newparent = self.inode(newparent)?;
        let name = cname(name)?;
        let newname = cname(newname)?;
        let pfd = self.inode_fd(&parent)?;
        let npfd = self.inode_fd(&newparent)?;
        let moved = self.known_at(&pfd, &name);
        let exchanged = if flags & libc::RENAME_EXCHANGE != 0 {
            self.known_at(&npfd, &newname)
        } else {
            None
        };
        sys::renameat2(pfd.as_fd(), &name, npfd.as_fd(), &newname, flags)
            .map_err(|e| self.lower_err(e))?;
        if let Some(m) = moved {
            m.set_location(&newparent, &newname);
        }
        if let Some(x) = exchanged {
            x.set_location(&parent, &name);
        }
        Ok(())
    }

    /// LINK: a new name for `nodeid`; the same nodeid is returned (hard links share identity).
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; else the lower's errno.
    pub fn link(&self, nodeid: u64, newparent: u64, newname: &OsStr) -> Result<Entry> {
        self.admission.check_admit()?;
        let inode = self.inode(nodeid)?;
        let newparent = self.inode(newparent)?;
        let newname = cname(newname)?;
        let fd = self.inode_fd(&inode)?;
        let npfd = self.inode_fd(&newparent)?;
        sys::link_fd(fd.as_fd(), npfd.as_fd(), &newname).map_err(|e| self.lower_err(e))?;
        self.new_entry(&newparent, &npfd, &newname)
    }

    fn lower_open_flags(flags: i32) -> i32 {
        // O_CREAT/O_EXCL were handled by the kernel or CREATE; O_DIRECT applies to the data
        // path (the kernel's backing file keeps it) and would force aligned buffers on ours.
        (flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_DIRECT))
            | libc::O_NOFOLLOW
    }

    fn mode_of(flags: i32) -> HandleMode {
        match flags & libc::O_ACCMODE {
            libc::O_RDONLY => HandleMode::Read,
            _ => HandleMode::Write,
        }
    }

    /// Installs a handle for `fd`. With `register`, the open uses kernel passthrough unless the
    /// kernel must not see it as one:
    /// - the inode already has opens served by drainfs (the kernel's cached io mode: a
    ///   passthrough open next to them fails with EIO), so this one is served by drainfs too;
    /// - `unprivileged_suid_writer`: a caller without CAP_FSETID opens a file that has
    ///   privilege bits for writing. With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves clearing
    ///   them on write to drainfs, but passthrough writes never reach drainfs (and the backing
    ///   file writes with drainfs's credentials), so such an open is served by drainfs, whose
    ///   WRITEs carry FUSE_WRITE_KILL_SUIDGID. If the inode already has passthrough opens,
    ///   this open must be passthrough too: the bits are cleared now instead, at open.
    fn install_handle(
        &self,
        inode: Arc<Inode>,
        fd: OwnedFd,
        flags: i32,
        register: RegisterBacking<'_>,
        unprivileged_suid_writer: Option<Caller>,
    ) -> Result<Opened> {
        let fd = Arc::new(fd);
        let writable = Self::mode_of(flags) == HandleMode::Write;
        let fh = self.next_fh.fetch_add(1, Relaxed);
        let mut backing = None;
        {
            let mut st = inode.open.lock();
            let cached_mode = st.opens > 0 && st.passthrough_opens == 0;
            let suid_writer_alone = unprivileged_suid_writer.is_some() && st.passthrough_opens == 0;
            let register = register
                .filter(|_| !cached_mode && !suid_writer_alone)
                .filter(|p| !p.only_if_shared || st.backing.is_some())
                .map(|p| p.register);
            if let Some(register) = register {
                if let Some(caller) = &unprivileged_suid_writer {
                    self.kill_privs(fd.as_fd(), caller)?;
                }
                if let Some(b) = &st.backing {
                    backing = Some(Arc::clone(b));
                } else {
                    match register(fd.as_fd()) {
                        Ok(b) => {
                            st.backing = Some(Arc::clone(&b));
                            backing = Some(b);
                        }
                        Err(e) if st.passthrough_opens == 0 && st.opens == 0 => {
                            tracing::debug!(nodeid = inode.nodeid, error = %e, "backing open failed; serving this open without passthrough");
                        }
                        Err(e) => {
                            tracing::warn!(nodeid = inode.nodeid, error = %e, "backing open failed while the inode has other opens");
                            return Err(Kind::Passthrough.into());
                        }
                    }
                }
                if backing.is_some() {
                    st.passthrough_opens += 1;
                }
            }
            st.opens += 1;
            st.fds.push((fh, Arc::clone(&fd)));
        }
        let guard = self.acct.handle(Self::mode_of(flags));
        let handle = Handle {
            inode,
            fd,
            kind: HandleKind::File {
                writable,
                passthrough: backing.is_some(),
            },
            flags,
            guard,
        };
        self.handles.write().insert(fh, Arc::new(handle));
        Ok(Opened { fh, backing })
    }

    /// OPEN: opens the lower file with the application's flags; with `register`, sets up
    /// kernel passthrough (one backing id per inode, shared by concurrent opens), except for
    /// the cases `Fs::install_handle` lists. `caller` is who opens (its uid stands for
    /// "lacks CAP_FSETID" when non-zero).
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; `ESTALE` when the name now names another inode;
    /// `EIO` when passthrough cannot be set up for an inode that has passthrough opens; else
    /// the lower's errno.
    pub fn open(
        &self,
        nodeid: u64,
        flags: i32,
        caller: Caller,
        register: RegisterBacking<'_>,
    ) -> Result<Opened> {
        self.admission.check_admit()?;
        let inode = self.inode(nodeid)?;
        let lflags = Self::lower_open_flags(flags);
        let fd = self.open_inode(&inode, lflags)?;
        let register = if inode.fmt == libc::S_IFREG {
            register
        } else {
            None
        };
        let suid_writer =
            if register.is_some() && Self::mode_of(flags) == HandleMode::Write && caller.uid != 0 {
                let st = sys::fstat(fd.as_fd()).map_err(|e| self.lower_err(e))?;
                (privs_to_kill(st.st_mode, st.st_gid, &caller) != 0).then_some(caller)
            } else {
                None
            };
        self.install_handle(inode, fd, flags, register, suid_writer)
    }

    fn open_inode(&self, inode: &Arc<Inode>, lflags: i32) -> Result<OwnedFd> {
        let cached = self
            .fd_cache
            .lock()
            .get(&inode.nodeid)
            .cloned()
            .or_else(|| inode.open_fd());
        if let Some(fd) = cached {
            return sys::reopen(fd.as_fd(), lflags & !libc::O_NOFOLLOW)
                .map_err(|e| self.lower_err(e));
        }
        let (parent, name) = {
            let loc = inode.loc.lock();
            let l = loc.as_ref().ok_or(Error::from(Kind::Stale))?;
            (Arc::clone(&l.parent), l.name.clone())
        };
        let pfd = self.inode_fd(&parent)?;
        let fd = sys::openat(pfd.as_fd(), &name, lflags, 0).map_err(|e| self.lower_err(e))?;
        let st = sys::fstat(fd.as_fd()).map_err(|e| self.lower_err(e))?;
        if InodeKey::of(&st) != inode.key {
            return Err(Kind::Stale.into());
        }
        Ok(fd)
    }

    /// CREATE: creates and opens `parent/name` as the caller; passthrough as for [`Fs::open`].
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; else the lower's errno (`EEXIST` with O_EXCL).
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        caller: Caller,
        register: RegisterBacking<'_>,
    ) -> Result<(Entry, Opened)> {
        self.admission.check_admit()?;
        let parent = self.inode(parent)?;
        let name = cname(name)?;
        let pfd = self.inode_fd(&parent)?;
        let lflags =
            (flags & !(libc::O_NOCTTY | libc::O_DIRECT)) | libc::O_CREAT | libc::O_NOFOLLOW;
        let fd = {
            let _creds = sys::CallerCreds::switch(caller);
            sys::openat(pfd.as_fd(), &name, lflags, mode).map_err(|e| self.lower_err(e))?
        };
        let st = sys::fstat(fd.as_fd()).map_err(|e| self.lower_err(e))?;
        let entry = self.remember(&parent, &name, &st);
        let inode = self.inode(entry.nodeid)?;
        let suid_writer = (Self::mode_of(flags) == HandleMode::Write
            && caller.uid != 0
            && privs_to_kill(st.st_mode, st.st_gid, &caller) != 0)
            .then_some(caller);
        let opened = self.install_handle(inode, fd, flags, register, suid_writer);
        if opened.is_err() {
            self.forget(entry.nodeid, 1);
        }
        Ok((entry, opened?))
    }

    /// READ into `buf` (drainfs's own data path; passthrough opens never get here).
    ///
    /// # Errors
    /// `EBADF` for an unknown fh; else the lower's errno.
    pub fn read(&self, nodeid: u64, fh: u64, offset: u64, buf: &mut [u8]) -> Result<usize> {
        self.admission.check_alive()?;
        let h = self.handle(nodeid, fh)?;
        let n = sys::pread(h.fd.as_fd(), buf, offset).map_err(|e| self.lower_err(e))?;
        self.acct.bytes_read.fetch_add(n as u64, Relaxed);
        Ok(n)
    }

    /// WRITE (drainfs's own data path). `kill_suidgid` (FUSE_WRITE_KILL_SUIDGID) clears
    /// set-user-ID/set-group-ID bits first, as the kernel expects with KILLPRIV_V2.
    ///
    /// # Errors
    /// `EBADF` for an unknown fh; else the lower's errno.
    pub fn write(
        &self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        data: &[u8],
        kill_privs: Option<Caller>,
    ) -> Result<usize> {
        self.admission.check_alive()?;
        let h = self.handle(nodeid, fh)?;
        if let Some(caller) = &kill_privs {
            self.kill_privs(h.fd.as_fd(), caller)?;
        }
        let n = sys::pwrite_all(h.fd.as_fd(), data, offset).map_err(|e| self.lower_err(e))?;
        self.acct.bytes_written.fetch_add(n as u64, Relaxed);
        Ok(n)
    }

    /// FLUSH: `close(dup(fd))` on the lower, so the lower's upload happens inside the
    /// application's `close()` and its error is returned there. Never ENOSYS.
    ///
    /// # Errors
    /// The lower's FLUSH errno (e.g. an upload failure).
    pub fn flush(&self, nodeid: u64, fh: u64) -> Result<()> {
        let h = self.handle(nodeid, fh)?;
        let _call = self.acct.lower_call(LowerCall::Flush);
        sys::flush(h.fd.as_fd()).map_err(|e| {
            self.acct.lower_flush_errors.fetch_add(1, Relaxed);
            let mut f = self.failed_flushes.lock();
            if f.len() < 64 {
                f.push(format!("{}: {e}", h.inode.path().display()));
            }
            self.lower_err(e)
        })
    }

    /// Paths whose FLUSH failed (capped at 64), for the shutdown summary.
    pub fn failed_flushes(&self) -> Vec<String> {
        self.failed_flushes.lock().clone()
    }

    /// FSYNC (or FSYNCDIR): `fsync`/`fdatasync` on the lower fd. Never ENOSYS.
    ///
    /// # Errors
    /// The lower's errno.
    pub fn fsync(&self, nodeid: u64, fh: u64, datasync: bool) -> Result<()> {
        let h = self.handle(nodeid, fh)?;
        let _call = self.acct.lower_call(LowerCall::Fsync);
        sys::fsync(h.fd.as_fd(), datasync).map_err(|e| self.lower_err(e))
    }

    /// RELEASE / RELEASEDIR: forgets the fh and closes the lower fd (the lower's RELEASE);
    /// the inode's backing id is dropped with its last passthrough open.
    ///
    /// # Errors
    /// `EBADF` for an unknown fh.
    pub fn release(&self, nodeid: u64, fh: u64) -> Result<()> {
        let h = {
            let mut handles = self.handles.write();
            match handles.get(&fh) {
                Some(h) if h.inode.nodeid == nodeid => handles.remove(&fh),
                _ => None,
            }
        }
        .ok_or(Error::from(Kind::UnknownHandle))?;
        let backing_to_drop = {
            let mut st = h.inode.open.lock();
            st.opens = st.opens.saturating_sub(1);
            st.fds.retain(|(f, _)| *f != fh);
            if let HandleKind::File {
                passthrough: true, ..
            } = h.kind
            {
                st.passthrough_opens = st.passthrough_opens.saturating_sub(1);
                if st.passthrough_opens == 0 {
                    st.backing.take()
                } else {
                    None
                }
            } else {
                None
            }
        };
        drop(backing_to_drop);
        let _call = self.acct.lower_call(LowerCall::Release);
        drop(h);
        Ok(())
    }

    /// OPENDIR.
    ///
    /// # Errors
    /// The lower's errno (`ENOTDIR`...).
    pub fn opendir(&self, nodeid: u64, flags: i32) -> Result<u64> {
        self.admission.check_alive()?;
        let inode = self.inode(nodeid)?;
        let pfd = self.inode_fd(&inode)?;
        let fd = sys::openat(pfd.as_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .map_err(|e| self.lower_err(e))?;
        let fh = self.next_fh.fetch_add(1, Relaxed);
        let handle = Handle {
            inode,
            fd: Arc::new(fd),
            kind: HandleKind::Dir(Mutex::new(DirStream {
                buf: vec![0; 32 * 1024],
                pos: 0,
                len: 0,
                next_off: 0,
            })),
            flags,
            guard: self.acct.handle(HandleMode::Dir),
        };
        self.handles.write().insert(fh, Arc::new(handle));
        Ok(fh)
    }

    /// READDIR / READDIRPLUS from `offset` (0 or a cookie returned earlier). `add` is called
    /// for each entry with `(lower d_ino, next offset, d_type, name)` and returns false when
    /// the reply is full (that entry is kept for the next call).
    ///
    /// # Errors
    /// `EBADF` for an unknown fh; else the lower's errno.
    pub fn readdir(
        &self,
        nodeid: u64,
        fh: u64,
        offset: i64,
        mut add: impl FnMut(u64, i64, u8, &[u8]) -> bool,
    ) -> Result<()> {
        self.admission.check_alive()?;
        let h = self.handle(nodeid, fh)?;
        let HandleKind::Dir(stream) = &h.kind else {
            return Err(Errno::ENOTDIR.into());
        };
        let mut s = stream.lock();
        if offset != s.next_off || (s.pos >= s.len && offset == 0) {
            sys::lseek(h.fd.as_fd(), offset, libc::SEEK_SET).map_err(|e| self.lower_err(e))?;
            s.pos = 0;
            s.len = 0;
            s.next_off = offset;
        }
        loop {
            if s.pos >= s.len {
                let DirStream { buf, .. } = &mut *s;
                let n = sys::getdents64(h.fd.as_fd(), buf).map_err(|e| self.lower_err(e))?;
                s.pos = 0;
                s.len = n;
                if n == 0 {
                    return Ok(());
                }
            }
            let (pos, len) = (s.pos, s.len);
            let Some(d) = sys::parse_dirent(&s.buf[pos..len]) else {
                s.pos = s.len;
                continue;
            };
            let (ino, off, typ, reclen) = (d.ino, d.off, d.typ, d.reclen);
            if !add(ino, off, typ, d.name) {
                return Ok(());
            }
            s.pos += reclen;
            s.next_off = off;
        }
    }

    /// For READDIRPLUS: looks up `name` in the directory of handle `fh` (one lookup reference).
    ///
    /// # Errors
    /// The lower's errno.
    pub fn lookup_in_dir(&self, nodeid: u64, fh: u64, name: &[u8]) -> Result<Entry> {
        let h = self.handle(nodeid, fh)?;
        let name = CString::new(name).map_err(|_| Error::from(Kind::BadName))?;
        let st = sys::fstatat(h.fd.as_fd(), &name).map_err(|e| self.lower_err(e))?;
        Ok(self.remember(&h.inode, &name, &st))
    }

    /// The nodeid a READDIR entry should carry as `d_ino`, so that it equals the `st_ino` a
    /// later stat reports: the inode's nodeid if known, else a nodeid reserved now (in a
    /// bounded map; LOOKUP takes the reservation). Reporting the lower's own inode number
    /// instead would disagree with `st_ino` and could collide with another file's nodeid
    /// (gcsfuse's inode numbers are a counter, as nodeids are).
    pub fn dirent_nodeid(&self, dev: u64, ino: u64) -> u64 {
        let key = InodeKey { dev, ino };
        if let Some(id) = self.inodes.read().by_key.get(&key) {
            return *id;
        }
        let mut reserved = self.reserved.lock();
        if let Some(id) = reserved.get(&key) {
            return *id;
        }
        let id = self.next_nodeid.fetch_add(1, Relaxed);
        reserved.push(key, id);
        id
    }

    /// The lower's `st_dev` of the root (directory entries are on it unless they are mounts).
    pub fn root_dev(&self) -> u64 {
        self.root.key.dev
    }

    /// STATFS of the lower.
    ///
    /// # Errors
    /// The lower's errno.
    pub fn statfs(&self) -> Result<libc::statvfs> {
        self.admission.check_alive()?;
        sys::fstatvfs(self.root_fd.as_fd()).map_err(|e| self.lower_err(e))
    }

    /// ACCESS (only sent without default_permissions): existence and the lower's answer for
    /// drainfs's credentials.
    ///
    /// # Errors
    /// The lower's errno.
    pub fn access(&self, nodeid: u64, mask: i32) -> Result<()> {
        self.admission.check_alive()?;
        let inode = self.inode(nodeid)?;
        let fd = self.inode_fd(&inode)?;
        let path = sys::proc_fd_path(fd.as_raw_fd());
        nix::unistd::access(
            path.as_c_str(),
            nix::unistd::AccessFlags::from_bits_truncate(mask),
        )
        .map_err(|e| self.lower_err(e))
    }

    fn xattr_fd(&self, nodeid: u64) -> Result<Arc<OwnedFd>> {
        self.admission.check_alive()?;
        let inode = self.inode(nodeid)?;
        self.inode_fd(&inode)
    }

    /// GETXATTR; `size == 0` asks for the value's size. Returns the size or the bytes.
    ///
    /// # Errors
    /// The lower's errno (`ENODATA`, `ERANGE`, `ENOTSUP`...).
    pub fn getxattr(&self, nodeid: u64, name: &OsStr, size: u32) -> Result<XattrReply> {
        let fd = self.xattr_fd(nodeid)?;
        let name = cname(name)?;
        if size == 0 {
            let n = sys::xattr::get(fd.as_fd(), &name, &mut []).map_err(|e| self.lower_err(e))?;
            return Ok(XattrReply::Size(n as u32));
        }
        let mut buf = vec![0u8; size as usize];
        let n = sys::xattr::get(fd.as_fd(), &name, &mut buf).map_err(|e| self.lower_err(e))?;
        buf.truncate(n);
        Ok(XattrReply::Data(buf))
    }

    /// LISTXATTR; `size == 0` asks for the list's size.
    ///
    /// # Errors
    /// The lower's errno.
    pub fn listxattr(&self, nodeid: u64, size: u32) -> Result<XattrReply> {
        let fd = self.xattr_fd(nodeid)?;
        if size == 0 {
            let n = sys::xattr::list(fd.as_fd(), &mut []).map_err(|e| self.lower_err(e))?;
            return Ok(XattrReply::Size(n as u32));
        }
        let mut buf = vec![0u8; size as usize];
        let n = sys::xattr::list(fd.as_fd(), &mut buf).map_err(|e| self.lower_err(e))?;
        buf.truncate(n);
        Ok(XattrReply::Data(buf))
    }

    /// SETXATTR.
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; else the lower's errno.
    pub fn setxattr(&self, nodeid: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        self.admission.check_admit()?;
        let fd = self.xattr_fd(nodeid)?;
        let name = cname(name)?;
        sys::xattr::set(fd.as_fd(), &name, value, flags).map_err(|e| self.lower_err(e))
    }

    /// REMOVEXATTR.
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; else the lower's errno.
    pub fn removexattr(&self, nodeid: u64, name: &OsStr) -> Result<()> {
        self.admission.check_admit()?;
        let fd = self.xattr_fd(nodeid)?;
        let name = cname(name)?;
        sys::xattr::remove(fd.as_fd(), &name).map_err(|e| self.lower_err(e))
    }

    /// FALLOCATE on the handle's lower fd. `kill_suidgid` (a caller without CAP_FSETID)
    /// clears privilege bits first, as the lower's own fallocate would for that caller.
    ///
    /// # Errors
    /// The lower's errno (`EOPNOTSUPP` for unsupported modes).
    pub fn fallocate(
        &self,
        nodeid: u64,
        fh: u64,
        offset: u64,
        len: u64,
        mode: i32,
        kill_privs: Option<Caller>,
    ) -> Result<()> {
        self.admission.check_alive()?;
        let h = self.handle(nodeid, fh)?;
        sys::fallocate(h.fd.as_fd(), mode, offset, len).map_err(|e| self.lower_err(e))?;
        if let Some(caller) = &kill_privs {
            self.kill_privs(h.fd.as_fd(), caller)?;
        }
        Ok(())
    }

    /// LSEEK (SEEK_DATA / SEEK_HOLE; also SEEK_SET/SEEK_END) on the handle's lower fd.
    ///
    /// # Errors
    /// The lower's errno (`ENXIO` past the end).
    pub fn lseek(&self, nodeid: u64, fh: u64, offset: i64, whence: i32) -> Result<i64> {
        self.admission.check_alive()?;
        let h = self.handle(nodeid, fh)?;
        sys::lseek(h.fd.as_fd(), offset, whence).map_err(|e| self.lower_err(e))
    }

    /// COPY_FILE_RANGE between two handles' lower fds. `kill_suidgid` (a caller without
    /// CAP_FSETID) clears privilege bits of the destination, as a write would.
    ///
    /// # Errors
    /// The lower's errno (`EXDEV`, `EINVAL`...).
    #[allow(clippy::too_many_arguments)]
    pub fn copy_file_range(
        &self,
        ino_in: u64,
        fh_in: u64,
        off_in: u64,
        ino_out: u64,
        fh_out: u64,
        off_out: u64,
        len: u64,
        flags: u32,
        kill_privs: Option<Caller>,
    ) -> Result<usize> {
        self.admission.check_alive()?;
        let hi = self.handle(ino_in, fh_in)?;
        let ho = self.handle(ino_out, fh_out)?;
        let n = sys::copy_file_range(hi.fd.as_fd(), off_in, ho.fd.as_fd(), off_out, len, flags)
            .map_err(|e| self.lower_err(e))?;
        if let Some(caller) = kill_privs.as_ref().filter(|_| n > 0) {
            self.kill_privs(ho.fd.as_fd(), caller)?;
        }
        Ok(n)
    }

    /// Paths of the handles still open (capped), for `/status` and the shutdown summary.
    pub fn open_paths(&self, cap: usize) -> Vec<(String, HandleMode)> {
        let handles: Vec<Arc<Handle>> = self.handles.read().values().take(cap).cloned().collect();
        handles
            .iter()
            .map(|h| (h.inode.path().display().to_string(), h.mode()))
            .collect()
    }

    /// Closes every remaining lower fd (teardown after unmount, or at the deadline): flushes
    /// each writable one first so the lower uploads what it can. Returns the paths whose
    /// flush failed.
    pub fn close_all(&self) -> Vec<String> {
        let handles: Vec<Arc<Handle>> = self.handles.write().drain().map(|(_, h)| h).collect();
        let mut failed = Vec::new();
        for h in handles {
            if let HandleKind::File { writable: true, .. } = h.kind {
                let _call = self.acct.lower_call(LowerCall::Flush);
                if let Err(e) = sys::flush(h.fd.as_fd()) {
                    failed.push(format!("{}: {}", h.inode.path().display(), e));
                }
            }
            {
                let mut st = h.inode.open.lock();
                st.fds.clear();
                st.backing = None;
            }
            let _call = self.acct.lower_call(LowerCall::Release);
            drop(h);
        }
        self.fd_cache.lock().clear();
        failed
    }
}

/// A GETXATTR / LISTXATTR answer.
#[derive(Debug)]
pub enum XattrReply {
    /// The size asked for with `size == 0`.
    Size(u32),
    /// The bytes.
    Data(Vec<u8>),
}

#[cfg(test)]
mod tests;

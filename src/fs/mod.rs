//! The filesystem core: a passthrough of a lower directory, free of fuser so it can be
//! unit-tested on a temp dir without mounting.
//!
//! Identity follows virtiofsd and fuse-backend-rs: an inode is keyed by the lower's
//! `(st_dev, st_ino)`, so hard links share one nodeid and renames keep identity; nodeids are
//! never reused; the root is pinned. Unlike virtiofsd, an inode does not hold an O_PATH fd for
//! its whole life: O_PATH fds live in a bounded LRU cache ([`crate::config::FsConfig::max_lower_fds`]) and an
//! inode that lost its fd is found again through the names it was last seen under (parent
//! inode + name, a few per inode so that a hard link stays reachable when another of its names
//! is removed), each verified against its key (a mismatch is `ESTALE`). That keeps 100,000 known inodes within a
//! 20,000 RLIMIT_NOFILE (gcsfuse's inode numbers are not usable with `name_to_handle_at`).
//! Open files need no path at all: every operation on an open file uses its handle's lower fd,
//! which is why unlinked-but-open files keep working.
//!
//! Admission ([`Admission`]) gates opens, creates and namespace changes once shutdown has
//! closed the door (`ESHUTDOWN`), and turns everything into `EIO` once the lower is gone.
//!
//! Modules: [`sys`] (the syscalls), `inodes` (the inode store), `handles` (the handle table
//! and each inode's open files).
//!
//! # Lock order
//! A lock may be taken while holding only the locks listed before it; the leaves are held
//! alone:
//! 1. the inode store's map (`InodeStore::map`), held while recording a name in
//!    2. an inode's names (`Inode::locs`), a leaf, or in
//!    3. the READDIR reservations (`InodeStore::reserved`), a leaf;
//! 4. an inode's open files (`Inode::open`), held across the backing-id registration and the
//!    privilege-bit clearing of an open (both syscalls on that inode only), never while
//!    holding another lock;
//! 5. the leaves: the handle table (`HandleTable::map`), the O_PATH cache (`Fs::fd_cache`),
//!    the root fd, the admitted list, the failed-flush list, the lingering fds of released
//!    passthrough writers (`Fs::lingering`), a directory stream (held across `getdents64`).
//!
//! Fds and inodes leave a lock as cloned `Arc`s; a syscall never runs under the store, table
//! or cache locks.

mod handles;
mod inodes;
mod open_files;
pub mod sys;

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr, OsString};
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

use nix::errno::Errno;
use parking_lot::{Mutex, RwLock};

use crate::accounting::{Accounting, HandleMode, LowerCall};
use crate::error::{Error, Kind, Result};
use handles::{DirStream, Handle, HandleKind, HandleTable};
pub use inodes::ROOT_ID;
use inodes::{Inode, InodeKey, InodeStore};
pub use open_files::Backing;
pub use sys::Caller;
use sys::Stat;

/// The shutdown gate shared with the lifecycle: the door (kept in the accounting's
/// [`crate::gate::Gate`], beside the in-flight count) and whether the lower is gone.
#[derive(Debug)]
pub struct Admission {
    acct: Arc<Accounting>,
    lower_gone: AtomicBool,
    fds_closed: AtomicBool,
    /// Signalled once when an operation first sees the lower's connection gone.
    pub lower_gone_notify: tokio::sync::Notify,
}

impl Admission {
    /// New, open, sharing `acct`'s door.
    pub fn new(acct: &Arc<Accounting>) -> Arc<Self> {
        Arc::new(Admission {
            acct: Arc::clone(acct),
            lower_gone: AtomicBool::new(false),
            fds_closed: AtomicBool::new(false),
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

    /// Marks drainfs's lower fds as closed ([`Fs::close_lower_fds`]): every operation fails
    /// with `EIO` from now on.
    fn close_fds(&self) {
        self.fds_closed.store(true, SeqCst);
    }

    /// Whether drainfs's lower fds are closed.
    pub fn fds_closed(&self) -> bool {
        self.fds_closed.load(SeqCst)
    }

    #[inline]
    fn check_alive(&self) -> Result<()> {
        if self.lower_gone.load(Relaxed) {
            Err(Kind::LowerGone.into())
        } else if self.fds_closed.load(Relaxed) {
            Err(Kind::Closed.into())
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

/// A path relative to the mount as shown in `/status` and the summary: the root is `.`.
fn shown(p: &Path) -> String {
    if p.as_os_str().is_empty() {
        ".".to_string()
    } else {
        p.display().to_string()
    }
}

/// An admitted open or create in flight (see [`Fs::admit`]); unlisted on drop.
struct Admitted<'a> {
    fs: &'a Fs,
    token: u64,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.fs.admitted.lock().remove(&self.token);
    }
}

/// At most this many lower fds of released passthrough writers are kept ([`Fs::release`]),
/// and at most a quarter of the fd budget.
pub const LINGER_CAP: usize = 256;

/// A released passthrough writer's inode and lower fd, kept until its close ([`Fs::release`]).
type Lingering = (Arc<Inode>, Arc<OwnedFd>);

/// Configuration of the core (the subset of [`crate::config::FsConfig`] it needs).
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Capacity of the O_PATH fd cache.
    pub max_lower_fds: usize,
}

/// The passthrough filesystem core.
pub struct Fs {
    /// The lower root's fd; `None` once [`Fs::close_lower_fds`] ran. A leaf lock.
    root_fd: RwLock<Option<Arc<OwnedFd>>>,
    inodes: InodeStore,
    handles: HandleTable,
    /// O_PATH fds of inodes, by nodeid, bounded by `max_lower_fds`. A leaf lock.
    fd_cache: Mutex<lru::LruCache<u64, Arc<OwnedFd>>>,
    /// Paths whose lower flush failed (at most 64). A leaf lock.
    failed_flushes: Mutex<Vec<String>>,
    /// Lower fds of released writable passthrough handles, by nodeid (the newest per inode),
    /// bounded by [`LINGER_CAP`]: their close (a FLUSH on the lower) is deferred to eviction
    /// or the teardown, so that writes through a mapping that outlives the release reach the
    /// bucket (see [`Fs::release`]). A leaf lock.
    lingering: Mutex<lru::LruCache<u64, Lingering>>,
    /// Admitted opens and creates in flight: token -> (nodeid, name under it), for naming
    /// them in the summary of a forced teardown. A leaf lock.
    admitted: Mutex<HashMap<u64, (u64, Option<OsString>)>>,
    next_admitted: AtomicU64,
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
        let root_fd = sys::open_path(&path, libc::O_PATH | libc::O_DIRECTORY)?;
        let st = sys::fstat(root_fd.as_fd())?;
        let cap = NonZeroUsize::new(cfg.max_lower_fds.max(16)).expect("max(16) is non-zero");
        Ok(Fs {
            root_fd: RwLock::new(Some(Arc::new(root_fd))),
            inodes: InodeStore::new(Inode::root(&st)),
            handles: HandleTable::new(),
            fd_cache: Mutex::new(lru::LruCache::new(cap)),
            failed_flushes: Mutex::new(Vec::new()),
            lingering: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new((cfg.max_lower_fds / 4).clamp(1, LINGER_CAP))
                    .expect("clamped to at least 1"),
            )),
            admitted: Mutex::new(HashMap::new()),
            next_admitted: AtomicU64::new(0),
            acct,
            admission,
        })
    }

    /// Admits an open or create of `name` under `nodeid` (or of `nodeid` itself): `ESHUTDOWN`
    /// once the door is closed. The guard keeps it listed in [`Fs::admitted_paths`] until the
    /// request ends.
    fn admit(&self, nodeid: u64, name: Option<&OsStr>) -> Result<Admitted<'_>> {
        // Listed before the door is checked: whoever reads the list after closing the door
        // sees every request that got past it.
        let token = self.next_admitted.fetch_add(1, Relaxed);
        self.admitted
            .lock()
            .insert(token, (nodeid, name.map(OsStr::to_os_string)));
        let admitted = Admitted { fs: self, token };
        self.admission.check_admit()?;
        Ok(admitted)
    }

    /// Paths of the opens and creates admitted and still in flight (at most `cap`), for the
    /// summary of a forced teardown.
    pub fn admitted_paths(&self, cap: usize) -> Vec<String> {
        let list: Vec<(u64, Option<OsString>)> =
            self.admitted.lock().values().take(cap).cloned().collect();
        list.into_iter()
            .map(|(nodeid, name)| {
                let base = self.inode(nodeid).map_or_else(
                    |_| PathBuf::from(format!("<nodeid {nodeid}>")),
                    |i| i.path(),
                );
                match name {
                    Some(n) => base.join(n),
                    None => base,
                }
                .display()
                .to_string()
            })
            .collect()
    }

    /// Number of inodes known (including the root).
    pub fn inode_count(&self) -> usize {
        self.inodes.len()
    }

    /// The lower path of `nodeid` relative to the lower root, as last known (for logs only),
    /// or `None` for a nodeid the kernel no longer holds.
    pub fn path_of(&self, nodeid: u64) -> Option<PathBuf> {
        self.inodes.get(nodeid).map(|i| i.path())
    }

    /// Number of O_PATH fds cached.
    pub fn cached_fds(&self) -> usize {
        self.fd_cache.lock().len()
    }

    /// The lower root's fd.
    ///
    /// # Errors
    /// `EIO` ([`Kind::Closed`]) once [`Fs::close_lower_fds`] ran.
    fn root_fd(&self) -> Result<Arc<OwnedFd>> {
        self.root_fd
            .read()
            .clone()
            .ok_or_else(|| Kind::Closed.into())
    }

    /// Puts a new handle in the table, unless the lower fds are closed (then the handle is
    /// unlisted from its inode and dropped here, closing its fd, and the open fails with
    /// `EIO`).
    fn insert_handle(&self, fh: u64, handle: Handle) -> Result<()> {
        // Checked under the table's lock, which `close_lower_fds` takes after setting it.
        let refused = self
            .handles
            .insert_unless(fh, handle, || self.admission.fds_closed());
        if let Err(handle) = refused {
            let (_, backing) = handle.inode.open.lock().remove(fh);
            drop(backing);
            return Err(Kind::Closed.into());
        }
        Ok(())
    }

    fn inode(&self, nodeid: u64) -> Result<Arc<Inode>> {
        self.inodes
            .get(nodeid)
            .ok_or_else(|| Kind::UnknownInode.into())
    }

    /// The handle `fh`, checked to belong to `nodeid`.
    ///
    /// # Errors
    /// `EBADF` for an unknown fh or one of another inode; `EIO` once the lower fds are closed.
    fn handle(&self, nodeid: u64, fh: u64) -> Result<Arc<Handle>> {
        if self.admission.fds_closed() {
            return Err(Kind::Closed.into());
        }
        self.handles
            .get(nodeid, fh)
            .ok_or_else(|| Kind::UnknownHandle.into())
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

    /// The inode's O_PATH fd from the cache, else an open file's fd (the two locks are taken
    /// one after the other, never nested).
    fn cached_fd(&self, inode: &Inode) -> Option<Arc<OwnedFd>> {
        let cached = self.fd_cache.lock().get(&inode.nodeid).cloned();
        cached.or_else(|| inode.open_fd())
    }

    /// An fd usable as a directory fd / O_PATH fd for `inode`: the root, a cached fd, an open
    /// handle's fd, or a fresh O_PATH open through the inode's location (verified, then cached).
    fn inode_fd(&self, inode: &Arc<Inode>) -> Result<Arc<OwnedFd>> {
        if inode.nodeid == ROOT_ID {
            return self.root_fd();
        }
        if let Some(fd) = self.cached_fd(inode) {
            return Ok(fd);
        }
        let fd = self.by_name(inode, |parent, name| {
            let pfd = self.inode_fd(parent)?;
            let fd = sys::openat(pfd.as_fd(), name, libc::O_PATH | libc::O_NOFOLLOW, 0)
                .map_err(|e| self.lower_err(e))?;
            let st = sys::fstat(fd.as_fd()).map_err(|e| self.lower_err(e))?;
            if InodeKey::of(&st) != inode.key {
                return Err(Kind::Stale.into());
            }
            Ok(fd)
        })?;
        let fd = Arc::new(fd);
        let evicted = {
            let mut cache = self.fd_cache.lock();
            // Checked under the cache lock, which `close_lower_fds` takes after setting it.
            if self.admission.fds_closed() {
                return Err(Kind::Closed.into());
            }
            cache.push(inode.nodeid, Arc::clone(&fd))
        };
        drop(evicted); // closes outside the lock
        Ok(fd)
    }

    /// Runs `f` on the inode's remembered names in turn (most recent first) until one
    /// answers: a name that is gone (`ENOENT`) or now names another inode (`ESTALE`) is
    /// skipped, and forgotten once another name answered (a hard link whose other name was
    /// removed or renamed). The last such error when none answers (`ESTALE` when there is no
    /// name); any other error at once.
    fn by_name<T>(
        &self,
        inode: &Arc<Inode>,
        mut f: impl FnMut(&Arc<Inode>, &CStr) -> Result<T>,
    ) -> Result<T> {
        let names = inode.locations();
        let mut last = Error::from(Kind::Stale);
        for (i, (parent, name)) in names.iter().enumerate() {
            match f(parent, name) {
                Ok(v) => {
                    for (p, n) in &names[..i] {
                        inode.remove_location(p.nodeid, n);
                    }
                    return Ok(v);
                }
                Err(e) if matches!(e.kind, Kind::Stale | Kind::Lower(Errno::ENOENT)) => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Attributes of `inode` without allocating an fd when it has none: `fstatat` through its
    /// location, verified against its key.
    fn stat_inode(&self, inode: &Arc<Inode>) -> Result<Stat> {
        let cached = if inode.nodeid == ROOT_ID {
            Some(self.root_fd()?)
        } else {
            self.cached_fd(inode)
        };
        if let Some(fd) = cached {
            return sys::fstat(fd.as_fd()).map_err(|e| self.lower_err(e));
        }
        self.by_name(inode, |parent, name| {
            let pfd = self.inode_fd(parent)?;
            let st = sys::fstatat(pfd.as_fd(), name).map_err(|e| self.lower_err(e))?;
            if InodeKey::of(&st) != inode.key {
                return Err(Kind::Stale.into());
            }
            Ok(st)
        })
    }

    /// Finds or creates the inode for `st` at `parent/name` and takes one lookup reference.
    fn remember(&self, parent: &Arc<Inode>, name: &CStr, st: &Stat) -> Entry {
        Entry {
            nodeid: self.inodes.remember(parent, name, st),
            st: *st,
        }
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
        if self.inodes.forget(nodeid, nlookup) {
            let evicted = self.fd_cache.lock().pop(&nodeid);
            drop(evicted); // closes outside the lock
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

    /// SETATTR. `mode`, `uid`/`gid`, `size`, `times` (`None` = leave; a timespec of
    /// `UTIME_NOW`/`UTIME_OMIT` as in utimensat(2)). With `kill_privs` (a caller without
    /// CAP_FSETID), a size change clears the set-user-ID/set-group-ID bits [`privs_to_kill`]
    /// names (FUSE_HANDLE_KILLPRIV_V2 semantics).
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
        times: Option<sys::Timestamps>,
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
                sys::fchmod(fd, mode).map_err(le)?;
            } else {
                sys::chmod_fd(fd, mode).map_err(le)?;
            }
        }
        if uid.is_some() || gid.is_some() {
            sys::chown_fd(fd, uid, gid).map_err(le)?;
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
        if let Some(times) = &times {
            let symlink = inode.fmt == libc::S_IFLNK && handle.is_none();
            sys::utimens_fd(fd, times, symlink).map_err(le)?;
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
        let _admitted = self.admit(parent, Some(name))?;
        let parent = self.inode(parent)?;
        let name = cname(name)?;
        let pfd = self.inode_fd(&parent)?;
        {
            let _creds = sys::CallerCreds::switch(caller).map_err(Kind::Credentials)?;
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
        let _admitted = self.admit(parent, Some(name))?;
        let parent = self.inode(parent)?;
        let name = cname(name)?;
        let pfd = self.inode_fd(&parent)?;
        {
            let _creds = sys::CallerCreds::switch(caller).map_err(Kind::Credentials)?;
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
        let _admitted = self.admit(parent, Some(name))?;
        let parent = self.inode(parent)?;
        let name = cname(name)?;
        let target = cname(target.as_os_str())?;
        let pfd = self.inode_fd(&parent)?;
        {
            let _creds = sys::CallerCreds::switch(caller).map_err(Kind::Credentials)?;
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
        sys::unlinkat(pfd.as_fd(), &name, rmdir).map_err(|e| self.lower_err(e))
    }

    fn known_at(&self, dir: &OwnedFd, name: &CStr) -> Option<Arc<Inode>> {
        let st = sys::fstatat(dir.as_fd(), name).ok()?;
        self.inodes.by_key(InodeKey::of(&st))
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
        if let Some(m) = &moved {
            m.remove_location(parent.nodeid, &name);
            m.set_location(&newparent, &newname);
        }
        if let Some(x) = exchanged {
            x.remove_location(newparent.nodeid, &newname);
            x.set_location(&parent, &name);
        }
        Ok(())
    }

    /// LINK: a new name for `nodeid`; the same nodeid is returned (hard links share identity).
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; else the lower's errno.
    pub fn link(&self, nodeid: u64, newparent: u64, newname: &OsStr) -> Result<Entry> {
        let _admitted = self.admit(newparent, Some(newname))?;
        let inode = self.inode(nodeid)?;
        let newparent = self.inode(newparent)?;
        let newname = cname(newname)?;
        let fd = self.inode_fd(&inode)?;
        let npfd = self.inode_fd(&newparent)?;
        sys::link_fd(fd.as_fd(), npfd.as_fd(), &newname).map_err(|e| self.lower_err(e))?;
        self.new_entry(&newparent, &npfd, &newname)
    }

    /// Flags of the lower open for an OPEN with the application's `flags`.
    ///
    /// O_CREAT/O_EXCL were handled by the kernel or CREATE; O_DIRECT applies to the data path
    /// (the kernel's backing file keeps it) and would force aligned buffers on ours.
    ///
    /// O_APPEND is dropped: the kernel resolves append offsets itself. For a FUSE file opened
    /// with O_APPEND, `write(2)` holds the inode lock and sends WRITE at the offset the kernel
    /// computed from its i_size (`generic_write_checks`, cached and direct-io paths alike), and
    /// a passthrough write carries IOCB_APPEND to the backing file. Page writeback of a shared
    /// writable mapping sends WRITE at the page's offset. On Linux, `pwrite` on an O_APPEND fd
    /// ignores its offset and appends, so an O_APPEND lower fd would turn the mapping's writes
    /// into appends. (libfuse's passthrough_hp clears O_APPEND only with the writeback cache.)
    fn lower_open_flags(flags: i32) -> i32 {
        (flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_DIRECT | libc::O_APPEND))
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
        let fh = self.handles.next_fh();
        let mut backing = None;
        {
            let mut files = inode.open.lock();
            let cached_mode = files.opens() > 0 && files.passthrough_opens() == 0;
            let suid_writer_alone =
                unprivileged_suid_writer.is_some() && files.passthrough_opens() == 0;
            let register = register
                .filter(|_| !cached_mode && !suid_writer_alone)
                .filter(|p| !p.only_if_shared || files.backing().is_some())
                .map(|p| p.register);
            if let Some(register) = register {
                if let Some(caller) = &unprivileged_suid_writer {
                    self.kill_privs(fd.as_fd(), caller)?;
                }
                backing = match files.backing() {
                    Some(b) => Some(Arc::clone(b)),
                    None => match register(fd.as_fd()) {
                        Ok(b) => Some(b),
                        Err(e) if files.opens() == 0 => {
                            tracing::debug!(nodeid = inode.nodeid, error = %e, "backing open failed; serving this open without passthrough");
                            None
                        }
                        // A registration happens only for an inode without opens (the
                        // filters above); should that change, an open must not be served
                        // differently from the inode's others: fail it.
                        Err(e) => return Err(Error::from(Kind::Passthrough).with_source(e)),
                    },
                };
            }
            files.add(fh, Arc::clone(&fd), backing.clone());
        }
        let guard = self.acct.handle(Self::mode_of(flags));
        let handle = Handle {
            inode,
            fd,
            kind: HandleKind::File { writable },
            guard,
        };
        self.insert_handle(fh, handle)?;
        Ok(Opened { fh, backing })
    }

    /// OPEN: opens the lower file with the application's flags; with `register`, sets up
    /// kernel passthrough (one backing id per inode, shared by concurrent opens), except for
    /// the cases `Fs::install_handle` lists. `caller` is who opens (its uid stands for
    /// "lacks CAP_FSETID" when non-zero); an O_TRUNC open by such a caller clears the
    /// set-user-ID/set-group-ID bits [`privs_to_kill`] names, as a truncate by it would.
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
        let _admitted = self.admit(nodeid, None)?;
        let inode = self.inode(nodeid)?;
        let lflags = Self::lower_open_flags(flags);
        let fd = self.open_inode(&inode, lflags)?;
        if flags & libc::O_TRUNC != 0 && caller.uid != 0 && inode.fmt == libc::S_IFREG {
            // FUSE_ATOMIC_O_TRUNC: the truncate rides on this open, made with drainfs's
            // CAP_FSETID; the lower would have dropped the privilege bits for this caller.
            self.kill_privs(fd.as_fd(), &caller)?;
        }
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
        if let Some(fd) = self.cached_fd(inode) {
            return sys::reopen(fd.as_fd(), lflags & !libc::O_NOFOLLOW)
                .map_err(|e| self.lower_err(e));
        }
        self.by_name(inode, |parent, name| {
            let pfd = self.inode_fd(parent)?;
            let fd = sys::openat(pfd.as_fd(), name, lflags, 0).map_err(|e| self.lower_err(e))?;
            let st = sys::fstat(fd.as_fd()).map_err(|e| self.lower_err(e))?;
            if InodeKey::of(&st) != inode.key {
                return Err(Kind::Stale.into());
            }
            Ok(fd)
        })
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
        let _admitted = self.admit(parent, Some(name))?;
        let parent = self.inode(parent)?;
        let name = cname(name)?;
        let pfd = self.inode_fd(&parent)?;
        let lflags = (flags & !(libc::O_NOCTTY | libc::O_DIRECT | libc::O_APPEND))
            | libc::O_CREAT
            | libc::O_NOFOLLOW;
        let fd = {
            let _creds = sys::CallerCreds::switch(caller).map_err(Kind::Credentials)?;
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

    /// WRITE (drainfs's own data path). `kill_privs` (FUSE_WRITE_KILL_SUIDGID) clears
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
            // Logged by the adapter with the request's context, as every failed request is.
            self.record_failed_flush(&h.inode, e);
            self.lower_err(e)
        })
    }

    /// Counts a failed lower flush (metric, the summary's list); returns the inode's path.
    fn record_failed_flush(&self, inode: &Inode, e: Errno) -> PathBuf {
        self.acct.lower_flush_errors.fetch_add(1, Relaxed);
        let path = inode.path();
        let mut f = self.failed_flushes.lock();
        if f.len() < 64 {
            f.push(format!("{}: {e}", path.display()));
        }
        drop(f);
        path
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
    /// the inode's backing id is dropped with its last passthrough open. The lower's close
    /// can fail (an upload started by writes through a mapping after the application's
    /// `close()`): for a writable file that is a failed flush ([`Fs::failed_flushes`], the
    /// lower flush error count, a warning with the path); the kernel ignores RELEASE errors,
    /// so this returns `Ok` all the same.
    ///
    /// A writable passthrough handle's lower fd is flushed (`close(dup(fd))`) and then kept
    /// ([`LINGER_CAP`], the newest per inode) instead of closed: a shared mapping made
    /// through it holds the kernel's own backing file, so RELEASE comes at the application's
    /// `close()` while the mapping's writes come later, straight to the lower, which then
    /// sees only its backing file's RELEASE and no FLUSH (gcsfuse and bucketfs would never
    /// upload them). The kept fd's close later (evicted, or at the teardown, [`Fs::close_all`])
    /// is a `close(2)` on the lower inode: the kernel writes the mapping's dirty pages back and
    /// sends the lower a FLUSH, which uploads them; if it fails, the file is a failed flush.
    /// A FLUSH of an unchanged file uploads nothing on gcsfuse v3.11.2 and bucketfs.
    ///
    /// # Errors
    /// `EBADF` for an unknown fh; `EIO` once the lower fds are closed (the handle's fd is
    /// already closed then).
    pub fn release(&self, nodeid: u64, fh: u64) -> Result<()> {
        if self.admission.fds_closed() {
            return Err(Kind::Closed.into());
        }
        let h = self
            .handles
            .remove(nodeid, fh)
            .ok_or(Error::from(Kind::UnknownHandle))?;
        let (passthrough, backing_to_drop) = match h.kind {
            HandleKind::File { .. } => h.inode.open.lock().remove(fh),
            HandleKind::Dir(_) => (false, None),
        };
        drop(backing_to_drop);
        let _call = self.acct.lower_call(LowerCall::Release);
        let writable = h.writable();
        let inode = Arc::clone(&h.inode);
        // Kept before the close, so the close below is a flush (close(dup(fd))).
        let keep = (writable && passthrough).then(|| Arc::clone(&h.fd));
        let closed = h.close();
        if let Some(fd) = keep {
            self.linger(Arc::clone(&inode), fd);
        }
        if let Err(e) = closed {
            if writable {
                // RELEASE answers the kernel `Ok` (it ignores errors), so this is the one log
                // line of the failure.
                let path = self.record_failed_flush(&inode, e);
                tracing::warn!(nodeid, fh, path = %path.display(), error = %e, "the lower's close at RELEASE failed: a failed flush");
            } else {
                tracing::debug!(path = %inode.path().display(), error = %e, "the lower's close of a read-only handle failed");
            }
            if Error::lower(e).is_lower_disconnect() {
                self.admission.set_lower_gone();
            }
        }
        Ok(())
    }

    /// Keeps `fd` of `inode` in the lingering set; closes what that pushes out (the same
    /// inode's older fd, or the least recently released one).
    fn linger(&self, inode: Arc<Inode>, fd: Arc<OwnedFd>) {
        let nodeid = inode.nodeid;
        let out = {
            let mut l = self.lingering.lock();
            // Checked under the lock, which `close_lower_fds` takes after setting it.
            if self.admission.fds_closed() {
                Some((nodeid, (inode, fd)))
            } else {
                l.push(nodeid, (inode, fd))
            }
        };
        if let Some((_, (inode, fd))) = out
            && let Err(e) = self.close_lingering(&inode, fd)
        {
            tracing::warn!(nodeid = inode.nodeid, path = %inode.path().display(), error = %e, "the lower's close of a released passthrough writer failed: a failed flush");
        }
    }

    /// Closes a lingering lower fd: the lower's FLUSH (counted as a lower flush), recorded as
    /// a failed flush when it fails.
    fn close_lingering(&self, inode: &Inode, fd: Arc<OwnedFd>) -> std::result::Result<(), Errno> {
        let _call = self.acct.lower_call(LowerCall::Flush);
        let r = match Arc::try_unwrap(fd) {
            Ok(fd) => sys::close(fd),
            Err(fd) => sys::flush(fd.as_fd()),
        };
        if let Err(e) = r {
            self.record_failed_flush(inode, e);
            if Error::lower(e).is_lower_disconnect() {
                self.admission.set_lower_gone();
            }
        }
        r
    }

    /// Number of lingering lower fds of released passthrough writers.
    pub fn lingering(&self) -> usize {
        self.lingering.lock().len()
    }

    /// OPENDIR.
    ///
    /// # Errors
    /// The lower's errno (`ENOTDIR`...).
    pub fn opendir(&self, nodeid: u64) -> Result<u64> {
        self.admission.check_alive()?;
        let inode = self.inode(nodeid)?;
        let pfd = self.inode_fd(&inode)?;
        let fd = sys::openat(pfd.as_fd(), c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)
            .map_err(|e| self.lower_err(e))?;
        let fh = self.handles.next_fh();
        let handle = Handle {
            inode,
            fd: Arc::new(fd),
            kind: HandleKind::Dir(Mutex::new(DirStream::new())),
            guard: self.acct.handle(HandleMode::Dir),
        };
        self.insert_handle(fh, handle)?;
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

    /// The nodeid a READDIR entry for lower inode `ino` on device `dev` should carry as
    /// `d_ino`, so that it equals the `st_ino` a later stat reports: the inode's nodeid if
    /// known, else a nodeid reserved now (in a bounded map; LOOKUP takes the reservation).
    /// Reporting the lower's own inode number instead would disagree with `st_ino` and could
    /// collide with another file's nodeid (gcsfuse's inode numbers are a counter, as nodeids
    /// are).
    pub fn dirent_nodeid(&self, dev: u64, ino: u64) -> u64 {
        self.inodes.dirent_nodeid(InodeKey { dev, ino })
    }

    /// The lower's `st_dev` of the root (directory entries are on it unless they are mounts).
    pub fn root_dev(&self) -> u64 {
        self.inodes.root().key.dev
    }

    /// STATFS of the lower.
    ///
    /// # Errors
    /// The lower's errno.
    pub fn statfs(&self) -> Result<sys::StatVfs> {
        self.admission.check_alive()?;
        sys::fstatvfs(self.root_fd()?.as_fd()).map_err(|e| self.lower_err(e))
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
        sys::access_fd(fd.as_fd(), mask).map_err(|e| self.lower_err(e))
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

    /// FALLOCATE on the handle's lower fd. `kill_privs` (a caller without CAP_FSETID)
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

    /// COPY_FILE_RANGE between two handles' lower fds. `kill_privs` (a caller without
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
        self.handles
            .some(cap)
            .iter()
            .map(|h| (shown(&h.inode.path()), h.mode()))
            .collect()
    }

    /// Closes every remaining handle's lower fd and every lingering one of a released
    /// passthrough writer (teardown after unmount, or at the deadline); the close is the
    /// lower's flush, so the lower uploads what it can. Returns the paths of writable handles
    /// whose close failed (also counted as lower flush errors).
    pub fn close_all(&self) -> Vec<String> {
        let handles = self.handles.drain();
        let mut failed = Vec::new();
        let lingering: Vec<_> = {
            let mut l = self.lingering.lock();
            std::iter::from_fn(|| l.pop_lru()).collect()
        };
        for (_, (inode, fd)) in lingering {
            if let Err(e) = self.close_lingering(&inode, fd) {
                failed.push(format!("{}: {e}", inode.path().display()));
            }
        }
        for h in handles {
            let unlisted = h.inode.open.lock().clear();
            drop(unlisted);
            let writable = h.writable();
            let inode = Arc::clone(&h.inode);
            let _call = self.acct.lower_call(if writable {
                LowerCall::Flush
            } else {
                LowerCall::Release
            });
            if let Err(e) = h.close()
                && writable
            {
                self.acct.lower_flush_errors.fetch_add(1, Relaxed);
                failed.push(format!("{}: {e}", inode.path().display()));
            }
        }
        self.fd_cache.lock().clear();
        failed
    }
}

impl Fs {
    /// Closes every lower fd drainfs holds, even while the core is still referenced (a FUSE
    /// session that cannot end because the mount was detached lazily and is still in use):
    /// each open handle's fd (its close is the lower's flush, as in [`Fs::close_all`]), the
    /// O_PATH cache and the root's fd. The lower can then unmount. From then on every
    /// operation fails with `EIO` ([`Kind::Closed`]); fds are only ever reached through
    /// `Arc`s taken from the tables, so no closed fd number is used again (a request that
    /// holds one finishes with it, and the fd closes when it lets go). Idempotent. Returns the
    /// paths of writable handles whose close failed.
    pub fn close_lower_fds(&self) -> Vec<String> {
        self.admission.close_fds();
        let failed = self.close_all();
        let cached: Vec<_> = {
            let mut cache = self.fd_cache.lock();
            std::iter::from_fn(|| cache.pop_lru()).collect()
        };
        drop(cached);
        for inode in self.inodes.all() {
            let unlisted = inode.open.lock().clear();
            drop(unlisted);
        }
        drop(self.root_fd.write().take());
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

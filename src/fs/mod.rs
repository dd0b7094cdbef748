//! The filesystem core: a passthrough of a lower directory, free of fuser so it can be
//! unit-tested on a temp dir without mounting.
//!
//! Identity follows virtiofsd and fuse-backend-rs: an inode is keyed by the lower's
//! `(st_dev, st_ino)`, so hard links share one nodeid; nodeids are never reused; the root is
//! pinned. A key is never assumed to stay with a name: after a RENAME the new name is checked
//! on the lower (`namespace`). Where the lower kept the key (POSIX lowers) the inode keeps its
//! nodeid and open files keep working; where the lower made a new inode under the new name
//! (gcsfuse renames by copying objects and deleting the old ones, so the file, or a directory
//! and everything under it, is a new gcsfuse inode), the moved inode is detached from the name,
//! its cached fds (and its descendants') are dropped, and the kernel is told to forget the
//! entry (`FUSE_NOTIFY_INVAL_ENTRY`, [`Renamed`]), so the next access looks the name up and
//! gets the lower's inode. What a rename replaces loses its cached fds before the lower's
//! rename (gcsfuse mishandles a replaced directory that is still referenced). A name whose key
//! changed without drainfs (an object overwritten in
//! the bucket, a name deleted and made again) is verified against the key whenever it is used
//! without an fd (a mismatch is `ESTALE`) and gives a new nodeid at the kernel's next LOOKUP
//! (after `--ttl`). Unlike virtiofsd, an inode does not hold an O_PATH fd for
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
//! This file holds [`Fs`] itself (its tables and the lookups every operation starts with) and
//! the shapes of its answers. The rest, one responsibility a file:
//! - the tables: `inodes` (the inode store: nodeid and `(st_dev, st_ino)` maps, lookup counts,
//!   remembered names), `handles` (the handle table: fh -> handle, checked against its
//!   inode), `open_files` (each inode's open files and its shared backing id);
//! - the gate: `admission` ([`Admission`] and the admitted opens still in flight);
//! - the operations: `lookup` (LOOKUP, FORGET, reaching an inode's O_PATH fd through the fd
//!   cache or its names), `attr` (GETATTR, SETATTR, READLINK, ACCESS, STATFS, privilege-bit
//!   clearing), `namespace` (MKNOD, MKDIR, SYMLINK, UNLINK, RMDIR, RENAME and what it leaves
//!   stale, LINK), `open`
//!   (OPEN, CREATE and the passthrough choice), `io` (READ, WRITE, FLUSH, FSYNC, FALLOCATE,
//!   LSEEK, COPY_FILE_RANGE), `release` (RELEASE and the lingering fds of released
//!   passthrough writers), `dir` (OPENDIR, READDIR), `xattr` (the four xattr requests);
//! - the end: `teardown` ([`Fs::close_all`], [`Fs::close_lower_fds`]);
//! - [`sys`]: the syscalls.
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

mod admission;
mod attr;
mod dir;
mod handles;
mod inodes;
mod io;
mod lookup;
mod namespace;
mod open;
mod open_files;
mod release;
pub mod sys;
mod teardown;
mod xattr;

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use nix::errno::Errno;
use parking_lot::{Mutex, RwLock};

use crate::accounting::{Accounting, HandleMode};
use crate::error::{Error, Kind, Result};
pub use admission::Admission;
pub use attr::privs_to_kill;
use handles::{Handle, HandleTable};
pub use inodes::ROOT_ID;
use inodes::{Inode, InodeStore};
pub use open_files::Backing;
pub use release::LINGER_CAP;
use release::Lingering;
pub use sys::Caller;
use sys::Stat;
pub use xattr::XattrReply;

/// A path relative to the mount as shown in `/status` and the summary: the root is `.`.
fn shown(p: &Path) -> String {
    if p.as_os_str().is_empty() {
        ".".to_string()
    } else {
        p.display().to_string()
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

/// The answer to RENAME: what the kernel must no longer trust.
#[derive(Debug, Default)]
pub struct Renamed {
    /// `(parent nodeid, name)` of each entry the kernel moved to a nodeid that no longer
    /// stands for the lower's inode under that name (the lower gave the name a new identity);
    /// the adapter invalidates them (`FUSE_NOTIFY_INVAL_ENTRY`) so that the next access looks
    /// the name up again. Empty when the lower kept every identity.
    pub stale: Vec<(u64, OsString)>,
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

/// `name` as a C string for the lower's `*at` calls.
///
/// # Errors
/// `EINVAL` ([`Kind::BadName`]) for a name with a NUL byte.
fn cname(name: &OsStr) -> Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| Kind::BadName.into())
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

    /// The inode `nodeid`.
    ///
    /// # Errors
    /// `ESTALE` for a nodeid the kernel no longer holds.
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

    /// Paths of the handles still open (capped), for `/status` and the shutdown summary.
    pub fn open_paths(&self, cap: usize) -> Vec<(String, HandleMode)> {
        self.handles
            .some(cap)
            .iter()
            .map(|h| (shown(&h.inode.path()), h.mode()))
            .collect()
    }
}

#[cfg(test)]
mod tests;

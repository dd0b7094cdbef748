//! The handle table: fh -> [`Handle`] (an open file or directory stream and its lower fd).
//! Each inode's own list of its open files is [`super::open_files::OpenFiles`].
//!
//! As in mountpoint-s3, the table's lock is held only long enough to clone or remove an
//! `Arc`, never across a syscall; fhs come from an `AtomicU64` and are never reused. As in
//! fuse-backend-rs, a handle is looked up with the inode it is used with, and one of another
//! inode is refused.
//!
//! Lock order (see also [`crate::fs`]): the table's lock is a leaf (nothing else is locked
//! while it is held); `OpenFiles` (under `Inode::open`) is taken after it has been released;
//! a directory stream's lock is a leaf held across `getdents64`.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use nix::errno::Errno;
use parking_lot::{Mutex, RwLock};

use super::inodes::Inode;
use super::sys;
use crate::accounting::{HandleGuard, HandleMode};

/// What kind of handle.
pub(super) enum HandleKind {
    /// A regular file (or anything opened with OPEN).
    File {
        /// Opened for writing.
        writable: bool,
        /// The lower fd is O_DIRECT: an open with O_DIRECT served by drainfs
        /// (`Fs::install_handle`); cleared when the lower refuses a direct I/O of it
        /// (`Fs::direct_io`).
        direct: AtomicBool,
    },
    /// A directory stream.
    Dir(Mutex<DirStream>),
}

/// The state of a directory stream between READDIR calls: `buf[pos..len]` holds the records
/// read by `getdents64` and not yet returned.
pub(super) struct DirStream {
    pub(super) buf: Vec<u8>,
    pub(super) pos: usize,
    pub(super) len: usize,
    /// The offset the next READDIR is expected at (the cookie of the last entry returned).
    pub(super) next_off: i64,
}

impl DirStream {
    /// An empty stream at offset 0 with a 32 KiB buffer.
    pub(super) fn new() -> Self {
        DirStream {
            buf: vec![0; 32 * 1024],
            pos: 0,
            len: 0,
            next_off: 0,
        }
    }
}

/// An open file or directory: the lower fd opened with the application's flags.
pub(super) struct Handle {
    /// The inode it belongs to.
    pub(super) inode: Arc<Inode>,
    /// The lower fd. Closing it (dropping the last reference) is the lower RELEASE.
    pub(super) fd: Arc<OwnedFd>,
    /// File or directory.
    pub(super) kind: HandleKind,
    /// Counts the handle as open until it is dropped.
    pub(super) guard: HandleGuard,
}

impl Handle {
    /// Read-only, write or directory.
    pub(super) fn mode(&self) -> HandleMode {
        self.guard.mode()
    }

    /// A file opened for writing.
    pub(super) fn writable(&self) -> bool {
        matches!(self.kind, HandleKind::File { writable: true, .. })
    }

    /// The flag telling whether the lower fd is O_DIRECT (`None` for a directory).
    pub(super) fn direct(&self) -> Option<&AtomicBool> {
        match &self.kind {
            HandleKind::File { direct, .. } => Some(direct),
            HandleKind::Dir(_) => None,
        }
    }

    /// Closes the lower fd of a handle that is no longer in the table and returns the
    /// lower's answer: an explicit `close` when this was the last reference to the fd, else
    /// `close(dup(fd))` (a request still holding the handle closes the fd when it finishes).
    /// The handle's accounting guard is dropped after the close, so the handle counts as open
    /// until the lower has answered.
    pub(super) fn close(self: Arc<Self>) -> Result<(), Errno> {
        match Arc::try_unwrap(self) {
            Ok(Handle { fd, guard, .. }) => {
                let r = match Arc::try_unwrap(fd) {
                    Ok(fd) => sys::close(fd),
                    Err(fd) => sys::flush(fd.as_fd()),
                };
                drop(guard);
                r
            }
            Err(h) => sys::flush(h.fd.as_fd()),
        }
    }
}

/// The handle table. Its lock is a leaf, held only to clone, insert or remove an `Arc`.
pub(super) struct HandleTable {
    map: RwLock<HashMap<u64, Arc<Handle>>>,
    next_fh: AtomicU64,
}

impl HandleTable {
    pub(super) fn new() -> Self {
        HandleTable {
            map: RwLock::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }
    }

    /// A new fh, never handed out before.
    pub(super) fn next_fh(&self) -> u64 {
        self.next_fh.fetch_add(1, Relaxed)
    }

    /// Inserts `handle` as `fh` unless `refuse()`, checked under the table's lock, says no;
    /// then the handle is given back.
    pub(super) fn insert_unless(
        &self,
        fh: u64,
        handle: Handle,
        refuse: impl FnOnce() -> bool,
    ) -> Result<(), Handle> {
        let mut map = self.map.write();
        if refuse() {
            return Err(handle);
        }
        map.insert(fh, Arc::new(handle));
        Ok(())
    }

    /// The handle `fh`, if it belongs to `nodeid`.
    pub(super) fn get(&self, nodeid: u64, fh: u64) -> Option<Arc<Handle>> {
        self.map
            .read()
            .get(&fh)
            .filter(|h| h.inode.nodeid == nodeid)
            .cloned()
    }

    /// Removes and returns the handle `fh`, if it belongs to `nodeid`.
    pub(super) fn remove(&self, nodeid: u64, fh: u64) -> Option<Arc<Handle>> {
        let mut map = self.map.write();
        match map.get(&fh) {
            Some(h) if h.inode.nodeid == nodeid => map.remove(&fh),
            _ => None,
        }
    }

    /// At most `cap` of the open handles.
    pub(super) fn some(&self, cap: usize) -> Vec<Arc<Handle>> {
        self.map.read().values().take(cap).cloned().collect()
    }

    /// Removes and returns every handle.
    pub(super) fn drain(&self) -> Vec<Arc<Handle>> {
        self.map.write().drain().map(|(_, h)| h).collect()
    }
}

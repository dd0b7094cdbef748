//! Each inode's open files ([`OpenFiles`]): the lower fds of its open handles and the backing
//! id its passthrough opens share (one per inode, as the kernel requires, created at the first
//! passthrough open and dropped with the last, as libfuse's passthrough_hp does).
//!
//! It sits below both the inode store (an [`super::inodes::Inode`] holds its `OpenFiles`
//! under `Inode::open`) and the handle table (a handle refers to its inode): the handle table
//! imports the inode store, never the reverse.
//!
//! Lock order (see also [`crate::fs`]): `Inode::open` is held across the backing-id
//! registration of an open and never while holding another lock.

use std::any::Any;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// A backing id registered with the kernel for passthrough (fuser's `BackingId`, type-erased
/// so the core stays fuser-free). Dropping the last reference closes it.
pub type Backing = Arc<dyn Any + Send + Sync>;

/// One open file of an inode, as [`OpenFiles`] lists it.
struct OpenFile {
    fh: u64,
    fd: Arc<OwnedFd>,
    passthrough: bool,
}

/// The open files of one inode (regular files opened with OPEN or CREATE; directory streams
/// are not listed). Every count is derived from the list.
#[derive(Default)]
pub(super) struct OpenFiles {
    /// Open handles of this inode; their lower fds serve operations that arrive without a fh
    /// while the file may be unlinked (fstat sends GETATTR without fh).
    files: Vec<OpenFile>,
    /// The backing id shared by every passthrough open of this inode (one per inode, as the
    /// kernel requires); `Some` exactly while a passthrough open is listed (or until
    /// [`OpenFiles::clear`]).
    backing: Option<Backing>,
}

impl OpenFiles {
    /// Number of open files.
    pub(super) fn opens(&self) -> usize {
        self.files.len()
    }

    /// Number of open files that use kernel passthrough.
    pub(super) fn passthrough_opens(&self) -> usize {
        self.files.iter().filter(|f| f.passthrough).count()
    }

    /// The backing id of the inode's passthrough opens, if any.
    pub(super) fn backing(&self) -> Option<&Backing> {
        self.backing.as_ref()
    }

    /// The lower fd of one open file.
    pub(super) fn any_fd(&self) -> Option<Arc<OwnedFd>> {
        self.files.first().map(|f| Arc::clone(&f.fd))
    }

    /// Lists an open file; `backing` is the inode's backing id for a passthrough open (the
    /// one already shared, or a new one).
    pub(super) fn add(&mut self, fh: u64, fd: Arc<OwnedFd>, backing: Option<Backing>) {
        let passthrough = backing.is_some();
        if let Some(b) = backing {
            self.backing.get_or_insert(b);
        }
        self.files.push(OpenFile {
            fh,
            fd,
            passthrough,
        });
    }

    /// Unlists `fh`; returns whether it was a passthrough open, and the backing id when that
    /// was the last passthrough open (the caller drops it outside the lock).
    pub(super) fn remove(&mut self, fh: u64) -> (bool, Option<Backing>) {
        let passthrough = self.files.iter().any(|f| f.fh == fh && f.passthrough);
        self.files.retain(|f| f.fh != fh);
        let backing = if self.passthrough_opens() == 0 {
            self.backing.take()
        } else {
            None
        };
        (passthrough, backing)
    }

    /// Unlists everything (teardown); returns what the caller drops outside the lock.
    pub(super) fn clear(&mut self) -> (Vec<Arc<OwnedFd>>, Option<Backing>) {
        let fds = self.files.drain(..).map(|f| f.fd).collect();
        (fds, self.backing.take())
    }
}

//! Reaching inodes on the lower: LOOKUP and FORGET, the O_PATH fd of an inode (the root's,
//! the bounded cache's, an open handle's, or a fresh one opened through the names the inode
//! was last seen under and verified against its `(st_dev, st_ino)` key), and attributes
//! without an fd.

use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use nix::errno::Errno;

use super::inodes::{Inode, InodeKey};
use super::sys::{self, Stat};
use super::{Entry, Fs, ROOT_ID, cname};
use crate::error::{Error, Kind, Result};

impl Fs {
    /// The inode's O_PATH fd from the cache, else an open file's fd (the two locks are taken
    /// one after the other, never nested). None for a detached inode ([`Inode::detach`]):
    /// those fds reach the lower inode its names no longer do.
    pub(super) fn cached_fd(&self, inode: &Inode) -> Option<Arc<OwnedFd>> {
        if inode.is_detached() {
            return None;
        }
        let cached = self.fd_cache.lock().get(&inode.nodeid).cloned();
        cached.or_else(|| inode.open_fd())
    }

    /// An fd usable as a directory fd / O_PATH fd for `inode`: the root, a cached fd, an open
    /// handle's fd, or a fresh O_PATH open through the inode's location (verified, then cached).
    pub(super) fn inode_fd(&self, inode: &Arc<Inode>) -> Result<Arc<OwnedFd>> {
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
    pub(super) fn by_name<T>(
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
    pub(super) fn stat_inode(&self, inode: &Arc<Inode>) -> Result<Stat> {
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
    pub(super) fn remember(&self, parent: &Arc<Inode>, name: &CStr, st: &Stat) -> Entry {
        Entry {
            nodeid: self.inodes.remember(parent, name, st),
            st: *st,
        }
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
}

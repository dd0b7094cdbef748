//! Namespace changes: MKNOD, MKDIR, SYMLINK (made with the caller's credentials), UNLINK and
//! RMDIR, RENAME and LINK (hard links share one nodeid). Each is refused with `ESHUTDOWN` once
//! the door is closed.
//!
//! A RENAME keeps a moved inode's nodeid only when the lower keeps its `(st_dev, st_ino)`
//! (POSIX lowers). On gcsfuse a rename is a copy and a delete of objects: the new name is a
//! new lower inode, and under a renamed directory every name is. Then the moved inode loses the
//! name and is detached with everything under it (requests by its nodeid fail with `ESTALE`;
//! its open handles keep what they opened), and the rename's answer names the new name for
//! the kernel to drop ([`Renamed::stale`]): the next LOOKUP finds the lower's inode. The
//! moved inode is the one the lower's key under the old name gives and, unless drainfs knows
//! that one under the old name, every inode drainfs knows under it: the kernel moves the
//! nodeid drainfs last answered for the name, whose lower inode gcsfuse may have replaced
//! since (a new generation of the object), and that nodeid must not keep reaching the lower
//! by the name it lost (an open through the moved entry, before the kernel drops it, got
//! `ENOENT` instead of `ESTALE`).
//! Before a rename replaces an existing name, drainfs closes its own fds of the replaced
//! inode, so the lower sees no more references to it than it would without drainfs.

use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use super::inodes::{Inode, InodeKey};
use super::sys::{self, Caller};
use super::{Entry, Fs, Renamed, cname};
use crate::error::{Kind, Result};

/// What a rename moves from one name ([`Fs::moved_at`]): the inode of the lower's key under
/// the name, if known, and the other inodes known under the name.
type Moved = (Option<Arc<Inode>>, Vec<Arc<Inode>>);

impl Fs {
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

    /// What a rename of `parent/name` moves: the inode of the lower's key under the name
    /// ([`Fs::known_at`]) and, unless that inode is known under this name, every inode that
    /// is. The kernel's entry for the name holds the nodeid drainfs last answered for it,
    /// whose lower inode the lower may since have replaced without drainfs (gcsfuse mints a new
    /// inode for an object's newer generation, as after a CREATE, its writes and FLUSHes), and
    /// the kernel moves that nodeid to the new name all the same.
    fn moved_at(&self, parent: &Arc<Inode>, dir: &OwnedFd, name: &CStr) -> Moved {
        let by_key = self.known_at(dir, name);
        if by_key
            .as_ref()
            .is_some_and(|i| i.remembers(parent.nodeid, name))
        {
            return (by_key, Vec::new());
        }
        (by_key, self.inodes.known_under(parent.nodeid, name))
    }

    /// RENAME with renameat2 flags (RENAME_NOREPLACE, RENAME_EXCHANGE). Afterwards each
    /// moved inode is checked against what the lower now has under its new name
    /// (`Fs::settle_moved`): where the lower kept its `(st_dev, st_ino)` (POSIX lowers) it
    /// keeps its nodeid and learns the new name; where the lower made a new inode (gcsfuse
    /// copies and deletes objects) it is detached, and the new name is in
    /// [`Renamed::stale`] for the kernel to look up again.
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
    ) -> Result<Renamed> {
        self.admission.check_admit()?;
        let parent = self.inode(parent)?;
        let newparent = self.inode(newparent)?;
        let name = cname(name)?;
        let newname = cname(newname)?;
        let pfd = self.inode_fd(&parent)?;
        let npfd = self.inode_fd(&newparent)?;
        let (moved, also_moved) = self.moved_at(&parent, &pfd, &name);
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let (target, also_target) = if exchange {
            self.moved_at(&newparent, &npfd, &newname)
        } else {
            (self.known_at(&npfd, &newname), Vec::new())
        };
        if !exchange && let Some(replaced) = &target {
            // drainfs holds no reference to what the rename replaces, as an application on
            // the lower alone would not: gcsfuse v3.11.2 shows a directory renamed onto an
            // empty one as empty, for good, when the replaced directory's inode is still
            // referenced at the next lookup of the name.
            self.drop_fds(replaced);
        }
        sys::renameat2(pfd.as_fd(), &name, npfd.as_fd(), &newname, flags)
            .map_err(|e| self.lower_err(e))?;
        #[cfg(test)]
        super::tests::hook(super::tests::Point::AfterLowerRename);
        let mut stale = Vec::new();
        let to = (&newparent, &*npfd, newname.as_c_str());
        if !self.settle_all(moved.as_ref(), &also_moved, (&parent, &name), to) {
            stale.push((
                newparent.nodeid,
                OsStr::from_bytes(newname.as_bytes()).into(),
            ));
        }
        if exchange {
            let to = (&parent, &*pfd, name.as_c_str());
            if !self.settle_all(target.as_ref(), &also_target, (&newparent, &newname), to) {
                stale.push((parent.nodeid, OsStr::from_bytes(name.as_bytes()).into()));
            }
        } else if let Some(replaced) = target
            && moved.as_ref().is_none_or(|m| m.nodeid != replaced.nodeid)
        {
            replaced.remove_location(newparent.nodeid, &newname);
            if replaced.locations().is_empty() {
                // Its last known name is gone; its lower inode number may be reused.
                self.inodes.unkey(&[replaced.nodeid]);
            }
        }
        Ok(Renamed { stale })
    }

    /// [`Fs::settle_moved`] for each inode a rename moved ([`Fs::moved_at`]): `moved`, the
    /// inode of the lower's key, and `also`, the others known under the old name (the lower's
    /// key under the new name is not theirs: they are detached). True when there was one and
    /// the lower kept every identity.
    fn settle_all(
        &self,
        moved: Option<&Arc<Inode>>,
        also: &[Arc<Inode>],
        from: (&Arc<Inode>, &CStr),
        to: (&Arc<Inode>, &OwnedFd, &CStr),
    ) -> bool {
        let mut kept = self.settle_moved(moved, from, to);
        for inode in also {
            kept &= self.settle_moved(Some(inode), from, to);
        }
        kept
    }

    /// After a rename moved `inode` (the inode drainfs knew under `from`, if any) to `to`:
    /// returns true when the lower kept its identity (`fstatat` of the new name gives its
    /// key), and the inode then learns the new name. Otherwise (gcsfuse: a rename is a copy
    /// and a delete, and the new name is a new lower inode; or nothing was known under the old
    /// name) returns false after taking the name from the inode, detaching it and every inode
    /// known under it ([`Inode::detach`]: only their open handles still reach the lower inodes
    /// they opened) and dropping their cached fds: the kernel's entry for the new name, which
    /// the kernel moved along with the old one, points at a nodeid that no longer stands for
    /// what the lower has there.
    fn settle_moved(
        &self,
        inode: Option<&Arc<Inode>>,
        from: (&Arc<Inode>, &CStr),
        to: (&Arc<Inode>, &OwnedFd, &CStr),
    ) -> bool {
        let Some(inode) = inode else {
            return false;
        };
        let (to_parent, to_fd, to_name) = to;
        inode.remove_location(from.0.nodeid, from.1);
        let now = sys::fstatat(to_fd.as_fd(), to_name).ok();
        if now.is_some_and(|st| InodeKey::of(&st) == inode.key) {
            inode.set_location(to_parent, to_name);
            return true;
        }
        tracing::debug!(nodeid = inode.nodeid, name = ?to_name, "the lower gave the renamed name a new identity; dropping the old one's binding");
        inode.remove_location(to_parent.nodeid, to_name);
        // Detached before their cached fds are dropped: from then on no request by nodeid
        // uses a cached fd of theirs (one cached meanwhile included) or an open file's fd.
        let gone = self.under(inode);
        for id in &gone {
            if let Some(i) = self.inodes.get(*id) {
                i.detach();
            }
        }
        self.drop_cached_fds(&gone);
        self.inodes.unkey(&gone);
        false
    }

    /// Drops the cached O_PATH fds of `inode` and, for a directory, of every inode known
    /// under it (before a rename replaces `inode`, they would keep it referenced).
    fn drop_fds(&self, inode: &Arc<Inode>) {
        self.drop_cached_fds(&self.under(inode));
    }

    /// `inode`'s nodeid and, for a directory, those of every inode known under it (through
    /// the names each was last seen under).
    fn under(&self, inode: &Arc<Inode>) -> Vec<u64> {
        let mut all = vec![inode.nodeid];
        if inode.fmt == libc::S_IFDIR {
            all.extend(
                self.inodes
                    .all()
                    .iter()
                    .filter(|i| i.has_ancestor(inode.nodeid))
                    .map(|i| i.nodeid),
            );
        }
        all
    }

    /// Closes the cached O_PATH fds of `nodeids` (outside the cache's lock).
    fn drop_cached_fds(&self, nodeids: &[u64]) {
        let evicted: Vec<_> = {
            let mut cache = self.fd_cache.lock();
            nodeids.iter().filter_map(|id| cache.pop(id)).collect()
        };
        drop(evicted);
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
}

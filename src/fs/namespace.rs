//! Namespace changes: MKNOD, MKDIR, SYMLINK (made with the caller's credentials), UNLINK and
//! RMDIR, RENAME (the moved inodes keep their nodeids and learn their new names) and LINK
//! (hard links share one nodeid). Each is refused with `ESHUTDOWN` once the door is closed.

use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

use super::inodes::{Inode, InodeKey};
use super::sys::{self, Caller};
use super::{Entry, Fs, cname};
use crate::error::{Kind, Result};

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
}

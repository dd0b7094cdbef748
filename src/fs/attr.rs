//! Attributes of an inode: GETATTR, SETATTR, READLINK, ACCESS, STATFS, and the clearing of
//! set-user-ID/set-group-ID bits a write by an unprivileged caller implies
//! ([`privs_to_kill`], FUSE_HANDLE_KILLPRIV_V2).

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use super::Fs;
use super::handles::HandleKind;
use super::sys::{self, Caller, Stat};
use crate::error::Result;

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
    /// Clears the bits [`privs_to_kill`] names for `caller` on the file behind `fd` (any fd,
    /// O_PATH too), as the lower would for that unprivileged writer.
    pub(super) fn kill_privs(&self, fd: BorrowedFd<'_>, caller: &Caller) -> Result<()> {
        let st = sys::fstat(fd).map_err(|e| self.lower_err(e))?;
        let kill = privs_to_kill(st.st_mode, st.st_gid, caller);
        if kill != 0 {
            sys::chmod_fd(fd, st.st_mode & 0o7777 & !kill).map_err(|e| self.lower_err(e))?;
        }
        Ok(())
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

    /// STATFS of the lower.
    ///
    /// # Errors
    /// The lower's errno.
    pub fn statfs(&self) -> Result<sys::StatVfs> {
        self.admission.check_alive()?;
        sys::fstatvfs(self.root_fd()?.as_fd()).map_err(|e| self.lower_err(e))
    }
}

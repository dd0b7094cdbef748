//! Extended attributes: GETXATTR, LISTXATTR, SETXATTR and REMOVEXATTR on the inode's O_PATH
//! fd; the two changes are refused with `ESHUTDOWN` once the door is closed.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use super::sys;
use super::{Fs, cname};
use crate::error::Result;

/// A GETXATTR / LISTXATTR answer.
#[derive(Debug)]
pub enum XattrReply {
    /// The size asked for with `size == 0`.
    Size(u32),
    /// The bytes.
    Data(Vec<u8>),
}

impl Fs {
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
}

//! Directories: OPENDIR, READDIR/READDIRPLUS over a directory stream kept between calls
//! (`getdents64` into the handle's buffer), the lookup READDIRPLUS makes for each entry, and
//! the nodeid a directory entry carries as `d_ino`.

use std::ffi::CString;
use std::os::fd::AsFd;
use std::sync::Arc;

use nix::errno::Errno;
use parking_lot::Mutex;

use super::handles::{DirStream, Handle, HandleKind};
use super::inodes::InodeKey;
use super::sys;
use super::{Entry, Fs};
use crate::accounting::HandleMode;
use crate::error::{Error, Kind, Result};

impl Fs {
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
}

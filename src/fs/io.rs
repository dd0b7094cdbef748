//! Drainfs's own data path on an open handle's lower fd: READ, WRITE, FALLOCATE, LSEEK,
//! COPY_FILE_RANGE, and the two requests that make the lower upload or persist: FLUSH
//! (`close(dup(fd))`, the failure recorded for the shutdown summary) and FSYNC.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

use nix::errno::Errno;

use super::Fs;
use super::inodes::Inode;
use super::sys::{self, Caller};
use crate::accounting::LowerCall;
use crate::error::Result;

impl Fs {
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
    pub(super) fn record_failed_flush(&self, inode: &Inode, e: Errno) -> PathBuf {
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
}

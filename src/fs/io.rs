//! Drainfs's own data path on an open handle's lower fd: READ, WRITE, FALLOCATE, LSEEK,
//! COPY_FILE_RANGE, and the two requests that make the lower upload or persist: FLUSH
//! (`close(dup(fd))`, the failure recorded for the shutdown summary) and FSYNC.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

use nix::errno::Errno;

use super::Fs;
use super::handles::Handle;
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
        let n = self
            .direct_io(&h, |direct| {
                if direct {
                    sys::pread_direct(h.fd.as_fd(), buf, offset)
                } else {
                    sys::pread(h.fd.as_fd(), buf, offset)
                }
            })
            .map_err(|e| self.lower_err(e))?;
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
        let n = self
            .direct_io(&h, |direct| {
                if direct {
                    sys::pwrite_all_direct(h.fd.as_fd(), data, offset)
                } else {
                    sys::pwrite_all(h.fd.as_fd(), data, offset)
                }
            })
            .map_err(|e| self.lower_err(e))?;
        self.acct.bytes_written.fetch_add(n as u64, Relaxed);
        Ok(n)
    }

    /// Runs the I/O `op` on `h`'s lower fd, telling it whether the fd is O_DIRECT (then its
    /// buffer must be aligned: `sys::pread_direct`, `sys::pwrite_all_direct`). When the lower
    /// refuses a direct I/O (`EINVAL`: an offset or length its direct I/O cannot take, which
    /// the application's O_DIRECT on a FUSE file does not promise; e.g. the kernel writing back
    /// a page of a shared mapping up to the end of the file), O_DIRECT is cleared on the fd
    /// for good ([`Fs::drop_direct`]) and `op` runs again, buffered.
    fn direct_io<T>(
        &self,
        h: &Handle,
        mut op: impl FnMut(bool) -> std::result::Result<T, Errno>,
    ) -> std::result::Result<T, Errno> {
        if !Self::is_direct(h) {
            return op(false);
        }
        match op(true) {
            Err(Errno::EINVAL) if self.drop_direct(h) => op(false),
            r => r,
        }
    }

    /// Whether `h`'s lower fd is O_DIRECT.
    fn is_direct(h: &Handle) -> bool {
        h.direct().is_some_and(|d| d.load(Relaxed))
    }

    /// Clears O_DIRECT on `h`'s lower fd (a file's; one that had it); returns whether the fd
    /// is now buffered.
    fn drop_direct(&self, h: &Handle) -> bool {
        let Some(direct) = h.direct() else {
            return false;
        };
        let was = direct.swap(false, Relaxed);
        match sys::set_direct(h.fd.as_fd(), false) {
            Ok(()) => {
                if was {
                    tracing::debug!(
                        nodeid = h.inode.nodeid,
                        "the lower refused a direct I/O; this O_DIRECT open is served buffered from now on"
                    );
                }
                true
            }
            Err(e) => {
                tracing::debug!(nodeid = h.inode.nodeid, error = %e, "clearing O_DIRECT on the lower fd failed");
                false
            }
        }
    }

    /// FLUSH: `close(dup(fd))` on the lower, so the lower's upload happens inside the
    /// application's `close()` and its error is returned there. Never ENOSYS. A failure is a
    /// failed flush ([`Fs::failed_flushes`]) for a writable handle.
    ///
    /// # Errors
    /// The lower's FLUSH errno (e.g. an upload failure).
    pub fn flush(&self, nodeid: u64, fh: u64) -> Result<()> {
        let h = self.handle(nodeid, fh)?;
        let _call = self.acct.lower_call(LowerCall::Flush);
        sys::flush(h.fd.as_fd()).map_err(|e| {
            // Logged by the adapter with the request's context, as every failed request is.
            // A read-only handle's lower flush (served by drainfs, see the adapter's FOPEN
            // flags) publishes nothing of its own: not a failed flush.
            if h.writable() {
                self.record_failed_flush(&h.inode, e);
            }
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
        let copy =
            || sys::copy_file_range(hi.fd.as_fd(), off_in, ho.fd.as_fd(), off_out, len, flags);
        let direct = (Self::is_direct(&hi), Self::is_direct(&ho));
        let n = match copy() {
            // As in `Fs::direct_io`, for either end.
            Err(Errno::EINVAL)
                if (direct.0 && self.drop_direct(&hi)) | (direct.1 && self.drop_direct(&ho)) =>
            {
                copy()
            }
            r => r,
        }
        .map_err(|e| self.lower_err(e))?;
        if let Some(caller) = kill_privs.as_ref().filter(|_| n > 0) {
            self.kill_privs(ho.fd.as_fd(), caller)?;
        }
        Ok(n)
    }
}

//! RELEASE and RELEASEDIR, and the lingering lower fds of released passthrough writers: a
//! writable passthrough handle's lower fd is kept past its RELEASE ([`LINGER_CAP`] of them),
//! so that writes through a shared mapping that outlives the application's `close()` reach
//! the lower's FLUSH when that fd is finally closed (see [`Fs::release`]).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use nix::errno::Errno;

use super::Fs;
use super::handles::HandleKind;
use super::inodes::Inode;
use super::sys;
use crate::accounting::LowerCall;
use crate::error::{Error, Kind, Result};

/// At most this many lower fds of released passthrough writers are kept ([`Fs::release`]),
/// and at most a quarter of the fd budget.
pub const LINGER_CAP: usize = 256;

/// A released passthrough writer's inode and lower fd, kept until its close ([`Fs::release`]).
pub(super) type Lingering = (Arc<Inode>, Arc<OwnedFd>);

impl Fs {
    /// RELEASE / RELEASEDIR: forgets the fh and closes the lower fd (the lower's RELEASE);
    /// the inode's backing id is dropped with its last passthrough open. The lower's close
    /// can fail (an upload started by writes through a mapping after the application's
    /// `close()`): for a writable file that is a failed flush ([`Fs::failed_flushes`], the
    /// lower flush error count, a warning with the path); the kernel ignores RELEASE errors,
    /// so this returns `Ok` all the same.
    ///
    /// A writable passthrough handle's lower fd is flushed (`close(dup(fd))`) and then kept
    /// ([`LINGER_CAP`], the newest per inode) instead of closed: a shared mapping made
    /// through it holds the kernel's own backing file, so RELEASE comes at the application's
    /// `close()` while the mapping's writes come later, straight to the lower, which then
    /// sees only its backing file's RELEASE and no FLUSH (gcsfuse and bucketfs would never
    /// upload them). The kept fd's close later (evicted, or at the teardown, [`Fs::close_all`])
    /// is a `close(2)` on the lower inode: the kernel writes the mapping's dirty pages back and
    /// sends the lower a FLUSH, which uploads them; if it fails, the file is a failed flush.
    /// A FLUSH of an unchanged file uploads nothing on gcsfuse v3.11.2 and bucketfs.
    ///
    /// # Errors
    /// `EBADF` for an unknown fh; `EIO` once the lower fds are closed (the handle's fd is
    /// already closed then).
    pub fn release(&self, nodeid: u64, fh: u64) -> Result<()> {
        if self.admission.fds_closed() {
            return Err(Kind::Closed.into());
        }
        let h = self
            .handles
            .remove(nodeid, fh)
            .ok_or(Error::from(Kind::UnknownHandle))?;
        let (passthrough, backing_to_drop) = match h.kind {
            HandleKind::File { .. } => h.inode.open.lock().remove(fh),
            HandleKind::Dir(_) => (false, None),
        };
        drop(backing_to_drop);
        let _call = self.acct.lower_call(LowerCall::Release);
        let writable = h.writable();
        let inode = Arc::clone(&h.inode);
        // Kept before the close, so the close below is a flush (close(dup(fd))).
        let keep = (writable && passthrough).then(|| Arc::clone(&h.fd));
        let closed = h.close();
        if let Some(fd) = keep {
            self.linger(Arc::clone(&inode), fd);
        }
        if let Err(e) = closed {
            if writable {
                // RELEASE answers the kernel `Ok` (it ignores errors), so this is the one log
                // line of the failure.
                let path = self.record_failed_flush(&inode, e);
                tracing::warn!(nodeid, fh, path = %path.display(), error = %e, "the lower's close at RELEASE failed: a failed flush");
            } else {
                tracing::debug!(path = %inode.path().display(), error = %e, "the lower's close of a read-only handle failed");
            }
            if Error::lower(e).is_lower_disconnect() {
                self.admission.set_lower_gone();
            }
        }
        Ok(())
    }

    /// Keeps `fd` of `inode` in the lingering set; closes what that pushes out (the same
    /// inode's older fd, or the least recently released one).
    fn linger(&self, inode: Arc<Inode>, fd: Arc<OwnedFd>) {
        let nodeid = inode.nodeid;
        let out = {
            let mut l = self.lingering.lock();
            // Checked under the lock, which `close_lower_fds` takes after setting it.
            if self.admission.fds_closed() {
                Some((nodeid, (inode, fd)))
            } else {
                l.push(nodeid, (inode, fd))
            }
        };
        if let Some((_, (inode, fd))) = out
            && let Err(e) = self.close_lingering(&inode, fd)
        {
            tracing::warn!(nodeid = inode.nodeid, path = %inode.path().display(), error = %e, "the lower's close of a released passthrough writer failed: a failed flush");
        }
    }

    /// Closes a lingering lower fd: the lower's FLUSH (counted as a lower flush), recorded as
    /// a failed flush when it fails.
    pub(super) fn close_lingering(
        &self,
        inode: &Inode,
        fd: Arc<OwnedFd>,
    ) -> std::result::Result<(), Errno> {
        let _call = self.acct.lower_call(LowerCall::Flush);
        let r = match Arc::try_unwrap(fd) {
            Ok(fd) => sys::close(fd),
            Err(fd) => sys::flush(fd.as_fd()),
        };
        if let Err(e) = r {
            self.record_failed_flush(inode, e);
            if Error::lower(e).is_lower_disconnect() {
                self.admission.set_lower_gone();
            }
        }
        r
    }

    /// Number of lingering lower fds of released passthrough writers.
    pub fn lingering(&self) -> usize {
        self.lingering.lock().len()
    }
}

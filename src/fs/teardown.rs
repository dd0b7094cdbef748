//! The teardown: closing every lower fd drainfs holds ([`Fs::close_all`] after the unmount or
//! at the deadline, [`Fs::close_lower_fds`] while the core may still be referenced), so the
//! lower flushes what it can and can then unmount.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use super::Fs;
use crate::accounting::LowerCall;

impl Fs {
    /// Closes every remaining handle's lower fd and every lingering one of a released
    /// passthrough writer (teardown after unmount, or at the deadline); the close is the
    /// lower's flush, so the lower uploads what it can. Returns the paths of writable handles
    /// whose close failed (also counted as lower flush errors).
    pub fn close_all(&self) -> Vec<String> {
        let handles = self.handles.drain();
        let mut failed = Vec::new();
        let lingering: Vec<_> = {
            let mut l = self.lingering.lock();
            std::iter::from_fn(|| l.pop_lru()).collect()
        };
        for (_, (inode, fd)) in lingering {
            if let Err(e) = self.close_lingering(&inode, fd) {
                failed.push(format!("{}: {e}", inode.path().display()));
            }
        }
        for h in handles {
            let unlisted = h.inode.open.lock().clear();
            drop(unlisted);
            let writable = h.writable();
            let inode = Arc::clone(&h.inode);
            let _call = self.acct.lower_call(if writable {
                LowerCall::Flush
            } else {
                LowerCall::Release
            });
            if let Err(e) = h.close()
                && writable
            {
                self.acct.lower_flush_errors.fetch_add(1, Relaxed);
                failed.push(format!("{}: {e}", inode.path().display()));
            }
        }
        self.fd_cache.lock().clear();
        failed
    }

    /// Closes every lower fd drainfs holds, even while the core is still referenced (a FUSE
    /// session that cannot end because the mount was detached lazily and is still in use):
    /// each open handle's fd (its close is the lower's flush, as in [`Fs::close_all`]), the
    /// O_PATH cache and the root's fd. The lower can then unmount. From then on every
    /// operation fails with `EIO` ([`crate::error::Kind::Closed`]); fds are only ever reached
    /// through `Arc`s taken from the tables, so no closed fd number is used again (a request
    /// that holds one finishes with it, and the fd closes when it lets go). Idempotent.
    /// Returns the paths of writable handles whose close failed.
    pub fn close_lower_fds(&self) -> Vec<String> {
        self.admission.close_fds();
        let failed = self.close_all();
        let cached: Vec<_> = {
            let mut cache = self.fd_cache.lock();
            std::iter::from_fn(|| cache.pop_lru()).collect()
        };
        drop(cached);
        for inode in self.inodes.all() {
            let unlisted = inode.open.lock().clear();
            drop(unlisted);
        }
        drop(self.root_fd.write().take());
        failed
    }
}

//! The notifier thread: writes the daemon's notifications (`unique == 0`) to the kernel, in
//! the daemon's order, from a bounded queue the pump fills. It has a thread of its own because
//! the kernel may hold such a write until a request in flight completes (`NOTIFY_INVAL_INODE`
//! waits for the folio a READ holds, `NOTIFY_INVAL_ENTRY` for the directory a LOOKUP holds),
//! and that request's reply comes through the pump. It ends once the pump has ended and the
//! queue is written, or at once (dropping the queue) after [`Relay::end_notifications`].
//!
//! Why the end matters: a notifier blocked in the kernel cannot be killed (the folio wait is
//! uninterruptible), and a process with such a thread never finishes exiting, so its
//! `/dev/fuse` fd never closes and the requests it holds are never answered: the reader of
//! that folio, the notifier and everything reading their `/proc` files wait forever. Before
//! drainfs exits, [`Relay::end_notifications`] stops the notifier while the pump still
//! answers every request (EIO once the daemon is gone), which unlocks the folio it waits for.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TrySendError};
use std::time::{Duration, Instant};

use nix::errno::Errno;

use super::Relay;
use crate::relay::proto::OutHeader;

/// Notifications queued for the notifier at most; more are dropped (and counted) while the
/// kernel is not taking them. An invalidation lost costs cache coherence, never data.
pub(super) const NOTIFY_QUEUE: usize = 4096;

impl Relay {
    /// The notifier thread: writes each queued notification to the kernel, in the daemon's
    /// order. The kernel may block such a write until a request in flight completes, which
    /// the pump keeps relaying meanwhile.
    pub(super) fn notifier(self: Arc<Self>, rx: Receiver<Vec<u8>>) {
        while let Ok(msg) = rx.recv() {
            if self.notify_discard.load(Ordering::SeqCst) {
                self.state.lock().counters.notifications_dropped += 1;
                continue;
            }
            let code = OutHeader::parse(&msg).map_or(0, |h| h.error);
            let r = self.write_raw(&msg);
            let mut s = self.state.lock();
            s.counters.notifications += 1;
            if let Err(e) = r {
                s.counters.notification_errors += 1;
                drop(s);
                // ENOENT is the ordinary answer to invalidating something the kernel does not
                // cache; other errnos mean the daemon sent something the kernel refused.
                if e == Errno::ENOENT {
                    tracing::debug!(code, error = %e, "relay: the kernel rejected a notification");
                } else {
                    tracing::warn!(code, error = %e, "relay: the kernel rejected a notification");
                }
            }
        }
        self.notifier_done.store(true, Ordering::SeqCst);
    }

    /// Ends the notifier before drainfs exits: notifications not yet written are dropped
    /// (counted; the daemon that sent them is stopped, and an invalidation lost costs cache
    /// coherence, never data), and the one being written, which the kernel may hold until a
    /// request in flight completes, is waited for while the pump keeps answering requests.
    /// Waits `timeout` at most; returns whether the notifier has ended (blocking, polls every
    /// 5 ms).
    pub fn end_notifications(&self, timeout: Duration) -> bool {
        self.notify_discard.store(true, Ordering::SeqCst);
        self.notify_tx.lock().take();
        let until = Instant::now() + timeout;
        while !self.notifier_done.load(Ordering::SeqCst) {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Queues a notification for the notifier (dropped, and counted, when the queue is full or
    /// the notifier is gone).
    pub(super) fn queue_notification(&self, msg: &[u8]) {
        let r = match self.notify_tx.lock().as_ref() {
            Some(tx) => tx.try_send(msg.to_vec()),
            None => Err(TrySendError::Disconnected(Vec::new())),
        };
        if r.is_err() {
            let n = {
                let mut s = self.state.lock();
                s.counters.notifications_dropped += 1;
                s.counters.notifications_dropped
            };
            if n.is_power_of_two() {
                tracing::warn!(
                    dropped = n,
                    "relay: the kernel is not taking notifications; dropped one"
                );
            }
        }
    }
}

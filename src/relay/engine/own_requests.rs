//! The relay's own requests, the ones no caller made:
//! - the FSYNC before a RELEASE: a RELEASE of a handle with changes no successful FLUSH (nor
//!   a failed FLUSH/FSYNC) covered is held back (the relay's `held` map) while an
//!   FSYNC with one of the relay's own uniques ([`crate::relay::inflight::OWN_UNIQUE_BASE`])
//!   goes to the daemon; its reply goes nowhere, and then the RELEASE is forwarded (or, for a
//!   handle the relay opened itself, answered here);
//! - the OPEN answer: an OPEN the daemon answered ENOSYS is answered with a handle of the
//!   relay's own (fh 0), so the kernel never enters its no-open mode, in which RELEASE never
//!   comes and writers would be invisible.

use super::Relay;
use super::pump::{Outgoing, PumpIo};
use crate::relay::proto::{self, InHeader, OutHeader};

impl Relay {
    /// Holds the RELEASE `msg` back and sends the daemon the FSYNC of `fh` that
    /// [`Admit::SyncFirst`](crate::relay::inflight::Admit::SyncFirst) recorded as in flight
    /// under `fsync_unique`. When the FSYNC cannot be sent, it is taken out of the in-flight
    /// map (a failed flush) and the RELEASE goes on at once.
    pub(super) fn sync_before_release(
        &self,
        h: &InHeader,
        msg: &[u8],
        fsync_unique: u64,
        fh: u64,
        local_release: bool,
        io: &mut PumpIo,
    ) {
        tracing::debug!(
            unique = h.unique,
            nodeid = h.nodeid,
            fh,
            "relay: RELEASE of a handle changed since its last FLUSH: FSYNC first"
        );
        self.held
            .lock()
            .insert(fsync_unique, (msg.to_vec(), local_release));
        let fsync = proto::fsync_request(fsync_unique, h.nodeid, fh);
        if self.send(&fsync, io).is_err() {
            // Counted as a failed flush when taken; the RELEASE goes on.
            drop(self.state.lock().take(fsync_unique));
            let held = self.held.lock().remove(&fsync_unique);
            if let Some((msg, local)) = held {
                io.outbox.push_back(Outgoing::Release(msg, local));
            }
        }
    }

    /// The daemon answered one of the relay's own FSYNCs: the reply goes nowhere (it counts as
    /// a reply and completes the FSYNC), and the RELEASE it held goes to the pump's outbox.
    pub(super) fn on_own_reply(&self, h: &OutHeader, msg: &[u8], io: &mut PumpIo) {
        {
            let mut s = self.state.lock();
            if s.on_reply(h.unique, h.error, OutHeader::body(msg))
                .is_some()
            {
                s.counters.replies += 1;
            }
            s.complete(h.unique);
        }
        let held = self.held.lock().remove(&h.unique);
        if let Some((msg, local)) = held {
            io.outbox.push_back(Outgoing::Release(msg, local));
        }
    }

    /// Forwards (or, for a handle the relay opened itself, answers) a RELEASE whose FSYNC of
    /// the relay's own has been answered.
    pub(super) fn release_held(&self, msg: &[u8], local: bool, io: &mut PumpIo) {
        let Ok(h) = InHeader::parse(msg) else { return };
        if local {
            let r = self.write_kernel(&proto::error_reply(h.unique, 0));
            self.finish(h.unique, r);
        } else {
            self.forward(&h, msg, io);
        }
    }

    /// Answers the kernel's OPEN `unique`, which the daemon answered ENOSYS, with fh 0 (the
    /// handle [`Inflight::on_reply`](crate::relay::inflight::Inflight::on_reply) counted for
    /// it), and completes it.
    pub(super) fn answer_open_enosys(&self, unique: u64) {
        let r = self.write_kernel(&proto::open_reply(unique, 0));
        self.finish(unique, r);
    }
}

//! A daemon message, daemon → kernel, routed by its `unique`: 0 is a notification (queued for
//! [`super::notifier`]); the interrupt bit marks an interrupt reply (passed through, never
//! completing anything); one of the relay's own uniques answers its FSYNC
//! ([`super::own_requests`]) or is a part of a split request ([`super::split_io`]); any
//! other answers a kernel request, which
//! [`Inflight::on_reply`](crate::relay::inflight::Inflight::on_reply) sees before the reply is
//! written to the kernel and completes after ([`Relay::finish`]). A message that does not parse,
//! or carries an error the kernel would not take, is answered EIO to its caller.

use nix::errno::Errno;

use super::Relay;
use super::pump::PumpIo;
use crate::relay::inflight::is_own_unique;
use crate::relay::proto::{self, Opcode, OutHeader};
use crate::relay::split::is_part_unique;

impl Relay {
    /// Handles one daemon message (one datagram).
    pub(super) fn on_reply(&self, msg: &[u8], io: &mut PumpIo) {
        let h = match OutHeader::parse(msg) {
            Ok(h) => h,
            Err(e) => {
                self.state.lock().counters.protocol_errors += 1;
                tracing::error!(error = %e, "relay: malformed message from the daemon; answering EIO");
                self.answer_malformed(msg);
                return;
            }
        };
        if h.unique == 0 {
            self.queue_notification(msg);
            return;
        }
        if h.unique & proto::INT_REQ_BIT != 0 {
            let _ = self.write_kernel(msg);
            self.state.lock().counters.interrupt_replies += 1;
            return;
        }
        if !self.error_is_valid(&h, msg) {
            return;
        }
        if is_part_unique(h.unique) {
            self.on_part_reply(&h, msg, io);
        } else if is_own_unique(h.unique) {
            self.on_own_reply(&h, msg, io);
        } else {
            self.on_kernel_reply(&h, msg);
        }
    }

    /// Whether the reply's error is one the kernel takes: only 0 or -1..=-511
    /// (fuse_dev_do_write); it would leave the caller waiting for another reply, so any other
    /// value is a protocol error and the caller is answered EIO instead.
    fn error_is_valid(&self, h: &OutHeader, msg: &[u8]) -> bool {
        if (-511..=0).contains(&h.error) {
            return true;
        }
        self.state.lock().counters.protocol_errors += 1;
        tracing::error!(
            unique = h.unique,
            error = h.error,
            "relay: the daemon replied with an invalid error value; answering EIO"
        );
        self.answer_malformed(msg);
        false
    }

    /// The reply to a kernel request: seen by the in-flight state first (handles, names,
    /// failed flushes), then written to the kernel (an OPEN answered ENOSYS and INIT have their
    /// own answers) and completed.
    pub(super) fn on_kernel_reply(&self, h: &OutHeader, msg: &[u8]) {
        let pending = self
            .state
            .lock()
            .on_reply(h.unique, h.error, OutHeader::body(msg));
        match pending {
            Some(Opcode::Open) if h.error == -libc::ENOSYS => self.answer_open_enosys(h.unique),
            Some(Opcode::Init) => self.on_init_reply(h, msg),
            _ => {
                let r = self.write_kernel(msg);
                self.finish(h.unique, r);
            }
        }
    }

    /// Answers EIO to the request a malformed daemon message was for, when its `unique` can be
    /// salvaged and it is in flight.
    pub(super) fn answer_malformed(&self, msg: &[u8]) {
        if let Some(u) = proto::salvage_unique(msg)
            && u != 0
            && u & proto::INT_REQ_BIT == 0
        {
            self.answer_eio(u);
        }
    }

    /// Answers EIO to the kernel request `unique` if it is in flight: takes it out of the
    /// state, writes the error reply and completes it as failed. Returns whether it was in
    /// flight.
    ///
    /// The request is taken in a statement of its own, so the state lock is released before
    /// the write: [`Relay::write_kernel`] locks the state again to count an ENOENT (which is
    /// what the kernel gives when it already ended the request, as after a reply it refused
    /// with EINVAL), and the lock is not reentrant. A `take` in an `if let` or `match`
    /// scrutinee would hold the lock for the whole block.
    pub(super) fn answer_eio(&self, unique: u64) -> bool {
        self.splits.lock().cancel(unique);
        let pending = self.state.lock().take(unique);
        let Some(mut p) = pending else {
            return false;
        };
        let _ = self.write_kernel(&proto::error_reply(unique, libc::EIO));
        p.fail();
        true
    }

    /// Completes the request `unique` after its reply was written to the kernel with result
    /// `r` (counted as a reply when written). A reply the kernel refused with EINVAL (a body it
    /// cannot take for this request) is a protocol error, and the caller is answered EIO.
    pub(super) fn finish(&self, unique: u64, r: Result<(), Errno>) {
        if r == Err(Errno::EINVAL) {
            // The kernel refused the reply (a body it cannot take for this request). Having
            // found the request, the kernel has already ended it with EIO itself
            // (fuse_dev_do_write), so this EIO usually gets ENOENT; it is written anyway, so
            // that no caller is left waiting on a kernel (or stand-in) that kept the request.
            self.state.lock().counters.protocol_errors += 1;
            tracing::error!(
                unique,
                "relay: the kernel refused the daemon's reply (EINVAL); answering EIO"
            );
            self.answer_eio(unique);
            return;
        }
        {
            let mut s = self.state.lock();
            if r.is_ok() {
                s.counters.replies += 1;
            }
            s.complete(unique);
        }
        if let Err(e) = r
            && e != Errno::ENOENT
        {
            tracing::debug!(unique, error = %e, "relay: the kernel refused a reply");
        }
    }
}

//! INIT, the first exchange of the connection. The kernel's INIT request has flags masked
//! before it is forwarded ([`init::rewrite_init_request`]); the daemon's reply is capped to
//! what one datagram carries ([`init::rewrite_init_reply`]) and reported as
//! [`EngineEvent::Initialized`]. An INIT the daemon refuses is passed on and reported
//! ([`EngineEvent::InitRefused`]); an INIT the socket cannot carry is answered EIO by the relay
//! ([`EngineEvent::InitFailed`]); an INIT the daemon does not answer in time is answered EIO
//! when the lifecycle asks ([`Relay::fail_init`]).

use std::sync::atomic::Ordering;

use super::{EngineEvent, Relay};
use crate::relay::init;
use crate::relay::proto::{self, OutHeader};

impl Relay {
    /// The socket cannot carry a minimal message: answers the kernel's INIT `unique` EIO and
    /// reports [`EngineEvent::InitFailed`].
    pub(super) fn refuse_init_too_small(&self, unique: u64) {
        tracing::error!(
            datagram_limit = self.limits.datagram_limit,
            "relay: the socket buffers cannot carry a minimal 8 KiB FUSE message; \
             answering INIT with EIO"
        );
        let _ = self.write_kernel(&proto::error_reply(unique, libc::EIO));
        self.init_failed.store(true, Ordering::SeqCst);
        self.emit(EngineEvent::InitFailed);
    }

    /// An admitted INIT (`msg`, rewritten in place) about to be forwarded: remembers its
    /// `unique` for [`Relay::fail_init`] and masks the flags the relay does not carry.
    pub(super) fn on_init_request(&self, unique: u64, msg: &mut [u8]) {
        *self.init_unique.lock() = Some(unique);
        let cleared = init::rewrite_init_request(msg);
        if cleared != 0 {
            tracing::debug!(flags2_cleared = cleared, "relay: masked INIT flags");
        }
    }

    /// The daemon's reply to INIT: a refusal is passed on and reported; a success is capped
    /// (the negotiated [`init::InitCaps`] kept for the status) and reported; a reply the cap
    /// cannot be applied to is passed on unchanged.
    pub(super) fn on_init_reply(&self, h: &OutHeader, msg: &[u8]) {
        self.init_unique.lock().take();
        if h.error != 0 {
            tracing::error!(errno = -h.error, "relay: the daemon refused INIT");
            self.init_refused.store(-h.error, Ordering::SeqCst);
            let r = self.write_kernel(msg);
            self.finish(h.unique, r);
            self.emit(EngineEvent::InitRefused(-h.error));
            return;
        }
        if let Some(cap) = self.limits.kernel_cap {
            let mut owned = msg.to_vec();
            if let Some(caps) = init::rewrite_init_reply(&mut owned, cap) {
                // WRITE parts fit the daemon's read buffer, sized for its own max_write.
                let part = self
                    .limits
                    .write_part
                    .min(caps.daemon_max_write / init::PAGE * init::PAGE);
                self.write_part
                    .store(part.max(self.limits.cap.unwrap_or(0)), Ordering::Relaxed);
                tracing::info!(
                    minor = caps.minor,
                    daemon_max_write = caps.daemon_max_write,
                    max_write = caps.max_write,
                    max_pages = caps.max_pages,
                    daemon_flags = format_args!("{:#x}", caps.daemon_flags),
                    cap,
                    "relay: INIT negotiated"
                );
                *self.init.lock() = Some(caps);
                let r = self.write_kernel(&owned);
                self.finish(h.unique, r);
                self.emit(EngineEvent::Initialized(caps));
                return;
            }
        }
        let r = self.write_kernel(msg);
        self.finish(h.unique, r);
    }

    /// Answers the kernel's INIT with EIO if the daemon has not answered it (the mount then
    /// fails with ECONNREFUSED instead of hanging). Returns whether INIT was still pending.
    pub fn fail_init(&self) -> bool {
        let Some(unique) = self.init_unique.lock().take() else {
            return false;
        };
        let pending = self.state.lock().take(unique);
        if let Some(mut p) = pending {
            tracing::error!("relay: the daemon did not answer INIT in time; answering it EIO");
            let _ = self.write_kernel(&proto::error_reply(unique, libc::EIO));
            p.fail();
            return true;
        }
        false
    }
}

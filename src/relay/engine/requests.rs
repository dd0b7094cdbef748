//! A kernel request, kernel → daemon: parsed, counted and admitted at the single admission
//! point ([`Inflight::admit`](crate::relay::inflight::Inflight::admit), which says what to do
//! with it), then forwarded to the daemon, answered by the relay itself (the door's ESHUTDOWN,
//! EIO once the daemon is gone or stopping), held behind an FSYNC of the relay's own
//! ([`super::own_requests`]), or dropped. A request that cannot be forwarded is answered EIO.

use std::sync::atomic::Ordering;

use nix::errno::Errno;

use super::Relay;
use super::pump::PumpIo;
use crate::relay::inflight::{Admit, accounting_op};
use crate::relay::proto::{self, InHeader, Opcode, ProtoError};

impl Relay {
    /// Handles one kernel request (`msg`, one `read(2)`; INIT's is rewritten in place before
    /// it is forwarded).
    pub(super) fn on_request(&self, msg: &mut [u8], io: &mut PumpIo) {
        let h = match InHeader::parse(msg) {
            Ok(h) => h,
            Err(e) => return self.on_malformed_request(msg, e),
        };
        // `fuse_read_in.size` sits where `fuse_write_in.size` does.
        match h.opcode {
            Opcode::Read => self
                .profile
                .read_sizes
                .count(proto::write_size(InHeader::body(msg)).unwrap_or(0)),
            Opcode::Write => self
                .profile
                .write_sizes
                .count(proto::write_size(InHeader::body(msg)).unwrap_or(0)),
            _ => {}
        }
        if h.opcode == Opcode::Init && self.limits.cap.is_none() {
            return self.refuse_init_too_small(h.unique);
        }
        match self.admit(&h, msg) {
            Admit::Forward => {
                if h.opcode == Opcode::Init {
                    self.on_init_request(h.unique, msg);
                }
                if !self.forward_split(&h, msg, io) {
                    self.forward(&h, msg, io);
                }
            }
            Admit::Reply(errno) => {
                tracing::debug!(
                    op = h.opcode.name(),
                    unique = h.unique,
                    errno,
                    "relay: answered by the relay"
                );
                let _ = self.write_kernel(&proto::error_reply(h.unique, errno));
            }
            Admit::SyncFirst {
                fsync_unique,
                fh,
                local_release,
            } => self.sync_before_release(&h, msg, fsync_unique, fh, local_release, io),
            Admit::Drop => {}
        }
    }

    /// The single admission point: count the request (enter the gate), then read the door,
    /// then decide under the state mutex.
    fn admit(&self, h: &InHeader, msg: &[u8]) -> Admit {
        let guard = self.acct.op_owned(accounting_op(h.opcode));
        let door_open = self.acct.door_open();
        self.state
            .lock()
            .admit(h, InHeader::body(msg), guard, door_open)
    }

    /// A request whose header does not parse: counted as a protocol error and, when its
    /// `unique` can be salvaged (and is neither 0 nor an interrupt's), answered EIO.
    fn on_malformed_request(&self, msg: &[u8], e: ProtoError) {
        self.state.lock().counters.protocol_errors += 1;
        tracing::error!(error = %e, "relay: malformed request from the kernel");
        if let Some(u) = proto::salvage_unique(msg)
            && u != 0
            && u & proto::INT_REQ_BIT == 0
        {
            let _ = self.write_kernel(&proto::error_reply(u, libc::EIO));
        }
    }

    /// Sends an admitted request to the daemon: a BATCH_FORGET larger than one datagram in
    /// parts, anything else whole. A request that cannot be sent (EMSGSIZE, the daemon gone)
    /// is answered EIO and counted in `answered_send_failed`.
    pub(super) fn forward(&self, h: &InHeader, msg: &[u8], io: &mut PumpIo) {
        if msg.len() > self.limits.datagram_limit && h.opcode == Opcode::BatchForget {
            match proto::split_batch_forget(msg, self.limits.datagram_limit) {
                Some(parts) => {
                    for p in parts {
                        if self.send(&p, io).is_err() {
                            return;
                        }
                    }
                }
                None => tracing::error!(len = msg.len(), "relay: malformed BATCH_FORGET dropped"),
            }
            return;
        }
        if let Err(e) = self.send(msg, io) {
            if e == Errno::EMSGSIZE {
                tracing::error!(
                    op = h.opcode.name(),
                    len = msg.len(),
                    limit = self.limits.datagram_limit,
                    "relay bug: a request does not fit one datagram; answering EIO"
                );
            } else if !self.shut_wr.load(Ordering::SeqCst) && !self.daemon_gone() {
                tracing::warn!(op = h.opcode.name(), error = %e, "relay: sending a request to the daemon failed");
            }
            let pending = {
                let mut s = self.state.lock();
                let p = s.take(h.unique);
                if p.is_some() {
                    s.counters.answered_send_failed += 1;
                }
                p
            };
            if let Some(mut p) = pending {
                let _ = self.write_kernel(&proto::error_reply(h.unique, libc::EIO));
                p.fail();
            }
        }
    }
}

//! READs and WRITEs larger than the daemon's cap, sent as parts ([`crate::relay::split`]
//! decides and assembles; this sends and answers). Only with [`Limits::splitting`]
//! (`--split-large-requests`, on by default): the kernel then sends up to the daemon's own
//! `max_write`/`max_pages` (1 MiB for gcsfuse), while each datagram the daemon sends stays
//! within the relay's cap. Also there: READDIR and READDIRPLUS asking for more than the cap
//! ask for the cap (a shorter directory reply is normal; the kernel asks again).
//!
//! [`Limits::splitting`]: super::Limits::splitting

use std::sync::atomic::Ordering;

use super::Relay;
use super::pump::{Outgoing, PumpIo};
use crate::relay::proto::{self, InHeader, Opcode, OutHeader};
use crate::relay::split::Next;

/// Offset of `size` in `fuse_read_in` (READ, READDIR, READDIRPLUS).
const READ_IN_SIZE: usize = 16;

impl Relay {
    /// Sends an admitted READ or WRITE larger than its part size as parts (returns true), or
    /// clamps a READDIR(PLUS) to the cap and returns false (forward it whole), as does every
    /// other request, and every request when the relay does not split.
    pub(super) fn forward_split(&self, h: &InHeader, msg: &mut [u8], io: &mut PumpIo) -> bool {
        let Some(cap) = self.limits.cap.filter(|_| self.limits.splits()) else {
            return false;
        };
        let first = match h.opcode {
            Opcode::Readdir | Opcode::Readdirplus => {
                let at = proto::IN_HEADER_LEN + READ_IN_SIZE;
                if proto::u32_at(msg, at).is_some_and(|n| n > cap) {
                    proto::put_u32(msg, at, cap);
                }
                return false;
            }
            Opcode::Read => self.splits.lock().read(h, msg, cap, self.limits.read_parts),
            Opcode::Write => {
                let part = self.write_part.load(Ordering::Relaxed);
                self.splits.lock().write(h, msg, part).map(|p| vec![p])
            }
            _ => None,
        };
        let Some(parts) = first else {
            return false;
        };
        {
            let mut s = self.state.lock();
            s.counters.split_requests += 1;
            s.counters.split_parts += parts.len() as u64;
        }
        for p in parts {
            if !self.send_part(h.unique, &p, io) {
                break;
            }
        }
        true
    }

    /// Sends one part of the kernel's request `unique`. When the send fails, the request is
    /// answered EIO (which cancels its other parts) and false returned.
    pub(super) fn send_part(&self, unique: u64, part: &[u8], io: &mut PumpIo) -> bool {
        match self.send(part, io) {
            Ok(()) => true,
            Err(e) => {
                if !self.shut_wr.load(Ordering::SeqCst) && !self.daemon_gone() {
                    tracing::warn!(unique, error = %e, len = part.len(), "relay: sending a request part to the daemon failed; answering EIO");
                }
                if self.answer_eio(unique) {
                    self.state.lock().counters.answered_send_failed += 1;
                }
                false
            }
        }
    }

    /// The daemon's reply to a part: once the request's parts are answered, its assembled
    /// reply goes to the kernel as the daemon's reply would; the next WRITE part goes to the
    /// outbox. A reply to a part of a request answered already is counted as unknown.
    pub(super) fn on_part_reply(&self, h: &OutHeader, msg: &[u8], io: &mut PumpIo) {
        let next = self.splits.lock().on_reply(h, msg);
        match next {
            None => self.state.lock().counters.unknown_replies += 1,
            Some((_, Next::Wait)) => {}
            Some((unique, Next::Send(part))) => {
                self.state.lock().counters.split_parts += 1;
                io.outbox.push_back(Outgoing::Part(unique, part));
            }
            Some((unique, Next::Reply(reply))) => match OutHeader::parse(&reply) {
                Ok(rh) => self.on_kernel_reply(&rh, &reply),
                Err(e) => {
                    tracing::error!(unique, error = %e, "relay bug: an assembled reply does not parse; answering EIO");
                    self.answer_eio(unique);
                }
            },
        }
    }
}

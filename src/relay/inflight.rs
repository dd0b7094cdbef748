//! The relay's accounting and door decisions: requests in flight by `unique`, open handles,
//! and what to do with each new kernel request. Pure state, no I/O: the engine holds it under
//! one mutex and performs the I/O each decision names.
//!
//! # Race freedom
//! New requests enter the relay in exactly one place: the kernel→daemon reader thread, which
//! calls [`Inflight::admit`] under the state's mutex. The door check and the insertion into
//! the in-flight map happen in that one call, so for any moment at which the door is closed
//! ([`Inflight::close_door`], same mutex), every request admitted before it is already in the
//! map and every request after it sees the door closed. A drain that closes the door and then
//! reads [`Inflight::outstanding`] therefore never misses an admitted request.

use std::collections::HashMap;
use std::time::Instant;

use serde::Serialize;

use super::proto::{self, InHeader, Opcode};

/// What an open handle is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HandleKind {
    /// A file opened O_RDONLY.
    Read,
    /// A file opened O_WRONLY or O_RDWR.
    Write,
    /// A directory (OPENDIR).
    Dir,
}

/// One request awaiting the daemon's reply.
#[derive(Debug, Clone, Copy)]
pub struct Pending {
    /// The operation.
    pub opcode: Opcode,
    /// When the relay read it from the kernel.
    pub start: Instant,
    /// For OPEN/CREATE/TMPFILE/OPENDIR: the kind of handle a successful reply creates.
    pub opens: Option<HandleKind>,
}

/// What to do with a kernel request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Send it to the daemon (recorded as in flight when it expects a reply).
    Forward,
    /// Answer it here with this errno (header-only error reply).
    Reply(i32),
    /// Neither forward nor answer (a FORGET or INTERRUPT once the daemon is gone or stopping).
    Drop,
}

/// Counters over the relay's life.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    /// Kernel requests forwarded to the daemon.
    pub forwarded: u64,
    /// Daemon replies written to the kernel.
    pub replies: u64,
    /// Requests refused by the door with ESHUTDOWN while draining.
    pub door_refused: u64,
    /// Requests answered EIO by the relay because the daemon was gone or being stopped.
    pub answered_daemon_gone: u64,
    /// Requests answered EIO because the relay could not forward them (EMSGSIZE, send error).
    pub answered_send_failed: u64,
    /// Replies the kernel no longer wanted (ENOENT: request aborted or interrupted).
    pub kernel_enoent: u64,
    /// Notifications (`unique == 0`) written to the kernel.
    pub notifications: u64,
    /// Notifications the kernel rejected (its errno is logged).
    pub notification_errors: u64,
    /// Interrupt replies (`unique & 1`) passed through.
    pub interrupt_replies: u64,
    /// FORGET and BATCH_FORGET messages forwarded (no reply expected, never in flight).
    pub forgets: u64,
    /// Malformed messages (a header whose length does not match the bytes read).
    pub protocol_errors: u64,
    /// Replies for a `unique` the relay had no record of.
    pub unknown_replies: u64,
}

/// A point-in-time view of what is outstanding, for the drain decision and `/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Outstanding {
    /// Requests awaiting a reply.
    pub in_flight: u64,
    /// Of those, FLUSH and FSYNC (uploads, for gcsfuse).
    pub flush_fsync: u64,
    /// In-flight requests by opcode name (non-zero only, sorted by name).
    pub by_op: Vec<(String, u64)>,
    /// Age of the oldest in-flight request, milliseconds.
    pub oldest_ms: Option<u64>,
    /// Open handles by kind.
    pub open_read: u64,
    /// Open write handles.
    pub open_write: u64,
    /// Open directory handles.
    pub open_dir: u64,
}

impl Outstanding {
    /// Nothing in flight and no file open for writing: safe to stop the daemon.
    pub fn is_drained(&self) -> bool {
        self.in_flight == 0 && self.open_write == 0
    }
}

/// The relay's state. See the module doc for the locking invariant.
#[derive(Debug, Default)]
pub struct Inflight {
    pending: HashMap<u64, Pending>,
    /// (kind, fh) -> how many opens returned that fh (daemons such as libfuse's examples
    /// return fh 0 for every open).
    handles: HashMap<(HandleKind, u64), u64>,
    door_closed: bool,
    stopping: bool,
    daemon_gone: bool,
    /// Counters.
    pub counters: Counters,
}

impl Inflight {
    /// Decides what to do with a kernel request and, when it is forwarded and expects a reply,
    /// records it as in flight. RELEASE/RELEASEDIR remove their handle here, at the request
    /// (the kernel considers the file closed once it sends RELEASE).
    pub fn admit(&mut self, h: &InHeader, body: &[u8], now: Instant) -> Admit {
        if matches!(h.opcode, Opcode::Release | Opcode::Releasedir) {
            self.remove_handle(h.opcode, body);
        }
        if !h.opcode.expects_reply() {
            if self.daemon_gone || self.stopping {
                return Admit::Drop;
            }
            if matches!(h.opcode, Opcode::Forget | Opcode::BatchForget) {
                self.counters.forgets += 1;
            }
            self.counters.forwarded += 1;
            return Admit::Forward;
        }
        if self.daemon_gone || self.stopping {
            self.counters.answered_daemon_gone += 1;
            return Admit::Reply(libc::EIO);
        }
        if self.door_closed && h.opcode.is_door_guarded() {
            self.counters.door_refused += 1;
            return Admit::Reply(libc::ESHUTDOWN);
        }
        let opens = match h.opcode {
            Opcode::Open | Opcode::Create | Opcode::Tmpfile => {
                let flags = proto::open_flags(body).unwrap_or(0);
                Some(if proto::is_write_intent(flags) {
                    HandleKind::Write
                } else {
                    HandleKind::Read
                })
            }
            Opcode::Opendir => Some(HandleKind::Dir),
            _ => None,
        };
        self.pending.insert(
            h.unique,
            Pending {
                opcode: h.opcode,
                start: now,
                opens,
            },
        );
        self.counters.forwarded += 1;
        Admit::Forward
    }

    fn remove_handle(&mut self, opcode: Opcode, body: &[u8]) {
        let Some(fh) = proto::release_fh(body) else {
            return;
        };
        // fuse_release_in: fh, then the flags the file was opened with.
        let flags = proto::u32_at(body, 8).unwrap_or(0);
        let kinds: &[HandleKind] = if opcode == Opcode::Releasedir {
            &[HandleKind::Dir]
        } else if proto::is_write_intent(flags) {
            &[HandleKind::Write, HandleKind::Read]
        } else {
            &[HandleKind::Read, HandleKind::Write]
        };
        for kind in kinds {
            if let Some(n) = self.handles.get_mut(&(*kind, fh)) {
                *n -= 1;
                if *n == 0 {
                    self.handles.remove(&(*kind, fh));
                }
                return;
            }
        }
    }

    /// Looks at a daemon reply before it is written to the kernel: returns the request it
    /// answers (`None` for an unknown `unique`), and records the handle a successful
    /// OPEN/CREATE/OPENDIR reply creates, so that it is known before the kernel can send its
    /// RELEASE.
    pub fn on_reply(&mut self, unique: u64, error: i32, body: &[u8]) -> Option<Pending> {
        let Some(p) = self.pending.get(&unique).copied() else {
            self.counters.unknown_replies += 1;
            return None;
        };
        if error == 0
            && let Some(kind) = p.opens
            && let Some(fh) = proto::reply_fh(p.opcode, body)
        {
            *self.handles.entry((kind, fh)).or_insert(0) += 1;
        }
        Some(p)
    }

    /// Marks a request finished (its reply was written to the kernel, or it was answered by
    /// the relay). Returns whether it was in flight.
    pub fn complete(&mut self, unique: u64) -> bool {
        self.pending.remove(&unique).is_some()
    }

    /// Closes the door: from now on [`Inflight::admit`] refuses door-guarded requests.
    pub fn close_door(&mut self) {
        self.door_closed = true;
    }

    /// Whether the door is closed.
    pub fn door_closed(&self) -> bool {
        self.door_closed
    }

    /// The relay is stopping the daemon (SHUT_WR): later requests are answered EIO.
    pub fn begin_stop(&mut self) {
        self.stopping = true;
    }

    /// Whether [`Inflight::begin_stop`] was called.
    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// The daemon is gone: later requests are answered EIO. Returns every in-flight request
    /// (removed from the map), for the caller to answer EIO at once.
    pub fn daemon_gone(&mut self) -> Vec<(u64, Pending)> {
        self.daemon_gone = true;
        let mut all: Vec<(u64, Pending)> = self.pending.drain().collect();
        all.sort_by_key(|(u, _)| *u);
        all
    }

    /// Whether [`Inflight::daemon_gone`] was called.
    pub fn is_daemon_gone(&self) -> bool {
        self.daemon_gone
    }

    /// What is outstanding now.
    pub fn outstanding(&self, now: Instant) -> Outstanding {
        let mut by_op: HashMap<&'static str, u64> = HashMap::new();
        let mut flush_fsync = 0;
        let mut oldest: Option<Instant> = None;
        for p in self.pending.values() {
            *by_op.entry(p.opcode.name()).or_insert(0) += 1;
            if matches!(p.opcode, Opcode::Flush | Opcode::Fsync) {
                flush_fsync += 1;
            }
            oldest = Some(oldest.map_or(p.start, |o| o.min(p.start)));
        }
        let mut by_op: Vec<(String, u64)> =
            by_op.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        by_op.sort();
        let count = |kind: HandleKind| {
            self.handles
                .iter()
                .filter(|((k, _), _)| *k == kind)
                .map(|(_, n)| *n)
                .sum()
        };
        Outstanding {
            in_flight: self.pending.len() as u64,
            flush_fsync,
            by_op,
            oldest_ms: oldest.map(|o| now.saturating_duration_since(o).as_millis() as u64),
            open_read: count(HandleKind::Read),
            open_write: count(HandleKind::Write),
            open_dir: count(HandleKind::Dir),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::proto::tests::request;

    fn hdr(m: &[u8]) -> InHeader {
        InHeader::parse(m).unwrap()
    }

    fn admit(s: &mut Inflight, opcode: u32, unique: u64, body: &[u8]) -> Admit {
        let m = request(opcode, unique, 1, body);
        s.admit(&hdr(&m), InHeader::body(&m), Instant::now())
    }

    fn open_in(flags: i32) -> Vec<u8> {
        let mut b = (flags as u32).to_le_bytes().to_vec();
        b.extend_from_slice(&[0; 4]);
        b
    }

    fn release_in(fh: u64, flags: i32) -> Vec<u8> {
        let mut b = fh.to_le_bytes().to_vec();
        b.extend_from_slice(&(flags as u32).to_le_bytes());
        b.extend_from_slice(&[0; 12]);
        b
    }

    fn open_out(fh: u64) -> Vec<u8> {
        let mut b = fh.to_le_bytes().to_vec();
        b.extend_from_slice(&[0; 8]);
        b
    }

    #[test]
    fn no_reply_opcodes_are_never_in_flight() {
        let mut s = Inflight::default();
        for (op, u) in [(2, 2), (42, 4), (36, 7), (41, 8)] {
            assert_eq!(admit(&mut s, op, u, &[0; 16]), Admit::Forward);
        }
        let o = s.outstanding(Instant::now());
        assert_eq!(o.in_flight, 0);
        assert_eq!(s.counters.forgets, 2);
        // Unknown opcodes expect a reply.
        assert_eq!(admit(&mut s, 9999, 10, &[]), Admit::Forward);
        assert_eq!(
            s.outstanding(Instant::now()).by_op,
            vec![("other".into(), 1)]
        );
    }

    #[test]
    fn handles_follow_open_replies_and_release_requests() {
        let mut s = Inflight::default();
        assert_eq!(
            admit(&mut s, 14, 2, &open_in(libc::O_WRONLY)),
            Admit::Forward
        );
        assert_eq!(
            admit(&mut s, 14, 4, &open_in(libc::O_RDONLY)),
            Admit::Forward
        );
        assert_eq!(admit(&mut s, 27, 6, &open_in(0)), Admit::Forward);
        assert_eq!(admit(&mut s, 14, 8, &open_in(libc::O_RDWR)), Admit::Forward);
        let o = s.outstanding(Instant::now());
        assert_eq!((o.in_flight, o.open_write), (4, 0));
        // Successful replies create handles (the same fh 0 twice, as libfuse examples do).
        assert!(s.on_reply(2, 0, &open_out(0)).is_some());
        assert!(s.on_reply(4, 0, &open_out(0)).is_some());
        assert!(s.on_reply(6, 0, &open_out(0)).is_some());
        // A failed open creates none.
        assert!(s.on_reply(8, -libc::EACCES, &[]).is_some());
        for u in [2, 4, 6, 8] {
            assert!(s.complete(u));
        }
        assert!(!s.complete(2));
        let o = s.outstanding(Instant::now());
        assert_eq!(
            (o.in_flight, o.open_read, o.open_write, o.open_dir),
            (0, 1, 1, 1)
        );
        assert!(!o.is_drained());
        // RELEASE (a request) removes the write handle at once, before its reply.
        assert_eq!(
            admit(&mut s, 18, 10, &release_in(0, libc::O_WRONLY)),
            Admit::Forward
        );
        let o = s.outstanding(Instant::now());
        assert_eq!((o.in_flight, o.open_write, o.open_read), (1, 0, 1));
        s.complete(10);
        admit(&mut s, 29, 12, &release_in(0, 0));
        s.complete(12);
        let o = s.outstanding(Instant::now());
        assert_eq!((o.open_dir, o.open_read), (0, 1));
        assert!(o.is_drained());
    }

    #[test]
    fn door_refuses_namespace_changes_only_after_closing() {
        let mut s = Inflight::default();
        assert_eq!(
            admit(&mut s, 35, 2, &open_in(libc::O_WRONLY)),
            Admit::Forward
        );
        s.close_door();
        for op in [14, 35, 9, 8, 6, 13, 12, 45, 51] {
            assert_eq!(
                admit(&mut s, op, 100 + u64::from(op) * 2, &open_in(0)),
                Admit::Reply(libc::ESHUTDOWN),
                "opcode {op}"
            );
        }
        // Work on existing handles still flows: WRITE, FLUSH, FSYNC, RELEASE, GETATTR.
        for (op, u) in [(16, 4), (25, 6), (20, 8), (18, 10), (3, 12)] {
            assert_eq!(admit(&mut s, op, u, &[0; 24]), Admit::Forward);
        }
        let o = s.outstanding(Instant::now());
        assert_eq!(o.in_flight, 6);
        assert_eq!(o.flush_fsync, 2);
        assert_eq!(s.counters.door_refused, 9);
    }

    #[test]
    fn daemon_gone_returns_everything_in_flight_and_fails_later_requests() {
        let mut s = Inflight::default();
        admit(&mut s, 15, 2, &[]);
        admit(&mut s, 25, 4, &[]);
        admit(&mut s, 2, 6, &[0; 8]);
        let gone = s.daemon_gone();
        assert_eq!(gone.iter().map(|(u, _)| *u).collect::<Vec<_>>(), vec![2, 4]);
        assert_eq!(s.outstanding(Instant::now()).in_flight, 0);
        assert_eq!(admit(&mut s, 3, 8, &[]), Admit::Reply(libc::EIO));
        assert_eq!(admit(&mut s, 2, 10, &[0; 8]), Admit::Drop);
    }

    #[test]
    fn stopping_answers_eio() {
        let mut s = Inflight::default();
        s.begin_stop();
        assert_eq!(admit(&mut s, 1, 2, &[]), Admit::Reply(libc::EIO));
        assert_eq!(admit(&mut s, 36, 3, &[0; 8]), Admit::Drop);
        assert_eq!(s.counters.answered_daemon_gone, 1);
    }
}

//! Large READs and WRITEs split inside the relay, so that the kernel keeps the daemon's own
//! `max_write`/`max_pages` (1 MiB for gcsfuse) while every datagram the daemon sends stays
//! small.
//!
//! Why (RELAY-PERF-NOTES 1, 5.3): a datagram above ~16 KiB needs one linear kernel allocation
//! of its size, and a failed one is ENOBUFS for the sender; jacobsa/fuse (gcsfuse) does not
//! retry a reply, so the daemon's replies must stay at the relay's cap (128 KiB by default,
//! an order-4 allocation). Capping the kernel at that size instead (what the relay did before)
//! turns every 1 MiB O_DIRECT READ or WRITE into 8 synchronous round trips through two more
//! hops.
//!
//! - **READ** larger than the read part size: the relay sends the daemon one READ per part
//!   (consecutive offsets, the kernel's header and `fuse_read_in` otherwise unchanged) under
//!   uniques of its own ([`PART_UNIQUE_BASE`]), one after another ([`ReadParts::InOrder`]: the
//!   next once the previous one came back full) or all at once ([`ReadParts::AtOnce`]), and
//!   answers the kernel once the parts are answered: their data in order, up to and including
//!   the first short part (a short READ reply is the end of the file; later parts are not
//!   sent, or not used); any part's error is the whole READ's error. In order is the default:
//!   gcsfuse without its file cache serves READs of one handle under one lock, and parts that
//!   reach it out of order count as seeks, which switch its reader to small random reads
//!   (measured: 0.6x of the capped relay's sequential O_DIRECT reads at once, against 2.5x
//!   with the file cache on).
//! - **WRITE** larger than the write part size: one part at a time, in order (a daemon that
//!   streams uploads, as gcsfuse does, needs its writes in offset order); the next part goes
//!   once the previous one wrote all its bytes. The kernel's reply says how many bytes were
//!   written: all, or those before the first short part; an error on the first part is the
//!   WRITE's error, an error on a later part ends it short. Only the relay sends WRITE parts,
//!   and it retries ENOBUFS on its own sends, so the write part size may be larger than the
//!   read part size.
//!
//! The kernel's request stays in flight (in [`super::inflight::Inflight`]) under its own
//! `unique` until its one reply, so the accounting, the door and the drain see exactly what
//! they would see without the split. An INTERRUPT of the kernel's request is forwarded as it
//! is (gcsfuse ignores interrupts of uniques it does not know). Pure state, no I/O: the engine
//! sends the messages this returns.

use std::collections::HashMap;

pub use crate::config::ReadParts;

use super::inflight::OWN_UNIQUE_BASE;
use super::proto::{self, IN_HEADER_LEN, InHeader, OUT_HEADER_LEN, Opcode, OutHeader, put_u32};

/// The uniques of request parts start here (within the relay's own range, above the FSYNCs of
/// [`OWN_UNIQUE_BASE`]), in steps of 2 (bit 0 is the kernel's interrupt bit).
pub const PART_UNIQUE_BASE: u64 = OWN_UNIQUE_BASE | (1 << 62);

/// Whether `unique` is one of the relay's request parts.
pub fn is_part_unique(unique: u64) -> bool {
    unique >= PART_UNIQUE_BASE
}

/// `sizeof(struct fuse_read_in)` and `sizeof(struct fuse_write_in)` (protocol 7.9 and later).
const IO_IN_LEN: usize = 40;
/// Offsets in `fuse_read_in` / `fuse_write_in`.
const IO_OFFSET: usize = 8;
const IO_SIZE: usize = 16;
/// Offset of `total_extlen` in `fuse_in_header`.
const IN_EXTLEN: usize = 36;

/// What the engine does after a part's reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Wait for more parts.
    Wait,
    /// Send this part (the next WRITE part, or READ part in order) to the daemon.
    Send(Vec<u8>),
    /// The kernel's request is answered: pass this reply (the kernel's `unique`, header
    /// included) on as the daemon's reply to it.
    Reply(Vec<u8>),
}

#[derive(Debug)]
enum Job {
    Read {
        /// The kernel's READ (header and `fuse_read_in`).
        msg: Vec<u8>,
        /// Part size.
        part: u32,
        /// Bytes asked for, per part.
        asked: Vec<u32>,
        /// Each part's reply body (`Ok`) or negative error, once answered; parts never sent
        /// (after a short or failed one, in order) stay `None`.
        got: Vec<Option<Result<Vec<u8>, i32>>>,
        /// Parts sent so far.
        sent: usize,
        /// How the parts go.
        mode: ReadParts,
    },
    Write {
        /// The kernel's WRITE (header, `fuse_write_in`, data).
        msg: Vec<u8>,
        /// Part size.
        part: usize,
        /// Data bytes written by the parts answered so far.
        done: usize,
        /// Data bytes sent in the part in flight.
        in_flight: usize,
    },
}

/// The split requests in flight.
#[derive(Debug)]
pub struct Splits {
    /// By the kernel's `unique`.
    jobs: HashMap<u64, Job>,
    /// Part `unique` → (kernel `unique`, part index).
    parts: HashMap<u64, (u64, usize)>,
    next: u64,
    /// Requests split so far.
    pub split: u64,
    /// Parts sent so far.
    pub parts_sent: u64,
}

impl Default for Splits {
    fn default() -> Self {
        Splits {
            jobs: HashMap::new(),
            parts: HashMap::new(),
            next: PART_UNIQUE_BASE,
            split: 0,
            parts_sent: 0,
        }
    }
}

/// A request header and `fuse_read_in`/`fuse_write_in` copied from `msg` with a new unique,
/// offset, size and total length (`extra` bytes of data follow the 80 bytes).
fn part_header(msg: &[u8], unique: u64, offset: u64, size: u32, extra: usize) -> Vec<u8> {
    let head = IN_HEADER_LEN + IO_IN_LEN;
    let mut m = Vec::with_capacity(head + extra);
    m.extend_from_slice(&msg[..head]);
    put_u32(&mut m, 0, (head + extra) as u32);
    m[8..16].copy_from_slice(&unique.to_le_bytes());
    let b = IN_HEADER_LEN;
    m[b + IO_OFFSET..b + IO_OFFSET + 8].copy_from_slice(&offset.to_le_bytes());
    put_u32(&mut m, b + IO_SIZE, size);
    m
}

/// (offset, size) of a READ or WRITE request, when it can be split: a well-formed message
/// without extension headers.
fn io_args(msg: &[u8]) -> Option<(u64, u32)> {
    if msg.len() < IN_HEADER_LEN + IO_IN_LEN || proto::u16_at(msg, IN_EXTLEN) != Some(0) {
        return None;
    }
    let b = IN_HEADER_LEN;
    Some((
        proto::u64_at(msg, b + IO_OFFSET)?,
        proto::u32_at(msg, b + IO_SIZE)?,
    ))
}

impl Splits {
    fn new_unique(&mut self) -> u64 {
        let u = self.next;
        self.next += 2;
        u
    }

    /// Splits the kernel's READ `msg` (`h` its header) into parts of at most `part` bytes
    /// (`part` > 0) when it asks for more; returns the part messages to send now: the first
    /// ([`ReadParts::InOrder`], the next ones come from [`Splits::on_reply`]) or all.
    /// `None`: not split (small enough, or not a READ this can split), forward it whole.
    pub fn read(
        &mut self,
        h: &InHeader,
        msg: &[u8],
        part: u32,
        mode: ReadParts,
    ) -> Option<Vec<Vec<u8>>> {
        if h.opcode != Opcode::Read || part == 0 {
            return None;
        }
        let (_, size) = io_args(msg)?;
        if size <= part {
            return None;
        }
        let n = size.div_ceil(part) as usize;
        let asked = (0..n).map(|i| part.min(size - i as u32 * part)).collect();
        let mut job = Job::Read {
            msg: msg[..IN_HEADER_LEN + IO_IN_LEN].to_vec(),
            part,
            asked,
            got: vec![None; n],
            sent: 0,
            mode,
        };
        let now = if mode == ReadParts::AtOnce { n } else { 1 };
        let msgs = (0..now)
            .filter_map(|_| self.next_read_part(h.unique, &mut job))
            .collect();
        self.jobs.insert(h.unique, job);
        self.split += 1;
        Some(msgs)
    }

    /// The next unsent part of a READ job, if any.
    fn next_read_part(&mut self, kernel: u64, job: &mut Job) -> Option<Vec<u8>> {
        let Job::Read {
            msg,
            part,
            asked,
            sent,
            ..
        } = job
        else {
            return None;
        };
        let i = *sent;
        let this = *asked.get(i)?;
        let (offset, _) = io_args(msg)?;
        let u = self.new_unique();
        self.parts.insert(u, (kernel, i));
        *sent += 1;
        self.parts_sent += 1;
        Some(part_header(
            msg,
            u,
            offset + i as u64 * u64::from(*part),
            this,
            0,
        ))
    }

    /// Splits the kernel's WRITE `msg` into parts of at most `part` bytes when it carries
    /// more; returns the first part to send (the next ones come from [`Splits::on_reply`]).
    /// `None`: not split, forward it whole.
    pub fn write(&mut self, h: &InHeader, msg: &[u8], part: u32) -> Option<Vec<u8>> {
        if h.opcode != Opcode::Write || part == 0 {
            return None;
        }
        let (_, size) = io_args(msg)?;
        let data = msg.len() - IN_HEADER_LEN - IO_IN_LEN;
        if size <= part || size as usize != data {
            return None;
        }
        let mut job = Job::Write {
            msg: msg.to_vec(),
            part: part as usize,
            done: 0,
            in_flight: 0,
        };
        let first = self.next_write_part(h.unique, &mut job);
        self.jobs.insert(h.unique, job);
        self.split += 1;
        first
    }

    /// The next part of a WRITE job, or `None` when every byte has been sent.
    fn next_write_part(&mut self, kernel: u64, job: &mut Job) -> Option<Vec<u8>> {
        let Job::Write {
            msg,
            part,
            done,
            in_flight,
        } = job
        else {
            return None;
        };
        let head = IN_HEADER_LEN + IO_IN_LEN;
        let total = msg.len() - head;
        if *done >= total {
            return None;
        }
        let this = (*part).min(total - *done);
        let (offset, _) = io_args(msg)?;
        let u = self.new_unique();
        self.parts.insert(u, (kernel, 0));
        let mut m = part_header(msg, u, offset + *done as u64, this as u32, this);
        m.extend_from_slice(&msg[head + *done..head + *done + this]);
        *in_flight = this;
        self.parts_sent += 1;
        Some(m)
    }

    /// The daemon's reply `msg` (header `h`) to a part: returns the kernel's `unique` and what
    /// to do next; `None` when `h.unique` is no part in flight (its request was answered
    /// already, or cancelled).
    pub fn on_reply(&mut self, h: &OutHeader, msg: &[u8]) -> Option<(u64, Next)> {
        let (kernel, index) = self.parts.remove(&h.unique)?;
        let mut job = self.jobs.remove(&kernel)?;
        let next = match &mut job {
            Job::Read {
                asked,
                got,
                sent,
                mode,
                ..
            } => {
                let body = OutHeader::body(msg);
                // In order, a failed or short part ends the READ: nothing after it is sent.
                let ends = h.error != 0 || body.len() < asked[index] as usize;
                got[index] = Some(if h.error != 0 {
                    Err(h.error)
                } else {
                    Ok(body.to_vec())
                });
                let sent_all = *sent == asked.len();
                if *mode == ReadParts::InOrder && !ends && !sent_all {
                    match self.next_read_part(kernel, &mut job) {
                        Some(p) => Next::Send(p),
                        None => Next::Wait,
                    }
                } else if got[..*sent].iter().any(Option::is_none) {
                    Next::Wait
                } else {
                    Next::Reply(read_reply(kernel, asked, got))
                }
            }
            Job::Write {
                done, in_flight, ..
            } => {
                let written = if h.error != 0 {
                    None
                } else {
                    proto::u32_at(OutHeader::body(msg), 0).map(|n| (n as usize).min(*in_flight))
                };
                match written {
                    None if *done == 0 => {
                        Next::Reply(proto::error_reply(kernel, -h.error).to_vec())
                    }
                    None => Next::Reply(write_reply(kernel, *done)),
                    Some(n) => {
                        *done += n;
                        if n < *in_flight {
                            Next::Reply(write_reply(kernel, *done))
                        } else {
                            match self.next_write_part(kernel, &mut job) {
                                Some(part) => Next::Send(part),
                                None => {
                                    let Job::Write { done, .. } = &job else {
                                        unreachable!("a write job")
                                    };
                                    Next::Reply(write_reply(kernel, *done))
                                }
                            }
                        }
                    }
                }
            }
        };
        if matches!(next, Next::Wait | Next::Send(_)) {
            self.jobs.insert(kernel, job);
        }
        Some((kernel, next))
    }

    /// Forgets the kernel's request `kernel` and its parts (it was answered some other way);
    /// replies to its parts are then ignored.
    pub fn cancel(&mut self, kernel: u64) {
        if self.jobs.remove(&kernel).is_some() {
            self.parts.retain(|_, (k, _)| *k != kernel);
        }
    }

    /// Forgets everything (the daemon is gone; every kernel request was answered EIO).
    pub fn clear(&mut self) {
        self.jobs.clear();
        self.parts.clear();
    }

    /// Kernel requests split and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.jobs.len()
    }
}

/// The kernel's READ reply from its parts' answers (all present).
fn read_reply(kernel: u64, asked: &[u32], got: &[Option<Result<Vec<u8>, i32>>]) -> Vec<u8> {
    if let Some(Some(Err(e))) = got.iter().find(|g| matches!(g, Some(Err(_)))) {
        return proto::error_reply(kernel, -*e).to_vec();
    }
    let mut m = vec![0u8; OUT_HEADER_LEN];
    for (a, g) in asked.iter().zip(got) {
        // A part never sent follows a short one.
        let Some(Ok(data)) = g else { break };
        m.extend_from_slice(data);
        if data.len() < *a as usize {
            break;
        }
    }
    let len = m.len() as u32;
    put_u32(&mut m, 0, len);
    m[8..16].copy_from_slice(&kernel.to_le_bytes());
    m
}

/// A successful WRITE reply (`fuse_write_out { size, padding }`) for `written` bytes.
fn write_reply(kernel: u64, written: usize) -> Vec<u8> {
    let mut m = vec![0u8; OUT_HEADER_LEN + 8];
    put_u32(&mut m, 0, (OUT_HEADER_LEN + 8) as u32);
    m[8..16].copy_from_slice(&kernel.to_le_bytes());
    put_u32(&mut m, OUT_HEADER_LEN, written as u32);
    m
}

#[cfg(test)]
mod tests;

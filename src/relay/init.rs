//! INIT negotiation through the relay: the message-size cap and the rewrite of INIT in both
//! directions, so that every message of the connection fits one datagram of the socketpair.
//!
//! Why (RELAY-NOTES 2.5, 2.6): an AF_UNIX SEQPACKET send larger than `sk_sndbuf - 32` fails
//! with EMSGSIZE, and a daemon such as gcsfuse (jacobsa/fuse) does not retry a failed reply:
//! the caller would hang. The kernel bounds its messages by the negotiated `max_write` and
//! `max_pages`, so the relay caps both in the daemon's INIT reply. Features that live on the
//! device fd itself (passthrough backing ids, io_uring) cannot cross a socket and are masked.

use serde::Serialize;

use super::proto::{self, OUT_HEADER_LEN, put_u16, put_u32, u16_at, u32_at};

/// Page size the kernel uses for `max_pages` (4 KiB on every platform drainfs supports).
pub const PAGE: u32 = 4096;
/// Largest cap the relay uses: 1 MiB, jacobsa/fuse's default `max_write`.
pub const MAX_CAP: u32 = 1 << 20;
/// The default largest message payload (`--max-message`): 128 KiB, as Android's AppFuse and
/// ndfuse use. Larger datagrams need larger linear skb allocations in the kernel (order 6 at
/// 256 KiB), which can fail with ENOBUFS under memory fragmentation.
pub const DEFAULT_MAX_MESSAGE: u32 = 128 << 10;
/// Per-datagram overhead `unix_dgram_sendmsg` subtracts from `sk_sndbuf`.
pub const DGRAM_OVERHEAD: u32 = 32;
/// Room for headers and request structs on top of the payload cap (a WRITE carries 80 bytes).
pub const HEADROOM: u32 = 4096;
/// The kernel's `max_pages` when the daemon does not set FUSE_MAX_PAGES (128 KiB).
pub const DEFAULT_MAX_PAGES: u32 = 32;

/// `FUSE_MAX_PAGES`: the reply's `max_pages` is valid.
pub const FUSE_MAX_PAGES: u32 = 1 << 22;
/// `FUSE_INIT_EXT`: `flags2` is valid (the high 32 bits of the flag word).
pub const FUSE_INIT_EXT: u32 = 1 << 30;
/// High-word (`flags2`) bits a socket cannot carry or the relay does not support:
/// FUSE_PASSTHROUGH (bit 37), FUSE_HAS_RESEND (39), FUSE_ALLOW_IDMAP (40),
/// FUSE_OVER_IO_URING (41), each minus 32.
pub const FLAGS2_MASKED: u32 = (1 << 5) | (1 << 7) | (1 << 8) | (1 << 9);

// Offsets in `struct fuse_init_in` (the request body).
const IN_FLAGS: usize = 12;
const IN_FLAGS2: usize = 16;
// Offsets in `struct fuse_init_out` (the reply body).
const OUT_MINOR: usize = 4;
const OUT_FLAGS: usize = 12;
const OUT_MAX_WRITE: usize = 20;
const OUT_MAX_PAGES: usize = 28;
const OUT_FLAGS2: usize = 32;
/// `sizeof(struct fuse_init_out)` on every kernel since 4.20.
pub const INIT_OUT_LEN: usize = 64;

/// The payload cap (bytes, a multiple of 4 KiB) for a socketpair whose two ends have these
/// send buffers (as read back with `getsockopt(SO_SNDBUF)`).
///
/// `CAP = min(a, b) - 32 - 4096`, rounded down to whole pages, at most 1 MiB. A message of
/// CAP + 4096 bytes (the relay's `/dev/fuse` read buffer) then fits one datagram either way.
/// `None` when the buffers cannot carry one page of payload, i.e. not even the kernel's
/// minimal 8 KiB message: the relay must fail INIT.
pub fn compute_cap(sndbuf_relay: usize, sndbuf_daemon: usize) -> Option<u32> {
    let smaller = u32::try_from(sndbuf_relay.min(sndbuf_daemon)).unwrap_or(u32::MAX);
    let room = smaller.checked_sub(DGRAM_OVERHEAD + HEADROOM)?;
    let cap = (room / PAGE * PAGE).min(MAX_CAP);
    (cap >= PAGE).then_some(cap)
}

/// The relay's `/dev/fuse` read buffer for a cap: CAP + 4 KiB, at least the kernel's 8 KiB
/// minimum. The kernel packs BATCH_FORGET to this size, so it also bounds forget batches.
pub fn read_buffer(cap: Option<u32>) -> usize {
    (cap.unwrap_or(0) as usize + HEADROOM as usize).max(proto::MIN_READ_BUFFER)
}

/// Masks, in a kernel INIT request (header included), the `flags2` bits a socket cannot
/// carry (see [`FLAGS2_MASKED`]). Leaves `major`/`minor` and everything else alone. Returns the
/// bits cleared (0 when the request has no `flags2`).
pub fn rewrite_init_request(msg: &mut [u8]) -> u32 {
    let body = proto::IN_HEADER_LEN;
    let (Some(flags), Some(flags2)) = (u32_at(msg, body + IN_FLAGS), u32_at(msg, body + IN_FLAGS2))
    else {
        return 0;
    };
    if flags & FUSE_INIT_EXT == 0 {
        return 0;
    }
    let cleared = flags2 & FLAGS2_MASKED;
    put_u32(msg, body + IN_FLAGS2, flags2 & !FLAGS2_MASKED);
    cleared
}

/// What INIT negotiated through the relay (for `/status` and the logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct InitCaps {
    /// The protocol minor the daemon answered (left unchanged).
    pub minor: u32,
    /// `max_write` the daemon asked for.
    pub daemon_max_write: u32,
    /// `max_write` the kernel was given.
    pub max_write: u32,
    /// `max_pages` the kernel will use (the kernel default of 32 when not set).
    pub max_pages: u32,
    /// The payload cap the socket buffers allow.
    pub cap: u32,
    /// The daemon's INIT reply flags as it sent them (`flags`, and `flags2` in the high 32
    /// bits with `FUSE_INIT_EXT`): e.g. bit 16 `FUSE_WRITEBACK_CACHE`, bit 17
    /// `FUSE_NO_OPEN_SUPPORT`.
    pub daemon_flags: u64,
}

/// Caps `max_write` and `max_pages` of a successful INIT reply (header included) at `cap`,
/// setting FUSE_MAX_PAGES when the kernel's default of 32 pages would exceed it, and clears
/// the [`FLAGS2_MASKED`] bits of `flags2`. `minor` is never touched (it fixes every struct
/// layout after INIT). A reply too short to hold `max_pages` is zero-extended to the full
/// 64-byte `fuse_init_out` when `max_pages` must be set, and the header's `len` updated.
/// Error replies are left alone (`None`).
pub fn rewrite_init_reply(msg: &mut Vec<u8>, cap: u32) -> Option<InitCaps> {
    let h = proto::OutHeader::parse(msg).ok()?;
    if h.error != 0 {
        return None;
    }
    let b = OUT_HEADER_LEN;
    let minor = u32_at(msg, b + OUT_MINOR).unwrap_or(0);
    let mut flags = u32_at(msg, b + OUT_FLAGS).unwrap_or(0);
    let daemon_flags = u64::from(flags)
        | if flags & FUSE_INIT_EXT != 0 {
            u64::from(u32_at(msg, b + OUT_FLAGS2).unwrap_or(0)) << 32
        } else {
            0
        };
    let daemon_max_write = u32_at(msg, b + OUT_MAX_WRITE).unwrap_or(0);
    let max_write = daemon_max_write.min(cap);
    if u32_at(msg, b + OUT_MAX_WRITE).is_some() {
        put_u32(msg, b + OUT_MAX_WRITE, max_write);
    }
    let cap_pages = cap / PAGE;
    let daemon_pages = if flags & FUSE_MAX_PAGES != 0 {
        u32::from(u16_at(msg, b + OUT_MAX_PAGES).unwrap_or(0)).max(1)
    } else {
        DEFAULT_MAX_PAGES
    };
    let max_pages = daemon_pages.min(cap_pages);
    if max_pages != daemon_pages || flags & FUSE_MAX_PAGES != 0 {
        if msg.len() < b + OUT_MAX_PAGES + 2 {
            msg.resize(b + INIT_OUT_LEN, 0);
            let len = msg.len() as u32;
            put_u32(msg, 0, len);
        }
        flags |= FUSE_MAX_PAGES;
        put_u32(msg, b + OUT_FLAGS, flags);
        put_u16(msg, b + OUT_MAX_PAGES, max_pages as u16);
    }
    if flags & FUSE_INIT_EXT != 0
        && let Some(f2) = u32_at(msg, b + OUT_FLAGS2)
    {
        put_u32(msg, b + OUT_FLAGS2, f2 & !FLAGS2_MASKED);
    }
    Some(InitCaps {
        minor,
        daemon_max_write,
        max_write,
        max_pages,
        cap,
        daemon_flags,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::proto::tests::{reply, request};

    #[test]
    fn cap_table() {
        let k = 1024usize;
        let cases: &[(usize, usize, Option<u32>)] = &[
            // The kernel default wmem_max (212992) doubled by SO_SNDBUF: 425984 - 4128 -> 408 KiB.
            (425_984, 425_984, Some(408 * 1024)),
            // The smaller end decides.
            (4 << 20, 256 * k, Some(248 * 1024)),
            (256 * k, 8 << 20, Some(248 * 1024)),
            // Large buffers stop at 1 MiB.
            (8 << 20, 8 << 20, Some(1 << 20)),
            // 128 KiB + overhead exactly.
            (128 * k + 32 + 4096, 1 << 20, Some(128 * 1024)),
            // One byte short of that rounds down a page.
            (128 * k + 32 + 4095, 1 << 20, Some(124 * 1024)),
            // The smallest workable socket: one page of payload, an 8 KiB read buffer.
            (8192 + 32, 8192 + 32, Some(4096)),
            // Cannot carry an 8 KiB message.
            (8192 + 31, 1 << 20, None),
            (4608, 4608, None),
            (0, 0, None),
        ];
        for &(a, b, want) in cases {
            let got = compute_cap(a, b);
            assert_eq!(got, want, "sndbufs {a}, {b}");
            if let Some(cap) = got {
                assert_eq!(cap % PAGE, 0);
                // The read buffer (largest kernel message) fits one datagram of either end.
                assert!(read_buffer(got) + 32 <= a.min(b), "sndbufs {a}, {b}");
            }
        }
        assert_eq!(read_buffer(None), 8192);
        assert_eq!(read_buffer(Some(4096)), 8192);
        assert_eq!(read_buffer(Some(128 * 1024)), 132 * 1024);
    }

    fn init_in(flags: u32, flags2: u32) -> Vec<u8> {
        let mut body = vec![0u8; 64];
        put_u32(&mut body, 0, 7);
        put_u32(&mut body, 4, 44);
        put_u32(&mut body, 8, 128 * 1024);
        put_u32(&mut body, IN_FLAGS, flags);
        put_u32(&mut body, IN_FLAGS2, flags2);
        request(26, 2, 0, &body)
    }

    #[test]
    fn init_request_masks_socket_incapable_flags() {
        let passthrough = 1 << 5;
        let io_uring = 1 << 9;
        let keep = 1 << 1; // FUSE_HAS_INODE_DAX: not ours to touch
        let mut m = init_in(
            FUSE_INIT_EXT | 1,
            passthrough | io_uring | keep | (1 << 7) | (1 << 8),
        );
        let before = m.clone();
        let cleared = rewrite_init_request(&mut m);
        assert_eq!(cleared, passthrough | io_uring | (1 << 7) | (1 << 8));
        assert_eq!(u32_at(&m, 40 + IN_FLAGS2), Some(keep));
        // Everything else is byte-identical (major, minor, flags, readahead).
        assert_eq!(m[..40 + IN_FLAGS2], before[..40 + IN_FLAGS2]);
        assert_eq!(m[40 + IN_FLAGS2 + 4..], before[40 + IN_FLAGS2 + 4..]);

        // Without FUSE_INIT_EXT flags2 means nothing: untouched.
        let mut m = init_in(1, passthrough);
        assert_eq!(rewrite_init_request(&mut m), 0);
        assert_eq!(u32_at(&m, 40 + IN_FLAGS2), Some(passthrough));
        // An old kernel's 16-byte init_in: nothing to do, no panic.
        let mut m = request(26, 2, 0, &[0; 16]);
        assert_eq!(rewrite_init_request(&mut m), 0);
    }

    fn init_out(minor: u32, flags: u32, max_write: u32, max_pages: u16, flags2: u32) -> Vec<u8> {
        let mut body = vec![0u8; INIT_OUT_LEN];
        put_u32(&mut body, 0, 7);
        put_u32(&mut body, OUT_MINOR, minor);
        put_u32(&mut body, 8, 1 << 20);
        put_u32(&mut body, OUT_FLAGS, flags);
        put_u32(&mut body, OUT_MAX_WRITE, max_write);
        put_u16(&mut body, OUT_MAX_PAGES, max_pages);
        put_u32(&mut body, OUT_FLAGS2, flags2);
        reply(2, 0, &body)
    }

    #[test]
    fn init_reply_caps_jacobsa_style() {
        // gcsfuse: minor 34, 1 MiB max_write, FUSE_MAX_PAGES with 256 pages, no INIT_EXT.
        let mut m = init_out(34, FUSE_MAX_PAGES | (1 << 5), 1 << 20, 256, 0);
        let caps = rewrite_init_reply(&mut m, 128 * 1024).unwrap();
        assert_eq!(
            caps,
            InitCaps {
                minor: 34,
                daemon_max_write: 1 << 20,
                max_write: 128 * 1024,
                max_pages: 32,
                cap: 128 * 1024,
                daemon_flags: u64::from(FUSE_MAX_PAGES | (1 << 5)),
            }
        );
        assert_eq!(u32_at(&m, 16 + OUT_MAX_WRITE), Some(128 * 1024));
        assert_eq!(u16_at(&m, 16 + OUT_MAX_PAGES), Some(32));
        assert_eq!(u32_at(&m, 16 + OUT_MINOR), Some(34));
        assert_eq!(m.len(), 80);
    }

    #[test]
    fn init_reply_fuser_16mib_with_small_cap_sets_max_pages() {
        // fuser: asks 16 MiB max_write; without FUSE_MAX_PAGES the kernel would use 32 pages,
        // above a 64 KiB cap, so the relay sets the flag.
        let mut m = init_out(31, 1 << 5, 16 << 20, 0, 0);
        let caps = rewrite_init_reply(&mut m, 64 * 1024).unwrap();
        assert_eq!((caps.max_write, caps.max_pages), (64 * 1024, 16));
        let flags = u32_at(&m, 16 + OUT_FLAGS).unwrap();
        assert_ne!(flags & FUSE_MAX_PAGES, 0);
        assert_eq!(u16_at(&m, 16 + OUT_MAX_PAGES), Some(16));
    }

    #[test]
    fn init_reply_within_cap_is_unchanged() {
        let mut m = init_out(38, 0, 64 * 1024, 0, 0);
        let before = m.clone();
        let caps = rewrite_init_reply(&mut m, 256 * 1024).unwrap();
        assert_eq!((caps.max_write, caps.max_pages), (64 * 1024, 32));
        assert_eq!(m, before);
    }

    #[test]
    fn init_reply_flags2_masked_only_with_init_ext() {
        let pt = 1 << 5;
        let mut m = init_out(40, FUSE_INIT_EXT, 4096, 0, pt | (1 << 9) | 1);
        rewrite_init_reply(&mut m, 1 << 20).unwrap();
        assert_eq!(u32_at(&m, 16 + OUT_FLAGS2), Some(1));
        let mut m = init_out(40, 0, 4096, 0, pt);
        rewrite_init_reply(&mut m, 1 << 20).unwrap();
        assert_eq!(u32_at(&m, 16 + OUT_FLAGS2), Some(pt));
    }

    #[test]
    fn short_init_reply_is_extended_when_max_pages_is_needed() {
        // A 24-byte (7.22-style) reply: no max_pages field; cap below 128 KiB.
        let mut body = vec![0u8; 24];
        put_u32(&mut body, 0, 7);
        put_u32(&mut body, OUT_MINOR, 22);
        put_u32(&mut body, OUT_MAX_WRITE, 1 << 20);
        let mut m = reply(2, 0, &body);
        let caps = rewrite_init_reply(&mut m, 32 * 1024).unwrap();
        assert_eq!(caps.max_pages, 8);
        assert_eq!(m.len(), 16 + INIT_OUT_LEN);
        let h = proto::OutHeader::parse(&m).unwrap();
        assert_eq!(h.len as usize, m.len());
        assert_eq!(u16_at(&m, 16 + OUT_MAX_PAGES), Some(8));
        assert_eq!(u32_at(&m, 16 + OUT_MINOR), Some(22));
    }

    #[test]
    fn error_and_malformed_init_replies_are_left_alone() {
        let mut m = reply(2, -libc::EPROTO, &[]);
        let before = m.clone();
        assert_eq!(rewrite_init_reply(&mut m, 4096), None);
        assert_eq!(m, before);
        let mut m = vec![1, 2, 3];
        assert_eq!(rewrite_init_reply(&mut m, 4096), None);
    }
}

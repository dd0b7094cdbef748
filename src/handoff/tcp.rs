//! Whether gcsfuse waits for an answer on one of its TCP connections, from the kernel's
//! `sock_diag` dump (pure: the bytes in, a verdict out; the executor sends the request).
//!
//! gcsfuse talks HTTP/1.1 to Cloud Storage (its default `--client-protocol=http1`): a request,
//! then its response, on a connection. While an upload waits for the server's answer (the
//! commit at the end of a `close()`), nothing moves in gcsfuse's I/O counters, but its
//! connection has sent data more recently than it received any: `tcpi_last_data_sent` (ms
//! since) is smaller than `tcpi_last_data_recv`. An idle keep-alive connection has received the
//! last response after its request. [`Judge::waiting`] says which of gcsfuse's
//! established connections (by socket inode, from `/proc/PID/fd`) are in the first state.
//!
//! The kernel keeps these times in jiffies (4 ms steps at `HZ=250`), so a request sent in the
//! same step as the previous answer arrived shows a tie, for as long as the server takes to
//! answer it. The server's ACK of that request breaks it ([`TcpSock::awaiting`]) when it
//! arrives in a later step (a delayed ACK, about 40 ms on Linux): `tcpi_last_ack_recv` turns
//! younger than the last data received, while a request answered within the step leaves the
//! last ACK no younger than the answer, which carried it. An immediate ACK in the same step
//! leaves the tie unbroken (seen on loopback under load: the final request of a 96 MiB upload
//! with `lastsnd`, `lastrcv` and `lastack` all 48 ms, then a commit of about a second). Nothing
//! in `tcp_info` orders a send and a receive of the same step; [`Judge`] tells the two from
//! the socket's previous sample: a tie is one exchange answered within the step only when the
//! socket was idle at that sample and has sent exactly one data segment since (the request)
//! and received data (the answer). Any other tie counts as waiting until it is
//! [`TIE_PROTECT_MS`] old less the idle window: gcsfuse is then ended no sooner than 2 s
//! after it.

use std::collections::HashMap;

/// `SOCK_DIAG_BY_FAMILY`, the netlink message type of an `inet_diag` request and its replies.
pub const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `INET_DIAG_INFO`: the reply attribute holding `struct tcp_info`.
const INET_DIAG_INFO: u16 = 2;
/// `TCP_ESTABLISHED`.
const TCP_ESTABLISHED: u8 = 1;
/// `NLMSG_DONE` and `NLMSG_ERROR`.
const NLMSG_DONE: u16 = 3;
const NLMSG_ERROR: u16 = 2;
/// Offsets in `struct tcp_info` (include/uapi/linux/tcp.h): 8 bytes of `__u8` fields, then
/// `__u32`s: `tcpi_last_data_sent` is the 10th, `tcpi_last_data_recv` the 12th,
/// `tcpi_last_ack_recv` the 13th.
const LAST_DATA_SENT: usize = 44;
const LAST_DATA_RECV: usize = 52;
const LAST_ACK_RECV: usize = 56;
/// `tcpi_data_segs_in` and `tcpi_data_segs_out` (Linux 4.6+), after the 64-bit counters.
const DATA_SEGS_IN: usize = 152;
const DATA_SEGS_OUT: usize = 156;

/// How long after a tie's last send an ACK may arrive and still count as the server's ACK of
/// that request (ms). Delayed ACKs come within 500 ms (RFC 1122; Linux at most 200 ms); a
/// keep-alive probe's ACK, the only other ACK an idle connection receives, comes no sooner
/// than 15 s after the last data (Go's default keep-alive idle time, gcsfuse's and its
/// server's), and must not make a tie look like a request waiting.
pub const TIE_ACK_MAX_MS: u32 = 5_000;

/// How long after an unbroken tie (the last send, the last receive and the last ACK in one
/// step) gcsfuse is not ended (ms): the tie may be an exchange answered within the step (idle)
/// or a request whose immediate ACK came in the step (waiting), and the hand-off takes it for
/// the second that long. 2 s is what the kubelet gives a native sidecar after the grace period
/// ran out, the case where an upload can still be in flight at a stop: the stock sidecar's
/// gcsfuse serves that long. The tie counts as waiting for this less the idle window (the
/// window then runs from the end of the hold), [`tie_hold_ms`].
pub const TIE_PROTECT_MS: u32 = 2_000;

/// How long an unbroken tie counts as a request waiting for its answer with an idle window of
/// `window_ms`: [`TIE_PROTECT_MS`] less the window, zero for a window of 2 s or more.
pub fn tie_hold_ms(window_ms: u64) -> u32 {
    u64::from(TIE_PROTECT_MS).saturating_sub(window_ms) as u32
}

/// Where a socket is, for an exact lookup ([`lookup_request`]): its address family and its
/// `struct inet_diag_sockid` as the kernel gave it (48 bytes: ports, addresses, interface and
/// cookie; the cookie makes the lookup find this socket and no later one on the same ports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiagKey {
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    /// The `inet_diag_sockid`, bytes 4..52 of its `inet_diag_msg`.
    pub id: [u8; 48],
}

/// One established TCP socket of the dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSock {
    /// Its inode (as `/proc/PID/fd/N` shows it: `socket:[INODE]`).
    pub inode: u32,
    /// Where it is, to look it up again without a dump.
    pub key: DiagKey,
    /// Milliseconds since it last sent data.
    pub last_data_sent_ms: u32,
    /// Milliseconds since it last received data.
    pub last_data_recv_ms: u32,
    /// Milliseconds since it last received an ACK (with data or without).
    pub last_ack_recv_ms: u32,
    /// Data segments received and sent so far (`tcpi_data_segs_in`, `tcpi_data_segs_out`;
    /// `None` from a kernel older than 4.6).
    pub data_segs: Option<(u32, u32)>,
    /// Bytes received that gcsfuse has not read yet (`idiag_rqueue`).
    pub rqueue: u32,
    /// Bytes sent that the peer has not acknowledged yet, or not yet sent (`idiag_wqueue`).
    pub wqueue: u32,
}

/// What a socket's previous sample showed: its verdict and its data segment counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// Whether it waited for an answer.
    pub awaiting: bool,
    /// Its [`TcpSock::data_segs`].
    pub data_segs: Option<(u32, u32)>,
}

impl TcpSock {
    /// Bytes are queued on it (received and not yet read, or sent and not yet acknowledged):
    /// gcsfuse has work in flight there. Else: it sent data after the last data it received: a
    /// request waits for its answer. When
    /// the last send and the last receive share a timestamp step (a tie), the request waits
    /// if an ACK arrived after that data, and no later than [`TIE_ACK_MAX_MS`] after the send
    /// (the server's ACK of the request, not a keep-alive's). A tie the ACK does not break
    /// (it fell in the same step, or before) waits while it is younger than `tie_hold_ms`
    /// ([`tie_hold_ms`]), unless `prev`, the socket's previous sample, shows it to be one
    /// exchange answered within the step: idle at `prev`, exactly one data segment sent since
    /// and at least one received (`None`: measured from the socket's start); with no data
    /// moved since `prev`, the verdict stays `prev`'s.
    pub fn awaiting(&self, prev: Option<Seen>, tie_hold_ms: u32) -> bool {
        if self.rqueue > 0 || self.wqueue > 0 {
            // An answer gcsfuse has yet to read, or a request still on its way.
            return true;
        }
        let (sent, recv, ack) = (
            self.last_data_sent_ms,
            self.last_data_recv_ms,
            self.last_ack_recv_ms,
        );
        if sent != recv {
            return sent < recv;
        }
        if ack < recv && sent - ack <= TIE_ACK_MAX_MS {
            return true;
        }
        if sent >= tie_hold_ms {
            return false;
        }
        match prev {
            Some(p) if p.data_segs.is_some() && p.data_segs == self.data_segs => p.awaiting,
            _ => !self.one_exchange_since(prev),
        }
    }

    /// Whether, since `prev`, the socket went from idle through exactly one request and its
    /// answer: idle then (not waiting), one data segment sent since and at least one received.
    /// An HTTP/1.1 connection receives data only in answer to a request, so the segment sent
    /// came before the data received, and no second request went out after it. A socket not
    /// seen before is measured from its start (idle, no segment), which only a new
    /// connection's first exchange fits.
    fn one_exchange_since(&self, prev: Option<Seen>) -> bool {
        let start = Seen {
            awaiting: false,
            data_segs: Some((0, 0)),
        };
        match (prev.or(Some(start)), self.data_segs) {
            (
                Some(Seen {
                    awaiting: false,
                    data_segs: Some((in0, out0)),
                }),
                Some((in1, out1)),
            ) => out1.wrapping_sub(out0) == 1 && in1.wrapping_sub(in0) >= 1,
            _ => false,
        }
    }
}

/// The `SOCK_DIAG_BY_FAMILY` dump request for `family` (`AF_INET` or `AF_INET6`): TCP,
/// established sockets, with `INET_DIAG_INFO`; `seq` is the netlink sequence number.
pub fn dump_request(family: u8, seq: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + 56);
    let len: u32 = 16 + 56;
    b.extend_from_slice(&len.to_ne_bytes());
    b.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    // NLM_F_REQUEST | NLM_F_DUMP.
    b.extend_from_slice(&(0x1u16 | 0x300).to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    // struct inet_diag_req_v2: family, protocol (IPPROTO_TCP), ext (1 << (INET_DIAG_INFO - 1)),
    // pad, states, then a zero inet_diag_sockid (48 bytes).
    b.extend_from_slice(&[family, 6, 1 << (INET_DIAG_INFO - 1), 0]);
    b.extend_from_slice(&(1u32 << TCP_ESTABLISHED).to_ne_bytes());
    b.extend_from_slice(&[0u8; 48]);
    b
}

/// The `SOCK_DIAG_BY_FAMILY` request for the one socket at `key` (no dump: the kernel looks
/// it up in its hash tables, `inet_diag_find_one_icsk`, instead of walking every TCP socket
/// of the machine), with `INET_DIAG_INFO`. Its reply is one `inet_diag_msg`, or an
/// `NLMSG_ERROR` (`ENOENT` once the socket is gone), read with [`parse_dump`].
pub fn lookup_request(key: &DiagKey, seq: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + 56);
    let len: u32 = 16 + 56;
    b.extend_from_slice(&len.to_ne_bytes());
    b.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    // NLM_F_REQUEST.
    b.extend_from_slice(&0x1u16.to_ne_bytes());
    b.extend_from_slice(&seq.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&[key.family, 6, 1 << (INET_DIAG_INFO - 1), 0]);
    b.extend_from_slice(&u32::MAX.to_ne_bytes());
    b.extend_from_slice(&key.id);
    b
}

/// What one `recv` of the dump held: its sockets, and whether the dump is over (`NLMSG_DONE`).
///
/// # Errors
/// An `NLMSG_ERROR` reply (its errno, positive), or a malformed message.
pub fn parse_dump(buf: &[u8]) -> Result<(Vec<TcpSock>, bool), i32> {
    let u16_at = |b: &[u8], o: usize| b.get(o..o + 2).map(|s| u16::from_ne_bytes([s[0], s[1]]));
    let u32_at = |b: &[u8], o: usize| {
        b.get(o..o + 4)
            .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
    };
    let mut out = Vec::new();
    let mut off = 0;
    while off + 16 <= buf.len() {
        let len = u32_at(buf, off).ok_or(libc::EBADMSG)? as usize;
        let kind = u16_at(buf, off + 4).ok_or(libc::EBADMSG)?;
        if len < 16 || off + len > buf.len() {
            return Err(libc::EBADMSG);
        }
        let msg = &buf[off + 16..off + len];
        match kind {
            NLMSG_DONE => return Ok((out, true)),
            NLMSG_ERROR => {
                let e = u32_at(msg, 0).ok_or(libc::EBADMSG)? as i32;
                return Err(if e < 0 { -e } else { libc::EBADMSG });
            }
            SOCK_DIAG_BY_FAMILY => {
                if let Some(s) = parse_diag_msg(msg) {
                    out.push(s);
                }
            }
            _ => {}
        }
        off += (len + 3) & !3;
    }
    Ok((out, false))
}

/// One `struct inet_diag_msg` (72 bytes: state at 1, `idiag_rqueue` at 56, `idiag_wqueue` at
/// 60, inode at 68) and its attributes.
fn parse_diag_msg(msg: &[u8]) -> Option<TcpSock> {
    let u32_at = |b: &[u8], o: usize| {
        b.get(o..o + 4)
            .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
    };
    if *msg.get(1)? != TCP_ESTABLISHED {
        return None;
    }
    let inode = u32_at(msg, 68)?;
    let key = DiagKey {
        family: *msg.first()?,
        id: msg.get(4..52)?.try_into().ok()?,
    };
    let mut off = 72;
    while off + 4 <= msg.len() {
        let len = u16::from_ne_bytes([msg[off], msg[off + 1]]) as usize;
        let kind = u16::from_ne_bytes([msg[off + 2], msg[off + 3]]);
        if len < 4 || off + len > msg.len() {
            return None;
        }
        if kind == INET_DIAG_INFO {
            let info = &msg[off + 4..off + len];
            return Some(TcpSock {
                inode,
                key,
                last_data_sent_ms: u32_at(info, LAST_DATA_SENT)?,
                last_data_recv_ms: u32_at(info, LAST_DATA_RECV)?,
                last_ack_recv_ms: u32_at(info, LAST_ACK_RECV)?,
                data_segs: u32_at(info, DATA_SEGS_IN).zip(u32_at(info, DATA_SEGS_OUT)),
                rqueue: u32_at(msg, 56)?,
                wqueue: u32_at(msg, 60)?,
            });
        }
        off += (len + 3) & !3;
    }
    None
}

/// Judges gcsfuse's sockets sample by sample, each against its own previous sample
/// ([`TcpSock::awaiting`]).
#[derive(Debug, Default)]
pub struct Judge {
    seen: HashMap<u32, Seen>,
}

impl Judge {
    /// The sockets of `socks` whose inode is in `owned` (gcsfuse's) that wait for an answer
    /// (unbroken ties held `tie_hold_ms`); each verdict is kept for the next sample, and
    /// sockets no longer in the dump are forgotten.
    pub fn waiting(&mut self, socks: &[TcpSock], owned: &[u32], tie_hold_ms: u32) -> Vec<TcpSock> {
        let mut seen = HashMap::with_capacity(owned.len());
        let mut waiting = Vec::new();
        for s in socks.iter().filter(|s| owned.contains(&s.inode)) {
            let awaiting = s.awaiting(self.seen.get(&s.inode).copied(), tie_hold_ms);
            seen.insert(
                s.inode,
                Seen {
                    awaiting,
                    data_segs: s.data_segs,
                },
            );
            if awaiting {
                waiting.push(*s);
            }
        }
        self.seen = seen;
        waiting
    }
}

/// The socket inodes among the targets of `/proc/PID/fd/*` (`socket:[INODE]`).
pub fn socket_inodes<'a>(links: impl IntoIterator<Item = &'a str>) -> Vec<u32> {
    links
        .into_iter()
        .filter_map(|l| l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A netlink message of `kind` with `payload`, padded to 4 bytes.
    fn nlmsg(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&[0; 10]);
        b.extend_from_slice(payload);
        while b.len() % 4 != 0 {
            b.push(0);
        }
        b
    }

    /// An `inet_diag_msg` for an established socket with its `INET_DIAG_INFO`.
    fn diag(inode: u32, state: u8, sent: u32, recv: u32) -> Vec<u8> {
        diag_full(inode, state, (sent, recv, recv), None)
    }

    /// [`diag`] with the last ACK received `ack` ms ago and, when `segs` is given, a
    /// `tcp_info` long enough to hold the data segment counts (Linux 4.6+) holding them.
    fn diag_full(
        inode: u32,
        state: u8,
        (sent, recv, ack): (u32, u32, u32),
        segs: Option<(u32, u32)>,
    ) -> Vec<u8> {
        let mut m = vec![0u8; 72];
        m[0] = 2;
        m[1] = state;
        m[68..72].copy_from_slice(&inode.to_ne_bytes());
        let mut info = vec![0u8; if segs.is_some() { 248 } else { 104 }];
        info[LAST_DATA_SENT..LAST_DATA_SENT + 4].copy_from_slice(&sent.to_ne_bytes());
        info[LAST_DATA_RECV..LAST_DATA_RECV + 4].copy_from_slice(&recv.to_ne_bytes());
        info[LAST_ACK_RECV..LAST_ACK_RECV + 4].copy_from_slice(&ack.to_ne_bytes());
        if let Some((i, o)) = segs {
            info[DATA_SEGS_IN..DATA_SEGS_IN + 4].copy_from_slice(&i.to_ne_bytes());
            info[DATA_SEGS_OUT..DATA_SEGS_OUT + 4].copy_from_slice(&o.to_ne_bytes());
        }
        // Another attribute first (INET_DIAG_MEMINFO-like), then the info.
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&1u16.to_ne_bytes());
        m.extend_from_slice(&[0; 4]);
        m.extend_from_slice(&((4 + info.len()) as u16).to_ne_bytes());
        m.extend_from_slice(&INET_DIAG_INFO.to_ne_bytes());
        m.extend_from_slice(&info);
        m
    }

    fn sock(sent: u32, recv: u32, ack: u32, segs: Option<(u32, u32)>) -> TcpSock {
        TcpSock {
            inode: 1,
            key: DiagKey {
                family: 2,
                id: [0; 48],
            },
            last_data_sent_ms: sent,
            last_data_recv_ms: recv,
            last_ack_recv_ms: ack,
            data_segs: segs,
            rqueue: 0,
            wqueue: 0,
        }
    }

    /// Bytes queued on a socket (an answer not yet read, a request not yet acknowledged) wait,
    /// whatever its times say; the dump carries them in the `inet_diag_msg` itself.
    #[test]
    fn queued_bytes_are_work_in_flight() {
        let idle = sock(900, 3, 3, Some((5, 5)));
        assert!(!idle.awaiting(None, 0));
        let unread = TcpSock {
            rqueue: 120,
            ..idle
        };
        let unacked = TcpSock {
            wqueue: 4096,
            ..idle
        };
        assert!(unread.awaiting(None, 0) && unacked.awaiting(None, 0));
        let mut m = diag_full(7, TCP_ESTABLISHED, (900, 3, 3), Some((5, 5)));
        m[56..60].copy_from_slice(&120u32.to_ne_bytes());
        m[60..64].copy_from_slice(&4096u32.to_ne_bytes());
        let (socks, _) = parse_dump(&nlmsg(SOCK_DIAG_BY_FAMILY, &m)).unwrap();
        assert_eq!(
            socks,
            [TcpSock {
                inode: 7,
                rqueue: 120,
                wqueue: 4096,
                ..idle
            }]
        );
    }

    /// The dump gives each socket's family and `inet_diag_sockid`; the lookup asks for that
    /// socket alone (no `NLM_F_DUMP`), with the id and its cookie as given.
    #[test]
    fn a_socket_of_the_dump_is_looked_up_again_by_its_id() {
        let mut m = diag_full(21, TCP_ESTABLISHED, (900, 3, 3), Some((5, 5)));
        m[0] = 10;
        for (i, b) in m[4..52].iter_mut().enumerate() {
            *b = i as u8 + 1;
        }
        let (socks, _) = parse_dump(&nlmsg(SOCK_DIAG_BY_FAMILY, &m)).unwrap();
        let key = socks[0].key;
        assert_eq!(key.family, 10);
        assert_eq!(&key.id[..], &m[4..52]);
        let req = lookup_request(&key, 7);
        assert_eq!(req.len(), 72);
        assert_eq!(u32::from_ne_bytes(req[0..4].try_into().unwrap()), 72);
        assert_eq!(
            u16::from_ne_bytes(req[4..6].try_into().unwrap()),
            SOCK_DIAG_BY_FAMILY
        );
        assert_eq!(u16::from_ne_bytes(req[6..8].try_into().unwrap()), 0x1);
        assert_eq!(u32::from_ne_bytes(req[8..12].try_into().unwrap()), 7);
        assert_eq!(&req[16..20], &[10, 6, 1 << (INET_DIAG_INFO - 1), 0]);
        assert_eq!(&req[24..72], &m[4..52]);
        // The dump request differs in its flags (a dump) and its zero id.
        let dump = dump_request(10, 7);
        assert_eq!(u16::from_ne_bytes(dump[6..8].try_into().unwrap()), 0x301);
        assert_eq!(&dump[24..72], &[0u8; 48][..]);
        // The lookup's reply when the socket is gone.
        let gone = nlmsg(NLMSG_ERROR, &(-libc::ENOENT).to_ne_bytes());
        assert_eq!(parse_dump(&gone), Err(libc::ENOENT));
    }

    #[test]
    fn parses_a_dump_and_tells_a_request_waiting_for_its_answer() {
        let mut buf = nlmsg(SOCK_DIAG_BY_FAMILY, &diag(11, TCP_ESTABLISHED, 5, 900));
        buf.extend(nlmsg(
            SOCK_DIAG_BY_FAMILY,
            &diag_full(12, TCP_ESTABLISHED, (40_000, 39_990, 39_990), Some((7, 9))),
        ));
        buf.extend(nlmsg(SOCK_DIAG_BY_FAMILY, &diag(13, 8, 1, 2)));
        let (socks, done) = parse_dump(&buf).unwrap();
        assert!(!done);
        assert_eq!(socks.len(), 2, "{socks:?}");
        assert_eq!(
            (socks[0].data_segs, socks[1].data_segs),
            (None, Some((7, 9)))
        );
        assert!(socks[0].awaiting(None, 0) && !socks[1].awaiting(None, 0));
        let mut judge = Judge::default();
        assert_eq!(judge.waiting(&socks, &[11], 0), [socks[0]]);
        assert!(judge.waiting(&socks, &[12, 13], 1_500).is_empty());
        let mut end = nlmsg(SOCK_DIAG_BY_FAMILY, &diag(14, TCP_ESTABLISHED, 1, 1));
        end.extend(nlmsg(NLMSG_DONE, &[0; 4]));
        assert!(parse_dump(&end).unwrap().1);
        let err = nlmsg(NLMSG_ERROR, &(-libc::EPERM).to_ne_bytes());
        assert_eq!(parse_dump(&err), Err(libc::EPERM));
        assert_eq!(parse_dump(&buf[..30]).unwrap_err(), libc::EBADMSG);
    }

    /// The ages `ss -ti` showed for a request sent in the same 4 ms step as the previous
    /// answer arrived (Python client and server on loopback, the server thinking 1 s):
    /// `lastsnd:160 lastrcv:160 lastack:116` while it thought, and `lastsnd:160 lastrcv:160
    /// lastack:160` when it had answered within the step.
    #[test]
    fn a_tie_is_a_request_waiting_once_its_ack_came_after_it() {
        let hold = tie_hold_ms(500);
        assert_eq!(hold, 1_500);
        assert_eq!((tie_hold_ms(2_000), tie_hold_ms(3_000)), (0, 0));
        let s = |sent, recv, ack| sock(sent, recv, ack, None);
        assert!(
            s(160, 160, 116).awaiting(None, 0),
            "the server's delayed ACK"
        );
        assert!(
            s(48, 48, 48).awaiting(None, hold),
            "an unbroken tie with no history or counts, younger than the hold"
        );
        assert!(
            !s(48, 48, 48).awaiting(None, 0),
            "an unbroken tie, no hold (a window of 2 s)"
        );
        assert!(
            s(1_499, 1_499, 1_499).awaiting(None, hold)
                && !s(1_500, 1_500, 1_500).awaiting(None, hold),
            "an unbroken tie, held {hold} ms"
        );
        assert!(
            !s(2_160, 2_160, 2_200).awaiting(None, hold),
            "the answer's ACK came earlier, the hold over"
        );
        assert!(
            s(5_200, 5_200, 200).awaiting(None, 0),
            "an ACK 5 s after the send"
        );
        assert!(
            !s(20_000, 20_000, 5_000).awaiting(None, hold),
            "a keep-alive probe's ACK, 15 s after the tie"
        );
        assert!(s(3, 900, 900).awaiting(None, 0) && !s(900, 3, 3).awaiting(None, hold));
        let buf = nlmsg(
            SOCK_DIAG_BY_FAMILY,
            &diag_full(7, TCP_ESTABLISHED, (160, 160, 116), None),
        );
        let (socks, _) = parse_dump(&buf).unwrap();
        assert_eq!(
            socks,
            [TcpSock {
                inode: 7,
                ..s(160, 160, 116)
            }]
        );
    }

    /// A young unbroken tie, judged from the socket's previous sample (`Judge`).
    #[test]
    fn a_tie_is_one_exchange_only_from_idle_with_one_segment_sent() {
        let hold = tie_hold_ms(500);
        let idle = |segs| {
            Some(Seen {
                awaiting: false,
                data_segs: Some(segs),
            })
        };
        let tie = |segs| sock(8, 8, 8, Some(segs));
        // Idle, then one request segment and its answer in one step: idle.
        assert!(!tie((11, 21)).awaiting(idle((10, 20)), hold));
        // An answer of several segments is still one exchange.
        assert!(!tie((14, 21)).awaiting(idle((10, 20)), hold));
        // Two segments sent since: a second request may have followed the answer.
        assert!(tie((12, 22)).awaiting(idle((10, 20)), hold));
        // Waiting at the previous sample: the answer came and the next request went out.
        let waiting = Some(Seen {
            awaiting: true,
            data_segs: Some((10, 20)),
        });
        assert!(tie((11, 21)).awaiting(waiting, hold));
        // Nothing received since: not an answer.
        assert!(tie((10, 21)).awaiting(idle((10, 20)), hold));
        // No history: measured from the socket's start, where only a new connection's first
        // exchange is one exchange; no counts (a kernel before 4.6): held.
        assert!(tie((11, 21)).awaiting(None, hold));
        assert!(!tie((1, 1)).awaiting(None, hold));
        assert!(!tie((3, 1)).awaiting(None, hold));
        assert!(tie((1, 2)).awaiting(None, hold));
        assert!(sock(8, 8, 8, None).awaiting(
            Some(Seen {
                awaiting: false,
                data_segs: None
            }),
            hold
        ));
        // Counters wrap.
        assert!(!tie((0, 0)).awaiting(idle((u32::MAX, u32::MAX)), hold));
        // The hold still ends a tie judged waiting.
        assert!(!sock(1_500, 1_500, 1_500, Some((11, 21))).awaiting(waiting, hold));

        // Sample by sample: the verdict of a tie stays while no data moves.
        let mut judge = Judge::default();
        let at = |sent, recv, segs| {
            [TcpSock {
                inode: 9,
                ..sock(sent, recv, sent.min(recv), Some(segs))
            }]
        };
        assert!(
            judge
                .waiting(&at(1_600, 1_600, (10, 20)), &[9], hold)
                .is_empty(),
            "an old tie"
        );
        assert!(
            !judge.waiting(&at(2, 400, (10, 21)), &[9], hold).is_empty(),
            "a request"
        );
        assert!(
            !judge.waiting(&at(40, 40, (11, 21)), &[9], hold).is_empty(),
            "answer and next request"
        );
        assert!(
            !judge.waiting(&at(90, 90, (11, 21)), &[9], hold).is_empty(),
            "still the same tie"
        );
        assert!(
            judge.waiting(&at(140, 20, (12, 21)), &[9], hold).is_empty(),
            "answered"
        );
        assert!(
            judge.waiting(&at(4, 4, (13, 22)), &[9], hold).is_empty(),
            "one exchange in a step"
        );
        assert!(
            judge.waiting(&at(54, 54, (13, 22)), &[9], hold).is_empty(),
            "the same tie, idle"
        );
        assert!(
            judge.waiting(&at(4, 4, (13, 22)), &[8], hold).is_empty(),
            "not gcsfuse's"
        );
        assert!(
            !judge.waiting(&at(4, 4, (14, 23)), &[9], hold).is_empty(),
            "forgotten: no history"
        );
    }

    #[test]
    fn the_request_and_the_fd_links() {
        let r = dump_request(10, 7);
        assert_eq!(r.len(), 72);
        assert_eq!(u32::from_ne_bytes([r[0], r[1], r[2], r[3]]), 72);
        assert_eq!((r[16], r[17], r[18]), (10, 6, 2));
        assert_eq!(
            socket_inodes(["socket:[123]", "/dev/fuse", "pipe:[9]", "socket:[x]"]),
            [123]
        );
    }
}

//! Whether gcsfuse waits for an answer on one of its TCP connections, from the kernel's
//! `sock_diag` dump (pure: the bytes in, a verdict out; the executor sends the request).
//!
//! gcsfuse talks HTTP/1.1 to Cloud Storage (its default `--client-protocol=http1`): a request,
//! then its response, on a connection. While an upload waits for the server's answer (the
//! commit at the end of a `close()`), nothing moves in gcsfuse's I/O counters, but its
//! connection has sent data more recently than it received any: `tcpi_last_data_sent` (ms
//! since) is smaller than `tcpi_last_data_recv`. An idle keep-alive connection has received the
//! last response after its request. [`awaiting_answer`] says whether any of gcsfuse's
//! established connections (by socket inode, from `/proc/PID/fd`) is in the first state.
//!
//! The kernel keeps these times in jiffies (4 ms steps at `HZ=250`), so a request sent in the
//! same step as the previous answer arrived shows a tie, for as long as the server takes to
//! answer it. The server's ACK of that request breaks it ([`TcpSock::awaiting`]) when it
//! arrives in a later step (a delayed ACK, about 40 ms on Linux): `tcpi_last_ack_recv` turns
//! younger than the last data received, while a request answered within the step leaves the
//! last ACK no younger than the answer, which carried it. An immediate ACK in the same step
//! leaves the tie unbroken: that case is the idle window's.

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

/// How long after a tie's last send an ACK may arrive and still count as the server's ACK of
/// that request (ms). Delayed ACKs come within 500 ms (RFC 1122; Linux at most 200 ms); a
/// keep-alive probe's ACK, the only other ACK an idle connection receives, comes no sooner
/// than 15 s after the last data (Go's default keep-alive idle time, gcsfuse's and its
/// server's), and must not make a tie look like a request waiting.
pub const TIE_ACK_MAX_MS: u32 = 5_000;

/// One established TCP socket of the dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSock {
    /// Its inode (as `/proc/PID/fd/N` shows it: `socket:[INODE]`).
    pub inode: u32,
    /// Milliseconds since it last sent data.
    pub last_data_sent_ms: u32,
    /// Milliseconds since it last received data.
    pub last_data_recv_ms: u32,
    /// Milliseconds since it last received an ACK (with data or without).
    pub last_ack_recv_ms: u32,
}

impl TcpSock {
    /// It sent data after the last data it received: a request waits for its answer. When
    /// the last send and the last receive share a timestamp step (a tie), the request waits
    /// if an ACK arrived after that data, and no later than [`TIE_ACK_MAX_MS`] after the send
    /// (the server's ACK of the request, not a keep-alive's). A tie whose ACK also falls in
    /// the same step (an immediate ACK: seen on loopback under load, the final request of a
    /// 96 MiB upload with `lastsnd`, `lastrcv` and `lastack` all 48 ms) still reads as not
    /// waiting: the idle window covers it, up to its length.
    pub fn awaiting(&self) -> bool {
        let (sent, recv, ack) = (
            self.last_data_sent_ms,
            self.last_data_recv_ms,
            self.last_ack_recv_ms,
        );
        sent < recv || (sent == recv && ack < recv && sent - ack <= TIE_ACK_MAX_MS)
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

/// One `struct inet_diag_msg` (72 bytes: state at 1, inode at 68) and its attributes.
fn parse_diag_msg(msg: &[u8]) -> Option<TcpSock> {
    let u32_at = |b: &[u8], o: usize| {
        b.get(o..o + 4)
            .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
    };
    if *msg.get(1)? != TCP_ESTABLISHED {
        return None;
    }
    let inode = u32_at(msg, 68)?;
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
                last_data_sent_ms: u32_at(info, LAST_DATA_SENT)?,
                last_data_recv_ms: u32_at(info, LAST_DATA_RECV)?,
                last_ack_recv_ms: u32_at(info, LAST_ACK_RECV)?,
            });
        }
        off += (len + 3) & !3;
    }
    None
}

/// Whether any socket of `socks` whose inode is in `owned` (gcsfuse's) waits for an answer.
pub fn awaiting_answer(socks: &[TcpSock], owned: &[u32]) -> bool {
    socks
        .iter()
        .any(|s| owned.contains(&s.inode) && s.awaiting())
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
        diag_ack(inode, state, sent, recv, recv)
    }

    /// [`diag`] with the last ACK received `ack` ms ago.
    fn diag_ack(inode: u32, state: u8, sent: u32, recv: u32, ack: u32) -> Vec<u8> {
        let mut m = vec![0u8; 72];
        m[0] = 2;
        m[1] = state;
        m[68..72].copy_from_slice(&inode.to_ne_bytes());
        let mut info = vec![0u8; 104];
        info[LAST_DATA_SENT..LAST_DATA_SENT + 4].copy_from_slice(&sent.to_ne_bytes());
        info[LAST_DATA_RECV..LAST_DATA_RECV + 4].copy_from_slice(&recv.to_ne_bytes());
        info[LAST_ACK_RECV..LAST_ACK_RECV + 4].copy_from_slice(&ack.to_ne_bytes());
        // Another attribute first (INET_DIAG_MEMINFO-like), then the info.
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&1u16.to_ne_bytes());
        m.extend_from_slice(&[0; 4]);
        m.extend_from_slice(&((4 + info.len()) as u16).to_ne_bytes());
        m.extend_from_slice(&INET_DIAG_INFO.to_ne_bytes());
        m.extend_from_slice(&info);
        m
    }

    #[test]
    fn parses_a_dump_and_tells_a_request_waiting_for_its_answer() {
        let mut buf = nlmsg(SOCK_DIAG_BY_FAMILY, &diag(11, TCP_ESTABLISHED, 5, 900));
        buf.extend(nlmsg(
            SOCK_DIAG_BY_FAMILY,
            &diag(12, TCP_ESTABLISHED, 40_000, 39_990),
        ));
        buf.extend(nlmsg(SOCK_DIAG_BY_FAMILY, &diag(13, 8, 1, 2)));
        let (socks, done) = parse_dump(&buf).unwrap();
        assert!(!done);
        assert_eq!(socks.len(), 2, "{socks:?}");
        assert!(socks[0].awaiting() && !socks[1].awaiting());
        assert!(awaiting_answer(&socks, &[11]));
        assert!(!awaiting_answer(&socks, &[12, 13]));
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
        let sock = |sent, recv, ack| TcpSock {
            inode: 1,
            last_data_sent_ms: sent,
            last_data_recv_ms: recv,
            last_ack_recv_ms: ack,
        };
        assert!(sock(160, 160, 116).awaiting(), "the server's delayed ACK");
        assert!(!sock(160, 160, 160).awaiting(), "answered within the step");
        assert!(
            !sock(160, 160, 200).awaiting(),
            "the answer's ACK came earlier"
        );
        assert!(
            sock(5_200, 5_200, 200).awaiting(),
            "an ACK 5 s after the send"
        );
        assert!(
            !sock(20_000, 20_000, 5_000).awaiting(),
            "a keep-alive probe's ACK, 15 s after the tie"
        );
        assert!(sock(3, 900, 900).awaiting() && !sock(900, 3, 3).awaiting());
        let buf = nlmsg(
            SOCK_DIAG_BY_FAMILY,
            &diag_ack(7, TCP_ESTABLISHED, 160, 160, 116),
        );
        let (socks, _) = parse_dump(&buf).unwrap();
        assert_eq!(
            socks,
            [sock(160, 160, 116)].map(|s| TcpSock { inode: 7, ..s })
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

//! Engine tests in the EdenFS FakeFuse style: a SEQPACKET socketpair stands in for
//! `/dev/fuse` (the test plays the kernel on one end) and a scripted fake daemon holds the
//! other end of the relay's socketpair.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{AddressFamily, MsgFlags, SockFlag, SockType, socketpair};

use super::pump::{Handled, SpinPolicy};
use super::*;
use crate::accounting::Outstanding;
use crate::relay::inflight::is_own_unique;
use crate::relay::proto::tests::{reply, request};
use crate::relay::proto::{self, InHeader, Opcode, OutHeader};
use crate::relay::proto::{put_u16, put_u32, u16_at, u32_at};

const T: Duration = Duration::from_secs(5);
/// The poll pump's spin in these tests.
pub(super) const SPIN: Duration = Duration::from_micros(50);

thread_local! {
    /// The pump mode of the relays this test thread starts ([`with_pump`]).
    static PUMP: std::cell::Cell<PumpMode> = const { std::cell::Cell::new(PumpMode::Threads) };
}

/// The pump mode of the relays this test thread starts.
pub(super) fn pump() -> PumpMode {
    PUMP.with(|p| p.get())
}

/// Runs `test` with relays started in `mode`.
pub(super) fn with_pump(mode: PumpMode, test: fn()) {
    PUMP.with(|p| p.set(mode));
    test();
}

/// Makes each named test function a test run with each pump mode, in the modules
/// `threads_pump` and `poll_pump`.
macro_rules! both_pumps {
    ($($name:ident),* $(,)?) => {
        mod threads_pump {
            $(
                #[test]
                fn $name() {
                    $crate::relay::engine::tests::with_pump(
                        $crate::relay::engine::PumpMode::Threads,
                        super::$name,
                    );
                }
            )*
        }
        mod poll_pump {
            $(
                #[test]
                fn $name() {
                    $crate::relay::engine::tests::with_pump(
                        $crate::relay::engine::PumpMode::Poll {
                            spin: $crate::relay::engine::tests::SPIN,
                        },
                        super::$name,
                    );
                }
            )*
        }
    };
}
pub(super) use both_pumps;

pub(super) struct Harness {
    pub(super) kernel: OwnedFd,
    pub(super) daemon: Option<OwnedFd>,
    pub(super) relay: Arc<Relay>,
    events: mpsc::Receiver<EngineEvent>,
}

fn pair() -> (OwnedFd, OwnedFd) {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .unwrap()
}

pub(super) fn start_with(limits: Limits) -> Harness {
    let (k_test, k_relay) = pair();
    let (d_relay, d_test) = pair();
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let (relay, _threads) = Relay::start(
        k_relay,
        d_relay,
        limits,
        pump(),
        Accounting::new(),
        move |ev| {
            let _ = tx.lock().unwrap().send(ev);
        },
    )
    .unwrap();
    Harness {
        kernel: k_test,
        daemon: Some(d_test),
        relay,
        events: rx,
    }
}

fn start() -> Harness {
    start_with(Limits::from_sndbufs(425_984, 425_984, init::MAX_CAP))
}

/// One message from `fd` within `T`, or `None` on timeout; `Some(vec![])` is EOF.
pub(super) fn recv_within(fd: &OwnedFd, t: Duration) -> Option<Vec<u8>> {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    let n = poll(
        &mut fds,
        PollTimeout::try_from(t.as_millis() as i32).unwrap(),
    )
    .unwrap();
    if n == 0 {
        return None;
    }
    let mut buf = vec![0u8; 1 << 21];
    let n = nix::sys::socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap();
    buf.truncate(n);
    Some(buf)
}

pub(super) fn recv(fd: &OwnedFd) -> Vec<u8> {
    recv_within(fd, T).expect("no message within 5 s")
}

pub(super) fn send(fd: &OwnedFd, msg: &[u8]) {
    nix::sys::socket::send(fd.as_raw_fd(), msg, MsgFlags::empty()).unwrap();
}

impl Harness {
    pub(super) fn d(&self) -> &OwnedFd {
        self.daemon.as_ref().unwrap()
    }

    pub(super) fn event(&self) -> EngineEvent {
        self.events.recv_timeout(T).expect("no engine event")
    }

    /// The relay's counters once `f` holds of them, or after `T` whatever they are: a counter
    /// is bumped after the message it counts went on, so the thread that moved it may still
    /// be between the two when the test sees the message.
    pub(super) fn wait_counters(
        &self,
        f: impl Fn(&crate::relay::inflight::Counters) -> bool,
    ) -> crate::relay::inflight::Counters {
        settle(|| self.relay.counters(), f)
    }

    pub(super) fn wait_outstanding(&self, f: impl Fn(&Outstanding) -> bool) -> Outstanding {
        settle(|| self.relay.outstanding(), f)
    }
}

/// `read()` once `f` holds of it, or after `T` whatever it is.
fn settle<V>(read: impl Fn() -> V, f: impl Fn(&V) -> bool) -> V {
    let deadline = Instant::now() + T;
    loop {
        let v = read();
        if f(&v) || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

pub(super) fn unique_of(m: &[u8]) -> u64 {
    proto::u64_at(m, 8).unwrap()
}

pub(super) fn init_in(flags: u32, flags2: u32) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    put_u32(&mut b, 0, 7);
    put_u32(&mut b, 4, 44);
    put_u32(&mut b, 8, 1 << 20);
    put_u32(&mut b, 12, flags);
    put_u32(&mut b, 16, flags2);
    b
}

pub(super) fn init_out(max_write: u32, flags: u32, max_pages: u16) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    put_u32(&mut b, 0, 7);
    put_u32(&mut b, 4, 34);
    put_u32(&mut b, 12, flags);
    put_u32(&mut b, 20, max_write);
    put_u16(&mut b, 28, max_pages);
    b
}

fn init_is_rewritten_both_ways() {
    let h = start_with(Limits::from_sndbufs(
        128 * 1024 + 4096 + 32,
        1 << 20,
        init::MAX_CAP,
    ));
    let passthrough = 1 << 5;
    send(
        &h.kernel,
        &request(
            26,
            2,
            0,
            &init_in(init::FUSE_INIT_EXT, passthrough | (1 << 9) | 1),
        ),
    );
    let got = recv(h.d());
    assert_eq!(
        u32_at(&got, 40 + 16),
        Some(1),
        "passthrough/io_uring masked"
    );
    assert_eq!(u32_at(&got, 40 + 4), Some(44), "minor untouched");
    send(
        h.d(),
        &reply(2, 0, &init_out(1 << 20, init::FUSE_MAX_PAGES, 256)),
    );
    let r = recv(&h.kernel);
    assert_eq!(u32_at(&r, 16 + 20), Some(128 * 1024));
    assert_eq!(u16_at(&r, 16 + 28), Some(32));
    assert_eq!(u32_at(&r, 16 + 4), Some(34));
    match h.event() {
        EngineEvent::Initialized(c) => assert_eq!(c.max_write, 128 * 1024),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.relay.init_caps().unwrap().max_pages, 32);
    assert_eq!(h.wait_outstanding(|o| o.in_flight == 0).in_flight, 0);
}

fn init_fails_loudly_when_the_socket_is_too_small() {
    let h = start_with(Limits::from_sndbufs(8000, 8000, init::MAX_CAP));
    assert_eq!(h.relay.limits().cap, None);
    send(&h.kernel, &request(26, 2, 0, &init_in(0, 0)));
    let r = recv(&h.kernel);
    let oh = OutHeader::parse(&r).unwrap();
    assert_eq!((oh.unique, oh.error), (2, -libc::EIO));
    assert_eq!(h.event(), EngineEvent::InitFailed);
    assert_eq!(recv_within(h.d(), Duration::from_millis(50)), None);
}

fn order_is_preserved_and_interrupt_replies_do_not_complete() {
    let h = start();
    // LOOKUP, READ, INTERRUPT(READ), FORGET, in kernel order.
    send(&h.kernel, &request(1, 2, 1, b"name\0"));
    send(&h.kernel, &request(15, 4, 5, &[0; 40]));
    send(&h.kernel, &request(36, 5, 0, &4u64.to_le_bytes()));
    send(&h.kernel, &request(2, 6, 5, &1u64.to_le_bytes()));
    let seen: Vec<(u32, u64)> = (0..4)
        .map(|_| {
            let m = recv(h.d());
            (u32_at(&m, 4).unwrap(), unique_of(&m))
        })
        .collect();
    assert_eq!(seen, vec![(1, 2), (15, 4), (36, 5), (2, 6)]);
    let o = h.wait_outstanding(|o| o.in_flight == 2);
    assert_eq!(
        o.in_flight, 2,
        "LOOKUP and READ; INTERRUPT and FORGET are not in flight"
    );
    // The daemon asks the kernel to retry the interrupt: passed through, READ still in flight.
    send(h.d(), &reply(5, -libc::EAGAIN, &[]));
    let r = recv(&h.kernel);
    assert_eq!(unique_of(&r), 5);
    assert_eq!(h.relay.outstanding().in_flight, 2);
    send(h.d(), &reply(2, -libc::ENOENT, &[]));
    send(h.d(), &reply(4, 0, b"data"));
    assert_eq!(unique_of(&recv(&h.kernel)), 2);
    let r = recv(&h.kernel);
    assert_eq!((unique_of(&r), &r[16..]), (4, &b"data"[..]));
    assert_eq!(h.wait_outstanding(|o| o.in_flight == 0).in_flight, 0);
    let c = h.wait_counters(|c| (c.interrupt_replies, c.replies, c.forgets) == (1, 2, 1));
    assert_eq!((c.interrupt_replies, c.replies, c.forgets), (1, 2, 1));
}

fn in_flight_counts_and_handles() {
    let h = start();
    let mut open = (libc::O_WRONLY as u32).to_le_bytes().to_vec();
    open.extend_from_slice(&[0; 4]);
    send(&h.kernel, &request(14, 2, 7, &open));
    recv(h.d());
    let mut out = 9u64.to_le_bytes().to_vec();
    out.extend_from_slice(&[0; 8]);
    send(h.d(), &reply(2, 0, &out));
    recv(&h.kernel);
    let o = h.wait_outstanding(|o| o.in_flight == 0);
    assert_eq!(o.open_write, 1);
    let mut flush = 9u64.to_le_bytes().to_vec();
    flush.extend_from_slice(&[0; 16]);
    send(&h.kernel, &request(25, 4, 7, &flush));
    send(&h.kernel, &request(20, 6, 7, &flush[..16]));
    recv(h.d());
    recv(h.d());
    let o = h.relay.outstanding();
    assert_eq!(o.in_flight, 2);
    assert_eq!(h.relay.in_flight(), 2);
    assert!(!o.is_idle());
    for u in [4, 6] {
        send(h.d(), &reply(u, 0, &[]));
        recv(&h.kernel);
    }
    // RELEASE removes the handle at the request; the FLUSH covered the open, so it goes
    // straight to the daemon.
    let mut rel = 9u64.to_le_bytes().to_vec();
    rel.extend_from_slice(&(libc::O_WRONLY as u32).to_le_bytes());
    rel.extend_from_slice(&[0; 12]);
    send(&h.kernel, &request(18, 8, 7, &rel));
    assert_eq!(unique_of(&recv(h.d())), 8);
    assert_eq!(h.relay.outstanding().open_write, 0);
    send(h.d(), &reply(8, 0, &[]));
    recv(&h.kernel);
    assert!(h.wait_outstanding(|o| o.is_idle()).is_idle());
}

fn door_answers_eshutdown_without_forwarding() {
    let h = start();
    h.relay.close_door();
    for (op, u) in [(14u32, 2u64), (35, 4), (9, 6), (12, 8), (45, 10), (13, 12)] {
        send(&h.kernel, &request(op, u, 1, &[0; 16]));
        let r = recv(&h.kernel);
        let oh = OutHeader::parse(&r).unwrap();
        assert_eq!((oh.unique, oh.error, oh.len), (u, -libc::ESHUTDOWN, 16));
    }
    assert_eq!(recv_within(h.d(), Duration::from_millis(50)), None);
    // Other requests still reach the daemon.
    send(&h.kernel, &request(3, 14, 1, &[0; 16]));
    assert_eq!(unique_of(&recv(h.d())), 14);
    assert_eq!(h.relay.counters().door_refused, 6);
}

fn notifications_pass_through_and_batch_forget_is_not_counted() {
    let h = start();
    // NOTIFY_INVAL_ENTRY (code 3) from the daemon: unique 0, error = code.
    send(h.d(), &reply(0, 3, &[0; 24]));
    let r = recv(&h.kernel);
    assert_eq!((unique_of(&r), r.len()), (0, 40));
    let mut body = 3u32.to_le_bytes().to_vec();
    body.extend_from_slice(&[0; 4]);
    body.extend_from_slice(&[1; 48]);
    send(&h.kernel, &request(42, 2, 0, &body));
    assert_eq!(u32_at(&recv(h.d()), 4), Some(42));
    let o = h.wait_outstanding(|o| o.in_flight == 0);
    assert_eq!(o.in_flight, 0);
    let c = h.wait_counters(|c| (c.notifications, c.forgets) == (1, 1));
    assert_eq!((c.notifications, c.forgets), (1, 1));
}

fn daemon_eof_answers_everything_in_flight_with_eio() {
    let mut h = start();
    send(&h.kernel, &request(15, 2, 5, &[0; 40]));
    send(&h.kernel, &request(25, 4, 5, &[0; 24]));
    recv(h.d());
    recv(h.d());
    drop(h.daemon.take());
    let mut got: Vec<(u64, i32)> = (0..2)
        .map(|_| {
            let oh = OutHeader::parse(&recv(&h.kernel)).unwrap();
            (oh.unique, oh.error)
        })
        .collect();
    got.sort();
    assert_eq!(got, vec![(2, -libc::EIO), (4, -libc::EIO)]);
    assert!(matches!(h.event(), EngineEvent::DaemonEof { .. }));
    // Later requests fail at once.
    send(&h.kernel, &request(3, 6, 1, &[0; 16]));
    let oh = OutHeader::parse(&recv(&h.kernel)).unwrap();
    assert_eq!((oh.unique, oh.error), (6, -libc::EIO));
    assert_eq!(h.wait_outstanding(|o| o.in_flight == 0).in_flight, 0);
}

fn stop_sends_shut_wr_and_keeps_reading_until_eof() {
    let mut h = start();
    send(&h.kernel, &request(25, 2, 5, &[0; 24]));
    assert_eq!(unique_of(&recv(h.d())), 2);
    h.relay.stop();
    // The daemon reads EOF ...
    assert_eq!(recv(h.d()), Vec::<u8>::new());
    // ... a request after SHUT_WR is answered EIO by the relay ...
    send(&h.kernel, &request(3, 4, 1, &[0; 16]));
    let oh = OutHeader::parse(&recv(&h.kernel)).unwrap();
    assert_eq!((oh.unique, oh.error), (4, -libc::EIO));
    // ... and its late reply still reaches the kernel.
    send(h.d(), &reply(2, 0, &[]));
    let oh = OutHeader::parse(&recv(&h.kernel)).unwrap();
    assert_eq!((oh.unique, oh.error), (2, 0));
    assert_eq!(h.wait_outstanding(|o| o.in_flight == 0).in_flight, 0);
    drop(h.daemon.take());
    assert_eq!(h.event(), EngineEvent::DaemonEof { reset: false });
}

fn max_message_caps_below_the_buffers() {
    let l = Limits::from_sndbufs(425_984, 425_984, init::DEFAULT_MAX_MESSAGE);
    assert_eq!((l.cap, l.buffer_cap), (Some(128 * 1024), Some(408 * 1024)));
    // The read buffer follows the cap (and bounds BATCH_FORGET).
    assert_eq!(init::read_buffer(l.cap), 132 * 1024);
    let l = Limits::from_sndbufs(425_984, 425_984, 1 << 20);
    assert_eq!(l.cap, Some(408 * 1024));
    let l = Limits::from_sndbufs(425_984, 425_984, 100_000);
    assert_eq!(l.cap, Some(96 * 1024), "whole pages");
    assert_eq!(Limits::from_sndbufs(8000, 8000, 1 << 20).cap, None);
}

fn init_timeout_answers_the_kernel_eio_and_a_late_reply_is_dropped() {
    let h = start();
    send(&h.kernel, &request(26, 2, 0, &init_in(0, 0)));
    recv(h.d());
    assert!(h.relay.fail_init());
    let oh = OutHeader::parse(&recv(&h.kernel)).unwrap();
    assert_eq!((oh.unique, oh.error), (2, -libc::EIO));
    assert!(!h.relay.fail_init(), "only once");
    assert_eq!(h.wait_outstanding(|o| o.in_flight == 0).in_flight, 0);
    // The daemon's late reply is not for a pending request.
    send(h.d(), &reply(2, 0, &init_out(1 << 20, 0, 0)));
    recv(&h.kernel);
    assert_eq!(
        h.wait_counters(|c| c.unknown_replies == 1).unknown_replies,
        1
    );
    assert_eq!(h.relay.init_caps(), None);
}

fn kernel_gone_releases_handles_and_sends_eof_to_the_daemon() {
    let mut h = start();
    let mut open = (libc::O_WRONLY as u32).to_le_bytes().to_vec();
    open.extend_from_slice(&[0; 4]);
    send(&h.kernel, &request(14, 2, 7, &open));
    recv(h.d());
    send(h.d(), &reply(2, 0, &[0; 16]));
    recv(&h.kernel);
    assert_eq!(h.wait_outstanding(|o| o.open_write == 1).open_write, 1);
    let k = std::mem::replace(&mut h.kernel, pair().0);
    drop(k);
    assert_eq!(h.event(), EngineEvent::KernelGone(Errno::ENODEV));
    assert_eq!(recv(h.d()), Vec::<u8>::new());
    assert!(h.relay.kernel_gone());
    assert!(h.wait_outstanding(Outstanding::is_idle).is_idle());
}

fn kernel_gone_sends_eof_to_the_daemon() {
    let mut h = start();
    let k = std::mem::replace(&mut h.kernel, pair().0);
    drop(k);
    assert_eq!(h.event(), EngineEvent::KernelGone(Errno::ENODEV));
    assert_eq!(recv(h.d()), Vec::<u8>::new());
}

fn malformed_daemon_reply_is_answered_eio() {
    let h = start();
    send(&h.kernel, &request(15, 2, 5, &[0; 40]));
    recv(h.d());
    let mut bad = reply(2, 0, &[0; 8]);
    put_u32(&mut bad, 0, 100);
    send(h.d(), &bad);
    let oh = OutHeader::parse(&recv(&h.kernel)).unwrap();
    assert_eq!((oh.unique, oh.error), (2, -libc::EIO));
    assert_eq!(
        h.wait_counters(|c| c.protocol_errors == 1).protocol_errors,
        1
    );
    assert_eq!(h.wait_outstanding(|o| o.in_flight == 0).in_flight, 0);
}

fn emsgsize_is_answered_eio() {
    // Limits claim more than the socket carries: the send fails with EMSGSIZE.
    let (k_test, k_relay) = pair();
    let (d_relay, d_test) = pair();
    nix::sys::socket::setsockopt(&d_relay, nix::sys::socket::sockopt::SndBuf, &4096).unwrap();
    let (relay, _t) = Relay::start(
        k_relay,
        d_relay,
        Limits::from_sndbufs(1 << 20, 1 << 20, init::MAX_CAP),
        pump(),
        Accounting::new(),
        |_| {},
    )
    .unwrap();
    send(&k_test, &request(16, 2, 5, &vec![0u8; 64 * 1024]));
    let oh = OutHeader::parse(&recv(&k_test)).unwrap();
    assert_eq!((oh.unique, oh.error), (2, -libc::EIO));
    assert_eq!(relay.counters().answered_send_failed, 1);
    assert_eq!(recv_within(&d_test, Duration::from_millis(50)), None);
}

fn replies_keep_flowing_while_the_daemon_does_not_read() {
    // The daemon stops reading requests (its receive queue fills and the relay's send waits)
    // but keeps replying: the replies must still reach the kernel, or a daemon that blocks on
    // its own replies and the relay waiting to send would wait on each other.
    let h = start();
    let kernel = h.kernel.try_clone().unwrap();
    let uniques: Vec<u64> = (1..=12).map(|i| 2 * i).collect();
    let to_send = uniques.clone();
    let sender = std::thread::spawn(move || {
        for u in to_send {
            send(&kernel, &request(16, u, 5, &vec![7u8; 64 * 1024]));
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    for &u in &uniques {
        send(h.d(), &reply(u, -libc::EIO, &[]));
    }
    let mut answered: Vec<u64> = (0..uniques.len())
        .map(|_| {
            // T, not 1 s: a held reply is held for good, and a loaded machine may run the
            // pump late.
            let r = recv_within(&h.kernel, T)
                .expect("a reply was held back while the relay waited to send");
            unique_of(&r)
        })
        .collect();
    answered.sort_unstable();
    assert_eq!(answered, uniques);
    // Now the daemon reads: every request arrives, in the kernel's order.
    let seen: Vec<u64> = (0..uniques.len())
        .map(|_| unique_of(&recv(h.d())))
        .collect();
    assert_eq!(seen, uniques);
    sender.join().unwrap();
}

/// A send the socket refuses with ENOBUFS (a failed skb allocation) is retried until it goes
/// through: every request reaches the daemon once, whole and in the kernel's order, and every
/// reply reaches the kernel; nothing is answered with an error.
fn a_send_refused_with_enobufs_is_retried_and_nothing_is_lost() {
    let h = start();
    h.relay
        .inject_enobufs
        .store(5, std::sync::atomic::Ordering::SeqCst);
    let bodies: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 40 * 1024]).collect();
    for (i, b) in bodies.iter().enumerate() {
        send(&h.kernel, &request(16, 2 * (i as u64 + 1), 5, b));
    }
    for (i, b) in bodies.iter().enumerate() {
        let got = recv(h.d());
        assert_eq!(unique_of(&got), 2 * (i as u64 + 1), "order");
        assert_eq!(InHeader::body(&got), &b[..], "a request arrived changed");
        send(h.d(), &reply(unique_of(&got), 0, &[]));
        let r = OutHeader::parse(&recv(&h.kernel)).unwrap();
        assert_eq!((r.unique, r.error), (2 * (i as u64 + 1), 0));
    }
    assert_eq!(
        h.relay
            .inject_enobufs
            .load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the injected ENOBUFS were not all hit"
    );
    assert_eq!(
        recv_within(h.d(), Duration::from_millis(50)),
        None,
        "a duplicate"
    );
    let c = h.wait_counters(|c| c.replies == 3);
    assert_eq!((c.answered_send_failed, c.replies), (0, 3));
}

fn open_files_are_named_from_the_names_relayed() {
    let h = start();
    let entry = |nodeid: u64| {
        let mut b = vec![0u8; proto::ENTRY_OUT_LEN];
        b[..8].copy_from_slice(&nodeid.to_le_bytes());
        b
    };
    // LOOKUP "dir" in the root -> 5; LOOKUP "f" in 5 -> 9; OPEN 9 for writing -> fh 3.
    send(&h.kernel, &request(1, 2, 1, b"dir\0"));
    send(h.d(), &reply(unique_of(&recv(h.d())), 0, &entry(5)));
    recv(&h.kernel);
    send(&h.kernel, &request(1, 4, 5, b"f\0"));
    send(h.d(), &reply(unique_of(&recv(h.d())), 0, &entry(9)));
    recv(&h.kernel);
    let mut open_in = (libc::O_WRONLY as u32).to_le_bytes().to_vec();
    open_in.extend_from_slice(&[0; 4]);
    send(&h.kernel, &request(14, 6, 9, &open_in));
    let mut open_out = 3u64.to_le_bytes().to_vec();
    open_out.extend_from_slice(&[0; 8]);
    send(h.d(), &reply(unique_of(&recv(h.d())), 0, &open_out));
    recv(&h.kernel);
    // A CREATE of "new" in 5 awaits its reply.
    let mut create_in = vec![0u8; 16];
    create_in[..4].copy_from_slice(&(libc::O_WRONLY as u32).to_le_bytes());
    create_in.extend_from_slice(b"new\0");
    send(&h.kernel, &request(35, 8, 5, &create_in));
    recv(h.d());
    h.wait_outstanding(|o| o.in_flight == 1);
    assert_eq!(
        h.relay.open_paths(10),
        vec![("dir/f".to_string(), crate::accounting::HandleMode::Write)]
    );
    assert_eq!(h.relay.admitted_paths(10), vec!["dir/new".to_string()]);
    // FORGET of both lookups of 5: its children show where the path breaks.
    send(&h.kernel, &request(2, 10, 5, &1u64.to_le_bytes()));
    recv(h.d());
    assert_eq!(h.relay.open_paths(10)[0].0, "<nodeid 5>/f");
}

fn an_invalid_error_value_is_answered_eio() {
    let h = start();
    for (unique, bad) in [(2u64, 7i32), (4, -100_000)] {
        send(&h.kernel, &request(3, unique, 1, &[0; 16]));
        recv(h.d());
        send(h.d(), &reply(unique, bad, &[]));
        let oh = OutHeader::parse(&recv(&h.kernel)).unwrap();
        assert_eq!((oh.unique, oh.error), (unique, -libc::EIO));
    }
    assert_eq!(h.wait_outstanding(|o| o.in_flight == 0).in_flight, 0);
    assert_eq!(
        h.wait_counters(|c| c.protocol_errors == 2).protocol_errors,
        2
    );
}

fn a_refused_init_is_passed_on_and_reported() {
    let h = start();
    send(&h.kernel, &request(26, 2, 0, &init_in(0, 0)));
    recv(h.d());
    send(h.d(), &reply(2, -libc::ENOSYS, &[]));
    let oh = OutHeader::parse(&recv(&h.kernel)).unwrap();
    assert_eq!((oh.unique, oh.error), (2, -libc::ENOSYS));
    assert_eq!(h.event(), EngineEvent::InitRefused(libc::ENOSYS));
    assert_eq!(h.wait_outstanding(|o| o.in_flight == 0).in_flight, 0);
}

#[test]
fn spin_policy_stops_spinning_on_a_slow_daemon_and_retries() {
    let mut p = SpinPolicy::default();
    // After a reply: always spin.
    p.handled(Handled::Reply, false);
    assert!(p.spin_now());
    // Requests whose replies come while spinning: keep spinning.
    for _ in 0..5 {
        p.handled(Handled::Request, false);
        assert!(p.spin_now());
        p.handled(Handled::Reply, true);
    }
    // Two spins after a request run out: stop spinning after requests...
    for _ in 0..SpinPolicy::MISSES {
        p.handled(Handled::Request, false);
        assert!(p.spin_now());
        p.spun_out();
        p.handled(Handled::Reply, false);
    }
    let mut spun = 0;
    for _ in 0..(2 * SpinPolicy::RETRY_EVERY) {
        p.handled(Handled::Request, false);
        if p.spin_now() {
            spun += 1;
            p.spun_out();
        }
        p.handled(Handled::Reply, false);
        // ...but never after replies.
        assert!(p.spin_now());
    }
    assert_eq!(
        spun,
        2,
        "one retry per {} requests",
        SpinPolicy::RETRY_EVERY
    );
    // A retry that catches the reply turns spinning back on.
    loop {
        p.handled(Handled::Request, false);
        if p.spin_now() {
            break;
        }
        p.handled(Handled::Reply, false);
    }
    p.handled(Handled::Reply, true);
    p.handled(Handled::Request, false);
    assert!(p.spin_now());
}

/// OPEN of `fh` for writing through the harness: request, daemon's reply, kernel's reply.
fn open_write(h: &Harness, unique: u64, fh: u64) {
    let mut open = (libc::O_WRONLY as u32).to_le_bytes().to_vec();
    open.extend_from_slice(&[0; 4]);
    send(&h.kernel, &request(14, unique, 7, &open));
    recv(h.d());
    let mut out = fh.to_le_bytes().to_vec();
    out.extend_from_slice(&[0; 8]);
    send(h.d(), &reply(unique, 0, &out));
    recv(&h.kernel);
}

/// A RELEASE request body for `fh` opened O_WRONLY.
fn release_write(fh: u64) -> Vec<u8> {
    let mut rel = fh.to_le_bytes().to_vec();
    rel.extend_from_slice(&(libc::O_WRONLY as u32).to_le_bytes());
    rel.extend_from_slice(&[0; 12]);
    rel
}

fn a_release_with_changes_no_flush_covered_is_preceded_by_an_own_fsync() {
    let h = start();
    open_write(&h, 2, 9);
    // close(): FLUSH covers the open.
    let mut fh9 = 9u64.to_le_bytes().to_vec();
    fh9.extend_from_slice(&[0; 16]);
    send(&h.kernel, &request(25, 4, 7, &fh9));
    recv(h.d());
    send(h.d(), &reply(4, 0, &[]));
    recv(&h.kernel);
    // A WRITE after the last FLUSH (a mapping written after close, then munmap).
    let mut write = 9u64.to_le_bytes().to_vec();
    write.extend_from_slice(&[0; 32]);
    send(&h.kernel, &request(16, 6, 7, &write));
    recv(h.d());
    send(h.d(), &reply(6, 0, &[0; 8]));
    recv(&h.kernel);
    send(&h.kernel, &request(18, 8, 7, &release_write(9)));
    // The daemon gets an FSYNC of the relay's own first, of the same handle and nodeid.
    let fsync = recv(h.d());
    let fh = InHeader::parse(&fsync).unwrap();
    assert_eq!((fh.opcode, fh.nodeid), (Opcode::Fsync, 7));
    assert!(is_own_unique(fh.unique));
    assert_eq!(proto::u64_at(&fsync, proto::IN_HEADER_LEN), Some(9));
    assert!(recv_within(h.d(), Duration::from_millis(100)).is_none());
    assert_eq!(h.relay.outstanding().in_flight, 2, "RELEASE and FSYNC");
    // Its reply goes nowhere; then the RELEASE is forwarded.
    send(h.d(), &reply(fh.unique, 0, &[]));
    assert_eq!(unique_of(&recv(h.d())), 8);
    assert!(recv_within(&h.kernel, Duration::from_millis(100)).is_none());
    send(h.d(), &reply(8, 0, &[]));
    assert_eq!(unique_of(&recv(&h.kernel)), 8);
    assert!(h.wait_outstanding(|o| o.is_idle()).is_idle());
    assert!(h.relay.failed_flushes().is_empty());
    assert_eq!(h.wait_counters(|c| c.relay_fsyncs == 1).relay_fsyncs, 1);

    // The same with the FSYNC failing: a failed flush; the RELEASE still goes on.
    open_write(&h, 10, 11);
    let mut write = 11u64.to_le_bytes().to_vec();
    write.extend_from_slice(&[0; 32]);
    send(&h.kernel, &request(16, 12, 7, &write));
    recv(h.d());
    send(h.d(), &reply(12, 0, &[0; 8]));
    recv(&h.kernel);
    send(&h.kernel, &request(18, 14, 7, &release_write(11)));
    let fsync = recv(h.d());
    send(h.d(), &reply(unique_of(&fsync), -libc::EIO, &[]));
    assert_eq!(unique_of(&recv(h.d())), 14);
    send(h.d(), &reply(14, 0, &[]));
    assert_eq!(unique_of(&recv(&h.kernel)), 14);
    assert!(h.wait_outstanding(|o| o.is_idle()).is_idle());
    assert_eq!(h.relay.failed_flushes().len(), 1);
}

fn an_open_answered_enosys_gets_a_handle_of_the_relay() {
    let h = start();
    let mut open = (libc::O_WRONLY as u32).to_le_bytes().to_vec();
    open.extend_from_slice(&[0; 4]);
    send(&h.kernel, &request(14, 2, 7, &open));
    recv(h.d());
    send(h.d(), &reply(2, -libc::ENOSYS, &[]));
    // The kernel gets a successful OPEN with fh 0 instead of ENOSYS (its no-open mode).
    let r = recv(&h.kernel);
    let oh = OutHeader::parse(&r).unwrap();
    assert_eq!((oh.unique, oh.error, r.len()), (2, 0, 32));
    assert_eq!(proto::u64_at(&r, 16), Some(0));
    let o = h.wait_outstanding(|o| o.in_flight == 0);
    assert_eq!(o.open_write, 1, "the writer counts");
    // FLUSH of fh 0 reaches the daemon; RELEASE is answered by the relay.
    let mut fh0 = vec![0u8; 24];
    fh0[..8].copy_from_slice(&0u64.to_le_bytes());
    send(&h.kernel, &request(25, 4, 7, &fh0));
    assert_eq!(unique_of(&recv(h.d())), 4);
    send(h.d(), &reply(4, 0, &[]));
    recv(&h.kernel);
    send(&h.kernel, &request(18, 6, 7, &release_write(0)));
    let r = recv(&h.kernel);
    let oh = OutHeader::parse(&r).unwrap();
    assert_eq!((oh.unique, oh.error), (6, 0));
    assert!(recv_within(h.d(), Duration::from_millis(100)).is_none());
    assert!(h.wait_outstanding(|o| o.is_idle()).is_idle());
    assert_eq!(h.wait_counters(|c| c.opens_answered == 1).opens_answered, 1);
}

/// A notifier held in a write (here: the stand-in kernel's socket is full; in the kernel: a
/// folio a READ holds) is waited for by `end_notifications`, and what is still queued is then
/// dropped instead of written: drainfs never exits with its notifier inside the kernel.
fn end_notifications_waits_for_the_write_in_progress_and_drops_the_rest() {
    let h = start();
    let sent = 2000;
    for _ in 0..sent {
        send(h.d(), &reply(0, 3, &[0; 24]));
    }
    // The stand-in kernel reads nothing yet: the notifier's write is held.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !h.relay.end_notifications(Duration::from_millis(200)),
        "the notifier cannot have ended while its write is held"
    );
    // The kernel takes what was written; the held write completes, the rest is dropped.
    let mut got = 0;
    while recv_within(&h.kernel, Duration::from_millis(300)).is_some_and(|m| !m.is_empty()) {
        got += 1;
    }
    assert!(h.relay.end_notifications(T), "the notifier did not end");
    let c = h.relay.counters();
    assert!(got < sent, "every notification was written ({got})");
    assert_eq!(
        c.notifications + c.notifications_dropped,
        sent as u64,
        "{c:?}"
    );
    assert!(c.notifications_dropped > 0, "{c:?}");
}

both_pumps!(
    a_send_refused_with_enobufs_is_retried_and_nothing_is_lost,
    init_is_rewritten_both_ways,
    init_fails_loudly_when_the_socket_is_too_small,
    order_is_preserved_and_interrupt_replies_do_not_complete,
    in_flight_counts_and_handles,
    door_answers_eshutdown_without_forwarding,
    notifications_pass_through_and_batch_forget_is_not_counted,
    daemon_eof_answers_everything_in_flight_with_eio,
    stop_sends_shut_wr_and_keeps_reading_until_eof,
    max_message_caps_below_the_buffers,
    init_timeout_answers_the_kernel_eio_and_a_late_reply_is_dropped,
    kernel_gone_releases_handles_and_sends_eof_to_the_daemon,
    kernel_gone_sends_eof_to_the_daemon,
    malformed_daemon_reply_is_answered_eio,
    emsgsize_is_answered_eio,
    replies_keep_flowing_while_the_daemon_does_not_read,
    open_files_are_named_from_the_names_relayed,
    an_invalid_error_value_is_answered_eio,
    a_refused_init_is_passed_on_and_reported,
    a_release_with_changes_no_flush_covered_is_preceded_by_an_own_fsync,
    an_open_answered_enosys_gets_a_handle_of_the_relay,
    end_notifications_waits_for_the_write_in_progress_and_drops_the_rest,
);

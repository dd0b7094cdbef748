//! The relay engine: one pump thread moving FUSE messages between the kernel's fd and the
//! daemon's socket, with the accounting of [`super::inflight`] in between.
//!
//! - **Kernel requests** are read one per `read(2)`, counted in the shared [`Accounting`]
//!   (entering the gate), checked against the door under the state mutex
//!   ([`Inflight::admit`]), and then forwarded, answered by the relay (door, daemon gone) or
//!   dropped. The pump is the only reader of the kernel fd and the only sender on the socket,
//!   so the kernel's order (INTERRUPT after its original, FORGET after the LOOKUP reply it
//!   follows) is kept end to end.
//! - **Daemon messages** are received one per datagram, written to the kernel, and then the
//!   request completes. At EOF (or ECONNRESET) every request still in flight is answered EIO,
//!   so no caller hangs on a dead daemon.
//! - **Notifications** (`unique == 0`) go to a queue that a thread of their own writes to the
//!   kernel: the kernel may hold such a write until a request in flight completes
//!   (`NOTIFY_INVAL_INODE` waits for the folio a READ holds, `NOTIFY_INVAL_ENTRY` for the
//!   directory a LOOKUP holds, and an inval of dirty pages sends WRITEs first), and that
//!   request's reply comes through the pump.
//! - **The relay's own requests**: a RELEASE of a handle changed since its last successful
//!   FLUSH/FSYNC is held back while an FSYNC of the relay's own (its own `unique`, see
//!   [`super::inflight::OWN_UNIQUE_BASE`]) goes to the daemon; its reply goes nowhere, and then
//!   the RELEASE is forwarded. A daemon that answers OPEN with ENOSYS gets the kernel's OPEN
//!   answered with a handle of the relay's own (fh 0), so the kernel never enters its no-open
//!   mode, in which RELEASE never comes and writers would be invisible.
//! - **Waiting**: both fds are non-blocking. After each message the pump keeps polling both
//!   (yielding the CPU between polls) for the configured spin time, then blocks in `poll(2)`
//!   on both. While a send to the daemon waits for room (backpressure: no further kernel
//!   request is read meanwhile, as if the kernel's queue were the daemon's), the daemon's
//!   replies keep being received and written, so a daemon blocked on its replies and the
//!   relay never wait on each other. A request is never failed because the daemon is slow:
//!   only the daemon's answer, its end of the socket closing, or the relay's stop ends it.
//!
//! The kernel fd can be `/dev/fuse` or anything that carries one message per read and write
//! (the unit tests use a SEQPACKET socketpair in its place, as EdenFS's FakeFuse does).

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{MsgFlags, Shutdown};
use parking_lot::Mutex;
use serde::Serialize;

use super::inflight::{Admit, Counters, Inflight, accounting_op, is_own_unique};
use super::init::{self, InitCaps};
use super::proto::{self, InHeader, Opcode, OutHeader};
use crate::accounting::{Accounting, Outstanding};

/// Sizes the engine works with, derived from the socket buffers obtained.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Payload cap: [`init::compute_cap`] of the buffers, at most the configured maximum
    /// message; `None` when the socket cannot carry a minimal message, in which case INIT is
    /// answered EIO.
    pub cap: Option<u32>,
    /// The cap the socket buffers alone would allow (`None`: not even a minimal message).
    pub buffer_cap: Option<u32>,
    /// Largest datagram the relay's end can send (its SO_SNDBUF - 32).
    pub datagram_limit: usize,
    /// Receive buffer for the daemon's messages: at least the largest datagram the daemon's
    /// end can send, so nothing is truncated.
    pub daemon_recv_buffer: usize,
    /// SO_SNDBUF of the relay's end, as read back.
    pub sndbuf_relay: usize,
    /// SO_SNDBUF of the daemon's end, as read back.
    pub sndbuf_daemon: usize,
}

impl Limits {
    /// Limits for a socketpair whose ends have these SO_SNDBUF values (as read back), with
    /// the payload cap at most `max_message` bytes (rounded down to whole pages).
    pub fn from_sndbufs(sndbuf_relay: usize, sndbuf_daemon: usize, max_message: u32) -> Limits {
        let buffer_cap = init::compute_cap(sndbuf_relay, sndbuf_daemon);
        let cap = buffer_cap.map(|c| c.min(max_message / init::PAGE * init::PAGE).max(init::PAGE));
        let dgram = |b: usize| b.saturating_sub(init::DGRAM_OVERHEAD as usize);
        Limits {
            cap,
            buffer_cap,
            datagram_limit: dgram(sndbuf_relay),
            daemon_recv_buffer: dgram(sndbuf_daemon).clamp(init::read_buffer(cap), 16 << 20),
            sndbuf_relay,
            sndbuf_daemon,
        }
    }
}

/// The relay's part of `/status` and of the shutdown summary.
#[derive(Debug, Clone, Serialize)]
pub struct RelayStatus {
    /// What INIT negotiated (once the daemon answered it).
    pub init: Option<InitCaps>,
    /// The message payload cap in use (bytes).
    pub cap: Option<u32>,
    /// How long the pump keeps polling after a message before it sleeps (µs; `--spin`).
    pub spin_us: u64,
    /// The cap the socket buffers alone would allow (bytes).
    pub buffer_cap: Option<u32>,
    /// SO_SNDBUF of the relay's end, as read back (bytes).
    pub sndbuf_relay: usize,
    /// SO_SNDBUF of the daemon's end, as read back (bytes).
    pub sndbuf_daemon: usize,
    /// Requests forwarded and awaiting the daemon's reply.
    pub awaiting_daemon: usize,
    /// The kernel side of the connection is gone.
    pub kernel_gone: bool,
    /// The daemon's end of the socket is gone.
    pub daemon_gone: bool,
    /// Nodeids whose name the relay knows (for naming open files; bounded by the kernel's
    /// lookup counts).
    pub known_nodeids: usize,
    /// Counters.
    pub counts: Counters,
}

/// Something the engine reports to whoever drives the lifecycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEvent {
    /// The daemon's INIT reply reached the kernel: the mount serves.
    Initialized(InitCaps),
    /// The socket cannot carry a minimal message: the kernel's INIT was answered EIO.
    InitFailed,
    /// The daemon answered the kernel's INIT with this errno (passed on: the mount fails).
    InitRefused(i32),
    /// The kernel side is gone (read gave this errno, or EOF); SHUT_WR was sent to the daemon.
    KernelGone(Errno),
    /// The daemon's end reached EOF (`reset`: ECONNRESET or another error); every request in
    /// flight was answered EIO.
    DaemonEof {
        /// Whether the socket failed instead of closing cleanly.
        reset: bool,
    },
}

type OnEvent = Box<dyn Fn(EngineEvent) + Send + Sync>;

/// A running relay. Shared by its pump thread and the lifecycle.
pub struct Relay {
    kernel: OwnedFd,
    sock: OwnedFd,
    limits: Limits,
    spin: Duration,
    acct: Arc<Accounting>,
    state: Mutex<Inflight>,
    init: Mutex<Option<InitCaps>>,
    /// The kernel's INIT request while it awaits the daemon's reply.
    init_unique: Mutex<Option<u64>>,
    shut_wr: AtomicBool,
    kernel_gone: AtomicBool,
    /// The socket cannot carry a minimal message: the relay answered INIT EIO itself.
    init_failed: AtomicBool,
    /// Files open for writing when the kernel side of the connection went away.
    lost_writes: Mutex<Vec<String>>,
    /// The errno the daemon answered INIT with (0: it did not refuse INIT).
    init_refused: std::sync::atomic::AtomicI32,
    /// The notifier's queue (dropped when the pump ends, which ends the notifier).
    notify_tx: Mutex<Option<SyncSender<Vec<u8>>>>,
    on_event: OnEvent,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("limits", &self.limits)
            .field("kernel_gone", &self.kernel_gone())
            .finish_non_exhaustive()
    }
}

/// The threads of a started relay. The pump ends once both the kernel side and the daemon's
/// end are gone; while the kernel side lives it answers late requests (EIO once the daemon is
/// gone), so it may run until the process exits. The notifier ends after the pump.
pub struct Threads {
    /// The pump.
    pub pump: std::thread::JoinHandle<()>,
    /// The notifier: writes the daemon's notifications to the kernel.
    pub notifier: std::thread::JoinHandle<()>,
}

/// The pump's buffers, which of its two fds are still open, and the RELEASEs held back.
struct PumpIo {
    /// One kernel request (the largest the negotiated cap allows).
    kbuf: Vec<u8>,
    /// One daemon message.
    dbuf: Vec<u8>,
    kernel_open: bool,
    daemon_open: bool,
    /// RELEASE requests waiting for the relay's own FSYNC, by that FSYNC's unique, with
    /// whether the relay answers the RELEASE itself (a handle it opened).
    held: HashMap<u64, (Vec<u8>, bool)>,
    /// RELEASE requests whose FSYNC was answered, to forward (or answer) next.
    outbox: VecDeque<(Vec<u8>, bool)>,
}

/// What the pump handled last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handled {
    /// A kernel request (sent to the daemon, or answered by the relay).
    Request,
    /// A daemon message (written to the kernel).
    Reply,
}

/// When the pump spins before it sleeps. After a reply went to the kernel it always spins:
/// the caller's next request usually follows within microseconds. After a request went to the
/// daemon it spins only while the daemon's replies have been arriving within the spin time: a
/// daemon that takes longer (an upload, a round trip to the bucket) would only lose CPU time
/// to the spinning. After two spins in a row that ran out waiting for the daemon, it spins
/// after a request only on every 16th one, to notice when the daemon is fast again.
#[derive(Debug, Default)]
struct SpinPolicy {
    /// Spins after a request, in a row, that ran out without an event.
    misses: u32,
    /// Requests handled (for the periodic retry).
    requests: u32,
    /// The last thing handled was a request.
    after_request: bool,
}

impl SpinPolicy {
    /// Spins after a request that run out this many times in a row stop the spinning.
    const MISSES: u32 = 2;
    /// With spinning stopped, it is tried again after every this many requests.
    const RETRY_EVERY: u32 = 16;

    /// Something was handled; `during_spin`: it arrived while the pump was spinning.
    fn handled(&mut self, what: Handled, during_spin: bool) {
        if during_spin && self.after_request {
            self.misses = 0;
        }
        self.after_request = what == Handled::Request;
        if self.after_request {
            self.requests = self.requests.wrapping_add(1);
        }
    }

    /// Whether to spin now, with nothing ready.
    fn spin_now(&self) -> bool {
        !self.after_request || self.misses < Self::MISSES || self.requests % Self::RETRY_EVERY == 0
    }

    /// A spin ran out without an event.
    fn spun_out(&mut self) {
        if self.after_request {
            self.misses = self.misses.saturating_add(1);
        }
    }
}

/// Daemon messages handled before the pump looks at the kernel fd again.
const BATCH: usize = 16;

/// Makes `fd` non-blocking (the pump polls both fds itself).
fn set_nonblocking(fd: &OwnedFd) -> Result<(), Errno> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// First and last backoff of a send retried on EAGAIN/ENOBUFS.
const BACKOFF_START: Duration = Duration::from_millis(1);
const BACKOFF_MAX: Duration = Duration::from_millis(64);
/// Notifications queued for the notifier at most; more are dropped (and counted) while the
/// kernel is not taking them. An invalidation lost costs cache coherence, never data.
const NOTIFY_QUEUE: usize = 4096;

impl Relay {
    /// Starts the pump thread over `kernel` (the FUSE connection, made non-blocking) and
    /// `sock` (the relay's end of the socketpair), counting requests and handles in `acct`.
    /// After each message the pump keeps polling both fds without sleeping for `spin` (zero:
    /// never) before it blocks in `poll(2)`, which saves two thread wake-ups per request
    /// while requests keep coming, at the price of CPU time. `on_event` is called from the
    /// pump.
    ///
    /// # Errors
    /// Thread spawn failure.
    pub fn start(
        kernel: OwnedFd,
        sock: OwnedFd,
        limits: Limits,
        spin: Duration,
        acct: Arc<Accounting>,
        on_event: impl Fn(EngineEvent) + Send + Sync + 'static,
    ) -> std::io::Result<(Arc<Relay>, Threads)> {
        let (notify_tx, notify_rx) = std::sync::mpsc::sync_channel(NOTIFY_QUEUE);
        let relay = Arc::new(Relay {
            kernel,
            sock,
            limits,
            spin,
            state: Mutex::new(Inflight::new(Arc::clone(&acct))),
            acct,
            init: Mutex::new(None),
            init_unique: Mutex::new(None),
            shut_wr: AtomicBool::new(false),
            kernel_gone: AtomicBool::new(false),
            init_failed: AtomicBool::new(false),
            lost_writes: Mutex::new(Vec::new()),
            init_refused: std::sync::atomic::AtomicI32::new(0),
            notify_tx: Mutex::new(Some(notify_tx)),
            on_event: Box::new(on_event),
        });
        let r = Arc::clone(&relay);
        let notifier = std::thread::Builder::new()
            .name("relay-notify".into())
            .spawn(move || r.notifier(notify_rx))?;
        let r = Arc::clone(&relay);
        let pump = std::thread::Builder::new()
            .name("relay-pump".into())
            .spawn(move || r.pump())?;
        Ok((relay, Threads { pump, notifier }))
    }

    /// The limits in use.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Closes the door (the accounting's): new OPEN/CREATE/MKDIR/MKNOD/SYMLINK/LINK/RENAME
    /// are answered ESHUTDOWN from now on.
    pub fn close_door(&self) {
        self.acct.close_door();
    }

    /// What is outstanding now (the accounting's counts).
    pub fn outstanding(&self) -> Outstanding {
        self.acct.outstanding()
    }

    /// A snapshot for `/status` and the summary.
    pub fn status(&self) -> RelayStatus {
        let s = self.state.lock();
        RelayStatus {
            init: *self.init.lock(),
            cap: self.limits.cap,
            spin_us: self.spin.as_micros() as u64,
            buffer_cap: self.limits.buffer_cap,
            sndbuf_relay: self.limits.sndbuf_relay,
            sndbuf_daemon: self.limits.sndbuf_daemon,
            awaiting_daemon: s.in_flight(),
            kernel_gone: self.kernel_gone(),
            daemon_gone: s.is_daemon_gone(),
            known_nodeids: s.known_names(),
            counts: s.counters.clone(),
        }
    }

    /// Requests the relay has forwarded and awaits the daemon's reply for.
    pub fn in_flight(&self) -> usize {
        self.state.lock().in_flight()
    }

    /// Paths of the open handles (files open for writing first), at most `cap`; a path
    /// the relay has not seen whole shows the nodeid where it stops (`<nodeid N>/name`).
    pub fn open_paths(&self, cap: usize) -> Vec<(String, crate::accounting::HandleMode)> {
        self.state.lock().open_paths(cap)
    }

    /// Paths of the OPEN/CREATE requests awaiting the daemon's reply, at most `cap`.
    pub fn admitted_paths(&self, cap: usize) -> Vec<String> {
        self.state.lock().admitted_paths(cap)
    }

    /// Paths whose FLUSH, FSYNC or RELEASE the daemon failed (uploads that may be missing).
    pub fn failed_flushes(&self) -> Vec<String> {
        self.state.lock().failed_flushes()
    }

    /// Paths of the files that were open for writing when the kernel side of the connection
    /// went away (a connection abort): their writers got ENOTCONN, so their data may be
    /// missing.
    pub fn lost_writes(&self) -> Vec<String> {
        self.lost_writes.lock().clone()
    }

    /// Counters so far.
    pub fn counters(&self) -> Counters {
        self.state.lock().counters.clone()
    }

    /// What INIT negotiated, once the daemon answered it.
    pub fn init_caps(&self) -> Option<InitCaps> {
        *self.init.lock()
    }

    /// Whether the kernel side of the connection went away (set before the daemon is sent
    /// EOF, so a daemon EOF that follows is known to be the consequence).
    pub fn kernel_gone(&self) -> bool {
        self.kernel_gone.load(Ordering::SeqCst)
    }

    /// Whether the relay answered the kernel's INIT EIO itself (the socket cannot carry a
    /// minimal message).
    pub fn init_failed(&self) -> bool {
        self.init_failed.load(Ordering::SeqCst)
    }

    /// The errno the daemon answered the kernel's INIT with, if it refused it.
    pub fn init_refused(&self) -> Option<i32> {
        Some(self.init_refused.load(Ordering::SeqCst)).filter(|&e| e != 0)
    }

    /// Whether the daemon's end reached EOF.
    pub fn daemon_gone(&self) -> bool {
        self.state.lock().is_daemon_gone()
    }

    /// Stops the daemon gracefully: later kernel requests are answered EIO, and the relay's
    /// end is shut down for writing, so the daemon reads EOF. The daemon reader keeps reading
    /// its late replies until the daemon closes its end (never closing with unread data,
    /// which would give the daemon ECONNRESET). Idempotent.
    pub fn stop(&self) {
        self.state.lock().begin_stop();
        if !self.shut_wr.swap(true, Ordering::SeqCst) {
            match nix::sys::socket::shutdown(self.sock.as_raw_fd(), Shutdown::Write) {
                Ok(()) => tracing::info!("relay: SHUT_WR sent to the daemon"),
                Err(e) => tracing::warn!(error = %e, "relay: shutdown(SHUT_WR) failed"),
            }
        }
    }

    /// Answers EIO to every request in flight and fails later ones at once, as if the daemon's
    /// end had reached EOF (for a daemon that exited while something else still holds its
    /// socket end). Returns how many requests were answered.
    pub fn fail_all(&self) -> usize {
        // Counted before the answers are written: whoever sees an answer sees it counted.
        let gone = {
            let mut s = self.state.lock();
            let gone = s.daemon_gone();
            s.counters.answered_daemon_gone += gone.len() as u64;
            gone
        };
        let n = gone.len();
        for (unique, mut p) in gone {
            // The relay's own FSYNC has no caller to answer.
            if !is_own_unique(unique) {
                let _ = self.write_kernel(&proto::error_reply(unique, libc::EIO));
            }
            p.fail();
        }
        n
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

    fn emit(&self, ev: EngineEvent) {
        (self.on_event)(ev);
    }

    /// Writes one reply to the kernel, counting ENOENT (the kernel no longer wants it: the
    /// request was interrupted or aborted). Returns the errno on failure.
    fn write_kernel(&self, msg: &[u8]) -> Result<(), Errno> {
        let r = self.write_raw(msg);
        if r == Err(Errno::ENOENT) {
            self.state.lock().counters.kernel_enoent += 1;
        }
        r
    }

    /// Writes one message to the kernel. ENODEV and friends mean the kernel side is gone,
    /// which the pump's next read reports. Returns the errno on failure.
    fn write_raw(&self, msg: &[u8]) -> Result<(), Errno> {
        loop {
            match nix::unistd::write(self.kernel.as_fd(), msg) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => continue,
                // Only a stand-in for /dev/fuse can be full (a write to /dev/fuse never
                // blocks): wait until it takes the message.
                Err(Errno::EAGAIN) => {
                    let mut fds = [PollFd::new(self.kernel.as_fd(), PollFlags::POLLOUT)];
                    let _ = poll(&mut fds, PollTimeout::from(100u8));
                }
                Err(e) => return Err(e),
            }
        }
    }

    // ---- the pump ----

    fn pump(self: Arc<Self>) {
        let mut io = PumpIo {
            kbuf: vec![0u8; init::read_buffer(self.limits.cap)],
            dbuf: vec![0u8; self.limits.daemon_recv_buffer],
            kernel_open: true,
            daemon_open: true,
            held: HashMap::new(),
            outbox: VecDeque::new(),
        };
        if let Err(e) = set_nonblocking(&self.kernel) {
            tracing::error!(error = %e, "relay: cannot make the FUSE connection non-blocking");
            self.on_kernel_gone(e);
            io.kernel_open = false;
        }
        let mut last_activity = Instant::now();
        let mut policy = SpinPolicy::default();
        let mut spinning = false;
        while io.kernel_open || io.daemon_open {
            let mut last = None;
            // Replies first: each one unblocks a caller.
            for _ in 0..BATCH {
                if !io.daemon_open || !self.recv_one(&mut io) {
                    break;
                }
                last = Some(Handled::Reply);
            }
            // RELEASEs whose FSYNC was answered, before any new kernel request.
            while let Some((msg, local)) = io.outbox.pop_front() {
                self.release_held(&msg, local, &mut io);
                last = Some(Handled::Request);
            }
            if io.kernel_open && self.read_one(&mut io) {
                last = Some(Handled::Request);
            }
            if let Some(handled) = last {
                policy.handled(handled, spinning);
                spinning = false;
                last_activity = Instant::now();
                continue;
            }
            if !self.spin.is_zero() && policy.spin_now() {
                if last_activity.elapsed() < self.spin {
                    spinning = true;
                    std::thread::yield_now();
                    continue;
                }
                if spinning {
                    policy.spun_out();
                }
            }
            spinning = false;
            self.wait_readable(&io);
            last_activity = Instant::now();
        }
        // Ends the notifier once it has written what is queued.
        self.notify_tx.lock().take();
    }

    /// The notifier thread: writes each queued notification to the kernel, in the daemon's
    /// order. The kernel may block such a write until a request in flight completes, which
    /// the pump keeps relaying meanwhile.
    fn notifier(self: Arc<Self>, rx: Receiver<Vec<u8>>) {
        while let Ok(msg) = rx.recv() {
            let code = OutHeader::parse(&msg).map_or(0, |h| h.error);
            let r = self.write_raw(&msg);
            let mut s = self.state.lock();
            s.counters.notifications += 1;
            if let Err(e) = r {
                s.counters.notification_errors += 1;
                drop(s);
                // ENOENT is the ordinary answer to invalidating something the kernel does not
                // cache; other errnos mean the daemon sent something the kernel refused.
                if e == Errno::ENOENT {
                    tracing::debug!(code, error = %e, "relay: the kernel rejected a notification");
                } else {
                    tracing::warn!(code, error = %e, "relay: the kernel rejected a notification");
                }
            }
        }
    }

    /// Queues a notification for the notifier (dropped, and counted, when the queue is full or
    /// the notifier is gone).
    fn queue_notification(&self, msg: &[u8]) {
        let r = match self.notify_tx.lock().as_ref() {
            Some(tx) => tx.try_send(msg.to_vec()),
            None => Err(TrySendError::Disconnected(Vec::new())),
        };
        if r.is_err() {
            let n = {
                let mut s = self.state.lock();
                s.counters.notifications_dropped += 1;
                s.counters.notifications_dropped
            };
            if n.is_power_of_two() {
                tracing::warn!(
                    dropped = n,
                    "relay: the kernel is not taking notifications; dropped one"
                );
            }
        }
    }

    /// Forwards (or, for a handle the relay opened itself, answers) a RELEASE whose FSYNC of
    /// the relay's own has been answered.
    fn release_held(&self, msg: &[u8], local: bool, io: &mut PumpIo) {
        let Ok(h) = InHeader::parse(msg) else { return };
        if local {
            let r = self.write_kernel(&proto::error_reply(h.unique, 0));
            self.finish(h.unique, r);
        } else {
            self.forward(&h, msg, io);
        }
    }

    /// Blocks until the kernel fd (while open) or the socket (while open) is readable.
    fn wait_readable(&self, io: &PumpIo) {
        let mut fds = Vec::with_capacity(2);
        if io.daemon_open {
            fds.push(PollFd::new(self.sock.as_fd(), PollFlags::POLLIN));
        }
        if io.kernel_open {
            fds.push(PollFd::new(self.kernel.as_fd(), PollFlags::POLLIN));
        }
        let _ = poll(&mut fds, PollTimeout::NONE);
    }

    /// Waits at most `timeout` (whole milliseconds, at least 1) for the socket to become
    /// readable or writable. Returns (readable, writable); readable includes HUP and ERR.
    fn wait_socket(&self, timeout: Duration) -> (bool, bool) {
        let mut fds = [PollFd::new(
            self.sock.as_fd(),
            PollFlags::POLLIN | PollFlags::POLLOUT,
        )];
        let t = PollTimeout::try_from(timeout.as_millis().clamp(1, 60_000) as i32)
            .unwrap_or(PollTimeout::MAX);
        if poll(&mut fds, t).is_err() {
            return (false, false);
        }
        let r = fds[0].revents().unwrap_or(PollFlags::empty());
        (
            r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR),
            r.contains(PollFlags::POLLOUT),
        )
    }

    /// Reads one kernel request if one is ready and handles it. Returns whether one was read.
    fn read_one(&self, io: &mut PumpIo) -> bool {
        let n = match nix::unistd::read(self.kernel.as_fd(), &mut io.kbuf) {
            Ok(0) => {
                io.kernel_open = false;
                self.on_kernel_gone(Errno::ENODEV);
                return false;
            }
            Ok(n) => n,
            Err(Errno::EAGAIN | Errno::EINTR) => return false,
            // The request was interrupted before it was read: there is nothing to do.
            Err(Errno::ENOENT) => return true,
            Err(e @ (Errno::ENODEV | Errno::ECONNABORTED)) => {
                io.kernel_open = false;
                self.on_kernel_gone(e);
                return false;
            }
            Err(e) => {
                tracing::error!(error = %e, "relay: reading the FUSE connection failed");
                io.kernel_open = false;
                self.on_kernel_gone(e);
                return false;
            }
        };
        let mut kbuf = std::mem::take(&mut io.kbuf);
        self.on_request(&mut kbuf[..n], io);
        io.kbuf = kbuf;
        true
    }

    /// Receives one daemon message if one is ready and handles it. Returns whether one was
    /// received; at the daemon's EOF (or a socket error) answers everything in flight EIO,
    /// marks the socket closed and returns false.
    fn recv_one(&self, io: &mut PumpIo) -> bool {
        // MSG_TRUNC: the return value is the datagram's real length, so truncation shows.
        let flags = MsgFlags::MSG_TRUNC | MsgFlags::MSG_DONTWAIT;
        let reset = match nix::sys::socket::recv(self.sock.as_raw_fd(), &mut io.dbuf, flags) {
            Ok(0) => false,
            Ok(n) if n > io.dbuf.len() => {
                self.state.lock().counters.protocol_errors += 1;
                tracing::error!(
                    len = n,
                    buffer = io.dbuf.len(),
                    "relay: a daemon message was larger than the receive buffer"
                );
                self.answer_malformed(&io.dbuf);
                return true;
            }
            Ok(n) => {
                let dbuf = std::mem::take(&mut io.dbuf);
                self.on_reply(&dbuf[..n], io);
                io.dbuf = dbuf;
                return true;
            }
            Err(Errno::EAGAIN | Errno::EINTR) => return false,
            Err(Errno::ECONNRESET) => true,
            Err(e) => {
                tracing::error!(error = %e, "relay: receiving from the daemon failed");
                true
            }
        };
        io.daemon_open = false;
        let n = self.fail_all();
        if self.shut_wr.load(Ordering::SeqCst) && !reset {
            tracing::info!(answered_eio = n, "relay: the daemon closed its end");
        } else {
            tracing::error!(
                answered_eio = n,
                reset,
                "relay: the daemon's end of the socket is gone"
            );
        }
        self.emit(EngineEvent::DaemonEof { reset });
        false
    }

    fn on_kernel_gone(&self, e: Errno) {
        tracing::info!(error = %e, "relay: the kernel side of the FUSE connection is gone");
        self.kernel_gone.store(true, Ordering::SeqCst);
        // No RELEASE will ever come: the handles stop counting. A file open for writing with
        // writes since its last successful FLUSH/FSYNC lost its connection before its close
        // could upload them (an abort; an unmount, even a lazy one, waits for the last close,
        // whose FLUSH comes first, though the kernel may drop the RELEASE that follows).
        let (released, lost) = {
            let mut s = self.state.lock();
            let lost = s.unsynced_paths();
            (s.release_all_handles(), lost)
        };
        if released > 0 {
            tracing::info!(released, "relay: handles the kernel will never release");
        }
        if !lost.is_empty() {
            tracing::warn!(
                files = ?lost,
                "relay: the FUSE connection ended with files open for writing: their data may not be uploaded"
            );
            self.lost_writes.lock().extend(lost);
        }
        self.stop();
        self.emit(EngineEvent::KernelGone(e));
    }

    fn on_request(&self, msg: &mut [u8], io: &mut PumpIo) {
        let h = match InHeader::parse(msg) {
            Ok(h) => h,
            Err(e) => {
                self.state.lock().counters.protocol_errors += 1;
                tracing::error!(error = %e, "relay: malformed request from the kernel");
                if let Some(u) = proto::salvage_unique(msg)
                    && u != 0
                    && u & proto::INT_REQ_BIT == 0
                {
                    let _ = self.write_kernel(&proto::error_reply(u, libc::EIO));
                }
                return;
            }
        };
        if h.opcode == Opcode::Init && self.limits.cap.is_none() {
            tracing::error!(
                datagram_limit = self.limits.datagram_limit,
                "relay: the socket buffers cannot carry a minimal 8 KiB FUSE message; \
                 answering INIT with EIO"
            );
            let _ = self.write_kernel(&proto::error_reply(h.unique, libc::EIO));
            self.init_failed.store(true, Ordering::SeqCst);
            self.emit(EngineEvent::InitFailed);
            return;
        }
        // The single admission point: count (enter the gate), then read the door.
        let guard = self.acct.op_owned(accounting_op(h.opcode));
        let door_open = self.acct.door_open();
        let decision = self
            .state
            .lock()
            .admit(&h, InHeader::body(msg), guard, door_open);
        match decision {
            Admit::Forward => {
                if h.opcode == Opcode::Init {
                    *self.init_unique.lock() = Some(h.unique);
                    let cleared = init::rewrite_init_request(msg);
                    if cleared != 0 {
                        tracing::debug!(flags2_cleared = cleared, "relay: masked INIT flags");
                    }
                }
                self.forward(&h, msg, io);
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
            } => {
                tracing::debug!(
                    unique = h.unique,
                    nodeid = h.nodeid,
                    fh,
                    "relay: RELEASE of a handle changed since its last FLUSH: FSYNC first"
                );
                io.held.insert(fsync_unique, (msg.to_vec(), local_release));
                let fsync = proto::fsync_request(fsync_unique, h.nodeid, fh);
                if self.send(&fsync, io).is_err() {
                    // Counted as a failed flush when taken; the RELEASE goes on.
                    drop(self.state.lock().take(fsync_unique));
                    if let Some(held) = io.held.remove(&fsync_unique) {
                        io.outbox.push_back(held);
                    }
                }
            }
            Admit::Drop => {}
        }
    }

    fn forward(&self, h: &InHeader, msg: &[u8], io: &mut PumpIo) {
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

    /// One datagram to the daemon; EINTR retried at once. While the socket is full
    /// (EAGAIN/ENOBUFS) the daemon's replies keep being received and written to the kernel
    /// (a daemon blocked on sending its replies then gets room to read again), and the send is
    /// retried when the socket polls writable or after a backoff of 1 ms doubling to 64 ms, for
    /// as long as it takes: a slow daemon is waited for, as the kernel's own queue would wait.
    /// EPIPE when the daemon's end closes meanwhile, or once the relay has stopped (SHUT_WR).
    fn send(&self, msg: &[u8], io: &mut PumpIo) -> Result<(), Errno> {
        let mut backoff = BACKOFF_START;
        loop {
            let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT;
            match nix::sys::socket::send(self.sock.as_raw_fd(), msg, flags) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN | Errno::ENOBUFS) => {
                    let (readable, writable) = self.wait_socket(backoff);
                    if readable {
                        while io.daemon_open && self.recv_one(io) {}
                        if !io.daemon_open {
                            return Err(Errno::EPIPE);
                        }
                    }
                    if !writable {
                        backoff = (backoff * 2).min(BACKOFF_MAX);
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    // ---- daemon → kernel ----

    fn answer_malformed(&self, msg: &[u8]) {
        if let Some(u) = proto::salvage_unique(msg)
            && u != 0
            && u & proto::INT_REQ_BIT == 0
            && let Some(mut p) = self.state.lock().take(u)
        {
            let _ = self.write_kernel(&proto::error_reply(u, libc::EIO));
            p.fail();
        }
    }

    fn on_reply(&self, msg: &[u8], io: &mut PumpIo) {
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
        // The kernel takes only 0 or -1..=-511 (fuse_dev_do_write) and would leave the caller
        // waiting for another reply: answer EIO instead.
        if !(-511..=0).contains(&h.error) {
            self.state.lock().counters.protocol_errors += 1;
            tracing::error!(
                unique = h.unique,
                error = h.error,
                "relay: the daemon replied with an invalid error value; answering EIO"
            );
            self.answer_malformed(msg);
            return;
        }
        if is_own_unique(h.unique) {
            // The relay's own FSYNC: its reply goes nowhere; the RELEASE it held goes on.
            {
                let mut s = self.state.lock();
                if s.on_reply(h.unique, h.error, OutHeader::body(msg))
                    .is_some()
                {
                    s.counters.replies += 1;
                }
                s.complete(h.unique);
            }
            if let Some(held) = io.held.remove(&h.unique) {
                io.outbox.push_back(held);
            }
            return;
        }
        let pending = self
            .state
            .lock()
            .on_reply(h.unique, h.error, OutHeader::body(msg));
        if pending == Some(Opcode::Open) && h.error == -libc::ENOSYS {
            // Inflight counted a handle of the relay's own (fh 0) for it.
            let r = self.write_kernel(&proto::open_reply(h.unique, 0));
            self.finish(h.unique, r);
            return;
        }
        let mut owned;
        let mut out = msg;
        if pending == Some(Opcode::Init) {
            self.init_unique.lock().take();
            if h.error != 0 {
                tracing::error!(errno = -h.error, "relay: the daemon refused INIT");
                self.init_refused.store(-h.error, Ordering::SeqCst);
                let r = self.write_kernel(msg);
                self.finish(h.unique, r);
                self.emit(EngineEvent::InitRefused(-h.error));
                return;
            }
        }
        if pending == Some(Opcode::Init)
            && let Some(cap) = self.limits.cap
        {
            owned = msg.to_vec();
            if let Some(caps) = init::rewrite_init_reply(&mut owned, cap) {
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
                out = &owned;
                let r = self.write_kernel(out);
                self.finish(h.unique, r);
                self.emit(EngineEvent::Initialized(caps));
                return;
            }
        }
        let r = self.write_kernel(out);
        self.finish(h.unique, r);
    }

    fn finish(&self, unique: u64, r: Result<(), Errno>) {
        if r == Err(Errno::EINVAL) {
            // The kernel refused the reply (a body it cannot take for this request): answer
            // EIO, or the caller would wait for a reply that never comes.
            self.state.lock().counters.protocol_errors += 1;
            tracing::error!(
                unique,
                "relay: the kernel refused the daemon's reply (EINVAL); answering EIO"
            );
            if let Some(mut p) = self.state.lock().take(unique) {
                let _ = self.write_kernel(&proto::error_reply(unique, libc::EIO));
                p.fail();
            }
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

#[cfg(test)]
mod tests;

//! The relay engine: a pump moving FUSE messages between the kernel's fd and the daemon's
//! socket, with the accounting of [`super::inflight`] in between. By default the pump is one
//! thread polling both fds ([`PumpMode::Poll`]); `--pump threads` makes it two threads, each
//! blocked in its own fd ([`PumpMode::Threads`]).
//!
//! - **Kernel requests** are read one per `read(2)`, counted in the shared [`Accounting`]
//!   (entering the gate), checked against the door under the state mutex
//!   ([`Inflight::admit`]), and then forwarded, answered by the relay (door, daemon gone) or
//!   dropped. One thread is the only reader of the kernel fd and the only sender of kernel
//!   requests on the socket, so the kernel's order (INTERRUPT after its original, FORGET
//!   after the LOOKUP reply it follows) is kept end to end. A request is in the in-flight
//!   state before it is sent, so its reply always finds it.
//! - **Daemon messages** are received one per datagram, written to the kernel, and then the
//!   request completes. At EOF (or ECONNRESET) every request still in flight is answered EIO,
//!   so no caller hangs on a dead daemon.
//! - **Notifications** (`unique == 0`) go to a queue that a thread of their own writes to the
//!   kernel: the kernel may hold such a write until a request in flight completes
//!   (`NOTIFY_INVAL_INODE` waits for the folio a READ holds, `NOTIFY_INVAL_ENTRY` for the
//!   directory a LOOKUP holds, and an inval of dirty pages sends WRITEs first), and that
//!   request's reply comes through the pump.
//! - **The relay's own requests**: a RELEASE of a handle open for writing with changes no
//!   successful FLUSH (nor a failed FLUSH/FSYNC) covered is held back while an FSYNC of the
//!   relay's own (its own `unique`, see [`super::inflight::OWN_UNIQUE_BASE`]) goes to the
//!   daemon; its reply goes nowhere, and then the RELEASE is forwarded. A daemon that answers
//!   OPEN with ENOSYS gets the kernel's OPEN answered with a handle of the relay's own (fh 0),
//!   so the kernel never enters its no-open mode, in which RELEASE never comes and writers
//!   would be invisible.
//! - **Waiting**: with [`PumpMode::Threads`], one thread blocks in `read(2)` on the kernel's
//!   fd and one in `recv(2)` on the socket (`engine/threads.rs`); with [`PumpMode::Poll`] both
//!   fds are non-blocking, and after each message the one pump thread keeps polling both
//!   (yielding the CPU between polls) for the configured spin time, then blocks in `poll(2)`
//!   on both. While a send to the daemon waits for room (backpressure: no further kernel
//!   request is read meanwhile, as if the kernel's queue were the daemon's), the daemon's
//!   replies keep being received and written, so a daemon blocked on its replies and the
//!   relay never wait on each other. A request is never failed because the daemon is slow:
//!   only the daemon's answer, its end of the socket closing, or the relay's stop ends it.
//!
//! The kernel fd can be `/dev/fuse` or anything that carries one message per read and write
//! (the unit tests use a SEQPACKET socketpair in its place, as EdenFS's FakeFuse does).
//!
//! # Where each part lives
//! This file holds the [`Relay`] itself ([`Relay::start`], its [`Limits`], the
//! [`EngineEvent`]s it reports, and the one place that writes to the kernel's fd). Its parts,
//! one file each:
//! - `engine/pump.rs`: the poll pump's loop and its spin policy; reading the kernel's fd,
//!   receiving from and sending to the daemon's socket (with backpressure), for both modes;
//! - `engine/threads.rs`: the threads pump's two threads;
//! - `engine/requests.rs`: a kernel request (kernel → daemon): admission, forwarding, the
//!   answers the relay gives itself (door, daemon gone);
//! - `engine/replies.rs`: a daemon message (daemon → kernel): routing by `unique`, writing the
//!   reply, completing the request, answering EIO what the kernel or the daemon got wrong;
//! - `engine/own_requests.rs`: the relay's own requests: its FSYNC before a RELEASE, the held
//!   RELEASE, its answer to an OPEN the daemon answered ENOSYS;
//! - `engine/split_io.rs`: READs and WRITEs larger than the daemon's cap sent as parts and
//!   answered once ([`crate::relay::split`] decides);
//! - `engine/init_handshake.rs`: INIT: the request's and the reply's rewrite, a refused INIT,
//!   an INIT the socket cannot carry, an INIT the daemon did not answer in time;
//! - `engine/notifier.rs`: the notifier thread that writes the daemon's notifications to the
//!   kernel;
//! - `engine/end_of_stream.rs`: the end of either side: where the relay closes the daemon's
//!   socket ([`Relay::stop`], SHUT_WR), the kernel side going away, the daemon's EOF, and
//!   answering every request in flight EIO;
//! - `engine/profile.rs`: the instrument: time in the relay's two hops, READ and WRITE sizes;
//! - `engine/status.rs`: [`RelayStatus`] and the counters, open files and flags the lifecycle
//!   reads, and the door it closes.

mod end_of_stream;
mod init_handshake;
mod notifier;
mod own_requests;
mod profile;
mod pump;
mod replies;
mod requests;
mod split_io;
mod status;
mod threads;

pub use profile::{HopSnapshot, ProfileSnapshot};
pub use status::RelayStatus;

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32};
use std::sync::mpsc::SyncSender;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use parking_lot::Mutex;

use super::inflight::Inflight;
use super::init::{self, InitCaps};
use super::split::{ReadParts, Splits};
use crate::accounting::Accounting;

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
    /// The payload cap the kernel is given in INIT (its `max_write` and `max_pages`, at most
    /// the daemon's own): [`Limits::cap`], or with [`Limits::splitting`] 1 MiB, the READs and
    /// WRITEs above `cap` then being split by the relay ([`crate::relay::split`]).
    pub kernel_cap: Option<u32>,
    /// Largest WRITE part the relay sends (bytes, whole pages, at least `cap`): what one
    /// datagram of the relay's end carries, at most 1 MiB (and at most the daemon's
    /// `max_write`, applied at INIT). Only the relay sends WRITE data, and it retries its own
    /// sends, so this may exceed `cap`, which bounds what the daemon sends.
    pub write_part: u32,
    /// How a split READ's parts go to the daemon (`--read-parts`).
    pub read_parts: ReadParts,
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
            kernel_cap: cap,
            write_part: cap.unwrap_or(0),
            read_parts: ReadParts::InOrder,
        }
    }

    /// These limits with READs and WRITEs larger than `cap` split by the relay: the kernel is
    /// given up to 1 MiB ([`init::MAX_CAP`]), WRITE parts are as large as one datagram of the
    /// relay's end carries, READ parts go as `read_parts` says. Unchanged when the socket
    /// cannot carry a minimal message.
    pub fn splitting(self, read_parts: ReadParts) -> Limits {
        let Some(cap) = self.cap else { return self };
        let room = self
            .datagram_limit
            .saturating_sub(init::HEADROOM as usize)
            .min(init::MAX_CAP as usize) as u32;
        Limits {
            kernel_cap: Some(init::MAX_CAP),
            write_part: (room / init::PAGE * init::PAGE).max(cap),
            read_parts,
            ..self
        }
    }

    /// Whether READs and WRITEs above `cap` are split ([`Limits::splitting`]).
    pub fn splits(&self) -> bool {
        self.kernel_cap > self.cap
    }
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

/// How the relay waits for messages (`--pump`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PumpMode {
    /// Two threads, each blocked in its own fd: one in `read(2)` on the kernel's fd (it
    /// handles and forwards each request), one in `recv(2)` on the daemon's socket (it handles
    /// each daemon message and writes it to the kernel). Neither polls nor spins, so an idle
    /// or waiting relay takes no CPU from the daemon.
    Threads,
    /// One thread with both fds non-blocking: after each message it keeps polling both,
    /// yielding the CPU between polls, for `spin` (zero: never), then blocks in `poll(2)` on
    /// both.
    Poll {
        /// How long to keep polling after a message before blocking.
        spin: Duration,
    },
}

impl PumpMode {
    /// The spin time (zero for [`PumpMode::Threads`]).
    pub fn spin(&self) -> Duration {
        match self {
            PumpMode::Threads => Duration::ZERO,
            PumpMode::Poll { spin } => *spin,
        }
    }

    /// `threads` or `poll`.
    pub fn name(&self) -> &'static str {
        match self {
            PumpMode::Threads => "threads",
            PumpMode::Poll { .. } => "poll",
        }
    }
}

type OnEvent = Box<dyn Fn(EngineEvent) + Send + Sync>;

/// A running relay. Shared by its pump thread and the lifecycle.
pub struct Relay {
    kernel: OwnedFd,
    sock: OwnedFd,
    limits: Limits,
    pump_mode: PumpMode,
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
    init_refused: AtomicI32,
    /// The notifier's queue (dropped when the pump ends, or by [`Relay::end_notifications`],
    /// which ends the notifier).
    notify_tx: Mutex<Option<SyncSender<Vec<u8>>>>,
    /// Set by [`Relay::end_notifications`]: the notifier drops what is still queued.
    notify_discard: AtomicBool,
    /// Set by the notifier thread as it ends.
    notifier_done: AtomicBool,
    /// RELEASE requests waiting for the relay's own FSYNC, by that FSYNC's unique, with
    /// whether the relay answers the RELEASE itself (a handle it opened). Inserted before the
    /// FSYNC is sent, removed when it is answered. A leaf lock.
    held: Mutex<HashMap<u64, (Vec<u8>, bool)>>,
    /// READs and WRITEs split into parts, while their parts are answered. A leaf lock.
    splits: Mutex<Splits>,
    /// Hop timings and message sizes.
    profile: profile::Profile,
    /// The WRITE part size: [`Limits::write_part`], at most the daemon's `max_write` once INIT
    /// is answered.
    write_part: AtomicU32,
    /// Test hook: this many of the next sends to the daemon fail with ENOBUFS before reaching
    /// the socket, as a failed skb allocation would.
    #[cfg(test)]
    inject_enobufs: AtomicU32,
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
    /// The pump ([`PumpMode::Poll`]), or its kernel-side thread, which joins the daemon-side
    /// thread when it ends ([`PumpMode::Threads`]).
    pub pump: std::thread::JoinHandle<()>,
    /// The notifier: writes the daemon's notifications to the kernel.
    pub notifier: std::thread::JoinHandle<()>,
}

impl Relay {
    /// Starts the pump over `kernel` (the FUSE connection; made blocking for
    /// [`PumpMode::Threads`], non-blocking for [`PumpMode::Poll`]) and `sock` (the relay's end
    /// of the socketpair), counting requests and handles in `acct`. `on_event` is called from
    /// the pump's threads.
    ///
    /// # Errors
    /// Thread spawn failure.
    pub fn start(
        kernel: OwnedFd,
        sock: OwnedFd,
        limits: Limits,
        pump_mode: PumpMode,
        acct: Arc<Accounting>,
        on_event: impl Fn(EngineEvent) + Send + Sync + 'static,
    ) -> std::io::Result<(Arc<Relay>, Threads)> {
        let (notify_tx, notify_rx) = std::sync::mpsc::sync_channel(notifier::NOTIFY_QUEUE);
        let relay = Arc::new(Relay {
            kernel,
            sock,
            limits,
            pump_mode,
            state: Mutex::new(Inflight::new(Arc::clone(&acct))),
            acct,
            init: Mutex::new(None),
            init_unique: Mutex::new(None),
            shut_wr: AtomicBool::new(false),
            kernel_gone: AtomicBool::new(false),
            init_failed: AtomicBool::new(false),
            lost_writes: Mutex::new(Vec::new()),
            init_refused: AtomicI32::new(0),
            notify_tx: Mutex::new(Some(notify_tx)),
            notify_discard: AtomicBool::new(false),
            notifier_done: AtomicBool::new(false),
            held: Mutex::new(HashMap::new()),
            splits: Mutex::new(Splits::default()),
            profile: profile::Profile::default(),
            write_part: AtomicU32::new(limits.write_part),
            #[cfg(test)]
            inject_enobufs: AtomicU32::new(0),
            on_event: Box::new(on_event),
        });
        let r = Arc::clone(&relay);
        let notifier = std::thread::Builder::new()
            .name("relay-notify".into())
            .spawn(move || r.notifier(notify_rx))?;
        let pump = Arc::clone(&relay).spawn_pump()?;
        Ok((relay, Threads { pump, notifier }))
    }

    /// Starts the pump's thread(s) for the relay's [`PumpMode`]; returns the one to join.
    fn spawn_pump(self: Arc<Self>) -> std::io::Result<std::thread::JoinHandle<()>> {
        match self.pump_mode {
            PumpMode::Poll { .. } => std::thread::Builder::new()
                .name("relay-pump".into())
                .spawn(move || self.pump()),
            PumpMode::Threads => {
                let d = Arc::clone(&self);
                let daemon_side = std::thread::Builder::new()
                    .name("relay-daemon".into())
                    .spawn(move || d.daemon_side())?;
                std::thread::Builder::new()
                    .name("relay-kernel".into())
                    .spawn(move || self.kernel_side(daemon_side))
            }
        }
    }

    /// Reports `ev` to whoever drives the lifecycle (called from the pump).
    fn emit(&self, ev: EngineEvent) {
        (self.on_event)(ev);
    }

    /// Writes one reply to the kernel, counting ENOENT (the kernel no longer wants it: the
    /// request was interrupted or aborted). Returns the errno on failure.
    pub(super) fn write_kernel(&self, msg: &[u8]) -> Result<(), Errno> {
        let r = self.write_raw(msg);
        if r == Err(Errno::ENOENT) {
            self.state.lock().counters.kernel_enoent += 1;
        }
        r
    }

    /// Writes one message to the kernel. ENODEV and friends mean the kernel side is gone,
    /// which the pump's next read reports. Returns the errno on failure.
    pub(super) fn write_raw(&self, msg: &[u8]) -> Result<(), Errno> {
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
}

#[cfg(test)]
mod split_tests;
#[cfg(test)]
mod tests;

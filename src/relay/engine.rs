//! The relay engine: two reader threads moving FUSE messages between the kernel's fd and the
//! daemon's socket, with the accounting of [`super::inflight`] in between.
//!
//! - The **kernel reader** reads one request per `read(2)` from the kernel fd, decides under
//!   the state mutex ([`Inflight::admit`]) whether to forward it, answer it itself (door,
//!   daemon gone) or drop it, and sends forwarded requests to the socket in the order read.
//!   It is the only sender on the socket, so the kernel's order (INTERRUPT after its original,
//!   FORGET after the LOOKUP reply it follows) is kept end to end.
//! - The **daemon reader** receives one reply per datagram, writes it to the kernel and then
//!   completes the request. At EOF (or ECONNRESET) it answers every request still in flight
//!   with EIO, so no caller hangs on a dead daemon.
//!
//! The kernel fd can be `/dev/fuse` or anything that carries one message per read and write
//! (the unit tests use a SEQPACKET socketpair in its place, as EdenFS's FakeFuse does).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::socket::{MsgFlags, Shutdown};
use parking_lot::Mutex;

use super::inflight::{Admit, Counters, Inflight, Outstanding};
use super::init::{self, InitCaps};
use super::proto::{self, InHeader, Opcode, OutHeader};

/// Sizes the engine works with, derived from the socket buffers obtained.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Payload cap ([`init::compute_cap`]); `None` when the socket cannot carry a minimal
    /// message, in which case INIT is answered EIO.
    pub cap: Option<u32>,
    /// Largest datagram the relay's end can send (its SO_SNDBUF - 32).
    pub datagram_limit: usize,
    /// Receive buffer for the daemon's messages: at least the largest datagram the daemon's
    /// end can send, so nothing is truncated.
    pub daemon_recv_buffer: usize,
}

impl Limits {
    /// Limits for a socketpair whose ends have these SO_SNDBUF values (as read back).
    pub fn from_sndbufs(sndbuf_relay: usize, sndbuf_daemon: usize) -> Limits {
        let cap = init::compute_cap(sndbuf_relay, sndbuf_daemon);
        let dgram = |b: usize| b.saturating_sub(init::DGRAM_OVERHEAD as usize);
        Limits {
            cap,
            datagram_limit: dgram(sndbuf_relay),
            daemon_recv_buffer: dgram(sndbuf_daemon).clamp(init::read_buffer(cap), 16 << 20),
        }
    }
}

/// Something the engine reports to whoever drives the lifecycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEvent {
    /// The daemon's INIT reply reached the kernel: the mount serves.
    Initialized(InitCaps),
    /// The socket cannot carry a minimal message: the kernel's INIT was answered EIO.
    InitFailed,
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

/// A running relay. Shared by its two reader threads and the lifecycle.
pub struct Relay {
    kernel: OwnedFd,
    sock: OwnedFd,
    limits: Limits,
    state: Mutex<Inflight>,
    changed: tokio::sync::Notify,
    init: Mutex<Option<InitCaps>>,
    shut_wr: AtomicBool,
    kernel_gone: AtomicBool,
    on_event: OnEvent,
}

/// The reader threads of a started relay.
pub struct Threads {
    /// The kernel→daemon reader (may stay blocked in `read` until the process exits).
    pub kernel: std::thread::JoinHandle<()>,
    /// The daemon→kernel reader; it ends at the daemon's EOF.
    pub daemon: std::thread::JoinHandle<()>,
}

/// First and last backoff of a send retried on EAGAIN/ENOBUFS.
const BACKOFF_START: Duration = Duration::from_millis(1);
const BACKOFF_MAX: Duration = Duration::from_millis(64);
/// How long one send may keep retrying before the request is answered EIO.
const SEND_RETRY_BUDGET: Duration = Duration::from_secs(5);

impl Relay {
    /// Starts the two reader threads over `kernel` (the FUSE connection) and `sock` (the
    /// relay's end of the socketpair, blocking). `on_event` is called from those threads.
    ///
    /// # Errors
    /// Thread spawn failure.
    pub fn start(
        kernel: OwnedFd,
        sock: OwnedFd,
        limits: Limits,
        on_event: impl Fn(EngineEvent) + Send + Sync + 'static,
    ) -> std::io::Result<(Arc<Relay>, Threads)> {
        let relay = Arc::new(Relay {
            kernel,
            sock,
            limits,
            state: Mutex::new(Inflight::default()),
            changed: tokio::sync::Notify::new(),
            init: Mutex::new(None),
            shut_wr: AtomicBool::new(false),
            kernel_gone: AtomicBool::new(false),
            on_event: Box::new(on_event),
        });
        let k = Arc::clone(&relay);
        let kernel = std::thread::Builder::new()
            .name("relay-kernel".into())
            .spawn(move || k.kernel_loop())?;
        let d = Arc::clone(&relay);
        let daemon = std::thread::Builder::new()
            .name("relay-daemon".into())
            .spawn(move || d.daemon_loop())?;
        Ok((relay, Threads { kernel, daemon }))
    }

    /// The limits in use.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Closes the door: new OPEN/CREATE/MKDIR/MKNOD/SYMLINK/LINK/RENAME are answered
    /// ESHUTDOWN from now on. Every request admitted before this call is already counted in
    /// [`Relay::outstanding`] (see [`super::inflight`]).
    pub fn close_door(&self) {
        self.state.lock().close_door();
        self.changed.notify_waiters();
    }

    /// What is outstanding now.
    pub fn outstanding(&self) -> Outstanding {
        self.state.lock().outstanding(Instant::now())
    }

    /// Signalled whenever a request completes or a handle is released. Create (and
    /// `enable`) the `Notified` future before reading [`Relay::outstanding`], or a change
    /// between the read and the wait is lost.
    pub fn changed(&self) -> &tokio::sync::Notify {
        &self.changed
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
        let gone = self.state.lock().daemon_gone();
        for (unique, _) in &gone {
            let _ = self.write_kernel(&proto::error_reply(*unique, libc::EIO));
        }
        let n = gone.len();
        self.state.lock().counters.answered_daemon_gone += n as u64;
        self.changed.notify_waiters();
        n
    }

    fn emit(&self, ev: EngineEvent) {
        (self.on_event)(ev);
    }

    /// Writes one message to the kernel. ENOENT (the request is gone) is counted; ENODEV and
    /// friends mean the kernel side is gone, which the kernel reader reports. Returns the
    /// errno on failure.
    fn write_kernel(&self, msg: &[u8]) -> Result<(), Errno> {
        loop {
            match nix::unistd::write(self.kernel.as_fd(), msg) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(Errno::ENOENT) => {
                    self.state.lock().counters.kernel_enoent += 1;
                    return Err(Errno::ENOENT);
                }
                Err(e) => return Err(e),
            }
        }
    }

    // ---- kernel → daemon ----

    fn kernel_loop(self: Arc<Self>) {
        let mut buf = vec![0u8; init::read_buffer(self.limits.cap)];
        loop {
            let n = match nix::unistd::read(self.kernel.as_fd(), &mut buf) {
                Ok(0) => {
                    self.on_kernel_gone(Errno::ENODEV);
                    return;
                }
                Ok(n) => n,
                Err(Errno::EINTR | Errno::EAGAIN | Errno::ENOENT) => continue,
                Err(e @ (Errno::ENODEV | Errno::ECONNABORTED)) => {
                    self.on_kernel_gone(e);
                    return;
                }
                Err(e) => {
                    tracing::error!(error = %e, "relay: reading the FUSE connection failed");
                    self.on_kernel_gone(e);
                    return;
                }
            };
            self.on_request(&mut buf[..n]);
        }
    }

    fn on_kernel_gone(&self, e: Errno) {
        tracing::info!(error = %e, "relay: the kernel side of the FUSE connection is gone");
        self.kernel_gone.store(true, Ordering::SeqCst);
        self.stop();
        self.emit(EngineEvent::KernelGone(e));
    }

    fn on_request(&self, msg: &mut [u8]) {
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
            self.emit(EngineEvent::InitFailed);
            return;
        }
        // The single admission point: door check and in-flight insert in one critical section.
        let decision = self
            .state
            .lock()
            .admit(&h, InHeader::body(msg), Instant::now());
        match decision {
            Admit::Forward => {
                if h.opcode == Opcode::Init {
                    let cleared = init::rewrite_init_request(msg);
                    if cleared != 0 {
                        tracing::debug!(flags2_cleared = cleared, "relay: masked INIT flags");
                    }
                }
                self.forward(&h, msg);
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
            Admit::Drop => {}
        }
    }

    fn forward(&self, h: &InHeader, msg: &[u8]) {
        if msg.len() > self.limits.datagram_limit && h.opcode == Opcode::BatchForget {
            match proto::split_batch_forget(msg, self.limits.datagram_limit) {
                Some(parts) => {
                    for p in parts {
                        if self.send(&p).is_err() {
                            return;
                        }
                    }
                }
                None => tracing::error!(len = msg.len(), "relay: malformed BATCH_FORGET dropped"),
            }
            return;
        }
        if let Err(e) = self.send(msg) {
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
            let answered = {
                let mut s = self.state.lock();
                let was = s.complete(h.unique);
                if was {
                    s.counters.answered_send_failed += 1;
                }
                was
            };
            if answered {
                let _ = self.write_kernel(&proto::error_reply(h.unique, libc::EIO));
                self.changed.notify_waiters();
            }
        }
    }

    /// One datagram to the daemon; EINTR retried at once, EAGAIN/ENOBUFS with a backoff of
    /// 1 ms doubling to 64 ms, for at most 5 s.
    fn send(&self, msg: &[u8]) -> Result<(), Errno> {
        let mut backoff = BACKOFF_START;
        let started = Instant::now();
        loop {
            match nix::sys::socket::send(self.sock.as_raw_fd(), msg, MsgFlags::MSG_NOSIGNAL) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(e @ (Errno::EAGAIN | Errno::ENOBUFS)) => {
                    if started.elapsed() >= SEND_RETRY_BUDGET {
                        return Err(e);
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
                Err(e) => return Err(e),
            }
        }
    }

    // ---- daemon → kernel ----

    fn daemon_loop(self: Arc<Self>) {
        let mut buf = vec![0u8; self.limits.daemon_recv_buffer];
        let reset = loop {
            // MSG_TRUNC: the return value is the datagram's real length, so truncation shows.
            let n = match nix::sys::socket::recv(
                self.sock.as_raw_fd(),
                &mut buf,
                MsgFlags::MSG_TRUNC,
            ) {
                Ok(0) => break false,
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(Errno::ECONNRESET) => break true,
                Err(e) => {
                    tracing::error!(error = %e, "relay: receiving from the daemon failed");
                    break true;
                }
            };
            if n > buf.len() {
                self.state.lock().counters.protocol_errors += 1;
                tracing::error!(
                    len = n,
                    buffer = buf.len(),
                    "relay: a daemon message was larger than the receive buffer"
                );
                self.answer_malformed(&buf);
                continue;
            }
            self.on_reply(&buf[..n]);
        };
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
    }

    fn answer_malformed(&self, msg: &[u8]) {
        if let Some(u) = proto::salvage_unique(msg)
            && u != 0
            && u & proto::INT_REQ_BIT == 0
            && self.state.lock().complete(u)
        {
            let _ = self.write_kernel(&proto::error_reply(u, libc::EIO));
            self.changed.notify_waiters();
        }
    }

    fn on_reply(&self, msg: &[u8]) {
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
            let r = self.write_kernel(msg);
            let mut s = self.state.lock();
            s.counters.notifications += 1;
            if let Err(e) = r {
                s.counters.notification_errors += 1;
                drop(s);
                tracing::debug!(code = h.error, error = %e, "relay: the kernel rejected a notification");
            }
            return;
        }
        if h.unique & proto::INT_REQ_BIT != 0 {
            let _ = self.write_kernel(msg);
            self.state.lock().counters.interrupt_replies += 1;
            return;
        }
        let pending = self
            .state
            .lock()
            .on_reply(h.unique, h.error, OutHeader::body(msg));
        let mut owned;
        let mut out = msg;
        if let Some(p) = pending
            && p.opcode == Opcode::Init
            && let Some(cap) = self.limits.cap
        {
            owned = msg.to_vec();
            if let Some(caps) = init::rewrite_init_reply(&mut owned, cap) {
                tracing::info!(
                    minor = caps.minor,
                    daemon_max_write = caps.daemon_max_write,
                    max_write = caps.max_write,
                    max_pages = caps.max_pages,
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
        self.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests;

//! The pump thread: the loop that moves messages between the kernel's fd and the daemon's
//! socket, and its waiting. Each turn it receives up to [`BATCH`] daemon messages (each one
//! unblocks a caller), forwards the RELEASEs whose FSYNC was answered, then reads one kernel
//! request (split WRITEs send their next parts there too); with nothing ready it spins for the configured time ([`SpinPolicy`]) and then blocks
//! in `poll(2)` on both fds. A send to the daemon that finds the socket full keeps receiving the
//! daemon's replies while it waits for room ([`Relay::send`]). What each message does is in
//! [`super::requests`] and [`super::replies`]; what ends each side in [`super::end_of_stream`].

use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::MsgFlags;

use super::Relay;
use crate::relay::init;

/// A pump thread's buffers, which of its fds are still open, and what a daemon reply made
/// ready to send. The poll pump has one for both fds; with [`super::PumpMode::Threads`] each
/// thread has its own (the kernel side's `dbuf` is empty and never used).
pub(super) struct PumpIo {
    /// One kernel request (the largest the negotiated cap allows).
    pub(super) kbuf: Vec<u8>,
    /// One daemon message.
    pub(super) dbuf: Vec<u8>,
    /// The kernel's fd has not reached EOF or an error yet.
    pub(super) kernel_open: bool,
    /// The daemon's socket has not reached EOF or an error yet.
    pub(super) daemon_open: bool,
    /// Whether this thread receives the daemon's messages: then a send that finds the socket
    /// full receives them while it waits ([`Relay::send`]); else it only waits for room (the
    /// other thread receives).
    pub(super) receives: bool,
    /// Messages to the daemon that a reply made ready, sent before the next kernel request.
    pub(super) outbox: VecDeque<Outgoing>,
}

impl PumpIo {
    /// Buffers of `kbuf_len` and `dbuf_len` bytes (0 for a side this thread does not read),
    /// both fds open, an empty outbox.
    pub(super) fn new(kbuf_len: usize, dbuf_len: usize, receives: bool) -> PumpIo {
        PumpIo {
            kbuf: vec![0u8; kbuf_len],
            dbuf: vec![0u8; dbuf_len],
            kernel_open: true,
            daemon_open: true,
            receives,
            outbox: VecDeque::new(),
        }
    }
}

/// A message to the daemon that a daemon reply made ready (the pump sends it next, not from
/// inside the reply's handling, where a full socket would have it receive replies again).
#[derive(Debug)]
pub(super) enum Outgoing {
    /// A RELEASE whose FSYNC of the relay's own was answered, with whether the relay answers
    /// it itself (a handle it opened).
    Release(Vec<u8>, bool),
    /// The next part of the split WRITE of the kernel's `unique`.
    Part(u64, Vec<u8>),
}

/// What the pump handled last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Handled {
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
pub(super) struct SpinPolicy {
    /// Spins after a request, in a row, that ran out without an event.
    misses: u32,
    /// Requests handled (for the periodic retry).
    requests: u32,
    /// The last thing handled was a request.
    after_request: bool,
}

impl SpinPolicy {
    /// Spins after a request that run out this many times in a row stop the spinning.
    pub(super) const MISSES: u32 = 2;
    /// With spinning stopped, it is tried again after every this many requests.
    pub(super) const RETRY_EVERY: u32 = 16;

    /// Something was handled; `during_spin`: it arrived while the pump was spinning.
    pub(super) fn handled(&mut self, what: Handled, during_spin: bool) {
        if during_spin && self.after_request {
            self.misses = 0;
        }
        self.after_request = what == Handled::Request;
        if self.after_request {
            self.requests = self.requests.wrapping_add(1);
        }
    }

    /// Whether to spin now, with nothing ready.
    pub(super) fn spin_now(&self) -> bool {
        !self.after_request || self.misses < Self::MISSES || self.requests % Self::RETRY_EVERY == 0
    }

    /// A spin ran out without an event.
    pub(super) fn spun_out(&mut self) {
        if self.after_request {
            self.misses = self.misses.saturating_add(1);
        }
    }
}

/// Daemon messages handled before the pump looks at the kernel fd again.
const BATCH: usize = 16;

/// Makes `fd` non-blocking (the poll pump polls both fds itself) or blocking (the threads
/// pump's kernel side waits in `read(2)`).
pub(super) fn set_nonblocking(fd: &OwnedFd, on: bool) -> Result<(), Errno> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    let flags = if on {
        flags | OFlag::O_NONBLOCK
    } else {
        flags - OFlag::O_NONBLOCK
    };
    fcntl(fd, FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// First and last backoff of a send retried on EAGAIN/ENOBUFS.
const BACKOFF_START: Duration = Duration::from_millis(1);
const BACKOFF_MAX: Duration = Duration::from_millis(64);

impl Relay {
    /// The pump thread's body: runs until both the kernel side and the daemon's end are gone,
    /// then drops the notifier's queue, which ends the notifier once it has written the rest.
    pub(super) fn pump(self: Arc<Self>) {
        let mut io = PumpIo::new(
            init::read_buffer(self.limits.kernel_cap),
            self.limits.daemon_recv_buffer,
            true,
        );
        if let Err(e) = set_nonblocking(&self.kernel, true) {
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
                if !io.daemon_open || !self.recv_one(&mut io, false) {
                    break;
                }
                last = Some(Handled::Reply);
            }
            // RELEASEs whose FSYNC was answered, before any new kernel request.
            if self.send_outbox(&mut io) {
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
            let spin = self.pump_mode.spin();
            if !spin.is_zero() && policy.spin_now() {
                if last_activity.elapsed() < spin {
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

    /// Sends what daemon replies made ready (held RELEASEs, next WRITE parts), in order.
    /// Returns whether there was anything.
    pub(super) fn send_outbox(&self, io: &mut PumpIo) -> bool {
        let mut any = false;
        while let Some(out) = io.outbox.pop_front() {
            match out {
                Outgoing::Release(msg, local) => self.release_held(&msg, local, io),
                Outgoing::Part(unique, msg) => {
                    self.send_part(unique, &msg, io);
                }
            }
            any = true;
        }
        any
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
    /// writable or (`readable`: also) readable. Returns (readable, writable); readable includes
    /// HUP and ERR.
    fn wait_socket(&self, timeout: Duration, readable: bool) -> (bool, bool) {
        let events = if readable {
            PollFlags::POLLIN | PollFlags::POLLOUT
        } else {
            PollFlags::POLLOUT
        };
        let mut fds = [PollFd::new(self.sock.as_fd(), events)];
        let t = PollTimeout::try_from(timeout.as_millis().clamp(1, 60_000) as i32)
            .unwrap_or(PollTimeout::MAX);
        if poll(&mut fds, t).is_err() {
            return (false, false);
        }
        let r = fds[0].revents().unwrap_or(PollFlags::empty());
        (
            readable && r.intersects(PollFlags::POLLIN | PollFlags::POLLHUP | PollFlags::POLLERR),
            r.contains(PollFlags::POLLOUT),
        )
    }

    /// Reads one kernel request if one is ready (on a blocking fd: waits for one) and handles
    /// it. Returns whether one was read.
    pub(super) fn read_one(&self, io: &mut PumpIo) -> bool {
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
        let t0 = Instant::now();
        let mut kbuf = std::mem::take(&mut io.kbuf);
        self.on_request(&mut kbuf[..n], io);
        io.kbuf = kbuf;
        self.profile.to_daemon.observe(t0.elapsed());
        true
    }

    /// Receives one daemon message if one is ready (`block`: waits for one) and handles it.
    /// Returns whether one was received; at the daemon's EOF (or a socket error) answers
    /// everything in flight EIO, marks the socket closed and returns false.
    pub(super) fn recv_one(&self, io: &mut PumpIo, block: bool) -> bool {
        // MSG_TRUNC: the return value is the datagram's real length, so truncation shows.
        let flags = if block {
            MsgFlags::MSG_TRUNC
        } else {
            MsgFlags::MSG_TRUNC | MsgFlags::MSG_DONTWAIT
        };
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
                let t0 = Instant::now();
                let dbuf = std::mem::take(&mut io.dbuf);
                self.on_reply(&dbuf[..n], io);
                io.dbuf = dbuf;
                self.profile.to_kernel.observe(t0.elapsed());
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
        self.on_daemon_eof(reset);
        false
    }

    /// One `send(2)` of one datagram to the daemon, without waiting (in tests, failing with
    /// ENOBUFS while `inject_enobufs` counts down).
    fn send_raw(&self, msg: &[u8]) -> Result<usize, Errno> {
        #[cfg(test)]
        if self
            .inject_enobufs
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |n| n.checked_sub(1),
            )
            .is_ok()
        {
            return Err(Errno::ENOBUFS);
        }
        let flags = MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT;
        nix::sys::socket::send(self.sock.as_raw_fd(), msg, flags)
    }

    /// One datagram to the daemon; EINTR retried at once. While the socket is full
    /// (EAGAIN/ENOBUFS) the daemon's replies keep being received and written to the kernel,
    /// by this thread when it is the one that receives them ([`PumpIo::receives`]), else by
    /// the other (a daemon blocked on sending its replies then gets room to read again), and
    /// the send is retried when the socket polls writable or after a backoff of 1 ms doubling
    /// to 64 ms, for as long as it takes: a slow daemon is waited for, as the kernel's own
    /// queue would wait. EPIPE when the daemon's end closes meanwhile, or once the relay has
    /// stopped (SHUT_WR).
    pub(super) fn send(&self, msg: &[u8], io: &mut PumpIo) -> Result<(), Errno> {
        let mut backoff = BACKOFF_START;
        loop {
            match self.send_raw(msg) {
                Ok(_) => return Ok(()),
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN | Errno::ENOBUFS) => {
                    let (readable, writable) = self.wait_socket(backoff, io.receives);
                    if readable {
                        while io.daemon_open && self.recv_one(io, false) {}
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
}

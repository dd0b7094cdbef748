//! The threads pump ([`PumpMode::Threads`]): two threads, each blocked in the system call that
//! brings its next message, so neither polls nor spins.
//!
//! - **Kernel side** (`relay-kernel`): `read(2)` on the kernel's fd, made blocking; each request
//!   is handled as in the poll pump ([`Relay::on_request`]: counted, admitted under the state
//!   mutex, forwarded). It is the only reader of the kernel fd and the only sender of kernel
//!   requests, so the kernel's order (INTERRUPT after its original, FORGET after the LOOKUP
//!   reply it follows) is kept end to end. A send that finds the socket full only waits for
//!   room: the daemon side keeps receiving meanwhile, so a daemon blocked on its replies gets
//!   room to read again.
//! - **Daemon side** (`relay-daemon`): `recv(2)` on the socket; each daemon message is handled
//!   as in the poll pump ([`Relay::on_reply`]: routed by `unique`, written to the kernel,
//!   completed). What a reply makes ready to send (a RELEASE whose FSYNC of the relay's own was
//!   answered, the next part of a split WRITE) it sends itself, receiving while the socket is
//!   full, as the poll pump does.
//!
//! What both threads share is what the poll pump shares with the lifecycle already: the
//! in-flight state (one mutex, where a request is registered before it is sent, so its reply
//! always finds it), the split requests and the held RELEASEs (leaf mutexes, filled before the
//! send that their reply answers). Both datagram directions are atomic on a SEQPACKET socket,
//! so the two threads' sends never interleave within a message.
//!
//! Ends: the kernel side ends when the kernel's fd reaches EOF or an error (the kernel side of
//! the connection is gone: [`Relay::on_kernel_gone`], which sends SHUT_WR); the daemon side at
//! the daemon's EOF ([`Relay::on_daemon_eof`], which answers every request in flight EIO;
//! requests read after that are answered EIO at admission). The kernel side then waits for the
//! daemon side and drops the notifier's queue, as the poll pump does when both fds are done.
//!
//! [`PumpMode::Threads`]: super::PumpMode::Threads

use std::sync::Arc;
use std::thread::JoinHandle;

use super::Relay;
use super::pump::{PumpIo, set_nonblocking};
use crate::relay::init;

impl Relay {
    /// The kernel side's body: reads and handles kernel requests until the kernel's fd is
    /// done, then waits for `daemon_side` and ends the notifier's queue.
    pub(super) fn kernel_side(self: Arc<Self>, daemon_side: JoinHandle<()>) {
        let mut io = PumpIo::new(init::read_buffer(self.limits.kernel_cap), 0, false);
        if let Err(e) = set_nonblocking(&self.kernel, false) {
            tracing::error!(error = %e, "relay: cannot make the FUSE connection blocking");
            self.on_kernel_gone(e);
            io.kernel_open = false;
        }
        while io.kernel_open {
            self.read_one(&mut io);
            // A RELEASE whose FSYNC could not be sent goes on at once.
            self.send_outbox(&mut io);
        }
        let _ = daemon_side.join();
        // Ends the notifier once it has written what is queued.
        self.notify_tx.lock().take();
    }

    /// The daemon side's body: receives and handles daemon messages until the daemon's end is
    /// gone, sending after each what it made ready.
    pub(super) fn daemon_side(self: Arc<Self>) {
        let mut io = PumpIo::new(0, self.limits.daemon_recv_buffer, true);
        while io.daemon_open {
            self.recv_one(&mut io, true);
            self.send_outbox(&mut io);
        }
    }
}

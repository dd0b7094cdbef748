//! The end of the stream, on either side. Where the relay closes the daemon's socket:
//! [`Relay::stop`] shuts the relay's end down for writing (SHUT_WR), so the daemon reads EOF
//! and exits cleanly, while the pump keeps reading the daemon's late replies until the daemon
//! closes its end. Also: the kernel side going away (handles that will never be released,
//! files whose writes may be lost, then [`Relay::stop`]), the daemon's EOF or reset, and
//! answering every request still in flight EIO ([`Relay::fail_all`]).

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;

use nix::errno::Errno;
use nix::sys::socket::Shutdown;

use super::{EngineEvent, Relay};
use crate::relay::inflight::is_own_unique;
use crate::relay::proto;

impl Relay {
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
        self.splits.lock().clear();
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

    /// The daemon's end reached EOF (`reset`: ECONNRESET or another socket error): answers
    /// every request in flight EIO and reports [`EngineEvent::DaemonEof`]. An EOF after the
    /// relay's own SHUT_WR is the clean end, logged at info; any other one as an error.
    pub(super) fn on_daemon_eof(&self, reset: bool) {
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

    /// The kernel side of the connection is gone (read gave `e`, or EOF as ENODEV): every
    /// handle stops counting, files open for writing with unsynced changes are recorded as
    /// lost writes, the daemon is sent EOF ([`Relay::stop`]) and
    /// [`EngineEvent::KernelGone`] is reported.
    pub(super) fn on_kernel_gone(&self, e: Errno) {
        tracing::info!(error = %e, "relay: the kernel side of the FUSE connection is gone");
        self.kernel_gone.store(true, Ordering::SeqCst);
        // No RELEASE will ever come: the handles stop counting. A file open for writing with
        // writes since its last successful FLUSH lost its connection before its close
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
}

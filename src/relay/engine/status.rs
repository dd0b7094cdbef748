//! What the lifecycle reads from a running relay: [`RelayStatus`] (the relay's part of
//! `/status` and of the shutdown summary), the counters, the open and failed files, the flags
//! (kernel gone, daemon gone, INIT failed or refused), the accounting's outstanding counts; and
//! the door it closes when a drain starts.

use std::sync::atomic::Ordering;

use serde::Serialize;

use super::profile::ProfileSnapshot;
use super::{Limits, Relay};
use crate::accounting::{HandleMode, Outstanding};
use crate::relay::inflight::Counters;
use crate::relay::init::InitCaps;

/// The relay's part of `/status` and of the shutdown summary.
#[derive(Debug, Clone, Serialize)]
pub struct RelayStatus {
    /// What INIT negotiated (once the daemon answered it).
    pub init: Option<InitCaps>,
    /// The message payload cap in use (bytes).
    pub cap: Option<u32>,
    /// How the relay waits for messages: `threads` or `poll` (`--pump`).
    pub pump: &'static str,
    /// How long the poll pump keeps polling after a message before it sleeps (µs; `--spin`;
    /// 0 with the threads pump).
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
    /// The payload cap the kernel was given (bytes; above `cap`, READs and WRITEs are split).
    pub kernel_cap: Option<u32>,
    /// The WRITE part size in use (bytes).
    pub write_part: u32,
    /// Where messages' time goes inside the relay, and READ/WRITE sizes.
    pub profile: ProfileSnapshot,
}

impl Relay {
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
            pump: self.pump_mode.name(),
            spin_us: self.pump_mode.spin().as_micros() as u64,
            buffer_cap: self.limits.buffer_cap,
            sndbuf_relay: self.limits.sndbuf_relay,
            sndbuf_daemon: self.limits.sndbuf_daemon,
            awaiting_daemon: s.in_flight(),
            kernel_gone: self.kernel_gone(),
            daemon_gone: s.is_daemon_gone(),
            known_nodeids: s.known_names(),
            counts: s.counters.clone(),
            kernel_cap: self.limits.kernel_cap,
            write_part: self.write_part.load(Ordering::Relaxed),
            profile: self.profile.snapshot(),
        }
    }

    /// Requests the relay has forwarded and awaits the daemon's reply for.
    pub fn in_flight(&self) -> usize {
        self.state.lock().in_flight()
    }

    /// Paths of the open handles (files open for writing first), at most `cap`; a path
    /// the relay has not seen whole shows the nodeid where it stops (`<nodeid N>/name`).
    pub fn open_paths(&self, cap: usize) -> Vec<(String, HandleMode)> {
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
}

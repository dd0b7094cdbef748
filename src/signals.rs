//! Signal handling without signal handlers.
//!
//! [`block_all`] runs first in `main`, before any thread exists, so every thread drainfs ever
//! creates (FUSE workers, tokio, helpers) inherits a mask with the handled signals blocked.
//! One dedicated thread ([`spawn_waiter`]) takes them from a signalfd. Consequently no signal
//! is ever delivered to a thread blocked in a lower FLUSH or FSYNC: such a delivery would make
//! the kernel send FUSE INTERRUPT to gcsfuse and cancel the upload.
//! Children inherit the mask through `fork` and `exec` (std's `Command` keeps it), so
//! [`crate::procs::spawn`] empties it in the child before `exec`.

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};

/// The signals drainfs consumes: SIGTERM and SIGINT (triggers), SIGCHLD (the reaper), and
/// every other signal whose default action would end the process without a teardown (a stray
/// `kill -USR2` or an alarm must not leave a dead mount and an orphaned lower): those are
/// logged and ignored. SIGPIPE stays ignored as Rust sets it (a failed write returns EPIPE).
pub const HANDLED: [Signal; 15] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGCHLD,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
    Signal::SIGVTALRM,
    Signal::SIGPROF,
    Signal::SIGIO,
    Signal::SIGPWR,
    Signal::SIGXCPU,
    Signal::SIGXFSZ,
    Signal::SIGSTKFLT,
];

fn set() -> SigSet {
    let mut s = SigSet::empty();
    for sig in HANDLED {
        s.add(sig);
    }
    s
}

/// Resets the handled signals to their default dispositions (a bash `cmd &` starts commands
/// with SIGINT ignored) and blocks them in the calling thread. Call before spawning threads.
///
/// # Errors
/// The errno of `sigaction`/`pthread_sigmask` (never expected).
pub fn block_all() -> nix::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, sigaction};
    for sig in HANDLED {
        let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
        // SAFETY: installing SIG_DFL has no handler code to be unsafe.
        unsafe { sigaction(sig, &dfl) }?;
    }
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&set()), None)
}

/// Starts the signal thread. Every signal but SIGCHLD is passed to `on_signal` (which returns
/// false to stop the thread); SIGCHLD, and the times [`crate::procs::reap`] asks to be called
/// again at, run [`crate::procs::reap`], which delivers owned children's statuses and collects
/// orphans.
///
/// # Errors
/// `signalfd` or thread spawn failure.
pub fn spawn_waiter(on_signal: impl Fn(Signal) -> bool + Send + 'static) -> std::io::Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    use std::os::fd::AsFd;
    use std::time::Instant;
    let fd = SignalFd::with_flags(&set(), SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)?;
    std::thread::Builder::new()
        .name("drainfs-signals".into())
        .spawn(move || {
            // Children that exited before this thread ran left one SIGCHLD pending at most,
            // which the first read below also returns; reaping first costs nothing.
            let mut recheck = crate::procs::reap();
            loop {
                let timeout = match recheck {
                    None => PollTimeout::NONE,
                    Some(at) => {
                        // Rounded up to whole milliseconds, so the wake-up is never early.
                        let left = at.saturating_duration_since(Instant::now());
                        let ms = left.as_micros().div_ceil(1000);
                        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
                    }
                };
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                let _ = poll(&mut fds, timeout);
                let mut chld = recheck.is_some_and(|at| Instant::now() >= at);
                while let Ok(Some(info)) = fd.read_signal() {
                    match Signal::try_from(info.ssi_signo as i32) {
                        Ok(Signal::SIGCHLD) => chld = true,
                        Ok(sig) => {
                            if !on_signal(sig) {
                                return;
                            }
                        }
                        Err(_) => {}
                    }
                }
                if chld {
                    recheck = crate::procs::reap();
                }
            }
        })?;
    Ok(())
}

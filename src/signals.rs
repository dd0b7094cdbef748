//! Signal handling without signal handlers.
//!
//! [`block_all`] runs first in `main`, before any thread exists, so every thread drainfs ever
//! creates (FUSE workers, tokio, helpers) inherits a mask with the handled signals blocked.
//! One dedicated thread ([`spawn_waiter`]) takes them with `sigwait`. Consequently no signal is
//! ever delivered to a thread blocked in a lower FLUSH or FSYNC: such a delivery would make the
//! kernel send FUSE INTERRUPT to gcsfuse and cancel the upload (FIELD-NOTES section 1).
//! Children get a clean mask: std's `Command` resets the mask before `exec`.

use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};

/// The signals drainfs consumes.
pub const HANDLED: [Signal; 6] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGCHLD,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
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
/// false to stop the thread); SIGCHLD reaps children ([`crate::procs::reap`]), which delivers
/// their statuses to whoever spawned them.
///
/// # Errors
/// Thread spawn failure.
pub fn spawn_waiter(on_signal: impl Fn(Signal) -> bool + Send + 'static) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("drainfs-signals".into())
        .spawn(move || {
            let set = set();
            crate::procs::reap();
            loop {
                match set.wait() {
                    Ok(Signal::SIGCHLD) => crate::procs::reap(),
                    Ok(sig) => {
                        if !on_signal(sig) {
                            return;
                        }
                    }
                    Err(_) => continue,
                }
            }
        })?;
    Ok(())
}

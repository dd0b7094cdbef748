//! drainfs's lifecycle, for both data paths, in the order it runs. Each step names the file
//! of this folder that carries it out.
//!
//! 1. **Start** ([`run`], here): the shared state (`shared.rs`: phase, cause, deadline,
//!    counters, for `/status`, probes and metrics), the triggers ([`crate::triggers`]), and the
//!    executor (`executor.rs`), which holds the drain machine ([`crate::drain::Machine`],
//!    where every decision is made) and carries out its steps.
//! 2. **The lower**: its process (`lower.rs`: spawned from `-- COMMAND`, adopted, or the
//!    relay's daemon, already running) and the executor's steps for it (`supervise.rs`: wait
//!    for its mount to appear, stop it, judge how it ended, remove a lingering mount).
//! 3. **The data path**, one trait (`data_path.rs`: start, serve events, what is open, tear
//!    down), one file per path, chosen in [`run`]: `handoff_path.rs` serves nothing (gcsfuse
//!    holds the kernel's connection; drainfs starts it, watches its I/O counters, and ends it
//!    once idle after a trigger, with a summary of its own); `mount_path.rs` mounts a passthrough view of
//!    the lower's directory; `relay_path.rs` relays a FUSE connection to the lower's process
//!    (its daemon) over a socketpair ([`crate::relay`]): the daemon is the lower, its end of
//!    the socket is its "mount", and stopping it is `shutdown(SHUT_WR)` (it reads EOF,
//!    finishes and exits), never a signal. Both count into the same
//!    [`Accounting`], so the door, `/status`, metrics, probes,
//!    the ready file and the summary are the same.
//! 4. **Serving and draining** (`serve.rs`): triggers only *send* [`Event`]s: signals (the
//!    signal thread), exit files and the watched process, control requests, the lower's
//!    process exiting (the reaper), the lower's connection failing (the core), drainfs's own
//!    mount going away (the session). The executor feeds them and observations of the counts
//!    (door first) to the machine and carries out its steps: close the door, then begin the
//!    teardown once drained or forced. Every phase change is logged once with its cause.
//! 5. **Teardown** (the data path's file; the lower's stop in `supervise.rs`): unmount, close
//!    the lower fds, stop the lower (drained: drainfs unmounts the lower's mount and it exits
//!    by itself), remove its lingering mount. Every wait is bounded by a
//!    [`crate::drain::Budget`] and re-bounded when a trigger (a second signal) arrives during
//!    it ([`crate::drain::Machine::budget`] computes the deadline and each step's budget).
//! 6. **Exit** ([`run`], here): the exit code from what the teardown recorded
//!    ([`crate::drain::exit_code`] chooses it), the summary built from the same record
//!    ([`crate::summary::Summary::new`]), logged and written, and the signal drainfs ends by,
//!    if any ([`Exit`]).

mod data_path;
mod executor;
mod handoff_path;
mod lower;
mod mount_path;
mod relay_path;
mod serve;
mod shared;
mod supervise;

use std::sync::Arc;

use nix::sys::signal::Signal;
use tokio::sync::{mpsc, oneshot};

use crate::accounting::Accounting;
use crate::config::{CleanSigtermExit, RunConfig};
use crate::relay::run::Prepared;
use crate::{summary, triggers};
use executor::Executor;
use handoff_path::HandoffPath;
use mount_path::MountPath;
use relay_path::RelayPath;

pub use crate::drain::{Cause, CauseKind, ExitCode, Forced, Phase, Source};
pub use crate::summary::Timings;
pub use crate::triggers::Event;
pub use lower::clean_stop;
pub use shared::{Control, Shared, Snapshot};

/// How `run` ends: the exit status, and (relay) a signal to end the process by instead.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    /// The exit status (128+N when `raise` is set, for when raising it does not end the
    /// process).
    pub code: i32,
    /// The relay's daemon died of this signal (one drainfs did not send): the caller raises it
    /// on drainfs after the cleanup, so that a supervisor sees the daemon's death as it would
    /// have without drainfs (Go's exec: "signal: killed").
    pub raise: Option<Signal>,
}

/// Runs drainfs: supervise/adopt the lower, mount (or, with `relay`, relay the prepared
/// connection to the daemon already started on it), serve, drain, tear down. Returns the exit
/// status. `lower` and `mountpoint` in `cfg` must already be absolute (see
/// [`crate::mount::preflight`]). `on_control` receives the handles of the admin server and
/// control socket once the shared state exists.
pub async fn run(
    cfg: RunConfig,
    relay: Option<Prepared>,
    events_tx: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    on_control: impl FnOnce(Control),
) -> Exit {
    let acct = Accounting::new();
    let shared = Shared::new(Arc::clone(&acct), &cfg);
    on_control(Control {
        events: events_tx.clone(),
        shared: Arc::clone(&shared),
    });
    triggers::start(&cfg.lifecycle, events_tx.clone());
    let mut ex = Executor::new(cfg, shared, events, acct);
    if ex.cfg.handoff.is_some() {
        ex.run_path::<HandoffPath>(()).await;
        let (s, exit) = handoff_path::finish(&mut ex);
        s.emit(
            ex.cfg.lifecycle.summary_file.as_deref(),
            ex.cfg.lifecycle.termination_log.as_deref(),
        );
        return exit;
    }
    let code = match relay {
        Some(p) => ex.run_path::<RelayPath>(p).await,
        None => ex.run_path::<MountPath>(()).await,
    };
    let mut s = ex.finish(code);
    let raise = ending_signal(&ex, code, &mut s);
    summary::emit(
        &s,
        ex.cfg.lifecycle.summary_file.as_deref(),
        ex.cfg.lifecycle.termination_log.as_deref(),
    );
    Exit {
        code: raise.map_or(s.exit_code, |sig| 128 + sig as i32),
        raise,
    }
}

/// The signal drainfs ends by, if any, noted in the summary `s`: the one its relay's daemon
/// died of (exit 69, which the summary keeps; the process's status is then that signal, or
/// 128+N if raising it does not end the process), or SIGTERM for a clean stop by
/// SIGTERM with `--clean-sigterm-exit signal` (the summary keeps exit code 0, the process
/// ends as a terminated gcsfuse would).
fn ending_signal(ex: &Executor, code: ExitCode, s: &mut summary::Summary) -> Option<Signal> {
    // A daemon killed by drainfs (LowerStop::Killed) is reported by the exit code, not raised.
    let raise = ex.record.raise.filter(|_| code == ExitCode::LowerFailed);
    if let Some(sig) = raise {
        s.notes.push(format!(
            "the daemon died of {}: drainfs ends by the same signal (its exit status is that signal's, not 69)",
            sig.as_str()
        ));
    }
    let clean_by_signal = code == ExitCode::Clean
        && matches!(ex.machine.first_trigger(), Some((_, Cause::Sigterm)))
        && ex
            .cfg
            .relay
            .as_ref()
            .is_some_and(|o| o.clean_sigterm_exit == CleanSigtermExit::Signal);
    if clean_by_signal {
        s.notes
            .push("clean: drainfs ends by SIGTERM (--clean-sigterm-exit signal)".to_string());
    }
    raise.or(clean_by_signal.then_some(Signal::SIGTERM))
}

/// A quarter of RLIMIT_NOFILE (soft limit), at least 64.
pub fn default_fd_budget() -> usize {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| (soft / 4) as usize)
        .unwrap_or(256)
        .max(64)
}

/// Runs `f` on a thread of its own (not the runtime's blocking pool: a call stuck in a wedged
/// lower must not hold a pool thread the runtime waits for at shutdown). If the awaiting
/// future is dropped, the thread finishes on its own.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.await {
        Ok(v) => v,
        Err(_) => std::future::pending().await,
    }
}

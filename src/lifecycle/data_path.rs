//! What a data path is to the lifecycle: one trait ([`DataPath`]) that each path implements
//! in its own file ([`super::mount_path`], [`super::relay_path`], [`super::handoff_path`]). The executor starts the
//! path, serves it (it waits on [`DataPath::next_event`] beside triggers and the lower's
//! process), asks it what is open when the teardown is forced, and hands it the teardown.
//! A new path (GKE's shared node mounter, say) is one new file implementing this trait, its
//! `mod` line, and one line in [`super::run`] choosing it.

use super::executor::Executor;
use crate::drain::{Ending, ExitCode};
use crate::fs::Admission;

/// What a data path reports while serving.
pub(super) enum PathEvent {
    /// The lower's side failed (its FUSE connection, or the relay's daemon closed its end).
    LowerGone(String),
    /// drainfs's own mount (or the relay's kernel connection) went away from outside.
    Unmounted(String),
    /// Nothing the lifecycle acts on.
    Nothing,
}

/// A data path: how drainfs serves the kernel's FUSE requests, from start to teardown.
/// Both paths count into the executor's [`crate::accounting::Accounting`], so the door,
/// the drain, `/status`, the metrics and the summary are the same for every path.
pub(super) trait DataPath: Sized {
    /// What starting takes beyond the configuration (the relay: its prepared connection).
    type Start;

    /// Starts the lower (or takes over the one already started), then the data path, and
    /// tells the executor it serves ([`Executor::serving`]). `Err(code)` when drainfs must
    /// exit without serving (everything it started is already stopped).
    async fn start(ex: &mut Executor, with: Self::Start) -> Result<Self, ExitCode>;

    /// Waits for the next thing the data path reports. `lower_died`: the lower's death is
    /// already known (not reported again).
    async fn next_event(&mut self, admission: &Admission, lower_died: bool) -> PathEvent;

    /// Paths of the handles still open (at most `max`, files open for writing first).
    fn open_paths(&self, max: usize) -> Vec<String>;

    /// Opens and creates admitted and still in flight (at most `max`), by path.
    fn admitted_paths(&self, max: usize) -> Vec<String>;

    /// The kernel side of the connection is gone (a relay's: the daemon's EOF and exit that
    /// follow are the consequence, not a death of its own).
    fn kernel_gone(&self) -> bool {
        false
    }

    /// drainfs's mount was removed from outside ([`PathEvent::Unmounted`]): no request can
    /// arrive any more; closes what the kernel will never release.
    async fn unmounted_externally(&mut self, ex: &mut Executor);

    /// The provisional summary to write while stopping, when the path has its own kind of
    /// summary (the hand-off's); `None`: the executor's [`crate::summary::Summary`].
    fn provisional(&self, _ex: &Executor) -> Option<crate::summary::LogEntry> {
        None
    }

    /// Tears the path down after serving ended with `ending` (the door is closed): unmount,
    /// close, stop the lower. Returns the exit code.
    async fn teardown(self, ex: &mut Executor, ending: Ending) -> ExitCode;
}

/// How serving ended, as the cause logged with the teardown's phase changes.
pub(super) fn ending_name(ending: Ending) -> &'static str {
    match ending {
        Ending::Drained => "drained",
        Ending::Forced(r) => r.name(),
    }
}

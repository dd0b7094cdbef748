//! The drain decision: a pure state machine, shared by both data paths (the passthrough mount
//! and the relay).
//!
//! Inputs are [`Cause`]s (triggers), [`Observation`]s (the door's state and the outstanding
//! counts, read in that order) and the time; outputs are [`Step`]s (wait until, close the door,
//! tear down) and, at the end, an [`ExitCode`]. Nothing here reads a clock, a counter or a file,
//! so every ordering can be unit-tested with fake time; the executors
//! ([`crate::lifecycle`], [`crate::relay`]) do the I/O.
//!
//! # Phases
//! `starting` (the lower is starting; nothing mounted) → `serving` → `draining` (a trigger
//! arrived; the door stays open while the workload may still be shutting down) →
//! `door_closed` (new opens, creates and namespace changes get `ESHUTDOWN`) → `unmounting` →
//! `stopping_lower` → `done`.
//!
//! # The door and the counts
//! The machine declares "drained" only from an observation whose counts were read *after* the
//! door was seen closed ([`Observation::door_closed`] is read first). Together with the data
//! path's side (an admitted request is counted in flight *before* it checks the door, see
//! [`crate::gate`]), this means a request that got past the door is always in the counts the
//! machine decides on. An executor must also register for change notifications *before* it
//! reads an observation, or a change in between is a lost wake-up.
//!
//! # Late requests
//! Once drained with the door closed, the mount is kept (refusing new opens) for [`SETTLE`]
//! after the last request that arrived *after the door closed* ([`Observation::since_late`]):
//! such a request shows that a process is still using the mount, and once drainfs unmounts
//! its next write would land in the directory underneath. Requests served before the door
//! closed never hold it, so a stop right after the workload's last write (a Job's last close,
//! then its SIGTERM) is torn down at once.
//!
//! # Read-only requests
//! READ, GETATTR, LOOKUP, READDIR... in flight never hold the drain and never make the
//! outcome incomplete ([`Outstanding::is_drained`]); the teardown cuts them off, and
//! [`Machine::at_teardown`] says how many there were (the summary notes them).
//!
//! # Deadlines
//! The first trigger starts the clock `t0`. Outstanding work is waited for until
//! `force_at = t0 + grace_period − margin`; the process must be gone by
//! `hard_exit = t0 + grace_period − margin/4`, before the kubelet's SIGKILL. `margin` is
//! `--grace-margin`, at most half the grace period. A forced teardown (deadline, second signal,
//! lower dead) gets budgets from [`Machine::budget`], all ending before `hard_exit`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;
use strum::{EnumDiscriminants, EnumIter, IntoStaticStr};

use crate::accounting::Outstanding;

/// Lifecycle phase. Ordered: later phases compare greater.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, EnumIter, IntoStaticStr,
)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Phase {
    /// Waiting for the lower's mount.
    Starting,
    /// Mounted and serving.
    Serving,
    /// A trigger arrived; admission still open until the mount is quiet or the workload gone.
    Draining,
    /// Admission closed; waiting for outstanding work.
    DoorClosed,
    /// Unmounting drainfs (or, for the relay, ending the daemon's connection).
    Unmounting,
    /// Stopping the lower's process.
    StoppingLower,
    /// Finished.
    Done,
}

impl Phase {
    /// Label value (`door_closed`).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Why shutdown started (or was escalated). The label of each variant is its
/// [`CauseKind`]'s snake_case name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, EnumDiscriminants)]
#[serde(rename_all = "snake_case", tag = "cause")]
#[strum_discriminants(
    name(CauseKind),
    derive(EnumIter, IntoStaticStr, Hash),
    strum(serialize_all = "snake_case")
)]
pub enum Cause {
    /// SIGTERM.
    Sigterm,
    /// SIGINT.
    Sigint,
    /// An exit file appeared.
    ExitFile {
        /// Which one.
        path: PathBuf,
    },
    /// The watched workload process exited.
    WatchedPidExited {
        /// Its PID.
        pid: i32,
    },
    /// A quit request (`/quitquitquit`, `drainfs shutdown`).
    QuitRequest {
        /// Where it came from.
        source: Source,
    },
    /// A drain request (`/drain`, `drainfs drain`): start draining, workload may still run.
    DrainRequest {
        /// Where it came from.
        source: Source,
    },
    /// The lower's process exited or its connection failed.
    LowerDied {
        /// What was seen.
        detail: String,
    },
    /// drainfs's own mount (or the relay's kernel connection) was removed by someone else.
    UnmountedExternally,
    /// drainfs's control plane (the admin server, the control socket) could not start or
    /// failed: drainfs drains as for SIGINT and exits 1, since its probes cannot be answered.
    ControlPlaneFailed {
        /// What failed.
        detail: String,
    },
}

/// Where a control request came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Source {
    /// The admin HTTP server.
    Http,
    /// The control socket.
    Control,
}

impl Cause {
    /// Short label for metrics and logs (`exit_file`).
    pub fn label(&self) -> &'static str {
        CauseKind::from(self).into()
    }

    /// Whether this cause means the workload is gone (so the door can close at once):
    /// exit files, the watched pid, quit requests, the lower dying and an external unmount
    /// always; SIGTERM only for a native sidecar (the kubelet signals it after every main
    /// container exited); SIGINT and drain requests never.
    pub fn workload_gone(&self, native_sidecar: bool) -> bool {
        match self {
            Cause::ExitFile { .. }
            | Cause::WatchedPidExited { .. }
            | Cause::QuitRequest { .. }
            | Cause::LowerDied { .. }
            | Cause::UnmountedExternally => true,
            Cause::Sigterm => native_sidecar,
            Cause::Sigint | Cause::DrainRequest { .. } | Cause::ControlPlaneFailed { .. } => false,
        }
    }

    fn is_signal(&self) -> bool {
        matches!(self, Cause::Sigterm | Cause::Sigint)
    }
}

impl CauseKind {
    /// Label value.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Why a teardown was forced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, EnumIter, IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum Forced {
    /// The deadline (grace period minus margin) passed with work outstanding.
    Deadline,
    /// A second SIGTERM/SIGINT: stop waiting.
    SecondSignal,
    /// The lower died: nothing outstanding can be synced any more.
    LowerDied,
    /// The lower's process had to be SIGKILLed.
    LowerSigkill,
}

impl Forced {
    /// Label value.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// drainfs's exit status (sysexits where one fits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ExitCode {
    /// 0: everything drained and synced, the lower stopped cleanly.
    Clean,
    /// 1: drainfs itself could not mount or serve.
    Failed,
    /// 2: bad command line or configuration (as clap uses).
    Usage,
    /// 69 (EX_UNAVAILABLE): the lower failed to start, failed, or died.
    LowerFailed,
    /// 75 (EX_TEMPFAIL): forced with work outstanding, or a lower flush/close failed: data
    /// may be incomplete.
    Incomplete,
    /// 69 (EX_UNAVAILABLE), `status`, `drain` and `shutdown`: drainfs could not be reached on
    /// its control socket (`wait` retries until its `--timeout` instead).
    Unreachable,
    /// 124, `drainfs wait`: the mount did not serve within `--timeout` (GNU `timeout`'s code;
    /// says nothing about data, unlike 75).
    WaitTimedOut,
}

impl ExitCode {
    /// The numeric status.
    pub fn code(self) -> i32 {
        match self {
            ExitCode::Clean => 0,
            ExitCode::Failed => 1,
            ExitCode::Usage => 2,
            ExitCode::LowerFailed | ExitCode::Unreachable => 69,
            ExitCode::Incomplete => 75,
            ExitCode::WaitTimedOut => 124,
        }
    }

    /// The summary's `outcome` (`clean`, `failed`, `usage`, `lower_failed`, `incomplete`,
    /// `unreachable`, `wait_timed_out`).
    pub fn outcome(self) -> &'static str {
        self.into()
    }
}

/// How the supervised lower's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LowerStop {
    /// drainfs does not supervise a process (adopted lower without a pid).
    NotSupervised,
    /// Exited 0, or by the stop signal drainfs sent.
    Clean,
    /// Exited otherwise (non-zero, another signal), or did not exit in time.
    Unclean,
    /// Had to be SIGKILLed.
    Killed,
}

/// What the teardown found, for [`exit_code`].
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The lower died (or never came up) before the stop.
    pub lower_died: bool,
    /// How its process ended (`None`: not stopped, e.g. never started).
    pub lower_stop: Option<LowerStop>,
    /// Why the teardown was forced.
    pub forced: Option<Forced>,
    /// What was outstanding (read with the door closed) when it was forced.
    pub outstanding_at_force: Option<Outstanding>,
    /// Lower flushes or closes that failed (uploads that may be missing).
    pub failed_flushes: usize,
    /// drainfs could not mount or serve.
    pub failed: bool,
    /// What was outstanding when the lower's process had to be SIGKILLed
    /// ([`Machine::outstanding_at_kill`]).
    pub outstanding_at_kill: Option<Outstanding>,
    /// Read-only requests in flight when the teardown began ([`Machine::at_teardown`]): the
    /// teardown may have cut them off (ending the lower's connection) before the kill.
    pub reads_at_teardown: i64,
    /// A close of the lower fds drainfs held did not finish within its budget: its result (an
    /// upload) is unknown.
    pub closes_unfinished: bool,
    /// The relay's daemon never answered INIT: nothing but INIT reached it (the kernel holds
    /// every other request of the connection until INIT is answered), so it holds nothing
    /// of the workload's, whatever it was doing when it was SIGKILLed.
    pub never_served: bool,
}

/// The exit status for an outcome: 69 when the lower died or stopped uncleanly on its own;
/// 75 when work was outstanding at a force, a flush failed, a close of a lower fd did not
/// finish, or the lower was SIGKILLed (unless read-only requests explain it, below); 1 when
/// drainfs itself failed; else 0.
///
/// A lower SIGKILLed with nothing but read-only requests outstanding
/// ([`Outstanding::is_drained`] at the kill) while such requests were in flight (at the kill,
/// or when the teardown began and then cut them off) loses nothing: gcsfuse (jacobsa/fuse's
/// `ServeOps`) waits for its in-flight ops before it exits, so a READ it cannot answer (the
/// bucket unreachable) makes it miss its stop budget although every upload is done. A lower
/// killed with nothing visible outstanding stays 75: it was busy with work of its own (an
/// upload drainfs cannot see, such as rclone's write-back, or a read that kernel passthrough
/// kept out of drainfs's counts, or a writer on the lower's own mount), unless the lower is
/// the relay's daemon and never answered INIT (`never_served`: SIGKILLed while still
/// starting), which leaves it nothing of the workload's to lose.
pub fn exit_code(o: &Outcome) -> ExitCode {
    if o.lower_died || (o.lower_stop == Some(LowerStop::Unclean) && o.forced.is_none()) {
        return ExitCode::LowerFailed;
    }
    if o.failed {
        return ExitCode::Failed;
    }
    let forced_with_work =
        o.forced.is_some() && o.outstanding_at_force.is_some_and(|w| !w.is_drained());
    let killed_with_work = o.lower_stop == Some(LowerStop::Killed)
        && !o.never_served
        && !o
            .outstanding_at_kill
            .is_some_and(|w| kill_explained_by_reads(&w, o.reads_at_teardown));
    if forced_with_work || o.failed_flushes > 0 || o.closes_unfinished || killed_with_work {
        return ExitCode::Incomplete;
    }
    ExitCode::Clean
}

/// Whether read-only requests explain a SIGKILL of the lower (see [`exit_code`]): nothing
/// but read-only work was outstanding at the kill (`at_kill`), and read-only requests were in
/// flight then or when the teardown began (`reads_at_teardown`, [`Machine::at_teardown`]).
pub fn kill_explained_by_reads(at_kill: &Outstanding, reads_at_teardown: i64) -> bool {
    at_kill.is_drained() && (at_kill.in_flight_read > 0 || reads_at_teardown > 0)
}

/// Timing configuration of the machine.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// The pod's `terminationGracePeriodSeconds` (from the first trigger).
    pub grace_period: Duration,
    /// Safety margin before the grace period ends (at most half of it is used).
    pub grace_margin: Duration,
    /// After a trigger that does not mean the workload is gone, how long the mount must be idle
    /// (counted from the trigger at the earliest) before the door closes.
    pub quiet_period: Duration,
    /// SIGTERM means the workload is gone (Kubernetes native sidecar).
    pub native_sidecar: bool,
}

/// What the executor saw, in this order: the door's state, then the counts. Counts read after
/// the door was seen closed include every request that got past it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Observation {
    /// The door was closed when this observation started.
    pub door_closed: bool,
    /// The counts, read after `door_closed`.
    pub outstanding: Outstanding,
    /// Time since a workload request last arrived or ended, or a handle was released (probes
    /// excluded).
    pub idle_for: Duration,
    /// Time since the last request that arrived after the door closed (served or refused)
    /// arrived or ended: `None` when none has, `Some(0)` while one is in flight. See
    /// [`crate::accounting::Accounting::since_late_request`].
    pub since_late: Option<Duration>,
}

/// What the executor should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do: wait for an event, a change of the counts, or `until` (if any).
    Wait {
        /// Call [`Machine::step`] again at this time at the latest.
        until: Option<Instant>,
    },
    /// Close the door, then observe again and call [`Machine::step`] at once.
    CloseDoor,
    /// Stop serving and tear down.
    Teardown(Ending),
    /// Shutdown came before anything was mounted: stop the lower, exit.
    AbortStart,
}

/// Why serving ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// Drained ([`Outstanding::is_drained`]: nothing in flight, no file open for writing, no
    /// lower flush pending), with the door closed.
    Drained,
    /// Forced, for this reason.
    Forced(Forced),
}

/// Why the door closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum DoorReason {
    /// A trigger that means the workload is gone.
    WorkloadGone,
    /// The mount stayed idle for the quiet period after the trigger.
    Quiet,
    /// The teardown was forced.
    Forced,
}

impl DoorReason {
    /// Label value.
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// What a trigger did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerEffect {
    /// The first trigger: the clock started.
    First,
    /// A later trigger that changed nothing but (maybe) the workload-gone flag.
    Further,
    /// A later trigger that forced the teardown.
    Forced(Forced),
}

/// Budgets of the teardown's steps, each ending before the hard exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Flushing and closing the handles that are left (forced only).
    pub close_remaining: Duration,
    /// Unmounting drainfs (or ending the relay's daemon connection).
    pub unmount: Duration,
    /// Waiting for the lower to exit after its stop signal, before SIGKILL.
    pub lower_stop: Duration,
    /// After SIGKILL, waiting for it to be reaped.
    pub lower_kill: Duration,
}

/// With the door closed and nothing outstanding, how long the mount is kept after the last
/// request that arrived after the door closed (served or refused), at most the quiet period.
pub const SETTLE: Duration = Duration::from_millis(500);
/// How long a second signal leaves drainfs for its own part of the teardown.
pub const SECOND_SIGNAL_OWN: Duration = Duration::from_millis(400);
/// After a second signal, how long the lower gets to exit on its stop signal before SIGKILL.
pub const SECOND_SIGNAL_LOWER: Duration = Duration::from_secs(2);
/// With the lower dead, how long drainfs may take to exit.
pub const LOWER_DEAD_EXIT: Duration = Duration::from_millis(1500);

/// The drain state machine. See the module docs.
#[derive(Debug, Clone)]
pub struct Machine {
    cfg: Config,
    phase: Phase,
    t0: Option<Instant>,
    cause: Option<Cause>,
    force_at: Option<Instant>,
    hard_exit: Option<Instant>,
    workload_gone: bool,
    signals: u32,
    forced: Option<Forced>,
    lower_died: Option<String>,
    door_closed_at: Option<Instant>,
    door_reason: Option<DoorReason>,
    drained_at: Option<Instant>,
    outstanding_at_force: Option<Outstanding>,
    at_teardown: Option<Outstanding>,
    outstanding_at_kill: Option<Outstanding>,
}

impl Machine {
    /// A machine in `starting`.
    pub fn new(cfg: Config) -> Self {
        Machine {
            cfg,
            phase: Phase::Starting,
            t0: None,
            cause: None,
            force_at: None,
            hard_exit: None,
            workload_gone: false,
            signals: 0,
            forced: None,
            lower_died: None,
            door_closed_at: None,
            door_reason: None,
            drained_at: None,
            outstanding_at_force: None,
            at_teardown: None,
            outstanding_at_kill: None,
        }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The first trigger and when it came.
    pub fn first_trigger(&self) -> Option<(Instant, &Cause)> {
        self.t0.zip(self.cause.as_ref())
    }

    /// When outstanding work stops being waited for.
    pub fn force_at(&self) -> Option<Instant> {
        self.force_at
    }

    /// When drainfs must be gone.
    pub fn hard_exit(&self) -> Option<Instant> {
        self.hard_exit
    }

    /// Why the teardown was forced, if it was.
    pub fn forced(&self) -> Option<Forced> {
        self.forced
    }

    /// What was outstanding (door closed) when the teardown was forced.
    pub fn outstanding_at_force(&self) -> Option<Outstanding> {
        self.outstanding_at_force
    }

    /// What was outstanding (door closed) when the machine decided to tear down, drained or
    /// forced: its `in_flight_read` read-only requests are cut off by the teardown.
    pub fn at_teardown(&self) -> Option<Outstanding> {
        self.at_teardown
    }

    /// What was seen of the lower dying.
    pub fn lower_died(&self) -> Option<&str> {
        self.lower_died.as_deref()
    }

    /// Whether a trigger has arrived.
    pub fn triggered(&self) -> bool {
        self.t0.is_some()
    }

    /// Why the door closed (once the machine asked for it).
    pub fn door_reason(&self) -> Option<DoorReason> {
        self.door_reason
    }

    /// When the door closed, and when the mount drained.
    pub fn milestones(&self) -> (Option<Instant>, Option<Instant>) {
        (self.door_closed_at, self.drained_at)
    }

    /// The mount is up: `starting` → `serving`. Returns whether the phase changed.
    pub fn mounted(&mut self) -> bool {
        self.advance(Phase::Serving)
    }

    /// The teardown moved on (`unmounting`, `stopping_lower`, `done`). Phases only move
    /// forward; returns whether the phase changed.
    pub fn advance(&mut self, to: Phase) -> bool {
        if to > self.phase {
            self.phase = to;
            true
        } else {
            false
        }
    }

    /// Records a trigger at `now`. The first starts the clock; a second SIGTERM/SIGINT forces
    /// the teardown; the lower dying forces it at once (nothing can be synced any more).
    pub fn trigger(&mut self, cause: Cause, now: Instant) -> TriggerEffect {
        if cause.is_signal() {
            self.signals += 1;
        }
        if cause.workload_gone(self.cfg.native_sidecar) {
            self.workload_gone = true;
        }
        if let Cause::LowerDied { detail } = &cause
            && self.lower_died.is_none()
        {
            self.lower_died = Some(detail.clone());
        }
        let first = self.t0.is_none();
        if first {
            let grace = self.cfg.grace_period;
            let margin = self.cfg.grace_margin.min(grace / 2);
            self.t0 = Some(now);
            self.force_at = Some(now + grace.saturating_sub(margin));
            self.hard_exit = Some(now + grace.saturating_sub(margin / 4));
        }
        let escalate = if matches!(cause, Cause::LowerDied { .. }) {
            Some(Forced::LowerDied)
        } else if cause.is_signal() && self.signals >= 2 {
            Some(Forced::SecondSignal)
        } else {
            None
        };
        if first {
            self.cause = Some(cause);
        }
        match escalate {
            Some(reason) if self.force(reason, now) => TriggerEffect::Forced(reason),
            _ if first => TriggerEffect::First,
            _ => TriggerEffect::Further,
        }
    }

    /// Forces the teardown (once): pulls the deadlines in. Returns whether this call forced it.
    fn force(&mut self, reason: Forced, now: Instant) -> bool {
        if self.forced.is_some() {
            return false;
        }
        self.forced = Some(reason);
        let own = match reason {
            Forced::SecondSignal => SECOND_SIGNAL_OWN + SECOND_SIGNAL_LOWER,
            Forced::LowerDied => LOWER_DEAD_EXIT,
            // The deadline keeps the hard exit it had.
            Forced::Deadline | Forced::LowerSigkill => Duration::MAX,
        };
        self.force_at = Some(self.force_at.map_or(now, |f| f.min(now)));
        let hard = now
            .checked_add(own)
            .unwrap_or(now + Duration::from_secs(3600));
        self.hard_exit = Some(self.hard_exit.map_or(hard, |h| h.min(hard)));
        true
    }

    /// The lower's process had to be SIGKILLed, with `outstanding` counted at that moment
    /// (read before the kill; see [`exit_code`] for what it decides).
    pub fn lower_killed(&mut self, now: Instant, outstanding: Outstanding) {
        self.force(Forced::LowerSigkill, now);
        self.outstanding_at_kill = Some(outstanding);
    }

    /// What was outstanding when the lower's process was SIGKILLed, if it was.
    pub fn outstanding_at_kill(&self) -> Option<Outstanding> {
        self.outstanding_at_kill
    }

    /// Decides what to do given an observation made at `now` (door state first, then counts).
    pub fn step(&mut self, now: Instant, obs: &Observation) -> Step {
        match self.phase {
            Phase::Starting => {
                if self.triggered() {
                    Step::AbortStart
                } else {
                    Step::Wait { until: None }
                }
            }
            Phase::Serving | Phase::Draining | Phase::DoorClosed => self.step_serving(now, obs),
            Phase::Unmounting | Phase::StoppingLower | Phase::Done => Step::Wait { until: None },
        }
    }

    fn step_serving(&mut self, now: Instant, obs: &Observation) -> Step {
        let Some(t0) = self.t0 else {
            return Step::Wait { until: None };
        };
        self.advance(Phase::Draining);
        let force_at = self.force_at.unwrap_or(now);
        if self.forced.is_none() && now >= force_at {
            self.force(Forced::Deadline, now);
        }
        if !obs.door_closed {
            // Idle time counts from the trigger at the earliest: an application still shutting
            // down gets the whole quiet period after it, however idle the mount was before.
            let idle = obs.idle_for.min(now.saturating_duration_since(t0));
            let quiet = obs.outstanding.is_drained() && idle >= self.cfg.quiet_period;
            let reason = if self.forced.is_some() {
                Some(DoorReason::Forced)
            } else if self.workload_gone {
                Some(DoorReason::WorkloadGone)
            } else if quiet {
                Some(DoorReason::Quiet)
            } else {
                None
            };
            if let Some(reason) = reason {
                self.door_reason.get_or_insert(reason);
                return Step::CloseDoor;
            }
            // Wake when the quiet period would end (only while idle: otherwise the count's
            // change notification wakes the executor) or at the deadline.
            let quiet_end = obs
                .outstanding
                .is_drained()
                .then(|| now + (self.cfg.quiet_period - idle));
            let until = quiet_end.map_or(force_at, |q| q.min(force_at));
            return Step::Wait { until: Some(until) };
        }
        if self.advance(Phase::DoorClosed) {
            self.door_closed_at = Some(now);
        }
        if let Some(reason) = self.forced {
            self.outstanding_at_force = Some(obs.outstanding);
            self.at_teardown = Some(obs.outstanding);
            return Step::Teardown(Ending::Forced(reason));
        }
        if obs.outstanding.is_drained() {
            // A request that arrived after the door closed (one served on an open handle, or
            // one refused at the door) means a process is still using the mount: once drainfs
            // unmounts, its next write would land in the directory underneath (the volume) and
            // never reach the bucket. Keep the mount, refusing new opens, until [`SETTLE`] (or
            // the quiet period, if shorter) has passed since the last such request. Requests
            // from before the close do not count: with the workload gone, a mount whose last
            // write came just before the trigger is torn down at once.
            let settle = self.cfg.quiet_period.min(SETTLE);
            if let Some(since) = obs.since_late
                && since < settle
            {
                let hold = now + (settle - since);
                return Step::Wait {
                    until: Some(hold.min(force_at)),
                };
            }
            self.drained_at = Some(now);
            self.at_teardown = Some(obs.outstanding);
            return Step::Teardown(Ending::Drained);
        }
        Step::Wait {
            until: Some(force_at),
        }
    }

    /// Budgets for the teardown steps starting at `now`. Unforced, the lower's stop may take
    /// until the hard exit; forced, drainfs's own steps share what is left before the hard
    /// exit with the lower's stop.
    pub fn budget(&self, now: Instant) -> Budget {
        let left = self.hard_exit.map_or(Duration::from_secs(30), |h| {
            h.saturating_duration_since(now)
        });
        match self.forced {
            None => Budget {
                close_remaining: left / 4,
                unmount: left / 2,
                lower_stop: left * 3 / 4,
                lower_kill: left / 4,
            },
            Some(Forced::SecondSignal) => {
                let own = SECOND_SIGNAL_OWN.min(left);
                Budget {
                    close_remaining: own / 2,
                    unmount: own / 2,
                    lower_stop: SECOND_SIGNAL_LOWER.min(left.saturating_sub(own)),
                    lower_kill: Duration::from_millis(200).min(left),
                }
            }
            Some(_) => Budget {
                close_remaining: left / 4,
                unmount: left / 4,
                lower_stop: left / 3,
                lower_kill: left / 6,
            },
        }
    }
}

#[cfg(test)]
mod tests;

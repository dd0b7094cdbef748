//! The executor: holds [`crate::drain::Machine`] and everything its steps act on (the
//! configuration, the shared state, the events, the lower's process, the accounting and the
//! door), and carries the steps out. It feeds the machine every trigger
//! ([`Executor::on_event`]), mirrors its phase ([`Executor::sync_phase`]), and bounds every
//! wait of the teardown ([`Executor::bounded`]: triggers keep arriving, and one that forces
//! the teardown shortens the bound). What happened is recorded in a [`Record`], from which
//! the exit code ([`crate::drain::exit_code`]) and the summary are made. Serving is in
//! [`super::serve`], the lower's steps in [`super::supervise`].

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use super::lower::Lower;
use super::{Event, Shared};
use crate::accounting::Accounting;
use crate::config::RunConfig;
use crate::drain::{
    Budget, Cause, Config as DrainConfig, ExitCode, Forced, Machine, Phase, TriggerEffect,
};
use crate::fs::Admission;
use crate::summary::{self, Record};

/// What a provisional summary shows that can change while stopping ([`super::serve`]): what
/// is outstanding, the phase, the force.
pub(super) type ProvisionalKey = (crate::accounting::Outstanding, Phase, Option<Forced>);

/// The lifecycle's executor: the machine, what it acts on, and what it recorded.
pub(super) struct Executor {
    /// The run's configuration (paths absolute).
    pub(super) cfg: RunConfig,
    /// What `/status`, the probes and the metrics see; the executor is its only writer.
    pub(super) shared: Arc<Shared>,
    /// Triggers and control requests, in arrival order.
    pub(super) events: mpsc::UnboundedReceiver<Event>,
    /// The lower's process (unsupervised until started or adopted).
    pub(super) lower: Lower,
    /// The counts every data path keeps.
    pub(super) acct: Arc<Accounting>,
    /// The door (and the lower-gone flag) every data path obeys.
    pub(super) admission: Arc<Admission>,
    /// Where every decision is made.
    pub(super) machine: Machine,
    /// What happened, for the exit code and the summary.
    pub(super) record: Record,
    /// The last provisional summary handed to the termination log's writer: when, and the
    /// state it showed ([`super::serve`]).
    pub(super) provisional: Option<(Instant, ProvisionalKey)>,
    /// The termination log's writer of provisional summaries, once one was written.
    pub(super) provisional_log: Option<summary::ProvisionalLog>,
}

impl Executor {
    /// An executor in `starting`, nothing supervised yet.
    pub(super) fn new(
        cfg: RunConfig,
        shared: Arc<Shared>,
        events: mpsc::UnboundedReceiver<Event>,
        acct: Arc<Accounting>,
    ) -> Self {
        let machine = Machine::new(DrainConfig {
            grace_period: cfg.lifecycle.grace_period,
            grace_margin: cfg.lifecycle.grace_margin,
            quiet_period: cfg.lifecycle.quiet_period,
            native_sidecar: cfg.lifecycle.native_sidecar,
        });
        Executor {
            lower: Lower::unsupervised(),
            cfg,
            shared,
            events,
            admission: Admission::new(&acct),
            acct,
            machine,
            record: Record::default(),
            provisional: None,
            provisional_log: None,
        }
    }

    /// Whether drainfs serves the FUSE requests (the mount, the relay): not in hand-off mode,
    /// where it has no door and counts nothing, so it must not claim either in its logs.
    pub(super) fn in_data_path(&self) -> bool {
        self.cfg.handoff.is_none()
    }

    /// The exit code of what the teardown found ([`crate::drain::exit_code`]).
    pub(super) fn exit_code(&self) -> ExitCode {
        let relay = self.cfg.relay.is_some();
        crate::drain::exit_code(&self.record.outcome(&self.machine, relay))
    }

    /// The run is over (exit code `code`): `done`, and the summary. No provisional summary is
    /// written after this.
    pub(super) fn finish(&mut self, code: ExitCode) -> summary::Summary {
        self.end_run();
        summary::Summary::new(
            code,
            &self.machine,
            &self.record,
            summary::Counts::from(self.acct.as_ref()),
            self.shared.data_path(),
            self.shared.relay_status(),
        )
    }

    /// The run is over: no provisional summary is written from now on, the exit time is
    /// recorded, the phase is `done`.
    pub(super) fn end_run(&mut self) {
        if let Some(log) = self.provisional_log.take() {
            log.close();
        }
        self.record.timings.exit_ms = self.ms_since_trigger();
        self.shared.set_phase(Phase::Done, "exit");
    }

    /// Milliseconds from the first trigger to `t`.
    pub(super) fn ms_since(&self, t: Option<Instant>) -> Option<u64> {
        let t0 = self.machine.first_trigger()?.0;
        t.map(|t| t.saturating_duration_since(t0).as_millis() as u64)
    }

    /// Milliseconds from the first trigger to now.
    pub(super) fn ms_since_trigger(&self) -> Option<u64> {
        self.ms_since(Some(Instant::now()))
    }

    /// Feeds an event to the machine and acts on what it says about the trigger itself.
    pub(super) fn on_event(&mut self, ev: Event) {
        let cause = match ev {
            Event::Signal(Signal::SIGTERM) => Cause::Sigterm,
            Event::Signal(Signal::SIGINT) => Cause::Sigint,
            Event::Signal(other) => {
                tracing::info!(signal = other.as_str(), "ignoring signal");
                return;
            }
            Event::Trigger(c) => c,
        };
        self.shared.count_trigger(&cause);
        match &cause {
            // Every later call fails at once with EIO.
            Cause::LowerDied { .. } => self.admission.set_lower_gone(),
            Cause::ControlPlaneFailed { detail } => {
                tracing::error!(detail, "the control plane failed: draining, then exiting 1");
                self.record.failed = true;
            }
            _ => {}
        }
        let label = cause.label();
        let gone = cause.workload_gone(self.cfg.lifecycle.native_sidecar);
        let detail = format!("{cause:?}");
        let first = !self.machine.triggered();
        let effect = self.machine.trigger(cause.clone(), Instant::now());
        if first {
            self.record.timings.trigger =
                Some(humantime::format_rfc3339_millis(SystemTime::now()).to_string());
            self.shared.set_cause(cause);
            self.shared.acct.set_watching(true);
            tracing::info!(
                cause = label,
                detail,
                workload_gone = gone,
                grace_period = ?self.cfg.lifecycle.grace_period,
                "shutdown triggered"
            );
        }
        self.shared.set_deadline(self.machine.force_at());
        log_trigger_effect(effect, label, &detail, gone);
    }

    /// Logs the machine's phase changes (the machine owns the phase; `Shared` mirrors it).
    pub(super) fn sync_phase(&mut self, why: &str) {
        let phase = self.machine.phase();
        if phase != self.shared.phase() {
            self.shared.set_phase(phase, why);
        }
    }

    /// Moves the machine (and the mirror) to a teardown phase.
    pub(super) fn advance(&mut self, to: Phase, why: &str) {
        self.machine.advance(to);
        self.sync_phase(why);
    }

    /// Runs `fut` until it resolves or the step's budget (from `pick`) runs out; triggers that
    /// arrive meanwhile are recorded, and one that forces the teardown shortens the bound.
    /// `None` when the budget ran out.
    pub(super) async fn bounded<T>(
        &mut self,
        pick: impl Fn(&Budget) -> Duration,
        fut: impl Future<Output = T>,
    ) -> Option<T> {
        tokio::pin!(fut);
        let start = Instant::now();
        let mut until = start + pick(&self.machine.budget(start));
        loop {
            tokio::select! {
                v = &mut fut => return Some(v),
                _ = tokio::time::sleep_until(until.into()) => return None,
                ev = self.events.recv() => match ev {
                    Some(ev) => {
                        let before = self.machine.forced();
                        self.on_event(ev);
                        if self.machine.forced() != before {
                            let now = Instant::now();
                            until = until.min(now + pick(&self.machine.budget(now)));
                        }
                    }
                    // Every sender is gone (cannot happen while `run` holds one): just wait.
                    None => return Some(fut.await),
                },
            }
        }
    }

    /// The data path serves: `starting` -> `serving`, the ready file.
    pub(super) fn serving(&mut self, why: &str) {
        self.record.served = true;
        self.machine.mounted();
        self.sync_phase(why);
        if let Some(rf) = &self.cfg.lifecycle.ready_file
            && let Err(e) = summary::write_atomic(rf, b"ready\n")
        {
            tracing::warn!(path = %rf.display(), error = %e, "cannot write the ready file");
        }
    }
}

/// Logs what a trigger did beyond the first: forced the teardown, or nothing more.
fn log_trigger_effect(effect: TriggerEffect, label: &str, detail: &str, gone: bool) {
    match effect {
        TriggerEffect::Forced(reason) => {
            tracing::warn!(
                cause = label,
                reason = reason.name(),
                "{}",
                match reason {
                    Forced::SecondSignal => "second signal: stop waiting, finishing now",
                    Forced::LowerDied => "the lower is gone: nothing can be synced any more",
                    _ => "forcing the teardown",
                }
            );
        }
        TriggerEffect::Further => {
            tracing::info!(
                cause = label,
                detail,
                workload_gone = gone,
                "further trigger"
            );
        }
        TriggerEffect::First => {}
    }
}

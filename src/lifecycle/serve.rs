//! Serving and draining: the executor's loop while a data path serves. Each turn it
//! registers for the accounting's change notification *before* it reads the door and the
//! counts ([`Accounting::observe`], door first), so no change between the read and the wait is
//! lost, and the machine only ever decides "drained" on counts read after the door was
//! closed; then it steps the machine and carries the step out: close the door, or begin the
//! teardown (record the milestones and, when forced, what was still open); otherwise it waits
//! for an event, the lower's process exiting, the data path's report, a count change or the
//! machine's wake-up time. The teardown itself is the data path's ([`DataPath::teardown`]).
//!
//! From the first trigger until the teardown begins, the loop keeps a provisional summary in
//! the termination log ([`crate::summary::Summary::provisional`]): written at once, then again
//! whenever what is outstanding, the phase or the force changed, at most every 250 ms, and
//! once more when the teardown begins. The final summary replaces it at the exit; a drainfs
//! killed before that leaves the last one.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Event;
use super::data_path::{DataPath, PathEvent};
use super::executor::{Executor, ProvisionalKey};
use crate::accounting::{Accounting, Outstanding};
use crate::drain::{Cause, DoorReason, Ending, ExitCode, Forced, Observation, Phase, Step};
use crate::{procs, summary};

/// How many open files and admitted opens a forced teardown names in the summary.
const OPEN_PATHS_CAP: usize = 100;

/// The shortest time between two provisional summaries.
const PROVISIONAL_EVERY: Duration = Duration::from_millis(250);

impl Executor {
    /// The whole run of data path `P`: start it, serve until the machine says drained or
    /// forced, tear it down. Returns the exit code.
    pub(super) async fn run_path<P: DataPath>(&mut self, with: P::Start) -> ExitCode {
        let mut dp = match P::start(self, with).await {
            Ok(dp) => dp,
            Err(code) => return code,
        };
        let ending = self.serve(&mut dp).await;
        dp.teardown(self, ending).await
    }

    /// The serving loop: observe (door, then counts), step the machine, carry out its step,
    /// wait for the next event, count change or wake-up time. Returns how serving ended.
    pub(super) async fn serve<P: DataPath>(&mut self, dp: &mut P) -> Ending {
        let acct = Arc::clone(&self.acct);
        loop {
            // Register for the count's change notification before reading the counts.
            let changed = acct.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let obs = observe(&acct);
            let step = self.machine.step(Instant::now(), &obs);
            let why = match (self.machine.phase(), self.machine.door_reason()) {
                (Phase::DoorClosed, Some(r)) => r.name(),
                _ => self.machine.first_trigger().map_or("", |(_, c)| c.label()),
            };
            let until = match step {
                Step::CloseDoor => {
                    self.close_door();
                    continue;
                }
                Step::Teardown(ending) => {
                    self.begin_teardown(ending, dp);
                    self.write_provisional(dp, obs.outstanding);
                    return ending;
                }
                Step::Wait { until } => until,
                Step::AbortStart => None,
            };
            let until = self.provisional_due(dp, obs.outstanding, until);
            if self.machine.phase() == Phase::Draining {
                self.remove_ready_file();
            }
            self.sync_phase(why);
            self.wait_for_change(dp, changed, until).await;
        }
    }

    /// While stopping (triggered, serving not yet ended), with a termination log: writes a
    /// provisional summary if what it would show (`out`, the phase, the force) changed since
    /// the last one and [`PROVISIONAL_EVERY`] has passed. Returns when the loop must wake up
    /// next: `until`, or sooner when a change waits for its turn.
    fn provisional_due<P: DataPath>(
        &mut self,
        dp: &P,
        out: Outstanding,
        until: Option<Instant>,
    ) -> Option<Instant> {
        if !self.machine.triggered() || self.cfg.lifecycle.termination_log.is_none() {
            return until;
        }
        let key = self.provisional_key(out);
        match &self.provisional {
            Some((_, last)) if *last == key => until,
            Some((at, _)) if at.elapsed() < PROVISIONAL_EVERY => {
                let next = *at + PROVISIONAL_EVERY;
                Some(until.map_or(next, |u| u.min(next)))
            }
            _ => {
                self.write_provisional(dp, out);
                until
            }
        }
    }

    /// What a provisional summary shows that can change while stopping: `out`, the phase, the
    /// force.
    fn provisional_key(&self, out: Outstanding) -> ProvisionalKey {
        (out, self.machine.phase(), self.machine.forced())
    }

    /// Hands a provisional summary to the termination log's writer (if there is a log; the
    /// write happens on the writer's thread): the record so far, `out` as what is
    /// outstanding, and (unless a forced teardown already named them) the files open and
    /// opening now.
    fn write_provisional<P: DataPath>(&mut self, dp: &P, out: Outstanding) {
        let Some(path) = self.cfg.lifecycle.termination_log.clone() else {
            return;
        };
        self.provisional = Some((Instant::now(), self.provisional_key(out)));
        if let Some(entry) = dp.provisional(self) {
            self.provisional_log
                .get_or_insert_with(|| summary::ProvisionalLog::start(path))
                .put(entry);
            return;
        }
        let mut record = self.record.clone();
        let (closed_at, drained_at) = self.machine.milestones();
        record.timings.door_closed_ms = self.ms_since(closed_at);
        record.timings.drained_ms = self.ms_since(drained_at);
        if self.machine.forced().is_none() {
            record.open_paths = dp.open_paths(OPEN_PATHS_CAP);
            record.in_flight_opens = dp.admitted_paths(OPEN_PATHS_CAP);
        }
        let s = summary::Summary::provisional(
            &self.machine,
            &record,
            out,
            summary::Counts::from(self.acct.as_ref()),
            self.shared.data_path(),
            self.shared.relay_status(),
        );
        self.provisional_log
            .get_or_insert_with(|| summary::ProvisionalLog::start(path))
            .put(s);
    }

    /// The machine's `CloseDoor`: new opens, creates and namespace changes get ESHUTDOWN from
    /// now on; the ready file goes.
    fn close_door(&mut self) {
        self.admission.close();
        let reason = self.machine.door_reason().map_or("", DoorReason::name);
        if self.in_data_path() {
            tracing::info!(
                reason,
                "door closed: new opens, creates and namespace changes get ESHUTDOWN"
            );
        }
        self.remove_ready_file();
    }

    fn remove_ready_file(&self) {
        if let Some(rf) = &self.cfg.lifecycle.ready_file {
            let _ = std::fs::remove_file(rf);
        }
    }

    /// The machine's `Teardown`: records the milestones, what the teardown cuts off, and
    /// (forced) what was still open or opening, or (drained) how long the drain took.
    fn begin_teardown<P: DataPath>(&mut self, ending: Ending, dp: &P) {
        let reason = self.machine.door_reason().map_or("", DoorReason::name);
        self.sync_phase(reason);
        let (closed_at, drained_at) = self.machine.milestones();
        self.record.timings.door_closed_ms = self.ms_since(closed_at);
        self.record.timings.drained_ms = self.ms_since(drained_at);
        self.note_cut_off();
        match ending {
            Ending::Forced(reason) => self.record_forced(reason, dp),
            Ending::Drained => {
                self.shared.set_drain_duration(
                    self.machine
                        .first_trigger()
                        .and_then(|(t0, _)| drained_at.map(|d| d - t0)),
                );
                if self.in_data_path() {
                    tracing::info!(
                        after_ms = self.record.timings.drained_ms,
                        "drained: nothing in flight, no file open for writing, no lower flush pending"
                    );
                }
            }
        }
    }

    /// A forced teardown: names the files still open and the opens still in flight.
    fn record_forced<P: DataPath>(&mut self, reason: Forced, dp: &P) {
        let out = self.machine.outstanding_at_force().unwrap_or_default();
        self.record.open_paths = dp.open_paths(OPEN_PATHS_CAP);
        self.record.in_flight_opens = dp.admitted_paths(OPEN_PATHS_CAP);
        let open = out.open_read + out.open_write + out.open_dirs;
        if self.record.open_paths.len() == OPEN_PATHS_CAP && open > OPEN_PATHS_CAP as i64 {
            self.record.notes.push(format!(
                "open_paths lists {OPEN_PATHS_CAP} of the {open} handles open at the forced teardown (files open for writing first)"
            ));
        }
        if !out.is_drained() {
            self.shared.count_forced(reason);
        }
        tracing::warn!(reason = reason.name(), outstanding = ?out, open = ?self.record.open_paths, opening = ?self.record.in_flight_opens, "forcing the teardown");
    }

    /// Notes (summary, log) the read-only requests the teardown is about to cut off: they
    /// did not hold the drain, and nothing of theirs can be lost.
    fn note_cut_off(&mut self) {
        let n = self.machine.at_teardown().map_or(0, |o| o.in_flight_read);
        if n <= 0 {
            return;
        }
        let ops: Vec<String> = crate::accounting::Op::ALL
            .iter()
            .filter(|op| op.class() == crate::gate::Class::ReadOnly)
            .filter_map(|op| {
                let k = self
                    .acct
                    .op_stats(*op)
                    .in_flight
                    .load(std::sync::atomic::Ordering::Relaxed);
                (k > 0).then(|| format!("{} {k}", op.name()))
            })
            .collect();
        tracing::info!(read_only_in_flight = n, ops = ?ops, "read-only requests still in flight are cut off by the teardown (nothing of theirs can be lost)");
        self.record.notes.push(format!(
            "{n} read-only request(s) still in flight were cut off by the teardown ({}); they did not hold the drain",
            ops.join(", ")
        ));
    }

    /// Waits for whatever comes first while serving: an event, the lower's process exiting,
    /// the data path's report, a count change (once triggered) or the machine's wake-up
    /// time `until`; acts on it.
    async fn wait_for_change<P: DataPath>(
        &mut self,
        dp: &mut P,
        changed: Pin<&mut tokio::sync::futures::Notified<'_>>,
        until: Option<Instant>,
    ) {
        let sleep = async move {
            match until {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        let lower_exit = self.lower.wait();
        let lower_died = self.machine.lower_died().is_some();
        // A relay's daemon exits after the EOF the relay sent when the kernel side went
        // away: that is not a death.
        let lower_watched = self.lower.watched() && !lower_died && !dp.kernel_gone();
        let triggered = self.machine.triggered();
        tokio::select! {
            ev = self.events.recv() => {
                if let Some(ev) = ev { self.on_event(ev) }
            }
            st = lower_exit, if lower_watched => {
                if !dp.kernel_gone() {
                    self.note_daemon_exit(&st);
                    self.on_event(Event::Trigger(Cause::LowerDied { detail: format!("lower process exited: {}", procs::describe(&st)) }));
                }
            }
            pe = dp.next_event(&self.admission, lower_died) => match pe {
                PathEvent::LowerGone(detail) => {
                    self.on_event(Event::Trigger(Cause::LowerDied { detail }));
                }
                PathEvent::Unmounted(r) => {
                    tracing::warn!(result = r, "drainfs's mount was removed from outside");
                    self.on_event(Event::Trigger(Cause::UnmountedExternally));
                    dp.unmounted_externally(self).await;
                }
                PathEvent::Nothing => {}
            },
            _ = changed, if triggered => {}
            _ = sleep => {}
        }
    }
}

/// Reads the door, then the counts (see the module docs), and the idle times.
fn observe(acct: &Accounting) -> Observation {
    let (door_closed, outstanding) = acct.observe();
    Observation {
        door_closed,
        outstanding,
        idle_for: acct.since_last_activity(),
        since_late: acct.since_late_request(),
    }
}

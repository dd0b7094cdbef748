use super::*;
use strum::IntoEnumIterator;

const GRACE: Duration = Duration::from_secs(30);
const MARGIN: Duration = Duration::from_secs(2);
const QUIET: Duration = Duration::from_millis(500);

fn machine(native: bool) -> Machine {
    Machine::new(Config {
        grace_period: GRACE,
        grace_margin: MARGIN,
        quiet_period: QUIET,
        native_sidecar: native,
    })
}

fn busy() -> Outstanding {
    Outstanding {
        open_write: 1,
        ..Default::default()
    }
}

fn obs(door_closed: bool, outstanding: Outstanding, idle_ms: u64) -> Observation {
    Observation {
        door_closed,
        outstanding,
        idle_for: Duration::from_millis(idle_ms),
        since_late: None,
    }
}

/// An observation with a request that arrived after the door closed `late_ms` ago.
fn obs_late(outstanding: Outstanding, idle_ms: u64, late_ms: u64) -> Observation {
    Observation {
        since_late: Some(Duration::from_millis(late_ms)),
        ..obs(true, outstanding, idle_ms)
    }
}

fn every_cause() -> Vec<Cause> {
    CauseKind::iter()
        .map(|k| match k {
            CauseKind::Sigterm => Cause::Sigterm,
            CauseKind::Sigint => Cause::Sigint,
            CauseKind::ExitFile => Cause::ExitFile { path: "/x".into() },
            CauseKind::WatchedPidExited => Cause::WatchedPidExited { pid: 7 },
            CauseKind::QuitRequest => Cause::QuitRequest {
                source: Source::Http,
            },
            CauseKind::DrainRequest => Cause::DrainRequest {
                source: Source::Control,
            },
            CauseKind::LowerDied => Cause::LowerDied {
                detail: "exit 1".into(),
            },
            CauseKind::UnmountedExternally => Cause::UnmountedExternally,
            CauseKind::ControlPlaneFailed => Cause::ControlPlaneFailed {
                detail: "bind".into(),
            },
        })
        .collect()
}

/// Runs the executor's loop against a fake mount: the door, counts that change at the
/// times in `changes` (the executor is woken by each change, as by the accounting's
/// notification), idle time counted from the last change, and fake time advancing to each
/// wake-up. Returns the final step and when it came.
fn drive(
    m: &mut Machine,
    start: Instant,
    changes: &[Duration],
    counts: impl Fn(Duration) -> Outstanding,
) -> (Step, Duration) {
    let mut door = false;
    let mut now = start;
    for _ in 0..1000 {
        let t = now - start;
        let o = counts(t);
        let last_change = changes.iter().rev().find(|c| **c <= t).copied();
        let idle = t - last_change.unwrap_or(Duration::ZERO);
        let next_change = changes.iter().find(|c| **c > t).map(|c| start + *c);
        let step = m.step(
            now,
            &Observation {
                door_closed: door,
                outstanding: o,
                idle_for: idle,
                since_late: None,
            },
        );
        match step {
            Step::CloseDoor => door = true,
            Step::Wait { until } => {
                let wake = [until, next_change].into_iter().flatten().min();
                let wake = wake.expect("a wait with nothing to wake it");
                assert!(wake > now, "a wait must move time forward");
                now = wake;
            }
            other => return (other, now - start),
        }
    }
    panic!("the machine never ended");
}

#[test]
fn labels_are_unique_and_stable() {
    let labels: Vec<&str> = CauseKind::iter().map(CauseKind::name).collect();
    assert_eq!(
        labels,
        [
            "sigterm",
            "sigint",
            "exit_file",
            "watched_pid_exited",
            "quit_request",
            "drain_request",
            "lower_died",
            "unmounted_externally",
            "control_plane_failed"
        ]
    );
    for c in every_cause() {
        assert_eq!(c.label(), CauseKind::from(&c).name());
    }
    assert_eq!(Phase::DoorClosed.name(), "door_closed");
    assert_eq!(Forced::SecondSignal.name(), "second_signal");
    assert_eq!(ExitCode::LowerFailed.outcome(), "lower_failed");
}

#[test]
fn serving_without_trigger_waits_forever() {
    let mut m = machine(false);
    let t = Instant::now();
    assert_eq!(
        m.step(t, &obs(false, busy(), 0)),
        Step::Wait { until: None }
    );
    assert!(m.mounted());
    assert_eq!(
        m.step(t, &obs(false, Outstanding::default(), 99_999)),
        Step::Wait { until: None }
    );
    assert_eq!(m.phase(), Phase::Serving);
}

#[test]
fn every_trigger_in_starting_aborts_the_start() {
    for c in every_cause() {
        let mut m = machine(false);
        let t = Instant::now();
        m.trigger(c.clone(), t);
        assert_eq!(
            m.step(t, &Observation::default()),
            Step::AbortStart,
            "{c:?}"
        );
    }
}

#[test]
fn workload_gone_triggers_close_the_door_at_once_then_drain() {
    for c in every_cause() {
        let gone = c.workload_gone(false);
        let mut m = machine(false);
        m.mounted();
        let t = Instant::now();
        m.trigger(c.clone(), t);
        let step = m.step(t, &obs(false, busy(), 0));
        if matches!(c, Cause::LowerDied { .. }) {
            assert_eq!(step, Step::CloseDoor, "forced: door first");
            let step = m.step(t, &obs(true, busy(), 0));
            assert_eq!(step, Step::Teardown(Ending::Forced(Forced::LowerDied)));
            assert_eq!(m.outstanding_at_force(), Some(busy()));
            continue;
        }
        if gone {
            assert_eq!(step, Step::CloseDoor, "{c:?}");
            assert_eq!(m.phase(), Phase::Draining);
            // Busy with the door closed: wait until the deadline (or a change).
            let step = m.step(t, &obs(true, busy(), 0));
            assert_eq!(
                step,
                Step::Wait {
                    until: m.force_at()
                },
                "{c:?}"
            );
            assert_eq!(m.phase(), Phase::DoorClosed);
            let t1 = t + Duration::from_secs(3);
            assert_eq!(
                m.step(t1, &obs(true, Outstanding::default(), 60_000)),
                Step::Teardown(Ending::Drained)
            );
            assert_eq!(m.milestones(), (Some(t), Some(t1)));
        } else {
            // SIGTERM (regular sidecar), SIGINT, drain request: the door stays open while busy.
            assert_eq!(
                step,
                Step::Wait {
                    until: m.force_at()
                },
                "{c:?}"
            );
        }
    }
}

#[test]
fn late_requests_hold_the_mount_until_it_is_quiet() {
    let mut m = machine(true);
    m.mounted();
    let t = Instant::now();
    m.trigger(Cause::ExitFile { path: "/e".into() }, t);
    assert_eq!(m.step(t, &obs(false, busy(), 0)), Step::CloseDoor);
    // Drained, but a request that arrived after the door closed ended 100 ms ago: hold
    // the mount.
    let idle = Outstanding::default();
    let s = m.step(t, &obs_late(idle, 100, 100));
    assert_eq!(
        s,
        Step::Wait {
            until: Some(t + QUIET - Duration::from_millis(100))
        }
    );
    assert_eq!(m.milestones().1, None);
    // One in flight: hold again.
    let t1 = t + QUIET - Duration::from_millis(100);
    assert_eq!(
        m.step(t1, &obs_late(idle, 0, 0)),
        Step::Wait {
            until: Some(t1 + QUIET)
        }
    );
    // Quiet since the last late one: drained.
    let t2 = t1 + QUIET;
    assert_eq!(
        m.step(
            t2,
            &obs_late(idle, QUIET.as_millis() as u64, QUIET.as_millis() as u64)
        ),
        Step::Teardown(Ending::Drained)
    );
    // An idle mount is torn down at once.
    let mut m = machine(true);
    m.mounted();
    m.trigger(Cause::Sigterm, t);
    assert_eq!(m.step(t, &obs(false, idle, 60_000)), Step::CloseDoor);
    assert_eq!(
        m.step(t, &obs(true, idle, 60_000)),
        Step::Teardown(Ending::Drained)
    );
}

/// A Job's last close comes right before its SIGTERM: requests served before the door
/// closed (however recent) never hold the mount once the workload is known to be gone.
#[test]
fn requests_before_the_close_never_hold_the_mount() {
    for c in every_cause()
        .into_iter()
        .filter(|c| c.workload_gone(true) && !matches!(c, Cause::LowerDied { .. }))
    {
        let mut m = machine(true);
        m.mounted();
        let t = Instant::now();
        m.trigger(c.clone(), t);
        // The last write ended 1 ms before the trigger.
        assert_eq!(
            m.step(t, &obs(false, Outstanding::default(), 1)),
            Step::CloseDoor
        );
        assert_eq!(
            m.step(t, &obs(true, Outstanding::default(), 1)),
            Step::Teardown(Ending::Drained),
            "{c:?}"
        );
        assert_eq!(m.milestones(), (Some(t), Some(t)));
    }
    // A write in flight across the close holds the drain until it ends, and no longer.
    let mut m = machine(true);
    m.mounted();
    let t = Instant::now();
    m.trigger(Cause::Sigterm, t);
    assert_eq!(m.step(t, &obs(false, busy(), 0)), Step::CloseDoor);
    assert_eq!(
        m.step(t, &obs(true, busy(), 0)),
        Step::Wait {
            until: m.force_at()
        }
    );
    let t1 = t + Duration::from_millis(40);
    assert_eq!(
        m.step(t1, &obs(true, Outstanding::default(), 0)),
        Step::Teardown(Ending::Drained)
    );
    assert_eq!(m.milestones().1, Some(t1));
}

/// A plain SIGTERM still keeps a straggler off the directory underneath: the door closes
/// once the mount is quiet, and a write refused after that holds the mount for [`SETTLE`].
#[test]
fn a_straggler_after_a_plain_sigterm_holds_the_mount() {
    let mut m = machine(false);
    m.mounted();
    let t = Instant::now();
    m.trigger(Cause::Sigterm, t);
    let idle = Outstanding::default();
    let t1 = t + QUIET;
    assert_eq!(m.step(t1, &obs(false, idle, 600)), Step::CloseDoor);
    // A create refused 10 ms after the close.
    assert_eq!(
        m.step(t1, &obs_late(idle, 10, 10)),
        Step::Wait {
            until: Some(t1 + QUIET - Duration::from_millis(10))
        }
    );
    let t2 = t1 + QUIET;
    assert_eq!(
        m.step(t2, &obs_late(idle, 500, 500)),
        Step::Teardown(Ending::Drained)
    );
}

/// Read-only requests in flight never hold the drain nor make it incomplete; what the
/// teardown cut off is kept for the summary.
#[test]
fn read_only_requests_in_flight_do_not_hold_the_drain() {
    let reading = Outstanding {
        in_flight: 2,
        in_flight_read: 2,
        open_read: 1,
        ..Default::default()
    };
    let mut m = machine(true);
    m.mounted();
    let t = Instant::now();
    m.trigger(Cause::Sigterm, t);
    assert_eq!(m.step(t, &obs(false, reading, 10_000)), Step::CloseDoor);
    assert_eq!(
        m.step(t, &obs(true, reading, 10_000)),
        Step::Teardown(Ending::Drained)
    );
    assert_eq!(m.at_teardown().map(|o| o.in_flight_read), Some(2));
    // Plain SIGTERM: a READ in flight since before the trigger does not keep the door
    // open past the quiet period (only arrivals and ends are activity).
    let mut m = machine(false);
    m.mounted();
    m.trigger(Cause::Sigterm, t);
    assert_eq!(
        m.step(t, &obs(false, reading, 10_000)),
        Step::Wait {
            until: Some(t + QUIET)
        }
    );
    assert_eq!(
        m.step(t + QUIET, &obs(false, reading, 10_000)),
        Step::CloseDoor
    );
    // Forced with only reads outstanding: clean.
    let mut m = machine(false);
    m.mounted();
    m.trigger(Cause::Sigint, t);
    let both = Outstanding {
        in_flight: 1,
        in_flight_read: 1,
        ..busy()
    };
    let (step, _) = drive(&mut m, t, &[], |_| both);
    assert_eq!(step, Step::Teardown(Ending::Forced(Forced::Deadline)));
    let reads_only = Outstanding {
        in_flight: 1,
        in_flight_read: 1,
        ..Default::default()
    };
    assert_eq!(
        exit_code(&Outcome {
            forced: Some(Forced::Deadline),
            outstanding_at_force: Some(reads_only),
            lower_stop: Some(LowerStop::Clean),
            ..Default::default()
        }),
        ExitCode::Clean
    );
    assert_eq!(
        exit_code(&Outcome {
            forced: Some(Forced::Deadline),
            outstanding_at_force: m.outstanding_at_force(),
            lower_stop: Some(LowerStop::Clean),
            ..Default::default()
        }),
        ExitCode::Incomplete,
        "a file open for writing still makes it incomplete"
    );
}

#[test]
fn read_handles_and_directories_do_not_hold_the_drain() {
    let mut m = machine(true);
    m.mounted();
    let t = Instant::now();
    m.trigger(Cause::Sigterm, t);
    let readers = Outstanding {
        open_read: 2,
        open_dirs: 1,
        ..Default::default()
    };
    assert_eq!(m.step(t, &obs(false, readers, 0)), Step::CloseDoor);
    assert_eq!(
        m.step(t, &obs(true, readers, 60_000)),
        Step::Teardown(Ending::Drained)
    );
}

#[test]
fn native_sidecar_sigterm_means_workload_gone() {
    let mut m = machine(true);
    m.mounted();
    let t = Instant::now();
    m.trigger(Cause::Sigterm, t);
    assert_eq!(
        m.step(t, &obs(false, Outstanding::default(), 0)),
        Step::CloseDoor
    );
    assert_eq!(
        m.step(t, &obs(true, Outstanding::default(), 60_000)),
        Step::Teardown(Ending::Drained)
    );
}

#[test]
fn quiet_period_counts_from_the_trigger_and_only_while_idle() {
    let mut m = machine(false);
    m.mounted();
    let t = Instant::now();
    m.trigger(Cause::Sigterm, t);
    // Idle for an hour before the trigger: still the whole quiet period after it.
    let s = m.step(t, &obs(false, Outstanding::default(), 3_600_000));
    assert_eq!(
        s,
        Step::Wait {
            until: Some(t + QUIET)
        }
    );
    // Busy: no quiet wake-up (the count's change wakes the executor), only the deadline.
    let t1 = t + Duration::from_millis(100);
    assert_eq!(
        m.step(t1, &obs(false, busy(), 0)),
        Step::Wait {
            until: m.force_at()
        }
    );
    // Idle again for 100 ms at t+300ms: wake at t+700ms.
    let t2 = t + Duration::from_millis(300);
    let s = m.step(t2, &obs(false, Outstanding::default(), 100));
    assert_eq!(
        s,
        Step::Wait {
            until: Some(t2 + Duration::from_millis(400))
        }
    );
    let t3 = t2 + Duration::from_millis(400);
    assert_eq!(
        m.step(t3, &obs(false, Outstanding::default(), 500)),
        Step::CloseDoor
    );
}

#[test]
fn drained_is_never_declared_from_counts_read_before_the_door_closed() {
    let mut m = machine(true);
    m.mounted();
    let t = Instant::now();
    m.trigger(Cause::ExitFile { path: "/e".into() }, t);
    // Counts read with the door open, even idle ones, only lead to closing the door.
    for _ in 0..3 {
        assert_eq!(
            m.step(t, &obs(false, Outstanding::default(), 10_000)),
            Step::CloseDoor
        );
    }
    // The observation after the close sees an open admitted in between.
    assert_eq!(
        m.step(t, &obs(true, busy(), 0)),
        Step::Wait {
            until: m.force_at()
        }
    );
    assert_eq!(m.milestones().1, None);
}

#[test]
fn deadline_forces_with_the_door_closed_first() {
    let mut m = machine(false);
    m.mounted();
    let start = Instant::now();
    m.trigger(Cause::Sigint, start);
    let (step, took) = drive(&mut m, start, &[], |_| busy());
    assert_eq!(step, Step::Teardown(Ending::Forced(Forced::Deadline)));
    assert_eq!(took, GRACE - MARGIN);
    assert_eq!(m.phase(), Phase::DoorClosed);
    assert_eq!(m.outstanding_at_force(), Some(busy()));
    let code = exit_code(&Outcome {
        forced: m.forced(),
        outstanding_at_force: m.outstanding_at_force(),
        lower_stop: Some(LowerStop::Clean),
        ..Default::default()
    });
    assert_eq!(code, ExitCode::Incomplete);
}

#[test]
fn work_that_ends_before_the_deadline_drains() {
    let mut m = machine(false);
    m.mounted();
    let start = Instant::now();
    m.trigger(Cause::Sigterm, start);
    let (step, took) = drive(&mut m, start, &[Duration::from_secs(3)], |t| {
        if t < Duration::from_secs(3) {
            busy()
        } else {
            Outstanding::default()
        }
    });
    assert_eq!(step, Step::Teardown(Ending::Drained));
    // Idle from 3 s: the door closes after the quiet period, and the mount is drained.
    assert_eq!(took, Duration::from_secs(3) + QUIET);
    assert_eq!(m.door_reason(), Some(DoorReason::Quiet));
}

#[test]
fn second_signal_forces_in_every_phase_and_pulls_the_hard_exit_in() {
    for phase in [
        Phase::Serving,
        Phase::Draining,
        Phase::DoorClosed,
        Phase::Unmounting,
        Phase::StoppingLower,
    ] {
        let mut m = machine(false);
        m.mounted();
        let t = Instant::now();
        assert_eq!(m.trigger(Cause::Sigterm, t), TriggerEffect::First);
        m.advance(phase);
        let t1 = t + Duration::from_secs(1);
        assert_eq!(
            m.trigger(Cause::Sigterm, t1),
            TriggerEffect::Forced(Forced::SecondSignal)
        );
        assert_eq!(
            m.hard_exit(),
            Some(t1 + SECOND_SIGNAL_OWN + SECOND_SIGNAL_LOWER)
        );
        let b = m.budget(t1);
        assert!(b.close_remaining + b.unmount <= SECOND_SIGNAL_OWN);
        assert_eq!(b.lower_stop, SECOND_SIGNAL_LOWER);
        // Third signal: nothing more.
        assert_eq!(m.trigger(Cause::Sigint, t1), TriggerEffect::Further);
        if phase <= Phase::DoorClosed {
            assert_eq!(m.step(t1, &obs(false, busy(), 0)), Step::CloseDoor);
            assert_eq!(
                m.step(t1, &obs(true, busy(), 0)),
                Step::Teardown(Ending::Forced(Forced::SecondSignal))
            );
        } else {
            assert_eq!(
                m.step(t1, &obs(true, busy(), 0)),
                Step::Wait { until: None }
            );
        }
    }
}

#[test]
fn a_non_signal_trigger_then_one_signal_is_not_a_second_signal() {
    let mut m = machine(false);
    m.mounted();
    let t = Instant::now();
    m.trigger(Cause::ExitFile { path: "/e".into() }, t);
    assert_eq!(m.trigger(Cause::Sigterm, t), TriggerEffect::Further);
    assert_eq!(m.forced(), None);
}

#[test]
fn lower_death_forces_at_once_with_a_short_hard_exit_in_every_phase() {
    for phase in [
        Phase::Serving,
        Phase::Draining,
        Phase::DoorClosed,
        Phase::Unmounting,
    ] {
        let mut m = machine(false);
        m.mounted();
        let t = Instant::now();
        if phase > Phase::Serving {
            m.trigger(Cause::Sigint, t);
            m.advance(phase);
        }
        let t1 = t + Duration::from_secs(2);
        let eff = m.trigger(
            Cause::LowerDied {
                detail: "exit 1".into(),
            },
            t1,
        );
        assert_eq!(eff, TriggerEffect::Forced(Forced::LowerDied), "{phase:?}");
        assert!(m.hard_exit().unwrap() <= t1 + LOWER_DEAD_EXIT);
        assert_eq!(m.lower_died(), Some("exit 1"));
        let code = exit_code(&Outcome {
            lower_died: true,
            forced: m.forced(),
            outstanding_at_force: Some(busy()),
            ..Default::default()
        });
        assert_eq!(code, ExitCode::LowerFailed);
    }
}

#[test]
fn deadline_force_keeps_the_hard_exit() {
    let mut m = machine(false);
    m.mounted();
    let t = Instant::now();
    m.trigger(Cause::Sigint, t);
    let hard = m.hard_exit().unwrap();
    let late = m.force_at().unwrap();
    assert_eq!(m.step(late, &obs(false, busy(), 0)), Step::CloseDoor);
    assert_eq!(m.hard_exit(), Some(hard));
    assert_eq!(
        m.step(late, &obs(true, busy(), 0)),
        Step::Teardown(Ending::Forced(Forced::Deadline))
    );
    let b = m.budget(late);
    assert!(b.close_remaining + b.unmount + b.lower_stop + b.lower_kill <= hard - late);
}

#[test]
fn margin_is_at_most_half_the_grace_period() {
    let mut m = Machine::new(Config {
        grace_period: Duration::from_secs(4),
        grace_margin: Duration::from_secs(10),
        quiet_period: QUIET,
        native_sidecar: false,
    });
    let t = Instant::now();
    m.trigger(Cause::Sigterm, t);
    assert_eq!(m.force_at(), Some(t + Duration::from_secs(2)));
    assert_eq!(m.hard_exit(), Some(t + Duration::from_millis(3500)));
}

#[test]
fn unforced_budgets_fit_before_the_hard_exit() {
    let mut m = machine(true);
    m.mounted();
    let t = Instant::now();
    m.trigger(Cause::Sigterm, t);
    let b = m.budget(t + Duration::from_secs(1));
    let left = m.hard_exit().unwrap() - (t + Duration::from_secs(1));
    assert!(b.lower_stop + b.lower_kill <= left);
    assert!(b.unmount <= left);
}

#[test]
fn exit_codes() {
    let clean = Outcome {
        lower_stop: Some(LowerStop::Clean),
        ..Default::default()
    };
    assert_eq!(exit_code(&clean), ExitCode::Clean);
    assert_eq!(
        exit_code(&Outcome {
            failed_flushes: 1,
            ..clean.clone()
        }),
        ExitCode::Incomplete
    );
    assert_eq!(
        exit_code(&Outcome {
            lower_stop: Some(LowerStop::Killed),
            ..clean.clone()
        }),
        ExitCode::Incomplete
    );
    assert_eq!(
        exit_code(&Outcome {
            lower_stop: Some(LowerStop::Unclean),
            ..clean.clone()
        }),
        ExitCode::LowerFailed
    );
    // Forced with nothing outstanding is still clean.
    assert_eq!(
        exit_code(&Outcome {
            forced: Some(Forced::SecondSignal),
            outstanding_at_force: Some(Outstanding::default()),
            ..clean.clone()
        }),
        ExitCode::Clean
    );
    assert_eq!(
        exit_code(&Outcome {
            failed: true,
            ..clean.clone()
        }),
        ExitCode::Failed
    );
    assert_eq!(ExitCode::Incomplete.code(), 75);
    assert_eq!(ExitCode::LowerFailed.code(), 69);
}

/// Issue 17.7: a lower SIGKILLed with only read-only requests in flight loses nothing;
/// with anything that may change data outstanding, nothing at all, or unknown, it is 75.
#[test]
fn a_lower_killed_with_only_reads_in_flight_is_clean() {
    let killed = |at_kill: Option<Outstanding>| Outcome {
        lower_stop: Some(LowerStop::Killed),
        forced: Some(Forced::LowerSigkill),
        outstanding_at_kill: at_kill,
        ..Default::default()
    };
    let reads = Outstanding {
        in_flight: 2,
        in_flight_read: 2,
        open_read: 1,
        open_dirs: 1,
        ..Default::default()
    };
    assert_eq!(exit_code(&killed(Some(reads))), ExitCode::Clean);
    // Nothing visible outstanding: the lower was busy with work of its own.
    assert_eq!(
        exit_code(&killed(Some(Outstanding::default()))),
        ExitCode::Incomplete
    );
    // Unless the relay's daemon never answered INIT (SIGKILLed while still starting, the stop
    // before INIT was even relayed: seen under load): nothing reached it, nothing to lose.
    assert_eq!(
        exit_code(&Outcome {
            never_served: true,
            ..killed(Some(Outstanding::default()))
        }),
        ExitCode::Clean
    );
    assert_eq!(
        exit_code(&Outcome {
            never_served: true,
            ..killed(None)
        }),
        ExitCode::Clean
    );
    // Reads in flight when the teardown began, cut off (the lower's connection ended)
    // before the kill: they explain it.
    assert_eq!(
        exit_code(&Outcome {
            reads_at_teardown: 2,
            ..killed(Some(Outstanding::default()))
        }),
        ExitCode::Clean
    );
    assert_eq!(
        exit_code(&Outcome {
            reads_at_teardown: 2,
            ..killed(Some(busy()))
        }),
        ExitCode::Incomplete
    );
    // Not known what was outstanding: as before, 75.
    assert_eq!(exit_code(&killed(None)), ExitCode::Incomplete);
    for w in [
        Outstanding {
            in_flight: 3,
            in_flight_read: 2,
            ..reads
        },
        Outstanding {
            open_write: 1,
            ..reads
        },
        Outstanding {
            lower_flush: 1,
            ..reads
        },
        Outstanding {
            lower_fsync: 1,
            ..reads
        },
        Outstanding {
            lower_release: 1,
            ..reads
        },
    ] {
        assert_eq!(exit_code(&killed(Some(w))), ExitCode::Incomplete, "{w:?}");
    }
    // A failed flush or an unfinished close still makes it 75.
    assert_eq!(
        exit_code(&Outcome {
            failed_flushes: 1,
            ..killed(Some(reads))
        }),
        ExitCode::Incomplete
    );
    assert_eq!(
        exit_code(&Outcome {
            closes_unfinished: true,
            ..killed(Some(reads))
        }),
        ExitCode::Incomplete
    );
    // Forced with work outstanding before the kill: 75 whatever was left at the kill.
    assert_eq!(
        exit_code(&Outcome {
            forced: Some(Forced::Deadline),
            outstanding_at_force: Some(busy()),
            ..killed(Some(reads))
        }),
        ExitCode::Incomplete
    );
}

#[test]
fn the_machine_records_what_was_outstanding_at_the_kill() {
    let mut m = machine(true);
    m.mounted();
    let t = Instant::now();
    m.trigger(Cause::Sigterm, t);
    assert_eq!(m.outstanding_at_kill(), None);
    m.lower_killed(t + Duration::from_secs(1), busy());
    assert_eq!(m.outstanding_at_kill(), Some(busy()));
    assert_eq!(m.forced(), Some(Forced::LowerSigkill));
}

#[test]
fn a_close_that_did_not_finish_is_incomplete() {
    assert_eq!(
        exit_code(&Outcome {
            lower_stop: Some(LowerStop::Clean),
            closes_unfinished: true,
            ..Default::default()
        }),
        ExitCode::Incomplete
    );
}

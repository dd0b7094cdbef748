use super::*;

const WINDOW: Duration = Duration::from_millis(300);
const EVERY: Duration = Duration::from_millis(20);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Counters `n` kilobytes into the run.
fn io(n: u64) -> IoSample {
    IoSample {
        wchar: n * 1000,
        ..IoSample::default()
    }
}

/// Drives the stop as the executor does, in fake time: a sample every [`EVERY`] (the
/// counters at time `t` are `counters(t)`, `None` when unreadable), a stop at `stop_at`, the
/// bound at `bound`, a second signal at `forced_at`. Returns how and when (since the start)
/// drainfs ends gcsfuse.
fn drive(
    counters: impl Fn(Duration) -> Option<u64>,
    stop_at: Duration,
    bound: Duration,
    forced_at: Option<Duration>,
) -> (Stop, Duration) {
    let t0 = Instant::now();
    let mut w = IdleWatch::new(WINDOW);
    let mut next_sample = t0;
    let mut now = t0;
    // Serving: samples every EVERY until the stop.
    while now - t0 < stop_at {
        w.sample(now, counters(now - t0).map(io));
        next_sample = now + EVERY;
        now = next_sample.min(t0 + stop_at);
    }
    for _ in 0..10_000 {
        if now >= next_sample {
            w.sample(now, counters(now - t0).map(io));
            next_sample = now + EVERY;
        }
        let forced = forced_at.is_some_and(|f| now - t0 >= f);
        match stop_step(&w, now, next_sample, t0 + bound, forced) {
            StopStep::End(s) => return (s, now - t0),
            StopStep::Wait { until } => {
                assert!(until > now, "no progress at {:?}", now - t0);
                // A second signal wakes the executor at once.
                now = match forced_at.map(|f| t0 + f) {
                    Some(f) if f > now && f < until => f,
                    _ => until,
                };
            }
        }
    }
    panic!("never ended");
}

#[test]
fn parses_proc_pid_io() {
    let text = "rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 5\nwrite_bytes: 6\ncancelled_write_bytes: 7\n";
    assert_eq!(
        IoSample::parse(text),
        Some(IoSample {
            rchar: 1,
            wchar: 2,
            syscr: 3,
            syscw: 4,
            read_bytes: 5,
            write_bytes: 6
        })
    );
    assert_eq!(IoSample::parse("rchar: 1\n"), None);
    assert_eq!(IoSample::parse(&text.replace("2", "x")), None);
}

/// A gcsfuse idle long before the stop is ended at once: the stillness seen while serving
/// counts.
#[test]
fn idle_before_the_stop_ends_at_once() {
    let (s, at) = drive(
        |t| {
            Some(if t < ms(100) {
                t.as_millis() as u64
            } else {
                100
            })
        },
        ms(2000),
        ms(4500),
        None,
    );
    assert_eq!((s, at), (Stop::Idle, ms(2000)));
}

/// Activity up to the stop: ended one window after the last change was seen, not sooner.
#[test]
fn activity_until_the_stop_waits_one_window() {
    let last = ms(1000);
    let (s, at) = drive(
        |t| Some(t.min(last).as_millis() as u64),
        last,
        ms(4500),
        None,
    );
    assert_eq!(s, Stop::Idle);
    assert!(at >= last + WINDOW, "{at:?}");
    assert!(at <= last + WINDOW + EVERY, "{at:?}");
}

/// An upload in flight that moves its counters with pauses shorter than the window is
/// never cut: drainfs waits until it has ended (plus the window).
#[test]
fn an_upload_with_short_pauses_is_waited_for() {
    // Moves for 40 ms, pauses 200 ms (< WINDOW), until 2.5 s after the start: the last
    // move ends at 2.44 s.
    let end = ms(2500);
    let counters = |t: Duration| {
        let t = t.min(end).as_millis() as u64;
        Some((t / 240) * 40 + (t % 240).min(40))
    };
    let (s, at) = drive(counters, ms(1000), ms(4500), None);
    assert_eq!(s, Stop::Idle);
    assert!(at >= ms(2440) + WINDOW, "cut at {at:?}");
    assert!(at <= ms(2440) + WINDOW + EVERY, "{at:?}");
}

/// Busy until past the bound: given up at the bound, not before.
#[test]
fn busy_at_the_bound_gives_up_there() {
    let (s, at) = drive(|t| Some(t.as_millis() as u64), ms(1000), ms(4500), None);
    assert_eq!((s, at), (Stop::Bound, ms(4500)));
}

/// The bound is past the grace period ([`give_up_at`]): an upload still moving 4.8 s into
/// the stop, when the stock sidecar's SIGKILL comes at 5 s, is waited for, not cut.
#[test]
fn an_upload_ending_just_before_the_grace_period_ends_is_not_cut() {
    let base = Instant::now();
    let stop = ms(1000);
    let bound = give_up_at(base, ms(5000), ms(500)) - base + stop;
    assert_eq!(bound, ms(6500));
    let end = stop + ms(4800);
    let (s, at) = drive(|t| Some(t.min(end).as_millis() as u64), stop, bound, None);
    assert_eq!(s, Stop::Idle);
    assert!(at >= end + WINDOW && at <= end + WINDOW + EVERY, "{at:?}");
}

/// Unreadable counters never count as idle: the bound ends it.
#[test]
fn unreadable_counters_are_never_idle() {
    let (s, at) = drive(|_| None, ms(1000), ms(4500), None);
    assert_eq!((s, at), (Stop::Bound, ms(4500)));
    // Readable again: idle one window later.
    let (s, at) = drive(|t| (t >= ms(2000)).then_some(7), ms(1000), ms(4500), None);
    assert_eq!(s, Stop::Idle);
    assert!(
        at >= ms(2000) + WINDOW && at <= ms(2000) + WINDOW + EVERY,
        "{at:?}"
    );
}

/// A second signal while busy ends it at once; while idle it changes nothing.
#[test]
fn a_second_signal_forces_only_a_busy_gcsfuse() {
    let (s, at) = drive(
        |t| Some(t.as_millis() as u64),
        ms(1000),
        ms(4500),
        Some(ms(1500)),
    );
    assert_eq!((s, at), (Stop::Forced, ms(1500)));
    let (s, at) = drive(|_| Some(1), ms(1000), ms(4500), Some(ms(1000)));
    assert_eq!((s, at), (Stop::Idle, ms(1000)));
}

/// The Go runtime's own tiny reads and writes (eventfd wake-ups, 3-byte reads) are not
/// activity; a FUSE request's 40-byte header is, and so is any storage I/O.
#[test]
fn the_runtime_s_own_tiny_io_is_not_activity() {
    let a = IoSample {
        rchar: 4108,
        wchar: 7091,
        syscr: 38,
        syscw: 22,
        read_bytes: 4096,
        write_bytes: 0,
    };
    let noise = IoSample {
        rchar: a.rchar + 3 + 8,
        wchar: a.wchar + 8,
        syscr: a.syscr + 2,
        syscw: a.syscw + 1,
        ..a
    };
    assert!(!a.moved_to(&noise));
    assert!(!a.moved_to(&a));
    let request = IoSample {
        rchar: a.rchar + 40,
        ..a
    };
    assert!(a.moved_to(&request));
    let storage = IoSample {
        write_bytes: 4096,
        ..a
    };
    assert!(a.moved_to(&storage));
    assert!(request.moved_to(&a), "counters that went backwards");
    let t0 = Instant::now();
    let mut w = IdleWatch::new(WINDOW);
    w.sample(t0, Some(a));
    w.sample(t0 + ms(200), Some(noise));
    w.sample(t0 + WINDOW, Some(noise));
    assert!(w.is_idle(t0 + WINDOW));
}

/// A request waiting for its answer (no counter moves while the server thinks) is activity.
#[test]
fn a_request_waiting_for_its_answer_is_activity() {
    let t0 = Instant::now();
    let mut w = IdleWatch::new(WINDOW);
    w.sample(t0, Some(io(1)));
    for i in 1..=20 {
        w.sample_with(t0 + ms(100 * i), Some(io(1)), true);
    }
    assert!(!w.is_idle(t0 + ms(2000)));
    w.sample_with(t0 + ms(2100), Some(io(1)), false);
    w.sample_with(t0 + ms(2000) + WINDOW - ms(1), Some(io(1)), false);
    assert!(!w.is_idle(t0 + ms(2000) + WINDOW - ms(1)));
    w.sample_with(t0 + ms(2000) + WINDOW, Some(io(1)), false);
    assert!(w.is_idle(t0 + ms(2000) + WINDOW));
}

/// Stillness runs to the last sample read, not to the time of the decision: a decision that
/// comes late (drainfs descheduled after a sample that saw a request waiting) is not idle
/// until a sample a window after that shows nothing. Measured with `stress-ng --cpu 2`: a
/// sample begun at 1,325 ms and read by 2,072 ms saw a request waiting; dated at its start, it
/// left 749 ms of "stillness" at the decision right after it.
#[test]
fn a_late_decision_rests_on_the_last_sample_read() {
    let t0 = Instant::now();
    let mut w = IdleWatch::new(WINDOW);
    w.sample(t0, Some(io(1)));
    w.sample_with(t0 + ms(100), Some(io(1)), true);
    // No sample since: however late the decision, nothing was seen to stand still.
    assert!(!w.is_idle(t0 + ms(100) + WINDOW * 3));
    assert_eq!(w.still_for(t0 + ms(100) + WINDOW * 3), Duration::ZERO);
    // A sample a window later that shows nothing: idle.
    w.sample_with(t0 + ms(100) + WINDOW, Some(io(1)), false);
    assert!(w.is_idle(t0 + ms(100) + WINDOW * 3));
    assert_eq!(w.still_for(t0 + ms(100) + WINDOW * 3), WINDOW);
    // Asked about a moment before that sample, only what was seen by then counts.
    assert_eq!(w.still_for(t0 + ms(150)), ms(50));
}

#[test]
fn parses_the_threads_of_proc_pid_task() {
    assert_eq!(CpuSample::parse_schedstat("123456 789 10\n"), Some(123_456));
    assert_eq!(CpuSample::parse_schedstat(""), None);
    assert_eq!(CpuSample::parse_schedstat("x 1 2"), None);
    // The command may hold parentheses and spaces: the state follows the last ')'.
    let stat = "42 (gcs) R (fuse)) S 1 42 42 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 8 0 1";
    assert_eq!(CpuSample::parse_state(stat), Some('S'));
    assert_eq!(CpuSample::parse_state("42 gcsfuse"), None);
    let mut c = CpuSample::default();
    c.add_thread(5, Some('S'));
    c.add_thread(7, Some('R'));
    c.add_thread(11, Some('D'));
    c.add_thread(13, None);
    assert_eq!(
        c,
        CpuSample {
            on_cpu_ns: 36,
            runnable: 1,
            blocked: 1
        }
    );
}

/// Time on a CPU of 1 ms or more between two samples is activity, and so is a thread
/// runnable or in an uninterruptible wait when read; the Go runtime's own wake-ups (well
/// under 1 ms) are not. Without two readable samples in a row, nothing is known: not busy.
#[test]
fn threads_that_ran_are_activity() {
    let idle = CpuSample {
        on_cpu_ns: 50_000_000,
        ..CpuSample::default()
    };
    let at = |ns| CpuSample {
        on_cpu_ns: ns,
        ..idle
    };
    assert!(!idle.moved_to(&at(50_000_000 + CPU_NOISE_NS - 1)));
    assert!(idle.moved_to(&at(50_000_000 + CPU_NOISE_NS)));
    assert!(idle.moved_to(&CpuSample {
        runnable: 1,
        ..idle
    }));
    assert!(idle.moved_to(&CpuSample { blocked: 1, ..idle }));
    assert!(idle.moved_to(&at(1)), "a sum that went backwards");
    let mut w = CpuWatch::default();
    assert!(!w.busy(Some(idle)), "the first sample");
    assert!(w.busy(Some(at(60_000_000))));
    assert!(!w.busy(Some(at(60_000_100))));
    assert!(!w.busy(None));
    assert!(!w.busy(Some(at(90_000_000))), "after an unreadable sample");
    w.skip();
    assert!(
        w.busy(Some(at(90_000_000))),
        "the reading after a skipped one"
    );
    assert!(!w.busy(Some(at(90_000_000))));
    w.skip();
    assert!(w.busy(None), "after a skip, even an unreadable reading");
}

/// While the I/O counters move, the threads are not read; the first sample after the I/O
/// reads them and counts as busy (nothing to compare with), so the idle window runs from
/// there: one sampling interval after the last I/O, never before it.
#[test]
fn threads_are_read_only_while_the_counters_stand_still() {
    let t0 = Instant::now();
    let mut w = IdleWatch::new(WINDOW);
    let mut cpu = CpuWatch::default();
    let mut reads = 0;
    let mut t = Duration::ZERO;
    let mut kb = 0;
    while t <= ms(1500) {
        // 1 s of I/O (a counter moves at every sample), then nothing; the threads' time stands
        // still throughout, as an idle gcsfuse's does.
        if t <= ms(1000) {
            kb += 1024;
        }
        let (moved, ran) = activity(&w, &mut cpu, Some(io(kb)), || {
            reads += 1;
            Some(CpuSample::default())
        });
        assert_eq!(moved, t <= ms(1000), "at {t:?}");
        assert_eq!(ran, t == ms(1020), "at {t:?}");
        w.sample_with(t0 + t, Some(io(kb)), ran);
        t += EVERY;
    }
    // Samples at 1020..=1500 ms read the threads, and only they.
    assert_eq!(reads, (1500 - 1000) / 20);
    assert!(!w.is_idle(t0 + ms(1020) + WINDOW - ms(1)));
    assert!(w.is_idle(t0 + ms(1020) + WINDOW));
}

/// A gcsfuse that computes without a system call (its counters still, its threads on a CPU)
/// is not idle: the window runs from the last sample at which it ran.
#[test]
fn computing_without_io_keeps_gcsfuse_from_idle() {
    let t0 = Instant::now();
    let mut w = IdleWatch::new(WINDOW);
    let mut cpu = CpuWatch::default();
    let mut ns = 0;
    let mut t = Duration::ZERO;
    while t <= ms(1500) {
        // 1.2 s of computing (10 ms on a CPU per 20 ms sample), then nothing.
        if t <= ms(1200) {
            ns += 10_000_000;
        }
        let ran = cpu.busy(Some(CpuSample {
            on_cpu_ns: ns,
            ..CpuSample::default()
        }));
        w.sample_with(t0 + t, Some(io(1)), ran);
        t += EVERY;
    }
    assert!(!w.is_idle(t0 + ms(1200) + WINDOW - ms(1)));
    assert!(w.is_idle(t0 + ms(1200) + WINDOW));
}

#[test]
fn the_first_sample_is_a_change() {
    let t0 = Instant::now();
    let mut w = IdleWatch::new(WINDOW);
    assert!(!w.is_idle(t0));
    assert_eq!(w.idle_at(), None);
    w.sample(t0, Some(io(1)));
    w.sample(t0 + WINDOW - ms(1), Some(io(1)));
    assert!(!w.is_idle(t0 + WINDOW - ms(1)));
    w.sample(t0 + WINDOW, Some(io(1)));
    assert!(w.is_idle(t0 + WINDOW));
    assert_eq!(w.idle_at(), Some(t0 + WINDOW));
    w.sample(t0 + WINDOW + ms(10), None);
    assert_eq!((w.unreadable(), w.is_idle(t0 + ms(1000))), (1, false));
}

#[test]
fn drainfs_ends_as_the_sidecar_mounter_expects() {
    let pid = nix::unistd::Pid::from_raw(5);
    let exited = |c| WaitStatus::Exited(pid, c);
    let killed = WaitStatus::Signaled(pid, Signal::SIGKILL, false);
    let term = Some(Signal::SIGTERM);
    // Idle after the sidecar mounter's SIGTERM: ends by SIGTERM (no "context canceled").
    let e = ending(Some(Stop::Idle), true, true, &killed);
    assert_eq!((e.outcome, e.code, e.raise), (outcome::IDLE, 0, term));
    assert_eq!(ending(Some(Stop::Idle), true, false, &killed).code, 0);
    // Busy at the bound, or forced while busy: 75.
    let e = ending(Some(Stop::Bound), true, true, &killed);
    assert_eq!(
        (e.outcome, e.code, e.raise),
        (outcome::BUSY_AT_BOUND, 75, None)
    );
    assert_eq!(ending(Some(Stop::Forced), true, true, &killed).code, 75);
    // gcsfuse ended by itself: the same status.
    let e = ending(None, false, true, &exited(1));
    assert_eq!(
        (e.outcome, e.code, e.raise),
        (outcome::GCSFUSE_EXITED, 1, None)
    );
    let e = ending(None, false, true, &killed);
    assert_eq!((e.code, e.raise), (137, Some(Signal::SIGKILL)));
    assert_eq!(ending(None, false, true, &exited(0)).code, 0);
    // Exit 0 by itself after a stop: a clean stop.
    assert_eq!(ending(None, true, true, &exited(0)).raise, term);
    // Anything else by itself after a stop: still mirrored.
    assert_eq!(ending(None, true, true, &exited(2)).code, 2);
}

#[test]
fn the_kernel_fd_is_the_dev_fd_mount_point() {
    let os = |v: &[&str]| v.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
    assert_eq!(
        kernel_fd(&os(&["/gcsfuse.real", "--foreground", "b", "/dev/fd/3"])),
        Some(3)
    );
    assert_eq!(kernel_fd(&os(&["g", "b", "/mnt/gcs"])), None);
    assert_eq!(kernel_fd(&os(&["g", "/dev/fd/3", "b", "/mnt"])), None);
    assert_eq!(kernel_fd(&os(&["g", "b", "/dev/fd/x"])), None);
    assert_eq!(kernel_fd(&os(&[])), None);
}

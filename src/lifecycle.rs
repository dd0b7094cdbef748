//! The executor of the passthrough mount's lifecycle: supervises the lower's process, mounts
//! drainfs, feeds the drain machine ([`crate::drain::Machine`], where every decision is made)
//! with triggers and observations, and carries out its steps (close the door, tear down).
//!
//! Triggers only *send* [`Event`]s: signals (the signal thread), exit files and the watched
//! process ([`crate::triggers`]), control requests, the lower's process exiting (the reaper),
//! the lower's connection failing (the core), drainfs's own mount going away (the session).
//! Every phase change is logged once with its cause.
//!
//! Observing: the executor registers for the accounting's change notification *before* it reads
//! the door and the counts ([`Accounting::observe`], door first), so no change between the
//! read and the wait is lost, and the machine only ever decides "drained" on counts read after
//! the door was closed.
//!
//! Teardown, in order: (forced only) flush and close the handles that are left; unmount drainfs
//! (a lazy detach when forced or busy, then abort drainfs's own FUSE connection so its session
//! ends at once); close every lower fd drainfs holds; stop the lower's process (its stop
//! signal, SIGKILL after the budget); remove the lower's FUSE mount if it lingers (by mount ID,
//! never a volume's bind mount); exit. Every wait is bounded by a [`crate::drain::Budget`] and
//! re-bounded when a trigger (a second signal) arrives during it.

use std::ffi::OsString;
use std::future::Future;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot, watch};

use crate::accounting::{Accounting, Outstanding};
use crate::config::{LowerProcess, RunConfig};
use crate::drain::{
    Budget, Config as DrainConfig, DoorReason, Ending, LowerStop, Machine, Observation, Outcome,
    Step, TriggerEffect,
};
pub use crate::drain::{Cause, CauseKind, ExitCode, Forced, Phase, Source};
use crate::fs::{Admission, CoreConfig, Fs};
use crate::fuse::{DrainFs, InitInfo};
use crate::{mount, procs, summary, triggers};

/// Something that happened, sent to the lifecycle by a trigger or a watcher.
#[derive(Debug)]
pub enum Event {
    /// A signal.
    Signal(Signal),
    /// A shutdown cause (exit file, watched pid, quit, drain).
    Trigger(Cause),
}

/// Shared, observable lifecycle state (for `/status`, probes and metrics).
#[derive(Debug)]
pub struct Shared {
    inner: Mutex<SharedInner>,
    /// Counters of the mount (present once mounted).
    pub acct: Arc<Accounting>,
    /// Triggers received, by cause.
    pub triggers: Mutex<std::collections::HashMap<CauseKind, u64>>,
    /// Forced teardowns with work outstanding, by reason.
    pub forced: Mutex<std::collections::HashMap<Forced, u64>>,
    /// Signalled on every phase change.
    pub phase_changed: watch::Sender<Phase>,
    started: std::sync::atomic::AtomicBool,
    admin: crate::config::AdminConfig,
    mountpoint: PathBuf,
    lower: PathBuf,
}

#[derive(Debug)]
struct SharedInner {
    phase: Phase,
    cause: Option<Cause>,
    deadline: Option<Instant>,
    fs: Option<Arc<Fs>>,
    init: Option<InitInfo>,
    lower_up: bool,
    drain_duration: Option<Duration>,
}

/// A point-in-time view of the lifecycle.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    /// Current phase.
    pub phase: Phase,
    /// First trigger and its cause.
    pub cause: Option<Cause>,
    /// Seconds left before the forced-exit deadline, once triggered.
    pub deadline_seconds_left: Option<f64>,
    /// Outstanding work.
    pub outstanding: Outstanding,
    /// In-flight requests by operation (only non-zero ones).
    pub in_flight_by_op: Vec<(String, i64)>,
    /// Paths still open (capped at 50), with their mode.
    pub open_paths: Vec<(String, crate::accounting::HandleMode)>,
    /// What INIT negotiated, and the data path chosen.
    pub init: Option<InitInfo>,
    /// Whether the lower's process is up.
    pub lower_up: bool,
    /// Duration of the drain once finished, seconds.
    pub drain_seconds: Option<f64>,
}

impl Shared {
    fn new(acct: Arc<Accounting>, cfg: &RunConfig) -> Arc<Self> {
        let (tx, _) = watch::channel(Phase::Starting);
        Arc::new(Shared {
            inner: Mutex::new(SharedInner {
                phase: Phase::Starting,
                cause: None,
                deadline: None,
                fs: None,
                init: None,
                lower_up: false,
                drain_duration: None,
            }),
            acct,
            triggers: Mutex::default(),
            forced: Mutex::default(),
            phase_changed: tx,
            started: std::sync::atomic::AtomicBool::new(false),
            admin: cfg.admin.clone(),
            mountpoint: cfg.fs.mountpoint.clone(),
            lower: cfg.fs.lower.clone(),
        })
    }

    /// Whether the mount is up and a round trip through it succeeded.
    pub fn is_started(&self) -> bool {
        self.started.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The admin configuration.
    pub fn admin_config(&self) -> crate::config::AdminConfig {
        self.admin.clone()
    }

    /// `(mountpoint, lower)`, absolute.
    pub fn paths(&self) -> (PathBuf, PathBuf) {
        (self.mountpoint.clone(), self.lower.clone())
    }

    /// Seconds from the first trigger to drained, once drained.
    pub fn drain_seconds(&self) -> Option<f64> {
        self.inner.lock().drain_duration.map(|d| d.as_secs_f64())
    }

    /// Whether kernel passthrough is in effect.
    pub fn passthrough(&self) -> bool {
        self.inner
            .lock()
            .init
            .as_ref()
            .is_some_and(|i| i.passthrough)
    }

    /// Current phase.
    pub fn phase(&self) -> Phase {
        self.inner.lock().phase
    }

    fn set_phase(&self, phase: Phase, why: &str) {
        let mut i = self.inner.lock();
        if i.phase == phase {
            return;
        }
        let from = i.phase;
        i.phase = phase;
        drop(i);
        tracing::info!(
            from = from.name(),
            to = phase.name(),
            cause = why,
            "lifecycle: {} -> {}",
            from.name(),
            phase.name()
        );
        self.phase_changed.send_replace(phase);
        notify_systemd(phase, why);
    }

    /// The mounted core, once mounted.
    pub fn fs(&self) -> Option<Arc<Fs>> {
        self.inner.lock().fs.clone()
    }

    /// Whether the lower's process is up.
    pub fn lower_up(&self) -> bool {
        self.inner.lock().lower_up
    }

    /// A snapshot for `/status` and `drainfs status`.
    pub fn snapshot(&self) -> Snapshot {
        let i = self.inner.lock();
        let fs = i.fs.clone();
        let snap = Snapshot {
            phase: i.phase,
            cause: i.cause.clone(),
            deadline_seconds_left: i
                .deadline
                .map(|d| d.saturating_duration_since(Instant::now()).as_secs_f64()),
            outstanding: self.acct.outstanding(),
            in_flight_by_op: crate::accounting::Op::ALL
                .iter()
                .filter_map(|op| {
                    let n = self
                        .acct
                        .op_stats(*op)
                        .in_flight
                        .load(std::sync::atomic::Ordering::Relaxed);
                    (n > 0).then(|| (op.name().to_string(), n))
                })
                .collect(),
            open_paths: Vec::new(),
            init: i.init.clone(),
            lower_up: i.lower_up,
            drain_seconds: i.drain_duration.map(|d| d.as_secs_f64()),
        };
        drop(i);
        Snapshot {
            open_paths: fs.map(|f| f.open_paths(50)).unwrap_or_default(),
            ..snap
        }
    }

    /// Time left before the forced-exit deadline, once triggered.
    pub fn deadline_left(&self) -> Option<Duration> {
        self.inner
            .lock()
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }
}

/// Handles the rest of drainfs (admin server, control socket) use to talk to the lifecycle.
#[derive(Clone, Debug)]
pub struct Control {
    /// Sends events (quit, drain) to the lifecycle.
    pub events: mpsc::UnboundedSender<Event>,
    /// Observable state.
    pub shared: Arc<Shared>,
}

/// The lower's process as supervised: its exit status arrives on a watch channel (from the
/// reaper, or from a pidfd for an adopted pid), so any number of waits can be bounded and
/// cancelled without owning the receiver.
struct Lower {
    pid: Option<i32>,
    spawned: bool,
    status: watch::Receiver<Option<WaitStatus>>,
    /// Keeps the channel open for a lower nobody reports on (adopted without a pid).
    _status_tx: Option<watch::Sender<Option<WaitStatus>>>,
    stderr_tail: Arc<Mutex<std::collections::VecDeque<String>>>,
}

impl Lower {
    /// Nothing supervised.
    fn unsupervised() -> Self {
        let (tx, rx) = watch::channel(None);
        Lower {
            pid: None,
            spawned: false,
            status: rx,
            _status_tx: Some(tx),
            stderr_tail: Arc::default(),
        }
    }

    /// An adopted process: its exit is seen through a pidfd (status unknown: reported as
    /// `exit 0`).
    fn adopted(pid: Option<i32>) -> Self {
        let Some(pid) = pid else {
            return Self::unsupervised();
        };
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            triggers::wait_pid_exit(pid).await;
            let _ = tx.send(Some(WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0)));
        });
        Lower {
            pid: Some(pid),
            spawned: false,
            status: rx,
            _status_tx: None,
            stderr_tail: Arc::default(),
        }
    }

    fn exited(&self) -> Option<WaitStatus> {
        *self.status.borrow()
    }

    /// Resolves with the exit status (never, for an unsupervised lower).
    fn wait(&self) -> impl Future<Output = WaitStatus> + Send + 'static {
        let mut rx = self.status.clone();
        async move {
            loop {
                if let Some(st) = *rx.borrow_and_update() {
                    return st;
                }
                if rx.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }

    fn watched(&self) -> bool {
        self.pid.is_some()
    }

    fn tail(&self) -> String {
        self.stderr_tail
            .lock()
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn spawn_lower(argv: &[OsString]) -> std::io::Result<Lower> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    // Its own process group: a Ctrl-C on drainfs's terminal must not reach gcsfuse, which
    // would unmount itself under a drain in progress. drainfs signals it when it is time.
    cmd.process_group(0);
    let (mut child, exit) = procs::spawn(&mut cmd)?;
    let tail = Arc::new(Mutex::new(std::collections::VecDeque::with_capacity(20)));
    if let Some(stderr) = child.stderr.take() {
        let tail = Arc::clone(&tail);
        std::thread::Builder::new()
            .name("lower-stderr".into())
            .spawn(move || {
                use std::io::{BufRead, Write};
                let reader = std::io::BufReader::new(stderr);
                for line in reader.lines() {
                    let Ok(line) = line else { break };
                    let _ = writeln!(std::io::stderr(), "{line}");
                    let mut t = tail.lock();
                    if t.len() == 20 {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            })?;
    }
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        if let Ok(st) = exit.await {
            let _ = tx.send(Some(st));
        }
    });
    Ok(Lower {
        pid: Some(child.id() as i32),
        spawned: true,
        status: rx,
        _status_tx: None,
        stderr_tail: tail,
    })
}

/// Whether a wait status is a clean stop after `sent` was sent: exit 0, exit 128+sent (as
/// rclone's 130 after SIGINT), or death by `sent` itself.
pub fn clean_stop(st: &WaitStatus, sent: Signal) -> bool {
    match st {
        WaitStatus::Exited(_, code) => *code == 0 || *code == 128 + sent as i32,
        WaitStatus::Signaled(_, sig, _) => *sig == sent,
        _ => false,
    }
}

/// Timings of the shutdown, milliseconds since the first trigger.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    /// Wall-clock time of the first trigger (RFC 3339).
    pub trigger: Option<String>,
    /// Admission closed.
    pub door_closed_ms: Option<u64>,
    /// Nothing outstanding.
    pub drained_ms: Option<u64>,
    /// drainfs unmounted.
    pub unmounted_ms: Option<u64>,
    /// The lower's process exited.
    pub lower_exited_ms: Option<u64>,
    /// drainfs about to exit.
    pub exit_ms: Option<u64>,
}

struct Runner {
    cfg: RunConfig,
    shared: Arc<Shared>,
    events: mpsc::UnboundedReceiver<Event>,
    lower: Lower,
    admission: Arc<Admission>,
    machine: Machine,
    timings: Timings,
    open_at_force: Vec<String>,
    failed_flushes: Vec<String>,
    lower_exit: Option<String>,
    lower_stop: Option<LowerStop>,
    /// The lower's FUSE mount, once it appeared (the only lower mount drainfs may remove).
    lower_mount_id: Option<u64>,
    failed: bool,
    notes: Vec<String>,
}

/// Runs drainfs: supervise/adopt the lower, mount, serve, drain, tear down. Returns the exit
/// status. `lower` and `mountpoint` in `cfg` must already be absolute (see
/// [`mount::preflight`]). `on_control` receives the handles of the admin server and control
/// socket once the shared state exists.
pub async fn run(
    cfg: RunConfig,
    events_tx: mpsc::UnboundedSender<Event>,
    events: mpsc::UnboundedReceiver<Event>,
    on_control: impl FnOnce(Control),
) -> i32 {
    let acct = Accounting::new();
    let shared = Shared::new(Arc::clone(&acct), &cfg);
    on_control(Control {
        events: events_tx.clone(),
        shared: Arc::clone(&shared),
    });
    triggers::start(&cfg.lifecycle, events_tx.clone());

    let machine = Machine::new(DrainConfig {
        grace_period: cfg.lifecycle.grace_period,
        grace_margin: cfg.lifecycle.grace_margin,
        quiet_period: cfg.lifecycle.quiet_period,
        native_sidecar: cfg.lifecycle.native_sidecar,
    });
    let mut r = Runner {
        lower: Lower::unsupervised(),
        cfg,
        shared,
        events,
        admission: Admission::new(&acct),
        machine,
        timings: Timings::default(),
        open_at_force: Vec::new(),
        failed_flushes: Vec::new(),
        lower_exit: None,
        lower_stop: None,
        lower_mount_id: None,
        failed: false,
        notes: Vec::new(),
    };
    let code = r.run_all(acct).await;
    r.timings.exit_ms = r.ms_since_trigger();
    r.shared.set_phase(Phase::Done, "exit");
    let s = r.summary(code);
    summary::emit(
        &s,
        r.cfg.lifecycle.summary_file.as_deref(),
        r.cfg.lifecycle.termination_log.as_deref(),
    );
    code.code()
}

impl Runner {
    fn ms_since(&self, t: Option<Instant>) -> Option<u64> {
        let t0 = self.machine.first_trigger()?.0;
        t.map(|t| t.saturating_duration_since(t0).as_millis() as u64)
    }

    fn ms_since_trigger(&self) -> Option<u64> {
        self.ms_since(Some(Instant::now()))
    }

    /// Feeds an event to the machine and acts on what it says about the trigger itself.
    fn on_event(&mut self, ev: Event) {
        let cause = match ev {
            Event::Signal(Signal::SIGTERM) => Cause::Sigterm,
            Event::Signal(Signal::SIGINT) => Cause::Sigint,
            Event::Signal(other) => {
                tracing::info!(signal = other.as_str(), "ignoring signal");
                return;
            }
            Event::Trigger(c) => c,
        };
        *self
            .shared
            .triggers
            .lock()
            .entry(CauseKind::from(&cause))
            .or_default() += 1;
        match &cause {
            // Every later call fails at once with EIO.
            Cause::LowerDied { .. } => self.admission.set_lower_gone(),
            Cause::ControlPlaneFailed { detail } => {
                tracing::error!(detail, "the control plane failed: draining, then exiting 1");
                self.failed = true;
            }
            _ => {}
        }
        let label = cause.label();
        let gone = cause.workload_gone(self.cfg.lifecycle.native_sidecar);
        let detail = format!("{cause:?}");
        let first = !self.machine.triggered();
        let effect = self.machine.trigger(cause.clone(), Instant::now());
        if first {
            self.timings.trigger =
                Some(humantime::format_rfc3339_millis(SystemTime::now()).to_string());
            self.shared.inner.lock().cause = Some(cause);
            self.shared.acct.set_watching(true);
            tracing::info!(
                cause = label,
                detail,
                workload_gone = gone,
                grace_period = ?self.cfg.lifecycle.grace_period,
                "shutdown triggered"
            );
        }
        self.shared.inner.lock().deadline = self.machine.force_at();
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

    /// Logs the machine's phase changes (the machine owns the phase; `Shared` mirrors it).
    fn sync_phase(&mut self, why: &str) {
        let phase = self.machine.phase();
        if phase != self.shared.phase() {
            self.shared.set_phase(phase, why);
        }
    }

    /// Moves the machine (and the mirror) to a teardown phase.
    fn advance(&mut self, to: Phase, why: &str) {
        self.machine.advance(to);
        self.sync_phase(why);
    }

    /// Runs `fut` until it resolves or the step's budget (from `pick`) runs out; triggers that
    /// arrive meanwhile are recorded, and one that forces the teardown shortens the bound.
    /// `None` when the budget ran out.
    async fn bounded<T>(
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

    async fn run_all(&mut self, acct: Arc<Accounting>) -> ExitCode {
        // 1. The lower.
        let lower_path = self.cfg.fs.lower.clone();
        match self.cfg.lifecycle.lower_process.clone() {
            LowerProcess::Spawn { argv } => {
                let before = mount::mount_at(&lower_path).map(|m| m.id);
                match spawn_lower(&argv) {
                    Ok(l) => self.lower = l,
                    Err(e) => {
                        tracing::error!(command = ?argv[0], error = %e, "cannot start the lower's process");
                        self.on_event(Event::Trigger(Cause::LowerDied {
                            detail: format!("cannot start {}: {e}", argv[0].to_string_lossy()),
                        }));
                        return ExitCode::LowerFailed;
                    }
                }
                tracing::info!(pid = self.lower.pid, command = ?argv, "started the lower's process; waiting for its mount");
                if let Some(code) = self.wait_lower_ready(&lower_path, before).await {
                    return code;
                }
            }
            LowerProcess::Adopted { pid } => {
                self.lower = Lower::adopted(pid);
                let p = lower_path.clone();
                let answered = blocking(move || std::fs::metadata(&p).map(|_| ())).await;
                if let Err(e) = answered {
                    tracing::error!(lower = %lower_path.display(), error = %e, "the lower does not answer");
                    self.on_event(Event::Trigger(Cause::LowerDied {
                        detail: format!("lower {} does not answer: {e}", lower_path.display()),
                    }));
                    return ExitCode::LowerFailed;
                }
            }
        }
        self.shared.inner.lock().lower_up = true;

        // 2. Mount drainfs.
        let core = match Fs::new(
            &self.cfg.fs.lower,
            CoreConfig {
                max_lower_fds: self.cfg.fs.max_lower_fds.unwrap_or_else(default_fd_budget),
            },
            Arc::clone(&acct),
            Arc::clone(&self.admission),
        ) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                tracing::error!(lower = %self.cfg.fs.lower.display(), error = %e, "cannot open the lower");
                self.failed = true;
                self.stop_lower_after_failure("drainfs could not open the lower")
                    .await;
                return ExitCode::LowerFailed;
            }
        };
        let init = Arc::new(Mutex::new(None));
        let (session_done_tx, session_done) = oneshot::channel::<std::io::Result<()>>();
        let mut session_done = Some(session_done);
        let mounted = mount_session(
            &self.cfg,
            Arc::clone(&core),
            Arc::clone(&init),
            session_done_tx,
        )
        .await;
        if let Err(e) = mounted {
            let why = init
                .lock()
                .as_ref()
                .and_then(|i: &InitInfo| i.passthrough_off_reason.clone());
            tracing::error!(mountpoint = %self.cfg.fs.mountpoint.display(), error = %e, reason = ?why, "cannot mount drainfs");
            self.notes.push(format!("mount failed: {e}"));
            self.failed = true;
            self.stop_lower_after_failure("drainfs could not mount")
                .await;
            return ExitCode::Failed;
        }
        // The FUSE connection behind drainfs's own mount (for an abort after a lazy detach).
        let own_connection = mount::mount_at(&self.cfg.fs.mountpoint).and_then(|m| m.dev_minor);
        let info = init.lock().clone().unwrap_or_default();
        tracing::info!(
            mountpoint = %self.cfg.fs.mountpoint.display(),
            lower = %self.cfg.fs.lower.display(),
            passthrough = info.passthrough,
            passthrough_off_reason = info.passthrough_off_reason.as_deref().unwrap_or(""),
            kernel_abi = %info.kernel_abi,
            threads = self.cfg.fs.threads,
            "mounted; data path: {}",
            match (info.passthrough, self.cfg.fs.passthrough) {
                (false, _) => "served by drainfs",
                (true, crate::config::PassthroughMode::Reads) => {
                    "kernel passthrough for read-only opens, writes served by drainfs"
                }
                (true, _) => "kernel passthrough",
            }
        );
        {
            let mut i = self.shared.inner.lock();
            i.fs = Some(Arc::clone(&core));
            i.init = Some(info);
        }
        // A real round trip through the mount before anyone is told it is ready.
        let mp = self.cfg.fs.mountpoint.clone();
        let rt = tokio::time::timeout(
            Duration::from_secs(10),
            blocking(move || {
                nix::sys::statfs::statfs(&mp)?;
                set_readahead(&mp);
                Ok::<(), nix::Error>(())
            }),
        )
        .await;
        match rt {
            Ok(Ok(())) => self
                .shared
                .started
                .store(true, std::sync::atomic::Ordering::SeqCst),
            other => {
                tracing::error!(result = ?other, "the first round trip through the mount failed")
            }
        }
        self.machine.mounted();
        self.sync_phase("mounted");
        if let Some(rf) = &self.cfg.lifecycle.ready_file
            && let Err(e) = summary::write_atomic(rf, b"ready\n")
        {
            tracing::warn!(path = %rf.display(), error = %e, "cannot write the ready file");
        }

        // 3. Serve until the machine says the mount drained or the teardown is forced.
        let ending = self.serve(&acct, &core, &mut session_done).await;

        // 4. Teardown.
        self.teardown(ending, core, session_done, own_connection)
            .await
    }

    /// The serving loop: observe (door, then counts), step the machine, carry out its step,
    /// wait for the next event, count change or wake-up time.
    async fn serve(
        &mut self,
        acct: &Arc<Accounting>,
        core: &Arc<Fs>,
        session_done: &mut Option<oneshot::Receiver<std::io::Result<()>>>,
    ) -> Ending {
        loop {
            // Register for the count's change notification before reading the counts.
            let changed = acct.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (door_closed, outstanding) = acct.observe();
            let obs = Observation {
                door_closed,
                outstanding,
                idle_for: acct.since_last_activity(),
            };
            let now = Instant::now();
            let step = self.machine.step(now, &obs);
            let why = match (self.machine.phase(), self.machine.door_reason()) {
                (Phase::DoorClosed, Some(r)) => r.name(),
                _ => self.machine.first_trigger().map_or("", |(_, c)| c.label()),
            };
            match step {
                Step::CloseDoor => {
                    self.admission.close();
                    let reason = self.machine.door_reason().map_or("", DoorReason::name);
                    tracing::info!(
                        reason,
                        "door closed: new opens, creates and namespace changes get ESHUTDOWN"
                    );
                    if let Some(rf) = &self.cfg.lifecycle.ready_file {
                        let _ = std::fs::remove_file(rf);
                    }
                    continue;
                }
                Step::Teardown(ending) => {
                    let reason = self.machine.door_reason().map_or("", DoorReason::name);
                    self.sync_phase(reason);
                    let (closed_at, drained_at) = self.machine.milestones();
                    self.timings.door_closed_ms = self.ms_since(closed_at);
                    self.timings.drained_ms = self.ms_since(drained_at);
                    if let Ending::Forced(reason) = ending {
                        let out = self.machine.outstanding_at_force().unwrap_or_default();
                        self.open_at_force =
                            core.open_paths(100).into_iter().map(|(p, _)| p).collect();
                        if !out.is_idle() {
                            *self.shared.forced.lock().entry(reason).or_default() += 1;
                        }
                        tracing::warn!(reason = reason.name(), outstanding = ?out, open = ?self.open_at_force, "forcing the teardown");
                    } else {
                        self.shared.inner.lock().drain_duration = self
                            .machine
                            .first_trigger()
                            .and_then(|(t0, _)| drained_at.map(|d| d - t0));
                        tracing::info!(
                            after_ms = self.timings.drained_ms,
                            "drained: nothing in flight, every handle released"
                        );
                    }
                    return ending;
                }
                Step::AbortStart | Step::Wait { .. } => {}
            }
            if self.machine.phase() == Phase::Draining {
                if let Some(rf) = &self.cfg.lifecycle.ready_file {
                    let _ = std::fs::remove_file(rf);
                }
            }
            self.sync_phase(why);
            let until = match step {
                Step::Wait { until } => until,
                _ => None,
            };
            let sleep = async move {
                match until {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            };
            let lower_exit = self.lower.wait();
            let lower_watched = self.lower.watched() && self.machine.lower_died().is_none();
            let session = async {
                match session_done.as_mut() {
                    Some(rx) => rx.await,
                    None => std::future::pending().await,
                }
            };
            let triggered = self.machine.triggered();
            tokio::select! {
                ev = self.events.recv() => {
                    if let Some(ev) = ev { self.on_event(ev) }
                }
                st = lower_exit, if lower_watched => {
                    self.on_event(Event::Trigger(Cause::LowerDied { detail: format!("lower process exited: {}", procs::describe(&st)) }));
                }
                _ = self.admission.lower_gone_notify.notified(), if self.machine.lower_died().is_none() => {
                    self.on_event(Event::Trigger(Cause::LowerDied { detail: "the lower's FUSE connection failed (ENOTCONN/ECONNABORTED)".into() }));
                }
                r = session => {
                    *session_done = None;
                    tracing::warn!(result = ?r, "drainfs's mount was removed from outside");
                    self.on_event(Event::Trigger(Cause::UnmountedExternally));
                    // No request can arrive any more: close what the kernel will never release.
                    let c = Arc::clone(core);
                    if let Some(failed) = self.bounded(|b| b.close_remaining, blocking(move || c.close_all())).await {
                        self.failed_flushes.extend(failed);
                    }
                }
                _ = &mut changed, if triggered => {}
                _ = sleep => {}
            }
        }
    }

    /// Waits for the lower's mount to appear at `lower_path` (a new mount ID, not `before`),
    /// while watching the process and triggers. `Some(code)` when drainfs must exit.
    async fn wait_lower_ready(
        &mut self,
        lower_path: &Path,
        before: Option<u64>,
    ) -> Option<ExitCode> {
        let deadline = Instant::now() + self.cfg.lifecycle.lower_ready_timeout;
        loop {
            if let Some(m) = mount::mount_at(lower_path)
                && Some(m.id) != before
                && !mount::is_dead(lower_path)
            {
                tracing::info!(lower = %lower_path.display(), fstype = %m.fstype, mount_id = m.id, "the lower is mounted");
                self.lower_mount_id = Some(m.id);
                return None;
            }
            if let Some(st) = self.lower.exited() {
                let tail = self.lower.tail();
                tracing::error!(status = %procs::describe(&st), stderr_tail = %tail, "the lower's process exited before its mount appeared");
                self.on_event(Event::Trigger(Cause::LowerDied {
                    detail: format!("exited before ready ({}): {}", procs::describe(&st), tail),
                }));
                self.lower_exit = Some(procs::describe(&st));
                self.cleanup_new_lower_mount(lower_path, before).await;
                return Some(ExitCode::LowerFailed);
            }
            if self.machine.step(Instant::now(), &Observation::default()) == Step::AbortStart {
                tracing::info!(
                    "shutdown before the lower was ready: stopping it; nothing was mounted"
                );
                self.stop_lower("shutdown before the lower was ready").await;
                self.cleanup_new_lower_mount(lower_path, before).await;
                return Some(match self.lower_stop {
                    Some(LowerStop::Clean) | Some(LowerStop::NotSupervised) | None => {
                        ExitCode::Clean
                    }
                    _ => ExitCode::LowerFailed,
                });
            }
            if Instant::now() >= deadline {
                tracing::error!(timeout = ?self.cfg.lifecycle.lower_ready_timeout, stderr_tail = %self.lower.tail(), "the lower's mount did not appear in time");
                self.on_event(Event::Trigger(Cause::LowerDied {
                    detail: format!(
                        "mount did not appear within {:?}",
                        self.cfg.lifecycle.lower_ready_timeout
                    ),
                }));
                self.stop_lower("the lower's mount did not appear in time")
                    .await;
                self.cleanup_new_lower_mount(lower_path, before).await;
                return Some(ExitCode::LowerFailed);
            }
            // The mount table has no cheap notification usable here; 20 ms polling only lasts
            // while the lower starts.
            tokio::select! {
                ev = self.events.recv() => if let Some(ev) = ev { self.on_event(ev) },
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    }

    /// Removes a FUSE mount that appeared at `path` after `before` (a lower that mounted and
    /// then failed or was stopped before drainfs took over).
    async fn cleanup_new_lower_mount(&mut self, path: &Path, before: Option<u64>) {
        if let Some(m) = mount::mount_at(path)
            && Some(m.id) != before
            && m.fstype.starts_with("fuse")
        {
            self.lower_mount_id = Some(m.id);
        }
        self.remove_lower_mount(path).await;
    }

    /// Removes the lower's FUSE mount if it is still the topmost mount at `path` (identified by
    /// the mount ID seen when it appeared; a volume's own bind mount is never touched).
    async fn remove_lower_mount(&mut self, path: &Path) {
        let Some(id) = self.lower_mount_id else {
            return;
        };
        match mount::mount_at(path) {
            Some(m) if m.id == id => {}
            _ => return,
        }
        let p = path.to_path_buf();
        let exited = self.lower.exited().is_some() || !self.lower.watched();
        let res = self
            .bounded(
                |b| b.lower_kill.max(Duration::from_millis(100)),
                blocking(move || {
                    if mount::mount_at(&p).is_none_or(|m| m.id != id) {
                        return Ok(None);
                    }
                    if exited || mount::is_dead(&p) {
                        mount::abort_fuse_connection(&p);
                    }
                    mount::unmount(&p, true, Duration::from_secs(5)).map(Some)
                }),
            )
            .await;
        tracing::info!(lower = %path.display(), mount_id = id, result = ?res, "removed the lower's lingering mount");
    }

    async fn stop_lower_after_failure(&mut self, why: &str) {
        if self.lower.spawned {
            self.on_event(Event::Trigger(Cause::LowerDied {
                detail: why.to_string(),
            }));
            self.stop_lower(why).await;
            let p = self.cfg.fs.lower.clone();
            self.remove_lower_mount(&p).await;
        }
    }

    /// Sends the lower its stop signal and waits within the budget; SIGKILL after.
    async fn stop_lower(&mut self, why: &str) {
        let Some(pid) = self.lower.pid else {
            self.lower_stop = Some(LowerStop::NotSupervised);
            return;
        };
        self.advance(Phase::StoppingLower, why);
        let sig = self.cfg.lifecycle.lower_signal;
        if self.lower.exited().is_none() {
            tracing::info!(pid, signal = sig.as_str(), "stopping the lower's process");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
        }
        let wait = self.lower.wait();
        let mut st = self.bounded(|b| b.lower_stop, wait).await;
        let mut killed = false;
        if st.is_none() {
            tracing::warn!(
                pid,
                "the lower's process did not exit within its budget: SIGKILL"
            );
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
            killed = true;
            self.machine.lower_killed(Instant::now());
            *self
                .shared
                .forced
                .lock()
                .entry(Forced::LowerSigkill)
                .or_default() += 1;
            let wait = self.lower.wait();
            st = self.bounded(|b| b.lower_kill, wait).await;
        }
        self.timings.lower_exited_ms = self.ms_since_trigger();
        self.shared.inner.lock().lower_up = false;
        self.lower_stop = Some(if killed {
            LowerStop::Killed
        } else {
            match &st {
                Some(s) if !self.lower.spawned || clean_stop(s, sig) => LowerStop::Clean,
                _ => LowerStop::Unclean,
            }
        });
        if let Some(st) = st {
            self.lower_exit = Some(procs::describe(&st));
            tracing::info!(pid, status = %procs::describe(&st), stop = ?self.lower_stop, "the lower's process exited");
        }
    }

    async fn teardown(
        &mut self,
        ending: Ending,
        core: Arc<Fs>,
        session_done: Option<oneshot::Receiver<std::io::Result<()>>>,
        own_connection: Option<u32>,
    ) -> ExitCode {
        let mp = self.cfg.fs.mountpoint.clone();
        let why = match ending {
            Ending::Drained => "drained",
            Ending::Forced(r) => r.name(),
        };
        self.advance(Phase::Unmounting, why);
        let forced = matches!(ending, Ending::Forced(_));
        if forced {
            // Flush and close what is left (a flush may hang on a wedged lower: bounded).
            let c = Arc::clone(&core);
            match self
                .bounded(|b| b.close_remaining, blocking(move || c.close_all()))
                .await
            {
                Some(failed) => self.failed_flushes.extend(failed),
                None => self.notes.push(
                    "closing the remaining lower fds did not finish within its budget".into(),
                ),
            }
        }
        if let Some(session_done) = session_done {
            let p = mp.clone();
            let lazy_first = forced || self.machine.lower_died().is_some();
            let res = self
                .bounded(
                    |b| b.unmount,
                    blocking(move || {
                        if lazy_first {
                            mount::unmount(&p, true, Duration::from_secs(5))
                        } else {
                            mount::unmount_or_detach(&p, Duration::from_secs(5))
                        }
                    }),
                )
                .await;
            let lazy = match res {
                Some(Ok(u)) => {
                    tracing::info!(mountpoint = %mp.display(), how = ?u, "unmounted drainfs");
                    u == mount::Unmounted::Lazy
                }
                Some(Err(e)) => {
                    tracing::error!(error = %e, "unmounting drainfs failed");
                    self.notes.push(e.to_string());
                    true
                }
                None => {
                    self.notes
                        .push("unmounting drainfs did not finish within its budget".into());
                    true
                }
            };
            if lazy {
                // Detached but still referenced (a process's cwd or open file): the session
                // would run until the last reference goes. Nothing outstanding remains to be
                // served (or it was forced), so end the connection now.
                if let Some(minor) = own_connection {
                    mount::abort_connection(minor);
                }
            }
            let wait = session_done;
            let _ = self
                .bounded(|b| b.unmount.min(Duration::from_secs(2)), wait)
                .await;
        }
        self.timings.unmounted_ms = self.ms_since_trigger();
        if !forced {
            let c = Arc::clone(&core);
            if let Some(failed) = self
                .bounded(|b| b.close_remaining, blocking(move || c.close_all()))
                .await
            {
                self.failed_flushes.extend(failed);
            }
        }
        self.failed_flushes.extend(core.failed_flushes());
        // Close every lower fd drainfs holds (the root's and the O_PATH cache) by dropping the
        // core: the fuser session released its reference when it ended. A lower fd left open
        // would make the lower's own unmount fail with EBUSY (gcsfuse then keeps running).
        self.shared.inner.lock().fs = None;
        let refs = Arc::strong_count(&core);
        drop(core);
        if refs > 1 {
            tracing::debug!(
                refs,
                "the core is still referenced (a stuck request); its lower fds close at exit"
            );
        }

        // The lower.
        if self.lower.watched() {
            self.stop_lower(if forced {
                "forced teardown"
            } else {
                "drained and unmounted"
            })
            .await;
            // Wait for its mount to go (gcsfuse unmounts on SIGINT); remove it if it lingers.
            let lower = self.cfg.fs.lower.clone();
            if let Some(id) = self.lower_mount_id {
                let p = lower.clone();
                let gone = async move {
                    while mount::mount_at(&p).is_some_and(|m| m.id == id) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                };
                let _ = self
                    .bounded(|b| b.lower_kill.min(Duration::from_secs(2)), gone)
                    .await;
            }
            self.remove_lower_mount(&lower).await;
        }
        drain_exit_code(self)
    }

    fn summary(&self, code: ExitCode) -> summary::Summary {
        let acct = &self.shared.acct;
        summary::Summary {
            exit_code: code.code(),
            outcome: code.outcome(),
            cause: self.shared.inner.lock().cause.clone(),
            forced: self.machine.forced(),
            lower_died: self.machine.lower_died().map(str::to_string),
            lower_exit: self.lower_exit.clone(),
            timings: self.timings.clone(),
            outstanding_at_force: self.machine.outstanding_at_force(),
            open_paths: self.open_at_force.clone(),
            failed_flushes: self.failed_flushes.clone(),
            counts: summary::Counts::from(acct.as_ref()),
            notes: self.notes.clone(),
        }
    }
}

fn drain_exit_code(r: &Runner) -> ExitCode {
    crate::drain::exit_code(&Outcome {
        lower_died: r.machine.lower_died().is_some(),
        lower_stop: r.lower_stop,
        forced: r.machine.forced(),
        outstanding_at_force: r.machine.outstanding_at_force(),
        failed_flushes: r.failed_flushes.len(),
        failed: r.failed,
    })
}

/// Tells systemd (when `NOTIFY_SOCKET` is set) READY=1 once serving, STOPPING=1 once
/// draining, and a STATUS= line on every phase change.
fn notify_systemd(phase: Phase, why: &str) {
    use sd_notify::NotifyState;
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let status = format!("{} ({why})", phase.name());
    let mut states = vec![NotifyState::Status(&status)];
    match phase {
        Phase::Serving => states.push(NotifyState::Ready),
        Phase::Draining | Phase::DoorClosed | Phase::Unmounting => {
            states.push(NotifyState::Stopping)
        }
        _ => {}
    }
    if let Err(e) = sd_notify::notify(&states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

/// Raises the mount's readahead to [`crate::fuse::MAX_IO`]: the kernel starts a FUSE mount's
/// bdi at 128 KiB whatever `max_readahead` says, so reads served by drainfs would arrive in
/// 128 KiB requests (an eighth of the work per round trip). Best effort: `/sys` may be read-only.
fn set_readahead(mountpoint: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = std::fs::metadata(mountpoint) else {
        return;
    };
    let dev = md.dev();
    let path = format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        libc::major(dev),
        libc::minor(dev)
    );
    if let Err(e) = std::fs::write(&path, format!("{}", crate::fuse::MAX_IO / 1024)) {
        tracing::debug!(path, error = %e, "cannot raise the mount's readahead");
    }
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

/// Mounts drainfs: creates the fuser session on a dedicated thread (mount + INIT handshake),
/// then runs its worker threads there until the mount goes away; `done` receives the result.
async fn mount_session(
    cfg: &RunConfig,
    core: Arc<Fs>,
    init: Arc<Mutex<Option<InitInfo>>>,
    done: oneshot::Sender<std::io::Result<()>>,
) -> std::io::Result<()> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("drainfs".into()),
        fuser::MountOption::Subtype("drainfs".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoAtime,
    ];
    config.acl = fuser::SessionACL::All;
    config.n_threads = Some(cfg.fs.threads);
    config.clone_fd = true;
    let fs = DrainFs::new(core, cfg.fs.ttl, cfg.fs.passthrough, init);
    let mp = cfg.fs.mountpoint.clone();
    let (ready_tx, ready_rx) = oneshot::channel::<std::io::Result<()>>();
    std::thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || match fuser::Session::new(fs, &mp, &config) {
            Ok(session) => {
                let _ = ready_tx.send(Ok(()));
                let _ = done.send(session.run());
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        })?;
    ready_rx
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("mount thread died")))
}

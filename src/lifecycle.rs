//! The one place that decides shutdown (mountpoint-s3's `fuse/session.rs` shape).
//!
//! States: `starting` (the lower's process is starting; nothing is mounted) → `serving` →
//! `draining` (a trigger arrived; admission still open while the workload may be shutting
//! down) → `door_closed` (new opens, creates and namespace changes get `ESHUTDOWN`) →
//! `unmounting` → `stopping_lower` → `done`.
//!
//! Triggers only *send* [`Event`]s: signals (the signal thread), exit files and the watched
//! process ([`crate::triggers`]), control requests, the lower's process exiting (the reaper),
//! the lower's connection failing (the core). Every transition is logged once with its cause.
//!
//! Order of teardown (issue #3): wait until nothing is in flight and every handle is released
//! (every lower close, i.e. every upload, has returned); unmount drainfs; close any remaining
//! lower fd; signal the lower's process; wait for it and for its mount to go; exit. Nothing
//! waits a fixed time. Every wait is bounded by the deadline: the first trigger plus the grace
//! period minus a safety margin; past it the teardown is forced (flush and close lower fds,
//! lazy unmount, SIGKILL the lower, abort and detach a dead lower mount) and drainfs exits 75.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::{mpsc, oneshot};

use crate::accounting::{Accounting, Outstanding};
use crate::config::{LowerProcess, RunConfig};
use crate::fs::{Admission, CoreConfig, Fs};
use crate::fuse::{DrainFs, InitInfo};
use crate::{mount, procs, summary, triggers};

/// Exit status: everything drained and the lower stopped cleanly.
pub const EXIT_OK: i32 = 0;
/// Exit status (EX_USAGE-like, as clap uses): bad command line or configuration.
pub const EXIT_USAGE: i32 = 2;
/// Exit status EX_UNAVAILABLE: the lower failed to start, failed, or died.
pub const EXIT_LOWER_FAILED: i32 = 69;
/// Exit status EX_TEMPFAIL: the deadline (or a second signal) forced the exit with work
/// outstanding, or a lower flush failed: data may be incomplete.
pub const EXIT_INCOMPLETE: i32 = 75;
/// Exit status: drainfs itself could not mount or serve.
pub const EXIT_FAILURE: i32 = 1;

/// Lifecycle phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Waiting for the lower's mount.
    Starting,
    /// Mounted and serving.
    Serving,
    /// A trigger arrived; admission still open until the mount is quiet.
    Draining,
    /// Admission closed; waiting for outstanding work.
    DoorClosed,
    /// Unmounting drainfs.
    Unmounting,
    /// Stopping the lower's process.
    StoppingLower,
    /// Finished.
    Done,
}

impl Phase {
    /// Every phase, for the metrics' `phase` label.
    pub const ALL: [Phase; 7] = [
        Phase::Starting,
        Phase::Serving,
        Phase::Draining,
        Phase::DoorClosed,
        Phase::Unmounting,
        Phase::StoppingLower,
        Phase::Done,
    ];

    /// Label value.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Starting => "starting",
            Phase::Serving => "serving",
            Phase::Draining => "draining",
            Phase::DoorClosed => "door_closed",
            Phase::Unmounting => "unmounting",
            Phase::StoppingLower => "stopping_lower",
            Phase::Done => "done",
        }
    }
}

/// Why shutdown started (or was escalated).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "cause")]
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
        /// `http` or `control`.
        source: String,
    },
    /// A drain request (`/drain`, `drainfs drain`): start draining, workload may still run.
    DrainRequest {
        /// `http` or `control`.
        source: String,
    },
    /// The lower's process exited or its connection failed.
    LowerDied {
        /// What was seen.
        detail: String,
    },
    /// drainfs's own mount was removed by someone else.
    UnmountedExternally,
}

impl Cause {
    /// Short label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Cause::Sigterm => "sigterm",
            Cause::Sigint => "sigint",
            Cause::ExitFile { .. } => "exit_file",
            Cause::WatchedPidExited { .. } => "watched_pid_exited",
            Cause::QuitRequest { .. } => "quit_request",
            Cause::DrainRequest { .. } => "drain_request",
            Cause::LowerDied { .. } => "lower_died",
            Cause::UnmountedExternally => "unmounted_externally",
        }
    }

    /// Every label, for metrics.
    pub const LABELS: [&'static str; 8] = [
        "sigterm",
        "sigint",
        "exit_file",
        "watched_pid_exited",
        "quit_request",
        "drain_request",
        "lower_died",
        "unmounted_externally",
    ];
}

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
    /// Triggers received, by cause label.
    pub triggers: Mutex<Vec<(&'static str, u64)>>,
    /// Forced shutdowns, by reason.
    pub forced: Mutex<Vec<(&'static str, u64)>>,
    /// Signalled on every phase change.
    pub phase_changed: tokio::sync::watch::Sender<Phase>,
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
    /// What INIT negotiated.
    pub init: Option<InitInfo>,
    /// Whether the lower's process is up.
    pub lower_up: bool,
    /// Duration of the drain once finished, seconds.
    pub drain_seconds: Option<f64>,
}

impl Shared {
    fn new(acct: Arc<Accounting>, cfg: &RunConfig) -> Arc<Self> {
        let (tx, _) = tokio::sync::watch::channel(Phase::Starting);
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
            triggers: Mutex::new(Vec::new()),
            forced: Mutex::new(Vec::new()),
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

    fn count(list: &Mutex<Vec<(&'static str, u64)>>, label: &'static str) {
        let mut l = list.lock();
        match l.iter_mut().find(|(k, _)| *k == label) {
            Some((_, n)) => *n += 1,
            None => l.push((label, 1)),
        }
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

/// The lower's process as supervised.
struct Lower {
    pid: Option<i32>,
    exit: Option<oneshot::Receiver<WaitStatus>>,
    status: Option<WaitStatus>,
    stderr_tail: Arc<Mutex<std::collections::VecDeque<String>>>,
    spawned: bool,
}

impl Lower {
    fn poll_exit(&mut self) -> Option<WaitStatus> {
        if self.status.is_none()
            && let Some(rx) = self.exit.as_mut()
            && let Ok(st) = rx.try_recv()
        {
            self.status = Some(st);
            self.exit = None;
        }
        self.status
    }

    async fn wait_exit(&mut self) -> WaitStatus {
        if let Some(st) = self.status {
            return st;
        }
        match self.exit.as_mut() {
            Some(rx) => match rx.await {
                Ok(st) => {
                    self.status = Some(st);
                    self.exit = None;
                    st
                }
                Err(_) => std::future::pending().await,
            },
            None => match self.pid {
                Some(pid) => {
                    triggers::wait_pid_exit(pid).await;
                    let st = WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0);
                    self.status = Some(st);
                    st
                }
                None => std::future::pending().await,
            },
        }
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
    let (mut child, rx) = procs::spawn(&mut cmd)?;
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
    Ok(Lower {
        pid: Some(child.id() as i32),
        exit: Some(rx),
        status: None,
        stderr_tail: tail,
        spawned: true,
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
    t0: Option<Instant>,
    force_at: Option<Instant>,
    hard_exit: Option<Instant>,
    workload_gone: bool,
    signals_seen: u32,
    forced: Option<&'static str>,
    lower_died: Option<String>,
    timings: Timings,
    outstanding_at_force: Option<Outstanding>,
    open_at_force: Vec<String>,
    failed_flushes: Vec<String>,
    lower_exit: Option<String>,
    lower_clean: bool,
    notes: Vec<String>,
    /// The lower's FUSE mount (by mount ID): the only lower mount drainfs may remove.
    lower_mount: Option<mount::MountInfo>,
    /// drainfs's own mount (by mount ID), recorded right after mounting.
    own_mount: Option<mount::MountInfo>,
}

/// Runs drainfs: supervise/adopt the lower, mount, serve, drain, tear down. Returns the exit
/// status. `lower` and `mountpoint` in `cfg` must already be absolute (see
/// [`mount::preflight`]).
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

    let mut r = Runner {
        lower: Lower {
            pid: None,
            exit: None,
            status: None,
            stderr_tail: Arc::default(),
            spawned: false,
        },
        cfg,
        shared,
        events,
        admission: Admission::new(),
        t0: None,
        force_at: None,
        hard_exit: None,
        workload_gone: false,
        signals_seen: 0,
        forced: None,
        lower_died: None,
        timings: Timings::default(),
        outstanding_at_force: None,
        open_at_force: Vec::new(),
        failed_flushes: Vec::new(),
        lower_exit: None,
        lower_clean: true,
        notes: Vec::new(),
        lower_mount: None,
        own_mount: None,
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
    code
}

impl Runner {
    fn ms_since_trigger(&self) -> Option<u64> {
        self.t0.map(|t| t.elapsed().as_millis() as u64)
    }

    /// Records a trigger: the first one starts the clock; classifies "workload gone".
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
        let is_signal = matches!(cause, Cause::Sigterm | Cause::Sigint);
        Shared::count(&self.shared.triggers, cause.label());
        if is_signal {
            self.signals_seen += 1;
        }
        let gone = match &cause {
            Cause::ExitFile { .. } | Cause::WatchedPidExited { .. } | Cause::QuitRequest { .. } => {
                true
            }
            Cause::Sigterm => self.cfg.lifecycle.native_sidecar,
            Cause::LowerDied { detail } => {
                if self.lower_died.is_none() {
                    self.lower_died = Some(detail.clone());
                }
                true
            }
            Cause::UnmountedExternally => true,
            Cause::Sigint | Cause::DrainRequest { .. } => false,
        };
        if self.t0.is_none() {
            let now = Instant::now();
            let grace = self.cfg.lifecycle.grace_period;
            let margin = self.cfg.lifecycle.grace_margin.min(grace / 2);
            self.t0 = Some(now);
            self.force_at = Some(now + grace.saturating_sub(margin));
            self.hard_exit = Some(now + grace.saturating_sub(margin / 4));
            self.timings.trigger =
                Some(humantime::format_rfc3339_millis(SystemTime::now()).to_string());
            {
                let mut i = self.shared.inner.lock();
                i.cause = Some(cause.clone());
                i.deadline = self.force_at;
            }
            tracing::info!(
                cause = cause.label(),
                detail = ?cause,
                workload_gone = gone,
                grace_period = ?grace,
                margin = ?margin,
                "shutdown triggered"
            );
        } else if is_signal && self.signals_seen >= 2 && self.forced.is_none() {
            tracing::warn!(
                cause = cause.label(),
                "second signal: stop waiting, finishing now"
            );
            self.force("second_signal");
        } else {
            tracing::info!(cause = cause.label(), detail = ?cause, workload_gone = gone, "further trigger");
        }
        if gone && !self.workload_gone {
            self.workload_gone = true;
        }
        if let Some(fs) = self.shared.fs() {
            fs.acct.set_watching(true);
        }
    }

    fn force(&mut self, reason: &'static str) {
        if self.forced.is_some() {
            return;
        }
        self.forced = Some(reason);
        // "Finish now": the forced teardown gets the safety margin (at least 1 s), never more
        // than what is left of the grace period.
        let now = Instant::now();
        let margin = self.cfg.lifecycle.grace_margin.max(Duration::from_secs(1));
        self.force_at = Some(self.force_at.map_or(now, |f| f.min(now)));
        self.hard_exit = Some(self.hard_exit.map_or(now + margin, |h| h.min(now + margin)));
        self.shared.inner.lock().deadline = self.force_at;
        let out = self.shared.acct.outstanding();
        self.outstanding_at_force = Some(out);
        if let Some(fs) = self.shared.fs() {
            self.open_at_force = fs.open_paths(100).into_iter().map(|(p, _)| p).collect();
        }
        if !out.is_idle() {
            Shared::count(&self.shared.forced, reason);
        }
        tracing::warn!(reason, outstanding = ?out, open = ?self.open_at_force, "forcing shutdown");
    }

    /// How long the mount has been idle, counted from the first trigger at the earliest: an
    /// application that is still shutting down gets the whole quiet period after the trigger,
    /// however idle the mount was before it.
    fn idle_for(&self, acct: &Accounting) -> Duration {
        let since_activity = acct.since_last_activity();
        match self.t0 {
            Some(t0) => since_activity.min(t0.elapsed()),
            None => since_activity,
        }
    }

    fn triggered(&self) -> bool {
        self.t0.is_some()
    }

    fn remaining_to_force(&self) -> Option<Duration> {
        self.force_at
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    async fn run_all(&mut self, acct: Arc<Accounting>) -> i32 {
        // 1. The lower.
        let lower_path = self.cfg.fs.lower.clone();
        match self.cfg.lifecycle.lower_process.clone() {
            LowerProcess::Spawn { argv } => {
                let before = mount::mount_at(&lower_path).map(|m| m.id);
                match spawn_lower(&argv) {
                    Ok(l) => self.lower = l,
                    Err(e) => {
                        tracing::error!(command = ?argv[0], error = %e, "cannot start the lower's process");
                        self.lower_died =
                            Some(format!("cannot start {}: {e}", argv[0].to_string_lossy()));
                        return EXIT_LOWER_FAILED;
                    }
                }
                tracing::info!(pid = self.lower.pid, command = ?argv, "started the lower's process; waiting for its mount");
                if let Some(code) = self.wait_lower_ready(&lower_path, before).await {
                    return code;
                }
            }
            LowerProcess::Adopted { pid } => {
                self.lower.pid = pid;
                self.lower_mount = mount::fuse_mount_above(&lower_path, None);
                if let Err(e) = std::fs::metadata(&lower_path) {
                    tracing::error!(lower = %lower_path.display(), error = %e, "the lower does not answer");
                    self.lower_died = Some(format!(
                        "lower {} does not answer: {e}",
                        lower_path.display()
                    ));
                    return EXIT_LOWER_FAILED;
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
                self.stop_lower_after_failure().await;
                return EXIT_LOWER_FAILED;
            }
        };
        let init = Arc::new(Mutex::new(None));
        let mp_baseline = mount::baseline(&self.cfg.fs.mountpoint);
        let (session_done_tx, mut session_done) = oneshot::channel::<std::io::Result<()>>();
        let mounted = mount_session(
            &self.cfg,
            Arc::clone(&core),
            Arc::clone(&init),
            session_done_tx,
        )
        .await;
        let mounted = mounted.map(|m| self.own_mount = m);
        if let Err(e) = mounted {
            let why = init
                .lock()
                .as_ref()
                .and_then(|i: &InitInfo| i.passthrough_off_reason.clone());
            tracing::error!(mountpoint = %self.cfg.fs.mountpoint.display(), error = %e, reason = ?why, "cannot mount drainfs");
            self.notes.push(format!("mount failed: {e}"));
            self.stop_lower_after_failure().await;
            return EXIT_FAILURE;
        }
        if self.own_mount.is_none() {
            self.own_mount = mount::fuse_mount_above(&self.cfg.fs.mountpoint, mp_baseline);
        }
        let info = init.lock().clone().unwrap_or_default();
        tracing::info!(
            mountpoint = %self.cfg.fs.mountpoint.display(),
            lower = %self.cfg.fs.lower.display(),
            passthrough = info.passthrough,
            writes_passthrough = info.writes_passthrough,
            lower_fs = info.lower_fs.as_deref().unwrap_or(""),
            reason = %info.data_path_reason,
            passthrough_off_reason = info.passthrough_off_reason.as_deref().unwrap_or(""),
            kernel_abi = %info.kernel_abi,
            threads = self.cfg.fs.threads,
            "mounted; data path: {}",
            match (info.passthrough, info.writes_passthrough) {
                (false, _) => "served by drainfs",
                (true, false) => {
                    "kernel passthrough for read-only opens, writes served by drainfs"
                }
                (true, true) => "kernel passthrough",
            }
        );
        {
            let mut i = self.shared.inner.lock();
            i.fs = Some(Arc::clone(&core));
            i.init = Some(info);
        }
        if self.triggered() {
            acct.set_watching(true);
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
        self.shared.set_phase(Phase::Serving, "mounted");
        if let Some(rf) = &self.cfg.lifecycle.ready_file
            && let Err(e) = summary::write_atomic(rf, b"ready\n")
        {
            tracing::warn!(path = %rf.display(), error = %e, "cannot write the ready file");
        }

        // 3. Serve until triggered; then drain.
        let mut session_ended = false;
        loop {
            if self.lower.poll_exit().is_some() && self.lower_died.is_none() {
                let st = self.lower.status.expect("polled");
                self.on_event(Event::Trigger(Cause::LowerDied {
                    detail: format!("lower process exited: {}", procs::describe(&st)),
                }));
                self.admission.set_lower_gone();
            }
            if self.triggered() {
                if self.shared.phase() == Phase::Serving {
                    let label = self
                        .shared
                        .inner
                        .lock()
                        .cause
                        .as_ref()
                        .map_or("", |c| c.label());
                    self.shared.set_phase(Phase::Draining, label);
                    if let Some(rf) = &self.cfg.lifecycle.ready_file {
                        let _ = std::fs::remove_file(rf);
                    }
                }
                if self.lower_died.is_some() {
                    self.admission.set_lower_gone();
                }
                let out = acct.outstanding();
                let door_open = !self.admission.is_closed();
                if door_open {
                    let quiet =
                        out.is_idle() && self.idle_for(&acct) >= self.cfg.lifecycle.quiet_period;
                    if self.workload_gone || quiet || self.forced.is_some() {
                        self.admission.close();
                        self.timings.door_closed_ms = self.ms_since_trigger();
                        let why = if self.workload_gone {
                            "workload gone"
                        } else if quiet {
                            "mount quiet"
                        } else {
                            "forced"
                        };
                        self.shared.set_phase(Phase::DoorClosed, why);
                    }
                }
                if self.admission.is_closed() && out.is_idle() {
                    self.timings.drained_ms = self.ms_since_trigger();
                    self.shared.inner.lock().drain_duration = self.t0.map(|t| t.elapsed());
                    tracing::info!(
                        after_ms = self.timings.drained_ms,
                        "drained: nothing in flight, every handle released"
                    );
                    break;
                }
                if self.forced.is_some() {
                    break;
                }
                if self.lower_died.is_some() {
                    // Nothing can be uploaded any more; give applications a moment to see EIO
                    // and close, but never more than 5 s.
                    let t0 = self.t0.expect("triggered");
                    if t0.elapsed() >= Duration::from_secs(5) {
                        self.force("lower_died");
                        break;
                    }
                }
                if self.remaining_to_force() == Some(Duration::ZERO) {
                    self.force("deadline");
                    break;
                }
            }
            // Wait for something to change.
            let wake = self.next_wake(&acct);
            tokio::select! {
                ev = self.events.recv() => {
                    if let Some(ev) = ev { self.on_event(ev) }
                }
                st = self.lower.wait_exit(), if self.lower_died.is_none() && (self.lower.exit.is_some() || (self.lower.pid.is_some() && !self.lower.spawned)) => {
                    self.on_event(Event::Trigger(Cause::LowerDied { detail: format!("lower process exited: {}", procs::describe(&st)) }));
                    self.admission.set_lower_gone();
                }
                _ = self.admission.lower_gone_notify.notified(), if self.lower_died.is_none() => {
                    self.on_event(Event::Trigger(Cause::LowerDied { detail: "the lower's FUSE connection failed (ENOTCONN/ECONNABORTED)".into() }));
                }
                r = &mut session_done, if !session_ended => {
                    session_ended = true;
                    tracing::warn!(result = ?r, "drainfs's mount was removed from outside");
                    self.on_event(Event::Trigger(Cause::UnmountedExternally));
                }
                _ = acct.changed.notified(), if self.triggered() => {}
                _ = tokio::time::sleep(wake) => {}
            }
        }

        // 4. Teardown.
        self.teardown(core, session_done, session_ended).await
    }

    fn next_wake(&self, acct: &Accounting) -> Duration {
        let mut wake = Duration::from_secs(3600);
        if let Some(left) = self.remaining_to_force() {
            wake = wake.min(left);
        }
        if self.triggered() && !self.admission.is_closed() {
            let since = self.idle_for(acct);
            let q = self.cfg.lifecycle.quiet_period;
            wake = wake.min(q.saturating_sub(since).max(Duration::from_millis(1)));
        }
        if self.lower_died.is_some() {
            wake = wake.min(Duration::from_millis(100));
        }
        wake
    }

    async fn wait_lower_ready(&mut self, lower_path: &Path, before: Option<u64>) -> Option<i32> {
        let deadline = Instant::now() + self.cfg.lifecycle.lower_ready_timeout;
        loop {
            if let Some(m) = mount::fuse_mount_above(lower_path, before)
                && !mount::is_dead(lower_path)
            {
                tracing::info!(lower = %lower_path.display(), fstype = %m.fstype, mount_id = m.id, "the lower is mounted");
                self.lower_mount = Some(m);
                return None;
            }
            if let Some(st) = self.lower.poll_exit() {
                let tail = self.lower.tail();
                tracing::error!(status = %procs::describe(&st), stderr_tail = %tail, "the lower's process exited before its mount appeared");
                self.lower_died = Some(format!(
                    "exited before ready ({}): {}",
                    procs::describe(&st),
                    tail
                ));
                self.lower_exit = Some(procs::describe(&st));
                self.cleanup_lower_mount(mount::fuse_mount_above(lower_path, before))
                    .await;
                return Some(EXIT_LOWER_FAILED);
            }
            if self.triggered() {
                tracing::info!(
                    "shutdown before the lower was ready: stopping it; nothing was mounted"
                );
                self.stop_lower("shutdown before the lower was ready").await;
                self.cleanup_lower_mount(mount::fuse_mount_above(lower_path, before))
                    .await;
                let code = if self.lower_clean {
                    EXIT_OK
                } else {
                    EXIT_LOWER_FAILED
                };
                return Some(code);
            }
            if Instant::now() >= deadline {
                tracing::error!(timeout = ?self.cfg.lifecycle.lower_ready_timeout, stderr_tail = %self.lower.tail(), "the lower's mount did not appear in time");
                self.lower_died = Some(format!(
                    "mount did not appear within {:?}",
                    self.cfg.lifecycle.lower_ready_timeout
                ));
                self.t0.get_or_insert(Instant::now());
                self.force_at = Some(Instant::now() + Duration::from_secs(5));
                self.hard_exit = self.force_at;
                self.stop_lower("the lower's mount did not appear in time")
                    .await;
                self.cleanup_lower_mount(mount::fuse_mount_above(lower_path, before))
                    .await;
                return Some(EXIT_LOWER_FAILED);
            }
            tokio::select! {
                ev = self.events.recv() => if let Some(ev) = ev { self.on_event(ev) },
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
    }

    /// Unmounts the lower's FUSE mount `m` (by mount ID), if any.
    async fn cleanup_lower_mount(&mut self, m: Option<mount::MountInfo>) {
        if let Some(m) = m {
            let path = m.mount_point.clone();
            let res = blocking(move || {
                let lazy = mount::is_dead(&m.mount_point);
                if lazy {
                    mount::abort_mount(&m);
                }
                mount::unmount_mount(&m, lazy, Duration::from_secs(5))
                    .or_else(|_| mount::unmount_mount(&m, true, Duration::from_secs(5)))
            })
            .await;
            tracing::info!(lower = %path.display(), result = ?res, "removed the lower's leftover mount");
        }
    }

    async fn stop_lower_after_failure(&mut self) {
        if self.lower.spawned {
            self.t0.get_or_insert(Instant::now());
            self.force_at
                .get_or_insert(Instant::now() + Duration::from_secs(10));
            self.hard_exit
                .get_or_insert(Instant::now() + Duration::from_secs(10));
            self.stop_lower("drainfs could not mount").await;
            self.cleanup_lower_mount(self.lower_mount.clone()).await;
        }
    }

    /// Sends the lower its stop signal and waits (bounded by the deadline); SIGKILL after.
    async fn stop_lower(&mut self, why: &str) {
        let Some(pid) = self.lower.pid else { return };
        self.shared.set_phase(Phase::StoppingLower, why);
        let sig = self.cfg.lifecycle.lower_signal;
        if self.lower.poll_exit().is_none() {
            tracing::info!(pid, signal = sig.as_str(), "stopping the lower's process");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
        }
        // Normally until the deadline; in a forced teardown, half of what is left before the hard
        // exit (then SIGKILL, which also releases any of our threads stuck in a lower FLUSH:
        // FUSE FLUSH requests wait uninterruptibly for the lower's answer).
        let bound = if self.forced.is_some() {
            self.hard_exit.map_or(Duration::ZERO, |h| {
                h.saturating_duration_since(Instant::now()) / 2
            })
        } else {
            self.force_at.map_or(Duration::from_secs(30), |f| {
                f.saturating_duration_since(Instant::now())
            })
        };
        let st = match tokio::time::timeout(bound, self.lower.wait_exit()).await {
            Ok(st) => Some(st),
            Err(_) => {
                tracing::warn!(
                    pid,
                    "the lower's process did not exit before the deadline: SIGKILL"
                );
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
                Shared::count(&self.shared.forced, "lower_sigkill");
                self.lower_clean = false;
                if self.forced.is_none() {
                    self.forced = Some("lower_sigkill");
                }
                let bound = self.hard_exit.map_or(Duration::from_secs(1), |h| {
                    h.saturating_duration_since(Instant::now())
                });
                tokio::time::timeout(bound, self.lower.wait_exit())
                    .await
                    .ok()
            }
        };
        self.timings.lower_exited_ms = self.ms_since_trigger();
        self.shared.inner.lock().lower_up = false;
        if let Some(st) = st {
            self.lower_exit = Some(procs::describe(&st));
            let clean = !self.lower.spawned || clean_stop(&st, sig);
            if !clean {
                self.lower_clean = false;
            }
            tracing::info!(pid, status = %procs::describe(&st), clean, "the lower's process exited");
        }
    }

    async fn teardown(
        &mut self,
        core: Arc<Fs>,
        session_done: oneshot::Receiver<std::io::Result<()>>,
        session_ended: bool,
    ) -> i32 {
        let mp = self.cfg.fs.mountpoint.clone();
        let hard = self
            .hard_exit
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(10));
        let left = || hard.saturating_duration_since(Instant::now());
        self.shared.set_phase(
            Phase::Unmounting,
            if self.forced.is_some() {
                "forced"
            } else {
                "drained"
            },
        );
        if self.forced.is_some() {
            // Flush and close what is left (a flush may hang on a wedged lower: bounded).
            let c = Arc::clone(&core);
            let budget = left() / 4;
            match tokio::time::timeout(budget, blocking(move || c.close_all())).await {
                Ok(failed) => self.failed_flushes.extend(failed),
                Err(_) => self.notes.push(
                    "closing the remaining lower fds did not finish before the deadline".into(),
                ),
            }
        }
        if !session_ended && self.own_mount.is_none() {
            tracing::error!(mountpoint = %mp.display(), "drainfs's own mount was not found after mounting: not unmounting by path");
            self.notes
                .push("drainfs's own mount was not identified; left mounted".into());
        }
        if !session_ended && let Some(own) = self.own_mount.clone() {
            let lazy_first = self.forced.is_some() || self.lower_died.is_some();
            let res = tokio::time::timeout(
                left(),
                blocking(move || {
                    if lazy_first {
                        mount::unmount_mount(&own, true, Duration::from_secs(5))
                    } else {
                        mount::unmount_or_detach_mount(&own, Duration::from_secs(5))
                    }
                }),
            )
            .await;
            match res {
                Ok(Ok(u)) => {
                    tracing::info!(mountpoint = %mp.display(), how = ?u, "unmounted drainfs")
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "unmounting drainfs failed");
                    self.notes.push(e.to_string());
                }
                Err(_) => self
                    .notes
                    .push("unmounting drainfs did not finish before the deadline".into()),
            }
        }
        self.timings.unmounted_ms = self.ms_since_trigger();
        let _ = tokio::time::timeout(left().min(Duration::from_secs(2)), session_done).await;
        if self.forced.is_none() {
            let failed = blocking({
                let c = Arc::clone(&core);
                move || c.close_all()
            })
            .await;
            self.failed_flushes.extend(failed);
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
        if self.lower.pid.is_some() {
            let why = if self.forced.is_some() {
                "forced teardown"
            } else {
                "drained and unmounted"
            };
            self.stop_lower(why).await;
        }
        let lower = self.cfg.fs.lower.clone();
        if self.lower.spawned || self.lower_died.is_some() || self.lower.pid.is_some() {
            // Wait for its mount to go (gcsfuse unmounts on SIGINT); remove it if it lingers
            // or is dead.
            let until = Instant::now() + left().min(Duration::from_secs(2));
            let present = |m: &Option<mount::MountInfo>| {
                m.as_ref()
                    .is_some_and(|m| mount::mount_by_id(m.id).is_some())
            };
            while present(&self.lower_mount)
                && Instant::now() < until
                && self.lower.status.is_none()
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if let Some(m) = self
                .lower_mount
                .clone()
                .filter(|_| present(&self.lower_mount))
            {
                // Off the runtime thread: `is_dead` stats the lower, which blocks if it is wedged.
                // A lazy detach is one syscall that does not wait on the lower, so it gets a
                // small minimum even when the deadline has nothing left.
                let exited = self.lower.status.is_some();
                let res = tokio::time::timeout(
                    left().max(Duration::from_millis(100)),
                    blocking(move || {
                        if exited || mount::is_dead(&m.mount_point) {
                            mount::abort_mount(&m);
                            mount::unmount_mount(&m, true, Duration::from_secs(5)).map(Some)
                        } else {
                            Ok(None)
                        }
                    }),
                )
                .await;
                tracing::info!(lower = %lower.display(), result = ?res, "removed the lower's lingering mount");
            }
        }
        self.exit_code()
    }

    fn exit_code(&self) -> i32 {
        if self.lower_died.is_some() || !self.lower_clean && self.forced.is_none() {
            return EXIT_LOWER_FAILED;
        }
        let forced_with_work =
            self.forced.is_some() && self.outstanding_at_force.is_some_and(|o| !o.is_idle());
        if forced_with_work
            || !self.failed_flushes.is_empty()
            || self.forced == Some("lower_sigkill")
        {
            return EXIT_INCOMPLETE;
        }
        EXIT_OK
    }

    fn summary(&self, code: i32) -> summary::Summary {
        let acct = &self.shared.acct;
        summary::Summary {
            exit_code: code,
            outcome: match code {
                EXIT_OK => "clean",
                EXIT_INCOMPLETE => "incomplete",
                EXIT_LOWER_FAILED => "lower_failed",
                _ => "failed",
            },
            cause: self.shared.inner.lock().cause.clone(),
            forced: self.forced,
            lower_died: self.lower_died.clone(),
            lower_exit: self.lower_exit.clone(),
            timings: self.timings.clone(),
            outstanding_at_force: self.outstanding_at_force,
            open_paths: self.open_at_force.clone(),
            failed_flushes: self.failed_flushes.clone(),
            counts: summary::Counts::from(acct.as_ref()),
            notes: self.notes.clone(),
        }
    }
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

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
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
) -> std::io::Result<Option<mount::MountInfo>> {
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
    let mut fs = DrainFs::new(core, cfg.fs.ttl, cfg.fs.passthrough, init);
    if let Some(m) = mount::mount_containing(&cfg.fs.lower) {
        fs = fs.with_lower(&m.fstype, &m.source);
    }
    let mp = cfg.fs.mountpoint.clone();
    let (ready_tx, ready_rx) = oneshot::channel::<std::io::Result<Option<mount::MountInfo>>>();
    std::thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || {
            // drainfs mounts itself (see `mount::mount_fuse`); without CAP_SYS_ADMIN fuser
            // mounts through fusermount3.
            let session = match mount::mount_fuse(&mp, "drainfs", "drainfs") {
                Ok((fd, m)) => match fuser::Session::from_fd(fs, fd, config.acl, config.clone()) {
                    Ok(s) => Ok((s, Some(m))),
                    Err(e) => {
                        let _ = mount::unmount_mount(&m, true, Duration::from_secs(5));
                        Err(e)
                    }
                },
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                    fuser::Session::new(fs, &mp, &config).map(|s| (s, None))
                }
                Err(e) => Err(e),
            };
            match session {
                Ok((session, m)) => {
                    let _ = ready_tx.send(Ok(m));
                    let _ = done.send(session.run());
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })?;
    ready_rx
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("mount thread died")))
}

//! The executor of drainfs's lifecycle, for both data paths: supervises the lower's process,
//! starts the data path, feeds the drain machine ([`crate::drain::Machine`], where every
//! decision is made) with triggers and observations, and carries out its steps (close the door,
//! tear down).
//!
//! The data paths (`DataPath`) differ only in how they start, what they report while
//! serving (`PathEvent`) and how they are torn down:
//! - **mount**: drainfs mounts a passthrough view of the lower's directory (fuser session);
//! - **relay**: drainfs relays a FUSE connection to the lower's process (its daemon) over a
//!   socketpair ([`crate::relay`]); the daemon is the lower, its end of the socket is its
//!   "mount", and stopping it is `shutdown(SHUT_WR)` (it reads EOF, finishes and exits), never
//!   a signal. Both count into the same [`Accounting`], so the door, `/status`, metrics,
//!   probes, the ready file and the summary are the same.
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
//! Teardown of the mount, in order: (forced only) flush and close the handles that are left;
//! unmount drainfs
//! (a lazy detach when forced or busy, then abort drainfs's own FUSE connection so its session
//! ends at once); close every lower fd drainfs holds; stop the lower's process (its stop
//! signal, SIGKILL after the budget); remove the lower's FUSE mount if it lingers (by mount ID,
//! never a volume's bind mount); exit. Teardown of the relay: unmount (when drainfs mounted the
//! connection itself), SHUT_WR to the daemon, wait for it to exit (SIGKILL after its budget).
//! Every wait is bounded by a [`crate::drain::Budget`] and re-bounded when a trigger (a second
//! signal) arrives during it.

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
use crate::relay::engine::{EngineEvent, Relay, RelayStatus};
use crate::relay::run::Prepared;
pub use crate::summary::Timings;
pub use crate::triggers::Event;
use crate::{mount, procs, summary, triggers};

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
    data_path: &'static str,
    relay: Mutex<Option<Arc<Relay>>>,
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
    /// Paths still open (capped at 50), with their mode (mount only: the relay sees handles,
    /// not paths).
    pub open_paths: Vec<(String, crate::accounting::HandleMode)>,
    /// `mount` or `relay`.
    pub data_path: &'static str,
    /// The relay's INIT caps, socket buffers and counters (relay only).
    pub relay: Option<RelayStatus>,
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
            data_path: if cfg.relay.is_some() {
                "relay"
            } else {
                "mount"
            },
            relay: Mutex::new(None),
        })
    }

    /// `mount` (a passthrough view of a lower directory) or `relay`.
    pub fn data_path(&self) -> &'static str {
        self.data_path
    }

    /// The relay's status (relay mode, once started).
    pub fn relay_status(&self) -> Option<RelayStatus> {
        self.relay.lock().as_ref().map(|r| r.status())
    }

    /// Whether the mount is up and a round trip through it succeeded.
    pub fn is_started(&self) -> bool {
        self.started.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The admin configuration.
    pub fn admin_config(&self) -> crate::config::AdminConfig {
        self.admin.clone()
    }

    /// `(mountpoint, lower)`, absolute (empty when there is none: the lower of a relay, the
    /// mountpoint of an inherited relay connection).
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
            data_path: self.data_path,
            relay: None,
            init: i.init.clone(),
            lower_up: i.lower_up,
            drain_seconds: i.drain_duration.map(|d| d.as_secs_f64()),
        };
        drop(i);
        let relay = self.relay.lock().clone();
        Snapshot {
            open_paths: match (&fs, &relay) {
                (Some(f), _) => f.open_paths(50),
                (None, Some(r)) => r.open_paths(50),
                (None, None) => Vec::new(),
            },
            relay: relay.map(|r| r.status()),
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

    /// A process spawned elsewhere (the relay's daemon), whose exit status the reaper
    /// delivers on `exit`.
    fn spawned(pid: i32, exit: oneshot::Receiver<WaitStatus>) -> Self {
        Lower {
            pid: Some(pid),
            spawned: true,
            status: status_watch(exit),
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
    Ok(Lower {
        pid: Some(child.id() as i32),
        spawned: true,
        status: status_watch(exit),
        _status_tx: None,
        stderr_tail: tail,
    })
}

/// A watch channel that receives the exit status the reaper sends on `exit`.
fn status_watch(exit: oneshot::Receiver<WaitStatus>) -> watch::Receiver<Option<WaitStatus>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        if let Ok(st) = exit.await {
            let _ = tx.send(Some(st));
        }
    });
    rx
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

/// How many open files and admitted opens a forced teardown names in the summary.
const OPEN_PATHS_CAP: usize = 100;

/// How long, after the daemon's process has exited, the relay's pump may take to read the
/// rest of the daemon's replies and its end-of-stream.
const RELAY_SETTLE: Duration = Duration::from_secs(1);

/// Once the daemon's process has exited: waits (at most [`RELAY_SETTLE`]) until the pump has
/// read the daemon's last replies and its end-of-stream, then answers EIO to whatever is
/// still in flight (nothing, unless a process the daemon left behind holds its socket), so
/// that no request outlives drainfs without an answer (the kernel would fail it with
/// ECONNABORTED when drainfs's fd closes).
async fn settle_relay(r: &mut RelayPath) {
    let until = tokio::time::Instant::now() + RELAY_SETTLE;
    while !r.relay.daemon_gone() {
        match tokio::time::timeout_at(until, r.events.recv()).await {
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => break,
        }
    }
    let n = r.relay.fail_all();
    if n > 0 {
        tracing::warn!(
            answered_eio = n,
            "relay: requests still in flight after the daemon exited were answered EIO"
        );
    }
}

/// After a clean drain, how long the lower may take to exit on its stop signal before drainfs
/// ends its (busy) FUSE connection.
const LOWER_BUSY_AFTER: Duration = Duration::from_millis(500);

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

/// What drainfs serves, and the parts of the lifecycle that differ between the two.
enum DataPath {
    /// A passthrough view of the lower directory.
    Mount(MountPath),
    /// A FUSE connection relayed to the lower's process.
    Relay(RelayPath),
}

struct MountPath {
    core: Arc<Fs>,
    session_done: Option<oneshot::Receiver<std::io::Result<()>>>,
    /// The FUSE connection behind drainfs's own mount (for an abort after a lazy detach).
    own_connection: Option<u32>,
}

struct RelayPath {
    relay: Arc<Relay>,
    events: mpsc::UnboundedReceiver<EngineEvent>,
    /// The mount drainfs made itself (self-mounted relay), by mount ID.
    mounted: Option<mount::MountInfo>,
}

/// What a data path reports while serving.
enum PathEvent {
    /// The lower's side failed (its FUSE connection, or the relay's daemon closed its end).
    LowerGone(String),
    /// drainfs's own mount (or the relay's kernel connection) went away from outside.
    Unmounted(String),
    /// Nothing the lifecycle acts on.
    Nothing,
}

impl DataPath {
    /// The kernel side of a relay is gone: the daemon's EOF and exit that follow are the
    /// consequence (the relay sent the EOF), not a death of its own.
    fn kernel_gone(&self) -> bool {
        match self {
            DataPath::Mount(_) => false,
            DataPath::Relay(r) => r.relay.kernel_gone(),
        }
    }

    fn open_paths(&self, max: usize) -> Vec<String> {
        let paths = match self {
            DataPath::Mount(m) => m.core.open_paths(max),
            DataPath::Relay(r) => r.relay.open_paths(max),
        };
        paths.into_iter().map(|(p, _)| p).collect()
    }

    /// Opens and creates admitted and still in flight.
    fn admitted_paths(&self, max: usize) -> Vec<String> {
        match self {
            DataPath::Mount(m) => m.core.admitted_paths(max),
            DataPath::Relay(r) => r.relay.admitted_paths(max),
        }
    }

    /// Waits for the next thing the data path reports. `lower_died`: the lower's death is
    /// already known (not reported again).
    async fn next_event(&mut self, admission: &Admission, lower_died: bool) -> PathEvent {
        match self {
            DataPath::Mount(m) => {
                let session = async {
                    match m.session_done.as_mut() {
                        Some(rx) => rx.await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = admission.lower_gone_notify.notified(), if !lower_died => {
                        PathEvent::LowerGone("the lower's FUSE connection failed (ENOTCONN/ECONNABORTED)".into())
                    }
                    r = session => {
                        m.session_done = None;
                        PathEvent::Unmounted(format!("{r:?}"))
                    }
                }
            }
            DataPath::Relay(r) => match r.events.recv().await {
                Some(EngineEvent::DaemonEof { reset }) if !lower_died && !r.relay.kernel_gone() => {
                    PathEvent::LowerGone(format!(
                        "the daemon's end of the socket {}",
                        if reset { "failed" } else { "closed" }
                    ))
                }
                Some(EngineEvent::KernelGone(e)) => {
                    PathEvent::Unmounted(format!("the kernel side of the connection: {e}"))
                }
                Some(_) => PathEvent::Nothing,
                None => std::future::pending().await,
            },
        }
    }
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
    opens_at_force: Vec<String>,
    failed_flushes: Vec<String>,
    lower_exit: Option<String>,
    lower_stop: Option<LowerStop>,
    failed: bool,
    notes: Vec<String>,
    /// The lower's FUSE mount (by mount ID): the only lower mount drainfs may remove.
    lower_mount: Option<mount::MountInfo>,
    /// drainfs's own mount (by mount ID), recorded right after mounting.
    own_mount: Option<mount::MountInfo>,
    /// The relay's daemon died of a signal drainfs did not send.
    raise: Option<Signal>,
}

/// Runs drainfs: supervise/adopt the lower, mount (or, with `relay`, relay the prepared
/// connection to the daemon already started on it), serve, drain, tear down. Returns the exit
/// status. `lower` and `mountpoint` in `cfg` must already be absolute (see
/// [`mount::preflight`]). `on_control` receives the handles of the admin server and control
/// socket once the shared state exists.
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
        opens_at_force: Vec::new(),
        failed_flushes: Vec::new(),
        lower_exit: None,
        lower_stop: None,
        failed: false,
        notes: Vec::new(),
        lower_mount: None,
        own_mount: None,
        raise: None,
    };
    let code = match relay {
        Some(p) => r.run_relay(acct, p).await,
        None => r.run_all(acct).await,
    };
    r.timings.exit_ms = r.ms_since_trigger();
    r.shared.set_phase(Phase::Done, "exit");
    // A daemon killed by drainfs (LowerStop::Killed) is reported by the exit code, not raised.
    let raise = r.raise.filter(|_| code == ExitCode::LowerFailed);
    let mut s = r.summary(code);
    if let Some(sig) = raise {
        s.exit_code = 128 + sig as i32;
        s.notes.push(format!(
            "the daemon died of {}: drainfs ends by the same signal",
            sig.as_str()
        ));
    }
    // A clean stop by SIGTERM ends by SIGTERM when asked (the gcsfuse drop-in): the summary
    // keeps exit_code 0, the process ends as a terminated gcsfuse would.
    let clean_by_signal = code == ExitCode::Clean
        && matches!(r.machine.first_trigger(), Some((_, Cause::Sigterm)))
        && r.cfg
            .relay
            .as_ref()
            .is_some_and(|o| o.clean_sigterm_exit == crate::config::CleanSigtermExit::Signal);
    if clean_by_signal {
        s.notes
            .push("clean: drainfs ends by SIGTERM (--clean-sigterm-exit signal)".to_string());
    }
    let raise = raise.or(clean_by_signal.then_some(Signal::SIGTERM));
    summary::emit(
        &s,
        r.cfg.lifecycle.summary_file.as_deref(),
        r.cfg.lifecycle.termination_log.as_deref(),
    );
    Exit {
        code: s.exit_code,
        raise,
    }
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

    /// Notes (summary, log) the read-only requests the teardown is about to cut off: they
    /// did not hold the drain, and nothing of theirs can be lost.
    fn note_cut_off(&mut self, acct: &Accounting) {
        let n = self.machine.at_teardown().map_or(0, |o| o.in_flight_read);
        if n <= 0 {
            return;
        }
        let ops: Vec<String> = crate::accounting::Op::ALL
            .iter()
            .filter(|op| op.class() == crate::gate::Class::ReadOnly)
            .filter_map(|op| {
                let k = acct
                    .op_stats(*op)
                    .in_flight
                    .load(std::sync::atomic::Ordering::Relaxed);
                (k > 0).then(|| format!("{} {k}", op.name()))
            })
            .collect();
        tracing::info!(read_only_in_flight = n, ops = ?ops, "read-only requests still in flight are cut off by the teardown (nothing of theirs can be lost)");
        self.notes.push(format!(
            "{n} read-only request(s) still in flight were cut off by the teardown ({}); they did not hold the drain",
            ops.join(", ")
        ));
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
                self.lower_mount = mount::fuse_mount_above(&lower_path, None);
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
        let mp_baseline = mount::baseline(&self.cfg.fs.mountpoint);
        let (session_done_tx, session_done) = oneshot::channel::<std::io::Result<()>>();
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
            self.failed = true;
            self.stop_lower_after_failure("drainfs could not mount")
                .await;
            return ExitCode::Failed;
        }
        if self.own_mount.is_none() {
            self.own_mount = mount::fuse_mount_above(&self.cfg.fs.mountpoint, mp_baseline);
        }
        // The FUSE connection behind drainfs's own mount (for an abort after a lazy detach).
        let own_connection = self.own_mount.as_ref().and_then(|m| m.connection());
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
        self.serving("mounted");

        // 3. Serve until the machine says the mount drained or the teardown is forced.
        let mut dp = DataPath::Mount(MountPath {
            core,
            session_done: Some(session_done),
            own_connection,
        });
        let ending = self.serve(&acct, &mut dp).await;

        // 4. Teardown.
        self.teardown(ending, dp).await
    }

    /// The data path serves: `starting` -> `serving`, the ready file.
    fn serving(&mut self, why: &str) {
        self.machine.mounted();
        self.sync_phase(why);
        if let Some(rf) = &self.cfg.lifecycle.ready_file
            && let Err(e) = summary::write_atomic(rf, b"ready\n")
        {
            tracing::warn!(path = %rf.display(), error = %e, "cannot write the ready file");
        }
    }

    /// The relay's lifecycle: start the engine on the prepared connection (the daemon is
    /// already running on its socket), wait for INIT, serve, tear down.
    async fn run_relay(&mut self, acct: Arc<Accounting>, p: Prepared) -> ExitCode {
        let Prepared {
            kernel,
            relay_end,
            limits,
            pid,
            exit,
            mounted,
            ..
        } = p;
        self.lower = Lower::spawned(pid, exit);
        self.shared.inner.lock().lower_up = true;
        let (tx, rx) = mpsc::unbounded_channel();
        let spin = self.cfg.relay.as_ref().map_or(Duration::ZERO, |o| o.spin);
        let started = Relay::start(
            kernel,
            relay_end,
            limits,
            spin,
            Arc::clone(&acct),
            move |ev| {
                let _ = tx.send(ev);
            },
        );
        let relay = match started {
            Ok((r, _threads)) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the relay's threads");
                self.failed = true;
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
                if let Some(m) = &mounted {
                    let _ = mount::unmount_mount(m, true, Duration::from_secs(1));
                }
                return ExitCode::Failed;
            }
        };
        *self.shared.relay.lock() = Some(Arc::clone(&relay));
        let mut rp = RelayPath {
            relay,
            events: rx,
            mounted,
        };
        if let Some(code) = self.wait_relay_init(&mut rp).await {
            return code;
        }
        self.shared
            .started
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.serving("initialized");
        let mut dp = DataPath::Relay(rp);
        let ending = self.serve(&acct, &mut dp).await;
        self.teardown(ending, dp).await
    }

    /// Waits until the daemon's INIT reply went through to the kernel, while watching
    /// triggers, the daemon and the connection. `Some(code)` when drainfs must exit: INIT
    /// failed (socket too small: 1), the daemon died or did not answer INIT within
    /// `--init-timeout` (the kernel's INIT is then answered EIO: 69), or a shutdown came first.
    async fn wait_relay_init(&mut self, rp: &mut RelayPath) -> Option<ExitCode> {
        let timeout = self
            .cfg
            .relay
            .as_ref()
            .map_or(Duration::from_secs(30), |o| o.init_timeout);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.machine.step(Instant::now(), &Observation::default()) == Step::AbortStart {
                tracing::info!("shutdown before INIT went through: stopping the daemon");
                self.stop_relay(rp, "shutdown before INIT went through")
                    .await;
                if rp.relay.init_failed() {
                    // The relay had answered INIT EIO already: the start failed.
                    self.failed = true;
                }
                if let Some(errno) = rp.relay.init_refused() {
                    self.notes.push(format!(
                        "the daemon refused INIT: {}",
                        nix::errno::Errno::from_raw(errno).desc()
                    ));
                    return Some(ExitCode::LowerFailed);
                }
                // The same outcome rules as a stop after serving (a failed control plane
                // is 1, a daemon that did not stop cleanly 69).
                return Some(drain_exit_code(self));
            }
            let lower_exit = self.lower.wait();
            let dead = self.machine.lower_died().is_some();
            tokio::select! {
                ev = self.events.recv() => if let Some(ev) = ev { self.on_event(ev) },
                ev = rp.events.recv() => match ev {
                    Some(EngineEvent::Initialized(_)) => return None,
                    Some(EngineEvent::InitFailed) => {
                        self.failed = true;
                        self.notes.push(format!(
                            "the socket buffers ({} and {} bytes) cannot carry a minimal FUSE message",
                            rp.relay.limits().sndbuf_relay,
                            rp.relay.limits().sndbuf_daemon
                        ));
                        self.stop_relay(rp, "INIT failed").await;
                        return Some(ExitCode::Failed);
                    }
                    Some(EngineEvent::InitRefused(errno)) => {
                        let detail = format!(
                            "the daemon refused INIT: {}",
                            nix::errno::Errno::from_raw(errno).desc()
                        );
                        self.notes.push(detail.clone());
                        self.on_event(Event::Trigger(Cause::LowerDied { detail }));
                        self.stop_relay(rp, "the daemon refused INIT").await;
                        return Some(ExitCode::LowerFailed);
                    }
                    Some(EngineEvent::KernelGone(_)) => {
                        self.on_event(Event::Trigger(Cause::UnmountedExternally));
                    }
                    Some(EngineEvent::DaemonEof { .. }) if !dead && !rp.relay.kernel_gone() => {
                        self.on_event(Event::Trigger(Cause::LowerDied {
                            detail: "the daemon closed its socket before answering INIT".into(),
                        }));
                        self.stop_relay(rp, "the daemon is gone").await;
                        return Some(ExitCode::LowerFailed);
                    }
                    Some(_) => {}
                    None => std::future::pending::<()>().await,
                },
                st = lower_exit, if !dead => {
                    self.note_daemon_exit(&st);
                    self.on_event(Event::Trigger(Cause::LowerDied {
                        detail: format!("the daemon exited before answering INIT: {}", procs::describe(&st)),
                    }));
                    self.stop_relay(rp, "the daemon is gone").await;
                    return Some(ExitCode::LowerFailed);
                }
                _ = tokio::time::sleep_until(deadline) => {
                    let pending = rp.relay.fail_init();
                    tracing::error!(timeout = ?timeout, init_pending = pending, "the daemon did not answer INIT in time");
                    self.notes.push(format!("the daemon did not answer INIT within {timeout:?}"));
                    self.on_event(Event::Trigger(Cause::LowerDied {
                        detail: format!("no INIT reply within {timeout:?}"),
                    }));
                    self.stop_relay(rp, "no INIT reply").await;
                    return Some(ExitCode::LowerFailed);
                }
            }
        }
    }

    /// Records a relay daemon's death by a signal drainfs did not send (to be raised on
    /// drainfs at the end).
    fn note_daemon_exit(&mut self, st: &WaitStatus) {
        if self.cfg.relay.is_some()
            && self.lower_stop != Some(LowerStop::Killed)
            && let WaitStatus::Signaled(_, sig, _) = st
        {
            self.raise = Some(*sig);
        }
    }

    /// Ends the relay: unmount (self-mounted: lazily when forced, busy or the daemon is
    /// dead), SHUT_WR to the daemon (it reads EOF, finishes its own work and exits; later
    /// kernel requests are answered EIO), then wait for the daemon to exit within its budget
    /// (SIGKILL after).
    async fn stop_relay(&mut self, rp: &RelayPath, why: &str) {
        self.advance(Phase::Unmounting, why);
        if let Some(m) = rp.mounted.clone() {
            let lazy = self.machine.forced().is_some() || self.machine.lower_died().is_some();
            let res = self
                .bounded(
                    |b| b.unmount,
                    blocking(move || {
                        if lazy {
                            mount::unmount_mount(&m, true, Duration::from_secs(5))
                        } else {
                            mount::unmount_or_detach_mount(&m, Duration::from_secs(5))
                        }
                    }),
                )
                .await;
            tracing::info!(result = ?res, "unmounted the relay's mount");
            if !matches!(res, Some(Ok(_))) {
                self.notes
                    .push(format!("unmounting the relay's mount: {res:?}"));
            }
        }
        rp.relay.stop();
        self.timings.unmounted_ms = self.ms_since_trigger();
        self.stop_lower(why).await;
    }

    /// The serving loop: observe (door, then counts), step the machine, carry out its step,
    /// wait for the next event, count change or wake-up time.
    async fn serve(&mut self, acct: &Arc<Accounting>, dp: &mut DataPath) -> Ending {
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
                since_late: acct.since_late_request(),
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
                    self.note_cut_off(acct);
                    if let Ending::Forced(reason) = ending {
                        let out = self.machine.outstanding_at_force().unwrap_or_default();
                        self.open_at_force = dp.open_paths(OPEN_PATHS_CAP);
                        self.opens_at_force = dp.admitted_paths(OPEN_PATHS_CAP);
                        let open = out.open_read + out.open_write + out.open_dirs;
                        if self.open_at_force.len() == OPEN_PATHS_CAP
                            && open > OPEN_PATHS_CAP as i64
                        {
                            self.notes.push(format!(
                                "open_paths lists {OPEN_PATHS_CAP} of the {open} handles open at the forced teardown (files open for writing first)"
                            ));
                        }
                        if !out.is_drained() {
                            *self.shared.forced.lock().entry(reason).or_default() += 1;
                        }
                        tracing::warn!(reason = reason.name(), outstanding = ?out, open = ?self.open_at_force, opening = ?self.opens_at_force, "forcing the teardown");
                    } else {
                        self.shared.inner.lock().drain_duration = self
                            .machine
                            .first_trigger()
                            .and_then(|(t0, _)| drained_at.map(|d| d - t0));
                        tracing::info!(
                            after_ms = self.timings.drained_ms,
                            "drained: nothing in flight, no file open for writing, no lower flush pending"
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
                        // No request can arrive any more: close what the kernel will never
                        // release (the relay's engine already stopped counting its handles).
                        if let DataPath::Mount(m) = &*dp {
                            let c = Arc::clone(&m.core);
                            if let Some(failed) = self.bounded(|b| b.close_remaining, blocking(move || c.close_all())).await {
                                self.failed_flushes.extend(failed);
                            }
                        }
                    }
                    PathEvent::Nothing => {}
                },
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
            if let Some(m) = mount::fuse_mount_above(lower_path, before)
                && !mount::is_dead(lower_path)
            {
                tracing::info!(lower = %lower_path.display(), fstype = %m.fstype, mount_id = m.id, "the lower is mounted");
                self.lower_mount = Some(m);
                return None;
            }
            if let Some(st) = self.lower.exited() {
                let tail = self.lower.tail();
                tracing::error!(status = %procs::describe(&st), stderr_tail = %tail, "the lower's process exited before its mount appeared");
                self.on_event(Event::Trigger(Cause::LowerDied {
                    detail: format!("exited before ready ({}): {}", procs::describe(&st), tail),
                }));
                self.lower_exit = Some(procs::describe(&st));
                self.remove_lower_mount(mount::fuse_mount_above(lower_path, before))
                    .await;
                return Some(ExitCode::LowerFailed);
            }
            if self.machine.step(Instant::now(), &Observation::default()) == Step::AbortStart {
                tracing::info!(
                    "shutdown before the lower was ready: stopping it; nothing was mounted"
                );
                self.stop_lower("shutdown before the lower was ready").await;
                self.remove_lower_mount(mount::fuse_mount_above(lower_path, before))
                    .await;
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
                self.remove_lower_mount(mount::fuse_mount_above(lower_path, before))
                    .await;
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

    /// Removes the lower's FUSE mount `m`, identified by mount ID (a volume's own bind mount
    /// is never touched), if it is still mounted: aborted and detached when the lower's process
    /// is gone or the mount is dead, else unmounted (lazily if busy).
    async fn remove_lower_mount(&mut self, m: Option<mount::MountInfo>) {
        let Some(m) = m.filter(|m| mount::mount_by_id(m.id).is_some()) else {
            return;
        };
        let (path, id) = (m.mount_point.clone(), m.id);
        let exited = self.lower.exited().is_some() || !self.lower.watched();
        let res = self
            .bounded(
                |b| b.lower_kill.max(Duration::from_millis(100)),
                blocking(move || {
                    if exited || mount::is_dead(&m.mount_point) {
                        mount::abort_mount(&m);
                        mount::unmount_mount(&m, true, Duration::from_secs(5))
                    } else {
                        mount::unmount_or_detach_mount(&m, Duration::from_secs(5))
                    }
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
            self.remove_lower_mount(self.lower_mount.clone()).await;
        }
    }

    /// Sends the lower its stop signal and waits within the budget; SIGKILL after.
    async fn stop_lower(&mut self, why: &str) {
        let Some(pid) = self.lower.pid else {
            self.lower_stop = Some(LowerStop::NotSupervised);
            return;
        };
        self.advance(Phase::StoppingLower, why);
        // A relay's daemon is stopped by the EOF on its socket, never by a signal.
        let sig = if self.cfg.relay.is_some() {
            None
        } else {
            Some(self.cfg.lifecycle.lower_signal)
        };
        if self.lower.exited().is_none()
            && let Some(sig) = sig
        {
            tracing::info!(pid, signal = sig.as_str(), "stopping the lower's process");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
        }
        let wait = self.lower.wait();
        let mut st = if self.machine.forced().is_none() && self.machine.triggered() {
            // Drained: nothing can be lost by ending the lower's connection. If its own unmount
            // is refused (EBUSY: a process still holds a file on it through drainfs's
            // passthrough, or has its cwd there), gcsfuse keeps running; ending the connection
            // makes it stop cleanly (its read of /dev/fuse returns ENODEV) instead of waiting
            // for a SIGKILL.
            match self
                .bounded(|b| b.lower_stop.min(LOWER_BUSY_AFTER), wait)
                .await
            {
                Some(st) => Some(st),
                None => {
                    if let Some(m) = self
                        .lower_mount
                        .clone()
                        .filter(|m| mount::mount_by_id(m.id).is_some())
                    {
                        tracing::info!(lower = %m.mount_point.display(), "the lower is still mounted (busy) after its stop signal; nothing is outstanding, so ending its FUSE connection");
                        let _ = blocking(move || {
                            mount::abort_mount(&m);
                            mount::unmount_mount(&m, true, Duration::from_secs(5))
                        })
                        .await;
                    }
                    let wait = self.lower.wait();
                    self.bounded(|b| b.lower_stop, wait).await
                }
            }
        } else {
            self.bounded(|b| b.lower_stop, wait).await
        };
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
            match (&st, sig) {
                (Some(_), _) if !self.lower.spawned => LowerStop::Clean,
                (Some(s), Some(sig)) if clean_stop(s, sig) => LowerStop::Clean,
                (Some(WaitStatus::Exited(_, 0)), None) => LowerStop::Clean,
                // A relay's daemon after the end-of-stream: see `--eof-exit-codes`.
                (Some(WaitStatus::Exited(_, code)), None)
                    if self.machine.forced().is_none()
                        && self.shared.is_started()
                        && self
                            .cfg
                            .relay
                            .as_ref()
                            .is_some_and(|o| o.eof_exit_codes.contains(code)) =>
                {
                    tracing::warn!(
                        pid,
                        code,
                        "the daemon exited {code} at the relay's end-of-stream; counted as a clean stop (--eof-exit-codes; libfuse daemons exit 1 there)"
                    );
                    self.notes.push(format!(
                        "the daemon exited {code} at the relay's end-of-stream (accepted by --eof-exit-codes)"
                    ));
                    LowerStop::Clean
                }
                _ => {
                    if let Some(st) = &st {
                        tracing::warn!(
                            pid,
                            status = %procs::describe(st),
                            "the lower's process did not stop cleanly (not exit 0, not the stop signal{})",
                            if self.cfg.relay.is_some() { ", not in --eof-exit-codes" } else { "" }
                        );
                        self.notes.push(format!(
                            "the lower's process ended with {}: not a clean stop",
                            procs::describe(st)
                        ));
                    }
                    LowerStop::Unclean
                }
            }
        });
        if let Some(st) = st {
            if !killed {
                self.note_daemon_exit(&st);
            }
            self.lower_exit = Some(procs::describe(&st));
            tracing::info!(pid, status = %procs::describe(&st), stop = ?self.lower_stop, "the lower's process exited");
        }
    }

    async fn teardown(&mut self, ending: Ending, dp: DataPath) -> ExitCode {
        match dp {
            DataPath::Mount(m) => {
                self.teardown_mount(ending, m.core, m.session_done, m.own_connection)
                    .await
            }
            DataPath::Relay(mut r) => {
                let why = match ending {
                    Ending::Drained => "drained",
                    Ending::Forced(r) => r.name(),
                };
                self.stop_relay(&r, why).await;
                settle_relay(&mut r).await;
                let lost = r.relay.lost_writes();
                if !lost.is_empty() {
                    self.notes.push(format!(
                        "the FUSE connection ended with {} file(s) open for writing; their writers got ENOTCONN",
                        lost.len()
                    ));
                    self.open_at_force.extend(lost.iter().cloned());
                }
                for f in r.relay.failed_flushes().into_iter().chain(lost) {
                    if !self.failed_flushes.contains(&f) {
                        self.failed_flushes.push(f);
                    }
                }
                drain_exit_code(self)
            }
        }
    }

    async fn teardown_mount(
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
        if session_done.is_some() && self.own_mount.is_none() {
            tracing::error!(mountpoint = %mp.display(), "drainfs's own mount was not found after mounting: not unmounting by path");
            self.notes
                .push("drainfs's own mount was not identified; left mounted".into());
        }
        if let Some(session_done) = session_done {
            if let Some(own) = self.own_mount.clone() {
                let lazy_first = forced || self.machine.lower_died().is_some();
                let res = self
                    .bounded(
                        |b| b.unmount,
                        blocking(move || {
                            if lazy_first {
                                mount::unmount_mount(&own, true, Duration::from_secs(5))
                            } else {
                                mount::unmount_or_detach_mount(&own, Duration::from_secs(5))
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
                    // would run until the last reference goes. Nothing outstanding remains to
                    // be served (or it was forced), so end the connection now.
                    if let Some(minor) = own_connection {
                        mount::abort_connection(minor);
                    }
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
        // Close every lower fd drainfs holds (handles, the root's, the O_PATH cache), even if a
        // lazily detached session still references the core: a lower fd left open would make
        // the lower's own unmount fail with EBUSY (gcsfuse then keeps running).
        let c = Arc::clone(&core);
        match self
            .bounded(|b| b.close_remaining, blocking(move || c.close_lower_fds()))
            .await
        {
            Some(failed) => self.failed_flushes.extend(failed),
            None => self
                .notes
                .push("closing drainfs's lower fds did not finish within its budget".into()),
        }
        self.shared.inner.lock().fs = None;

        // The lower.
        if self.lower.watched() {
            self.stop_lower(if forced {
                "forced teardown"
            } else {
                "drained and unmounted"
            })
            .await;
            // Wait for its mount to go (gcsfuse unmounts on SIGINT); remove it if it lingers.
            if let Some(id) = self.lower_mount.as_ref().map(|m| m.id) {
                let gone = async move {
                    while mount::mount_by_id(id).is_some() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                };
                let _ = self
                    .bounded(|b| b.lower_kill.min(Duration::from_secs(2)), gone)
                    .await;
            }
            self.remove_lower_mount(self.lower_mount.clone()).await;
        }
        // Read last: a FLUSH that was still in flight at a forced teardown fails only once the
        // lower is stopped or its connection ended.
        let failed = core.failed_flushes();
        for f in failed {
            if !self.failed_flushes.contains(&f) {
                self.failed_flushes.push(f);
            }
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
            in_flight_opens: self.opens_at_force.clone(),
            failed_flushes: self.failed_flushes.clone(),
            counts: summary::Counts::from(acct.as_ref()),
            notes: self.notes.clone(),
            data_path: self.shared.data_path(),
            relay: self.shared.relay_status(),
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

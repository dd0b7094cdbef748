//! The lifecycle's observable state, for everything outside it: [`Shared`] (the phase, the
//! first cause, the deadline, the counters, the mounted core or the relay) and its
//! [`Snapshot`] for `/status`, the probes and the metrics, and [`Control`], the handles the
//! admin server and the control socket use to send [`Event`]s. The executor is the only
//! writer; it mirrors every phase change here (logged once, told to systemd).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::accounting::{Accounting, Outstanding};
use crate::config::RunConfig;
use crate::drain::{Cause, CauseKind, Forced, Phase};
use crate::fs::Fs;
use crate::fuse::InitInfo;
use crate::relay::engine::{Relay, RelayStatus};
use crate::triggers::Event;

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
    /// Paths still open (capped at 50), with their mode (the relay names a file by the names it
    /// saw in LOOKUP and CREATE). Empty when [`Snapshot::hide_paths`] took them out.
    pub open_paths: Vec<(String, crate::accounting::HandleMode)>,
    /// How many paths [`Snapshot::hide_paths`] took out of `open_paths` (absent when none
    /// were hidden: a local reader's snapshot).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_paths_hidden: Option<usize>,
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
    pub(super) fn new(acct: Arc<Accounting>, cfg: &RunConfig) -> Arc<Self> {
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
            } else if cfg.handoff.is_some() {
                "handoff"
            } else {
                "mount"
            },
            relay: Mutex::new(None),
        })
    }

    /// `mount` (a passthrough view of a lower directory), `relay` or `handoff`.
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

    /// Mirrors the machine's phase; logs the change with its cause and tells systemd.
    pub(super) fn set_phase(&self, phase: Phase, why: &str) {
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

    /// Records the first trigger's cause.
    pub(super) fn set_cause(&self, cause: Cause) {
        self.inner.lock().cause = Some(cause);
    }

    /// Records the forced-exit deadline (`None` before the first trigger).
    pub(super) fn set_deadline(&self, deadline: Option<Instant>) {
        self.inner.lock().deadline = deadline;
    }

    /// Records whether the lower's process is up.
    pub(super) fn set_lower_up(&self, up: bool) {
        self.inner.lock().lower_up = up;
    }

    /// The data path answered its first round trip (mount) or INIT (relay).
    pub(super) fn set_started(&self) {
        self.started
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The mount is up: its core and what INIT negotiated.
    pub(super) fn set_mounted(&self, core: Arc<Fs>, init: InitInfo) {
        let mut i = self.inner.lock();
        i.fs = Some(core);
        i.init = Some(init);
    }

    /// The mount's core is closed: `/status` no longer lists its open paths.
    pub(super) fn clear_fs(&self) {
        self.inner.lock().fs = None;
    }

    /// The relay is running.
    pub(super) fn set_relay(&self, relay: Arc<Relay>) {
        *self.relay.lock() = Some(relay);
    }

    /// Records how long the drain took, from the first trigger.
    pub(super) fn set_drain_duration(&self, d: Option<Duration>) {
        self.inner.lock().drain_duration = d;
    }

    /// Counts a forced teardown (or a SIGKILL of the lower) by reason.
    pub(super) fn count_forced(&self, reason: Forced) {
        *self.forced.lock().entry(reason).or_default() += 1;
    }

    /// Counts a trigger by its cause.
    pub(super) fn count_trigger(&self, cause: &Cause) {
        *self
            .triggers
            .lock()
            .entry(CauseKind::from(cause))
            .or_default() += 1;
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
            open_paths_hidden: None,
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

impl Snapshot {
    /// Takes the open files' paths out, keeping their number in `open_paths_hidden`: what the
    /// admin server's `/status` answers a peer beyond loopback (file names are the workload's
    /// data; the counts, phase and cause are not).
    pub fn hide_paths(&mut self) {
        self.open_paths_hidden = Some(self.open_paths.len());
        self.open_paths.clear();
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

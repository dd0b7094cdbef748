//! The relay data path: drainfs relays the kernel's FUSE connection to the lower's process
//! (its daemon, already started on its end of a socketpair by [`crate::relay::run::prepare`])
//! through the relay's engine ([`crate::relay::engine::Relay`]). The daemon is the lower; its
//! end of the socket is its "mount".
//!
//! Start: the engine on the prepared connection, then the daemon's INIT reply (bounded by
//! `--init-timeout`) before the relay counts as serving. Teardown: unmount (when drainfs
//! mounted the connection itself; lazily when forced, busy or the daemon is dead), SHUT_WR to
//! the daemon's socket (it reads EOF, finishes its own work and exits; later kernel requests
//! are answered EIO), wait for the daemon to exit (SIGKILL after its budget), then let the
//! pump read the daemon's last replies and answer EIO to anything still in flight.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use super::data_path::{DataPath, PathEvent, ending_name};
use super::executor::Executor;
use super::lower::Lower;
use super::{Event, blocking};
use crate::config::PumpChoice;
use crate::drain::{Cause, Ending, ExitCode, Observation, Phase, Step};
use crate::fs::Admission;
use crate::relay::engine::{EngineEvent, PumpMode, Relay};
use crate::relay::run::Prepared;
use crate::{mount, procs};

/// How long, after the daemon's process has exited, the relay's pump may take to read the
/// rest of the daemon's replies and its end-of-stream.
const RELAY_SETTLE: Duration = Duration::from_secs(1);

/// How long, after that, the notifier may take to finish the notification the kernel holds
/// ([`RelayPath::end_notifications`]).
const NOTIFIER_END: Duration = Duration::from_secs(1);

/// Where waiting for the daemon's INIT stands after an engine event.
enum InitWait {
    /// INIT went through: the relay serves.
    Initialized,
    /// drainfs must exit with this code (the daemon is already stopped).
    Exit(ExitCode),
    /// Still waiting.
    Waiting,
}

/// The relay as served: the engine, its events, and the mount drainfs made itself.
pub(super) struct RelayPath {
    relay: std::sync::Arc<Relay>,
    events: mpsc::UnboundedReceiver<EngineEvent>,
    /// The mount drainfs made itself (self-mounted relay), by mount ID.
    mounted: Option<mount::MountInfo>,
}

impl DataPath for RelayPath {
    type Start = Prepared;

    async fn start(ex: &mut Executor, p: Prepared) -> Result<Self, ExitCode> {
        let Prepared {
            kernel,
            relay_end,
            limits,
            pid,
            exit,
            mounted,
            ..
        } = p;
        ex.lower = Lower::spawned(pid, exit);
        ex.shared.set_lower_up(true);
        let (tx, rx) = mpsc::unbounded_channel();
        let pump = match ex.cfg.relay.as_ref() {
            Some(o) if o.pump == PumpChoice::Threads => PumpMode::Threads,
            o => PumpMode::Poll {
                spin: o.map_or(Duration::ZERO, |o| o.spin),
            },
        };
        let started = Relay::start(
            kernel,
            relay_end,
            limits,
            pump,
            std::sync::Arc::clone(&ex.acct),
            move |ev| {
                let _ = tx.send(ev);
            },
        );
        let relay = match started {
            Ok((r, _threads)) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the relay's threads");
                ex.record.failed = true;
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
                if let Some(m) = &mounted {
                    let _ = mount::unmount_mount(m, true, Duration::from_secs(1));
                }
                return Err(ExitCode::Failed);
            }
        };
        ex.shared.set_relay(std::sync::Arc::clone(&relay));
        let mut rp = RelayPath {
            relay,
            events: rx,
            mounted,
        };
        if let Some(code) = rp.wait_init(ex).await {
            return Err(code);
        }
        ex.shared.set_started();
        ex.serving("initialized");
        Ok(rp)
    }

    async fn next_event(&mut self, _: &Admission, lower_died: bool) -> PathEvent {
        match self.events.recv().await {
            Some(EngineEvent::DaemonEof { reset }) if !lower_died && !self.relay.kernel_gone() => {
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
        }
    }

    fn open_paths(&self, max: usize) -> Vec<String> {
        self.relay
            .open_paths(max)
            .into_iter()
            .map(|(p, _)| p)
            .collect()
    }

    fn admitted_paths(&self, max: usize) -> Vec<String> {
        self.relay.admitted_paths(max)
    }

    fn kernel_gone(&self) -> bool {
        self.relay.kernel_gone()
    }

    /// Nothing to close: the relay's engine already stopped counting its handles.
    async fn unmounted_externally(&mut self, _: &mut Executor) {}

    async fn teardown(mut self, ex: &mut Executor, ending: Ending) -> ExitCode {
        self.stop(ex, ending_name(ending)).await;
        self.settle().await;
        self.end_notifications(ex).await;
        let lost = self.relay.lost_writes();
        if !lost.is_empty() {
            ex.record.notes.push(format!(
                "the FUSE connection ended with {} file(s) open for writing; their writers got ENOTCONN",
                lost.len()
            ));
            ex.record.open_paths.extend(lost.iter().cloned());
        }
        ex.record
            .add_failed_flushes(self.relay.failed_flushes().into_iter().chain(lost));
        ex.exit_code()
    }
}

impl RelayPath {
    /// Waits until the daemon's INIT reply went through to the kernel, while watching
    /// triggers, the daemon and the connection. `Some(code)` when drainfs must exit: INIT
    /// failed (socket too small: 1), the daemon died or did not answer INIT within
    /// `--init-timeout` (the kernel's INIT is then answered EIO: 69), or a shutdown came first.
    async fn wait_init(&mut self, ex: &mut Executor) -> Option<ExitCode> {
        let timeout = ex
            .cfg
            .relay
            .as_ref()
            .map_or(Duration::from_secs(30), |o| o.init_timeout);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if ex.machine.step(Instant::now(), &Observation::default()) == Step::AbortStart {
                return Some(self.abort_before_init(ex).await);
            }
            let lower_exit = ex.lower.wait();
            let dead = ex.machine.lower_died().is_some();
            tokio::select! {
                ev = ex.events.recv() => if let Some(ev) = ev { ex.on_event(ev) },
                ev = self.events.recv() => match ev {
                    Some(ev) => match self.on_init_event(ex, ev, dead).await {
                        InitWait::Initialized => return None,
                        InitWait::Exit(code) => return Some(code),
                        InitWait::Waiting => {}
                    },
                    None => std::future::pending::<()>().await,
                },
                st = lower_exit, if !dead => {
                    ex.note_daemon_exit(&st);
                    let detail = format!("the daemon exited before answering INIT: {}", procs::describe(&st));
                    return Some(self.daemon_gone(ex, detail).await);
                }
                _ = tokio::time::sleep_until(deadline) => {
                    return Some(self.init_timed_out(ex, timeout).await);
                }
            }
        }
    }

    /// Acts on an engine event that came before INIT went through. `dead`: the lower's death
    /// is already known.
    async fn on_init_event(&mut self, ex: &mut Executor, ev: EngineEvent, dead: bool) -> InitWait {
        match ev {
            EngineEvent::Initialized(_) => InitWait::Initialized,
            EngineEvent::InitFailed => {
                ex.record.failed = true;
                ex.record.notes.push(format!(
                    "the socket buffers ({} and {} bytes) cannot carry a minimal FUSE message",
                    self.relay.limits().sndbuf_relay,
                    self.relay.limits().sndbuf_daemon
                ));
                self.stop(ex, "INIT failed").await;
                InitWait::Exit(ExitCode::Failed)
            }
            EngineEvent::InitRefused(errno) => {
                let detail = format!(
                    "the daemon refused INIT: {}",
                    nix::errno::Errno::from_raw(errno).desc()
                );
                ex.record.notes.push(detail.clone());
                ex.on_event(Event::Trigger(Cause::LowerDied { detail }));
                self.stop(ex, "the daemon refused INIT").await;
                InitWait::Exit(ExitCode::LowerFailed)
            }
            EngineEvent::KernelGone(_) => {
                ex.on_event(Event::Trigger(Cause::UnmountedExternally));
                InitWait::Waiting
            }
            EngineEvent::DaemonEof { .. } if !dead && !self.relay.kernel_gone() => {
                let detail = "the daemon closed its socket before answering INIT".to_string();
                InitWait::Exit(self.daemon_gone(ex, detail).await)
            }
            _ => InitWait::Waiting,
        }
    }

    /// A shutdown came before INIT went through: stops the daemon. The exit code follows
    /// the same rules as a stop after serving, unless the start had already failed.
    async fn abort_before_init(&mut self, ex: &mut Executor) -> ExitCode {
        tracing::info!("shutdown before INIT went through: stopping the daemon");
        self.stop(ex, "shutdown before INIT went through").await;
        if self.relay.init_failed() {
            // The relay had answered INIT EIO already: the start failed.
            ex.record.failed = true;
        }
        if let Some(errno) = self.relay.init_refused() {
            ex.record.notes.push(format!(
                "the daemon refused INIT: {}",
                nix::errno::Errno::from_raw(errno).desc()
            ));
            return ExitCode::LowerFailed;
        }
        // The same outcome rules as a stop after serving (a failed control plane is 1, a
        // daemon that did not stop cleanly 69).
        ex.exit_code()
    }

    /// The daemon died (or closed its socket) before answering INIT: `detail` is the lower's
    /// death; the relay is stopped. Returns 69.
    async fn daemon_gone(&mut self, ex: &mut Executor, detail: String) -> ExitCode {
        ex.on_event(Event::Trigger(Cause::LowerDied { detail }));
        self.stop(ex, "the daemon is gone").await;
        ExitCode::LowerFailed
    }

    /// The daemon did not answer INIT within `timeout`: the kernel's INIT is answered EIO,
    /// the daemon counts as dead and is stopped. Returns 69.
    async fn init_timed_out(&mut self, ex: &mut Executor, timeout: Duration) -> ExitCode {
        let pending = self.relay.fail_init();
        tracing::error!(timeout = ?timeout, init_pending = pending, "the daemon did not answer INIT in time");
        ex.record
            .notes
            .push(format!("the daemon did not answer INIT within {timeout:?}"));
        ex.on_event(Event::Trigger(Cause::LowerDied {
            detail: format!("no INIT reply within {timeout:?}"),
        }));
        self.stop(ex, "no INIT reply").await;
        ExitCode::LowerFailed
    }

    /// Ends the relay: unmount (self-mounted: lazily when forced, busy or the daemon is
    /// dead), SHUT_WR to the daemon (it reads EOF, finishes its own work and exits; later
    /// kernel requests are answered EIO), then wait for the daemon to exit within its budget
    /// (SIGKILL after).
    async fn stop(&self, ex: &mut Executor, why: &str) {
        ex.advance(Phase::Unmounting, why);
        if let Some(m) = self.mounted.clone() {
            let lazy = ex.machine.forced().is_some() || ex.machine.lower_died().is_some();
            let res = ex
                .bounded(
                    |b| b.unmount,
                    blocking(move || mount::detach_or_unmount(&m, lazy, Duration::from_secs(5))),
                )
                .await;
            tracing::info!(result = ?res, "unmounted the relay's mount");
            if !matches!(res, Some(Ok(_))) {
                ex.record
                    .notes
                    .push(format!("unmounting the relay's mount: {res:?}"));
            }
        }
        self.relay.stop();
        ex.record.timings.unmounted_ms = ex.ms_since_trigger();
        ex.stop_lower(why).await;
    }

    /// Ends the notifier while the pump still answers requests ([`Relay::end_notifications`],
    /// at most [`NOTIFIER_END`]): a notifier left blocked in the kernel would keep drainfs
    /// from ever finishing its exit, and so keep the connection's requests unanswered. When it
    /// does not end in time, the summary says so.
    async fn end_notifications(&self, ex: &mut Executor) {
        let relay = std::sync::Arc::clone(&self.relay);
        let ended = blocking(move || relay.end_notifications(NOTIFIER_END)).await;
        if !ended {
            tracing::error!(
                "relay: a notification is still held by the kernel; drainfs may not finish exiting until its request is answered"
            );
            ex.record.notes.push(format!(
                "a notification to the kernel was still blocked {NOTIFIER_END:?} after the daemon exited"
            ));
        }
    }

    /// Once the daemon's process has exited: waits (at most [`RELAY_SETTLE`]) until the pump
    /// has read the daemon's last replies and its end-of-stream, then answers EIO to whatever
    /// is still in flight (nothing, unless a process the daemon left behind holds its
    /// socket), so that no request outlives drainfs without an answer (the kernel would fail
    /// it with ECONNABORTED when drainfs's fd closes).
    async fn settle(&mut self) {
        let until = tokio::time::Instant::now() + RELAY_SETTLE;
        while !self.relay.daemon_gone() {
            match tokio::time::timeout_at(until, self.events.recv()).await {
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => break,
            }
        }
        let n = self.relay.fail_all();
        if n > 0 {
            tracing::warn!(
                answered_eio = n,
                "relay: requests still in flight after the daemon exited were answered EIO"
            );
        }
    }
}

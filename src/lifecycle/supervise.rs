//! Supervising the lower, as the executor's steps: start it (spawn `-- COMMAND` and wait for
//! its mount to appear, or adopt the mounted lower), stop it (drained: unmount its FUSE mount,
//! and it exits by itself; otherwise its stop signal, or for the relay's daemon the
//! end-of-stream the relay sends; SIGKILL after its budget), judge how it
//! ended ([`LowerStop`]), and remove its mount when it lingers, by mount ID only (never a
//! volume's bind mount). Every wait is bounded ([`Executor::bounded`]), and nothing here waits
//! on what drainfs does not own: the lower's first `statfs` runs on a helper, the scan for
//! writers on the lower reads other processes' `/proc` files with a deadline per process
//! ([`users::scan`]); docs/blocking-calls.md lists every such call of the start and the stop.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;

use super::executor::Executor;
use super::lower::{Lower, clean_stop, spawn_lower};
use super::{Event, blocking};
use crate::config::LowerProcess;
use crate::drain::{Cause, ExitCode, Forced, LowerStop, Observation, Phase, Step};
use crate::mount::users::{self, scan::Verdict};
use crate::summary::LowerUnmount;
use crate::{mount, procs};

/// After a clean drain, how long the lower may take to exit on its stop signal before drainfs
/// ends its (busy) FUSE connection.
const LOWER_BUSY_AFTER: Duration = Duration::from_millis(500);

impl Executor {
    /// The mount's lower: spawns `-- COMMAND` and waits for its mount, or adopts the mounted
    /// lower (checking that it answers). `Err(code)` when drainfs must exit.
    pub(super) async fn start_lower(&mut self) -> Result<(), ExitCode> {
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
                        return Err(ExitCode::LowerFailed);
                    }
                }
                tracing::info!(pid = self.lower.pid, command = ?argv, "started the lower's process; waiting for its mount");
                if let Some(code) = self.wait_lower_ready(&lower_path, before).await {
                    return Err(code);
                }
            }
            LowerProcess::Adopted { pid } => {
                self.lower = Lower::adopted(pid);
                self.lower.mount = mount::fuse_mount_above(&lower_path, None);
                self.lower.connection = self.lower.mount.as_ref().and_then(mount::Connection::of);
                let p = lower_path.clone();
                let limit = self.cfg.lifecycle.lower_ready_timeout;
                let answered = tokio::time::timeout(
                    limit,
                    blocking(move || std::fs::metadata(&p).map(|_| ())),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {limit:?}"),
                    ))
                });
                if let Err(e) = answered {
                    tracing::error!(lower = %lower_path.display(), error = %e, "the lower does not answer");
                    self.on_event(Event::Trigger(Cause::LowerDied {
                        detail: format!("lower {} does not answer: {e}", lower_path.display()),
                    }));
                    return Err(ExitCode::LowerFailed);
                }
            }
        }
        self.shared.set_lower_up(true);
        Ok(())
    }

    /// Waits for the lower's mount to appear at `lower_path` (a new mount ID, not `before`),
    /// while watching the process and triggers. `Some(code)` when drainfs must exit.
    async fn wait_lower_ready(
        &mut self,
        lower_path: &Path,
        before: Option<u64>,
    ) -> Option<ExitCode> {
        let deadline = Instant::now() + self.cfg.lifecycle.lower_ready_timeout;
        // The lower's first statfs, on a helper (one at a time): a lower that mounted and
        // then hangs must not stop this loop from watching its process, the triggers and
        // the ready timeout.
        let mut answers: Option<tokio::sync::oneshot::Receiver<bool>> = None;
        loop {
            if let Some(m) = mount::fuse_mount_above(lower_path, before) {
                let rx = answers.get_or_insert_with(|| dead_probe(lower_path));
                match tokio::time::timeout(Duration::from_millis(20), rx).await {
                    Ok(Ok(false)) => {
                        tracing::info!(lower = %lower_path.display(), fstype = %m.fstype, mount_id = m.id, "the lower is mounted");
                        self.lower.connection = mount::Connection::of(&m);
                        self.lower.mount = Some(m);
                        return None;
                    }
                    // Dead (or the helper is gone): ask again.
                    Ok(_) => answers = None,
                    // No answer yet: keep waiting for it.
                    Err(_) => {}
                }
            }
            if let Some(st) = self.lower.exited() {
                let tail = self.lower.tail();
                tracing::error!(status = %procs::describe(&st), stderr_tail = %tail, "the lower's process exited before its mount appeared");
                self.on_event(Event::Trigger(Cause::LowerDied {
                    detail: format!("exited before ready ({}): {}", procs::describe(&st), tail),
                }));
                self.record.lower_exit = Some(procs::describe(&st));
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
                return Some(match self.record.lower_stop {
                    Some(LowerStop::Clean) | Some(LowerStop::NotSupervised) | None => {
                        ExitCode::Clean
                    }
                    _ => ExitCode::LowerFailed,
                });
            }
            if Instant::now() >= deadline {
                return Some(self.lower_not_ready(lower_path, before).await);
            }
            // The mount table has no cheap notification usable here; 20 ms polling only lasts
            // while the lower starts.
            tokio::select! {
                ev = self.events.recv() => if let Some(ev) = ev { self.on_event(ev) },
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
    }

    /// The lower's mount did not appear within `--lower-ready-timeout`: the lower counts as
    /// dead; it is stopped and its mount (if one came up late) removed. Returns 69.
    async fn lower_not_ready(&mut self, lower_path: &Path, before: Option<u64>) -> ExitCode {
        let timeout = self.cfg.lifecycle.lower_ready_timeout;
        tracing::error!(timeout = ?timeout, stderr_tail = %self.lower.tail(), "the lower's mount did not appear in time");
        self.on_event(Event::Trigger(Cause::LowerDied {
            detail: format!("mount did not appear within {timeout:?}"),
        }));
        self.stop_lower("the lower's mount did not appear in time")
            .await;
        self.remove_lower_mount(mount::fuse_mount_above(lower_path, before))
            .await;
        ExitCode::LowerFailed
    }

    /// Removes the lower's FUSE mount `m`, identified by mount ID (a volume's own bind mount
    /// is never touched), if it is still mounted: aborted and detached when the lower's process
    /// is gone or the mount is dead, else unmounted (lazily if busy).
    pub(super) async fn remove_lower_mount(&mut self, m: Option<mount::MountInfo>) {
        let Some(m) = m.filter(|m| mount::still_mounted(m).is_some()) else {
            return;
        };
        let (path, id) = (m.mount_point.clone(), m.id);
        let under = mount::users::children_of(&mount::mounts(), id);
        if !under.is_empty() {
            mount::abort_mount(&m);
            self.note_mounts_under_lower(&under);
            return;
        }
        if self.lower.watched() {
            self.record.lower_unmount = Some(LowerUnmount::Removed);
        }
        // A lower SIGKILLed that has not been reaped (asleep in the kernel: its connection
        // lives on, and a statfs would wait on it) is as good as gone.
        let exited = self.lower.exited().is_some()
            || !self.lower.watched()
            || self.record.lower_stop == Some(LowerStop::Killed);
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

    /// drainfs failed to start its data path: a lower it spawned counts as dead (nothing was
    /// served) and is stopped, its mount removed.
    pub(super) async fn stop_lower_after_failure(&mut self, why: &str) {
        if self.lower.spawned {
            self.on_event(Event::Trigger(Cause::LowerDied {
                detail: why.to_string(),
            }));
            self.stop_lower(why).await;
            self.remove_lower_mount(self.lower.mount.clone()).await;
        }
    }

    /// The mount's last teardown step: stops the lower's process, waits (bounded) for its
    /// mount to go (gcsfuse unmounts on SIGINT), and removes the mount if it lingers.
    pub(super) async fn stop_lower_and_its_mount(&mut self, why: &str) {
        if !self.lower.watched() {
            return;
        }
        self.stop_lower(why).await;
        if let Some(m) = self.lower.mount.clone() {
            let gone = async move {
                while mount::still_mounted(&m).is_some() {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            let gone = self
                .bounded(|b| b.lower_kill.min(Duration::from_secs(2)), gone)
                .await
                .is_some();
            if gone && self.record.lower_unmount.is_none() {
                self.record.lower_unmount = Some(LowerUnmount::Lower);
            }
        }
        self.remove_lower_mount(self.lower.mount.clone()).await;
    }

    /// Stops the lower: drained, by unmounting its mount ([`Self::unmount_lower_first`]),
    /// else by its stop signal (the relay's daemon: by the end-of-stream already sent); waits
    /// within the budget, SIGKILL after. Records how it ended ([`LowerStop`], its wait status).
    pub(super) async fn stop_lower(&mut self, why: &str) {
        let Some(pid) = self.lower.pid else {
            self.record.lower_stop = Some(LowerStop::NotSupervised);
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
            // After drainfs's own unmount the lower's session ends and it exits by itself; it
            // gets no stop signal, because its own unmount on that signal would now hit the
            // mount beneath (`fusermount3 -u` as root removes a volume's bind mount too).
            let unmounted = self.drained() && self.unmount_lower_first().await;
            if !unmounted {
                tracing::info!(pid, signal = sig.as_str(), "stopping the lower's process");
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
            }
        }
        let mut st = self.wait_lower_stopped().await;
        let killed = st.is_none();
        if killed {
            st = self.kill_lower(pid).await;
        }
        self.record.timings.lower_exited_ms = self.ms_since_trigger();
        self.shared.set_lower_up(false);
        self.record.lower_stop = Some(if killed {
            LowerStop::Killed
        } else {
            self.judge_stop(pid, st.as_ref(), sig)
        });
        if let Some(st) = st {
            if !killed {
                self.note_daemon_exit(&st);
            }
            self.record.lower_exit = Some(procs::describe(&st));
            tracing::info!(pid, status = %procs::describe(&st), stop = ?self.record.lower_stop, "the lower's process exited");
        }
    }

    /// Triggered and not forced: everything was drained (and drainfs's own mount is gone), so
    /// ending the lower's FUSE session loses nothing.
    fn drained(&self) -> bool {
        self.machine.forced().is_none() && self.machine.triggered()
    }

    /// Drained: unmounts the lower's FUSE mount itself, instead of sending its stop signal,
    /// with one non-lazy `umount2` (only when it is the topmost mount at its mount point; needs
    /// CAP_SYS_ADMIN). The lower's session then ends (its read of `/dev/fuse` returns ENODEV)
    /// and it exits by itself: gcsfuse v3.11.2 exits 0 within milliseconds. Without this, a
    /// gcsfuse with no `fusermount` on its PATH (a FROM-scratch image) cannot unmount on
    /// SIGINT, logs that it waits 30 s, and is ended only by [`LOWER_BUSY_AFTER`]'s abort.
    /// Returns whether the mount is gone; on any failure (EPERM without the capability, EBUSY
    /// while a process still uses the lower) the lower gets its stop signal and unmounts
    /// itself, as before.
    async fn unmount_lower_first(&mut self) -> bool {
        let Some(m) = self.lower.mount.clone().filter(|m| m.is_fuse()) else {
            return false;
        };
        let path = m.mount_point.clone();
        let res = self
            .bounded(
                |b| b.lower_stop.min(Duration::from_secs(1)),
                blocking(move || mount::unmount_now(&m)),
            )
            .await;
        match res {
            Some(Ok(())) => {
                tracing::info!(lower = %path.display(), "drained: unmounted the lower's FUSE mount; it exits by itself, without a stop signal");
                self.record.lower_unmount = Some(LowerUnmount::Drainfs);
                true
            }
            Some(Err(e)) => {
                tracing::debug!(lower = %path.display(), error = %e, "not unmounting the lower first; it unmounts itself on its stop signal");
                false
            }
            None => {
                tracing::warn!(lower = %path.display(), "unmounting the lower did not finish within its budget");
                // Whether it went is unknown: the lower's own unmount could hit what is
                // beneath, so no stop signal once it is gone.
                self.lower
                    .mount
                    .as_ref()
                    .is_none_or(|m| mount::still_mounted(m).is_none())
            }
        }
    }

    /// Waits (within the lower's stop budget) for the lower's process to exit. `None` when
    /// the budget ran out.
    async fn wait_lower_stopped(&mut self) -> Option<WaitStatus> {
        let wait = self.lower.wait();
        if !self.drained() {
            return self.bounded(|b| b.lower_stop, wait).await;
        }
        if let Some(st) = self
            .bounded(|b| b.lower_stop.min(LOWER_BUSY_AFTER), wait)
            .await
        {
            return Some(st);
        }
        self.end_busy_lower().await
    }

    /// Drained, and the lower has not exited [`LOWER_BUSY_AFTER`] after drainfs's unmount or
    /// its stop signal: something else keeps its session alive (a process with a file or its
    /// cwd on it, through drainfs's lazily detached passthrough or directly; a bind mount of
    /// it elsewhere; a mount stacked under it). Nothing of drainfs's is outstanding, so ending
    /// the lower's FUSE connection (its read of `/dev/fuse` returns ENODEV) lets it stop
    /// cleanly instead of waiting for a SIGKILL, but only once no process writes on the lower
    /// directly: a writer that is not drainfs's would lose what it has not closed. While one
    /// does, or a process does not answer the scan in time (it may be a writer: its `/proc`
    /// files block, see [`users::scan`]), drainfs waits (the lower's stop budget, then
    /// SIGKILL: exit 75, with the unanswered pids in the summary). The connection is
    /// the one seen when the lower came up ([`mount::Connection`]): its abort reaches the
    /// superblock wherever it is mounted, and once it has ended (drainfs's unmount took it)
    /// nothing is aborted, whoever has its number now; drainfs just waits for the process.
    /// The lower's mount is detached only when nothing is mounted under it (a lazy detach
    /// takes every mount under it along). Returns the lower's wait status, `None` when the
    /// budget ran out.
    async fn end_busy_lower(&mut self) -> Option<WaitStatus> {
        let wait = self.lower.wait();
        let Some(m) = self.lower.mount.clone() else {
            return self.bounded(|b| b.lower_stop, wait).await;
        };
        // Without the FUSE control file system (`connection` is None) nothing can be aborted,
        // but the lower's mount is still detached below.
        if let Some(c) = self.lower.connection
            && !blocking(move || c.exists()).await
        {
            tracing::info!(lower = %m.mount_point.display(), "the lower's FUSE connection has ended but its process has not exited: waiting for it");
            return self.bounded(|b| b.lower_stop, wait).await;
        }
        let last = std::sync::Arc::new(parking_lot::Mutex::new(None::<Verdict>));
        let no_writers = wait_for_no_writer(m, std::sync::Arc::clone(&last));
        let first = self
            .bounded(|b| b.lower_stop, async {
                tokio::select! {
                    st = wait => Err(st),
                    waited = no_writers => Ok(waited),
                }
            })
            .await;
        match first {
            None => {
                let last = last.lock().take();
                self.note_writers_at_budget(last);
                return None;
            }
            Some(Err(st)) => return Some(st),
            Some(Ok(waited)) => {
                if waited.writers {
                    self.record.notes.push(
                        "processes wrote on the lower directly (not through drainfs); drainfs waited for them before ending the lower's connection".into(),
                    );
                }
                if waited.unanswered {
                    self.record.notes.push(
                        "processes did not answer drainfs's scan for writers on the lower for a while; drainfs waited until they did before ending the lower's connection".into(),
                    );
                }
            }
        }
        self.abort_lower_connection().await;
        let wait = self.lower.wait();
        self.bounded(|b| b.lower_stop, wait).await
    }

    /// Ends the lower's FUSE connection (the one seen when the lower came up, wherever its
    /// superblock is mounted, and only while it exists: [`mount::Connection::abort`]) and
    /// detaches the lower's mount if it is still there with nothing mounted under it.
    async fn abort_lower_connection(&mut self) {
        let Some(m) = self.lower.mount.clone() else {
            return;
        };
        let connection = self.lower.connection;
        tracing::info!(lower = %m.mount_point.display(), "the lower did not exit (busy); nothing is outstanding, so ending its FUSE connection");
        let (aborted, under) = blocking(move || {
            let aborted = connection.is_some_and(|c| c.abort());
            let table = mount::mounts();
            if !table.iter().any(|t| m.same_mount(t)) {
                return (aborted, Vec::new());
            }
            let under = mount::users::children_of(&table, m.id);
            if under.is_empty() {
                let _ = mount::unmount_mount(&m, true, Duration::from_secs(5));
            }
            (aborted, under)
        })
        .await;
        if aborted {
            self.record.lower_unmount = Some(LowerUnmount::Aborted);
        }
        if !under.is_empty() {
            self.note_mounts_under_lower(&under);
        }
    }

    /// The lower's stop budget ran out while drainfs waited for the lower to have no writer
    /// but its own: notes why, from the last scan's verdict. A scan some processes did not
    /// answer is not "no writer": the connection was not ended under them, their pids go to
    /// the summary, and the SIGKILL that follows makes the exit 75.
    fn note_writers_at_budget(&mut self, last: Option<Verdict>) {
        match last {
            Some(Verdict::Unknown(pids)) => {
                self.record.unanswered_pids = pids.iter().copied().take(20).collect();
                self.record.notes.push(format!(
                    "drainfs could not tell whether {} process(es) write on the lower directly: their /proc files did not answer within {} ms (stuck on something else, see unanswered_pids); the lower's connection was not ended under them, so its files may be incomplete",
                    pids.len(),
                    users::scan::PER_PROCESS.as_millis()
                ));
            }
            Some(Verdict::Writers(_)) => self.record.notes.push("processes wrote on the lower directly (not through drainfs) until the lower's stop budget ran out: their files may be incomplete".into()),
            Some(Verdict::NoWriter) | None => self.record.notes.push(
                "the scan for writers on the lower did not finish within the lower's stop budget: a writer may exist, so the lower's connection was not ended".into(),
            ),
        }
    }

    /// Notes that the lower's (dead) mount is left in place because of the mounts under it.
    fn note_mounts_under_lower(&mut self, under: &[std::path::PathBuf]) {
        tracing::warn!(mounts = ?under, "mounts are stacked under the lower: leaving its (ended) mount in place rather than detaching them with it");
        self.record.notes.push(format!(
            "the lower's mount was left in place (its connection ended): mounts are stacked under it ({})",
            under
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }

    /// SIGKILLs the lower's process (it did not exit within its budget) and waits for it
    /// within the kill budget. `None` when even that ran out.
    async fn kill_lower(&mut self, pid: i32) -> Option<WaitStatus> {
        tracing::warn!(
            pid,
            "the lower's process did not exit within its budget: SIGKILL"
        );
        // Counted before the kill: the lower's death ends its requests at once.
        let at_kill = self.shared.acct.outstanding();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        self.machine.lower_killed(Instant::now(), at_kill);
        let at_teardown = self.machine.at_teardown().map_or(0, |o| o.in_flight_read);
        if crate::drain::kill_explained_by_reads(&at_kill, at_teardown) {
            let reads = at_kill.in_flight_read.max(at_teardown);
            self.record.notes.push(format!(
                "the lower's process was SIGKILLed with only read-only work outstanding ({reads} read-only request(s), no file open for writing): nothing of it can be lost"
            ));
        }
        self.shared.count_forced(Forced::LowerSigkill);
        let wait = self.lower.wait();
        self.bounded(|b| b.lower_kill, wait).await
    }

    /// How a lower that was not SIGKILLed ended, after `sig` (`None`: the relay's daemon,
    /// stopped by its end-of-stream); a stop that is not clean is noted.
    fn judge_stop(&mut self, pid: i32, st: Option<&WaitStatus>, sig: Option<Signal>) -> LowerStop {
        match (st, sig) {
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
                self.record.notes.push(format!(
                    "the daemon exited {code} at the relay's end-of-stream (accepted by --eof-exit-codes)"
                ));
                LowerStop::Clean
            }
            _ => {
                if let Some(st) = st {
                    tracing::warn!(
                        pid,
                        status = %procs::describe(st),
                        "the lower's process did not stop cleanly (not exit 0, not the stop signal{})",
                        if self.cfg.relay.is_some() { ", not in --eof-exit-codes" } else { "" }
                    );
                    self.record.notes.push(format!(
                        "the lower's process ended with {}: not a clean stop",
                        procs::describe(st)
                    ));
                }
                LowerStop::Unclean
            }
        }
    }

    /// Records a relay daemon's death by a signal drainfs did not send (to be raised on
    /// drainfs at the end).
    pub(super) fn note_daemon_exit(&mut self, st: &WaitStatus) {
        if self.cfg.relay.is_some()
            && self.record.lower_stop != Some(LowerStop::Killed)
            && let WaitStatus::Signaled(_, sig, _) = st
        {
            self.record.raise = Some(*sig);
        }
    }
}

/// Starts `statfs(path)` on a helper thread; the receiver gets whether the mount is dead
/// ([`mount::is_dead`]).
fn dead_probe(path: &Path) -> tokio::sync::oneshot::Receiver<bool> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(mount::is_dead(&p));
    });
    rx
}

/// What [`wait_for_no_writer`] waited for before the lower had no writer but drainfs.
#[derive(Debug, Default, Clone, Copy)]
struct Waited {
    /// Processes wrote on the lower.
    writers: bool,
    /// Processes did not answer the scan (each a possible writer).
    unanswered: bool,
}

/// Scans for writers on the lower's superblock (mount `m`) every 50 ms, each scan on a
/// helper thread and bounded per process ([`users::scan`]), until a scan finds none and every
/// process answered; `last` holds the latest verdict. Logs each kind of wait once.
async fn wait_for_no_writer(
    m: mount::MountInfo,
    last: std::sync::Arc<parking_lot::Mutex<Option<Verdict>>>,
) -> Waited {
    let mut waited = Waited::default();
    loop {
        let d = m.devno.clone();
        let verdict =
            blocking(move || users::scan::scan(&d, users::scan::PER_PROCESS).verdict()).await;
        *last.lock() = Some(verdict.clone());
        match verdict {
            Verdict::NoWriter => return waited,
            Verdict::Writers(w) => {
                if !waited.writers {
                    tracing::warn!(lower = %m.mount_point.display(), writers = ?w, "processes write on the lower directly (not through drainfs): not ending its connection under them");
                }
                waited.writers = true;
            }
            Verdict::Unknown(pids) => {
                if !waited.unanswered {
                    tracing::warn!(lower = %m.mount_point.display(), pids = ?pids, "processes do not answer the scan for writers on the lower (their /proc files block): each may be a writer, so not ending its connection");
                }
                waited.unanswered = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

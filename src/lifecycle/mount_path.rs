//! The mount data path: drainfs mounts a passthrough view of the lower's directory (a fuser
//! session over [`crate::fuse::DrainFs`] and its core [`crate::fs::Fs`]) at `--mountpoint`.
//!
//! Start: the lower (spawned and waited for, or adopted), the core on the lower, the mount
//! and its INIT, a first round trip through it (and its readahead raised) before anyone is
//! told it is ready. Teardown, in order: (forced only) flush and close the handles that are
//! left; unmount drainfs (a lazy detach when forced or busy, then abort drainfs's own FUSE
//! connection so its session ends at once); close every lower fd drainfs holds; stop the
//! lower's process (drained: drainfs unmounts the lower's mount and it exits by itself;
//! otherwise its stop signal; SIGKILL after the budget: `supervise.rs`); remove the lower's
//! FUSE mount if it lingers (by mount ID, never a volume's bind mount). Every step is bounded by a
//! [`crate::drain::Budget`].

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::blocking;
use super::data_path::{DataPath, PathEvent, ending_name};
use super::executor::Executor;
use crate::config::RunConfig;
use crate::drain::{Ending, ExitCode, Phase};
use crate::fs::{Admission, CoreConfig, Fs};
use crate::fuse::{DrainFs, InitInfo};
use crate::mount;

/// How long opening the core on the lower (an open and an fstat of its root) may take.
const OPEN_CORE_LIMIT: Duration = Duration::from_secs(10);

/// The mount as served: its core, its session and how to end it.
pub(super) struct MountPath {
    core: Arc<Fs>,
    /// Resolves when the fuser session ends (`None` once it did).
    session_done: Option<oneshot::Receiver<std::io::Result<()>>>,
    /// drainfs's own mount (by mount ID), recorded right after mounting.
    own_mount: Option<mount::MountInfo>,
    /// The FUSE connection behind drainfs's own mount (for an abort after a lazy detach).
    own_connection: Option<mount::Connection>,
}

impl DataPath for MountPath {
    type Start = ();

    async fn start(ex: &mut Executor, (): ()) -> Result<Self, ExitCode> {
        ex.start_lower().await?;
        let core = open_core(ex).await?;
        let path = MountPath::mount(ex, core).await?;
        path.first_round_trip(ex).await;
        ex.serving("mounted");
        Ok(path)
    }

    async fn next_event(&mut self, admission: &Admission, lower_died: bool) -> PathEvent {
        let session = async {
            match self.session_done.as_mut() {
                Some(rx) => rx.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = admission.lower_gone_notify.notified(), if !lower_died => {
                PathEvent::LowerGone("the lower's FUSE connection failed (ENOTCONN/ECONNABORTED)".into())
            }
            r = session => {
                self.session_done = None;
                PathEvent::Unmounted(format!("{r:?}"))
            }
        }
    }

    fn open_paths(&self, max: usize) -> Vec<String> {
        self.core
            .open_paths(max)
            .into_iter()
            .map(|(p, _)| p)
            .collect()
    }

    fn admitted_paths(&self, max: usize) -> Vec<String> {
        self.core.admitted_paths(max)
    }

    async fn unmounted_externally(&mut self, ex: &mut Executor) {
        self.close_remaining(ex).await;
    }

    async fn teardown(mut self, ex: &mut Executor, ending: Ending) -> ExitCode {
        ex.advance(Phase::Unmounting, ending_name(ending));
        let forced = matches!(ending, Ending::Forced(_));
        // Forced: flush and close what is left first (a flush may hang on a wedged lower).
        if forced {
            self.close_remaining(ex).await;
        }
        self.unmount(ex, forced).await;
        ex.record.timings.unmounted_ms = ex.ms_since_trigger();
        if !forced {
            self.close_remaining(ex).await;
        }
        self.close_lower_fds(ex).await;
        ex.shared.clear_fs();
        ex.stop_lower_and_its_mount(if forced {
            "forced teardown"
        } else {
            "drained and unmounted"
        })
        .await;
        // Read last: a FLUSH that was still in flight at a forced teardown fails only once the
        // lower is stopped or its connection ended.
        ex.record.add_failed_flushes(self.core.failed_flushes());
        ex.exit_code()
    }
}

/// Opens the core on the lower. `Err(69)` (the lower stopped) when the lower cannot be
/// opened.
async fn open_core(ex: &mut Executor) -> Result<Arc<Fs>, ExitCode> {
    let lower = ex.cfg.fs.lower.clone();
    let cfg = CoreConfig {
        max_lower_fds: ex
            .cfg
            .fs
            .max_lower_fds
            .unwrap_or_else(super::default_fd_budget),
    };
    let (acct, admission) = (Arc::clone(&ex.acct), Arc::clone(&ex.admission));
    // The open and fstat of the lower's root go to its daemon: on a helper, bounded, so a
    // lower that hangs right after mounting does not hold the lifecycle.
    let limit = ex.cfg.lifecycle.lower_ready_timeout.min(OPEN_CORE_LIMIT);
    let core = tokio::time::timeout(
        limit,
        blocking(move || Fs::new(&lower, cfg, acct, admission).map_err(|e| e.to_string())),
    )
    .await
    .unwrap_or_else(|_| Err(format!("the lower's root did not answer within {limit:?}")));
    match core {
        Ok(c) => Ok(Arc::new(c)),
        Err(e) => {
            tracing::error!(lower = %ex.cfg.fs.lower.display(), error = %e, "cannot open the lower");
            ex.record.failed = true;
            ex.stop_lower_after_failure("drainfs could not open the lower")
                .await;
            Err(ExitCode::LowerFailed)
        }
    }
}

impl MountPath {
    /// Mounts drainfs over `core` and identifies its own mount. `Err(1)` (the lower
    /// stopped) when the mount fails.
    async fn mount(ex: &mut Executor, core: Arc<Fs>) -> Result<Self, ExitCode> {
        let init = Arc::new(Mutex::new(None));
        let mp_baseline = mount::baseline(&ex.cfg.fs.mountpoint);
        let (session_done_tx, session_done) = oneshot::channel::<std::io::Result<()>>();
        let mounted = mount_session(
            &ex.cfg,
            Arc::clone(&core),
            Arc::clone(&init),
            session_done_tx,
        )
        .await;
        let own_mount = match mounted {
            Ok(m) => m.or_else(|| mount::fuse_mount_above(&ex.cfg.fs.mountpoint, mp_baseline)),
            Err(e) => {
                let why = init
                    .lock()
                    .as_ref()
                    .and_then(|i: &InitInfo| i.passthrough_off_reason.clone());
                tracing::error!(mountpoint = %ex.cfg.fs.mountpoint.display(), error = %e, reason = ?why, "cannot mount drainfs");
                ex.record.notes.push(format!("mount failed: {e}"));
                ex.record.failed = true;
                ex.stop_lower_after_failure("drainfs could not mount").await;
                return Err(ExitCode::Failed);
            }
        };
        let info = init.lock().clone().unwrap_or_default();
        log_mounted(&ex.cfg, &info);
        ex.shared.set_mounted(Arc::clone(&core), info);
        Ok(MountPath {
            core,
            session_done: Some(session_done),
            own_connection: own_mount.as_ref().and_then(mount::Connection::of),
            own_mount,
        })
    }

    /// A real round trip through the mount (and its readahead raised) before anyone is told
    /// it is ready; `/readyz` stays unready when it fails.
    async fn first_round_trip(&self, ex: &mut Executor) {
        let mp = ex.cfg.fs.mountpoint.clone();
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
            Ok(Ok(())) => ex.shared.set_started(),
            other => {
                tracing::error!(result = ?other, "the first round trip through the mount failed")
            }
        }
    }

    /// Unmounts drainfs by its mount ID (lazily first when forced or the lower died; a
    /// lazy detach is followed by an abort of its connection) and waits for the session to
    /// end.
    async fn unmount(&mut self, ex: &mut Executor, forced: bool) {
        let Some(session_done) = self.session_done.take() else {
            return;
        };
        match self.own_mount.clone() {
            Some(own) => {
                let lazy_first = forced || ex.machine.lower_died().is_some();
                if unmount_own(ex, own, lazy_first).await {
                    // Detached but still referenced (a process's cwd or open file): the
                    // session would run until the last reference goes. Nothing outstanding
                    // remains to be served (or it was forced), so end the connection now.
                    if let Some(c) = self.own_connection {
                        blocking(move || c.abort()).await;
                    }
                }
            }
            None => {
                tracing::error!(mountpoint = %ex.cfg.fs.mountpoint.display(), "drainfs's own mount was not found after mounting: not unmounting by path");
                ex.record
                    .notes
                    .push("drainfs's own mount was not identified; left mounted".into());
            }
        }
        let _ = ex
            .bounded(|b| b.unmount.min(Duration::from_secs(2)), session_done)
            .await;
    }

    /// Flushes and closes the handles that are left (bounded by the `close_remaining`
    /// budget), recording the failed flushes, or that the closes did not finish (their
    /// uploads' results unknown: the outcome is incomplete).
    async fn close_remaining(&self, ex: &mut Executor) {
        let c = Arc::clone(&self.core);
        match ex
            .bounded(|b| b.close_remaining, blocking(move || c.close_all()))
            .await
        {
            Some(failed) => ex.record.failed_flushes.extend(failed),
            None => {
                ex.record.closes_unfinished = true;
                ex.record.notes.push(
                    "closing the remaining lower fds did not finish within its budget".into(),
                );
            }
        }
    }

    /// Closes every lower fd drainfs holds (handles, the root's, the O_PATH cache), even if a
    /// lazily detached session still references the core: a lower fd left open would make
    /// the lower's own unmount fail with EBUSY (gcsfuse then keeps running).
    async fn close_lower_fds(&self, ex: &mut Executor) {
        let c = Arc::clone(&self.core);
        match ex
            .bounded(|b| b.close_remaining, blocking(move || c.close_lower_fds()))
            .await
        {
            Some(failed) => ex.record.failed_flushes.extend(failed),
            None => {
                ex.record.closes_unfinished = true;
                ex.record
                    .notes
                    .push("closing drainfs's lower fds did not finish within its budget".into());
            }
        }
    }
}

/// Unmounts drainfs's own mount `own` (`lazy_first`: detach at once), within the unmount
/// budget. Returns whether the mount was (or must be taken as) only lazily detached.
async fn unmount_own(ex: &mut Executor, own: mount::MountInfo, lazy_first: bool) -> bool {
    let mp = ex.cfg.fs.mountpoint.clone();
    let res = ex
        .bounded(
            |b| b.unmount,
            blocking(move || mount::detach_or_unmount(&own, lazy_first, Duration::from_secs(5))),
        )
        .await;
    match res {
        Some(Ok(u)) => {
            tracing::info!(mountpoint = %mp.display(), how = ?u, "unmounted drainfs");
            u == mount::Unmounted::Lazy
        }
        Some(Err(e)) => {
            tracing::error!(error = %e, "unmounting drainfs failed");
            ex.record.notes.push(e.to_string());
            true
        }
        None => {
            ex.record
                .notes
                .push("unmounting drainfs did not finish within its budget".into());
            true
        }
    }
}

/// Logs what the mount's INIT negotiated and which data path serves reads and writes.
fn log_mounted(cfg: &RunConfig, info: &InitInfo) {
    tracing::info!(
        mountpoint = %cfg.fs.mountpoint.display(),
        lower = %cfg.fs.lower.display(),
        passthrough = info.passthrough,
        writes_passthrough = info.writes_passthrough,
        lower_fs = info.lower_fs.as_deref().unwrap_or(""),
        reason = %info.data_path_reason,
        passthrough_off_reason = info.passthrough_off_reason.as_deref().unwrap_or(""),
        kernel_abi = %info.kernel_abi,
        threads = cfg.fs.threads,
        "mounted; data path: {}",
        match (info.passthrough, info.writes_passthrough) {
            (false, _) => "served by drainfs",
            (true, false) => {
                "kernel passthrough for read-only opens, writes served by drainfs"
            }
            (true, true) => "kernel passthrough",
        }
    );
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
    let invalidator = fs.invalidator();
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
                    if let Err(e) = invalidator.start(session.notifier()) {
                        tracing::warn!(error = %e, "cannot start the kernel invalidation thread; renamed entries expire after --ttl");
                    }
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

//! `drainfs run` (and `drainfs relay`): pre-flight checks, process set-up, and the tokio
//! runtime for the control plane. FUSE requests are served on fuser's own threads (or the
//! relay's two threads), never on the runtime.

use crate::config::RunConfig;
use crate::lifecycle::{self, Control, Event, ExitCode};
use crate::relay::run::Prepared;
use crate::{logging, mount, signals};

/// Runs `drainfs run` (or, with `cfg.relay`, a relay) and returns the process exit status.
/// When the relay's daemon died of a signal, that signal is raised on drainfs itself after
/// the cleanup (see [`lifecycle::Exit`]); this returns only if it did not end the process.
pub fn main(mut cfg: RunConfig, on_control: impl FnOnce(Control) + Send + 'static) -> i32 {
    // Before any thread exists: every thread inherits a mask with the handled signals blocked.
    if let Err(e) = signals::block_all() {
        eprintln!("drainfs: error: cannot set up signal handling: {e}");
        return ExitCode::Failed.code();
    }
    logging::init(&cfg.log);
    if cfg.check_config {
        return check_config(&cfg);
    }
    let relay = match preflight(&mut cfg) {
        Ok(relay) => relay,
        Err(code) => return code.code(),
    };
    if let Err(e) = check_outputs(&cfg) {
        eprintln!("drainfs: error: {e}");
        return ExitCode::Usage.code();
    }
    if let Some(addr) = cfg.admin.admin_addr
        && let Err(e) = crate::admin::prebind(addr)
    {
        // One relay runs per gcsfuse volume in the sidecar, all with the image's environment
        // and one network namespace: the first serves the address, the others go without,
        // rather than failing their volume's mount.
        if (cfg.relay.is_some() || cfg.handoff.is_some())
            && e.kind() == std::io::ErrorKind::AddrInUse
        {
            tracing::warn!(%addr, "admin address in use (another relay of this pod serves it?): this relay runs without an admin server");
            cfg.admin.admin_addr = None;
        } else {
            eprintln!("drainfs: error: --admin-addr {addr}: {e}");
            return ExitCode::Usage.code();
        }
    }
    run_lifecycle(cfg, relay, on_control)
}

/// `--check-config`: prints the configuration as JSON and every start-up problem (one
/// `drainfs: error:` line each). Returns 0, or 2 when there is a problem (1 when the
/// configuration cannot be printed).
fn check_config(cfg: &RunConfig) -> i32 {
    match serde_json::to_string_pretty(cfg) {
        Ok(j) => println!("{j}"),
        Err(e) => {
            eprintln!("drainfs: error: {e}");
            return ExitCode::Failed.code();
        }
    }
    let problems = crate::checks::problems(cfg);
    for p in &problems {
        eprintln!("drainfs: error: {p}");
    }
    if problems.is_empty() {
        0
    } else {
        ExitCode::Usage.code()
    }
}

/// The data path's pre-flight: none for a hand-off; for a relay, its mountpoint (self-mounted) and the prepared
/// connection with the daemon started on it; for a mount, the lower and the mountpoint made
/// absolute and the process prepared. Errors are printed; `Err` carries the exit code.
fn preflight(cfg: &mut RunConfig) -> Result<Option<Prepared>, ExitCode> {
    if cfg.handoff.is_some() {
        // Nothing to prepare, and nothing of the process changed (umask, limits): gcsfuse
        // gets drainfs's environment as drainfs got it.
        return Ok(None);
    }
    let Some(opts) = &cfg.relay else {
        let spawns = matches!(
            cfg.lifecycle.lower_process,
            crate::config::LowerProcess::Spawn { .. }
        );
        match mount::preflight(&cfg.fs.lower, &cfg.fs.mountpoint, spawns) {
            Ok((lower, mp)) => {
                cfg.fs.lower = lower;
                cfg.fs.mountpoint = mp;
            }
            Err(e) => {
                eprintln!("drainfs: error: {e}");
                return Err(ExitCode::Usage);
            }
        }
        prepare_process();
        return Ok(None);
    };
    if opts.connection == crate::config::RelayConnection::SelfMounted {
        match relay_preflight(&cfg.fs.mountpoint) {
            Ok(mp) => cfg.fs.mountpoint = mp,
            Err(e) => {
                eprintln!("drainfs: error: {e}");
                return Err(ExitCode::Usage);
            }
        }
    }
    match crate::relay::run::prepare(cfg) {
        Ok(p) => Ok(Some(p)),
        Err((code, e)) => {
            eprintln!("drainfs: error: {e}");
            Err(code)
        }
    }
}

/// Starts the control plane's runtime and the signal thread, runs the lifecycle, and ends
/// as it says (its exit status, or the signal it asks drainfs to end by).
fn run_lifecycle(
    cfg: RunConfig,
    relay: Option<Prepared>,
    on_control: impl FnOnce(Control) + Send + 'static,
) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("drainfs-control")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drainfs: error: cannot start the runtime: {e}");
            return ExitCode::Failed.code();
        }
    };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Event>();
    let sig_tx = tx.clone();
    if let Err(e) = signals::spawn_waiter(move |sig| sig_tx.send(Event::Signal(sig)).is_ok()) {
        eprintln!("drainfs: error: cannot start the signal thread: {e}");
        return ExitCode::Failed.code();
    }
    let exit = rt.block_on(lifecycle::run(cfg, relay, tx, rx, on_control));
    // Threads stuck in a wedged lower must not keep the process alive past the deadline.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    if let Some(sig) = exit.raise {
        raise_default(sig);
    }
    exit.code
}

/// Checks a self-mounted relay's mountpoint: an existing directory (a dead FUSE mount left by
/// a killed predecessor is repaired first), not already a mount. Returns it absolute.
fn relay_preflight(mp: &std::path::Path) -> Result<std::path::PathBuf, String> {
    mount::repair_if_dead(mp, "--mountpoint");
    let p = mp.to_path_buf();
    let limit = mount::probe::PROBE_LIMIT;
    match mount::probe::within(limit, move || std::fs::metadata(p)) {
        Some(Ok(m)) if m.is_dir() => {}
        Some(Ok(_)) => return Err(format!("--mountpoint {}: not a directory", mp.display())),
        Some(Err(e)) => return Err(format!("--mountpoint {}: {e}", mp.display())),
        None => {
            return Err(format!(
                "--mountpoint {}: does not answer within {limit:?} (a FUSE mount whose daemon is hung?)",
                mp.display()
            ));
        }
    }
    let abs = mount::absolute(mp);
    if let Some(m) = mount::mount_at(&abs) {
        return Err(format!(
            "--mountpoint {}: already a mount ({} from {}); unmount it or choose another directory",
            mp.display(),
            m.fstype,
            m.source
        ));
    }
    Ok(abs)
}

/// Ends drainfs by `sig`, as its daemon ended: default disposition, no core file (the core
/// would be drainfs's, not the daemon's), unblocked, raised on this thread. Returns if `sig`
/// does not terminate (the caller then exits 128+N).
fn raise_default(sig: nix::sys::signal::Signal) {
    use nix::sys::signal::{
        SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, pthread_sigmask, raise, sigaction,
    };
    tracing::info!(
        signal = sig.as_str(),
        "ending drainfs by a signal (default action), as its summary says"
    );
    let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
    let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // SAFETY: installing SIG_DFL has no handler code to be unsafe.
    let _ = unsafe { sigaction(sig, &dfl) };
    let mut set = SigSet::empty();
    set.add(sig);
    let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None);
    let _ = raise(sig);
}

/// Process-wide settings: umask 0 (the kernel already applied the caller's umask to modes
/// it sends), and RLIMIT_NOFILE raised to its hard limit.
fn prepare_process() {
    nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
    }
}

/// Start-up checks of what would otherwise fail only at shutdown or at once after start
/// ([`crate::checks::output_problems`]: outputs, the control socket, the watched pid, the
/// grace margin, the exit files); the first problem.
fn check_outputs(cfg: &RunConfig) -> Result<(), String> {
    let mut problems = Vec::new();
    crate::checks::output_problems(cfg, &mut problems);
    problems.into_iter().next().map_or(Ok(()), Err)
}

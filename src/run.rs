//! `drainfs run`: pre-flight checks, process set-up, and the tokio runtime for the control
//! plane. FUSE requests are served on fuser's own threads, never on the runtime.

use crate::config::RunConfig;
use crate::lifecycle::{self, Control, Event, ExitCode};
use crate::{logging, mount, signals};

/// Runs `drainfs run` and returns the process exit status.
pub fn main(mut cfg: RunConfig, on_control: impl FnOnce(Control) + Send + 'static) -> i32 {
    // Before any thread exists: every thread inherits a mask with the handled signals blocked.
    if let Err(e) = signals::block_all() {
        eprintln!("drainfs: error: cannot set up signal handling: {e}");
        return ExitCode::Failed.code();
    }
    logging::init(&cfg.log);
    if cfg.check_config {
        match serde_json::to_string_pretty(&cfg) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("drainfs: error: {e}");
                return ExitCode::Failed.code();
            }
        }
        return 0;
    }
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
            return ExitCode::Usage.code();
        }
    }
    prepare_process();
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
    let code = rt.block_on(lifecycle::run(cfg, tx, rx, on_control));
    // Threads stuck in a wedged lower must not keep the process alive past the deadline.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    code
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

//! The local control socket and the subcommands that use it (`status`, `drain`, `shutdown`,
//! `wait`), plus `cleanup`, which needs no running drainfs.
//!
//! Protocol: the client connects to the unix socket (mode 0600, so only the same user, in
//! practice root in the sidecar, may steer drainfs), writes one JSON request line such as
//! `{"cmd":"status"}`, and reads one JSON response line. Commands: `status` (the same snapshot
//! as `/status`), `drain`, `shutdown`, `wait_ready` (answers once the mount serves, or with
//! `ready: false` if shutdown began first).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::cli::Command;
use crate::lifecycle::{Cause, Control, Event, ExitCode, Phase, Source};
use crate::mount;

/// A request on the control socket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    /// Snapshot of the lifecycle.
    Status,
    /// Start draining (preStop).
    Drain,
    /// Shutdown trigger: the workload is gone.
    Shutdown,
    /// Answer once the mount serves.
    WaitReady,
}

/// Binds the control socket (removing a stale one) with mode 0600 and serves it until the
/// process exits.
///
/// # Errors
/// Bind errors (directory missing, permission denied).
pub fn serve(path: &Path, control: Control) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let path = path.to_path_buf();
    tokio::spawn(async move {
        let _cleanup = RemoveOnDrop(path);
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let control = control.clone();
            tokio::spawn(async move {
                if let Err(e) = handle(stream, control).await {
                    tracing::debug!(error = %e, "control connection failed");
                }
            });
        }
    });
    Ok(())
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn handle(stream: UnixStream, control: Control) -> std::io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut line = String::new();
    BufReader::new(r).read_line(&mut line).await?;
    let resp = match serde_json::from_str::<Request>(line.trim()) {
        Err(e) => serde_json::json!({"ok": false, "error": format!("bad request: {e}")}),
        Ok(Request::Status) => serde_json::to_value(control.shared.snapshot()).unwrap_or_default(),
        Ok(Request::Drain) => {
            let _ = control.events.send(Event::Trigger(Cause::DrainRequest {
                source: Source::Control,
            }));
            serde_json::json!({"ok": true})
        }
        Ok(Request::Shutdown) => {
            let _ = control.events.send(Event::Trigger(Cause::QuitRequest {
                source: Source::Control,
            }));
            serde_json::json!({"ok": true})
        }
        Ok(Request::WaitReady) => {
            let mut rx = control.shared.phase_changed.subscribe();
            loop {
                let phase = *rx.borrow_and_update();
                if control.shared.is_started() {
                    break serde_json::json!({"ok": true, "ready": true, "phase": phase});
                }
                if phase != Phase::Starting && phase != Phase::Serving {
                    break serde_json::json!({"ok": true, "ready": false, "phase": phase});
                }
                if tokio::time::timeout(Duration::from_millis(50), rx.changed())
                    .await
                    .is_ok_and(|r| r.is_err())
                {
                    break serde_json::json!({"ok": false, "ready": false});
                }
            }
        }
    };
    let mut out = serde_json::to_vec(&resp).unwrap_or_default();
    out.push(b'\n');
    w.write_all(&out).await?;
    w.shutdown().await
}

fn request(path: &Path, req: &Request, timeout: Duration) -> std::io::Result<serde_json::Value> {
    use std::io::{BufRead, Write};
    let s = std::os::unix::net::UnixStream::connect(path)?;
    s.set_read_timeout(Some(timeout))?;
    let mut w = &s;
    let mut body = serde_json::to_vec(req)?;
    body.push(b'\n');
    w.write_all(&body)?;
    let mut line = String::new();
    std::io::BufReader::new(&s).read_line(&mut line)?;
    serde_json::from_str(line.trim()).map_err(std::io::Error::other)
}

/// Runs a client subcommand and returns the exit status.
pub fn client(cmd: Command) -> i32 {
    crate::logging::init(&crate::config::LogConfig {
        format: crate::config::LogFormat::Text,
        level: None,
        to_stdout: false,
    });
    match cmd {
        Command::Run(_) | Command::Relay(_) | Command::Handoff(_) => ExitCode::Usage.code(),
        Command::Status {
            control_socket,
            json,
        } => match request(&control_socket, &Request::Status, Duration::from_secs(10)) {
            Ok(v) if json => {
                println!("{v}");
                0
            }
            Ok(v) => {
                println!("phase: {}", v["phase"].as_str().unwrap_or("?"));
                if !v["cause"].is_null() {
                    println!("cause: {}", v["cause"]);
                }
                if let Some(left) = v["deadline_seconds_left"].as_f64() {
                    println!("deadline in: {left:.1}s");
                }
                println!("outstanding: {}", v["outstanding"]);
                for p in v["open_paths"].as_array().into_iter().flatten() {
                    println!(
                        "open: {} ({})",
                        p[0].as_str().unwrap_or("?"),
                        p[1].as_str().unwrap_or("?")
                    );
                }
                0
            }
            Err(e) => unreachable_socket(&control_socket, e),
        },
        Command::Drain { control_socket } => simple(&control_socket, &Request::Drain),
        Command::Shutdown {
            control_socket,
            wait,
        } => {
            let code = simple(&control_socket, &Request::Shutdown);
            if code == 0 && wait {
                // The socket disappears when drainfs exits.
                while control_socket.exists() {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            code
        }
        Command::Wait {
            control_socket,
            timeout,
        } => {
            let deadline = Instant::now() + timeout;
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    eprintln!("drainfs wait: not ready within {timeout:?}");
                    return ExitCode::WaitTimedOut.code();
                }
                match request(&control_socket, &Request::WaitReady, left) {
                    Ok(v) if v["ready"] == true => return 0,
                    Ok(v) if v["ok"] == true => {
                        eprintln!(
                            "drainfs wait: shutdown began before the mount was ready (phase {})",
                            v["phase"]
                        );
                        return ExitCode::Failed.code();
                    }
                    // Not started yet (no socket), or a timeout: try again until the deadline.
                    _ => std::thread::sleep(Duration::from_millis(50).min(left)),
                }
            }
        }
        Command::Cleanup { paths, force } => cleanup(&paths, force),
    }
}

fn simple(path: &Path, req: &Request) -> i32 {
    match request(path, req, Duration::from_secs(10)) {
        Ok(v) if v["ok"] == true => 0,
        Ok(v) => {
            eprintln!("drainfs: error: {}", v["error"]);
            ExitCode::Failed.code()
        }
        Err(e) => unreachable_socket(path, e),
    }
}

fn unreachable_socket(path: &Path, e: std::io::Error) -> i32 {
    eprintln!(
        "drainfs: error: cannot reach drainfs at {} ({e}); is it running with --control-socket?",
        path.display()
    );
    ExitCode::Unreachable.code()
}

/// `drainfs cleanup`: for each path, a dead FUSE mount is aborted and detached; a path that is
/// not mounted is fine; a live mount is left alone unless `force`. Exit 0 when every path is
/// usable (or unmounted) afterwards, 1 otherwise.
pub fn cleanup(paths: &[PathBuf], force: bool) -> i32 {
    let mut code = 0;
    for p in paths {
        let abs = mount::absolute(p);
        let mut rounds = 0;
        // A path can carry several stacked dead mounts; peel them one by one.
        loop {
            rounds += 1;
            let Some(m) = mount::mount_at(&abs) else {
                println!("{}: not mounted", p.display());
                break;
            };
            if !m.is_fuse() {
                // A volume's own (bind) mount, or the filesystem underneath: never drainfs's to
                // remove, --force or not.
                println!("{}: {} mount, not FUSE; left alone", p.display(), m.fstype);
                break;
            }
            let answer = mount::probe::statfs_within(&abs, mount::probe::PROBE_LIMIT);
            if answer == mount::probe::Answer::Silent && !force {
                println!(
                    "{}: {} mount that does not answer (a hung daemon); left alone (use --force to detach it)",
                    p.display(),
                    m.fstype
                );
                code = ExitCode::Failed.code();
                break;
            }
            let dead = answer == mount::probe::Answer::Dead;
            if !dead && !force {
                println!(
                    "{}: live {} mount; left alone (use --force to unmount it)",
                    p.display(),
                    m.fstype
                );
                break;
            }
            if dead {
                mount::abort_fuse_connection(&abs);
            }
            // A silent mount (forced) is detached at once: a normal unmount would wait on it.
            let lazy = dead || answer == mount::probe::Answer::Silent;
            match mount::unmount(&abs, lazy, Duration::from_secs(10))
                .or_else(|_| mount::unmount(&abs, true, Duration::from_secs(10)))
            {
                Ok(how) => println!(
                    "{}: {} {} mount removed ({how:?})",
                    p.display(),
                    if dead { "dead" } else { "live" },
                    m.fstype
                ),
                Err(e) => {
                    eprintln!("drainfs cleanup: {}: {e}", p.display());
                    code = ExitCode::Failed.code();
                    break;
                }
            }
            if rounds > 16 {
                code = ExitCode::Failed.code();
                break;
            }
        }
        let usable = || {
            let a = abs.clone();
            mount::probe::within(mount::probe::PROBE_LIMIT, move || {
                std::fs::metadata(a).is_ok()
            }) == Some(true)
        };
        if code == 0 && mount::mount_at(&abs).is_none() && !usable() {
            eprintln!("drainfs cleanup: {} is still not usable", p.display());
            code = ExitCode::Failed.code();
        }
    }
    code
}

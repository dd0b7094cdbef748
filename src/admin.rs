//! The admin HTTP server (`--admin-addr`) and the start of the control socket.
//!
//! Endpoints (Kubernetes style, answered by status code; `?verbose` lists the checks):
//! - `GET /startupz`: 200 once the mount is up and a real round trip through it succeeded.
//! - `GET /readyz`: 200 while serving and not draining.
//! - `GET /livez`: 200 while a round trip through drainfs's request loop and a call on the
//!   lower both answer within [`LIVENESS_BOUND`]; a wedged lower or a stuck loop gives 503.
//!   In relay mode the round trip goes through the relay to the daemon (when drainfs knows the
//!   mountpoint: `run --relay`), and the lower check is the daemon's process being up.
//! - `GET /metrics`: Prometheus text format, read from the accounting atomics at scrape time
//!   (nothing is added to the FUSE hot path).
//! - `GET /status`: the lifecycle snapshot as JSON; to a peer beyond loopback without the open
//!   files' paths (`open_paths` empty, their number in `open_paths_hidden`). From inside the
//!   pod (its loopback, `kubectl port-forward`, or `drainfs status` on the control socket) the
//!   paths are listed.
//! - `POST /drain`, `POST /quitquitquit`: loopback peers only (403 otherwise), POST only (405).
//!
//! It runs on the control-plane runtime; probe syscalls run on their own threads, at most one
//! per check at a time, so a wedged lower can neither block the runtime nor pile up threads.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::lifecycle::{Cause, Control, Event, Phase, Source};
use crate::metrics;

/// How long a liveness check may take before it counts as failed.
pub const LIVENESS_BOUND: Duration = Duration::from_secs(2);

/// Starts the control socket and the admin server when configured (called by `run` once the
/// lifecycle exists). Failures to bind are logged and make drainfs exit: a probe that cannot
/// be reached would get the pod killed later for a worse reason.
pub fn start(control: Control) {
    let cfg = control.shared.admin_config();
    if let Some(path) = cfg.control_socket.clone()
        && let Err(e) = crate::control::serve(&path, control.clone())
    {
        tracing::error!(path = %path.display(), error = %e, "cannot bind the control socket");
        let _ = control
            .events
            .send(Event::Trigger(Cause::ControlPlaneFailed {
                detail: format!("cannot bind the control socket {}: {e}", path.display()),
            }));
    }
    if let Some(addr) = cfg.admin_addr {
        let control = control.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(addr, control.clone()).await {
                tracing::error!(%addr, error = %e, "admin server failed");
                let _ = control
                    .events
                    .send(Event::Trigger(Cause::ControlPlaneFailed {
                        detail: format!("admin server on {addr}: {e}"),
                    }));
            }
        });
    }
}

#[derive(Clone)]
struct App {
    control: Control,
    mountpoint: PathBuf,
    lower: PathBuf,
    loop_check: Arc<AtomicBool>,
    lower_check: Arc<AtomicBool>,
    registry: Arc<prometheus_client::registry::Registry>,
}

/// The admin listener, bound by [`prebind`] before anything is started.
static PREBOUND: parking_lot::Mutex<Option<std::net::TcpListener>> = parking_lot::Mutex::new(None);

/// Binds the admin server's address now, so that an address in use is a start-up error (one
/// line, exit 2) instead of a failure found after the lower was started or the mount was up.
///
/// # Errors
/// The bind error (`EADDRINUSE`, `EADDRNOTAVAIL`, `EACCES` for a privileged port).
pub fn prebind(addr: SocketAddr) -> std::io::Result<()> {
    let l = std::net::TcpListener::bind(addr)?;
    *PREBOUND.lock() = Some(l);
    Ok(())
}

async fn serve(addr: SocketAddr, control: Control) -> std::io::Result<()> {
    let (mountpoint, lower) = control.shared.paths();
    let app = App {
        registry: Arc::new(metrics::registry(Arc::clone(&control.shared))),
        control,
        mountpoint,
        lower,
        loop_check: Arc::default(),
        lower_check: Arc::default(),
    };
    let router = Router::new()
        .route("/startupz", get(startupz))
        .route("/readyz", get(readyz))
        .route("/livez", get(livez))
        .route("/metrics", get(metrics_handler))
        .route("/status", get(status))
        .route(
            "/drain",
            axum::routing::post(drain).fallback(method_not_allowed),
        )
        .route(
            "/quitquitquit",
            axum::routing::post(quit).fallback(method_not_allowed),
        )
        .with_state(app);
    let prebound = PREBOUND.lock().take();
    let listener = match prebound {
        Some(l) => {
            l.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(l)?
        }
        None => tokio::net::TcpListener::bind(addr).await?,
    };
    tracing::info!(addr = %listener.local_addr()?, "admin server listening");
    axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await
}

struct Check {
    name: &'static str,
    ok: bool,
    detail: String,
}

fn probe_response(query: Option<String>, checks: &[Check]) -> Response {
    let ok = checks.iter().all(|c| c.ok);
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let verbose = query.is_some_and(|q| {
        q.split('&')
            .any(|p| p == "verbose" || p.starts_with("verbose="))
    });
    let body = if verbose {
        let mut s = String::new();
        for c in checks {
            s.push_str(&format!(
                "[{}] {} {}\n",
                if c.ok { "+" } else { "-" },
                c.name,
                c.detail
            ));
        }
        s.push_str(if ok {
            "check passed\n"
        } else {
            "check failed\n"
        });
        s
    } else if ok {
        "ok\n".to_string()
    } else {
        "failed\n".to_string()
    };
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

async fn startupz(State(app): State<App>, RawQuery(q): RawQuery) -> Response {
    let started = app.control.shared.is_started();
    probe_response(
        q,
        &[Check {
            name: "mounted",
            ok: started,
            detail: if started {
                "round trip through the mount succeeded".into()
            } else {
                format!("phase {}", app.control.shared.phase().name())
            },
        }],
    )
}

async fn readyz(State(app): State<App>, RawQuery(q): RawQuery) -> Response {
    let phase = app.control.shared.phase();
    let started = app.control.shared.is_started();
    probe_response(
        q,
        &[
            Check {
                name: "mounted",
                ok: started,
                detail: String::new(),
            },
            Check {
                name: "serving",
                ok: phase == Phase::Serving,
                detail: format!("phase {}", phase.name()),
            },
        ],
    )
}

/// Runs `f` on its own thread with a bound; `busy` ensures at most one runs at a time (a
/// check still stuck from a previous probe fails at once).
async fn bounded(
    busy: &Arc<AtomicBool>,
    f: impl FnOnce() -> std::io::Result<()> + Send + 'static,
) -> Result<(), String> {
    if busy.swap(true, Ordering::SeqCst) {
        return Err("previous check still stuck".into());
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let flag = Arc::clone(busy);
    std::thread::spawn(move || {
        let r = f();
        flag.store(false, Ordering::SeqCst);
        let _ = tx.send(r);
    });
    match tokio::time::timeout(LIVENESS_BOUND, rx).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(e.to_string()),
        Ok(Err(_)) => Err("check thread died".into()),
        Err(_) => Err(format!("no answer within {LIVENESS_BOUND:?}")),
    }
}

fn statfs(p: PathBuf) -> std::io::Result<()> {
    nix::sys::statfs::statfs(&p)
        .map(drop)
        .map_err(std::io::Error::from)
}

async fn livez(State(app): State<App>, RawQuery(q): RawQuery) -> Response {
    let shared = &app.control.shared;
    let mut checks = Vec::new();
    // The relay and the hand-off: the lower is the daemon's process.
    let relay = shared.data_path() != "mount";
    let has_mount = if relay {
        shared.is_started() && !app.mountpoint.as_os_str().is_empty()
    } else {
        shared.fs().is_some()
    };
    let mounted = has_mount
        && matches!(
            shared.phase(),
            Phase::Serving | Phase::Draining | Phase::DoorClosed
        );
    if mounted {
        let mp = app.mountpoint.clone();
        let r = bounded(&app.loop_check, move || statfs(mp)).await;
        checks.push(Check {
            name: "fuse_loop",
            ok: r.is_ok(),
            detail: r
                .err()
                .unwrap_or_else(|| "statfs through the mount answered".into()),
        });
    } else {
        checks.push(Check {
            name: "fuse_loop",
            ok: true,
            detail: format!("not mounted (phase {})", shared.phase().name()),
        });
    }
    if relay {
        let ok = shared.lower_up()
            || shared.phase() == Phase::Starting
            || shared.phase() >= Phase::Unmounting;
        checks.push(Check {
            name: "lower",
            ok,
            detail: if shared.lower_up() {
                "the daemon's process is up".into()
            } else {
                format!(
                    "the daemon's process is not up (phase {})",
                    shared.phase().name()
                )
            },
        });
    } else if shared.lower_up() {
        let lower = app.lower.clone();
        let r = bounded(&app.lower_check, move || statfs(lower)).await;
        checks.push(Check {
            name: "lower",
            ok: r.is_ok(),
            detail: r
                .err()
                .unwrap_or_else(|| "statfs on the lower answered".into()),
        });
    } else {
        let ok = shared.phase() == Phase::Starting || shared.phase() >= Phase::Unmounting;
        checks.push(Check {
            name: "lower",
            ok,
            detail: "the lower's process is not up".into(),
        });
    }
    probe_response(q, &checks)
}

async fn metrics_handler(State(app): State<App>) -> Response {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &app.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

async fn status(State(app): State<App>, ConnectInfo(peer): ConnectInfo<SocketAddr>) -> Response {
    let mut snap = app.control.shared.snapshot();
    if !loopback(peer) {
        snap.hide_paths();
    }
    axum::Json(snap).into_response()
}

/// Whether `peer` is on loopback: 127.0.0.0/8 or `::1`, and an IPv4 loopback address as a
/// dual-stack `[::]` socket reports it (`::ffff:127.0.0.1`).
fn loopback(peer: SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

fn loopback_only(peer: &SocketAddr) -> Option<Response> {
    if loopback(*peer) {
        None
    } else {
        Some((StatusCode::FORBIDDEN, "loopback only\n").into_response())
    }
}

async fn drain(State(app): State<App>, ConnectInfo(peer): ConnectInfo<SocketAddr>) -> Response {
    if let Some(r) = loopback_only(&peer) {
        return r;
    }
    let _ = app.control.events.send(Event::Trigger(Cause::DrainRequest {
        source: Source::Http,
    }));
    (StatusCode::OK, "draining\n").into_response()
}

async fn quit(State(app): State<App>, ConnectInfo(peer): ConnectInfo<SocketAddr>) -> Response {
    if let Some(r) = loopback_only(&peer) {
        return r;
    }
    let _ = app.control.events.send(Event::Trigger(Cause::QuitRequest {
        source: Source::Http,
    }));
    (StatusCode::OK, "shutting down\n").into_response()
}

async fn method_not_allowed() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        "POST only\n",
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::loopback;

    #[test]
    fn loopback_peers_include_ipv4_mapped_ones() {
        for (addr, want) in [
            ("127.0.0.1:1", true),
            ("127.3.4.5:1", true),
            ("[::1]:1", true),
            ("[::ffff:127.0.0.1]:1", true),
            ("192.0.2.2:1", false),
            ("[::ffff:192.0.2.2]:1", false),
            ("[fd00::2]:1", false),
        ] {
            assert_eq!(loopback(addr.parse().unwrap()), want, "{addr}");
        }
    }
}

//! `drainfs relay`: the process around the engine. Takes the inherited FUSE connection fd,
//! builds the socketpair, starts the daemon on it, and drives the relay's lifecycle: serve
//! until a trigger, drain (door closed, nothing in flight, no file open for writing, or the
//! deadline), stop the daemon with SHUT_WR, wait for it, report, exit.
//!
//! The drain decision is kept in [`drain`], a small loop over the engine's three hooks
//! (close the door, an outstanding snapshot read after it, a change notification registered
//! before each read), so that it can be replaced by the crate's drain state machine.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, fcntl};
use nix::sys::signal::Signal;
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, getsockopt, setsockopt, socketpair, sockopt,
};
use nix::sys::wait::WaitStatus;
use serde::Serialize;
use tokio::sync::mpsc;

use super::engine::{EngineEvent, Limits, Relay};
use super::inflight::{Counters, Outstanding};
use super::init::InitCaps;
use crate::config::{AdminConfig, LifecycleConfig, LogConfig};
use crate::lifecycle::{Cause, Event};
use crate::{logging, procs, signals, summary, triggers};

// Exit statuses as `match` patterns; equal to [`ExitCode::code`] (checked by a unit test).
const EXIT_OK: i32 = 0;
const EXIT_FAILURE: i32 = 1;
const EXIT_USAGE: i32 = 2;
const EXIT_LOWER_FAILED: i32 = 69;
const EXIT_INCOMPLETE: i32 = 75;

/// The fd number the daemon finds its socket end at (`/dev/fd/3`, as the CSI driver passes).
pub const DAEMON_FD: RawFd = 3;
/// The kernel fd is moved to this number or above.
pub const HIGH_FD: RawFd = 100;

/// Everything `drainfs relay` needs.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// The daemon's command line as given (with its `/dev/fd/N` argument).
    pub argv: Vec<OsString>,
    /// `--kernel-fd`: the kernel fd, when not taken from the `/dev/fd/N` argument.
    pub kernel_fd: Option<RawFd>,
    /// `--socket-buffer`: SO_SNDBUF/SO_RCVBUF to request; `None` = net.core.wmem_max.
    pub socket_buffer: Option<usize>,
    /// Triggers, deadline, summary and ready file (`lower_*` and `quiet_period` unused).
    pub lifecycle: LifecycleConfig,
    /// Admin server and control socket.
    pub admin: AdminConfig,
    /// Logging.
    pub log: LogConfig,
}

/// Finds the kernel fd and the daemon's argv: the one `/dev/fd/N` argument names the kernel
/// fd (unless `kernel_fd` overrides it) and is rewritten to `/dev/fd/3`.
///
/// # Errors
/// A message for: an empty command, no `/dev/fd/N` argument and no override, more than one,
/// or an N that is not a number.
pub fn plan_argv(
    argv: &[OsString],
    kernel_fd: Option<RawFd>,
) -> Result<(RawFd, Vec<OsString>), String> {
    if argv.is_empty() {
        return Err("no daemon command given (drainfs relay -- COMMAND ARGS... /dev/fd/N)".into());
    }
    let mut found: Vec<(usize, RawFd)> = Vec::new();
    for (i, a) in argv.iter().enumerate().skip(1) {
        if let Some(rest) = a.as_bytes().strip_prefix(b"/dev/fd/") {
            let n = std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.parse::<RawFd>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| format!("`{}` does not name an fd", a.to_string_lossy()))?;
            found.push((i, n));
        }
    }
    if found.len() > 1 {
        return Err("more than one /dev/fd/N argument; pass --kernel-fd".into());
    }
    let kfd = match (kernel_fd, found.first()) {
        (Some(k), _) => k,
        (None, Some((_, n))) => *n,
        (None, None) => {
            return Err(
                "no /dev/fd/N argument names the FUSE connection (or pass --kernel-fd N)".into(),
            );
        }
    };
    let mut out = argv.to_vec();
    if let Some((i, _)) = found.first() {
        out[*i] = OsString::from(format!("/dev/fd/{DAEMON_FD}"));
    }
    Ok((kfd, out))
}

/// `net.core.wmem_max`, the most an unprivileged SO_SNDBUF can get (before doubling).
pub fn wmem_max() -> Option<usize> {
    std::fs::read_to_string("/proc/sys/net/core/wmem_max")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The fds of a relay before the daemon starts.
struct Plumbing {
    kernel: OwnedFd,
    relay_end: OwnedFd,
    daemon_end: OwnedFd,
    sndbuf_relay: usize,
    sndbuf_daemon: usize,
}

fn plumb(kfd: RawFd, socket_buffer: usize) -> Result<Plumbing, String> {
    fcntl_check(kfd)?;
    // SAFETY: `kfd` is open (checked above) and was inherited; nothing else in this process
    // owns it, so taking ownership (and closing it once duplicated) is sound.
    let inherited = unsafe { OwnedFd::from_raw_fd(kfd) };
    let high = fcntl(&inherited, FcntlArg::F_DUPFD_CLOEXEC(HIGH_FD))
        .map_err(|e| format!("cannot move fd {kfd}: {e}"))?;
    drop(inherited);
    // SAFETY: F_DUPFD_CLOEXEC returned a new fd that nothing else owns.
    let kernel = unsafe { OwnedFd::from_raw_fd(high) };
    let (relay_end, daemon_end) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| format!("socketpair: {e}"))?;
    for end in [&relay_end, &daemon_end] {
        // Failures leave the defaults, which the read-back below reports.
        let _ = setsockopt(end, sockopt::SndBuf, &socket_buffer);
        let _ = setsockopt(end, sockopt::RcvBuf, &socket_buffer);
    }
    let sndbuf_relay = getsockopt(&relay_end, sockopt::SndBuf).map_err(|e| e.to_string())?;
    let sndbuf_daemon = getsockopt(&daemon_end, sockopt::SndBuf).map_err(|e| e.to_string())?;
    Ok(Plumbing {
        kernel,
        relay_end,
        daemon_end,
        sndbuf_relay,
        sndbuf_daemon,
    })
}

fn fcntl_check(fd: RawFd) -> Result<(), String> {
    // SAFETY: F_GETFD only inspects the descriptor table; an unknown fd gives EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(format!(
            "fd {fd} (the FUSE connection) is not open in this process"
        ));
    }
    Ok(())
}

/// Spawns the daemon with `daemon_end` as fd 3 (blocking, CLOEXEC cleared), stdin null,
/// stdout/stderr inherited, and PR_SET_PDEATHSIG(SIGKILL). Must run on the main thread: the
/// death signal follows the thread that forked, not the process.
fn spawn_daemon(
    argv: &[OsString],
    daemon_end: &OwnedFd,
) -> std::io::Result<(u32, tokio::sync::oneshot::Receiver<WaitStatus>)> {
    use std::os::unix::process::CommandExt;
    let src = daemon_end.as_raw_fd();
    let parent = std::process::id() as libc::pid_t;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).stdin(Stdio::null());
    // SAFETY: only async-signal-safe calls (dup2, fcntl, prctl, getppid, kill) between fork
    // and exec; nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            if src == DAEMON_FD {
                let flags = libc::fcntl(DAEMON_FD, libc::F_GETFD);
                if flags < 0 || libc::fcntl(DAEMON_FD, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(src, DAEMON_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // drainfs died between fork and prctl: the signal will never come.
            if libc::getppid() != parent {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
    let (child, rx) = procs::spawn(&mut cmd)?;
    Ok((child.id(), rx))
}

/// The relay's shutdown summary (written like `drainfs run`'s).
#[derive(Debug, Clone, Serialize)]
pub struct RelaySummary {
    /// The exit status.
    pub exit_code: i32,
    /// `clean`, `incomplete`, `lower_failed`, `failed`.
    pub outcome: &'static str,
    /// Always `relay`.
    pub data_path: &'static str,
    /// The first trigger, if any.
    pub cause: Option<Cause>,
    /// Why the exit was forced (`deadline`, `second_signal`, `daemon_sigkill`).
    pub forced: Option<&'static str>,
    /// How the daemon ended (`exit 0`, `signal SIGKILL`).
    pub daemon_exit: Option<String>,
    /// Milliseconds from the first trigger: door closed, drained, SHUT_WR sent, daemon exited.
    pub timings_ms: Timings,
    /// What was outstanding when the daemon was stopped.
    pub outstanding_at_stop: Option<Outstanding>,
    /// Relay counters.
    pub counts: Counters,
    /// What INIT negotiated, and the socket buffers obtained.
    pub init: Option<InitCaps>,
    /// SO_SNDBUF of the relay's and the daemon's ends, as read back.
    pub socket_buffers: (usize, usize),
    /// Anything else worth knowing.
    pub notes: Vec<String>,
}

/// Phase timings, milliseconds from the first trigger.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    /// Door closed.
    pub door_closed: Option<u64>,
    /// Nothing outstanding (or the deadline).
    pub drained: Option<u64>,
    /// SHUT_WR sent.
    pub shut_wr: Option<u64>,
    /// The daemon exited.
    pub daemon_exited: Option<u64>,
}

/// How the drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainEnd {
    /// Nothing in flight and no file open for writing.
    Drained,
    /// The deadline passed with work outstanding.
    Deadline,
    /// Stopped early by another event (second signal, daemon gone).
    Interrupted,
}

/// Closes the door and waits until nothing is outstanding, `deadline`, or `interrupt`
/// resolves. The notification is registered before each read of the counts, so no
/// completion between the read and the wait is missed.
pub async fn drain(
    relay: &Relay,
    deadline: Instant,
    interrupt: impl std::future::Future<Output = ()>,
) -> (DrainEnd, Outstanding) {
    relay.close_door();
    tokio::pin!(interrupt);
    loop {
        let notified = relay.changed().notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let o = relay.outstanding();
        if o.is_drained() || relay.daemon_gone() {
            return (DrainEnd::Drained, o);
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(deadline.into()) => {
                return (DrainEnd::Deadline, relay.outstanding());
            }
            _ = &mut interrupt => return (DrainEnd::Interrupted, relay.outstanding()),
        }
    }
}

/// Runs `drainfs relay` and returns the exit status.
pub fn main(cfg: RelayConfig) -> i32 {
    if let Err(e) = signals::block_all() {
        eprintln!("drainfs: error: cannot set up signal handling: {e}");
        return EXIT_FAILURE;
    }
    logging::init(&cfg.log);
    let (kfd, argv) = match plan_argv(&cfg.argv, cfg.kernel_fd) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("drainfs: error: {e}");
            return EXIT_USAGE;
        }
    };
    let want = cfg.socket_buffer.or_else(wmem_max).unwrap_or(212_992);
    let p = match plumb(kfd, want) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("drainfs: error: {e}");
            return EXIT_USAGE;
        }
    };
    let limits = Limits::from_sndbufs(p.sndbuf_relay, p.sndbuf_daemon);
    tracing::info!(
        kernel_fd = p.kernel.as_raw_fd(),
        requested = want,
        sndbuf_relay = p.sndbuf_relay,
        sndbuf_daemon = p.sndbuf_daemon,
        cap = ?limits.cap,
        "relay: socketpair ready"
    );
    if cfg.admin.admin_addr.is_some() || cfg.admin.control_socket.is_some() {
        tracing::warn!("relay: --admin-addr and --control-socket are not served in relay mode yet");
    }
    let (pid, exit_rx) = match spawn_daemon(&argv, &p.daemon_end) {
        Ok(x) => x,
        Err(e) => {
            eprintln!(
                "drainfs: error: cannot start {}: {e}",
                argv[0].to_string_lossy()
            );
            return EXIT_LOWER_FAILED;
        }
    };
    drop(p.daemon_end);
    tracing::info!(pid, daemon = %argv[0].to_string_lossy(), "relay: daemon started");
    let (eng_tx, eng_rx) = mpsc::unbounded_channel();
    let relay = match Relay::start(p.kernel, p.relay_end, limits, move |ev| {
        let _ = eng_tx.send(ev);
    }) {
        Ok((r, _threads)) => r,
        Err(e) => {
            eprintln!("drainfs: error: cannot start the relay threads: {e}");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
            return EXIT_FAILURE;
        }
    };
    let (tx, rx) = mpsc::unbounded_channel::<Event>();
    let sig_tx = tx.clone();
    if let Err(e) = signals::spawn_waiter(move |sig| sig_tx.send(Event::Signal(sig)).is_ok()) {
        eprintln!("drainfs: error: cannot start the signal thread: {e}");
        return EXIT_FAILURE;
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("drainfs-control")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("drainfs: error: cannot start the runtime: {e}");
            return EXIT_FAILURE;
        }
    };
    let mut r = Runner {
        cfg,
        relay,
        pid: pid as i32,
        exit_rx,
        status: None,
        eng_rx,
        events: rx,
        t0: None,
        timings: Timings::default(),
        forced: None,
        cause: None,
        notes: Vec::new(),
        outstanding_at_stop: None,
        sndbufs: (p.sndbuf_relay, p.sndbuf_daemon),
    };
    let code = rt.block_on(async {
        triggers::start(&r.cfg.lifecycle, tx.clone());
        r.run().await
    });
    rt.shutdown_timeout(Duration::from_millis(100));
    code
}

struct Runner {
    cfg: RelayConfig,
    relay: Arc<Relay>,
    pid: i32,
    exit_rx: tokio::sync::oneshot::Receiver<WaitStatus>,
    status: Option<WaitStatus>,
    eng_rx: mpsc::UnboundedReceiver<EngineEvent>,
    events: mpsc::UnboundedReceiver<Event>,
    t0: Option<Instant>,
    timings: Timings,
    forced: Option<&'static str>,
    cause: Option<Cause>,
    notes: Vec<String>,
    outstanding_at_stop: Option<Outstanding>,
    sndbufs: (usize, usize),
}

/// Why serving ended.
enum Stop {
    Trigger,
    KernelGone,
    InitFailed,
    DaemonGone,
}

impl Runner {
    fn ms(&self) -> Option<u64> {
        self.t0.map(|t| t.elapsed().as_millis() as u64)
    }

    fn cause_of(ev: Event) -> Option<Cause> {
        match ev {
            Event::Signal(Signal::SIGTERM) => Some(Cause::Sigterm),
            Event::Signal(Signal::SIGINT) => Some(Cause::Sigint),
            Event::Signal(other) => {
                tracing::info!(signal = other.as_str(), "ignoring signal");
                None
            }
            Event::Trigger(c) => Some(c),
        }
    }

    async fn run(&mut self) -> i32 {
        let stop = self.serve().await;
        let code = match stop {
            Stop::InitFailed => {
                self.notes
                    .push("the socket buffers cannot carry a minimal FUSE message".into());
                self.stop_daemon().await;
                EXIT_FAILURE
            }
            Stop::DaemonGone => {
                self.relay.fail_all();
                self.wait_daemon(Duration::from_secs(2)).await;
                self.daemon_code()
                    .unwrap_or(EXIT_LOWER_FAILED)
                    .max(EXIT_LOWER_FAILED)
            }
            Stop::KernelGone => {
                self.notes
                    .push("the kernel side of the FUSE connection went away".into());
                self.stop_daemon().await;
                self.daemon_code().unwrap_or(EXIT_LOWER_FAILED)
            }
            Stop::Trigger => self.drain_and_stop().await,
        };
        self.finish(code)
    }

    /// Serves until a trigger or a failure.
    async fn serve(&mut self) -> Stop {
        loop {
            tokio::select! {
                ev = self.events.recv() => {
                    let Some(ev) = ev else { return Stop::Trigger };
                    if let Some(cause) = Self::cause_of(ev) {
                        tracing::info!(cause = cause.label(), "relay: shutdown triggered");
                        self.cause = Some(cause);
                        self.t0 = Some(Instant::now());
                        return Stop::Trigger;
                    }
                }
                ev = self.eng_rx.recv() => match ev {
                    Some(EngineEvent::Initialized(_)) => self.write_ready(),
                    Some(EngineEvent::InitFailed) => return Stop::InitFailed,
                    Some(EngineEvent::KernelGone(_)) => {
                        self.t0 = Some(Instant::now());
                        return Stop::KernelGone;
                    }
                    Some(EngineEvent::DaemonEof { .. }) | None => {
                        self.t0 = Some(Instant::now());
                        return self.daemon_gone_or_kernel_gone();
                    }
                },
                st = &mut self.exit_rx, if self.status.is_none() => {
                    if let Ok(st) = st {
                        self.daemon_exited(st);
                    }
                    self.t0 = Some(Instant::now());
                    return self.daemon_gone_or_kernel_gone();
                }
            }
        }
    }

    /// The daemon's end closed or the daemon exited: a consequence of the kernel side going
    /// away (the relay sent it EOF) or a death of its own. The engine's flag is set before
    /// the EOF is sent, so the two cannot be confused whatever order the events arrive in.
    fn daemon_gone_or_kernel_gone(&self) -> Stop {
        if self.relay.kernel_gone() {
            Stop::KernelGone
        } else {
            Stop::DaemonGone
        }
    }

    fn daemon_exited(&mut self, st: WaitStatus) {
        if self.status.is_none() {
            self.timings.daemon_exited = self.ms();
            tracing::info!(status = %procs::describe(&st), "relay: the daemon exited");
            self.status = Some(st);
        }
    }

    fn write_ready(&self) {
        if let Some(rf) = &self.cfg.lifecycle.ready_file
            && let Err(e) = summary::write_atomic(rf, b"ready\n")
        {
            tracing::warn!(path = %rf.display(), error = %e, "cannot write the ready file");
        }
    }

    fn remove_ready(&self) {
        if let Some(rf) = &self.cfg.lifecycle.ready_file {
            let _ = std::fs::remove_file(rf);
        }
    }

    /// The instant the relay must be done by: the grace period minus its margin, from the
    /// first trigger.
    fn deadline(&self) -> Instant {
        let l = &self.cfg.lifecycle;
        self.t0.unwrap_or_else(Instant::now) + l.grace_period.saturating_sub(l.grace_margin)
    }

    async fn drain_and_stop(&mut self) -> i32 {
        self.remove_ready();
        let deadline = self.deadline();
        let relay = Arc::clone(&self.relay);
        let events = &mut self.events;
        // A second SIGTERM/SIGINT forces the stop; other events are logged and ignored.
        let second = async {
            while let Some(ev) = events.recv().await {
                if matches!(ev, Event::Signal(Signal::SIGTERM | Signal::SIGINT)) {
                    return;
                }
            }
            std::future::pending::<()>().await
        };
        let t0 = self.t0.unwrap_or_else(Instant::now);
        let (end, o) = drain(&relay, deadline, second).await;
        self.timings.door_closed = Some(0);
        self.timings.drained = Some(t0.elapsed().as_millis() as u64);
        match end {
            DrainEnd::Drained => tracing::info!("relay: drained"),
            DrainEnd::Deadline => {
                self.forced = Some("deadline");
                tracing::warn!(outstanding = ?o, "relay: drain deadline passed with work outstanding");
            }
            DrainEnd::Interrupted => {
                self.forced = Some("second_signal");
                tracing::warn!(outstanding = ?o, "relay: second signal; stopping now");
            }
        }
        let incomplete = !o.is_drained();
        self.outstanding_at_stop = Some(o);
        self.stop_daemon().await;
        match self.daemon_code() {
            Some(EXIT_OK) if incomplete || self.forced == Some("daemon_sigkill") => EXIT_INCOMPLETE,
            Some(EXIT_OK) => EXIT_OK,
            Some(c) => c,
            None => EXIT_INCOMPLETE,
        }
    }

    /// SHUT_WR, then wait for the daemon to exit (it reads EOF, finishes its own in-flight
    /// work and exits); SIGKILL it at the hard deadline.
    async fn stop_daemon(&mut self) {
        self.relay.stop();
        self.timings.shut_wr = self.ms();
        let hard = self.deadline() + self.cfg.lifecycle.grace_margin / 2;
        let left = hard.saturating_duration_since(Instant::now());
        if !self.wait_daemon(left.max(Duration::from_millis(200))).await {
            tracing::warn!(
                pid = self.pid,
                "relay: the daemon did not exit after EOF; SIGKILL"
            );
            self.forced = Some("daemon_sigkill");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), Signal::SIGKILL);
            self.wait_daemon(Duration::from_secs(1)).await;
        }
    }

    async fn wait_daemon(&mut self, t: Duration) -> bool {
        if self.status.is_some() {
            return true;
        }
        match tokio::time::timeout(t, &mut self.exit_rx).await {
            Ok(Ok(st)) => {
                self.daemon_exited(st);
                true
            }
            _ => false,
        }
    }

    /// The exit status the daemon's end maps to: 0 for `exit 0`, 69 for another exit code,
    /// 128+N for death by signal N.
    fn daemon_code(&self) -> Option<i32> {
        match self.status? {
            WaitStatus::Exited(_, 0) => Some(EXIT_OK),
            WaitStatus::Exited(..) => Some(EXIT_LOWER_FAILED),
            WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
            _ => None,
        }
    }

    fn finish(&mut self, code: i32) -> i32 {
        self.remove_ready();
        let outcome = match code {
            EXIT_OK => "clean",
            EXIT_INCOMPLETE => "incomplete",
            EXIT_FAILURE | EXIT_USAGE => "failed",
            _ => "lower_failed",
        };
        let s = RelaySummary {
            exit_code: code,
            outcome,
            data_path: "relay",
            cause: self.cause.clone(),
            forced: self.forced,
            daemon_exit: self.status.as_ref().map(procs::describe),
            timings_ms: self.timings.clone(),
            outstanding_at_stop: self.outstanding_at_stop.clone(),
            counts: self.relay.counters(),
            init: self.relay.init_caps(),
            socket_buffers: self.sndbufs,
            notes: std::mem::take(&mut self.notes),
        };
        let json = serde_json::to_string(&s).unwrap_or_default();
        tracing::info!(summary = %json, exit_code = code, outcome, "shutdown summary");
        if let Some(p) = &self.cfg.lifecycle.summary_file
            && let Err(e) = summary::write_atomic(p, format!("{json}\n").as_bytes())
        {
            tracing::warn!(path = %p.display(), error = %e, "cannot write the summary file");
        }
        if let Some(p) = &self.cfg.lifecycle.termination_log {
            let mut t = json;
            t.truncate(summary::TERMINATION_LOG_CAP);
            if let Err(e) = std::fs::write(p, t) {
                tracing::warn!(path = %p.display(), error = %e, "cannot write the termination log");
            }
        }
        code
    }
}

/// Whether `arg0`'s basename is `gcsfuse` (the drop-in entry point).
pub fn is_gcsfuse_dropin(arg0: &OsStr) -> bool {
    std::path::Path::new(arg0)
        .file_name()
        .is_some_and(|n| n == "gcsfuse")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drain::ExitCode;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn argv_plans() {
        let (k, a) = plan_argv(
            &os(&["/gcsfuse.real", "--foreground", "b", "/dev/fd/7"]),
            None,
        )
        .unwrap();
        assert_eq!(k, 7);
        assert_eq!(a, os(&["/gcsfuse.real", "--foreground", "b", "/dev/fd/3"]));
        let (k, a) = plan_argv(&os(&["d", "/dev/fd/3"]), Some(9)).unwrap();
        assert_eq!((k, a), (9, os(&["d", "/dev/fd/3"])));
        let (k, a) = plan_argv(&os(&["d", "x"]), Some(9)).unwrap();
        assert_eq!((k, a), (9, os(&["d", "x"])));
        for bad in [
            os(&[]),
            os(&["d", "x"]),
            os(&["d", "/dev/fd/3", "/dev/fd/4"]),
            os(&["d", "/dev/fd/x"]),
            os(&["d", "/dev/fd/-1"]),
        ] {
            assert!(plan_argv(&bad, None).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn exit_codes_match_the_drain_machine() {
        assert_eq!(EXIT_OK, ExitCode::Clean.code());
        assert_eq!(EXIT_FAILURE, ExitCode::Failed.code());
        assert_eq!(EXIT_USAGE, ExitCode::Usage.code());
        assert_eq!(EXIT_LOWER_FAILED, ExitCode::LowerFailed.code());
        assert_eq!(EXIT_INCOMPLETE, ExitCode::Incomplete.code());
    }

    #[test]
    fn dropin_names() {
        assert!(is_gcsfuse_dropin(OsStr::new("/gcsfuse")));
        assert!(is_gcsfuse_dropin(OsStr::new("gcsfuse")));
        assert!(!is_gcsfuse_dropin(OsStr::new("/usr/bin/drainfs")));
        assert!(!is_gcsfuse_dropin(OsStr::new("gcsfuse.real")));
    }
}

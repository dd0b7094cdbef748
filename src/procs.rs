//! Child processes and reaping.
//!
//! drainfs is often PID 1 in its container, so it reaps every child, including orphans
//! re-parented to it. All signals are blocked in every thread and consumed by one thread
//! ([`crate::signals`]); on SIGCHLD it calls [`reap`], which collects every exited child with
//! `waitpid(-1, WNOHANG)` and hands each status to whoever spawned that child through
//! [`spawn`]. Nothing else may call `waitpid` (std's `Child::wait`/`output` would race with the
//! reaper), which is why [`output`] exists.

use std::collections::HashMap;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use parking_lot::Mutex;
use tokio::sync::oneshot;

#[derive(Default)]
struct Table {
    waiting: HashMap<i32, oneshot::Sender<WaitStatus>>,
}

fn table() -> &'static Mutex<Table> {
    static T: OnceLock<Mutex<Table>> = OnceLock::new();
    T.get_or_init(Mutex::default)
}

/// Spawns `cmd` and registers it with the reaper; the receiver yields its exit status.
///
/// # Errors
/// The spawn error (command not found, permission denied).
pub fn spawn(cmd: &mut Command) -> std::io::Result<(Child, oneshot::Receiver<WaitStatus>)> {
    use std::os::unix::process::CommandExt;
    // drainfs runs with its handled signals blocked in every thread (see `signals`); a child
    // must not inherit that mask, or gcsfuse would never see the SIGINT that stops it.
    // SAFETY: sigprocmask is async-signal-safe; nothing is allocated between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
            libc::sigemptyset(set.as_mut_ptr());
            if libc::sigprocmask(libc::SIG_SETMASK, set.as_ptr(), std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut t = table().lock();
    let child = cmd.spawn()?;
    let (tx, rx) = oneshot::channel();
    t.waiting.insert(child.id() as i32, tx);
    Ok((child, rx))
}

/// Collects every exited child (called on SIGCHLD, and once at start for children that
/// exited before the signal thread ran). Statuses of children nobody waits for (orphans) are
/// logged and dropped.
pub fn reap() {
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(status) => {
                let Some(pid) = status.pid() else { continue };
                let tx = table().lock().waiting.remove(&pid.as_raw());
                match tx {
                    Some(tx) => {
                        let _ = tx.send(status);
                    }
                    None => tracing::debug!(pid = pid.as_raw(), ?status, "reaped an orphan"),
                }
            }
        }
    }
}

/// Like `Command::output`, but through the reaper, with a deadline after which the child is
/// killed.
///
/// # Errors
/// Spawn errors, or `TimedOut` when the deadline passed.
pub fn output(mut cmd: Command, timeout: Duration) -> std::io::Result<std::process::Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mut child, rx) = spawn(&mut cmd)?;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let out_t = std::thread::spawn(move || {
        let mut b = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.read_to_end(&mut b);
        }
        b
    });
    let mut err_b = Vec::new();
    if let Some(s) = stderr.as_mut() {
        let _ = s.read_to_end(&mut err_b);
    }
    let status = wait_blocking(rx, timeout);
    let out_b = out_t.join().unwrap_or_default();
    match status {
        Some(st) => Ok(std::process::Output {
            status: exit_status(st),
            stdout: out_b,
            stderr: err_b,
        }),
        None => {
            let _ = nix::sys::signal::kill(
                Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "helper process timed out",
            ))
        }
    }
}

fn wait_blocking(mut rx: oneshot::Receiver<WaitStatus>, timeout: Duration) -> Option<WaitStatus> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        match rx.try_recv() {
            Ok(s) => return Some(s),
            Err(oneshot::error::TryRecvError::Closed) => return None,
            Err(oneshot::error::TryRecvError::Empty) => {
                if std::time::Instant::now() >= deadline {
                    return None;
                }
                // The reaper runs on its own thread; SIGCHLD may also be pending before it has
                // started, so reap here too.
                reap();
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Converts a wait status into `std::process::ExitStatus`.
pub fn exit_status(st: WaitStatus) -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    match st {
        WaitStatus::Exited(_, code) => std::process::ExitStatus::from_raw((code & 0xff) << 8),
        WaitStatus::Signaled(_, sig, _) => std::process::ExitStatus::from_raw(sig as i32),
        _ => std::process::ExitStatus::from_raw(0),
    }
}

/// A human and JSON-friendly description of a wait status: `exit 0`, `signal SIGKILL`.
pub fn describe(st: &WaitStatus) -> String {
    match st {
        WaitStatus::Exited(_, code) => format!("exit {code}"),
        WaitStatus::Signaled(_, sig, core) => {
            format!(
                "signal {}{}",
                sig.as_str(),
                if *core { " (core dumped)" } else { "" }
            )
        }
        other => format!("{other:?}"),
    }
}

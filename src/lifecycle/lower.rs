//! The lower's process as drainfs holds it ([`Lower`]): spawned from `-- COMMAND` (its own
//! process group, its stderr's tail kept for errors), adopted (`--lower-pid`, followed through
//! a pidfd), or the relay's daemon (spawned by [`crate::relay::run`]); its exit status, which
//! any number of bounded waits can watch; and what counts as a clean stop ([`clean_stop`]).
//! The executor's steps that start, stop and judge it are in [`super::supervise`].

use std::ffi::OsString;
use std::future::Future;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;

use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};

use crate::{mount, procs, triggers};

/// The lower's process as supervised: its exit status arrives on a watch channel (from the
/// reaper, or from a pidfd for an adopted pid), so any number of waits can be bounded and
/// cancelled without owning the receiver.
pub(super) struct Lower {
    pub(super) pid: Option<i32>,
    pub(super) spawned: bool,
    status: watch::Receiver<Option<WaitStatus>>,
    /// Keeps the channel open for a lower nobody reports on (adopted without a pid).
    _status_tx: Option<watch::Sender<Option<WaitStatus>>>,
    stderr_tail: Arc<Mutex<std::collections::VecDeque<String>>>,
    /// The lower's FUSE mount (its mountinfo line: ID, device number, mount point): the only
    /// lower mount drainfs may remove.
    pub(super) mount: Option<mount::MountInfo>,
    /// The connection behind [`Lower::mount`], taken when the mount was seen: the only
    /// connection drainfs may abort by number.
    pub(super) connection: Option<mount::Connection>,
}

impl Lower {
    /// Nothing supervised.
    pub(super) fn unsupervised() -> Self {
        let (tx, rx) = watch::channel(None);
        Lower {
            pid: None,
            spawned: false,
            status: rx,
            _status_tx: Some(tx),
            stderr_tail: Arc::default(),
            mount: None,
            connection: None,
        }
    }

    /// An adopted process: its exit is seen through a pidfd (status unknown: reported as
    /// `exit 0`).
    pub(super) fn adopted(pid: Option<i32>) -> Self {
        let Some(pid) = pid else {
            return Self::unsupervised();
        };
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            triggers::wait_pid_exit(pid).await;
            let _ = tx.send(Some(WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0)));
        });
        Lower {
            pid: Some(pid),
            spawned: false,
            status: rx,
            _status_tx: None,
            stderr_tail: Arc::default(),
            mount: None,
            connection: None,
        }
    }

    /// A process spawned elsewhere (the relay's daemon), whose exit status the reaper
    /// delivers on `exit`.
    pub(super) fn spawned(pid: i32, exit: oneshot::Receiver<WaitStatus>) -> Self {
        Lower {
            pid: Some(pid),
            spawned: true,
            status: status_watch(exit),
            _status_tx: None,
            stderr_tail: Arc::default(),
            mount: None,
            connection: None,
        }
    }

    /// Its exit status, once it exited.
    pub(super) fn exited(&self) -> Option<WaitStatus> {
        *self.status.borrow()
    }

    /// Resolves with the exit status (never, for an unsupervised lower).
    pub(super) fn wait(&self) -> impl Future<Output = WaitStatus> + Send + 'static {
        let mut rx = self.status.clone();
        async move {
            loop {
                if let Some(st) = *rx.borrow_and_update() {
                    return st;
                }
                if rx.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        }
    }

    /// Whether a process is supervised (a pid to signal and wait for).
    pub(super) fn watched(&self) -> bool {
        self.pid.is_some()
    }

    /// The last lines (up to 20) of its stderr, newline-separated.
    pub(super) fn tail(&self) -> String {
        self.stderr_tail
            .lock()
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Starts `argv` as the lower's process: stdin null, stdout inherited, stderr copied to
/// drainfs's stderr with its last 20 lines kept.
///
/// # Errors
/// The error of spawning it (or of starting the stderr thread).
pub(super) fn spawn_lower(argv: &[OsString]) -> std::io::Result<Lower> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped());
    // Its own process group: a Ctrl-C on drainfs's terminal must not reach gcsfuse, which
    // would unmount itself under a drain in progress. drainfs signals it when it is time.
    cmd.process_group(0);
    let (mut child, exit) = procs::spawn(&mut cmd)?;
    let tail = Arc::new(Mutex::new(std::collections::VecDeque::with_capacity(20)));
    if let Some(stderr) = child.stderr.take() {
        let tail = Arc::clone(&tail);
        std::thread::Builder::new()
            .name("lower-stderr".into())
            .spawn(move || {
                use std::io::{BufRead, Write};
                let reader = std::io::BufReader::new(stderr);
                for line in reader.lines() {
                    let Ok(line) = line else { break };
                    let _ = writeln!(std::io::stderr(), "{line}");
                    let mut t = tail.lock();
                    if t.len() == 20 {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            })?;
    }
    Ok(Lower {
        pid: Some(child.id() as i32),
        spawned: true,
        status: status_watch(exit),
        _status_tx: None,
        stderr_tail: tail,
        mount: None,
        connection: None,
    })
}

/// A watch channel that receives the exit status the reaper sends on `exit`.
fn status_watch(exit: oneshot::Receiver<WaitStatus>) -> watch::Receiver<Option<WaitStatus>> {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        if let Ok(st) = exit.await {
            let _ = tx.send(Some(st));
        }
    });
    rx
}

/// Whether a wait status is a clean stop after `sent` was sent: exit 0, exit 128+sent (as
/// rclone's 130 after SIGINT), or death by `sent` itself.
pub fn clean_stop(st: &WaitStatus, sent: Signal) -> bool {
    match st {
        WaitStatus::Exited(_, code) => *code == 0 || *code == 128 + sent as i32,
        WaitStatus::Signaled(_, sig, _) => *sig == sent,
        _ => false,
    }
}

//! `fake-node-driver` (see `src/bin/fake-node-driver.rs`) as a harness process: the CSI node
//! driver that mounts with `fd=N` and starts an unprivileged sidecar, in both of its modes.
//! [`crate::relay::Sidecar`] (a daemon on `/dev/fd/3`, directly or behind `drainfs relay`) and
//! [`crate::csi::CsiSidecar`] (GKE's real sidecar mounter) are thin layers over
//! [`NodeDriver`]: it spawns the driver, waits for its `ready` line, records the PIDs below
//! it, stops it, reads its `sidecar exit: ...` line into a [`DriverEnding`], and on drop stops
//! it, kills what is left by PID and detaches the mount.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::{bin, test_log};
use crate::mounts::{force_unmount, is_mounted};
use crate::process::{Proc, child_chain, kill_leftovers, pid_exists};
use crate::wait::{wait_for, wait_until};

/// The uid and gid the sidecar runs as (the CSI sidecar's `nobody`).
pub const SIDECAR_UID: u32 = 65534;

/// Makes `path` a directory owned by the sidecar's uid.
pub fn sidecar_dir(path: &Path) {
    std::fs::create_dir_all(path).unwrap();
    nix::unistd::chown(
        path,
        Some(nix::unistd::Uid::from_raw(SIDECAR_UID)),
        Some(nix::unistd::Gid::from_raw(SIDECAR_UID)),
    )
    .unwrap();
}

/// How the sidecar ended, from `fake-node-driver`'s exit status and stdout.
#[derive(Debug, Clone)]
pub struct DriverEnding {
    /// `fake-node-driver`'s own exit status (0 iff the sidecar exited 0).
    pub status: ExitStatus,
    /// The sidecar's exit code, when it exited normally.
    pub code: Option<i32>,
    /// The signal that killed the sidecar (`SIGKILL`...), when one did.
    pub signal: Option<String>,
    /// Milliseconds from the stop to the sidecar's exit; `None` when it exited before any.
    pub ms_after_stop: Option<u64>,
    /// Whether the driver had to SIGKILL the sidecar (it printed `sigkill sent`).
    pub sigkill_sent: bool,
    /// Everything the driver printed on stdout.
    pub lines: Vec<String>,
}

/// The ending as a readable string, for assertion messages.
impl std::fmt::Display for DriverEnding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sidecar code {:?} signal {:?}, {:?} ms after the stop, sigkill sent: {}",
            self.code, self.signal, self.ms_after_stop, self.sigkill_sent
        )
    }
}

/// Parses `sidecar exit: <code|signal NAME> after <ms> ms` into the code, the signal and the
/// milliseconds (`None` for `-1`).
///
/// # Panics
/// On any other line.
pub fn parse_exit_line(line: &str) -> (Option<i32>, Option<String>, Option<u64>) {
    let bad = || -> ! { panic!("bad status line {line:?}") };
    let rest = line.strip_prefix("sidecar exit: ").unwrap_or_else(|| bad());
    let (what, ms) = rest.rsplit_once(" after ").unwrap_or_else(|| bad());
    let ms: i64 = ms.trim_end_matches(" ms").parse().unwrap_or_else(|_| bad());
    let (code, signal) = match what.strip_prefix("signal ") {
        Some(sig) => (None, Some(sig.to_string())),
        None => (Some(what.parse().unwrap_or_else(|_| bad())), None),
    };
    (code, signal, u64::try_from(ms).ok())
}

/// A running `fake-node-driver` and what was seen below it.
pub struct NodeDriver {
    /// The driver process (stdin kept open: closing it also stops the sidecar).
    pub proc: Proc,
    /// The mount point it mounted.
    mnt: PathBuf,
    /// How long the drop gives the driver to stop the sidecar after its SIGTERM.
    grace: Duration,
    /// PIDs below the driver, top first (see [`NodeDriver::note_chain`]).
    pids: Vec<i32>,
    ended: Option<DriverEnding>,
}

impl NodeDriver {
    /// `fake-node-driver --mountpoint MNT --uid 65534 --gid 65534`, with `RUST_LOG` set;
    /// the caller adds its mode's arguments and `-- SIDECAR...`.
    pub fn command(mnt: &Path) -> Command {
        let mut cmd = Command::new(bin("fake-node-driver"));
        cmd.arg("--mountpoint")
            .arg(mnt)
            .arg("--uid")
            .arg(SIDECAR_UID.to_string())
            .arg("--gid")
            .arg(SIDECAR_UID.to_string())
            .env("RUST_LOG", test_log());
        cmd
    }

    /// Spawns `cmd` (from [`NodeDriver::command`]) for the mount at `mnt`, its stdout echoed
    /// after `label`; the drop allows it `grace` to stop the sidecar.
    pub fn spawn(cmd: Command, mnt: &Path, label: &'static str, grace: Duration) -> NodeDriver {
        crate::bound::own_dir(mnt);
        NodeDriver {
            proc: Proc::spawn_piped(cmd, label),
            mnt: mnt.to_path_buf(),
            grace,
            pids: Vec::new(),
            ended: None,
        }
    }

    /// Waits up to `timeout` for the driver's `ready` line (the mount answers).
    ///
    /// # Panics
    /// If it does not come (or the driver exits first), with everything on stderr.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let ok = self.proc.wait_stdout_line("ready", timeout);
        assert!(
            ok,
            "the mount did not become ready:\n{}",
            self.stderr_text()
        );
    }

    /// Records the chain of first children below the driver, `depth` deep (the sidecar, its
    /// child...), for [`NodeDriver::pids`], [`NodeDriver::assert_gone`] and the drop.
    pub fn note_chain(&mut self, depth: usize) {
        self.pids = child_chain(self.proc.pid(), depth);
    }

    /// The PIDs recorded by [`NodeDriver::note_chain`], top first.
    pub fn pids(&self) -> &[i32] {
        &self.pids
    }

    /// Whether the driver printed exactly `line`.
    pub fn stdout_has(&self, line: &str) -> bool {
        self.proc.stdout_has(line)
    }

    /// Everything written on stderr so far (the driver's, the sidecar's, the daemon's).
    pub fn stderr_text(&self) -> String {
        self.proc.stderr_text()
    }

    /// Sends SIGTERM to the driver (which stops the sidecar its way) and waits up to
    /// `timeout` for the ending.
    pub fn stop(&mut self, timeout: Duration) -> DriverEnding {
        self.proc.signal(Signal::SIGTERM);
        self.wait(timeout)
    }

    /// Waits up to `timeout` for the driver to exit (without asking it to stop) and returns
    /// the ending.
    ///
    /// # Panics
    /// On timeout, or when the driver printed no status line.
    pub fn wait(&mut self, timeout: Duration) -> DriverEnding {
        if let Some(e) = &self.ended {
            return e.clone();
        }
        let status = self.proc.wait_exit(timeout, "fake-node-driver");
        // The stdout reader may lag behind the exit by a moment (longer on a loaded machine).
        let exit_line = |lines: &[String]| {
            lines
                .iter()
                .find(|l| l.starts_with("sidecar exit: "))
                .cloned()
        };
        let line = wait_for(Duration::from_secs(10), || {
            exit_line(&self.proc.stdout_lines())
        })
        .unwrap_or_else(|| {
            panic!(
                "fake-node-driver exited ({status}) without a status line:\n{}",
                self.stderr_text()
            )
        });
        let (code, signal, ms_after_stop) = parse_exit_line(&line);
        let lines = self.proc.stdout_lines();
        let ending = DriverEnding {
            status,
            code,
            signal,
            ms_after_stop,
            sigkill_sent: lines.iter().any(|l| l == "sigkill sent"),
            lines,
        };
        self.ended = Some(ending.clone());
        ending
    }

    /// Asserts that nothing is left: no mount at the mount point, and no process recorded
    /// by [`NodeDriver::note_chain`] (not even as a zombie; each gets 10 s: gone at once when
    /// idle, and only a loaded machine's late reaping needs more than milliseconds).
    pub fn assert_gone(&self) {
        assert!(
            !is_mounted(&self.mnt),
            "{} is still mounted",
            self.mnt.display()
        );
        for &pid in &self.pids {
            let gone = wait_until(Duration::from_secs(10), || !pid_exists(pid));
            assert!(
                gone,
                "process {pid} is still there: {:?} {:?}",
                crate::process::cmdline(pid),
                std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default()
            );
        }
    }

    /// Stops everything, also after a panic: closes the driver's stdin, SIGTERMs it (it stops
    /// the sidecar), SIGKILLs it after the grace period, SIGKILLs every recorded PID still
    /// there, and detaches the mount. Idempotent.
    pub fn shut_down(&mut self) {
        self.proc.close_stdin();
        self.proc.stop(&[
            (Signal::SIGTERM, self.grace),
            (Signal::SIGKILL, Duration::from_secs(5)),
        ]);
        kill_leftovers(&self.pids);
        force_unmount(&self.mnt);
    }
}

impl Drop for NodeDriver {
    fn drop(&mut self) {
        self.shut_down();
    }
}

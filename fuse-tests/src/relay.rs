//! The relay tests' harness: a FUSE daemon served the way GKE's CSI driver serves gcsfuse.
//!
//! [`Sidecar::start`] runs `fake-node-driver` (see `src/bin/fake-node-driver.rs`), which mounts
//! a fresh directory with `fd=N`, and hands the connection as fd 3 to an unprivileged sidecar
//! (uid 65534, no capabilities). The sidecar is either the daemon itself on the kernel fd
//! ([`Via::Direct`], how gcsfuse runs in GKE today) or `drainfs relay` in front of the daemon
//! ([`Via::Relay`], with the socket buffers forced to the kernel default `wmem_max`, 212992,
//! since this machine's larger value would hide message-size bugs).
//!
//! Dropping a [`Sidecar`] stops it as the CSI driver would (SIGTERM, SIGKILL 5 s later), then
//! kills whatever is left and detaches the mount, even when the test panicked.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::driver::{DriverEnding, NodeDriver};
pub use crate::driver::{SIDECAR_UID, sidecar_dir};
use crate::harness::{bin, scratch_dir};
pub use crate::process::{pid_exists, proc_status_field};
pub use crate::wait::{find_key, free_port};

/// The SO_SNDBUF the relay is told to request: the kernel's default `net.core.wmem_max`.
pub const SOCKET_BUFFER: u32 = 212_992;

/// Which FUSE daemon serves the connection.
#[derive(Clone, Debug)]
pub enum Daemon {
    /// `bucketfs --mountpoint /dev/fd/3` (the gcsfuse-like, flush-publishing test backend), with
    /// extra arguments (e.g. `--upload-delay 2s`).
    Bucketfs(Vec<String>),
    /// `fuse-overlayfs` (libfuse 3, Debian's package) over a lower and an upper directory.
    Overlay,
    /// Any daemon, run as this argv (which names `/dev/fd/3`), e.g. the real gcsfuse from
    /// [`crate::lowers::Server::mount_cmd`]. `store` and `lower` are unused.
    Command(Vec<String>),
}

/// How the daemon is connected to the kernel.
#[derive(Clone, Debug)]
pub enum Via {
    /// The daemon holds the kernel fd itself.
    Direct,
    /// `drainfs relay --socket-buffer 212992 --admin-addr ... [extra] -- DAEMON`.
    Relay(Vec<String>),
}

/// How a [`Sidecar`] ended, from `fake-node-driver`'s exit status and stdout
/// (`ms_after_stop` counts from the driver's SIGTERM to the sidecar).
pub type Ending = DriverEnding;

/// A daemon mounted through `fake-node-driver`, directly or behind the relay.
pub struct Sidecar {
    /// Scratch directory (mode 0755) holding everything below.
    pub dir: tempfile::TempDir,
    /// The mount point.
    pub mnt: PathBuf,
    /// bucketfs: the directory playing the bucket. Overlay: the upper directory.
    pub store: PathBuf,
    /// Overlay: the lower directory (read-only layer). bucketfs: unused (empty).
    pub lower: PathBuf,
    /// A directory owned by the sidecar's uid for its files (events, summary).
    pub var: PathBuf,
    /// bucketfs's `--events` log (in `var`).
    pub events: PathBuf,
    /// The relay's `--summary-file` (in `var`).
    pub summary: PathBuf,
    /// `http://127.0.0.1:PORT` of the relay's admin server, in relay mode.
    pub admin: Option<String>,
    /// The `fake-node-driver` process, and the PIDs below it.
    driver: NodeDriver,
}

/// `GET url` over plain HTTP/1.0 on loopback ([`crate::wait::http_get_from`], 5 s); returns
/// the status code and body.
///
/// # Errors
/// When the URL is not `http://IP:PORT/...`, or connecting, sending or reading fails.
pub fn http_get(url: &str) -> std::io::Result<(u16, String)> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| std::io::Error::other("not an http:// URL"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    crate::wait::http_get_from(host, &format!("/{path}"), Duration::from_secs(5))
        .map_err(std::io::Error::other)
}

/// The directories of one [`Sidecar`], created under a fresh scratch directory.
struct Layout {
    dir: tempfile::TempDir,
    mnt: PathBuf,
    store: PathBuf,
    lower: PathBuf,
    var: PathBuf,
}

impl Layout {
    /// `mnt` (root's), and `store`, `lower`, `var` owned by the sidecar's uid.
    fn new() -> Layout {
        let dir = scratch_dir("/tmp", "drainfs-relay-");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let [store, lower, var] = ["store", "lower", "var"].map(|d| dir.path().join(d));
        for d in [&store, &lower, &var] {
            sidecar_dir(d);
        }
        Layout {
            dir,
            mnt,
            store,
            lower,
            var,
        }
    }

    /// The daemon's argv, serving `/dev/fd/3`.
    fn daemon_argv(&self, daemon: &Daemon) -> Vec<String> {
        match daemon {
            Daemon::Bucketfs(extra) => {
                let mut v = vec![
                    bin("bucketfs").display().to_string(),
                    "--bucket".into(),
                    self.store.display().to_string(),
                    "--events".into(),
                    self.var.join("events.jsonl").display().to_string(),
                ];
                v.extend(extra.iter().cloned());
                v.extend(["--mountpoint".into(), "/dev/fd/3".into()]);
                v
            }
            Daemon::Command(argv) => argv.clone(),
            Daemon::Overlay => self.overlay_argv(),
        }
    }

    /// `fuse-overlayfs` over `lower` and `store` (the upper directory), squashed to the
    /// sidecar's uid.
    fn overlay_argv(&self) -> Vec<String> {
        let exe = "/usr/bin/fuse-overlayfs";
        assert!(
            Path::new(exe).exists(),
            "{exe} is missing: `apt-get install fuse-overlayfs` (scripts/test.sh does)"
        );
        let work = self.var.join("work");
        sidecar_dir(&work);
        vec![
            exe.into(),
            "-f".into(),
            "-o".into(),
            format!(
                "squash_to_uid={SIDECAR_UID},squash_to_gid={SIDECAR_UID},\
                 lowerdir={},upperdir={},workdir={}",
                self.lower.display(),
                self.store.display(),
                work.display()
            ),
            "/dev/fd/3".into(),
        ]
    }
}

/// The sidecar's argv for `daemon_argv` connected `via`, and the relay's admin URL.
fn sidecar_argv(
    via: &Via,
    daemon_argv: Vec<String>,
    summary: &Path,
) -> (Vec<String>, Option<String>) {
    let Via::Relay(extra) = via else {
        return (daemon_argv, None);
    };
    let port = free_port();
    let mut v = vec![
        bin("drainfs").display().to_string(),
        "relay".into(),
        "--socket-buffer".into(),
        SOCKET_BUFFER.to_string(),
        "--admin-addr".into(),
        format!("127.0.0.1:{port}"),
        "--summary-file".into(),
        summary.display().to_string(),
    ];
    v.extend(extra.iter().cloned());
    v.push("--".into());
    v.extend(daemon_argv);
    (v, Some(format!("http://127.0.0.1:{port}")))
}

impl Sidecar {
    /// Mounts a fresh directory with `daemon` behind `path` and waits (30 s at most) until the
    /// mount answers (`fake-node-driver` prints `ready`).
    ///
    /// # Panics
    /// If the mount does not become ready (with everything the processes wrote on stderr), or
    /// `fuse-overlayfs` is not installed (`scripts/test.sh` installs it).
    pub fn start(daemon: Daemon, via: Via) -> Sidecar {
        let mut s = Self::spawn(daemon, via);
        s.driver.wait_ready(Duration::from_secs(30));
        // The sidecar, and behind the relay the daemon.
        s.driver.note_chain(if s.admin.is_some() { 2 } else { 1 });
        s
    }

    /// Spawns `fake-node-driver` without waiting for the mount.
    pub fn spawn(daemon: Daemon, via: Via) -> Sidecar {
        let l = Layout::new();
        let summary = l.var.join("summary.json");
        let (argv, admin) = sidecar_argv(&via, l.daemon_argv(&daemon), &summary);
        let mut cmd = NodeDriver::command(&l.mnt);
        cmd.arg("--").args(&argv);
        let driver = NodeDriver::spawn(cmd, &l.mnt, "[driver]", Duration::from_secs(10));
        Sidecar {
            events: l.var.join("events.jsonl"),
            summary,
            admin,
            driver,
            dir: l.dir,
            mnt: l.mnt,
            store: l.store,
            lower: l.lower,
            var: l.var,
        }
    }

    /// PID of the sidecar (the relay, or the daemon itself on a direct connection).
    pub fn sidecar_pid(&self) -> i32 {
        *self.driver.pids().first().expect("no sidecar process seen")
    }

    /// PID of the daemon (the relay's child, or the sidecar itself on a direct connection).
    pub fn daemon_pid(&self) -> i32 {
        *self.driver.pids().last().expect("no daemon process seen")
    }

    /// Path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Whether `fake-node-driver` printed exactly `line`.
    pub fn stdout_has(&self, line: &str) -> bool {
        self.driver.stdout_has(line)
    }

    /// Whether `fake-node-driver` has printed its final `sidecar exit: ...` line.
    pub fn stdout_has_status(&self) -> bool {
        self.driver
            .proc
            .stdout_lines()
            .iter()
            .any(|l| l.starts_with("sidecar exit: "))
    }

    /// Everything written on stderr so far.
    pub fn stderr_text(&self) -> String {
        self.driver.stderr_text()
    }

    /// The relay's `/status` document.
    ///
    /// # Panics
    /// On a direct connection, or when the admin server does not answer 200 with JSON.
    pub fn status(&self) -> serde_json::Value {
        let base = self.admin.as_ref().expect("/status needs the relay");
        let (code, body) = http_get(&format!("{base}/status"))
            .unwrap_or_else(|e| panic!("GET {base}/status: {e}"));
        assert_eq!(code, 200, "GET /status: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/status is not JSON ({e}): {body}"))
    }

    /// Sends SIGTERM to `fake-node-driver` (which SIGTERMs the sidecar, SIGKILLs it 5 s later)
    /// and waits up to `timeout` for the ending.
    pub fn stop(&mut self, timeout: Duration) -> Ending {
        self.driver.stop(timeout)
    }

    /// Waits up to `timeout` for `fake-node-driver` to exit (without asking it to stop) and
    /// returns the ending.
    ///
    /// # Panics
    /// On timeout, or when the driver printed no status line.
    pub fn wait(&mut self, timeout: Duration) -> Ending {
        self.driver.wait(timeout)
    }

    /// Asserts that nothing is left: no mount at the mount point, and neither the sidecar nor
    /// the daemon exists any more (not even as a zombie).
    pub fn assert_nothing_left(&self) {
        self.driver.assert_gone();
    }
}

/// Stops it as the CSI driver would (SIGTERM, SIGKILL 5 s later), kills whatever is left and
/// detaches the mount, before the scratch directory goes.
impl Drop for Sidecar {
    fn drop(&mut self) {
        self.driver.shut_down();
    }
}

//! GKE's real sidecar mounter (gcs-fuse-csi-driver v1.24.4) in front of the real gcsfuse, for
//! tests: `fake-node-driver` in CSI mode plays the node driver and the kubelet's stop (see
//! `src/bin/fake-node-driver.rs`), the sidecar mounter runs unprivileged (uid 65534, no
//! capabilities) and execs either gcsfuse itself ([`Gcsfuse::Stock`]) or drainfs as the
//! gcsfuse drop-in (a symlink named `gcsfuse` to the drainfs binary, with
//! `DRAINFS_REAL_GCSFUSE` naming the real one and 212992-byte socket buffers): in its default
//! mode, the hand-off ([`Gcsfuse::DropIn`]), or as the relay ([`Gcsfuse::Relay`], chosen by
//! the volume's mount option `drainfs-mode=relay`, as a user would).
//!
//! Dropping a [`CsiSidecar`] stops it (SIGTERM to the driver, which stops the sidecar the way
//! it was told), kills whatever is left and detaches the mount, even when the test panicked.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use crate::driver::{DriverEnding, NodeDriver, sidecar_dir};
use crate::harness::{bin, scratch_dir};
use crate::lowers::{Server, require_installed};
use crate::relay::SOCKET_BUFFER;
use crate::wait::{free_port, read_json};

/// What the sidecar mounter's `--gcsfuse-path` names.
#[derive(Clone, Debug)]
pub enum Gcsfuse {
    /// The real gcsfuse (`/opt/drainfs-lowers/bin/gcsfuse`), as GKE runs it today.
    Stock,
    /// drainfs as the drop-in in the relay mode (the mount option `drainfs-mode=relay`), the
    /// real gcsfuse behind it; extra `DRAINFS_*` variables (e.g.
    /// `("DRAINFS_GRACE_PERIOD", "5s")`).
    Relay(Vec<(String, String)>),
    /// drainfs as the drop-in with no mode option (the hand-off, its default, unless the
    /// test's own mount options choose otherwise); extra `DRAINFS_*` variables.
    DropIn(Vec<(String, String)>),
}

impl Gcsfuse {
    /// Whether drainfs is the drop-in (the sidecar mounter's child is drainfs, gcsfuse below).
    pub fn is_dropin(&self) -> bool {
        !matches!(self, Gcsfuse::Stock)
    }
}

/// How the workload's end reaches the sidecar mounter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Native sidecar (`NATIVE_SIDECAR=TRUE`): SIGTERM.
    Native,
    /// Regular container: the exit file `<base>/exit`, polled every 5 s by the sidecar.
    ExitFile,
}

/// How a [`CsiSidecar`] ended, from `fake-node-driver`'s stdout.
#[derive(Debug, Clone)]
pub struct CsiEnding {
    /// `fake-node-driver`'s own exit status (0 iff the sidecar mounter exited 0).
    pub driver: ExitStatus,
    /// The sidecar mounter's exit code, when it exited normally.
    pub code: Option<i32>,
    /// The signal that killed the sidecar mounter, when one did.
    pub signal: Option<String>,
    /// Milliseconds from the stop (SIGTERM or exit file) to the sidecar mounter's exit;
    /// `None` when it exited before any stop.
    pub ms_after_stop: Option<u64>,
    /// Whether the driver had to SIGKILL the sidecar mounter (the grace period ran out).
    pub sigkill_sent: bool,
    /// What the sidecar mounter said about its child's end (`0`, `signal SIGKILL`,
    /// `exit status 75`, `context canceled`, `unknown`).
    pub gcsfuse_exit: String,
    /// The lines of the volume's error file (what the node driver turns into mount errors).
    pub error_lines: Vec<String>,
}

impl std::fmt::Display for CsiEnding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sidecar code {:?} signal {:?}, {:?} ms after the stop, sigkill sent: {}, \
             gcsfuse exit: {}, error file: {:?}",
            self.code,
            self.signal,
            self.ms_after_stop,
            self.sigkill_sent,
            self.gcsfuse_exit,
            self.error_lines
        )
    }
}

/// The real sidecar mounter serving a bucket of `server` on a fresh mount.
pub struct CsiSidecar {
    /// Scratch directory (mode 0755) holding everything below.
    pub dir: tempfile::TempDir,
    /// The mount point.
    pub mnt: PathBuf,
    /// The sidecar mounter's `--volume-base-path`.
    pub base: PathBuf,
    /// The volume's name (also its directory under `/gcsfuse-tmp/.volumes`).
    pub volume: String,
    /// drainfs's `--summary-file` (drop-in only).
    pub summary: PathBuf,
    /// `http://127.0.0.1:PORT` of drainfs's admin server (drop-in only).
    pub admin: Option<String>,
    /// The `fake-node-driver` process, and the PIDs below it.
    driver: NodeDriver,
}

/// The volume's mountOptions that point gcsfuse at `server` (REAL-PEERS.md §2.2 and §4.3),
/// plus `extra`.
pub fn mount_options(server: &Server, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        format!(
            "custom-endpoint=http://localhost:{}/storage/v1/",
            server.port
        ),
        "anonymous-access".into(),
        "enable-hns=false".into(),
        "enable-atomic-rename-object=false".into(),
        "disable-autoconfig".into(),
        "implicit-dirs".into(),
        "disable-metrics-for-gke:true".into(),
        "logging:format:text".into(),
        "logging:severity:info".into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// The installed sidecar mounter and real gcsfuse (`lowers.py paths`).
///
/// # Panics
/// When either is not installed.
fn installed_peers() -> (String, String) {
    require_installed(&[]);
    let paths: serde_json::Value = crate::lowers::lowers_py(&["paths"])
        .ok()
        .and_then(|j| serde_json::from_str(&j).ok())
        .expect("lowers.py paths");
    let path_of = |name: &str| {
        paths[name]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| panic!("{name} is not installed"))
    };
    (
        path_of("gcs-fuse-csi-driver-sidecar-mounter"),
        path_of("gcsfuse"),
    )
}

/// Where one [`CsiSidecar`]'s volume lives: the mount point, the `--volume-base-path` and the
/// volume's name.
struct Volume<'a> {
    mnt: &'a Path,
    base: &'a Path,
    name: &'a str,
}

/// `fake-node-driver` in CSI mode for `volume`, the bucket of `server`, stopped `stop`'s way,
/// with the volume's mountOptions.
fn csi_driver_command(
    volume: &Volume<'_>,
    server: &Server,
    stop: Stop,
    extra_options: &[&str],
) -> Command {
    let mut cmd = NodeDriver::command(volume.mnt);
    cmd.arg("--ready-timeout")
        .arg("30s")
        .arg("--volume-base-path")
        .arg(volume.base)
        .arg("--volume-name")
        .arg(volume.name)
        .arg("--bucket")
        .arg(&server.bucket)
        .arg("--stop")
        .arg(match stop {
            Stop::Native => "native",
            Stop::ExitFile => "exit-file",
        });
    for o in mount_options(server, extra_options) {
        cmd.arg(format!("--mount-option={o}"));
    }
    cmd
}

/// What `--gcsfuse-path` names for `gcsfuse`: the real one, or a `gcsfuse` symlink to drainfs
/// in `dir/dropin` with the `DRAINFS_*` environment (the real gcsfuse, 212992-byte socket
/// buffers, the summary file, an admin address) set on `cmd`; returns the path and the admin
/// URL (relay only).
fn gcsfuse_path(
    cmd: &mut Command,
    gcsfuse: &Gcsfuse,
    dir: &Path,
    real: &str,
    summary: &Path,
) -> (PathBuf, Option<String>) {
    let (Gcsfuse::Relay(env) | Gcsfuse::DropIn(env)) = gcsfuse else {
        return (PathBuf::from(real), None);
    };
    let dropin = dir.join("dropin");
    std::fs::create_dir(&dropin).unwrap();
    let link = dropin.join("gcsfuse");
    std::os::unix::fs::symlink(bin("drainfs"), &link).unwrap();
    let port = free_port();
    cmd.env("DRAINFS_REAL_GCSFUSE", real)
        .env("DRAINFS_SOCKET_BUFFER", SOCKET_BUFFER.to_string())
        .env("DRAINFS_SUMMARY_FILE", summary)
        .env("DRAINFS_ADMIN_ADDR", format!("127.0.0.1:{port}"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    (link, Some(format!("http://127.0.0.1:{port}")))
}

impl CsiSidecar {
    /// Mounts a fresh directory through the real sidecar mounter and waits (60 s at most)
    /// until the mount answers.
    ///
    /// # Panics
    /// If the real peers are not installed, or the mount does not become ready (with
    /// everything the processes wrote on stderr).
    pub fn start(server: &Server, gcsfuse: Gcsfuse, stop: Stop, extra_options: &[&str]) -> Self {
        let mut s = Self::spawn(server, gcsfuse.clone(), stop, extra_options);
        s.driver.wait_ready(Duration::from_secs(60));
        // The sidecar mounter, its child (gcsfuse or drainfs), and drainfs's child (gcsfuse).
        s.driver.note_chain(if gcsfuse.is_dropin() { 3 } else { 2 });
        s
    }

    /// Starts the driver and the sidecar mounter without waiting for the mount (for a mount
    /// that must fail: see [`CsiSidecar::error_file`]); no PID is noted below the driver.
    ///
    /// # Panics
    /// If the real peers are not installed.
    pub fn spawn(server: &Server, gcsfuse: Gcsfuse, stop: Stop, extra_options: &[&str]) -> Self {
        let (mounter, real) = installed_peers();
        let dir = scratch_dir("/tmp", "drainfs-csi-");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let base = dir.path().join("volumes");
        let var = dir.path().join("var");
        sidecar_dir(&var);
        let summary = var.join("summary.json");
        let volume = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let v = Volume {
            mnt: &mnt,
            base: &base,
            name: &volume,
        };
        let mut options: Vec<&str> = extra_options.to_vec();
        if matches!(gcsfuse, Gcsfuse::Relay(_)) {
            options.push("drainfs-mode=relay");
        }
        let mut cmd = csi_driver_command(&v, server, stop, &options);
        let (path, admin) = gcsfuse_path(&mut cmd, &gcsfuse, dir.path(), &real, &summary);
        cmd.arg("--")
            .arg(&mounter)
            .arg("--v=5")
            .arg(format!("--gcsfuse-path={}", path.display()));
        let driver = NodeDriver::spawn(cmd, &mnt, "[csi-driver]", Duration::from_secs(40));
        CsiSidecar {
            dir,
            mnt,
            base,
            volume,
            summary,
            admin,
            driver,
        }
    }

    /// The lines of the volume's error file so far (what the sidecar mounter copies of its
    /// child's stderr, and its own errors).
    pub fn error_file(&self) -> Vec<String> {
        std::fs::read_to_string(self.base.join(&self.volume).join("error"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// PID of the sidecar mounter.
    pub fn mounter_pid(&self) -> i32 {
        self.driver.pids()[0]
    }

    /// PID of the sidecar mounter's child: gcsfuse (stock) or drainfs (drop-in).
    pub fn child_pid(&self) -> i32 {
        *self
            .driver
            .pids()
            .get(1)
            .expect("no child of the sidecar mounter seen")
    }

    /// PID of the real gcsfuse.
    pub fn gcsfuse_pid(&self) -> i32 {
        *self.driver.pids().last().expect("no gcsfuse seen")
    }

    /// Path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Whether `fake-node-driver` printed exactly `line`.
    pub fn stdout_has(&self, line: &str) -> bool {
        self.driver.stdout_has(line)
    }

    /// Everything written on stderr so far (driver, sidecar mounter, drainfs, gcsfuse).
    pub fn stderr_text(&self) -> String {
        self.driver.stderr_text()
    }

    /// drainfs's summary (drop-in only).
    ///
    /// # Panics
    /// When it is missing or not JSON.
    pub fn summary(&self) -> serde_json::Value {
        read_json(&self.summary).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Stops the workload (SIGTERM to `fake-node-driver`, which sends the sidecar mounter
    /// SIGTERM or creates the exit file) and waits up to `timeout` for the ending.
    pub fn stop(&mut self, timeout: Duration) -> CsiEnding {
        self.driver.stop(timeout).into()
    }

    /// Waits up to `timeout` for `fake-node-driver` to exit and returns the ending.
    ///
    /// # Panics
    /// On timeout, or when the driver printed no status line.
    pub fn wait(&mut self, timeout: Duration) -> CsiEnding {
        self.driver.wait(timeout).into()
    }

    /// Asserts that nothing is left: no mount, no sidecar mounter, drainfs or gcsfuse process,
    /// and no directory of this volume under `/gcsfuse-tmp` or `/gcsfuse-buffer`.
    pub fn assert_nothing_left(&self) {
        self.driver.assert_gone();
        for p in self.volume_dirs() {
            assert!(!p.exists(), "{} is left behind", p.display());
        }
    }

    /// The sidecar mounter's directories of this volume outside the scratch directory.
    fn volume_dirs(&self) -> [PathBuf; 2] {
        ["/gcsfuse-tmp/.volumes", "/gcsfuse-buffer/.volumes"]
            .map(|d| Path::new(d).join(&self.volume))
    }
}

impl From<DriverEnding> for CsiEnding {
    fn from(e: DriverEnding) -> CsiEnding {
        CsiEnding {
            driver: e.status,
            code: e.code,
            signal: e.signal,
            ms_after_stop: e.ms_after_stop,
            sigkill_sent: e.sigkill_sent,
            gcsfuse_exit: e
                .lines
                .iter()
                .find_map(|l| l.strip_prefix("gcsfuse exit: "))
                .unwrap_or("")
                .to_string(),
            error_lines: e
                .lines
                .iter()
                .filter_map(|l| l.strip_prefix("error file: "))
                .map(str::to_string)
                .collect(),
        }
    }
}

/// Stops the driver (which stops the sidecar mounter the way it was told, 40 s at most), kills
/// whatever is left, detaches the mount and removes the volume's directories.
impl Drop for CsiSidecar {
    fn drop(&mut self) {
        self.driver.shut_down();
        for p in self.volume_dirs() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

//! GKE's real sidecar mounter (gcs-fuse-csi-driver v1.24.4) in front of the real gcsfuse, for
//! tests: `fake-node-driver` in CSI mode plays the node driver and the kubelet's stop (see
//! `src/bin/fake-node-driver.rs`), the sidecar mounter runs unprivileged (uid 65534, no
//! capabilities) and execs either gcsfuse itself ([`Gcsfuse::Stock`]) or drainfs as the
//! gcsfuse drop-in ([`Gcsfuse::Relay`]: a symlink named `gcsfuse` to the drainfs binary, with
//! `DRAINFS_REAL_GCSFUSE` naming the real one and 212992-byte socket buffers).
//!
//! Dropping a [`CsiSidecar`] stops it (SIGTERM to the driver, which stops the sidecar the way
//! it was told), kills whatever is left and detaches the mount, even when the test panicked.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::{bin, force_unmount, is_mounted, wait_until};
use crate::lowers::{Server, require_installed};
use crate::relay::{SIDECAR_UID, SOCKET_BUFFER, collect, first_child, free_port, pid_exists};

/// What the sidecar mounter's `--gcsfuse-path` names.
#[derive(Clone, Debug)]
pub enum Gcsfuse {
    /// The real gcsfuse (`/opt/drainfs-lowers/bin/gcsfuse`), as GKE runs it today.
    Stock,
    /// drainfs as the drop-in, the real gcsfuse behind it; extra `DRAINFS_*` variables (e.g.
    /// `("DRAINFS_GRACE_PERIOD", "5s")`).
    Relay(Vec<(String, String)>),
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
    /// drainfs's `--summary-file` (relay only).
    pub summary: PathBuf,
    /// `http://127.0.0.1:PORT` of drainfs's admin server (relay only).
    pub admin: Option<String>,
    driver: Child,
    stdin: Option<ChildStdin>,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    ended: Option<CsiEnding>,
    pids: Vec<i32>,
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

impl CsiSidecar {
    /// Mounts a fresh directory through the real sidecar mounter and waits (60 s at most)
    /// until the mount answers.
    ///
    /// # Panics
    /// If the real peers are not installed, or the mount does not become ready (with
    /// everything the processes wrote on stderr).
    pub fn start(server: &Server, gcsfuse: Gcsfuse, stop: Stop, extra_options: &[&str]) -> Self {
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
        let mounter = path_of("gcs-fuse-csi-driver-sidecar-mounter");
        let real = path_of("gcsfuse");
        let dir = tempfile::Builder::new()
            .prefix("drainfs-csi-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let base = dir.path().join("volumes");
        let var = dir.path().join("var");
        crate::relay::sidecar_dir(&var);
        let summary = var.join("summary.json");
        let volume = dir
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();

        let mut cmd = Command::new(bin("fake-node-driver"));
        cmd.arg("--mountpoint")
            .arg(&mnt)
            .arg("--uid")
            .arg(SIDECAR_UID.to_string())
            .arg("--gid")
            .arg(SIDECAR_UID.to_string())
            .arg("--ready-timeout")
            .arg("30s")
            .arg("--volume-base-path")
            .arg(&base)
            .arg("--volume-name")
            .arg(&volume)
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
        let mut admin = None;
        let gcsfuse_path = match &gcsfuse {
            Gcsfuse::Stock => PathBuf::from(&real),
            Gcsfuse::Relay(env) => {
                let dropin = dir.path().join("dropin");
                std::fs::create_dir(&dropin).unwrap();
                let link = dropin.join("gcsfuse");
                std::os::unix::fs::symlink(bin("drainfs"), &link).unwrap();
                let port = free_port();
                admin = Some(format!("http://127.0.0.1:{port}"));
                cmd.env("DRAINFS_REAL_GCSFUSE", &real)
                    .env("DRAINFS_SOCKET_BUFFER", SOCKET_BUFFER.to_string())
                    .env("DRAINFS_SUMMARY_FILE", &summary)
                    .env("DRAINFS_ADMIN_ADDR", format!("127.0.0.1:{port}"));
                for (k, v) in env {
                    cmd.env(k, v);
                }
                link
            }
        };
        cmd.arg("--")
            .arg(&mounter)
            .arg("--v=5")
            .arg(format!("--gcsfuse-path={}", gcsfuse_path.display()))
            .env(
                "RUST_LOG",
                std::env::var("DRAINFS_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut driver = cmd.spawn().expect("spawn fake-node-driver");
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        collect(
            driver.stdout.take().unwrap(),
            stdout.clone(),
            "[csi-driver]",
        );
        collect(driver.stderr.take().unwrap(), stderr.clone(), "|");
        let stdin = driver.stdin.take();
        let mut s = CsiSidecar {
            dir,
            mnt,
            base,
            volume,
            summary,
            admin,
            driver,
            stdin,
            stdout,
            stderr,
            ended: None,
            pids: Vec::new(),
        };
        let ok = wait_until(Duration::from_secs(60), || {
            s.stdout_has("ready") || s.driver.try_wait().ok().flatten().is_some()
        });
        assert!(
            ok && s.stdout_has("ready"),
            "the mount did not become ready:\n{}",
            s.stderr_text()
        );
        // The sidecar mounter, its child (gcsfuse or drainfs), and drainfs's child (gcsfuse).
        let mut pid = s.driver.id() as i32;
        for _ in 0..(if s.admin.is_some() { 3 } else { 2 }) {
            let mut next = None;
            wait_until(Duration::from_secs(5), || {
                next = first_child(pid);
                next.is_some()
            });
            let Some(n) = next else { break };
            s.pids.push(n);
            pid = n;
        }
        s
    }

    /// PID of the sidecar mounter.
    pub fn mounter_pid(&self) -> i32 {
        self.pids[0]
    }

    /// PID of the sidecar mounter's child: gcsfuse (stock) or drainfs (relay).
    pub fn child_pid(&self) -> i32 {
        *self
            .pids
            .get(1)
            .expect("no child of the sidecar mounter seen")
    }

    /// PID of the real gcsfuse.
    pub fn gcsfuse_pid(&self) -> i32 {
        *self.pids.last().expect("no gcsfuse seen")
    }

    /// Path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Whether `fake-node-driver` printed exactly `line`.
    pub fn stdout_has(&self, line: &str) -> bool {
        self.stdout.lock().unwrap().iter().any(|l| l == line)
    }

    /// Everything written on stderr so far (driver, sidecar mounter, drainfs, gcsfuse).
    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// drainfs's summary (relay only).
    ///
    /// # Panics
    /// When it is missing or not JSON.
    pub fn summary(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(&self.summary)
            .unwrap_or_else(|e| panic!("{}: {e}", self.summary.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("summary is not JSON ({e}): {text}"))
    }

    /// Stops the workload (SIGTERM to `fake-node-driver`, which sends the sidecar mounter
    /// SIGTERM or creates the exit file) and waits up to `timeout` for the ending.
    pub fn stop(&mut self, timeout: Duration) -> CsiEnding {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.driver.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.wait(timeout)
    }

    /// Waits up to `timeout` for `fake-node-driver` to exit and returns the ending.
    ///
    /// # Panics
    /// On timeout, or when the driver printed no status line.
    pub fn wait(&mut self, timeout: Duration) -> CsiEnding {
        if let Some(e) = &self.ended {
            return e.clone();
        }
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(st) = self.driver.try_wait().expect("try_wait") {
                break st;
            }
            assert!(
                Instant::now() < deadline,
                "fake-node-driver did not exit within {timeout:?}:\n{}",
                self.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        wait_until(Duration::from_secs(2), || {
            self.stdout
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.starts_with("sidecar exit: "))
        });
        let lines = self.stdout.lock().unwrap().clone();
        let last = lines
            .iter()
            .find(|l| l.starts_with("sidecar exit: "))
            .unwrap_or_else(|| {
                panic!(
                    "fake-node-driver exited ({status}) without a status line:\n{}",
                    self.stderr_text()
                )
            });
        let rest = last.strip_prefix("sidecar exit: ").unwrap();
        let (what, ms) = rest.rsplit_once(" after ").expect("status line");
        let ms: i64 = ms.trim_end_matches(" ms").parse().expect("status line ms");
        let (code, signal) = match what.strip_prefix("signal ") {
            Some(sig) => (None, Some(sig.to_string())),
            None => (Some(what.parse().expect("status line code")), None),
        };
        let ending = CsiEnding {
            driver: status,
            code,
            signal,
            ms_after_stop: u64::try_from(ms).ok(),
            sigkill_sent: lines.iter().any(|l| l == "sigkill sent"),
            gcsfuse_exit: lines
                .iter()
                .find_map(|l| l.strip_prefix("gcsfuse exit: "))
                .unwrap_or("")
                .to_string(),
            error_lines: lines
                .iter()
                .filter_map(|l| l.strip_prefix("error file: "))
                .map(str::to_string)
                .collect(),
        };
        self.ended = Some(ending.clone());
        ending
    }

    /// Asserts that nothing is left: no mount, no sidecar mounter, drainfs or gcsfuse process,
    /// and no directory of this volume under `/gcsfuse-tmp` or `/gcsfuse-buffer`.
    pub fn assert_nothing_left(&self) {
        assert!(
            !is_mounted(&self.mnt),
            "{} is still mounted",
            self.mnt.display()
        );
        for &pid in &self.pids {
            let gone = wait_until(Duration::from_secs(2), || !pid_exists(pid));
            assert!(
                gone,
                "process {pid} is still there: {:?}",
                std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default()
            );
        }
        for d in ["/gcsfuse-tmp/.volumes", "/gcsfuse-buffer/.volumes"] {
            let p = Path::new(d).join(&self.volume);
            assert!(!p.exists(), "{} is left behind", p.display());
        }
    }
}

impl Drop for CsiSidecar {
    fn drop(&mut self) {
        if let Some(mut i) = self.stdin.take() {
            let _ = i.flush();
        }
        if self.ended.is_none() && self.driver.try_wait().ok().flatten().is_none() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.driver.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            if !wait_until(Duration::from_secs(40), || {
                self.driver.try_wait().ok().flatten().is_some()
            }) {
                let _ = self.driver.kill();
                let _ = self.driver.wait();
            }
        }
        for &pid in &self.pids {
            if pid_exists(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        force_unmount(&self.mnt);
        let _ = std::fs::remove_dir_all(Path::new("/gcsfuse-tmp/.volumes").join(&self.volume));
        let _ = std::fs::remove_dir_all(Path::new("/gcsfuse-buffer/.volumes").join(&self.volume));
    }
}

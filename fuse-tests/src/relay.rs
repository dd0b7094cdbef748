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

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::{bin, force_unmount, is_mounted, wait_until};

/// The uid and gid the sidecar runs as (the CSI sidecar's `nobody`).
pub const SIDECAR_UID: u32 = 65534;

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

/// How a [`Sidecar`] ended, from `fake-node-driver`'s exit status and stdout.
#[derive(Debug, Clone)]
pub struct Ending {
    /// `fake-node-driver`'s own exit status (0 iff the sidecar exited 0).
    pub driver: ExitStatus,
    /// The sidecar's exit code, when it exited normally.
    pub code: Option<i32>,
    /// The signal that killed the sidecar (`SIGKILL`...), when one did.
    pub signal: Option<String>,
    /// Milliseconds from the SIGTERM to the sidecar's exit; `None` when the sidecar exited
    /// before any stop.
    pub ms_after_sigterm: Option<u64>,
    /// Whether the driver had to SIGKILL the sidecar.
    pub sigkill_sent: bool,
}

/// The sidecar's ending as a readable string, for assertion messages.
impl std::fmt::Display for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sidecar code {:?} signal {:?}, {:?} ms after SIGTERM, sigkill sent: {}",
            self.code, self.signal, self.ms_after_sigterm, self.sigkill_sent
        )
    }
}

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
    /// The `fake-node-driver` process.
    driver: Child,
    /// Its stdin, kept open: closing it also stops the sidecar.
    stdin: Option<ChildStdin>,
    /// Its stdout lines so far.
    stdout: Arc<Mutex<Vec<String>>>,
    /// Its stderr lines (and the sidecar's, and the daemon's) so far.
    stderr: Arc<Mutex<Vec<String>>>,
    /// The driver's exit status, once reaped.
    ended: Option<Ending>,
    /// PIDs seen: the sidecar (relay or daemon) and the daemon.
    pids: Vec<i32>,
}

/// Spawns a thread that appends every line of `r` to `sink` (and echoes it when `echo`).
pub fn collect(r: impl Read + Send + 'static, sink: Arc<Mutex<Vec<String>>>, echo: &'static str) {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            eprintln!("    {echo} {line}");
            sink.lock().unwrap().push(line);
        }
    });
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

/// Makes `path` a directory owned by the sidecar's uid.
pub fn sidecar_dir(path: &std::path::Path) {
    std::fs::create_dir_all(path).unwrap();
    nix::unistd::chown(
        path,
        Some(nix::unistd::Uid::from_raw(SIDECAR_UID)),
        Some(nix::unistd::Gid::from_raw(SIDECAR_UID)),
    )
    .unwrap();
}

/// The first child PID of `pid` (any thread), if it has one.
pub fn first_child(pid: i32) -> Option<i32> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        if let Some(c) = children.split_whitespace().next() {
            return c.parse().ok();
        }
    }
    None
}

/// Whether a process `pid` exists (running or zombie).
pub fn pid_exists(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// A field of `/proc/PID/status` (e.g. `Uid`, `CapEff`), trimmed.
pub fn proc_status_field(pid: i32, field: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_string())
    })
}

/// `GET url` over plain HTTP/1.0 on loopback; returns the status code and body.
pub fn http_get(url: &str) -> std::io::Result<(u16, String)> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| std::io::Error::other("not an http:// URL"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut s = std::net::TcpStream::connect(host)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((code, body.to_string()))
}

/// Finds the first value under key `key` anywhere in `v` (depth first).
pub fn find_key<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    match v {
        serde_json::Value::Object(map) => map
            .get(key)
            .or_else(|| map.values().find_map(|x| find_key(x, key))),
        serde_json::Value::Array(a) => a.iter().find_map(|x| find_key(x, key)),
        _ => None,
    }
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
        let ok = wait_until(Duration::from_secs(30), || {
            s.stdout_has("ready") || s.driver.try_wait().ok().flatten().is_some()
        });
        assert!(
            ok && s.stdout_has("ready"),
            "the mount did not become ready:\n{}",
            s.stderr_text()
        );
        s.note_pids();
        s
    }

    /// Spawns `fake-node-driver` without waiting for the mount.
    pub fn spawn(daemon: Daemon, via: Via) -> Sidecar {
        let dir = tempfile::Builder::new()
            .prefix("drainfs-relay-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let store = dir.path().join("store");
        let lower = dir.path().join("lower");
        let var = dir.path().join("var");
        for d in [&store, &lower, &var] {
            sidecar_dir(d);
        }
        let events = var.join("events.jsonl");
        let summary = var.join("summary.json");

        let daemon_cmd: Vec<String> = match &daemon {
            Daemon::Bucketfs(extra) => {
                let mut v = vec![
                    bin("bucketfs").display().to_string(),
                    "--bucket".into(),
                    store.display().to_string(),
                    "--events".into(),
                    events.display().to_string(),
                ];
                v.extend(extra.iter().cloned());
                v.extend(["--mountpoint".into(), "/dev/fd/3".into()]);
                v
            }
            Daemon::Command(argv) => argv.clone(),
            Daemon::Overlay => {
                let exe = "/usr/bin/fuse-overlayfs";
                assert!(
                    std::path::Path::new(exe).exists(),
                    "{exe} is missing: `apt-get install fuse-overlayfs` (scripts/test.sh does)"
                );
                let work = var.join("work");
                sidecar_dir(&work);
                vec![
                    exe.into(),
                    "-f".into(),
                    "-o".into(),
                    format!(
                        "squash_to_uid={SIDECAR_UID},squash_to_gid={SIDECAR_UID},\
                         lowerdir={},upperdir={},workdir={}",
                        lower.display(),
                        store.display(),
                        work.display()
                    ),
                    "/dev/fd/3".into(),
                ]
            }
        };
        let (sidecar_cmd, admin) = match &via {
            Via::Direct => (daemon_cmd, None),
            Via::Relay(extra) => {
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
                v.extend(daemon_cmd);
                (v, Some(format!("http://127.0.0.1:{port}")))
            }
        };

        let mut cmd = Command::new(bin("fake-node-driver"));
        cmd.arg("--mountpoint")
            .arg(&mnt)
            .arg("--uid")
            .arg(SIDECAR_UID.to_string())
            .arg("--gid")
            .arg(SIDECAR_UID.to_string())
            .arg("--")
            .args(&sidecar_cmd)
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
        collect(driver.stdout.take().unwrap(), stdout.clone(), "[driver]");
        collect(driver.stderr.take().unwrap(), stderr.clone(), "|");
        let stdin = driver.stdin.take();
        Sidecar {
            dir,
            mnt,
            store,
            lower,
            var,
            events,
            summary,
            admin,
            driver,
            stdin,
            stdout,
            stderr,
            ended: None,
            pids: Vec::new(),
        }
    }

    /// Records the sidecar's and the daemon's PIDs (for [`Sidecar::assert_nothing_left`]).
    fn note_pids(&mut self) {
        let driver = self.driver.id() as i32;
        let mut sidecar = None;
        wait_until(Duration::from_secs(5), || {
            sidecar = first_child(driver);
            sidecar.is_some()
        });
        let Some(sidecar) = sidecar else { return };
        self.pids = vec![sidecar];
        if self.admin.is_some() {
            let mut daemon = None;
            wait_until(Duration::from_secs(5), || {
                daemon = first_child(sidecar);
                daemon.is_some()
            });
            self.pids.extend(daemon);
        }
    }

    /// PID of the sidecar (the relay, or the daemon itself on a direct connection).
    pub fn sidecar_pid(&self) -> i32 {
        *self.pids.first().expect("no sidecar process seen")
    }

    /// PID of the daemon (the relay's child, or the sidecar itself on a direct connection).
    pub fn daemon_pid(&self) -> i32 {
        *self.pids.last().expect("no daemon process seen")
    }

    /// Path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Whether `fake-node-driver` printed exactly `line`.
    pub fn stdout_has(&self, line: &str) -> bool {
        self.stdout.lock().unwrap().iter().any(|l| l == line)
    }

    /// Whether `fake-node-driver` has printed its final `sidecar exit: ...` line.
    pub fn stdout_has_status(&self) -> bool {
        self.stdout
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.starts_with("sidecar exit: "))
    }

    /// Everything written on stderr so far.
    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
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
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.driver.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.wait(timeout)
    }

    /// Waits up to `timeout` for `fake-node-driver` to exit (without asking it to stop) and
    /// returns the ending.
    ///
    /// # Panics
    /// On timeout, or when the driver printed no status line.
    pub fn wait(&mut self, timeout: Duration) -> Ending {
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
        // The stdout reader may lag behind the exit by a moment.
        let mut line = None;
        wait_until(Duration::from_secs(2), || {
            line = self
                .stdout
                .lock()
                .unwrap()
                .iter()
                .find(|l| l.starts_with("sidecar exit: "))
                .cloned();
            line.is_some()
        });
        let line = line.unwrap_or_else(|| {
            panic!(
                "fake-node-driver exited ({status}) without a status line:\n{}",
                self.stderr_text()
            )
        });
        let ending = parse_ending(status, &line, self.stdout_has("sigkill sent"));
        self.ended = Some(ending.clone());
        ending
    }

    /// Asserts that nothing is left: no mount at the mount point, and neither the sidecar nor
    /// the daemon exists any more (not even as a zombie).
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
                std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default()
            );
        }
    }
}

/// Parses `sidecar exit: <code|signal NAME> after <ms> ms`.
fn parse_ending(driver: ExitStatus, line: &str, sigkill_sent: bool) -> Ending {
    let rest = line.strip_prefix("sidecar exit: ").unwrap();
    let (what, ms) = rest
        .rsplit_once(" after ")
        .unwrap_or_else(|| panic!("bad status line {line:?}"));
    let ms: i64 = ms
        .trim_end_matches(" ms")
        .parse()
        .unwrap_or_else(|_| panic!("bad status line {line:?}"));
    let (code, signal) = match what.strip_prefix("signal ") {
        Some(sig) => (None, Some(sig.to_string())),
        None => (
            Some(
                what.parse()
                    .unwrap_or_else(|_| panic!("bad status line {line:?}")),
            ),
            None,
        ),
    };
    Ending {
        driver,
        code,
        signal,
        ms_after_sigterm: u64::try_from(ms).ok(),
        sigkill_sent,
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if self.ended.is_none() && self.driver.try_wait().ok().flatten().is_none() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.driver.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            if !wait_until(Duration::from_secs(10), || {
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
    }
}

//! The real lowers (FUSE clients of object stores), for tests: an object-store server on loopback and the FUSE
//! client of it that drainfs is mounted over, driven through `scripts/lowers.py`.
//!
//! - [`Kind::Gcsfuse`]: fake-gcs-server + the real gcsfuse v3.11.2 (the primary peer): streaming
//!   writes upload blocks during write() and the object is finalized inside close().
//! - [`Kind::Gcs`]: fake-gcs-server + `rclone mount` (GCS backend, `--vfs-cache-mode off`), the
//!   gcsfuse stand-in: data streams during write() and the object is finalized inside close().
//! - [`Kind::S3`]: moto_server + s3fs: writes are staged locally and uploaded inside close().
//!
//! `scripts/LOWERS-NOTES.md` describes how each behaves. The binaries come from
//! `scripts/install-lowers.sh`; when they are missing, [`require_installed`] panics with a
//! message saying so (tests never skip silently). Objects are always read back from the server
//! ([`Server::objects`]), never through a mount.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::process::pid_alive;

/// Which pair of server and FUSE client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// fake-gcs-server + the real gcsfuse.
    Gcsfuse,
    /// fake-gcs-server + rclone mount (the gcsfuse stand-in).
    Gcs,
    /// moto_server + s3fs.
    S3,
}

impl Kind {
    /// The name `lowers.py` uses (`gcsfuse`, `gcs`, `s3`).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Gcsfuse => "gcsfuse",
            Kind::Gcs => "gcs",
            Kind::S3 => "s3",
        }
    }

    /// The FUSE client's file system type in `/proc/self/mountinfo`.
    pub fn fstype(self) -> &'static str {
        match self {
            Kind::Gcsfuse => "fuse.gcsfuse",
            Kind::Gcs => "fuse.rclone",
            Kind::S3 => "fuse.s3fs",
        }
    }
}

/// An object as the server has it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Object {
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the content, lowercase hex.
    pub sha256: String,
}

/// The repository's `scripts/` directory.
pub fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("fuse-tests lives in the workspace")
        .join("scripts")
}

const INSTALL_HINT: &str =
    "run `sudo bash scripts/install-lowers.sh` (the README's test command, scripts/test.sh, does)";

/// Runs `python3 scripts/lowers.py ARGS` and returns its stdout (one JSON document), or a
/// message with its stderr.
pub fn lowers_py(args: &[&str]) -> Result<String, String> {
    let script = scripts_dir().join("lowers.py");
    let out = Command::new("python3")
        .arg(&script)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run python3 {}: {e}", script.display()))?;
    if !out.status.success() {
        return Err(format!(
            "lowers.py {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("lowers.py {}: {e}", args.join(" ")))
}

/// Panics, with a message naming what is missing and how to install it, unless every real
/// lower (gcsfuse, rclone, fake-gcs-server, moto_server, s3fs, fusermount3, the GKE sidecar
/// mounter) and `tools` are installed.
/// The check runs once per test process.
pub fn require_installed(tools: &[&str]) {
    static LOWERS: OnceLock<Result<(), String>> = OnceLock::new();
    let r = LOWERS.get_or_init(|| {
        let json = lowers_py(&["paths"])?;
        let paths: BTreeMap<String, Option<String>> =
            serde_json::from_str(&json).map_err(|e| format!("lowers.py paths: {e}: {json}"))?;
        let missing: Vec<&str> = paths
            .iter()
            .filter(|(_, p)| p.is_none())
            .map(|(n, _)| n.as_str())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("missing: {}", missing.join(", ")))
        }
    });
    if let Err(e) = r {
        panic!("the real lowers are not installed ({e}): {INSTALL_HINT}");
    }
    for tool in tools {
        let found = Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(found, "`{tool}` is not installed: {INSTALL_HINT}");
    }
}

/// A server with one empty bucket on 127.0.0.1 (a free port), in its own work directory.
/// Dropping it stops what `lowers.py` started there and removes the directory.
pub struct Server {
    /// Which pair.
    pub kind: Kind,
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// The bucket.
    pub bucket: String,
    /// The server's PID (a direct child of nobody in this process: `lowers.py` started it in
    /// its own session).
    pub pid: i32,
    workdir: tempfile::TempDir,
}

impl Server {
    /// Starts the server of `kind` (panics if the lowers are not installed or it fails).
    pub fn start(kind: Kind) -> Server {
        require_installed(&[]);
        let workdir = tempfile::Builder::new()
            .prefix(&format!("drainfs-{}-server-", kind.name()))
            .tempdir_in("/tmp")
            .expect("tempdir");
        let wd = workdir.path().to_str().expect("utf-8 path").to_string();
        let json = lowers_py(&["start-server", kind.name(), "--workdir", &wd])
            .unwrap_or_else(|e| panic!("cannot start the {} server: {e}", kind.name()));
        let v: serde_json::Value = serde_json::from_str(&json).expect("start-server JSON");
        Server {
            kind,
            port: v["port"].as_u64().expect("port") as u16,
            bucket: v["bucket"].as_str().expect("bucket").to_string(),
            pid: v["pid"].as_i64().expect("pid") as i32,
            workdir,
        }
    }

    /// Sends `sig` to the server's process (SIGSTOP to wedge it, SIGKILL to lose it). A
    /// stopped server is continued when the `Server` drops.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), sig);
    }

    /// The object names and sizes in the bucket (directory markers left out), asked from the
    /// server over HTTP/1.0 from this process, without forking: a fork+exec anywhere in the
    /// test process closes the child's copies of every open fd, and each of those closes is a
    /// FLUSH, which makes gcsfuse finalize a file the test still holds open. Only for
    /// `Kind::Gcsfuse` and `Kind::Gcs` (the GCS JSON API); sizes only, no content
    /// ([`Server::objects`] reads content, but forks).
    ///
    /// # Errors
    /// A message when the server does not answer (e.g. it is stopped or dead) within
    /// `timeout`, or answers anything but 200 with a listing.
    pub fn listing(&self, timeout: std::time::Duration) -> Result<BTreeMap<String, u64>, String> {
        let mut out = BTreeMap::new();
        let mut token: Option<String> = None;
        loop {
            let mut path = format!("/storage/v1/b/{}/o?maxResults=1000", self.bucket);
            if let Some(t) = &token {
                path.push_str(&format!("&pageToken={t}"));
            }
            let (code, body) = http_get(self.port, &path, timeout)?;
            if code != 200 {
                return Err(format!("GET {path}: HTTP {code}: {body:.200}"));
            }
            let doc: serde_json::Value =
                serde_json::from_str(&body).map_err(|e| format!("GET {path}: {e}: {body:.200}"))?;
            for item in doc["items"].as_array().into_iter().flatten() {
                let name = item["name"].as_str().unwrap_or_default().to_string();
                if name.ends_with('/') {
                    continue;
                }
                let size = match &item["size"] {
                    serde_json::Value::String(s) => s.parse().unwrap_or(0),
                    v => v.as_u64().unwrap_or(0),
                };
                out.insert(name, size);
            }
            token = doc["nextPageToken"].as_str().map(str::to_string);
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    /// The work directory (server data, logs, the client's credentials and cache).
    pub fn workdir(&self) -> &Path {
        self.workdir.path()
    }

    /// argv of the FUSE client mounting the bucket at `mountpoint`, in the foreground (for
    /// `drainfs run ... -- ARGV`).
    pub fn mount_cmd(&self, mountpoint: &Path) -> Vec<String> {
        self.mount_cmd_with(mountpoint, &[])
    }

    /// [`Server::mount_cmd`] with extra client flags before the positional arguments (e.g.
    /// `--write-block-size-mb=1` for gcsfuse). `mountpoint` may be `/dev/fd/N`.
    pub fn mount_cmd_with(&self, mountpoint: &Path, extra: &[&str]) -> Vec<String> {
        let mut args = vec![
            "mount-cmd",
            self.kind.name(),
            "--workdir",
            self.workdir.path().to_str().expect("utf-8 path"),
            "--mountpoint",
            mountpoint.to_str().expect("utf-8 path"),
            "--",
        ];
        args.extend_from_slice(extra);
        let json = lowers_py(&args).unwrap_or_else(|e| panic!("{e}"));
        serde_json::from_str(&json).expect("mount-cmd JSON")
    }

    /// Every object in the bucket with its size and SHA-256, read from the server (directory
    /// markers left out).
    pub fn objects(&self) -> BTreeMap<String, Object> {
        let json = lowers_py(&[
            "objects",
            self.kind.name(),
            "--workdir",
            self.workdir.path().to_str().expect("utf-8 path"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        serde_json::from_str(&json).expect("objects JSON")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A test may have stopped it (SIGSTOP): a stopped server would not see the SIGTERM.
        if pid_alive(self.pid) {
            self.signal(nix::sys::signal::Signal::SIGCONT);
        }
        let wd = self.workdir.path().to_string_lossy().into_owned();
        if let Err(e) = lowers_py(&["stop", "--workdir", &wd]) {
            eprintln!("stopping the {} server: {e}", self.kind.name());
        }
    }
}

/// `GET path` from `127.0.0.1:port` over HTTP/1.0, in this process (no fork): the status code
/// and the body ([`crate::wait::http_get_from`]).
///
/// # Errors
/// A message when connecting, sending or reading fails or takes longer than `timeout`.
pub fn http_get(
    port: u16,
    path: &str,
    timeout: std::time::Duration,
) -> Result<(u16, String), String> {
    crate::wait::http_get_from(&format!("127.0.0.1:{port}"), path, timeout)
}

/// SHA-256 of `data`, lowercase hex (through `sha256sum`).
pub fn sha256_hex(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum");
    // sha256sum writes nothing before the end of its input: no deadlock.
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(data)
        .expect("write to sha256sum");
    let out = child.wait_with_output().expect("sha256sum");
    assert!(out.status.success(), "sha256sum failed");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_string()
}

/// The object a file with this content should become.
pub fn object_of(data: &[u8]) -> Object {
    Object {
        size: data.len() as u64,
        sha256: sha256_hex(data),
    }
}

/// The object each regular file under `root` should become, keyed `prefix` + its path relative
/// to `root` (`/`-separated).
pub fn objects_of_tree(root: &Path, prefix: &str) -> BTreeMap<String, Object> {
    fn walk(dir: &Path, rel: &str, out: &mut BTreeMap<String, Object>) {
        for e in std::fs::read_dir(dir).expect("read_dir") {
            let e = e.expect("dir entry");
            let name = e.file_name().to_string_lossy().into_owned();
            let ft = e.file_type().expect("file type");
            let key = format!("{rel}{name}");
            if ft.is_dir() {
                walk(&e.path(), &format!("{key}/"), out);
            } else if ft.is_file() {
                out.insert(key, object_of(&std::fs::read(e.path()).expect("read")));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, prefix, &mut out);
    out
}

//! A mounted drainfs for tests: runs the real `drainfs` binary over a temporary lower and
//! unmounts on drop, even when the test panics (RAII, as mountpoint-s3's test sessions do).
//!
//! The binaries are found next to the test executable's `deps/` directory
//! (`target/<profile>/drainfs`, `target/<profile>/bucketfs`), so the suite must be run after
//! `cargo build --workspace --bins` (the README's test command does that), or with
//! `DRAINFS_BIN` / `BUCKETFS_BIN` set.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Path of a workspace binary (`drainfs`, `bucketfs`).
pub fn bin(name: &str) -> PathBuf {
    let var = format!("{}_BIN", name.to_ascii_uppercase());
    if let Some(p) = std::env::var_os(&var) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(|d| {
            if d.ends_with("deps") {
                d.parent()
            } else {
                Some(d)
            }
        })
        .expect("target dir");
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} not found; run `cargo build --workspace --bins` first (or set {var})",
        p.display()
    );
    p
}

/// Whether `path` (absolute) is a mount point right now.
pub fn is_mounted(path: &Path) -> bool {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let p = path.to_string_lossy().replace(' ', "\\040");
    text.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.as_str()))
}

/// Polls `f` every 10 ms until it returns true or `timeout` passes; returns the last result.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Detaches anything still mounted at `path` (lazy), aborting a wedged FUSE connection.
pub fn force_unmount(path: &Path) {
    for _ in 0..8 {
        if !is_mounted(path) {
            return;
        }
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg("-q")
            .arg(path)
            .stderr(Stdio::null())
            .status();
        if is_mounted(path) {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(path)
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A running process whose stderr is collected, killed on drop.
pub struct Proc {
    /// The child.
    pub child: Child,
    /// Its stderr lines so far.
    pub stderr: Arc<Mutex<Vec<String>>>,
    exited: Option<ExitStatus>,
}

impl Proc {
    /// Spawns `cmd` with stderr captured (and echoed to the test's stderr for debugging).
    pub fn spawn(mut cmd: Command) -> Proc {
        cmd.stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let err = child.stderr.take().expect("piped");
        let sink = Arc::clone(&stderr);
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("    | {line}");
                sink.lock().unwrap().push(line);
            }
        });
        Proc {
            child,
            stderr,
            exited: None,
        }
    }

    /// PID.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a signal.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), sig);
    }

    /// Waits up to `timeout` for the exit status.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exited {
            return Some(s);
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.exited = Some(s);
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// PID of this process's first child (drainfs's lower), waiting up to 5 s for it.
    pub fn child_pid(&self) -> i32 {
        let pid = self.pid();
        let mut out = None;
        wait_until(Duration::from_secs(5), || {
            for task in std::fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let children =
                    std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
                if let Some(c) = children.split_whitespace().next() {
                    out = c.parse().ok();
                    return true;
                }
            }
            false
        });
        out.expect("a child process")
    }

    /// Whether stderr has a line containing `needle`.
    pub fn stderr_contains(&self, needle: &str) -> bool {
        self.stderr
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
    }

    /// All stderr so far.
    pub fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.exited.is_none() && self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A temporary lower, a mountpoint and a running drainfs. Dropping it stops drainfs
/// (SIGTERM, then SIGKILL) and detaches anything left mounted.
pub struct Mounted {
    /// Scratch directory holding `lower/`, `mnt/` and anything else the test wants.
    pub dir: tempfile::TempDir,
    /// The lower directory.
    pub lower: PathBuf,
    /// drainfs's mountpoint.
    pub mnt: PathBuf,
    /// The drainfs process.
    pub proc: Proc,
    /// drainfs's `--ready-file` (the test's own, or one the harness adds).
    pub ready: PathBuf,
}

/// Options for [`Mounted::start`].
#[derive(Default, Clone)]
pub struct MountOpts {
    /// Extra `drainfs run` arguments (before `--`).
    pub args: Vec<String>,
    /// Lower command after `--` (`{lower}` is replaced by the lower path).
    pub lower_cmd: Vec<String>,
    /// Wait for the mount to appear (default true unless `no_wait`).
    pub no_wait: bool,
}

impl Mounted {
    /// Mounts drainfs over a fresh temporary lower with `--passthrough <passthrough>`.
    pub fn new(passthrough: &str) -> Mounted {
        Self::start(MountOpts {
            args: vec!["--passthrough".into(), passthrough.into()],
            ..Default::default()
        })
    }

    /// Mounts with full options.
    pub fn start(opts: MountOpts) -> Mounted {
        let dir = tempfile::Builder::new()
            .prefix("drainfs-test-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        // World-traversable so non-root test users can reach the mount.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let lower = dir.path().join("lower");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&lower).unwrap();
        std::fs::create_dir(&mnt).unwrap();
        Self::start_in(dir, lower, mnt, opts)
    }

    /// Mounts with a caller-prepared directory layout.
    pub fn start_in(
        dir: tempfile::TempDir,
        lower: PathBuf,
        mnt: PathBuf,
        opts: MountOpts,
    ) -> Mounted {
        let mut cmd = Command::new(bin("drainfs"));
        cmd.arg("run")
            .arg("--lower")
            .arg(&lower)
            .arg("--mountpoint")
            .arg(&mnt);
        cmd.args(&opts.args);
        // drainfs writes the ready file once serving: the harness waits on that state.
        let ready = match opts.args.iter().position(|a| a == "--ready-file") {
            Some(i) => PathBuf::from(&opts.args[i + 1]),
            None => {
                let r = dir.path().join("harness-ready");
                cmd.arg("--ready-file").arg(&r);
                r
            }
        };
        if !opts.lower_cmd.is_empty() {
            cmd.arg("--");
            for a in &opts.lower_cmd {
                cmd.arg(
                    a.replace("{lower}", &lower.to_string_lossy())
                        .replace("{dir}", &dir.path().to_string_lossy()),
                );
            }
        }
        cmd.env(
            "RUST_LOG",
            std::env::var("DRAINFS_TEST_LOG").unwrap_or_else(|_| "info".into()),
        );
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        let proc = Proc::spawn(cmd);
        let mut m = Mounted {
            dir,
            lower,
            mnt,
            proc,
            ready,
        };
        if !opts.no_wait {
            m.wait_serving(Duration::from_secs(30));
        }
        m
    }

    /// Waits until drainfs's mount is up and answered a round trip.
    pub fn wait_serving(&mut self, timeout: Duration) {
        let mnt = self.mnt.clone();
        let ok = wait_until(timeout, || {
            if self.proc.child.try_wait().ok().flatten().is_some() {
                return true;
            }
            self.ready.exists() && is_mounted(&mnt)
        });
        assert!(
            ok && is_mounted(&mnt),
            "drainfs did not mount within {timeout:?}:\n{}",
            self.proc.stderr_text()
        );
    }

    /// Path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// Path inside the lower.
    pub fn lower_path(&self, rel: &str) -> PathBuf {
        self.lower.join(rel)
    }

    /// Sends SIGTERM and waits for the exit status (bounded); asserts nothing is left mounted.
    pub fn stop(&mut self, timeout: Duration) -> ExitStatus {
        self.proc.signal(nix::sys::signal::Signal::SIGTERM);
        let st = self.proc.wait_timeout(timeout).unwrap_or_else(|| {
            panic!(
                "drainfs did not exit within {timeout:?}:\n{}",
                self.proc.stderr_text()
            )
        });
        assert!(!is_mounted(&self.mnt), "mount left behind after exit");
        st
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.proc.exited.is_none() && self.proc.child.try_wait().ok().flatten().is_none() {
            self.proc.signal(nix::sys::signal::Signal::SIGTERM);
            if self.proc.wait_timeout(Duration::from_secs(10)).is_none() {
                let _ = self.proc.child.kill();
                let _ = self.proc.wait_timeout(Duration::from_secs(5));
            }
        }
        force_unmount(&self.mnt);
        force_unmount(&self.lower);
    }
}

/// Runs `cmd` as `uid:gid` with no supplementary groups (std drops them when a root parent
/// changes the uid) and returns its output.
pub fn run_as(uid: u32, gid: u32, program: &str, args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    Command::new(program)
        .args(args)
        .uid(uid)
        .gid(gid)
        .output()
        .expect("run_as")
}

/// drainfs supervising the gcsfuse-like `bucketfs` backend, with the paths tests look at.
pub struct BucketStack {
    /// The mounted drainfs.
    pub m: Mounted,
    /// The directory playing the bucket (what has been "uploaded").
    pub bucket: PathBuf,
    /// bucketfs's `--events` log.
    pub events: PathBuf,
    /// An exit file drainfs watches (`volumes/exit`, parent not created).
    pub exit_file: PathBuf,
    /// drainfs's `--summary-file`.
    pub summary: PathBuf,
}

/// Starts `drainfs run <drainfs_args> -- bucketfs <bucketfs_args>` in a fresh temp dir;
/// `wait` waits until drainfs serves.
pub fn over_bucketfs(drainfs_args: &[&str], bucketfs_args: &[&str], wait: bool) -> BucketStack {
    let dir = tempfile::Builder::new()
        .prefix("drainfs-bucket-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let lower = dir.path().join("lower");
    let mnt = dir.path().join("mnt");
    let bucket = dir.path().join("bucket");
    for d in [&lower, &mnt, &bucket] {
        std::fs::create_dir(d).unwrap();
    }
    let events = dir.path().join("events.jsonl");
    let exit_file = dir.path().join("volumes").join("exit");
    let summary = dir.path().join("summary.json");
    let mut args: Vec<String> = vec![
        "--exit-file".into(),
        exit_file.display().to_string(),
        "--summary-file".into(),
        summary.display().to_string(),
        "--lower-ready-timeout".into(),
        "20s".into(),
    ];
    args.extend(drainfs_args.iter().map(|s| s.to_string()));
    let mut lower_cmd: Vec<String> = vec![
        bin("bucketfs").display().to_string(),
        "--bucket".into(),
        bucket.display().to_string(),
        "--mountpoint".into(),
        lower.display().to_string(),
        "--events".into(),
        events.display().to_string(),
    ];
    lower_cmd.extend(bucketfs_args.iter().map(|s| s.to_string()));
    let m = Mounted::start_in(
        dir,
        lower,
        mnt,
        MountOpts {
            args,
            lower_cmd,
            no_wait: !wait,
        },
    );
    BucketStack {
        m,
        bucket,
        events,
        exit_file,
        summary,
    }
}

//! drainfs mounted for tests: [`Mounted`] runs the real `drainfs run` over a temporary lower
//! (a plain directory, or any lower command) and unmounts on drop, even when the test panics
//! (RAII, as mountpoint-s3's test sessions do); [`BucketStack`] is drainfs over the gcsfuse-like
//! `bucketfs`. Also where the binaries are found ([`bin`]) and the scratch directories every
//! layer makes ([`scratch_dir`], [`make_dirs`]). The process, mount and wait primitives it
//! builds on live in [`crate::process`], [`crate::mounts`] and [`crate::wait`] (re-exported
//! here: [`Proc`], [`is_mounted`], [`force_unmount`], [`wait_until`]).
//!
//! Every test that mounts runs under [`crate::bound`]: what it starts through [`Proc`] and the
//! directories it mounts in ([`scratch_dir`], the topologies' mountpoints, temporary
//! directories named in a started process's arguments) are recorded, and past the bound
//! (420 s, `DRAINFS_TEST_BOUND`) its FUSE connections are aborted, its processes killed and
//! the test process fails. A new test gets that by starting its processes with [`Proc`] and
//! making its directories with [`scratch_dir`] (or `tempfile`'s defaults). A test that needs
//! machine-wide state (connection numbers, the whole mount table, fusectl) goes in
//! `tests/machine_wide.rs` and takes its lock; ports come from [`crate::wait::free_port`].
//!
//! The binaries are found next to the test executable's `deps/` directory
//! (`target/<profile>/drainfs`, `target/<profile>/bucketfs`), so the suite must be run after
//! `cargo build --workspace --bins` (the README's test command does that), or with
//! `DRAINFS_BIN` / `BUCKETFS_BIN` set.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

pub use crate::mounts::{force_unmount, is_mounted};
pub use crate::process::Proc;
pub use crate::wait::wait_until;

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

/// A fresh scratch directory `BASE/PREFIXxxxxxx` (mode 0755, so that other users, such as a
/// sidecar's uid 65534 or a non-root test user, can reach what is inside), removed on drop.
pub fn scratch_dir(base: &str, prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(base)
        .expect("tempdir");
    crate::bound::own_dir(dir.path());
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    dir
}

/// Creates each of `names` as a directory under `dir` and returns their paths, in order.
pub fn make_dirs<const N: usize>(dir: &Path, names: [&str; N]) -> [PathBuf; N] {
    names.map(|n| {
        let p = dir.join(n);
        std::fs::create_dir(&p).unwrap();
        p
    })
}

/// The `RUST_LOG` the processes under test run with: `DRAINFS_TEST_LOG`, or `info`.
pub fn test_log() -> String {
    std::env::var("DRAINFS_TEST_LOG").unwrap_or_else(|_| "info".into())
}

/// How [`Mounted`]'s drop stops drainfs: SIGTERM (drain), then SIGKILL.
const DROP_LADDER: [(Signal, Duration); 2] = [
    (Signal::SIGTERM, Duration::from_secs(10)),
    (Signal::SIGKILL, Duration::from_secs(5)),
];

impl Mounted {
    /// Mounts drainfs over a fresh temporary lower with `--passthrough <passthrough>`.
    pub fn new(passthrough: &str) -> Mounted {
        Self::start(MountOpts {
            args: vec!["--passthrough".into(), passthrough.into()],
            ..Default::default()
        })
    }

    /// Mounts with full options, in a fresh directory under `/tmp`.
    pub fn start(opts: MountOpts) -> Mounted {
        Self::start_under("/tmp", opts)
    }

    /// Mounts with full options, in a fresh directory (mode 0755, holding `lower/` and `mnt/`)
    /// under `base` (e.g. `/dev/shm`, for a lower on tmpfs).
    pub fn start_under(base: &str, opts: MountOpts) -> Mounted {
        let dir = scratch_dir(base, "drainfs-test-");
        let [lower, mnt] = make_dirs(dir.path(), ["lower", "mnt"]);
        Self::start_in(dir, lower, mnt, opts)
    }

    /// Mounts with a caller-prepared directory layout: `drainfs run --lower LOWER
    /// --mountpoint MNT <args> [--ready-file DIR/harness-ready] [-- <lower_cmd>]`, and waits
    /// (30 s at most) until it serves unless `opts.no_wait`.
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
        cmd.env("RUST_LOG", test_log());
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
    ///
    /// # Panics
    /// If it is not mounted by `timeout` (or drainfs exited first), with drainfs's stderr.
    pub fn wait_serving(&mut self, timeout: Duration) {
        let (ready, mnt) = (self.ready.clone(), self.mnt.clone());
        self.proc
            .wait_while_running(timeout, || ready.exists() && is_mounted(&mnt));
        assert!(
            is_mounted(&mnt),
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
        self.proc.signal(Signal::SIGTERM);
        let st = self.proc.wait_exit(timeout, "drainfs");
        assert!(!is_mounted(&self.mnt), "mount left behind after exit");
        st
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        self.proc.stop(&DROP_LADDER);
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
    let [lower, mnt, bucket] = make_dirs(dir.path(), ["lower", "mnt", "bucket"]);
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

impl BucketStack {
    /// bucketfs's events so far.
    pub fn events(&self) -> Vec<crate::bucket::BucketEvent> {
        crate::bucket::read_events(&self.events)
    }

    /// Creates the exit file (and its directory) in place.
    pub fn touch_exit_file(&self) {
        std::fs::create_dir_all(self.exit_file.parent().unwrap()).unwrap();
        std::fs::write(&self.exit_file, b"").unwrap();
    }

    /// drainfs's summary file.
    ///
    /// # Panics
    /// When it is missing or not JSON.
    pub fn summary(&self) -> serde_json::Value {
        crate::wait::summary_at(&self.summary)
    }

    /// drainfs's exit code (-1 for a signal), waiting up to `timeout`.
    ///
    /// # Panics
    /// On timeout, with drainfs's stderr.
    pub fn wait_exit(&mut self, timeout: Duration) -> i32 {
        self.m
            .proc
            .wait_exit(timeout, "drainfs")
            .code()
            .unwrap_or(-1)
    }

    /// Asserts that neither drainfs's mount nor the lower's is left.
    pub fn assert_nothing_mounted(&self) {
        assert!(!is_mounted(&self.m.mnt), "drainfs mount left behind");
        assert!(!is_mounted(&self.m.lower), "lower mount left behind");
    }

    /// PID of the lower (drainfs's child, bucketfs), waiting up to 5 s for it.
    pub fn lower_pid(&self) -> i32 {
        self.m.proc.child_pid()
    }
}

//! Supervision: drainfs collects the children it starts and the orphans re-parented to it, and
//! never a child that other code (std's `Command::spawn`, fuser's `fusermount3`) waits for.
//!
//! - A lower command that cannot be executed: exit 69 and a summary naming it, every time
//!   (std waits for a child whose `exec` failed; a reaper that takes it makes std panic).
//! - drainfs as a non-root user mounts through fuser's `fusermount3`, every time (fuser waits
//!   for it; a reaper that takes it fails the mount with ECHILD). The test runs in a private
//!   mount namespace with a world-usable `/dev/fuse` node and a `fuse.conf` that has
//!   `user_allow_other`, so nothing on the machine changes.
//! - drainfs as PID 1 of a PID namespace collects an orphan that its lower left behind, with
//!   its own `/proc` and with the parent namespace's `/proc` (where it cannot list its
//!   children), and still reports the lower's own exit status.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use fuse_tests::harness::{
    MountOpts, Mounted, Proc, bin, force_unmount, make_dirs, scratch_dir, wait_until,
};
use fuse_tests::process::child_pids;
use fuse_tests::wait::summary_at;
use nix::sys::signal::Signal;

/// How often the racy scenarios are repeated.
const RUNS: usize = 30;

/// The uid/gid drainfs runs as in the non-root test (`fusermount3` needs a passwd entry).
const NOBODY: u32 = 65534;

/// A world-traversable scratch directory with `lower/` and `mnt/`.
fn layout() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = scratch_dir("/tmp", "drainfs-supervision-");
    let [lower, mnt] = make_dirs(dir.path(), ["lower", "mnt"]);
    (dir, lower, mnt)
}

fn summary(path: &Path) -> serde_json::Value {
    summary_at(path)
}

#[test]
fn unexecutable_lower_command_exits_69_every_time() {
    for run in 0..RUNS {
        let (dir, lower, mnt) = layout();
        let sum = dir.path().join("summary.json");
        let mut m = Mounted::start_in(
            dir,
            lower,
            mnt,
            MountOpts {
                args: vec!["--summary-file".into(), sum.display().to_string()],
                lower_cmd: vec!["/nonexistent/drainfs-no-such-lower".into()],
                no_wait: true,
            },
        );
        let st = m
            .proc
            .wait_timeout(Duration::from_secs(20))
            .unwrap_or_else(|| {
                panic!("run {run}: drainfs did not exit:\n{}", m.proc.stderr_text())
            });
        assert_eq!(
            st.code(),
            Some(69),
            "run {run}: exit status {st:?}:\n{}",
            m.proc.stderr_text()
        );
        let s = summary(&sum);
        assert_eq!(s["exit_code"], 69, "run {run}: {s}");
        assert!(
            s["lower_died"].as_str().is_some_and(|d| !d.is_empty()),
            "run {run}: the summary names no lower failure: {s}"
        );
        assert!(!fuse_tests::harness::is_mounted(&m.mnt), "run {run}");
    }
}

/// The `/dev/fuse` node and `fuse.conf` bind-mounted in the non-root test's namespace.
struct FuseAccess {
    dir: tempfile::TempDir,
}

impl FuseAccess {
    fn new() -> FuseAccess {
        let dir = tempfile::Builder::new()
            .prefix("drainfs-fuse-access-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let dev = dir.path().join("fuse");
        let st = nix::sys::stat::stat("/dev/fuse").expect("stat /dev/fuse");
        nix::sys::stat::mknod(
            &dev,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            st.st_rdev,
        )
        .expect("mknod a /dev/fuse node (the test runs as root)");
        std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::fs::write(dir.path().join("fuse.conf"), "user_allow_other\n").unwrap();
        FuseAccess { dir }
    }
}

/// Runs drainfs as `nobody` (a child of the shell, so not PID 1) in a private mount namespace
/// (`/dev/fuse` usable by all, `user_allow_other` set). The shell exits with drainfs's status, or 91 when drainfs's
/// mount is still there after it exited, or 90 when the namespace could not be set up.
const NON_ROOT_SCRIPT: &str = r#"
access="$1"; drainfs="$2"; dir="$3"
mount --bind "$access/fuse" /dev/fuse && mount --bind "$access/fuse.conf" /etc/fuse.conf || exit 90
setpriv --reuid 65534 --regid 65534 --clear-groups -- "$drainfs" run \
    --lower "$dir/lower" --mountpoint "$dir/mnt" \
    --ready-file "$dir/ready" --exit-file "$dir/exit" --summary-file "$dir/summary.json"
rc=$?
if mountpoint -q "$dir/mnt"; then exit 91; fi
exit $rc
"#;

#[test]
fn non_root_drainfs_mounts_every_time() {
    let access = FuseAccess::new();
    for run in 0..RUNS {
        let (dir, lower, mnt) = layout();
        std::fs::write(lower.join("hello"), b"hello from the lower\n").unwrap();
        for p in [
            dir.path(),
            lower.as_path(),
            mnt.as_path(),
            &lower.join("hello"),
        ] {
            std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        let ready = dir.path().join("ready");
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "--pid",
            "--mount-proc",
            "--fork",
            "--kill-child",
            "sh",
            "-c",
            NON_ROOT_SCRIPT,
            "sh",
        ])
        .arg(access.dir.path())
        .arg(bin("drainfs"))
        .arg(dir.path())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
        // The shell is PID 1 of its own PID namespace: killing `unshare` kills the shell and so
        // every process in there, and the mount namespace (and any mount in it) goes with
        // them.
        let mut p = Proc::spawn(cmd);
        let served = p.wait_while_running(Duration::from_secs(20), || ready.exists());
        assert!(
            served && ready.exists(),
            "run {run}: a non-root drainfs did not become ready:\n{}",
            p.stderr_text()
        );
        // The mount lives in the shell's namespace: read through it from there.
        let shell = p.child_pid();
        let through = PathBuf::from(format!("/proc/{shell}/root")).join(
            mnt.join("hello")
                .strip_prefix("/")
                .expect("absolute mountpoint"),
        );
        assert_eq!(
            std::fs::read(&through).unwrap_or_else(|e| panic!("run {run}: read {through:?}: {e}")),
            b"hello from the lower\n",
            "run {run}"
        );
        std::fs::write(dir.path().join("exit"), b"").unwrap();
        let st = p
            .wait_timeout(Duration::from_secs(20))
            .unwrap_or_else(|| panic!("run {run}: drainfs did not exit:\n{}", p.stderr_text()));
        assert_eq!(
            st.code(),
            Some(0),
            "run {run}: exit status {st:?} (91: mount left behind):\n{}",
            p.stderr_text()
        );
        assert_eq!(summary(&dir.path().join("summary.json"))["exit_code"], 0);
    }
}

/// drainfs as PID 1 of a new PID namespace (`unshare --pid --fork`), supervising `lower_cmd`.
/// Dropping it kills `unshare`, which SIGKILLs drainfs (and so the whole namespace), then
/// detaches whatever is left mounted at the layout's paths.
struct Pid1 {
    proc: Proc,
    dir: tempfile::TempDir,
    lower: PathBuf,
    mnt: PathBuf,
}

impl Pid1 {
    /// `own_proc`: mount a `/proc` of the new namespace (`--mount-proc`, which also makes a
    /// private mount namespace); otherwise drainfs sees the parent namespace's `/proc`.
    fn start(own_proc: bool, lower_cmd: impl FnOnce(&Path, &Path) -> Vec<String>) -> Pid1 {
        let (dir, lower, mnt) = layout();
        let mut cmd = Command::new("unshare");
        cmd.args(["--pid", "--fork", "--kill-child"]);
        if own_proc {
            cmd.arg("--mount-proc");
        }
        cmd.arg(bin("drainfs"))
            .arg("run")
            .arg("--lower")
            .arg(&lower)
            .arg("--mountpoint")
            .arg(&mnt)
            .arg("--ready-file")
            .arg(dir.path().join("ready"))
            .arg("--exit-file")
            .arg(dir.path().join("exit"))
            .arg("--summary-file")
            .arg(dir.path().join("summary.json"))
            .args(["--lower-ready-timeout", "20s", "--"])
            .args(lower_cmd(dir.path(), &lower))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        Pid1 {
            proc: Proc::spawn(cmd),
            dir,
            lower,
            mnt,
        }
    }

    /// drainfs's pid as seen from here (the child of `unshare`).
    fn drainfs_pid(&self) -> i32 {
        self.proc.child_pid()
    }

    fn wait_ready(&mut self) {
        let ready = self.dir.path().join("ready");
        let ok = self
            .proc
            .wait_while_running(Duration::from_secs(30), || ready.exists());
        assert!(
            ok && ready.exists(),
            "drainfs (PID 1) did not become ready:\n{}",
            self.proc.stderr_text()
        );
    }

    fn wait_exit(&mut self) -> i32 {
        let st = self.proc.wait_exit(Duration::from_secs(30), "drainfs");
        st.code().unwrap_or(-1)
    }

    fn summary(&self) -> serde_json::Value {
        summary(&self.dir.path().join("summary.json"))
    }
}

impl Drop for Pid1 {
    fn drop(&mut self) {
        self.proc
            .stop(&[(Signal::SIGKILL, Duration::from_secs(10))]);
        force_unmount(&self.mnt);
        force_unmount(&self.lower);
    }
}

/// `(pid, comm, state)` of every child of `pid`.
fn children(pid: i32) -> Vec<(i32, String, char)> {
    let mut out = Vec::new();
    for c in child_pids(pid) {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{c}/stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = stat[open + 1..close].to_string();
        let state = stat[close + 1..].trim_start().chars().next().unwrap_or('?');
        out.push((c, comm, state));
    }
    out
}

/// The lower command: `bucketfs` on `lower`, after a subshell left `sleep 3` behind as an
/// orphan (re-parented to PID 1 of the namespace: drainfs).
fn bucketfs_leaving_an_orphan(dir: &Path, lower: &Path) -> Vec<String> {
    let bucket = dir.join("bucket");
    std::fs::create_dir(&bucket).unwrap();
    vec![
        "sh".into(),
        "-c".into(),
        r#"(exec sleep 3 &); exec "$@""#.into(),
        "sh".into(),
        bin("bucketfs").display().to_string(),
        "--bucket".into(),
        bucket.display().to_string(),
        "--mountpoint".into(),
        lower.display().to_string(),
    ]
}

fn pid1_collects_orphans(own_proc: bool) {
    let mut d = Pid1::start(own_proc, bucketfs_leaving_an_orphan);
    d.wait_ready();
    let pid = d.drainfs_pid();
    let sleepers = || {
        children(pid)
            .into_iter()
            .filter(|(_, comm, _)| comm == "sleep")
            .collect::<Vec<_>>()
    };
    // The orphan is re-parented to drainfs before the lower's mount appears (the subshell
    // exits before bucketfs starts), so it is drainfs's child by now, alive or a zombie.
    let adopted = sleepers();
    assert!(
        !adopted.is_empty(),
        "the orphaned `sleep` is not a child of drainfs (PID 1): children {:?}",
        children(pid)
    );
    // It exits 3 s after it started; drainfs must collect it, leaving no zombie.
    let gone = wait_until(Duration::from_secs(15), || sleepers().is_empty());
    assert!(
        gone,
        "the orphan was not collected: children of drainfs {:?}",
        children(pid)
    );
    assert!(
        children(pid).iter().all(|(_, _, state)| *state != 'Z'),
        "zombie children of drainfs: {:?}",
        children(pid)
    );
    std::fs::write(d.dir.path().join("exit"), b"").unwrap();
    assert_eq!(d.wait_exit(), 0, "{}", d.proc.stderr_text());
    assert_eq!(d.summary()["exit_code"], 0);
}

#[test]
fn pid1_collects_orphans_with_its_own_proc() {
    pid1_collects_orphans(true);
}

#[test]
fn pid1_collects_orphans_with_the_parents_proc() {
    pid1_collects_orphans(false);
}

/// A lower that leaves an orphan behind and exits 3 before mounting: drainfs reports the
/// lower's own status (exit 69, `lower_exit` "exit 3"), not the orphan's.
fn pid1_reports_the_lowers_exit(own_proc: bool) {
    let mut d = Pid1::start(own_proc, |_, _| {
        vec![
            "sh".into(),
            "-c".into(),
            "(exec sleep 0.2 &); sleep 0.5; exit 3".into(),
        ]
    });
    assert_eq!(d.wait_exit(), 69, "{}", d.proc.stderr_text());
    let s = d.summary();
    assert_eq!(s["exit_code"], 69, "{s}");
    assert_eq!(s["lower_exit"], "exit 3", "{s}");
}

#[test]
fn pid1_reports_the_lowers_exit_with_its_own_proc() {
    pid1_reports_the_lowers_exit(true);
}

#[test]
fn pid1_reports_the_lowers_exit_with_the_parents_proc() {
    pid1_reports_the_lowers_exit(false);
}

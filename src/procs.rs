//! Child processes and reaping.
//!
//! Every child has exactly one collector, and drainfs never waits with a wildcard
//! (`waitpid(-1)`, `waitid(P_ALL)` without `WNOWAIT`):
//! - Children started through [`spawn`] and [`output`] are *owned*: registered by pid while the
//!   table lock is held across `Command::spawn`, and collected only with `waitid(P_PID, pid)`,
//!   by [`reap`] (on SIGCHLD, from the signal thread) or by [`output`] itself. An owned child
//!   stays a zombie until then, so its pid cannot be reused meanwhile.
//! - Children that other code starts are collected by that code: std's `Command::spawn` waits
//!   for a child whose `exec` failed (the failure comes back through a pipe), fuser waits for
//!   `fusermount3`, `Command::output` waits for its child. drainfs does not touch them.
//! - Orphans: when drainfs is PID 1 of its PID namespace or a child subreaper, the kernel
//!   re-parents orphaned descendants to it and nobody else will collect them. [`reap`] lists
//!   drainfs's zombie children (`zombie_children`) and collects each one that is not owned
//!   and that nobody collected within [`ORPHAN_GRACE`] of drainfs first seeing it
//!   (`orphans_to_reap`); std and fuser collect their children as soon as those exit. When
//!   drainfs is neither PID 1 nor a subreaper, nothing can be re-parented to it, every child it
//!   does not own has another collector, and it does not look for orphans.
//!
//! Children get an empty signal mask (drainfs blocks its handled signals in every thread, see
//! [`crate::signals`], and std's `Command` leaves the mask as it is).

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;
use parking_lot::Mutex;
use tokio::sync::oneshot;

/// How long an exited child that drainfs does not own may stay a zombie before drainfs collects
/// it as an orphan. Code that waits for its own children does so right after they exit.
pub const ORPHAN_GRACE: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Table {
    /// Owned children by pid, and where their status goes.
    owned: HashMap<i32, oneshot::Sender<WaitStatus>>,
    /// Zombie children drainfs does not own, with the time it first saw each.
    seen: HashMap<Zombie, Instant>,
}

fn table() -> &'static Mutex<Table> {
    static T: OnceLock<Mutex<Table>> = OnceLock::new();
    T.get_or_init(Mutex::default)
}

/// Spawns `cmd` as an owned child (with an empty signal mask); the receiver yields its exit
/// status once [`reap`] or [`output`] collected it. Never wait for the returned `Child`
/// (`wait`, `try_wait`, `wait_with_output`): its status goes to the receiver.
///
/// # Errors
/// The spawn error (command not found, permission denied), after std collected the child
/// whose `exec` failed.
pub fn spawn(cmd: &mut Command) -> std::io::Result<(Child, oneshot::Receiver<WaitStatus>)> {
    use std::os::unix::process::CommandExt;
    // drainfs runs with its handled signals blocked in every thread (see `signals`) and std
    // does not reset the mask: without this, gcsfuse would never see the SIGINT that stops it.
    // SAFETY: sigprocmask is async-signal-safe; nothing is allocated between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::signal::sigprocmask(
                nix::sys::signal::SigmaskHow::SIG_SETMASK,
                Some(&nix::sys::signal::SigSet::empty()),
                None,
            )
            .map_err(std::io::Error::from)
        });
    }
    // The lock is held until the pid is registered, so [`reap`] never sees this child
    // unregistered.
    let mut t = table().lock();
    let child = cmd.spawn()?;
    let (tx, rx) = oneshot::channel();
    t.owned.insert(child.id() as i32, tx);
    Ok((child, rx))
}

/// Makes the child `cmd` starts die with drainfs: `PR_SET_PDEATHSIG(SIGKILL)` between fork
/// and exec, and a SIGKILL to itself when drainfs already died in between. The death signal
/// follows the *thread* that forked, not the process: spawn from the main thread (or the
/// current-thread runtime's, which is the main thread), which lives until drainfs exits.
/// GKE's sidecar mounter SIGKILLs only its own child (drainfs) 5 s after its SIGTERM; a
/// gcsfuse left behind would keep the sidecar's stderr pipe open, and the sidecar with it.
pub fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe calls (prctl, getppid, kill, getpid) between fork and
    // exec; nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // drainfs died between fork and prctl: the signal will never come.
            if libc::getppid() != parent {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
            Ok(())
        });
    }
}

/// Closes every `/dev/fuse` fd of drainfs (character device 10:229) but `keep`, and returns
/// their numbers: copies of the kernel's connection inherited with it, which a child would
/// inherit in turn, and which would keep the connection alive (the mount hung instead of
/// failed) after the process that serves it died. GKE's sidecar mounter receives the fd over
/// its socket without `MSG_CMSG_CLOEXEC`, so its own copy (fd 9 under v1.24.4) leaks into its
/// child beside the `/dev/fd/3` it hands over.
pub fn close_fuse_fds(keep: Option<std::os::fd::RawFd>) -> Vec<std::os::fd::RawFd> {
    use nix::sys::stat::{SFlag, fstat, major, minor};
    let fds: Vec<std::os::fd::RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let mut closed = Vec::new();
    for fd in fds.into_iter().filter(|fd| *fd > 2 && Some(*fd) != keep) {
        // SAFETY: only borrowed for fstat; an fd closed meanwhile (the directory's) fails.
        let Ok(st) = fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }) else {
            continue;
        };
        let chr = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFCHR;
        if chr && (major(st.st_rdev), minor(st.st_rdev)) == (10, 229) {
            // SAFETY: an inherited copy of the connection nothing in drainfs owns.
            drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
            closed.push(fd);
        }
    }
    closed
}

/// Collects the owned child `pid` if it exited, and sends its status.
fn collect(t: &mut Table, pid: i32) {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG;
    match waitid(Id::Pid(Pid::from_raw(pid)), flags) {
        Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => {}
        Ok(status) => {
            if let Some(tx) = t.owned.remove(&pid) {
                let _ = tx.send(status);
            }
        }
        Err(e) => {
            // ECHILD: something else collected it (seen for the fusermount3 helper of an
            // unmount, whose caller then checks the mount table itself). Dropping the sender
            // closes the receiver, which tells the waiter.
            tracing::debug!(pid, error = %e, "cannot collect an owned child");
            t.owned.remove(&pid);
        }
    }
}

/// Collects exited owned children and, when drainfs adopts orphans, the orphans due
/// (`orphans_to_reap`). Called by the signal thread on SIGCHLD and when the returned time
/// comes: the earliest time a zombie seen now becomes due, if any.
pub fn reap() -> Option<Instant> {
    reap_as(adopts_orphans())
}

/// [`reap`], looking for orphans when `adopts`.
fn reap_as(adopts: bool) -> Option<Instant> {
    let mut t = table().lock();
    let pids: Vec<i32> = t.owned.keys().copied().collect();
    for pid in pids {
        collect(&mut t, pid);
    }
    if !adopts {
        return None;
    }
    let zombies = zombie_children();
    let t = &mut *t;
    let owned = &t.owned;
    let plan = orphans_to_reap(
        |pid| owned.contains_key(&pid),
        &zombies,
        &mut t.seen,
        Instant::now(),
        ORPHAN_GRACE,
    );
    for pid in plan.reap {
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG;
        match waitid(Id::Pid(Pid::from_raw(pid)), flags) {
            Ok(status) => tracing::debug!(pid, ?status, "collected an orphan"),
            Err(e) => tracing::debug!(pid, error = %e, "an orphan was gone before collection"),
        }
    }
    plan.recheck_at
}

/// Whether orphans can be re-parented to drainfs: it is PID 1 of its PID namespace or a child
/// subreaper (the attribute survives `execve`, so a launcher may have set it).
fn adopts_orphans() -> bool {
    static ADOPTS: OnceLock<bool> = OnceLock::new();
    *ADOPTS.get_or_init(|| {
        nix::unistd::getpid().as_raw() == 1
            || nix::sys::prctl::get_child_subreaper().unwrap_or(false)
    })
}

/// A zombie child: its pid, and its start time in clock ticks after boot (`/proc/PID/stat`
/// field 22; 0 when unknown), which tells a reused pid from the process first seen under it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Zombie {
    /// Its pid in drainfs's PID namespace.
    pub(crate) pid: i32,
    /// Its start time (clock ticks after boot), 0 when unknown.
    pub(crate) start: u64,
}

/// What `orphans_to_reap` decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct OrphanPlan {
    /// Pids to collect now.
    pub(crate) reap: Vec<i32>,
    /// When the earliest zombie still in its grace becomes due; `None` when none is waiting.
    pub(crate) recheck_at: Option<Instant>,
}

/// Decides which zombie children to collect as orphans at `now`: those not owned (`owned`)
/// that have been zombies for at least `grace` since first seen. `seen` holds the first-seen
/// times between calls; entries of zombies no longer listed (collected by their owner) or
/// owned are dropped, new zombies are added with `now`, and those returned are removed.
pub(crate) fn orphans_to_reap(
    owned: impl Fn(i32) -> bool,
    zombies: &[Zombie],
    seen: &mut HashMap<Zombie, Instant>,
    now: Instant,
    grace: Duration,
) -> OrphanPlan {
    let listed: HashSet<Zombie> = zombies.iter().copied().collect();
    seen.retain(|z, _| listed.contains(z) && !owned(z.pid));
    let mut plan = OrphanPlan {
        reap: Vec::new(),
        recheck_at: None,
    };
    for z in &listed {
        if owned(z.pid) {
            continue;
        }
        let due = *seen.entry(*z).or_insert(now) + grace;
        if now >= due {
            seen.remove(z);
            plan.reap.push(z.pid);
        } else {
            plan.recheck_at = Some(plan.recheck_at.map_or(due, |r: Instant| r.min(due)));
        }
    }
    plan.reap.sort_unstable();
    plan
}

/// drainfs's zombie children. From `/proc/self/task/*/children` (every thread's children) and
/// each child's `/proc/PID/stat`, or from a scan of `/proc/*/stat` by parent pid where the
/// kernel has no `children` files. When `/proc` belongs to another PID namespace (its `self` is
/// not our pid), from a `waitid(P_ALL, WEXITED | WNOHANG | WNOWAIT)` peek, which shows one
/// zombie at a time: an orphan behind a zombie in its grace waits for that one.
pub(crate) fn zombie_children() -> Vec<Zombie> {
    let me = nix::unistd::getpid().as_raw();
    let ours = std::fs::read_link("/proc/self").is_ok_and(|l| l.as_os_str() == &*me.to_string());
    if !ours {
        return peek();
    }
    let mut pids = Vec::new();
    let mut listed = false;
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            listed = true;
            pids.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    if !listed {
        pids = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .collect();
    }
    pids.into_iter()
        .filter_map(|pid| {
            let stat = parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)?;
            (stat.state == 'Z' && stat.ppid == me).then_some(Zombie {
                pid,
                start: stat.start,
            })
        })
        .collect()
}

fn peek() -> Vec<Zombie> {
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    match waitid(Id::All, flags) {
        Ok(status) => status
            .pid()
            .map(|pid| Zombie {
                pid: pid.as_raw(),
                start: 0,
            })
            .into_iter()
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The fields of `/proc/PID/stat` that `zombie_children` reads.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    state: char,
    ppid: i32,
    start: u64,
}

/// Parses `/proc/PID/stat`: `pid (comm) state ppid ...`, starttime being field 22. The command
/// name may hold spaces and parentheses, so fields are counted after the last `)`.
fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// Like `Command::output`, for an owned child, with a deadline after which the child is
/// killed (SIGKILL) and collected.
///
/// # Errors
/// Spawn errors; `TimedOut` when the deadline passed; `Other` when the child was collected by
/// something else (never expected).
pub fn output(mut cmd: Command, timeout: Duration) -> std::io::Result<std::process::Output> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mut child, mut rx) = spawn(&mut cmd)?;
    let pid = child.id() as i32;
    let stdout = child.stdout.take().map(read_all);
    let stderr = child.stderr.take().map(read_all);
    match wait_owned(pid, &mut rx, timeout) {
        Ok(st) => {
            let join = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
                h.and_then(|h| h.join().ok()).unwrap_or_default()
            };
            Ok(std::process::Output {
                status: exit_status(st),
                stdout: join(stdout),
                stderr: join(stderr),
            })
        }
        Err(e) => {
            if e.kind() == std::io::ErrorKind::TimedOut {
                let _ =
                    nix::sys::signal::kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                let _ = wait_owned(pid, &mut rx, Duration::from_secs(1));
            }
            Err(e)
        }
    }
}

fn read_all(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = r.read_to_end(&mut b);
        b
    })
}

/// Waits up to `timeout` for the owned child `pid`, collecting it itself (the signal thread
/// may not run yet), woken by its pidfd (polled every 5 ms where pidfds are missing).
fn wait_owned(
    pid: i32,
    rx: &mut oneshot::Receiver<WaitStatus>,
    timeout: Duration,
) -> std::io::Result<WaitStatus> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let deadline = Instant::now() + timeout;
    let pidfd = rustix::process::Pid::from_raw(pid)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
    loop {
        collect(&mut table().lock(), pid);
        match rx.try_recv() {
            Ok(st) => return Ok(st),
            Err(oneshot::error::TryRecvError::Closed) => {
                return Err(std::io::Error::other(format!(
                    "child {pid} was collected elsewhere"
                )));
            }
            Err(oneshot::error::TryRecvError::Empty) => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "helper process timed out",
            ));
        }
        match &pidfd {
            Some(fd) => {
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                let _ = poll(
                    &mut fds,
                    PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX),
                );
            }
            None => std::thread::sleep(left.min(Duration::from_millis(5))),
        }
    }
}

/// Converts a wait status into `std::process::ExitStatus`.
pub fn exit_status(st: WaitStatus) -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    match st {
        WaitStatus::Exited(_, code) => std::process::ExitStatus::from_raw((code & 0xff) << 8),
        WaitStatus::Signaled(_, sig, _) => std::process::ExitStatus::from_raw(sig as i32),
        _ => std::process::ExitStatus::from_raw(0),
    }
}

/// A human and JSON-friendly description of a wait status: `exit 0`, `signal SIGKILL`.
pub fn describe(st: &WaitStatus) -> String {
    match st {
        WaitStatus::Exited(_, code) => format!("exit {code}"),
        WaitStatus::Signaled(_, sig, core) => {
            format!(
                "signal {}{}",
                sig.as_str(),
                if *core { " (core dumped)" } else { "" }
            )
        }
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(2);

    fn z(pid: i32, start: u64) -> Zombie {
        Zombie { pid, start }
    }

    #[test]
    fn an_unowned_zombie_is_collected_after_the_grace() {
        let t0 = Instant::now();
        let mut seen = HashMap::new();
        let first = orphans_to_reap(|_| false, &[z(7, 100)], &mut seen, t0, GRACE);
        assert_eq!(
            first,
            OrphanPlan {
                reap: vec![],
                recheck_at: Some(t0 + GRACE)
            }
        );
        let early = orphans_to_reap(|_| false, &[z(7, 100)], &mut seen, t0 + GRACE / 2, GRACE);
        assert_eq!(early.reap, Vec::<i32>::new());
        assert_eq!(
            early.recheck_at,
            Some(t0 + GRACE),
            "first-seen time is kept"
        );
        let due = orphans_to_reap(|_| false, &[z(7, 100)], &mut seen, t0 + GRACE, GRACE);
        assert_eq!(
            due,
            OrphanPlan {
                reap: vec![7],
                recheck_at: None
            }
        );
        assert!(seen.is_empty());
    }

    #[test]
    fn an_owned_zombie_is_never_collected_as_an_orphan() {
        let t0 = Instant::now();
        let mut seen = HashMap::new();
        for later in [0, 5, 60] {
            let plan = orphans_to_reap(
                |pid| pid == 7,
                &[z(7, 100)],
                &mut seen,
                t0 + Duration::from_secs(later),
                GRACE,
            );
            assert_eq!(
                plan,
                OrphanPlan {
                    reap: vec![],
                    recheck_at: None
                }
            );
        }
        assert!(seen.is_empty());
    }

    #[test]
    fn a_zombie_collected_by_its_owner_is_forgotten_and_a_reused_pid_starts_over() {
        let t0 = Instant::now();
        let mut seen = HashMap::new();
        orphans_to_reap(|_| false, &[z(7, 100)], &mut seen, t0, GRACE);
        // std collected it; the list no longer has it.
        orphans_to_reap(|_| false, &[], &mut seen, t0 + GRACE / 2, GRACE);
        assert!(seen.is_empty());
        // The pid comes back as another process (another start time): a fresh grace.
        let t1 = t0 + GRACE;
        let plan = orphans_to_reap(|_| false, &[z(7, 200)], &mut seen, t1, GRACE);
        assert_eq!(plan.reap, Vec::<i32>::new());
        assert_eq!(plan.recheck_at, Some(t1 + GRACE));
        // Even if the first one was never seen gone: same pid, other start time.
        let mut seen = HashMap::new();
        orphans_to_reap(|_| false, &[z(7, 100)], &mut seen, t0, GRACE);
        let plan = orphans_to_reap(|_| false, &[z(7, 200)], &mut seen, t0 + GRACE, GRACE);
        assert_eq!(plan.reap, Vec::<i32>::new());
    }

    #[test]
    fn a_zombie_in_its_grace_does_not_hold_back_others() {
        let t0 = Instant::now();
        let mut seen = HashMap::new();
        orphans_to_reap(|_| false, &[z(3, 1), z(4, 1)], &mut seen, t0, GRACE);
        let t1 = t0 + Duration::from_millis(1500);
        let plan = orphans_to_reap(
            |_| false,
            &[z(3, 1), z(4, 1), z(9, 5)],
            &mut seen,
            t1,
            GRACE,
        );
        assert_eq!(plan.reap, Vec::<i32>::new());
        assert_eq!(plan.recheck_at, Some(t0 + GRACE));
        let plan = orphans_to_reap(
            |_| false,
            &[z(3, 1), z(4, 1), z(9, 5)],
            &mut seen,
            t0 + GRACE,
            GRACE,
        );
        assert_eq!(plan.reap, vec![3, 4]);
        assert_eq!(plan.recheck_at, Some(t1 + GRACE));
    }

    #[test]
    fn parses_proc_stat_with_a_hostile_command_name() {
        let line = "4321 (a) Z 9 (x)) Z 77 4321 4321 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 \
                    416922 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'Z',
                ppid: 77,
                start: 416922
            })
        );
        assert_eq!(parse_stat("12 (short) S"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn reaping_never_takes_a_child_that_std_waits_for() {
        // The reaper runs in a loop, looking for orphans, while std spawns commands that fail
        // to exec (std waits for that child inside `spawn`) and runs `output` (std waits after
        // reading the pipes). The loop stays shorter than the grace, so it collects nothing
        // that other tests in this process own.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reaper = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    reap_as(true);
                }
            })
        };
        let until = Instant::now() + Duration::from_millis(800);
        let mut runs = 0;
        while Instant::now() < until {
            let e = Command::new("/nonexistent/drainfs-no-such-command")
                .spawn()
                .expect_err("no such command");
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
            let out = Command::new("true")
                .output()
                .expect("std collects its own child");
            assert!(out.status.success());
            runs += 1;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        reaper.join().unwrap();
        // Hundreds of rounds when idle; a loaded machine (both cores busy, the reaper spinning
        // beside this thread) can make each fork+exec take tens of milliseconds, and the loop
        // cannot run longer. A few rounds still race the reaper against both of std's waits.
        assert!(runs >= 3, "only {runs} rounds ran");
    }

    #[test]
    fn output_collects_its_child_and_times_out() {
        let mut sh = Command::new("sh");
        sh.args(["-c", "echo out; echo err >&2; exit 3"]);
        let out = output(sh, Duration::from_secs(10)).expect("sh runs");
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        let mut slow = Command::new("sleep");
        slow.arg("30");
        let t0 = Instant::now();
        let e = output(slow, Duration::from_millis(200)).expect_err("times out");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(
            table().lock().owned.is_empty(),
            "the killed child was collected"
        );
    }
}

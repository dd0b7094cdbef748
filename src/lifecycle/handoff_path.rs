//! The hand-off data path, which serves nothing: drainfs starts the lower's process (the
//! real gcsfuse) with its own argv, environment, stdio and the kernel's FUSE fd
//! (`/dev/fd/N`) untouched, closes its own copy of that fd, and stays its parent (it dies
//! with drainfs: [`crate::procs::die_with_parent`]). gcsfuse holds the kernel's connection
//! itself, so the door, the counts and the drain are empty: the machine tears down as soon
//! as a trigger comes. While serving, drainfs reads gcsfuse's `/proc/PID/io` every
//! `sample_every` ([`IdleWatch`]); its threads (`/proc/PID/task/*`, [`CpuWatch`]) only when
//! those counters stood still ([`handoff::activity`]); and its TCP connections (`sock_diag`),
//! only the ones already known while the counters move. The teardown waits until a sample
//! shows that none of them has moved for the idle window, then ends gcsfuse (SIGKILL, or
//! SIGTERM and SIGKILL after `term_wait`: gcsfuse v3.11.2 cannot unmount a `/dev/fd/N` mount,
//! so it would serve on for 30 s) and
//! reaps it. A gcsfuse still busy is left to the SIGKILL that ends drainfs at the grace
//! period's end (the sidecar mounter's, 5 s after its SIGTERM), as the stock sidecar leaves
//! it; drainfs SIGKILLs it itself only at the bound ([`handoff::give_up_at`]), past that.
//! The decisions are pure ([`crate::handoff`]); this file only reads, signals and waits.

use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use tokio::time::Instant as TokioInstant;

use super::data_path::{DataPath, PathEvent};
use super::executor::Executor;
use super::lower::Lower;
use crate::config::{CleanSigtermExit, HandoffOptions, LowerProcess};
use crate::drain::{Cause, Ending, ExitCode, Phase};
use crate::fs::Admission;
use crate::handoff::{self, CpuSample, CpuWatch, IdleWatch, IoSample, Stop, StopStep};
use crate::summary::{HandoffFacts, HandoffSummary, LogEntry};
use crate::{procs, summary};

/// The least idle window while gcsfuse's TCP connections cannot be seen
/// ([`handoff::tcp::TIE_PROTECT_MS`]).
const TIE_PROTECT: Duration = Duration::from_millis(handoff::tcp::TIE_PROTECT_MS as u64);

/// gcsfuse as handed the connection: its pid and what is known of its I/O.
pub(super) struct HandoffPath {
    pid: i32,
    opts: HandoffOptions,
    watch: IdleWatch,
    next_sample: Instant,
    /// The `sock_diag` socket that shows gcsfuse's TCP connections (`None` once it failed:
    /// the counters alone decide).
    diag: Option<Diag>,
    /// Why the connections could not be seen, once they could not.
    diag_failed: Option<String>,
    /// The verdicts of gcsfuse's connections at the previous sample.
    judge: handoff::tcp::Judge,
    /// gcsfuse's threads at the previous sample.
    cpu: CpuWatch,
}

impl DataPath for HandoffPath {
    type Start = ();

    async fn start(ex: &mut Executor, _: ()) -> Result<Self, ExitCode> {
        let opts = ex.cfg.handoff.clone().ok_or(ExitCode::Usage)?;
        let LowerProcess::Spawn { argv } = ex.cfg.lifecycle.lower_process.clone() else {
            return Err(ExitCode::Usage);
        };
        ex.record.handoff = Some(HandoffFacts {
            idle_window: opts.idle_window,
            ..HandoffFacts::default()
        });
        let (pid, exit) = match spawn_handed(&argv) {
            Ok(v) => v,
            Err(e) => {
                let what = format!("cannot start {}: {e}", argv[0].to_string_lossy());
                // The sidecar mounter copies this to the volume's error file, as it would
                // its own failure to start gcsfuse.
                eprintln!("drainfs: error: {what}");
                tracing::error!(error = %e, "cannot start gcsfuse");
                ex.record.notes.push(what.clone());
                ex.on_event(super::Event::Trigger(Cause::LowerDied { detail: what }));
                return Err(ExitCode::LowerFailed);
            }
        };
        // gcsfuse holds the connection now; drainfs's copies would keep the mount alive (hung)
        // after gcsfuse dies, instead of failing it.
        let closed = procs::close_fuse_fds(None);
        tracing::debug!(fds = ?closed, "handoff: closed drainfs's copies of the FUSE connection");
        tracing::info!(
            pid,
            gcsfuse = %argv[0].to_string_lossy(),
            idle_window = ?opts.idle_window,
            "handoff: gcsfuse started on the kernel's connection; drainfs is not in the data path"
        );
        ex.lower = Lower::spawned(pid, exit);
        if let Some(f) = ex.record.handoff.as_mut() {
            f.gcsfuse_pid = Some(pid);
        }
        ex.shared.set_lower_up(true);
        ex.shared.set_started();
        ex.serving("gcsfuse started");
        let (diag, diag_failed) = match Diag::open() {
            Ok(d) => (Some(d), None),
            Err(e) => (None, Some(e)),
        };
        let mut watch = IdleWatch::new(opts.idle_window);
        if diag_failed.is_some() {
            watch.widen_to(TIE_PROTECT);
        }
        let mut hp = HandoffPath {
            pid,
            watch,
            next_sample: Instant::now(),
            opts,
            diag,
            diag_failed,
            judge: handoff::tcp::Judge::default(),
            cpu: CpuWatch::default(),
        };
        hp.sample();
        Ok(hp)
    }

    /// Samples gcsfuse's counters on time; nothing to report.
    async fn next_event(&mut self, _: &Admission, _: bool) -> PathEvent {
        tokio::time::sleep_until(TokioInstant::from_std(self.next_sample)).await;
        self.sample();
        PathEvent::Nothing
    }

    fn open_paths(&self, _: usize) -> Vec<String> {
        Vec::new()
    }

    fn admitted_paths(&self, _: usize) -> Vec<String> {
        Vec::new()
    }

    async fn unmounted_externally(&mut self, _: &mut Executor) {}

    fn provisional(&self, ex: &Executor) -> Option<LogEntry> {
        let mut record = ex.record.clone();
        if let Some(f) = record.handoff.as_mut() {
            f.bound_ms = bound_ms(ex);
        }
        Some(HandoffSummary::provisional(&ex.machine, &record).into())
    }

    async fn teardown(mut self, ex: &mut Executor, _: Ending) -> ExitCode {
        ex.advance(Phase::StoppingLower, "waiting for gcsfuse to be idle");
        let bound = bound_ms(ex);
        if let Some(f) = ex.record.handoff.as_mut() {
            f.bound_ms = bound;
        }
        if ex.lower.exited().is_none() {
            let stop = self.wait_idle(ex).await;
            if let Some(stop) = stop {
                self.end_gcsfuse(ex, stop).await;
            }
        }
        if let Some(d) = &self.diag {
            tracing::debug!(
                dumps = d.dumps,
                lookups = d.lookups,
                "handoff: how gcsfuse's connections were read"
            );
        }
        let st = ex.lower.exited();
        if let Some(st) = &st {
            ex.record.lower_exit = Some(procs::describe(st));
        }
        ex.record.timings.lower_exited_ms = ex.ms_since_trigger();
        ex.shared.set_lower_up(false);
        ExitCode::Clean
    }
}

impl HandoffPath {
    /// Reads gcsfuse's counters, then its threads and its connections unless the counters
    /// moved ([`CpuWatch::skip`]: a busy gcsfuse costs one read of `/proc/PID/io` per sample,
    /// plus the tie hold's lookups), into the watch, dated when the reads are done, and
    /// schedules the next read.
    fn sample(&mut self) {
        let io = read_io(self.pid);
        let pid = self.pid;
        let mut cpu = None;
        let (io_moved, ran) = handoff::activity(&self.watch, &mut self.cpu, io, || {
            cpu = read_cpu(pid);
            cpu
        });
        let moved = io_moved || ran;
        // Only while the counters stand still does a connection waiting count. With a tie hold
        // (a window under 2 s), every sample judges the connections, since a tie is told from
        // the socket's previous sample; without one, they are read only when it counts.
        let hold = handoff::tcp::tie_hold_ms(self.watch.window().as_millis() as u64);
        let awaiting = if moved {
            if hold > 0 {
                self.keep_history(hold);
            }
            false
        } else {
            self.awaiting_answer()
        };
        // The sample is dated when its last read is done: what it saw held then.
        let now = Instant::now();
        if (moved || awaiting) && self.watch.still_for(now) >= self.opts.sample_every {
            tracing::debug!(io = ?io, cpu = ?cpu, ran, awaiting, after_still_ms = self.watch.still_for(now).as_millis() as u64, "handoff: gcsfuse is active");
        }
        tracing::trace!(io = ?io, cpu = ?cpu, ran, awaiting, "handoff: sample");
        self.watch.sample_with(now, io, awaiting || ran);
        self.next_sample = now + self.opts.sample_every;
    }

    /// While gcsfuse is active: the sockets already known are looked up again, so that each
    /// keeps the previous sample a tie is judged from, and nothing else is read (no `/proc`
    /// fd scan, no dump for a socket opened meanwhile: a random reader's gcsfuse opens a
    /// connection for many of its reads, and each would cost a dump). A socket first seen at a
    /// still sample is judged from its start, which holds a tie unless the connection made
    /// just one exchange ([`handoff::tcp::TcpSock::awaiting`]).
    fn keep_history(&mut self, hold: u32) {
        let Some(diag) = self.diag.as_mut() else {
            return;
        };
        let socks = diag.known();
        let owned: Vec<u32> = socks.iter().map(|s| s.inode).collect();
        self.judge.waiting(&socks, &owned, hold);
    }

    /// Whether one of gcsfuse's TCP connections waits for an answer ([`handoff::tcp`]); false
    /// when that cannot be seen (the first failure is kept for the summary, and the counters
    /// alone decide from then on).
    fn awaiting_answer(&mut self) -> bool {
        let Some(diag) = self.diag.as_mut() else {
            return false;
        };
        let links: Vec<String> = std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| std::fs::read_link(e.path()).ok())
                    .map(|t| t.to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        let owned = handoff::tcp::socket_inodes(links.iter().map(String::as_str));
        if owned.is_empty() {
            return false;
        }
        match diag.owned(&owned) {
            Ok(socks) => {
                tracing::trace!(sockets = ?socks.iter().filter(|s| owned.contains(&s.inode)).collect::<Vec<_>>(), "handoff: gcsfuse's connections");
                let hold = handoff::tcp::tie_hold_ms(self.watch.window().as_millis() as u64);
                let waiting = self.judge.waiting(&socks, &owned, hold);
                if !waiting.is_empty() {
                    tracing::debug!(sockets = ?waiting, tie_hold_ms = hold, "handoff: a connection of gcsfuse waits for an answer");
                }
                !waiting.is_empty()
            }
            Err(e) => {
                tracing::warn!(error = %e, "handoff: cannot see gcsfuse's TCP connections (sock_diag); its I/O counters alone decide when it is idle, over a window of at least 2 s");
                self.watch.widen_to(TIE_PROTECT);
                self.diag = None;
                self.diag_failed = Some(e);
                false
            }
        }
    }

    /// After the trigger: waits until gcsfuse is idle, the bound, a second signal, or
    /// gcsfuse's own exit (`None`). Samples at every wake-up (so that "idle" is never decided
    /// on a sample older than the decision), and on time in between; triggers are fed to the
    /// machine.
    async fn wait_idle(&mut self, ex: &mut Executor) -> Option<Stop> {
        let bound = give_up_at(ex).unwrap_or_else(Instant::now);
        loop {
            self.sample();
            let now = Instant::now();
            let forced = ex.machine.forced().is_some();
            let until = match handoff::stop_step(&self.watch, now, self.next_sample, bound, forced)
            {
                StopStep::End(stop) => {
                    self.note_stop(ex, stop, now);
                    return Some(stop);
                }
                StopStep::Wait { until } => until,
            };
            let exited = ex.lower.wait();
            tokio::select! {
                ev = ex.events.recv() => if let Some(ev) = ev { ex.on_event(ev) },
                st = exited => {
                    tracing::info!(status = %procs::describe(&st), "handoff: gcsfuse exited by itself while drainfs waited for it to be idle");
                    return None;
                }
                _ = tokio::time::sleep_until(TokioInstant::from_std(until)) => {}
            }
        }
    }

    /// Records why and when drainfs ends gcsfuse.
    fn note_stop(&self, ex: &mut Executor, stop: Stop, now: Instant) {
        let still = self.watch.still_for(now);
        let at = ex.ms_since(Some(now));
        match stop {
            Stop::Idle => tracing::info!(
                still_ms = still.as_millis() as u64,
                "handoff: gcsfuse is idle (its I/O counters stood still for the idle window): ending it"
            ),
            Stop::Bound => {
                tracing::warn!(
                    still_ms = still.as_millis() as u64,
                    "handoff: gcsfuse was still doing I/O at the bound: SIGKILL (an upload may be cut)"
                );
                ex.record.notes.push(format!(
                    "gcsfuse was still doing I/O (its counters last moved {} ms before) when drainfs gave up waiting: an upload may have been cut",
                    still.as_millis()
                ));
            }
            Stop::Forced => {
                tracing::warn!("handoff: a second signal while gcsfuse was not idle: SIGKILL");
                ex.record.notes.push(
                    "a second signal came while gcsfuse was still doing I/O: an upload may have been cut".into(),
                );
            }
        }
        if let Some(e) = &self.diag_failed {
            ex.record.notes.push(format!(
                "drainfs could not see gcsfuse's TCP connections ({e}): the idle window was widened to {} ms; an upload waiting for the server's answer longer than that would have looked idle",
                self.watch.window().as_millis()
            ));
        }
        if self.watch.unreadable() > 0 {
            ex.record.notes.push(format!(
                "{} reads of gcsfuse's /proc/PID/io failed; while they fail gcsfuse never counts as idle",
                self.watch.unreadable()
            ));
        }
        if let Some(f) = ex.record.handoff.as_mut() {
            f.stop = Some(stop);
            f.still_ms = Some(still.as_millis() as u64);
            f.idle_ms = (stop == Stop::Idle).then_some(at).flatten();
            f.unreadable_samples = self.watch.unreadable();
        }
    }

    /// Ends gcsfuse: an idle one by SIGTERM, SIGKILL if it has not exited within `term_wait`
    /// (or the hard exit); a busy one (bound, second signal) by SIGKILL at once. Waits for
    /// the reaper within the kill budget.
    async fn end_gcsfuse(&self, ex: &mut Executor, stop: Stop) {
        let pid = nix::unistd::Pid::from_raw(self.pid);
        let mut ended_by = "SIGKILL";
        if stop == Stop::Idle && !self.opts.term_wait.is_zero() {
            let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
            ended_by = "SIGTERM";
            let wait = ex.lower.wait();
            let term_wait = self.opts.term_wait;
            if ex
                .bounded(|b| b.lower_stop.min(term_wait), wait)
                .await
                .is_none()
            {
                ended_by = "SIGKILL";
            }
        }
        if ended_by == "SIGKILL" {
            let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
            let wait = ex.lower.wait();
            let reaped = ex
                .bounded(|b| b.lower_kill.max(Duration::from_millis(500)), wait)
                .await;
            if reaped.is_none() {
                ex.record
                    .notes
                    .push("gcsfuse was SIGKILLed but not reaped in time".into());
            }
        }
        if let Some(f) = ex.record.handoff.as_mut() {
            f.ended_by = Some(ended_by);
        }
    }
}

/// When drainfs gives up waiting for a busy gcsfuse ([`handoff::give_up_at`]; `None` before
/// the first trigger).
fn give_up_at(ex: &Executor) -> Option<Instant> {
    let (t0, _) = ex.machine.first_trigger()?;
    let l = &ex.cfg.lifecycle;
    Some(handoff::give_up_at(t0, l.grace_period, l.grace_margin))
}

/// Milliseconds from the first trigger to the bound ([`give_up_at`]).
fn bound_ms(ex: &Executor) -> Option<u64> {
    ex.ms_since(give_up_at(ex))
}

/// Starts `argv` as handed over: stdio, environment and every inherited fd (the kernel's
/// `/dev/fd/N` among them) as drainfs got them, an empty signal mask, and death with drainfs.
fn spawn_handed(
    argv: &[std::ffi::OsString],
) -> std::io::Result<(i32, tokio::sync::oneshot::Receiver<WaitStatus>)> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    procs::die_with_parent(&mut cmd);
    let (child, exit) = procs::spawn(&mut cmd)?;
    Ok((child.id() as i32, exit))
}

/// A `NETLINK_SOCK_DIAG` socket: the kernel's dump of the TCP sockets of drainfs's network
/// namespace (gcsfuse's), with their `tcp_info`. Unprivileged.
struct Diag {
    fd: std::os::fd::OwnedFd,
    seq: u32,
    /// Where gcsfuse's established sockets were at the last dump, by inode.
    known: std::collections::HashMap<u32, handoff::tcp::DiagKey>,
    /// Dumps and lookups so far (logged at debug when the hand-off ends).
    dumps: u64,
    lookups: u64,
}

impl Diag {
    /// Opens the socket (close-on-exec, 200 ms receive timeout).
    fn open() -> Result<Diag, String> {
        use std::os::fd::FromRawFd;
        // SAFETY: plain socket(2); the fd is owned at once.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_SOCK_DIAG,
            )
        };
        if raw < 0 {
            return Err(format!("socket: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a new fd nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let tv = nix::sys::time::TimeVal::new(0, 200_000);
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &tv)
            .map_err(|e| format!("SO_RCVTIMEO: {e}"))?;
        Ok(Diag {
            fd,
            seq: 0,
            known: std::collections::HashMap::new(),
            dumps: 0,
            lookups: 0,
        })
    }

    /// gcsfuse's established TCP sockets among `owned` (its socket inodes). When each of them
    /// was established at the last dump, each is looked up by its id (a hash lookup in the
    /// kernel per socket); else, or when a lookup does not find it established, one dump of
    /// every established TCP socket of the network namespace (a walk of the kernel's whole
    /// TCP hash table: about 1 ms with 4,000 sockets in TIME_WAIT here) finds them again.
    fn owned(&mut self, owned: &[u32]) -> Result<Vec<handoff::tcp::TcpSock>, String> {
        if owned.iter().all(|i| self.known.contains_key(i)) {
            let socks = self.known();
            if owned.iter().all(|i| socks.iter().any(|s| s.inode == *i)) {
                return Ok(socks
                    .into_iter()
                    .filter(|s| owned.contains(&s.inode))
                    .collect());
            }
        }
        let all = self.established()?;
        self.dumps += 1;
        let mine: Vec<_> = all
            .into_iter()
            .filter(|s| owned.contains(&s.inode))
            .collect();
        self.known = mine.iter().map(|s| (s.inode, s.key)).collect();
        Ok(mine)
    }

    /// The sockets of the last dump that are still established, each looked up by its id;
    /// the others are forgotten.
    fn known(&mut self) -> Vec<handoff::tcp::TcpSock> {
        let keys: Vec<(u32, handoff::tcp::DiagKey)> =
            self.known.iter().map(|(i, k)| (*i, *k)).collect();
        let mut out = Vec::with_capacity(keys.len());
        for (inode, key) in keys {
            match self.lookup(&key) {
                Some(s) if s.inode == inode => out.push(s),
                _ => {
                    self.known.remove(&inode);
                }
            }
        }
        out
    }

    /// The socket at `key` if it is still established (`None` when it is gone, or the
    /// lookup failed: the caller dumps instead).
    fn lookup(&mut self, key: &handoff::tcp::DiagKey) -> Option<handoff::tcp::TcpSock> {
        use std::os::fd::AsRawFd;
        self.seq = self.seq.wrapping_add(1);
        self.lookups += 1;
        let req = handoff::tcp::lookup_request(key, self.seq);
        // SAFETY: `req` is a valid buffer of its length; the fd is open.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
        if n < 0 {
            return None;
        }
        let mut buf = [0u8; 8192];
        // SAFETY: `buf` is writable for its length; the fd is open.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n <= 0 {
            return None;
        }
        let (mut socks, _) = handoff::tcp::parse_dump(&buf[..n as usize]).ok()?;
        (socks.len() == 1).then(|| socks.remove(0))
    }

    /// The established TCP sockets (IPv4 and IPv6) with their last data times.
    fn established(&mut self) -> Result<Vec<handoff::tcp::TcpSock>, String> {
        use std::os::fd::AsRawFd;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 32 << 10];
        for family in [libc::AF_INET as u8, libc::AF_INET6 as u8] {
            self.seq = self.seq.wrapping_add(1);
            let req = handoff::tcp::dump_request(family, self.seq);
            // SAFETY: `req` is a valid buffer of its length; the fd is open.
            let n = unsafe { libc::send(self.fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
            if n < 0 {
                return Err(format!("send: {}", std::io::Error::last_os_error()));
            }
            loop {
                // SAFETY: `buf` is writable for its length; the fd is open.
                let n = unsafe {
                    libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0)
                };
                if n < 0 {
                    return Err(format!("recv: {}", std::io::Error::last_os_error()));
                }
                let (socks, done) = handoff::tcp::parse_dump(&buf[..n as usize])
                    .map_err(|e| format!("sock_diag: {}", nix::errno::Errno::from_raw(e)))?;
                out.extend(socks);
                if done || n == 0 {
                    break;
                }
            }
        }
        Ok(out)
    }
}

/// A small `/proc` file's text in one `read(2)` into `buf` (no `statx` for a size hint, no
/// second read for the end of file, as `read_to_string` would do: this runs for each of
/// gcsfuse's threads every sample). A text longer than `buf` is cut at its length; the
/// files read here are under 1 KiB.
fn read_proc<'a>(path: &std::path::Path, buf: &'a mut [u8]) -> std::io::Result<&'a str> {
    use std::io::Read;
    let n = std::fs::File::open(path)?.read(buf)?;
    std::str::from_utf8(&buf[..n])
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData))
}

/// gcsfuse's counters now (`None` when `/proc/PID/io` cannot be read or parsed).
fn read_io(pid: i32) -> Option<IoSample> {
    let mut buf = [0u8; 1024];
    IoSample::parse(read_proc(std::path::Path::new(&format!("/proc/{pid}/io")), &mut buf).ok()?)
}

/// gcsfuse's threads now, from `/proc/PID/task/*/schedstat` and `stat` (`None` when the
/// task list or a live thread's `schedstat` cannot be read: a kernel without
/// `CONFIG_SCHED_INFO`; a thread that ended between the list and its read is left out).
fn read_cpu(pid: i32) -> Option<CpuSample> {
    let mut sample = CpuSample::default();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let dir = task.path();
        let mut buf = [0u8; 1024];
        let on_cpu = match read_proc(&dir.join("schedstat"), &mut buf) {
            Ok(text) => CpuSample::parse_schedstat(text)?,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => continue,
            Err(_) => return None,
        };
        let state = read_proc(&dir.join("stat"), &mut buf)
            .ok()
            .and_then(CpuSample::parse_state);
        sample.add_thread(on_cpu, state);
    }
    Some(sample)
}

/// The end of a hand-off: the summary (from the record and the machine) and how drainfs
/// ends ([`handoff::ending`]).
pub(super) fn finish(ex: &mut Executor) -> (HandoffSummary, super::Exit) {
    ex.end_run();
    let stop = ex.record.handoff.as_ref().and_then(|f| f.stop);
    let sigterm_exit = matches!(ex.machine.first_trigger(), Some((_, Cause::Sigterm)))
        && ex
            .cfg
            .handoff
            .as_ref()
            .is_some_and(|o| o.clean_sigterm_exit == CleanSigtermExit::Signal);
    let status = ex
        .lower
        .exited()
        .unwrap_or(WaitStatus::Exited(nix::unistd::Pid::from_raw(0), 0));
    // A stop from outside (not gcsfuse's own end, which the serve loop reports as a trigger).
    let stopped = ex
        .machine
        .first_trigger()
        .is_some_and(|(_, c)| !matches!(c, Cause::LowerDied { .. }));
    let mut ending = handoff::ending(stop, stopped, sigterm_exit, &status);
    if ex.lower.exited().is_none()
        && ex
            .record
            .handoff
            .as_ref()
            .and_then(|f| f.gcsfuse_pid)
            .is_none()
    {
        // gcsfuse never started.
        ending = handoff::Ending {
            outcome: handoff::outcome::GCSFUSE_EXITED,
            code: ExitCode::LowerFailed.code(),
            raise: None,
        };
    }
    let s = summary::HandoffSummary::new(&ending, &ex.machine, &ex.record);
    (
        s,
        super::Exit {
            code: ending.raise.map_or(ending.code, |sig| 128 + sig as i32),
            raise: ending.raise,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    /// The socket inode of `s`, as `/proc/PID/fd` shows it.
    fn inode(s: &std::net::TcpStream) -> u32 {
        let st = nix::sys::stat::fstat(s).unwrap();
        st.st_ino as u32
    }

    /// The kernel's own dump, on loopback: a request sent right after the previous answer
    /// arrived (often in the same timestamp step: a tie) waits for its answer until the
    /// server answers, and the connection is idle after that.
    #[test]
    fn sock_diag_tells_a_request_waiting_from_an_answered_one() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut srv, _) = l.accept().unwrap();
        c.set_nodelay(true).unwrap();
        srv.set_nodelay(true).unwrap();
        let mut buf = [0u8; 64];
        let mut diag = Diag::open().unwrap();
        // The hold of a 500 ms window.
        const HOLD: u32 = 1_500;
        let ino = inode(&c);
        let mut judge = handoff::tcp::Judge::default();
        // Whether the connection reads as `waiting` within 5 s (the first read printed).
        let mut turns = |what: &str, waiting: bool| {
            let end = Instant::now() + Duration::from_secs(5);
            for n in 0.. {
                let socks = diag.owned(&[ino]).unwrap();
                let s = *socks.iter().find(|s| s.inode == ino).unwrap();
                let now = !judge.waiting(&socks, &[ino], HOLD).is_empty();
                if n == 0 || now == waiting {
                    eprintln!("{what}: {s:?}");
                }
                if now == waiting {
                    return true;
                }
                if Instant::now() > end {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            unreachable!()
        };
        // One exchange, then the next request at once, then the server thinks.
        c.write_all(b"GET /1").unwrap();
        let n = srv.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"GET /1");
        srv.write_all(b"200 one").unwrap();
        c.read_exact(&mut buf[..7]).unwrap();
        c.write_all(b"PUT /2").unwrap();
        let n = srv.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"PUT /2");
        // At the latest once the server's delayed ACK (40 ms on Linux) breaks a tie.
        assert!(
            turns("the server thinks", true),
            "the request never read as waiting for its answer"
        );
        srv.write_all(b"200 two").unwrap();
        c.read_exact(&mut buf[..7]).unwrap();
        // Answered: at once, or when the answer shares the request's step (a tie), once the
        // tie is older than the hold.
        assert!(
            turns("answered", false),
            "an answered request still reads as waiting"
        );
        // And stays so: nothing else arrives on an idle connection.
        std::thread::sleep(Duration::from_millis(100));
        assert!(turns("answered, later", false));
        // One dump found the socket; every later read was a lookup of it alone.
        assert_eq!(diag.dumps, 1, "lookups {}", diag.lookups);
        assert!(diag.lookups >= 2, "lookups {}", diag.lookups);
        // While gcsfuse is active, only the sockets known are looked up: this one.
        let lookups = diag.lookups;
        assert_eq!(
            diag.known().iter().map(|s| s.inode).collect::<Vec<_>>(),
            [ino]
        );
        assert_eq!((diag.dumps, diag.lookups), (1, lookups + 1));
        // Once it is gone, the lookup misses, it is forgotten, and a dump no longer finds it.
        drop(c);
        drop(srv);
        assert!(diag.known().is_empty());
        assert!(diag.known.is_empty());
        assert!(diag.owned(&[ino]).unwrap().is_empty());
        assert_eq!(diag.dumps, 2);
    }
}

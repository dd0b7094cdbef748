//! The hand-off's decisions, pure (no clock, no `/proc`, no signal: every ordering is
//! unit-tested with fake time); the lifecycle's executor ([`crate::lifecycle`], its
//! `handoff_path.rs`) reads the clock and gcsfuse's `/proc/PID/io`, sends the signals and
//! reaps.
//!
//! In hand-off mode drainfs is not in the data path: gcsfuse holds the kernel's FUSE
//! connection itself. What drainfs can see of it from outside is how much I/O its process
//! does ([`IoSample`], the counters of `/proc/PID/io`, summed over its threads): a FUSE request
//! moves them (gcsfuse reads it from `/dev/fuse` and writes its reply), and so does an upload
//! (its HTTP connection's reads and writes). [`IdleWatch`] keeps when they last moved;
//! gcsfuse counts as idle once they have stood still for the idle window. [`stop_step`]
//! decides, after the sidecar mounter's stop, between waiting, ending an idle gcsfuse, and
//! giving up at the bound; [`ending`] chooses how drainfs itself ends so that the sidecar
//! mounter sees what it sees of gcsfuse today.
//!
//! What the counters cannot tell: an upload whose HTTP request is waiting for the server's
//! answer (no byte moves). [`tcp`] tells it from gcsfuse's TCP connections (one that sent data
//! after the last data it received waits for an answer, and so does one with bytes unread or
//! unacknowledged), where the kernel lets drainfs see them; without that, such a pause longer
//! than the idle window looks idle, and the executor widens the window to at least
//! [`tcp::TIE_PROTECT_MS`]. Nor can they tell work without a system call (a checksum, a
//! thread waiting for a CPU under load): [`CpuSample`] tells it from the scheduler's view of
//! gcsfuse's threads.

pub mod tcp;

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use serde::Serialize;

/// The counters of `/proc/PID/io` drainfs compares (bytes and system calls).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoSample {
    /// Bytes read through read-like calls (`rchar`), sockets and `/dev/fuse` included.
    pub rchar: u64,
    /// Bytes written through write-like calls (`wchar`).
    pub wchar: u64,
    /// Read-like system calls (`syscr`).
    pub syscr: u64,
    /// Write-like system calls (`syscw`).
    pub syscw: u64,
    /// Bytes fetched from storage (`read_bytes`).
    pub read_bytes: u64,
    /// Bytes sent to storage (`write_bytes`).
    pub write_bytes: u64,
}

impl IoSample {
    /// Parses the text of `/proc/PID/io` (`name: value` lines). `None` when any of the six
    /// counters is missing or not a number.
    pub fn parse(text: &str) -> Option<IoSample> {
        let mut v = [None; 6];
        const NAMES: [&str; 6] = [
            "rchar",
            "wchar",
            "syscr",
            "syscw",
            "read_bytes",
            "write_bytes",
        ];
        for line in text.lines() {
            let Some((k, n)) = line.split_once(':') else {
                continue;
            };
            if let Some(i) = NAMES.iter().position(|name| *name == k.trim()) {
                v[i] = Some(n.trim().parse::<u64>().ok()?);
            }
        }
        Some(IoSample {
            rchar: v[0]?,
            wchar: v[1]?,
            syscr: v[2]?,
            syscw: v[3]?,
            read_bytes: v[4]?,
            write_bytes: v[5]?,
        })
    }
}

/// The least number of bytes read and written between two samples that counts as activity.
/// Smaller changes are the Go runtime's own, not gcsfuse's work: measured on an idle gcsfuse
/// v3.11.2, 8-byte eventfd reads and writes (the netpoller's wake-ups) and 3-byte reads, a few
/// times a minute. A FUSE request alone reads at least 40 bytes (its header) and an HTTP
/// exchange hundreds, so nothing that matters is below it.
pub const NOISE_BYTES: u64 = 32;

impl IoSample {
    /// Whether going from `self` to `next` is activity: at least [`NOISE_BYTES`] read and
    /// written, or any storage I/O (`read_bytes`, `write_bytes`: a staged write's temp file).
    /// Counters that went backwards (another process with the pid) count too.
    pub fn moved_to(&self, next: &IoSample) -> bool {
        let grew = |a: u64, b: u64| b.checked_sub(a);
        let bytes = grew(self.rchar, next.rchar)
            .zip(grew(self.wchar, next.wchar))
            .map(|(r, w)| r + w);
        match bytes {
            None => true,
            Some(b) => {
                b >= NOISE_BYTES
                    || next.read_bytes != self.read_bytes
                    || next.write_bytes != self.write_bytes
            }
        }
    }
}

/// gcsfuse's threads as the scheduler sees them, over `/proc/PID/task/*`: their time on a CPU
/// summed (`schedstat`'s first field, ns; it needs Linux's `CONFIG_SCHED_INFO`, on in this
/// machine's Debian 6.18 kernel; where it is missing the read fails and the I/O counters and
/// the connections decide alone), and how many of them were runnable (`R`) or in an
/// uninterruptible wait (`D`, a disk write of a staged file, for example) when read (`stat`'s
/// state).
///
/// A gcsfuse that computes without a system call (a checksum, a CPU it waits for under load)
/// moves no counter of `/proc/PID/io`; this shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuSample {
    /// Time its threads ran on a CPU, summed (ns).
    pub on_cpu_ns: u64,
    /// Threads runnable (`R`) when read: running, or waiting for a CPU.
    pub runnable: u32,
    /// Threads in an uninterruptible wait (`D`) when read.
    pub blocked: u32,
}

/// The least CPU time between two samples that counts as activity (ns): 1 ms. Measured on an
/// idle gcsfuse v3.11.2 (2026-12-06, 200 samples 50 ms apart over 10 s, beside a loaded suite
/// run): no CPU time in 199 samples, 0.7 ms in one (the Go runtime's own).
pub const CPU_NOISE_NS: u64 = 1_000_000;

impl CpuSample {
    /// The time on a CPU from the text of `/proc/PID/task/TID/schedstat` (`run_ns wait_ns
    /// slices`, ns), `None` when it is not a number.
    pub fn parse_schedstat(text: &str) -> Option<u64> {
        text.split_whitespace().next()?.parse().ok()
    }

    /// The state letter from the text of `/proc/PID/task/TID/stat` (the field after the
    /// command, which is in parentheses and may hold any byte), `None` when malformed.
    pub fn parse_state(text: &str) -> Option<char> {
        text.rsplit_once(')')?
            .1
            .split_whitespace()
            .next()?
            .chars()
            .next()
    }

    /// Adds one thread: its time on a CPU and its state letter.
    pub fn add_thread(&mut self, on_cpu_ns: u64, state: Option<char>) {
        self.on_cpu_ns += on_cpu_ns;
        match state {
            Some('R') => self.runnable += 1,
            Some('D') => self.blocked += 1,
            _ => {}
        }
    }

    /// Whether going from `self` to `next` is activity: at least [`CPU_NOISE_NS`] on a CPU, a
    /// thread runnable or in an uninterruptible wait at `next`, or a sum that went backwards
    /// (a thread ended, or another process has the pid).
    pub fn moved_to(&self, next: &CpuSample) -> bool {
        next.runnable > 0
            || next.blocked > 0
            || next
                .on_cpu_ns
                .checked_sub(self.on_cpu_ns)
                .is_none_or(|d| d >= CPU_NOISE_NS)
    }
}

/// Whether gcsfuse's threads were busy between two samples ([`CpuSample::moved_to`]), from
/// one sample to the next. A sample whose I/O counters moved is active without its threads,
/// which are then not read ([`CpuWatch::skip`]): the next reading has nothing to compare
/// with and counts as busy, so the idle window runs from the first sample after the I/O, one
/// sampling interval later than with the threads read at every sample.
#[derive(Debug, Clone, Default)]
pub struct CpuWatch {
    last: Option<CpuSample>,
    skipped: bool,
}

impl CpuWatch {
    /// Records `next` (`None`: it could not be read) and says whether gcsfuse was busy since
    /// the previous one: true after a [`CpuWatch::skip`]. Without two readable samples in a
    /// row nothing is known, and the I/O counters and the connections decide alone: not busy.
    pub fn busy(&mut self, next: Option<CpuSample>) -> bool {
        let busy =
            self.skipped || matches!((self.last, next), (Some(a), Some(b)) if a.moved_to(&b));
        self.last = next;
        self.skipped = false;
        busy
    }

    /// The threads were not read at this sample (its I/O counters moved): what they did
    /// since is unknown, so the next [`CpuWatch::busy`] says busy.
    pub fn skip(&mut self) {
        self.last = None;
        self.skipped = true;
    }
}

/// One sample's activity: whether gcsfuse's I/O counters moved since the watch's last sample
/// (a sample that could not be read, after one that could, or the reverse, is a change), and,
/// only when they did not, whether its threads ran (`read_threads` is called then, and its
/// result goes to `cpu`); when they moved, the threads are not read ([`CpuWatch::skip`]).
/// Returns `(counters moved, threads ran)`.
pub fn activity(
    watch: &IdleWatch,
    cpu: &mut CpuWatch,
    io: Option<IoSample>,
    read_threads: impl FnOnce() -> Option<CpuSample>,
) -> (bool, bool) {
    let io_moved = match (watch.last(), io) {
        (Some(a), Some(b)) => a.moved_to(&b),
        (a, b) => a.is_some() != b.is_some(),
    };
    if io_moved {
        cpu.skip();
        return (true, false);
    }
    (false, cpu.busy(read_threads()))
}

/// When gcsfuse's I/O counters last moved, from samples read at known times.
///
/// A change is dated at the sample that showed it (it happened at most one sampling
/// interval earlier; the executor dates a sample when its last read is done, not when it
/// began), and stillness runs only to the last sample read, never to "now": gcsfuse is idle
/// once a sample taken a whole window after the last change still shows none. So the
/// stillness measured is never longer than the stillness seen, however late a sample or a
/// decision comes (a drainfs descheduled for 750 ms in the middle of a sample, under
/// `stress-ng --cpu 2`, once took a sample begun before a request waited and read after it
/// for 749 ms of stillness). The first sample counts as a change (nothing is known before it),
/// and so does a sample that could not be read: while the counters cannot be read, gcsfuse is
/// never idle. Changes below [`NOISE_BYTES`] are not activity ([`IoSample::moved_to`]).
#[derive(Debug, Clone)]
pub struct IdleWatch {
    window: Duration,
    last: Option<IoSample>,
    moved_at: Option<Instant>,
    /// When the last sample was read.
    last_at: Option<Instant>,
    unreadable: u64,
}

impl IdleWatch {
    /// A watch with no sample yet; gcsfuse is idle once its counters stood still `window`.
    pub fn new(window: Duration) -> IdleWatch {
        IdleWatch {
            window,
            last: None,
            moved_at: None,
            last_at: None,
            unreadable: 0,
        }
    }

    /// The idle window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Widens the window to at least `floor` (when gcsfuse's TCP connections cannot be seen,
    /// the window alone must cover a request waiting for its answer).
    pub fn widen_to(&mut self, floor: Duration) {
        self.window = self.window.max(floor);
    }

    /// Records a sample read at `now` (`None`: `/proc/PID/io` could not be read).
    pub fn sample(&mut self, now: Instant, s: Option<IoSample>) {
        self.sample_with(now, s, false);
    }

    /// [`IdleWatch::sample`], and whether gcsfuse was busy in a way its counters do not show
    /// (`busy`): one of its connections waits for an answer ([`tcp::Judge::waiting`]: a
    /// request in flight is activity, although no counter moves while the server thinks), or
    /// its threads ran ([`CpuWatch::busy`]).
    pub fn sample_with(&mut self, now: Instant, s: Option<IoSample>, busy: bool) {
        if s.is_none() {
            self.unreadable += 1;
        }
        let moved = busy
            || match (self.last, s) {
                (Some(a), Some(b)) => a.moved_to(&b),
                _ => true,
            };
        if moved {
            self.moved_at = Some(now);
        }
        self.last = s;
        self.last_at = Some(now);
    }

    /// The last sample (`None` before the first, or when it could not be read).
    pub fn last(&self) -> Option<IoSample> {
        self.last
    }

    /// How many samples could not be read.
    pub fn unreadable(&self) -> u64 {
        self.unreadable
    }

    /// How long the counters were seen to stand still by `now`: from the last change to the
    /// last sample read by then, not to `now` (zero before the first sample, or while the last
    /// sample could not be read).
    pub fn still_for(&self, now: Instant) -> Duration {
        match (self.last, self.moved_at, self.last_at) {
            (Some(_), Some(t), Some(seen)) => seen.min(now).saturating_duration_since(t),
            _ => Duration::ZERO,
        }
    }

    /// Whether the counters were seen to stand still for the whole window by `now`.
    pub fn is_idle(&self, now: Instant) -> bool {
        self.last.is_some() && self.still_for(now) >= self.window
    }

    /// When gcsfuse becomes idle if nothing moves: the last change plus the window, to be
    /// confirmed by a sample read then (`None` while the last sample could not be read).
    pub fn idle_at(&self) -> Option<Instant> {
        self.last?;
        self.moved_at.map(|t| t + self.window)
    }
}

/// Why drainfs ends gcsfuse after a stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// Its counters stood still for the idle window.
    Idle,
    /// The bound ([`give_up_at`]: the grace period and the margin after it) came first:
    /// gcsfuse was still doing I/O, and nothing had killed drainfs.
    Bound,
    /// A second signal: stop waiting.
    Forced,
}

/// What the executor does next while stopping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopStep {
    /// Wait for an event, gcsfuse's exit, or `until` (then sample again and ask again).
    Wait {
        /// The next sample, the time gcsfuse would turn idle, or the bound, whichever first.
        until: Instant,
    },
    /// End gcsfuse now, for this reason.
    End(Stop),
}

/// After the stop: end an idle gcsfuse at once; else wait for the next sample, for the time
/// it would turn idle, or for the `bound`, whichever comes first; give up at the bound or on a
/// second signal (`forced`). Idle wins over the bound and the force: a gcsfuse whose counters
/// stood still the whole window is ended as idle whenever it is seen so.
pub fn stop_step(
    watch: &IdleWatch,
    now: Instant,
    next_sample: Instant,
    bound: Instant,
    forced: bool,
) -> StopStep {
    if watch.is_idle(now) {
        return StopStep::End(Stop::Idle);
    }
    if forced {
        return StopStep::End(Stop::Forced);
    }
    if now >= bound {
        return StopStep::End(Stop::Bound);
    }
    let mut until = next_sample.min(bound);
    if let Some(t) = watch.idle_at() {
        until = until.min(t.max(now));
    }
    StopStep::Wait { until }
}

/// When drainfs gives up waiting for a busy gcsfuse and SIGKILLs it itself: `margin` after
/// the end of the grace period (`t0`, the first trigger, plus `grace`).
///
/// The grace period is the time to the SIGKILL that ends drainfs: GKE's sidecar mounter
/// (v1.24.4: `cmd.Cancel` sends the SIGTERM, `forceKillCmd` the SIGKILL after
/// `gracefulKillGracePeriod`) SIGKILLs its child 5 s after its SIGTERM, and gcsfuse dies with
/// drainfs. So an upload in flight runs exactly as long as under the stock
/// sidecar, whose SIGKILL ends gcsfuse at the same moment, and the termination log keeps
/// drainfs's provisional summary (`stopping`, 75). drainfs kills gcsfuse itself only when
/// nothing has killed drainfs by then (run by hand, or a sender that is late).
pub fn give_up_at(t0: Instant, grace: Duration, margin: Duration) -> Instant {
    t0 + grace + margin
}

/// How drainfs ends, from how gcsfuse ended: the summary's exit code and the signal to end
/// by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ending {
    /// The summary's `outcome`.
    pub outcome: &'static str,
    /// The summary's `exit_code`: 0 for a stop with gcsfuse idle (also when drainfs then ends
    /// by SIGTERM), 75 when an upload may have been cut, gcsfuse's status when it ended by
    /// itself (128+N for signal N). The process's status is 128+N when it ends by `raise`.
    pub code: i32,
    /// The signal drainfs ends by (default action, after its summary), if any.
    pub raise: Option<Signal>,
}

/// The summary's `outcome` of each ending.
pub mod outcome {
    /// Stopped, gcsfuse idle, ended by drainfs (or it exited 0 by itself meanwhile).
    pub const IDLE: &str = "idle";
    /// Stopped, gcsfuse still doing I/O at the bound: SIGKILLed, an upload may be cut.
    pub const BUSY_AT_BOUND: &str = "busy_at_bound";
    /// A second signal while gcsfuse was not idle: SIGKILLed, an upload may be cut.
    pub const FORCED: &str = "forced";
    /// gcsfuse ended by itself (no stop, or not a clean exit after one): drainfs ends the
    /// same way.
    pub const GCSFUSE_EXITED: &str = "gcsfuse_exited";
}

/// How drainfs ends once gcsfuse ended with `status`. `stop`: why drainfs ended it (`None`:
/// it ended by itself). `stopped`: a stop (trigger) had come. `sigterm_exit`: the stop's
/// trigger was SIGTERM and a clean stop ends by SIGTERM (`--clean-sigterm-exit signal`), so
/// that GKE's sidecar mounter logs "gcsfuse was terminated" and writes nothing to the error
/// file (an exit 0 after its cancel would be the error "context canceled").
///
/// - Ended by drainfs when idle, or exited 0 by itself after a stop: `idle`, 0 (or SIGTERM).
/// - Ended by drainfs at the bound or on a second signal while busy: 75 (data may be
///   incomplete: an upload may have been cut).
/// - Otherwise gcsfuse ended by itself: drainfs ends the same way (its exit status, or the
///   same signal), so the sidecar mounter and the node driver see what they see of gcsfuse.
pub fn ending(
    stop: Option<Stop>,
    stopped: bool,
    sigterm_exit: bool,
    status: &WaitStatus,
) -> Ending {
    let clean = Ending {
        outcome: outcome::IDLE,
        code: 0,
        raise: None,
    };
    let clean = Ending {
        raise: sigterm_exit.then_some(Signal::SIGTERM),
        ..clean
    };
    match stop {
        Some(Stop::Idle) => clean,
        Some(s) => Ending {
            outcome: if s == Stop::Bound {
                outcome::BUSY_AT_BOUND
            } else {
                outcome::FORCED
            },
            code: crate::drain::ExitCode::Incomplete.code(),
            raise: None,
        },
        None => match status {
            WaitStatus::Exited(_, 0) if stopped => clean,
            WaitStatus::Exited(_, code) => Ending {
                outcome: outcome::GCSFUSE_EXITED,
                code: *code,
                raise: None,
            },
            WaitStatus::Signaled(_, sig, _) => Ending {
                outcome: outcome::GCSFUSE_EXITED,
                code: 128 + *sig as i32,
                raise: Some(*sig),
            },
            _ => Ending {
                outcome: outcome::GCSFUSE_EXITED,
                code: crate::drain::ExitCode::LowerFailed.code(),
                raise: None,
            },
        },
    }
}

/// The FUSE connection's fd number, when gcsfuse's mount point (its last argument) is
/// `/dev/fd/N` (GKE's node driver mounted the connection and hands it over); `None` for a
/// directory (GKE's shared-mount mode, where gcsfuse mounts itself).
pub fn kernel_fd(argv: &[std::ffi::OsString]) -> Option<RawFd> {
    use std::os::unix::ffi::OsStrExt;
    let last = argv.last()?;
    let n = last.as_bytes().strip_prefix(b"/dev/fd/")?;
    std::str::from_utf8(n)
        .ok()?
        .parse::<RawFd>()
        .ok()
        .filter(|n| *n >= 0)
}

#[cfg(test)]
mod tests;

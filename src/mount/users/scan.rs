//! The bounded scan for writers: every process of drainfs's PID namespace is read
//! ([`super::probe`]) on a helper thread, one process at a time, and a process whose `/proc`
//! files do not answer within [`PER_PROCESS`] while the helper is asleep in the kernel (not
//! runnable: waiting on the process's memory-map lock, say) is given up on: it is
//! *unanswered* (it may be a writer), the helper stays behind, asleep in its read (a killable
//! sleep: it ends when the read returns or drainfs exits), and a fresh helper goes on with the
//! processes left. A helper that is only slow (runnable: a loaded or throttled CPU) gets up
//! to [`SLOW_LIMIT`] times the deadline before it is given up too. A
//! later scan does not read a process again while a helper is still asleep on it, and gives
//! up on the rest at once once [`MAX_STUCK`] helpers are asleep.
//!
//! The decisions (when to give a process up, when to start a helper, when the scan is over)
//! are made by [`ScanState`], pure and tested with fake time; [`scan`] is the executor.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long one process's `/proc` files may take to be read before the scan gives it up. A
/// healthy process answers in microseconds; a wait means its memory-map lock is held by a
/// task that waits on something else (a wedged FUSE daemon).
pub const PER_PROCESS: Duration = Duration::from_millis(250);

/// How many times [`PER_PROCESS`] a helper that is runnable (slow, not stuck) may take on one
/// process.
pub const SLOW_LIMIT: u32 = 8;

/// How many helpers may be asleep in a read at once (over every scan of the run); beyond
/// that, a scan reads nothing and reports every process it has not read as unanswered.
pub const MAX_STUCK: usize = 8;

/// What a scan found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Scan {
    /// The processes that write on the superblock (`pid comm`).
    pub writers: Vec<String>,
    /// The processes whose `/proc` files did not answer in time (or were not read, see
    /// [`MAX_STUCK`]): each may be a writer.
    pub unanswered: Vec<i32>,
}

/// What the caller should take from a [`Scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every process answered and none writes.
    NoWriter,
    /// These processes write (whatever the unanswered ones do).
    Writers(Vec<String>),
    /// None of those that answered writes, but these did not answer: a writer may exist.
    Unknown(Vec<i32>),
}

impl Scan {
    /// The scan's verdict: a process that did not answer counts as a possible writer.
    pub fn verdict(&self) -> Verdict {
        if !self.writers.is_empty() {
            Verdict::Writers(self.writers.clone())
        } else if !self.unanswered.is_empty() {
            Verdict::Unknown(self.unanswered.clone())
        } else {
            Verdict::NoWriter
        }
    }
}

/// What [`ScanState::next`] says the executor should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Start a helper on the processes left ([`ScanState::left`]).
    Start,
    /// Wait for the helper's next message until this time, then ask again.
    Wait(Instant),
    /// The scan is over.
    Done,
}

/// The scan's state: what is left to read, what is being read since when, what was found.
#[derive(Debug)]
pub struct ScanState {
    per_process: Duration,
    left: VecDeque<i32>,
    /// The process being read, and since when.
    current: Option<(i32, Instant)>,
    /// Since when the helper has been between processes (or starting).
    idle_since: Option<Instant>,
    /// Whether a helper is working for this scan.
    running: bool,
    /// The process just given up on, until a helper is started again.
    given_up: Option<i32>,
    found: Scan,
}

impl ScanState {
    /// A scan of `pids`; those `asleep` (a helper of an earlier scan is still asleep on them)
    /// are unanswered at once.
    pub fn new(pids: Vec<i32>, asleep: impl Fn(i32) -> bool, per_process: Duration) -> Self {
        let (skip, left): (Vec<i32>, Vec<i32>) = pids.into_iter().partition(|p| asleep(*p));
        ScanState {
            per_process,
            left: left.into(),
            current: None,
            idle_since: None,
            running: false,
            given_up: None,
            found: Scan {
                writers: Vec::new(),
                unanswered: skip,
            },
        }
    }

    /// The processes not read yet, in order.
    pub fn left(&self) -> Vec<i32> {
        self.left.iter().copied().collect()
    }

    /// A helper was started at `now` on [`Self::left`].
    pub fn started_helper(&mut self, now: Instant) {
        self.running = true;
        self.current = None;
        self.given_up = None;
        self.idle_since = Some(now);
    }

    /// No helper can be started (too many asleep): everything left is unanswered.
    pub fn give_up_rest(&mut self) {
        self.found.unanswered.extend(self.left.drain(..));
        self.running = false;
        self.current = None;
    }

    /// The helper began reading `pid` at `now`.
    pub fn reading(&mut self, pid: i32, now: Instant) {
        self.current = Some((pid, now));
        self.idle_since = None;
    }

    /// The helper read `pid` at `now`: `writer` is `Some("pid comm")` when it writes.
    pub fn answered(&mut self, pid: i32, writer: Option<String>, now: Instant) {
        self.left.retain(|p| *p != pid);
        if self.current.is_some_and(|(c, _)| c == pid) {
            self.current = None;
        }
        self.idle_since = Some(now);
        self.found.writers.extend(writer);
    }

    /// What to do at `now`: give up the process being read once it took [`PER_PROCESS`] and
    /// the helper is `asleep` in the kernel (asked only then), or once it took [`SLOW_LIMIT`]
    /// times as long anyway (and start a fresh helper on the rest); or give up the rest when
    /// the helper has been idle as long (asleep or gone: it died).
    pub fn next(&mut self, now: Instant, mut asleep: impl FnMut() -> bool) -> Next {
        if self.left.is_empty() {
            return Next::Done;
        }
        if !self.running {
            return Next::Start;
        }
        match (self.current, self.idle_since) {
            (Some((_, since)), _)
                if now >= since + self.per_process
                    && now < since + self.per_process * SLOW_LIMIT
                    && !asleep() =>
            {
                // Runnable: slow, not stuck. Look again soon.
                Next::Wait(now + self.per_process / 5)
            }
            (Some((pid, since)), _) if now >= since + self.per_process => {
                self.left.retain(|p| *p != pid);
                self.found.unanswered.push(pid);
                self.given_up = Some(pid);
                self.running = false;
                self.current = None;
                if self.left.is_empty() {
                    Next::Done
                } else {
                    Next::Start
                }
            }
            (Some((_, since)), _) => Next::Wait(since + self.per_process),
            (None, Some(since))
                if now >= since + self.per_process
                    && now < since + self.per_process * SLOW_LIMIT
                    && !asleep() =>
            {
                // Between two processes and runnable: slow, not gone.
                Next::Wait(now + self.per_process / 5)
            }
            (None, Some(since)) if now >= since + self.per_process => {
                self.give_up_rest();
                Next::Done
            }
            (None, Some(since)) => Next::Wait(since + self.per_process),
            (None, None) => Next::Wait(now + self.per_process),
        }
    }

    /// The process the helper was reading when the scan gave it up, until another helper
    /// starts (the helper stays asleep on it).
    pub fn given_up(&self) -> Option<i32> {
        self.given_up
    }

    /// What was found.
    pub fn finish(self) -> Scan {
        self.found
    }
}

/// A helper's messages.
enum Msg {
    Thread(i32),
    Reading(i32),
    Answered(i32, Option<String>),
}

/// Helpers asleep in a read: the process each is asleep on, and whether it has returned.
type Asleep = Mutex<Vec<(i32, Arc<AtomicBool>)>>;

/// The helpers asleep in a read, over every scan of the run.
fn asleep() -> &'static Asleep {
    static ASLEEP: std::sync::OnceLock<Asleep> = std::sync::OnceLock::new();
    ASLEEP.get_or_init(|| Mutex::new(Vec::new()))
}

/// Sets the flag when the helper thread ends (its read returned, or it finished).
struct Returned(Arc<AtomicBool>);

impl Drop for Returned {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Starts a helper reading `pids` for writers on the mounts `ids` (superblock `devno`);
/// returns its messages and the flag it sets when it ends.
fn helper(
    pids: Vec<i32>,
    ids: Vec<u64>,
    devno: String,
) -> std::io::Result<(mpsc::Receiver<Msg>, Arc<AtomicBool>)> {
    let (tx, rx) = mpsc::channel();
    let done = Arc::new(AtomicBool::new(false));
    let flag = Returned(Arc::clone(&done));
    std::thread::Builder::new()
        .name("writer-scan".into())
        .spawn(move || {
            let _flag = flag;
            if tx
                .send(Msg::Thread(nix::unistd::gettid().as_raw()))
                .is_err()
            {
                return;
            }
            for pid in pids {
                if tx.send(Msg::Reading(pid)).is_err() {
                    return;
                }
                let w = super::probe(pid, &ids, &devno);
                // Given up on meanwhile: the scan has gone on without this helper.
                if tx.send(Msg::Answered(pid, w)).is_err() {
                    return;
                }
            }
        })?;
    Ok((rx, done))
}

/// Whether drainfs's thread `tid` is asleep in the kernel (any state but `R`, running or
/// runnable), from `/proc/self/task/TID/stat` (which never waits: it is drainfs's own).
fn thread_asleep(tid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
        .ok()
        .and_then(|t| {
            let rest = &t[t.rfind(')')? + 1..];
            rest.split_whitespace().next().map(|s| s != "R")
        })
        .unwrap_or(true)
}

/// Scans every process of drainfs's PID namespace for writers on superblock `devno`
/// (`major:minor`), giving up on a process after `per_process` (see the module's doc).
/// Returns within about `per_process` per process given up, whatever the processes do.
pub fn scan(devno: &str, per_process: Duration) -> Scan {
    let ids = super::mounts_of(&super::super::mounts(), devno);
    let mut sleeping = asleep().lock();
    sleeping.retain(|(_, returned)| !returned.load(Ordering::SeqCst));
    let mut st = ScanState::new(
        super::pids(),
        |p| sleeping.iter().any(|(q, _)| *q == p),
        per_process,
    );
    let mut rx: Option<(mpsc::Receiver<Msg>, Arc<AtomicBool>)> = None;
    let mut tid = None;
    loop {
        let now = Instant::now();
        // A helper that has not reported its thread yet is starting: not asleep.
        match st.next(now, || tid.is_some_and(thread_asleep)) {
            Next::Done => break,
            Next::Start => {
                // The helper left behind on the process given up (if any) stays asleep.
                if let (Some((_, done)), Some(pid)) = (rx.take(), st.given_up()) {
                    sleeping.push((pid, done));
                }
                if sleeping.len() >= MAX_STUCK {
                    st.give_up_rest();
                    continue;
                }
                match helper(st.left(), ids.clone(), devno.to_string()) {
                    Ok(h) => {
                        rx = Some(h);
                        tid = None;
                        st.started_helper(Instant::now());
                    }
                    Err(_) => st.give_up_rest(),
                }
            }
            Next::Wait(until) => {
                let Some((r, _)) = &rx else {
                    st.give_up_rest();
                    continue;
                };
                match r.recv_timeout(until.saturating_duration_since(now)) {
                    Ok(Msg::Thread(t)) => tid = Some(t),
                    Ok(Msg::Reading(pid)) => st.reading(pid, Instant::now()),
                    Ok(Msg::Answered(pid, w)) => st.answered(pid, w, Instant::now()),
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    Err(mpsc::RecvTimeoutError::Disconnected) => st.give_up_rest(),
                }
            }
        }
    }
    // A helper given up on as the last process stays asleep too.
    if let (Some((_, done)), Some(pid)) = (rx, st.given_up()) {
        sleeping.push((pid, done));
    }
    st.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Duration = Duration::from_millis(250);

    #[test]
    fn every_process_answering_is_no_writer_or_the_writers() {
        let t0 = Instant::now();
        let mut st = ScanState::new(vec![1, 2], |_| false, P);
        assert_eq!(st.next(t0, || true), Next::Start);
        st.started_helper(t0);
        assert_eq!(st.next(t0, || true), Next::Wait(t0 + P));
        st.reading(1, t0);
        st.answered(1, None, t0);
        st.reading(2, t0);
        st.answered(2, Some("2 w".into()), t0);
        assert_eq!(st.next(t0, || true), Next::Done);
        let s = st.finish();
        assert_eq!(s.verdict(), Verdict::Writers(vec!["2 w".into()]));
        let st = ScanState::new(vec![], |_| false, P);
        assert_eq!(st.finish().verdict(), Verdict::NoWriter);
    }

    #[test]
    fn a_process_that_does_not_answer_is_given_up_and_the_rest_read_by_a_new_helper() {
        let t0 = Instant::now();
        let mut st = ScanState::new(vec![1, 2, 3], |_| false, P);
        assert_eq!(st.next(t0, || true), Next::Start);
        st.started_helper(t0);
        st.reading(1, t0);
        st.answered(1, None, t0);
        let t1 = t0 + Duration::from_millis(1);
        st.reading(2, t1);
        // Still within its time: wait until exactly its deadline.
        assert_eq!(st.next(t1 + P / 2, || true), Next::Wait(t1 + P));
        assert_eq!(st.next(t1 + P, || true), Next::Start);
        assert_eq!(st.given_up(), Some(2));
        assert_eq!(st.left(), vec![3]);
        st.started_helper(t1 + P);
        st.reading(3, t1 + P);
        st.answered(3, None, t1 + P);
        assert_eq!(st.next(t1 + P, || true), Next::Done);
        assert_eq!(st.finish().verdict(), Verdict::Unknown(vec![2]));
    }

    #[test]
    fn a_writer_found_wins_over_processes_that_did_not_answer() {
        let t0 = Instant::now();
        let mut st = ScanState::new(vec![5, 6], |p| p == 5, P);
        assert_eq!(st.left(), vec![6]);
        st.started_helper(t0);
        st.reading(6, t0);
        st.answered(6, Some("6 w".into()), t0);
        assert_eq!(st.next(t0, || true), Next::Done);
        let s = st.finish();
        assert_eq!(s.unanswered, vec![5]);
        assert_eq!(s.verdict(), Verdict::Writers(vec!["6 w".into()]));
    }

    #[test]
    fn the_last_process_given_up_ends_the_scan_and_a_dead_helper_gives_up_the_rest() {
        let t0 = Instant::now();
        let mut st = ScanState::new(vec![1], |_| false, P);
        st.started_helper(t0);
        st.reading(1, t0);
        assert_eq!(st.next(t0 + P, || true), Next::Done);
        assert_eq!(st.finish().unanswered, vec![1]);
        // A helper that never reports (it could not start reading): idle for the deadline.
        let mut st = ScanState::new(vec![1, 2], |_| false, P);
        st.started_helper(t0);
        assert_eq!(st.next(t0 + P / 2, || true), Next::Wait(t0 + P));
        assert_eq!(st.next(t0 + P, || true), Next::Done);
        assert_eq!(st.finish().verdict(), Verdict::Unknown(vec![1, 2]));
    }

    #[test]
    fn a_slow_helper_gets_more_time_and_a_stuck_one_does_not() {
        let t0 = Instant::now();
        let mut st = ScanState::new(vec![1, 2], |_| false, P);
        st.started_helper(t0);
        st.reading(1, t0);
        // Past the deadline but runnable: look again in a fifth of it.
        assert_eq!(st.next(t0 + P, || false), Next::Wait(t0 + P + P / 5));
        assert_eq!(
            st.next(t0 + 3 * P, || false),
            Next::Wait(t0 + 3 * P + P / 5)
        );
        // Runnable for SLOW_LIMIT deadlines: given up all the same.
        assert_eq!(st.next(t0 + P * SLOW_LIMIT, || false), Next::Start);
        assert_eq!(st.given_up(), Some(1));
        // Asleep in the kernel at the deadline: given up at once.
        let mut st = ScanState::new(vec![1, 2], |_| false, P);
        st.started_helper(t0);
        st.reading(1, t0);
        let mut asked = false;
        assert_eq!(
            st.next(t0 + P / 2, || {
                asked = true;
                false
            }),
            Next::Wait(t0 + P)
        );
        assert!(
            !asked,
            "the helper's state is asked only once the deadline passed"
        );
        assert_eq!(st.next(t0 + P, || true), Next::Start);
        assert_eq!(st.finish().unanswered, vec![1]);
    }

    #[test]
    fn too_many_helpers_asleep_gives_up_everything_left() {
        let mut st = ScanState::new(vec![1, 2, 3], |_| false, P);
        st.give_up_rest();
        assert_eq!(st.next(Instant::now(), || true), Next::Done);
        assert_eq!(st.finish().unanswered, vec![1, 2, 3]);
    }
}

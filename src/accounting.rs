//! Accounting of what is outstanding: in-flight FUSE operations, open handles, lower
//! FLUSH/FSYNC/RELEASE calls in progress, and per-operation statistics.
//!
//! Every count is owned by a guard ([`OpGuard`], [`HandleGuard`], [`LowerCallGuard`]) that
//! increments on creation and decrements in `Drop`, so no return path, error or panic can leak
//! a count (mountpoint-s3's write-slot pattern). The hot path is a handful of relaxed atomic
//! adds; nothing here takes a lock or allocates.
//!
//! The drain waits on [`Accounting::changed`]; it is only signalled while
//! [`Accounting::set_watching`] is on, so serving costs no wake-ups.
//!
//! Requests are counted in two classes ([`Op::class`], [`crate::gate::Class`]): those that may
//! change data hold the drain; read-only ones (READ, GETATTR, LOOKUP, READDIR...) are counted
//! (`/status`, metrics, the summary) but never hold it. A request that arrives with the door
//! already closed is *late* ([`Accounting::since_late_request`]): the drain keeps the mount
//! (refusing new opens) for a moment after the last one, since its process may still be at
//! work.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::gate::{Class, Gate};

macro_rules! ops {
    ($($variant:ident => $name:literal),* $(,)?) => {
        /// A FUSE operation, as counted and labelled (`op="lookup"`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(usize)]
        pub enum Op { $(#[doc = $name] $variant),* }

        impl Op {
            /// Every operation, in label order.
            pub const ALL: &'static [Op] = &[$(Op::$variant),*];

            /// The label value (lower-case FUSE opcode name).
            pub fn name(self) -> &'static str {
                match self { $(Op::$variant => $name),* }
            }
        }
    };
}

ops! {
    Lookup => "lookup", Forget => "forget", Getattr => "getattr", Setattr => "setattr",
    Readlink => "readlink", Mknod => "mknod", Mkdir => "mkdir", Unlink => "unlink",
    Rmdir => "rmdir", Symlink => "symlink", Rename => "rename", Link => "link",
    Open => "open", Create => "create", Read => "read", Write => "write", Flush => "flush",
    Fsync => "fsync", Release => "release", Opendir => "opendir", Readdir => "readdir",
    Readdirplus => "readdirplus", Releasedir => "releasedir", Fsyncdir => "fsyncdir",
    Statfs => "statfs", Access => "access", Setxattr => "setxattr", Getxattr => "getxattr",
    Listxattr => "listxattr", Removexattr => "removexattr", Fallocate => "fallocate",
    Lseek => "lseek", CopyFileRange => "copy_file_range", Init => "init",
    Other => "other",
}

const N_OPS: usize = Op::ALL.len();

impl Op {
    /// Which count of the gate the operation is in. Read-only: LOOKUP, FORGET, GETATTR,
    /// READLINK, READ, OPENDIR, READDIR, READDIRPLUS, RELEASEDIR, STATFS, ACCESS, GETXATTR,
    /// LISTXATTR, LSEEK, INIT (the relay's; nothing of theirs reaches the bucket). Everything else may change
    /// data or creates a handle, including OPEN (the door's admission, and O_TRUNC rides on
    /// it), RELEASE (a writable file's last close uploads on some lowers) and `other` (ioctl,
    /// locks, opcodes drainfs does not know).
    pub fn class(self) -> Class {
        match self {
            Op::Lookup
            | Op::Forget
            | Op::Getattr
            | Op::Readlink
            | Op::Read
            | Op::Opendir
            | Op::Readdir
            | Op::Readdirplus
            | Op::Releasedir
            | Op::Statfs
            | Op::Access
            | Op::Getxattr
            | Op::Listxattr
            | Op::Lseek
            | Op::Init => Class::ReadOnly,
            _ => Class::Changes,
        }
    }

    /// Whether a request of this operation shows that a process is using the mount. FORGET,
    /// RELEASE and RELEASEDIR do not: the kernel sends them on its own after a process has
    /// closed a file or dropped an inode (RELEASE comes after `close()` has returned), so
    /// arriving after the door closed does not make them late.
    pub fn from_a_process(self) -> bool {
        !matches!(self, Op::Forget | Op::Release | Op::Releasedir)
    }
}

/// Upper bounds (seconds) of the request-duration histogram buckets; `+Inf` is implied.
pub const DURATION_BUCKETS: [f64; 16] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 5.0, 30.0,
];
const N_BUCKETS: usize = DURATION_BUCKETS.len() + 1;

/// A lock-free latency histogram (cumulative rendering is done by the reader).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; N_BUCKETS],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let idx = DURATION_BUCKETS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(N_BUCKETS - 1);
        self.buckets[idx].fetch_add(1, Relaxed);
        self.sum_ns.fetch_add(d.as_nanos() as u64, Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    /// Per-bucket (non-cumulative) counts, the sum in seconds, and the count.
    pub fn snapshot(&self) -> ([u64; N_BUCKETS], f64, u64) {
        let mut b = [0; N_BUCKETS];
        for (i, slot) in self.buckets.iter().enumerate() {
            b[i] = slot.load(Relaxed);
        }
        (
            b,
            self.sum_ns.load(Relaxed) as f64 / 1e9,
            self.count.load(Relaxed),
        )
    }
}

/// Statistics of one operation type.
#[derive(Debug, Default)]
pub struct OpStats {
    /// Requests in flight now.
    pub in_flight: AtomicI64,
    /// Requests finished.
    pub count: AtomicU64,
    /// Requests answered with an error.
    pub errors: AtomicU64,
    /// Request durations.
    pub duration: Histogram,
}

/// Which kind of open handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HandleMode {
    /// A file opened read-only.
    Read,
    /// A file opened for writing (O_WRONLY or O_RDWR).
    Write,
    /// A directory stream.
    Dir,
}

/// A lower call whose duration matters for the drain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LowerCall {
    /// `close(dup(fd))` on the lower: the FLUSH that uploads.
    Flush,
    /// `fsync`/`fdatasync` on the lower.
    Fsync,
    /// The final `close` of a lower fd (RELEASE).
    Release,
}

/// Shared counters. One per mount.
#[derive(Debug)]
pub struct Accounting {
    ops: [OpStats; N_OPS],
    /// The door and the in-flight count (see [`crate::gate`]).
    gate: Gate,
    handles: [AtomicI64; 3],
    handles_opened: [AtomicU64; 3],
    lower_calls: [AtomicI64; 3],
    /// Duration of lower flushes.
    pub lower_flush_duration: Histogram,
    /// Duration of lower fsyncs.
    pub lower_fsync_duration: Histogram,
    /// Lower flushes that returned an error.
    pub lower_flush_errors: AtomicU64,
    /// Bytes read by drainfs's own data path (not kernel passthrough).
    pub bytes_read: AtomicU64,
    /// Bytes written by drainfs's own data path (not kernel passthrough).
    pub bytes_written: AtomicU64,
    /// Milliseconds since `epoch` of the last time a request arrived or ended, or a handle or
    /// lower call ended.
    last_activity_ms: AtomicU64,
    /// Late requests (arrived with the door closed, [`Op::from_a_process`]) in flight.
    late_in_flight: AtomicI64,
    /// Milliseconds since `epoch` of the last arrival or end of a late request; `u64::MAX`:
    /// none yet.
    late_ms: AtomicU64,
    epoch: Instant,
    watching: AtomicBool,
    /// Signalled (while watching) whenever an operation ends or a handle is released.
    pub changed: tokio::sync::Notify,
}

impl Default for Accounting {
    fn default() -> Self {
        Accounting {
            ops: std::array::from_fn(|_| OpStats::default()),
            gate: Gate::new(),
            handles: Default::default(),
            handles_opened: Default::default(),
            lower_calls: Default::default(),
            lower_flush_duration: Histogram::default(),
            lower_fsync_duration: Histogram::default(),
            lower_flush_errors: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            last_activity_ms: AtomicU64::new(0),
            late_in_flight: AtomicI64::new(0),
            late_ms: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            watching: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        }
    }
}

/// A point-in-time copy of the counts, for the drain decision, `/status` and the summary.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Outstanding {
    /// FUSE requests being served (both classes).
    pub in_flight: i64,
    /// Of those, read-only requests ([`Op::class`]): counted, but never holding the drain.
    pub in_flight_read: i64,
    /// Files open read-only.
    pub open_read: i64,
    /// Files open for writing.
    pub open_write: i64,
    /// Open directory streams.
    pub open_dirs: i64,
    /// Lower FLUSH calls in progress.
    pub lower_flush: i64,
    /// Lower FSYNC calls in progress.
    pub lower_fsync: i64,
    /// Lower RELEASE (close) calls in progress.
    pub lower_release: i64,
}

impl Outstanding {
    /// Nothing that can still upload: no request that may change data in flight, no file open
    /// for writing, no lower FLUSH/FSYNC/RELEASE in progress. Read-only requests, files open
    /// read-only and directory streams do not hold the drain (nothing of theirs reaches the
    /// bucket); the teardown cuts them off.
    pub fn is_drained(&self) -> bool {
        self.in_flight == self.in_flight_read
            && self.open_write == 0
            && self.lower_flush == 0
            && self.lower_fsync == 0
            && self.lower_release == 0
    }

    /// Nothing in flight and no handle open at all.
    pub fn is_idle(&self) -> bool {
        self.in_flight == 0
            && self.open_read == 0
            && self.open_write == 0
            && self.open_dirs == 0
            && self.lower_flush == 0
            && self.lower_fsync == 0
            && self.lower_release == 0
    }
}

impl Accounting {
    /// New, shared.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Starts counting one request in its class ([`Op::class`]); the guard ends it. Counting
    /// comes before the request looks at the door ([`Accounting::door_open`]), which is what
    /// makes the drain race-free.
    #[inline]
    pub fn op(&self, op: Op) -> OpGuard<'_> {
        let (start, late) = self.begin(op, true);
        OpGuard {
            acct: self,
            op,
            start,
            failed: false,
            activity: true,
            late,
        }
    }

    /// Like [`Accounting::op`], for a request drainfs makes itself (a probe's statfs through
    /// the mount): counted in flight and in the statistics, but not workload activity, so it
    /// never restarts the quiet period ([`Accounting::since_last_activity`]) and is never
    /// late. The drain is still woken when it ends.
    #[inline]
    pub fn own_op(&self, op: Op) -> OpGuard<'_> {
        let (start, late) = self.begin(op, false);
        OpGuard {
            acct: self,
            op,
            start,
            failed: false,
            activity: false,
            late,
        }
    }

    /// Like [`Accounting::op`], for a request whose end comes later on another thread (the
    /// relay keeps it in its in-flight map until the daemon's reply is written).
    #[inline]
    pub fn op_owned(self: &Arc<Self>, op: Op) -> OwnedOpGuard {
        let (start, late) = self.begin(op, true);
        OwnedOpGuard {
            acct: Arc::clone(self),
            op,
            start,
            failed: false,
            late,
        }
    }

    /// Enters the gate in `op`'s class; `activity`: a workload request (records its arrival
    /// and, with the door closed, counts it late). Returns its start and whether it is late.
    #[inline]
    fn begin(&self, op: Op, activity: bool) -> (Instant, bool) {
        let door_open = self.gate.enter(op.class());
        self.ops[op as usize].in_flight.fetch_add(1, Relaxed);
        let start = Instant::now();
        let late = activity && !door_open && op.from_a_process();
        if activity {
            let ms = self.ms_at(start);
            self.last_activity_ms.store(ms, Relaxed);
            if late {
                self.late_in_flight.fetch_add(1, SeqCst);
                self.late_ms.store(ms, SeqCst);
            }
        }
        (start, late)
    }

    /// Ends one request counted by [`Accounting::op`] or [`Accounting::op_owned`];
    /// `activity`: it was the workload's (restarts the quiet period); `late`: it arrived with
    /// the door closed.
    #[inline]
    fn end_op(&self, op: Op, start: Instant, failed: bool, activity: bool, late: bool) {
        let stats = &self.ops[op as usize];
        stats.count.fetch_add(1, Relaxed);
        if failed {
            stats.errors.fetch_add(1, Relaxed);
        }
        stats.duration.observe(start.elapsed());
        stats.in_flight.fetch_sub(1, Relaxed);
        if late {
            self.late_ms
                .store(self.epoch.elapsed().as_millis() as u64, SeqCst);
            self.late_in_flight.fetch_sub(1, SeqCst);
        }
        self.gate.exit(op.class());
        if activity {
            self.touched();
        } else {
            self.notify();
        }
    }

    fn ms_at(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.epoch).as_millis() as u64
    }

    /// Counts an open handle until the guard is dropped.
    pub fn handle(self: &Arc<Self>, mode: HandleMode) -> HandleGuard {
        self.handles[mode as usize].fetch_add(1, SeqCst);
        self.handles_opened[mode as usize].fetch_add(1, Relaxed);
        HandleGuard {
            acct: Arc::clone(self),
            mode,
        }
    }

    /// Counts a lower call in progress until the guard is dropped.
    pub fn lower_call(&self, which: LowerCall) -> LowerCallGuard<'_> {
        self.lower_calls[which as usize].fetch_add(1, SeqCst);
        LowerCallGuard {
            acct: self,
            which,
            start: Instant::now(),
        }
    }

    /// Statistics of one operation.
    pub fn op_stats(&self, op: Op) -> &OpStats {
        &self.ops[op as usize]
    }

    /// Handles ever opened of this mode.
    pub fn handles_opened(&self, mode: HandleMode) -> u64 {
        self.handles_opened[mode as usize].load(Relaxed)
    }

    /// Whether the door is open: new opens, creates and namespace changes are admitted. Call
    /// only from a request counted with [`Accounting::op`].
    #[inline]
    pub fn door_open(&self) -> bool {
        self.gate.is_open()
    }

    /// Closes the door (idempotent).
    pub fn close_door(&self) {
        self.gate.close();
    }

    /// The door's state, then the counts read after it (see [`crate::drain::Observation`]).
    pub fn observe(&self) -> (bool, Outstanding) {
        let g = self.gate.state();
        (g.closed, self.counts(g.changes as i64, g.read_only as i64))
    }

    /// Current counts.
    pub fn outstanding(&self) -> Outstanding {
        self.observe().1
    }

    fn counts(&self, changes: i64, read_only: i64) -> Outstanding {
        Outstanding {
            in_flight: changes + read_only,
            in_flight_read: read_only,
            open_read: self.handles[HandleMode::Read as usize].load(SeqCst),
            open_write: self.handles[HandleMode::Write as usize].load(SeqCst),
            open_dirs: self.handles[HandleMode::Dir as usize].load(SeqCst),
            lower_flush: self.lower_calls[LowerCall::Flush as usize].load(SeqCst),
            lower_fsync: self.lower_calls[LowerCall::Fsync as usize].load(SeqCst),
            lower_release: self.lower_calls[LowerCall::Release as usize].load(SeqCst),
        }
    }

    /// Time since a workload request last arrived or ended, or a handle or lower call ended
    /// ("idle for"; a read-only request in flight for a long time does not make the mount
    /// busy, only its arrival counts).
    pub fn since_last_activity(&self) -> Duration {
        let now = self.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_activity_ms.load(Relaxed)))
    }

    /// Time since the last *late* request (one that arrived with the door closed, served or
    /// refused, [`Op::from_a_process`]) arrived or ended: `None` when none has arrived,
    /// `Some(0)` while one is in flight. Millisecond resolution.
    pub fn since_late_request(&self) -> Option<Duration> {
        if self.late_in_flight.load(SeqCst) > 0 {
            return Some(Duration::ZERO);
        }
        let at = self.late_ms.load(SeqCst);
        (at != u64::MAX).then(|| {
            let now = self.epoch.elapsed().as_millis() as u64;
            Duration::from_millis(now.saturating_sub(at))
        })
    }

    /// Turns wake-ups of [`Accounting::changed`] on (during shutdown) or off.
    pub fn set_watching(&self, on: bool) {
        self.watching.store(on, SeqCst);
    }

    #[inline]
    fn touched(&self) {
        self.last_activity_ms
            .store(self.epoch.elapsed().as_millis() as u64, Relaxed);
        self.notify();
    }

    #[inline]
    fn notify(&self) {
        if self.watching.load(Relaxed) {
            self.changed.notify_waiters();
        }
    }
}

/// One request in flight. Call [`OpGuard::fail`] when answering with an error.
#[must_use]
pub struct OpGuard<'a> {
    acct: &'a Accounting,
    op: Op,
    start: Instant,
    failed: bool,
    activity: bool,
    late: bool,
}

impl OpGuard<'_> {
    /// Marks the request as answered with an error.
    pub fn fail(&mut self) {
        self.failed = true;
    }

    /// The operation counted.
    pub fn op(&self) -> Op {
        self.op
    }
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        self.acct
            .end_op(self.op, self.start, self.failed, self.activity, self.late);
    }
}

/// One request in flight, owning its reference to the accounting (see
/// [`Accounting::op_owned`]). Call [`OwnedOpGuard::fail`] when it is answered with an error.
#[must_use]
#[derive(Debug)]
pub struct OwnedOpGuard {
    acct: Arc<Accounting>,
    op: Op,
    start: Instant,
    failed: bool,
    late: bool,
}

impl OwnedOpGuard {
    /// Marks the request as answered with an error.
    pub fn fail(&mut self) {
        self.failed = true;
    }

    /// The operation counted.
    pub fn op(&self) -> Op {
        self.op
    }
}

impl Drop for OwnedOpGuard {
    fn drop(&mut self) {
        self.acct
            .end_op(self.op, self.start, self.failed, true, self.late);
    }
}

/// One open handle (held inside the handle; dropped after its lower fd is closed).
#[must_use]
#[derive(Debug)]
pub struct HandleGuard {
    acct: Arc<Accounting>,
    mode: HandleMode,
}

impl HandleGuard {
    /// The handle's mode.
    pub fn mode(&self) -> HandleMode {
        self.mode
    }
}

impl Drop for HandleGuard {
    fn drop(&mut self) {
        self.acct.handles[self.mode as usize].fetch_sub(1, SeqCst);
        self.acct.touched();
    }
}

/// One lower FLUSH/FSYNC/RELEASE in progress.
#[must_use]
pub struct LowerCallGuard<'a> {
    acct: &'a Accounting,
    which: LowerCall,
    start: Instant,
}

impl Drop for LowerCallGuard<'_> {
    fn drop(&mut self) {
        let d = self.start.elapsed();
        match self.which {
            LowerCall::Flush => self.acct.lower_flush_duration.observe(d),
            LowerCall::Fsync => self.acct.lower_fsync_duration.observe(d),
            LowerCall::Release => {}
        }
        self.acct.lower_calls[self.which as usize].fetch_sub(1, SeqCst);
        self.acct.touched();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_balance_on_every_path() {
        let acct = Accounting::new();
        {
            let mut g = acct.op(Op::Open);
            assert_eq!(acct.outstanding().in_flight, 1);
            g.fail();
        }
        let h = acct.handle(HandleMode::Write);
        let r = acct.handle(HandleMode::Read);
        let f = acct.lower_call(LowerCall::Flush);
        let o = acct.outstanding();
        assert_eq!(
            (o.in_flight, o.open_write, o.open_read, o.lower_flush),
            (0, 1, 1, 1)
        );
        assert!(!o.is_idle());
        drop((h, r, f));
        assert!(acct.outstanding().is_idle());
        let s = acct.op_stats(Op::Open);
        assert_eq!((s.count.load(Relaxed), s.errors.load(Relaxed)), (1, 1));
        assert_eq!(s.duration.snapshot().2, 1);
        assert_eq!(acct.handles_opened(HandleMode::Write), 1);
    }

    #[test]
    fn own_requests_do_not_restart_the_quiet_period() {
        let acct = Accounting::new();
        drop(acct.op(Op::Getattr));
        std::thread::sleep(Duration::from_millis(30));
        let before = acct.since_last_activity();
        assert!(before >= Duration::from_millis(30));
        {
            let _probe = acct.own_op(Op::Statfs);
            assert_eq!(acct.outstanding().in_flight, 1, "still counted in flight");
        }
        assert!(
            acct.since_last_activity() >= before,
            "a probe is not activity"
        );
        assert_eq!(acct.op_stats(Op::Statfs).count.load(Relaxed), 1);
        // Measured against the time since just before the request, not against `before`
        // (30 ms): a loaded machine can preempt this thread for that long between the two
        // lines. Without the restart, the idle time would include the 30 ms slept above.
        let t = Instant::now();
        drop(acct.op(Op::Statfs));
        let since = acct.since_last_activity();
        assert!(
            since <= t.elapsed() + Duration::from_millis(1),
            "a workload statfs is activity: idle {since:?}"
        );
    }

    #[test]
    fn read_only_requests_are_counted_but_do_not_hold_the_drain() {
        let acct = Accounting::new();
        let r = acct.op(Op::Read);
        let l = acct.op(Op::Lookup);
        let o = acct.outstanding();
        assert_eq!((o.in_flight, o.in_flight_read), (2, 2));
        assert!(o.is_drained(), "read-only requests never hold the drain");
        assert!(!o.is_idle());
        let w = acct.op(Op::Write);
        let o = acct.outstanding();
        assert_eq!((o.in_flight, o.in_flight_read), (3, 2));
        assert!(!o.is_drained());
        drop((r, l, w));
        assert!(acct.outstanding().is_idle());
        assert_eq!(Op::Release.class(), Class::Changes);
        assert_eq!(Op::Open.class(), Class::Changes);
        assert_eq!(Op::Other.class(), Class::Changes);
        assert_eq!(Op::Readdirplus.class(), Class::ReadOnly);
    }

    #[test]
    fn only_process_requests_after_the_close_are_late() {
        let acct = Accounting::new();
        drop(acct.op(Op::Write));
        // Before the close nothing is late, however recent.
        assert_eq!(acct.since_late_request(), None);
        let before = acct.op(Op::Flush);
        acct.close_door();
        // In flight across the close: not late; its end does not make it late either.
        drop(before);
        assert_eq!(acct.since_late_request(), None);
        // The kernel's own RELEASE/FORGET and drainfs's probes are not late.
        drop(acct.op(Op::Release));
        drop(acct.op(Op::Forget));
        drop(acct.own_op(Op::Statfs));
        assert_eq!(acct.since_late_request(), None);
        // A process's request after the close is late, while in flight and after.
        let g = acct.op(Op::Getattr);
        assert_eq!(acct.since_late_request(), Some(Duration::ZERO));
        drop(g);
        std::thread::sleep(Duration::from_millis(20));
        let since = acct.since_late_request().unwrap();
        assert!(since >= Duration::from_millis(20), "{since:?}");
    }

    #[test]
    fn arrivals_restart_the_idle_time() {
        let acct = Accounting::new();
        std::thread::sleep(Duration::from_millis(30));
        // Against the time since just before the arrival (1 ms for the millisecond
        // resolution), not a fixed 30 ms that a preempted thread can pass between two lines.
        let t = Instant::now();
        let g = acct.op(Op::Read);
        let since = acct.since_last_activity();
        assert!(since <= t.elapsed() + Duration::from_millis(1), "{since:?}");
        drop(g);
    }

    #[test]
    fn op_names_are_unique() {
        let mut names: Vec<_> = Op::ALL.iter().map(|o| o.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Op::ALL.len());
    }
}

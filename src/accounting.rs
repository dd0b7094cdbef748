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

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::gate::Gate;

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
    Lseek => "lseek", CopyFileRange => "copy_file_range",
}

const N_OPS: usize = Op::ALL.len();

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
    /// Milliseconds since `epoch` of the last time the mount became busy or idle.
    last_activity_ms: AtomicU64,
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
            epoch: Instant::now(),
            watching: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        }
    }
}

/// A point-in-time copy of the counts, for the drain decision, `/status` and the summary.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Outstanding {
    /// FUSE requests being served.
    pub in_flight: i64,
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
    /// Nothing in flight and no handle open: every lower close (every upload) has returned.
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

    /// Starts counting one request; the guard ends it. Counting comes before the request looks
    /// at the door ([`Accounting::door_open`]), which is what makes the drain race-free.
    #[inline]
    pub fn op(&self, op: Op) -> OpGuard<'_> {
        self.gate.enter();
        self.ops[op as usize].in_flight.fetch_add(1, Relaxed);
        OpGuard {
            acct: self,
            op,
            start: Instant::now(),
            failed: false,
        }
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
        let (door_closed, in_flight) = self.gate.state();
        (door_closed, self.counts(in_flight as i64))
    }

    /// Current counts.
    pub fn outstanding(&self) -> Outstanding {
        self.observe().1
    }

    fn counts(&self, in_flight: i64) -> Outstanding {
        Outstanding {
            in_flight,
            open_read: self.handles[HandleMode::Read as usize].load(SeqCst),
            open_write: self.handles[HandleMode::Write as usize].load(SeqCst),
            open_dirs: self.handles[HandleMode::Dir as usize].load(SeqCst),
            lower_flush: self.lower_calls[LowerCall::Flush as usize].load(SeqCst),
            lower_fsync: self.lower_calls[LowerCall::Fsync as usize].load(SeqCst),
            lower_release: self.lower_calls[LowerCall::Release as usize].load(SeqCst),
        }
    }

    /// Time since the last operation ended or handle was released (an approximation of
    /// "idle for", valid when [`Outstanding::is_idle`]).
    pub fn since_last_activity(&self) -> Duration {
        let now = self.epoch.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.last_activity_ms.load(Relaxed)))
    }

    /// Turns wake-ups of [`Accounting::changed`] on (during shutdown) or off.
    pub fn set_watching(&self, on: bool) {
        self.watching.store(on, SeqCst);
    }

    #[inline]
    fn touched(&self) {
        self.last_activity_ms
            .store(self.epoch.elapsed().as_millis() as u64, Relaxed);
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
        let stats = &self.acct.ops[self.op as usize];
        stats.count.fetch_add(1, Relaxed);
        if self.failed {
            stats.errors.fetch_add(1, Relaxed);
        }
        stats.duration.observe(self.start.elapsed());
        stats.in_flight.fetch_sub(1, Relaxed);
        self.acct.gate.exit();
        self.acct.touched();
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
    fn op_names_are_unique() {
        let mut names: Vec<_> = Op::ALL.iter().map(|o| o.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Op::ALL.len());
    }
}

//! The door and the in-flight counts in one atomic word, so that "is the door open?" and "how
//! many requests are in flight?" can never disagree.
//!
//! Bit 63 is the door (set: closed); bits 0-31 count requests in flight that may change data
//! (writes, namespace changes, opens, FLUSH/FSYNC/RELEASE: [`Class::Changes`]), bits 32-62 the
//! read-only ones (READ, GETATTR, LOOKUP, READDIR...: [`Class::ReadOnly`]), which never hold
//! the drain. A request [`Gate::enter`]s (one atomic add) before it looks at the door
//! ([`Gate::is_open`]), and the drain [`Gate::close`]s the door (one atomic or) before it reads
//! the counts ([`Gate::state`]).
//! Both act on the same location, so by the coherence of a single atomic (no cross-variable
//! ordering argument needed): a request that entered before the close is in every count read
//! after it until it [`Gate::exit`]s, and a request that entered after the close sees the door
//! closed. Hence `state() == (closed, 0)` means every admitted request has finished, and
//! everything it did before exiting (a handle it opened) is visible to the reader (the exit is
//! a SeqCst read-modify-write, the read a SeqCst load).
//!
//! Built with `--cfg drainfs_loom`, the atomics are loom's and the `loom_` tests below model-check the
//! protocol (`RUSTFLAGS="--cfg drainfs_loom" cargo test --lib gate`).

#[cfg(drainfs_loom)]
use loom::sync::atomic::{AtomicU64, Ordering::SeqCst};
#[cfg(not(drainfs_loom))]
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

const CLOSED: u64 = 1 << 63;
/// One read-only request in the word.
const READ_ONE: u64 = 1 << 32;
const CHANGES_MASK: u64 = READ_ONE - 1;
const READ_MASK: u64 = !CLOSED & !CHANGES_MASK;

/// Which count a request is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// A request that may change data or metadata, or create a handle: it holds the drain.
    Changes,
    /// A request that only reads (data, attributes, names, directory entries): nothing of it
    /// can be lost, so it never holds the drain.
    ReadOnly,
}

impl Class {
    #[inline]
    fn unit(self) -> u64 {
        match self {
            Class::Changes => 1,
            Class::ReadOnly => READ_ONE,
        }
    }
}

/// What [`Gate::state`] read, from one load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GateState {
    /// The door is closed.
    pub closed: bool,
    /// Requests in flight that may change data ([`Class::Changes`]).
    pub changes: u64,
    /// Read-only requests in flight ([`Class::ReadOnly`]).
    pub read_only: u64,
}

/// The door plus the in-flight count. See the module docs.
#[derive(Debug)]
pub struct Gate {
    word: AtomicU64,
}

impl Default for Gate {
    fn default() -> Self {
        Self::new()
    }
}

impl Gate {
    /// Open, nothing in flight.
    pub fn new() -> Self {
        Gate {
            word: AtomicU64::new(0),
        }
    }

    /// Counts one request of `class` in flight. Returns whether the door was open when it
    /// entered (a request that finds it closed arrived after the close).
    #[inline]
    pub fn enter(&self, class: Class) -> bool {
        self.word.fetch_add(class.unit(), SeqCst) & CLOSED == 0
    }

    /// Ends one request counted by [`Gate::enter`] with the same `class`.
    #[inline]
    pub fn exit(&self, class: Class) {
        self.word.fetch_sub(class.unit(), SeqCst);
    }

    /// Whether the door is open now. A request that has entered and then sees the door open is
    /// admitted: any [`Gate::close`] after this load still counts it.
    #[inline]
    pub fn is_open(&self) -> bool {
        self.word.load(SeqCst) & CLOSED == 0
    }

    /// Closes the door (idempotent). Returns the number of requests that may change data in
    /// flight at that instant.
    pub fn close(&self) -> u64 {
        self.word.fetch_or(CLOSED, SeqCst) & CHANGES_MASK
    }

    /// The door and both counts, from one load.
    #[inline]
    pub fn state(&self) -> GateState {
        let w = self.word.load(SeqCst);
        GateState {
            closed: w & CLOSED != 0,
            changes: w & CHANGES_MASK,
            read_only: (w & READ_MASK) >> 32,
        }
    }
}

#[cfg(all(test, not(drainfs_loom)))]
mod tests {
    use super::*;

    fn st(closed: bool, changes: u64, read_only: u64) -> GateState {
        GateState {
            closed,
            changes,
            read_only,
        }
    }

    #[test]
    fn close_counts_and_blocks_later_entries() {
        let g = Gate::new();
        assert!(g.enter(Class::Changes));
        assert!(g.is_open());
        assert_eq!(g.close(), 1);
        assert!(!g.enter(Class::Changes), "entered after the close");
        assert_eq!(g.state(), st(true, 2, 0));
        g.exit(Class::Changes);
        g.exit(Class::Changes);
        assert_eq!(g.state(), st(true, 0, 0));
        assert_eq!(g.close(), 0);
    }

    #[test]
    fn read_only_requests_have_their_own_count() {
        let g = Gate::new();
        for _ in 0..3 {
            assert!(g.enter(Class::ReadOnly));
        }
        assert!(g.enter(Class::Changes));
        assert_eq!(g.state(), st(false, 1, 3));
        assert_eq!(
            g.close(),
            1,
            "close reports the requests that may change data"
        );
        assert!(!g.enter(Class::ReadOnly));
        assert_eq!(g.state(), st(true, 1, 4));
        g.exit(Class::Changes);
        for _ in 0..4 {
            g.exit(Class::ReadOnly);
        }
        assert_eq!(g.state(), st(true, 0, 0));
        // Many read-only requests never spill into the other count or the door.
        let g = Gate::new();
        for _ in 0..100_000 {
            g.enter(Class::ReadOnly);
        }
        assert_eq!(g.state(), st(false, 0, 100_000));
        assert!(g.is_open());
    }
}

#[cfg(all(test, drainfs_loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicU64 as Counter;

    /// A request that opens a handle when admitted, racing the drain's close-then-count.
    /// The drain may only declare "drained" if no admitted request's handle is missing from
    /// what it read.
    #[test]
    fn loom_drain_never_misses_an_admitted_request() {
        loom::model(|| {
            let gate = Arc::new(Gate::new());
            let handles = Arc::new(Counter::new(0));
            let (g, h) = (Arc::clone(&gate), Arc::clone(&handles));
            let request = loom::thread::spawn(move || {
                g.enter(Class::Changes);
                let admitted = g.is_open();
                if admitted {
                    h.fetch_add(1, SeqCst);
                }
                g.exit(Class::Changes);
                admitted
            });
            gate.close();
            let s = gate.state();
            let open_handles = handles.load(SeqCst);
            let drained = s.closed && s.changes == 0 && open_handles == 0;
            let admitted = request.join().unwrap();
            assert!(
                !(drained && admitted),
                "declared drained with an admitted open live"
            );
        });
    }

    /// A read-only request running beside the writer never hides it: the drain decides on
    /// the count of requests that may change data, which the reader never touches.
    #[test]
    fn loom_a_reader_never_hides_a_writer() {
        loom::model(|| {
            let gate = Arc::new(Gate::new());
            let handles = Arc::new(Counter::new(0));
            let (g, h) = (Arc::clone(&gate), Arc::clone(&handles));
            let writer = loom::thread::spawn(move || {
                g.enter(Class::Changes);
                let admitted = g.is_open();
                if admitted {
                    h.fetch_add(1, SeqCst);
                }
                g.exit(Class::Changes);
                admitted
            });
            let g = Arc::clone(&gate);
            let reader = loom::thread::spawn(move || {
                let door_open_at_entry = g.enter(Class::ReadOnly);
                g.exit(Class::ReadOnly);
                door_open_at_entry
            });
            gate.close();
            let s = gate.state();
            let open_handles = handles.load(SeqCst);
            let drained = s.closed && s.changes == 0 && open_handles == 0;
            let admitted = writer.join().unwrap();
            let _ = reader.join().unwrap();
            assert!(
                !(drained && admitted),
                "declared drained with an admitted open live"
            );
        });
    }
}

//! The door and the in-flight count in one atomic word, so that "is the door open?" and "how
//! many requests are in flight?" can never disagree.
//!
//! Bit 63 is the door (set: closed); the low bits count requests in flight. A request
//! [`Gate::enter`]s (one atomic add) before it looks at the door ([`Gate::is_open`]), and the
//! drain [`Gate::close`]s the door (one atomic or) before it reads the count ([`Gate::state`]).
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

    /// Counts one request in flight. Returns whether the door was open when it entered.
    #[inline]
    pub fn enter(&self) -> bool {
        self.word.fetch_add(1, SeqCst) & CLOSED == 0
    }

    /// Ends one request counted by [`Gate::enter`].
    #[inline]
    pub fn exit(&self) {
        self.word.fetch_sub(1, SeqCst);
    }

    /// Whether the door is open now. A request that has entered and then sees the door open is
    /// admitted: any [`Gate::close`] after this load still counts it.
    #[inline]
    pub fn is_open(&self) -> bool {
        self.word.load(SeqCst) & CLOSED == 0
    }

    /// Closes the door (idempotent). Returns the number of requests in flight at that instant.
    pub fn close(&self) -> u64 {
        self.word.fetch_or(CLOSED, SeqCst) & !CLOSED
    }

    /// `(door closed, requests in flight)`, from one load.
    #[inline]
    pub fn state(&self) -> (bool, u64) {
        let w = self.word.load(SeqCst);
        (w & CLOSED != 0, w & !CLOSED)
    }
}

#[cfg(all(test, not(drainfs_loom)))]
mod tests {
    use super::*;

    #[test]
    fn close_counts_and_blocks_later_entries() {
        let g = Gate::new();
        assert!(g.enter());
        assert!(g.is_open());
        assert_eq!(g.close(), 1);
        assert!(!g.enter(), "entered after the close");
        assert_eq!(g.state(), (true, 2));
        g.exit();
        g.exit();
        assert_eq!(g.state(), (true, 0));
        assert_eq!(g.close(), 0);
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
                g.enter();
                let admitted = g.is_open();
                if admitted {
                    h.fetch_add(1, SeqCst);
                }
                g.exit();
                admitted
            });
            gate.close();
            let (closed, in_flight) = gate.state();
            let open_handles = handles.load(SeqCst);
            let drained = closed && in_flight == 0 && open_handles == 0;
            let admitted = request.join().unwrap();
            assert!(
                !(drained && admitted),
                "declared drained with an admitted open live"
            );
        });
    }
}

//! The relay's instrument: where a message's time goes inside the relay, and the sizes of the
//! kernel's READs and WRITEs. Two hops are timed on the pump, each from the syscall that brought
//! the message in returning to the handling of it ending (the syscalls that pass it on
//! included): `to_daemon`, a kernel request read from the FUSE fd until it is sent on the
//! socket (or answered by the relay); `to_kernel`, a daemon message received until it is
//! written to the FUSE fd. A request's whole time in the relay's view is its operation's
//! duration in the accounting (admitted to answered), so the daemon's part is that minus the
//! two hops. In `/status` and the summary as [`ProfileSnapshot`].

use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use crate::accounting::{DURATION_BUCKETS, Histogram};

/// Upper bounds (bytes) of the size buckets; larger sizes go to the last bucket.
const SIZE_BOUNDS: [u32; 8] = [
    4 << 10,
    16 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    u32::MAX,
];
/// The size buckets' names, in order.
const SIZE_NAMES: [&str; 8] = [
    "le_4KiB",
    "le_16KiB",
    "le_64KiB",
    "le_128KiB",
    "le_256KiB",
    "le_512KiB",
    "le_1MiB",
    "over_1MiB",
];

/// Counts of sizes by bucket ([`SIZE_BOUNDS`]).
#[derive(Debug, Default)]
pub struct SizeCounts([AtomicU64; 8]);

impl SizeCounts {
    /// Counts one message of `size` bytes.
    pub fn count(&self, size: u32) {
        let i = SIZE_BOUNDS.iter().position(|b| size <= *b).unwrap_or(7);
        self.0[i].fetch_add(1, Relaxed);
    }

    fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        SIZE_NAMES
            .iter()
            .zip(&self.0)
            .map(|(n, c)| (*n, c.load(Relaxed)))
            .filter(|(_, c)| *c > 0)
            .collect()
    }
}

/// The relay's instrument (see the module doc).
#[derive(Debug, Default)]
pub struct Profile {
    /// Kernel request read → sent to the daemon (or answered by the relay).
    pub to_daemon: Histogram,
    /// Daemon message received → written to the kernel.
    pub to_kernel: Histogram,
    /// READ sizes the kernel asked for (`fuse_read_in.size`).
    pub read_sizes: SizeCounts,
    /// WRITE sizes the kernel sent (`fuse_write_in.size`).
    pub write_sizes: SizeCounts,
}

/// One hop's timing: count, mean and the histogram (non-cumulative counts by upper bound in
/// microseconds; `inf` for the rest; empty buckets left out).
#[derive(Debug, Clone, Serialize)]
pub struct HopSnapshot {
    /// Messages timed.
    pub count: u64,
    /// Mean time in the hop, microseconds.
    pub mean_us: f64,
    /// Counts by upper bound (µs).
    pub buckets: BTreeMap<String, u64>,
}

/// The relay's instrument as `/status` and the summary show it.
#[derive(Debug, Clone, Serialize)]
pub struct ProfileSnapshot {
    /// Kernel request read → sent to the daemon.
    pub to_daemon: HopSnapshot,
    /// Daemon message received → written to the kernel.
    pub to_kernel: HopSnapshot,
    /// READ sizes the kernel asked for, by bucket (`le_128KiB`: at most 128 KiB).
    pub read_sizes: BTreeMap<&'static str, u64>,
    /// WRITE sizes the kernel sent, by bucket.
    pub write_sizes: BTreeMap<&'static str, u64>,
}

fn hop(h: &Histogram) -> HopSnapshot {
    let (b, sum, count) = h.snapshot();
    let names = DURATION_BUCKETS
        .iter()
        .map(|s| format!("{:.0}", s * 1e6))
        .chain(std::iter::once("inf".to_string()));
    HopSnapshot {
        count,
        mean_us: if count == 0 {
            0.0
        } else {
            sum * 1e6 / count as f64
        },
        buckets: names.zip(b).filter(|(_, c)| *c > 0).collect(),
    }
}

impl Profile {
    /// The snapshot for `/status` and the summary.
    pub fn snapshot(&self) -> ProfileSnapshot {
        ProfileSnapshot {
            to_daemon: hop(&self.to_daemon),
            to_kernel: hop(&self.to_kernel),
            read_sizes: self.read_sizes.snapshot(),
            write_sizes: self.write_sizes.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn sizes_go_to_their_buckets_and_hops_to_theirs() {
        let p = Profile::default();
        for s in [4096, 4097, 128 << 10, 1 << 20, (1 << 20) + 1] {
            p.read_sizes.count(s);
        }
        p.to_daemon.observe(Duration::from_micros(30));
        p.to_daemon.observe(Duration::from_micros(90));
        let s = p.snapshot();
        assert_eq!(
            s.read_sizes.into_iter().collect::<Vec<_>>(),
            vec![
                ("le_128KiB", 1),
                ("le_16KiB", 1),
                ("le_1MiB", 1),
                ("le_4KiB", 1),
                ("over_1MiB", 1)
            ]
        );
        assert!(s.write_sizes.is_empty());
        assert_eq!(s.to_daemon.count, 2);
        assert!((s.to_daemon.mean_us - 60.0).abs() < 1.0);
        assert_eq!(
            s.to_daemon.buckets.into_iter().collect::<Vec<_>>(),
            vec![("100".to_string(), 1), ("50".to_string(), 1)]
        );
        assert_eq!(s.to_kernel.count, 0);
    }
}

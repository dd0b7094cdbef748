//! Prometheus metrics, all prefixed `drainfs_`, in base units, with no high-cardinality labels
//! (no paths, no inode numbers). They are read from the accounting atomics and the lifecycle
//! state at scrape time by one [`Collector`], so serving requests costs nothing extra.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `drainfs_build_info` | info | `version` (Cargo.toml's), `revision` (the commit: `build.rs`) |
//! | `drainfs_phase` | gauge (1 for the current phase) | `phase` |
//! | `drainfs_requests_total` | counter | `op` |
//! | `drainfs_request_errors_total` | counter | `op` |
//! | `drainfs_request_duration_seconds` | histogram | `op` |
//! | `drainfs_requests_in_flight` | gauge | — |
//! | `drainfs_open_handles` | gauge | `mode` = read, write, dir |
//! | `drainfs_handles_opened_total` | counter | `mode` |
//! | `drainfs_lower_flush_duration_seconds` | histogram | — |
//! | `drainfs_lower_fsync_duration_seconds` | histogram | — |
//! | `drainfs_lower_flush_errors_total` | counter | — |
//! | `drainfs_lower_calls_in_progress` | gauge | `call` = flush, fsync, release |
//! | `drainfs_read_bytes_total`, `drainfs_written_bytes_total` | counter | — (drainfs's own data path; kernel passthrough I/O is not seen) |
//! | `drainfs_shutdown_triggers_total` | counter | `cause` |
//! | `drainfs_drain_duration_seconds` | gauge | — (0 until drained) |
//! | `drainfs_deadline_remaining_seconds` | gauge | — (absent before a trigger) |
//! | `drainfs_forced_shutdowns_total` | counter | `reason` |
//! | `drainfs_lower_up` | gauge | — |
//! | `drainfs_passthrough_enabled` | gauge | — |
//! | `drainfs_relay_answered` | counter | `reason` = door, daemon_gone, send_failed (relay only: requests the relay answered itself) |
//! | `drainfs_relay_message_cap_bytes` | gauge | — (relay only: the largest payload relayed) |

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::accounting::{Accounting, DURATION_BUCKETS, HandleMode, Histogram, Op, Outstanding};
use strum::IntoEnumIterator;

use crate::lifecycle::{CauseKind, Forced, Phase, Shared};

/// Builds the registry with the drainfs collector.
pub fn registry(shared: Arc<Shared>) -> Registry {
    let mut r = Registry::with_prefix("drainfs");
    r.register_collector(Box::new(DrainCollector { shared }));
    r
}

#[derive(Debug)]
struct DrainCollector {
    shared: Arc<Shared>,
}

type Labels<'a> = [(&'static str, &'a str); 1];

fn histogram_buckets(h: &Histogram) -> (Vec<(f64, u64)>, f64, u64) {
    let (b, sum, count) = h.snapshot();
    let mut out: Vec<(f64, u64)> = DURATION_BUCKETS
        .iter()
        .copied()
        .zip(b.iter().copied())
        .collect();
    out.push((f64::MAX, b[b.len() - 1])); // rendered as le="+Inf"
    (out, sum, count)
}

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    m.encode_counter::<NoLabelSet, _, u64>(&v, None)
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    m.encode_gauge(&v)
}

fn gauge_f(enc: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    m.encode_gauge(&v)
}

fn histogram(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    h: &Histogram,
) -> std::fmt::Result {
    let (b, sum, count) = histogram_buckets(h);
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    m.encode_histogram::<NoLabelSet>(sum, count, &b, None)
}

/// A counter family with one label: `name{label="k"} v` for each `(k, v)`.
fn counter_family<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    values: impl IntoIterator<Item = (&'a str, u64)>,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (k, v) in values {
        let l: Labels = [(label, k)];
        m.encode_family(&l)?
            .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
    }
    Ok(())
}

/// A gauge family with one label.
fn gauge_family<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    values: impl IntoIterator<Item = (&'a str, i64)>,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (k, v) in values {
        let l: Labels = [(label, k)];
        m.encode_family(&l)?.encode_gauge(&v)?;
    }
    Ok(())
}

impl Collector for DrainCollector {
    /// Encodes every family, in the order of the module doc's table, from one snapshot of
    /// the outstanding counts.
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.shared;
        let out = s.acct.outstanding();
        encode_build_info(&mut enc)?;
        encode_phase(&mut enc, s)?;
        encode_requests(&mut enc, &s.acct, &out)?;
        encode_handles(&mut enc, &s.acct, &out)?;
        encode_lower_calls(&mut enc, &s.acct, &out)?;
        encode_bytes(&mut enc, &s.acct)?;
        encode_shutdown(&mut enc, s)?;
        encode_processes(&mut enc, s)?;
        encode_relay(&mut enc, s)
    }
}

/// `drainfs_build_info{version,revision}`: Cargo.toml's version and the commit built
/// ([`crate::VERSION`]'s two halves).
fn encode_build_info(enc: &mut DescriptorEncoder) -> std::fmt::Result {
    let info = prometheus_client::metrics::info::Info::new([
        ("version", env!("CARGO_PKG_VERSION")),
        ("revision", env!("DRAINFS_COMMIT")),
    ]);
    let m = enc.encode_descriptor(
        "build",
        "drainfs build information",
        None,
        info.metric_type(),
    )?;
    info.encode(m)
}

/// `drainfs_phase{phase}`: 1 for the current phase, 0 for the others.
fn encode_phase(enc: &mut DescriptorEncoder, s: &Shared) -> std::fmt::Result {
    let phase = s.phase();
    gauge_family(
        enc,
        "phase",
        "Lifecycle phase (1 for the current one)",
        "phase",
        Phase::iter().map(|p| (p.name(), i64::from(p == phase))),
    )
}

/// The request families by `op` (count, errors, duration histogram), then
/// `drainfs_requests_in_flight`.
fn encode_requests(
    enc: &mut DescriptorEncoder,
    a: &Accounting,
    out: &Outstanding,
) -> std::fmt::Result {
    let ops = || Op::ALL.iter().map(|op| (op.name(), a.op_stats(*op)));
    counter_family(
        enc,
        "requests",
        "FUSE requests answered, by operation",
        "op",
        ops().map(|(n, st)| (n, st.count.load(Relaxed))),
    )?;
    counter_family(
        enc,
        "request_errors",
        "FUSE requests answered with an error, by operation",
        "op",
        ops().map(|(n, st)| (n, st.errors.load(Relaxed))),
    )?;
    {
        let mut m = enc.encode_descriptor(
            "request_duration_seconds",
            "FUSE request duration, by operation",
            None,
            MetricType::Histogram,
        )?;
        for (name, st) in ops() {
            let (b, sum, count) = histogram_buckets(&st.duration);
            let l: Labels = [("op", name)];
            m.encode_family(&l)?
                .encode_histogram::<NoLabelSet>(sum, count, &b, None)?;
        }
    }
    gauge(
        enc,
        "requests_in_flight",
        "FUSE requests being served",
        out.in_flight,
    )
}

/// `drainfs_open_handles{mode}` and `drainfs_handles_opened_total{mode}`.
fn encode_handles(
    enc: &mut DescriptorEncoder,
    a: &Accounting,
    out: &Outstanding,
) -> std::fmt::Result {
    gauge_family(
        enc,
        "open_handles",
        "Open handles, by mode",
        "mode",
        [
            ("read", out.open_read),
            ("write", out.open_write),
            ("dir", out.open_dirs),
        ],
    )?;
    counter_family(
        enc,
        "handles_opened",
        "Handles opened, by mode",
        "mode",
        [
            ("read", HandleMode::Read),
            ("write", HandleMode::Write),
            ("dir", HandleMode::Dir),
        ]
        .map(|(n, mode)| (n, a.handles_opened(mode))),
    )
}

/// The lower's FLUSH/FSYNC/RELEASE calls: in progress by `call`, the flush and fsync duration
/// histograms, and the flushes that failed.
fn encode_lower_calls(
    enc: &mut DescriptorEncoder,
    a: &Accounting,
    out: &Outstanding,
) -> std::fmt::Result {
    gauge_family(
        enc,
        "lower_calls_in_progress",
        "Lower FLUSH/FSYNC/RELEASE calls in progress",
        "call",
        [
            ("flush", out.lower_flush),
            ("fsync", out.lower_fsync),
            ("release", out.lower_release),
        ],
    )?;
    histogram(
        enc,
        "lower_flush_duration_seconds",
        "Duration of lower flushes (uploads on gcsfuse)",
        &a.lower_flush_duration,
    )?;
    histogram(
        enc,
        "lower_fsync_duration_seconds",
        "Duration of lower fsyncs",
        &a.lower_fsync_duration,
    )?;
    counter(
        enc,
        "lower_flush_errors",
        "Lower flushes that failed",
        a.lower_flush_errors.load(Relaxed),
    )
}

/// `drainfs_read_bytes_total` and `drainfs_written_bytes_total` (drainfs's own data path).
fn encode_bytes(enc: &mut DescriptorEncoder, a: &Accounting) -> std::fmt::Result {
    counter(
        enc,
        "read_bytes",
        "Bytes read through drainfs's own data path (not kernel passthrough)",
        a.bytes_read.load(Relaxed),
    )?;
    counter(
        enc,
        "written_bytes",
        "Bytes written through drainfs's own data path (not kernel passthrough)",
        a.bytes_written.load(Relaxed),
    )
}

/// The shutdown families: triggers by `cause`, forced shutdowns by `reason`, the drain's
/// duration (seconds, 0 until drained) and the deadline's remaining seconds (absent before a
/// trigger).
fn encode_shutdown(enc: &mut DescriptorEncoder, s: &Shared) -> std::fmt::Result {
    let triggers = s.triggers.lock().clone();
    counter_family(
        enc,
        "shutdown_triggers",
        "Shutdown triggers received, by cause",
        "cause",
        CauseKind::iter().map(|c| (c.name(), triggers.get(&c).copied().unwrap_or(0))),
    )?;
    let forced = s.forced.lock().clone();
    counter_family(
        enc,
        "forced_shutdowns",
        "Shutdowns forced with work outstanding, by reason",
        "reason",
        Forced::iter().map(|r| (r.name(), forced.get(&r).copied().unwrap_or(0))),
    )?;
    gauge_f(
        enc,
        "drain_duration_seconds",
        "Time from the first trigger to drained (0 until drained)",
        s.drain_seconds().unwrap_or(0.0),
    )?;
    if let Some(left) = s.deadline_left() {
        gauge_f(
            enc,
            "deadline_remaining_seconds",
            "Time left before the forced-exit deadline",
            left.as_secs_f64(),
        )?;
    }
    Ok(())
}

/// `drainfs_lower_up` (the lower's process) and `drainfs_passthrough_enabled` (0 or 1 each).
fn encode_processes(enc: &mut DescriptorEncoder, s: &Shared) -> std::fmt::Result {
    gauge(
        enc,
        "lower_up",
        "Whether the lower's process is up",
        i64::from(s.lower_up()),
    )?;
    gauge(
        enc,
        "passthrough_enabled",
        "Whether kernel passthrough is in effect",
        i64::from(s.passthrough()),
    )
}

/// The relay's families (only in relay mode): requests it answered itself by `reason`, and its
/// message payload cap in bytes.
fn encode_relay(enc: &mut DescriptorEncoder, s: &Shared) -> std::fmt::Result {
    let Some(r) = s.relay_status() else {
        return Ok(());
    };
    counter_family(
        enc,
        "relay_answered",
        "Requests the relay answered itself instead of the daemon, by reason",
        "reason",
        [
            ("door", r.counts.door_refused),
            ("daemon_gone", r.counts.answered_daemon_gone),
            ("send_failed", r.counts.answered_send_failed),
        ],
    )?;
    gauge(
        enc,
        "relay_message_cap_bytes",
        "Largest FUSE message payload the relay carries (max_write)",
        i64::from(r.cap.unwrap_or(0)),
    )
}

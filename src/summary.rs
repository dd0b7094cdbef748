//! The JSON shutdown summary: logged, written atomically to `--summary-file`, and written to
//! `--termination-log` (Kubernetes' `/dev/termination-log`, shown in `kubectl get pod -o
//! yaml`), capped at 4 KiB there.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

use serde::Serialize;

use crate::accounting::{Accounting, HandleMode, Op, Outstanding};
use crate::lifecycle::{Cause, Forced, Timings};

/// Kubernetes truncates termination messages at 4096 bytes.
pub const TERMINATION_LOG_CAP: usize = 4096;

/// Counts over the whole run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    /// FUSE requests served.
    pub requests: u64,
    /// FUSE requests answered with an error.
    pub request_errors: u64,
    /// Files opened read-only.
    pub opened_read: u64,
    /// Files opened for writing.
    pub opened_write: u64,
    /// Lower flushes that failed.
    pub lower_flush_errors: u64,
    /// Lower flushes (uploads) performed.
    pub lower_flushes: u64,
    /// Bytes read through drainfs's own data path.
    pub bytes_read: u64,
    /// Bytes written through drainfs's own data path.
    pub bytes_written: u64,
}

impl From<&Accounting> for Counts {
    fn from(a: &Accounting) -> Self {
        let (mut requests, mut request_errors) = (0, 0);
        for op in Op::ALL {
            let s = a.op_stats(*op);
            requests += s.count.load(Relaxed);
            request_errors += s.errors.load(Relaxed);
        }
        Counts {
            requests,
            request_errors,
            opened_read: a.handles_opened(HandleMode::Read),
            opened_write: a.handles_opened(HandleMode::Write),
            lower_flush_errors: a.lower_flush_errors.load(Relaxed),
            lower_flushes: a.lower_flush_duration.snapshot().2,
            bytes_read: a.bytes_read.load(Relaxed),
            bytes_written: a.bytes_written.load(Relaxed),
        }
    }
}

/// The shutdown summary.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The process's exit status (0, 1, 69, 75).
    pub exit_code: i32,
    /// [`crate::drain::ExitCode::outcome`]: `clean`, `failed`, `lower_failed`, `incomplete`.
    pub outcome: &'static str,
    /// The first trigger.
    pub cause: Option<Cause>,
    /// Why the exit was forced, if it was (`deadline`, `second_signal`, `lower_died`,
    /// `lower_sigkill`).
    pub forced: Option<Forced>,
    /// What was seen of the lower dying, if it did.
    pub lower_died: Option<String>,
    /// How the lower's process ended.
    pub lower_exit: Option<String>,
    /// Phase timings.
    pub timings: Timings,
    /// What was outstanding when the exit was forced.
    pub outstanding_at_force: Option<Outstanding>,
    /// Paths still open when the exit was forced.
    pub open_paths: Vec<String>,
    /// Opens and creates admitted and still in flight when the exit was forced, by path.
    pub in_flight_opens: Vec<String>,
    /// Paths whose lower flush failed.
    pub failed_flushes: Vec<String>,
    /// Counts.
    pub counts: Counts,
    /// Anything else worth knowing.
    pub notes: Vec<String>,
    /// `mount` or `relay`.
    pub data_path: &'static str,
    /// The relay's INIT caps, socket buffers and counters (relay only).
    pub relay: Option<crate::relay::engine::RelayStatus>,
}

/// Writes `data` to `path` atomically for readers: a temp file in the same directory, then a
/// rename, so a reader sees the old file or the whole new one. Not fsynced: readers are other
/// processes of the same machine, and an fsync on a busy disk can take seconds (measured:
/// 2.3 s after a benchmark's writes), which would delay drainfs's exit towards the kubelet's
/// or the CSI sidecar's SIGKILL.
///
/// # Errors
/// The I/O error of any step.
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(data)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Cuts the JSON to fit Kubernetes' termination message (4 KiB): keeps as many of the path
/// lists' first entries (open paths, admitted opens, failed flushes) as fit, with a note of
/// how many were left out; only if even empty lists do not fit, the relay's details and the
/// notes go, and last the text is cut.
pub fn for_termination_log(s: &Summary) -> String {
    let full = serde_json::to_string(s).unwrap_or_default();
    if full.len() <= TERMINATION_LOG_CAP {
        return full;
    }
    let cut = |keep: usize| {
        let mut small = s.clone();
        let lists = [
            ("open paths", &mut small.open_paths),
            ("admitted opens", &mut small.in_flight_opens),
            ("failed flushes", &mut small.failed_flushes),
        ];
        let mut left_out = Vec::new();
        for (what, list) in lists {
            if list.len() > keep {
                left_out.push(format!("{} of {} {what}", list.len() - keep, list.len()));
                list.truncate(keep);
            }
        }
        if !left_out.is_empty() {
            small.notes.push(format!(
                "termination log: left out {} (the summary file and the log have them)",
                left_out.join(", ")
            ));
        }
        small
    };
    let longest = s
        .open_paths
        .len()
        .max(s.in_flight_opens.len())
        .max(s.failed_flushes.len());
    let mut keep = longest;
    while keep > 0 {
        keep /= 2;
        let out = serde_json::to_string(&cut(keep)).unwrap_or_default();
        if out.len() <= TERMINATION_LOG_CAP {
            return out;
        }
    }
    let mut small = cut(0);
    small.relay = None;
    small.notes.truncate(1);
    let mut out = serde_json::to_string(&small).unwrap_or_default();
    out.truncate(TERMINATION_LOG_CAP);
    out
}

/// Logs the summary and writes it where configured. Failures to write are logged.
pub fn emit(s: &Summary, summary_file: Option<&Path>, termination_log: Option<&Path>) {
    let json = serde_json::to_string(s).unwrap_or_default();
    tracing::info!(summary = %json, exit_code = s.exit_code, outcome = s.outcome, "shutdown summary");
    if let Some(p) = summary_file
        && let Err(e) = write_atomic(p, format!("{json}\n").as_bytes())
    {
        tracing::warn!(path = %p.display(), error = %e, "cannot write the summary file");
    }
    if let Some(p) = termination_log {
        // Not a rename: Kubernetes bind-mounts this one file.
        if let Err(e) = std::fs::write(p, for_termination_log(s)) {
            tracing::warn!(path = %p.display(), error = %e, "cannot write the termination log");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_log_fits_in_4k() {
        let s = Summary {
            exit_code: 75,
            outcome: "incomplete",
            cause: Some(Cause::Sigterm),
            forced: Some(Forced::Deadline),
            lower_died: None,
            lower_exit: None,
            timings: Timings::default(),
            outstanding_at_force: None,
            in_flight_opens: Vec::new(),
            open_paths: (0..500)
                .map(|i| format!("/some/long/path/to/file-{i:05}.parquet"))
                .collect(),
            failed_flushes: vec![],
            counts: Counts::default(),
            notes: vec![],
            data_path: "mount",
            relay: None,
        };
        let t = for_termination_log(&s);
        assert!(t.len() <= TERMINATION_LOG_CAP);
        let v: serde_json::Value = serde_json::from_str(&t).unwrap();
        assert_eq!(v["exit_code"], 75);
        let kept = v["open_paths"].as_array().unwrap().len();
        assert!((3..500).contains(&kept), "kept {kept}");
        assert!(
            v["notes"][0]
                .as_str()
                .unwrap()
                .contains(&format!("{} of 500 open paths", 500 - kept)),
            "{v:#}"
        );
    }
}

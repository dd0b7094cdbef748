//! The JSON shutdown summary: logged (INFO when clean, ERROR with the files named
//! otherwise), written atomically to `--summary-file`, and written to `--termination-log`
//! (Kubernetes' `/dev/termination-log`, shown in `kubectl get pod -o yaml`), capped at 4 KiB
//! there. The relay writes `/dev/termination-log` by default when it may.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;

use serde::Serialize;

use crate::accounting::{Accounting, HandleMode, Op, Outstanding};
use crate::drain::{Cause, ExitCode, Forced, LowerStop, Machine, Outcome};
use crate::relay::engine::RelayStatus;

mod handoff;
pub use handoff::{HandoffFacts, HandoffSummary, HandoffTimings};

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

/// Timings of the shutdown, milliseconds since the first trigger.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Timings {
    /// Wall-clock time of the first trigger (RFC 3339).
    pub trigger: Option<String>,
    /// Admission closed.
    pub door_closed_ms: Option<u64>,
    /// Nothing outstanding.
    pub drained_ms: Option<u64>,
    /// drainfs unmounted.
    pub unmounted_ms: Option<u64>,
    /// The lower's process exited.
    pub lower_exited_ms: Option<u64>,
    /// drainfs about to exit.
    pub exit_ms: Option<u64>,
}

/// How the lower's FUSE mount went away at the end (mount path, supervised lower).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LowerUnmount {
    /// drainfs unmounted it (one `umount2`, drained, instead of the stop signal): the lower's
    /// session ends and it exits by itself. gcsfuse unmounts only through fusermount, which
    /// a FROM-scratch image lacks.
    Drainfs,
    /// It was gone after the stop signal: the lower unmounted itself.
    Lower,
    /// Still mounted (busy) after the stop signal with nothing outstanding: drainfs ended its
    /// FUSE connection and detached it.
    Aborted,
    /// It lingered after the lower's process ended (or was killed): drainfs removed it.
    Removed,
}

/// The shutdown summary.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The process's exit status (0, 1, 69, 75); 75 in a provisional summary
    /// ([`Summary::provisional`]), which is what a stop that never finished amounts to.
    pub exit_code: i32,
    /// [`crate::drain::ExitCode::outcome`]: `clean`, `failed`, `lower_failed`, `incomplete`;
    /// or [`STOPPING`] in a provisional summary.
    pub outcome: &'static str,
    /// The process id of the drainfs that wrote it (in its own PID namespace): several relays
    /// of one pod share one termination log, and a clean summary replaces a provisional one
    /// only its own writer's ([`write_termination_log`]).
    pub pid: u32,
    /// The first trigger.
    pub cause: Option<Cause>,
    /// Why the exit was forced, if it was (`deadline`, `second_signal`, `lower_died`,
    /// `lower_sigkill`).
    pub forced: Option<Forced>,
    /// What was seen of the lower dying, if it did.
    pub lower_died: Option<String>,
    /// How the lower's process ended.
    pub lower_exit: Option<String>,
    /// How the lower's FUSE mount went away (`None`: there was none to remove: the relay, an
    /// unsupervised lower, or it never mounted).
    pub lower_unmount: Option<LowerUnmount>,
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
    pub relay: Option<RelayStatus>,
    /// Processes (pids, at most 20) whose `/proc` files did not answer drainfs's scan for
    /// writers on the lower within its deadline when last scanned: each may have been
    /// writing, so the lower's connection was not ended under them (absent when none).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unanswered_pids: Vec<i32>,
    /// [`SCHEMA_VERSION`]: the summaries' schema this one follows.
    pub schema_version: u32,
    /// The drainfs that wrote it ([`crate::VERSION`]: `0.1.0+COMMIT`).
    pub drainfs_version: &'static str,
}

/// The version of the summaries' schema (`docker/monitoring/summary.schema.json` and
/// `handoff-summary.schema.json`), every summary's `schema_version`. It changes when a field
/// is removed, renamed or changes meaning (docs/stable-surface.md); adding a field keeps it.
pub const SCHEMA_VERSION: u32 = 1;

/// What the lifecycle's executor recorded of one run, as it happened: the facts of the stop
/// beyond what the drain machine knows. [`Record::outcome`] gives the exit code's inputs,
/// [`Summary::new`] builds the summary from it.
#[derive(Debug, Clone, Default)]
pub struct Record {
    /// The data path served: drainfs's mount was up, the relay's daemon answered INIT, or
    /// the hand-off started gcsfuse.
    pub served: bool,
    /// Phase timings, milliseconds since the first trigger.
    pub timings: Timings,
    /// Paths still open when the teardown was forced (the relay adds files whose connection
    /// ended while open for writing).
    pub open_paths: Vec<String>,
    /// Opens and creates admitted and still in flight when the teardown was forced.
    pub in_flight_opens: Vec<String>,
    /// Paths whose lower flush or close failed, each once.
    pub failed_flushes: Vec<String>,
    /// How the lower's process ended ([`crate::procs::describe`]).
    pub lower_exit: Option<String>,
    /// How the lower's process was stopped (`None`: never stopped).
    pub lower_stop: Option<LowerStop>,
    /// How the lower's FUSE mount went away.
    pub lower_unmount: Option<LowerUnmount>,
    /// drainfs itself failed (could not mount or serve, its control plane failed): exit 1.
    pub failed: bool,
    /// A close of lower fds did not finish within its budget (its upload's result is unknown).
    pub closes_unfinished: bool,
    /// The relay's daemon died of this signal, one drainfs did not send.
    pub raise: Option<nix::sys::signal::Signal>,
    /// Anything else worth knowing, in order.
    pub notes: Vec<String>,
    /// Processes that did not answer the last scan for writers on the lower (at most 20).
    pub unanswered_pids: Vec<i32>,
    /// What the hand-off saw of gcsfuse (hand-off only).
    pub handoff: Option<HandoffFacts>,
}

impl Record {
    /// Adds `paths` to the failed flushes, each path once.
    pub fn add_failed_flushes(&mut self, paths: impl IntoIterator<Item = String>) {
        for f in paths {
            if !self.failed_flushes.contains(&f) {
                self.failed_flushes.push(f);
            }
        }
    }

    /// The inputs of [`crate::drain::exit_code`]: this record and what `machine` decided;
    /// `relay`: the lower is the relay's daemon (whose connection serves nothing before its
    /// INIT answer).
    pub fn outcome(&self, machine: &Machine, relay: bool) -> Outcome {
        Outcome {
            never_served: relay && !self.served,
            lower_died: machine.lower_died().is_some(),
            lower_stop: self.lower_stop,
            forced: machine.forced(),
            outstanding_at_force: machine.outstanding_at_force(),
            failed_flushes: self.failed_flushes.len(),
            failed: self.failed,
            outstanding_at_kill: machine.outstanding_at_kill(),
            reads_at_teardown: machine.at_teardown().map_or(0, |o| o.in_flight_read),
            closes_unfinished: self.closes_unfinished,
        }
    }
}

impl Summary {
    /// The summary of a run that ends with `code`: the first trigger, the force and the
    /// lower's death as `machine` saw them, the `record`'s facts, the run's `counts`, the
    /// data path (`mount` or `relay`) and the relay's status.
    pub fn new(
        code: ExitCode,
        machine: &Machine,
        record: &Record,
        counts: Counts,
        data_path: &'static str,
        relay: Option<RelayStatus>,
    ) -> Summary {
        Summary {
            exit_code: code.code(),
            outcome: code.outcome(),
            pid: std::process::id(),
            cause: machine.first_trigger().map(|(_, c)| c.clone()),
            forced: machine.forced(),
            lower_died: machine.lower_died().map(str::to_string),
            lower_exit: record.lower_exit.clone(),
            lower_unmount: record.lower_unmount,
            timings: record.timings.clone(),
            outstanding_at_force: machine.outstanding_at_force(),
            open_paths: record.open_paths.clone(),
            in_flight_opens: record.in_flight_opens.clone(),
            failed_flushes: record.failed_flushes.clone(),
            counts,
            notes: record.notes.clone(),
            data_path,
            relay,
            unanswered_pids: record.unanswered_pids.clone(),
            schema_version: SCHEMA_VERSION,
            drainfs_version: crate::VERSION,
        }
    }
}

/// The `outcome` of a provisional summary: drainfs was stopping when it wrote it.
pub const STOPPING: &str = "stopping";

impl Summary {
    /// A provisional summary, written to the termination log while drainfs stops (from the
    /// first trigger until the final summary replaces it), so that a drainfs killed before
    /// it finished its stop (the kubelet's SIGKILL at the end of the grace period, which for
    /// a native sidecar can come 2 s after its SIGTERM) still leaves what it knew: the
    /// trigger, what was outstanding, and the files open (`open_paths`) and opening
    /// (`in_flight_opens`) when it was written. `exit_code` 75 and outcome [`STOPPING`]: a
    /// stop that never finished confirmed nothing. `outstanding_at_force` holds the counts
    /// when it was written.
    pub fn provisional(
        machine: &Machine,
        record: &Record,
        outstanding: Outstanding,
        counts: Counts,
        data_path: &'static str,
        relay: Option<RelayStatus>,
    ) -> Summary {
        let mut s = Summary::new(
            ExitCode::Incomplete,
            machine,
            record,
            counts,
            data_path,
            relay,
        );
        s.outcome = STOPPING;
        s.outstanding_at_force = Some(outstanding);
        s.notes.push(
            "provisional: drainfs was still stopping when it wrote this; if it stayed, drainfs \
             was killed before it finished (the container's exit code says how): treat the \
             stop as incomplete, the files named here may be missing from the bucket"
                .to_string(),
        );
        s
    }
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

/// How many paths of each list the ERROR line of a stop that is not clean names.
const LOGGED_PATHS: usize = 20;

/// Logs the summary and writes it where configured. Failures to write are logged.
///
/// A clean stop (exit 0) is logged at INFO. Any other outcome is logged at ERROR, with a
/// second ERROR line that names the files (up to 20 of each list: open when the exit was
/// forced, opens still in flight, failed flushes) and the lower's death, so that log-based
/// alerting and `kubectl logs` show what may be missing.
pub fn emit(s: &Summary, summary_file: Option<&Path>, termination_log: Option<&Path>) {
    let json = serde_json::to_string(s).unwrap_or_default();
    if s.exit_code == 0 {
        tracing::info!(summary = %json, exit_code = s.exit_code, outcome = s.outcome, "shutdown summary");
    } else {
        tracing::error!(summary = %json, exit_code = s.exit_code, outcome = s.outcome, "shutdown summary");
        tracing::error!(
            exit_code = s.exit_code,
            outcome = s.outcome,
            forced = ?s.forced,
            "{}",
            not_clean_message(s)
        );
    }
    write_outputs(&json, &LogEntry::from(s), summary_file, termination_log);
}

/// Writes a summary's `json` to the summary file and its `entry` to the termination log, where
/// configured; failures are logged.
fn write_outputs(
    json: &str,
    entry: &LogEntry,
    summary_file: Option<&Path>,
    termination_log: Option<&Path>,
) {
    if let Some(p) = summary_file
        && let Err(e) = write_atomic(p, format!("{json}\n").as_bytes())
    {
        tracing::warn!(path = %p.display(), error = %e, "cannot write the summary file");
    }
    if let Some(p) = termination_log
        && let Err(e) = write_log_entry(p, entry)
    {
        tracing::warn!(path = %p.display(), error = %e, "cannot write the termination log");
    }
}

/// The ERROR line of a stop that is not clean: the outcome, then the files.
pub fn not_clean_message(s: &Summary) -> String {
    let served = s.counts.opened_write > 0
        || s.counts.bytes_written > 0
        || !s.open_paths.is_empty()
        || !s.in_flight_opens.is_empty()
        || !s.failed_flushes.is_empty();
    let mut parts = vec![format!(
        "stopped with exit {} ({}): {}",
        s.exit_code,
        s.outcome,
        if served || s.outcome == STOPPING {
            "data may be missing from the bucket"
        } else {
            "no file was opened for writing, so nothing written through drainfs is missing"
        }
    )];
    let list = |what: &str, paths: &[String]| {
        let shown: Vec<&str> = paths
            .iter()
            .take(LOGGED_PATHS)
            .map(String::as_str)
            .collect();
        let more = paths.len().saturating_sub(LOGGED_PATHS);
        format!(
            "{what}: {}{}",
            shown.join(", "),
            if more > 0 {
                format!(" (and {more} more)")
            } else {
                String::new()
            }
        )
    };
    if !s.open_paths.is_empty() {
        parts.push(list("still open", &s.open_paths));
    }
    if !s.in_flight_opens.is_empty() {
        parts.push(list("opens in flight", &s.in_flight_opens));
    }
    if !s.failed_flushes.is_empty() {
        parts.push(list("failed flushes", &s.failed_flushes));
    }
    if let Some(d) = &s.lower_died {
        parts.push(format!("the lower died: {d}"));
    }
    parts.join("; ")
}

/// One summary as the termination log holds it: its text (capped at 4 KiB) and what
/// the sharing rules (`replaces`) need to know of it. Every data path's summary ([`Summary`], the hand-off's
/// [`HandoffSummary`]) becomes one, so that summaries of several drop-ins of one pod (one
/// per volume) share the file by the same rules whatever their mode.
#[derive(Debug, Clone)]
pub struct LogEntry {
    /// The JSON text, at most [`TERMINATION_LOG_CAP`] bytes.
    pub text: String,
    /// The writer's process id.
    pub pid: u32,
    /// The summary's `exit_code` (0: the stop needs no attention).
    pub exit_code: i32,
    /// A provisional summary (outcome [`STOPPING`]).
    pub stopping: bool,
}

impl From<&Summary> for LogEntry {
    fn from(s: &Summary) -> LogEntry {
        LogEntry {
            text: for_termination_log(s),
            pid: s.pid,
            exit_code: s.exit_code,
            stopping: s.outcome == STOPPING,
        }
    }
}

impl From<Summary> for LogEntry {
    fn from(s: Summary) -> LogEntry {
        LogEntry::from(&s)
    }
}

/// Whether `s` may replace `old`, the termination log's content. Several drop-ins of one pod
/// (one per gcsfuse volume) share the container's `/dev/termination-log`, and the sidecar
/// mounter SIGTERMs them all at once. A clean summary (exit code 0) replaces only a clean one
/// or its own writer's (same `pid`) provisional one: it never hides another volume's
/// incomplete or unfinished stop. A provisional summary replaces anything but another
/// writer's final summary that is not clean; in particular another writer's provisional one,
/// so that a writer whose stop is still going is the one the file shows when the other
/// finishes clean. A final summary that is not clean replaces anything. Anything that is not
/// a drainfs summary is replaced.
fn replaces(old: &str, s: &LogEntry) -> bool {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(old) else {
        return true;
    };
    let Some(old_code) = v.get("exit_code").and_then(serde_json::Value::as_i64) else {
        return true;
    };
    let own = v.get("pid").and_then(serde_json::Value::as_u64) == Some(u64::from(s.pid));
    let old_stopping = v.get("outcome").and_then(serde_json::Value::as_str) == Some(STOPPING);
    if old_code == 0 || own {
        return true;
    }
    if s.stopping {
        return old_stopping;
    }
    s.exit_code != 0
}

/// Writes the termination-log form of `s` ([`for_termination_log`]) to `path` in place (not
/// a rename: Kubernetes bind-mounts this one file), under an exclusive `flock`, unless what
/// the file holds must stay (`replaces`: a clean summary never hides another writer's one
/// that is not clean, a provisional one never hides another writer's final one that is not
/// clean).
///
/// # Errors
/// The I/O error of any step.
pub fn write_termination_log(path: &Path, s: &Summary) -> std::io::Result<()> {
    write_termination_log_unless(path, &LogEntry::from(s), || false)
}

/// [`write_termination_log`] for a summary already made a [`LogEntry`] (any data path's).
///
/// # Errors
/// The I/O error of any step.
pub fn write_log_entry(path: &Path, e: &LogEntry) -> std::io::Result<()> {
    write_termination_log_unless(path, e, || false)
}

/// [`write_termination_log`], unless `stop()` is true once the file's lock is held (the
/// [`ProvisionalLog`]'s writer: a final summary written meanwhile must not be overwritten).
fn write_termination_log_unless(
    path: &Path,
    s: &LogEntry,
    stop: impl Fn() -> bool,
) -> std::io::Result<()> {
    use std::io::{Read, Seek};
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o644)
        .open(path)?;
    let locked = nix::fcntl::Flock::lock(f.try_clone()?, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| std::io::Error::from(e))?;
    if stop() {
        drop(locked);
        return Ok(());
    }
    let mut old = String::new();
    // A file that cannot be read (a pipe, unreadable) is simply overwritten.
    let _ = f.read_to_string(&mut old);
    if !replaces(&old, s) {
        drop(locked);
        return Ok(());
    }
    // One write over the old text, padded with spaces to its length (trailing spaces are
    // still the same JSON), then the cut: a SIGKILL at any point leaves the old summary or
    // the new one, never an empty file (truncating first left one in between).
    let mut text = s.text.clone().into_bytes();
    let len = text.len();
    text.resize(len.max(old.len()), b' ');
    f.rewind()?;
    f.write_all(&text)?;
    f.set_len(len as u64)?;
    drop(locked);
    Ok(())
}

/// Writes provisional summaries ([`Summary::provisional`]) to the termination log on a thread
/// of its own, so that a termination log that does not answer (a path on a hung mount) never
/// holds the lifecycle's loop, its triggers or its deadline. Only the latest summary handed
/// over is written; [`ProvisionalLog::close`] (before the final summary is written) ends the
/// thread, and a write already waiting for the file's lock then gives up, so a provisional
/// summary never lands after the final one.
///
/// Until then, every [`REASSERT_EVERY`] the thread looks at the file and writes its latest
/// summary again if the file shows a clean stop (or no drainfs summary): one file holds one
/// summary, and another relay of the pod that finished clean may have replaced this one's
/// (after this one's provisional summary had replaced the other's). So the file shows "clean"
/// for at most that long while a relay of the pod is still stopping.
pub struct ProvisionalLog {
    shared: std::sync::Arc<(parking_lot::Mutex<ProvisionalState>, parking_lot::Condvar)>,
    thread: std::thread::JoinHandle<()>,
}

#[derive(Default)]
struct ProvisionalState {
    next: Option<LogEntry>,
    closed: bool,
}

impl ProvisionalLog {
    /// Starts the writer for the termination log at `path`.
    pub fn start(path: std::path::PathBuf) -> ProvisionalLog {
        let shared = std::sync::Arc::new((
            parking_lot::Mutex::new(ProvisionalState::default()),
            parking_lot::Condvar::new(),
        ));
        let theirs = std::sync::Arc::clone(&shared);
        let thread = std::thread::spawn(move || {
            let (state, wake) = &*theirs;
            let mut last: Option<LogEntry> = None;
            loop {
                let next = {
                    let mut st = state.lock();
                    while st.next.is_none() && !st.closed {
                        if last.is_none() {
                            wake.wait(&mut st);
                        } else if wake.wait_for(&mut st, REASSERT_EVERY).timed_out() {
                            break;
                        }
                    }
                    if st.closed {
                        return;
                    }
                    st.next.take()
                };
                match next {
                    Some(s) => last = Some(s),
                    // Timed out: write again only if the file shows a clean stop.
                    None if !shows_clean(&path) => continue,
                    None => {}
                }
                if let Some(s) = &last
                    && let Err(e) = write_termination_log_unless(&path, s, || state.lock().closed)
                {
                    tracing::warn!(path = %path.display(), error = %e, "cannot write the provisional summary");
                }
            }
        });
        ProvisionalLog { shared, thread }
    }

    /// Hands `s` (a [`Summary`] or any [`LogEntry`]) over to be written (replacing one not yet
    /// written); never blocks on I/O.
    pub fn put(&self, s: impl Into<LogEntry>) {
        let (state, wake) = &*self.shared;
        state.lock().next = Some(s.into());
        wake.notify_one();
    }

    /// Whether the writer's thread has ended (after [`ProvisionalLog::close`], once a write
    /// it was in has returned).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Ends the writer: nothing handed over is written from now on.
    pub fn close(&self) {
        let (state, wake) = &*self.shared;
        let mut st = state.lock();
        st.closed = true;
        st.next = None;
        drop(st);
        wake.notify_one();
    }
}

/// How often a [`ProvisionalLog`] looks whether another relay's clean summary replaced its own.
pub const REASSERT_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Whether the termination log at `path` shows a clean stop or no drainfs summary at all (a
/// file that cannot be read counts as not clean: nothing to put right).
fn shows_clean(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else {
        return false;
    };
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("exit_code").and_then(serde_json::Value::as_i64))
        .is_none_or(|c| c == 0)
}

/// Where the relay writes its summary when `--termination-log` is not given: Kubernetes'
/// `/dev/termination-log`, if this process may write it (the kubelet bind-mounts it into
/// every container; the node driver's injected sidecar spec leaves no way to set flags).
pub const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";

/// [`DEFAULT_TERMINATION_LOG`] when it exists and is writable by this process, else `None`.
pub fn default_termination_log() -> Option<std::path::PathBuf> {
    let p = Path::new(DEFAULT_TERMINATION_LOG);
    (p.exists() && nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).is_ok())
        .then(|| p.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(exit_code: i32, open: &[&str]) -> Summary {
        Summary {
            exit_code,
            outcome: if exit_code == 0 {
                "clean"
            } else {
                "incomplete"
            },
            pid: 1000,
            cause: Some(Cause::Sigterm),
            forced: None,
            lower_died: None,
            lower_exit: None,
            lower_unmount: None,
            timings: Timings::default(),
            outstanding_at_force: None,
            in_flight_opens: Vec::new(),
            open_paths: open.iter().map(|p| p.to_string()).collect(),
            failed_flushes: vec![],
            counts: Counts::default(),
            notes: vec![],
            data_path: "relay",
            relay: None,
            unanswered_pids: Vec::new(),
            schema_version: SCHEMA_VERSION,
            drainfs_version: crate::VERSION,
        }
    }

    /// [`summary`] written by process `pid`, provisional (`stopping`) or not.
    fn of(pid: u32, code: i32, stopping: bool, open: &[&str]) -> Summary {
        let mut s = summary(code, open);
        s.pid = pid;
        if stopping {
            s.outcome = STOPPING;
        }
        s
    }

    #[test]
    fn a_clean_summary_never_hides_an_incomplete_one_in_the_termination_log() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("termination-log");
        let read = || -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
        };
        // Two writers (two relays of one pod): 1000 and 2000.
        let clean = || {
            let mut s = summary(0, &[]);
            s.pid = 2000;
            s
        };
        write_termination_log(&p, &clean()).unwrap();
        assert_eq!(read()["exit_code"], 0);
        write_termination_log(&p, &summary(75, &["/a.parquet"])).unwrap();
        assert_eq!(read()["exit_code"], 75);
        write_termination_log(&p, &clean()).unwrap();
        assert_eq!(
            read()["exit_code"],
            75,
            "a clean stop replaced an incomplete one"
        );
        assert_eq!(read()["open_paths"][0], "/a.parquet");
        // A shorter summary leaves no tail of the longer one behind.
        write_termination_log(&p, &summary(69, &[])).unwrap();
        assert_eq!(read()["exit_code"], 69);
        // Anything that is not a drainfs summary is overwritten.
        std::fs::write(&p, "not json at all, and long enough to leave a tail").unwrap();
        write_termination_log(&p, &clean()).unwrap();
        assert_eq!(read()["exit_code"], 0);
    }

    /// A provisional summary (outcome `stopping`) is replaced by its own writer's final one,
    /// clean or not; another writer's clean or provisional summary never replaces it, and it
    /// never replaces another writer's final one that is not clean.
    #[test]
    fn a_provisional_summary_gives_way_only_to_its_writer_or_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("termination-log");
        let read = || -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
        };
        // One writer: provisional, a later provisional, then its clean final.
        write_termination_log(&p, &of(7, 75, true, &["/a"])).unwrap();
        assert_eq!(
            (read()["outcome"].clone(), read()["pid"].clone()),
            ("stopping".into(), 7.into())
        );
        write_termination_log(&p, &of(7, 75, true, &["/b"])).unwrap();
        assert_eq!(read()["open_paths"][0], "/b");
        write_termination_log(&p, &of(7, 0, false, &[])).unwrap();
        assert_eq!(
            read()["outcome"],
            "clean",
            "its own clean final replaces it"
        );
        // Two writers: 8's provisional stays under 9's clean final.
        write_termination_log(&p, &of(8, 75, true, &["/c"])).unwrap();
        write_termination_log(&p, &of(9, 0, false, &[])).unwrap();
        assert_eq!(
            (read()["outcome"].clone(), read()["pid"].clone()),
            ("stopping".into(), 8.into())
        );
        // Both SIGTERMed at once (GKE's sidecar mounter): 8's provisional, then 9's, which
        // replaces it; 8's clean final must not then hide 9's unfinished stop (it did when
        // 9's provisional was refused).
        write_termination_log(&p, &of(9, 75, true, &["/d"])).unwrap();
        assert_eq!(read()["open_paths"][0], "/d", "9's provisional was refused");
        write_termination_log(&p, &of(8, 0, false, &[])).unwrap();
        assert_eq!(
            (read()["outcome"].clone(), read()["pid"].clone()),
            ("stopping".into(), 9.into()),
            "a clean stop hid another volume's unfinished one"
        );
        // 9's final incomplete replaces it (a stop that is not clean either way).
        write_termination_log(&p, &of(9, 75, false, &["/d"])).unwrap();
        assert_eq!(
            (read()["outcome"].clone(), read()["pid"].clone()),
            ("incomplete".into(), 9.into())
        );
        // Then 8's provisional may not hide 9's final incomplete; 8's clean final neither.
        write_termination_log(&p, &of(8, 75, true, &["/c"])).unwrap();
        write_termination_log(&p, &of(8, 0, false, &[])).unwrap();
        assert_eq!(
            (read()["outcome"].clone(), read()["pid"].clone()),
            ("incomplete".into(), 9.into())
        );
        // A summary without a pid (an older drainfs) that is not clean stays under a clean one.
        std::fs::write(&p, r#"{"exit_code":75,"outcome":"incomplete"}"#).unwrap();
        write_termination_log(&p, &of(8, 0, false, &[])).unwrap();
        assert_eq!(read()["exit_code"], 75);
    }

    /// The writer of provisional summaries never holds its caller, writes the latest one, and
    /// writes nothing once closed, not even a summary already waiting for the file's lock
    /// (here held by the test, as by a final summary being written).
    #[test]
    fn the_provisional_writer_never_blocks_and_never_writes_after_close() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("termination-log");
        let read = || std::fs::read_to_string(&p).unwrap_or_default();
        let of = |open: &str| {
            let mut s = summary(75, &[open]);
            s.outcome = STOPPING;
            s
        };
        let log = ProvisionalLog::start(p.clone());
        log.put(of("/first"));
        let t = std::time::Instant::now();
        while !read().contains("/first") {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "never written"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Hold the file's lock: the writer's next write waits for it; put and close do not.
        let f = std::fs::File::open(&p).unwrap();
        let held = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).unwrap();
        log.put(of("/second"));
        std::thread::sleep(std::time::Duration::from_millis(100));
        let t = std::time::Instant::now();
        log.put(of("/third"));
        log.close();
        // Blocking would last as long as the lock is held, i.e. forever.
        assert!(
            t.elapsed() < std::time::Duration::from_secs(2),
            "put or close blocked"
        );
        drop(held);
        let t = std::time::Instant::now();
        while !log.is_finished() {
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "the writer never ended"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let text = read();
        assert!(text.contains("/first"), "written after close: {text}");
    }

    /// Two relays SIGTERMed at once: A's provisional summary, then B's (which replaces it),
    /// then B's clean final (which replaces its own): the file said "clean" while A was still
    /// stopping (a newcomer's reading of the rule). A's writer puts its summary back within
    /// `REASSERT_EVERY`.
    #[test]
    fn a_relay_still_stopping_puts_its_summary_back_over_another_ones_clean_one() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("termination-log");
        let read = || -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_default())
                .unwrap_or_default()
        };
        let a = ProvisionalLog::start(p.clone());
        a.put(of(8, 75, true, &["/stuck.bin"]));
        let wait_for = |want_pid: u64| {
            let t = std::time::Instant::now();
            while read()["pid"] != want_pid || read()["outcome"] != "stopping" {
                assert!(
                    t.elapsed() < std::time::Duration::from_secs(10),
                    "not back: {:#}",
                    read()
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        wait_for(8);
        write_termination_log(&p, &of(9, 75, true, &["/b.bin"])).unwrap();
        write_termination_log(&p, &of(9, 0, false, &[])).unwrap();
        wait_for(8);
        assert_eq!(read()["open_paths"][0], "/stuck.bin");
        // Once A has closed its writer (its final summary comes next), nothing comes back.
        a.close();
        let t = std::time::Instant::now();
        while !a.is_finished() {
            assert!(t.elapsed() < std::time::Duration::from_secs(10));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        write_termination_log(&p, &of(8, 0, false, &[])).unwrap();
        std::thread::sleep(REASSERT_EVERY * 3);
        assert_eq!(read()["outcome"], "clean");
    }

    #[test]
    fn a_provisional_summary_says_stopping_and_counts_what_is_outstanding() {
        let mut m = Machine::new(crate::drain::Config {
            grace_period: std::time::Duration::from_secs(30),
            grace_margin: std::time::Duration::from_secs(2),
            quiet_period: std::time::Duration::from_millis(500),
            native_sidecar: true,
        });
        m.trigger(Cause::Sigterm, std::time::Instant::now());
        let r = Record {
            open_paths: vec!["/out/part-0.parquet".into()],
            ..Record::default()
        };
        let out = Outstanding {
            open_write: 1,
            ..Outstanding::default()
        };
        let s = Summary::provisional(&m, &r, out, Counts::default(), "relay", None);
        assert_eq!((s.exit_code, s.outcome), (75, STOPPING));
        assert_eq!(s.pid, std::process::id());
        assert_eq!(s.outstanding_at_force.map(|o| o.open_write), Some(1));
        assert_eq!(s.open_paths, ["/out/part-0.parquet"]);
        assert!(
            s.notes.last().unwrap().starts_with("provisional"),
            "{:?}",
            s.notes
        );
        assert!(matches!(s.cause, Some(Cause::Sigterm)));
    }

    #[test]
    fn the_not_clean_line_names_the_files() {
        let many: Vec<String> = (0..25).map(|i| format!("/out/{i}.csv")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let mut s = summary(75, &many);
        s.failed_flushes = vec!["/out/bad.csv".into()];
        let m = not_clean_message(&s);
        assert!(
            m.contains("exit 75 (incomplete): data may be missing"),
            "{m}"
        );
        assert!(m.contains("/out/0.csv") && m.contains("/out/19.csv"), "{m}");
        assert!(
            !m.contains("/out/20.csv") && m.contains("(and 5 more)"),
            "{m}"
        );
        assert!(m.contains("failed flushes: /out/bad.csv"), "{m}");
        // A lower that never mounted: nothing was opened for writing, so nothing is missing.
        let mut s = summary(69, &[]);
        s.outcome = "lower_failed";
        let m = not_clean_message(&s);
        assert!(
            m.contains("nothing written through drainfs is missing"),
            "{m}"
        );
        s.counts.opened_write = 1;
        assert!(not_clean_message(&s).contains("data may be missing"));
    }

    /// The published schema (docker/monitoring/summary.schema.json) names every field the
    /// summary has, and requires every field it always has.
    #[test]
    fn the_published_schema_matches_the_summary() {
        let schema: serde_json::Value =
            serde_json::from_str(include_str!("../docker/monitoring/summary.schema.json")).unwrap();
        let props = schema["properties"].as_object().unwrap();
        let required: Vec<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let v = serde_json::to_value(summary(75, &["/a"])).unwrap();
        let obj = v.as_object().unwrap();
        for k in obj.keys() {
            assert!(props.contains_key(k), "{k} is not in the schema");
        }
        for k in &required {
            assert!(
                obj.contains_key(*k),
                "the schema requires {k}, the summary lacks it"
            );
        }
        assert_eq!(props["schema_version"]["const"], SCHEMA_VERSION);
        assert_eq!(v["schema_version"], SCHEMA_VERSION);
        let version = v["drainfs_version"].as_str().unwrap();
        let (pkg, commit) = version.split_once('+').unwrap();
        assert_eq!(pkg, env!("CARGO_PKG_VERSION"));
        assert!(!commit.is_empty(), "{version}");
        for (section, value) in [("timings", &v["timings"]), ("counts", &v["counts"])] {
            let known = props[section]["properties"].as_object().unwrap();
            for k in value.as_object().unwrap().keys() {
                assert!(known.contains_key(k), "{section}.{k} is not in the schema");
            }
        }
        // outstanding_at_force: null or an object with exactly the counts' fields.
        let known = props["outstanding_at_force"]["oneOf"][1]["properties"]
            .as_object()
            .unwrap();
        let counts = serde_json::to_value(crate::accounting::Outstanding::default()).unwrap();
        let counts = counts.as_object().unwrap();
        for k in counts.keys() {
            assert!(
                known.contains_key(k),
                "outstanding_at_force.{k} is not in the schema"
            );
        }
        for k in known.keys() {
            assert!(
                counts.contains_key(k),
                "outstanding_at_force.{k} is not in the summary"
            );
        }
    }

    #[test]
    fn termination_log_fits_in_4k() {
        let s = Summary {
            exit_code: 75,
            outcome: "incomplete",
            pid: 1,
            cause: Some(Cause::Sigterm),
            forced: Some(Forced::Deadline),
            lower_died: None,
            lower_exit: None,
            lower_unmount: None,
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
            unanswered_pids: Vec::new(),
            schema_version: SCHEMA_VERSION,
            drainfs_version: crate::VERSION,
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

    #[test]
    fn the_summary_and_the_exit_code_come_from_the_record_and_the_machine() {
        let mut m = Machine::new(crate::drain::Config {
            grace_period: std::time::Duration::from_secs(30),
            grace_margin: std::time::Duration::from_secs(2),
            quiet_period: std::time::Duration::from_millis(500),
            native_sidecar: false,
        });
        let mut r = Record {
            lower_exit: Some("exit 0".into()),
            lower_stop: Some(LowerStop::Clean),
            notes: vec!["a note".into()],
            ..Record::default()
        };
        let t0 = std::time::Instant::now();
        m.trigger(Cause::Sigterm, t0);
        assert_eq!(
            crate::drain::exit_code(&r.outcome(&m, false)),
            ExitCode::Clean
        );
        r.add_failed_flushes(["/a".to_string(), "/b".to_string()]);
        r.add_failed_flushes(["/a".to_string()]);
        assert_eq!(r.failed_flushes, ["/a", "/b"], "each path once");
        assert_eq!(
            crate::drain::exit_code(&r.outcome(&m, false)),
            ExitCode::Incomplete
        );
        let s = Summary::new(
            ExitCode::Incomplete,
            &m,
            &r,
            Counts::default(),
            "mount",
            None,
        );
        assert_eq!((s.exit_code, s.outcome), (75, "incomplete"));
        assert!(matches!(s.cause, Some(Cause::Sigterm)));
        assert_eq!(s.forced, None);
        assert_eq!(s.lower_died, None);
        assert_eq!(s.lower_exit.as_deref(), Some("exit 0"));
        assert_eq!(s.failed_flushes, ["/a", "/b"]);
        assert_eq!(s.notes, ["a note"]);
        assert_eq!(s.data_path, "mount");
        m.trigger(
            Cause::LowerDied {
                detail: "gone".into(),
            },
            t0,
        );
        let s = Summary::new(
            ExitCode::LowerFailed,
            &m,
            &r,
            Counts::default(),
            "mount",
            None,
        );
        assert_eq!(s.forced, Some(Forced::LowerDied));
        assert_eq!(s.lower_died.as_deref(), Some("gone"));
        assert!(matches!(s.cause, Some(Cause::Sigterm)), "the first trigger");
        assert_eq!(
            crate::drain::exit_code(&r.outcome(&m, false)),
            ExitCode::LowerFailed
        );
    }
}

//! The hand-off's summary ([`HandoffSummary`]): what drainfs knows when it is not in the data
//! path, and nothing more. It names the trigger and its time, how gcsfuse ended and who ended
//! it, whether gcsfuse's I/O counters stood still for the idle window before drainfs ended it
//! or the bound came first, and the time to exit. It has no counts, no open files and no
//! failed flushes, and its outcome is never `clean`: drainfs saw none of the requests, so it
//! verified nothing about them (the relay's summary does). Schema:
//! `docker/monitoring/handoff-summary.schema.json`.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::{LogEntry, Record, STOPPING, TERMINATION_LOG_CAP, write_outputs};
use crate::drain::{Cause, Machine};
use crate::handoff::{Ending, Stop};

/// What the hand-off's executor saw of gcsfuse, for its summary.
#[derive(Debug, Clone, Default)]
pub struct HandoffFacts {
    /// gcsfuse's pid, once started.
    pub gcsfuse_pid: Option<i32>,
    /// The idle window.
    pub idle_window: Duration,
    /// Why drainfs ended gcsfuse (`None`: it did not; gcsfuse ended by itself).
    pub stop: Option<Stop>,
    /// The signal drainfs ended gcsfuse with in the end (`SIGTERM`, or `SIGKILL` when it did
    /// not exit on SIGTERM in time, or at the bound).
    pub ended_by: Option<&'static str>,
    /// How long gcsfuse's counters had stood still when drainfs ended it, milliseconds.
    pub still_ms: Option<u64>,
    /// Milliseconds from the first trigger to the time gcsfuse was seen idle.
    pub idle_ms: Option<u64>,
    /// Milliseconds from the first trigger to the bound (when drainfs gives up waiting).
    pub bound_ms: Option<u64>,
    /// Reads of `/proc/PID/io` that failed.
    pub unreadable_samples: u64,
}

/// Milliseconds since the first trigger.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HandoffTimings {
    /// gcsfuse was seen idle (its counters had stood still for the idle window).
    pub idle_ms: Option<u64>,
    /// gcsfuse's process exited (was reaped).
    pub gcsfuse_exited_ms: Option<u64>,
    /// drainfs about to exit.
    pub exit_ms: Option<u64>,
}

/// The hand-off's shutdown summary (`data_path: "handoff"`).
#[derive(Debug, Clone, Serialize)]
pub struct HandoffSummary {
    /// drainfs's exit status: 0 when gcsfuse was idle and drainfs ended it (drainfs then ends
    /// by SIGTERM when `ends_by_signal` says so), 75 when drainfs had to end it while it was
    /// still doing I/O, gcsfuse's own status (or 128+N for signal N) when it ended by itself;
    /// 75 in a provisional summary.
    pub exit_code: i32,
    /// `idle`, `busy_at_bound`, `forced`, `gcsfuse_exited`, or [`STOPPING`] (provisional).
    /// Never `clean`: drainfs saw no request.
    pub outcome: &'static str,
    /// The process id of the drainfs that wrote it (several drop-ins of one pod share one
    /// termination log).
    pub pid: u32,
    /// Always `handoff`.
    pub data_path: &'static str,
    /// The first trigger (`null` when gcsfuse ended before any).
    pub cause: Option<Cause>,
    /// Wall-clock time of the first trigger (RFC 3339).
    pub trigger: Option<String>,
    /// gcsfuse's pid.
    pub gcsfuse_pid: Option<i32>,
    /// How gcsfuse's process ended (`exit 0`, `signal SIGKILL`).
    pub gcsfuse_exit: Option<String>,
    /// The signal drainfs ended gcsfuse with (`SIGTERM`, `SIGKILL`); `null` when gcsfuse ended
    /// by itself.
    pub ended_by: Option<&'static str>,
    /// Whether gcsfuse's I/O counters (`/proc/PID/io`) had stood still for the idle window when
    /// drainfs ended it; `null` when drainfs did not end it.
    pub idle: Option<bool>,
    /// How long they had stood still then, milliseconds.
    pub still_ms: Option<u64>,
    /// The idle window, milliseconds.
    pub idle_window_ms: u64,
    /// When drainfs gives up waiting for gcsfuse to be idle, milliseconds from the trigger.
    pub bound_ms: Option<u64>,
    /// The signal drainfs itself ends by after writing this (`SIGTERM` after a stop by
    /// SIGTERM with gcsfuse idle, gcsfuse's signal when it died of one).
    pub ends_by_signal: Option<&'static str>,
    /// Milliseconds since the first trigger.
    pub timings: HandoffTimings,
    /// Anything else worth knowing.
    pub notes: Vec<String>,
    /// [`super::SCHEMA_VERSION`]: the summaries' schema this one follows.
    pub schema_version: u32,
    /// The drainfs that wrote it ([`crate::VERSION`]: `0.1.0+COMMIT`).
    pub drainfs_version: &'static str,
}

impl HandoffSummary {
    /// The summary of a hand-off that ends as `ending` says, from what `machine` decided and
    /// `record` holds (its `handoff` facts, its timings and notes).
    pub fn new(ending: &Ending, machine: &Machine, record: &Record) -> HandoffSummary {
        let f = record.handoff.clone().unwrap_or_default();
        HandoffSummary {
            exit_code: ending.code,
            outcome: ending.outcome,
            pid: std::process::id(),
            data_path: "handoff",
            cause: machine.first_trigger().map(|(_, c)| c.clone()),
            trigger: record.timings.trigger.clone(),
            gcsfuse_pid: f.gcsfuse_pid,
            gcsfuse_exit: record.lower_exit.clone(),
            ended_by: f.ended_by,
            idle: f.stop.map(|s| s == Stop::Idle),
            still_ms: f.still_ms,
            idle_window_ms: f.idle_window.as_millis() as u64,
            bound_ms: f.bound_ms,
            ends_by_signal: ending.raise.map(|s| s.as_str()),
            timings: HandoffTimings {
                idle_ms: f.idle_ms,
                gcsfuse_exited_ms: record.timings.lower_exited_ms,
                exit_ms: record.timings.exit_ms,
            },
            notes: record.notes.clone(),
            schema_version: super::SCHEMA_VERSION,
            drainfs_version: crate::VERSION,
        }
    }

    /// A provisional summary, written to the termination log when the stop begins: exit
    /// code 75 and outcome [`STOPPING`] (a drainfs killed before its final summary confirmed
    /// nothing; the sidecar mounter's SIGKILL at 5 s would leave this one).
    pub fn provisional(machine: &Machine, record: &Record) -> HandoffSummary {
        let ending = Ending {
            outcome: STOPPING,
            code: crate::drain::ExitCode::Incomplete.code(),
            raise: None,
        };
        let mut s = HandoffSummary::new(&ending, machine, record);
        s.notes.push(
            "provisional: drainfs was still waiting for gcsfuse to be idle when it wrote this; if \
             it stayed, drainfs was killed before it finished (an upload may have been cut)"
                .to_string(),
        );
        s
    }

    /// Logs the summary (INFO for exit code 0, ERROR otherwise) and writes it to
    /// `summary_file` and `termination_log` when given; failures are logged.
    pub fn emit(&self, summary_file: Option<&Path>, termination_log: Option<&Path>) {
        let json = serde_json::to_string(self).unwrap_or_default();
        if self.exit_code == 0 {
            tracing::info!(summary = %json, exit_code = self.exit_code, outcome = self.outcome, "shutdown summary");
        } else {
            tracing::error!(summary = %json, exit_code = self.exit_code, outcome = self.outcome, "shutdown summary");
        }
        write_outputs(&json, &LogEntry::from(self), summary_file, termination_log);
    }
}

impl From<&HandoffSummary> for LogEntry {
    fn from(s: &HandoffSummary) -> LogEntry {
        let mut small = s.clone();
        let mut text = serde_json::to_string(&small).unwrap_or_default();
        while text.len() > TERMINATION_LOG_CAP && !small.notes.is_empty() {
            small.notes.pop();
            text = serde_json::to_string(&small).unwrap_or_default();
        }
        text.truncate(TERMINATION_LOG_CAP);
        LogEntry {
            text,
            pid: s.pid,
            exit_code: s.exit_code,
            stopping: s.outcome == STOPPING,
        }
    }
}

impl From<HandoffSummary> for LogEntry {
    fn from(s: HandoffSummary) -> LogEntry {
        LogEntry::from(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published schema (docker/monitoring/handoff-summary.schema.json) names every field
    /// the hand-off's summary has, requires each of them, and knows every timing.
    #[test]
    fn the_published_schema_matches_the_handoff_summary() {
        let schema: serde_json::Value = serde_json::from_str(include_str!(
            "../../docker/monitoring/handoff-summary.schema.json"
        ))
        .unwrap();
        let props = schema["properties"].as_object().unwrap();
        let required: Vec<&str> = schema["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let m = crate::drain::Machine::new(crate::drain::Config {
            grace_period: Duration::from_secs(5),
            grace_margin: Duration::from_millis(500),
            quiet_period: Duration::ZERO,
            native_sidecar: true,
        });
        let s = HandoffSummary::provisional(&m, &Record::default());
        let v = serde_json::to_value(&s).unwrap();
        let obj = v.as_object().unwrap();
        for k in obj.keys() {
            assert!(props.contains_key(k), "{k} is not in the schema");
            assert!(required.contains(&k.as_str()), "{k} is not required");
        }
        for k in &required {
            assert!(obj.contains_key(*k), "the schema requires {k}");
        }
        let known = props["timings"]["properties"].as_object().unwrap();
        for k in v["timings"].as_object().unwrap().keys() {
            assert!(known.contains_key(k), "timings.{k} is not in the schema");
        }
        let outcomes = props["outcome"]["enum"].as_array().unwrap();
        for o in [
            crate::handoff::outcome::IDLE,
            crate::handoff::outcome::BUSY_AT_BOUND,
            crate::handoff::outcome::FORCED,
            crate::handoff::outcome::GCSFUSE_EXITED,
            STOPPING,
        ] {
            assert!(outcomes.iter().any(|x| x == o), "outcome {o}");
        }
        assert_eq!(
            (s.exit_code, s.outcome, s.data_path),
            (75, STOPPING, "handoff")
        );
        assert_eq!(
            props["schema_version"]["const"],
            super::super::SCHEMA_VERSION
        );
        assert_eq!(
            (s.schema_version, s.drainfs_version),
            (super::super::SCHEMA_VERSION, crate::VERSION)
        );
    }

    /// A hand-off summary in the shared termination log follows the relay's rules: a clean
    /// (idle) one never hides another volume's busy one.
    #[test]
    fn handoff_summaries_share_the_termination_log() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("termination-log");
        let of = |pid: u32, code: i32, outcome: &'static str| {
            let mut s = HandoffSummary::provisional(
                &crate::drain::Machine::new(crate::drain::Config {
                    grace_period: Duration::from_secs(5),
                    grace_margin: Duration::from_millis(500),
                    quiet_period: Duration::ZERO,
                    native_sidecar: true,
                }),
                &Record::default(),
            );
            (s.pid, s.exit_code, s.outcome) = (pid, code, outcome);
            LogEntry::from(&s)
        };
        let read = || -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
        };
        super::super::write_log_entry(&p, &of(8, 75, STOPPING)).unwrap();
        super::super::write_log_entry(&p, &of(9, 75, "busy_at_bound")).unwrap();
        super::super::write_log_entry(&p, &of(8, 0, "idle")).unwrap();
        assert_eq!(
            (read()["pid"].clone(), read()["exit_code"].clone()),
            (9.into(), 75.into())
        );
    }
}

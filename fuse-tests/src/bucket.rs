//! Reading the `--events` log of the `bucketfs` test backend (`src/bin/bucketfs.rs`).
//!
//! `bucketfs` appends one JSON object per line, each with an `event` name and `t_ms`
//! (milliseconds since the UNIX epoch). Events and their extra fields:
//!
//! | `event`          | extra fields                      |
//! |------------------|-----------------------------------|
//! | `mounted`        |                                   |
//! | `upload_start`   | `key`                             |
//! | `upload_done`    | `key`, `size`                     |
//! | `upload_failed`  | `key`, `error`                    |
//! | `signal`         | `signal` (`SIGINT` or `SIGTERM`)  |
//! | `unmount_failed` | `error` (e.g. the mount is busy)  |
//! | `unmounted`      |                                   |
//! | `exit`           |                                   |
//!
//! Keys are bucket-relative paths with `/` separators.

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Deserialize;

/// One line of a `bucketfs` events log.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct BucketEvent {
    /// What happened: `mounted`, `upload_start`, `upload_done`, `upload_failed`, `signal`,
    /// `unmount_failed`, `unmounted` or `exit`.
    pub event: String,
    /// When, in milliseconds since the UNIX epoch.
    pub t_ms: u64,
    /// Object key (bucket-relative, `/`-separated) for upload events.
    #[serde(default)]
    pub key: Option<String>,
    /// Bytes published, for `upload_done`.
    #[serde(default)]
    pub size: Option<u64>,
    /// Signal name (`SIGINT`, `SIGTERM`), for `signal`.
    #[serde(default)]
    pub signal: Option<String>,
    /// Error text, for `upload_failed` and `unmount_failed`.
    #[serde(default)]
    pub error: Option<String>,
}

impl BucketEvent {
    /// Whether this is an `event` event about `key`.
    pub fn is(&self, event: &str, key: &str) -> bool {
        self.event == event && self.key.as_deref() == Some(key)
    }
}

/// Reads every complete line of the events log at `path`.
///
/// A missing file reads as no events. A last line without its newline (still being written)
/// is ignored.
///
/// # Panics
/// If the file cannot be read, or a complete line is not a valid event: both are bugs in the
/// test or in `bucketfs`.
pub fn read_events(path: impl AsRef<Path>) -> Vec<BucketEvent> {
    let path = path.as_ref();
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => panic!("cannot read bucketfs events {}: {e}", path.display()),
    };
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    complete
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| {
                panic!(
                    "bad bucketfs event line in {}: {line:?}: {e}",
                    path.display()
                )
            })
        })
        .collect()
}

/// Polls the events log at `path` until an event satisfies `pred` or `timeout` passes;
/// returns the first matching event.
pub fn wait_for_event(
    path: impl AsRef<Path>,
    timeout: Duration,
    mut pred: impl FnMut(&BucketEvent) -> bool,
) -> Option<BucketEvent> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(ev) = read_events(path.as_ref()).into_iter().find(|e| pred(e)) {
            return Some(ev);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_complete_lines_and_skips_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        std::fs::write(
            &path,
            concat!(
                "{\"event\":\"mounted\",\"t_ms\":1}\n",
                "{\"event\":\"upload_done\",\"key\":\"a/b.txt\",\"size\":3,\"t_ms\":2}\n",
                "{\"event\":\"signal\",\"signal\":\"SIGINT\",\"t_ms\":3}\n",
                "{\"event\":\"exi",
            ),
        )
        .unwrap();
        let events = read_events(&path);
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].event, "mounted");
        assert!(events[1].is("upload_done", "a/b.txt"));
        assert_eq!(events[1].size, Some(3));
        assert_eq!(events[2].signal.as_deref(), Some("SIGINT"));
        assert!(read_events(dir.path().join("missing")).is_empty());
    }
}

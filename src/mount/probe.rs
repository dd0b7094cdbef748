//! Calls that can block on a file system drainfs does not own (a FUSE mount whose daemon is
//! hung answers nothing, and its caller sleeps until it does), made on a helper thread with a
//! deadline, so that drainfs's own thread goes on without the answer ([`within`]).
//!
//! A helper whose call never returns stays behind. If the daemon never read the request, the
//! helper's sleep ends when drainfs exits (the kernel's wait for a request that no daemon has
//! taken is killable); if the daemon took it and hangs, the helper sleeps uninterruptibly
//! until that daemon answers or its connection ends, and drainfs's process cannot finish
//! exiting before then. So drainfs calls into such a mount only where it must know the answer
//! (is the mount at `--mountpoint` dead?), never on its stop path; docs/blocking-calls.md
//! lists every such call.

use std::path::Path;
use std::time::Duration;

/// How long a probe of a mount drainfs does not own may take.
pub const PROBE_LIMIT: Duration = Duration::from_secs(2);

/// Runs `f` on a helper thread and waits for its result at most `limit`: `None` when it did
/// not answer in time (the helper is left to finish on its own) or could not be started.
pub fn within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("probe".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .ok()?;
    rx.recv_timeout(limit).ok()
}

/// How a (FUSE) mount answered a `statfs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// It answered (with anything but ENOTCONN/ECONNABORTED).
    Alive,
    /// Its daemon is gone: ENOTCONN or ECONNABORTED.
    Dead,
    /// No answer within the deadline: its daemon is alive and does not answer.
    Silent,
}

/// `statfs(path)` within `limit` (see [`super::is_dead`]).
pub fn statfs_within(path: &Path, limit: Duration) -> Answer {
    let p = path.to_path_buf();
    match within(limit, move || super::is_dead(&p)) {
        Some(true) => Answer::Dead,
        Some(false) => Answer::Alive,
        None => Answer::Silent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_that_does_not_return_in_time_is_none() {
        assert_eq!(within(Duration::from_secs(5), || 7), Some(7));
        let t0 = std::time::Instant::now();
        let r = within(Duration::from_millis(50), || {
            std::thread::sleep(Duration::from_secs(2));
            1
        });
        assert_eq!(r, None);
        assert!(t0.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_local_directory_is_alive() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(statfs_within(d.path(), PROBE_LIMIT), Answer::Alive);
    }
}

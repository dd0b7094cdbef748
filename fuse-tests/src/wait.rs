//! Waits on state, for the mount tests: every wait polls a condition with a deadline, and
//! reads the state drainfs reports (a ready file, a summary file, `/status` from its admin
//! server) rather than its log wording.
//!
//! The admin server is asked over HTTP/1.0 from the test process itself, without forking: a
//! fork+exec anywhere in a test process gives the child a copy of every open fd, and each of
//! those closes is a FLUSH (see [`crate::stack::serial`]).

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// Polls `f` every 10 ms until it returns true or `timeout` passes; returns the last result.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    wait_for(timeout, || f().then_some(())).is_some()
}

/// Polls `f` every 10 ms until it returns `Some` or `timeout` passes; returns that value, or
/// `None` after the deadline.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits up to `timeout` for `path` to exist (a ready file, an exit file, a mount's file).
pub fn wait_path(path: &Path, timeout: Duration) -> bool {
    wait_until(timeout, || path.exists())
}

/// Reads `path` as one JSON document (a summary file).
///
/// # Errors
/// A message naming the file, when it cannot be read or is not JSON.
pub fn read_json(path: &Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not JSON ({e}): {text}", path.display()))
}

/// The summary file drainfs wrote at `path`.
///
/// # Panics
/// When it is missing or not JSON.
pub fn summary_at(path: &Path) -> serde_json::Value {
    read_json(path).unwrap_or_else(|e| panic!("summary file: {e}"))
}

/// Whether the summary's list `field` (`open_paths`, `failed_flushes`...) names `path`.
pub fn summary_names(summary: &serde_json::Value, field: &str, path: &str) -> bool {
    summary[field]
        .as_array()
        .is_some_and(|a| a.iter().any(|p| p == path))
}

/// `GET path` from `addr` (`IP:PORT`) over HTTP/1.0, in this process (no fork): the status
/// code and the body. HTTP/1.0 makes the server answer without chunked encoding and end the
/// connection after the answer.
///
/// # Errors
/// A message when connecting, sending or reading fails or takes longer than `timeout`.
pub fn http_get_from(addr: &str, path: &str, timeout: Duration) -> Result<(u16, String), String> {
    let sock: std::net::SocketAddr = addr
        .parse()
        .map_err(|e| format!("bad address {addr:?}: {e}"))?;
    let mut conn = std::net::TcpStream::connect_timeout(&sock, timeout)
        .map_err(|e| format!("connect to {addr}: {e}"))?;
    conn.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    conn.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")
        .map_err(|e| format!("GET {path}: {e}"))?;
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw)
        .map_err(|e| format!("GET {path}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("GET {path}: no HTTP header in {text:.200}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("GET {path}: bad status line in {head:.200}"))?;
    Ok((code, body.to_string()))
}

/// drainfs's `/status` document from its admin server at `addr` (`IP:PORT`); `None` while
/// nothing answers there with 200 and JSON (5 s per try).
pub fn status_from(addr: &str) -> Option<serde_json::Value> {
    let (code, body) = http_get_from(addr, "/status", Duration::from_secs(5)).ok()?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

/// Polls `/status` at `addr` until `pred` holds for it or `timeout` passes; returns the
/// document that satisfied it.
pub fn wait_status(
    addr: &str,
    timeout: Duration,
    mut pred: impl FnMut(&serde_json::Value) -> bool,
) -> Option<serde_json::Value> {
    wait_for(timeout, || status_from(addr).filter(|v| pred(v)))
}

/// Finds the first value under key `key` anywhere in `v` (depth first).
pub fn find_key<'a>(v: &'a serde_json::Value, key: &str) -> Option<&'a serde_json::Value> {
    match v {
        serde_json::Value::Object(map) => map
            .get(key)
            .or_else(|| map.values().find_map(|x| find_key(x, key))),
        serde_json::Value::Array(a) => a.iter().find_map(|x| find_key(x, key)),
        _ => None,
    }
}

/// The file that hands out the suite's ports ([`free_port`], and `free_port()` in
/// `scripts/lowers.py`, which follows the same protocol).
pub const PORTS_FILE: &str = "/tmp/drainfs-test-ports";
/// The suite's ports: 20000-29999, below the kernel's ephemeral range (32768-60999 by
/// default), so that no `connect` anywhere on the machine takes one as its local port.
pub const PORTS: std::ops::Range<u32> = 20_000..30_000;

/// A TCP port on 127.0.0.1 for a server a test starts (`--admin-addr`, fake-gcs-server):
/// the next port of [`PORTS`] after the last one handed out (a counter in [`PORTS_FILE`],
/// under `flock`, shared by every test process and `scripts/lowers.py`) that binds now. A port
/// is handed out again only after the other 9,999 were, so two tests never race for one.
///
/// # Panics
/// When the counter file cannot be used, or no port of the range binds.
pub fn free_port() -> u16 {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .open(PORTS_FILE)
        .unwrap_or_else(|e| panic!("{PORTS_FILE}: {e}"));
    let mut f = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .unwrap_or_else(|(_, e)| panic!("flock {PORTS_FILE}: {e}"));
    let mut text = String::new();
    let _ = f.read_to_string(&mut text);
    let mut next: u32 = text.trim().parse().unwrap_or(0);
    let len = PORTS.end - PORTS.start;
    for _ in 0..len {
        let port = u16::try_from(PORTS.start + next % len).expect("port");
        next = (next + 1) % len;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            use std::io::Seek;
            f.set_len(0).expect("truncate the ports file");
            f.rewind().expect("rewind the ports file");
            f.write_all(next.to_string().as_bytes())
                .expect("write the ports file");
            return port;
        }
    }
    panic!("no port of {PORTS:?} binds on 127.0.0.1")
}

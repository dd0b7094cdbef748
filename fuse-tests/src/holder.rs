//! A file held open for writing by another process ([`Holder`]: python3, which never forks),
//! and a fake-gcs-server stopped for a while ([`Stopped`]). Files that must stay open across a
//! stop are held by a separate process: any fork+exec in the test process would close a copy
//! of the fd, and each close is a FLUSH, which makes gcsfuse finalize the object.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::lowers::{Object, Server, object_of};

/// The fake-gcs-server's PID, from `lowers.py`'s state file.
pub fn server_pid(server: &Server) -> i32 {
    let text = std::fs::read_to_string(server.workdir().join("lowers-state.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["servers"][server.kind.name()]["pid"].as_i64().unwrap() as i32
}

/// Sends SIGCONT to a SIGSTOPped server when dropped, so a failing test does not leave it
/// stopped (its work directory's cleanup would wait on it).
pub struct Stopped(i32);

impl Stopped {
    pub fn stop(server: &Server) -> Stopped {
        let pid = server_pid(server);
        kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.0), Signal::SIGCONT);
    }
}

/// The Python side of [`Holder`]: one file, commands on stdin, one reply line each
/// (`ok SIZE SHA256` of everything written so far, or `err ERRNO`). It never forks.
const HOLDER: &str = r#"
import os, sys, hashlib, errno
path = sys.argv[1]
h = hashlib.sha256(); size = 0; fd = None
def pattern(n, seed):
    x = seed | 1; out = bytearray(); m = (1 << 64) - 1
    while len(out) < n:
        x ^= (x << 13) & m; x ^= x >> 7; x ^= (x << 17) & m
        out += x.to_bytes(8, "little")
    return bytes(out[:n])
def reply(s):
    sys.stdout.write(s + "\n"); sys.stdout.flush()
for line in sys.stdin:
    cmd = line.split()
    try:
        if cmd[0] == "open":
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        elif cmd[0] == "write":
            n, seed = int(cmd[1]), int(cmd[2]); b = pattern(n, seed); v = memoryview(b)
            while len(v):
                k = os.write(fd, v[:1 << 20]); v = v[k:]
            h.update(b); size += n
        elif cmd[0] == "fsync":
            os.fsync(fd)
        elif cmd[0] == "close":
            f, fd = fd, None; os.close(f)
        reply(f"ok {size} {h.hexdigest()}")
    except OSError as e:
        reply("err " + errno.errorcode.get(e.errno, str(e.errno)))
"#;

/// A file open for writing in another process (python3, which never forks), driven line by
/// line. Dropping it SIGKILLs that process.
pub struct Holder {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// What was written so far, as the object it should become.
    pub written: Object,
}

impl Holder {
    /// Opens (creates, truncates) `path` in a new holder process.
    pub fn open(path: &Path) -> Holder {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(HOLDER)
            .arg(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut h = Holder {
            child,
            stdin,
            stdout,
            written: object_of(b""),
        };
        h.cmd("open").expect("open in the holder");
        h
    }

    /// Sends one command without waiting for its reply.
    pub fn send(&mut self, c: &str) {
        writeln!(self.stdin, "{c}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// The reply to the last command sent: Ok, or the errno name.
    pub fn reply(&mut self) -> Result<(), String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let parts: Vec<&str> = line.split_whitespace().collect();
        match parts.as_slice() {
            ["ok", size, sha] => {
                self.written = Object {
                    size: size.parse().unwrap(),
                    sha256: sha.to_string(),
                };
                Ok(())
            }
            ["err", e] => Err(e.to_string()),
            _ => panic!("holder said {line:?}"),
        }
    }

    /// Runs one command: `write N SEED`, `fsync`, `close`.
    pub fn cmd(&mut self, c: &str) -> Result<(), String> {
        self.send(c);
        self.reply()
    }

    /// The reply to the last command, or `None` if none came within `timeout`.
    pub fn reply_within(&mut self, timeout: Duration) -> Option<Result<(), String>> {
        let fd = std::os::fd::AsFd::as_fd(self.stdout.get_ref());
        if self.stdout.buffer().is_empty() {
            let mut fds = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
            let ms = u16::try_from(timeout.as_millis()).unwrap_or(u16::MAX);
            if nix::poll::poll(&mut fds, ms).unwrap_or(0) == 0 {
                return None;
            }
        }
        Some(self.reply())
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

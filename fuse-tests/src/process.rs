//! A process a mount test runs (drainfs, or a daemon: gcsfuse, fake-gcs-server, bucketfs,
//! `fake-node-driver`, the sidecar mounter) and what the tests read about processes from
//! `/proc`.
//!
//! [`Proc`] is the one process type of the harness: it collects the process's stderr (and,
//! with [`Proc::spawn_piped`], its stdout, keeping its stdin open), stops it by an escalation
//! ladder of signals ([`Proc::stop`]), and on drop kills and reaps it by PID if it still runs,
//! also when the test panicked. Every [`Proc`] is recorded in its test's bound
//! ([`crate::bound`]): a test that outlives it has its processes killed and its mounts
//! aborted. The free functions find children and read `/proc/PID/*`.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::wait::{wait_for, wait_until};

/// Lines a reader thread collected (stdout or stderr of a [`Proc`]).
pub type Lines = Arc<Mutex<Vec<String>>>;

/// Spawns a thread that appends every line of `r` to `sink`, echoing each to the test's stderr
/// after `echo` (the test's output then shows what the process said); it ends at `r`'s end of
/// file.
pub fn collect(r: impl Read + Send + 'static, sink: Lines, echo: &'static str) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            eprintln!("    {echo} {line}");
            sink.lock().unwrap().push(line);
        }
    })
}

/// How long the first read of a process's output after its exit ([`Proc::stderr_lines`] and
/// the other accessors) waits for its reader threads to reach end of file: the lines it wrote
/// before its exit are then all collected. A descendant still holding the pipe keeps it open;
/// the wait ends then anyway.
const READERS_AFTER_EXIT: Duration = Duration::from_secs(2);

/// A running process whose stderr is collected; killed (SIGKILL) and reaped on drop if it
/// still runs.
pub struct Proc {
    /// The child.
    pub child: Child,
    /// Its stderr lines so far ([`Proc::stderr_lines`]).
    stderr: Lines,
    /// Its stdout lines so far ([`Proc::spawn_piped`] only; empty otherwise).
    stdout: Lines,
    /// Its stdin, kept open ([`Proc::spawn_piped`] only): closing it is an end-of-input signal
    /// to processes that watch it.
    stdin: Option<ChildStdin>,
    /// The threads collecting stdout and stderr ([`collect`]).
    readers: Vec<JoinHandle<()>>,
    /// Whether the output was read to its end (or `READERS_AFTER_EXIT` passed) after the exit.
    settled: AtomicBool,
    exited: Option<ExitStatus>,
    /// Its record in the test's bound ([`crate::bound`]), dropped after the process is reaped.
    _bound: crate::bound::Record,
}

impl Proc {
    /// Spawns `cmd` with stderr captured (and echoed to the test's stderr after `|`); stdin
    /// and stdout are left as `cmd` has them.
    ///
    /// # Panics
    /// If the program cannot be started.
    pub fn spawn(mut cmd: Command) -> Proc {
        cmd.stderr(Stdio::piped());
        crate::bound::own_args(cmd.get_args());
        let mut child = cmd.spawn().expect("spawn");
        let stderr = Lines::default();
        let reader = collect(child.stderr.take().expect("piped"), stderr.clone(), "|");
        Proc {
            _bound: crate::bound::process(child.id() as i32, stderr.clone()),
            child,
            stderr,
            stdout: Lines::default(),
            stdin: None,
            readers: vec![reader],
            settled: AtomicBool::new(false),
            exited: None,
        }
    }

    /// Spawns `cmd` with stdin a pipe kept open, and stdout and stderr captured (stdout echoed
    /// after `label`, stderr after `|`).
    ///
    /// # Panics
    /// If the program cannot be started.
    pub fn spawn_piped(mut cmd: Command, label: &'static str) -> Proc {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        crate::bound::own_args(cmd.get_args());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
        let (stdout, stderr) = (Lines::default(), Lines::default());
        let readers = vec![
            collect(child.stdout.take().expect("piped"), stdout.clone(), label),
            collect(child.stderr.take().expect("piped"), stderr.clone(), "|"),
        ];
        Proc {
            _bound: crate::bound::process(child.id() as i32, stderr.clone()),
            stdin: child.stdin.take(),
            child,
            stderr,
            stdout,
            readers,
            settled: AtomicBool::new(false),
            exited: None,
        }
    }

    /// PID.
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a signal.
    pub fn signal(&self, sig: Signal) {
        send(self.pid(), sig);
    }

    /// Whether the process has exited (it is reaped then).
    pub fn exited(&mut self) -> bool {
        self.wait_timeout(Duration::ZERO).is_some()
    }

    /// Waits up to `timeout` for the exit status (polling every 5 ms).
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if let Some(s) = self.exited {
            return Some(s);
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.exited = Some(s);
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The exit status, waiting up to `timeout`.
    ///
    /// # Panics
    /// On timeout, naming `what` and showing the process's stderr.
    pub fn wait_exit(&mut self, timeout: Duration, what: &str) -> ExitStatus {
        self.wait_timeout(timeout).unwrap_or_else(|| {
            panic!(
                "{what} did not exit within {timeout:?}:\n{}",
                self.stderr_text()
            )
        })
    }

    /// Polls `cond` every 10 ms until it holds or the process exits, for up to `timeout`;
    /// returns whether `cond` holds at the end (a process that exited early fails the wait at
    /// once instead of after the whole timeout).
    pub fn wait_while_running(
        &mut self,
        timeout: Duration,
        mut cond: impl FnMut() -> bool,
    ) -> bool {
        wait_until(timeout, || cond() || self.exited());
        cond()
    }

    /// Stops the process by a ladder of `(signal, wait)` steps: each step sends its signal
    /// to `target` (the process itself, or e.g. a container's PID 1 whose exit ends this
    /// process) and waits up to its time. Returns the exit status, `None` if it outlived the
    /// whole ladder. A process that already exited gets no signal.
    pub fn stop_via(&mut self, target: i32, ladder: &[(Signal, Duration)]) -> Option<ExitStatus> {
        for &(sig, wait) in ladder {
            if let Some(st) = self.wait_timeout(Duration::ZERO) {
                return Some(st);
            }
            send(target, sig);
            if let Some(st) = self.wait_timeout(wait) {
                return Some(st);
            }
        }
        self.wait_timeout(Duration::ZERO)
    }

    /// [`Proc::stop_via`] with the process itself as the target.
    pub fn stop(&mut self, ladder: &[(Signal, Duration)]) -> Option<ExitStatus> {
        self.stop_via(self.pid(), ladder)
    }

    /// Closes the process's stdin ([`Proc::spawn_piped`]); a no-op when already closed.
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// PID of this process's first child (drainfs's lower), waiting up to 5 s for it.
    ///
    /// # Panics
    /// If it has none by then.
    pub fn child_pid(&self) -> i32 {
        wait_for(Duration::from_secs(5), || first_child(self.pid())).expect("a child process")
    }

    /// Once the process was seen to exit ([`Proc::wait_timeout`]), waits the first time (up to
    /// `READERS_AFTER_EXIT`, 2 s, while a descendant holds a pipe) for its output to be read to
    /// its end, so that what it wrote before its exit is all there.
    fn settle(&self) {
        if self.exited.is_some() && !self.settled.swap(true, Ordering::SeqCst) {
            wait_until(READERS_AFTER_EXIT, || {
                self.readers.iter().all(JoinHandle::is_finished)
            });
        }
    }

    /// Whether stdout ([`Proc::spawn_piped`]) has a line equal to `line`.
    pub fn stdout_has(&self, line: &str) -> bool {
        self.settle();
        self.stdout.lock().unwrap().iter().any(|l| l == line)
    }

    /// Waits up to `timeout` for a stdout line equal to `line` ([`Proc::spawn_piped`]); a
    /// process that exits first fails the wait at once.
    pub fn wait_stdout_line(&mut self, line: &str, timeout: Duration) -> bool {
        let out = self.stdout.clone();
        self.wait_while_running(timeout, || out.lock().unwrap().iter().any(|l| l == line))
    }

    /// Stdout's lines so far ([`Proc::spawn_piped`]).
    pub fn stdout_lines(&self) -> Vec<String> {
        self.settle();
        self.stdout.lock().unwrap().clone()
    }

    /// Whether stderr has a line containing `needle`.
    pub fn stderr_contains(&self, needle: &str) -> bool {
        self.settle();
        self.stderr
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains(needle))
    }

    /// All stderr so far.
    pub fn stderr_text(&self) -> String {
        self.stderr_lines().join("\n")
    }

    /// Stderr's lines so far; after the exit, all of them (see `settle`).
    pub fn stderr_lines(&self) -> Vec<String> {
        self.settle();
        self.stderr.lock().unwrap().clone()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.close_stdin();
        if !self.exited() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sends `sig` to `pid` (errors, e.g. a process already gone, are ignored). A PID that is not
/// positive (one never seen) gets nothing: kill(2) would read it as a process group, or as
/// every process.
pub fn send(pid: i32, sig: Signal) {
    if pid > 0 {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
    }
}

/// SIGKILLs every PID in `pids` that still exists (processes a harness saw under the one it
/// started, left over when that one could not stop them).
pub fn kill_leftovers(pids: &[i32]) {
    for &pid in pids {
        if pid > 0 && pid_exists(pid) {
            send(pid, Signal::SIGKILL);
        }
    }
}

/// The PIDs of `pid`'s children (from `/proc/PID/task/*/children`).
pub fn child_pids(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let text = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            text.split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok()),
        );
    }
    out
}

/// The first child PID of `pid` (any thread), if it has one.
pub fn first_child(pid: i32) -> Option<i32> {
    child_pids(pid).first().copied()
}

/// The chain below `pid`: its first child, that child's first child, and so on, up to
/// `depth` processes, waiting up to 5 s for each; shorter when one has no child by then.
pub fn child_chain(pid: i32, depth: usize) -> Vec<i32> {
    let mut chain = Vec::new();
    let mut parent = pid;
    while chain.len() < depth {
        let Some(next) = wait_for(Duration::from_secs(5), || first_child(parent)) else {
            break;
        };
        chain.push(next);
        parent = next;
    }
    chain
}

/// Whether a process `pid` exists (running or zombie).
pub fn pid_exists(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Whether `pid` exists and is not a zombie.
pub fn pid_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(st) => st
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// A field of `/proc/PID/status` (e.g. `Uid`, `CapEff`), trimmed.
pub fn proc_status_field(pid: i32, field: &str) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix(&format!("{field}:"))
            .map(|v| v.trim().to_string())
    })
}

/// The arguments of process `pid` (`/proc/PID/cmdline`); empty when it is gone.
pub fn cmdline(pid: i32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process that writes its last line and exits at once: once `wait_timeout` has its
    /// status, `stderr_lines` has that line (the reader thread, which echoes each of 20,000 lines
    /// first, lags behind the exit; the suite read the lines too early under load once).
    #[test]
    fn the_lines_written_before_the_exit_are_all_collected_at_the_exit() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "seq 1 20000 >&2; echo last >&2; exit 3"]);
        let mut p = Proc::spawn(cmd);
        let st = p.wait_timeout(Duration::from_secs(30)).expect("exits");
        assert_eq!(st.code(), Some(3));
        let lines = p.stderr_lines();
        assert_eq!(lines.len(), 20_001);
        assert_eq!(lines.last().map(String::as_str), Some("last"));
    }
}

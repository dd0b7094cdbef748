//! Shutdown triggers other than signals: exit files and the watched workload process.
//! They only send [`Event`]s; the lifecycle decides.
//! [`Event`] is defined here, below the lifecycle: every trigger (these, the signal thread, the
//! admin server and control socket) sends it.
//!
//! Exit files are watched with inotify on their parent directories **plus an initial scan**,
//! so a file created before drainfs started still counts (the GKE layout
//! `/gcsfuse-tmp/.volumes/exit` is written by the node driver, possibly early). A parent that
//! does not exist yet is re-checked every 500 ms until it does; so is one that is deleted or
//! moved away while watched (its watch ends; the directory re-created at its path is watched
//! and scanned again). The watcher runs on a thread
//! of its own, off the lifecycle's runtime (its path lookups could wait on a mount that does
//! not answer; see docs/blocking-calls.md).
//! The watched process is followed through a pidfd (`pidfd_open(2)`), which becomes readable
//! when the process exits, without polling and without being its parent.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

use inotify::{EventMask, Inotify, WatchMask};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc::UnboundedSender;

use crate::config::LifecycleConfig;
use crate::drain::Cause;

/// Something that happened, sent to the lifecycle by a trigger or a watcher.
#[derive(Debug)]
pub enum Event {
    /// A signal.
    Signal(Signal),
    /// A shutdown cause (exit file, watched pid, quit, drain).
    Trigger(Cause),
}

/// Starts the exit-file and watched-pid tasks on the current tokio runtime.
pub fn start(cfg: &LifecycleConfig, tx: UnboundedSender<Event>) {
    if !cfg.exit_files.is_empty() {
        let files = cfg.exit_files.clone();
        let tx = tx.clone();
        let spawned = std::thread::Builder::new()
            .name("exit-files".into())
            .spawn(move || {
                if let Err(e) = watch_exit_files(files, tx) {
                    tracing::error!(error = %e, "exit-file watcher failed");
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the exit-file watcher");
        }
    }
    if let Some(pid) = cfg.watch_pid {
        tokio::spawn(async move {
            wait_pid_exit(pid).await;
            tracing::info!(pid, "the watched process exited");
            let _ = tx.send(Event::Trigger(Cause::WatchedPidExited { pid }));
        });
    }
}

fn absolute(p: &PathBuf) -> PathBuf {
    if p.is_absolute() {
        p.clone()
    } else {
        std::env::current_dir().unwrap_or_default().join(p)
    }
}

/// Watches the exit files (see the module's doc) on the calling thread, blocking, until one
/// appears. Runs on a thread of its own: its path lookups and `stat`s of the exit files'
/// directories would otherwise hold the lifecycle's runtime if those directories were on a
/// mount that does not answer.
fn watch_exit_files(files: Vec<PathBuf>, tx: UnboundedSender<Event>) -> std::io::Result<()> {
    let files: Vec<PathBuf> = files.iter().map(absolute).collect();
    let mut inotify = Inotify::init()?;
    // parent dir -> names watched in it
    let mut wanted: HashMap<PathBuf, Vec<(OsString, PathBuf)>> = HashMap::new();
    for f in &files {
        let (Some(dir), Some(name)) = (f.parent(), f.file_name()) else {
            continue;
        };
        wanted
            .entry(dir.to_path_buf())
            .or_default()
            .push((name.to_os_string(), f.clone()));
    }
    let mut by_wd = HashMap::new();
    let mut pending = add_watches(&mut inotify, wanted.keys().cloned().collect(), &mut by_wd);
    // Initial scan, after the watches exist, so nothing created in between is missed.
    if let Some(f) = files.iter().find(|f| f.exists()) {
        tracing::info!(path = %f.display(), "exit file already present");
        let _ = tx.send(Event::Trigger(Cause::ExitFile { path: f.clone() }));
        return Ok(());
    }
    let mut buf = [0u8; 4096];
    loop {
        let timeout = if pending.is_empty() {
            PollTimeout::NONE
        } else {
            PollTimeout::from(500u16)
        };
        let mut fds = [PollFd::new(inotify.as_fd(), PollFlags::POLLIN)];
        let ready = match poll(&mut fds, timeout) {
            Ok(n) => n > 0,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if ready {
            match inotify.read_events(&mut buf) {
                Ok(events) => {
                    let mut gone = Vec::new();
                    for ev in events {
                        let Some(dir) = by_wd.get(&ev.wd) else {
                            continue;
                        };
                        if ev.mask.intersects(
                            EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF,
                        ) {
                            // The directory went (or moved): watch its path again once it exists.
                            gone.push(ev.wd.clone());
                            continue;
                        }
                        let Some(name) = ev.name else { continue };
                        if let Some((_, full)) = wanted
                            .get(dir)
                            .and_then(|v| v.iter().find(|(n, _)| n == name))
                        {
                            tracing::info!(path = %full.display(), "exit file appeared");
                            let _ = tx.send(Event::Trigger(Cause::ExitFile { path: full.clone() }));
                            return Ok(());
                        }
                    }
                    for wd in gone {
                        if let Some(dir) = by_wd.remove(&wd) {
                            tracing::info!(dir = %dir.display(), "an exit file's directory went away; watching for it again");
                            let _ = inotify.watches().remove(wd);
                            pending.push(dir);
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            continue;
        }
        pending = add_watches(&mut inotify, pending, &mut by_wd);
        if let Some(f) = files.iter().find(|f| f.exists()) {
            let _ = tx.send(Event::Trigger(Cause::ExitFile { path: f.clone() }));
            return Ok(());
        }
    }
}

/// Watches each of `dirs` (recording it in `by_wd`); returns those that cannot be watched yet
/// (missing).
fn add_watches(
    inotify: &mut Inotify,
    dirs: Vec<PathBuf>,
    by_wd: &mut HashMap<inotify::WatchDescriptor, PathBuf>,
) -> Vec<PathBuf> {
    let mut still = Vec::new();
    for dir in dirs {
        match inotify.watches().add(
            &dir,
            WatchMask::CREATE
                | WatchMask::MOVED_TO
                | WatchMask::CLOSE_WRITE
                | WatchMask::DELETE_SELF
                | WatchMask::MOVE_SELF,
        ) {
            Ok(wd) => {
                by_wd.insert(wd, dir);
            }
            Err(_) => still.push(dir),
        }
    }
    still
}

/// Resolves when process `pid` has exited (immediately if it does not exist). Uses a pidfd;
/// falls back to polling `kill(pid, 0)` every 100 ms where pidfds are unavailable.
pub async fn wait_pid_exit(pid: i32) {
    // SAFETY: pidfd_open has no memory arguments.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd >= 0 {
        // SAFETY: a fresh fd owned by us.
        let owned = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // SAFETY: `owned` is moved into the AsyncFd and stays open for its whole life.
        if let Ok(afd) = unsafe { AsyncFd::register_with_interest(owned, Interest::READABLE) } {
            let _ = afd.readable().await;
            return;
        }
    } else if std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return;
    }
    while nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Runs the watcher on `file` on a thread; returns the receiver of its event.
    fn watch(file: PathBuf) -> tokio::sync::mpsc::UnboundedReceiver<Event> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || watch_exit_files(vec![file], tx));
        rx
    }

    /// Waits up to 10 s for the watcher's event; the exit file's path, or `None`.
    fn fired(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Event>) -> Option<PathBuf> {
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            match rx.try_recv() {
                Ok(Event::Trigger(Cause::ExitFile { path })) => return Some(path),
                Ok(other) => panic!("unexpected {other:?}"),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        None
    }

    /// Watches `sig/exit`, lets `take_away` remove the directory `sig` (given it and its
    /// parent), makes `sig` again and the exit file in it: the watcher must fire.
    fn fires_after_the_directory_went(take_away: impl FnOnce(&Path, &Path)) {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("sig");
        std::fs::create_dir(&dir).unwrap();
        let file = dir.join("exit");
        let mut rx = watch(file.clone());
        std::thread::sleep(Duration::from_millis(300));
        take_away(&dir, root.path());
        std::thread::sleep(Duration::from_millis(300));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(&file, b"").unwrap();
        assert_eq!(fired(&mut rx), Some(file));
    }

    /// The exit file's directory deleted while watched, then made again: the file created in
    /// the new directory fires (it did not: the watch died with the first directory).
    #[test]
    fn an_exit_file_in_a_directory_deleted_and_made_again_fires() {
        fires_after_the_directory_went(|dir, _| std::fs::remove_dir(dir).unwrap());
    }

    /// The same with the directory moved away (its watch would follow it).
    #[test]
    fn an_exit_file_in_a_directory_moved_away_and_replaced_fires() {
        fires_after_the_directory_went(|dir, root| std::fs::rename(dir, root.join("old")).unwrap());
    }
}

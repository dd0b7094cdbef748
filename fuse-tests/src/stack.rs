//! drainfs over a real lower, for the `real_lowers` and `real_gcsfuse` tests: a loopback server
//! ([`Server`]), and `drainfs run ... -- <its FUSE client>` mounted over that client
//! ([`Stack`]), with the paths and views of state the tests key on (exit code, summary file,
//! `/status` from the admin server, objects read back from the server).
//!
//! RAII: dropping a [`Stack`] stops drainfs (SIGTERM, a second SIGTERM, then SIGKILL), then the
//! FUSE client if drainfs could not, then detaches anything left mounted ([`Mounted`]'s drop),
//! then stops the server ([`Server`]'s drop, which first continues a stopped server).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::{MountOpts, Mounted, make_dirs};
use crate::lowers::{Kind, Object, Server};
use crate::mounts::{fstype_at, is_mounted};
use crate::process::{child_pids, cmdline, pid_alive, send};
use crate::wait::{free_port, read_json, status_from, wait_for, wait_until};

/// One test at a time in a test process that writes through a real lower: a fork+exec
/// anywhere in the process (starting a server, `sha256sum`, `lowers.py objects`) gives the
/// child a copy of every open fd, which exec closes, and each of those closes is a FLUSH. On
/// rclone a FLUSH finalizes the upload and closes its handle (the file's next write() fails
/// with EBADF); on gcsfuse it finalizes the object early. Take it before anything forks.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// What [`Stack::start_with`] passes to drainfs and the client.
#[derive(Debug, Clone, Default)]
pub struct StackOpts {
    /// `Some(mode)` passes `--passthrough mode`; `None` leaves drainfs's default (`auto`).
    pub passthrough: Option<String>,
    /// More `drainfs run` arguments (`--grace-period 8s`, `--native-sidecar`...).
    pub args: Vec<String>,
    /// More FUSE client flags, before its positional arguments.
    pub client_flags: Vec<String>,
}

/// `drainfs run`'s arguments for a [`Stack`]: `opts.passthrough`, the exit and summary files,
/// the admin server on `127.0.0.1:admin_port`, 30 s for the lower to be ready, then
/// `opts.args`.
fn drainfs_args(
    opts: &StackOpts,
    exit_file: &Path,
    summary: &Path,
    admin_port: u16,
) -> Vec<String> {
    let mut args: Vec<String> = opts
        .passthrough
        .clone()
        .map(|p| vec!["--passthrough".to_string(), p])
        .unwrap_or_default();
    args.extend([
        "--exit-file".into(),
        exit_file.display().to_string(),
        "--summary-file".into(),
        summary.display().to_string(),
        "--admin-addr".into(),
        format!("127.0.0.1:{admin_port}"),
        "--lower-ready-timeout".into(),
        "30s".into(),
    ]);
    args.extend(opts.args.iter().cloned());
    args
}

/// A server, and `drainfs run` mounted over that server's FUSE client. Fields drop in order:
/// drainfs (and the client) first, then the server.
pub struct Stack {
    /// The mounted drainfs.
    pub m: Mounted,
    /// The server.
    pub server: Server,
    /// Which pair.
    pub kind: Kind,
    /// drainfs's `--exit-file` (`volumes/exit`, parent not created).
    pub exit_file: PathBuf,
    /// drainfs's `--summary-file`.
    pub summary: PathBuf,
    /// drainfs's `--admin-addr` port on 127.0.0.1 (for `/status`).
    pub admin_port: u16,
    /// The FUSE client's PID (drainfs's child).
    pub lower_pid: i32,
}

impl Stack {
    /// [`Stack::start_with`] with drainfs's default flags.
    pub fn start(kind: Kind) -> Stack {
        Self::start_with(kind, StackOpts::default())
    }

    /// Starts a server of `kind` and `drainfs run --exit-file .. --summary-file ..
    /// --admin-addr 127.0.0.1:PORT --lower-ready-timeout 30s <opts> -- <client>`; returns once drainfs
    /// serves, with the client's PID found and its mount checked to be the real client's
    /// (panics otherwise).
    pub fn start_with(kind: Kind, opts: StackOpts) -> Stack {
        let server = Server::start(kind);
        let dir = tempfile::Builder::new()
            .prefix(&format!("drainfs-real-{}-", kind.name()))
            .tempdir_in("/tmp")
            .unwrap();
        let [lower, mnt] = make_dirs(dir.path(), ["lower", "mnt"]);
        let exit_file = dir.path().join("volumes").join("exit");
        let summary = dir.path().join("summary.json");
        let admin_port = free_port();
        let args = drainfs_args(&opts, &exit_file, &summary, admin_port);
        let flags: Vec<&str> = opts.client_flags.iter().map(String::as_str).collect();
        let lower_cmd = server.mount_cmd_with(&lower, &flags);
        let client = lower_cmd[0].clone();
        let m = Mounted::start_in(
            dir,
            lower.clone(),
            mnt,
            MountOpts {
                args,
                lower_cmd,
                no_wait: false,
            },
        );
        // The FUSE client is the child of drainfs running the client's program.
        let drainfs = m.proc.pid();
        let lower_pid = wait_for(Duration::from_secs(5), || {
            child_pids(drainfs)
                .into_iter()
                .find(|pid| cmdline(*pid).first() == Some(&client))
        });
        let s = Stack {
            m,
            server,
            kind,
            exit_file,
            summary,
            admin_port,
            lower_pid: lower_pid.unwrap_or(-1),
        };
        assert!(s.lower_pid > 0, "drainfs has no child (the FUSE client)");
        assert_eq!(
            fstype_at(&lower).as_deref(),
            Some(kind.fstype()),
            "the real client is not mounted under drainfs"
        );
        s
    }

    /// Writes the exit file the way Kubernetes wrappers do: a temp file, then a rename.
    pub fn trigger_exit_file(&self) {
        let dir = self.exit_file.parent().unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let tmp = dir.join(".exit.tmp");
        std::fs::write(&tmp, b"").unwrap();
        std::fs::rename(&tmp, &self.exit_file).unwrap();
    }

    /// drainfs's exit code (-1 for a signal), waiting up to `timeout` (panics after, with
    /// drainfs's stderr).
    pub fn wait_exit(&mut self, timeout: Duration) -> i32 {
        let st = self.m.proc.wait_exit(timeout, "drainfs");
        st.code().unwrap_or(-1)
    }

    /// The summary file (panics, with drainfs's stderr, if there is none).
    pub fn summary(&self) -> serde_json::Value {
        read_json(&self.summary)
            .unwrap_or_else(|e| panic!("no summary file ({e}):\n{}", self.m.proc.stderr_text()))
    }

    /// drainfs's `/status` from its admin server, asked in this process (no fork, so no
    /// stray FLUSH of a file the test holds open: see [`serial`]); `None` while nothing
    /// answers there.
    pub fn status(&self) -> Option<serde_json::Value> {
        status_from(&format!("127.0.0.1:{}", self.admin_port))
    }

    /// After drainfs exited: nothing mounted, the client's process gone.
    pub fn assert_clean_end(&self) {
        assert!(!is_mounted(&self.m.mnt), "drainfs's mount left behind");
        assert!(!is_mounted(&self.m.lower), "the lower's mount left behind");
        assert!(
            // At once when idle; 10 s for a loaded machine's late exit and reaping.
            wait_until(Duration::from_secs(10), || !pid_alive(self.lower_pid)),
            "the FUSE client (pid {}) is still running",
            self.lower_pid
        );
    }

    /// The bucket holds exactly `want` (same keys, sizes and SHA-256), read from the server.
    pub fn assert_bucket(&self, want: &BTreeMap<String, Object>) {
        let got = self.server.objects();
        let missing: Vec<&String> = want.keys().filter(|k| !got.contains_key(*k)).collect();
        let extra: Vec<&String> = got.keys().filter(|k| !want.contains_key(*k)).collect();
        let wrong: Vec<String> = want
            .iter()
            .filter_map(|(k, w)| {
                let g = got.get(k)?;
                (g != w).then(|| {
                    format!(
                        "{k}: {} B sha256 {:.12} (want {} B sha256 {:.12})",
                        g.size, g.sha256, w.size, w.sha256
                    )
                })
            })
            .collect();
        assert!(
            missing.is_empty() && extra.is_empty() && wrong.is_empty(),
            "{} bucket differs: missing {missing:?}, unexpected {extra:?}, wrong content {wrong:?}",
            self.kind.name()
        );
    }
}

/// How a [`Stack`]'s drop stops drainfs: SIGTERM (drain), a second SIGTERM (finish now),
/// then SIGKILL.
const STACK_LADDER: [(Signal, Duration); 3] = [
    (Signal::SIGTERM, Duration::from_secs(5)),
    (Signal::SIGTERM, Duration::from_secs(5)),
    (Signal::SIGKILL, Duration::from_secs(5)),
];

impl Drop for Stack {
    fn drop(&mut self) {
        // A test may have stopped the server: drainfs's drain would wait on it.
        if pid_alive(self.server.pid) {
            self.server.signal(Signal::SIGCONT);
        }
        // drainfs first, then the client, in case drainfs could not stop it. Mounted's own
        // drop detaches what is left mounted, and Server's stops the server.
        self.m.proc.stop(&STACK_LADDER);
        if pid_alive(self.lower_pid) {
            send(self.lower_pid, Signal::SIGKILL);
        }
    }
}

/// Whether thread `tid` of this process is inside `close(fd)` (from /proc, as `strace -p`
/// would see it).
pub fn in_close(tid: i32, fd: i32) -> bool {
    let text =
        std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).unwrap_or_default();
    let mut f = text.split_whitespace();
    f.next() == Some(libc::SYS_close.to_string().as_str())
        && f.next() == Some(format!("{fd:#x}").as_str())
}

/// Creates `path` (O_TRUNC), writes `data` and closes it, returning close()'s error: the upload
/// happens inside close(), so that is where its failure shows.
pub fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    write_and_close(create_file(path)?, data)
}

/// Opens `path` for writing (`O_WRONLY | O_CREAT | O_TRUNC`, mode 0644), as [`write_file`]
/// does.
pub fn create_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL");
    // SAFETY: NUL-terminated path; the fd is owned by the File alone.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by open.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Writes `data` to `f` and closes it, returning close()'s error (the upload's).
pub fn write_and_close(mut f: std::fs::File, data: &[u8]) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    f.write_all(data)?;
    let fd = f.into_raw_fd();
    // SAFETY: `fd` is owned here and closed exactly once.
    if unsafe { libc::close(fd) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

//! `--check-config`: every start-up check that needs no mount, collected instead of stopping
//! at the first, so one run lists every problem (one line each).
//!
//! Nothing here mounts, unmounts, repairs, starts a process or writes a file: a dead FUSE
//! mount at the mountpoint is reported as something `drainfs run` will repair, not repaired.
//! The admin address is bound and released at once to prove it is free.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::config::{LowerProcess, RelayConnection, RunConfig};
use crate::mount;

/// The problems `cfg` would meet at start-up, one line each; empty when it would start.
///
/// Passthrough mount (`run`): `--lower` and `--mountpoint` exist, are directories, are not
/// live FUSE mounts and do not contain each other; `/dev/fuse` opens read-write and
/// `fusermount3` is on `PATH` (needed without CAP_SYS_ADMIN only); the lower's command exists, and when it is gcsfuse it has
/// `--foreground` and mounts at `--lower` (its last argument); any other command names
/// `--lower` among its arguments.
///
/// Relay (`relay`): the daemon's command exists and has a `/dev/fd/N` argument (or
/// `--kernel-fd`), and that fd is open on `/dev/fuse`; for `run --relay`, `--mountpoint` is
/// a directory that is not a mount and `/dev/fuse` opens.
///
/// Hand-off (`handoff`): nothing of the command (gcsfuse checks its own arguments).
///
/// All: [`output_problems`], and `--admin-addr` can be bound.
pub fn problems(cfg: &RunConfig) -> Vec<String> {
    let mut out = Vec::new();
    match (&cfg.relay, &cfg.handoff) {
        // The hand-off passes gcsfuse everything untouched: gcsfuse checks its own.
        (_, Some(_)) => {}
        (None, None) => mount_problems(cfg, &mut out),
        (Some(opts), None) => relay_problems(cfg, opts.connection, &mut out),
    }
    output_problems(cfg, &mut out);
    // A relay whose address is taken runs without an admin server (the first relay of the
    // pod serves it), as `run` decides at start.
    if let Some(addr) = cfg.admin.admin_addr
        && let Err(e) = std::net::TcpListener::bind(addr)
        && !((cfg.relay.is_some() || cfg.handoff.is_some())
            && e.kind() == std::io::ErrorKind::AddrInUse)
    {
        out.push(format!("--admin-addr {addr}: {e}"));
    }
    out
}

/// A directory flag: `Some(absolute path)` when it is one, else the problem is recorded.
fn dir_problem(path: &Path, flag: &str, out: &mut Vec<String>) -> Option<PathBuf> {
    if path.as_os_str().is_empty() {
        out.push(format!("{flag} is required"));
        return None;
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Some(mount::absolute(path)),
        Ok(_) => {
            out.push(format!("{flag} {}: not a directory", path.display()));
            None
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            // A dead FUSE mount left by a killed predecessor: `run` repairs it at start.
            Some(mount::absolute(path))
        }
        Err(e) => {
            out.push(format!("{flag} {}: {e}", path.display()));
            None
        }
    }
}

fn mount_problems(cfg: &RunConfig, out: &mut Vec<String>) {
    let spawns = matches!(cfg.lifecycle.lower_process, LowerProcess::Spawn { .. });
    let lower = dir_problem(&cfg.fs.lower, "--lower", out);
    let mp = dir_problem(&cfg.fs.mountpoint, "--mountpoint", out);
    let live_fuse = |p: &Path, flag: &str, out: &mut Vec<String>| {
        if let Some(m) = mount::mount_at(p)
            && std::fs::metadata(p).is_ok()
            && let Err(e) = mount::check_existing_mount(&m, flag, p)
        {
            out.push(e.0);
        }
    };
    if let Some(mp) = &mp {
        live_fuse(mp, "--mountpoint", out);
    }
    if spawns && let Some(l) = &lower {
        live_fuse(l, "--lower", out);
    }
    if let (Some(l), Some(m)) = (&lower, &mp) {
        if m.starts_with(l) {
            out.push(format!(
                "--mountpoint {} is inside --lower {}: drainfs would serve itself",
                m.display(),
                l.display()
            ));
        } else if l.starts_with(m) {
            out.push(format!(
                "--lower {} is inside --mountpoint {}: the lower would be hidden by drainfs's own mount",
                l.display(),
                m.display()
            ));
        }
    }
    dev_fuse_problem(out);
    if mount::which("fusermount3").is_none() && !mount::has_cap_sys_admin() {
        out.push(
            "fusermount3 not found on PATH and no CAP_SYS_ADMIN; install fuse3 (apt-get install fuse3)"
                .into(),
        );
    }
    if let LowerProcess::Spawn { argv } = &cfg.lifecycle.lower_process {
        let args: Vec<String> = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        command_problem(&args, out);
        if let Some(l) = &lower {
            lower_command_problems(&args, l, out);
        }
    }
}

/// The lower's command must mount where drainfs waits for it, and stay in the foreground.
fn lower_command_problems(args: &[String], lower: &Path, out: &mut Vec<String>) {
    let names_lower = |a: &str| {
        let p = Path::new(a);
        p.is_absolute() && mount::absolute(p) == lower
            || !p.is_absolute() && !a.starts_with('-') && mount::absolute(p) == lower
    };
    let is_gcsfuse = args.first().is_some_and(|a0| {
        Path::new(a0)
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("gcsfuse"))
    });
    if is_gcsfuse {
        let foreground = args[1..]
            .iter()
            .any(|a| a == "--foreground" || a == "--foreground=true");
        if !foreground {
            out.push(format!(
                "-- {}: no --foreground; a gcsfuse that daemonizes exits right after mounting and drainfs takes that for a dead lower (exit 69)",
                args[0]
            ));
        }
        match args.last() {
            Some(last) if args.len() > 1 && names_lower(last) => {}
            other => out.push(format!(
                "-- {}: mounts at {} (its last argument), not at --lower {}",
                args[0],
                other.map_or("nothing", |s| s.as_str()),
                lower.display()
            )),
        }
    } else if !args[1..].iter().any(|a| names_lower(a)) {
        out.push(format!(
            "-- {}: none of its arguments is --lower {}; drainfs waits for a new mount there",
            args[0],
            lower.display()
        ));
    }
}

/// The command's program exists and is executable (a path, or a name found on `PATH`).
fn command_problem(args: &[String], out: &mut Vec<String>) {
    let Some(a0) = args.first() else {
        out.push("-- COMMAND is empty".into());
        return;
    };
    let found = if a0.contains('/') {
        Some(PathBuf::from(a0))
    } else {
        mount::which(a0)
    };
    let executable = found.as_ref().is_some_and(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file())
            && nix::unistd::access(p.as_path(), nix::unistd::AccessFlags::X_OK).is_ok()
    });
    if !executable {
        out.push(format!(
            "-- {a0}: {}",
            if a0.contains('/') {
                "not an executable file"
            } else {
                "not found on PATH"
            }
        ));
    }
}

fn dev_fuse_problem(out: &mut Vec<String>) {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        out.push(format!(
            "/dev/fuse is unusable ({e}); give the container the device and run drainfs as a user that may open it"
        ));
    }
}

/// FUSE's character device: major 10, minor 229.
const FUSE_DEV: (u32, u32) = (10, 229);

fn relay_problems(cfg: &RunConfig, connection: RelayConnection, out: &mut Vec<String>) {
    let LowerProcess::Spawn { argv } = &cfg.lifecycle.lower_process else {
        out.push("relay mode needs the daemon's command (-- COMMAND ARGS... /dev/fd/N)".into());
        return;
    };
    let args: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    command_problem(&args, out);
    let dev_fd = args.iter().skip(1).find_map(|a| {
        a.strip_prefix("/dev/fd/")
            .and_then(|n| n.parse::<i32>().ok())
    });
    match connection {
        RelayConnection::Inherited { fd } => {
            let Some(kfd) = fd.or(dev_fd) else {
                out.push(format!(
                    "-- {}: no /dev/fd/N argument and no --kernel-fd: which fd is the FUSE connection?",
                    args.first().map_or("", |s| s.as_str())
                ));
                return;
            };
            match std::fs::metadata(format!("/proc/self/fd/{kfd}")) {
                Err(e) => out.push(format!(
                    "fd {kfd} (the FUSE connection): not open in drainfs ({e}); the node driver passes it as /dev/fd/N"
                )),
                Ok(m) => {
                    use std::os::unix::fs::MetadataExt;
                    let rdev = m.rdev();
                    let dev = (nix::sys::stat::major(rdev) as u32, nix::sys::stat::minor(rdev) as u32);
                    if !m.file_type().is_char_device() || dev != FUSE_DEV {
                        out.push(format!("fd {kfd} (the FUSE connection): not /dev/fuse"));
                    } else if let Err(e) = crate::relay::run::live_connection_check(kfd) {
                        out.push(e);
                    }
                }
            }
        }
        RelayConnection::SelfMounted => {
            if dev_fd.is_none() {
                out.push(format!(
                    "-- {}: no /dev/fd/N argument for the daemon's connection",
                    args.first().map_or("", |s| s.as_str())
                ));
            }
            if let Some(mp) = dir_problem(&cfg.fs.mountpoint, "--mountpoint", out)
                && std::fs::metadata(&mp).is_ok()
                && let Some(m) = mount::mount_at(&mp)
            {
                out.push(format!(
                    "--mountpoint {}: already a mount ({} from {})",
                    mp.display(),
                    m.fstype,
                    m.source
                ));
            }
            dev_fuse_problem(out);
        }
    }
}

/// The checks of the outputs and triggers that `run` and `relay` make at start (exit 2) and
/// `--check-config` lists: the directories of `--summary-file`, `--termination-log`,
/// `--ready-file` and `--control-socket` exist and are writable, and none of these is an
/// existing directory; `--control-socket` is not an existing file other than a socket, nor a
/// socket another process answers on (drainfs replaces a stale one); `--watch-pid` is alive;
/// the grace margin is shorter than the grace period; no exit file is the ready file or lies
/// under `--mountpoint` or `--lower` (drainfs's own mount, and the bucket: the kernel sends
/// no inotify event for a file created there by another mount's users, and it would be an
/// object). (An exit file's directory may appear later: drainfs waits for it.)
pub fn output_problems(cfg: &RunConfig, out: &mut Vec<String>) {
    let files = [
        ("--summary-file", cfg.lifecycle.summary_file.as_deref()),
        (
            "--termination-log",
            cfg.lifecycle.termination_log.as_deref(),
        ),
        ("--ready-file", cfg.lifecycle.ready_file.as_deref()),
        ("--control-socket", cfg.admin.control_socket.as_deref()),
    ];
    for (flag, path) in files {
        let Some(path) = path else { continue };
        if let Err(e) = writable_dir_of(path) {
            out.push(format!("{flag} {}: {e}", path.display()));
        }
    }
    if let Some(sock) = &cfg.admin.control_socket
        && let Err(e) = control_socket_free(sock)
    {
        out.push(format!("--control-socket {}: {e}", sock.display()));
    }
    if let Some(pid) = cfg.lifecycle.watch_pid
        && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH)
    {
        out.push(format!("--watch-pid {pid}: no such process"));
    }
    let l = &cfg.lifecycle;
    if l.grace_margin >= l.grace_period {
        out.push(format!(
            "--grace-margin {} is not shorter than --grace-period {}: drainfs would force its stop at the trigger",
            humantime::format_duration(l.grace_margin),
            humantime::format_duration(l.grace_period)
        ));
    }
    let mut served: Vec<(&str, PathBuf)> = Vec::new();
    if !cfg.fs.mountpoint.as_os_str().is_empty() {
        served.push(("--mountpoint", mount::absolute(&cfg.fs.mountpoint)));
    }
    if cfg.relay.is_none() && !cfg.fs.lower.as_os_str().is_empty() {
        served.push(("--lower", mount::absolute(&cfg.fs.lower)));
    }
    let ready = l.ready_file.as_deref().map(mount::absolute);
    for f in &l.exit_files {
        let abs = mount::absolute(f);
        if ready.as_ref() == Some(&abs) {
            out.push(format!(
                "--exit-file {} is also --ready-file: drainfs would stop itself once it serves",
                f.display()
            ));
        }
        for (flag, dir) in &served {
            if abs.starts_with(dir) {
                out.push(format!(
                    "--exit-file {} is under {flag} {}: put it on a volume of its own (an emptyDir)",
                    f.display(),
                    dir.display()
                ));
            }
        }
    }
}

/// `--control-socket`'s path is free for drainfs: missing, or a socket nobody answers on (a
/// predecessor's, which drainfs replaces).
///
/// # Errors
/// A readable reason: an existing file that is not a socket (drainfs would delete it), or a
/// socket another process (another drainfs) accepts connections on.
pub fn control_socket_free(path: &Path) -> Result<(), String> {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !m.file_type().is_socket() {
        return Err("exists and is not a socket (drainfs would replace it)".into());
    }
    match std::os::unix::net::UnixStream::connect(path) {
        Ok(_) => Err("another process (another drainfs?) answers on this socket".into()),
        Err(_) => Ok(()),
    }
}

fn parent(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Whether drainfs may create `path` (the summary, the ready file, the socket): its directory
/// exists and is writable, or `path` itself is an existing writable file (Kubernetes
/// bind-mounts `/dev/termination-log` as one file).
///
/// # Errors
/// A readable reason.
pub fn writable_dir_of(path: &Path) -> Result<(), String> {
    use nix::unistd::{AccessFlags, access};
    if std::fs::metadata(path).is_ok_and(|m| m.is_file()) && access(path, AccessFlags::W_OK).is_ok()
    {
        return Ok(());
    }
    if path.is_dir() {
        return Err("is a directory: drainfs writes a file at this path".into());
    }
    let dir = parent(path);
    if !dir.is_dir() {
        return Err(format!("the directory {} does not exist", dir.display()));
    }
    access(dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|e| {
        format!(
            "drainfs (uid {}) cannot create files in {}: {e}",
            nix::unistd::geteuid(),
            dir.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `drainfs run ARGS` as a configuration.
    fn cfg(args: &[&str]) -> RunConfig {
        use clap::Parser;
        let mut argv = vec!["drainfs", "run"];
        argv.extend_from_slice(args);
        match crate::cli::Cli::try_parse_from(argv).unwrap().command {
            crate::cli::Command::Run(a) => a.into_config(None).unwrap(),
            other => panic!("parsed {other:?}"),
        }
    }

    fn outputs(args: &[&str]) -> Vec<String> {
        let mut out = Vec::new();
        output_problems(&cfg(args), &mut out);
        out
    }

    /// What a newcomer's configurations did (each passed `--check-config` and then lost the
    /// summary, replaced a file, stopped another drainfs, never fired, or stopped at once):
    /// each is now a problem, and the same configurations made sane have none.
    #[test]
    fn outputs_and_triggers_that_cannot_work_are_problems() {
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n).display().to_string();
        for n in ["l", "m", "outdir"] {
            std::fs::create_dir(d.path().join(n)).unwrap();
        }
        let base = ["--lower", &p("l"), "--mountpoint", &p("m")];
        let with = |extra: &[&str]| {
            let mut a = base.to_vec();
            a.extend_from_slice(extra);
            outputs(&a)
        };
        assert!(with(&[]).is_empty(), "{:?}", with(&[]));
        // A directory where a file goes.
        let e = with(&["--summary-file", &p("outdir")]);
        assert!(e.len() == 1 && e[0].contains("is a directory"), "{e:?}");
        let e = with(&["--termination-log", &p("outdir")]);
        assert!(e.len() == 1 && e[0].contains("is a directory"), "{e:?}");
        // The control socket: a regular file, a socket someone answers on, a stale socket.
        std::fs::write(d.path().join("precious.txt"), b"precious").unwrap();
        let e = with(&["--control-socket", &p("precious.txt")]);
        assert!(e.len() == 1 && e[0].contains("not a socket"), "{e:?}");
        let live = std::os::unix::net::UnixListener::bind(d.path().join("live.sock")).unwrap();
        let e = with(&["--control-socket", &p("live.sock")]);
        assert!(e.len() == 1 && e[0].contains("answers"), "{e:?}");
        drop(live);
        assert!(
            with(&["--control-socket", &p("live.sock")]).is_empty(),
            "a stale socket"
        );
        // Exit files: under the mountpoint, under the lower, the ready file itself.
        let under_m = format!("{}/exit", p("m"));
        let e = with(&["--exit-file", &under_m]);
        assert!(e.len() == 1 && e[0].contains("under --mountpoint"), "{e:?}");
        let under_l = format!("{}/sub/exit", p("l"));
        let e = with(&["--exit-file", &under_l]);
        assert!(e.len() == 1 && e[0].contains("under --lower"), "{e:?}");
        let e = with(&["--exit-file", &p("x"), "--ready-file", &p("x")]);
        assert!(e.len() == 1 && e[0].contains("--ready-file"), "{e:?}");
        assert!(with(&["--exit-file", &p("sig/exit"), "--ready-file", &p("ready")]).is_empty());
        // The grace margin.
        let e = with(&["--grace-period", "2s", "--grace-margin", "5s"]);
        assert!(e.len() == 1 && e[0].contains("--grace-margin"), "{e:?}");
        let e = with(&["--grace-period", "0"]);
        assert!(e.len() == 1 && e[0].contains("--grace-margin"), "{e:?}");
        assert!(with(&["--grace-period", "2s", "--grace-margin", "1s"]).is_empty());
    }

    /// A taken admin address is a problem for `run`, not for a relay (which goes without an
    /// admin server, as at start: one relay per volume shares the pod's address).
    #[test]
    fn a_taken_admin_address_is_a_problem_for_run_only() {
        use clap::Parser;
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let d = tempfile::tempdir().unwrap();
        let p = |n: &str| d.path().join(n).display().to_string();
        for n in ["l", "m"] {
            std::fs::create_dir(d.path().join(n)).unwrap();
        }
        let run = cfg(&[
            "--lower",
            &p("l"),
            "--mountpoint",
            &p("m"),
            "--admin-addr",
            &addr,
        ]);
        assert!(problems(&run).iter().any(|e| e.starts_with("--admin-addr")));
        let argv = [
            "drainfs",
            "relay",
            "--admin-addr",
            &addr,
            "--",
            "d",
            "/dev/fd/3",
        ];
        let relay = match crate::cli::Cli::try_parse_from(argv).unwrap().command {
            crate::cli::Command::Relay(a) => a.into_config(),
            other => panic!("parsed {other:?}"),
        };
        let e = problems(&relay);
        assert!(!e.iter().any(|e| e.starts_with("--admin-addr")), "{e:?}");
    }

    fn lower_cmd(args: &[&str], lower: &str) -> Vec<String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let mut out = Vec::new();
        lower_command_problems(&args, Path::new(lower), &mut out);
        out
    }

    #[test]
    fn gcsfuse_must_stay_in_the_foreground_and_mount_at_lower() {
        assert!(lower_cmd(&["gcsfuse", "--foreground", "b", "/l"], "/l").is_empty());
        assert!(lower_cmd(&["/bin/gcsfuse", "--foreground=true", "b", "/l/"], "/l").is_empty());
        let p = lower_cmd(&["gcsfuse", "b", "/l"], "/l");
        assert!(p.len() == 1 && p[0].contains("--foreground"), "{p:?}");
        let p = lower_cmd(&["gcsfuse", "--foreground", "b", "/elsewhere"], "/l");
        assert!(p.len() == 1 && p[0].contains("/elsewhere"), "{p:?}");
        assert_eq!(lower_cmd(&["gcsfuse", "b", "/x"], "/l").len(), 2);
        assert!(
            lower_cmd(
                &["rclone", "mount", "r:b", "/l", "--vfs-cache-mode", "off"],
                "/l"
            )
            .is_empty()
        );
        assert_eq!(lower_cmd(&["rclone", "mount", "r:b", "/x"], "/l").len(), 1);
    }
}

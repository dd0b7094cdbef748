//! The process side of relay mode: finds or creates the FUSE connection, builds the
//! socketpair, and starts the daemon on it ([`prepare`]); the lifecycle
//! ([`crate::lifecycle`]) then starts the engine and drives everything else, exactly as for
//! the passthrough mount.
//!
//! The connection is either inherited (`drainfs relay`, the CSI driver's `/dev/fd/N`) or
//! mounted here (`drainfs run --relay`: `/dev/fuse` opened and mounted with `fd=N`).

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};

use nix::fcntl::{FcntlArg, fcntl};
use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, getsockopt, setsockopt, socketpair, sockopt,
};
use nix::sys::wait::WaitStatus;

use super::engine::Limits;
use crate::config::{LowerProcess, RelayConnection, RunConfig};
use crate::drain::ExitCode;
use crate::procs;

/// The fd number the daemon finds its socket end at (`/dev/fd/3`, as the CSI driver passes).
pub const DAEMON_FD: RawFd = 3;
/// The kernel fd is moved to this number or above.
pub const HIGH_FD: RawFd = 100;

/// A relay ready to start: the connection, the socketpair's relay end, and the daemon running
/// on the other end.
#[derive(Debug)]
pub struct Prepared {
    /// The FUSE connection (CLOEXEC, at [`HIGH_FD`] or above).
    pub kernel: OwnedFd,
    /// The relay's end of the socketpair (blocking).
    pub relay_end: OwnedFd,
    /// Sizes from the socket buffers obtained and `--max-message`.
    pub limits: Limits,
    /// The SO_SNDBUF requested.
    pub requested: usize,
    /// The daemon's PID.
    pub pid: i32,
    /// The daemon's exit status, from the reaper.
    pub exit: tokio::sync::oneshot::Receiver<WaitStatus>,
    /// The daemon's command line as run.
    pub argv: Vec<OsString>,
    /// The mount drainfs made itself (self-mounted relay, by mount ID), to unmount at the end.
    pub mounted: Option<crate::mount::MountInfo>,
}

/// Finds or mounts the connection, creates the socketpair and starts the daemon. Must run on
/// the main thread (PR_SET_PDEATHSIG follows the thread that forked). `cfg.relay` must be
/// set and `cfg.lifecycle.lower_process` must be `Spawn`.
///
/// # Errors
/// The exit status and a one-line message: usage (no `/dev/fd/N` argument, an fd that is not
/// open), failed (`/dev/fuse` or the mount, the socketpair), lower failed (the daemon did not
/// start). Anything mounted here is unmounted again on error.
pub fn prepare(cfg: &RunConfig) -> Result<Prepared, (ExitCode, String)> {
    let usage = |e: String| (ExitCode::Usage, e);
    let Some(opts) = cfg.relay.as_ref() else {
        return Err(usage("not in relay mode".into()));
    };
    let LowerProcess::Spawn { argv } = &cfg.lifecycle.lower_process else {
        return Err(usage(
            "relay mode needs the daemon's command (-- COMMAND ARGS... /dev/fd/N)".into(),
        ));
    };
    let (kernel, argv, mounted) = match opts.connection {
        RelayConnection::Inherited { fd } => {
            let (kfd, argv) = plan_argv(argv, fd).map_err(usage)?;
            (take_fd(kfd).map_err(usage)?, argv, None)
        }
        RelayConnection::SelfMounted => {
            let (_, argv) = plan_argv(argv, None).map_err(usage)?;
            let (kernel, m) = mount_fuse(&cfg.fs.mountpoint).map_err(|e| (ExitCode::Failed, e))?;
            (kernel, argv, Some(m))
        }
    };
    let undo = |e: (ExitCode, String)| {
        if let Some(m) = &mounted {
            let _ = crate::mount::unmount_mount(m, true, std::time::Duration::from_secs(1));
        }
        e
    };
    keep_message_buffers();
    let requested = opts.socket_buffer.or_else(wmem_max).unwrap_or(212_992);
    let p = plumb(kernel, requested).map_err(|e| undo((ExitCode::Failed, e)))?;
    let mut limits = Limits::from_sndbufs(p.sndbuf_relay, p.sndbuf_daemon, opts.max_message);
    if opts.split_large_requests {
        limits = limits.splitting(opts.read_parts);
    }
    tracing::info!(
        kernel_fd = p.kernel.as_raw_fd(),
        requested,
        sndbuf_relay = p.sndbuf_relay,
        sndbuf_daemon = p.sndbuf_daemon,
        cap = ?limits.cap,
        buffer_cap = ?limits.buffer_cap,
        kernel_cap = ?limits.kernel_cap,
        write_part = limits.write_part,
        max_message = opts.max_message,
        pump = ?opts.pump,
        spin_us = opts.spin.as_micros() as u64,
        "relay: socketpair ready"
    );
    if limits
        .buffer_cap
        .is_some_and(|b| b < opts.max_message / super::init::PAGE * super::init::PAGE)
    {
        tracing::warn!(
            max_message = opts.max_message,
            cap = ?limits.cap,
            "relay: --max-message is larger than the socket buffers carry; capped"
        );
    }
    let (pid, exit) = spawn_daemon(&argv, &p.daemon_end).map_err(|e| {
        undo((
            ExitCode::LowerFailed,
            format!("cannot start {}: {e}", argv[0].to_string_lossy()),
        ))
    })?;
    drop(p.daemon_end);
    tracing::info!(pid, daemon = %argv[0].to_string_lossy(), "relay: daemon started");
    Ok(Prepared {
        kernel: p.kernel,
        relay_end: p.relay_end,
        limits,
        requested,
        pid: pid as i32,
        exit,
        argv,
        mounted,
    })
}

/// Takes ownership of the inherited fd `kfd` and moves it to [`HIGH_FD`] or above with
/// FD_CLOEXEC (the daemon must never inherit the FUSE connection), and closes every other
/// inherited copy of the connection (GKE's sidecar mounter leaks its own, which would go on
/// to the daemon: [`procs::close_fuse_fds`]).
fn take_fd(kfd: RawFd) -> Result<OwnedFd, String> {
    fcntl_check(kfd)?;
    fuse_device_check(kfd)?;
    live_connection_check(kfd)?;
    // SAFETY: `kfd` is open (checked above) and was inherited; nothing else in this process
    // owns it, so taking ownership (and closing it once duplicated) is sound.
    let inherited = unsafe { OwnedFd::from_raw_fd(kfd) };
    let kernel = to_high_fd(inherited)?;
    let closed = procs::close_fuse_fds(Some(kernel.as_raw_fd()));
    if !closed.is_empty() {
        tracing::debug!(fds = ?closed, "relay: closed inherited copies of the FUSE connection");
    }
    Ok(kernel)
}

fn to_high_fd(fd: OwnedFd) -> Result<OwnedFd, String> {
    let high = fcntl(&fd, FcntlArg::F_DUPFD_CLOEXEC(HIGH_FD))
        .map_err(|e| format!("cannot move fd {}: {e}", fd.as_raw_fd()))?;
    drop(fd);
    // SAFETY: F_DUPFD_CLOEXEC returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

/// Opens `/dev/fuse` and mounts `mountpoint` on it ([`crate::mount::mount_fuse`]: fstype
/// `fuse.drainfs`, source `drainfs`, `fd=N,rootmode=40000,user_id=U,group_id=G,
/// default_permissions,allow_other`, nosuid, nodev, noatime). Returns the connection (moved
/// to [`HIGH_FD`] or above, CLOEXEC) and the new mount.
///
/// # Errors
/// A one-line message with the errno of `open` (ENOENT: no FUSE module) or `mount` (EPERM:
/// not privileged).
pub fn mount_fuse(mountpoint: &Path) -> Result<(OwnedFd, crate::mount::MountInfo), String> {
    let (fd, m) = crate::mount::mount_fuse(mountpoint, "drainfs", "drainfs")
        .map_err(|e| format!("cannot mount {}: {e}", mountpoint.display()))?;
    let fd = to_high_fd(fd)?;
    tracing::info!(mountpoint = %mountpoint.display(), mount_id = m.id, "relay: mounted the FUSE connection");
    Ok((fd, m))
}

/// Finds the kernel fd and the daemon's argv: the one `/dev/fd/N` argument names the kernel
/// fd (unless `kernel_fd` overrides it) and is rewritten to `/dev/fd/3`.
///
/// # Errors
/// A message for: an empty command, no `/dev/fd/N` argument and no override, more than one,
/// or an N that is not a number.
pub fn plan_argv(
    argv: &[OsString],
    kernel_fd: Option<RawFd>,
) -> Result<(RawFd, Vec<OsString>), String> {
    if argv.is_empty() {
        return Err("no daemon command given (drainfs relay -- COMMAND ARGS... /dev/fd/N)".into());
    }
    let mut found: Vec<(usize, RawFd)> = Vec::new();
    for (i, a) in argv.iter().enumerate().skip(1) {
        if let Some(rest) = a.as_bytes().strip_prefix(b"/dev/fd/") {
            let n = std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.parse::<RawFd>().ok())
                .filter(|n| *n >= 0)
                .ok_or_else(|| format!("`{}` does not name an fd", a.to_string_lossy()))?;
            found.push((i, n));
        }
    }
    if found.len() > 1 {
        return Err("more than one /dev/fd/N argument; pass --kernel-fd".into());
    }
    let kfd = match (kernel_fd, found.first()) {
        (Some(k), _) => k,
        (None, Some((_, n))) => *n,
        (None, None) => {
            return Err(
                "no /dev/fd/N argument names the FUSE connection (or pass --kernel-fd N)".into(),
            );
        }
    };
    let mut out = argv.to_vec();
    if let Some((i, _)) = found.first() {
        out[*i] = OsString::from(format!("/dev/fd/{DAEMON_FD}"));
    }
    Ok((kfd, out))
}

/// `net.core.wmem_max`, the most an unprivileged SO_SNDBUF can get (before doubling).
pub fn wmem_max() -> Option<usize> {
    std::fs::read_to_string("/proc/sys/net/core/wmem_max")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The fds of a relay before the daemon starts.
struct Plumbing {
    kernel: OwnedFd,
    relay_end: OwnedFd,
    daemon_end: OwnedFd,
    sndbuf_relay: usize,
    sndbuf_daemon: usize,
}

fn plumb(kernel: OwnedFd, socket_buffer: usize) -> Result<Plumbing, String> {
    let (relay_end, daemon_end) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| format!("socketpair: {e}"))?;
    for end in [&relay_end, &daemon_end] {
        // Failures leave the defaults, which the read-back below reports.
        let _ = setsockopt(end, sockopt::SndBuf, &socket_buffer);
        let _ = setsockopt(end, sockopt::RcvBuf, &socket_buffer);
    }
    let sndbuf_relay = getsockopt(&relay_end, sockopt::SndBuf).map_err(|e| e.to_string())?;
    let sndbuf_daemon = getsockopt(&daemon_end, sockopt::SndBuf).map_err(|e| e.to_string())?;
    Ok(Plumbing {
        kernel,
        relay_end,
        daemon_end,
        sndbuf_relay,
        sndbuf_daemon,
    })
}

fn fcntl_check(fd: RawFd) -> Result<(), String> {
    // SAFETY: F_GETFD only inspects the descriptor table; an unknown fd gives EBADF.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(format!(
            "fd {fd} (the FUSE connection) is not open in this process"
        ));
    }
    Ok(())
}

/// `/dev/fuse`'s device number (misc major 10, minor 229: `FUSE_MINOR` in
/// `<linux/miscdevice.h>`).
const FUSE_DEV: (u64, u64) = (10, 229);

/// Checks that `fd` is a FUSE connection: a character device `/dev/fuse` (a file, a pipe or a
/// socket there would be read as FUSE requests).
fn fuse_device_check(fd: RawFd) -> Result<(), String> {
    use nix::sys::stat::{SFlag, fstat, major, minor};
    // SAFETY: `fd` is open (fcntl_check) and only borrowed for the fstat call.
    let st = fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) })
        .map_err(|e| format!("fd {fd} (the FUSE connection): fstat failed: {e}"))?;
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    let dev = (major(st.st_rdev), minor(st.st_rdev));
    if kind != SFlag::S_IFCHR || dev != FUSE_DEV {
        let what = match kind {
            SFlag::S_IFREG => "a regular file".to_string(),
            SFlag::S_IFIFO => "a pipe".to_string(),
            SFlag::S_IFSOCK => "a socket".to_string(),
            SFlag::S_IFDIR => "a directory".to_string(),
            SFlag::S_IFCHR => format!("the character device {}:{}", dev.0, dev.1),
            _ => "not a character device".to_string(),
        };
        return Err(format!(
            "fd {fd} is not a FUSE connection (an open /dev/fuse, device 10:229): it is {what}"
        ));
    }
    Ok(())
}

/// Checks that `fd` (an open `/dev/fuse`) is a live FUSE connection: `poll(2)` without waiting
/// reports `POLLERR` for a `/dev/fuse` that was never mounted (no connection) or whose
/// connection has ended (fs/fuse/dev.c, `fuse_dev_poll`); a live one reports `POLLIN` (INIT
/// queued) or nothing.
///
/// # Errors
/// The reason, naming `fd`.
pub(crate) fn live_connection_check(fd: RawFd) -> Result<(), String> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    // SAFETY: `fd` is open (fcntl_check) and only borrowed for the poll call.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let mut fds = [PollFd::new(borrowed, PollFlags::POLLIN)];
    poll(&mut fds, PollTimeout::ZERO)
        .map_err(|e| format!("fd {fd} (the FUSE connection): poll failed: {e}"))?;
    if fds[0]
        .revents()
        .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLNVAL))
    {
        return Err(format!(
            "fd {fd} is /dev/fuse but not a live FUSE connection: never mounted (the node driver mounts it with fd=N before handing it over), or already ended"
        ));
    }
    Ok(())
}

/// Spawns the daemon with `daemon_end` as fd 3 (blocking, CLOEXEC cleared), stdin null,
/// stdout/stderr inherited, and PR_SET_PDEATHSIG(SIGKILL). Must run on the main thread: the
/// death signal follows the thread that forked, not the process.
fn spawn_daemon(
    argv: &[OsString],
    daemon_end: &OwnedFd,
) -> std::io::Result<(u32, tokio::sync::oneshot::Receiver<WaitStatus>)> {
    use std::os::unix::process::CommandExt;
    let src = daemon_end.as_raw_fd();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).stdin(Stdio::null());
    // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec; nothing is
    // allocated.
    unsafe {
        cmd.pre_exec(move || {
            if src == DAEMON_FD {
                let flags = libc::fcntl(DAEMON_FD, libc::F_GETFD);
                if flags < 0 || libc::fcntl(DAEMON_FD, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(src, DAEMON_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    procs::die_with_parent(&mut cmd);
    let (child, rx) = procs::spawn(&mut cmd)?;
    Ok((child.id(), rx))
}

/// Whether `arg0`'s basename is `gcsfuse` (the drop-in entry point).
pub fn is_gcsfuse_dropin(arg0: &OsStr) -> bool {
    std::path::Path::new(arg0)
        .file_name()
        .is_some_and(|n| n == "gcsfuse")
}

/// Largest allocation glibc's malloc serves from its heaps instead of a fresh `mmap(2)` once
/// [`keep_message_buffers`] ran (bytes): above the relay's largest message (1 MiB + header).
const MMAP_THRESHOLD: i32 = 4 << 20;
/// Free memory at the top of a glibc malloc heap that is kept instead of being given back with
/// `madvise(MADV_DONTNEED)` or `brk(2)` once [`keep_message_buffers`] ran (bytes).
const TRIM_THRESHOLD: i32 = 32 << 20;

/// Makes glibc's malloc keep the relay's message buffers between messages: a split READ's
/// assembled reply and a split WRITE's parts (up to 1 MiB each) are allocated and freed once
/// per request; with glibc's defaults each such free of a reply gave the pages back
/// (`madvise`, about 130 µs per 1 MiB reply measured with `strace -c` on 2 vCPUs) and the next
/// allocation faulted them in again: the threads pump's 1 MiB O_DIRECT reads measured
/// 354 MiB/s so, 498 MiB/s with these settings. The process keeps at most what it used at its peak. glibc only
/// (`mallopt(3)`); a no-op elsewhere.
pub fn keep_message_buffers() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets malloc's tunables; it is called before the relay's threads
    // start, and glibc serialises it against concurrent allocation anyway.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

/// The pump's spin when `--spin auto`: [`spin_for`] of the CPUs this process may use.
pub fn auto_spin() -> std::time::Duration {
    let cpus = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .map(|set| {
            (0..nix::sched::CpuSet::count())
                .filter(|&i| set.is_set(i).unwrap_or(false))
                .count()
        })
        .unwrap_or(1);
    spin_for(cpus, cgroup_cpu_quota())
}

/// `--spin auto`: 50 µs when at least 2 CPUs are usable (the affinity mask's count `cpus`,
/// and the cgroup quota `quota` in CPUs when one is set), else zero: spinning under a tighter
/// CPU limit would take time from the daemon itself (CFS throttling).
pub fn spin_for(cpus: usize, quota: Option<f64>) -> std::time::Duration {
    let usable = quota.map_or(cpus as f64, |q| q.min(cpus as f64));
    if usable >= 2.0 {
        std::time::Duration::from_micros(50)
    } else {
        std::time::Duration::ZERO
    }
}

/// The tightest CPU quota, in CPUs, on the path from this process's cgroup up to the root of
/// its hierarchy: cgroup v2 `cpu.max`, else cgroup v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`.
/// `None` when none is set or neither is readable. A container often sees only its own
/// cgroup at the hierarchy's root, so directories that do not exist are skipped.
fn cgroup_cpu_quota() -> Option<f64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let (v2, v1) = cgroup_paths(&own);
    let root = Path::new("/sys/fs/cgroup");
    if let Some(rel) = v2
        && root.join("cgroup.controllers").exists()
    {
        return tightest(&root.join(rel.trim_start_matches('/')), root, |d| {
            parse_cpu_max(&std::fs::read_to_string(d.join("cpu.max")).ok()?)
        });
    }
    let rel = v1?;
    let root = root.join("cpu");
    tightest(&root.join(rel.trim_start_matches('/')), &root, |d| {
        let quota = std::fs::read_to_string(d.join("cpu.cfs_quota_us")).ok()?;
        let period = std::fs::read_to_string(d.join("cpu.cfs_period_us")).ok()?;
        parse_cfs(&quota, &period)
    })
}

/// The smallest `read(dir)` from `dir` up to `root`.
fn tightest(dir: &Path, root: &Path, read: impl Fn(&Path) -> Option<f64>) -> Option<f64> {
    let mut dir = dir.to_path_buf();
    let mut best: Option<f64> = None;
    loop {
        if let Some(q) = read(&dir) {
            best = Some(best.map_or(q, |b| b.min(q)));
        }
        if dir == root || !dir.pop() || !dir.starts_with(root) {
            return best;
        }
    }
}

/// This process's cgroup paths from `/proc/self/cgroup`: the v2 one (`0::PATH`) and the v1
/// one of the hierarchy that has the `cpu` controller (`ID:cpu,cpuacct:PATH`).
pub fn cgroup_paths(proc_self_cgroup: &str) -> (Option<&str>, Option<&str>) {
    let mut v2 = None;
    let mut v1 = None;
    for line in proc_self_cgroup.lines() {
        let mut it = line.splitn(3, ':');
        let (Some(_), Some(ctrl), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if ctrl.is_empty() {
            v2 = Some(path);
        } else if ctrl.split(',').any(|c| c == "cpu") {
            v1 = Some(path);
        }
    }
    (v2, v1)
}

/// Parses cgroup v2 `cpu.max` (`"QUOTA PERIOD"` in µs, or `"max PERIOD"`) into CPUs.
pub fn parse_cpu_max(s: &str) -> Option<f64> {
    let mut it = s.split_whitespace();
    let quota: f64 = it.next()?.parse().ok()?;
    let period: f64 = it.next()?.parse().ok()?;
    (period > 0.0).then_some(quota / period)
}

/// Parses cgroup v1 `cpu.cfs_quota_us` (`-1`: none) and `cpu.cfs_period_us` into CPUs.
pub fn parse_cfs(quota: &str, period: &str) -> Option<f64> {
    let quota: f64 = quota.trim().parse().ok()?;
    let period: f64 = period.trim().parse().ok()?;
    (quota > 0.0 && period > 0.0).then_some(quota / period)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn spin_follows_the_usable_cpus() {
        use std::time::Duration;
        let on = Duration::from_micros(50);
        assert_eq!(spin_for(2, None), on);
        assert_eq!(spin_for(8, Some(2.0)), on);
        assert_eq!(spin_for(1, None), Duration::ZERO);
        assert_eq!(spin_for(8, Some(1.5)), Duration::ZERO);
        assert_eq!(spin_for(1, Some(4.0)), Duration::ZERO);
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("250000 100000\n"), Some(2.5));
        assert_eq!(parse_cpu_max("garbage"), None);
        assert_eq!(parse_cfs("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs("25000\n", "100000\n"), Some(0.25));
        let v1 = "12:cpu,cpuacct:/kubepods/pod1/c1\n4:memory:/x\n0::/\n";
        assert_eq!(cgroup_paths(v1), (Some("/"), Some("/kubepods/pod1/c1")));
        assert_eq!(
            cgroup_paths("0::/user.slice\n"),
            (Some("/user.slice"), None)
        );
    }

    /// A `/dev/fuse` fd that was never mounted is refused at start (it was relayed, and the
    /// relay reported a clean stop, exit 0, cause `unmounted_externally`).
    #[test]
    fn a_dev_fuse_that_was_never_mounted_is_not_a_connection() {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .expect("/dev/fuse opens (the suite needs it)");
        let fd = f.as_raw_fd();
        assert!(fuse_device_check(fd).is_ok());
        let e = live_connection_check(fd).unwrap_err();
        assert!(e.contains("not a live FUSE connection"), "{e}");
    }

    #[test]
    fn argv_plans() {
        let (k, a) = plan_argv(
            &os(&["/gcsfuse.real", "--foreground", "b", "/dev/fd/7"]),
            None,
        )
        .unwrap();
        assert_eq!(k, 7);
        assert_eq!(a, os(&["/gcsfuse.real", "--foreground", "b", "/dev/fd/3"]));
        let (k, a) = plan_argv(&os(&["d", "/dev/fd/3"]), Some(9)).unwrap();
        assert_eq!((k, a), (9, os(&["d", "/dev/fd/3"])));
        let (k, a) = plan_argv(&os(&["d", "x"]), Some(9)).unwrap();
        assert_eq!((k, a), (9, os(&["d", "x"])));
        for bad in [
            os(&[]),
            os(&["d", "x"]),
            os(&["d", "/dev/fd/3", "/dev/fd/4"]),
            os(&["d", "/dev/fd/x"]),
            os(&["d", "/dev/fd/-1"]),
        ] {
            assert!(plan_argv(&bad, None).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn dropin_names() {
        assert!(is_gcsfuse_dropin(OsStr::new("/gcsfuse")));
        assert!(is_gcsfuse_dropin(OsStr::new("gcsfuse")));
        assert!(!is_gcsfuse_dropin(OsStr::new("/usr/bin/drainfs")));
        assert!(!is_gcsfuse_dropin(OsStr::new("gcsfuse.real")));
    }
}

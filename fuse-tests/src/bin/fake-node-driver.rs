//! `fake-node-driver`: plays GKE's Cloud Storage FUSE CSI node driver and its sidecar-mounter,
//! so that the relay (and any `/dev/fd/N` FUSE daemon) can be tested without GKE.
//!
//! ```text
//! fake-node-driver --mountpoint M [--uid 65534 --gid 65534] [--kill-after 5s]
//!                  [--ready-timeout 10s] -- SIDECAR_COMMAND [ARGS...] /dev/fd/3
//! ```
//!
//! What it does, in the CSI driver's order (must run as root):
//! 1. The node driver's part: opens `/dev/fuse` read-write and mounts `M` (fstype `fuse`,
//!    `MS_NOSUID|MS_NODEV`) with
//!    `fd=N,rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions`.
//! 2. The sidecar-mounter's part: spawns `SIDECAR_COMMAND` with the connection as fd 3 (the
//!    command line is passed as given, so it should name `/dev/fd/3`), stdin on `/dev/null`,
//!    stdout on this process's stderr (this process's stdout carries only the lines below),
//!    stderr inherited; as `--uid`/`--gid` with no supplementary groups, every capability
//!    dropped (bounding, ambient, inheritable, permitted, effective) and `no_new_privs` set.
//!    Then it closes its own copy of the connection fd, so the sidecar holds the only one.
//!    As a safety net for the test suite only, the sidecar also gets `PR_SET_PDEATHSIG(SIGKILL)`
//!    (so it never outlives a killed `fake-node-driver`); the real sidecar-mounter does not.
//! 3. Prints `ready` once `statfs(M)` answers (the daemon has answered INIT and STATFS).
//! 4. Stops on SIGTERM or SIGINT, or when its stdin reaches EOF: sends SIGTERM to the sidecar's
//!    PID only and, if it has not exited `--kill-after` later, SIGKILL to that PID, as the
//!    sidecar-mounter does when the workload is gone. If the sidecar exits on its own first,
//!    nothing is sent.
//! 5. Unmounts `M` (`umount2(M, 0)`, lazily with `MNT_DETACH` when busy).
//!
//! stdout lines, for tests to key on:
//! - `ready`: the mount answers.
//! - `sigkill sent`: the sidecar did not exit within `--kill-after` of the SIGTERM.
//! - `sidecar exit: <code|signal NAME> after <ms> ms` (e.g. `sidecar exit: 0 after 12 ms`,
//!   `sidecar exit: signal SIGKILL after 5003 ms`): the last line; `<ms>` is the time from
//!   the SIGTERM to the sidecar's exit, or `-1` when the sidecar exited before any stop.
//!
//! Exit status: 0 when the sidecar exited with status 0 and `M` was unmounted, 1 otherwise, 2 on
//! usage errors. A mount that does not answer within `--ready-timeout` is reported on stderr
//! and stops the sidecar as above (no `ready` line).

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::Parser;
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::signal::{Signal, kill};
use nix::sys::stat::Mode;
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;

/// Command line of `fake-node-driver`.
#[derive(Parser, Debug)]
#[command(
    name = "fake-node-driver",
    about = "Plays the GKE gcsfuse CSI node driver and sidecar-mounter: mounts with fd=N and \
             hands the fuse fd to an unprivileged sidecar as fd 3"
)]
struct Args {
    /// Where to mount (an existing directory).
    #[arg(long, value_name = "DIR")]
    mountpoint: PathBuf,

    /// User the sidecar runs as.
    #[arg(long, default_value_t = 65534)]
    uid: u32,

    /// Group the sidecar runs as (no supplementary groups).
    #[arg(long, default_value_t = 65534)]
    gid: u32,

    /// How long after the SIGTERM the sidecar is SIGKILLed if it has not exited.
    #[arg(long, value_name = "DUR", default_value = "5s", value_parser = humantime::parse_duration)]
    kill_after: Duration,

    /// How long the mount may take to answer statfs after the sidecar is spawned.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = humantime::parse_duration)]
    ready_timeout: Duration,

    /// The mount's source, as shown in /proc/mounts.
    #[arg(long, value_name = "NAME", default_value = "gcsfuse-test")]
    source: String,

    /// The sidecar command and its arguments (the kernel connection is its fd 3).
    #[arg(last = true, required = true, value_name = "SIDECAR_COMMAND")]
    command: Vec<OsString>,
}

/// Something the main loop reacts to.
enum Event {
    /// A stop was requested (SIGTERM, SIGINT or stdin EOF); the string says which.
    Stop(&'static str),
    /// `statfs(M)` answered (Ok) or failed (Err).
    Ready(Result<(), Errno>),
    /// The sidecar has exited (not yet reaped), at this instant.
    Exited(Instant),
}

/// The `/dev/fuse` fd number in the sidecar, as the CSI driver passes it.
const SIDECAR_FD: i32 = 3;

/// Makes sure fds 0, 1 and 2 are open (on `/dev/null` if not), so that `/dev/fuse` never
/// lands on one of them.
fn ensure_std_fds() {
    for fd in 0..3 {
        // SAFETY: F_GETFD only queries the descriptor table.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            // SAFETY: opening /dev/null with a static NUL-terminated path; the new fd is the
            // lowest free one, i.e. the missing standard descriptor, and is meant to stay open.
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) };
        }
    }
}

/// The highest capability number the running kernel knows (`/proc/sys/kernel/cap_last_cap`).
fn cap_last_cap() -> Result<i32, String> {
    let text = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .map_err(|e| format!("/proc/sys/kernel/cap_last_cap: {e}"))?;
    text.trim()
        .parse()
        .map_err(|e| format!("/proc/sys/kernel/cap_last_cap: {e}"))
}

/// `capset(2)` header (`struct __user_cap_header_struct`).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// `capset(2)` data (`struct __user_cap_data_struct`), two of them for version 3.
#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`.
const CAP_VERSION_3: u32 = 0x2008_0522;

/// Turns a `-1` return into the current errno.
fn check(rc: libc::c_int) -> std::io::Result<()> {
    if rc == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Runs in the forked child before `exec`: puts the connection on fd 3, drops to `uid`/`gid`
/// with no capabilities and `no_new_privs`. Only async-signal-safe syscalls, no allocation.
fn sidecar_pre_exec(fuse_fd: i32, uid: u32, gid: u32, last_cap: i32) -> std::io::Result<()> {
    // SAFETY: the whole block is plain syscalls on integers and on stack structs that live for
    // the duration of each call; nothing here touches memory shared with the parent.
    unsafe {
        if fuse_fd == SIDECAR_FD {
            check(libc::fcntl(SIDECAR_FD, libc::F_SETFD, 0))?;
        } else {
            // dup2 leaves FD_CLOEXEC clear on the new descriptor.
            check(libc::dup2(fuse_fd, SIDECAR_FD))?;
        }
        // The bounding set needs CAP_SETPCAP, so it goes before the uid change.
        for cap in 0..=last_cap {
            check(libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0))?;
        }
        check(libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        ))?;
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setgid(gid))?;
        check(libc::setuid(uid))?;
        // A change from uid 0 already clears the permitted and effective sets; this also clears
        // the inheritable set, and all three for `--uid 0`.
        let mut header = CapHeader {
            version: CAP_VERSION_3,
            pid: 0,
        };
        let data = [CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        }; 2];
        let rc = libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        );
        if rc == -1 {
            return Err(std::io::Error::last_os_error());
        }
        check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        // After the uid change, which clears it.
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
    }
    Ok(())
}

/// Unmounts `path`; lazily when it is busy. A path that is no longer a mount point is fine.
fn unmount(path: &std::path::Path) -> Result<(), String> {
    match nix::mount::umount2(path, MntFlags::empty()) {
        Ok(()) | Err(Errno::EINVAL) => Ok(()),
        Err(Errno::EBUSY) => nix::mount::umount2(path, MntFlags::MNT_DETACH)
            .map_err(|e| format!("umount2(MNT_DETACH) {}: {e}", path.display())),
        Err(e) => Err(format!("umount {}: {e}", path.display())),
    }
}

/// Formats an exit status the way the status line says it.
fn describe(status: WaitStatus) -> (String, bool) {
    match status {
        WaitStatus::Exited(_, code) => (code.to_string(), code == 0),
        WaitStatus::Signaled(_, sig, _) => (format!("signal {}", sig.as_str()), false),
        other => (format!("{other:?}"), false),
    }
}

/// Mounts, runs the sidecar, stops it, unmounts; returns whether the sidecar exited 0.
fn run(args: Args) -> Result<bool, String> {
    let mountpoint = args
        .mountpoint
        .canonicalize()
        .map_err(|e| format!("mountpoint {}: {e}", args.mountpoint.display()))?;
    if !mountpoint.is_dir() {
        return Err(format!(
            "mountpoint {} is not a directory",
            mountpoint.display()
        ));
    }
    let last_cap = cap_last_cap()?;

    // Signals are consumed by one sigwait thread; every thread spawned later inherits the
    // block. The sidecar does not: std resets the signal mask in the child.
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.thread_block()
        .map_err(|e| format!("cannot block signals: {e}"))?;

    let fuse: OwnedFd =
        nix::fcntl::open("/dev/fuse", OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| format!("cannot open /dev/fuse: {e}"))?;
    let data = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions",
        fuse.as_raw_fd()
    );
    nix::mount::mount(
        Some(args.source.as_str()),
        &mountpoint,
        Some("fuse"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(data.as_str()),
    )
    .map_err(|e| format!("cannot mount {}: {e}", mountpoint.display()))?;

    let result = serve(&args, &mountpoint, fuse, last_cap, set);
    let unmounted = unmount(&mountpoint);
    let (line, ok) = result.inspect_err(|_| {
        if let Err(e) = &unmounted {
            eprintln!("fake-node-driver: {e}");
        }
    })?;
    println!("{line}");
    let _ = std::io::stdout().flush();
    unmounted?;
    Ok(ok)
}

/// Spawns the sidecar on the mounted connection, waits for ready and for the stop, stops the
/// sidecar; returns the status line and whether the sidecar exited 0. `fuse` is closed once
/// the sidecar holds its copy.
fn serve(
    args: &Args,
    mountpoint: &std::path::Path,
    fuse: OwnedFd,
    last_cap: i32,
    set: nix::sys::signal::SigSet,
) -> Result<(String, bool), String> {
    let stdout_for_sidecar = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| format!("dup stderr: {e}"))?;
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::from(stdout_for_sidecar));
    let (fuse_raw, uid, gid) = (fuse.as_raw_fd(), args.uid, args.gid);
    // SAFETY: the closure only makes async-signal-safe syscalls (see sidecar_pre_exec).
    unsafe {
        cmd.pre_exec(move || sidecar_pre_exec(fuse_raw, uid, gid, last_cap));
    }
    let spawned_at = Instant::now();
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", args.command[0]))?;
    drop(fuse);
    let pid = Pid::from_raw(child.id() as i32);
    // Reaped below with waitpid; std's Child does not wait or kill on drop.
    drop(child);

    let (tx, rx) = mpsc::channel::<Event>();
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            loop {
                match set.wait() {
                    Ok(Signal::SIGINT) => {
                        let _ = tx.send(Event::Stop("SIGINT"));
                    }
                    Ok(_) => {
                        let _ = tx.send(Event::Stop("SIGTERM"));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
    }
    {
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            let mut stdin = std::io::stdin().lock();
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = tx.send(Event::Stop("stdin EOF"));
        });
    }
    {
        let tx = tx.clone();
        // Waits without reaping (WNOWAIT), so the PID cannot be reused before the main loop
        // has decided whether to signal it.
        std::thread::spawn(move || {
            loop {
                match waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
                    Ok(_) => break,
                    Err(Errno::EINTR) => {}
                    Err(_) => break,
                }
            }
            let _ = tx.send(Event::Exited(Instant::now()));
        });
    }
    {
        let tx = tx.clone();
        let mnt = mountpoint.to_path_buf();
        std::thread::spawn(move || {
            let r = nix::sys::statvfs::statvfs(&mnt).map(|_| ());
            let _ = tx.send(Event::Ready(r));
        });
    }

    let mut ready = false;
    let mut stop_reason: Option<&'static str> = None;
    let mut exited: Option<Instant> = None;
    let ready_deadline = spawned_at + args.ready_timeout;
    while !ready && stop_reason.is_none() && exited.is_none() {
        let left = ready_deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(Event::Ready(Ok(()))) => {
                ready = true;
                println!("ready");
                let _ = std::io::stdout().flush();
            }
            Ok(Event::Ready(Err(e))) => {
                eprintln!("fake-node-driver: statfs {}: {e}", mountpoint.display());
                stop_reason = Some("not ready");
            }
            Ok(Event::Stop(why)) => stop_reason = Some(why),
            Ok(Event::Exited(t)) => exited = Some(t),
            Err(_) => {
                eprintln!(
                    "fake-node-driver: the mount did not answer statfs within {:?}",
                    args.ready_timeout
                );
                stop_reason = Some("not ready");
            }
        }
    }
    while stop_reason.is_none() && exited.is_none() {
        match rx.recv() {
            Ok(Event::Stop(why)) => stop_reason = Some(why),
            Ok(Event::Exited(t)) => exited = Some(t),
            Ok(Event::Ready(_)) => {}
            Err(_) => return Err("event channel closed".into()),
        }
    }

    let mut stopped_at = None;
    if exited.is_none() {
        let why = stop_reason.unwrap_or("stop");
        eprintln!("fake-node-driver: {why}: SIGTERM to the sidecar (pid {pid})");
        let t0 = Instant::now();
        stopped_at = Some(t0);
        let _ = kill(pid, Signal::SIGTERM);
        let kill_at = t0 + args.kill_after;
        while exited.is_none() {
            let left = kill_at.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Event::Exited(t)) => exited = Some(t),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err("event channel closed".into());
                }
            }
        }
        if exited.is_none() {
            eprintln!(
                "fake-node-driver: the sidecar did not exit within {:?}: SIGKILL",
                args.kill_after
            );
            println!("sigkill sent");
            let _ = std::io::stdout().flush();
            let _ = kill(pid, Signal::SIGKILL);
            while exited.is_none() {
                match rx.recv() {
                    Ok(Event::Exited(t)) => exited = Some(t),
                    Ok(_) => {}
                    Err(_) => return Err("event channel closed".into()),
                }
            }
        }
    }
    let status = loop {
        match waitpid(pid, None) {
            Err(Errno::EINTR) => {}
            Ok(s) => break s,
            Err(e) => return Err(format!("waitpid {pid}: {e}")),
        }
    };
    let ms = match (stopped_at, exited) {
        (Some(t0), Some(t)) => {
            i64::try_from(t.saturating_duration_since(t0).as_millis()).unwrap_or(i64::MAX)
        }
        _ => -1,
    };
    let (what, ok) = describe(status);
    Ok((format!("sidecar exit: {what} after {ms} ms"), ok))
}

/// Entry point: usage errors exit 2 (clap), failures print one line and exit 1.
fn main() -> ExitCode {
    ensure_std_fds();
    let args = Args::parse();
    match run(args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fake-node-driver: {e}");
            ExitCode::FAILURE
        }
    }
}

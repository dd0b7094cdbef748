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
//!
//! # CSI mode: only the node driver, for GKE's real sidecar mounter
//!
//! ```text
//! fake-node-driver --mountpoint M --volume-base-path B [--volume-name VOL] [--bucket NAME]
//!                  [--mount-option OPT]... [--stop native|exit-file] [--grace-period 30s]
//!                  -- gcs-fuse-csi-driver-sidecar-mounter [--v=5] --gcsfuse-path=PATH
//! ```
//!
//! `--volume-base-path` selects this mode. The process plays the CSI node driver (and the
//! kubelet's stop); the command is the real sidecar mounter (gcs-fuse-csi-driver v1.24.4,
//! `cmd/sidecar_mounter`), which starts gcsfuse (or drainfs as its drop-in) itself:
//! 1. Prepares the sidecar's directories, owned by `--uid`/`--gid`: `B` and `B/VOL` (socket,
//!    error file, exit file), and the sidecar's hard-coded `/gcsfuse-tmp/.volumes/VOL` (its
//!    `config.yaml`, a stale one removed) and `/gcsfuse-buffer/.volumes` (its `temp-dir`).
//! 2. Mounts `M` with `fd=N` as above, then listens on the unix stream socket `B/VOL/socket`
//!    **before** the sidecar starts (the sidecar globs `B/*/socket` once).
//! 3. Starts the command with `--volume-base-path=B` appended, as `--uid`/`--gid` with no
//!    capabilities and `no_new_privs` (as in the other mode), stdout a pipe owned by that uid
//!    (gcsfuse reopens `/dev/fd/1`) and stderr a pipe, both copied to this process's stderr; env `NATIVE_SIDECAR=TRUE` with `--stop native`,
//!    no `NATIVE_SIDECAR` with `--stop exit-file`. The sidecar does not get the fd as fd 3.
//! 4. When the sidecar connects: one `sendmsg` with the JSON mount config
//!    (`{"bucketName","volumeName","options"}`, under the sidecar's 5000-byte buffer) and the
//!    connection fd as SCM_RIGHTS; then closes its own copy of the fd and the listener.
//! 5. Prints `ready` once `statfs(M)` answers.
//! 6. On SIGTERM, SIGINT or stdin EOF, stops the sidecar the GKE way: SIGTERM to its PID
//!    (`--stop native`), or creates `B/exit` (`--stop exit-file`; the sidecar polls every 5 s).
//!    If the sidecar has not exited `--grace-period` later (the pod's
//!    terminationGracePeriodSeconds), SIGKILL.
//! 7. Unmounts `M` and removes the sidecar's directories under `/gcsfuse-tmp/.volumes/VOL` and
//!    `/gcsfuse-buffer/.volumes/VOL`.
//!
//! stdout lines: `ready`, `sigkill sent` as above; then one `error file: LINE` per line of
//! `B/VOL/error` (what the sidecar turns into mount errors); `gcsfuse exit: WHAT`, what the
//! sidecar said about its child (`0` for "exited normally", `signal SIGKILL` for "was killed",
//! `signal SIGTERM` for "was terminated", the error file's `gcsfuse exited with error: ...`
//! text otherwise, `unknown` if it said nothing); last `sidecar exit: <code|signal NAME> after
//! <ms> ms`, `<ms>` counted from the stop (the SIGTERM or the exit file's creation).

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

    /// CSI mode: the sidecar mounter's `--volume-base-path` (socket, error and exit files);
    /// the command is the real sidecar mounter, which gets the connection over the socket.
    #[arg(long, value_name = "DIR")]
    volume_base_path: Option<PathBuf>,

    /// CSI mode: the volume's name (the socket's directory under the base path).
    #[arg(
        long,
        value_name = "NAME",
        default_value = "gcs-vol",
        requires = "volume_base_path"
    )]
    volume_name: String,

    /// CSI mode: the JSON's `bucketName`.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "drainfs-test",
        requires = "volume_base_path"
    )]
    bucket: String,

    /// CSI mode: one entry of the JSON's `options` (the volume's mountOptions), repeatable.
    #[arg(
        long = "mount-option",
        value_name = "OPT",
        requires = "volume_base_path"
    )]
    mount_options: Vec<String>,

    /// CSI mode: how the workload's end reaches the sidecar.
    #[arg(long, value_enum, default_value_t = CsiStop::Native, requires = "volume_base_path")]
    stop: CsiStop,

    /// CSI mode: the pod's termination grace period: SIGKILL to the sidecar this long after
    /// the stop.
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = humantime::parse_duration, requires = "volume_base_path")]
    grace_period: Duration,

    /// The sidecar command and its arguments (the kernel connection is its fd 3; in CSI mode,
    /// the sidecar mounter, which receives it over the socket).
    #[arg(last = true, required = true, value_name = "SIDECAR_COMMAND")]
    command: Vec<OsString>,
}

/// How the CSI-mode stop reaches the sidecar mounter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum CsiStop {
    /// A native sidecar: `NATIVE_SIDECAR=TRUE`, stopped by SIGTERM.
    Native,
    /// A regular container: no `NATIVE_SIDECAR`, stopped by the exit file `<base>/exit`.
    ExitFile,
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

// ------------------------------------------------------------------------------------------
// CSI mode: the node driver's part only, for the real sidecar mounter.

/// The sidecar mounter's hard-coded directory for `config.yaml` (webhook
/// `SidecarContainerTmpVolumeMountPath` + `/.volumes`).
const SIDECAR_TMP_VOLUMES: &str = "/gcsfuse-tmp/.volumes";
/// The sidecar mounter's hard-coded parent of `temp-dir` (`SidecarContainerBufferVolumeMountPath`
/// + `/.volumes`).
const SIDECAR_BUFFER_VOLUMES: &str = "/gcsfuse-buffer/.volumes";
/// The sidecar mounter's receive buffer for the mount config (`util.RecvMsg`).
const SIDECAR_MSG_MAX: usize = 5000;

/// Creates `dir` (and its parents, mode 0755) and makes it owned by `uid`/`gid`.
fn owned_dir(dir: &std::path::Path, uid: u32, gid: u32) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
    std::os::unix::fs::chown(dir, Some(uid), Some(gid))
        .map_err(|e| format!("chown {}: {e}", dir.display()))
}

/// Removes `path` if it exists.
fn remove_stale(path: &std::path::Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("rm {}: {e}", path.display())),
    }
}

/// Runs in the forked sidecar mounter before `exec`: drops to `uid`/`gid` with no capabilities
/// and `no_new_privs`, death signal SIGKILL. Only async-signal-safe syscalls, no allocation.
fn csi_sidecar_pre_exec(uid: u32, gid: u32, last_cap: i32) -> std::io::Result<()> {
    // SAFETY: plain syscalls on integers and on stack structs that live for each call.
    unsafe {
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
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0))?;
    }
    Ok(())
}

/// The JSON mount config the CSI driver sends (`bucketName`, `volumeName`, `options`).
fn csi_mount_config(args: &Args) -> Result<Vec<u8>, String> {
    let msg = serde_json::json!({
        "bucketName": args.bucket,
        "volumeName": args.volume_name,
        "options": args.mount_options,
    })
    .to_string()
    .into_bytes();
    if msg.len() >= SIDECAR_MSG_MAX {
        return Err(format!(
            "the mount config is {} bytes; the sidecar reads at most {SIDECAR_MSG_MAX}",
            msg.len()
        ));
    }
    Ok(msg)
}

/// Sends `msg` and `fd` (SCM_RIGHTS) in one `sendmsg` on `conn`.
fn send_config(
    conn: &std::os::unix::net::UnixStream,
    msg: &[u8],
    fd: &OwnedFd,
) -> Result<(), String> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    let iov = [std::io::IoSlice::new(msg)];
    let fds = [fd.as_raw_fd()];
    let cmsg = [ControlMessage::ScmRights(&fds)];
    let n = sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None)
        .map_err(|e| format!("sendmsg to the sidecar: {e}"))?;
    if n != msg.len() {
        return Err(format!("sendmsg sent {n} of {} bytes", msg.len()));
    }
    Ok(())
}

/// What the sidecar mounter said about gcsfuse's end: from its log lines
/// (`waitForGcsfuseExit`) and the error file.
fn gcsfuse_exit(sidecar_log: &[String], error_lines: &[String]) -> String {
    if let Some(l) = error_lines
        .iter()
        .find_map(|l| l.split_once("gcsfuse exited with error: ").map(|(_, r)| r))
    {
        return l.trim().to_string();
    }
    for l in sidecar_log.iter().rev() {
        if l.contains("gcsfuse exited normally") {
            return "0".into();
        }
        if l.contains("gcsfuse was killed") {
            return "signal SIGKILL".into();
        }
        if l.contains("gcsfuse was terminated") {
            return "signal SIGTERM".into();
        }
    }
    "unknown".into()
}

/// CSI mode: prepares the directories, mounts, serves the config to the sidecar mounter, stops
/// it the GKE way, reports, unmounts and cleans up; returns whether the sidecar exited 0.
fn run_csi(args: Args) -> Result<bool, String> {
    let base = args.volume_base_path.clone().expect("CSI mode");
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
    let vol = args.volume_name.clone();
    if vol.is_empty() || vol.contains('/') || vol.starts_with('.') {
        return Err(format!("bad volume name {vol:?}"));
    }
    let msg = csi_mount_config(&args)?;
    let last_cap = cap_last_cap()?;
    let (uid, gid) = (args.uid, args.gid);
    let vol_dir = base.join(&vol);
    owned_dir(&base, uid, gid)?;
    owned_dir(&vol_dir, uid, gid)?;
    for f in ["socket", "error"] {
        remove_stale(&vol_dir.join(f))?;
    }
    remove_stale(&base.join("exit"))?;
    let tmp_vol = std::path::Path::new(SIDECAR_TMP_VOLUMES).join(&vol);
    let buffer_vol = std::path::Path::new(SIDECAR_BUFFER_VOLUMES).join(&vol);
    owned_dir(&tmp_vol, uid, gid)?;
    remove_stale(&tmp_vol.join("config.yaml"))?;
    owned_dir(std::path::Path::new(SIDECAR_BUFFER_VOLUMES), uid, gid)?;

    let mut set = nix::sys::signal::SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    set.thread_block()
        .map_err(|e| format!("cannot block signals: {e}"))?;

    let fuse: OwnedFd =
        nix::fcntl::open("/dev/fuse", OFlag::O_RDWR | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| format!("cannot open /dev/fuse: {e}"))?;
    // The CSI driver's mount options (csi_mounter.go), with the fd number of this process.
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

    let result = serve_csi(&args, &base, &mountpoint, fuse, &msg, last_cap, set);
    let unmounted = unmount(&mountpoint);
    let _ = std::fs::remove_dir_all(&tmp_vol);
    let _ = std::fs::remove_dir_all(&buffer_vol);
    let (lines, ok) = result.inspect_err(|_| {
        if let Err(e) = &unmounted {
            eprintln!("fake-node-driver: {e}");
        }
    })?;
    for l in lines {
        println!("{l}");
    }
    let _ = std::io::stdout().flush();
    unmounted?;
    Ok(ok)
}

/// CSI mode after the mount: listens, starts the sidecar mounter, hands it the config and the
/// fd, waits for ready and the stop, stops it; returns the final stdout lines (error file,
/// gcsfuse's end, the sidecar's exit) and whether the sidecar exited 0.
fn serve_csi(
    args: &Args,
    base: &std::path::Path,
    mountpoint: &std::path::Path,
    fuse: OwnedFd,
    msg: &[u8],
    last_cap: i32,
    set: nix::sys::signal::SigSet,
) -> Result<(Vec<String>, bool), String> {
    use std::os::unix::fs::PermissionsExt;
    let vol_dir = base.join(&args.volume_name);
    let sock = vol_dir.join("socket");
    let listener = std::os::unix::net::UnixListener::bind(&sock)
        .map_err(|e| format!("listen on {}: {e}", sock.display()))?;
    std::os::unix::fs::chown(&sock, Some(args.uid), Some(args.gid))
        .map_err(|e| format!("chown {}: {e}", sock.display()))?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("chmod {}: {e}", sock.display()))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("listener: {e}"))?;

    // The sidecar's stdout: a pipe owned by its uid, copied to this process's stderr. gcsfuse
    // reopens it (`logging: file-path: /dev/fd/1` in the sidecar's config.yaml), which needs
    // write permission on the pipe itself, as a container's stdout gives.
    let (out_r, out_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))?;
    for end in [&out_r, &out_w] {
        nix::unistd::fchown(
            end,
            Some(nix::unistd::Uid::from_raw(args.uid)),
            Some(nix::unistd::Gid::from_raw(args.gid)),
        )
        .map_err(|e| format!("fchown on the stdout pipe: {e}"))?;
    }
    std::thread::spawn(move || {
        let mut r = std::fs::File::from(out_r);
        let _ = std::io::copy(&mut r, &mut std::io::stderr());
    });
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .arg(format!("--volume-base-path={}", base.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::from(out_w))
        .stderr(Stdio::piped());
    match args.stop {
        CsiStop::Native => cmd.env("NATIVE_SIDECAR", "TRUE"),
        CsiStop::ExitFile => cmd.env_remove("NATIVE_SIDECAR"),
    };
    let (uid, gid) = (args.uid, args.gid);
    // SAFETY: the closure only makes async-signal-safe syscalls (see csi_sidecar_pre_exec).
    unsafe {
        cmd.pre_exec(move || csi_sidecar_pre_exec(uid, gid, last_cap));
    }
    let spawned_at = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", args.command[0]))?;
    let pid = Pid::from_raw(child.id() as i32);
    let sidecar_log = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let log_done = {
        let stderr = child.stderr.take().expect("piped");
        let sink = sidecar_log.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                eprintln!("{line}");
                sink.lock().unwrap().push(line);
            }
        })
    };
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

    // The hand-off: the sidecar sleeps 1.5 s, then connects once.
    let ready_deadline = spawned_at + args.ready_timeout;
    let mut fuse = Some(fuse);
    let mut stop_reason: Option<&'static str> = None;
    let mut exited: Option<Instant> = None;
    while fuse.is_some() && stop_reason.is_none() && exited.is_none() {
        match listener.accept() {
            Ok((conn, _)) => {
                let fd = fuse.take().expect("checked");
                let sent = conn
                    .set_nonblocking(false)
                    .map_err(|e| format!("socket: {e}"))
                    .and_then(|()| send_config(&conn, msg, &fd));
                drop(fd);
                drop(conn);
                if let Err(e) = sent {
                    eprintln!("fake-node-driver: {e}");
                    stop_reason = Some("hand-off failed");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= ready_deadline {
                    eprintln!(
                        "fake-node-driver: the sidecar did not connect to {} within {:?}",
                        sock.display(),
                        args.ready_timeout
                    );
                    stop_reason = Some("not ready");
                }
                match rx.recv_timeout(Duration::from_millis(20)) {
                    Ok(Event::Stop(why)) => stop_reason = Some(why),
                    Ok(Event::Exited(t)) => exited = Some(t),
                    Ok(Event::Ready(_)) | Err(_) => {}
                }
            }
            Err(e) => return Err(format!("accept on {}: {e}", sock.display())),
        }
    }
    drop(fuse);
    drop(listener);
    let _ = std::fs::remove_file(&sock);

    if stop_reason.is_none() && exited.is_none() {
        let tx = tx.clone();
        let mnt = mountpoint.to_path_buf();
        std::thread::spawn(move || {
            let r = nix::sys::statvfs::statvfs(&mnt).map(|_| ());
            let _ = tx.send(Event::Ready(r));
        });
        let mut ready = false;
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
        let t0 = match args.stop {
            CsiStop::Native => {
                eprintln!("fake-node-driver: {why}: SIGTERM to the sidecar mounter (pid {pid})");
                let t0 = Instant::now();
                let _ = kill(pid, Signal::SIGTERM);
                t0
            }
            CsiStop::ExitFile => {
                let exit = base.join("exit");
                let tmp = base.join(".exit.tmp");
                eprintln!("fake-node-driver: {why}: creating {}", exit.display());
                let t0 = Instant::now();
                std::fs::write(&tmp, b"")
                    .and_then(|()| std::fs::rename(&tmp, &exit))
                    .map_err(|e| format!("create {}: {e}", exit.display()))?;
                t0
            }
        };
        stopped_at = Some(t0);
        let kill_at = t0 + args.grace_period;
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
                "fake-node-driver: the sidecar mounter did not exit within {:?}: SIGKILL",
                args.grace_period
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
    // The log pipe ends when the sidecar and every process holding its stderr (gcsfuse) have
    // exited; a child it left behind must not hold the report back.
    let log_deadline = Instant::now() + Duration::from_secs(2);
    while !log_done.is_finished() && Instant::now() < log_deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let ms = match (stopped_at, exited) {
        (Some(t0), Some(t)) => {
            i64::try_from(t.saturating_duration_since(t0).as_millis()).unwrap_or(i64::MAX)
        }
        _ => -1,
    };
    let error_lines: Vec<String> = std::fs::read_to_string(vol_dir.join("error"))
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    let mut out: Vec<String> = error_lines
        .iter()
        .map(|l| format!("error file: {l}"))
        .collect();
    let log = sidecar_log.lock().unwrap().clone();
    out.push(format!(
        "gcsfuse exit: {}",
        gcsfuse_exit(&log, &error_lines)
    ));
    let (what, ok) = describe(status);
    out.push(format!("sidecar exit: {what} after {ms} ms"));
    Ok((out, ok))
}

/// Entry point: usage errors exit 2 (clap), failures print one line and exit 1.
fn main() -> ExitCode {
    ensure_std_fds();
    let args = Args::parse();
    let result = if args.volume_base_path.is_some() {
        run_csi(args)
    } else {
        run(args)
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fake-node-driver: {e}");
            ExitCode::FAILURE
        }
    }
}

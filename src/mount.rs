//! Mount-table facts and mount/unmount actions: pre-flight checks of `run`, finding mounts in
//! `/proc/self/mountinfo`, unmounting with `fusermount3` or `umount2`, detecting dead FUSE
//! mounts ("Transport endpoint is not connected"), and whether drainfs holds CAP_SYS_ADMIN
//! ([`has_cap_sys_admin`]: mount(2) itself instead of `fusermount3`, and kernel passthrough's
//! backing files).
//!
//! Mounts are identified by their mount ID, never by path: in Kubernetes every `volumeMount` is
//! a bind mount, so the mountpoint and the lower are usually mount points of the volume itself,
//! and a FUSE mount (drainfs's own, the lower's) is stacked on top of that bind mount. `umount2`
//! and `fusermount3 -u` act on the topmost mount at a path, so every removal first checks that
//! the topmost mount at the path is still the one drainfs means ([`unmount_mount`]).

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::procs;

/// One line of `/proc/self/mountinfo` (proc(5)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Unique mount ID (field 1), stable for the life of the mount in this mount namespace.
    pub id: u64,
    /// Mount ID of the parent mount (field 2); for a mount stacked on another at the same
    /// mount point, the one underneath.
    pub parent_id: u64,
    /// `major:minor` of the mounted filesystem (field 3); for FUSE the minor is the connection
    /// number under `/sys/fs/fuse/connections/`.
    pub devno: String,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Filesystem type (`fuse`, `fuse.drainfs`, `tmpfs`...).
    pub fstype: String,
    /// Mount source.
    pub source: String,
}

impl MountInfo {
    /// Whether this is a FUSE mount (`fuse`, `fuse.<subtype>`, `fuseblk`, `fuseblk.<subtype>`).
    pub fn is_fuse(&self) -> bool {
        let base = self.fstype.split('.').next().unwrap_or("");
        base == "fuse" || base == "fuseblk"
    }

    /// Whether `t` is this same mount. A mount ID is handed to a new mount once its mount is
    /// gone (the kernel takes the lowest free one), so the device number and the mount point
    /// must match too.
    pub fn same_mount(&self, t: &MountInfo) -> bool {
        t.id == self.id && t.devno == self.devno && t.mount_point == self.mount_point
    }

    /// The minor device number (`major:minor` field): for a FUSE mount, its connection number
    /// in `/sys/fs/fuse/connections/`.
    pub fn connection(&self) -> Option<u32> {
        self.devno.split(':').nth(1)?.parse().ok()
    }
}

fn unescape(field: &str) -> PathBuf {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

/// Parses mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.split(" - ");
            let left: Vec<&str> = parts.next()?.split(' ').collect();
            let right: Vec<&str> = parts.next()?.split(' ').collect();
            Some(MountInfo {
                id: left.first()?.parse().ok()?,
                parent_id: left.get(1)?.parse().ok()?,
                devno: (*left.get(2)?).to_string(),
                mount_point: unescape(left.get(4)?),
                fstype: (*right.first()?).to_string(),
                source: unescape(right.get(1)?).to_string_lossy().into_owned(),
            })
        })
        .collect()
}

/// All mounts of this process's mount namespace.
pub fn mounts() -> Vec<MountInfo> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| parse_mountinfo(&t))
        .unwrap_or_default()
}

/// The topmost mount whose mount point is exactly `path` (which must be absolute and
/// canonical), if any: of the mounts at `path`, the one no other mount at `path` is stacked on.
pub fn mount_at(path: &Path) -> Option<MountInfo> {
    topmost(&mounts(), path)
}

/// [`mount_at`] over a given mount table.
fn topmost(table: &[MountInfo], path: &Path) -> Option<MountInfo> {
    let here: Vec<&MountInfo> = table.iter().filter(|m| m.mount_point == path).collect();
    here.iter()
        .rev()
        .find(|m| !here.iter().any(|o| o.parent_id == m.id && o.id != m.id))
        .map(|m| (*m).clone())
}

/// The mount that holds `path` (absolute, canonical): the topmost mount at the longest mount
/// point that is `path` or one of its ancestors. `None` only if mountinfo cannot be read.
pub fn mount_containing(path: &Path) -> Option<MountInfo> {
    let table = mounts();
    path.ancestors().find_map(|p| topmost(&table, p))
}

/// `m` (a line read earlier) as it is in this mount namespace's table now, if it is still
/// mounted ([`MountInfo::same_mount`]).
pub fn still_mounted(m: &MountInfo) -> Option<MountInfo> {
    mounts().into_iter().find(|t| m.same_mount(t))
}

/// The ID of the topmost mount at `path` now (`None`: `path` is not a mount point). Taken
/// before drainfs starts the lower (or mounts itself), it is the baseline that
/// [`fuse_mount_above`] compares with: the volume's own bind mount, or nothing.
pub fn baseline(path: &Path) -> Option<u64> {
    mount_at(&absolute(path)).map(|m| m.id)
}

/// The FUSE mount on top at `path` that is not `baseline`: the mount a lower (or drainfs)
/// stacked there after the baseline was taken. `None` when the topmost mount at `path` is the
/// baseline, is not FUSE (a volume's bind mount), or there is no mount at `path`.
pub fn fuse_mount_above(path: &Path, baseline: Option<u64>) -> Option<MountInfo> {
    fuse_above(&mounts(), &absolute(path), baseline)
}

fn fuse_above(table: &[MountInfo], path: &Path, baseline: Option<u64>) -> Option<MountInfo> {
    topmost(table, path).filter(|m| m.is_fuse() && Some(m.id) != baseline)
}

/// Canonical absolute form of a path that may be a dead mount (where `canonicalize` fails
/// with ENOTCONN): canonicalize the parent and append the last component.
pub fn absolute(path: &Path) -> PathBuf {
    if let Ok(p) = path.canonicalize() {
        return p;
    }
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .unwrap_or_else(|_| PathBuf::from("/"))
            .join(path)
    };
    match (abs.parent(), abs.file_name()) {
        (Some(parent), Some(name)) => parent
            .canonicalize()
            .unwrap_or_else(|_| parent.to_path_buf())
            .join(name),
        _ => abs,
    }
}

/// Whether `path` is a FUSE mount whose daemon is gone: `statfs` fails with ENOTCONN or
/// ECONNABORTED.
pub fn is_dead(path: &Path) -> bool {
    // statfs, not stat: the kernel answers stat from its attribute cache for up to the TTL
    // after the daemon died, while STATFS always goes to the connection.
    match nix::sys::statfs::statfs(path) {
        Err(e) => matches!(
            e,
            nix::errno::Errno::ENOTCONN | nix::errno::Errno::ECONNABORTED
        ),
        Ok(_) => false,
    }
}

/// A failed pre-flight check of `run`: one readable line, exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Preflight(pub String);

/// Checks what `run` needs before anything is started: the lower and the mountpoint are
/// existing directories, neither is inside the other, `/dev/fuse` opens read-write,
/// `fusermount3` is on PATH (unless drainfs has CAP_SYS_ADMIN, and mounts and unmounts with
/// the syscalls), and what is mounted at them is acceptable:
/// - a mount of a non-FUSE filesystem (a Kubernetes volume is a bind mount of ext4, xfs, tmpfs,
///   overlay...) is a volume and is accepted ([`check_existing_mount`]);
/// - a dead FUSE mount (a killed predecessor) is repaired first;
/// - a live FUSE mount at the mountpoint is refused (another drainfs or FUSE daemon serves
///   there), and so is one at the lower when drainfs is to start the lower itself
///   (`spawns_lower`); an adopted lower is a live FUSE mount by design.
///
/// # Errors
/// The first failed check, as one line naming the path and the fix.
pub fn preflight(
    lower: &Path,
    mountpoint: &Path,
    spawns_lower: bool,
) -> Result<(PathBuf, PathBuf), Preflight> {
    // A dead FUSE mount left by a killed predecessor (a restarted sidecar cannot count on init
    // containers to run `drainfs cleanup` again) is repaired at the mountpoint, and at the
    // lower when drainfs is about to mount the lower itself.
    repair_if_dead(mountpoint, "--mountpoint");
    if spawns_lower {
        repair_if_dead(lower, "--lower");
    }
    let lower_abs = existing_dir(lower, "--lower")?;
    let mp_abs = existing_dir(mountpoint, "--mountpoint")?;
    if let Some(m) = mount_at(&mp_abs) {
        check_existing_mount(&m, "--mountpoint", mountpoint)?;
    }
    if spawns_lower && let Some(m) = mount_at(&lower_abs) {
        check_existing_mount(&m, "--lower", lower)?;
    }
    if mp_abs.starts_with(&lower_abs) {
        return Err(Preflight(format!(
            "--mountpoint {} is inside --lower {}: drainfs would serve itself",
            mountpoint.display(),
            lower.display()
        )));
    }
    if lower_abs.starts_with(&mp_abs) {
        return Err(Preflight(format!(
            "--lower {} is inside --mountpoint {}: the lower would be hidden by drainfs's own mount",
            lower.display(),
            mountpoint.display()
        )));
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        let fix = match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => {
                "run drainfs as root, or make /dev/fuse readable and writable by its user"
            }
            Some(libc::ENOENT) | Some(libc::ENXIO) | Some(libc::ENODEV) => {
                "load the fuse module, or give the container the /dev/fuse device"
            }
            _ => "check the device and the container's device permissions",
        };
        return Err(Preflight(format!("/dev/fuse is unusable ({e}); {fix}")));
    }
    // With CAP_SYS_ADMIN drainfs mounts with mount(2) and unmounts with umount2: the helper is
    // needed only without it.
    if which("fusermount3").is_none() && !has_cap_sys_admin() {
        return Err(Preflight(
            "fusermount3 not found on PATH; install fuse3 (apt-get install fuse3)".to_string(),
        ));
    }
    Ok((lower_abs, mp_abs))
}

/// Whether the calling thread has CAP_SYS_ADMIN in its effective set: with it drainfs mounts
/// with mount(2) and unmounts with umount2 (no `fusermount3` needed), and can register
/// passthrough backing files (`FUSE_DEV_IOC_BACKING_OPEN`). False when `capget` fails.
pub fn has_cap_sys_admin() -> bool {
    caps::has_cap(
        None,
        caps::CapSet::Effective,
        caps::Capability::CAP_SYS_ADMIN,
    )
    .unwrap_or(false)
}

/// Whether the (live) topmost mount `m` at a `flag` path is acceptable: a non-FUSE mount is a
/// volume (accepted, logged); a FUSE mount is refused.
///
/// # Errors
/// For a FUSE mount: one line naming the flag, the path, the mount and the fix.
pub fn check_existing_mount(m: &MountInfo, flag: &str, shown: &Path) -> Result<(), Preflight> {
    if m.is_fuse() {
        return Err(Preflight(format!(
            "{flag} {}: already a live FUSE mount ({} from {}); is another drainfs or FUSE \
             daemon serving there? Stop it, or remove it with `drainfs cleanup --force {}`",
            shown.display(),
            m.fstype,
            m.source,
            shown.display()
        )));
    }
    tracing::info!(
        path = %shown.display(),
        fstype = %m.fstype,
        source = %m.source,
        mount_id = m.id,
        "{flag} is a mount point of a non-FUSE filesystem (a volume): accepted"
    );
    Ok(())
}

/// `path` as an absolute path if it is an existing directory; otherwise one line naming the
/// flag, the path and the fix.
fn existing_dir(path: &Path, flag: &str) -> Result<PathBuf, Preflight> {
    let shown = path.display();
    // A FUSE mount there whose daemon is hung would never answer the stat.
    let p = path.to_path_buf();
    let Some(md) = probe::within(probe::PROBE_LIMIT, move || std::fs::metadata(p)) else {
        return Err(Preflight(format!(
            "{flag} {shown}: does not answer within {:?} (a FUSE mount whose daemon is hung?); \
             stop that daemon, or remove the mount with `drainfs cleanup --force {shown}`",
            probe::PROBE_LIMIT
        )));
    };
    match md {
        Ok(m) if m.is_dir() => Ok(absolute(path)),
        Ok(_) => Err(Preflight(format!("{flag} {shown}: not a directory"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Preflight(format!(
            "{flag} {shown}: no such directory (create it first)"
        ))),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTCONN) | Some(libc::ECONNABORTED)
            ) =>
        {
            Err(Preflight(format!(
                "{flag} {shown}: dead FUSE mount left by a killed process; repair it with `drainfs cleanup {shown}`"
            )))
        }
        Err(e) => Err(Preflight(format!("{flag} {shown}: {e}"))),
    }
}

/// Aborts and detaches dead FUSE mounts stacked at `path` (topmost first), logging what it did.
/// Stops at the first mount that is alive or not FUSE (a volume's bind mount is never touched).
pub fn repair_if_dead(path: &Path, what: &str) {
    let abs = absolute(path);
    for _ in 0..8 {
        let Some(m) = mount_at(&abs) else { return };
        if !m.is_fuse() {
            return;
        }
        // Only a mount that answers ENOTCONN is dead; one that does not answer at all has a
        // live (hung) daemon and is left alone (the checks that follow refuse it).
        match probe::statfs_within(&abs, probe::PROBE_LIMIT) {
            probe::Answer::Dead => {}
            probe::Answer::Alive => return,
            probe::Answer::Silent => {
                tracing::warn!(path = %abs.display(), fstype = %m.fstype, mount_id = m.id, "{what} is a FUSE mount that does not answer: not touching it");
                return;
            }
        }
        tracing::warn!(path = %abs.display(), fstype = %m.fstype, mount_id = m.id, "{what} is a dead FUSE mount left by a killed process: detaching it");
        abort_mount(&m);
        match unmount_mount(&m, true, Duration::from_secs(5)) {
            Ok(Unmounted::Lazy | Unmounted::Clean | Unmounted::NotMounted) => {}
            Ok(other) => {
                tracing::error!(path = %abs.display(), result = ?other, "cannot detach the dead mount");
                return;
            }
            Err(e) => {
                tracing::error!(path = %abs.display(), error = %e, "cannot detach the dead mount");
                return;
            }
        }
    }
}

/// The first `name` on PATH that is an executable file.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| {
                m.is_file()
                    && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
            })
        })
}

/// How an unmount went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmounted {
    /// The mount is gone.
    Clean,
    /// The mount was busy and was detached lazily (open files keep it alive).
    Lazy,
    /// Nothing was mounted there (or the mount with that ID is already gone).
    NotMounted,
    /// The mount is still there but another mount is stacked on top of it at the same path:
    /// nothing was done, since `umount2` would remove the one on top.
    Covered {
        /// The mount that was meant.
        id: u64,
        /// The mount on top of it.
        top: MountInfo,
    },
}

/// A failed unmount.
#[derive(Debug, thiserror::Error)]
pub enum UnmountError {
    /// The mount is still there after `fusermount3 -u` and `umount2`.
    #[error("unmount {} (mount {id}) failed: {errno}; fusermount3: {helper}", path.display())]
    Failed {
        /// Where.
        path: PathBuf,
        /// The mount's ID.
        id: u64,
        /// `umount2`'s error (EBUSY when files are open on it, EPERM without CAP_SYS_ADMIN).
        errno: std::io::Error,
        /// `fusermount3`'s stderr, or why it could not run.
        helper: String,
    },
    /// The mount point contains a NUL byte.
    #[error("unmount {}: the path contains a NUL byte", path.display())]
    BadPath {
        /// Where.
        path: PathBuf,
    },
}

/// Unmounts the topmost mount at `path` (see [`unmount_mount`]); `NotMounted` when nothing is
/// mounted there.
///
/// # Errors
/// As [`unmount_mount`].
pub fn unmount(path: &Path, lazy: bool, timeout: Duration) -> Result<Unmounted, UnmountError> {
    match mount_at(&absolute(path)) {
        Some(m) => unmount_mount(&m, lazy, timeout),
        None => Ok(Unmounted::NotMounted),
    }
}

/// Unmounts the mount `m`, identified by its mount ID: only when it is still the topmost
/// mount at its mount point (checked before each action, since `umount2` and
/// `fusermount3 -u` act on whatever is on top). With `umount2` first (MNT_DETACH when
/// `lazy`); when that is refused with EPERM (no CAP_SYS_ADMIN) and the mount is FUSE, with
/// `fusermount3 -u` (`-z` when `lazy`), then `umount2` once more. `timeout` bounds the helper
/// process.
///
/// Returns `NotMounted` when the ID is gone already, `Covered` (and does nothing) when another
/// mount is on top of it.
///
/// # Errors
/// [`UnmountError::Failed`] with `umount2`'s errno and fusermount3's stderr when the mount is
/// still there afterwards.
pub fn unmount_mount(
    m: &MountInfo,
    lazy: bool,
    timeout: Duration,
) -> Result<Unmounted, UnmountError> {
    let path = m.mount_point.clone();
    let done = if lazy {
        Unmounted::Lazy
    } else {
        Unmounted::Clean
    };
    if let Some(other) = not_on_top(m) {
        return Ok(other);
    }
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| UnmountError::BadPath { path: path.clone() })?;
    // As root an unmount is one syscall: no helper process to spawn (which matters when the
    // deadline leaves milliseconds), and none that stats the mount point on the way (with a
    // lower that no longer answers, `fusermount3 -u` of drainfs's own mount sat in that stat,
    // through drainfs, until its timeout). Only when the syscall is refused (EPERM: no
    // CAP_SYS_ADMIN) does `fusermount3` try.
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: umount2 on a NUL-terminated path.
    let r = unsafe { libc::umount2(c.as_ptr(), flags) };
    let first = std::io::Error::last_os_error();
    if r == 0 && still_mounted(m).is_none() {
        return Ok(done);
    }
    let mut helper = String::new();
    if m.is_fuse() && r != 0 && first.raw_os_error() == Some(libc::EPERM) {
        if let Some(other) = not_on_top(m) {
            return Ok(other);
        }
        let mut cmd = std::process::Command::new("fusermount3");
        cmd.arg("-u").arg("-q");
        if lazy {
            cmd.arg("-z");
        }
        cmd.arg("--").arg(&path);
        helper = match procs::output(cmd, timeout) {
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => e.to_string(),
        };
        if still_mounted(m).is_none() {
            return Ok(done);
        }
    }
    if let Some(other) = not_on_top(m) {
        return Ok(other);
    }
    // SAFETY: umount2 on a NUL-terminated path.
    let r = unsafe { libc::umount2(c.as_ptr(), flags) };
    let errno = std::io::Error::last_os_error();
    if r == 0 || still_mounted(m).is_none() {
        return Ok(done);
    }
    Err(UnmountError::Failed {
        path,
        id: m.id,
        errno,
        helper,
    })
}

/// Unmounts `m` now with one non-lazy `umount2(2)` (no helper process, no retry), when it is
/// still the topmost mount at its mount point.
///
/// # Errors
/// `ENOENT` when `m` is gone already, `EBUSY` when another mount is stacked on top of it (or
/// it is in use), `EPERM` without CAP_SYS_ADMIN, `EINVAL` for a path with a NUL byte.
pub fn unmount_now(m: &MountInfo) -> std::io::Result<()> {
    match not_on_top(m) {
        Some(Unmounted::NotMounted) => return Err(std::io::Error::from_raw_os_error(libc::ENOENT)),
        Some(_) => return Err(std::io::Error::from_raw_os_error(libc::EBUSY)),
        None => {}
    }
    let c = std::ffi::CString::new(m.mount_point.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: umount2 on a NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// `None` when `m` is the topmost mount at its mount point; otherwise what to answer instead
/// (`NotMounted`: that mount is gone; `Covered`: something is stacked on it), logged.
fn not_on_top(m: &MountInfo) -> Option<Unmounted> {
    let table = mounts();
    if !table.iter().any(|t| m.same_mount(t)) {
        return Some(Unmounted::NotMounted);
    }
    match topmost(&table, &m.mount_point) {
        Some(top) if top.id != m.id => {
            tracing::warn!(
                path = %m.mount_point.display(),
                mount_id = m.id,
                top_id = top.id,
                top_fstype = %top.fstype,
                "not unmounting: another mount is stacked on top of this one"
            );
            Some(Unmounted::Covered { id: m.id, top })
        }
        _ => None,
    }
}

/// Unmounts `path`'s topmost mount normally; if it is busy, detaches it lazily.
///
/// # Errors
/// When even the lazy unmount fails.
pub fn unmount_or_detach(path: &Path, timeout: Duration) -> Result<Unmounted, UnmountError> {
    match mount_at(&absolute(path)) {
        Some(m) => unmount_or_detach_mount(&m, timeout),
        None => Ok(Unmounted::NotMounted),
    }
}

/// Unmounts the mount `m` normally; if it is busy, detaches it lazily (both only while it is
/// the topmost mount at its mount point, see [`unmount_mount`]).
///
/// # Errors
/// When even the lazy unmount fails.
pub fn unmount_or_detach_mount(
    m: &MountInfo,
    timeout: Duration,
) -> Result<Unmounted, UnmountError> {
    detach_or_unmount(m, false, timeout)
}

/// With `detach_at_once`, detaches the mount `m` lazily at once (a forced teardown, a dead
/// connection: nothing would answer a normal unmount); otherwise as
/// [`unmount_or_detach_mount`].
///
/// # Errors
/// When the (last) lazy unmount fails.
pub fn detach_or_unmount(
    m: &MountInfo,
    detach_at_once: bool,
    timeout: Duration,
) -> Result<Unmounted, UnmountError> {
    if detach_at_once {
        return unmount_mount(m, true, timeout);
    }
    match unmount_mount(m, false, timeout) {
        Ok(u) => Ok(u),
        Err(first) => {
            tracing::warn!(path = %m.mount_point.display(), error = %first, "unmount failed (busy?); detaching lazily");
            unmount_mount(m, true, timeout)
        }
    }
}

/// Mounts a FUSE file system at `mountpoint` with `mount(2)` (type `fuse.<subtype>`, source
/// `fsname`, `nosuid,nodev,noatime`, `default_permissions,allow_other`) on a fresh `/dev/fuse`
/// fd, and returns the fd (for `fuser::Session::from_fd`) with the new mount, identified by its
/// mount ID.
///
/// drainfs mounts itself instead of letting `fuser::Session::new` do it because fuser's
/// session, when it ends, unmounts its mountpoint again *by path*: after drainfs's own unmount
/// that removes whatever is underneath, which in Kubernetes is the volume's bind mount.
///
/// # Errors
/// EPERM without CAP_SYS_ADMIN (the caller then falls back to `fusermount3` through fuser);
/// any other `open("/dev/fuse")` or `mount(2)` errno; ENOENT if the new mount cannot be found
/// in mountinfo afterwards (it is then detached again).
pub fn mount_fuse(
    mountpoint: &Path,
    fsname: &str,
    subtype: &str,
) -> std::io::Result<(std::os::fd::OwnedFd, MountInfo)> {
    use nix::mount::MsFlags;
    use std::os::fd::AsRawFd;
    let abs = absolute(mountpoint);
    let below = mount_at(&abs).map(|m| m.id);
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let fd: std::os::fd::OwnedFd = dev.into();
    let data = format!(
        "fd={},rootmode=40000,user_id={},group_id={},default_permissions,allow_other",
        fd.as_raw_fd(),
        nix::unistd::getuid(),
        nix::unistd::getgid()
    );
    nix::mount::mount(
        Some(fsname),
        &abs,
        Some(format!("fuse.{subtype}").as_str()),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOATIME,
        Some(data.as_str()),
    )
    .map_err(std::io::Error::from)?;
    match fuse_mount_above(&abs, below) {
        Some(m) => Ok((fd, m)),
        None => {
            if let Ok(c) = std::ffi::CString::new(abs.as_os_str().as_bytes()) {
                // SAFETY: umount2 on a NUL-terminated path, right after our own mount(2) there.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
            Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("the new mount at {} is not in mountinfo", abs.display()),
            ))
        }
    }
}

pub mod connection;
pub use connection::{Connection, abort_fuse_connection, abort_mount};
pub mod probe;
pub mod users;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_with_escapes() {
        let text = "36 35 98:0 / /mnt/with\\040space rw,noatime master:1 - fuse.drainfs drainfs rw,user_id=0\n\
                    37 35 0:45 / /tmp/x rw - tmpfs tmpfs rw\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(m[0].fstype, "fuse.drainfs");
        assert_eq!((m[1].id, m[1].fstype.as_str()), (37, "tmpfs"));
    }

    #[test]
    fn preflight_rejects_bad_paths() {
        let d = tempfile::tempdir().unwrap();
        let lower = d.path().join("lower");
        let mp = d.path().join("mnt");
        std::fs::create_dir(&lower).unwrap();
        std::fs::write(d.path().join("file"), b"").unwrap();
        let cases: Vec<(PathBuf, PathBuf, &str)> = vec![
            (d.path().join("missing"), mp.clone(), "no such directory"),
            (d.path().join("file"), mp.clone(), "not a directory"),
            (lower.clone(), d.path().join("missing"), "no such directory"),
            (lower.clone(), lower.join("inner"), "inside --lower"),
        ];
        std::fs::create_dir(lower.join("inner")).unwrap();
        std::fs::create_dir(&mp).unwrap();
        for (l, m, want) in cases {
            let err = preflight(&l, &m, false).unwrap_err().0;
            assert!(err.contains(want), "{l:?} {m:?}: {err}");
        }
        // A live FUSE mount is refused by the shared check; a volume (any other filesystem) is not.
        let fuse = MountInfo {
            id: 40,
            parent_id: 30,
            devno: "0:50".into(),
            mount_point: mp.clone(),
            fstype: "fuse.drainfs".into(),
            source: "drainfs".into(),
        };
        let err = check_existing_mount(&fuse, "--mountpoint", &mp)
            .unwrap_err()
            .0;
        assert!(err.contains("already a live FUSE mount"), "{err}");
        for fstype in ["ext4", "tmpfs", "overlay", "xfs", "proc"] {
            let vol = MountInfo {
                fstype: fstype.into(),
                ..fuse.clone()
            };
            assert!(
                check_existing_mount(&vol, "--mountpoint", &mp).is_ok(),
                "{fstype}"
            );
        }
    }

    const STACKED: &str = "\
27 1 254:0 / / rw - ext4 /dev/vda rw
100 27 254:0 /tmp/pod/data /tmp/pod/data rw shared:5 - ext4 /dev/vda rw
101 27 254:0 /tmp/pod/lower /tmp/pod/lower rw - ext4 /dev/vda rw
102 101 0:60 / /tmp/pod/lower rw - fuse.gcsfuse example-bucket rw
103 100 0:61 / /tmp/pod/data rw shared:5 - fuse.drainfs drainfs rw
";

    #[test]
    fn topmost_follows_the_parent_chain() {
        let t = parse_mountinfo(STACKED);
        assert_eq!(t[4].parent_id, 100);
        assert_eq!(t[4].devno, "0:61");
        assert_eq!(topmost(&t, Path::new("/tmp/pod/data")).unwrap().id, 103);
        assert_eq!(topmost(&t, Path::new("/tmp/pod/lower")).unwrap().id, 102);
        // Listed in another order, the chain still decides.
        let mut rev = t.clone();
        rev.reverse();
        assert_eq!(topmost(&rev, Path::new("/tmp/pod/lower")).unwrap().id, 102);
        assert!(topmost(&t, Path::new("/tmp/pod")).is_none());
    }

    #[test]
    fn fuse_above_never_names_the_volume() {
        let t = parse_mountinfo(STACKED);
        let lower = Path::new("/tmp/pod/lower");
        // Baseline: the volume's bind mount (101). The lower's FUSE mount is above it.
        assert_eq!(fuse_above(&t, lower, Some(101)).unwrap().id, 102);
        // The lower unmounted itself: only the volume is left, which is never a candidate.
        let gone: Vec<MountInfo> = t.iter().filter(|m| m.id != 102).cloned().collect();
        assert_eq!(fuse_above(&gone, lower, Some(101)), None);
        assert_eq!(fuse_above(&gone, lower, None), None);
        // The baseline itself is never "above".
        assert_eq!(fuse_above(&t, lower, Some(102)), None);
        assert!(t[4].is_fuse() && !t[1].is_fuse());
    }
}

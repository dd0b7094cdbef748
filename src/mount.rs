//! Mount-table facts and mount/unmount actions: pre-flight checks of `run`, finding the mount
//! at a path in `/proc/self/mountinfo`, unmounting with `fusermount3`, and detecting dead FUSE
//! mounts ("Transport endpoint is not connected").

use std::ffi::OsString;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::procs;

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Unique mount id.
    pub id: u64,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Filesystem type (`fuse`, `fuse.drainfs`, `tmpfs`...).
    pub fstype: String,
    /// Mount source.
    pub source: String,
    /// Minor device number (`major:minor` field); for a FUSE mount, its connection number in
    /// `/sys/fs/fuse/connections/`.
    pub dev_minor: Option<u32>,
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
                mount_point: unescape(left.get(4)?),
                fstype: (*right.first()?).to_string(),
                source: unescape(right.get(1)?).to_string_lossy().into_owned(),
                dev_minor: left
                    .get(2)
                    .and_then(|d| d.split(':').nth(1))
                    .and_then(|m| m.parse().ok()),
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
/// canonical), if any.
pub fn mount_at(path: &Path) -> Option<MountInfo> {
    mounts().into_iter().rev().find(|m| m.mount_point == path)
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

/// Whether `path` is a FUSE mount whose daemon is gone: `stat` fails with ENOTCONN or
/// ECONNABORTED.
pub fn is_dead(path: &Path) -> bool {
    match std::fs::metadata(path) {
        Err(e) => matches!(
            e.raw_os_error(),
            Some(libc::ENOTCONN) | Some(libc::ECONNABORTED)
        ),
        Ok(_) => false,
    }
}

/// A failed pre-flight check of `run`: one readable line, exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Preflight(pub String);

/// Checks what `run` needs before anything is started: the lower is a directory (only when
/// `lower_must_exist`: a spawned lower may create its mountpoint... but it must exist to be
/// mounted on, so this is always checked), the mountpoint is an existing directory that is not
/// already a mount and not inside the lower, `/dev/fuse` opens read-write, `fusermount3` is on
/// PATH.
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
        return Err(Preflight(format!(
            "--mountpoint {}: already a mount ({} from {}); unmount it or choose another directory",
            mountpoint.display(),
            m.fstype,
            m.source
        )));
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
        return Err(Preflight(format!(
            "/dev/fuse is unusable ({e}); load the fuse module or give the container /dev/fuse"
        )));
    }
    if which("fusermount3").is_none() {
        return Err(Preflight(
            "fusermount3 not found on PATH; install fuse3 (apt-get install fuse3)".to_string(),
        ));
    }
    Ok((lower_abs, mp_abs))
}

/// `path` as an absolute path if it is an existing directory; otherwise one line naming the
/// flag, the path and the fix.
fn existing_dir(path: &Path, flag: &str) -> Result<PathBuf, Preflight> {
    let shown = path.display();
    match std::fs::metadata(path) {
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

/// Aborts and detaches a dead FUSE mount at `path` (peeling stacked ones), logging what it did.
pub fn repair_if_dead(path: &Path, what: &str) {
    let abs = absolute(path);
    for _ in 0..8 {
        if !is_dead(&abs) || mount_at(&abs).is_none() {
            return;
        }
        tracing::warn!(path = %abs.display(), "{what} is a dead FUSE mount left by a killed process: detaching it");
        abort_fuse_connection(&abs);
        if let Err(e) = unmount(&abs, true, Duration::from_secs(5)) {
            tracing::error!(path = %abs.display(), error = %e, "cannot detach the dead mount");
            return;
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
    /// Nothing was mounted there.
    NotMounted,
}

/// Unmounts `path`: lazily with `umount2(MNT_DETACH)` first when `lazy` (as root), else with
/// `fusermount3 -u` (`-z` when `lazy`), falling back to `umount2`
/// (MNT_DETACH when lazy) for non-FUSE mounts or when fusermount3 refuses. `timeout` bounds the
/// helper process.
///
/// # Errors
/// A message with fusermount3's stderr when the mount is still there afterwards.
pub fn unmount(path: &Path, lazy: bool, timeout: Duration) -> Result<Unmounted, String> {
    let abs = absolute(path);
    if mount_at(&abs).is_none() {
        return Ok(Unmounted::NotMounted);
    }
    if lazy && detach(&abs) {
        // As root a lazy detach is one syscall that never waits on the FUSE daemon: no helper
        // process to spawn, which matters when the deadline leaves milliseconds.
        return Ok(Unmounted::Lazy);
    }
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-u").arg("-q");
    if lazy {
        cmd.arg("-z");
    }
    cmd.arg("--").arg(&abs);
    let out = procs::output(cmd, timeout);
    if mount_at(&abs).is_none() {
        return Ok(if lazy {
            Unmounted::Lazy
        } else {
            Unmounted::Clean
        });
    }
    let c = std::ffi::CString::new(abs.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: umount2 on a NUL-terminated path.
    let r = unsafe { libc::umount2(c.as_ptr(), flags) };
    if r == 0 || mount_at(&abs).is_none() {
        return Ok(if lazy {
            Unmounted::Lazy
        } else {
            Unmounted::Clean
        });
    }
    let errno = std::io::Error::last_os_error();
    let stderr = match out {
        Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
        Err(e) => e.to_string(),
    };
    Err(format!(
        "unmount {} failed: {errno}; fusermount3: {stderr}",
        abs.display()
    ))
}

/// `umount2(path, MNT_DETACH)`; true when the mount is gone from the table afterwards.
fn detach(abs: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(abs.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: umount2 on a NUL-terminated path.
    let r = unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    r == 0 && mount_at(abs).is_none()
}

/// Unmounts `path` normally; if it is busy, detaches it lazily.
///
/// # Errors
/// When even the lazy unmount fails.
pub fn unmount_or_detach(path: &Path, timeout: Duration) -> Result<Unmounted, String> {
    match unmount(path, false, timeout) {
        Ok(u) => Ok(u),
        Err(first) => {
            tracing::warn!(path = %path.display(), error = %first, "unmount failed (busy?); detaching lazily");
            unmount(path, true, timeout)
        }
    }
}

/// Aborts the FUSE connection behind a mount (`/sys/fs/fuse/connections/<dev>/abort`), which
/// fails every request waiting on a wedged daemon. Returns whether it was written.
pub fn abort_fuse_connection(path: &Path) -> bool {
    let abs = absolute(path);
    let Some(m) = mount_at(&abs) else {
        return false;
    };
    if !m.fstype.starts_with("fuse") {
        return false;
    }
    // The connection's number is the minor of the mount's st_dev, read from mountinfo's
    // major:minor field (stat on a wedged mount would hang).
    m.dev_minor.is_some_and(abort_connection)
}

/// Aborts FUSE connection `minor` (`/sys/fs/fuse/connections/<minor>/abort`): every pending
/// request fails with ECONNABORTED and later ones with ENOTCONN; the daemon's read of
/// `/dev/fuse` returns ENODEV. Works after the mount was detached. Returns whether it was
/// written.
pub fn abort_connection(minor: u32) -> bool {
    std::fs::write(format!("/sys/fs/fuse/connections/{minor}/abort"), b"1").is_ok()
}

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
        assert!(
            preflight(&d.path().join("lower"), Path::new("/proc"), false)
                .unwrap_err()
                .0
                .contains("already a mount")
        );
    }
}

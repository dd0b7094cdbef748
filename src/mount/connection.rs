//! Aborting a FUSE connection (`/sys/fs/fuse/connections/<N>/abort`) without ever reaching
//! another file system's.
//!
//! A connection's number `N` is the minor of its superblock's `st_dev`: an anonymous device
//! number that the kernel frees when the superblock goes and hands to the next mount that asks,
//! anywhere on the node. A number remembered from mountinfo can therefore name another pod's
//! (or another test's) FUSE mount by the time it is used. So a [`Connection`] remembers the
//! inode number of the connection's directory in the FUSE control file system as well (fusectl
//! gives every connection's directory a fresh one, fs/fuse/control.c), and aborts only through
//! a directory that still has it.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::{MountInfo, absolute, mount_at, still_mounted};

/// Where the FUSE control file system is mounted.
pub const FUSECTL: &str = "/sys/fs/fuse/connections";

/// One FUSE connection, identified by its number and by the inode of its directory under
/// [`FUSECTL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connection {
    minor: u32,
    ino: u64,
}

impl Connection {
    /// The connection behind the FUSE mount `m`, which must be mounted now: `None` when `m` is
    /// not FUSE, no longer mounted with the same device number, or [`FUSECTL`] is not mounted.
    pub fn of(m: &MountInfo) -> Option<Connection> {
        if !m.is_fuse() {
            return None;
        }
        let minor = m.connection()?;
        let ino = std::fs::metadata(format!("{FUSECTL}/{minor}")).ok()?.ino();
        // Still that mount with that number after the stat: the directory seen is its own.
        still_mounted(m)?;
        Some(Connection { minor, ino })
    }

    /// Aborts this connection if it still exists: every pending request fails with
    /// ECONNABORTED and later ones with ENOTCONN; the daemon's read of `/dev/fuse` returns
    /// ENODEV. Works after the mount was detached, and never reaches a connection that got the
    /// same number since (its directory has another inode; an abort file opened through the
    /// old directory belongs to the old connection). Returns whether the abort was written.
    pub fn abort(&self) -> bool {
        let Some(dir) = self.dir() else {
            tracing::info!(
                connection = self.minor,
                "the FUSE connection has ended (its number is free or another's): not aborting"
            );
            return false;
        };
        let Some(file) = open_at(Some(&dir), "abort", libc::O_WRONLY) else {
            return false;
        };
        nix::unistd::write(&file, b"1").is_ok()
    }

    /// Whether the connection still exists (its superblock is alive somewhere on the node).
    pub fn exists(&self) -> bool {
        self.dir().is_some()
    }

    /// The connection's directory under [`FUSECTL`], if it is still this connection's.
    fn dir(&self) -> Option<OwnedFd> {
        let path = format!("{FUSECTL}/{}", self.minor);
        let dir = open_at(None, &path, libc::O_DIRECTORY)?;
        let ino = nix::sys::stat::fstat(dir.as_fd()).ok()?.st_ino;
        (ino == self.ino).then_some(dir)
    }
}

/// Aborts the FUSE connection of `m` while `m` is still mounted ([`Connection::of`]); `false`
/// otherwise. Returns whether the abort was written.
pub fn abort_mount(m: &MountInfo) -> bool {
    Connection::of(m).is_some_and(|c| c.abort())
}

/// Aborts the FUSE connection behind the topmost mount at `path` ([`abort_mount`]).
pub fn abort_fuse_connection(path: &Path) -> bool {
    mount_at(&absolute(path)).is_some_and(|m| abort_mount(&m))
}

/// `openat(dir or AT_FDCWD, path, flags | O_CLOEXEC)`.
fn open_at(dir: Option<&OwnedFd>, path: &str, flags: i32) -> Option<OwnedFd> {
    let c = std::ffi::CString::new(path).ok()?;
    let dirfd = dir.map_or(libc::AT_FDCWD, |d| d.as_raw_fd());
    // SAFETY: openat on a valid dirfd (or AT_FDCWD) and a NUL-terminated path.
    let fd = unsafe { libc::openat(dirfd, c.as_ptr(), flags | libc::O_CLOEXEC) };
    // SAFETY: a non-negative return of openat(2) is a fresh fd nobody else owns.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A live connection is known by its directory's inode: with another inode (its number
    /// handed on) it counts as ended, so `abort` would not write. Nothing is written here.
    #[test]
    fn a_connection_is_known_by_its_directory_inode() {
        assert!(
            !Connection {
                minor: u32::MAX,
                ino: 1
            }
            .exists()
        );
        let Ok(entries) = std::fs::read_dir(FUSECTL) else {
            return;
        };
        for e in entries.flatten() {
            let Some(minor) = e.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            // Connections of other processes come and go while this runs: one that went
            // counts as ended, correctly.
            let Ok(md) = e.metadata() else { continue };
            let ino = md.ino();
            let now = || std::fs::metadata(e.path()).ok().map(|m| m.ino());
            assert!(
                Connection { minor, ino }.exists() || now() != Some(ino),
                "connection {minor}"
            );
            assert!(
                !Connection {
                    minor,
                    ino: ino.wrapping_add(1)
                }
                .exists(),
                "connection {minor} with another inode"
            );
        }
    }

    /// A number with no directory is not aborted.
    #[test]
    fn a_number_without_a_connection_is_not_aborted() {
        assert!(
            !Connection {
                minor: u32::MAX,
                ino: 1
            }
            .abort()
        );
    }
}

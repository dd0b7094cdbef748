//! Which data path regular files get: a pure decision from the `--passthrough` mode, the lower's
//! file system (mountinfo fstype and source) and what the kernel granted at INIT.
//!
//! With kernel passthrough (Documentation/filesystems/fuse-passthrough.rst) the kernel opens
//! the lower file itself and writes through that handle; the application's `close()` sends
//! drainfs a FLUSH, but the kernel's own lower handle gets no FLUSH until RELEASE. That is safe
//! only on a lower that keeps write state per file (per inode), so that the FLUSH drainfs sends
//! through its own handle of the same inode publishes what the kernel wrote. A lower that keeps
//! write state per file handle (rclone `--vfs-cache-mode off`) publishes drainfs's handle (with
//! nothing written through it) and the kernel's data is lost or arrives late. So `auto` gives
//! writers passthrough only on lowers known to keep per-inode write state:
//! - gcsfuse: fstype `fuse.gcsfuse` (jacobsa/fuse mounts with subtype `gcsfuse`; its fsname is
//!   the bucket, or `gcsfuse` for a dynamic mount), or fstype `fuse` with source `gcsfuse`;
//! - bucketfs, drainfs's gcsfuse-like test lower (per-inode staging, published at FLUSH):
//!   fstype `fuse.bucketfs`, or any FUSE fstype with a source starting `bucketfs:`;
//! - local file systems ([`LOCAL_FSTYPES`]), where every handle writes to the one page cache.
//!
//! Any other lower (rclone, s3fs, an unknown FUSE file system) gets `reads`: kernel passthrough
//! for read-only opens, writers served by drainfs (direct io), whose FLUSH reaches the very
//! handle that wrote.

use crate::config::PassthroughMode;

/// Local file systems: every open of an inode writes to the same page cache.
pub const LOCAL_FSTYPES: &[&str] = &[
    "ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "ramfs", "overlay", "zfs", "f2fs", "bcachefs",
];

/// The data path chosen for regular files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WritePath {
    /// Read-only opens use kernel passthrough.
    pub reads_passthrough: bool,
    /// Writable opens use kernel passthrough (otherwise drainfs serves them).
    pub writes_passthrough: bool,
    /// Why, in one sentence (logged at start and shown in `/status`).
    pub reason: String,
}

/// The name of a lower known to keep write state per inode, from its mountinfo `fstype` and
/// `source`; `None` for any other.
pub fn per_inode_lower(fstype: &str, source: &str) -> Option<&'static str> {
    let fuse = fstype == "fuse" || fstype.starts_with("fuse.");
    if fstype == "fuse.gcsfuse" || (fstype == "fuse" && source == "gcsfuse") {
        Some("gcsfuse")
    } else if fstype == "fuse.bucketfs" || (fuse && source.starts_with("bucketfs:")) {
        Some("bucketfs")
    } else {
        LOCAL_FSTYPES.iter().find(|t| **t == fstype).copied()
    }
}

/// Decides the data path. `lower` is the lower's mount (`(fstype, source)`, `None` when it is
/// not known); `kernel` is `Ok` when the kernel granted FUSE_PASSTHROUGH and drainfs can open
/// backing files, else why not.
///
/// # Errors
/// `--passthrough always` when `kernel` is an error: the message to fail the mount with.
pub fn decide(
    mode: PassthroughMode,
    lower: Option<(&str, &str)>,
    kernel: Result<(), &str>,
) -> Result<WritePath, String> {
    let off = |reason: String| WritePath {
        reads_passthrough: false,
        writes_passthrough: false,
        reason,
    };
    if mode == PassthroughMode::Never {
        return Ok(off(
            "--passthrough never: reads and writes are served by drainfs".into(),
        ));
    }
    if let Err(why) = kernel {
        if mode == PassthroughMode::Always {
            return Err(format!("--passthrough always, but {why}"));
        }
        return Ok(off(format!(
            "{why}: reads and writes are served by drainfs"
        )));
    }
    let both = |reason: String| WritePath {
        reads_passthrough: true,
        writes_passthrough: true,
        reason,
    };
    let reads = |reason: String| WritePath {
        reads_passthrough: true,
        writes_passthrough: false,
        reason,
    };
    Ok(match mode {
        PassthroughMode::Always => both("--passthrough always".into()),
        PassthroughMode::Reads => reads(
            "--passthrough reads: kernel passthrough for read-only opens, writes served by drainfs"
                .into(),
        ),
        PassthroughMode::Auto => match lower {
            Some((fstype, source)) => match per_inode_lower(fstype, source) {
                Some(name) => both(format!(
                    "--passthrough auto: the lower ({name}) keeps write state per inode, so \
                     writers get kernel passthrough"
                )),
                None => reads(format!(
                    "--passthrough auto: the lower ({fstype} from {source}) is not known to keep \
                     write state per inode (it may upload per file handle, and the kernel's \
                     passthrough handle never gets a FLUSH): writes are served by drainfs; \
                     --passthrough always forces passthrough"
                )),
            },
            None => reads(
                "--passthrough auto: the lower's file system is unknown: writes are served by \
                 drainfs"
                    .into(),
            ),
        },
        PassthroughMode::Never => unreachable!("handled above"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use PassthroughMode::*;

    /// (mode, lower, kernel ok) -> (reads passthrough, writes passthrough)
    type Case = (
        PassthroughMode,
        Option<(&'static str, &'static str)>,
        bool,
        bool,
        bool,
    );

    #[test]
    fn decisions() {
        let cases: &[Case] = &[
            (
                Auto,
                Some(("fuse.gcsfuse", "example-bucket")),
                true,
                true,
                true,
            ),
            (Auto, Some(("fuse", "gcsfuse")), true, true, true),
            (
                Auto,
                Some(("fuse.bucketfs", "bucketfs:/b")),
                true,
                true,
                true,
            ),
            (Auto, Some(("fuse", "bucketfs:/b")), true, true, true),
            (Auto, Some(("ext4", "/dev/vda")), true, true, true),
            (Auto, Some(("tmpfs", "tmpfs")), true, true, true),
            (Auto, Some(("overlay", "overlay")), true, true, true),
            (
                Auto,
                Some(("fuse.rclone", ":gcs:bucket")),
                true,
                true,
                false,
            ),
            (Auto, Some(("fuse.s3fs", "s3fs")), true, true, false),
            // A bucket named like a lower proves nothing without the subtype.
            (Auto, Some(("fuse", "example-bucket")), true, true, false),
            (Auto, Some(("nfs4", "server:/x")), true, true, false),
            (Auto, None, true, true, false),
            (Auto, Some(("fuse.gcsfuse", "b")), false, false, false),
            (Reads, Some(("fuse.gcsfuse", "b")), true, true, false),
            (Reads, Some(("fuse.rclone", "r")), false, false, false),
            (Always, Some(("fuse.rclone", "r")), true, true, true),
            (Never, Some(("ext4", "/dev/vda")), true, false, false),
        ];
        for &(mode, lower, kernel_ok, reads, writes) in cases {
            let kernel = if kernel_ok {
                Ok(())
            } else {
                Err("no FUSE_PASSTHROUGH")
            };
            let d = decide(mode, lower, kernel).unwrap();
            assert_eq!(
                (d.reads_passthrough, d.writes_passthrough),
                (reads, writes),
                "{mode:?} {lower:?} kernel_ok={kernel_ok}: {}",
                d.reason
            );
            assert!(!d.reason.is_empty());
        }
        assert!(
            decide(
                Always,
                Some(("ext4", "/dev/vda")),
                Err("no FUSE_PASSTHROUGH")
            )
            .is_err()
        );
    }
}

//! The adapter's side of OPEN and CREATE: which opens ask the core for kernel passthrough
//! (by `--passthrough` mode and what INIT negotiated), the FOPEN flags of each open, and the
//! reply's backing id (fuser's `BackingId`, type-erased in the core).

use std::os::fd::BorrowedFd;
use std::sync::Arc;

use fuser::{FileHandle, FopenFlags};

use super::DrainFs;
use crate::config::PassthroughMode;
use crate::error::{Error, Kind};
use crate::fs::{Backing, Opened, Passthrough, RegisterBacking};

/// A backing id registered for passthrough, type-erased for the core.
pub(super) fn backing(id: std::io::Result<fuser::BackingId>) -> std::io::Result<Backing> {
    Ok(Arc::new(id?))
}

/// What an OPEN or CREATE replies with (see [`DrainFs::open_reply`]).
pub(super) struct OpenReply {
    /// The core's fh.
    pub(super) fh: FileHandle,
    /// FOPEN flags ([`DrainFs::open_flags`]).
    pub(super) flags: FopenFlags,
    /// Fuser's backing id, for a passthrough open.
    pub(super) backing: Option<Arc<fuser::BackingId>>,
}

impl DrainFs {
    /// The passthrough request for an open with these flags: any open in `auto` and `always`;
    /// in `reads`, read-only opens, and writable ones only to join readers that already hold
    /// the inode's backing id.
    pub(super) fn passthrough_for<'a>(
        &self,
        flags: i32,
        register: &'a dyn Fn(BorrowedFd<'_>) -> std::io::Result<Backing>,
    ) -> RegisterBacking<'a> {
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        self.passthrough.then_some(Passthrough {
            register,
            only_if_shared: writable && self.mode == PassthroughMode::Reads,
        })
    }

    /// What to reply to an OPEN or CREATE the core accepted: its fh, FOPEN flags and, for a
    /// passthrough open, fuser's backing id.
    ///
    /// # Errors
    /// `EIO` ([`Kind::Passthrough`]) when the backing id is not fuser's `BackingId`: the core
    /// has listed the open as a passthrough open of its inode, and the kernel requires every
    /// open of an inode with a backing file to be one (fs/fuse/iomode.c), so it must not be
    /// served without passthrough. The open is released first (the kernel sends no RELEASE
    /// for a failed open); a CREATE's caller also drops the entry's lookup reference.
    pub(super) fn open_reply(
        &self,
        nodeid: u64,
        flags: i32,
        o: Opened,
    ) -> Result<OpenReply, Error> {
        let fopen = self.open_flags(flags, o.backing.is_some());
        let backing = match o.backing.map(|b| b.downcast::<fuser::BackingId>()) {
            None => None,
            Some(Ok(id)) => Some(id),
            Some(Err(_)) => {
                let released = self.core.release(nodeid, o.fh);
                return Err(
                    Error::from(Kind::Passthrough).with_source(std::io::Error::other(format!(
                        "the backing id is not fuser's BackingId; the open is released ({})",
                        released.map_or_else(|e| e.to_string(), |()| "ok".to_string())
                    ))),
                );
            }
        };
        Ok(OpenReply {
            fh: FileHandle(o.fh),
            flags: fopen,
            backing,
        })
    }

    /// FOPEN flags for an open served as `passthrough` or not:
    /// - read-only passthrough opens need no FLUSH round trip (`FOPEN_NOFLUSH`). A read-only
    ///   open served by drainfs gets its FLUSH: drainfs's lower fd is a file of the lower's
    ///   own, whose close flushes it, and a lower FUSE mount with the writeback cache (gcsfuse
    ///   without streaming writes) flushes even read-only files at `close()` (FOPEN_NOFLUSH
    ///   does not apply there; gcsfuse then uploads a local file another handle wrote). Without
    ///   a FLUSH, that flush would come with drainfs's RELEASE, after the application's
    ///   `close()` returned, and race its next request: an unlink of the local file, which
    ///   gcsfuse then uploads after the unlink (gcsfuse's
    ///   local_file/TestReadSymlinkForDeletedLocalFile on `--passthrough never`);
    /// - write-only opens served by drainfs get `FOPEN_DIRECT_IO`: the kernel then hands the
    ///   application's pages to drainfs instead of first copying them into the page cache
    ///   (one copy of three saved; nothing is read back through such a handle). In `reads`
    ///   mode every writable open served by drainfs gets it, because direct io takes no inode io
    ///   mode, so passthrough readers may still open the inode (fs/fuse/iomode.c).
    fn open_flags(&self, flags: i32, passthrough: bool) -> FopenFlags {
        let acc = flags & libc::O_ACCMODE;
        if acc == libc::O_RDONLY {
            if passthrough {
                FopenFlags::FOPEN_NOFLUSH
            } else {
                FopenFlags::empty()
            }
        } else if !passthrough
            && (acc == libc::O_WRONLY || (self.passthrough && self.mode == PassthroughMode::Reads))
        {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;
    use std::time::Duration;

    use super::*;
    use crate::accounting::Accounting;
    use crate::fs::{Admission, Caller, CoreConfig, Fs, ROOT_ID};

    /// A backing id that is not fuser's fails the open with `EIO` and releases it in the
    /// core, instead of replying without passthrough for an open the core counts as one.
    #[test]
    fn a_backing_id_of_another_type_fails_the_open_and_releases_it() {
        let dir = tempfile::tempdir().unwrap();
        let acct = Accounting::new();
        let core = Arc::new(
            Fs::new(
                dir.path(),
                CoreConfig { max_lower_fds: 64 },
                Arc::clone(&acct),
                Admission::new(&acct),
            )
            .unwrap(),
        );
        let register = |_: BorrowedFd<'_>| -> std::io::Result<Backing> { Ok(Arc::new(7u32)) };
        let reg = Some(Passthrough {
            register: &register,
            only_if_shared: false,
        });
        let (e, o) = core
            .create(
                ROOT_ID,
                OsStr::new("f"),
                0o644,
                libc::O_RDWR,
                Caller::ROOT,
                reg,
            )
            .unwrap();
        assert!(o.backing.is_some(), "the core took the passthrough path");
        let fh = o.fh;
        let fs = DrainFs::new(
            Arc::clone(&core),
            Duration::from_secs(1),
            PassthroughMode::Auto,
            Arc::default(),
        );
        let err = fs.open_reply(e.nodeid, libc::O_RDWR, o).err().unwrap();
        assert_eq!(err.kind, Kind::Passthrough);
        assert_eq!(err.raw_errno(), libc::EIO);
        assert_eq!(core.open_paths(10).len(), 0, "the open was released");
        assert_eq!(
            core.release(e.nodeid, fh).unwrap_err().raw_errno(),
            libc::EBADF
        );
    }
}

//! READDIRPLUS's entries ([`PlusListing`]): each name is looked up (one lookup reference the
//! kernel keeps when the entry fits in the reply), except the dot entries, which the kernel
//! does not link.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{FileAttr, FileHandle, FileType, Generation, INodeNo, ReplyDirectoryPlus};

use super::DrainFs;
use super::reply::attr;
use crate::fs::ROOT_ID;

/// One READDIRPLUS reply being filled from directory `ino`'s handle `fh`.
pub(super) struct PlusListing<'a> {
    fs: &'a DrainFs,
    ino: INodeNo,
    fh: FileHandle,
    /// The lower's `st_dev` of the root, for the nodeid of `..`.
    dev: u64,
    /// The directory's own attributes, fetched at the first dot entry.
    dir_attr: Option<FileAttr>,
}

impl<'a> PlusListing<'a> {
    /// A listing of directory `ino` read through its handle `fh`.
    pub(super) fn new(fs: &'a DrainFs, ino: INodeNo, fh: FileHandle) -> Self {
        PlusListing {
            fs,
            ino,
            fh,
            dev: fs.core.root_dev(),
            dir_attr: None,
        }
    }

    /// Adds the entry `name` (lower inode `d_ino`, next offset `off`) to `reply`; returns
    /// false when the reply is full (the entry is then left for the next READDIRPLUS, and its
    /// lookup reference dropped). A name removed between `getdents64` and its lookup is
    /// skipped, as a concurrent unlink would make it.
    pub(super) fn add(
        &mut self,
        reply: &mut ReplyDirectoryPlus,
        d_ino: u64,
        off: i64,
        name: &[u8],
    ) -> bool {
        if name == b"." || name == b".." {
            return self.add_dot(reply, d_ino, off, name);
        }
        let core = &self.fs.core;
        match core.lookup_in_dir(self.ino.0, self.fh.0, name) {
            Ok(e) => {
                let full = reply.add(
                    INodeNo(e.nodeid),
                    off as u64,
                    OsStr::from_bytes(name),
                    &self.fs.ttl,
                    &attr(e.nodeid, &e.st),
                    Generation(0),
                );
                if full {
                    core.forget(e.nodeid, 1);
                }
                !full
            }
            // Removed between getdents and fstatat: skip it, as a concurrent unlink would.
            Err(_) => true,
        }
    }

    /// Adds `.` or `..`. The kernel does not link dot entries (fuse_direntplus_link skips
    /// them), so no lookup is made and no reference taken; only the entry's inode number
    /// counts: the directory's own nodeid for `.`, and for `..` the parent's, as READDIR
    /// reports it (the root's `..` is the root itself).
    fn add_dot(
        &mut self,
        reply: &mut ReplyDirectoryPlus,
        d_ino: u64,
        off: i64,
        name: &[u8],
    ) -> bool {
        let mut a = self.dir_attr();
        if name == b".." {
            a.ino = if self.ino.0 == ROOT_ID {
                INodeNo(ROOT_ID)
            } else {
                INodeNo(self.fs.core.dirent_nodeid(self.dev, d_ino))
            };
        }
        !reply.add(
            a.ino,
            off as u64,
            OsStr::from_bytes(name),
            &Duration::ZERO,
            &a,
            Generation(0),
        )
    }

    /// The directory's attributes (fetched once per reply); when GETATTR fails, attributes
    /// with only the inode number and the type, which are all a dot entry uses.
    fn dir_attr(&mut self) -> FileAttr {
        let (fs, ino, fh) = (self.fs, self.ino, self.fh);
        *self
            .dir_attr
            .get_or_insert_with(|| match fs.core.getattr(ino.0, Some(fh.0)) {
                Ok(st) => attr(ino.0, &st),
                Err(_) => FileAttr {
                    ino,
                    size: 0,
                    blocks: 0,
                    atime: UNIX_EPOCH,
                    mtime: UNIX_EPOCH,
                    ctime: UNIX_EPOCH,
                    crtime: UNIX_EPOCH,
                    kind: FileType::Directory,
                    perm: 0,
                    nlink: 0,
                    uid: 0,
                    gid: 0,
                    rdev: 0,
                    blksize: 0,
                    flags: 0,
                },
            })
    }
}

//! Conversions between the lower's answers and fuser's types: `struct stat` to FUSE
//! attributes (the nodeid stands in for `st_ino`), file types from `st_mode` and `d_type`,
//! and SETATTR's times to `utimensat(2)` timespecs.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};

use crate::fs::sys::Stat;

fn to_time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH - Duration::from_secs(secs.unsigned_abs()) + Duration::from_nanos(nsecs as u64)
    }
}

fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

pub(super) fn kind_of_dtype(t: u8) -> FileType {
    match t {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// Converts the lower's `struct stat` into FUSE attributes; `st_ino` becomes the nodeid.
pub fn attr(nodeid: u64, st: &Stat) -> FileAttr {
    FileAttr {
        ino: INodeNo(nodeid),
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        atime: to_time(st.st_atime, st.st_atime_nsec as i64),
        mtime: to_time(st.st_mtime, st.st_mtime_nsec as i64),
        ctime: to_time(st.st_ctime, st.st_ctime_nsec as i64),
        crtime: UNIX_EPOCH,
        kind: kind_of(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        rdev: st.st_rdev as u32,
        blksize: st.st_blksize as u32,
        flags: 0,
    }
}

pub(super) fn timespec(t: Option<TimeOrNow>) -> rustix::fs::Timespec {
    use rustix::fs::{Timespec, UTIME_NOW, UTIME_OMIT};
    match t {
        None => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_OMIT,
        },
        Some(TimeOrNow::Now) => Timespec {
            tv_sec: 0,
            tv_nsec: UTIME_NOW,
        },
        Some(TimeOrNow::SpecificTime(t)) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timespec {
                tv_sec: d.as_secs() as i64,
                tv_nsec: i64::from(d.subsec_nanos()),
            },
            Err(e) => {
                let d = e.duration();
                let (mut s, mut n) = (-(d.as_secs() as i64), -i64::from(d.subsec_nanos()));
                if n < 0 {
                    s -= 1;
                    n += 1_000_000_000;
                }
                Timespec {
                    tv_sec: s,
                    tv_nsec: n,
                }
            }
        },
    }
}

//! FUSE wire format, as far as the relay needs it: the request and reply headers, opcodes,
//! and the few bodies it reads (OPEN/CREATE flags and replies, INTERRUPT, BATCH_FORGET).
//!
//! Layouts are the kernel's (`include/uapi/linux/fuse.h`), little-endian on every platform
//! drainfs supports. Everything here is pure: it parses byte slices and builds byte vectors,
//! never does I/O, and returns [`ProtoError`] for malformed input instead of panicking.

use std::fmt;

/// Size of `struct fuse_in_header` (kernel → daemon).
pub const IN_HEADER_LEN: usize = 40;
/// Size of `struct fuse_out_header` (daemon → kernel).
pub const OUT_HEADER_LEN: usize = 16;
/// `FUSE_INT_REQ_BIT`: set in the `unique` of INTERRUPT requests and their replies.
pub const INT_REQ_BIT: u64 = 1;
/// `FUSE_MIN_READ_BUFFER`: a `/dev/fuse` read with a smaller buffer fails with EINVAL.
pub const MIN_READ_BUFFER: usize = 8192;
/// Size of `struct fuse_entry_out` (nodeid, generation, two valid pairs, `fuse_attr`).
pub const ENTRY_OUT_LEN: usize = 128;
/// Size of `struct fuse_forget_one`.
pub const FORGET_ONE_LEN: usize = 16;
/// Size of `struct fuse_batch_forget_in`.
pub const BATCH_FORGET_IN_LEN: usize = 8;

/// FUSE opcodes (`enum fuse_opcode`). Unknown values are carried as [`Opcode::Other`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Opcode {
    /// 1
    Lookup,
    /// 2: no reply.
    Forget,
    /// 3
    Getattr,
    /// 4
    Setattr,
    /// 5
    Readlink,
    /// 6
    Symlink,
    /// 8
    Mknod,
    /// 9
    Mkdir,
    /// 10
    Unlink,
    /// 11
    Rmdir,
    /// 12
    Rename,
    /// 13
    Link,
    /// 14
    Open,
    /// 15
    Read,
    /// 16
    Write,
    /// 17
    Statfs,
    /// 18
    Release,
    /// 20
    Fsync,
    /// 21
    Setxattr,
    /// 22
    Getxattr,
    /// 23
    Listxattr,
    /// 24
    Removexattr,
    /// 25
    Flush,
    /// 26
    Init,
    /// 27
    Opendir,
    /// 28
    Readdir,
    /// 29
    Releasedir,
    /// 30
    Fsyncdir,
    /// 31
    Getlk,
    /// 32
    Setlk,
    /// 33
    Setlkw,
    /// 34
    Access,
    /// 35
    Create,
    /// 36: no reply to the INTERRUPT itself (its reply, if any, is an interrupt reply).
    Interrupt,
    /// 37
    Bmap,
    /// 38
    Destroy,
    /// 39
    Ioctl,
    /// 40
    Poll,
    /// 41: no reply (answers a daemon's NOTIFY_RETRIEVE).
    NotifyReply,
    /// 42: no reply.
    BatchForget,
    /// 43
    Fallocate,
    /// 44
    Readdirplus,
    /// 45
    Rename2,
    /// 46
    Lseek,
    /// 47
    CopyFileRange,
    /// 51
    Tmpfile,
    /// 52
    Statx,
    /// Anything else (newer kernels): forwarded, a reply expected.
    Other(u32),
}

impl Opcode {
    /// Decodes the header's opcode field.
    pub fn from_u32(v: u32) -> Opcode {
        use Opcode::*;
        match v {
            1 => Lookup,
            2 => Forget,
            3 => Getattr,
            4 => Setattr,
            5 => Readlink,
            6 => Symlink,
            8 => Mknod,
            9 => Mkdir,
            10 => Unlink,
            11 => Rmdir,
            12 => Rename,
            13 => Link,
            14 => Open,
            15 => Read,
            16 => Write,
            17 => Statfs,
            18 => Release,
            20 => Fsync,
            21 => Setxattr,
            22 => Getxattr,
            23 => Listxattr,
            24 => Removexattr,
            25 => Flush,
            26 => Init,
            27 => Opendir,
            28 => Readdir,
            29 => Releasedir,
            30 => Fsyncdir,
            31 => Getlk,
            32 => Setlk,
            33 => Setlkw,
            34 => Access,
            35 => Create,
            36 => Interrupt,
            37 => Bmap,
            38 => Destroy,
            39 => Ioctl,
            40 => Poll,
            41 => NotifyReply,
            42 => BatchForget,
            43 => Fallocate,
            44 => Readdirplus,
            45 => Rename2,
            46 => Lseek,
            47 => CopyFileRange,
            51 => Tmpfile,
            52 => Statx,
            other => Other(other),
        }
    }

    /// The lower-case name used in logs, `/status` and metrics labels (`other` for unknown).
    pub fn name(self) -> &'static str {
        use Opcode::*;
        match self {
            Lookup => "lookup",
            Forget => "forget",
            Getattr => "getattr",
            Setattr => "setattr",
            Readlink => "readlink",
            Symlink => "symlink",
            Mknod => "mknod",
            Mkdir => "mkdir",
            Unlink => "unlink",
            Rmdir => "rmdir",
            Rename => "rename",
            Link => "link",
            Open => "open",
            Read => "read",
            Write => "write",
            Statfs => "statfs",
            Release => "release",
            Fsync => "fsync",
            Setxattr => "setxattr",
            Getxattr => "getxattr",
            Listxattr => "listxattr",
            Removexattr => "removexattr",
            Flush => "flush",
            Init => "init",
            Opendir => "opendir",
            Readdir => "readdir",
            Releasedir => "releasedir",
            Fsyncdir => "fsyncdir",
            Getlk => "getlk",
            Setlk => "setlk",
            Setlkw => "setlkw",
            Access => "access",
            Create => "create",
            Interrupt => "interrupt",
            Bmap => "bmap",
            Destroy => "destroy",
            Ioctl => "ioctl",
            Poll => "poll",
            NotifyReply => "notify_reply",
            BatchForget => "batch_forget",
            Fallocate => "fallocate",
            Readdirplus => "readdirplus",
            Rename2 => "rename2",
            Lseek => "lseek",
            CopyFileRange => "copy_file_range",
            Tmpfile => "tmpfile",
            Statx => "statx",
            Other(_) => "other",
        }
    }

    /// Whether the kernel waits for a reply to this request. FORGET, BATCH_FORGET, INTERRUPT
    /// and NOTIFY_REPLY get none (an INTERRUPT may get an interrupt reply, which finishes
    /// nothing). Unknown opcodes are assumed to expect one.
    pub fn expects_reply(self) -> bool {
        !matches!(
            self,
            Opcode::Forget | Opcode::BatchForget | Opcode::Interrupt | Opcode::NotifyReply
        )
    }

    /// Whether the door refuses this request while draining: it opens a file or changes the
    /// namespace (OPEN, CREATE, TMPFILE, MKDIR, MKNOD, SYMLINK, LINK, RENAME, RENAME2).
    pub fn is_door_guarded(self) -> bool {
        matches!(
            self,
            Opcode::Open
                | Opcode::Create
                | Opcode::Tmpfile
                | Opcode::Mkdir
                | Opcode::Mknod
                | Opcode::Symlink
                | Opcode::Link
                | Opcode::Rename
                | Opcode::Rename2
        )
    }
}

/// A malformed message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// Fewer bytes than the header needs.
    Short {
        /// Bytes received.
        got: usize,
        /// Bytes needed.
        need: usize,
    },
    /// The header's `len` differs from the bytes received (a framing error).
    LengthMismatch {
        /// The header's `len`.
        header: u32,
        /// Bytes received.
        got: usize,
    },
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::Short { got, need } => {
                write!(
                    f,
                    "message of {got} bytes is shorter than its {need}-byte header"
                )
            }
            ProtoError::LengthMismatch { header, got } => {
                write!(f, "header says {header} bytes, but {got} were received")
            }
        }
    }
}

impl std::error::Error for ProtoError {}

/// Reads a little-endian u32 at `off`; `None` past the end.
pub fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    b.get(off..off + 4)
        .map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// Reads a little-endian u16 at `off`; `None` past the end.
pub fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    b.get(off..off + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
}

/// Reads a little-endian u64 at `off`; `None` past the end.
pub fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    b.get(off..off + 8).map(|s| {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        u64::from_le_bytes(a)
    })
}

/// Writes a little-endian u32 at `off` (the caller checked the length).
pub fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// Writes a little-endian u16 at `off` (the caller checked the length).
pub fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

/// The fields of `struct fuse_in_header` the relay uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    /// Total message length, header included.
    pub len: u32,
    /// The operation.
    pub opcode: Opcode,
    /// Request id; bit 0 set for INTERRUPT.
    pub unique: u64,
    /// The inode the request is about.
    pub nodeid: u64,
}

impl InHeader {
    /// Parses a kernel request of exactly `msg.len()` bytes (one `/dev/fuse` read).
    ///
    /// # Errors
    /// [`ProtoError::Short`] under 40 bytes, [`ProtoError::LengthMismatch`] when `len` is not
    /// the number of bytes read.
    pub fn parse(msg: &[u8]) -> Result<InHeader, ProtoError> {
        let (Some(len), Some(op), Some(unique), Some(nodeid)) = (
            u32_at(msg, 0),
            u32_at(msg, 4),
            u64_at(msg, 8),
            u64_at(msg, 16),
        ) else {
            return Err(ProtoError::Short {
                got: msg.len(),
                need: IN_HEADER_LEN,
            });
        };
        if msg.len() < IN_HEADER_LEN {
            return Err(ProtoError::Short {
                got: msg.len(),
                need: IN_HEADER_LEN,
            });
        }
        if len as usize != msg.len() {
            return Err(ProtoError::LengthMismatch {
                header: len,
                got: msg.len(),
            });
        }
        Ok(InHeader {
            len,
            opcode: Opcode::from_u32(op),
            unique,
            nodeid,
        })
    }

    /// The request's body (after the 40-byte header).
    pub fn body(msg: &[u8]) -> &[u8] {
        msg.get(IN_HEADER_LEN..).unwrap_or(&[])
    }
}

/// The `unique` of a message too malformed to parse fully, when at least that field is there
/// (so the relay can still answer it instead of leaving the caller hanging).
pub fn salvage_unique(msg: &[u8]) -> Option<u64> {
    u64_at(msg, 8)
}

/// `struct fuse_out_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutHeader {
    /// Total message length, header included.
    pub len: u32,
    /// 0, a negative errno, or (with `unique == 0`) the notification code.
    pub error: i32,
    /// The request this answers; 0 for a notification.
    pub unique: u64,
}

impl OutHeader {
    /// Parses a daemon reply of exactly `msg.len()` bytes (one datagram).
    ///
    /// # Errors
    /// [`ProtoError::Short`] under 16 bytes, [`ProtoError::LengthMismatch`] when `len` is not
    /// the number of bytes received.
    pub fn parse(msg: &[u8]) -> Result<OutHeader, ProtoError> {
        let (Some(len), Some(error), Some(unique)) =
            (u32_at(msg, 0), u32_at(msg, 4), u64_at(msg, 8))
        else {
            return Err(ProtoError::Short {
                got: msg.len(),
                need: OUT_HEADER_LEN,
            });
        };
        if len as usize != msg.len() {
            return Err(ProtoError::LengthMismatch {
                header: len,
                got: msg.len(),
            });
        }
        Ok(OutHeader {
            len,
            error: error as i32,
            unique,
        })
    }

    /// The reply's body (after the 16-byte header).
    pub fn body(msg: &[u8]) -> &[u8] {
        msg.get(OUT_HEADER_LEN..).unwrap_or(&[])
    }
}

/// A header-only error reply (`len = 16`, `error = -errno`), the only form the kernel accepts
/// for an error.
pub fn error_reply(unique: u64, errno: i32) -> [u8; OUT_HEADER_LEN] {
    let mut b = [0u8; OUT_HEADER_LEN];
    put_u32(&mut b, 0, OUT_HEADER_LEN as u32);
    b[4..8].copy_from_slice(&(-errno).to_le_bytes());
    b[8..16].copy_from_slice(&unique.to_le_bytes());
    b
}

/// An FSYNC request of the relay's own (`fuse_in_header` with uid, gid and pid 0, then
/// `fuse_fsync_in { fh, fsync_flags: 0 (a full fsync), padding }`): 56 bytes.
pub fn fsync_request(unique: u64, nodeid: u64, fh: u64) -> Vec<u8> {
    let mut m = vec![0u8; IN_HEADER_LEN + 16];
    put_u32(&mut m, 0, (IN_HEADER_LEN + 16) as u32);
    put_u32(&mut m, 4, 20);
    m[8..16].copy_from_slice(&unique.to_le_bytes());
    m[16..24].copy_from_slice(&nodeid.to_le_bytes());
    m[IN_HEADER_LEN..IN_HEADER_LEN + 8].copy_from_slice(&fh.to_le_bytes());
    m
}

/// A successful OPEN reply: `fuse_out_header`, then `fuse_open_out { fh, open_flags: 0,
/// backing_id: 0 }`: 32 bytes.
pub fn open_reply(unique: u64, fh: u64) -> [u8; OUT_HEADER_LEN + 16] {
    let mut b = [0u8; OUT_HEADER_LEN + 16];
    put_u32(&mut b, 0, (OUT_HEADER_LEN + 16) as u32);
    b[8..16].copy_from_slice(&unique.to_le_bytes());
    b[OUT_HEADER_LEN..OUT_HEADER_LEN + 8].copy_from_slice(&fh.to_le_bytes());
    b
}

/// The `flags` (O_RDONLY/O_WRONLY/O_RDWR and friends) of an OPEN or CREATE request body
/// (`fuse_open_in.flags` / `fuse_create_in.flags`, both at offset 0); `None` if too short.
pub fn open_flags(body: &[u8]) -> Option<u32> {
    u32_at(body, 0)
}

/// Whether open flags carry write intent (`O_WRONLY` or `O_RDWR`).
pub fn is_write_intent(flags: u32) -> bool {
    (flags as i32 & libc::O_ACCMODE) != libc::O_RDONLY
}

/// The file handle of a successful OPEN/OPENDIR reply body (`fuse_open_out.fh`) or CREATE
/// reply body (`fuse_entry_out` then `fuse_open_out`); `None` if the body is too short.
pub fn reply_fh(opcode: Opcode, body: &[u8]) -> Option<u64> {
    match opcode {
        Opcode::Open | Opcode::Opendir => u64_at(body, 0),
        Opcode::Create | Opcode::Tmpfile => u64_at(body, ENTRY_OUT_LEN),
        _ => None,
    }
}

/// The handle whose file a request changes: WRITE and FALLOCATE (`fh` first), SETATTR with
/// `FATTR_FH` (`fuse_setattr_in.fh` at 8), COPY_FILE_RANGE (`fh_out` at 24).
pub fn written_fh(opcode: Opcode, body: &[u8]) -> Option<u64> {
    /// `FATTR_FH` from `<linux/fuse.h>`.
    const FATTR_FH: u32 = 1 << 6;
    match opcode {
        Opcode::Write | Opcode::Fallocate => u64_at(body, 0),
        Opcode::Setattr if u32_at(body, 0).is_some_and(|v| v & FATTR_FH != 0) => u64_at(body, 8),
        Opcode::CopyFileRange => u64_at(body, 24),
        _ => None,
    }
}

/// The byte count of a WRITE request body (`fuse_write_in.size`, after `fh` and `offset`).
pub fn write_size(body: &[u8]) -> Option<u32> {
    u32_at(body, 16)
}

/// The handle a RELEASE/RELEASEDIR request body names (`fuse_release_in.fh`).
pub fn release_fh(body: &[u8]) -> Option<u64> {
    u64_at(body, 0)
}

/// What a request does to names, parsed from its body (nodeids are the kernel's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameOp {
    /// LOOKUP, CREATE, MKNOD, MKDIR, SYMLINK, LINK: a successful reply's `fuse_entry_out`
    /// gives the nodeid of `name` in `parent`.
    Entry {
        /// The directory (the request's nodeid).
        parent: u64,
        /// The entry's name.
        name: Box<[u8]>,
    },
    /// UNLINK, RMDIR of `name` in `parent`.
    Unlink {
        /// The directory.
        parent: u64,
        /// The name removed.
        name: Box<[u8]>,
    },
    /// RENAME, RENAME2.
    Rename {
        /// The source directory (the request's nodeid).
        olddir: u64,
        /// The source name.
        old: Box<[u8]>,
        /// The target directory.
        newdir: u64,
        /// The target name.
        new: Box<[u8]>,
        /// `RENAME_EXCHANGE`: the names swap.
        exchange: bool,
    },
    /// READDIRPLUS of the directory `parent`: each entry of a successful reply with a
    /// nonzero nodeid is a lookup.
    Readdirplus {
        /// The directory.
        parent: u64,
    },
}

/// The NUL-terminated string at the start of `b` (without the NUL); `None` without a NUL.
fn cstr(b: &[u8]) -> Option<&[u8]> {
    b.iter().position(|&c| c == 0).map(|i| &b[..i])
}

/// `RENAME_EXCHANGE` from `<linux/fs.h>`.
const RENAME_EXCHANGE: u32 = 2;

/// The [`NameOp`] of a kernel request (`None` for other opcodes or a malformed body). Body
/// layouts from `<linux/fuse.h>` (protocol 7.12 and later): `fuse_create_in` and
/// `fuse_mknod_in` are 16 bytes, `fuse_mkdir_in` 8, `fuse_link_in` 8 (the old nodeid),
/// `fuse_rename_in` 8 and `fuse_rename2_in` 16 (newdir first); the name(s) follow, each
/// NUL-terminated (SYMLINK: the entry's name, then the link's target).
pub fn name_op(opcode: Opcode, nodeid: u64, body: &[u8]) -> Option<NameOp> {
    let entry = |skip: usize| {
        Some(NameOp::Entry {
            parent: nodeid,
            name: cstr(body.get(skip..)?)?.into(),
        })
    };
    match opcode {
        Opcode::Lookup | Opcode::Symlink => entry(0),
        Opcode::Mkdir | Opcode::Link => entry(8),
        Opcode::Create | Opcode::Mknod => entry(16),
        Opcode::Unlink | Opcode::Rmdir => Some(NameOp::Unlink {
            parent: nodeid,
            name: cstr(body)?.into(),
        }),
        Opcode::Rename | Opcode::Rename2 => {
            let (skip, flags) = if opcode == Opcode::Rename {
                (8, 0)
            } else {
                (16, u32_at(body, 8)?)
            };
            let old = cstr(body.get(skip..)?)?;
            let new = cstr(body.get(skip + old.len() + 1..)?)?;
            Some(NameOp::Rename {
                olddir: nodeid,
                old: old.into(),
                newdir: u64_at(body, 0)?,
                new: new.into(),
                exchange: flags & RENAME_EXCHANGE != 0,
            })
        }
        Opcode::Readdirplus => Some(NameOp::Readdirplus { parent: nodeid }),
        _ => None,
    }
}

/// The nodeid of a successful entry reply body (`fuse_entry_out.nodeid`, first; CREATE's
/// body starts with it too).
pub fn entry_nodeid(body: &[u8]) -> Option<u64> {
    u64_at(body, 0)
}

/// `FUSE_NAME_OFFSET_DIRENTPLUS`: `fuse_entry_out` then `fuse_dirent`'s fixed part
/// (ino, off, namelen, type).
const DIRENTPLUS_NAME_OFFSET: usize = ENTRY_OUT_LEN + 24;

/// The (nodeid, name) pairs of a READDIRPLUS reply body (`fuse_direntplus` records, each
/// padded to 8 bytes), without `.`, `..` and nodeid 0, which the kernel does not count as
/// lookups (`fuse_direntplus_link`). Stops at the first malformed record.
pub fn direntplus_entries(body: &[u8]) -> Vec<(u64, &[u8])> {
    let mut out = Vec::new();
    let mut off = 0;
    while let Some(rec) = body.get(off..) {
        let (Some(nodeid), Some(namelen)) = (u64_at(rec, 0), u32_at(rec, ENTRY_OUT_LEN + 16))
        else {
            break;
        };
        let end = DIRENTPLUS_NAME_OFFSET + namelen as usize;
        let Some(name) = rec.get(DIRENTPLUS_NAME_OFFSET..end) else {
            break;
        };
        if nodeid != 0 && name != b"." && name != b".." {
            out.push((nodeid, name));
        }
        off += end.div_ceil(8) * 8;
    }
    out
}

/// Splits a BATCH_FORGET request that exceeds `limit` bytes into several that each fit.
/// Forgets have no reply and no ordering among themselves, so splitting is safe. Returns the
/// message unchanged (one element) when it fits; `None` when it is malformed (a count larger
/// than the body) or `limit` cannot hold even one entry.
pub fn split_batch_forget(msg: &[u8], limit: usize) -> Option<Vec<Vec<u8>>> {
    if msg.len() <= limit {
        return Some(vec![msg.to_vec()]);
    }
    let fixed = IN_HEADER_LEN + BATCH_FORGET_IN_LEN;
    if limit < fixed + FORGET_ONE_LEN || msg.len() < fixed {
        return None;
    }
    let count = u32_at(msg, IN_HEADER_LEN)? as usize;
    let entries = msg.get(fixed..)?;
    if entries.len() < count.checked_mul(FORGET_ONE_LEN)? {
        return None;
    }
    let per = (limit - fixed) / FORGET_ONE_LEN;
    let mut out = Vec::new();
    for chunk in entries[..count * FORGET_ONE_LEN].chunks(per * FORGET_ONE_LEN) {
        let mut m = Vec::with_capacity(fixed + chunk.len());
        m.extend_from_slice(&msg[..fixed]);
        m.extend_from_slice(chunk);
        let len = m.len() as u32;
        put_u32(&mut m, 0, len);
        put_u32(&mut m, IN_HEADER_LEN, (chunk.len() / FORGET_ONE_LEN) as u32);
        out.push(m);
    }
    Some(out)
}

#[cfg(test)]
pub(crate) mod tests;

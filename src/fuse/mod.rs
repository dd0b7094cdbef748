//! The fuser adapter: implements `fuser::Filesystem` on top of the core ([`crate::fs::Fs`]).
//!
//! Every handler has the same shape (mountpoint-s3's `fuse.rs`): count the request with an
//! [`OpGuard`](crate::accounting::OpGuard), call the core, reply; on error `fail!` logs,
//! counts and replies with the error's errno (`failure`). No handler writes an errno literal.
//! Handlers are synchronous on fuser's worker threads and never wait for the control plane.
//!
//! This file holds [`DrainFs`] and the handlers; the rest, one responsibility a file:
//! - `init`: INIT, the connection settings and the data path decision ([`InitInfo`]);
//! - `open`: which OPEN/CREATE asks for kernel passthrough, FOPEN flags, the reply's backing id;
//! - `dir`: READDIRPLUS's entries;
//! - `invalidator`: the kernel entry invalidations a RENAME leaves, sent from a thread of
//!   their own ([`Invalidator`]);
//! - `reply`: conversions from the lower's answers to fuser's types ([`attr`]);
//! - `failure`: `fail!`, the one way a handler fails a request;
//! - `log_filter`: [`StaleReplyFilter`], for fuser's own log lines.

mod dir;
mod failure;
mod init;
mod invalidator;
mod log_filter;
mod open;
mod reply;

use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, FileHandle, Filesystem, FopenFlags, Generation,
    INodeNo, KernelConfig, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs,
    ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;

use crate::accounting::Op;
use crate::config::PassthroughMode;
use crate::fs::sys::Timestamps;
use crate::fs::{Caller, Entry, Fs, XattrReply};
pub use crate::mount::has_cap_sys_admin;
use dir::PlusListing;
use failure::fail;
pub use init::InitInfo;
pub use invalidator::Invalidator;
pub use log_filter::StaleReplyFilter;
use open::{OpenReply, backing};
pub use reply::attr;
use reply::{kind_of_dtype, timespec};

/// Largest WRITE the kernel sends (`max_write`) and the readahead window (`max_readahead`):
/// 1 MiB.
pub const MAX_IO: u32 = 1 << 20;

/// Largest READ served at once from a worker thread's buffer (4 MiB): a bigger READ is
/// answered with the first 4 MiB (a short read). The buffer grows to the largest READ seen
/// and is kept for the thread's life.
const MAX_READ: usize = 4 * MAX_IO as usize;

/// The fuser filesystem.
pub struct DrainFs {
    core: Arc<Fs>,
    ttl: Duration,
    mode: PassthroughMode,
    passthrough: bool,
    init: Arc<Mutex<Option<InitInfo>>>,
    /// The lower's mount (fstype, source), for the data path decision.
    lower_fs: Option<(String, String)>,
    /// Entry invalidations for the kernel, sent from a thread of their own
    /// ([`DrainFs::invalidator`]).
    invalidator: Arc<Invalidator>,
}

impl DrainFs {
    /// Wraps the core. `init` receives what INIT negotiated.
    pub fn new(
        core: Arc<Fs>,
        ttl: Duration,
        mode: PassthroughMode,
        init: Arc<Mutex<Option<InitInfo>>>,
    ) -> Self {
        DrainFs {
            core,
            ttl,
            mode,
            passthrough: false,
            init,
            lower_fs: None,
            invalidator: Arc::default(),
        }
    }

    /// The queue of kernel entry invalidations, to start with the session's notifier once
    /// the session exists (the session takes the filesystem, so the notifier can only be
    /// handed over afterwards). Until then nothing is invalidated, and the kernel's entries
    /// expire after `--ttl`.
    pub fn invalidator(&self) -> Arc<Invalidator> {
        Arc::clone(&self.invalidator)
    }

    /// Sets the lower's file system (mountinfo fstype and source) that `--passthrough auto`
    /// decides on ([`crate::write_path::decide`]).
    pub fn with_lower(mut self, fstype: &str, source: &str) -> Self {
        self.lower_fs = Some((fstype.to_string(), source.to_string()));
        self
    }

    /// Replies to a request that answers with an entry (LOOKUP, MKNOD, MKDIR...).
    fn entry(&self, reply: ReplyEntry, e: &Entry) {
        reply.entry(&self.ttl, &attr(e.nodeid, &e.st), Generation(0));
    }
}

/// Who sent a request that creates an inode (credentials are switched to it on the lower).
fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
    }
}

/// Whether `pid`, a request's sender (the calling thread's id, in drainfs's pid namespace),
/// is a thread of drainfs itself.
fn is_own_thread(pid: u32) -> bool {
    pid != 0 && (pid == std::process::id() || Path::new(&format!("/proc/self/task/{pid}")).exists())
}

thread_local! {
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Filesystem for DrainFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        self.negotiate(config)
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let mut g = self.core.acct.op(Op::Lookup);
        match self.core.lookup(parent.0, name) {
            Ok(e) => self.entry(reply, &e),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        let _g = self.core.acct.op(Op::Forget);
        self.core.forget(ino.0, nlookup);
    }

    // BATCH_FORGET: fuser 0.18 does not export `ForgetOne`, so the trait's default, which
    // calls `forget` for each node, is used.

    fn getattr(&self, req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        let mut g = self.core.acct.op(Op::Getattr);
        match self.core.getattr(ino.0, fh.map(|f| f.0)) {
            Ok(st) => reply.attr(&self.ttl, &attr(ino.0, &st)),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.map(|f| f.0)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut g = self.core.acct.op(Op::Setattr);
        let times = (atime.is_some() || mtime.is_some()).then(|| Timestamps {
            last_access: timespec(atime),
            last_modification: timespec(mtime),
        });
        // KILLPRIV_V2: a truncate by a caller without CAP_FSETID must clear suid/sgid; fuser
        // does not pass FATTR_KILL_SUIDGID through, so non-root callers stand for it.
        let kill = (size.is_some() && req.uid() != 0).then(|| caller(req));
        match self
            .core
            .setattr(ino.0, fh.map(|f| f.0), mode, uid, gid, size, times, kill)
        {
            Ok(st) => reply.attr(&self.ttl, &attr(ino.0, &st)),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.map(|f| f.0)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let mut g = self.core.acct.op(Op::Readlink);
        match self.core.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let mut g = self.core.acct.op(Op::Mknod);
        match self.core.mknod(parent.0, name, mode, rdev, caller(req)) {
            Ok(e) => self.entry(reply, &e),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let mut g = self.core.acct.op(Op::Mkdir);
        match self.core.mkdir(parent.0, name, mode, caller(req)) {
            Ok(e) => self.entry(reply, &e),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut g = self.core.acct.op(Op::Unlink);
        match self.core.unlink(parent.0, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut g = self.core.acct.op(Op::Rmdir);
        match self.core.unlink(parent.0, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let mut g = self.core.acct.op(Op::Symlink);
        match self.core.symlink(parent.0, link_name, target, caller(req)) {
            Ok(e) => self.entry(reply, &e),
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = link_name),
        }
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Rename);
        match self
            .core
            .rename(parent.0, name, newparent.0, newname, flags.bits())
        {
            Ok(renamed) => {
                reply.ok();
                self.invalidator.send(renamed.stale);
            }
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut g = self.core.acct.op(Op::Link);
        match self.core.link(ino.0, newparent.0, newname) {
            Ok(e) => self.entry(reply, &e),
            Err(e) => fail!(self, req, g, reply, e, ino = newparent.0, name = newname),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut g = self.core.acct.op(Op::Open);
        let register = |fd: BorrowedFd<'_>| backing(reply.open_backing(fd));
        let reg = self.passthrough_for(flags.0, &register);
        let opened = self.core.open(ino.0, flags.0, caller(req), reg);
        match opened.and_then(|o| self.open_reply(ino.0, flags.0, o)) {
            Ok(OpenReply { fh, flags, backing }) => match backing.as_deref() {
                Some(id) => reply.opened_passthrough(fh, flags, id),
                None => reply.opened(fh, flags),
            },
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut g = self.core.acct.op(Op::Read);
        READ_BUF.with_borrow_mut(|buf| {
            let size = (size as usize).min(MAX_READ);
            if buf.len() < size {
                buf.resize(size, 0);
            }
            match self.core.read(ino.0, fh.0, offset, &mut buf[..size]) {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut g = self.core.acct.op(Op::Write);
        let kill = write_flags
            .contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID)
            .then(|| caller(req));
        match self.core.write(ino.0, fh.0, offset, data, kill) {
            Ok(n) => reply.written(n as u32),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Flush);
        match self.core.flush(ino.0, fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Release);
        match self.core.release(ino.0, fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Fsync);
        match self.core.fsync(ino.0, fh.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut g = self.core.acct.op(Op::Opendir);
        match self.core.opendir(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut g = self.core.acct.op(Op::Readdir);
        let dev = self.core.root_dev();
        let res = self
            .core
            .readdir(ino.0, fh.0, offset as i64, |d_ino, off, typ, name| {
                let ino = self.core.dirent_nodeid(dev, d_ino);
                !reply.add(
                    INodeNo(ino),
                    off as u64,
                    kind_of_dtype(typ),
                    OsStr::from_bytes(name),
                )
            });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let mut g = self.core.acct.op(Op::Readdirplus);
        let mut listing = PlusListing::new(self, ino, fh);
        let res = self
            .core
            .readdir(ino.0, fh.0, offset as i64, |d_ino, off, _typ, name| {
                listing.add(&mut reply, d_ino, off, name)
            });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn releasedir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Releasedir);
        match self.core.release(ino.0, fh.0) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Fsyncdir);
        match self.core.fsync(ino.0, fh.0, datasync) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn statfs(&self, req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        // drainfs's own probes (`/livez` statfs's the mountpoint) are not workload activity.
        let mut g = if is_own_thread(req.pid()) {
            self.core.acct.own_op(Op::Statfs)
        } else {
            self.core.acct.op(Op::Statfs)
        };
        match self.core.statfs() {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Setxattr);
        match self.core.setxattr(ino.0, name, value, flags) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, name = name),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let mut g = self.core.acct.op(Op::Getxattr);
        match self.core.getxattr(ino.0, name, size) {
            Ok(XattrReply::Size(n)) => reply.size(n),
            Ok(XattrReply::Data(d)) => reply.data(&d),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, name = name),
        }
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let mut g = self.core.acct.op(Op::Listxattr);
        match self.core.listxattr(ino.0, size) {
            Ok(XattrReply::Size(n)) => reply.size(n),
            Ok(XattrReply::Data(d)) => reply.data(&d),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0),
        }
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut g = self.core.acct.op(Op::Removexattr);
        match self.core.removexattr(ino.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, name = name),
        }
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let mut g = self.core.acct.op(Op::Access);
        match self.core.access(ino.0, mask.bits()) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let mut g = self.core.acct.op(Op::Create);
        let register = |fd: BorrowedFd<'_>| backing(reply.open_backing(fd));
        let reg = self.passthrough_for(flags, &register);
        let created = self
            .core
            .create(parent.0, name, mode, flags, caller(req), reg)
            .and_then(|(e, o)| {
                self.open_reply(e.nodeid, flags, o)
                    .inspect_err(|_| self.core.forget(e.nodeid, 1))
                    .map(|r| (e, r))
            });
        match created {
            Ok((e, OpenReply { fh, flags, backing })) => {
                let a = attr(e.nodeid, &e.st);
                match backing.as_deref() {
                    Some(id) => {
                        reply.created_passthrough(&self.ttl, &a, Generation(0), fh, flags, id)
                    }
                    None => reply.created(&self.ttl, &a, Generation(0), fh, flags),
                }
            }
            Err(e) => fail!(self, req, g, reply, e, ino = parent.0, name = name),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut g = self.core.acct.op(Op::Fallocate);
        // KILLPRIV_V2: the kernel leaves clearing suid/sgid to drainfs; a non-root caller
        // stands for "without CAP_FSETID", as for truncate.
        let kill = (req.uid() != 0).then(|| caller(req));
        match self.core.fallocate(ino.0, fh.0, offset, length, mode, kill) {
            Ok(()) => reply.ok(),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn lseek(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let mut g = self.core.acct.op(Op::Lseek);
        match self.core.lseek(ino.0, fh.0, offset, whence) {
            Ok(o) => reply.offset(o),
            Err(e) => fail!(self, req, g, reply, e, ino = ino.0, fh = fh.0),
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let mut g = self.core.acct.op(Op::CopyFileRange);
        match self.core.copy_file_range(
            ino_in.0,
            fh_in.0,
            offset_in,
            ino_out.0,
            fh_out.0,
            offset_out,
            len,
            flags.bits() as u32,
            (req.uid() != 0).then(|| caller(req)),
        ) {
            Ok(n) => reply.written(n as u32),
            Err(e) => fail!(self, req, g, reply, e, ino = ino_in.0, fh = fh_in.0),
        }
    }
}

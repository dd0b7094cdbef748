//! OPEN and CREATE: the lower open with the application's flags, and the choice per open
//! between kernel passthrough (one backing id per inode, shared by its passthrough opens) and
//! drainfs's own data path (`Fs::install_handle` lists the cases).

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::attr::privs_to_kill;
use super::handles::{Handle, HandleKind};
use super::inodes::{Inode, InodeKey};
use super::sys::{self, Caller};
use super::{Entry, Fs, Opened, RegisterBacking, cname};
use crate::accounting::HandleMode;
use crate::error::{Error, Kind, Result};

impl Fs {
    /// Flags of the lower open for an OPEN with the application's `flags`.
    ///
    /// O_CREAT/O_EXCL were handled by the kernel or CREATE. O_DIRECT is left out here: the
    /// kernel opens a passthrough open's backing file with the application's flags, O_DIRECT
    /// included; an open served by drainfs gets it afterwards (`Fs::install_handle`).
    ///
    /// O_APPEND is dropped: the kernel resolves append offsets itself. For a FUSE file opened
    /// with O_APPEND, `write(2)` holds the inode lock and sends WRITE at the offset the kernel
    /// computed from its i_size (`generic_write_checks`, cached and direct-io paths alike), and
    /// a passthrough write carries IOCB_APPEND to the backing file. Page writeback of a shared
    /// writable mapping sends WRITE at the page's offset. On Linux, `pwrite` on an O_APPEND fd
    /// ignores its offset and appends, so an O_APPEND lower fd would turn the mapping's writes
    /// into appends. (libfuse's passthrough_hp clears O_APPEND only with the writeback cache.)
    fn lower_open_flags(flags: i32) -> i32 {
        (flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY | libc::O_DIRECT | libc::O_APPEND))
            | libc::O_NOFOLLOW
    }

    fn mode_of(flags: i32) -> HandleMode {
        match flags & libc::O_ACCMODE {
            libc::O_RDONLY => HandleMode::Read,
            _ => HandleMode::Write,
        }
    }

    /// Installs a handle for `fd`. With `register`, the open uses kernel passthrough unless the
    /// kernel must not see it as one:
    /// - the inode already has opens served by drainfs (the kernel's cached io mode: a
    ///   passthrough open next to them fails with EIO), so this one is served by drainfs too;
    /// - `unprivileged_suid_writer`: a caller without CAP_FSETID opens a file that has
    ///   privilege bits for writing. With FUSE_HANDLE_KILLPRIV_V2 the kernel leaves clearing
    ///   them on write to drainfs, but passthrough writes never reach drainfs (and the backing
    ///   file writes with drainfs's credentials), so such an open is served by drainfs, whose
    ///   WRITEs carry FUSE_WRITE_KILL_SUIDGID. If the inode already has passthrough opens,
    ///   this open must be passthrough too: the bits are cleared now instead, at open.
    ///
    /// An O_DIRECT open served by drainfs gets O_DIRECT on its lower fd, as the kernel's
    /// backing file of a passthrough open has it: the application's `write()` returns once the
    /// lower has the data, not its page cache. (gcsfuse without streaming writes mounts with
    /// the kernel's writeback cache: a buffered write would reach gcsfuse later, e.g. after a
    /// rename that uploads the file without it, gcsfuse's local_file/TestRenameOfLocalFile.)
    /// A lower without direct I/O serves it buffered.
    fn install_handle(
        &self,
        inode: Arc<Inode>,
        fd: OwnedFd,
        flags: i32,
        register: RegisterBacking<'_>,
        unprivileged_suid_writer: Option<Caller>,
    ) -> Result<Opened> {
        let fd = Arc::new(fd);
        let writable = Self::mode_of(flags) == HandleMode::Write;
        let fh = self.handles.next_fh();
        let mut backing = None;
        {
            let mut files = inode.open.lock();
            let cached_mode = files.opens() > 0 && files.passthrough_opens() == 0;
            let suid_writer_alone =
                unprivileged_suid_writer.is_some() && files.passthrough_opens() == 0;
            let register = register
                .filter(|_| !cached_mode && !suid_writer_alone)
                .filter(|p| !p.only_if_shared || files.backing().is_some())
                .map(|p| p.register);
            if let Some(register) = register {
                if let Some(caller) = &unprivileged_suid_writer {
                    self.kill_privs(fd.as_fd(), caller)?;
                }
                backing = match files.backing() {
                    Some(b) => Some(Arc::clone(b)),
                    None => match register(fd.as_fd()) {
                        Ok(b) => Some(b),
                        Err(e) if files.opens() == 0 => {
                            tracing::debug!(nodeid = inode.nodeid, error = %e, "backing open failed; serving this open without passthrough");
                            None
                        }
                        // A registration happens only for an inode without opens (the
                        // filters above); should that change, an open must not be served
                        // differently from the inode's others: fail it.
                        Err(e) => return Err(Error::from(Kind::Passthrough).with_source(e)),
                    },
                };
            }
            files.add(fh, Arc::clone(&fd), backing.clone());
        }
        let direct = backing.is_none()
            && flags & libc::O_DIRECT != 0
            && inode.fmt == libc::S_IFREG
            && match sys::set_direct(fd.as_fd(), true) {
                Ok(()) => true,
                Err(e) => {
                    tracing::debug!(nodeid = inode.nodeid, error = %e, "the lower refused O_DIRECT; serving this O_DIRECT open buffered");
                    false
                }
            };
        let guard = self.acct.handle(Self::mode_of(flags));
        let handle = Handle {
            inode,
            fd,
            kind: HandleKind::File {
                writable,
                direct: AtomicBool::new(direct),
            },
            guard,
        };
        self.insert_handle(fh, handle)?;
        Ok(Opened { fh, backing })
    }

    /// OPEN: opens the lower file with the application's flags; with `register`, sets up
    /// kernel passthrough (one backing id per inode, shared by concurrent opens), except for
    /// the cases `Fs::install_handle` lists. `caller` is who opens (its uid stands for
    /// "lacks CAP_FSETID" when non-zero); an O_TRUNC open by such a caller clears the
    /// set-user-ID/set-group-ID bits [`privs_to_kill`] names, as a truncate by it would.
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; `ESTALE` when the name now names another inode;
    /// `EIO` when passthrough cannot be set up for an inode that has passthrough opens; else
    /// the lower's errno.
    pub fn open(
        &self,
        nodeid: u64,
        flags: i32,
        caller: Caller,
        register: RegisterBacking<'_>,
    ) -> Result<Opened> {
        let _admitted = self.admit(nodeid, None)?;
        let inode = self.inode(nodeid)?;
        let lflags = Self::lower_open_flags(flags);
        let fd = self.open_inode(&inode, lflags)?;
        if flags & libc::O_TRUNC != 0 && caller.uid != 0 && inode.fmt == libc::S_IFREG {
            // FUSE_ATOMIC_O_TRUNC: the truncate rides on this open, made with drainfs's
            // CAP_FSETID; the lower would have dropped the privilege bits for this caller.
            self.kill_privs(fd.as_fd(), &caller)?;
        }
        let register = if inode.fmt == libc::S_IFREG {
            register
        } else {
            None
        };
        let suid_writer =
            if register.is_some() && Self::mode_of(flags) == HandleMode::Write && caller.uid != 0 {
                let st = sys::fstat(fd.as_fd()).map_err(|e| self.lower_err(e))?;
                (privs_to_kill(st.st_mode, st.st_gid, &caller) != 0).then_some(caller)
            } else {
                None
            };
        self.install_handle(inode, fd, flags, register, suid_writer)
    }

    fn open_inode(&self, inode: &Arc<Inode>, lflags: i32) -> Result<OwnedFd> {
        if let Some(fd) = self.cached_fd(inode) {
            return sys::reopen(fd.as_fd(), lflags & !libc::O_NOFOLLOW)
                .map_err(|e| self.lower_err(e));
        }
        self.by_name(inode, |parent, name| {
            let pfd = self.inode_fd(parent)?;
            let fd = sys::openat(pfd.as_fd(), name, lflags, 0).map_err(|e| self.lower_err(e))?;
            let st = sys::fstat(fd.as_fd()).map_err(|e| self.lower_err(e))?;
            if InodeKey::of(&st) != inode.key {
                return Err(Kind::Stale.into());
            }
            Ok(fd)
        })
    }

    /// CREATE: creates and opens `parent/name` as the caller; passthrough as for [`Fs::open`].
    ///
    /// # Errors
    /// `ESHUTDOWN` once admission is closed; else the lower's errno (`EEXIST` with O_EXCL).
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        parent: u64,
        name: &OsStr,
        mode: u32,
        flags: i32,
        caller: Caller,
        register: RegisterBacking<'_>,
    ) -> Result<(Entry, Opened)> {
        let _admitted = self.admit(parent, Some(name))?;
        let parent = self.inode(parent)?;
        let name = cname(name)?;
        let pfd = self.inode_fd(&parent)?;
        let lflags = (flags & !(libc::O_NOCTTY | libc::O_DIRECT | libc::O_APPEND))
            | libc::O_CREAT
            | libc::O_NOFOLLOW;
        let fd = {
            let _creds = sys::CallerCreds::switch(caller).map_err(Kind::Credentials)?;
            sys::openat(pfd.as_fd(), &name, lflags, mode).map_err(|e| self.lower_err(e))?
        };
        let st = sys::fstat(fd.as_fd()).map_err(|e| self.lower_err(e))?;
        let entry = self.remember(&parent, &name, &st);
        let inode = self.inode(entry.nodeid)?;
        let suid_writer = (Self::mode_of(flags) == HandleMode::Write
            && caller.uid != 0
            && privs_to_kill(st.st_mode, st.st_gid, &caller) != 0)
            .then_some(caller);
        let opened = self.install_handle(inode, fd, flags, register, suid_writer);
        if opened.is_err() {
            self.forget(entry.nodeid, 1);
        }
        Ok((entry, opened?))
    }
}

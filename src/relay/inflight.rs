//! The relay's side of the accounting: requests in flight by `unique` (for the replies) and
//! open handles by `fh`, each holding the guard that counts it in the crate's
//! [`Accounting`] (the same counts, door and metrics the passthrough mount uses), and what to
//! do with each new kernel request. No I/O: the engine holds this under one mutex and performs
//! the I/O each decision names. The open handles' map is in `inflight/handles.rs`.
//!
//! # Race freedom
//! New requests enter the relay in one place, the engine's pump thread. It counts a
//! request with [`Accounting::op_owned`] (entering the gate) *before* it reads the door
//! ([`Accounting::door_open`]), and [`Inflight::admit`] keeps that guard in the in-flight map
//! until the daemon's reply has been written to the kernel. A handle created by an OPEN reply
//! is counted ([`Accounting::handle`]) before the OPEN's guard is dropped. So a drain that
//! closes the door and then observes the gate (see [`crate::gate`]) never misses an admitted
//! request or the handle it opened.

mod handles;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use serde::Serialize;

use self::handles::{OpenHandle, OpenHandles};
use super::names::Names;
use super::proto::{self, InHeader, NameOp, Opcode};
use crate::accounting::{Accounting, HandleMode, Op, OwnedOpGuard};

/// The accounting's operation for a FUSE opcode: BATCH_FORGET counts as `forget`, RENAME2 as
/// `rename`, TMPFILE as `create`, INIT as `init` (read-only: a daemon SIGKILLed before it
/// answered INIT had served nothing); other opcodes the passthrough mount never sees
/// (INTERRUPT, locks, ioctl, poll, unknown ones...) as `other`.
pub fn accounting_op(op: Opcode) -> Op {
    use Opcode as O;
    match op {
        O::Lookup => Op::Lookup,
        O::Forget | O::BatchForget => Op::Forget,
        O::Getattr | O::Statx => Op::Getattr,
        O::Setattr => Op::Setattr,
        O::Readlink => Op::Readlink,
        O::Symlink => Op::Symlink,
        O::Mknod => Op::Mknod,
        O::Mkdir => Op::Mkdir,
        O::Unlink => Op::Unlink,
        O::Rmdir => Op::Rmdir,
        O::Rename | O::Rename2 => Op::Rename,
        O::Link => Op::Link,
        O::Open => Op::Open,
        O::Create | O::Tmpfile => Op::Create,
        O::Read => Op::Read,
        O::Write => Op::Write,
        O::Statfs => Op::Statfs,
        O::Release => Op::Release,
        O::Fsync => Op::Fsync,
        O::Setxattr => Op::Setxattr,
        O::Getxattr => Op::Getxattr,
        O::Listxattr => Op::Listxattr,
        O::Removexattr => Op::Removexattr,
        O::Flush => Op::Flush,
        O::Opendir => Op::Opendir,
        O::Readdir => Op::Readdir,
        O::Readdirplus => Op::Readdirplus,
        O::Releasedir => Op::Releasedir,
        O::Fsyncdir => Op::Fsyncdir,
        O::Access => Op::Access,
        O::Fallocate => Op::Fallocate,
        O::Lseek => Op::Lseek,
        O::CopyFileRange => Op::CopyFileRange,
        O::Init => Op::Init,
        O::Getlk
        | O::Setlk
        | O::Setlkw
        | O::Interrupt
        | O::Bmap
        | O::Destroy
        | O::Ioctl
        | O::Poll
        | O::NotifyReply
        | O::Other(_) => Op::Other,
    }
}

/// One request awaiting the daemon's reply.
#[derive(Debug)]
pub struct Pending {
    /// The operation.
    pub opcode: Opcode,
    /// For OPEN/CREATE/TMPFILE/OPENDIR: the kind of handle a successful reply creates.
    pub opens: Option<HandleMode>,
    /// FLUSH, FSYNC: the handle it syncs and the changes admitted before it.
    syncs: Option<(u64, u64)>,
    /// The request's nodeid.
    nodeid: u64,
    /// What a successful reply does to names.
    names: Option<NameOp>,
    /// A FLUSH, FSYNC or RELEASE of a file open for writing ([`Inflight::admit`]'s
    /// `flushes_write`): when it was forwarded (the daemon's upload time is measured).
    started: Option<Instant>,
    /// Counts the request in the accounting until dropped.
    guard: OwnedOpGuard,
}

impl Pending {
    /// Marks the request as answered with an error (for the accounting's error counts).
    pub fn fail(&mut self) {
        self.guard.fail();
    }
}

/// What to do with a kernel request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Send it to the daemon (recorded as in flight when it expects a reply).
    Forward,
    /// Answer it here with this errno (header-only error reply).
    Reply(i32),
    /// Neither forward nor answer (a FORGET or INTERRUPT once the daemon is gone or stopping).
    Drop,
    /// A RELEASE of a handle open for writing with changes no successful FLUSH (nor a failed
    /// FLUSH/FSYNC) covered: send the daemon an FSYNC of the relay's own (`fsync_unique`, of
    /// `fh`, already in flight) first, and only once it is answered the RELEASE (recorded in
    /// flight); with `local_release` (a handle the relay opened itself) answer the RELEASE
    /// here instead of forwarding it.
    SyncFirst {
        /// The relay's own unique for the FSYNC ([`is_own_unique`]).
        fsync_unique: u64,
        /// The handle to sync.
        fh: u64,
        /// Answer the RELEASE with success here instead of forwarding it.
        local_release: bool,
    },
}

/// The relay's own requests (the FSYNC before a RELEASE) use uniques from here up, in steps
/// of 2 (bit 0 is the kernel's interrupt bit): the kernel's counter starts at 0 and never
/// gets near 2^63.
pub const OWN_UNIQUE_BASE: u64 = 1 << 63;

/// Whether `unique` belongs to a request the relay sent itself (its reply goes nowhere).
pub fn is_own_unique(unique: u64) -> bool {
    unique >= OWN_UNIQUE_BASE
}

/// Counters over the relay's life (relay-specific; request counts, durations and handles are
/// in the [`Accounting`]).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    /// Kernel requests forwarded to the daemon.
    pub forwarded: u64,
    /// Daemon replies written to the kernel.
    pub replies: u64,
    /// Requests refused by the door with ESHUTDOWN while draining.
    pub door_refused: u64,
    /// Requests answered EIO by the relay because the daemon was gone or being stopped.
    pub answered_daemon_gone: u64,
    /// Requests answered EIO because the relay could not forward them (EMSGSIZE, send error).
    pub answered_send_failed: u64,
    /// Replies the kernel no longer wanted (ENOENT: request aborted or interrupted).
    pub kernel_enoent: u64,
    /// Notifications (`unique == 0`) written to the kernel.
    pub notifications: u64,
    /// Notifications the kernel rejected (ENOENT, the usual one, is logged at debug level,
    /// any other errno as a warning). Not counted in `kernel_enoent`.
    pub notification_errors: u64,
    /// Interrupt replies (`unique & 1`) passed through.
    pub interrupt_replies: u64,
    /// FORGET and BATCH_FORGET messages forwarded (no reply expected, never in flight).
    pub forgets: u64,
    /// Notifications dropped because the notifier's queue was full (the kernel was not
    /// taking them).
    pub notifications_dropped: u64,
    /// FSYNCs the relay sent itself before forwarding a RELEASE (changes no FLUSH covered).
    pub relay_fsyncs: u64,
    /// OPENs the daemon answered ENOSYS that the relay answered with a handle of its own
    /// (the kernel stays out of its no-open mode, so RELEASE still comes).
    pub opens_answered: u64,
    /// Malformed messages (a header whose length does not match the bytes read).
    pub protocol_errors: u64,
    /// Replies for a `unique` the relay had no record of.
    pub unknown_replies: u64,
    /// Kernel READs and WRITEs the relay split into parts ([`crate::relay::split`]).
    pub split_requests: u64,
    /// Parts sent for them.
    pub split_parts: u64,
}

/// The relay's state. See the module doc for the counting invariant.
#[derive(Debug)]
pub struct Inflight {
    acct: Arc<Accounting>,
    pending: HashMap<u64, Pending>,
    /// The open handles.
    handles: OpenHandles,
    /// Paths of the nodeids the kernel knows, for naming open files.
    names: Names,
    /// Paths whose FLUSH, FSYNC or RELEASE of a file open for writing failed.
    failed_flushes: Vec<String>,
    stopping: bool,
    daemon_gone: bool,
    /// The daemon answered an FSYNC ENOSYS: it has none, the relay sends none of its own.
    no_fsync: bool,
    /// The next of the relay's own uniques.
    next_own: u64,
    /// Counters.
    pub counters: Counters,
}

impl Inflight {
    /// Empty state counting into `acct`.
    pub fn new(acct: Arc<Accounting>) -> Self {
        Inflight {
            acct,
            pending: HashMap::new(),
            handles: OpenHandles::default(),
            names: Names::default(),
            failed_flushes: Vec::new(),
            stopping: false,
            daemon_gone: false,
            no_fsync: false,
            next_own: OWN_UNIQUE_BASE,
            counters: Counters::default(),
        }
    }

    /// Decides what to do with a kernel request. `guard` counts it (taken before `door_open`
    /// was read); it is kept in the in-flight map when the request is forwarded and expects a
    /// reply, and dropped otherwise. RELEASE/RELEASEDIR drop their handle's guard here, at the
    /// request (the kernel considers the file closed once it sends RELEASE).
    pub fn admit(
        &mut self,
        h: &InHeader,
        body: &[u8],
        mut guard: OwnedOpGuard,
        door_open: bool,
    ) -> Admit {
        // Decided before RELEASE drops its handle.
        let flushes_write = self.flushes_write(h.opcode, body);
        let released = self.release_or_forget(h, body);
        if !h.opcode.expects_reply() {
            return self.admit_without_reply(h.opcode);
        }
        if let Some(errno) = self.refusal(h, door_open, flushes_write) {
            guard.fail();
            return Admit::Reply(errno);
        }
        let sync_first = match self.release_plan(h.opcode, body, released.as_ref()) {
            ReleasePlan::AnswerHere => return Admit::Reply(0),
            ReleasePlan::SyncFirst { fh, local_release } => Some((fh, local_release)),
            ReleasePlan::Forward => None,
        };
        if let Some(fh) = proto::written_fh(h.opcode, body) {
            for oh in self.handles.writers(fh) {
                oh.changes += 1;
            }
        }
        let pending = self.pending_request(h, body, guard, flushes_write);
        self.pending.insert(h.unique, pending);
        if h.opcode == Opcode::Write
            && let Some(n) = proto::write_size(body)
        {
            self.acct.bytes_written.fetch_add(u64::from(n), Relaxed);
        }
        self.counters.forwarded += 1;
        match sync_first {
            Some((fh, local_release)) => self.start_own_fsync(h.nodeid, fh, local_release),
            None => Admit::Forward,
        }
    }

    /// What a request does to the state before anything else: a RELEASE/RELEASEDIR removes
    /// its handle (returned with its mode), a FORGET/BATCH_FORGET lowers lookup counts.
    fn release_or_forget(&mut self, h: &InHeader, body: &[u8]) -> Option<(HandleMode, OpenHandle)> {
        match h.opcode {
            Opcode::Release | Opcode::Releasedir => return self.remove_handle(h.opcode, body),
            // fuse_forget_in: nlookup.
            Opcode::Forget => {
                if let Some(n) = proto::u64_at(body, 0) {
                    self.names.forget(h.nodeid, n);
                }
            }
            // fuse_batch_forget_in (count, dummy), then fuse_forget_one (nodeid, nlookup).
            Opcode::BatchForget => {
                let count = proto::u32_at(body, 0).unwrap_or(0) as usize;
                for one in body.get(8..).unwrap_or(&[]).chunks_exact(16).take(count) {
                    if let (Some(id), Some(n)) = (proto::u64_at(one, 0), proto::u64_at(one, 8)) {
                        self.names.forget(id, n);
                    }
                }
            }
            _ => {}
        }
        None
    }

    /// A request that expects no reply (FORGET, BATCH_FORGET, INTERRUPT, ...): forwarded, or
    /// dropped once the daemon is gone or being stopped.
    fn admit_without_reply(&mut self, opcode: Opcode) -> Admit {
        if self.daemon_gone || self.stopping {
            return Admit::Drop;
        }
        if matches!(opcode, Opcode::Forget | Opcode::BatchForget) {
            self.counters.forgets += 1;
        }
        self.counters.forwarded += 1;
        Admit::Forward
    }

    /// The errno the relay answers a request with itself, if any: EIO once the daemon is gone
    /// or being stopped (a FLUSH/FSYNC/RELEASE of a file open for writing so answered is a
    /// failed flush), ESHUTDOWN for a door-guarded request once the door is closed.
    fn refusal(&mut self, h: &InHeader, door_open: bool, flushes_write: bool) -> Option<i32> {
        if self.daemon_gone || self.stopping {
            self.counters.answered_daemon_gone += 1;
            if flushes_write {
                self.record_failed_flush(h.opcode, h.nodeid, libc::EIO);
            }
            return Some(libc::EIO);
        }
        if !door_open && h.opcode.is_door_guarded() {
            self.counters.door_refused += 1;
            return Some(libc::ESHUTDOWN);
        }
        None
    }

    /// What a RELEASE of the handle it `released` needs. A handle open for writing with
    /// changes no successful FLUSH (nor a failed FLUSH/FSYNC) covered (a write through a
    /// mapping after the last close, then munmap: WRITE then RELEASE, no FLUSH) gets an FSYNC
    /// of the relay's own first: a daemon that uploads only at FLUSH/FSYNC, as gcsfuse does,
    /// would otherwise drop the change (none when the daemon has no FSYNC). A handle the relay
    /// opened itself is answered here: the daemon never saw it.
    fn release_plan(
        &self,
        opcode: Opcode,
        body: &[u8],
        released: Option<&(HandleMode, OpenHandle)>,
    ) -> ReleasePlan {
        let Some((mode, oh)) = released.filter(|_| opcode == Opcode::Release) else {
            return ReleasePlan::Forward;
        };
        if *mode == HandleMode::Write && oh.needs_sync() && !self.no_fsync {
            return ReleasePlan::SyncFirst {
                fh: proto::release_fh(body).unwrap_or(0),
                local_release: oh.synthetic,
            };
        }
        if oh.synthetic {
            ReleasePlan::AnswerHere
        } else {
            ReleasePlan::Forward
        }
    }

    /// The in-flight record of a forwarded request: for FLUSH/FSYNC the handle it syncs and
    /// the changes admitted before it, for OPEN/CREATE/TMPFILE/OPENDIR the kind of handle its
    /// reply creates, what its reply does to names, and (`flushes_write`) when it started.
    fn pending_request(
        &self,
        h: &InHeader,
        body: &[u8],
        guard: OwnedOpGuard,
        flushes_write: bool,
    ) -> Pending {
        let syncs = match h.opcode {
            // fuse_flush_in and fuse_fsync_in start with fh.
            Opcode::Flush | Opcode::Fsync => {
                proto::u64_at(body, 0).map(|fh| (fh, self.handles.changes(fh)))
            }
            _ => None,
        };
        Pending {
            opcode: h.opcode,
            opens: opened_mode(h.opcode, body),
            syncs,
            nodeid: h.nodeid,
            names: proto::name_op(h.opcode, h.nodeid, body),
            started: flushes_write.then(Instant::now),
            guard,
        }
    }

    /// Records an FSYNC of the relay's own of `fh` (on `nodeid`) in flight, under the next
    /// of its uniques, for the RELEASE that waits for it.
    fn start_own_fsync(&mut self, nodeid: u64, fh: u64, local_release: bool) -> Admit {
        let fsync_unique = self.next_own;
        self.next_own = self.next_own.wrapping_add(2).max(OWN_UNIQUE_BASE);
        self.pending.insert(
            fsync_unique,
            Pending {
                opcode: Opcode::Fsync,
                opens: None,
                syncs: None,
                nodeid,
                names: None,
                started: Some(Instant::now()),
                guard: self.acct.op_owned(Op::Fsync),
            },
        );
        self.counters.relay_fsyncs += 1;
        Admit::SyncFirst {
            fsync_unique,
            fh,
            local_release,
        }
    }

    /// Whether a request is a FLUSH or FSYNC of a handle open for writing (or of an `fh` the
    /// relay has not seen open read-only), or the RELEASE of a file opened for writing: where
    /// a daemon such as gcsfuse uploads, so its failure may lose data.
    fn flushes_write(&self, opcode: Opcode, body: &[u8]) -> bool {
        match opcode {
            // fuse_flush_in and fuse_fsync_in start with fh.
            Opcode::Flush | Opcode::Fsync => proto::u64_at(body, 0).is_some_and(|fh| {
                self.handles.is_open(HandleMode::Write, fh)
                    || !self.handles.is_open(HandleMode::Read, fh)
            }),
            // fuse_release_in: fh, then the flags the file was opened with.
            Opcode::Release => proto::u32_at(body, 8).is_some_and(proto::is_write_intent),
            _ => false,
        }
    }

    /// Removes the handle a RELEASE/RELEASEDIR names; returns it with its mode.
    fn remove_handle(&mut self, opcode: Opcode, body: &[u8]) -> Option<(HandleMode, OpenHandle)> {
        let fh = proto::release_fh(body)?;
        // fuse_release_in: fh, then the flags the file was opened with.
        let flags = proto::u32_at(body, 8).unwrap_or(0);
        let modes: &[HandleMode] = if opcode == Opcode::Releasedir {
            &[HandleMode::Dir]
        } else if proto::is_write_intent(flags) {
            &[HandleMode::Write, HandleMode::Read]
        } else {
            &[HandleMode::Read, HandleMode::Write]
        };
        self.handles.remove(fh, modes)
    }

    /// Looks at a daemon reply before it is written to the kernel: returns the opcode of the
    /// request it answers (`None` for an unknown `unique`), and counts the handle a successful
    /// OPEN/CREATE/OPENDIR reply creates, so that it is known before the kernel can send its
    /// RELEASE and before the request stops counting. Also: a failed FLUSH/FSYNC/RELEASE of a
    /// file open for writing is recorded as a failed flush (ENOSYS aside), the flush's duration
    /// and the bytes a READ returned are counted, and names are learned ([`Names`]).
    pub fn on_reply(&mut self, unique: u64, error: i32, body: &[u8]) -> Option<Opcode> {
        let Some(p) = self.pending.get_mut(&unique) else {
            self.counters.unknown_replies += 1;
            return None;
        };
        if let Some(t0) = p.started
            && p.opcode != Opcode::Release
        {
            self.acct.lower_flush_duration.observe(t0.elapsed());
        }
        if p.opcode == Opcode::Open && error == -libc::ENOSYS {
            let (opens, nodeid) = (p.opens, p.nodeid);
            self.open_answered_here(opens, nodeid);
            return Some(Opcode::Open);
        }
        if error != 0 {
            p.fail();
            let (opcode, nodeid, syncs) = (p.opcode, p.nodeid, p.syncs);
            let flushing = p.started.is_some();
            self.on_error_reply(unique, -error, opcode, nodeid, syncs, flushing);
            return Some(opcode);
        }
        if p.opcode == Opcode::Read {
            self.acct.bytes_read.fetch_add(body.len() as u64, Relaxed);
        }
        // Only a FLUSH counts as synced: an FSYNC does not finalize a streaming write.
        if let Some((fh, changes)) = p.syncs.filter(|_| p.opcode == Opcode::Flush) {
            self.handles.mark_synced(fh, changes);
        }
        let nodeid = learn_names(&mut self.names, p.names.as_ref(), body).unwrap_or(p.nodeid);
        if let Some(mode) = p.opens
            && let Some(fh) = proto::reply_fh(p.opcode, body)
        {
            let oh = OpenHandle::new(self.acct.handle(mode), nodeid, mode, false);
            self.handles.add(mode, fh, oh);
        }
        Some(p.opcode)
    }

    /// An OPEN the daemon answered ENOSYS: the engine answers the kernel's OPEN with a handle
    /// of its own (fh 0, what the kernel would use in its no-open mode), counted here, so the
    /// kernel keeps sending RELEASE and a writer keeps counting.
    fn open_answered_here(&mut self, opens: Option<HandleMode>, nodeid: u64) {
        if let Some(mode) = opens {
            let oh = OpenHandle::new(self.acct.handle(mode), nodeid, mode, true);
            self.handles.add(mode, 0, oh);
        }
        self.counters.opens_answered += 1;
    }

    /// An error reply (`errno`, positive) to the request `unique`. ENOSYS means the daemon has
    /// no such request (the kernel then stops sending it): it attempted nothing and nothing
    /// failed, and after an FSYNC of the relay's own the relay sends no more. Any other errno
    /// counts as an attempt on the handle a FLUSH/FSYNC (`syncs`) covered, and a `flushing`
    /// request so answered is a failed flush.
    fn on_error_reply(
        &mut self,
        unique: u64,
        errno: i32,
        opcode: Opcode,
        nodeid: u64,
        syncs: Option<(u64, u64)>,
        flushing: bool,
    ) {
        if errno == libc::ENOSYS {
            if opcode == Opcode::Fsync && is_own_unique(unique) {
                self.no_fsync = true;
            }
            return;
        }
        if let Some((fh, changes)) = syncs {
            self.handles.mark_attempted(fh, changes);
        }
        if flushing {
            self.record_failed_flush(opcode, nodeid, errno);
        }
    }

    /// Paths of the open handles (files open for writing first), at most `cap`, for
    /// `/status` and the shutdown summary.
    pub fn open_paths(&self, cap: usize) -> Vec<(String, HandleMode)> {
        let mut v: Vec<(HandleMode, u64)> = self
            .handles
            .iter()
            .map(|(mode, oh)| (mode, oh.nodeid))
            .collect();
        v.sort_by_key(|(mode, id)| (*mode != HandleMode::Write, *id));
        v.into_iter()
            .take(cap)
            .map(|(mode, id)| (self.names.path(id), mode))
            .collect()
    }

    /// Paths of the files open for writing that were written (or created or truncated) since
    /// their last successful FLUSH.
    pub fn unsynced_paths(&self) -> Vec<String> {
        let mut ids: Vec<u64> = self
            .handles
            .iter()
            .filter(|(mode, oh)| *mode == HandleMode::Write && oh.unsynced())
            .map(|(_, oh)| oh.nodeid)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter().map(|id| self.names.path(id)).collect()
    }

    /// Paths of the OPEN/CREATE requests awaiting the daemon's reply, at most `cap`.
    pub fn admitted_paths(&self, cap: usize) -> Vec<String> {
        self.pending
            .values()
            .filter(|p| p.opens.is_some())
            .take(cap)
            .map(|p| match &p.names {
                Some(NameOp::Entry { parent, name }) => self.names.child_path(*parent, name),
                _ => self.names.path(p.nodeid),
            })
            .collect()
    }

    /// Counts a FLUSH, FSYNC or RELEASE that failed (answered `errno` by the daemon, or EIO by
    /// the relay because the daemon is gone or unreachable): an upload that may be missing.
    fn record_failed_flush(&mut self, opcode: Opcode, nodeid: u64, errno: i32) {
        self.acct.lower_flush_errors.fetch_add(1, Relaxed);
        let path = self.names.path(nodeid);
        tracing::warn!(
            op = opcode.name(),
            path = %path,
            errno,
            "relay: a flush failed: the object may not be uploaded"
        );
        self.failed_flushes.push(path);
    }

    /// Paths whose FLUSH, FSYNC or RELEASE the daemon answered with an error (ENOSYS aside),
    /// in the order seen.
    pub fn failed_flushes(&self) -> Vec<String> {
        self.failed_flushes.clone()
    }

    /// Nodeids whose path is known.
    pub fn known_names(&self) -> usize {
        self.names.len()
    }

    /// Marks a request finished (its reply was written to the kernel, or it was answered by
    /// the relay): it stops counting. Returns whether it was in flight.
    pub fn complete(&mut self, unique: u64) -> bool {
        self.pending.remove(&unique).is_some()
    }

    /// Takes one request out of the in-flight map, for the caller to answer it EIO (still
    /// counted until the returned value is dropped); a FLUSH, FSYNC or RELEASE so answered is
    /// a failed flush.
    pub fn take(&mut self, unique: u64) -> Option<Pending> {
        let p = self.pending.remove(&unique)?;
        if p.started.is_some() {
            self.record_failed_flush(p.opcode, p.nodeid, libc::EIO);
        }
        Some(p)
    }

    /// The relay is stopping the daemon (SHUT_WR): later requests are answered EIO.
    pub fn begin_stop(&mut self) {
        self.stopping = true;
    }

    /// Whether [`Inflight::begin_stop`] was called.
    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// The daemon is gone: later requests are answered EIO. Returns every in-flight request
    /// (removed from the map, still counted until dropped), for the caller to answer EIO.
    pub fn daemon_gone(&mut self) -> Vec<(u64, Pending)> {
        self.daemon_gone = true;
        let mut all: Vec<(u64, Pending)> = self.pending.drain().collect();
        all.sort_by_key(|(u, _)| *u);
        for (_, p) in &all {
            if p.started.is_some() {
                self.record_failed_flush(p.opcode, p.nodeid, libc::EIO);
            }
        }
        all
    }

    /// Whether [`Inflight::daemon_gone`] was called.
    pub fn is_daemon_gone(&self) -> bool {
        self.daemon_gone
    }

    /// The kernel side is gone: no RELEASE will ever come, so every handle stops counting.
    /// Returns how many there were.
    pub fn release_all_handles(&mut self) -> usize {
        self.handles.clear()
    }

    /// Requests awaiting a reply.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }
}

/// What a RELEASE needs before it goes on ([`Inflight::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReleasePlan {
    /// Forward it (or it is no RELEASE of a known handle).
    Forward,
    /// Answer it with success here: a handle the relay opened itself.
    AnswerHere,
    /// An FSYNC of the relay's own of `fh` first ([`Admit::SyncFirst`]).
    SyncFirst {
        /// The handle to sync.
        fh: u64,
        /// The handle is the relay's own: answer the RELEASE here once the FSYNC is answered.
        local_release: bool,
    },
}

/// The kind of handle a successful reply to `opcode` creates: OPEN/CREATE/TMPFILE by the
/// write intent of their flags, OPENDIR a directory; `None` for anything else.
fn opened_mode(opcode: Opcode, body: &[u8]) -> Option<HandleMode> {
    match opcode {
        Opcode::Open | Opcode::Create | Opcode::Tmpfile => {
            let flags = proto::open_flags(body).unwrap_or(0);
            Some(if proto::is_write_intent(flags) {
                HandleMode::Write
            } else {
                HandleMode::Read
            })
        }
        Opcode::Opendir => Some(HandleMode::Dir),
        _ => None,
    }
}

/// What a successful reply does to `names`: an entry reply names the nodeid it returns (and
/// returns it), UNLINK/RMDIR and RENAME/RENAME2 unlink or move names, READDIRPLUS names every
/// entry. `None` unless an entry reply gave a nodeid.
fn learn_names(names: &mut Names, op: Option<&NameOp>, body: &[u8]) -> Option<u64> {
    match op? {
        NameOp::Entry { parent, name } => {
            let id = proto::entry_nodeid(body)?;
            names.entry(*parent, name, id);
            return Some(id);
        }
        NameOp::Unlink { parent, name } => names.unlink(*parent, name),
        NameOp::Rename {
            olddir,
            old,
            newdir,
            new,
            exchange,
        } => names.rename(*olddir, old, *newdir, new, *exchange),
        NameOp::Readdirplus { parent } => {
            for (id, name) in proto::direntplus_entries(body) {
                names.entry(*parent, name, id);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests;

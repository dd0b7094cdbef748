//! The relay's open handles: one [`OpenHandle`] per open the daemon (or the relay itself)
//! answered, by mode and `fh`, each holding the guard that counts it in the accounting and the
//! changes it has seen, synced and attempted to sync. Kept apart from the requests in flight
//! (as virtiofsd keeps its handle map apart from its inode map). Pure state, no I/O.

use std::collections::HashMap;

use crate::accounting::{HandleGuard, HandleMode};

/// One open handle: the guard that counts it, its nodeid, and how many changes it has seen
/// and a successful FLUSH covered (a FLUSH covers the changes admitted before it). A
/// successful FSYNC does not count as covering them: gcsfuse's streaming writes (its default)
/// put an object in the bucket only at a FLUSH, never at an FSYNC.
#[derive(Debug)]
pub(super) struct OpenHandle {
    _guard: HandleGuard,
    /// The nodeid it was opened on (of the entry a CREATE made).
    pub(super) nodeid: u64,
    /// Changes admitted (WRITE, FALLOCATE, ...), plus 1 for the open itself when it is open
    /// for writing: the kernel may change the file without a WRITE the relay sees (a dirty
    /// `MAP_SHARED` page, the writeback cache), so only a successful FLUSH after the open
    /// makes it synced.
    pub(super) changes: u64,
    /// Changes a successful FLUSH covered.
    pub(super) synced: u64,
    /// Changes a failed FLUSH/FSYNC covered (ENOSYS aside): a failed one is a failed flush
    /// already, and the caller got its error.
    pub(super) attempted: u64,
    /// The daemon answered its OPEN with ENOSYS and the relay answered the kernel with this
    /// handle itself (fh 0): the daemon never sees its RELEASE.
    pub(super) synthetic: bool,
}

impl OpenHandle {
    /// A handle just opened on `nodeid`, counted by `guard`; one open for writing starts with
    /// one change (the open itself).
    pub(super) fn new(guard: HandleGuard, nodeid: u64, mode: HandleMode, synthetic: bool) -> Self {
        OpenHandle {
            _guard: guard,
            nodeid,
            changes: u64::from(mode == HandleMode::Write),
            synced: 0,
            attempted: 0,
            synthetic,
        }
    }

    /// Changed since its last successful FLUSH.
    pub(super) fn unsynced(&self) -> bool {
        self.changes > self.synced
    }

    /// Changed since its last successful FLUSH or failed FLUSH/FSYNC (a successful FSYNC
    /// covers nothing): its RELEASE needs an FSYNC first.
    pub(super) fn needs_sync(&self) -> bool {
        self.changes > self.synced.max(self.attempted)
    }
}

/// (mode, fh) → one [`OpenHandle`] per open that returned that fh (daemons such as libfuse's
/// examples return fh 0 for every open).
#[derive(Debug, Default)]
pub(super) struct OpenHandles(HashMap<(HandleMode, u64), Vec<OpenHandle>>);

impl OpenHandles {
    /// Records a handle `fh` of `mode`.
    pub(super) fn add(&mut self, mode: HandleMode, fh: u64, oh: OpenHandle) {
        self.0.entry((mode, fh)).or_default().push(oh);
    }

    /// Whether some handle `fh` of `mode` is open.
    pub(super) fn is_open(&self, mode: HandleMode, fh: u64) -> bool {
        self.0.contains_key(&(mode, fh))
    }

    /// The handles `fh` open for writing.
    pub(super) fn writers(&mut self, fh: u64) -> impl Iterator<Item = &mut OpenHandle> {
        self.0
            .get_mut(&(HandleMode::Write, fh))
            .into_iter()
            .flatten()
    }

    /// The most changes any handle `fh` open for writing has seen (0: none open).
    pub(super) fn changes(&self, fh: u64) -> u64 {
        self.0
            .get(&(HandleMode::Write, fh))
            .into_iter()
            .flatten()
            .map(|oh| oh.changes)
            .max()
            .unwrap_or(0)
    }

    /// A FLUSH/FSYNC that covered `changes` of the writers `fh` failed (ENOSYS aside): those
    /// need no FSYNC of the relay's own.
    pub(super) fn mark_attempted(&mut self, fh: u64, changes: u64) {
        for oh in self.writers(fh) {
            oh.attempted = oh.attempted.max(changes.min(oh.changes));
        }
    }

    /// A FLUSH that covered `changes` of the writers `fh` succeeded: those changes are synced.
    pub(super) fn mark_synced(&mut self, fh: u64, changes: u64) {
        for oh in self.writers(fh) {
            oh.synced = oh.synced.max(changes.min(oh.changes));
        }
    }

    /// Removes one handle `fh`, of the first of `modes` that has one; returns it with its mode.
    pub(super) fn remove(
        &mut self,
        fh: u64,
        modes: &[HandleMode],
    ) -> Option<(HandleMode, OpenHandle)> {
        for mode in modes {
            if let Some(v) = self.0.get_mut(&(*mode, fh)) {
                let oh = v.pop();
                if v.is_empty() {
                    self.0.remove(&(*mode, fh));
                }
                return oh.map(|oh| (*mode, oh));
            }
        }
        None
    }

    /// Every open handle with its mode, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (HandleMode, &OpenHandle)> {
        self.0
            .iter()
            .flat_map(|((mode, _), hs)| hs.iter().map(move |oh| (*mode, oh)))
    }

    /// Drops every handle (each stops counting); returns how many there were.
    pub(super) fn clear(&mut self) -> usize {
        let n = self.0.values().map(Vec::len).sum();
        self.0.clear();
        n
    }
}

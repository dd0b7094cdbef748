//! The inode store: every inode the kernel knows, keyed by nodeid and by the lower's
//! `(st_dev, st_ino)`, with its lookup count and the names it was last seen under.
//!
//! Identity follows virtiofsd and fuse-backend-rs (`inode_store.rs`): a lookup of a known key
//! reuses its inode, so hard links share one nodeid and a rename that keeps the lower's key
//! keeps the nodeid; nodeids are never reused; the root is pinned. A key is never changed: when
//! the lower gives a name a new key (gcsfuse's renames), the name leaves the old inode
//! ([`Inode::remove_location`]) and the next lookup makes or finds the inode of the new key. The lookup count is raised while the store's write guard
//! is held when the inode was found under it, so a concurrent FORGET either removed the inode
//! before (and the lookup creates a new one) or sees the new reference.
//!
//! Lock order (see also [`crate::fs`]): the store's `map` guard may be held while taking an
//! [`Inode`]'s `locs` lock ([`InodeStore::remember`] records the name under the read guard)
//! or the `reserved` lock (under the write guard); neither of those is held while taking any
//! other lock.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

use parking_lot::{Mutex, RwLock};

use super::open_files::OpenFiles;
use super::sys::Stat;

/// The root's nodeid (FUSE_ROOT_ID).
pub const ROOT_ID: u64 = 1;

/// How many names (parent + name) an inode remembers for finding it again without an fd.
const MAX_NAMES: usize = 4;

/// How many READDIR-reserved nodeids are remembered (about 64 bytes each).
const RESERVED_NODEIDS: usize = 65_536;

/// The lower's identity of an inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct InodeKey {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl InodeKey {
    /// The key of the inode `st` describes.
    pub fn of(st: &Stat) -> Self {
        InodeKey {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// One name of an inode: its parent and the name in it.
#[derive(Debug)]
struct Location {
    parent: Arc<Inode>,
    name: CString,
}

/// An inode the kernel knows (lookup count > 0) or that an open handle still refers to.
pub struct Inode {
    /// FUSE nodeid; never reused.
    pub nodeid: u64,
    /// Lower identity.
    pub key: InodeKey,
    /// `st_mode & S_IFMT`.
    pub fmt: u32,
    /// The kernel's lookup count; the inode leaves the store at zero.
    pub(super) lookups: AtomicU64,
    /// Names the inode is known under (most recent first, at most [`MAX_NAMES`]): hard
    /// links give it several, and a removed one must not make it unreachable. A leaf lock.
    locs: Mutex<Vec<Location>>,
    /// The open files of this inode (see [`OpenFiles`]). Held across the backing-id
    /// registration of an open; no other lock is taken while it is held.
    pub(super) open: Mutex<OpenFiles>,
    /// Set when the lower gave this inode's name a new identity (a rename on gcsfuse): the
    /// nodeid then stands for a lower inode no name reaches any more, and only its open
    /// handles keep using it ([`Inode::detach`]).
    detached: AtomicBool,
}

impl std::fmt::Debug for Inode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inode")
            .field("nodeid", &self.nodeid)
            .field("key", &self.key)
            .finish()
    }
}

impl Inode {
    /// The root inode (lookup count 1, pinned, no name).
    pub(super) fn root(st: &Stat) -> Arc<Self> {
        Arc::new(Inode {
            nodeid: ROOT_ID,
            key: InodeKey::of(st),
            fmt: st.st_mode & libc::S_IFMT,
            lookups: AtomicU64::new(1),
            locs: Mutex::new(Vec::new()),
            open: Mutex::new(OpenFiles::default()),
            detached: AtomicBool::new(false),
        })
    }

    /// Records `parent/name` as the most recent name of this inode.
    pub(super) fn set_location(&self, parent: &Arc<Inode>, name: &CStr) {
        let mut locs = self.locs.lock();
        if let Some(first) = locs.first()
            && first.parent.nodeid == parent.nodeid
            && first.name.as_c_str() == name
        {
            return;
        }
        locs.retain(|l| !(l.parent.nodeid == parent.nodeid && l.name.as_c_str() == name));
        locs.insert(
            0,
            Location {
                parent: Arc::clone(parent),
                name: name.to_owned(),
            },
        );
        locs.truncate(MAX_NAMES);
    }

    /// Forgets the name `parent/name` (renamed away, or no longer naming this inode).
    pub(super) fn remove_location(&self, parent: u64, name: &CStr) {
        self.locs
            .lock()
            .retain(|l| !(l.parent.nodeid == parent && l.name.as_c_str() == name));
    }

    /// Whether `parent/name` is one of the remembered names.
    pub(super) fn remembers(&self, parent: u64, name: &CStr) -> bool {
        self.locs
            .lock()
            .iter()
            .any(|l| l.parent.nodeid == parent && l.name.as_c_str() == name)
    }

    /// The remembered names, most recent first.
    pub(super) fn locations(&self) -> Vec<(Arc<Inode>, CString)> {
        self.locs
            .lock()
            .iter()
            .map(|l| (Arc::clone(&l.parent), l.name.clone()))
            .collect()
    }

    fn first_location(&self) -> Option<(Arc<Inode>, CString)> {
        self.locs
            .lock()
            .first()
            .map(|l| (Arc::clone(&l.parent), l.name.clone()))
    }

    /// Whether `dir` is a proper ancestor of this inode through the names it was last seen
    /// under (the most recent name of each inode on the way up; a directory has one).
    pub(super) fn has_ancestor(&self, dir: u64) -> bool {
        let mut cur = self.first_location();
        let mut depth = 0;
        while let Some((parent, _)) = cur {
            if parent.nodeid == dir {
                return true;
            }
            depth += 1;
            if parent.nodeid == ROOT_ID || depth > 4096 {
                return false;
            }
            cur = parent.first_location();
        }
        false
    }

    /// Marks the inode detached: its lower inode is no longer what any name of the lower
    /// reaches (gcsfuse made the renamed name, or a name under a renamed directory, a new
    /// inode). From then on nothing reaches the lower through this nodeid but its open
    /// handles (by fh): no cached or open-file fd serves a request by nodeid, so an OPEN or
    /// GETATTR that reaches it through an entry the kernel has not yet dropped fails with
    /// `ESTALE` (see [`Inode::is_detached`]).
    pub(super) fn detach(&self) {
        self.detached.store(true, SeqCst);
    }

    /// Whether [`Inode::detach`] was called.
    pub(super) fn is_detached(&self) -> bool {
        self.detached.load(SeqCst)
    }

    /// The lower fd of one of this inode's open files, if any.
    pub(super) fn open_fd(&self) -> Option<Arc<OwnedFd>> {
        self.open.lock().any_fd()
    }

    /// The inode's path relative to the lower root, as last known (for logs and the shutdown
    /// summary only; never used to reach the lower).
    pub fn path(&self) -> PathBuf {
        let mut parts: Vec<CString> = Vec::new();
        let mut cur = self.first_location();
        while let Some((parent, name)) = cur {
            parts.push(name);
            if parts.len() > 4096 {
                break;
            }
            cur = parent.first_location();
        }
        let mut p = PathBuf::new();
        for n in parts.iter().rev() {
            p.push(OsStr::from_bytes(n.as_bytes()));
        }
        p
    }
}

#[derive(Default)]
struct Maps {
    by_id: HashMap<u64, Arc<Inode>>,
    by_key: HashMap<InodeKey, u64>,
}

/// The inode store (see the module doc).
pub(super) struct InodeStore {
    root: Arc<Inode>,
    /// Both maps under one lock. May be held while taking `Inode::locs` or `reserved`.
    map: RwLock<Maps>,
    next_nodeid: AtomicU64,
    /// Nodeids handed out as READDIR `d_ino` before any LOOKUP (see
    /// [`InodeStore::dirent_nodeid`]). A leaf lock.
    reserved: Mutex<lru::LruCache<InodeKey, u64>>,
}

impl InodeStore {
    /// A store holding only `root`.
    pub(super) fn new(root: Arc<Inode>) -> Self {
        let mut map = Maps::default();
        map.by_id.insert(ROOT_ID, Arc::clone(&root));
        map.by_key.insert(root.key, ROOT_ID);
        InodeStore {
            root,
            map: RwLock::new(map),
            next_nodeid: AtomicU64::new(ROOT_ID + 1),
            reserved: Mutex::new(lru::LruCache::new(
                NonZeroUsize::new(RESERVED_NODEIDS).expect("non-zero"),
            )),
        }
    }

    /// The root inode.
    pub(super) fn root(&self) -> &Arc<Inode> {
        &self.root
    }

    /// Number of inodes known (including the root).
    pub(super) fn len(&self) -> usize {
        self.map.read().by_id.len()
    }

    /// The inode `nodeid`, if the kernel still knows it.
    pub(super) fn get(&self, nodeid: u64) -> Option<Arc<Inode>> {
        if nodeid == ROOT_ID {
            return Some(Arc::clone(&self.root));
        }
        self.map.read().by_id.get(&nodeid).cloned()
    }

    /// The inode of lower identity `key`, if known.
    pub(super) fn by_key(&self, key: InodeKey) -> Option<Arc<Inode>> {
        let map = self.map.read();
        map.by_key
            .get(&key)
            .and_then(|id| map.by_id.get(id))
            .cloned()
    }

    /// Every known inode.
    pub(super) fn all(&self) -> Vec<Arc<Inode>> {
        self.map.read().by_id.values().cloned().collect()
    }

    /// Every known inode that remembers the name `parent/name` (a scan of the store).
    pub(super) fn known_under(&self, parent: u64, name: &CStr) -> Vec<Arc<Inode>> {
        let all = self.all();
        all.into_iter()
            .filter(|i| i.remembers(parent, name))
            .collect()
    }

    /// Finds or creates the inode for `st` at `parent/name`, takes one lookup reference and
    /// returns its nodeid.
    pub(super) fn remember(&self, parent: &Arc<Inode>, name: &CStr, st: &Stat) -> u64 {
        let key = InodeKey::of(st);
        {
            let map = self.map.read();
            if let Some(id) = map.by_key.get(&key) {
                let inode = &map.by_id[id];
                inode.lookups.fetch_add(1, SeqCst);
                if inode.nodeid != ROOT_ID {
                    inode.set_location(parent, name);
                }
                return *id;
            }
        }
        #[cfg(test)]
        super::tests::hook(super::tests::Point::BeforeWriteGuard);
        let mut map = self.map.write();
        if let Some(id) = map.by_key.get(&key).copied() {
            let inode = Arc::clone(&map.by_id[&id]);
            // Counted while the write guard is held: a FORGET (which takes the write guard)
            // either ran before and removed nothing we hold, or runs after and sees this
            // reference (fuse-backend-rs `do_lookup`).
            inode.lookups.fetch_add(1, SeqCst);
            drop(map);
            #[cfg(test)]
            super::tests::hook(super::tests::Point::AfterCountedUnderWriteGuard);
            inode.set_location(parent, name);
            return id;
        }
        let reserved = self.reserved.lock().pop(&key);
        let nodeid = reserved.unwrap_or_else(|| self.next_nodeid.fetch_add(1, Relaxed));
        let inode = Arc::new(Inode {
            nodeid,
            key,
            fmt: st.st_mode & libc::S_IFMT,
            lookups: AtomicU64::new(1),
            locs: Mutex::new(vec![Location {
                parent: Arc::clone(parent),
                name: name.to_owned(),
            }]),
            open: Mutex::new(OpenFiles::default()),
            detached: AtomicBool::new(false),
        });
        map.by_id.insert(nodeid, inode);
        map.by_key.insert(key, nodeid);
        nodeid
    }

    /// Drops `nlookup` references of `nodeid` (saturating); returns true when that removed the
    /// inode from the store. The root is never removed.
    pub(super) fn forget(&self, nodeid: u64, nlookup: u64) -> bool {
        if nodeid == ROOT_ID {
            return false;
        }
        let mut map = self.map.write();
        let Some(inode) = map.by_id.get(&nodeid) else {
            return false;
        };
        let now = inode.lookups.load(SeqCst).saturating_sub(nlookup);
        inode.lookups.store(now, SeqCst);
        if now != 0 {
            return false;
        }
        let key = inode.key;
        map.by_id.remove(&nodeid);
        if map.by_key.get(&key) == Some(&nodeid) {
            map.by_key.remove(&key);
        }
        true
    }

    /// Unbinds the lower identities of `nodeids` from them: the next LOOKUP or READDIR that
    /// meets one of those `(st_dev, st_ino)` gets a new nodeid. For inodes whose lower inode
    /// is gone (a rename on gcsfuse is a copy and a delete): a lower that reuses inode numbers
    /// (ext4, xfs) would otherwise hand a new file the old nodeid, whose kernel inode may
    /// still hold the old file's pages. The inodes stay known by nodeid until FORGET.
    pub(super) fn unkey(&self, nodeids: &[u64]) {
        let mut map = self.map.write();
        for id in nodeids {
            if *id == ROOT_ID {
                continue;
            }
            let Some(key) = map.by_id.get(id).map(|i| i.key) else {
                continue;
            };
            if map.by_key.get(&key) == Some(id) {
                map.by_key.remove(&key);
            }
        }
    }

    /// The nodeid a READDIR entry should carry as `d_ino`, so that it equals the `st_ino` a
    /// later stat reports: the inode's nodeid if known, else a nodeid reserved now (in a
    /// bounded map; LOOKUP takes the reservation). Reporting the lower's own inode number
    /// instead would disagree with `st_ino` and could collide with another file's nodeid
    /// (gcsfuse's inode numbers are a counter, as nodeids are).
    pub(super) fn dirent_nodeid(&self, key: InodeKey) -> u64 {
        if let Some(id) = self.map.read().by_key.get(&key) {
            return *id;
        }
        let mut reserved = self.reserved.lock();
        if let Some(id) = reserved.get(&key) {
            return *id;
        }
        let id = self.next_nodeid.fetch_add(1, Relaxed);
        reserved.push(key, id);
        id
    }
}

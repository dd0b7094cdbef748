//! Paths for nodeids, learned from the traffic the relay carries, so that a forced stop can
//! name the files still open (the relay sees nodeids and names, never paths).
//!
//! The kernel's lookup count is mirrored the way a FUSE daemon keeps it (libfuse's
//! `fuse_lowlevel.h`, "lookup count"): every successful LOOKUP, CREATE, MKNOD, MKDIR, SYMLINK,
//! LINK reply and every READDIRPLUS entry with a nonzero nodeid adds one; FORGET and
//! BATCH_FORGET subtract their `nlookup`. An entry is dropped when its count reaches zero, so
//! the map holds at most what the kernel's inode cache holds. RENAME/RENAME2 and
//! UNLINK/RMDIR replies move or unlink names. Pure: no I/O.

use std::collections::HashMap;

/// The root's nodeid (`FUSE_ROOT_ID`).
pub const ROOT: u64 = 1;

/// Parent directories walked at most when building a path (a cycle or a missing link stops
/// the walk).
const MAX_DEPTH: usize = 256;

#[derive(Debug)]
struct Entry {
    parent: u64,
    name: Box<[u8]>,
    nlookup: u64,
    unlinked: bool,
}

/// Nodeid → (parent, name) with lookup counts. See the module doc.
#[derive(Debug, Default)]
pub struct Names {
    entries: HashMap<u64, Entry>,
    by_name: HashMap<(u64, Box<[u8]>), u64>,
}

impl Names {
    /// A successful entry reply: `nodeid` is `name` in `parent`, and the kernel's lookup
    /// count of `nodeid` grew by one. A nodeid of 0 (a negative entry) is ignored.
    pub fn entry(&mut self, parent: u64, name: &[u8], nodeid: u64) {
        if nodeid == 0 || nodeid == ROOT {
            return;
        }
        let key = (parent, Box::<[u8]>::from(name));
        // The name now refers to `nodeid`; an inode it named before lost that name.
        if let Some(old) = self.by_name.insert(key.clone(), nodeid)
            && old != nodeid
            && let Some(e) = self.entries.get_mut(&old)
            && (e.parent, &*e.name) == (parent, name)
        {
            e.unlinked = true;
        }
        let e = self.entries.entry(nodeid).or_insert_with(|| Entry {
            parent,
            name: key.1.clone(),
            nlookup: 0,
            unlinked: false,
        });
        e.nlookup += 1;
        // A hard link, or the inode seen under a new name: the latest name is shown.
        (e.parent, e.name) = key;
        e.unlinked = false;
    }

    /// FORGET of `nlookup` lookups of `nodeid`.
    pub fn forget(&mut self, nodeid: u64, nlookup: u64) {
        let Some(e) = self.entries.get_mut(&nodeid) else {
            return;
        };
        e.nlookup = e.nlookup.saturating_sub(nlookup);
        if e.nlookup == 0 {
            let e = self.entries.remove(&nodeid).expect("present");
            let key = (e.parent, e.name);
            if self.by_name.get(&key) == Some(&nodeid) {
                self.by_name.remove(&key);
            }
        }
    }

    /// A successful UNLINK/RMDIR of `name` in `parent`. The inode counts as deleted only when
    /// this was the name it is shown by (a hard link it was seen under later keeps it).
    pub fn unlink(&mut self, parent: u64, name: &[u8]) {
        if let Some(nodeid) = self.by_name.remove(&(parent, Box::from(name)))
            && let Some(e) = self.entries.get_mut(&nodeid)
            && (e.parent, &*e.name) == (parent, name)
        {
            e.unlinked = true;
        }
    }

    /// A successful RENAME/RENAME2 of `old` in `olddir` to `new` in `newdir`; `exchange`:
    /// RENAME_EXCHANGE (the two names swap).
    pub fn rename(&mut self, olddir: u64, old: &[u8], newdir: u64, new: &[u8], exchange: bool) {
        let old_key = (olddir, Box::<[u8]>::from(old));
        let new_key = (newdir, Box::<[u8]>::from(new));
        let moving = self.by_name.remove(&old_key);
        let replaced = self.by_name.remove(&new_key);
        if let Some(n) = moving {
            self.by_name.insert(new_key.clone(), n);
            if let Some(e) = self.entries.get_mut(&n) {
                (e.parent, e.name) = new_key.clone();
            }
        }
        if let Some(r) = replaced {
            if exchange {
                self.by_name.insert(old_key.clone(), r);
                if let Some(e) = self.entries.get_mut(&r) {
                    (e.parent, e.name) = old_key;
                }
            } else if let Some(e) = self.entries.get_mut(&r) {
                e.unlinked = true;
            }
        }
    }

    /// The path of `nodeid` relative to the mount's root (`.` for the root), as far as it is
    /// known: an unknown ancestor shows as `<nodeid N>`, an unlinked name ends in
    /// ` (deleted)`.
    pub fn path(&self, nodeid: u64) -> String {
        if nodeid == ROOT {
            return ".".into();
        }
        let mut parts: Vec<String> = Vec::new();
        let mut at = nodeid;
        let mut deleted = false;
        for _ in 0..MAX_DEPTH {
            if at == ROOT {
                break;
            }
            let Some(e) = self.entries.get(&at) else {
                parts.push(format!("<nodeid {at}>"));
                break;
            };
            deleted |= at == nodeid && e.unlinked;
            parts.push(String::from_utf8_lossy(&e.name).into_owned());
            at = e.parent;
        }
        parts.reverse();
        let mut p = parts.join("/");
        if deleted {
            p.push_str(" (deleted)");
        }
        p
    }

    /// `name` in `parent`, as a path.
    pub fn child_path(&self, parent: u64, name: &[u8]) -> String {
        let n = String::from_utf8_lossy(name);
        if parent == ROOT {
            n.into_owned()
        } else {
            format!("{}/{n}", self.path(parent))
        }
    }

    /// Nodeids known.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no nodeid is known.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_lookups_renames_and_forgets() {
        let mut n = Names::default();
        n.entry(ROOT, b"dir", 2);
        n.entry(2, b"a.txt", 3);
        assert_eq!(n.path(3), "dir/a.txt");
        assert_eq!(n.path(ROOT), ".");
        assert_eq!(n.child_path(2, b"new"), "dir/new");
        n.rename(2, b"a.txt", ROOT, b"b.txt", false);
        assert_eq!(n.path(3), "b.txt");
        // A second lookup needs a second forget.
        n.entry(ROOT, b"b.txt", 3);
        n.forget(3, 1);
        assert_eq!(n.path(3), "b.txt");
        n.forget(3, 1);
        assert_eq!(n.path(3), "<nodeid 3>");
        assert_eq!(n.len(), 1);
    }

    #[test]
    fn unlinked_and_replaced_names_are_marked() {
        let mut n = Names::default();
        n.entry(ROOT, b"x", 5);
        n.entry(ROOT, b"y", 6);
        n.unlink(ROOT, b"x");
        assert_eq!(n.path(5), "x (deleted)");
        n.rename(ROOT, b"y", ROOT, b"z", false);
        n.entry(ROOT, b"w", 7);
        n.rename(ROOT, b"w", ROOT, b"z", false);
        assert_eq!(n.path(6), "z (deleted)");
        assert_eq!(n.path(7), "z");
        // A new file under an unlinked name takes the name.
        n.entry(ROOT, b"x", 8);
        assert_eq!(n.path(8), "x");
        assert_eq!(n.path(5), "x (deleted)");
    }

    #[test]
    fn unlinking_an_older_hard_link_keeps_the_newer_name() {
        let mut n = Names::default();
        n.entry(ROOT, b"c", 4);
        n.entry(ROOT, b"hl", 4);
        n.unlink(ROOT, b"c");
        assert_eq!(n.path(4), "hl");
        n.unlink(ROOT, b"hl");
        assert_eq!(n.path(4), "hl (deleted)");
    }

    #[test]
    fn exchange_swaps_and_unknown_ancestors_show_their_nodeid() {
        let mut n = Names::default();
        n.entry(ROOT, b"a", 2);
        n.entry(ROOT, b"b", 3);
        n.rename(ROOT, b"a", ROOT, b"b", true);
        assert_eq!((n.path(2), n.path(3)), ("b".into(), "a".into()));
        n.entry(40, b"orphan", 9);
        assert_eq!(n.path(9), "<nodeid 40>/orphan");
        // Negative entries and the root are not recorded.
        n.entry(ROOT, b"none", 0);
        n.entry(ROOT, b"root", ROOT);
        assert_eq!(n.len(), 3);
    }

    #[test]
    fn a_cycle_does_not_hang() {
        let mut n = Names::default();
        n.entry(3, b"a", 2);
        n.entry(2, b"b", 3);
        assert!(n.path(2).len() < 4 * MAX_DEPTH);
    }
}

//! The shutdown gate of the mount path ([`Admission`]) and the list of admitted opens and
//! creates still in flight ([`Fs::admitted_paths`]).
//!
//! The door itself lives in the accounting's [`crate::gate::Gate`], beside the in-flight
//! count; [`Admission`] adds whether the lower is gone and whether drainfs closed its lower
//! fds. Opens, creates and namespace changes are refused with `ESHUTDOWN` once the door is
//! closed; every operation fails with `EIO` once the lower is gone or the fds are closed.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed, Ordering::SeqCst};

use super::Fs;
use crate::accounting::Accounting;
use crate::error::{Kind, Result};

/// The shutdown gate shared with the lifecycle: the door (kept in the accounting's
/// [`crate::gate::Gate`], beside the in-flight count) and whether the lower is gone.
#[derive(Debug)]
pub struct Admission {
    acct: Arc<Accounting>,
    lower_gone: AtomicBool,
    fds_closed: AtomicBool,
    /// Signalled once when an operation first sees the lower's connection gone.
    pub lower_gone_notify: tokio::sync::Notify,
}

impl Admission {
    /// New, open, sharing `acct`'s door.
    pub fn new(acct: &Arc<Accounting>) -> Arc<Self> {
        Arc::new(Admission {
            acct: Arc::clone(acct),
            lower_gone: AtomicBool::new(false),
            fds_closed: AtomicBool::new(false),
            lower_gone_notify: tokio::sync::Notify::new(),
        })
    }

    /// Closes the door: new opens, creates and namespace changes fail with `ESHUTDOWN`.
    pub fn close(&self) {
        self.acct.close_door();
    }

    /// Whether the door is closed.
    pub fn is_closed(&self) -> bool {
        !self.acct.door_open()
    }

    /// Marks the lower as gone: every operation fails with `EIO` from now on.
    pub fn set_lower_gone(&self) {
        if !self.lower_gone.swap(true, SeqCst) {
            self.lower_gone_notify.notify_one();
        }
    }

    /// Marks drainfs's lower fds as closed ([`Fs::close_lower_fds`]): every operation fails
    /// with `EIO` from now on.
    pub(super) fn close_fds(&self) {
        self.fds_closed.store(true, SeqCst);
    }

    /// Whether drainfs's lower fds are closed.
    pub fn fds_closed(&self) -> bool {
        self.fds_closed.load(SeqCst)
    }

    #[inline]
    pub(super) fn check_alive(&self) -> Result<()> {
        if self.lower_gone.load(Relaxed) {
            Err(Kind::LowerGone.into())
        } else if self.fds_closed.load(Relaxed) {
            Err(Kind::Closed.into())
        } else {
            Ok(())
        }
    }

    /// For a request already counted in flight: `ESHUTDOWN` once the door is closed.
    #[inline]
    pub(super) fn check_admit(&self) -> Result<()> {
        self.check_alive()?;
        if self.acct.door_open() {
            Ok(())
        } else {
            Err(Kind::Shutdown.into())
        }
    }
}

/// An admitted open or create in flight (see [`Fs::admit`]); unlisted on drop.
pub(super) struct Admitted<'a> {
    fs: &'a Fs,
    token: u64,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        self.fs.admitted.lock().remove(&self.token);
    }
}

impl Fs {
    /// Admits an open or create of `name` under `nodeid` (or of `nodeid` itself): `ESHUTDOWN`
    /// once the door is closed. The guard keeps it listed in [`Fs::admitted_paths`] until the
    /// request ends.
    pub(super) fn admit(&self, nodeid: u64, name: Option<&OsStr>) -> Result<Admitted<'_>> {
        // Listed before the door is checked: whoever reads the list after closing the door
        // sees every request that got past it.
        let token = self.next_admitted.fetch_add(1, Relaxed);
        self.admitted
            .lock()
            .insert(token, (nodeid, name.map(OsStr::to_os_string)));
        let admitted = Admitted { fs: self, token };
        self.admission.check_admit()?;
        Ok(admitted)
    }

    /// Paths of the opens and creates admitted and still in flight (at most `cap`), for the
    /// summary of a forced teardown.
    pub fn admitted_paths(&self, cap: usize) -> Vec<String> {
        let list: Vec<(u64, Option<OsString>)> =
            self.admitted.lock().values().take(cap).cloned().collect();
        list.into_iter()
            .map(|(nodeid, name)| {
                let base = self.inode(nodeid).map_or_else(
                    |_| PathBuf::from(format!("<nodeid {nodeid}>")),
                    |i| i.path(),
                );
                match name {
                    Some(n) => base.join(n),
                    None => base,
                }
                .display()
                .to_string()
            })
            .collect()
    }
}

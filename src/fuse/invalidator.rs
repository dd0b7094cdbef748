//! Kernel entry invalidations (`FUSE_NOTIFY_INVAL_ENTRY`), sent from a thread of their own.
//!
//! A notification takes the kernel's lock of the entry's directory, which a request in flight
//! in that directory (another RENAME, a CREATE) holds until drainfs answers it. Sent from a
//! FUSE worker, enough such notifications would occupy every worker while the requests that
//! hold the locks wait for one: a deadlock. So workers only queue them ([`Invalidator::send`])
//! and one thread sends them in order, as libfuse advises for notifications.

use std::ffi::OsString;
use std::sync::OnceLock;
use std::sync::mpsc;

use fuser::{INodeNo, Notifier};

/// An entry the kernel should forget: `(parent nodeid, name)`.
type Stale = (u64, OsString);

/// The queue of invalidations and the thread that sends them (started once the session
/// exists, [`Invalidator::start`]).
#[derive(Default)]
pub struct Invalidator {
    queue: OnceLock<mpsc::Sender<Stale>>,
}

impl Invalidator {
    /// Starts the thread that sends queued invalidations through `notifier`. It ends when
    /// the invalidator is dropped (with the session's filesystem). A second call does nothing.
    ///
    /// # Errors
    /// The thread could not be spawned (nothing is invalidated then: the kernel's entries
    /// expire after `--ttl`).
    pub fn start(&self, notifier: Notifier) -> std::io::Result<()> {
        if self.queue.get().is_some() {
            return Ok(());
        }
        let (tx, rx) = mpsc::channel::<Stale>();
        std::thread::Builder::new()
            .name("fuse-inval".into())
            .spawn(move || {
                for (parent, name) in rx {
                    if let Err(e) = notifier.inval_entry(INodeNo(parent), &name) {
                        tracing::debug!(parent, ?name, error = %e, "invalidating a kernel entry failed");
                    }
                }
            })?;
        let _ = self.queue.set(tx);
        Ok(())
    }

    /// Queues `stale` for the thread. Before [`Invalidator::start`] (or if it failed) the
    /// entries are left to expire after `--ttl`; every use of such an entry's nodeid without
    /// a name gives `ESTALE` meanwhile, which makes the kernel look the path up again.
    pub fn send(&self, stale: Vec<Stale>) {
        let Some(q) = self.queue.get() else {
            return;
        };
        for s in stale {
            let _ = q.send(s);
        }
    }
}

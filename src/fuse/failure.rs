//! Failing a request, the one way every handler does it (mountpoint-s3's `fuse_error!`):
//! `fail!` adds the request's context to the error (op, nodeid, fh, name, the lower's path),
//! logs it once at the error's own level inside a span carrying the request's `unique`,
//! counts it and replies with its errno. No handler writes an errno literal.

use std::ffi::OsStr;

use fuser::{Errno, Request};

use super::DrainFs;
use crate::accounting::OpGuard;
use crate::error::Error;

/// The errno to reply with for `e`.
fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.raw_errno())
}

/// What a failed request was about, as the kernel named it.
pub(super) struct At<'a> {
    /// The request's nodeid (the parent's for a request about a name in it).
    pub(super) nodeid: u64,
    /// The fh, for a request on an open file or directory.
    pub(super) fh: Option<u64>,
    /// The name, for a request about a name in a directory.
    pub(super) name: Option<&'a OsStr>,
}

/// The one way a handler fails a request: `fail!(self, req, guard, reply, error, ino = N)`
/// with `fh = ...` (a `u64` or an `Option<u64>`) and `name = ...` where the request has
/// them. It counts the failure, logs it once at the error's level with the request's context
/// ([`DrainFs::failed`]) and replies with the error's errno.
macro_rules! fail {
    ($self:ident, $req:ident, $guard:ident, $reply:ident, $err:expr, ino = $ino:expr $(, fh = $fh:expr)? $(, name = $name:expr)?) => {{
        #[allow(unused_mut)]
        let mut at = $crate::fuse::failure::At { nodeid: $ino, fh: None, name: None };
        $( at.fh = Option::<u64>::from($fh); )?
        $( at.name = Some($name); )?
        $reply.error($self.failed($req, &mut $guard, at, $err))
    }};
}
pub(super) use fail;

impl DrainFs {
    /// Counts a failed request, logs it once at the error's level (debug for a filesystem's
    /// ordinary answers, warn for failures; see [`Error::level`]) inside a span carrying the
    /// request's `unique`, op, nodeid and name, with the error's context (op, nodeid, fh,
    /// name, the lower's path), and returns the errno to reply with. The span and the path
    /// are made only when the line is logged, so a failure costs nothing more when its level
    /// is filtered out, and a request that succeeds never pays for a span.
    pub(super) fn failed(
        &self,
        req: &Request,
        guard: &mut OpGuard<'_>,
        at: At<'_>,
        e: Error,
    ) -> Errno {
        guard.fail();
        let errno = errno(&e);
        let warn = e.level() <= tracing::Level::WARN;
        let enabled = if warn {
            tracing::enabled!(tracing::Level::WARN)
        } else {
            tracing::enabled!(tracing::Level::DEBUG)
        };
        if !enabled {
            return errno;
        }
        let op = guard.op().name();
        let mut e = e.at(op, at.nodeid);
        if let Some(fh) = at.fh {
            e = e.fh(fh);
        }
        if let Some(name) = at.name {
            e = e.name(name);
        }
        if let Some(path) = self.core.path_of(at.nodeid) {
            e = e.path(at.name.map_or_else(|| path.clone(), |n| path.join(n)));
        }
        let unique = req.unique().0;
        let name = at.name.map(OsStr::to_string_lossy);
        let name = name.as_deref();
        if warn {
            let span = tracing::warn_span!("request", unique, op, nodeid = at.nodeid, name);
            let _entered = span.enter();
            tracing::warn!(errno = ?e.errno(), error = %e, "request failed");
        } else {
            let span = tracing::debug_span!("request", unique, op, nodeid = at.nodeid, name);
            let _entered = span.enter();
            tracing::debug!(errno = ?e.errno(), error = %e, "request failed");
        }
        errno
    }
}

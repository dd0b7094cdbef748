//! The one error type of the filesystem core and its errno policy.
//!
//! Shape borrowed from mountpoint-s3's `fs/error.rs`: every error carries the errno the
//! caller will see, what it is about and a log level. The policy is:
//! - an error from a lower syscall is passed through with the lower's errno unchanged
//!   ([`Error::lower`]), so the application sees exactly what gcsfuse would have said;
//! - drainfs's own refusals are named variants of [`Kind`] and mapped to errnos in one
//!   exhaustive `match` ([`Kind::errno`]), so no handler writes an errno literal;
//! - the ordinary answers of a filesystem (`ENOENT`, `EEXIST`, `ESHUTDOWN` from the door...)
//!   log at debug, a failing lower and a failing drainfs at warn ([`Error::level`]).
//!
//! The core creates an error with its [`Kind`] (and the source `io::Error` where there is
//! one); the fuser adapter adds the request's context (operation, nodeid, fh, name, the
//! lower's path) before logging it, so [`Error`]'s `Display` is one line that ties the
//! failure to a file.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use nix::errno::Errno;

/// Why drainfs itself refused or failed an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The lower returned this errno; passed through unchanged.
    Lower(Errno),
    /// Admission is closed (draining): new opens, creates and namespace changes. `ESHUTDOWN`.
    Shutdown,
    /// The lower's process died or its mount is gone. `EIO`, as a dead disk would give.
    LowerGone,
    /// The kernel named a nodeid drainfs does not know (forgotten). `ESTALE`.
    UnknownInode,
    /// The kernel named a fh drainfs does not know, or one that belongs to another inode.
    /// `EBADF`.
    UnknownHandle,
    /// The name now refers to a different lower inode than the nodeid (the lower changed
    /// underneath). `ESTALE`.
    Stale,
    /// A name with a NUL byte. `EINVAL`.
    BadName,
    /// Kernel passthrough could not be set up for an inode that already has passthrough opens,
    /// or the backing id of an open that promises passthrough is not fuser's. `EIO`.
    Passthrough,
    /// drainfs has closed its lower fds (teardown after a lazy unmount). `EIO`.
    Closed,
    /// Switching the worker thread to the caller's credentials failed (`setgroups`,
    /// `setfsgid` or `setfsuid`); the operation did not run. That errno.
    Credentials(Errno),
}

impl Kind {
    /// The errno a caller sees for this kind.
    pub fn errno(self) -> Errno {
        match self {
            Kind::Lower(e) => e,
            Kind::Shutdown => Errno::ESHUTDOWN,
            Kind::LowerGone => Errno::EIO,
            Kind::UnknownInode => Errno::ESTALE,
            Kind::UnknownHandle => Errno::EBADF,
            Kind::Stale => Errno::ESTALE,
            Kind::BadName => Errno::EINVAL,
            Kind::Passthrough => Errno::EIO,
            Kind::Closed => Errno::EIO,
            Kind::Credentials(e) => e,
        }
    }

    /// What went wrong, in a few words.
    fn what(self) -> &'static str {
        match self {
            Kind::Lower(_) => "the lower answered",
            Kind::Shutdown => "draining: the door is closed",
            Kind::LowerGone => "the lower is gone",
            Kind::UnknownInode => "unknown nodeid",
            Kind::UnknownHandle => "unknown fh for this nodeid",
            Kind::Stale => "the name now names another lower inode",
            Kind::BadName => "name contains a NUL byte",
            Kind::Passthrough => "kernel passthrough could not be set up",
            Kind::Closed => "drainfs's lower fds are closed",
            Kind::Credentials(_) => "could not switch to the caller's credentials",
        }
    }
}

/// Errnos that are a filesystem's ordinary answers rather than failures: logged at debug.
const ORDINARY: &[Errno] = &[
    Errno::ENOENT,
    Errno::EEXIST,
    Errno::ENOTEMPTY,
    Errno::ENOTDIR,
    Errno::EISDIR,
    Errno::EACCES,
    Errno::EPERM,
    Errno::EINVAL,
    Errno::ENAMETOOLONG,
    Errno::ELOOP,
    Errno::EXDEV,
    Errno::ENODATA,
    Errno::ERANGE,
    Errno::EOPNOTSUPP,
    Errno::ENOSYS,
    Errno::ENXIO,
    Errno::EINTR,
    Errno::EAGAIN,
    Errno::EROFS,
    Errno::ETXTBSY,
    Errno::EBUSY,
    Errno::EFBIG,
    Errno::EMLINK,
];

/// An error of the filesystem core: what the caller sees, what it is about, and how loudly
/// to log it.
#[derive(Clone)]
pub struct Error {
    /// What went wrong.
    pub kind: Kind,
    op: Option<&'static str>,
    nodeid: Option<u64>,
    fh: Option<u64>,
    name: Option<OsString>,
    path: Option<PathBuf>,
    source: Option<Arc<std::io::Error>>,
}

/// Result alias of the filesystem core.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error returned by a lower syscall, passed through unchanged.
    pub fn lower(errno: Errno) -> Self {
        Kind::Lower(errno).into()
    }

    /// The same error, caused by `source`.
    pub fn with_source(mut self, source: std::io::Error) -> Self {
        self.source = Some(Arc::new(source));
        self
    }

    /// The same error, about operation `op` (e.g. `lookup`) on `nodeid`.
    pub fn at(mut self, op: &'static str, nodeid: u64) -> Self {
        self.op = Some(op);
        self.nodeid = Some(nodeid);
        self
    }

    /// The same error, about handle `fh`.
    pub fn fh(mut self, fh: u64) -> Self {
        self.fh = Some(fh);
        self
    }

    /// The same error, about the entry `name` (under the nodeid).
    pub fn name(mut self, name: &OsStr) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    /// The same error, about the lower path `path` (relative to the lower root, as last
    /// known).
    pub fn path(mut self, path: PathBuf) -> Self {
        self.path = Some(path);
        self
    }

    /// The errno the caller sees.
    pub fn errno(&self) -> Errno {
        self.kind.errno()
    }

    /// The errno as the raw integer FUSE replies carry.
    pub fn raw_errno(&self) -> i32 {
        self.errno() as i32
    }

    /// The level to log this error at: debug for the ordinary answers of a filesystem
    /// (`ENOENT`, `EEXIST`, ... from the lower; the door's `ESHUTDOWN`; unknown or stale
    /// nodeids and fhs; every request once the lower is gone, which is logged once on its
    /// own), warn for a lower that fails (`EIO`, `ENOTCONN`, `ENOSPC`, any errno not in the
    /// ordinary list) and for drainfs's own failures (passthrough, credentials).
    pub fn level(&self) -> tracing::Level {
        match self.kind {
            Kind::Lower(e) if ORDINARY.contains(&e) => tracing::Level::DEBUG,
            Kind::Lower(_) | Kind::Passthrough | Kind::Credentials(_) => tracing::Level::WARN,
            Kind::Shutdown
            | Kind::LowerGone
            | Kind::Stale
            | Kind::UnknownInode
            | Kind::UnknownHandle
            | Kind::BadName
            | Kind::Closed => tracing::Level::DEBUG,
        }
    }

    /// Whether the lower's errno says its FUSE connection is gone (the lower died).
    pub fn is_lower_disconnect(&self) -> bool {
        matches!(
            self.kind,
            Kind::Lower(Errno::ENOTCONN | Errno::ECONNABORTED)
        )
    }
}

impl From<Kind> for Error {
    fn from(kind: Kind) -> Self {
        Error {
            kind,
            op: None,
            nodeid: None,
            fh: None,
            name: None,
            path: None,
            source: None,
        }
    }
}

impl From<Errno> for Error {
    fn from(e: Errno) -> Self {
        Error::lower(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        let errno = Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO));
        Error::lower(errno).with_source(e)
    }
}

/// One line: `OP nodeid N fh F name "NAME" (lower path P): WHAT: ERRNO: SOURCE`, each part
/// only where known.
impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut about = Vec::new();
        if let Some(op) = self.op {
            about.push(op.to_string());
        }
        if let Some(n) = self.nodeid {
            about.push(format!("nodeid {n}"));
        }
        if let Some(fh) = self.fh {
            about.push(format!("fh {fh}"));
        }
        if let Some(name) = &self.name {
            about.push(format!("name {name:?}"));
        }
        if let Some(path) = &self.path {
            about.push(format!("(lower path {})", path.display()));
        }
        if !about.is_empty() {
            write!(f, "{}: ", about.join(" "))?;
        }
        let errno = self.errno();
        write!(f, "{}: {errno:?} ({})", self.kind.what(), errno.desc())?;
        if let Some(source) = &self.source {
            write!(f, ": {source}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({self})")
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_one_line_with_the_context_known() {
        let e = Error::lower(Errno::EIO)
            .at("write", 7)
            .fh(3)
            .path(PathBuf::from("dir/f"));
        assert_eq!(
            e.to_string(),
            "write nodeid 7 fh 3 (lower path dir/f): the lower answered: EIO (I/O error)"
        );
        let e = Error::from(Kind::Shutdown)
            .at("create", 1)
            .name(OsStr::new("x"));
        assert_eq!(
            e.to_string(),
            "create nodeid 1 name \"x\": draining: the door is closed: ESHUTDOWN (Cannot send after transport endpoint shutdown)"
        );
        assert!(!Error::lower(Errno::ENOENT).to_string().contains('\n'));
    }

    #[test]
    fn ordinary_answers_log_at_debug_and_failures_at_warn() {
        use tracing::Level;
        for (kind, level) in [
            (Kind::Lower(Errno::ENOENT), Level::DEBUG),
            (Kind::Lower(Errno::EEXIST), Level::DEBUG),
            (Kind::Shutdown, Level::DEBUG),
            (Kind::Lower(Errno::EIO), Level::WARN),
            (Kind::Lower(Errno::ENOSPC), Level::WARN),
            (Kind::Lower(Errno::ENOTCONN), Level::WARN),
            (Kind::Passthrough, Level::WARN),
            (Kind::Credentials(Errno::EPERM), Level::WARN),
        ] {
            assert_eq!(Error::from(kind).level(), level, "{kind:?}");
        }
    }
}

//! The one error type of the filesystem core and its errno policy.
//!
//! Shape borrowed from mountpoint-s3's `fs/error.rs`: every error carries the errno the
//! caller will see, a message, and a log level. The policy is:
//! - an error from a lower syscall is passed through with the lower's errno unchanged
//!   ([`Error::lower`]), so the application sees exactly what gcsfuse would have said;
//! - drainfs's own refusals are named variants of [`Kind`] and mapped to errnos in one
//!   exhaustive `match` ([`Kind::errno`]), so no handler writes an errno literal.

use std::fmt;

/// Why drainfs itself refused or failed an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The lower returned this errno; passed through unchanged.
    Lower(nix::errno::Errno),
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
    /// Kernel passthrough could not be set up for an inode that already has passthrough opens.
    /// `EIO`.
    Passthrough,
    /// drainfs has closed its lower fds (teardown after a lazy unmount). `EIO`.
    Closed,
}

impl Kind {
    /// The errno a caller sees for this kind.
    pub fn errno(self) -> nix::errno::Errno {
        use nix::errno::Errno as E;
        match self {
            Kind::Lower(e) => e,
            Kind::Shutdown => E::ESHUTDOWN,
            Kind::LowerGone => E::EIO,
            Kind::UnknownInode => E::ESTALE,
            Kind::UnknownHandle => E::EBADF,
            Kind::Stale => E::ESTALE,
            Kind::BadName => E::EINVAL,
            Kind::Passthrough => E::EIO,
            Kind::Closed => E::EIO,
        }
    }
}

/// An error of the filesystem core: what the caller sees and how loudly to log it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Error {
    /// What went wrong.
    pub kind: Kind,
}

/// Result alias of the filesystem core.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error returned by a lower syscall, passed through unchanged.
    pub fn lower(errno: nix::errno::Errno) -> Self {
        Error {
            kind: Kind::Lower(errno),
        }
    }

    /// The errno as the raw integer FUSE replies carry.
    pub fn raw_errno(self) -> i32 {
        self.kind.errno() as i32
    }

    /// Whether this error is worth a log line above debug. Lower errnos such as ENOENT or
    /// EEXIST are the ordinary answers of a filesystem and are not logged.
    pub fn level(self) -> tracing::Level {
        match self.kind {
            Kind::Lower(nix::errno::Errno::EIO) => tracing::Level::WARN,
            Kind::Lower(_) | Kind::Shutdown => tracing::Level::DEBUG,
            Kind::LowerGone | Kind::Stale | Kind::UnknownInode | Kind::UnknownHandle => {
                tracing::Level::DEBUG
            }
            Kind::BadName | Kind::Closed => tracing::Level::DEBUG,
            Kind::Passthrough => tracing::Level::WARN,
        }
    }

    /// Whether the lower's errno says its FUSE connection is gone (the lower died).
    pub fn is_lower_disconnect(self) -> bool {
        matches!(
            self.kind,
            Kind::Lower(nix::errno::Errno::ENOTCONN | nix::errno::Errno::ECONNABORTED)
        )
    }
}

impl From<Kind> for Error {
    fn from(kind: Kind) -> Self {
        Error { kind }
    }
}

impl From<nix::errno::Errno> for Error {
    fn from(e: nix::errno::Errno) -> Self {
        Error::lower(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::lower(nix::errno::Errno::from_raw(
            e.raw_os_error().unwrap_or(libc::EIO),
        ))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Lower(e) => write!(f, "lower: {e}"),
            other => write!(f, "{other:?} ({})", other.errno()),
        }
    }
}

impl std::error::Error for Error {}

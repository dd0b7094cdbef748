//! drainfs: a FUSE passthrough filesystem in front of a lower mount (gcsfuse in production)
//! that tracks in-flight operations and open handles, and on shutdown drains them before
//! unmounting, stopping the lower and exiting.

/// drainfs's version and the commit it was built from, `VERSION+COMMIT` (`0.1.0+1a2b3c4d5e6f`,
/// `-dirty` after the commit when the tree had changes, `unknown` without one: `build.rs`):
/// what `drainfs --version` prints after the name and every summary's `drainfs_version` holds.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "+", env!("DRAINFS_COMMIT"));

pub mod accounting;
pub mod admin;
pub mod checks;
pub mod cli;
pub mod config;
pub mod control;
pub mod drain;
pub mod dropin;
pub mod error;
pub mod fs;
pub mod fuse;
pub mod gate;
pub mod handoff;
pub mod lifecycle;
pub mod logging;
pub mod metrics;
pub mod mount;
pub mod procs;
pub mod relay;
pub mod run;
pub mod signals;
pub mod summary;
pub mod triggers;
pub mod write_path;

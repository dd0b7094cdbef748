//! drainfs: a FUSE passthrough filesystem in front of a lower mount (gcsfuse in production)
//! that tracks in-flight operations and open handles, and on shutdown drains them before
//! unmounting, stopping the lower and exiting.

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

//! drainfs: a FUSE passthrough filesystem in front of a lower mount (gcsfuse in production)
//! that tracks in-flight operations and open handles, and on shutdown drains them before
//! unmounting, stopping the lower and exiting.

pub mod cli;
pub mod accounting;
pub mod config;
pub mod error;
pub mod fs;
pub mod fuse;

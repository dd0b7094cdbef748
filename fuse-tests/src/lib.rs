//! Test support for drainfs: harnesses that really mount, and the test backends drainfs is
//! mounted over (see `src/bin/`).

pub mod bucket;
pub mod csi;
pub mod fileops;
pub mod harness;
pub mod lowers;
pub mod pod;
pub mod relay;
pub mod stack;

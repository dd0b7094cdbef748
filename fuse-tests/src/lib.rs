//! Test support for drainfs: one harness for every mount test, and the test backends drainfs
//! is mounted over (see `src/bin/`).
//!
//! The core: [`process`] (a process drainfs or a daemon runs in, stopped and reaped by PID),
//! [`mounts`] (mount checks and cleanup by path or mount ID) and [`wait`] (waits on state).
//! Over it, one layer per topology: [`harness`] (drainfs over a directory or `bucketfs`),
//! [`stack`] (over a real lower), [`pod`] (a pod's mount and PID namespaces), [`driver`] (the
//! CSI node driver), with [`relay`] (a daemon on `/dev/fd/3`, directly or behind the relay)
//! and [`csi`] (GKE's real sidecar mounter) over it. Every test that mounts runs under
//! [`bound`]: past its deadline its connections are aborted, its processes killed and the
//! test process fails, so that no test hangs the suite or leaves a reader in D state.

pub mod bound;
pub mod bucket;
pub mod csi;
pub mod driver;
pub mod fileops;
pub mod harness;
pub mod holder;
pub mod lowers;
pub mod mounts;
pub mod pod;
pub mod process;
pub mod relay;
pub mod stack;
pub mod wait;
pub mod wedge;

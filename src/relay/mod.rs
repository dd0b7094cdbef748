//! Relay mode: drainfs holds an already-mounted FUSE connection fd and relays its messages to
//! a FUSE daemon (gcsfuse) over a `SOCK_SEQPACKET` socketpair that the daemon serves as its
//! `/dev/fd/3`. No second mount and no privileges: drainfs sees every request and reply,
//! counts what is in flight, refuses new opens while draining, and stops the daemon by
//! shutting down its socket (the daemon reads EOF and exits cleanly).
//!
//! - [`proto`]: FUSE header and body parsing (pure);
//! - [`init`]: the message-size cap and the INIT rewrite (pure);
//! - [`inflight`]: in-flight map, open handles and door decisions (pure state);
//! - [`names`]: paths of nodeids, for naming open files (pure state);
//! - [`split`]: large READs and WRITEs split into parts the daemon's datagrams can carry
//!   (pure state);
//! - [`engine`]: the running relay: its pump thread between the kernel's fd and the daemon's
//!   socket, the notifier thread, the relay's own requests, INIT, the end of the stream
//!   (where the daemon's socket is closed) and the status (its module doc maps its files);
//! - [`run`]: the fd plumbing, the daemon process and the lifecycle of `drainfs relay`.

pub mod engine;
pub mod inflight;
pub mod init;
pub mod names;
pub mod proto;
pub mod run;
pub mod split;

#[cfg(test)]
mod prop_tests;

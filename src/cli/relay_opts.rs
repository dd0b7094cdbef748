//! `drainfs relay`'s and `run --relay`'s relay options ([`RelayOptArgs`]) and their parsers.

use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{HEADING_RELAY, parse_duration};
use crate::config::{CleanSigtermExit, PumpChoice, ReadParts, RelayConnection, RelayOptions};

/// Options of the relay's socketpair and INIT, shared by `relay` and `run --relay`.
#[derive(Debug, Args)]
pub struct RelayOptArgs {
    /// SO_SNDBUF/SO_RCVBUF to request on both ends of the socketpair, bytes (default:
    /// net.core.wmem_max). The message-size cap follows from what the kernel grants.
    #[arg(long, env = "DRAINFS_SOCKET_BUFFER", help_heading = HEADING_RELAY)]
    pub socket_buffer: Option<usize>,

    /// Largest FUSE message payload relayed (the kernel's max_write and max_pages), bytes,
    /// rounded down to whole 4 KiB pages; lowered to what the socket buffers carry.
    /// Larger messages need larger contiguous kernel allocations per datagram.
    #[arg(long, env = "DRAINFS_MAX_MESSAGE", default_value_t = crate::relay::init::DEFAULT_MAX_MESSAGE, value_parser = parse_max_message, help_heading = HEADING_RELAY)]
    pub max_message: u32,

    /// If the daemon has not answered the kernel's INIT after this long, answer it EIO (the
    /// mount fails instead of hanging), stop the daemon and exit 69.
    #[arg(long, env = "DRAINFS_INIT_TIMEOUT", value_parser = parse_duration, default_value = "30s", help_heading = HEADING_RELAY)]
    pub init_timeout: Duration,

    /// How the relay waits for messages. `poll`: one thread polling both fds, spinning for
    /// --spin after each message before it blocks (fastest per request while CPUs are free).
    /// `threads`: one thread blocked in read(2) on the FUSE fd, one blocked in recv(2) on the
    /// daemon's socket; no polling, no spinning (less of the relay's CPU than spinning, slower
    /// small requests; see docs/performance.md).
    #[arg(long, env = "DRAINFS_PUMP", value_enum, default_value = "poll", help_heading = HEADING_RELAY)]
    pub pump: PumpChoice,

    /// With `--pump poll`: after each message, keep polling without sleeping for this long
    /// before blocking (`0s`: never). Saves two thread wake-ups per request while requests
    /// keep coming, at the price of CPU time. `auto`: 50us when drainfs may use at least 2
    /// CPUs (its affinity mask and its cgroup's cpu.max quota), else 0s.
    #[arg(long, env = "DRAINFS_SPIN", value_parser = parse_spin, default_value = "auto", help_heading = HEADING_RELAY)]
    pub spin: SpinArg,

    /// Let the kernel send READs and WRITEs as large as the daemon takes (gcsfuse: 1 MiB) and
    /// split those larger than the cap (--max-message) inside the relay: a WRITE's parts go one
    /// after another, each as large as one datagram of the relay's end carries; a READ's parts
    /// of the cap go as --read-parts says and are answered as one reply. The daemon never sends
    /// a datagram larger than the cap. `false`: the kernel itself is capped (8 round trips per
    /// 1 MiB at the default cap).
    #[arg(long, env = "DRAINFS_SPLIT_LARGE_REQUESTS", default_value_t = true, action = clap::ArgAction::Set, help_heading = HEADING_RELAY)]
    pub split_large_requests: bool,

    /// How a split READ's parts go to the daemon: `in-order`, one after another (gcsfuse
    /// without its file cache reads a handle's parts that arrive out of order as seeks, and
    /// turns to small random reads), or `at-once` (faster on gcsfuse's file cache hits).
    #[arg(long, env = "DRAINFS_READ_PARTS", value_enum, default_value = "in-order", help_heading = HEADING_RELAY)]
    pub read_parts: ReadParts,

    /// Exit statuses that count as a clean stop when the daemon exits by itself after the
    /// relay's end-of-stream, with nothing outstanding (comma-separated). libfuse daemons exit
    /// 1 there: libfuse reads any end of its connection other than an unmount (ENODEV) as an
    /// error ("short read on fuse device"). Any other status, or a signal, is exit 69.
    #[arg(long, env = "DRAINFS_EOF_EXIT_CODES", value_delimiter = ',', default_value = "0,1", value_parser = clap::value_parser!(i32).range(0..=255), help_heading = HEADING_RELAY)]
    pub eof_exit_codes: Vec<i32>,

    /// How a clean stop whose trigger was SIGTERM ends. `code` (the default of `relay` and
    /// `run --relay`): exit 0. `signal` (the gcsfuse drop-in's default, unless
    /// `DRAINFS_CLEAN_SIGTERM_EXIT` is set): after its summary, drainfs ends by SIGTERM. GKE's sidecar
    /// mounter stops its child through Go's `exec.CommandContext`, which reports a child that
    /// exits 0 after the cancel as the error "context canceled" and writes that to the volume's
    /// error file, while a child that ends by SIGTERM is only logged ("gcsfuse was
    /// terminated"). A stop that is not clean always exits with its code (75, 69, ...).
    #[arg(long, env = "DRAINFS_CLEAN_SIGTERM_EXIT", value_enum, default_value = "code", help_heading = HEADING_RELAY)]
    pub clean_sigterm_exit: CleanSigtermExitArg,
}

/// `--clean-sigterm-exit` values ([`CleanSigtermExit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CleanSigtermExitArg {
    /// Exit status 0.
    Code,
    /// End by SIGTERM (default action), after the summary is written.
    Signal,
}

/// `--spin`: a duration or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpinArg {
    /// Decide from the CPUs drainfs may use.
    Auto,
    /// This long.
    Fixed(Duration),
}

/// Parses `--spin`: `auto` or a duration of at most 10 ms.
///
/// # Errors
/// A readable message for anything else.
pub fn parse_spin(s: &str) -> Result<SpinArg, String> {
    if s.trim() == "auto" {
        return Ok(SpinArg::Auto);
    }
    let d = parse_duration(s)?;
    if d > Duration::from_millis(10) {
        return Err(format!("`{s}` is longer than 10ms"));
    }
    Ok(SpinArg::Fixed(d))
}

impl RelayOptArgs {
    pub(super) fn into_options(self, connection: RelayConnection) -> RelayOptions {
        RelayOptions {
            connection,
            socket_buffer: self.socket_buffer,
            max_message: self.max_message,
            init_timeout: self.init_timeout,
            eof_exit_codes: self.eof_exit_codes,
            clean_sigterm_exit: match self.clean_sigterm_exit {
                CleanSigtermExitArg::Code => CleanSigtermExit::Code,
                CleanSigtermExitArg::Signal => CleanSigtermExit::Signal,
            },
            pump: self.pump,
            spin: match self.spin {
                SpinArg::Auto => crate::relay::run::auto_spin(),
                SpinArg::Fixed(d) => d,
            },
            split_large_requests: self.split_large_requests,
            read_parts: self.read_parts,
        }
    }
}

/// Parses `--max-message`: bytes, between 4096 and 1 MiB.
///
/// # Errors
/// A readable message for anything else.
pub fn parse_max_message(s: &str) -> Result<u32, String> {
    let n: u32 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a number of bytes"))?;
    let max = crate::relay::init::MAX_CAP;
    if !(4096..=max).contains(&n) {
        return Err(format!("`{s}` is outside 4096..={max} bytes"));
    }
    Ok(n)
}

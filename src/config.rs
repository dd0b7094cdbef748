//! Typed configuration, built by [`cli`](crate::cli) and taken by the rest of the crate.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

/// Everything `drainfs run` needs.
#[derive(Debug, Clone, Serialize)]
pub struct RunConfig {
    /// The mount itself.
    pub fs: FsConfig,
    /// Supervision, triggers, drain and deadline.
    pub lifecycle: LifecycleConfig,
    /// Admin HTTP server and control socket.
    pub admin: AdminConfig,
    /// Logging.
    pub log: LogConfig,
    /// Validate, print and exit without mounting.
    pub check_config: bool,
    /// Relay mode: drainfs relays a FUSE connection to the lower's process (its daemon)
    /// instead of mounting a passthrough view of a lower directory.
    pub relay: Option<RelayOptions>,
    /// Hand-off mode: drainfs starts the lower's process (gcsfuse) on the inherited FUSE
    /// connection untouched, serves nothing, and ends it once idle after a trigger
    /// ([`crate::handoff`]). Exclusive with `relay`.
    pub handoff: Option<HandoffOptions>,
}

/// Hand-off options (`drainfs handoff`, the gcsfuse drop-in's default).
#[derive(Debug, Clone, Serialize)]
pub struct HandoffOptions {
    /// How long gcsfuse's I/O counters (`/proc/PID/io`) must stand still before it counts as
    /// idle.
    #[serde(with = "humantime_serde_shim")]
    pub idle_window: Duration,
    /// How often the counters are read (while serving and while stopping).
    #[serde(with = "humantime_serde_shim")]
    pub sample_every: Duration,
    /// After the SIGTERM drainfs sends an idle gcsfuse, how long it may take to exit before
    /// SIGKILL (gcsfuse v3.11.2 on `/dev/fd/N` does not exit on SIGTERM: it cannot unmount).
    #[serde(with = "humantime_serde_shim")]
    pub term_wait: Duration,
    /// How a stop by SIGTERM ends once gcsfuse was idle (exit 0, or by SIGTERM).
    pub clean_sigterm_exit: CleanSigtermExit,
}

/// Where the relay's FUSE connection comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RelayConnection {
    /// Inherited, already mounted (`drainfs relay`, the CSI driver's `/dev/fd/N`): this fd,
    /// or N of the daemon's `/dev/fd/N` argument when `None`.
    Inherited {
        /// `--kernel-fd`.
        fd: Option<i32>,
    },
    /// drainfs opens `/dev/fuse` and mounts [`FsConfig::mountpoint`] itself (`drainfs run
    /// --relay`).
    SelfMounted,
}

/// Relay-mode options.
#[derive(Debug, Clone, Serialize)]
pub struct RelayOptions {
    /// Where the connection comes from.
    pub connection: RelayConnection,
    /// SO_SNDBUF/SO_RCVBUF to request on both ends of the socketpair, bytes; `None` means
    /// net.core.wmem_max.
    pub socket_buffer: Option<usize>,
    /// Largest FUSE message payload (max_write, max_pages), bytes; lowered further to what the
    /// socket buffers carry.
    pub max_message: u32,
    /// How long the daemon may take to answer the kernel's INIT.
    #[serde(with = "humantime_serde_shim")]
    pub init_timeout: Duration,
    /// Daemon exit statuses that count as a clean stop after the relay's end-of-stream.
    pub eof_exit_codes: Vec<i32>,
    /// How a clean stop triggered by SIGTERM ends (exit 0, or by SIGTERM).
    pub clean_sigterm_exit: CleanSigtermExit,
    /// How the relay waits for messages.
    pub pump: PumpChoice,
    /// How long the poll pump keeps polling after a message before it blocks (zero: never).
    #[serde(with = "humantime_serde_shim")]
    pub spin: Duration,
    /// Let the kernel send READs and WRITEs up to the daemon's own `max_write` and split those
    /// larger than the cap inside the relay ([`crate::relay::split`]).
    pub split_large_requests: bool,
    /// How a split READ's parts go to the daemon.
    pub read_parts: ReadParts,
}

/// How the relay waits for messages (`relay --pump`; see [`crate::relay::engine::PumpMode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PumpChoice {
    /// One thread polling both fds, spinning for `--spin` after each message.
    Poll,
    /// Two threads, each blocked in its own fd's read.
    Threads,
}

/// How a split READ's parts go to the daemon (`relay --read-parts`; see
/// [`crate::relay::split`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ReadParts {
    /// One after another, in offset order.
    InOrder,
    /// All at once.
    AtOnce,
}

/// How a clean stop triggered by SIGTERM ends (`relay --clean-sigterm-exit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CleanSigtermExit {
    /// Exit status 0.
    Code,
    /// End by SIGTERM (default action), after the summary is written.
    Signal,
}

/// Kernel passthrough policy (`--passthrough`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PassthroughMode {
    /// Use FUSE_PASSTHROUGH when the kernel grants it and drainfs has CAP_SYS_ADMIN.
    Auto,
    /// Fail the mount unless FUSE_PASSTHROUGH is available.
    Always,
    /// Passthrough for read-only opens only; writes are served by drainfs (for lowers that
    /// upload per file handle, such as rclone with `--vfs-cache-mode off`).
    Reads,
    /// Serve reads and writes in drainfs.
    Never,
}

/// The passthrough filesystem's configuration.
#[derive(Debug, Clone, Serialize)]
pub struct FsConfig {
    /// The lower directory.
    pub lower: PathBuf,
    /// Where drainfs is mounted.
    pub mountpoint: PathBuf,
    /// Kernel passthrough policy.
    pub passthrough: PassthroughMode,
    /// FUSE worker threads.
    pub threads: usize,
    /// Attribute and entry TTL given to the kernel.
    #[serde(with = "humantime_serde_shim")]
    pub ttl: Duration,
    /// Cap on cached O_PATH fds; `None` means a quarter of RLIMIT_NOFILE.
    pub max_lower_fds: Option<usize>,
}

/// How the lower's process is found.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LowerProcess {
    /// drainfs starts it (`-- COMMAND...`) and waits for its mount.
    Spawn {
        /// The command line.
        #[serde(serialize_with = "ser_argv")]
        argv: Vec<OsString>,
    },
    /// The lower is already mounted; optionally signal this PID at the end.
    Adopted {
        /// PID to signal after unmounting.
        pid: Option<i32>,
    },
}

/// Lifecycle configuration.
#[derive(Debug, Clone, Serialize)]
pub struct LifecycleConfig {
    /// The lower's process.
    pub lower_process: LowerProcess,
    /// Bound on waiting for the lower's mount to appear.
    #[serde(with = "humantime_serde_shim")]
    pub lower_ready_timeout: Duration,
    /// Signal that asks the lower to stop.
    #[serde(serialize_with = "ser_signal")]
    pub lower_signal: nix::sys::signal::Signal,
    /// Exit files (shutdown triggers).
    pub exit_files: Vec<PathBuf>,
    /// Workload PID (shutdown trigger when it exits).
    pub watch_pid: Option<i32>,
    /// SIGTERM means the workload is gone.
    pub native_sidecar: bool,
    /// Idle time required before closing admission on a plain SIGTERM/SIGINT.
    #[serde(with = "humantime_serde_shim")]
    pub quiet_period: Duration,
    /// The pod's termination grace period.
    #[serde(with = "humantime_serde_shim")]
    pub grace_period: Duration,
    /// Exit this long before the grace period ends.
    #[serde(with = "humantime_serde_shim")]
    pub grace_margin: Duration,
    /// Where to write the JSON shutdown summary.
    pub summary_file: Option<PathBuf>,
    /// Where to write the 4 KiB-capped summary for Kubernetes.
    pub termination_log: Option<PathBuf>,
    /// File written once ready, removed when draining begins.
    pub ready_file: Option<PathBuf>,
}

/// Admin server and control socket.
#[derive(Debug, Clone, Serialize)]
pub struct AdminConfig {
    /// Admin HTTP listen address.
    pub admin_addr: Option<SocketAddr>,
    /// Control socket path.
    pub control_socket: Option<PathBuf>,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging configuration.
#[derive(Debug, Clone, Serialize)]
pub struct LogConfig {
    /// Output format.
    pub format: LogFormat,
    /// Filter directive; `None` falls back to `RUST_LOG`, then `info`.
    pub level: Option<String>,
    /// Logs go to stdout instead of stderr.
    pub to_stdout: bool,
}

fn ser_argv<S: serde::Serializer>(argv: &[OsString], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(argv.iter().map(|a| a.to_string_lossy()))
}

fn ser_signal<S: serde::Serializer>(
    sig: &nix::sys::signal::Signal,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(sig.as_str())
}

mod humantime_serde_shim {
    use std::time::Duration;

    pub fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }
}

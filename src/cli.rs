//! Command-line interface: the only module that knows about clap.
//!
//! Every `run` option can also be given as a `DRAINFS_*` environment variable (the flag wins).
//! Parsing turns arguments into the typed configs the rest of the crate takes
//! ([`crate::config::RunConfig`] and friends); value parsers return domain types so
//! a bad value is rejected with a readable one-line message and exit status 2.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{
    AdminConfig, FsConfig, LifecycleConfig, LogConfig, LogFormat, LowerProcess, PassthroughMode,
    RelayConnection, RelayOptions, RunConfig,
};

const HEADING_FS: &str = "Filesystem";
const HEADING_LOWER: &str = "Lower process";
const HEADING_SHUTDOWN: &str = "Shutdown";
const HEADING_OBS: &str = "Observability and control";
const HEADING_RELAY: &str = "Relay";

/// drainfs: a FUSE passthrough mount in front of gcsfuse that drains in-flight I/O before the
/// sidecar exits.
#[derive(Debug, Parser)]
#[command(name = "drainfs", version, about, propagate_version = true)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mount a passthrough view of LOWER at MOUNTPOINT and serve it until a shutdown trigger;
    /// with `-- COMMAND...`, start the lower's process (e.g. gcsfuse) first and stop it last.
    Run(Box<RunArgs>),
    /// Relay an already-mounted FUSE connection (the one `/dev/fd/N` argument of COMMAND, as
    /// the GKE CSI driver passes it) to COMMAND over a socketpair given to it as `/dev/fd/3`;
    /// on a trigger, drain, stop COMMAND by closing its socket, and exit with the outcome (0
    /// clean, 69 COMMAND failed or died, 75 forced with work outstanding; a COMMAND killed by a
    /// signal ends drainfs by the same signal).
    Relay(Box<RelayArgs>),
    /// Print the state of a running drainfs (through its control socket).
    Status {
        /// Control socket of the running drainfs.
        #[arg(long, env = "DRAINFS_CONTROL_SOCKET", default_value = DEFAULT_CONTROL_SOCKET)]
        control_socket: PathBuf,
        /// Print the raw JSON snapshot (the same document as the admin server's `/status`).
        #[arg(long)]
        json: bool,
    },
    /// Start draining now (for a preStop hook): readiness turns false, the door closes once the
    /// mount is idle.
    Drain {
        /// Control socket of the running drainfs.
        #[arg(long, env = "DRAINFS_CONTROL_SOCKET", default_value = DEFAULT_CONTROL_SOCKET)]
        control_socket: PathBuf,
    },
    /// Trigger shutdown as if the workload were gone.
    Shutdown {
        /// Control socket of the running drainfs.
        #[arg(long, env = "DRAINFS_CONTROL_SOCKET", default_value = DEFAULT_CONTROL_SOCKET)]
        control_socket: PathBuf,
        /// Block until the process has exited (its control socket is gone).
        #[arg(long)]
        wait: bool,
    },
    /// Block until the mount serves (for an entrypoint or a postStart hook).
    Wait {
        /// Control socket of the running drainfs.
        #[arg(long, env = "DRAINFS_CONTROL_SOCKET", default_value = DEFAULT_CONTROL_SOCKET)]
        control_socket: PathBuf,
        /// Give up after this long (exit 75). Accepts `30`, `30s`, `1500ms`.
        #[arg(long, value_parser = parse_duration, default_value = "60s")]
        timeout: Duration,
    },
    /// Repair mounts left behind by a killed process ("Transport endpoint is not connected").
    Cleanup {
        /// Paths to repair. A path that is not mounted is left alone (exit 0).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Also unmount a live, healthy mount.
        #[arg(long)]
        force: bool,
    },
}

/// Default control socket path used by the subcommands when none is given.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/drainfs/control.sock";

/// Arguments of `drainfs run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The lower directory (the gcsfuse mountpoint) whose contents drainfs serves (not used
    /// with `--relay`).
    #[arg(long, env = "DRAINFS_LOWER", required_unless_present = "relay", help_heading = HEADING_FS)]
    pub lower: Option<PathBuf>,

    /// Where drainfs mounts itself (where the application expects the bucket).
    #[arg(long, env = "DRAINFS_MOUNTPOINT", help_heading = HEADING_FS)]
    pub mountpoint: PathBuf,

    /// Kernel passthrough for regular files: `auto` uses it when the kernel grants
    /// FUSE_PASSTHROUGH and drainfs has CAP_SYS_ADMIN; `always` fails the mount otherwise;
    /// `never` serves reads and writes in drainfs; `reads` uses passthrough for read-only opens
    /// only (for lowers that upload per file handle, such as rclone: with passthrough the
    /// kernel writes through its own lower handle, which never sees a FLUSH).
    #[arg(long, env = "DRAINFS_PASSTHROUGH", value_enum, default_value_t = PassthroughArg::Auto, help_heading = HEADING_FS)]
    pub passthrough: PassthroughArg,

    /// FUSE worker threads (each has its own /dev/fuse clone). A slow lower FLUSH occupies one.
    #[arg(long, env = "DRAINFS_THREADS", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256), help_heading = HEADING_FS)]
    pub threads: u16,

    /// How long the kernel may cache attributes and directory entries. `0` re-asks the lower
    /// on every stat (always correct when the lower changes underneath).
    #[arg(long, env = "DRAINFS_TTL", value_parser = parse_duration, default_value = "1s", help_heading = HEADING_FS)]
    pub ttl: Duration,

    /// Most O_PATH fds on the lower that drainfs keeps cached (open files are not counted).
    /// Default: a quarter of RLIMIT_NOFILE.
    #[arg(long, env = "DRAINFS_MAX_LOWER_FDS", help_heading = HEADING_FS)]
    pub max_lower_fds: Option<usize>,

    /// How long to wait for the lower's mount to appear after starting its process.
    #[arg(long, env = "DRAINFS_LOWER_READY_TIMEOUT", value_parser = parse_duration, default_value = "60s", help_heading = HEADING_LOWER)]
    pub lower_ready_timeout: Duration,

    /// Adopted lower: the PID to signal at the end (when no `-- COMMAND` is given).
    #[arg(long, env = "DRAINFS_LOWER_PID", conflicts_with = "command", help_heading = HEADING_LOWER)]
    pub lower_pid: Option<i32>,

    /// Signal sent to the lower's process once drainfs has unmounted (gcsfuse unmounts on SIGINT).
    #[arg(long, env = "DRAINFS_LOWER_SIGNAL", value_parser = parse_signal, default_value = "SIGINT", help_heading = HEADING_LOWER)]
    pub lower_signal: nix::sys::signal::Signal,

    /// Shutdown triggers besides signals.
    #[command(flatten)]
    pub triggers: TriggerArgs,

    /// drainfs runs as a native sidecar: SIGTERM means every workload container has exited, so
    /// admission closes at once. Also set by `NATIVE_SIDECAR=TRUE`.
    #[arg(long, env = "DRAINFS_NATIVE_SIDECAR", value_parser = clap::builder::BoolishValueParser::new(), num_args = 0..=1, default_missing_value = "true", default_value = "false", help_heading = HEADING_SHUTDOWN)]
    pub native_sidecar: bool,

    /// On a plain SIGTERM/SIGINT, keep serving until the mount has been idle this long.
    #[arg(long, env = "DRAINFS_QUIET_PERIOD", value_parser = parse_duration, default_value = "500ms", help_heading = HEADING_SHUTDOWN)]
    pub quiet_period: Duration,

    /// The pod's terminationGracePeriodSeconds: time from the first trigger to the kubelet's
    /// SIGKILL. drainfs exits before it, by a safety margin. Accepts `30`, `30s`, `1500ms`.
    #[arg(long, env = "DRAINFS_GRACE_PERIOD", value_parser = parse_duration, default_value = "30s", help_heading = HEADING_SHUTDOWN)]
    pub grace_period: Duration,

    /// How long before the end of the grace period drainfs forces its exit. Default: a tenth of
    /// the grace period, between 250ms and 3s.
    #[arg(long, env = "DRAINFS_GRACE_MARGIN", value_parser = parse_duration, help_heading = HEADING_SHUTDOWN)]
    pub grace_margin: Option<Duration>,

    /// Summary, logs, admin server, control socket, ready file.
    #[command(flatten)]
    pub out: OutputArgs,

    /// Validate the configuration, print it as JSON and exit 0 (nothing is mounted or started).
    #[arg(long)]
    pub check_config: bool,

    /// One FUSE mount instead of two: drainfs opens /dev/fuse, mounts MOUNTPOINT itself and
    /// relays the connection to COMMAND (whose `/dev/fd/N` argument becomes `/dev/fd/3`, a
    /// socket) instead of serving a view of a lower directory.
    #[arg(long, env = "DRAINFS_RELAY", requires = "command", conflicts_with_all = ["lower", "lower_pid"], help_heading = HEADING_RELAY)]
    pub relay: bool,

    /// Relay options (with `--relay`).
    #[command(flatten)]
    pub relay_opts: RelayOptArgs,

    /// The lower's process and its arguments, e.g. `gcsfuse --foreground BUCKET LOWER`.
    #[arg(last = true, id = "command")]
    pub command: Vec<std::ffi::OsString>,
}

/// Where the outcome and the logs go, and the control plane: shared by `run` and `relay`.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Write the JSON shutdown summary here (atomically).
    #[arg(long, env = "DRAINFS_SUMMARY_FILE", help_heading = HEADING_SHUTDOWN)]
    pub summary_file: Option<PathBuf>,

    /// Write the shutdown summary here too, capped at 4 KiB (Kubernetes' `/dev/termination-log`).
    #[arg(long, env = "DRAINFS_TERMINATION_LOG", help_heading = HEADING_SHUTDOWN)]
    pub termination_log: Option<PathBuf>,

    /// Log format.
    #[arg(long, env = "DRAINFS_LOG_FORMAT", value_enum, default_value_t = LogFormatArg::Text, help_heading = HEADING_OBS)]
    pub log_format: LogFormatArg,

    /// Log level or filter (`info`, `drainfs=debug`); `RUST_LOG` is used when this is unset.
    #[arg(long, env = "DRAINFS_LOG_LEVEL", help_heading = HEADING_OBS)]
    pub log_level: Option<String>,

    /// Write logs to stdout instead of stderr. The gcsfuse drop-in sets it: GKE's sidecar
    /// copies gcsfuse's stderr into the error file its node driver turns into mount errors.
    #[arg(long, env = "DRAINFS_LOG_TO_STDOUT", value_parser = clap::builder::BoolishValueParser::new(), num_args = 0..=1, default_missing_value = "true", default_value = "false", help_heading = HEADING_OBS)]
    pub log_to_stdout: bool,

    /// Serve the admin HTTP endpoints (probes, metrics, status, drain, quitquitquit) here.
    #[arg(long, env = "DRAINFS_ADMIN_ADDR", help_heading = HEADING_OBS)]
    pub admin_addr: Option<SocketAddr>,

    /// Listen for control commands (status, drain, shutdown, wait) on this unix socket (0600).
    #[arg(long, env = "DRAINFS_CONTROL_SOCKET", help_heading = HEADING_OBS)]
    pub control_socket: Option<PathBuf>,

    /// Write this file atomically once the mount serves (for the relay: once INIT went
    /// through); remove it when draining begins.
    #[arg(long, env = "DRAINFS_READY_FILE", help_heading = HEADING_OBS)]
    pub ready_file: Option<PathBuf>,
}

impl OutputArgs {
    fn admin_config(&self) -> AdminConfig {
        AdminConfig {
            admin_addr: self.admin_addr,
            control_socket: self.control_socket.clone(),
        }
    }

    fn log_config(&self) -> LogConfig {
        LogConfig {
            format: match self.log_format {
                LogFormatArg::Text => LogFormat::Text,
                LogFormatArg::Json => LogFormat::Json,
            },
            level: self.log_level.clone(),
            to_stdout: self.log_to_stdout,
        }
    }
}

/// The grace margin: `--grace-margin`, else a tenth of the grace period between 250 ms and 3 s.
fn grace_margin(grace_period: Duration, margin: Option<Duration>) -> Duration {
    margin.unwrap_or_else(|| {
        (grace_period / 10).clamp(Duration::from_millis(250), Duration::from_secs(3))
    })
}

/// Shutdown triggers besides signals, shared by `run` and `relay`.
#[derive(Debug, Args)]
pub struct TriggerArgs {
    /// Shutdown trigger: this file appearing (repeatable; a file present at start counts).
    #[arg(long = "exit-file", env = "DRAINFS_EXIT_FILE", value_delimiter = ',', help_heading = HEADING_SHUTDOWN)]
    pub exit_files: Vec<PathBuf>,

    /// Shutdown trigger: this process exiting (the workload), watched with a pidfd.
    #[arg(long, env = "DRAINFS_WATCH_PID", help_heading = HEADING_SHUTDOWN)]
    pub watch_pid: Option<i32>,
}

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

    /// After each message, keep polling without sleeping for this long before blocking
    /// (`0s`: never). Saves two thread wake-ups per request while requests keep coming, at the
    /// price of CPU time. `auto`: 50us when drainfs may use at least 2 CPUs (its affinity mask
    /// and its cgroup's cpu.max quota), else 0s.
    #[arg(long, env = "DRAINFS_SPIN", value_parser = parse_spin, default_value = "auto", help_heading = HEADING_RELAY)]
    pub spin: SpinArg,

    /// Exit statuses that count as a clean stop when the daemon exits by itself after the
    /// relay's end-of-stream, with nothing outstanding (comma-separated). libfuse daemons exit
    /// 1 there: libfuse reads any end of its connection other than an unmount (ENODEV) as an
    /// error ("short read on fuse device"). Any other status, or a signal, is exit 69.
    #[arg(long, env = "DRAINFS_EOF_EXIT_CODES", value_delimiter = ',', default_value = "0,1", value_parser = clap::value_parser!(i32).range(0..=255), help_heading = HEADING_RELAY)]
    pub eof_exit_codes: Vec<i32>,
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
    fn into_options(self, connection: RelayConnection) -> RelayOptions {
        RelayOptions {
            connection,
            socket_buffer: self.socket_buffer,
            max_message: self.max_message,
            init_timeout: self.init_timeout,
            eof_exit_codes: self.eof_exit_codes,
            spin: match self.spin {
                SpinArg::Auto => crate::relay::run::auto_spin(),
                SpinArg::Fixed(d) => d,
            },
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

/// Arguments of `drainfs relay`.
#[derive(Debug, Args)]
pub struct RelayArgs {
    /// The inherited FUSE connection fd (default: N of the command's `/dev/fd/N` argument).
    #[arg(long, env = "DRAINFS_KERNEL_FD", help_heading = HEADING_FS)]
    pub kernel_fd: Option<i32>,

    /// Socketpair and INIT options.
    #[command(flatten)]
    pub relay_opts: RelayOptArgs,

    /// Shutdown triggers besides signals.
    #[command(flatten)]
    pub triggers: TriggerArgs,

    /// Accepted for symmetry with `run`: in relay mode SIGTERM always means the workload is gone.
    #[arg(long, env = "DRAINFS_NATIVE_SIDECAR", value_parser = clap::builder::BoolishValueParser::new(), num_args = 0..=1, default_missing_value = "true", default_value = "false", help_heading = HEADING_SHUTDOWN)]
    pub native_sidecar: bool,

    /// Time from the first trigger to the SIGKILL that ends the relay (the GKE sidecar kills
    /// 5 s after its SIGTERM). Accepts `5`, `5s`, `1500ms`.
    #[arg(long, env = "DRAINFS_GRACE_PERIOD", value_parser = parse_duration, default_value = "5s", help_heading = HEADING_SHUTDOWN)]
    pub grace_period: Duration,

    /// How long before the end of the grace period the drain gives up. Default: a tenth of
    /// the grace period, between 250ms and 3s.
    #[arg(long, env = "DRAINFS_GRACE_MARGIN", value_parser = parse_duration, help_heading = HEADING_SHUTDOWN)]
    pub grace_margin: Option<Duration>,

    /// Summary, logs, admin server, control socket, ready file.
    #[command(flatten)]
    pub out: OutputArgs,

    /// The daemon and its arguments, e.g. `gcsfuse --foreground BUCKET /dev/fd/3`.
    #[arg(last = true, required = true, id = "command")]
    pub command: Vec<std::ffi::OsString>,
}

impl RelayArgs {
    /// Converts the parsed arguments into the run configuration of a relay over an inherited
    /// connection (SIGTERM always means the workload is gone).
    pub fn into_config(self) -> RunConfig {
        let grace_margin = grace_margin(self.grace_period, self.grace_margin);
        RunConfig {
            fs: relay_fs(PathBuf::new()),
            check_config: false,
            relay: Some(
                self.relay_opts
                    .into_options(RelayConnection::Inherited { fd: self.kernel_fd }),
            ),
            lifecycle: LifecycleConfig {
                lower_process: LowerProcess::Spawn { argv: self.command },
                lower_ready_timeout: Duration::ZERO,
                lower_signal: nix::sys::signal::Signal::SIGTERM,
                exit_files: self.triggers.exit_files,
                watch_pid: self.triggers.watch_pid,
                native_sidecar: true,
                quiet_period: Duration::ZERO,
                grace_period: self.grace_period,
                grace_margin,
                summary_file: self.out.summary_file.clone(),
                termination_log: self.out.termination_log.clone(),
                ready_file: self.out.ready_file.clone(),
            },
            admin: self.out.admin_config(),
            log: self.out.log_config(),
        }
    }
}

/// `--passthrough` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PassthroughArg {
    /// Use kernel passthrough when available.
    Auto,
    /// Require kernel passthrough.
    Always,
    /// Never use kernel passthrough.
    Never,
    /// Kernel passthrough for read-only opens only.
    Reads,
}

/// The (unused) filesystem settings of a relay: only the mountpoint matters.
fn relay_fs(mountpoint: PathBuf) -> FsConfig {
    FsConfig {
        lower: PathBuf::new(),
        mountpoint,
        passthrough: PassthroughMode::Never,
        threads: 1,
        ttl: Duration::ZERO,
        max_lower_fds: None,
    }
}

/// `--log-format` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormatArg {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, Cloud Logging field names.
    Json,
}

/// Parses a duration: a bare number is seconds (`30`, `0.5`), otherwise humantime
/// (`30s`, `1500ms`, `1m 30s`).
///
/// # Errors
/// A readable message when the text is neither.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!("`{s}` is not a non-negative duration"));
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration ({e}); use e.g. 30, 30s, 1500ms"))
}

/// Parses a signal name (`SIGINT`, `INT`, `int`) or number (`2`).
///
/// # Errors
/// A readable message for an unknown signal.
pub fn parse_signal(s: &str) -> Result<nix::sys::signal::Signal, String> {
    use std::str::FromStr;
    let t = s.trim();
    if let Ok(n) = t.parse::<i32>() {
        return nix::sys::signal::Signal::try_from(n)
            .map_err(|_| format!("`{s}` is not a signal number"));
    }
    let upper = t.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    nix::sys::signal::Signal::from_str(&name).map_err(|_| format!("`{s}` is not a signal name"))
}

impl RunArgs {
    /// Converts the parsed arguments into the typed run configuration. `native_sidecar_env` is
    /// the value of `NATIVE_SIDECAR` (GKE's variable), honoured when it is `TRUE`.
    pub fn into_config(self, native_sidecar_env: Option<&str>) -> RunConfig {
        let passthrough = match self.passthrough {
            PassthroughArg::Auto => PassthroughMode::Auto,
            PassthroughArg::Always => PassthroughMode::Always,
            PassthroughArg::Never => PassthroughMode::Never,
            PassthroughArg::Reads => PassthroughMode::Reads,
        };
        let native_env = native_sidecar_env.is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let grace_margin = grace_margin(self.grace_period, self.grace_margin);
        let lower_process = if self.command.is_empty() {
            LowerProcess::Adopted {
                pid: self.lower_pid,
            }
        } else {
            LowerProcess::Spawn { argv: self.command }
        };
        let (fs, relay) = if self.relay {
            (
                relay_fs(self.mountpoint),
                Some(self.relay_opts.into_options(RelayConnection::SelfMounted)),
            )
        } else {
            let fs = FsConfig {
                lower: self.lower.unwrap_or_default(),
                mountpoint: self.mountpoint,
                passthrough,
                threads: usize::from(self.threads),
                ttl: self.ttl,
                max_lower_fds: self.max_lower_fds,
            };
            (fs, None)
        };
        RunConfig {
            fs,
            relay,
            lifecycle: LifecycleConfig {
                lower_process,
                lower_ready_timeout: self.lower_ready_timeout,
                lower_signal: self.lower_signal,
                exit_files: self.triggers.exit_files,
                watch_pid: self.triggers.watch_pid,
                native_sidecar: self.native_sidecar || native_env,
                quiet_period: self.quiet_period,
                grace_period: self.grace_period,
                grace_margin,
                summary_file: self.out.summary_file.clone(),
                termination_log: self.out.termination_log.clone(),
                ready_file: self.out.ready_file.clone(),
            },
            admin: self.out.admin_config(),
            log: self.out.log_config(),
            check_config: self.check_config,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn durations() {
        let cases = [
            ("30", Some(Duration::from_secs(30))),
            ("30s", Some(Duration::from_secs(30))),
            ("1500ms", Some(Duration::from_millis(1500))),
            ("0.5", Some(Duration::from_millis(500))),
            ("1m 30s", Some(Duration::from_secs(90))),
            ("-1", None),
            ("soon", None),
            ("", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_duration(input).ok(), want, "input {input:?}");
        }
    }

    #[test]
    fn signals() {
        use nix::sys::signal::Signal;
        let cases = [
            ("SIGINT", Some(Signal::SIGINT)),
            ("int", Some(Signal::SIGINT)),
            ("TERM", Some(Signal::SIGTERM)),
            ("9", Some(Signal::SIGKILL)),
            ("SIGNOPE", None),
            ("999", None),
        ];
        for (input, want) in cases {
            assert_eq!(parse_signal(input).ok(), want, "input {input:?}");
        }
    }

    fn run_config(args: &[&str], native_env: Option<&str>) -> Result<RunConfig, clap::Error> {
        let mut argv = vec!["drainfs", "run"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv)?.command {
            Command::Run(a) => Ok(a.into_config(native_env)),
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn run_args_table() {
        let c = run_config(&["--lower", "/l", "--mountpoint", "/m"], None).unwrap();
        assert_eq!(c.lifecycle.grace_period, Duration::from_secs(30));
        assert_eq!(c.lifecycle.grace_margin, Duration::from_secs(3));
        assert!(!c.lifecycle.native_sidecar);
        assert!(matches!(
            c.lifecycle.lower_process,
            LowerProcess::Adopted { pid: None }
        ));

        let c = run_config(
            &[
                "--lower",
                "/l",
                "--mountpoint",
                "/m",
                "--grace-period",
                "3s",
            ],
            Some("TRUE"),
        )
        .unwrap();
        assert_eq!(c.lifecycle.grace_margin, Duration::from_millis(300));
        assert!(c.lifecycle.native_sidecar);

        let c = run_config(
            &[
                "--lower",
                "/l",
                "--mountpoint",
                "/m",
                "--exit-file",
                "/a",
                "--exit-file",
                "/b",
                "--",
                "gcsfuse",
                "--foreground",
                "b",
                "/l",
            ],
            Some("false"),
        )
        .unwrap();
        assert_eq!(
            c.lifecycle.exit_files,
            vec![PathBuf::from("/a"), PathBuf::from("/b")]
        );
        assert!(!c.lifecycle.native_sidecar);
        match c.lifecycle.lower_process {
            LowerProcess::Spawn { argv } => assert_eq!(argv.len(), 4),
            other => panic!("{other:?}"),
        }

        for bad in [
            vec!["--mountpoint", "/m"],
            vec![
                "--lower",
                "/l",
                "--mountpoint",
                "/m",
                "--grace-period",
                "soon",
            ],
            vec![
                "--lower",
                "/l",
                "--mountpoint",
                "/m",
                "--passthrough",
                "maybe",
            ],
            vec!["--lower", "/l", "--mountpoint", "/m", "--threads", "0"],
            vec![
                "--lower",
                "/l",
                "--mountpoint",
                "/m",
                "--lower-signal",
                "SIGNOPE",
            ],
            vec![
                "--lower",
                "/l",
                "--mountpoint",
                "/m",
                "--lower-pid",
                "1",
                "--",
                "x",
            ],
        ] {
            assert!(run_config(&bad, None).is_err(), "accepted {bad:?}");
        }
    }
}

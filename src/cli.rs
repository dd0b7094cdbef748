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
    RelayConnection, RunConfig,
};

const HEADING_FS: &str = "Filesystem";
const HEADING_LOWER: &str = "Lower process";
const HEADING_SHUTDOWN: &str = "Shutdown";
const HEADING_OBS: &str = "Observability and control";
const HEADING_RELAY: &str = "Relay";

/// drainfs: a FUSE passthrough mount in front of gcsfuse that drains in-flight I/O before the
/// sidecar exits.
#[derive(Debug, Parser)]
#[command(name = "drainfs", version = crate::VERSION, about, propagate_version = true, after_help = DROPIN_HELP)]
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
    /// (`run --relay` is the self-mounted relay, for hosts without GKE's driver; on GKE use
    /// `relay` or the gcsfuse drop-in.)
    Run(Box<RunArgs>),
    /// Relay an already-mounted FUSE connection (the one `/dev/fd/N` argument of COMMAND, as
    /// the GKE CSI driver passes it) to COMMAND over a socketpair given to it as `/dev/fd/3`;
    /// on a trigger, drain, stop COMMAND by closing its socket, and exit with the outcome (0
    /// clean, 69 COMMAND failed or died, 75 forced with work outstanding; a COMMAND killed by a
    /// signal ends drainfs by the same signal). Its deadline is `--grace-period`, 5 s by
    /// default (GKE's sidecar mounter SIGKILLs 5 s after its SIGTERM). The gcsfuse drop-in runs
    /// it for a volume with `drainfs-mode=relay` or under `DRAINFS_DROPIN_MODE=relay`; its
    /// default is `handoff` (see the end of `drainfs --help`).
    Relay(Box<RelayArgs>),
    /// Hand the inherited FUSE connection (COMMAND's `/dev/fd/N` argument, as GKE's sidecar
    /// mounter passes it) to COMMAND untouched: start COMMAND with drainfs's own argv,
    /// environment, stdio and fds, stay its parent (it dies with drainfs), and serve nothing.
    /// On a trigger, wait until COMMAND has stood still for `--idle-window` (its I/O counters,
    /// its threads, its TCP connections),
    /// end it (SIGKILL; SIGTERM first with `--term-wait`) and exit: by SIGTERM after a stop by
    /// SIGTERM with COMMAND idle (or exited 0 by itself after the stop), and as COMMAND ended
    /// when it ended by itself otherwise. A COMMAND still
    /// busy is left to the SIGKILL that ends drainfs at the end of the 5 s `--grace-period` (it
    /// dies with drainfs); drainfs ends it itself and exits 75 only on a second signal, or if
    /// nothing has killed drainfs `--grace-margin` after the grace period. The gcsfuse
    /// drop-in's default.
    Handoff(Box<HandoffArgs>),
    /// Print the state of a running drainfs (through its control socket).
    Status {
        /// Control socket of the running drainfs, which opens one only when given
        /// `--control-socket` (`DRAINFS_CONTROL_SOCKET`).
        #[arg(long, env = "DRAINFS_CONTROL_SOCKET", default_value = DEFAULT_CONTROL_SOCKET)]
        control_socket: PathBuf,
        /// Print the raw JSON snapshot (the same document as the admin server's `/status`).
        #[arg(long)]
        json: bool,
    },
    /// Start draining now (for a preStop hook): readiness turns false, the door closes once the
    /// mount is idle.
    Drain {
        /// Control socket of the running drainfs, which opens one only when given
        /// `--control-socket` (`DRAINFS_CONTROL_SOCKET`).
        #[arg(long, env = "DRAINFS_CONTROL_SOCKET", default_value = DEFAULT_CONTROL_SOCKET)]
        control_socket: PathBuf,
    },
    /// Trigger shutdown as if the workload were gone.
    Shutdown {
        /// Control socket of the running drainfs, which opens one only when given
        /// `--control-socket` (`DRAINFS_CONTROL_SOCKET`).
        #[arg(long, env = "DRAINFS_CONTROL_SOCKET", default_value = DEFAULT_CONTROL_SOCKET)]
        control_socket: PathBuf,
        /// Block until the process has exited (its control socket is gone). The exit status
        /// is still 0 whatever drainfs's outcome: read that from its exit code or summary.
        #[arg(long)]
        wait: bool,
    },
    /// Block until the mount serves (for an entrypoint or a postStart hook). Exit 0 once it
    /// serves, 124 when `--timeout` passed first, 1 when shutdown began before it served. A
    /// missing socket is retried silently until `--timeout`: a drainfs started without
    /// `--control-socket` has none, and `wait` then always ends 124.
    Wait {
        /// Control socket of the running drainfs, which opens one only when given
        /// `--control-socket` (`DRAINFS_CONTROL_SOCKET`).
        #[arg(long, env = "DRAINFS_CONTROL_SOCKET", default_value = DEFAULT_CONTROL_SOCKET)]
        control_socket: PathBuf,
        /// Give up after this long (exit 124). Accepts `30`, `30s`, `1500ms`.
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

/// What `--help` says about the binary's other name (see [`dropin_args`]).
pub const DROPIN_HELP: &str = "\
Invoked as `gcsfuse` (argv[0]'s file name is gcsfuse, as in the drainfs image's /gcsfuse), drainfs
is GKE's gcsfuse drop-in: `gcsfuse ARGS...` runs
  drainfs handoff --log-to-stdout --log-format json -- REAL ARGS...
where REAL is $DRAINFS_REAL_GCSFUSE (default /gcsfuse.real): gcsfuse gets the kernel's
connection itself and drainfs ends it once idle after the sidecar mounter's SIGTERM. With the
volume's mount option drainfs-mode=relay (argv --drainfs-mode=relay, or the key drainfs-mode:
relay in gcsfuse's --config-file; drainfs removes it before gcsfuse sees it) it runs instead
  drainfs relay --log-to-stdout --log-format json --clean-sigterm-exit signal -- REAL ARGS...
drainfs-idle-window=DURATION sets the hand-off's --idle-window. Without drainfs-mode,
DRAINFS_DROPIN_MODE (handoff or relay; the relay image sets relay) chooses. DRAINFS_LOG_FORMAT and
DRAINFS_CLEAN_SIGTERM_EXIT, when set, win over those defaults. A mount point that is not
/dev/fd/N (GKE's shared-mount mode), `gcsfuse --version` and `gcsfuse --help` (alone): REAL
is exec'ed. The deadline is 5 s by default (GKE's sidecar mounter SIGKILLs its child 5 s after
its SIGTERM), not the pod's grace period.

Exit codes of `run` and `relay`: 0 clean; 1 drainfs could not mount or serve; 2 usage; 69 the
lower (gcsfuse) failed or died, or `status`, `drain` or `shutdown` could not reach drainfs's
control socket; 75 data may be incomplete; 124 `drainfs wait` timed out before the mount served
(`wait` also waits for a missing control socket: drainfs opens one only with
`--control-socket`). Of `handoff`: 0 idle (or by SIGTERM after a stop by SIGTERM); 75 gcsfuse
was ended while busy; 69 gcsfuse could not be started; otherwise gcsfuse's own status, or the
signal it died of, when it ended by itself.";

/// The gcsfuse drop-in's relay command line (the mount option `drainfs-mode=relay`, see
/// [`crate::dropin`]): for `gcsfuse ARGS...` (argv\[0\]'s file name is `gcsfuse`), `drainfs relay --log-to-stdout [--log-format json] [--clean-sigterm-exit signal]
/// -- REAL ARGS...`, with `real` the real gcsfuse. `env` reads the environment: each of the two
/// bracketed defaults is left out when its `DRAINFS_*` variable is set, so the variable decides.
///
/// Logs go to stdout as Cloud Logging JSON: GKE's sidecar mounter copies its child's stderr into
/// the volume's error file (turned into mount errors), and GKE's logging agent reads a JSON
/// line's `severity` (a plain text line on stdout is filed as INFO, so an ERROR line would not
/// reach a `severity>=ERROR` alert). A clean stop by SIGTERM ends by SIGTERM, so that the sidecar
/// mounter logs "gcsfuse was terminated" instead of an error (`--clean-sigterm-exit`).
pub fn dropin_args(
    real: std::ffi::OsString,
    rest: Vec<std::ffi::OsString>,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> =
        vec!["drainfs".into(), "relay".into(), "--log-to-stdout".into()];
    if env("DRAINFS_LOG_FORMAT").is_none() {
        args.push("--log-format=json".into());
    }
    if env("DRAINFS_CLEAN_SIGTERM_EXIT").is_none() {
        args.push("--clean-sigterm-exit=signal".into());
    }
    args.push("--".into());
    args.push(real);
    args.extend(rest);
    args
}

/// Default control socket path used by the subcommands when none is given.
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/drainfs/control.sock";

/// Arguments of `drainfs run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Required (unless `--relay`): the lower directory (the gcsfuse mountpoint) whose
    /// contents drainfs serves.
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

    /// Signal that stops the lower's process; no signal is sent after a clean drain when
    /// drainfs can unmount gcsfuse's mount itself (CAP_SYS_ADMIN: root, as in the manifests),
    /// and gcsfuse then exits by itself. The signal is sent without CAP_SYS_ADMIN or when that
    /// unmount is refused, and, as root too, on a forced stop (deadline, second signal) and
    /// when drainfs fails to start; SIGKILL follows if the lower has not exited within its
    /// budget. (gcsfuse unmounts on SIGINT.)
    #[arg(long, env = "DRAINFS_LOWER_SIGNAL", value_parser = parse_signal, default_value = "SIGINT", help_heading = HEADING_LOWER)]
    pub lower_signal: nix::sys::signal::Signal,

    /// Shutdown triggers besides signals.
    #[command(flatten)]
    pub triggers: TriggerArgs,

    /// drainfs runs as a native sidecar: SIGTERM means every workload container has exited, so
    /// admission closes at once. When neither this flag nor `DRAINFS_NATIVE_SIDECAR` is given,
    /// GKE's `NATIVE_SIDECAR` decides (default false); when one is, it wins over
    /// `NATIVE_SIDECAR`.
    #[arg(long, env = "DRAINFS_NATIVE_SIDECAR", value_parser = parse_go_bool, num_args = 0..=1, default_missing_value = "true", help_heading = HEADING_SHUTDOWN)]
    pub native_sidecar: Option<bool>,

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

    /// Run every start-up check that needs no mount (lower and mountpoint, /dev/fuse and
    /// fusermount3, the lower's command, output directories, `--watch-pid`, the admin
    /// address), print the configuration as JSON and exit: 0 when every check passed, 2 with
    /// one line per problem otherwise. Nothing is mounted, started or repaired.
    #[arg(long)]
    pub check_config: bool,

    /// One FUSE mount instead of two: drainfs opens /dev/fuse, mounts MOUNTPOINT itself and
    /// relays the connection to COMMAND (whose `/dev/fd/N` argument becomes `/dev/fd/3`, a
    /// socket) instead of serving a view of a lower directory. For hosts without GKE's CSI
    /// driver; under the driver, whose node driver mounts, use `drainfs relay` (or the gcsfuse
    /// drop-in). Unlike `relay`, it uses run's 30 s grace period default and quiet period.
    #[arg(long, env = "DRAINFS_RELAY", value_parser = parse_go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", help_heading = HEADING_RELAY)]
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

    /// Write the shutdown summary here too, capped at 4 KiB (Kubernetes' `/dev/termination-log`);
    /// a clean summary does not replace one with a non-zero exit code already there. `relay`
    /// writes `/dev/termination-log` by default when it exists and is writable.
    #[arg(long, env = "DRAINFS_TERMINATION_LOG", help_heading = HEADING_SHUTDOWN)]
    pub termination_log: Option<PathBuf>,

    /// Log format.
    #[arg(long, env = "DRAINFS_LOG_FORMAT", value_enum, default_value_t = LogFormatArg::Text, help_heading = HEADING_OBS)]
    pub log_format: LogFormatArg,

    /// Log level or filter (`info`, `drainfs=debug`); `RUST_LOG` is used when this is unset.
    #[arg(long, env = "DRAINFS_LOG_LEVEL", value_parser = parse_log_level, help_heading = HEADING_OBS)]
    pub log_level: Option<String>,

    /// Write logs to stdout instead of stderr. The gcsfuse drop-in sets it: GKE's sidecar
    /// copies gcsfuse's stderr into the error file its node driver turns into mount errors.
    #[arg(long, env = "DRAINFS_LOG_TO_STDOUT", value_parser = parse_go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", help_heading = HEADING_OBS)]
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

    /// Shutdown trigger: this process exiting (the workload), watched with a pidfd. A process
    /// id: 1 or more.
    #[arg(long, env = "DRAINFS_WATCH_PID", value_parser = clap::value_parser!(i32).range(1..), help_heading = HEADING_SHUTDOWN)]
    pub watch_pid: Option<i32>,
}

mod handoff_opts;
mod relay_opts;
pub use handoff_opts::*;
pub use relay_opts::*;

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
    #[arg(long, env = "DRAINFS_NATIVE_SIDECAR", value_parser = parse_go_bool, num_args = 0..=1, default_missing_value = "true", default_value = "false", help_heading = HEADING_SHUTDOWN)]
    pub native_sidecar: bool,

    /// Time from the first trigger to the SIGKILL that ends the relay: 5 s by default, because
    /// GKE's sidecar mounter SIGKILLs its child 5 s after its SIGTERM, whatever the pod's
    /// terminationGracePeriodSeconds (`run` defaults to 30 s). A larger value does not buy
    /// time under the sidecar mounter. Accepts `5`, `5s`, `1500ms`.
    #[arg(long, env = "DRAINFS_GRACE_PERIOD", value_parser = parse_duration, default_value = "5s", help_heading = HEADING_SHUTDOWN)]
    pub grace_period: Duration,

    /// How long before the end of the grace period the drain gives up. Default: a tenth of
    /// the grace period, between 250ms and 3s.
    #[arg(long, env = "DRAINFS_GRACE_MARGIN", value_parser = parse_duration, help_heading = HEADING_SHUTDOWN)]
    pub grace_margin: Option<Duration>,

    /// Summary, logs, admin server, control socket, ready file.
    #[command(flatten)]
    pub out: OutputArgs,

    /// Run every start-up check that needs no mount (the daemon's command, the connection fd,
    /// output directories, the admin address), print the configuration as JSON and exit: 0
    /// when every check passed, 2 with one line per problem otherwise.
    #[arg(long)]
    pub check_config: bool,

    /// The daemon and its arguments, e.g. `gcsfuse --foreground BUCKET /dev/fd/3`.
    #[arg(last = true, required = true, id = "command")]
    pub command: Vec<std::ffi::OsString>,
}

impl RelayArgs {
    /// Converts the parsed arguments into the run configuration of a relay over an inherited
    /// connection (SIGTERM always means the workload is gone). Without `--termination-log`,
    /// the summary goes to `/dev/termination-log` when this process may write it.
    pub fn into_config(self) -> RunConfig {
        let grace_margin = grace_margin(self.grace_period, self.grace_margin);
        RunConfig {
            fs: relay_fs(PathBuf::new()),
            check_config: self.check_config,
            relay: Some(
                self.relay_opts
                    .into_options(RelayConnection::Inherited { fd: self.kernel_fd }),
            ),
            handoff: None,
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
                termination_log: self
                    .out
                    .termination_log
                    .clone()
                    .or_else(crate::summary::default_termination_log),
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

/// The longest duration any flag takes: 365 days. Deadlines are instants computed from
/// these (a grace period times a few, plus now), which must not overflow.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Parses a duration: a bare number is seconds (`30`, `0.5`), otherwise humantime
/// (`30s`, `1500ms`, `1m 30s`); at most [`MAX_DURATION`].
///
/// # Errors
/// A readable message when the text is neither, or the duration is longer than 365 days.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let d = if let Ok(secs) = s.parse::<f64>() {
        if !(secs.is_finite() && secs >= 0.0) {
            return Err(format!("`{s}` is not a non-negative duration"));
        }
        Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
    } else {
        humantime::parse_duration(s)
            .map_err(|e| format!("`{s}` is not a duration ({e}); use e.g. 30, 30s, 1500ms"))?
    };
    if d > MAX_DURATION {
        return Err(format!(
            "`{s}` is longer than 365 days, the longest duration drainfs takes"
        ));
    }
    Ok(d)
}

/// Parses a boolean exactly as Go's `strconv.ParseBool` does (GKE's components read
/// `NATIVE_SIDECAR` with it): `1`, `t`, `T`, `TRUE`, `true`, `True` are true; `0`, `f`, `F`,
/// `FALSE`, `false`, `False` are false.
///
/// # Errors
/// Anything else (`yes`, `on`, `tRuE`, an empty string, surrounding spaces), with the accepted
/// spellings in the message.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!(
            "`{s}` is not a boolean; use one of 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False"
        )),
    }
}

/// The level names a log filter accepts (tracing's, plus `off`).
const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Parses `--log-level`: comma-separated directives, each a level (`info`) or
/// `TARGET=LEVEL` (`drainfs=debug`, `drainfs::relay=trace`), levels `trace`, `debug`,
/// `info`, `warn`, `error`, `off` (any case). The result is handed to tracing-subscriber's
/// `EnvFilter` unchanged.
///
/// # Errors
/// A directive that is neither: tracing-subscriber would take a bare word such as `warning`
/// for a target name and silence every other log line, the shutdown summary included.
pub fn parse_log_level(s: &str) -> Result<String, String> {
    let is_level = |l: &str| LOG_LEVELS.iter().any(|k| k.eq_ignore_ascii_case(l.trim()));
    let hint = "use a level (trace, debug, info, warn, error, off) or TARGET=LEVEL directives, e.g. `info,drainfs=debug`";
    if s.trim().is_empty() {
        return Err(format!("empty log filter; {hint}"));
    }
    for d in s.split(',') {
        let d = d.trim();
        let ok = match d.rsplit_once('=') {
            Some((target, level)) => !target.trim().is_empty() && is_level(level),
            None => is_level(d),
        };
        if !ok {
            return Err(format!(
                "`{d}` is not a log level or TARGET=LEVEL directive; {hint}"
            ));
        }
    }
    tracing_subscriber::EnvFilter::try_new(s).map_err(|e| format!("`{s}`: {e}; {hint}"))?;
    Ok(s.to_string())
}

/// Checks every `DRAINFS_*` variable the subcommand in `args` reads (`args[1]`; nothing for
/// an unknown subcommand) with the value parser of its flag, whether or not the flag is also
/// given: a malformed value is an error, never a silent default. Values of flags that take
/// a list (`DRAINFS_EXIT_FILE`, `DRAINFS_EOF_EXIT_CODES`) are checked item by item.
///
/// Returns one line per problem, each naming the variable (`DRAINFS_GRACE_PERIOD=soon: ...`);
/// an empty or non-UTF-8 value is a problem too.
pub fn env_problems(args: &[std::ffi::OsString]) -> Vec<String> {
    env_problems_from(args, |name| std::env::var_os(name))
}

fn env_problems_from(
    args: &[std::ffi::OsString],
    get: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Vec<String> {
    use clap::CommandFactory;
    let cli = Cli::command();
    let Some(sub_name) = args.get(1).and_then(|a| a.to_str()) else {
        return Vec::new();
    };
    let Some(sub) = cli.find_subcommand(sub_name) else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    for arg in sub.get_arguments() {
        let Some(name) = arg.get_env().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(raw) = get(name) else { continue };
        let Some(value) = raw.to_str() else {
            problems.push(format!("{name}: the value is not valid UTF-8"));
            continue;
        };
        if value.is_empty() {
            problems.push(format!(
                "{name} is set but empty; unset it to use the default, or give a value"
            ));
            continue;
        }
        let items: Vec<&str> = match arg.get_value_delimiter() {
            Some(d) => value.split(d).collect(),
            None => vec![value],
        };
        // The flag's own value parser, on a one-argument command of its own.
        let check = clap::Command::new("drainfs").arg(
            clap::Arg::new("value")
                .value_parser(arg.get_value_parser().clone())
                .allow_hyphen_values(true)
                .required(true),
        );
        for item in items {
            if let Err(e) = check.clone().try_get_matches_from(["drainfs", item]) {
                problems.push(format!("{name}={value}: {}", clap_reason(&e)));
                break;
            }
        }
    }
    problems
}

/// The reason inside a clap value error, without clap's `error: invalid value ... for ...`
/// framing and its usage footer.
fn clap_reason(e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    let reason = first
        .split_once("': ")
        .map_or("not a valid value", |(_, r)| r);
    let valid = match e.get(ContextKind::ValidValue) {
        Some(ContextValue::Strings(v)) => format!(" (possible values: {})", v.join(", ")),
        _ => String::new(),
    };
    format!("{reason}{valid}")
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
    /// the value of `NATIVE_SIDECAR` (GKE's variable), read as Go's `strconv.ParseBool` reads
    /// it ([`parse_go_bool`]).
    ///
    /// # Errors
    /// `NATIVE_SIDECAR` set to anything [`parse_go_bool`] refuses: one line naming it.
    pub fn into_config(self, native_sidecar_env: Option<&str>) -> Result<RunConfig, String> {
        let passthrough = match self.passthrough {
            PassthroughArg::Auto => PassthroughMode::Auto,
            PassthroughArg::Always => PassthroughMode::Always,
            PassthroughArg::Never => PassthroughMode::Never,
            PassthroughArg::Reads => PassthroughMode::Reads,
        };
        let native_env = match native_sidecar_env {
            None => false,
            Some(v) => parse_go_bool(v).map_err(|e| format!("NATIVE_SIDECAR={v}: {e}"))?,
        };
        let grace_margin = grace_margin(self.grace_period, self.grace_margin);
        // Checked here, not by clap: `DRAINFS_RELAY=false` would count as `--relay` given.
        if self.relay {
            if self.command.is_empty() {
                return Err("--relay needs the daemon's command: -- COMMAND ARGS...".into());
            }
            if self.lower.is_some() || self.lower_pid.is_some() {
                return Err(
                    "--relay cannot be used with --lower or --lower-pid: the relay serves no lower directory"
                        .into(),
                );
            }
        } else if self.lower.is_none() {
            return Err("--lower is required (or --relay)".into());
        }
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
        Ok(RunConfig {
            fs,
            relay,
            handoff: None,
            lifecycle: LifecycleConfig {
                lower_process,
                lower_ready_timeout: self.lower_ready_timeout,
                lower_signal: self.lower_signal,
                exit_files: self.triggers.exit_files,
                watch_pid: self.triggers.watch_pid,
                native_sidecar: self.native_sidecar.unwrap_or(native_env),
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
        })
    }
}

#[cfg(test)]
mod tests;

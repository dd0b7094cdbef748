//! `drainfs handoff`'s arguments ([`HandoffArgs`]): the gcsfuse drop-in's default mode.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::{
    CleanSigtermExitArg, HEADING_SHUTDOWN, OutputArgs, TriggerArgs, grace_margin, parse_duration,
    relay_fs,
};
use crate::config::{CleanSigtermExit, HandoffOptions, LifecycleConfig, LowerProcess, RunConfig};

/// Arguments of `drainfs handoff`.
#[derive(Debug, Args)]
pub struct HandoffArgs {
    /// How long gcsfuse's I/O counters (`/proc/PID/io`: bytes and calls, its FUSE requests
    /// and its HTTP connections alike) must stand still, with its threads not running
    /// (`/proc/PID/task/*`) and none of its TCP connections waiting for an answer, before
    /// gcsfuse counts as idle and is ended after a stop.
    /// Stillness before the stop counts; a stop takes up to this long, plus one `--idle-sample`,
    /// after the last I/O. A connection whose last send, receive and ACK share one 4 ms
    /// timestamp step (which came first cannot be told) keeps gcsfuse from being ended until
    /// 2 s after that step, the window included, unless its previous sample shows one exchange
    /// answered within the step (idle then, sent one segment since, received data), and
    /// without sight of the connections (no `sock_diag`) the window is at least 2 s. 500 ms by
    /// default: in 300 randomized stops at b201aff, 77 uploads in flight at the stop, none cut
    /// and none taken for idle before its `close()` ended
    /// (docs/results/2026-12-07-handoff-stops-300-b201aff.txt). Accepts `2s`, `500ms`.
    #[arg(long, env = "DRAINFS_IDLE_WINDOW", value_parser = parse_duration, default_value = "500ms", help_heading = HEADING_SHUTDOWN)]
    pub idle_window: Duration,

    /// How often gcsfuse's I/O counters are read (while serving too, so that stillness before
    /// a stop counts); its threads are read only at a sample whose counters stood still.
    #[arg(long, env = "DRAINFS_IDLE_SAMPLE", value_parser = parse_duration, default_value = "50ms", help_heading = HEADING_SHUTDOWN)]
    pub idle_sample: Duration,

    /// After the SIGTERM drainfs sends an idle gcsfuse, how long it may take to exit before
    /// SIGKILL (`0s`, the default: an idle gcsfuse is SIGKILLed at once, no SIGTERM). gcsfuse
    /// v3.11.2 on `/dev/fd/N` does not exit on SIGTERM (it cannot unmount a mount it did not
    /// make, and serves on for 30 s), so any wait here is added to every stop for nothing.
    #[arg(long, env = "DRAINFS_TERM_WAIT", value_parser = parse_duration, default_value = "0s", help_heading = HEADING_SHUTDOWN)]
    pub term_wait: Duration,

    /// Shutdown triggers besides signals.
    #[command(flatten)]
    pub triggers: TriggerArgs,

    /// Time from the first trigger to the SIGKILL that ends drainfs: 5 s by default (GKE's
    /// sidecar mounter SIGKILLs its child 5 s after its SIGTERM). A gcsfuse still busy then
    /// dies with drainfs, as the stock gcsfuse dies by the same SIGKILL; drainfs SIGKILLs it
    /// itself only if nothing has killed drainfs `--grace-margin` after it.
    #[arg(long, env = "DRAINFS_GRACE_PERIOD", value_parser = parse_duration, default_value = "5s", help_heading = HEADING_SHUTDOWN)]
    pub grace_period: Duration,

    /// How long after the end of the grace period drainfs gives up waiting for gcsfuse to be
    /// idle and SIGKILLs it, if nothing has killed drainfs by then. Default: a tenth of the
    /// grace period, between 250ms and 3s.
    #[arg(long, env = "DRAINFS_GRACE_MARGIN", value_parser = parse_duration, help_heading = HEADING_SHUTDOWN)]
    pub grace_margin: Option<Duration>,

    /// How a stop by SIGTERM ends when gcsfuse was idle: `signal` (default), by SIGTERM, which
    /// GKE's sidecar mounter logs as "gcsfuse was terminated"; `code`, exit 0 (which it would
    /// write to the volume's error file as "context canceled").
    #[arg(long, env = "DRAINFS_CLEAN_SIGTERM_EXIT", value_enum, default_value = "signal", help_heading = HEADING_SHUTDOWN)]
    pub clean_sigterm_exit: CleanSigtermExitArg,

    /// Summary, logs, admin server, control socket, ready file.
    #[command(flatten)]
    pub out: OutputArgs,

    /// Print the configuration as JSON and exit (0, or 2 with one line per problem).
    #[arg(long)]
    pub check_config: bool,

    /// gcsfuse and its arguments, passed untouched, e.g. `/gcsfuse.real --foreground ...
    /// BUCKET /dev/fd/3`.
    #[arg(last = true, required = true, id = "command")]
    pub command: Vec<std::ffi::OsString>,
}

impl HandoffArgs {
    /// Converts the parsed arguments into the run configuration of a hand-off (SIGTERM means
    /// the workload is gone). Without `--termination-log`, the summary goes to
    /// `/dev/termination-log` when this process may write it.
    pub fn into_config(self) -> RunConfig {
        RunConfig {
            fs: relay_fs(PathBuf::new()),
            check_config: self.check_config,
            relay: None,
            handoff: Some(HandoffOptions {
                idle_window: self.idle_window,
                sample_every: self.idle_sample.max(Duration::from_millis(1)),
                term_wait: self.term_wait,
                clean_sigterm_exit: match self.clean_sigterm_exit {
                    CleanSigtermExitArg::Code => CleanSigtermExit::Code,
                    CleanSigtermExitArg::Signal => CleanSigtermExit::Signal,
                },
            }),
            lifecycle: LifecycleConfig {
                lower_process: LowerProcess::Spawn { argv: self.command },
                lower_ready_timeout: Duration::ZERO,
                lower_signal: nix::sys::signal::Signal::SIGTERM,
                exit_files: self.triggers.exit_files,
                watch_pid: self.triggers.watch_pid,
                native_sidecar: true,
                quiet_period: Duration::ZERO,
                grace_period: self.grace_period,
                grace_margin: grace_margin(self.grace_period, self.grace_margin),
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

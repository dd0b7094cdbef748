//! The `drainfs` binary: parse arguments, hand over to the library, exit with its code.

use clap::Parser;
use drainfs::cli::{Cli, Command};

fn main() {
    // Drop-in for the gcsfuse binary: `gcsfuse ARGS...` runs `drainfs handoff -- REAL ARGS...`
    // (or, with the mount option drainfs-mode=relay, `drainfs relay -- REAL ARGS...`).
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args
        .first()
        .is_some_and(|a0| drainfs::relay::run::is_gcsfuse_dropin(a0))
    {
        let real =
            std::env::var_os("DRAINFS_REAL_GCSFUSE").unwrap_or_else(|| "/gcsfuse.real".into());
        let rest = args.split_off(1);
        args = drainfs::dropin::command_line(real, rest);
    }
    // Malformed `DRAINFS_*` values are start-up errors naming the variable, not defaults.
    let problems = drainfs::cli::env_problems(&args);
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("drainfs: error: {p}");
        }
        std::process::exit(drainfs::drain::ExitCode::Usage.code());
    }
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            std::process::exit(if e.use_stderr() {
                drainfs::drain::ExitCode::Usage.code()
            } else {
                0
            });
        }
    };
    let code = match cli.command {
        Command::Run(args) => {
            let native =
                std::env::var_os("NATIVE_SIDECAR").map(|v| v.to_string_lossy().into_owned());
            match args.into_config(native.as_deref()) {
                Ok(cfg) => drainfs::run::main(cfg, drainfs::admin::start),
                Err(e) => {
                    eprintln!("drainfs: error: {e}");
                    drainfs::drain::ExitCode::Usage.code()
                }
            }
        }
        Command::Relay(args) => drainfs::run::main(args.into_config(), drainfs::admin::start),
        Command::Handoff(args) => drainfs::run::main(args.into_config(), drainfs::admin::start),
        other => drainfs::control::client(other),
    };
    std::process::exit(code);
}

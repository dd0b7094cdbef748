//! The `drainfs` binary: parse arguments, hand over to the library, exit with its code.

use clap::Parser;
use drainfs::cli::{Cli, Command};

fn main() {
    let cli = match Cli::try_parse() {
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
            let native = std::env::var("NATIVE_SIDECAR").ok();
            drainfs::run::main(args.into_config(native.as_deref()), drainfs::admin::start)
        }
        other => drainfs::control::client(other),
    };
    std::process::exit(code);
}

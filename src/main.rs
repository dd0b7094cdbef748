//! The `drainfs` binary: parse arguments, hand over to the library, exit with its code.

use clap::Parser;

fn main() {
    let cli = drainfs::cli::Cli::parse();
    println!("{cli:?}");
}

//! The `shufflefs` binary: parse arguments, set up logging, run the command, map errors to an
//! exit code (1 for errors, 2 for usage errors from clap).

use clap::Parser;

use shufflefs::cli::Cli;
use shufflefs::{cmd, logging};

fn main() {
    let cli = Cli::parse();
    logging::init(cli.verbose as i8 - cli.quiet as i8);
    if let Err(e) = cmd::run(cli.command) {
        // Display already includes the underlying cause.
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

//! The `shufflefs` binary: parse arguments, set up logging, run the command, map errors to an
//! exit code (1 for errors, 2 for usage errors from clap).

use clap::Parser;

use shufflefs::Cli;

fn main() {
    let cli = Cli::parse();
    shufflefs::init(cli.verbose as i8 - cli.quiet as i8);
    if let Err(e) = shufflefs::run(cli.command) {
        // Display already includes the underlying cause.
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

//! The `shufflefs` binary: parse arguments, set up logging, run the command, map errors to an
//! exit code (1 for errors, a refused flag value included; 2 for usage errors from clap).

use clap::Parser;

use shufflefs::Cli;

fn main() {
    let cli = Cli::try_parse().unwrap_or_else(|e| match shufflefs::cli::value_error(&e) {
        // A value our parsers refused (a size, a mode...): an error like any other.
        Some(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
        None => e.exit(),
    });
    shufflefs::init(cli.verbose as i8 - cli.quiet as i8);
    if let Err(e) = shufflefs::run(cli.command) {
        // Display already includes the underlying cause.
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

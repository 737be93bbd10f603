//! One module per subcommand: arguments in, library calls, output out.

/// `println!` that ignores a closed stdout (`shufflefs inspect | head` must not panic).
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub(crate) mod bench;
pub(crate) mod inspect;
pub(crate) mod mount;
pub(crate) mod pack;
pub(crate) mod plan;
pub(crate) mod synth;
pub(crate) mod unmount;
pub(crate) mod verify;

use crate::cli::{Command, ModeArg, PlanOptions};
use crate::error::Result;
use crate::view::{Mode, ViewConfig};

/// Runs one parsed command.
pub fn run(command: Command) -> Result<()> {
    match command {
        Command::Pack(args) => pack::run(args),
        Command::Mount(args) => mount::run(args),
        Command::Unmount(args) => unmount::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Verify(args) => verify::run(args),
        Command::Plan(args) => plan::run(args),
        Command::Synth(args) => synth::run(args),
        Command::Bench(args) => bench::run(args),
    }
}

impl From<&PlanOptions> for ViewConfig {
    fn from(p: &PlanOptions) -> ViewConfig {
        ViewConfig {
            // Required by clap without --config (a missing value is refused as 0).
            window: p.window.unwrap_or(0),
            stride: p.stride,
            batch_size: p.batch_size.unwrap_or(0),
            ranks: p.ranks,
            seed: p.seed,
            epochs: p.epochs,
            mode: match p.mode {
                ModeArg::Stream => Mode::Stream,
                ModeArg::Documents => Mode::Documents,
                ModeArg::Packed => Mode::Packed,
            },
            pad_id: p.pad_id,
            bos: p.bos,
            pack_block_docs: p.pack_block_docs,
            rewindow: p.rewindow,
            quarantine: p.quarantine.clone(),
            max_listing: crate::tree::DEFAULT_MAX_LISTING,
            out_dtype: p.out_dtype,
        }
    }
}

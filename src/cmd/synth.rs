//! `shufflefs synth OUTPUT --tokens N [--dtype T]`

use crate::cli::SynthArgs;
use crate::error::Result;
use crate::pack::write_positional;

/// Runs `synth`.
pub(crate) fn run(args: SynthArgs) -> Result<()> {
    let dtype = args.dtype;
    write_positional(&args.output, dtype, args.tokens)?;
    say!(
        "wrote {} positional {dtype} tokens to {}",
        args.tokens,
        args.output.display()
    );
    Ok(())
}

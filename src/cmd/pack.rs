//! `shufflefs pack DATASET_DIR INPUT... --dtype T [--shard-size S]`

use crate::cli::PackArgs;
use crate::dtype::ScalarType;
use crate::error::Result;
use crate::pack::{PackOptions, pack, parse_size};

/// Runs `pack`.
pub fn run(args: PackArgs) -> Result<()> {
    let options = PackOptions {
        dtype: ScalarType::from_name(&args.dtype)?,
        shard_size: parse_size(&args.shard_size)?,
        force: args.force,
    };
    let m = pack(&args.dataset_dir, &args.inputs, &options)?;
    println!(
        "packed {} tokens ({} bytes, dtype {}) into {} shard(s) in {}",
        m.records,
        m.records * m.itemsize,
        m.dtype,
        m.shards.len(),
        args.dataset_dir.display()
    );
    Ok(())
}

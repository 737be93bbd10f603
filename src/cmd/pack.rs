//! `shufflefs pack DATASET_DIR INPUT... [--dtype T] [--shard-size S] [--doc-sep TOKEN]`

use crate::cli::{MegatronUnitArg, PackArgs};
use crate::error::Result;
use crate::pack::formats::megatron::Unit;
use crate::pack::{PackOptions, pack, pack_in_place};

/// Runs `pack`.
pub(crate) fn run(args: PackArgs) -> Result<()> {
    let options = PackOptions {
        dtype: args.dtype,
        shard_size: args.shard_size,
        force: args.force,
        doc_sep: args.doc_sep,
        doc_start: args.doc_start,
        doc_bos: args.doc_bos,
        megatron_unit: match args.megatron_unit {
            MegatronUnitArg::Document => Unit::Document,
            MegatronUnitArg::Sequence => Unit::Sequence,
        },
        tokens_field: args.tokens_field,
        progress: !args.no_progress,
        max_entries_per_shard: None,
    };
    let m = if args.in_place {
        pack_in_place(&args.dataset_dir, &args.inputs, &options)?
    } else {
        pack(&args.dataset_dir, &args.inputs, &options)?
    };
    let docs = match m.documents {
        Some(n) => format!(
            ", {n} document{}{}",
            if n == 1 { "" } else { "s" },
            if m.metadata { " with metadata" } else { "" }
        ),
        None => String::new(),
    };
    say!(
        "packed {} records ({} bytes, dtype {}{docs}) into {} shard(s) in {}",
        m.records,
        m.records * m.itemsize,
        m.dtype,
        m.shards.len(),
        args.dataset_dir.display()
    );
    Ok(())
}

//! `shufflefs inspect DATASET_DIR [--json]`: the dataset summary.

use crate::cli::InspectArgs;
use crate::dataset::Dataset;
use crate::error::Result;

/// Runs `inspect`.
pub(crate) fn run(args: InspectArgs) -> Result<()> {
    let ds = Dataset::open(&args.dataset_dir)?;
    let m = ds.manifest();
    if args.json {
        let summary = serde_json::json!({
            "dataset": ds.dir().display().to_string(),
            "format_version": m.version,
            "dtype": m.dtype,
            "itemsize": m.itemsize,
            "n_tokens": m.records,
            "bytes": ds.n_bytes(),
            "shards": m.shards,
            "content_hash": m.content_hash,
            "documents": m.documents,
            "metadata": m.metadata,
            "created_by": m.created_by,
        });
        say!("{}", serde_json::to_string_pretty(&summary).expect("json"));
        return Ok(());
    }
    say!("dataset       {}", ds.dir().display());
    say!("format        {} v{}", m.format, m.version);
    say!("dtype         {} ({} bytes per token)", m.dtype, m.itemsize);
    say!("tokens        {}", m.records);
    say!("bytes         {}", ds.n_bytes());
    say!("shards        {}", m.shards.len());
    match m.documents {
        Some(n) => say!(
            "documents     {n}{}",
            if m.metadata {
                " (with metadata)"
            } else {
                " (no metadata)"
            }
        ),
        None => say!("documents     none (a plain token stream)"),
    }
    say!("content hash  {}", m.content_hash);
    say!("created by    {}", m.created_by);
    for s in &m.shards {
        say!(
            "  {}  {} tokens  {} bytes  hash {}",
            s.path,
            s.records,
            s.bytes,
            s.hash
        );
    }
    Ok(())
}

//! `shufflefs pack`: concatenate input files into shards plus a manifest.
//!
//! Inputs, in the order given, make one record stream:
//! - raw headerless little-endian record files (nanoGPT `train.bin` style);
//! - `.npy` arrays, 1-D, plain or structured (recognised by numpy's magic, whatever the name);
//! - llm.c token shards (recognised by their header, whatever the name): the tokens after the
//!   1,024-byte header, of the type the header names;
//! - JSON Lines documents (`.jsonl`/`.ndjson`): `{"tokens": [...], "meta": ..., "spans": [...]}`.
//!
//! Files are checked before anything is written, the same way for a copy and `--in-place`
//! (existence, regular file, what the file is (`format::sniff`: known non-token formats are refused
//! saying what to do), size a multiple of the record size, `.npy` header, dtype and shape, the
//! llm.c token count, and a raw file's sampled content against `--dtype`'s width). JSON Lines are validated while they are
//! written; any error names the file and line and removes everything written. Shards are
//! written under temporary names, fsynced and renamed to names unique to this pack run; the
//! directory is fsynced, then the manifest is written last the same way. Until the manifest's
//! rename the directory holds no new dataset, so a crashed or failed pack never leaves
//! something that mounts, and `--force` replaces a dataset atomically (its old shards are
//! deleted only after the switch).
//!
//! Documents: when any input is JSON Lines or `--doc-sep` is given, every record belongs to a
//! document (a raw or `.npy` input without `--doc-sep` is one document), and each shard gets
//! document and metadata files (`format::ShardDocs`). Every span of records that shares
//! metadata is one *entry*; each record stores its shard-local entry id, and an entry that
//! continues into the next shard is written again there, so every shard is self-contained.
//!
//! The files: `inputs.rs` checks the inputs, `jsonl.rs` reads JSON Lines documents,
//! `writer.rs` writes shards and document files, `in_place.rs` makes `--in-place` manifests;
//! this file runs a pack, writes the manifest and switches datasets atomically.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::dtype::{RecordType, ScalarType};
use crate::format::{FORMAT_NAME, MANIFEST, Manifest, ShardEntry, version_for};

mod documents;
pub mod formats;
mod in_place;
mod inputs;
mod jsonl;
mod remote_inputs;
mod writer;

use documents::{for_each_end, scan_rule};
pub use in_place::pack_in_place;
use inputs::{Input, check_inputs, expand_inputs};
use jsonl::write_jsonl;
use writer::{Split, Writer, write_records_file};

/// Default shard size bound: 1 GiB.
pub(crate) const DEFAULT_SHARD_SIZE: u64 = 1 << 30;

/// Copy buffer size: large enough to stream at disk speed, small enough to stay cheap.
const CHUNK: usize = 8 << 20;

/// Entries per shard are addressed by u32 ids.
const MAX_ENTRIES: u64 = 1 << 32;

/// Options of `shufflefs pack`.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// The token type (`--dtype`); required unless an `.npy` or llm.c input defines the record
    /// type.
    pub dtype: Option<ScalarType>,
    /// Upper bound of a shard's size in bytes (rounded down to whole records).
    pub shard_size: u64,
    /// Replace an existing dataset in the directory, and pack inputs the heuristic checks
    /// refuse (text, a raw file that looks like another token width).
    pub force: bool,
    /// End a document after every record whose token equals this value.
    pub doc_sep: Option<i128>,
    /// Start a document at every record whose token equals this value.
    pub doc_start: Option<i128>,
    /// With `doc_sep`: a document ends only at a separator followed by this token (OLMo).
    pub doc_bos: Option<i128>,
    /// What a document of a Megatron-LM input is.
    pub megatron_unit: formats::megatron::Unit,
    /// The token column of HF tables and the token field of JSON Lines (default: `input_ids`,
    /// then `tokens`).
    pub tokens_field: Option<String>,
    /// Show a progress bar on stderr when it is a terminal.
    pub progress: bool,
    /// Metadata entries per shard before pack starts a new shard (default and maximum 2^32,
    /// the range of the u32 ids; smaller values exist for tests).
    pub max_entries_per_shard: Option<u64>,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            dtype: None,
            shard_size: DEFAULT_SHARD_SIZE,
            force: false,
            doc_sep: None,
            doc_start: None,
            doc_bos: None,
            megatron_unit: formats::megatron::Unit::Document,
            tokens_field: None,
            progress: false,
            max_entries_per_shard: None,
        }
    }
}

/// Everything a pack has put on disk so far, removed again if the pack fails.
#[derive(Default)]
struct Written {
    files: Vec<PathBuf>,
}

impl Written {
    fn cleanup(&self) {
        for f in &self.files {
            let _ = fs::remove_file(f);
        }
    }
}

/// Packs `inputs` into `dir`. Returns the manifest written.
pub fn pack(dir: &Path, inputs: &[PathBuf], options: &PackOptions) -> Result<Manifest> {
    let inputs = expand_inputs(inputs)?;
    if let Some(url) = inputs.iter().find(|p| crate::storage::remote::is_remote(p)) {
        return Err(Error::invalid(format!(
            "{}: a remote input is referenced where it is: pack --in-place (a copy of it \
             needs it on local disk first)",
            crate::storage::remote::redact_url(&url.to_string_lossy())
        )));
    }
    let (checked, record) = check_inputs(&inputs, options)?;
    let itemsize = record.itemsize() as u64;
    let shard_records = options.shard_size / itemsize;
    if shard_records == 0 {
        return Err(Error::invalid(format!(
            "--shard-size {} is smaller than one record ({itemsize} bytes)",
            options.shard_size
        )));
    }
    if let Some(sep) = options.doc_sep
        && record
            .token_type()
            .int_range()
            .is_none_or(|(lo, hi)| sep < lo || sep > hi)
    {
        return Err(Error::invalid(format!(
            "--doc-sep {sep} is not a {} value",
            record.token_type()
        )));
    }
    let has_docs = options.doc_sep.is_some()
        || options.doc_start.is_some()
        || checked.iter().any(|i| match i {
            Input::Jsonl { .. } | Input::Table { .. } => true,
            Input::Records { native, .. } => native.source_format().is_some(),
        });
    if dir.exists() && !dir.is_dir() {
        return Err(Error::invalid(format!(
            "{}: DATASET_DIR exists and is not a directory (the dataset directory comes \
             first: shufflefs pack DATASET_DIR INPUT...)",
            dir.display()
        )));
    }
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let manifest_path = dir.join(MANIFEST);
    let old = if manifest_path.exists() {
        if !options.force {
            return Err(Error::invalid(format!(
                "{} already holds a dataset ({MANIFEST} exists): choose another directory or \
                 pass --force to replace it",
                dir.display()
            )));
        }
        current_manifest(dir)
    } else {
        None
    };
    let total_bytes: u64 = checked
        .iter()
        .map(|i| match i {
            Input::Records { bytes, .. } => *bytes,
            Input::Jsonl { path } | Input::Table { path } => {
                fs::metadata(path).map_or(0, |m| m.len())
            }
        })
        .fold(0u64, u64::saturating_add);
    let mut writer = Writer::new(dir, record.clone(), shard_records * itemsize, has_docs);
    writer.max_entries = options
        .max_entries_per_shard
        .unwrap_or(MAX_ENTRIES)
        .clamp(4, MAX_ENTRIES);
    writer.progress = options.progress.then(|| progress_bar(total_bytes));
    let result = write_all(&mut writer, &checked, options).and_then(|()| {
        let (shards, documents, metadata) = writer.finish()?;
        write_manifest(
            dir,
            shards,
            &record,
            documents,
            metadata,
            &mut writer.written,
        )
    });
    if let Some(bar) = &writer.progress {
        bar.finish_and_clear();
    }
    match &result {
        Ok(new) => remove_replaced(dir, old.as_ref(), new),
        Err(_) => writer.written.cleanup(),
    }
    result
}

/// The manifest a `--force` pack into `dir` replaces, if there is one readable.
pub(super) fn current_manifest(dir: &Path) -> Option<Manifest> {
    crate::storage::read_manifest(dir).ok().map(|(m, _)| m)
}

/// Once the manifest `new` is in place: deletes the files only the replaced manifest `old`
/// referenced (they are garbage), except the files it referenced in place (the user's).
pub(super) fn remove_replaced(dir: &Path, old: Option<&Manifest>, new: &Manifest) {
    let Some(old) = old else { return };
    let keep: std::collections::HashSet<&str> = new.shards.iter().flat_map(shard_files).collect();
    let owned = old.shards.iter().flat_map(|s| {
        let mut files = shard_files(s);
        if s.in_place_mtime_ns.is_some() {
            files.retain(|f| Some(*f) != Some(s.path.as_str()));
        }
        files
    });
    for f in owned {
        if !keep.contains(&f) {
            let _ = fs::remove_file(dir.join(f));
        }
    }
}

/// All file names of one shard.
fn shard_files(s: &ShardEntry) -> Vec<&str> {
    let mut v = vec![s.path.as_str()];
    if let Some(c) = &s.checksums {
        v.push(c.file.as_str());
    }
    if let Some(d) = &s.docs {
        v.extend(d.names().into_iter().flatten());
        if let Some(c) = &d.checksums {
            v.push(c.file.as_str());
        }
    }
    v
}

fn progress_bar(total: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} ({binary_bytes_per_sec}) {msg}",
        )
        .expect("valid template"),
    );
    bar
}

fn write_all(writer: &mut Writer, inputs: &[Input], options: &PackOptions) -> Result<()> {
    let itemsize = writer.record.itemsize() as u64;
    for input in inputs {
        match input {
            Input::Records {
                path,
                offset,
                bytes,
                native,
                ..
            } => {
                let records = bytes / itemsize;
                let scanned = options.doc_start.is_some() || options.doc_bos.is_some();
                if native.source_format().is_some() || scanned {
                    // The format's own index, or a --doc-start/--doc-bos scan: the ends first
                    // (O(documents) memory), then the copy.
                    let rule = scan_rule(options.doc_sep, options.doc_start, options.doc_bos)?;
                    let scan = match (rule, tokens(writer)) {
                        (Some(rule), Some(t)) => Some((rule, t)),
                        _ => None,
                    };
                    let mut ends = Vec::new();
                    for_each_end(native, scan, (path, *offset, records), |e| {
                        ends.push(e);
                        Ok(())
                    })?;
                    write_records_file(writer, path, *offset, *bytes, Split::Ends(&ends))?;
                } else {
                    let split = Split::Sep(options.doc_sep);
                    write_records_file(writer, path, *offset, *bytes, split)?;
                }
            }
            Input::Jsonl { path } => write_jsonl(writer, path, options.tokens_field.as_deref())?,
            Input::Table { path } => write_table(writer, path, options)?,
        }
    }
    Ok(())
}

/// The dataset's token type, when its records are integer tokens.
fn tokens(writer: &Writer) -> Option<ScalarType> {
    writer.record.scalar_type().filter(|t| t.is_token_type())
}

/// Converts a table of token lists (`formats/hf`): one document per non-empty row.
fn write_table(writer: &mut Writer, path: &Path, options: &PackOptions) -> Result<()> {
    let dtype = tokens(writer)
        .ok_or_else(|| Error::invalid("a table of token lists needs an integer --dtype"))?;
    let opts = formats::hf::Options {
        column: options.tokens_field.clone(),
        ..formats::hf::Options::new(dtype)
    };
    let size = dtype.size();
    formats::hf::convert(path, &opts, &mut |bytes, lens| {
        let mut at = 0usize;
        for &len in lens {
            let n = len as usize * size;
            if n > 0 {
                writer.begin_doc(None)?;
                writer.write_doc_records(&bytes[at..at + n], writer::Seg::Doc)?;
                writer.end_doc()?;
            }
            at += n;
        }
        Ok(())
    })?;
    Ok(())
}

fn write_manifest(
    dir: &Path,
    shards: Vec<ShardEntry>,
    record: &RecordType,
    documents: Option<u64>,
    metadata: bool,
    written: &mut Written,
) -> Result<Manifest> {
    let mut manifest = Manifest {
        format: FORMAT_NAME.into(),
        version: version_for(&shards),
        dtype: record.manifest_descr(),
        itemsize: record.itemsize() as u64,
        records: shards.iter().map(|s| s.records).sum(),
        content_hash: String::new(),
        shards,
        documents,
        metadata,
        created_by: format!("shufflefs {}", env!("CARGO_PKG_VERSION")),
    };
    manifest.content_hash = manifest.expected_content_hash();
    let tmp = dir.join(format!("{MANIFEST}.tmp"));
    let path = dir.join(MANIFEST);
    written.files.push(tmp.clone());
    let write = || -> io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(&manifest.to_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)
    };
    write().map_err(|e| Error::io(&path, e))?;
    // The dataset exists from the rename on; a failure to make it durable is worth a warning
    // but must not delete the shards it references.
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        log::warn!(
            "{}: fsync after writing the manifest failed: {e}",
            dir.display()
        );
    }
    Ok(manifest)
}

/// Writes `tokens` positional tokens of `dtype` to `path` (token `i` has value `i` modulo the
/// type's range): a dataset where every window names its own position. Used by the demo,
/// tests and benchmarks.
pub fn write_positional(path: &Path, dtype: ScalarType, tokens: u64) -> Result<()> {
    let mut f = File::create(path).map_err(|e| Error::io(path, e))?;
    let size = dtype.size();
    let per_chunk = (CHUNK / size) as u64;
    let mut buf = Vec::with_capacity(CHUNK);
    let mut i = 0u64;
    while i < tokens {
        buf.clear();
        let end = (i + per_chunk).min(tokens);
        for t in i..end {
            buf.extend_from_slice(&t.to_le_bytes()[..size]);
        }
        f.write_all(&buf).map_err(|e| Error::io(path, e))?;
        i = end;
    }
    f.sync_all().map_err(|e| Error::io(path, e))
}

//! `shufflefs pack --in-place`: a manifest that references the input files themselves as
//! shards, identified by their content (sampled pages), never copied.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::documents::{CompactDocs, Native, for_each_end, scan_rule};
use super::formats::doc_scan::Rule;
use super::inputs::{Input, check_inputs, expand_inputs};
use super::{PackOptions, Written, write_manifest};
use crate::error::{Error, Result};
use crate::format::dtype::ScalarType;
use crate::format::sniff::Kind;
use crate::format::{self, MANIFEST, Manifest, ShardDocs, ShardEntry, shard_name};
use crate::storage::ReadAt;
use crate::storage::remote;

/// `shufflefs pack --in-place`: writes only a manifest that references the input files
/// themselves as shards, without copying them (it reads 16 pages of each). The inputs get the
/// checks a copy gets (one file is accepted by both or refused by both); a shard starts at its
/// records, after an llm.c or `.npy` header (`ShardEntry::offset`). Each file is identified by
/// its size and sampled content, and referenced by a path relative to the dataset directory
/// when it is inside it (so copies, archives and moves of the directory keep working and keep
/// the fingerprint), else by its absolute path. A mount refuses a file whose content samples
/// changed (`reference_in_place`).
pub fn pack_in_place(dir: &Path, inputs: &[PathBuf], options: &PackOptions) -> Result<Manifest> {
    super::remote_inputs::reset();
    let inputs = expand_inputs(inputs)?;
    let (checked, record) = check_inputs(&inputs, options)?;
    let itemsize = record.itemsize() as u64;
    let rule = scan_rule(options.doc_sep, options.doc_start, options.doc_bos)?;
    let mut shards = Vec::new();
    for input in checked {
        let (input, offset, bytes, kind, native) = match input {
            Input::Jsonl { path } => {
                return Err(Error::invalid(format!(
                    "{}: --in-place references token files (raw, .npy, llm.c, Megatron, \
                     datatrove) as they are; JSON Lines documents need files pack writes: \
                     pack it without --in-place",
                    path.display()
                )));
            }
            Input::Table { path } => {
                return Err(Error::invalid(format!(
                    "{}: a table of token lists (parquet or Arrow): --in-place serves token \
                     files as they are; pack it without --in-place (pack converts its token \
                     column, one document per row)",
                    path.display()
                )));
            }
            Input::Records {
                path,
                offset,
                bytes,
                kind,
                native,
            } => (path, offset, bytes, kind, native),
        };
        if bytes == 0 {
            // An input without records adds nothing (a copy skips it too).
            continue;
        }
        let abs = if remote::is_remote(&input) {
            input
        } else {
            input.canonicalize().map_err(|e| Error::io(&input, e))?
        };
        if abs.to_str().is_none() {
            return Err(Error::invalid(format!(
                "{}: path is not UTF-8",
                abs.display()
            )));
        }
        shards.push((abs, offset, bytes, kind, native));
    }
    if shards.is_empty() {
        return Err(Error::invalid("the inputs hold no tokens"));
    }
    let with_docs = rule.is_some() || shards.iter().any(|s| s.4.source_format().is_some());
    let scan = match (rule, record.scalar_type()) {
        (Some(rule), Some(t)) if t.is_token_type() => Some((rule, t)),
        (Some(_), _) => {
            return Err(Error::invalid(format!(
                "--doc-sep and --doc-start need integer tokens, but the records are {}",
                record.manifest_descr()
            )));
        }
        (None, _) => None,
    };
    if dir.exists() && !dir.is_dir() {
        return Err(Error::invalid(format!(
            "{}: DATASET_DIR exists and is not a directory",
            dir.display()
        )));
    }
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let canonical_dir = dir.canonicalize().map_err(|e| Error::io(dir, e))?;
    if dir.join(MANIFEST).exists() && !options.force {
        return Err(Error::invalid(format!(
            "{} already holds a dataset ({MANIFEST} exists): choose another directory or \
             pass --force to replace it",
            dir.display()
        )));
    }
    let mut entries = shards
        .iter()
        .map(|(abs, offset, bytes, kind, native)| {
            let format = native.source_format().unwrap_or(kind.source_format());
            reference_in_place(&canonical_dir, abs, (*offset, *bytes, itemsize), format)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut written = Written::default();
    let result = (|| {
        let documents = if with_docs {
            let (docs, n) = write_documents(&canonical_dir, &shards, &entries, scan, &mut written)?;
            for (entry, d) in entries.iter_mut().zip(docs) {
                entry.docs = Some(d);
            }
            Some(n)
        } else {
            None
        };
        let old = super::current_manifest(dir);
        let manifest = write_manifest(dir, entries, &record, documents, false, &mut written)?;
        super::remove_replaced(dir, old.as_ref(), &manifest);
        Ok(manifest)
    })();
    if result.is_err() {
        written.cleanup();
    }
    result
}

/// One in-place input: its canonical path, header offset, bytes, kind and own index.
type InPlace = (PathBuf, u64, u64, Kind, Native);

/// Writes the compact docs file of every shard (`documents.rs`): each input's documents,
/// from its own index or the separator scan, never spanning inputs. Returns the shards'
/// `ShardDocs` and the number of documents.
fn write_documents(
    dir: &Path,
    shards: &[InPlace],
    entries: &[ShardEntry],
    scan: Option<(Rule, ScalarType)>,
    written: &mut Written,
) -> Result<(Vec<ShardDocs>, u64)> {
    let pack_id = super::writer::new_pack_id();
    let names = (0..shards.len())
        .map(|k| {
            let bin = shard_name(&pack_id, k);
            format!("{}.docs", bin.trim_end_matches(".bin"))
        })
        .collect();
    let records: Vec<u64> = entries.iter().map(|e| e.records).collect();
    let mut docs = CompactDocs::new(dir, names, &records, written);
    let mut first = 0u64;
    for ((path, offset, _, _, native), &n) in shards.iter().zip(&records) {
        for_each_end(native, scan, (path, *offset, n), |end| {
            if end > n {
                return Err(Error::invalid(format!(
                    "{}: a document ends at token {end}, past its {n} tokens",
                    path.display()
                )));
            }
            docs.boundary(first + end)
        })?;
        first += n;
    }
    docs.finish()
}

/// The manifest entry of a file referenced in place (format version 4), its records starting
/// `offset` bytes into it: its path relative to the dataset directory `dir` (canonical) when
/// it is inside it, else absolute; its content identity from the size and the sampled pages of
/// the records (`format::sampled_identity`); its mtime and the guard that binds path and mtime
/// to that identity.
fn reference_in_place(
    dir: &Path,
    abs: &Path,
    (offset, bytes, itemsize): (u64, u64, u64),
    format: &str,
) -> Result<ShardEntry> {
    let (source, len, mtime, etag): (Arc<dyn ReadAt>, u64, u64, Option<String>) =
        if remote::is_remote(abs) {
            // A remote object (as the checks pinned it): referenced by its URL, its
            // Last-Modified as its mtime, its ETag recorded.
            let object = super::remote_inputs::pinned(abs)?;
            let (len, mtime) = (object.len(), object.mtime_ns());
            let etag = object.etag().map(str::to_string);
            (Arc::new(object), len, mtime, etag)
        } else {
            let file = File::open(abs).map_err(|e| Error::io(abs, e))?;
            let meta = file.metadata().map_err(|e| Error::io(abs, e))?;
            (
                Arc::new(file),
                meta.len(),
                crate::storage::mtime_ns(&meta),
                None,
            )
        };
    if len != offset + bytes {
        return Err(Error::invalid(format!(
            "{}: the file changed while packing; re-run pack when it is complete",
            abs.display()
        )));
    }
    let shard = crate::dataset::Shard::new(abs, bytes, source).with_offset(offset);
    let hash = shard.sampled_identity()?;
    let inside = abs
        .strip_prefix(dir)
        .ok()
        .and_then(Path::to_str)
        .filter(|rel| !rel.is_empty() && *rel != MANIFEST);
    let path = match inside {
        Some(rel) => rel.to_string(),
        None => abs.to_str().expect("checked UTF-8").to_string(),
    };
    Ok(ShardEntry {
        in_place_guard: Some(format::in_place_guard(&path, bytes, mtime, &hash)),
        hash,
        path,
        records: bytes / itemsize,
        bytes,
        offset,
        source_format: Some(format.to_string()),
        docs: None,
        in_place_mtime_ns: Some(mtime),
        checksums: None,
        etag,
    })
}

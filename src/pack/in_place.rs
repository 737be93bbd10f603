//! `shufflefs pack --in-place`: a manifest that references the input files themselves as
//! shards, identified by their content (sampled pages), never copied.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use super::inputs::{Input, check_inputs};
use super::{PackOptions, Written, write_manifest};
use crate::error::{Error, Result};
use crate::format::sniff::Kind;
use crate::format::{self, MANIFEST, Manifest, ShardEntry};

/// `shufflefs pack --in-place`: writes only a manifest that references the input files
/// themselves as shards, without copying them (it reads 16 pages of each). The inputs get the
/// checks a copy gets (one file is accepted by both or refused by both); a shard starts at its
/// records, after an llm.c or `.npy` header (`ShardEntry::offset`). Each file is identified by
/// its size and sampled content, and referenced by a path relative to the dataset directory
/// when it is inside it (so copies, archives and moves of the directory keep working and keep
/// the fingerprint), else by its absolute path. A mount refuses a file whose content samples
/// changed (`reference_in_place`).
pub fn pack_in_place(dir: &Path, inputs: &[PathBuf], options: &PackOptions) -> Result<Manifest> {
    if options.doc_sep.is_some() {
        return Err(Error::invalid(
            "--in-place cannot split documents (--doc-sep): documents need files pack writes",
        ));
    }
    let (checked, record) = check_inputs(inputs, options)?;
    let itemsize = record.itemsize() as u64;
    let mut shards = Vec::new();
    for input in checked {
        let (input, offset, bytes, kind) = match input {
            Input::Jsonl { path } => {
                return Err(Error::invalid(format!(
                    "{}: --in-place references token files (raw, .npy, llm.c) as they are; JSON \
                     Lines documents need files pack writes: pack it without --in-place",
                    path.display()
                )));
            }
            Input::Records {
                path,
                offset,
                bytes,
                kind,
            } => (path, offset, bytes, kind),
        };
        if bytes == 0 {
            // An input without records adds nothing (a copy skips it too).
            continue;
        }
        let abs = input.canonicalize().map_err(|e| Error::io(&input, e))?;
        if abs.to_str().is_none() {
            return Err(Error::invalid(format!(
                "{}: path is not UTF-8",
                abs.display()
            )));
        }
        shards.push((abs, offset, bytes, kind));
    }
    if shards.is_empty() {
        return Err(Error::invalid("the inputs hold no tokens"));
    }
    if dir.exists() && !dir.is_dir() {
        return Err(Error::invalid(format!(
            "{}: DATASET_DIR exists and is not a directory",
            dir.display()
        )));
    }
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let canonical_dir = dir.canonicalize().map_err(|e| Error::io(dir, e))?;
    let shards = shards
        .into_iter()
        .map(|(abs, offset, bytes, kind)| {
            reference_in_place(&canonical_dir, &abs, (offset, bytes, itemsize), kind)
        })
        .collect::<Result<Vec<_>>>()?;
    if dir.join(MANIFEST).exists() && !options.force {
        return Err(Error::invalid(format!(
            "{} already holds a dataset ({MANIFEST} exists): choose another directory or \
             pass --force to replace it",
            dir.display()
        )));
    }
    let mut written = Written::default();
    let result = write_manifest(dir, shards, &record, None, false, &mut written);
    if result.is_err() {
        written.cleanup();
    }
    result
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
    kind: Kind,
) -> Result<ShardEntry> {
    let file = File::open(abs).map_err(|e| Error::io(abs, e))?;
    let meta = file.metadata().map_err(|e| Error::io(abs, e))?;
    if meta.len() != offset + bytes {
        return Err(Error::invalid(format!(
            "{}: the file changed while packing; re-run pack when it is complete",
            abs.display()
        )));
    }
    let shard =
        crate::dataset::Shard::new(abs, bytes, std::sync::Arc::new(file)).with_offset(offset);
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
    let mtime = crate::storage::mtime_ns(&meta);
    Ok(ShardEntry {
        in_place_guard: Some(format::in_place_guard(&path, bytes, mtime, &hash)),
        hash,
        path,
        records: bytes / itemsize,
        bytes,
        offset,
        source_format: Some(kind.source_format().to_string()),
        docs: None,
        in_place_mtime_ns: Some(mtime),
        checksums: None,
    })
}

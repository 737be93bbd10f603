//! `pack --in-place` over remote token files (`s3://BUCKET/tokens/*.bin`,
//! `https://HOST/data/train.bin`): each object gets the checks a local file gets (what it is,
//! its header, its dtype, a Megatron index in full) from the few ranges they need, fetched
//! together, and is referenced by its URL: nothing is copied. A Megatron `.idx` is fetched once
//! into an unnamed temporary file (its checks and the document index read all of it).
//! Datatrove files and JSON Lines or tables are refused: they need their companions or a
//! conversion, which `pack` does from local files.

use std::path::{Path, PathBuf};

use super::PackOptions;
use super::documents::Native;
use super::formats::megatron::{self, MegatronIndex};
use super::inputs::{Input, check_records, indexed, is_glob, wildcard};
use crate::error::{Error, Result};
use crate::format::dtype::RecordType;
use crate::storage::remote::{self, Location, RemoteObject, StorageError};

/// The remote location a path names.
fn location(path: &Path) -> Result<Location> {
    Location::parse(&path.to_string_lossy()).map_err(Error::invalid)
}

fn remote_error(path: &Path, e: StorageError) -> Error {
    Error::io(path, e.into())
}

/// The objects a remote input stands for: a glob in its last component (`*`, `?`), or a URL
/// ending in `/`, stands for the objects directly under that prefix (matching the glob), in
/// key order (S3 only: an HTTP server cannot list); any other URL for itself.
pub(super) fn expand(p: &Path) -> Result<Vec<PathBuf>> {
    let url = p.to_string_lossy();
    let (dir, pattern) = if url.ends_with('/') {
        (url.trim_end_matches('/').to_string(), None)
    } else if is_glob(p) {
        let (dir, name) = url.rsplit_once('/').expect("a URL has a '/'");
        (dir.to_string(), Some(name.to_string()))
    } else {
        return Ok(vec![p.to_path_buf()]);
    };
    let dir_location = Location::parse(&dir).map_err(Error::invalid)?;
    let listed = remote::list_dir(&dir_location).map_err(|e| remote_error(p, e))?;
    let files: Vec<PathBuf> = listed
        .into_iter()
        .filter(|l| {
            let url = l.url();
            let name = url.rsplit('/').next().unwrap_or("");
            !name.starts_with('.') && pattern.as_deref().is_none_or(|pat| wildcard(pat, name))
        })
        .map(|l| l.path())
        .collect();
    if files.is_empty() {
        return Err(Error::invalid(format!(
            "{}: no object matches",
            remote::redact_url(&url)
        )));
    }
    Ok(files)
}

/// Checks one remote input (see the module docs).
pub(super) fn check(
    path: &Path,
    record: &mut Option<RecordType>,
    options: &PackOptions,
) -> Result<Input> {
    let at = |msg: &str| Error::invalid(format!("{}: {msg}", path.display()));
    let here = location(path)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if [".ds", ".ds.index", ".ds.metadata", ".ds.loss"]
        .iter()
        .any(|s| name.ends_with(s))
    {
        return Err(at(
            "a datatrove file in remote storage: --in-place over remote storage takes raw, \
             .npy, llm.c and Megatron token files; copy the datatrove folder to local disk and \
             pack it there",
        ));
    }
    if name.ends_with(".idx") {
        return Err(at(
            "a Megatron-LM index: name its .bin (the .idx beside it is read with it)",
        ));
    }
    let object = RemoteObject::open(&here).map_err(|e| remote_error(path, e))?;
    if name.ends_with(".bin") {
        let idx_path = megatron::idx_path(path);
        match RemoteObject::open(&location(&idx_path)?) {
            Ok(idx) => return megatron_input(path, &object, &idx, record, options),
            Err(StorageError::Missing { .. }) => {}
            Err(e) => return Err(remote_error(&idx_path, e)),
        }
    }
    let input = check_records(path, &object, object.len(), record, options)?;
    if matches!(input, Input::Jsonl { .. } | Input::Table { .. }) {
        return Err(at(
            "JSON Lines or a table in remote storage: --in-place references token files \
             where they are; download it and pack it without --in-place (pack converts it)",
        ));
    }
    Ok(input)
}

/// A Megatron-LM `PREFIX.bin` with its `PREFIX.idx` (`idx`): the index fetched into a
/// temporary file and checked in full, as for a local pair.
fn megatron_input(
    path: &Path,
    bin: &RemoteObject,
    idx: &RemoteObject,
    record: &mut Option<RecordType>,
    options: &PackOptions,
) -> Result<Input> {
    let idx_path = PathBuf::from(idx.url());
    let mut file = tempfile::tempfile().map_err(|e| Error::io(&idx_path, e))?;
    {
        let mut out = std::io::BufWriter::new(&mut file);
        remote::download(idx, &mut out).map_err(|e| remote_error(&idx_path, e))?;
        std::io::Write::flush(&mut out).map_err(|e| Error::io(&idx_path, e))?;
    }
    let index = MegatronIndex::open(&idx_path, &file, idx.len(), bin.len())?;
    index.verify(&file)?;
    let dtype = index.dtype();
    let bytes = index.tokens() * dtype.size() as u64;
    let what = format!("Megatron-LM dataset of {dtype} tokens (its .idx)");
    let native = Native::Megatron(index, file, options.megatron_unit);
    indexed(path, record, options, (native, dtype, bytes, &what))
}

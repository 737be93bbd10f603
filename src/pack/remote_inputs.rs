//! `pack --in-place` over remote token files (`s3://BUCKET/tokens/*.bin`,
//! `https://HOST/data/train.bin`): each object gets the checks a local file gets (what it is,
//! its header, its dtype, a Megatron index in full) from the few ranges they need, fetched
//! together, and is referenced by its URL: nothing is copied. A Megatron `.idx` is fetched once
//! into an unnamed temporary file (its checks and the document index read all of it).
//! Datatrove files and JSON Lines or tables are refused: they need their companions or a
//! conversion, which `pack` does from local files.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

use super::PackOptions;
use super::documents::Native;
use super::formats::megatron::{self, MegatronIndex};
use super::inputs::{Input, check_records, indexed, is_glob, wildcard};
use crate::error::{Error, Result};
use crate::format::dtype::RecordType;
use crate::storage::remote::{self, Location, RemoteObject, StorageError};

/// What this pack run knows of the store: every object it pinned, by URL (the checks, the
/// document scan and the manifest entry of an input all read the object as first opened, and
/// its reads carry If-Match, so one replaced in between fails the pack instead of mixing two
/// versions), and the prefixes listed for globs with the URLs they hold (whether a `.bin` has
/// its `.idx` needs no HEAD there).
#[derive(Default)]
struct Known {
    pinned: HashMap<String, RemoteObject>,
    listed_dirs: HashSet<String>,
    listed: HashSet<String>,
}

fn known() -> std::sync::MutexGuard<'static, Known> {
    static KNOWN: LazyLock<Mutex<Known>> = LazyLock::new(Mutex::default);
    KNOWN.lock().unwrap_or_else(|p| p.into_inner())
}

/// Forgets what an earlier pack run of this process knew.
pub(super) fn reset() {
    *known() = Known::default();
}

/// The object at `path`, pinned by this pack run's first open of it.
fn pin(path: &Path) -> std::result::Result<RemoteObject, StorageError> {
    let url = path.to_string_lossy().into_owned();
    if let Some(o) = known().pinned.get(&url) {
        return Ok(o.clone());
    }
    let location = Location::parse(&url).map_err(|what| StorageError::Remote {
        name: remote::redact_url(&url),
        what,
    })?;
    let object = RemoteObject::open(&location)?;
    known().pinned.insert(url, object.clone());
    Ok(object)
}

/// [`pin`] for the checks and the manifest (errors name the file).
pub(super) fn pinned(path: &Path) -> Result<RemoteObject> {
    pin(path).map_err(|e| remote_error(path, e))
}

/// Whether `path` exists as far as a listing of its prefix knows (`None`: not listed).
fn listed(path: &Path) -> Option<bool> {
    let url = path.to_string_lossy();
    let dir = url.rsplit_once('/')?.0;
    let k = known();
    k.listed_dirs
        .contains(dir)
        .then(|| k.listed.contains(url.as_ref()))
}

/// The remote location a path names.
fn location(path: &Path) -> Result<Location> {
    Location::parse(&path.to_string_lossy()).map_err(Error::invalid)
}

fn remote_error(path: &Path, e: StorageError) -> Error {
    Error::io(path, e.into())
}

/// The objects a remote input stands for: a glob in its last component (`*`; a `?` would
/// start a query), or a URL ending in `/`, stands for the objects directly under that prefix
/// (matching the glob), in key order (S3 only: an HTTP server cannot list); any other URL for
/// itself.
pub(super) fn expand(p: &Path) -> Result<Vec<PathBuf>> {
    let url = p.to_string_lossy();
    // A URL with credentials or a query (a presigned URL) is refused before anything names
    // it (`?` is no glob character here).
    Location::parse(&url).map_err(Error::invalid)?;
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
    {
        let mut k = known();
        k.listed_dirs.insert(dir_location.url());
        k.listed.extend(listed.iter().map(Location::url));
    }
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
    // Refuses credentials and queries before anything names the URL.
    location(path)?;
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
    let object = pinned(path)?;
    if name.ends_with(".bin") {
        let idx_path = megatron::idx_path(path);
        let exists = listed(&idx_path);
        if exists != Some(false) {
            match pin(&idx_path) {
                Ok(idx) => return megatron_input(path, &object, &idx, record, options),
                Err(StorageError::Missing { .. }) => {}
                // S3 answers 403 for a missing key to whoever may not list the bucket.
                Err(StorageError::Denied { .. }) if exists.is_none() => {
                    return Err(Error::invalid(format!(
                        "{}: cannot tell whether the Megatron-LM index beside it exists (a HEAD \
                         of {} was denied, as S3 denies missing keys without s3:ListBucket): \
                         grant s3:ListBucket, or name the files with a glob of their prefix",
                        path.display(),
                        idx_path.display()
                    )));
                }
                Err(e) => return Err(remote_error(&idx_path, e)),
            }
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

//! Opening a dataset: read and validate the manifest, open every file it lists, and check
//! each against it before anything is served.
//!
//! For each shard: opened as the dataset's principals, a regular file of a real filesystem
//! (`storage/local.rs`); its size is `offset + bytes`; a version 2-3 in-place shard still has
//! its mtime at pack, a version 4 one its content identity (`Shard::check_in_place`). Its
//! checksum file has the size its shard implies and is bound to the hash the manifest records;
//! its document files have the sizes the manifest implies. Any doubt is an error naming the
//! file and what to do. Descriptors: at most `max_open` (`--max-open-shards`) stay open, the
//! others are reopened on demand and must still be the files validated here
//! (`storage/fdpool.rs`).
//!
//! A dataset directory may be remote (`s3://BUCKET/PREFIX`, `http(s)://HOST/PATH`: the
//! directory as packed, uploaded as it is): its manifest and every file it lists are objects
//! under that prefix, each pinned at open (`storage/remote/`). A local manifest may name
//! remote objects (`pack --in-place` over remote token files) only when it belongs to the user
//! whose credentials fetch them: the daemon's.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Dataset;
use super::documents::{DocFiles, DocSums};
use super::shard::Shard;
use crate::error::{CorruptKind, Error, Result};
use crate::format::checksum;
use crate::format::docfiles::{DOC_RECORD, DocFile, ID_BYTES, OFFSET_BYTES};
use crate::format::{MANIFEST, Manifest, ShardDocs, ShardEntry, parse_hash};
use crate::storage::fdpool::DEFAULT_MAX_OPEN;
use crate::storage::remote::{self, Listing, Location, RemoteObject};
use crate::storage::{LocalFiles, MAX_MANIFEST_BYTES, ReadAt, mtime_ns, read_manifest};

impl Dataset {
    /// Opens `dir` (see the module docs), keeping at most `DEFAULT_MAX_OPEN` descriptors
    /// open.
    pub fn open(dir: &Path) -> Result<Dataset> {
        Dataset::open_bounded(dir, DEFAULT_MAX_OPEN)
    }

    /// [`Dataset::open`] keeping at most `max_open` file descriptors open.
    pub fn open_bounded(dir: &Path, max_open: usize) -> Result<Dataset> {
        Dataset::open_with(dir, max_open, false)
    }

    /// [`Dataset::open_bounded`] for a mount that other users may read (`allow_other`): a
    /// non-root daemon then serves only files every user may read when others can choose what
    /// the dataset names (`storage/access.rs`).
    pub(crate) fn open_with(dir: &Path, max_open: usize, allow_other: bool) -> Result<Dataset> {
        if remote::is_remote(dir) {
            let location = location(dir)?;
            let manifest_path = location.join(MANIFEST).map_err(Error::invalid)?;
            // The listing pins the manifest's files in the manifest's round trip (S3).
            let (bytes, listing) =
                remote::read_small_listing(&manifest_path, Some(&location), MAX_MANIFEST_BYTES);
            let bytes = bytes.map_err(|e| match e {
                remote::StorageError::Missing { .. } => Error::invalid(format!(
                    "{}: no {MANIFEST} there, so not a packed dataset: upload the directory \
                     `shufflefs pack` wrote, or reference token files where they are with \
                     `shufflefs pack DIR --in-place '{}/*.bin'` and mount DIR",
                    location.url(),
                    location.url()
                )),
                e => remote_error(&manifest_path.path(), e),
            })?;
            let manifest = Manifest::parse(&bytes, &manifest_path.path())?;
            let mut files = Files::new(FilesKind::Remote(location.clone()));
            files.listing = listing;
            let dir = location.path();
            files.open_remote_ahead(&dir, &manifest)?;
            let shards = manifest
                .shards
                .iter()
                .map(|entry| open_shard(&dir, &manifest, entry, &files))
                .collect::<Result<Vec<_>>>()?;
            return Ok(Dataset::from_parts(dir, manifest, shards));
        }
        let dir = &dir.canonicalize().map_err(|e| Error::io(dir, e))?;
        let (manifest, manifest_meta) = read_manifest(dir)?;
        let local = LocalFiles::new(
            dir,
            &manifest_meta,
            allow_other,
            listed_files(&manifest),
            max_open,
        )?;
        let files = Files::new(FilesKind::Local {
            local,
            remote_ok: {
                use std::os::unix::fs::MetadataExt;
                manifest_meta.uid() == nix::unistd::geteuid().as_raw()
            },
        });
        files.open_remote_ahead(dir, &manifest)?;
        let shards = manifest
            .shards
            .iter()
            .map(|entry| open_shard(dir, &manifest, entry, &files))
            .collect::<Result<Vec<_>>>()?;
        Ok(Dataset::from_parts(dir.to_path_buf(), manifest, shards))
    }
}

/// The names of every file the manifest lists: shards, checksum and document files.
fn listed_names(manifest: &Manifest) -> Vec<&str> {
    let mut names = Vec::new();
    for s in &manifest.shards {
        names.push(s.path.as_str());
        if let Some(c) = &s.checksums {
            names.push(c.file.as_str());
        }
        if let Some(d) = &s.docs {
            names.extend(d.names().into_iter().flatten());
            if let Some(c) = &d.checksums {
                names.push(c.file.as_str());
            }
        }
    }
    names
}

/// How many files the manifest lists: shards, checksum and document files.
fn listed_files(manifest: &Manifest) -> usize {
    manifest
        .shards
        .iter()
        .map(|s| {
            1 + usize::from(s.checksums.is_some())
                + s.docs.as_ref().map_or(0, |d| {
                    d.names().iter().flatten().count() + usize::from(d.checksums.is_some())
                })
        })
        .sum()
}

/// Where the files a manifest lists are opened.
struct Files {
    kind: FilesKind,
    /// Remote objects opened together ahead of the checks ([`Files::open_remote_ahead`]).
    ahead: RefCell<HashMap<PathBuf, std::result::Result<RemoteObject, remote::StorageError>>>,
    /// The objects listed under a remote dataset's prefix with its manifest (S3).
    listing: Listing,
}

enum FilesKind {
    /// Local files (`remote_ok`: the manifest may name remote objects).
    Local { local: LocalFiles, remote_ok: bool },
    /// Objects under a remote dataset prefix.
    Remote(Location),
}

/// A listed file's size and modification time.
struct FileInfo {
    len: u64,
    mtime_ns: u64,
    /// A remote object's strong ETag when opened (`None` for local files).
    etag: Option<String>,
}

impl Files {
    fn new(kind: FilesKind) -> Files {
        Files {
            kind,
            ahead: RefCell::new(HashMap::new()),
            listing: Listing::default(),
        }
    }

    /// Opens every remote object `manifest` (of `dir`) lists, all at once: one round trip,
    /// not one per file, and none for those the listing holds. The checks of each come later,
    /// in [`Files::open`].
    fn open_remote_ahead(&self, dir: &Path, manifest: &Manifest) -> Result<()> {
        if let FilesKind::Local {
            remote_ok: false, ..
        } = self.kind
        {
            return Ok(());
        }
        let mut paths = Vec::new();
        for name in listed_names(manifest) {
            let path = self.locate(dir, name)?;
            if remote::is_remote(&path) {
                paths.push(path);
            }
        }
        let locations = paths
            .iter()
            .map(|p| location(p))
            .collect::<Result<Vec<_>>>()?;
        let opened = RemoteObject::open_many_listed(&locations, &self.listing);
        self.ahead
            .borrow_mut()
            .extend(paths.into_iter().zip(opened));
        Ok(())
    }

    /// The path of the file the manifest of `dir` names `name`.
    fn locate(&self, dir: &Path, name: &str) -> Result<PathBuf> {
        let listed = Path::new(name);
        match &self.kind {
            FilesKind::Local { .. } => Ok(if remote::is_remote(listed) {
                listed.to_path_buf()
            } else {
                dir.join(name)
            }),
            FilesKind::Remote(location) => {
                if listed.is_absolute() || remote::is_remote(listed) {
                    return Err(Error::dataset(
                        dir.join(MANIFEST),
                        CorruptKind::Manifest(format!(
                            "a remote dataset's manifest names {name:?}: it may only name \
                             files under its own prefix (relative names)"
                        )),
                    ));
                }
                Ok(location
                    .join(name)
                    .map_err(|e| Error::dataset(dir.join(MANIFEST), CorruptKind::Manifest(e)))?
                    .path())
            }
        }
    }

    /// Opens the listed file `path` (`what`: "shard", "document file"; `random`: advise
    /// random reads).
    fn open(
        &self,
        path: &Path,
        what: &'static str,
        random: bool,
    ) -> Result<(Arc<dyn ReadAt>, FileInfo)> {
        if !remote::is_remote(path) {
            let FilesKind::Local { local, .. } = &self.kind else {
                // Files::locate names only objects under a remote dataset's prefix.
                return Err(Error::invalid(format!(
                    "{}: a remote dataset lists only remote objects",
                    path.display()
                )));
            };
            let (source, meta) = local.open(path, what, random)?;
            let info = FileInfo {
                len: meta.len(),
                mtime_ns: mtime_ns(&meta),
                etag: None,
            };
            return Ok((source, info));
        }
        if let FilesKind::Local {
            remote_ok: false, ..
        } = self.kind
        {
            return Err(Error::dataset(
                path,
                CorruptKind::Manifest(format!(
                    "the manifest names this remote object but belongs to another user than \
                     the one whose credentials would fetch it (uid {}): pack it as that user",
                    nix::unistd::geteuid()
                )),
            ));
        }
        let ahead = self.ahead.borrow_mut().remove(path);
        let object = match ahead {
            Some(opened) => opened,
            None => RemoteObject::open(&location(path)?),
        }
        .map_err(|e| remote_error(path, e))?;
        let info = FileInfo {
            len: object.len(),
            mtime_ns: object.mtime_ns(),
            etag: object.etag().map(str::to_string),
        };
        Ok((Arc::new(object), info))
    }
}

/// The remote location `path` names.
fn location(path: &Path) -> Result<Location> {
    Location::parse(&path.to_string_lossy()).map_err(Error::invalid)
}

/// A remote open or read that failed.
fn remote_error(path: &Path, e: remote::StorageError) -> Error {
    Error::io(path, e.into())
}

/// Opens and checks one shard with its checksum and document files.
fn open_shard(dir: &Path, manifest: &Manifest, entry: &ShardEntry, files: &Files) -> Result<Shard> {
    let path = files.locate(dir, &entry.path)?;
    let (source, meta) = files.open(&path, "shard", true)?;
    if let Some(want) = entry.in_place_mtime_ns
        && manifest.version < 4
        && meta.mtime_ns != want
    {
        return Err(Error::dataset(&path, CorruptKind::InPlaceModified));
    }
    // Validated: offset + bytes does not overflow.
    if meta.len != entry.offset + entry.bytes {
        let kind = CorruptKind::ShardSize {
            actual: meta.len,
            offset: entry.offset,
            bytes: entry.bytes,
        };
        return Err(Error::dataset(&path, kind));
    }
    let mut shard = Shard::new(path, entry.bytes, source).with_offset(entry.offset);
    if manifest.version >= 4 {
        shard.check_in_place(entry, meta.mtime_ns, meta.etag.as_deref())?;
    }
    if let Some(c) = &entry.checksums {
        let sums = open_file(dir, files, &c.file, checksum::file_len(entry.bytes))?;
        shard = shard.with_sums(sums.bound_to(hash(&c.hash)));
    }
    if let Some(d) = &entry.docs {
        shard = shard.with_docs(open_docs(dir, files, entry, d)?);
    }
    Ok(shard)
}

/// The value of a hash the manifest's validation checked.
fn hash(text: &str) -> u64 {
    parse_hash(text).expect("validated at parse")
}

/// Opens a checksum or document file, which must be `want` bytes.
fn open_file(dir: &Path, files: &Files, name: &str, want: u64) -> Result<Shard> {
    let path = files.locate(dir, name)?;
    let (source, meta) = files.open(&path, "document file", false)?;
    let len = meta.len;
    if len != want {
        let kind = CorruptKind::FileSize {
            actual: len,
            expected: want,
        };
        return Err(Error::dataset(&path, kind));
    }
    Ok(Shard::new(path, len, source))
}

/// Opens a shard's document files and their checksum file.
fn open_docs(dir: &Path, files: &Files, entry: &ShardEntry, d: &ShardDocs) -> Result<DocFiles> {
    let sizes = (
        entry.records.checked_mul(ID_BYTES),
        d.entries
            .checked_add(1)
            .and_then(|n| n.checked_mul(OFFSET_BYTES)),
        d.documents.checked_mul(DOC_RECORD),
    );
    let (Some(ids), Some(index), Some(docs)) = sizes else {
        let kind = CorruptKind::Manifest("document file sizes overflow".into());
        return Err(Error::dataset(dir.join(MANIFEST), kind));
    };
    let mut docfiles: [Option<Shard>; 4] = [None, None, None, None];
    for (which, name) in DocFile::ALL.into_iter().zip(d.names()) {
        let Some(name) = name else { continue };
        let want = match which {
            DocFile::Ids => ids,
            DocFile::Index => index,
            DocFile::Meta => d.meta_bytes,
            DocFile::Docs => docs,
        };
        docfiles[which.index()] = Some(open_file(dir, files, name, want)?);
    }
    let sums = match &d.checksums {
        None => None,
        Some(c) => {
            let lens = docfiles
                .each_ref()
                .map(|f| f.as_ref().map_or(0, Shard::len));
            let file = open_file(dir, files, &c.file, DocSums::file_len(lens))?;
            Some(DocSums::new(file.bound_to(hash(&c.hash)), &docfiles))
        }
    };
    Ok(DocFiles::new(docfiles, d.entries, d.documents, sums))
}

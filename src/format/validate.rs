//! Validation of a parsed `manifest.json`: every invariant a reader relies on, checked once at
//! open so that the read path can trust the numbers.
//!
//! The checks run in a fixed order, and the first failure is reported: the header (format name,
//! version, record type), each shard in order (its path, in-place fields, counts, offset,
//! checksum file, hash), the totals, the document files, the names against each other, and
//! last the content hash. A message says which field is wrong; every one but the version's
//! ends with [`crate::error::EDITED`], which says what to do (`Error::Dataset` with
//! [`CorruptKind::Manifest`]).

use std::collections::HashMap;
use std::path::{Component, Path};

use super::checksum;
use super::docfiles::DocFile;
use super::dtype::RecordType;
use super::hash::{in_place_hash, parse_hash};
use super::manifest::{
    Manifest, SOURCE_FORMATS, ShardChecksums, ShardDocs, ShardEntry, pack_shard_number,
};
use super::{FORMAT_NAME, MANIFEST, MIN_VERSION, VERSION};
use crate::error::{CorruptKind, Error, Result};

/// What is wrong, without the path and the advice (added by [`Manifest::validate`]).
type Invalid = std::result::Result<(), String>;

impl Manifest {
    /// Checks every invariant a reader relies on (see the module docs). `path` is used in
    /// messages only.
    pub(crate) fn validate(&self, path: &Path) -> Result<()> {
        let invalid = |message: String| Error::Dataset {
            path: path.to_path_buf(),
            kind: CorruptKind::Manifest(message),
        };
        if self.format != FORMAT_NAME {
            return Err(invalid(format!(
                "format is {:?}, expected {FORMAT_NAME:?}",
                self.format
            )));
        }
        if !(MIN_VERSION..=VERSION).contains(&self.version) {
            return Err(Error::Dataset {
                path: path.to_path_buf(),
                kind: CorruptKind::ManifestVersion {
                    version: self.version,
                    reads: MIN_VERSION..=VERSION,
                },
            });
        }
        self.check_record_type().map_err(invalid)?;
        let mut total: u64 = 0;
        for (i, shard) in self.shards.iter().enumerate() {
            self.check_shard(i, shard).map_err(invalid)?;
            total = total
                .checked_add(shard.records)
                .ok_or_else(|| invalid("record count overflows 64 bits".into()))?;
        }
        if total != self.records {
            return Err(invalid(format!(
                "records is {} but the shards hold {total}",
                self.records
            )));
        }
        if total.checked_mul(self.itemsize).is_none() {
            return Err(invalid("the stream's byte size overflows 64 bits".into()));
        }
        self.check_documents().map_err(invalid)?;
        self.check_names().map_err(invalid)?;
        if self.content_hash != self.expected_content_hash() {
            return Err(invalid(format!(
                "content_hash {:?} does not match the shard list",
                self.content_hash
            )));
        }
        Ok(())
    }

    /// The record type: a known, canonical descr whose size is `itemsize`.
    fn check_record_type(&self) -> Invalid {
        let record =
            RecordType::from_manifest(&self.dtype).map_err(|e| format!("field dtype: {e}"))?;
        if record.manifest_descr() != self.dtype {
            return Err(format!(
                "field dtype {:?} is not in canonical form ({:?})",
                self.dtype,
                record.manifest_descr()
            ));
        }
        if record.itemsize() as u64 != self.itemsize {
            return Err(format!(
                "field itemsize is {} but dtype {} has {} bytes",
                self.itemsize,
                self.dtype,
                record.itemsize()
            ));
        }
        Ok(())
    }

    /// Shard `i` on its own: its path, the in-place fields, counts, offset, checksum file and
    /// hash.
    fn check_shard(&self, i: usize, shard: &ShardEntry) -> Invalid {
        match shard.in_place_mtime_ns {
            None => check_shard_path(&shard.path),
            Some(_) if shard.docs.as_ref().is_some_and(|d| !d.is_compact()) => {
                Err("an in-place shard can only have compact document files".to_string())
            }
            Some(_) if self.version >= 4 => check_in_place_path(&shard.path),
            Some(_) if Path::new(&shard.path).is_absolute() => Ok(()),
            Some(_) => Err(format!(
                "{:?} of an in-place shard must be absolute",
                shard.path
            )),
        }
        .map_err(|e| format!("shards[{i}].path: {e}"))?;
        match (&shard.in_place_guard, shard.in_place_mtime_ns) {
            (None, Some(_)) if self.version >= 4 => {
                return Err(format!("shards[{i}] is in place but has no in_place_guard"));
            }
            (Some(_), _) if self.version < 4 => {
                return Err(format!(
                    "shards[{i}].in_place_guard needs manifest version 4, not {}",
                    self.version
                ));
            }
            (Some(_), None) => {
                return Err(format!(
                    "shards[{i}].in_place_guard without in_place_mtime_ns"
                ));
            }
            (Some(g), _) if parse_hash(g).is_none() => {
                return Err(format!(
                    "shards[{i}].in_place_guard {g:?} is not 16 hex digits"
                ));
            }
            _ => {}
        }
        if shard.records == 0 {
            return Err(format!("shards[{i}] ({}) has no records", shard.path));
        }
        if shard.offset != 0 && shard.in_place_mtime_ns.is_none() {
            return Err(format!(
                "shards[{i}] ({}) has offset {} but only an in-place shard has a header",
                shard.path, shard.offset
            ));
        }
        if shard.offset.checked_add(shard.bytes).is_none() {
            return Err(format!(
                "shards[{i}] ({}): offset {} + bytes {} overflows 64 bits",
                shard.path, shard.offset, shard.bytes
            ));
        }
        if let Some(etag) = &shard.etag {
            let remote = crate::storage::remote::is_remote(Path::new(&shard.path));
            if shard.in_place_mtime_ns.is_none() || !remote {
                return Err(format!(
                    "shards[{i}].etag belongs to an in-place shard that is a remote object"
                ));
            }
            if etag.len() > 256 || !etag.chars().all(|c| c.is_ascii_graphic()) {
                return Err(format!(
                    "shards[{i}].etag is not an ETag (at most 256 printable ASCII characters)"
                ));
            }
        }
        if let Some(f) = &shard.source_format
            && !SOURCE_FORMATS.contains(&f.as_str())
        {
            return Err(format!(
                "shards[{i}].source_format {f:?} is not one of {SOURCE_FORMATS:?}"
            ));
        }
        if shard.records.checked_mul(self.itemsize) != Some(shard.bytes) {
            return Err(format!(
                "shards[{i}] ({}): bytes {} != records {} * itemsize {}",
                shard.path, shard.bytes, shard.records, self.itemsize
            ));
        }
        if let Some(c) = &shard.checksums {
            self.check_checksums(&format!("shards[{i}].checksums"), c, checksum::BLOCK)?;
        }
        if parse_hash(&shard.hash).is_none() {
            return Err(format!(
                "shards[{i}].hash {:?} is not 16 hex digits",
                shard.hash
            ));
        }
        // Versions 2-3: an in-place shard's hash is its identity (path, size, mtime): checking
        // it is what binds the path, which content_hash does not cover, to the shard. (From
        // version 4 the hash is the content's, checked against the file at mount whenever the
        // guard does not vouch for it.)
        if let Some(mtime) = shard.in_place_mtime_ns
            && self.version < 4
            && shard.hash != in_place_hash(&shard.path, shard.bytes, mtime)
        {
            return Err(format!(
                "shards[{i}].hash {:?} is not the in-place identity of its path {:?}, bytes and \
                 in_place_mtime_ns",
                shard.hash, shard.path
            ));
        }
        Ok(())
    }

    /// A checksum file entry (`field` names it in messages): version 3 or later, a plain file
    /// name, the block size this build uses, a hash.
    fn check_checksums(&self, field: &str, c: &ShardChecksums, block: u64) -> Invalid {
        if self.version < 3 {
            return Err(format!(
                "{field} needs manifest version 3, not {}",
                self.version
            ));
        }
        check_shard_path(&c.file).map_err(|e| format!("{field}.file: {e}"))?;
        if c.block != block {
            return Err(format!(
                "{field}.block is {} but this shufflefs uses {block}",
                c.block
            ));
        }
        if parse_hash(&c.hash).is_none() {
            return Err(format!("{field}.hash {:?} is not 16 hex digits", c.hash));
        }
        Ok(())
    }

    /// The document files: all shards or none have them, `documents` and `metadata` agree,
    /// and each shard's entry is well-formed.
    fn check_documents(&self) -> Invalid {
        let with_docs = self.shards.iter().filter(|s| s.docs.is_some()).count();
        match self.documents {
            None if with_docs > 0 => {
                return Err("shards have document files but documents is missing".into());
            }
            Some(_) if with_docs != self.shards.len() => {
                return Err("documents is set but not every shard has document files".into());
            }
            _ => {}
        }
        if self.documents.is_none() && self.metadata {
            return Err("metadata is true but the dataset has no documents".into());
        }
        let compact = self
            .shards
            .iter()
            .filter(|s| s.docs.as_ref().is_some_and(ShardDocs::is_compact))
            .count();
        if compact > 0 && compact != with_docs {
            return Err("some shards have compact document files and others not".into());
        }
        if compact > 0 && self.version < 5 {
            return Err(format!(
                "compact document files need version 5, but version is {}",
                self.version
            ));
        }
        if compact > 0 && self.metadata {
            return Err("metadata is true but the document files are compact".into());
        }
        let mut docs_total: u64 = 0;
        for (i, shard) in self.shards.iter().enumerate() {
            let Some(d) = &shard.docs else { continue };
            let partial =
                d.ids.is_some() != d.index.is_some() || d.ids.is_some() != d.meta.is_some();
            if partial {
                return Err(format!(
                    "shards[{i}].docs lists some of ids, index and meta but not all"
                ));
            }
            for (field, name) in ["ids", "index", "meta", "docs"].into_iter().zip(d.names()) {
                if let Some(name) = name {
                    check_shard_path(name).map_err(|e| format!("shards[{i}].docs.{field}: {e}"))?;
                }
            }
            let entries_ok = if d.is_compact() {
                d.entries == 0 && d.meta_bytes == 0
            } else {
                d.entries > 0 && d.entries <= 1 << 32
            };
            if !entries_ok {
                return Err(format!(
                    "shards[{i}].docs.entries {} is out of range",
                    d.entries
                ));
            }
            if parse_hash(&d.hash).is_none() {
                return Err(format!(
                    "shards[{i}].docs.hash {:?} is not 16 hex digits",
                    d.hash
                ));
            }
            if let Some(c) = &d.checksums {
                let field = format!("shards[{i}].docs.checksums");
                self.check_checksums(&field, c, checksum::DOC_BLOCK)?;
            }
            docs_total = docs_total
                .checked_add(d.documents)
                .ok_or("document count overflows 64 bits")?;
        }
        match self.documents {
            Some(n) if n != docs_total => {
                Err(format!("documents is {n} but the shards hold {docs_total}"))
            }
            _ => Ok(()),
        }
    }

    /// File names against each other: the content hash covers no name, so a name edited
    /// to another listed file, or two names swapped, would serve the wrong file's bytes
    /// under the same identity. Every listed name (shard paths, checksum and document files)
    /// must be distinct (one hash map: linear in the names, so a manifest of 500k shards
    /// validates in about a second), and a name of pack's form (`shard-<id>-<k>.bin`) must
    /// belong to shard `k`, with document files of the same stem.
    fn check_names(&self) -> Invalid {
        // Name -> (shard, field), formatted only for a message.
        let mut seen: HashMap<&str, (usize, &'static str)> =
            HashMap::with_capacity(self.shards.len());
        for (i, shard) in self.shards.iter().enumerate() {
            let docs = shard.docs.as_ref();
            let names = [
                Some(("path", &shard.path)),
                docs.and_then(|d| d.ids.as_ref()).map(|n| ("docs.ids", n)),
                docs.and_then(|d| d.index.as_ref())
                    .map(|n| ("docs.index", n)),
                docs.and_then(|d| d.meta.as_ref()).map(|n| ("docs.meta", n)),
                docs.map(|d| ("docs.docs", &d.docs)),
                shard
                    .checksums
                    .as_ref()
                    .map(|c| ("checksums.file", &c.file)),
                docs.and_then(|d| d.checksums.as_ref())
                    .map(|c| ("docs.checksums.file", &c.file)),
            ];
            for (field, name) in names.iter().flatten() {
                if let Some((j, first)) = seen.insert(name.as_str(), (i, field)) {
                    return Err(format!(
                        "shards[{i}].{field} {name:?} is also shards[{j}].{first}"
                    ));
                }
            }
            if shard.in_place_mtime_ns.is_some() {
                continue;
            }
            let Some((k, stem)) = pack_shard_number(&shard.path) else {
                continue;
            };
            if k != i as u64 {
                return Err(format!(
                    "shards[{i}].path {:?} is the name pack gives shard {k}: the shard list \
                     was reordered or a path edited",
                    shard.path
                ));
            }
            let present = docs.map_or([None; 4], |d| d.names());
            let files = DocFile::ALL
                .into_iter()
                .zip(present)
                .filter(|(_, n)| n.is_some());
            for ((field, name), (file, _)) in names[1..5].iter().flatten().zip(files) {
                let ext = file.ext();
                let named_after = name
                    .strip_prefix(stem)
                    .and_then(|rest| rest.strip_prefix('.'))
                    == Some(ext);
                if !named_after {
                    return Err(format!(
                        "shards[{i}].{field} {name:?} is not named after its shard {:?} \
                         ({stem}.{ext})",
                        shard.path
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The path of an in-place shard (version 4): relative to the dataset directory (normal
/// components only: no `..`, `.`, empty components or trailing `/`, and not the manifest
/// itself) or absolute, in that same canonical form, so that one file has one spelling.
fn check_in_place_path(p: &str) -> Invalid {
    // A remote object (`pack --in-place s3://...`): a URL without secrets or `..`.
    if crate::storage::remote::is_remote(Path::new(p)) {
        return crate::storage::remote::Location::parse(p)
            .map(|_| ())
            .map_err(|e| format!("an in-place shard's URL: {e}"));
    }
    let mut rebuilt = std::path::PathBuf::new();
    let (mut normal, mut other) = (0, false);
    for c in Path::new(p).components() {
        match c {
            Component::RootDir => rebuilt.push("/"),
            Component::Normal(name) => {
                normal += 1;
                rebuilt.push(name);
            }
            _ => other = true,
        }
    }
    if normal == 0 || other || rebuilt.as_os_str() != p || p == MANIFEST {
        return Err(format!(
            "{p:?} of an in-place shard must be a path inside the dataset directory (normal \
             components only, no `..`) or an absolute path, in canonical form"
        ));
    }
    Ok(())
}

/// A shard path must be one plain file name inside the dataset directory.
fn check_shard_path(p: &str) -> Invalid {
    let mut components = Path::new(p).components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(name)), None) if name != MANIFEST => Ok(()),
        _ => Err(format!(
            "{p:?} must be a plain file name inside the dataset directory"
        )),
    }
}

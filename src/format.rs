//! The on-disk dataset format: `manifest.json` plus shard files of raw little-endian records.
//!
//! ```text
//! DATASET_DIR/
//!   manifest.json                written last, by rename: a dataset without it does not exist
//!   shard-<pack>-00000.bin       records 0 .. n0 of the stream, headerless, little-endian
//!   shard-<pack>-00001.bin       records n0 .. n0+n1
//!   ...
//! ```
//!
//! `<pack>` is an id unique to each run of `pack`, so a repack (`--force`) never overwrites a
//! shard the current manifest references: the new manifest's rename switches datasets
//! atomically. A dataset with documents also has, per shard, `shard-<pack>-NNNNN.ids`,
//! `.idx`, `.meta` and `.docs` ([`ShardDocs`]).
//!
//! The manifest is versioned ([`VERSION`]); a reader refuses any other version, any unknown
//! field and any count that does not add up. See docs/FORMAT.md for the byte-exact layout.
//! This module only parses and checks; it opens no files (see `dataset.rs`).

use std::path::{Component, Path};

use serde::{Deserialize, Serialize};

use crate::dtype::RecordType;
use crate::error::{Error, Result};

/// The file name of the manifest inside a dataset directory.
pub(crate) const MANIFEST: &str = "manifest.json";

/// The value of the manifest's `format` field.
pub(crate) const FORMAT_NAME: &str = "shufflefs-dataset";

/// The manifest version this build writes. Bumped on any change that an older reader would
/// misread; readers refuse versions they do not know with a message saying what to do.
/// Version 3 added per-shard block checksums (`checksums`); version 4 identifies in-place
/// shards by their content ([`sampled_identity`]) and stores their paths relative to the
/// dataset directory where they are inside it, with an [`in_place_guard`].
pub const VERSION: u32 = 4;

/// The oldest manifest version this build reads: a version 2 manifest is a version 3 one
/// without checksums; versions 2 and 3 identify an in-place shard by its absolute path, size
/// and mtime ([`in_place_hash`]).
pub(crate) const MIN_VERSION: u32 = 2;

/// One shard of the stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardEntry {
    /// File name, relative to the dataset directory (a single normal path component). For an
    /// in-place shard (version 4): a relative path of normal components when the file is
    /// inside the dataset directory, an absolute one otherwise.
    pub path: String,
    /// Number of records in the shard.
    pub records: u64,
    /// Size of the shard's records in bytes (`records * itemsize`); the file is `offset +
    /// bytes` bytes.
    pub bytes: u64,
    /// Content hash of the shard bytes ([`ContentHasher`]), 16 hex digits. For an in-place
    /// shard, its [`sampled_identity`] (version 4) or [`in_place_hash`] (versions 2-3).
    pub hash: String,
    /// The shard's document and metadata files, when the dataset has documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docs: Option<ShardDocs>,
    /// For a shard referenced in place (`pack --in-place`): the file's modification time in
    /// nanoseconds since the epoch when it was packed. In version 4 only the live-mutation
    /// guard: a mount that finds another mtime samples the content again instead of trusting
    /// it. (Versions 2-3: `path` is absolute and `hash` is [`in_place_hash`].)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_mtime_ns: Option<u64>,
    /// For an in-place shard (version 4): [`in_place_guard`] of `path`, `bytes`,
    /// `in_place_mtime_ns` and `hash`. While it matches and the file's mtime is still
    /// `in_place_mtime_ns`, a mount trusts the file to be the one sampled; otherwise (an edited
    /// path, a file restored from an archive) it samples the file and compares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_guard: Option<String>,
    /// Block checksums of the shard bytes (version 3; optional).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksums: Option<ShardChecksums>,
    /// Byte offset of record 0 in the file: the header an in-place shard keeps (an llm.c
    /// shard's 1,024 bytes, a `.npy` header). 0 (omitted) for every copied shard.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub offset: u64,
    /// What `pack --in-place` recognised the file as ([`SOURCE_FORMATS`]), informational.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_format: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The values of `ShardEntry::source_format`: headerless records, a numpy `.npy`, an llm.c
/// shard.
pub(crate) const SOURCE_FORMATS: [&str; 3] = ["raw", "npy", "llmc"];

/// A shard's checksum file (see `checksum.rs` and docs/FORMAT.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardChecksums {
    /// The checksum file's name, inside the dataset directory.
    pub file: String,
    /// Bytes per block: always [`crate::checksum::BLOCK`].
    pub block: u64,
    /// Content hash of the checksum file ([`ContentHasher`]), 16 hex digits.
    pub hash: String,
}

/// Per-shard document and metadata files (see docs/FORMAT.md):
///
/// - `ids`: one little-endian u32 per record of the shard: the shard-local metadata entry
///   the record belongs to;
/// - `index`: `entries + 1` little-endian u64 offsets into `meta` (entry `k` is bytes
///   `[index[k], index[k+1])`);
/// - `meta`: the entries, each `doc` (u64 LE), `span` (u64 LE, the dataset-wide entry number)
///   and the metadata as JSON text (`null` where there is none);
/// - `docs`: one 24-byte record per document that starts in this shard: first record (u64,
///   stream-global), length in records (u64), and its document entry (u64, shard-local).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardDocs {
    /// The ids file name.
    pub ids: String,
    /// The entry index file name.
    pub index: String,
    /// The entry data file name.
    pub meta: String,
    /// Number of metadata entries in this shard (`<= 2^32`).
    pub entries: u64,
    /// Size of the entry data file.
    pub meta_bytes: u64,
    /// The documents file name.
    pub docs: String,
    /// Number of documents that start in this shard.
    pub documents: u64,
    /// Content hash of the four files: [`ContentHasher`] over the little-endian u64 content
    /// hashes of ids, index, meta and docs, in that order.
    pub hash: String,
    /// Block checksums of the four files (version 3; optional): one file holding the
    /// checksums of ids, index, meta and docs, in that order, in blocks of
    /// [`crate::checksum::DOC_BLOCK`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksums: Option<ShardChecksums>,
}

/// Bytes per document record in a `docs` file.
pub(crate) const DOC_RECORD: u64 = 24;

/// The parsed `manifest.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// Always [`VERSION`] for this build.
    pub version: u32,
    /// The record dtype as a numpy descr (`<u4`).
    pub dtype: String,
    /// Bytes per record.
    pub itemsize: u64,
    /// Total records (tokens) in the stream.
    pub records: u64,
    /// The shards, in stream order.
    pub shards: Vec<ShardEntry>,
    /// Hash over the shards' hashes and sizes: the dataset's content identity.
    pub content_hash: String,
    /// Number of documents, when the dataset has document structure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documents: Option<u64>,
    /// Whether any document or span carries metadata.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub metadata: bool,
    /// The program that wrote the manifest (informational).
    pub created_by: String,
}

impl Manifest {
    /// Parses and validates manifest bytes. `path` is used in messages only.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Manifest> {
        let manifest: Manifest = serde_json::from_slice(bytes).map_err(|e| {
            Error::dataset(
                path,
                format!("not a valid shufflefs manifest ({e}); re-run `shufflefs pack`"),
            )
        })?;
        manifest.validate(path)?;
        Ok(manifest)
    }

    /// Checks every invariant a reader relies on. Every message but the version's ends with
    /// [`EDITED`], which says what to do.
    pub fn validate(&self, path: &Path) -> Result<()> {
        let dataset_err = |msg: String| Error::dataset(path, format!("{msg}{EDITED}"));
        let fail = |msg: String| Err(dataset_err(msg));
        if self.format != FORMAT_NAME {
            return fail(format!(
                "format is {:?}, expected {FORMAT_NAME:?}",
                self.format
            ));
        }
        if !(MIN_VERSION..=VERSION).contains(&self.version) {
            return Err(Error::dataset(
                path,
                format!(
                    "manifest version {} but this shufflefs reads versions {MIN_VERSION} to \
                     {VERSION}: \
                 re-run `shufflefs pack` with this version, or use the shufflefs that wrote it",
                    self.version
                ),
            ));
        }
        let record = RecordType::from_manifest(&self.dtype)
            .map_err(|e| dataset_err(format!("field dtype: {e}")))?;
        if record.manifest_descr() != self.dtype {
            return fail(format!(
                "field dtype {:?} is not in canonical form ({:?})",
                self.dtype,
                record.manifest_descr()
            ));
        }
        if record.itemsize() as u64 != self.itemsize {
            return fail(format!(
                "field itemsize is {} but dtype {} has {} bytes",
                self.itemsize,
                self.dtype,
                record.itemsize()
            ));
        }
        let mut total: u64 = 0;
        for (i, shard) in self.shards.iter().enumerate() {
            match shard.in_place_mtime_ns {
                None => check_shard_path(&shard.path),
                Some(_) if shard.docs.is_some() => {
                    Err("an in-place shard cannot have document files".to_string())
                }
                Some(_) if self.version >= 4 => check_in_place_path(&shard.path),
                Some(_) if Path::new(&shard.path).is_absolute() => Ok(()),
                Some(_) => Err(format!(
                    "{:?} of an in-place shard must be absolute",
                    shard.path
                )),
            }
            .map_err(|e| dataset_err(format!("shards[{i}].path: {e}")))?;
            match (&shard.in_place_guard, shard.in_place_mtime_ns) {
                (None, Some(_)) if self.version >= 4 => {
                    return fail(format!("shards[{i}] is in place but has no in_place_guard"));
                }
                (Some(_), _) if self.version < 4 => {
                    return fail(format!(
                        "shards[{i}].in_place_guard needs manifest version 4, not {}",
                        self.version
                    ));
                }
                (Some(_), None) => {
                    return fail(format!(
                        "shards[{i}].in_place_guard without in_place_mtime_ns"
                    ));
                }
                (Some(g), _) if parse_hash(g).is_none() => {
                    return fail(format!(
                        "shards[{i}].in_place_guard {g:?} is not 16 hex digits"
                    ));
                }
                _ => {}
            }
            if shard.records == 0 {
                return fail(format!("shards[{i}] ({}) has no records", shard.path));
            }
            if shard.offset != 0 && shard.in_place_mtime_ns.is_none() {
                return fail(format!(
                    "shards[{i}] ({}) has offset {} but only an in-place shard has a header",
                    shard.path, shard.offset
                ));
            }
            if shard.offset.checked_add(shard.bytes).is_none() {
                return fail(format!(
                    "shards[{i}] ({}): offset {} + bytes {} overflows 64 bits",
                    shard.path, shard.offset, shard.bytes
                ));
            }
            if let Some(f) = &shard.source_format
                && !SOURCE_FORMATS.contains(&f.as_str())
            {
                return fail(format!(
                    "shards[{i}].source_format {f:?} is not one of {SOURCE_FORMATS:?}"
                ));
            }
            if shard.records.checked_mul(self.itemsize) != Some(shard.bytes) {
                return fail(format!(
                    "shards[{i}] ({}): bytes {} != records {} * itemsize {}",
                    shard.path, shard.bytes, shard.records, self.itemsize
                ));
            }
            if let Some(c) = &shard.checksums {
                if self.version < 3 {
                    return fail(format!(
                        "shards[{i}].checksums needs manifest version 3, not {}",
                        self.version
                    ));
                }
                check_shard_path(&c.file)
                    .map_err(|e| dataset_err(format!("shards[{i}].checksums.file: {e}")))?;
                if c.block != crate::checksum::BLOCK {
                    return fail(format!(
                        "shards[{i}].checksums.block is {} but this shufflefs uses {}",
                        c.block,
                        crate::checksum::BLOCK
                    ));
                }
                if parse_hash(&c.hash).is_none() {
                    return fail(format!(
                        "shards[{i}].checksums.hash {:?} is not 16 hex digits",
                        c.hash
                    ));
                }
            }
            if parse_hash(&shard.hash).is_none() {
                return fail(format!(
                    "shards[{i}].hash {:?} is not 16 hex digits",
                    shard.hash
                ));
            }
            // Versions 2-3: an in-place shard's hash is its identity (path, size, mtime):
            // checking it is what binds the path, which content_hash does not cover, to the
            // shard. (From version 4 the hash is the content's, checked against the file at
            // mount whenever the guard does not vouch for it.)
            if let Some(mtime) = shard.in_place_mtime_ns
                && self.version < 4
                && shard.hash != in_place_hash(&shard.path, shard.bytes, mtime)
            {
                return fail(format!(
                    "shards[{i}].hash {:?} is not the in-place identity of its path {:?}, \
                     bytes and in_place_mtime_ns",
                    shard.hash, shard.path
                ));
            }
            total = total
                .checked_add(shard.records)
                .ok_or_else(|| dataset_err("record count overflows 64 bits".into()))?;
        }
        if total != self.records {
            return fail(format!(
                "records is {} but the shards hold {total}",
                self.records
            ));
        }
        if total.checked_mul(self.itemsize).is_none() {
            return fail("the stream's byte size overflows 64 bits".into());
        }
        let with_docs = self.shards.iter().filter(|s| s.docs.is_some()).count();
        match self.documents {
            None if with_docs > 0 => {
                return fail("shards have document files but documents is missing".into());
            }
            Some(_) if with_docs != self.shards.len() => {
                return fail("documents is set but not every shard has document files".into());
            }
            _ => {}
        }
        if self.documents.is_none() && self.metadata {
            return fail("metadata is true but the dataset has no documents".into());
        }
        let mut docs_total: u64 = 0;
        for (i, shard) in self.shards.iter().enumerate() {
            let Some(d) = &shard.docs else { continue };
            for (field, name) in [
                ("ids", &d.ids),
                ("index", &d.index),
                ("meta", &d.meta),
                ("docs", &d.docs),
            ] {
                check_shard_path(name)
                    .map_err(|e| dataset_err(format!("shards[{i}].docs.{field}: {e}")))?;
            }
            if d.entries == 0 || d.entries > 1 << 32 {
                return fail(format!(
                    "shards[{i}].docs.entries {} is out of range",
                    d.entries
                ));
            }
            if parse_hash(&d.hash).is_none() {
                return fail(format!(
                    "shards[{i}].docs.hash {:?} is not 16 hex digits",
                    d.hash
                ));
            }
            if let Some(c) = &d.checksums {
                if self.version < 3 {
                    return fail(format!(
                        "shards[{i}].docs.checksums needs manifest version 3, not {}",
                        self.version
                    ));
                }
                check_shard_path(&c.file)
                    .map_err(|e| dataset_err(format!("shards[{i}].docs.checksums.file: {e}")))?;
                if c.block != crate::checksum::DOC_BLOCK {
                    return fail(format!(
                        "shards[{i}].docs.checksums.block is {} but this shufflefs uses {}",
                        c.block,
                        crate::checksum::DOC_BLOCK
                    ));
                }
                if parse_hash(&c.hash).is_none() {
                    return fail(format!(
                        "shards[{i}].docs.checksums.hash {:?} is not 16 hex digits",
                        c.hash
                    ));
                }
            }
            docs_total = docs_total
                .checked_add(d.documents)
                .ok_or_else(|| dataset_err("document count overflows 64 bits".into()))?;
        }
        if let Some(n) = self.documents
            && n != docs_total
        {
            return fail(format!("documents is {n} but the shards hold {docs_total}"));
        }
        self.check_names().map_err(dataset_err)?;
        if self.content_hash != self.expected_content_hash() {
            return fail(format!(
                "content_hash {:?} does not match the shard list",
                self.content_hash
            ));
        }
        Ok(())
    }

    /// File names against each other: the content hash covers no name, so a name edited
    /// to another listed file, or two names swapped, would serve the wrong file's bytes
    /// under the same identity. Every listed name (shard paths, checksum and document files)
    /// must be distinct (one hash map: linear in the names, so a manifest of 500k shards
    /// validates in about a second), and a name of pack's form (`shard-<id>-<k>.bin`) must
    /// belong to shard `k`, with document files of the same stem.
    fn check_names(&self) -> std::result::Result<(), String> {
        // Name -> (shard, field), formatted only for a message.
        let mut seen: std::collections::HashMap<&str, (usize, &'static str)> =
            std::collections::HashMap::with_capacity(self.shards.len());
        for (i, shard) in self.shards.iter().enumerate() {
            let docs = shard.docs.as_ref();
            let names = [
                Some(("path", &shard.path)),
                docs.map(|d| ("docs.ids", &d.ids)),
                docs.map(|d| ("docs.index", &d.index)),
                docs.map(|d| ("docs.meta", &d.meta)),
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
            for (field, name) in names[1..5].iter().flatten() {
                let ext = match *field {
                    "docs.ids" => "ids",
                    "docs.index" => "idx",
                    "docs.meta" => "meta",
                    _ => "docs",
                };
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

    /// The record type.
    pub fn record_type(&self) -> RecordType {
        RecordType::from_manifest(&self.dtype).expect("validated at parse")
    }

    /// Serializes the manifest as written to disk (pretty JSON, trailing newline).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("manifest serializes");
        out.push(b'\n');
        out
    }
}

/// The end of every manifest validation message except the version's: what to do.
pub(crate) const EDITED: &str =
    "; the manifest is damaged or was edited: restore it or re-run `shufflefs pack`";

/// The name of shard `index` written by the pack run `pack_id`.
pub(crate) fn shard_name(pack_id: &str, index: usize) -> String {
    format!("shard-{pack_id}-{index:05}.bin")
}

/// The shard number `k` and the stem of a name of exactly the form [`shard_name`] gives:
/// `shard-<8 lowercase hex digits>-<k, zero-padded to 5 digits>.bin`.
fn pack_shard_number(path: &str) -> Option<(u64, &str)> {
    let stem = path.strip_suffix(".bin")?;
    let (id, k) = stem.strip_prefix("shard-")?.split_once('-')?;
    let id_ok = id.len() == 8 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !id_ok || !k.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Zero-padded to 5 digits: no leading zero beyond the padding.
    let canonical = k.len() == 5 || (k.len() > 5 && !k.starts_with('0'));
    let n: u64 = k.parse().ok()?;
    canonical.then_some((n, stem))
}

/// The path of an in-place shard (version 4): relative to the dataset directory (normal
/// components only: no `..`, `.`, empty components or trailing `/`, and not the manifest
/// itself) or absolute, in that same canonical form, so that one file has one spelling.
fn check_in_place_path(p: &str) -> std::result::Result<(), String> {
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
fn check_shard_path(p: &str) -> std::result::Result<(), String> {
    let mut components = Path::new(p).components();
    match (components.next(), components.next()) {
        (Some(Component::Normal(name)), None) if name != MANIFEST => Ok(()),
        _ => Err(format!(
            "{p:?} must be a plain file name inside the dataset directory"
        )),
    }
}

impl Manifest {
    /// The `content_hash` this manifest must carry. From version 3 it covers `dtype` and
    /// `metadata` too, which change what a mount serves (an edited dtype of the same item
    /// size, or a dropped metadata flag, would otherwise open under a new fingerprint instead
    /// of being refused), and the version (3 or 4); version 2 covers the shard list only
    /// ([`content_hash`]).
    pub fn expected_content_hash(&self) -> String {
        let shards = content_hash(&self.shards);
        if self.version < 3 {
            return shards;
        }
        let mut h = ContentHasher::new();
        // The version is part of the identity, so an edited version is refused rather than
        // opened under a new fingerprint.
        h.update(if self.version >= 4 {
            b"shufflefs-dataset-v4"
        } else {
            b"shufflefs-dataset-v3"
        });
        h.update(self.dtype.as_bytes());
        h.update(&[0, u8::from(self.metadata)]);
        h.update(&parse_hash(&shards).unwrap_or(0).to_le_bytes());
        format_hash(h.finish())
    }
}

/// Ranges sampled per in-place shard by [`sample_ranges`].
pub(crate) const SAMPLES: u64 = 16;

/// Bytes per sampled range (a page).
pub(crate) const SAMPLE_BYTES: u64 = 4096;

/// The byte ranges `(offset, len)` of a shard of `bytes` bytes whose content identifies it in
/// place: the whole shard when it is at most [`SAMPLES`] * [`SAMPLE_BYTES`] (64 KiB), else
/// [`SAMPLES`] pages spread evenly from the first to the last byte (page-aligned but the last,
/// which ends at the end). Fixed by the size alone, so the same bytes always sample alike.
pub(crate) fn sample_ranges(bytes: u64) -> Vec<(u64, u64)> {
    if bytes <= SAMPLES * SAMPLE_BYTES {
        return vec![(0, bytes)];
    }
    let span = u128::from(bytes - SAMPLE_BYTES);
    (0..SAMPLES)
        .map(|k| {
            let at = if k + 1 == SAMPLES {
                bytes - SAMPLE_BYTES
            } else {
                let spread = (u128::from(k) * span / u128::from(SAMPLES - 1)) as u64;
                spread / SAMPLE_BYTES * SAMPLE_BYTES
            };
            (at, SAMPLE_BYTES)
        })
        .collect()
}

/// The content identity of an in-place shard (version 4): its size and the bytes of its
/// [`sample_ranges`], in order (`sampled`, concatenated). O(1) per shard; it cannot see a
/// change of the same size outside the sampled pages (docs/FORMAT.md, section 3).
pub(crate) fn sampled_identity(bytes: u64, sampled: &[u8]) -> String {
    let mut h = ContentHasher::new();
    h.update(b"shufflefs-in-place-v4\0");
    h.update(&bytes.to_le_bytes());
    h.update(sampled);
    format_hash(h.finish())
}

/// The guard of an in-place shard (version 4): binds its stored `path` and its mtime at pack
/// to its content identity `hash`. Not a secret: it makes a mount trust an unmodified file
/// without sampling it, and sample every file whose path, mtime or hash was edited.
pub(crate) fn in_place_guard(path: &str, bytes: u64, mtime_ns: u64, hash: &str) -> String {
    let mut h = ContentHasher::new();
    h.update(b"shufflefs-in-place-guard\0");
    h.update(path.as_bytes());
    h.update(&[0]);
    h.update(&bytes.to_le_bytes());
    h.update(&mtime_ns.to_le_bytes());
    h.update(&parse_hash(hash).unwrap_or(0).to_le_bytes());
    format_hash(h.finish())
}

/// The identity hash of a shard referenced in place by a version 2-3 manifest: its absolute
/// path, size and mtime.
pub fn in_place_hash(path: &str, bytes: u64, mtime_ns: u64) -> String {
    let mut h = ContentHasher::new();
    h.update(path.as_bytes());
    h.update(&[0]);
    h.update(&bytes.to_le_bytes());
    h.update(&mtime_ns.to_le_bytes());
    format_hash(h.finish())
}

/// The dataset identity over all shards: hash of each shard's size and content hash, in
/// order. File names do not count: the same tokens packed twice have the same identity.
pub(crate) fn content_hash(shards: &[ShardEntry]) -> String {
    let mut h = ContentHasher::new();
    for s in shards {
        h.update(&s.bytes.to_le_bytes());
        h.update(&parse_hash(&s.hash).unwrap_or(0).to_le_bytes());
        if s.offset != 0 {
            // Where the records start changes what is served: part of the identity (only
            // present in in-place shards with a header, so other identities are unchanged).
            h.update(b"offset");
            h.update(&s.offset.to_le_bytes());
        }
        if let Some(c) = &s.checksums {
            // Only present since version 3, so version 2 identities are unchanged.
            h.update(b"checksums");
            h.update(&parse_hash(&c.hash).unwrap_or(0).to_le_bytes());
        }
        if let Some(d) = &s.docs {
            h.update(&d.documents.to_le_bytes());
            h.update(&parse_hash(&d.hash).unwrap_or(0).to_le_bytes());
            if let Some(c) = &d.checksums {
                h.update(b"docsums");
                h.update(&parse_hash(&c.hash).unwrap_or(0).to_le_bytes());
            }
        }
    }
    format_hash(h.finish())
}

/// Formats a hash as 16 lowercase hex digits.
pub(crate) fn format_hash(h: u64) -> String {
    format!("{h:016x}")
}

/// Parses 16 hex digits.
pub(crate) fn parse_hash(s: &str) -> Option<u64> {
    if s.len() == 16
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        u64::from_str_radix(s, 16).ok()
    } else {
        None
    }
}

/// A fast streaming 64-bit hash for content identity (not cryptographic): 8-byte words are
/// folded with a multiply-rotate step, then finished with the length and SplitMix64. Equal
/// byte streams give equal hashes however they are split into `update` calls.
#[derive(Clone, Debug)]
pub(crate) struct ContentHasher {
    state: u64,
    pending: [u8; 8],
    pending_len: usize,
    total: u64,
}

impl Default for ContentHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl ContentHasher {
    const P: u64 = 0x9FB2_1C65_1E98_DF25;

    /// A fresh hasher.
    pub(crate) fn new() -> ContentHasher {
        ContentHasher {
            state: 0x243F_6A88_85A3_08D3,
            pending: [0; 8],
            pending_len: 0,
            total: 0,
        }
    }

    #[inline(always)]
    fn word(&mut self, w: u64) {
        self.state = (self.state ^ w).wrapping_mul(Self::P).rotate_left(29);
    }

    /// Feeds bytes.
    pub(crate) fn update(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.pending_len > 0 {
            let take = (8 - self.pending_len).min(bytes.len());
            self.pending[self.pending_len..self.pending_len + take].copy_from_slice(&bytes[..take]);
            self.pending_len += take;
            bytes = &bytes[take..];
            if self.pending_len < 8 {
                return;
            }
            let w = u64::from_le_bytes(self.pending);
            self.word(w);
            self.pending_len = 0;
        }
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.word(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = chunks.remainder();
        self.pending[..rest.len()].copy_from_slice(rest);
        self.pending_len = rest.len();
    }

    /// The hash of everything fed so far.
    pub(crate) fn finish(&self) -> u64 {
        let mut s = self.clone();
        if s.pending_len > 0 {
            let mut last = [0u8; 8];
            last[..s.pending_len].copy_from_slice(&s.pending[..s.pending_len]);
            s.word(u64::from_le_bytes(last));
        }
        crate::feistel::mix(s.state ^ s.total.wrapping_mul(Self::P))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let shards = vec![
            ShardEntry {
                path: shard_name("p", 0),
                records: 10,
                bytes: 40,
                hash: format_hash(1),
                offset: 0,
                source_format: None,
                docs: None,
                in_place_mtime_ns: None,
                in_place_guard: None,
                checksums: None,
            },
            ShardEntry {
                path: shard_name("p", 1),
                records: 5,
                bytes: 20,
                hash: format_hash(2),
                offset: 0,
                source_format: None,
                docs: None,
                in_place_mtime_ns: None,
                in_place_guard: None,
                checksums: None,
            },
        ];
        let mut m = Manifest {
            format: FORMAT_NAME.into(),
            version: VERSION,
            dtype: "<u4".into(),
            itemsize: 4,
            records: 15,
            content_hash: String::new(),
            shards,
            documents: None,
            metadata: false,
            created_by: "test".into(),
        };
        m.content_hash = m.expected_content_hash();
        m
    }

    #[test]
    fn round_trip() {
        let m = sample();
        let parsed = Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
        assert_eq!(parsed, m);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let bytes = sample().to_bytes();
        for cut in 0..bytes.len() - 2 {
            assert!(
                Manifest::parse(&bytes[..cut], Path::new("m")).is_err(),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn rejects_inconsistent_manifests() {
        let check = |f: &dyn Fn(&mut Manifest), want: &str| {
            let mut m = sample();
            f(&mut m);
            let err = Manifest::parse(&m.to_bytes(), Path::new("/d/manifest.json")).unwrap_err();
            let msg = err.to_string();
            assert!(msg.starts_with("/d/manifest.json: "), "{msg}");
            assert!(msg.contains(want), "{msg:?} lacks {want:?}");
        };
        check(&|m| m.version = 1, "version 1");
        check(&|m| m.format = "x".into(), "format");
        check(&|m| m.dtype = "<c8".into(), "dtype");
        check(&|m| m.itemsize = 2, "itemsize");
        check(&|m| m.records = 16, "records is 16");
        check(&|m| m.shards[1].bytes = 21, "bytes 21");
        check(&|m| m.shards[0].path = "../x.bin".into(), "plain file name");
        check(
            &|m| {
                m.version = 3;
                m.shards[0].path = "rel.bin".into();
                m.shards[0].in_place_mtime_ns = Some(1);
            },
            "must be absolute",
        );
        check(
            &|m| {
                m.shards[0].path = "rel.bin".into();
                m.shards[0].in_place_mtime_ns = Some(1);
            },
            "shards[0] is in place but has no in_place_guard",
        );
        check(
            &|m| m.shards[0].path = "/etc/passwd".into(),
            "plain file name",
        );
        check(&|m| m.shards[0].path = "a/b".into(), "plain file name");
        check(&|m| m.shards[0].hash = "zz".into(), "hex");
        check(&|m| m.shards[0].hash = format_hash(9), "content_hash");
        check(&|m| m.version = 5, "version 5");
        let sums = |file: &str| ShardChecksums {
            file: file.into(),
            block: crate::checksum::BLOCK,
            hash: format_hash(7),
        };
        let with_sums = |m: &mut Manifest, c: ShardChecksums| {
            m.shards[0].checksums = Some(c);
            m.content_hash = m.expected_content_hash();
        };
        check(
            &|m| {
                with_sums(m, sums("a.sums"));
                m.version = 2;
            },
            "needs manifest version 3",
        );
        check(
            &|m| {
                with_sums(
                    m,
                    ShardChecksums {
                        block: 4096,
                        ..sums("a.sums")
                    },
                )
            },
            "block is 4096",
        );
        check(&|m| with_sums(m, sums("../a.sums")), "plain file name");
        check(
            &|m| with_sums(m, sums(&m.shards[1].path.clone())),
            "is also shards[0].checksums.file",
        );
        check(
            &|m| {
                with_sums(
                    m,
                    ShardChecksums {
                        hash: "x".into(),
                        ..sums("a.sums")
                    },
                )
            },
            "hex",
        );
        // Checksums count in the identity; a version 2 manifest without them still reads.
        let mut m = sample();
        let before = m.content_hash.clone();
        with_sums(&mut m, sums("a.sums"));
        assert_ne!(m.content_hash, before);
        Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
        let mut v2 = sample();
        v2.version = 2;
        v2.content_hash = content_hash(&v2.shards);
        Manifest::parse(&v2.to_bytes(), Path::new("m")).unwrap();
        // From version 3 the dtype and the metadata flag are part of the identity.
        check(&|m| m.dtype = "<f4".into(), "does not match the shard list");
        check(&|m| m.metadata = true, "metadata is true but");
        check(
            &|m| m.shards[0].hash = format_hash(9),
            "does not match the shard list",
        );
        // Every message says what to do.
        check(&|m| m.format = "x".into(), EDITED);
        check(&|m| m.itemsize = 2, EDITED);
        check(&|m| m.shards[0].path = "../x.bin".into(), EDITED);
        check(&|m| m.shards[0].hash = format_hash(9), EDITED);
        check(
            &|m| m.version = 1,
            "re-run `shufflefs pack` with this version",
        );
        let mut value: serde_json::Value = serde_json::from_slice(&sample().to_bytes()).unwrap();
        value["extra"] = 1.into();
        let err = Manifest::parse(value.to_string().as_bytes(), Path::new("m")).unwrap_err();
        assert!(err.to_string().contains("unknown field"));
    }

    /// Three shards named as pack names them, with document files.
    fn with_docs() -> Manifest {
        let shards: Vec<ShardEntry> = (0..3)
            .map(|k| {
                let path = shard_name("0123abcd", k);
                let stem = path.trim_end_matches(".bin");
                ShardEntry {
                    records: 4,
                    bytes: 8,
                    hash: format_hash(k as u64),
                    docs: Some(ShardDocs {
                        ids: format!("{stem}.ids"),
                        index: format!("{stem}.idx"),
                        meta: format!("{stem}.meta"),
                        entries: 1,
                        meta_bytes: 20,
                        docs: format!("{stem}.docs"),
                        documents: 1,
                        hash: format_hash(10 + k as u64),
                        checksums: None,
                    }),
                    in_place_mtime_ns: None,
                    in_place_guard: None,
                    checksums: None,
                    offset: 0,
                    source_format: None,
                    path,
                }
            })
            .collect();
        let mut m = Manifest {
            format: FORMAT_NAME.into(),
            version: VERSION,
            dtype: "<u2".into(),
            itemsize: 2,
            records: 12,
            content_hash: String::new(),
            shards,
            documents: Some(3),
            metadata: false,
            created_by: "test".into(),
        };
        m.content_hash = m.expected_content_hash();
        m
    }

    #[test]
    fn names_cannot_point_at_another_listed_file_or_be_swapped() {
        Manifest::parse(&with_docs().to_bytes(), Path::new("m")).unwrap();
        // None of these edits changes content_hash, which covers no name: before the check
        // each opened and served another file's bytes under the same fingerprint.
        let check = |f: &dyn Fn(&mut Manifest), want: &str| {
            let mut m = with_docs();
            f(&mut m);
            assert_eq!(m.content_hash, m.expected_content_hash());
            let msg = Manifest::parse(&m.to_bytes(), Path::new("/d/manifest.json"))
                .unwrap_err()
                .to_string();
            assert!(msg.starts_with("/d/manifest.json: "), "{msg}");
            assert!(msg.contains(want), "{msg:?} lacks {want:?}");
            assert!(msg.ends_with(EDITED), "{msg}");
        };
        let docs = |m: &mut Manifest, k: usize| m.shards[k].docs.clone().unwrap();
        check(
            &|m| m.shards[1].path = docs(m, 0).ids,
            "shards[1].path \"shard-0123abcd-00000.ids\" is also shards[0].docs.ids",
        );
        check(
            &|m| m.shards[2].docs.as_mut().unwrap().meta = docs(m, 1).meta,
            "shards[2].docs.meta \"shard-0123abcd-00001.meta\" is also shards[1].docs.meta",
        );
        check(
            &|m| m.shards[0].docs.as_mut().unwrap().docs = m.shards[0].path.clone(),
            "shards[0].docs.docs \"shard-0123abcd-00000.bin\" is also shards[0].path",
        );
        check(
            &|m| {
                let p0 = m.shards[0].path.clone();
                m.shards[0].path = std::mem::replace(&mut m.shards[1].path, p0);
            },
            "shards[0].path \"shard-0123abcd-00001.bin\" is the name pack gives shard 1",
        );
        check(
            &|m| {
                let (a, b) = (docs(m, 0).ids, docs(m, 2).ids);
                m.shards[0].docs.as_mut().unwrap().ids = b;
                m.shards[2].docs.as_mut().unwrap().ids = a;
            },
            "shards[0].docs.ids \"shard-0123abcd-00002.ids\" is not named after its shard",
        );
        check(
            &|m| m.shards[1].docs.as_mut().unwrap().index = "shard-0123abcd-00001.meta2".into(),
            "shards[1].docs.index",
        );
        // Names of another form are the writer's business, but must still be distinct.
        let mut m = with_docs();
        m.shards[0].path = "first.bin".into();
        m.shards[1].path = "shard-0123abcd-000001.bin".into();
        m.shards[1].docs.as_mut().unwrap().ids = "any.ids".into();
        Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
        assert_eq!(
            pack_shard_number("shard-0123abcd-100000.bin"),
            Some((100000, "shard-0123abcd-100000"))
        );
        assert_eq!(pack_shard_number("shard-0123ABCD-00001.bin"), None);
        assert_eq!(pack_shard_number("shard-p-00001.bin"), None);
    }

    #[test]
    fn a_version_3_in_place_shard_hash_binds_its_path() {
        let mut m = sample();
        m.version = 3;
        for (k, s) in m.shards.iter_mut().enumerate() {
            s.path = format!("/data/part{k}.bin");
            s.bytes = 40;
            s.records = 10;
            s.in_place_mtime_ns = Some(1_700_000_000_000_000_000);
            s.hash = in_place_hash(&s.path, s.bytes, 1_700_000_000_000_000_000);
        }
        m.records = 20;
        m.content_hash = m.expected_content_hash();
        Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
        // Swapped paths (equal sizes and mtimes) keep content_hash: before the check this
        // served the two files in the wrong order under the same fingerprint.
        let mut swapped = m.clone();
        swapped.shards[0].path = m.shards[1].path.clone();
        swapped.shards[1].path = m.shards[0].path.clone();
        let msg = Manifest::parse(&swapped.to_bytes(), Path::new("m"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("shards[0].hash") && msg.contains("is not the in-place identity"),
            "{msg}"
        );
        let mut moved = m.clone();
        moved.shards[1].path = "/data/other.bin".into();
        assert!(Manifest::parse(&moved.to_bytes(), Path::new("m")).is_err());
    }

    #[test]
    fn version_4_in_place_paths_and_guards() {
        let in_place = |paths: &[&str]| {
            let mut m = sample();
            for (s, p) in m.shards.iter_mut().zip(paths) {
                s.path = p.to_string();
                s.in_place_mtime_ns = Some(7);
                s.in_place_guard = Some(in_place_guard(&s.path, s.bytes, 7, &s.hash));
            }
            m.content_hash = m.expected_content_hash();
            m
        };
        let parse = |m: &Manifest| Manifest::parse(&m.to_bytes(), Path::new("m"));
        // Inside the dataset directory (relative, any depth) or outside (absolute).
        parse(&in_place(&["part0.bin", "data/x/part1.bin"])).unwrap();
        parse(&in_place(&["/srv/a.bin", "b.bin"])).unwrap();
        for bad in [
            "../x.bin",
            "data/../x.bin",
            "./x.bin",
            "data/./x.bin",
            "data//x.bin",
            "data/",
            "",
            "/",
            "//srv/a.bin",
            "/srv/../a.bin",
            "manifest.json",
        ] {
            let msg = parse(&in_place(&[bad, "b.bin"])).unwrap_err().to_string();
            assert!(msg.contains("in canonical form"), "{bad:?}: {msg}");
        }
        let msg = parse(&in_place(&["a.bin", "a.bin"]))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("shards[1].path \"a.bin\" is also shards[0].path"),
            "{msg}"
        );
        // The guard is a hex hash, only in version 4 and only in place; the paths are not in
        // the identity (copies and moves keep it), the content hashes are.
        let mut m = in_place(&["a.bin", "b.bin"]);
        m.shards[0].in_place_guard = Some("x".into());
        assert!(
            parse(&m)
                .unwrap_err()
                .to_string()
                .contains("not 16 hex digits")
        );
        let mut m = in_place(&["a.bin", "b.bin"]);
        m.shards[0].in_place_mtime_ns = None;
        assert!(
            parse(&m)
                .unwrap_err()
                .to_string()
                .contains("without in_place_mtime_ns")
        );
        let mut m = in_place(&["/a.bin", "/b.bin"]);
        m.version = 3;
        m.content_hash = m.expected_content_hash();
        assert!(
            parse(&m)
                .unwrap_err()
                .to_string()
                .contains("needs manifest version 4")
        );
        assert_eq!(
            in_place(&["a.bin", "b.bin"]).content_hash,
            in_place(&["/elsewhere/a.bin", "c/b.bin"]).content_hash
        );
        // A guard that does not match (an edited path or mtime) is not an error here: the
        // mount samples the file instead of trusting it.
        let mut m = in_place(&["a.bin", "b.bin"]);
        m.shards[1].path = "c.bin".into();
        parse(&m).unwrap();
    }

    #[test]
    fn sample_ranges_cover_small_shards_and_spread_over_large_ones() {
        assert_eq!(sample_ranges(10), vec![(0, 10)]);
        assert_eq!(sample_ranges(65_536), vec![(0, 65_536)]);
        for bytes in [65_537, 1 << 30, 3 << 40, u64::MAX] {
            let r = sample_ranges(bytes);
            assert_eq!(r.len() as u64, SAMPLES);
            assert_eq!(r[0], (0, SAMPLE_BYTES));
            assert_eq!(
                r[15],
                (bytes - SAMPLE_BYTES, SAMPLE_BYTES),
                "ends at the end"
            );
            assert!(r.windows(2).all(|w| w[0].0 < w[1].0), "{bytes}: {r:?}");
            assert!(r[..15].iter().all(|&(at, _)| at % SAMPLE_BYTES == 0));
        }
        assert_ne!(
            sampled_identity(4, &[1, 2, 3, 4]),
            sampled_identity(5, &[1, 2, 3, 4])
        );
        assert_ne!(
            sampled_identity(4, &[1, 2, 3, 4]),
            sampled_identity(4, &[1, 2, 3, 5])
        );
    }

    /// A manifest of `n` shards named as pack names them, each with a checksum file.
    fn many_shards(n: usize) -> Manifest {
        let mut m = sample();
        m.shards = (0..n)
            .map(|k| ShardEntry {
                path: shard_name("0123abcd", k),
                records: 4,
                bytes: 16,
                hash: format_hash(k as u64),
                offset: 0,
                source_format: None,
                docs: None,
                in_place_mtime_ns: None,
                in_place_guard: None,
                checksums: Some(ShardChecksums {
                    file: format!("shard-0123abcd-{k:05}.sums"),
                    block: crate::checksum::BLOCK,
                    hash: format_hash(!(k as u64)),
                }),
            })
            .collect();
        m.records = 4 * n as u64;
        m.content_hash = m.expected_content_hash();
        m
    }

    /// Parses `bytes` on another thread, failing instead of hanging: a generous watchdog
    /// (validation was quadratic, 500k shards did not finish in 40 s), not a timing assert.
    fn parse_watched(bytes: Vec<u8>) -> Result<Manifest> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let started = std::time::Instant::now();
            let result = Manifest::parse(&bytes, Path::new("m"));
            eprintln!("parsed {} bytes in {:.2?}", bytes.len(), started.elapsed());
            let _ = tx.send(result);
        });
        rx.recv_timeout(std::time::Duration::from_secs(600))
            .expect("manifest validation did not finish in 10 minutes")
    }

    #[test]
    fn validation_of_500k_shards_finishes_and_still_finds_duplicates() {
        for n in [40_000, 500_000] {
            let m = many_shards(n);
            assert_eq!(parse_watched(m.to_bytes()).unwrap().shards.len(), n);
        }
        let n = 500_000;
        // A shard path listed twice (the last shard names the first one's file).
        let mut m = many_shards(n);
        m.shards[n - 1].path = m.shards[3].path.clone();
        m.content_hash = m.expected_content_hash();
        let msg = parse_watched(m.to_bytes()).unwrap_err().to_string();
        assert!(
            msg.contains(&format!("shards[{}].path", n - 1)) && msg.contains("shards[3].path"),
            "{msg}"
        );
        // A checksum file shared by two shards.
        let mut m = many_shards(n);
        m.shards[n - 2].checksums.as_mut().unwrap().file =
            m.shards[7].checksums.as_ref().unwrap().file.clone();
        m.content_hash = m.expected_content_hash();
        let msg = parse_watched(m.to_bytes()).unwrap_err().to_string();
        assert!(
            msg.contains(&format!("shards[{}].checksums.file", n - 2))
                && msg.contains("shards[7].checksums.file"),
            "{msg}"
        );
    }

    #[test]
    fn offset_only_in_place_and_bound_to_the_identity() {
        let mut m = sample();
        for (k, s) in m.shards.iter_mut().enumerate() {
            s.path = format!("/data/part{k}.bin");
            s.in_place_mtime_ns = Some(5);
            s.in_place_guard = Some(in_place_guard(&s.path, s.bytes, 5, &s.hash));
        }
        m.content_hash = m.expected_content_hash();
        let plain = m.content_hash.clone();
        m.shards[0].offset = 1024;
        m.shards[0].source_format = Some("llmc".into());
        m.content_hash = m.expected_content_hash();
        assert_ne!(m.content_hash, plain, "the offset is part of the identity");
        let parsed = Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
        assert_eq!(parsed, m);
        let text = String::from_utf8(m.to_bytes()).unwrap();
        assert_eq!(
            text.matches("\"offset\"").count(),
            1,
            "omitted when 0: {text}"
        );
        // An edited offset changes what is served: refused unless the identity follows.
        let mut edited = m.clone();
        edited.shards[0].offset = 1000;
        let msg = Manifest::parse(&edited.to_bytes(), Path::new("m"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("does not match the shard list"), "{msg}");
        let check = |f: &dyn Fn(&mut Manifest), want: &str| {
            let mut bad = m.clone();
            f(&mut bad);
            bad.content_hash = bad.expected_content_hash();
            let msg = Manifest::parse(&bad.to_bytes(), Path::new("m"))
                .unwrap_err()
                .to_string();
            assert!(msg.contains(want), "{msg:?} lacks {want:?}");
        };
        check(&|b| b.shards[0].offset = u64::MAX - 10, "overflows 64 bits");
        check(
            &|b| b.shards[1].source_format = Some("parquet".into()),
            "source_format \"parquet\" is not one of",
        );
        let mut copied = sample();
        copied.shards[1].offset = 8;
        copied.content_hash = copied.expected_content_hash();
        let msg = Manifest::parse(&copied.to_bytes(), Path::new("m"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains("only an in-place shard has a header"), "{msg}");
    }

    #[test]
    fn hasher_is_split_invariant() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
        let mut whole = ContentHasher::new();
        whole.update(&data);
        for split in [0, 1, 7, 8, 9, 500, 999, 1000] {
            let mut h = ContentHasher::new();
            h.update(&data[..split]);
            h.update(&data[split..]);
            assert_eq!(h.finish(), whole.finish(), "split {split}");
        }
        let mut other = ContentHasher::new();
        other.update(&data[..999]);
        assert_ne!(other.finish(), whole.finish());
        let mut zero_padded = ContentHasher::new();
        zero_padded.update(&[1, 2, 3]);
        let mut longer = ContentHasher::new();
        longer.update(&[1, 2, 3, 0]);
        assert_ne!(
            zero_padded.finish(),
            longer.finish(),
            "length is part of the hash"
        );
    }
}

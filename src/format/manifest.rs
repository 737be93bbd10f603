//! `manifest.json`: the typed manifest ([`Manifest`], one [`ShardEntry`] per shard, with its
//! [`ShardDocs`] and [`ShardChecksums`]), its parsing and serialization, the names `pack`
//! gives shards, and the dataset's content identity ([`Manifest::expected_content_hash`]).
//! Validation is in `validate.rs`; the hashes are in `hash.rs`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::dtype::RecordType;
use super::hash::{ContentHasher, format_hash, parse_hash};
use crate::error::{CorruptKind, Error, Result};

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
    /// Content hash of the shard bytes (`ContentHasher`), 16 hex digits. For an in-place
    /// shard, its `sampled_identity` (version 4) or `in_place_hash` (versions 2-3).
    pub hash: String,
    /// The shard's document and metadata files, when the dataset has documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub docs: Option<ShardDocs>,
    /// For a shard referenced in place (`pack --in-place`): the file's modification time in
    /// nanoseconds since the epoch when it was packed. In version 4 only the live-mutation
    /// guard: a mount that finds another mtime samples the content again instead of trusting
    /// it. (Versions 2-3: `path` is absolute and `hash` is `in_place_hash`.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_place_mtime_ns: Option<u64>,
    /// For an in-place shard (version 4): `in_place_guard` of `path`, `bytes`,
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
    /// What `pack --in-place` recognised the file as (`SOURCE_FORMATS`), informational.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_format: Option<String>,
    /// For an in-place shard that is a remote object: its strong ETag (quoted) when packed. A
    /// mount trusts the object without sampling it only while its ETag is still this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The values of `ShardEntry::source_format`: headerless records, a numpy `.npy`, an llm.c
/// shard.
pub(crate) const SOURCE_FORMATS: [&str; 5] = ["raw", "npy", "llmc", "megatron", "datatrove"];

/// A shard's checksum file (see `checksum.rs` and docs/FORMAT.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardChecksums {
    /// The checksum file's name, inside the dataset directory.
    pub file: String,
    /// Bytes per block: always `format::checksum::BLOCK`.
    pub block: u64,
    /// Content hash of the checksum file (`ContentHasher`), 16 hex digits.
    pub hash: String,
}

/// Per-shard document and metadata files (see docs/FORMAT.md):
///
/// - `docs`: one 24-byte record per document that starts in this shard: first record (u64,
///   stream-global), length in records (u64), and its document entry (u64, shard-local);
/// - `ids`: one little-endian u32 per record of the shard: the shard-local metadata entry
///   the record belongs to;
/// - `index`: `entries + 1` little-endian u64 offsets into `meta` (entry `k` is bytes
///   `[index[k], index[k+1])`);
/// - `meta`: the entries, each `doc` (u64 LE), `span` (u64 LE, the dataset-wide entry number)
///   and the metadata as JSON text (`null` where there is none).
///
/// A dataset without metadata (version 5) has the *compact* form: the `docs` file only
/// (O(documents) bytes; `ids`, `index` and `meta` absent, `entries` and `meta_bytes` 0, the
/// records' entry field unused). Each record's document is then found from the `docs`
/// records, and every document's metadata is `null`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardDocs {
    /// The ids file name (absent in the compact form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<String>,
    /// The entry index file name (absent in the compact form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<String>,
    /// The entry data file name (absent in the compact form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<String>,
    /// Number of metadata entries in this shard (`<= 2^32`; 0 in the compact form).
    pub entries: u64,
    /// Size of the entry data file (0 in the compact form).
    pub meta_bytes: u64,
    /// The documents file name.
    pub docs: String,
    /// Number of documents that start in this shard.
    pub documents: u64,
    /// Content hash of the files: `ContentHasher` over the little-endian u64 content hashes
    /// of ids, index, meta and docs, in that order (of docs alone in the compact form).
    pub hash: String,
    /// Block checksums of the files (version 3; optional): one file holding the checksums
    /// of ids, index, meta and docs (docs alone in the compact form), in that order, in
    /// blocks of `format::checksum::DOC_BLOCK` bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksums: Option<ShardChecksums>,
}

impl ShardDocs {
    /// Whether this is the compact form (the `docs` file only).
    pub fn is_compact(&self) -> bool {
        self.ids.is_none()
    }

    /// The listed file names, in the order of `DocFile::ALL` (`None` where absent).
    pub(crate) fn names(&self) -> [Option<&str>; 4] {
        [
            self.ids.as_deref(),
            self.index.as_deref(),
            self.meta.as_deref(),
            Some(self.docs.as_str()),
        ]
    }
}

/// The parsed `manifest.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Always `FORMAT_NAME`.
    pub format: String,
    /// Always `VERSION` for this build.
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
    pub(crate) fn parse(bytes: &[u8], path: &Path) -> Result<Manifest> {
        let manifest: Manifest = serde_json::from_slice(bytes)
            .map_err(|e| Error::dataset(path, CorruptKind::ManifestSyntax(e.to_string())))?;
        manifest.validate(path)?;
        Ok(manifest)
    }

    /// The record type.
    pub(crate) fn record_type(&self) -> RecordType {
        RecordType::from_manifest(&self.dtype).expect("validated at parse")
    }

    /// Serializes the manifest as written to disk (pretty JSON, trailing newline).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("manifest serializes");
        out.push(b'\n');
        out
    }

    /// The `content_hash` this manifest must carry. From version 3 it covers `dtype` and
    /// `metadata` too, which change what a mount serves (an edited dtype of the same item
    /// size, or a dropped metadata flag, would otherwise open under a new fingerprint instead
    /// of being refused), and the version (3 or 4); version 2 covers the shard list only
    /// (`content_hash`).
    pub fn expected_content_hash(&self) -> String {
        let shards = content_hash(&self.shards);
        if self.version < 3 {
            return shards;
        }
        let mut h = ContentHasher::new();
        // The version is part of the identity, so an edited version is refused rather than
        // opened under a new fingerprint.
        h.update(match self.version {
            5.. => b"shufflefs-dataset-v5",
            4 => b"shufflefs-dataset-v4",
            _ => b"shufflefs-dataset-v3",
        });
        h.update(self.dtype.as_bytes());
        h.update(&[0, u8::from(self.metadata)]);
        h.update(&parse_hash(&shards).unwrap_or(0).to_le_bytes());
        format_hash(h.finish())
    }
}

/// The name of shard `index` written by the pack run `pack_id`.
pub(crate) fn shard_name(pack_id: &str, index: usize) -> String {
    format!("shard-{pack_id}-{index:05}.bin")
}

/// The shard number `k` and the stem of a name of exactly the form [`shard_name`] gives:
/// `shard-<8 lowercase hex digits>-<k, zero-padded to 5 digits>.bin`.
pub(super) fn pack_shard_number(path: &str) -> Option<(u64, &str)> {
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

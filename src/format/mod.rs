//! The on-disk structures, pure: bytes in, typed values out, with each structure's writer
//! beside its reader. Nothing here opens a file (`storage/` and `dataset/` do).
//!
//! ```text
//! DATASET_DIR/
//!   manifest.json                written last, by rename: a dataset without it does not exist
//!   shard-<pack>-00000.bin       records 0 .. n0 of the stream, headerless, little-endian
//!   shard-<pack>-00000.sums      its block checksums (checksum.rs)
//!   shard-<pack>-00001.bin       records n0 .. n0+n1
//!   ...
//! ```
//!
//! `<pack>` is an id unique to each run of `pack`, so a repack (`--force`) never overwrites a
//! shard the current manifest references: the new manifest's rename switches datasets
//! atomically. A dataset with documents also has, per shard, `shard-<pack>-NNNNN.ids`, `.idx`,
//! `.meta` and `.docs` and their checksums `.docsums` (`docfiles.rs`). A shard referenced in
//! place (`pack --in-place`) is the user's own file, anywhere, records starting at its
//! `offset`.
//!
//! The manifest is versioned ([`VERSION`]); a reader refuses any other version, any unknown
//! field and any count that does not add up (`validate.rs`). docs/FORMAT.md has the byte-exact
//! layout.
//!
//! | file | what |
//! | --- | --- |
//! | `manifest.rs` | [`Manifest`], [`ShardEntry`], [`ShardDocs`], [`ShardChecksums`]: parse, write, content identity |
//! | `validate.rs` | every invariant of a manifest, checked at parse |
//! | `hash.rs` | `ContentHasher`, hashes as hex, in-place identities |
//! | `checksum.rs` | block checksums: writer (`checksum::BlockSums`) and file layout |
//! | `docfiles.rs` | the document files of a shard: which file, record layouts |
//! | `dtype.rs` | record types and their numpy spellings |
//! | `npy.rs` | the `.npy` header: writer and parser |
//! | `sniff/` | what an input file is (magic numbers, refusals, token width) |

pub(crate) mod checksum;
pub(crate) mod docfiles;
pub(crate) mod dtype;
mod hash;
mod manifest;
pub mod npy;
pub(crate) mod sniff;
mod validate;

#[cfg(test)]
mod tests;

pub use hash::in_place_hash;
pub(crate) use hash::{
    ContentHasher, SAMPLES, format_hash, in_place_guard, parse_hash, sample_ranges,
    sampled_identity,
};
#[cfg(test)]
pub(crate) use manifest::content_hash;
pub(crate) use manifest::shard_name;
pub use manifest::{Manifest, ShardChecksums, ShardDocs, ShardEntry};

/// The file name of the manifest inside a dataset directory.
pub(crate) const MANIFEST: &str = "manifest.json";

/// The value of the manifest's `format` field.
pub(crate) const FORMAT_NAME: &str = "shufflefs-dataset";

/// The manifest version this build writes. Bumped on any change that an older reader would
/// misread; readers refuse versions they do not know with a message saying what to do.
/// Version 3 added per-shard block checksums (`checksums`); version 4 identifies in-place
/// shards by their content (`sampled_identity`) and stores their paths relative to the
/// dataset directory where they are inside it, with an `in_place_guard`; version 5 adds the
/// compact document form (`ShardDocs::is_compact`). `pack` writes the oldest version that
/// can express a dataset ([`version_for`]): 5 only with compact documents, so older readers
/// keep reading everything else.
pub const VERSION: u32 = 5;

/// The version `pack` writes for a dataset with these shards: 5 when a shard has compact
/// documents, else 4.
pub(crate) fn version_for(shards: &[ShardEntry]) -> u32 {
    let compact = shards
        .iter()
        .any(|s| s.docs.as_ref().is_some_and(ShardDocs::is_compact));
    if compact { 5 } else { 4 }
}

/// The oldest manifest version this build reads: a version 2 manifest is a version 3 one
/// without checksums; versions 2 and 3 identify an in-place shard by its absolute path, size
/// and mtime ([`in_place_hash`]).
pub(crate) const MIN_VERSION: u32 = 2;

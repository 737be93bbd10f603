//! The document and metadata files of a shard ([`super::ShardDocs`]): which file is which, and
//! the layout of their records, written by `pack` and read by `dataset/documents.rs`.
//!
//! - `.ids` ([`DocFile::Ids`]): one little-endian u32 per record of the shard: the shard-local
//!   metadata entry the record belongs to;
//! - `.idx` ([`DocFile::Index`]): `entries + 1` little-endian u64 offsets into `.meta` (entry
//!   `k` is bytes `[index[k], index[k+1])`; the first is 0, the last the size of `.meta`);
//! - `.meta` ([`DocFile::Meta`]): the entries, each a [`Entry`] header (`doc` and `entry`, u64
//!   LE each: the document and the dataset-wide entry number) and the metadata as JSON text,
//!   without surrounding white space (`null` where there is none);
//! - `.docs` ([`DocFile::Docs`]): one [`DocRecord`] (24 bytes) per document that starts in the
//!   shard: its first record (stream-global), its length in records, and its entry
//!   (shard-local).
//!
//! Their block checksums are one `.docsums` file per shard: the checksums of the four files in
//! the order of [`DocFile::ALL`], in blocks of [`super::checksum::DOC_BLOCK`] bytes.

/// One of the four document files of a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DocFile {
    /// `.ids`: the entry of every record.
    Ids,
    /// `.idx`: where each entry starts in `.meta`.
    Index,
    /// `.meta`: the entries.
    Meta,
    /// `.docs`: where each document is.
    Docs,
}

impl DocFile {
    /// The four files, in the order of their checksums (and of their hashes in the manifest).
    pub(crate) const ALL: [DocFile; 4] =
        [DocFile::Ids, DocFile::Index, DocFile::Meta, DocFile::Docs];

    /// The file's extension as `pack` names it (`shard-<pack>-NNNNN.<ext>`).
    pub(crate) fn ext(self) -> &'static str {
        match self {
            DocFile::Ids => "ids",
            DocFile::Index => "idx",
            DocFile::Meta => "meta",
            DocFile::Docs => "docs",
        }
    }

    /// The file's position in [`DocFile::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Bytes per record of `.ids`.
pub(crate) const ID_BYTES: u64 = 4;

/// Bytes per offset of `.idx`.
pub(crate) const OFFSET_BYTES: u64 = 8;

/// Bytes of an entry's header in `.meta` (before its metadata text).
pub(crate) const ENTRY_HEADER: u64 = 16;

/// Bytes per document record in a `.docs` file.
pub(crate) const DOC_RECORD: u64 = 24;

/// One record of `.docs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DocRecord {
    /// The document's first record in the stream.
    pub(crate) start: u64,
    /// Its length in records.
    pub(crate) len: u64,
    /// Its own metadata entry (shard-local).
    pub(crate) entry: u64,
}

impl DocRecord {
    /// The record's bytes.
    pub(crate) fn encode(self) -> [u8; DOC_RECORD as usize] {
        let mut out = [0u8; DOC_RECORD as usize];
        out[..8].copy_from_slice(&self.start.to_le_bytes());
        out[8..16].copy_from_slice(&self.len.to_le_bytes());
        out[16..].copy_from_slice(&self.entry.to_le_bytes());
        out
    }

    /// The record in `bytes` (at least [`DOC_RECORD`] long).
    pub(crate) fn decode(bytes: &[u8]) -> DocRecord {
        DocRecord {
            start: u64_at(bytes, 0),
            len: u64_at(bytes, 8),
            entry: u64_at(bytes, 16),
        }
    }
}

/// One entry of `.meta`: whose it is and its metadata text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry<'a> {
    /// The document it belongs to.
    pub(crate) doc: u64,
    /// Its dataset-wide number (equal for the pieces of one document or span).
    pub(crate) entry: u64,
    /// The metadata as JSON text.
    pub(crate) meta: &'a [u8],
}

impl<'a> Entry<'a> {
    /// Appends the entry's bytes to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.doc.to_le_bytes());
        out.extend_from_slice(&self.entry.to_le_bytes());
        out.extend_from_slice(self.meta);
    }

    /// The entry in `bytes` (at least [`ENTRY_HEADER`] long: the index guarantees it).
    pub(crate) fn decode(bytes: &'a [u8]) -> Entry<'a> {
        Entry {
            doc: u64_at(bytes, 0),
            entry: u64_at(bytes, 8),
            meta: &bytes[ENTRY_HEADER as usize..],
        }
    }
}

/// The little-endian u64 at `at`.
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

/// The little-endian u64s of `bytes` (`.idx`).
pub(crate) fn offsets(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(OFFSET_BYTES as usize)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

/// The little-endian u32s of `bytes` (`.ids`).
pub(crate) fn ids(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(ID_BYTES as usize)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_entries_round_trip() {
        let r = DocRecord {
            start: 1 << 40,
            len: 7,
            entry: 3,
        };
        assert_eq!(DocRecord::decode(&r.encode()), r);
        let e = Entry {
            doc: 9,
            entry: 12,
            meta: b"{\"a\":1}",
        };
        let mut bytes = Vec::new();
        e.encode(&mut bytes);
        assert_eq!(bytes.len() as u64, ENTRY_HEADER + 7);
        assert_eq!(Entry::decode(&bytes), e);
        assert_eq!(
            offsets(&[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]),
            [1, 2]
        );
        assert_eq!(ids(&[5, 0, 0, 0, 6, 0, 0, 0]), [5, 6]);
        let exts: Vec<&str> = DocFile::ALL.iter().map(|f| f.ext()).collect();
        assert_eq!(exts, ["ids", "idx", "meta", "docs"]);
    }
}

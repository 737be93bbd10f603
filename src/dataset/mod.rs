//! A dataset opened: the manifest and every file it lists, read as one stream of records.
//!
//! [`Dataset::read_stream`] reads any byte range of the record stream straight into the
//! caller's buffer: one positioned read per shard the range touches, the shard holding an
//! offset found by binary search over cumulative shard sizes. A shard that delivers fewer
//! bytes than the manifest promises yields [`Error::ShortRead`] (EIO), never zero-filled or
//! partial data. With `--verify-reads`, every range is checked against the block checksums
//! first.
//!
//! | file | question |
//! | --- | --- |
//! | `open.rs` | how is a dataset opened, and every listed file checked against the manifest? |
//! | `shard.rs` | how is a byte range of one file read exactly (and checked)? |
//! | `documents.rs` | which document and metadata does each record carry? |

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{CorruptKind, Error, Result};
use crate::format::Manifest;
use crate::format::dtype::RecordType;
use crate::storage::remote::{self, RemoteObject};

mod documents;
mod open;
mod shard;

#[cfg(test)]
mod tests;

pub use documents::{DocFiles, Document, Meta, Span, SpanShape};
pub use shard::Shard;

// Also at the paths tests/it still name (until they use the crate root).
pub use crate::storage::{MAX_MANIFEST_BYTES, ReadAt, mtime_ns};

/// An opened, validated dataset.
#[derive(Debug)]
pub struct Dataset {
    dir: PathBuf,
    manifest: Manifest,
    record: RecordType,
    shards: Vec<Shard>,
    /// `ends[i]` is the stream byte offset one past shard `i`.
    ends: Vec<u64>,
    /// `doc_ends[i]` is one past the last document starting in shard `i` (with documents).
    doc_ends: Vec<u64>,
    /// Check every shard read against the block checksums (`--verify-reads`).
    verify_reads: bool,
}

impl Dataset {
    /// Assembles a dataset from already-open shards (tests and fault injection). The shard
    /// lengths must match the manifest.
    pub(crate) fn from_parts(dir: PathBuf, manifest: Manifest, shards: Vec<Shard>) -> Dataset {
        let mut ends = Vec::with_capacity(shards.len());
        let mut doc_ends = Vec::new();
        let (mut end, mut doc_end) = (0u64, 0u64);
        for s in &shards {
            end += s.len();
            ends.push(end);
            if let Some(d) = s.docs() {
                doc_end += d.documents;
                doc_ends.push(doc_end);
            }
        }
        Dataset {
            dir,
            record: manifest.record_type(),
            manifest,
            shards,
            ends,
            doc_ends,
            verify_reads: false,
        }
    }

    /// Checks every shard read against the block checksums from now on (`--verify-reads`).
    /// Refused when a shard has no checksum file.
    pub fn with_verified_reads(mut self) -> Result<Dataset> {
        if let Some(s) = self.shards.iter().find(|s| s.sums().is_none()) {
            return Err(Error::dataset(s.path(), CorruptKind::NoChecksums));
        }
        self.verify_reads = true;
        Ok(self)
    }

    /// Replaces the byte source of every file (shards, checksum and document files) with
    /// `wrap(path, source)`: the seam for counting reads and injecting faults in tests.
    pub fn wrap_sources(
        mut self,
        wrap: impl Fn(&Path, Arc<dyn ReadAt>) -> Arc<dyn ReadAt>,
    ) -> Dataset {
        for shard in &mut self.shards {
            shard.wrap_sources(&wrap);
        }
        self
    }

    /// The dataset directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The validated manifest.
    pub(crate) fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The record type.
    pub fn record_type(&self) -> &RecordType {
        &self.record
    }

    /// Number of records in the stream.
    pub fn n_records(&self) -> u64 {
        self.manifest.records
    }

    /// Bytes in the stream.
    pub(crate) fn n_bytes(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// The shards, in stream order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Number of documents, when the dataset has document structure.
    pub(crate) fn n_documents(&self) -> Option<u64> {
        self.manifest.documents
    }

    /// Whether records carry document and metadata entries.
    pub(crate) fn has_documents(&self) -> bool {
        self.manifest.documents.is_some()
    }

    /// The shard holding record `record`, with its first record and one past its last.
    fn shard_of_record(&self, record: u64) -> (usize, u64, u64) {
        let itemsize = self.record.itemsize() as u64;
        let index = self.ends.partition_point(|&e| e <= record * itemsize);
        let (first, end) = self.shard_records(index);
        (index, first, end)
    }

    /// Where records `[record, record + count)` are stored: one `(shard index, byte offset in
    /// the shard's file, records)` per shard they touch, in order (S.json's `sources`). No I/O.
    pub(crate) fn pieces(
        &self,
        record: u64,
        count: u64,
    ) -> impl Iterator<Item = (usize, u64, u64)> + '_ {
        let itemsize = self.record.itemsize() as u64;
        let end = record.saturating_add(count).min(self.n_records());
        let mut pos = record;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let (index, first, shard_end) = self.shard_of_record(pos);
            let take = shard_end.min(end) - pos;
            let offset = self.manifest.shards[index].offset + (pos - first) * itemsize;
            pos += take;
            Some((index, offset, take))
        })
    }

    /// The first record of shard `index` and one past its last.
    fn shard_records(&self, index: usize) -> (u64, u64) {
        let itemsize = self.record.itemsize() as u64;
        let start = self.ends[index] - self.shards[index].len();
        (start / itemsize, self.ends[index] / itemsize)
    }

    /// The shard whose documents file lists document `doc`.
    fn shard_of_document(&self, doc: u64) -> Option<usize> {
        let index = self.doc_ends.partition_point(|&e| e <= doc);
        (index < self.shards.len()).then_some(index)
    }

    /// The token value (first field) of record `record`.
    pub(crate) fn token_at(&self, record: u64) -> Result<i128> {
        let mut buf = vec![0u8; self.record.itemsize()];
        self.read_stream(record * buf.len() as u64, &mut buf)?;
        Ok(self.record.token_value(&buf))
    }

    /// Reads each `(dataset, offset, buf)`: `buf.len()` bytes of the dataset's stream at byte
    /// `offset`. The pieces in remote objects are fetched all at once (`remote::read_many`),
    /// local ones read in turn; with verified reads each is a [`Dataset::read_stream`].
    pub(crate) fn read_many(reads: &mut [(&Dataset, u64, &mut [u8])]) -> Result<()> {
        let mut remote: Vec<(&RemoteObject, u64, &mut [u8])> = Vec::new();
        for (dataset, offset, buf) in reads.iter_mut() {
            let (dataset, offset) = (*dataset, *offset);
            if dataset.verify_reads {
                dataset.read_stream(offset, buf)?;
                continue;
            }
            dataset.check_range(offset, buf.len())?;
            let mut index = dataset.ends.partition_point(|&e| e <= offset);
            let mut pos = offset;
            let mut rest: &mut [u8] = buf;
            while !rest.is_empty() {
                let shard = &dataset.shards[index];
                let shard_start = dataset.ends[index] - shard.len();
                let take = ((dataset.ends[index] - pos) as usize).min(rest.len());
                let (piece, tail) = std::mem::take(&mut rest).split_at_mut(take);
                match shard.remote_at(pos - shard_start) {
                    Some((object, at)) => remote.push((object, at, piece)),
                    None => shard.read_exact_at(piece, pos - shard_start)?,
                }
                rest = tail;
                pos += take as u64;
                index += 1;
            }
        }
        if !remote.is_empty() {
            remote::read_many(&mut remote)
                .map_err(|e| Error::io(PathBuf::from(e.name()), e.into()))?;
        }
        Ok(())
    }

    /// Whether some shard is a remote object.
    pub(crate) fn is_remote(&self) -> bool {
        self.shards.iter().any(|s| s.remote_at(0).is_some())
    }

    /// Checks that `len` bytes at stream byte `offset` exist.
    fn check_range(&self, offset: u64, len: usize) -> Result<()> {
        offset
            .checked_add(len as u64)
            .filter(|&e| e <= self.n_bytes())
            .map(|_| ())
            .ok_or_else(|| {
                let kind = CorruptKind::PastEnd {
                    len,
                    offset,
                    stream: self.n_bytes(),
                };
                Error::dataset(&self.dir, kind)
            })
    }

    /// Reads `buf.len()` bytes of the stream starting at byte `offset`: one positioned read
    /// per shard touched, straight into `buf`.
    pub fn read_stream(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.n_bytes())
            .ok_or_else(|| {
                let kind = CorruptKind::PastEnd {
                    len: buf.len(),
                    offset,
                    stream: self.n_bytes(),
                };
                Error::dataset(&self.dir, kind)
            })?;
        if buf.is_empty() {
            return Ok(());
        }
        // First shard whose end is past `offset`.
        let mut index = self.ends.partition_point(|&e| e <= offset);
        let mut pos = offset;
        let mut filled = 0usize;
        while pos < end {
            let shard = &self.shards[index];
            let shard_start = self.ends[index] - shard.len();
            let take = (self.ends[index].min(end) - pos) as usize;
            let out = &mut buf[filled..filled + take];
            if self.verify_reads {
                shard.read_verified_at(out, pos - shard_start)?;
            } else {
                shard.read_exact_at(out, pos - shard_start)?;
            }
            filled += take;
            pos += take as u64;
            index += 1;
        }
        Ok(())
    }
}

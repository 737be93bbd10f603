//! The compact document form (`format::ShardDocs::is_compact`): the `.docs` records alone,
//! 24 bytes per document. A record's document is found through a fence (every [`FENCE`]-th
//! document's first record, read once per shard) and one read of at most [`FENCE`] records.

use std::sync::Arc;

use super::{DocFiles, DocRead, Shard, corrupt};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::format::docfiles::{DOC_RECORD, DocFile, DocRecord};

/// Documents per fence post of a compact docs file (8 bytes of memory per 256 documents).
pub(super) const FENCE: u64 = 256;

/// Document records read at a time when walking the documents of a range.
const WALK: u64 = 16;

/// The compact form (`format::ShardDocs::is_compact`): each record's document is found from
/// the docs records alone. Documents tile the stream: each is listed by the shard where it
/// starts, starts where the one before it ends, and has at least one record; the first
/// starts at record 0 and the last ends at the end of the stream. Every read checks what it
/// relies on, so damaged files give an error naming them, never a wrong document.
impl Dataset {
    /// Whether the dataset's document files have the compact form.
    pub(crate) fn compact_documents(&self) -> bool {
        self.shards
            .first()
            .and_then(Shard::docs)
            .is_some_and(DocFiles::is_compact)
    }

    /// The docs files of shard `index`.
    pub(super) fn docs_of(&self, index: usize) -> Result<&DocFiles> {
        self.shards[index]
            .docs()
            .ok_or_else(|| Error::invalid("the dataset has no documents"))
    }

    /// Reads `n` docs records of shard `index` from its local document `first`, each checked to
    /// lie in the shard (it starts there and has records, ending inside the stream).
    fn read_doc_records(
        &self,
        index: usize,
        first: u64,
        n: u64,
        read: DocRead,
    ) -> Result<Vec<DocRecord>> {
        let d = self.docs_of(index)?;
        let mut raw = vec![0u8; (n * DOC_RECORD) as usize];
        d.read_at(DocFile::Docs, &mut raw, first * DOC_RECORD, read)?;
        let (shard_first, shard_end) = self.shard_records(index);
        let records: Vec<DocRecord> = raw
            .chunks_exact(DOC_RECORD as usize)
            .map(DocRecord::decode)
            .collect();
        for (k, r) in records.iter().enumerate() {
            // A document starts in the shard that lists it; pack may list one starting
            // exactly at the shard's end there (it began a new shard for its entries).
            let fits = r.len > 0
                && (shard_first..=shard_end).contains(&r.start)
                && r.start
                    .checked_add(r.len)
                    .is_some_and(|e| e <= self.n_records());
            if !fits {
                let doc = self.doc_ends[index] - d.documents + first + k as u64;
                return Err(corrupt(
                    d.file(DocFile::Docs).path(),
                    format!(
                        "document {doc} at records [{}, +{}) is not inside its shard's records                          [{shard_first}, {shard_end})",
                        r.start, r.len
                    ),
                ));
            }
        }
        Ok(records)
    }

    /// The extents `(first record, records)` of documents `first ..` (at most `n`, fewer at the
    /// end), from the docs records alone (no metadata), in one read per shard touched; each
    /// checked to start where the one before it ends.
    pub(crate) fn document_extents(&self, first: u64, n: u64) -> Result<Vec<(u64, u64)>> {
        let total = self.n_documents().unwrap_or(0);
        let end = first.saturating_add(n).min(total);
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(end.saturating_sub(first) as usize);
        let mut doc = first;
        while doc < end {
            let shard = self.shard_of_document(doc).ok_or(Error::NotFound)?;
            let d = self.docs_of(shard)?;
            let local = doc - (self.doc_ends[shard] - d.documents);
            let take = (end - doc).min(d.documents - local);
            for r in self.read_doc_records(shard, local, take, DocRead::Checked)? {
                if let Some(&(s, l)) = out.last()
                    && s + l != r.start
                {
                    return Err(corrupt(
                        d.file(DocFile::Docs).path(),
                        format!("document {doc} does not start where the one before it ends"),
                    ));
                }
                out.push((r.start, r.len));
                doc += 1;
            }
        }
        Ok(out)
    }

    /// The first record of every [`FENCE`]-th document of shard `index`: the whole docs file
    /// read once, in blocks, and checked (documents in order, each ending where the next
    /// starts).
    fn fence(&self, index: usize, read: DocRead) -> Result<Arc<Vec<u64>>> {
        let d = self.docs_of(index)?;
        if let Some(f) = d.fence.lock().expect("fence lock").as_ref() {
            return Ok(f.clone());
        }
        const BLOCK: u64 = 1 << 15;
        let mut fence = Vec::with_capacity(d.documents.div_ceil(FENCE) as usize);
        let mut prev_end: Option<u64> = None;
        let mut first = 0u64;
        while first < d.documents {
            let n = BLOCK.min(d.documents - first);
            let records = self.read_doc_records(index, first, n, read)?;
            for (k, r) in records.iter().enumerate() {
                let local = first + k as u64;
                if prev_end.is_some_and(|e| e != r.start) {
                    return Err(corrupt(
                        d.file(DocFile::Docs).path(),
                        format!("local document {local} does not start where the one before ends"),
                    ));
                }
                prev_end = Some(r.start + r.len);
                if local.is_multiple_of(FENCE) {
                    fence.push(r.start);
                }
            }
            first += n;
        }
        let fence = Arc::new(fence);
        // Built from checked reads only: a fence from unchecked bytes is not kept.
        if read == DocRead::Checked || d.sums.is_none() {
            *d.fence.lock().expect("fence lock") = Some(fence.clone());
        }
        Ok(fence)
    }

    /// How many documents of shard `index` start at or before `record`.
    fn starts_at_or_before(&self, index: usize, record: u64, read: DocRead) -> Result<u64> {
        let d = self.docs_of(index)?;
        if d.documents == 0 {
            return Ok(0);
        }
        let fence = self.fence(index, read)?;
        let posts = fence.partition_point(|&s| s <= record) as u64;
        let Some(block) = posts.checked_sub(1) else {
            return Ok(0);
        };
        let first = block * FENCE;
        let n = FENCE.min(d.documents - first);
        let records = self.read_doc_records(index, first, n, read)?;
        if records[0].start != fence[block as usize] {
            return Err(corrupt(
                d.file(DocFile::Docs).path(),
                "the docs file changed while mounted",
            ));
        }
        Ok(first + records.partition_point(|r| r.start <= record) as u64)
    }

    /// The documents of records `[record, record + count)`: `(start, end, document)` with
    /// `start`, `end` relative to `record`, in order, tiling the range.
    pub(super) fn compact_runs(
        &self,
        record: u64,
        count: u64,
        read: DocRead,
    ) -> Result<Vec<(u64, u64, u64)>> {
        let end = record + count;
        let mut out = Vec::new();
        if count == 0 {
            return Ok(out);
        }
        let (index, _, _) = self.shard_of_record(record);
        let d = self.docs_of(index)?;
        let before = self.doc_ends[index] - d.documents;
        let started = before + self.starts_at_or_before(index, record, read)?;
        let Some(mut doc) = started.checked_sub(1) else {
            return Err(corrupt(
                d.file(DocFile::Docs).path(),
                format!("record {record} is before the first document"),
            ));
        };
        let mut pos = record;
        while pos < end {
            let Some(shard) = self.shard_of_document(doc) else {
                return Err(corrupt(
                    self.docs_of(self.shards.len() - 1)?
                        .file(DocFile::Docs)
                        .path(),
                    format!("the documents end before record {pos}"),
                ));
            };
            let ds = self.docs_of(shard)?;
            let local = doc - (self.doc_ends[shard] - ds.documents);
            let n = WALK.min(ds.documents - local);
            for r in self.read_doc_records(shard, local, n, read)? {
                let doc_end = r.start + r.len;
                // The first document holds `record`; each next one starts where the one
                // before ended.
                if r.start > pos || doc_end <= pos {
                    return Err(corrupt(
                        ds.file(DocFile::Docs).path(),
                        format!(
                            "document {doc} at records [{}, {doc_end}) does not hold record {pos}",
                            r.start
                        ),
                    ));
                }
                let stop = doc_end.min(end);
                out.push((pos - record, stop - record, doc));
                pos = stop;
                doc += 1;
                if pos >= end {
                    break;
                }
            }
        }
        Ok(out)
    }
}

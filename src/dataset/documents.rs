//! Documents and metadata: which document and metadata entry each record belongs to, read
//! from a shard's document files (`format/docfiles.rs` has their layout).
//!
//! [`Dataset::spans`] tiles a record range with runs of one metadata entry each: per shard
//! touched, one read of `.ids`, one of the entry index and one of the entry data.
//! [`Dataset::document`] finds a document from its shard's `.docs` record and its own entry.
//! Both check what they read against the invariants `pack` writes (documents tile the stream,
//! entries are numbered in the order pack meets them, an entry names its document, offsets
//! increase, metadata is JSON without surrounding white space): a damaged file of the right
//! size is an error naming it ([`CorruptKind::Documents`]), never a wrong range or metadata
//! under the same fingerprint. Every read is checked against the block checksums when the
//! dataset has them ([`DocRead::Checked`]).
//!
//! For sizes only (`stat` of a JSON file, thousands per `ls -l`), [`Dataset::span_shapes`] and
//! [`Dataset::document_shape`] read without checksums and without parsing the metadata
//! ([`DocRead::ForSize`]), falling back to checked reads on any error: the shapes are those of
//! the spans whenever the spans can be read, and nothing read that way is ever served.

use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::value::RawValue;

use super::Dataset;

mod compact;
use super::shard::{Shard, Wrap};
use crate::error::{CorruptKind, Error, Result};
use crate::format::checksum::DOC_BLOCK;
use crate::format::docfiles::{
    DOC_RECORD, DocFile, DocRecord, ENTRY_HEADER, Entry, ID_BYTES, OFFSET_BYTES, ids, offsets,
};

/// The document and metadata files of one shard (`format::ShardDocs`).
#[derive(Debug)]
pub struct DocFiles {
    /// The files, in the order of [`DocFile::ALL`]: all four, or (compact form) the docs file
    /// alone.
    files: [Option<Shard>; 4],
    /// Number of entries (0 in the compact form).
    pub(crate) entries: u64,
    /// Number of documents starting in the shard.
    pub(crate) documents: u64,
    /// The block checksums of the files, when the manifest lists them.
    pub(crate) sums: Option<DocSums>,
    /// Compact form: the first record of every `compact::FENCE`-th document of the shard, read once
    /// on first use (the whole docs file, checked), so that finding a record's document is
    /// one search in memory and one read of at most `FENCE` records.
    fence: Mutex<Option<Arc<Vec<u64>>>>,
}

/// The checksum file of a shard's document files.
#[derive(Debug)]
pub(crate) struct DocSums {
    /// The file: the checksums of the files, one after the other.
    pub(crate) file: Shard,
    /// The index of the first checksum of each of the four files (absent files have none).
    bases: [u64; 4],
}

impl DocSums {
    /// The checksum file `file` of the document files `files`.
    pub(crate) fn new(file: Shard, files: &[Option<Shard>; 4]) -> DocSums {
        let mut bases = [0u64; 4];
        let mut total = 0u64;
        for (base, f) in bases.iter_mut().zip(files) {
            *base = total;
            total += f.as_ref().map_or(0, |f| f.len().div_ceil(DOC_BLOCK));
        }
        DocSums { file, bases }
    }

    /// The size of the checksum file of document files of these sizes (0 for an absent one).
    pub(crate) fn file_len(lens: [u64; 4]) -> u64 {
        lens.iter().map(|len| len.div_ceil(DOC_BLOCK)).sum::<u64>() * 8
    }
}

impl DocFiles {
    /// The document files `files` (in the order of [`DocFile::ALL`]; the docs file alone in
    /// the compact form) of a shard with `entries` entries and `documents` documents.
    pub(crate) fn new(
        files: [Option<Shard>; 4],
        entries: u64,
        documents: u64,
        sums: Option<DocSums>,
    ) -> DocFiles {
        DocFiles {
            files,
            entries,
            documents,
            sums,
            fence: Mutex::new(None),
        }
    }

    /// Whether the shard has the compact form (the docs file only).
    pub(crate) fn is_compact(&self) -> bool {
        self.files[DocFile::Ids.index()].is_none()
    }

    /// One of the files; in the compact form only [`DocFile::Docs`] exists (the callers
    /// of the others are on the full form's paths).
    pub(crate) fn file(&self, which: DocFile) -> &Shard {
        self.files[which.index()]
            .as_ref()
            .expect("the full form's files are read only in the full form")
    }

    /// The files present, in the order of [`DocFile::ALL`].
    pub(crate) fn present(&self) -> impl Iterator<Item = (DocFile, &Shard)> {
        DocFile::ALL
            .into_iter()
            .zip(&self.files)
            .filter_map(|(w, f)| f.as_ref().map(|f| (w, f)))
    }

    /// Reads `buf.len()` bytes of document file `which` at `offset`, checked against its
    /// block checksums when the dataset has them and `read` is [`DocRead::Checked`]: a
    /// changed document file is an error, never served.
    fn read_at(&self, which: DocFile, buf: &mut [u8], offset: u64, read: DocRead) -> Result<()> {
        let file = self.file(which);
        match &self.sums {
            Some(s) if read == DocRead::Checked => {
                let base = s.bases[which.index()];
                file.read_checked_at(&s.file, DOC_BLOCK, base, buf, offset)
            }
            _ => file.read_exact_at(buf, offset),
        }
    }

    /// See [`Shard::wrap_sources`].
    pub(super) fn wrap_sources(&mut self, wrap: &Wrap<'_>) {
        for f in self.files.iter_mut().flatten() {
            f.wrap_sources(wrap);
        }
        if let Some(s) = self.sums.as_mut() {
            s.file.wrap_sources(wrap);
        }
    }
}

/// How document files are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DocRead {
    /// Against their block checksums, metadata validated as JSON: for anything served.
    Checked,
    /// As they are, for sizes only (`stat` of a JSON file): no checksum reads, no JSON
    /// parsing. Whatever such a read yields is never served; a read of the file itself checks
    /// everything. The callers fall back to [`DocRead::Checked`] on any error, and reads whose
    /// extent comes from unchecked bytes are bounded ([`UNCHECKED_ENTRIES`]).
    ForSize,
}

/// Most entry index and metadata bytes an unchecked read (`DocRead::ForSize`) of one shard piece
/// reads; beyond it (rare metadata, or damaged files) the piece is read checked.
const UNCHECKED_ENTRIES: u64 = 1 << 20;

/// Metadata: the JSON text of a document's or span's metadata (`null` where there is none),
/// checked to be valid JSON. Served as it is in `S.json` and `I.json`.
#[derive(Clone, Debug)]
pub struct Meta(Box<RawValue>);

impl Meta {
    /// Metadata of JSON text `text` (tests).
    #[cfg(test)]
    pub(crate) fn new(text: &str) -> Meta {
        Meta(RawValue::from_string(text.to_string()).expect("JSON text"))
    }

    /// The JSON text.
    pub(crate) fn get(&self) -> &str {
        self.0.get()
    }
}

impl std::ops::Deref for Meta {
    type Target = str;
    fn deref(&self) -> &str {
        self.get()
    }
}

impl std::fmt::Display for Meta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.get())
    }
}

impl PartialEq for Meta {
    fn eq(&self, other: &Meta) -> bool {
        self.get() == other.get()
    }
}

impl Eq for Meta {}

impl Serialize for Meta {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

/// A run of records that share one metadata entry, relative to the start of a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// First record of the run (relative).
    pub start: u64,
    /// One past the last record (relative).
    pub end: u64,
    /// The document the records belong to.
    pub doc: u64,
    /// The dataset-wide entry number (equal for the pieces of one document or span).
    pub entry: u64,
    /// The metadata.
    pub meta: Meta,
}

/// The shape of a [`Span`] without its metadata text: what its JSON length depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanShape {
    /// First record of the run (relative).
    pub start: u64,
    /// One past the last record (relative).
    pub end: u64,
    /// The document the records belong to.
    pub doc: u64,
    /// Length of the metadata's JSON text.
    pub meta_len: u64,
}

/// Where a document is and what it carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Document {
    /// First record in the stream.
    pub start: u64,
    /// Length in records.
    pub len: u64,
    /// The document's metadata.
    pub meta: Meta,
}

/// The shape of a [`Document`] without its metadata text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DocShape {
    /// First record in the stream.
    pub(crate) start: u64,
    /// Length in records.
    pub(crate) len: u64,
    /// Length of the metadata's JSON text.
    pub(crate) meta_len: u64,
}

/// An entry's metadata as read: its text and, for checked reads, the text as JSON.
struct MetaRead<'a> {
    text: &'a [u8],
    json: Option<&'a RawValue>,
}

impl MetaRead<'_> {
    /// The checked metadata ([`DocRead::Checked`] reads only).
    fn meta(&self) -> Meta {
        Meta(
            self.json
                .expect("a checked read parses the metadata")
                .to_owned(),
        )
    }

    fn len(&self) -> u64 {
        self.text.len() as u64
    }
}

/// A run of records with one metadata entry, its metadata as `M` (see `Dataset::runs`).
struct Run<M> {
    start: u64,
    end: u64,
    doc: u64,
    entry: u64,
    meta: M,
}

/// The metadata of every document of a dataset without metadata (compact document files).
const NULL_META: MetaRead<'static> = MetaRead {
    text: b"null",
    json: Some(RawValue::NULL),
};

/// The error of document files that contradict what `pack` writes.
fn corrupt(path: &Path, what: impl Into<String>) -> Error {
    Error::dataset(path, CorruptKind::Documents(what.into()))
}

impl Dataset {
    /// The metadata runs of records `[record, record + count)`, in order, tiling the range.
    /// Per shard touched: one read of the ids, one of the entry index, one of the entry data.
    pub fn spans(&self, record: u64, count: u64) -> Result<Vec<Span>> {
        let runs = self.runs(record, count, DocRead::Checked, |m: &MetaRead<'_>| m.meta())?;
        Ok(runs
            .into_iter()
            .map(|r| Span {
                start: r.start,
                end: r.end,
                doc: r.doc,
                entry: r.entry,
                meta: r.meta,
            })
            .collect())
    }

    /// The shapes of [`Dataset::spans`] (the same runs, with the length of their metadata
    /// text), for sizes only (see the module docs).
    pub fn span_shapes(&self, record: u64, count: u64) -> Result<Vec<SpanShape>> {
        let shapes = |read| {
            self.runs(record, count, read, |m: &MetaRead<'_>| m.len())
                .map(|runs| {
                    runs.into_iter()
                        .map(|r| SpanShape {
                            start: r.start,
                            end: r.end,
                            doc: r.doc,
                            meta_len: r.meta,
                        })
                        .collect()
                })
        };
        shapes(DocRead::ForSize).or_else(|_| shapes(DocRead::Checked))
    }

    /// Document `doc`: one read of its shard's docs file, then its entry (index + data).
    pub fn document(&self, doc: u64) -> Result<Document> {
        let (start, len, meta) =
            self.document_with(doc, DocRead::Checked, |m: &MetaRead<'_>| m.meta())?;
        Ok(Document { start, len, meta })
    }

    /// The shape of [`Dataset::document`], for sizes only (see the module docs).
    pub(crate) fn document_shape(&self, doc: u64) -> Result<DocShape> {
        let (start, len, meta_len) = self
            .document_with(doc, DocRead::ForSize, |m: &MetaRead<'_>| m.len())
            .or_else(|_| self.document_with(doc, DocRead::Checked, |m: &MetaRead<'_>| m.len()))?;
        Ok(DocShape {
            start,
            len,
            meta_len,
        })
    }

    /// Transitional, for tests/it until it names [`Dataset::document_shape`]: the document
    /// read as for sizes, its metadata parsed.
    #[doc(hidden)]
    pub fn document_for_size(&self, doc: u64) -> Result<Document> {
        let text = |m: &MetaRead<'_>| m.text.to_vec();
        let (start, len, text) = self
            .document_with(doc, DocRead::ForSize, text)
            .or_else(|_| self.document_with(doc, DocRead::Checked, text))?;
        let text = String::from_utf8(text).map_err(|e| Error::invalid(e.to_string()))?;
        let meta = RawValue::from_string(text).map_err(|e| Error::invalid(e.to_string()))?;
        Ok(Document {
            start,
            len,
            meta: Meta(meta),
        })
    }

    /// Reads entries `lo..=hi` of a shard: one index read and one data read. Returns
    /// `(index offsets lo..=hi+1, data starting at offsets[0])`.
    fn read_entries(
        &self,
        d: &DocFiles,
        lo: u32,
        hi: u32,
        read: DocRead,
    ) -> Result<(Vec<u64>, Vec<u8>)> {
        if u64::from(hi) >= d.entries || lo > hi {
            return Err(corrupt(
                d.file(DocFile::Ids).path(),
                "entry id out of range",
            ));
        }
        let count = (hi - lo) as usize + 2;
        if read == DocRead::ForSize && count as u64 * OFFSET_BYTES > UNCHECKED_ENTRIES {
            return self.read_entries(d, lo, hi, DocRead::Checked);
        }
        let mut raw = vec![0u8; count * OFFSET_BYTES as usize];
        d.read_at(DocFile::Index, &mut raw, u64::from(lo) * OFFSET_BYTES, read)?;
        let offsets = offsets(&raw);
        // idx[0] = 0 and idx[entries] = meta_bytes, where the read reaches them.
        let meta_len = d.file(DocFile::Meta).len();
        let first_ok = lo > 0 || offsets[0] == 0;
        let last_ok = u64::from(hi) + 1 < d.entries || offsets[count - 1] == meta_len;
        if offsets
            .windows(2)
            .any(|w| w[1] < w[0].saturating_add(ENTRY_HEADER))
            || offsets[count - 1] > meta_len
            || !first_ok
            || !last_ok
        {
            return Err(corrupt(
                d.file(DocFile::Index).path(),
                "entry offsets not increasing or past the end",
            ));
        }
        let len = offsets[count - 1] - offsets[0];
        if read == DocRead::ForSize && len > UNCHECKED_ENTRIES {
            return self.read_entries(d, lo, hi, DocRead::Checked);
        }
        let mut data = vec![0u8; len as usize];
        d.read_at(DocFile::Meta, &mut data, offsets[0], read)?;
        Ok((offsets, data))
    }

    /// Parses entry `id` out of a [`Dataset::read_entries`] result starting at `lo`; its
    /// metadata is parsed as JSON unless `read` is [`DocRead::ForSize`]. Returns its document,
    /// its entry number and its metadata.
    fn entry<'a>(
        &self,
        d: &DocFiles,
        (offsets, data): (&[u64], &'a [u8]),
        lo: u32,
        id: u32,
        read: DocRead,
    ) -> Result<(u64, u64, MetaRead<'a>)> {
        let meta_path = || d.file(DocFile::Meta).path();
        let k = (id - lo) as usize;
        let base = offsets[0];
        let bytes = &data[(offsets[k] - base) as usize..(offsets[k + 1] - base) as usize];
        let Entry { doc, entry, meta } = Entry::decode(bytes);
        if doc >= self.n_documents().unwrap_or(0) {
            return Err(corrupt(
                meta_path(),
                "metadata entry of a document out of range",
            ));
        }
        let json = match read {
            DocRead::ForSize => None,
            DocRead::Checked => {
                let parsed = std::str::from_utf8(meta)
                    .ok()
                    .and_then(|m| serde_json::from_str::<&RawValue>(m).ok());
                match parsed {
                    Some(json) => Some(json),
                    None => return Err(corrupt(meta_path(), "metadata entry is not valid JSON")),
                }
            }
        };
        // pack stores the value's own text, which neither starts nor ends with whitespace.
        let space = |b: Option<&u8>| b.is_some_and(|b| b" \t\n\r".contains(b));
        if space(meta.first()) || space(meta.last()) {
            return Err(corrupt(
                meta_path(),
                "metadata entry has whitespace around its JSON value",
            ));
        }
        Ok((doc, entry, MetaRead { text: meta, json }))
    }

    /// The runs of [`Dataset::spans`], with `meta_of(metadata)` as their metadata: the
    /// metadata of runs with equal entries must have equal `meta_of`.
    fn runs<M: PartialEq>(
        &self,
        record: u64,
        count: u64,
        read: DocRead,
        meta_of: impl Fn(&MetaRead<'_>) -> M,
    ) -> Result<Vec<Run<M>>> {
        if self.compact_documents() {
            let meta = meta_of(&NULL_META);
            return Ok(self
                .compact_runs(record, count, read)?
                .into_iter()
                .map(|(start, end, doc)| Run {
                    start,
                    end,
                    doc,
                    entry: doc,
                    meta: meta_of(&NULL_META),
                })
                .inspect(|r| debug_assert!(r.meta == meta))
                .collect());
        }
        let mut out: Vec<Run<M>> = Vec::new();
        let mut pos = record;
        let end = record + count;
        while pos < end {
            let (index, shard_first, shard_end) = self.shard_of_record(pos);
            let d = self.shards[index]
                .docs()
                .ok_or_else(|| Error::invalid("the dataset has no documents"))?;
            let take = shard_end.min(end) - pos;
            let mut raw = vec![0u8; (take * ID_BYTES) as usize];
            d.read_at(DocFile::Ids, &mut raw, (pos - shard_first) * ID_BYTES, read)?;
            let ids = ids(&raw);
            let starts = id_runs(&ids);
            let lo = starts.iter().map(|r| r.1).min().expect("non-empty");
            let hi = starts.iter().map(|r| r.1).max().expect("non-empty");
            let (offsets, data) = self.read_entries(d, lo, hi, read)?;
            for (k, &(i, id)) in starts.iter().enumerate() {
                let j = starts.get(k + 1).map_or(ids.len(), |r| r.0);
                let (doc, entry, meta) = self.entry(d, (&offsets, &data), lo, id, read)?;
                let meta = meta_of(&meta);
                let (start, stop) = (pos - record + i as u64, pos - record + j as u64);
                // Documents are runs of consecutive records, and entries are numbered in
                // the order pack meets them: the next run belongs to the same document or
                // the next one, a run of the next document has a larger entry number, and
                // a run with the same entry number (continued from the previous shard) is
                // the same entry, document and metadata.
                if let Some(last) = out.last() {
                    let (last_doc, last_entry) = (last.doc, last.entry);
                    let fits = if entry == last_entry {
                        doc == last_doc && meta == last.meta
                    } else {
                        doc == last_doc
                            || (Some(doc) == last_doc.checked_add(1) && entry > last_entry)
                    };
                    if !fits {
                        let before = match self.shards[index.saturating_sub(1)].docs() {
                            Some(prev) if i == 0 => {
                                let ids = prev.file(DocFile::Ids).path();
                                format!(" at the end of {}", ids.display())
                            }
                            _ => String::new(),
                        };
                        return Err(corrupt(
                            d.file(DocFile::Ids).path(),
                            format!(
                                "records of document {doc} (entry {entry}) follow records of \
                                 document {last_doc} (entry {last_entry}){before}"
                            ),
                        ));
                    }
                }
                match out.last_mut() {
                    Some(last) if last.entry == entry && last.end == start => last.end = stop,
                    _ => out.push(Run {
                        start,
                        end: stop,
                        doc,
                        entry,
                        meta,
                    }),
                }
            }
            pos += take;
        }
        Ok(out)
    }

    /// Document `doc`'s first record, length and `meta_of(its metadata)`.
    fn document_with<M>(
        &self,
        doc: u64,
        read: DocRead,
        meta_of: impl Fn(&MetaRead<'_>) -> M,
    ) -> Result<(u64, u64, M)> {
        let index = self.shard_of_document(doc).ok_or(Error::NotFound)?;
        let d = self.shards[index]
            .docs()
            .ok_or_else(|| Error::invalid("the dataset has no documents"))?;
        let docs_path = || d.file(DocFile::Docs).path();
        let local = doc - (self.doc_ends[index] - d.documents);
        // The record and its neighbours in this shard, in one read: documents tile the
        // stream, so each starts where the one before it ends.
        let first = local.saturating_sub(1);
        let last = (local + 1).min(d.documents - 1);
        let mut raw = vec![0u8; ((last - first + 1) * DOC_RECORD) as usize];
        d.read_at(DocFile::Docs, &mut raw, first * DOC_RECORD, read)?;
        let record = |l: u64| DocRecord::decode(&raw[((l - first) * DOC_RECORD) as usize..]);
        let DocRecord { start, len, entry } = record(local);
        let end = start
            .checked_add(len)
            .filter(|&e| e <= self.n_records())
            .ok_or_else(|| corrupt(docs_path(), "document extends past the stream"))?;
        // A document is listed by the shard where it starts (or, when pack started a new
        // shard for its entries, the shard just before), and the last one listed there ends
        // at or after the shard's end: otherwise the next document would start in the shard.
        let (shard_first, shard_end) = self.shard_records(index);
        let follows = |r: DocRecord| r.start.checked_add(r.len) == Some(start);
        // The last document listed by a shard ends where the next one starts (listed by a
        // later shard), or at the end of the stream.
        let next_start = if local + 1 < d.documents {
            record(local + 1).start
        } else if doc + 1 < self.n_documents().unwrap_or(0) {
            let next = self.shard_of_document(doc + 1).ok_or(Error::NotFound)?;
            let ds = self.docs_of(next)?;
            let first = doc + 1 - (self.doc_ends[next] - ds.documents);
            let mut raw = [0u8; DOC_RECORD as usize];
            ds.read_at(DocFile::Docs, &mut raw, first * DOC_RECORD, read)?;
            DocRecord::decode(&raw).start
        } else {
            self.n_records()
        };
        let placed = len > 0
            && (shard_first..=shard_end).contains(&start)
            && (local == 0 || follows(record(local - 1)))
            && next_start == end
            && (local + 1 < d.documents || end >= shard_end);
        if !placed {
            return Err(corrupt(
                docs_path(),
                format!("document {doc} at records [{start}, {end}) does not fit its place"),
            ));
        }
        if d.is_compact() {
            return Ok((start, len, meta_of(&NULL_META)));
        }
        // Its entry (and the one before, in the same two reads) is the document's own: it
        // names the document, and pack stores it before any other entry of the document.
        let entry = u32::try_from(entry)
            .map_err(|_| corrupt(docs_path(), "document entry out of range"))?;
        let lo = entry.saturating_sub(1);
        let (offsets, data) = self.read_entries(d, lo, entry, read)?;
        let (owner, _, meta) = self.entry(d, (&offsets, &data), lo, entry, read)?;
        let before = if entry > 0 {
            Some(self.entry(d, (&offsets, &data), lo, lo, read)?.0)
        } else {
            None
        };
        if owner != doc || before == Some(doc) {
            return Err(corrupt(
                docs_path(),
                format!("the entry of document {doc} is not its own"),
            ));
        }
        Ok((start, len, meta_of(&meta)))
    }
}

/// The runs of equal ids, as (first index, id): one pass, comparing sixteen ids at a time
/// without branching (runs are tens to thousands of records long).
fn id_runs(ids: &[u32]) -> Vec<(usize, u32)> {
    let mut starts: Vec<(usize, u32)> = Vec::new();
    let mut i = 0usize;
    while i < ids.len() {
        let id = ids[i];
        starts.push((i, id));
        let mut j = i + 1;
        while j + 16 <= ids.len() && ids[j..j + 16].iter().fold(0, |a, &x| a | (x ^ id)) == 0 {
            j += 16;
        }
        while j < ids.len() && ids[j] == id {
            j += 1;
        }
        i = j;
    }
    starts
}

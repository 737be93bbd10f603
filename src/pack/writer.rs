//! The shard writer: records into shards under temporary names (content hash and block
//! checksums fed as they are written), the document files beside them (entries, ids, index,
//! metadata, documents), fsync and rename to names unique to the pack run.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use log::debug;

use super::{CHUNK, MAX_ENTRIES, Written};
use crate::error::{Error, Result};
use crate::format::checksum::{self, BlockSums};
use crate::format::docfiles::{DocFile, DocRecord, ENTRY_HEADER, Entry};
use crate::format::dtype::RecordType;
use crate::format::{self, ContentHasher, ShardChecksums, ShardDocs, ShardEntry, shard_name};

pub(super) fn write_records_file(
    writer: &mut Writer,
    path: &Path,
    offset: u64,
    bytes: u64,
    split: Split<'_>,
) -> Result<()> {
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| Error::io(path, e))?;
    let itemsize = writer.itemsize as usize;
    let per_chunk = (CHUNK / itemsize).max(1) * itemsize;
    let mut buf = vec![0u8; per_chunk];
    let mut left = bytes;
    let mut doc_open = false;
    // Records of this file before `buf`, and the next document end of `Split::Ends`.
    let mut base = 0u64;
    let mut next_end = 0usize;
    while left > 0 {
        let want = left.min(per_chunk as u64) as usize;
        file.read_exact(&mut buf[..want]).map_err(|e| {
            Error::io(
                path,
                io::Error::new(e.kind(), format!("input changed while packing: {e}")),
            )
        })?;
        left -= want as u64;
        if let Some(bar) = &writer.progress {
            bar.inc(want as u64);
        }
        if !writer.has_docs {
            writer.write_plain(&buf[..want])?;
            continue;
        }
        // Split where documents end: after each separator record, or at the given ends.
        let mut start = 0;
        let records = (want / itemsize) as u64;
        let mut cut = |end: usize, writer: &mut Writer, doc_open: &mut bool| -> Result<()> {
            if end > start {
                if !*doc_open {
                    writer.begin_doc(None)?;
                }
                writer.write_doc_records(&buf[start..end], Seg::Doc)?;
                writer.end_doc()?;
                *doc_open = false;
                start = end;
            }
            Ok(())
        };
        match split {
            Split::Sep(None) => {}
            Split::Sep(Some(sep)) => {
                for (i, rec) in buf[..want].chunks_exact(itemsize).enumerate() {
                    if writer.record.token_value(rec) == sep {
                        cut((i + 1) * itemsize, writer, &mut doc_open)?;
                    }
                }
            }
            Split::Ends(ends) => {
                while let Some(&e) = ends.get(next_end) {
                    if e > base + records {
                        break;
                    }
                    let local = e.saturating_sub(base) as usize * itemsize;
                    cut(local, writer, &mut doc_open)?;
                    next_end += 1;
                }
            }
        }
        if start < want {
            if !doc_open {
                writer.begin_doc(None)?;
                doc_open = true;
            }
            writer.write_doc_records(&buf[start..want], Seg::Doc)?;
        }
        base += records;
    }
    if doc_open {
        writer.end_doc()?;
    }
    Ok(())
}

/// Where the documents of a records file end.
#[derive(Clone, Copy, Debug)]
pub(super) enum Split<'a> {
    /// After every record equal to this token (`--doc-sep`); `None`: the file is one document.
    Sep(Option<i128>),
    /// At these record counts from the file's start (non-decreasing; the format's own index
    /// or a `--doc-start` scan).
    Ends(&'a [u64]),
}

/// Which metadata a run of records carries.
#[derive(Clone, Copy)]
pub(super) enum Seg<'a> {
    /// The document's own metadata.
    Doc,
    /// A span's metadata (JSON text).
    Span(&'a str),
}

/// The content hash and the block checksums of one document file, fed together.
#[derive(Clone, Debug)]
struct DocHasher {
    content: ContentHasher,
    blocks: BlockSums,
}

impl Default for DocHasher {
    fn default() -> Self {
        DocHasher {
            content: ContentHasher::new(),
            blocks: BlockSums::with_block(checksum::DOC_BLOCK),
        }
    }
}

impl DocHasher {
    fn update(&mut self, bytes: &[u8]) {
        self.content.update(bytes);
        self.blocks.update(bytes);
    }

    fn finish(&self) -> u64 {
        self.content.finish()
    }
}

/// The files of the shard being written.
struct OpenShard {
    index: usize,
    name: String,
    tmp: PathBuf,
    file: BufWriter<File>,
    hasher: ContentHasher,
    sums: BlockSums,
    bytes: u64,
    docs: Option<OpenDocs>,
}

/// The document files of the shard being written.
struct OpenDocs {
    ids: BufWriter<File>,
    index: BufWriter<File>,
    meta: BufWriter<File>,
    docs: BufWriter<File>,
    /// Per file, in the order of [`DocFile::ALL`] (indexed by [`DocFile::index`]).
    tmps: [PathBuf; 4],
    names: [String; 4],
    hashers: [DocHasher; 4],
    entries: u64,
    meta_bytes: u64,
    documents: u64,
    /// Dataset-wide entry number -> shard-local id, for the entries of the open document.
    local: HashMap<u64, u32>,
}

/// The document being written.
struct OpenDoc {
    id: u64,
    meta: String,
    entry: u64,
    start: Option<(u64, usize, u32)>,
    spans: u64,
}

pub(super) struct Writer {
    dir: PathBuf,
    pack_id: String,
    pub(super) record: RecordType,
    itemsize: u64,
    shard_bytes: u64,
    has_docs: bool,
    pub(super) max_entries: u64,
    shards: Vec<ShardEntry>,
    current: Option<OpenShard>,
    /// Docs records of documents that started in a finished shard and are still open.
    pending_docs: Vec<(usize, Vec<u8>)>,
    /// Running hashes of each finished shard's document files (ids, index, meta, docs).
    doc_hashers: Vec<[DocHasher; 4]>,
    next_record: u64,
    next_doc: u64,
    next_entry: u64,
    doc: Option<OpenDoc>,
    metadata: bool,
    pub(super) written: Written,
    pub(super) progress: Option<indicatif::ProgressBar>,
    started: Instant,
}

impl Writer {
    pub(super) fn new(dir: &Path, record: RecordType, shard_bytes: u64, has_docs: bool) -> Writer {
        Writer {
            dir: dir.to_path_buf(),
            pack_id: new_pack_id(),
            itemsize: record.itemsize() as u64,
            record,
            shard_bytes,
            has_docs,
            max_entries: MAX_ENTRIES,
            shards: Vec::new(),
            current: None,
            pending_docs: Vec::new(),
            doc_hashers: Vec::new(),
            next_record: 0,
            next_doc: 0,
            next_entry: 0,
            doc: None,
            metadata: false,
            written: Written::default(),
            progress: None,
            started: Instant::now(),
        }
    }

    fn create(&mut self, name: &str) -> Result<(PathBuf, BufWriter<File>)> {
        let tmp = self.dir.join(format!("{name}.tmp"));
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| Error::io(&tmp, e))?;
        self.written.files.push(tmp.clone());
        Ok((tmp, BufWriter::with_capacity(1 << 20, f)))
    }

    /// The shard being written, opened on demand.
    fn shard(&mut self) -> Result<&mut OpenShard> {
        if self.current.is_none() {
            let index = self.shards.len();
            let name = shard_name(&self.pack_id, index);
            let stem = name.trim_end_matches(".bin").to_string();
            let (tmp, file) = self.create(&name)?;
            let docs = if self.has_docs {
                let names = DocFile::ALL.map(|f| format!("{stem}.{}", f.ext()));
                let mut files = Vec::new();
                let mut tmps = Vec::new();
                for n in &names {
                    let (t, f) = self.create(n)?;
                    tmps.push(t);
                    files.push(f);
                }
                let mut files = files.into_iter();
                let mut next = || files.next().expect("four files");
                Some(OpenDocs {
                    ids: next(),
                    index: next(),
                    meta: next(),
                    docs: next(),
                    tmps: tmps.try_into().expect("four paths"),
                    names,
                    hashers: Default::default(),
                    entries: 0,
                    meta_bytes: 0,
                    documents: 0,
                    local: HashMap::new(),
                })
            } else {
                None
            };
            self.current = Some(OpenShard {
                index,
                name,
                tmp,
                file,
                hasher: ContentHasher::new(),
                sums: BlockSums::new(),
                bytes: 0,
                docs,
            });
        }
        Ok(self.current.as_mut().expect("just opened"))
    }

    /// Appends as many of `bytes` (whole records) as the current shard has room for;
    /// returns how many bytes it took and whether the shard is now full.
    fn append_records(&mut self, bytes: &[u8]) -> Result<(usize, bool)> {
        let shard_bytes = self.shard_bytes;
        let shard = self.shard()?;
        let take = ((shard_bytes - shard.bytes) as usize).min(bytes.len());
        shard
            .file
            .write_all(&bytes[..take])
            .map_err(|e| Error::io(&shard.tmp, e))?;
        shard.hasher.update(&bytes[..take]);
        shard.sums.update(&bytes[..take]);
        shard.bytes += take as u64;
        let full = shard.bytes == shard_bytes;
        self.next_record += take as u64 / self.itemsize;
        Ok((take, full))
    }

    fn write_plain(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let (take, full) = self.append_records(bytes)?;
            bytes = &bytes[take..];
            if full {
                self.finish_shard()?;
            }
        }
        Ok(())
    }

    pub(super) fn begin_doc(&mut self, meta: Option<&str>) -> Result<()> {
        if meta.is_some_and(|m| m != "null") {
            self.metadata = true;
        }
        let entry = self.next_entry;
        self.next_entry += 1;
        self.doc = Some(OpenDoc {
            id: self.next_doc,
            meta: meta.unwrap_or("null").to_string(),
            entry,
            start: None,
            spans: 0,
        });
        self.next_doc += 1;
        Ok(())
    }

    /// The shard-local id of a dataset-wide entry, registering it in the current shard.
    fn local_entry(&mut self, entry: u64, doc: u64, meta: &str) -> Result<u32> {
        let max_entries = self.max_entries;
        let shard = self.shard()?;
        let docs = shard.docs.as_mut().expect("document shard");
        if let Some(&id) = docs.local.get(&entry) {
            return Ok(id);
        }
        if docs.entries >= max_entries && shard.bytes > 0 {
            // Shard-local ids are u32: start a new shard before they overflow. The open
            // document's entries are registered again there.
            self.finish_shard()?;
            return self.local_entry(entry, doc, meta);
        }
        let shard = self.current.as_mut().expect("open shard");
        let docs = shard.docs.as_mut().expect("document shard");
        let id = docs.entries as u32;
        let mut bytes = Vec::with_capacity(ENTRY_HEADER as usize + meta.len());
        let meta = meta.as_bytes();
        Entry { doc, entry, meta }.encode(&mut bytes);
        let offset = docs.meta_bytes.to_le_bytes();
        docs.index
            .write_all(&offset)
            .and_then(|()| docs.meta.write_all(&bytes))
            .map_err(|e| Error::io(&docs.tmps[DocFile::Meta.index()], e))?;
        docs.hashers[DocFile::Index.index()].update(&offset);
        docs.hashers[DocFile::Meta.index()].update(&bytes);
        docs.meta_bytes += bytes.len() as u64;
        docs.entries += 1;
        docs.local.insert(entry, id);
        Ok(id)
    }

    pub(super) fn write_doc_records(&mut self, mut bytes: &[u8], seg: Seg<'_>) -> Result<()> {
        let mut doc = self.doc.take().expect("an open document");
        let (entry, meta) = match seg {
            Seg::Doc => (doc.entry, doc.meta.clone()),
            Seg::Span(m) => {
                if m != "null" {
                    self.metadata = true;
                }
                doc.spans += 1;
                // Spans get entry numbers after their document's.
                let e = self.next_entry;
                self.next_entry += 1;
                (e, m.to_string())
            }
        };
        let result = (|| {
            while !bytes.is_empty() {
                if doc.start.is_none() {
                    let doc_entry = self.local_entry(doc.entry, doc.id, &doc.meta)?;
                    let index = self.shard()?.index;
                    doc.start = Some((self.next_record, index, doc_entry));
                }
                let id = self.local_entry(entry, doc.id, &meta)?;
                let (take, full) = self.append_records(bytes)?;
                let docs = self
                    .current
                    .as_mut()
                    .and_then(|s| s.docs.as_mut())
                    .expect("document shard");
                let ids: Vec<u8> =
                    std::iter::repeat_n(id.to_le_bytes(), take / self.itemsize as usize)
                        .flatten()
                        .collect();
                docs.ids
                    .write_all(&ids)
                    .map_err(|e| Error::io(&docs.tmps[DocFile::Ids.index()], e))?;
                docs.hashers[DocFile::Ids.index()].update(&ids);
                bytes = &bytes[take..];
                if full {
                    self.finish_shard()?;
                }
            }
            Ok(())
        })();
        self.doc = Some(doc);
        result
    }

    pub(super) fn end_doc(&mut self) -> Result<()> {
        let doc = self.doc.take().expect("an open document");
        let (start, shard_index, entry) = doc.start.expect("documents are not empty");
        let rec = DocRecord {
            start,
            len: self.next_record - start,
            entry: u64::from(entry),
        }
        .encode()
        .to_vec();
        match self.current.as_mut().filter(|s| s.index == shard_index) {
            Some(shard) => {
                let docs = shard.docs.as_mut().expect("document shard");
                docs.docs
                    .write_all(&rec)
                    .map_err(|e| Error::io(&docs.tmps[DocFile::Docs.index()], e))?;
                docs.hashers[DocFile::Docs.index()].update(&rec);
                docs.documents += 1;
                docs.local.clear();
            }
            None => {
                // The document started in a shard that is already finished.
                self.pending_docs.push((shard_index, rec));
                self.flush_pending_docs()?;
                if let Some(docs) = self.current.as_mut().and_then(|s| s.docs.as_mut()) {
                    docs.local.clear();
                }
            }
        }
        if let Some(bar) = &self.progress
            && doc.id.is_multiple_of(1024)
        {
            let secs = self.started.elapsed().as_secs_f64().max(1e-9);
            bar.set_message(format!(
                "{} documents, {} tokens, {:.0} MB/s",
                doc.id + 1,
                self.next_record,
                (self.next_record * self.itemsize) as f64 / secs / 1e6
            ));
        }
        Ok(())
    }

    /// Appends docs records of documents that ended after their start shard was finished.
    fn flush_pending_docs(&mut self) -> Result<()> {
        for (index, rec) in std::mem::take(&mut self.pending_docs) {
            let entry = &mut self.shards[index];
            let d = entry.docs.as_mut().expect("document shard");
            let path = self.dir.join(&d.docs);
            let mut f = OpenOptions::new()
                .append(true)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            f.write_all(&rec).map_err(|e| Error::io(&path, e))?;
            f.sync_all().map_err(|e| Error::io(&path, e))?;
            d.documents += 1;
            self.doc_hashers[index][DocFile::Docs.index()].update(&rec);
        }
        Ok(())
    }

    fn finish_shard(&mut self) -> Result<()> {
        let Some(shard) = self.current.take() else {
            return Ok(());
        };
        let sync = |mut w: BufWriter<File>, path: &Path| -> Result<()> {
            w.flush().map_err(|e| Error::io(path, e))?;
            w.get_ref().sync_all().map_err(|e| Error::io(path, e))
        };
        sync(shard.file, &shard.tmp)?;
        let path = self.dir.join(&shard.name);
        fs::rename(&shard.tmp, &path).map_err(|e| Error::io(&path, e))?;
        self.written.files.push(path);
        let sums_name = format!("{}.sums", shard.name.trim_end_matches(".bin"));
        let encoded = checksum::encode(&shard.sums.finish());
        let (sums_tmp, mut sums_file) = self.create(&sums_name)?;
        sums_file
            .write_all(&encoded)
            .map_err(|e| Error::io(&sums_tmp, e))?;
        sync(sums_file, &sums_tmp)?;
        let sums_path = self.dir.join(&sums_name);
        fs::rename(&sums_tmp, &sums_path).map_err(|e| Error::io(&sums_path, e))?;
        self.written.files.push(sums_path);
        let checksums = Some(ShardChecksums {
            file: sums_name,
            block: checksum::BLOCK,
            hash: format::format_hash(checksum::file_hash(&encoded)),
        });
        let docs = match shard.docs {
            None => None,
            Some(mut d) => {
                let end = d.meta_bytes.to_le_bytes();
                d.index
                    .write_all(&end)
                    .map_err(|e| Error::io(&d.tmps[DocFile::Index.index()], e))?;
                d.hashers[DocFile::Index.index()].update(&end);
                let [t0, t1, t2, t3] = d.tmps.clone();
                sync(d.ids, &t0)?;
                sync(d.index, &t1)?;
                sync(d.meta, &t2)?;
                sync(d.docs, &t3)?;
                for (tmp, name) in d.tmps.iter().zip(&d.names) {
                    let path = self.dir.join(name);
                    fs::rename(tmp, &path).map_err(|e| Error::io(&path, e))?;
                    self.written.files.push(path);
                }
                self.doc_hashers.push(d.hashers.clone());
                let [ids, index, meta, docs] = d.names;
                Some(ShardDocs {
                    ids: Some(ids),
                    index: Some(index),
                    meta: Some(meta),
                    entries: d.entries,
                    meta_bytes: d.meta_bytes,
                    docs,
                    documents: d.documents,
                    hash: String::new(),
                    checksums: None,
                })
            }
        };
        debug!("wrote {} ({} bytes)", shard.name, shard.bytes);
        self.shards.push(ShardEntry {
            path: shard.name,
            records: shard.bytes / self.itemsize,
            bytes: shard.bytes,
            hash: format::format_hash(shard.hasher.finish()),
            offset: 0,
            source_format: None,
            etag: None,
            docs,
            in_place_mtime_ns: None,
            in_place_guard: None,
            checksums,
        });
        Ok(())
    }

    /// Finishes the last shard; returns the shards, the document count and whether any
    /// metadata was seen.
    pub(super) fn finish(&mut self) -> Result<(Vec<ShardEntry>, Option<u64>, bool)> {
        self.finish_shard()?;
        if self.shards.is_empty() {
            return Err(Error::invalid("the inputs hold no tokens"));
        }
        // Document-file hashes cover the files as finally written (some docs records were
        // appended after their shard was finished): the hash of the four files' hashes.
        // Their block checksums too: one file per shard, the checksums of .ids, .idx, .meta
        // and .docs one after the other.
        // Without metadata the dataset takes the compact form (`format::ShardDocs`): the
        // .docs files alone, O(documents); the per-record .ids and the entry files go.
        let compact = self.has_docs && !self.metadata;
        for i in 0..self.shards.len().min(self.doc_hashers.len()) {
            let mut hashers = self.doc_hashers[i].to_vec();
            let Some(d) = self.shards[i].docs.as_mut() else {
                continue;
            };
            if compact {
                for name in [d.ids.take(), d.index.take(), d.meta.take()]
                    .into_iter()
                    .flatten()
                {
                    let path = self.dir.join(&name);
                    fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
                    self.written.files.retain(|f| *f != path);
                }
                (d.entries, d.meta_bytes) = (0, 0);
                hashers.drain(..DocFile::Docs.index());
            }
            let d = &self.shards[i].docs.as_ref().expect("checked above");
            let mut h = ContentHasher::new();
            for file in &hashers {
                h.update(&file.finish().to_le_bytes());
            }
            let sums: Vec<u64> = hashers.iter().flat_map(|f| f.blocks.finish()).collect();
            let encoded = checksum::encode(&sums);
            let stem = d.docs.strip_suffix(".docs").unwrap_or(&d.docs);
            let name = format!("{stem}.docsums");
            let (tmp, mut file) = self.create(&name)?;
            file.write_all(&encoded).map_err(|e| Error::io(&tmp, e))?;
            file.flush().map_err(|e| Error::io(&tmp, e))?;
            file.get_ref().sync_all().map_err(|e| Error::io(&tmp, e))?;
            let path = self.dir.join(&name);
            fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
            self.written.files.push(path);
            let d = self.shards[i].docs.as_mut().expect("checked above");
            d.hash = format::format_hash(h.finish());
            d.checksums = Some(ShardChecksums {
                file: name,
                block: checksum::DOC_BLOCK,
                hash: format::format_hash(checksum::file_hash(&encoded)),
            });
        }
        // The renames must be durable before a manifest can reference them.
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(&self.dir, e))?;
        let documents = self.has_docs.then_some(self.next_doc);
        Ok((std::mem::take(&mut self.shards), documents, self.metadata))
    }
}

/// An id unique to one pack run (time and process id, mixed), 8 hex digits.
pub(super) fn new_pack_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let id = crate::shuffle::feistel::mix(nanos ^ (u64::from(std::process::id()) << 40));
    format!("{:08x}", id >> 32)
}

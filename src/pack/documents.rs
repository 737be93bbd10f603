//! Documents without copying tokens: the document boundaries of in-place inputs, from the
//! format's own index (Megatron-LM `.idx`, datatrove `.ds.index`) or from a separator scan
//! (`--doc-sep`, `--doc-start`), written as compact docs files (`format::ShardDocs`, compact
//! form: one 24-byte record per document, O(documents) bytes, never a per-token file).
//!
//! [`CompactDocs`] takes boundaries in stream order and streams the records out, one file
//! per shard, so memory stays O(1) whatever the number of documents. Documents never span
//! input files (as a copy with `--doc-sep` splits them), and an empty document (two equal
//! boundaries: an empty Megatron document, an empty datatrove document) has no record: the
//! documents shufflefs numbers are the non-empty ones, in stream order.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::Written;
use super::formats::datatrove::DatatroveFile;
use super::formats::doc_scan::{self, Rule, Tail};
use super::formats::megatron::{MegatronIndex, Unit};
use crate::error::{Error, Result};
use crate::format::docfiles::DocRecord;
use crate::format::dtype::ScalarType;
use crate::format::{ContentHasher, ShardDocs, format_hash};
use crate::storage::remote;

/// Where an input's document boundaries come from, besides a separator scan.
#[derive(Debug)]
pub(super) enum Native {
    /// No index: the input is one document, or a separator scan finds them.
    None,
    /// A Megatron-LM `.idx` (open), and what a document is.
    Megatron(MegatronIndex, File, Unit),
    /// A datatrove `.ds.index` (open).
    Datatrove(DatatroveFile, File),
}

impl Native {
    /// `ShardEntry::source_format` of an input with this index, if it has one.
    pub(super) fn source_format(&self) -> Option<&'static str> {
        match self {
            Native::None => None,
            Native::Megatron(..) => Some("megatron"),
            Native::Datatrove(..) => Some("datatrove"),
        }
    }
}

/// The separator rule of `--doc-sep` (with `--doc-bos`) or `--doc-start`, if one was given.
/// Tokens after the last separator are one more document (as a copy makes them).
pub(super) fn scan_rule(
    doc_sep: Option<i128>,
    doc_start: Option<i128>,
    doc_bos: Option<i128>,
) -> Result<Option<Rule>> {
    let id = |v: i128, flag: &str| {
        u64::try_from(v).map_err(|_| Error::invalid(format!("{flag} {v}: token ids are >= 0")))
    };
    let tail = Tail::Document;
    Ok(match (doc_sep, doc_start, doc_bos) {
        (Some(_), Some(_), _) => {
            return Err(Error::invalid("give --doc-sep or --doc-start, not both"));
        }
        (None, _, Some(_)) => return Err(Error::invalid("--doc-bos goes with --doc-sep")),
        (Some(sep), None, None) => Some(Rule::EosEnds {
            eos: id(sep, "--doc-sep")?,
            tail,
        }),
        (Some(sep), None, Some(bos)) => Some(Rule::EosBeforeBos {
            eos: id(sep, "--doc-sep")?,
            bos: id(bos, "--doc-bos")?,
            tail,
        }),
        (None, Some(bos), None) => Some(Rule::BosStarts {
            bos: id(bos, "--doc-start")?,
        }),
        (None, None, None) => None,
    })
}

/// Calls `f` with the end of every document of one input of `records` tokens (exclusive,
/// relative to the input's first token), in order; the last is `records`.
pub(super) fn for_each_end(
    native: &Native,
    scan: Option<(Rule, ScalarType)>,
    (path, offset, records): (&Path, u64, u64),
    mut f: impl FnMut(u64) -> Result<()>,
) -> Result<()> {
    match native {
        Native::Megatron(index, idx, unit) => index.for_each_end(idx, *unit, &mut f)?,
        Native::Datatrove(file, index) => file.for_each_end(index, &mut f)?,
        Native::None => {
            if let Some((rule, dtype)) = scan {
                let file: Box<dyn crate::storage::ReadAt> = if remote::is_remote(path) {
                    Box::new(super::remote_inputs::pinned(path)?)
                } else {
                    Box::new(File::open(path).map_err(|e| Error::io(path, e))?)
                };
                let found = doc_scan::scan(&*file, path, offset, records, dtype, rule)?;
                for &e in &found.ends {
                    f(e)?;
                }
            }
        }
    }
    f(records)
}

/// Writes the compact docs files of a dataset's shards from its document boundaries.
pub(super) struct CompactDocs<'a> {
    dir: PathBuf,
    /// The docs file name of each shard.
    names: Vec<String>,
    /// The first record of each shard, and the stream's end.
    shard_starts: Vec<u64>,
    total: u64,
    /// The shard whose file is open, and the file.
    current: usize,
    file: Option<Open>,
    /// The finished shards' entries.
    done: Vec<ShardDocs>,
    /// Where the open document started.
    open_start: u64,
    written: &'a mut Written,
}

/// A docs file being written.
struct Open {
    path: PathBuf,
    out: BufWriter<File>,
    hasher: ContentHasher,
    documents: u64,
}

impl<'a> CompactDocs<'a> {
    /// A writer for shards of `shard_records` records each, their docs files named `names`
    /// inside `dir`.
    pub(super) fn new(
        dir: &Path,
        names: Vec<String>,
        shard_records: &[u64],
        written: &'a mut Written,
    ) -> CompactDocs<'a> {
        let mut shard_starts = Vec::with_capacity(shard_records.len());
        let mut total = 0u64;
        for &n in shard_records {
            shard_starts.push(total);
            total += n;
        }
        CompactDocs {
            dir: dir.to_path_buf(),
            names,
            shard_starts,
            total,
            current: 0,
            file: None,
            done: Vec::new(),
            open_start: 0,
            written,
        }
    }

    /// A document boundary at stream record `record`: the open document ends and the next
    /// starts there. Boundaries must not decrease; a repeated one (an empty document) adds
    /// nothing.
    pub(super) fn boundary(&mut self, record: u64) -> Result<()> {
        if record > self.total {
            return Err(Error::invalid(format!(
                "document boundary at record {record} is past the end of the stream ({})",
                self.total
            )));
        }
        if record <= self.open_start {
            return Ok(());
        }
        let (start, len) = (self.open_start, record - self.open_start);
        self.open_start = record;
        let shard = self.shard_starts.partition_point(|&s| s <= start) - 1;
        while self.current < shard {
            self.close()?;
        }
        if self.file.is_none() {
            let open = self.open(self.current)?;
            self.file = Some(open);
        }
        let open = self.file.as_mut().expect("opened above");
        let rec = DocRecord {
            start,
            len,
            entry: 0,
        }
        .encode();
        open.out
            .write_all(&rec)
            .map_err(|e| Error::io(&open.path, e))?;
        open.hasher.update(&rec);
        open.documents += 1;
        Ok(())
    }

    /// Ends the last document at the end of the stream and closes every file; returns each
    /// shard's `ShardDocs` (compact form) and the number of documents.
    pub(super) fn finish(mut self) -> Result<(Vec<ShardDocs>, u64)> {
        self.boundary(self.total)?;
        while self.current < self.names.len() {
            self.close()?;
        }
        let documents = self.done.iter().map(|d| d.documents).sum();
        Ok((self.done, documents))
    }

    fn open(&mut self, shard: usize) -> Result<Open> {
        let path = self.dir.join(&self.names[shard]);
        let file = File::create_new(&path).map_err(|e| Error::io(&path, e))?;
        self.written.files.push(path.clone());
        Ok(Open {
            path,
            out: BufWriter::new(file),
            hasher: ContentHasher::new(),
            documents: 0,
        })
    }

    /// Finishes the current shard's file (an empty one when no document starts in it).
    fn close(&mut self) -> Result<()> {
        let open = match self.file.take() {
            Some(open) => open,
            None => self.open(self.current)?,
        };
        let file = open
            .out
            .into_inner()
            .map_err(|e| Error::io(&open.path, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&open.path, e))?;
        // The compact form's hash: over the docs file's hash alone.
        let mut h = ContentHasher::new();
        h.update(&open.hasher.finish().to_le_bytes());
        self.done.push(ShardDocs {
            ids: None,
            index: None,
            meta: None,
            entries: 0,
            meta_bytes: 0,
            docs: self.names[self.current].clone(),
            documents: open.documents,
            hash: format_hash(h.finish()),
            checksums: None,
        });
        self.current += 1;
        Ok(())
    }
}

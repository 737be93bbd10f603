//! `shufflefs pack`: concatenate input files into shards plus a manifest.
//!
//! Inputs, in the order given, make one record stream:
//! - raw headerless little-endian record files (nanoGPT `train.bin` style);
//! - `.npy` arrays, 1-D, plain or structured (recognised by numpy's magic, whatever the name);
//! - llm.c token shards (recognised by their header, whatever the name): the tokens after the
//!   1,024-byte header, of the type the header names;
//! - JSON Lines documents (`.jsonl`/`.ndjson`): `{"tokens": [...], "meta": ..., "spans": [...]}`.
//!
//! Files are checked before anything is written, the same way for a copy and `--in-place`
//! (existence, regular file, what the file is (sniff.rs: known non-token formats are refused
//! saying what to do), size a multiple of the record size, `.npy` header, dtype and shape, the
//! llm.c token count, and a raw file's sampled content against `--dtype`'s width). JSON Lines are validated while they are
//! written; any error names the file and line and removes everything written. Shards are
//! written under temporary names, fsynced and renamed to names unique to this pack run; the
//! directory is fsynced, then the manifest is written last the same way. Until the manifest's
//! rename the directory holds no new dataset, so a crashed or failed pack never leaves
//! something that mounts, and `--force` replaces a dataset atomically (its old shards are
//! deleted only after the switch).
//!
//! Documents: when any input is JSON Lines or `--doc-sep` is given, every record belongs to a
//! document (a raw or `.npy` input without `--doc-sep` is one document), and each shard gets
//! document and metadata files (format.rs `ShardDocs`). Every span of records that shares
//! metadata is one *entry*; each record stores its shard-local entry id, and an entry that
//! continues into the next shard is written again there, so every shard is self-contained.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use log::debug;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::error::{Error, Result};
use crate::format::checksum::{self, BlockSums};
use crate::format::docfiles::{DocFile, DocRecord, ENTRY_HEADER, Entry};
use crate::format::dtype::{RecordType, ScalarType};
use crate::format::npy;
use crate::format::sniff::{self, Kind};
use crate::format::{
    self, ContentHasher, FORMAT_NAME, MANIFEST, Manifest, ShardChecksums, ShardDocs, ShardEntry,
    VERSION, shard_name,
};

/// Default shard size bound: 1 GiB.
pub(crate) const DEFAULT_SHARD_SIZE: u64 = 1 << 30;

/// Copy buffer size: large enough to stream at disk speed, small enough to stay cheap.
const CHUNK: usize = 8 << 20;

/// Entries per shard are addressed by u32 ids.
const MAX_ENTRIES: u64 = 1 << 32;

/// Options of `shufflefs pack`.
#[derive(Clone, Debug)]
pub struct PackOptions {
    /// The token type (`--dtype`); required unless an `.npy` or llm.c input defines the record
    /// type.
    pub dtype: Option<ScalarType>,
    /// Upper bound of a shard's size in bytes (rounded down to whole records).
    pub shard_size: u64,
    /// Replace an existing dataset in the directory, and pack inputs the heuristic checks
    /// refuse (text, a raw file that looks like another token width).
    pub force: bool,
    /// End a document after every record whose token equals this value.
    pub doc_sep: Option<i128>,
    /// Show a progress bar on stderr when it is a terminal.
    pub progress: bool,
    /// Metadata entries per shard before pack starts a new shard (default and maximum 2^32,
    /// the range of the u32 ids; smaller values exist for tests).
    pub max_entries_per_shard: Option<u64>,
}

impl Default for PackOptions {
    fn default() -> Self {
        PackOptions {
            dtype: None,
            shard_size: DEFAULT_SHARD_SIZE,
            force: false,
            doc_sep: None,
            progress: false,
            max_entries_per_shard: None,
        }
    }
}

/// Parses a byte size: a number with an optional binary suffix (`K`/`KiB`, `M`/`MiB`,
/// `G`/`GiB`, `T`/`TiB`, case-insensitive) or `B`.
pub(crate) fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        _ => return Err(bad_size(text)),
    };
    let n: u64 = digits.parse().map_err(|_| bad_size(text))?;
    n.checked_mul(1u64 << shift).ok_or_else(|| bad_size(text))
}

fn bad_size(text: &str) -> Error {
    Error::invalid(format!(
        "invalid size {text:?}: use bytes with an optional suffix, e.g. 1GiB, 512MiB, 4096"
    ))
}

/// One checked input.
#[derive(Debug)]
enum Input {
    /// Records at `[offset, offset + bytes)` of a raw, `.npy` or llm.c file.
    Records {
        path: PathBuf,
        offset: u64,
        bytes: u64,
        kind: Kind,
    },
    /// A JSON Lines file of documents.
    Jsonl { path: PathBuf },
}

fn is_jsonl(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("jsonl") || e.eq_ignore_ascii_case("ndjson"))
}

/// Checks every input (the same checks for a copy and `--in-place`); returns them with the
/// dataset's record type: `--dtype`, else the type the first `.npy` or llm.c input defines.
fn check_inputs(inputs: &[PathBuf], options: &PackOptions) -> Result<(Vec<Input>, RecordType)> {
    if inputs.is_empty() {
        return Err(Error::invalid("no INPUT files given"));
    }
    let mut record = options.dtype.map(RecordType::scalar);
    // The first .npy or llm.c input may define the record type for the others.
    if record.is_none() {
        for p in inputs.iter().filter(|p| !is_jsonl(p)) {
            if let Ok(Input::Records { .. }) = check_input(p, &mut record, options)
                && record.is_some()
            {
                break;
            }
        }
    }
    let checked: Vec<Input> = inputs
        .iter()
        .map(|p| check_input(p, &mut record, options))
        .collect::<Result<_>>()?;
    let record = record.ok_or_else(|| Error::invalid("--dtype is required"))?;
    Ok((checked, record))
}

/// Checks one input: what it is (sniff.rs; a file that holds no token records is refused
/// saying what it is and what to do), that its records fit `record`, the dataset's record
/// type once known (an `.npy` or llm.c input defines it when nothing did), and that a raw
/// input does not look like tokens of another width than `--dtype` (`--force` skips the
/// heuristic checks).
fn check_input(
    path: &Path,
    record: &mut Option<RecordType>,
    options: &PackOptions,
) -> Result<Input> {
    let at = |msg: String| Error::invalid(format!("{}: {msg}", path.display()));
    // metadata before open: opening a FIFO would block.
    let meta = fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(at("not a regular file".into()));
    }
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = meta.len();
    let kind = match sniff::sniff_file(path, &file, len).map_err(|e| Error::io(path, e))? {
        Ok(kind) => kind,
        Err(r) if r.heuristic && options.force => Kind::Raw,
        Err(r) => {
            let force = if r.heuristic {
                "; if these bytes really are token ids, pass --force"
            } else {
                ""
            };
            return Err(at(format!("{}: {}{force}", r.what, r.todo)));
        }
    };
    match kind {
        Kind::Jsonl => {
            match record {
                Some(r) if r.scalar_type().is_none_or(|t| !t.is_token_type()) => {
                    return Err(at(format!(
                        "JSON Lines documents need an integer token dtype, but the dataset's \
                         records are {}",
                        r.manifest_descr()
                    )));
                }
                Some(_) => {}
                None => return Err(at("JSON Lines input needs --dtype (the token type)".into())),
            }
            Ok(Input::Jsonl {
                path: path.to_path_buf(),
            })
        }
        Kind::Raw => {
            let Some(r) = record.as_ref() else {
                return Err(at("raw input needs --dtype (the token type)".into()));
            };
            let itemsize = r.itemsize() as u64;
            if len % itemsize != 0 {
                return Err(at(format!(
                    "{len} bytes is not a whole number of {} records ({itemsize} bytes each); \
                     is --dtype right?",
                    r.manifest_descr()
                )));
            }
            if let Some(t) = r.scalar_type()
                && !options.force
                && let Some(g) = sniff::width(&file, 0, len, t).map_err(|e| Error::io(path, e))?
            {
                let like = g.looks_like;
                return Err(at(format!(
                    "read as {t}, {}: this looks like {like} tokens; pass --dtype {like}, or \
                     --force if {t} is right",
                    g.evidence
                )));
            }
            Ok(Input::Records {
                path: path.to_path_buf(),
                offset: 0,
                bytes: len,
                kind,
            })
        }
        Kind::Llmc {
            magic,
            version,
            dtype,
            tokens,
        } => {
            let what = format!("llm.c shard of {dtype} tokens (magic {magic}, version {version})");
            if let Some(flag) = options.dtype
                && flag != dtype
            {
                return Err(at(format!(
                    "{what} but --dtype is {flag}: leave --dtype out (the header defines the \
                     token type)"
                )));
            }
            let found = RecordType::scalar(dtype);
            match record {
                None => *record = Some(found),
                Some(want) if *want != found => {
                    return Err(at(format!(
                        "{what} but the dataset's records are {} (defined by an earlier \
                         input): pack them into separate datasets",
                        want.manifest_descr()
                    )));
                }
                Some(_) => {}
            }
            Ok(Input::Records {
                path: path.to_path_buf(),
                offset: sniff::LLMC_HEADER,
                bytes: tokens * dtype.size() as u64,
                kind,
            })
        }
        Kind::Npy => check_npy(path, &mut file, len, record),
    }
}

/// Checks a `.npy` input: a 1-D array (Fortran order is refused for more dimensions) of a
/// record type pack supports, whose header promises exactly the bytes the file holds.
fn check_npy(
    path: &Path,
    file: &mut File,
    len: u64,
    record: &mut Option<RecordType>,
) -> Result<Input> {
    let at = |msg: String| Error::invalid(format!("{}: {msg}", path.display()));
    let mut head = Vec::with_capacity(4096);
    file.take(65536 + 16)
        .read_to_end(&mut head)
        .map_err(|e| Error::io(path, e))?;
    let header = npy::parse_header(&head).map_err(|e| at(e.to_string()))?;
    if header.descr.trim_start_matches(['|', '<', '>', '=']) == "O" {
        return Err(at(
            "array of Python objects (dtype object), not token ids: convert it with \
             np.save(FILE, np.asarray(arr, dtype='uint32'))"
                .into(),
        ));
    }
    let found = RecordType::from_descr(&header.descr).map_err(|e| {
        at(format!(
            "array dtype {} cannot be packed: {e}",
            header.descr
        ))
    })?;
    match record {
        None => *record = Some(found.clone()),
        Some(want) if *want != found => {
            let hint = match found.scalar_type() {
                Some(t) if t.is_token_type() => format!("pass --dtype {t} or convert"),
                _ => "convert".to_string(),
            };
            return Err(at(format!(
                "array dtype is {} ({}) but the dataset's records are {}: {hint} with \
                 arr.astype({:?})",
                found
                    .scalar_type()
                    .map_or_else(|| "structured".to_string(), |t| t.to_string()),
                header.descr,
                want.manifest_descr(),
                want.manifest_descr()
            )));
        }
        Some(_) => {}
    }
    if header.fortran_order && header.shape.len() > 1 {
        return Err(at(format!(
            "Fortran-order array of shape {:?}; pack takes 1-D arrays: save it as one with \
             np.save(FILE, np.ascontiguousarray(arr).reshape(-1))",
            header.shape
        )));
    }
    let [count] = header.shape[..] else {
        return Err(at(format!(
            "array has shape {:?}; pack takes 1-D arrays (flatten it with arr.reshape(-1))",
            header.shape
        )));
    };
    let itemsize = found.itemsize() as u64;
    let data_bytes = count
        .checked_mul(itemsize)
        .ok_or_else(|| at(format!("shape {count} overflows")))?;
    if header.data_offset.checked_add(data_bytes) != Some(len) {
        return Err(at(format!(
            "header promises {count} elements ({data_bytes} bytes after a {}-byte header) but \
             the file is {len} bytes: truncated or not a plain array",
            header.data_offset
        )));
    }
    Ok(Input::Records {
        path: path.to_path_buf(),
        offset: header.data_offset,
        bytes: data_bytes,
        kind: Kind::Npy,
    })
}

/// Everything a pack has put on disk so far, removed again if the pack fails.
#[derive(Default)]
struct Written {
    files: Vec<PathBuf>,
}

impl Written {
    fn cleanup(&self) {
        for f in &self.files {
            let _ = fs::remove_file(f);
        }
    }
}

/// Packs `inputs` into `dir`. Returns the manifest written.
pub fn pack(dir: &Path, inputs: &[PathBuf], options: &PackOptions) -> Result<Manifest> {
    let (checked, record) = check_inputs(inputs, options)?;
    let itemsize = record.itemsize() as u64;
    let shard_records = options.shard_size / itemsize;
    if shard_records == 0 {
        return Err(Error::invalid(format!(
            "--shard-size {} is smaller than one record ({itemsize} bytes)",
            options.shard_size
        )));
    }
    if let Some(sep) = options.doc_sep
        && record
            .token_type()
            .int_range()
            .is_none_or(|(lo, hi)| sep < lo || sep > hi)
    {
        return Err(Error::invalid(format!(
            "--doc-sep {sep} is not a {} value",
            record.token_type()
        )));
    }
    let has_docs =
        options.doc_sep.is_some() || checked.iter().any(|i| matches!(i, Input::Jsonl { .. }));
    if dir.exists() && !dir.is_dir() {
        return Err(Error::invalid(format!(
            "{}: DATASET_DIR exists and is not a directory (the dataset directory comes \
             first: shufflefs pack DATASET_DIR INPUT...)",
            dir.display()
        )));
    }
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let manifest_path = dir.join(MANIFEST);
    let old = if manifest_path.exists() {
        if !options.force {
            return Err(Error::invalid(format!(
                "{} already holds a dataset ({MANIFEST} exists): choose another directory or \
                 pass --force to replace it",
                dir.display()
            )));
        }
        crate::storage::read_manifest(dir).ok().map(|(m, _)| m)
    } else {
        None
    };
    let total_bytes: u64 = checked
        .iter()
        .map(|i| match i {
            Input::Records { bytes, .. } => *bytes,
            Input::Jsonl { path } => fs::metadata(path).map_or(0, |m| m.len()),
        })
        .fold(0u64, u64::saturating_add);
    let mut writer = Writer::new(dir, record.clone(), shard_records * itemsize, has_docs);
    writer.max_entries = options
        .max_entries_per_shard
        .unwrap_or(MAX_ENTRIES)
        .clamp(4, MAX_ENTRIES);
    writer.progress = options.progress.then(|| progress_bar(total_bytes));
    let result = write_all(&mut writer, &checked, options).and_then(|()| {
        let (shards, documents, metadata) = writer.finish()?;
        write_manifest(
            dir,
            shards,
            &record,
            documents,
            metadata,
            &mut writer.written,
        )
    });
    if let Some(bar) = &writer.progress {
        bar.finish_and_clear();
    }
    match &result {
        Ok(new) => {
            // The new manifest is in place: files only the old one referenced are garbage.
            if let Some(old) = old {
                let keep: std::collections::HashSet<&str> =
                    new.shards.iter().flat_map(shard_files).collect();
                // Files referenced in place belong to the user: never delete them (their
                // checksum files, in the dataset directory, are ours).
                let owned = old.shards.iter().flat_map(|s| {
                    let mut files = shard_files(s);
                    if s.in_place_mtime_ns.is_some() {
                        files.retain(|f| Some(*f) != Some(s.path.as_str()));
                    }
                    files
                });
                for f in owned {
                    if !keep.contains(&f) {
                        let _ = fs::remove_file(dir.join(f));
                    }
                }
            }
        }
        Err(_) => writer.written.cleanup(),
    }
    result
}

/// All file names of one shard.
fn shard_files(s: &ShardEntry) -> Vec<&str> {
    let mut v = vec![s.path.as_str()];
    if let Some(c) = &s.checksums {
        v.push(c.file.as_str());
    }
    if let Some(d) = &s.docs {
        v.extend([
            d.ids.as_str(),
            d.index.as_str(),
            d.meta.as_str(),
            d.docs.as_str(),
        ]);
        if let Some(c) = &d.checksums {
            v.push(c.file.as_str());
        }
    }
    v
}

fn progress_bar(total: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:30} {bytes}/{total_bytes} ({binary_bytes_per_sec}) {msg}",
        )
        .expect("valid template"),
    );
    bar
}

fn write_all(writer: &mut Writer, inputs: &[Input], options: &PackOptions) -> Result<()> {
    for input in inputs {
        match input {
            Input::Records {
                path,
                offset,
                bytes,
                ..
            } => write_records_file(writer, path, *offset, *bytes, options.doc_sep)?,
            Input::Jsonl { path } => write_jsonl(writer, path)?,
        }
    }
    Ok(())
}

fn write_records_file(
    writer: &mut Writer,
    path: &Path,
    offset: u64,
    bytes: u64,
    doc_sep: Option<i128>,
) -> Result<()> {
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| Error::io(path, e))?;
    let itemsize = writer.itemsize as usize;
    let per_chunk = (CHUNK / itemsize).max(1) * itemsize;
    let mut buf = vec![0u8; per_chunk];
    let mut left = bytes;
    let mut doc_open = false;
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
        // Split at separators: a document ends after each separator record.
        let mut start = 0;
        for (i, rec) in buf[..want].chunks_exact(itemsize).enumerate() {
            let ends = doc_sep.is_some_and(|sep| writer.record.token_value(rec) == sep);
            if ends {
                let end = (i + 1) * itemsize;
                if !doc_open {
                    writer.begin_doc(None)?;
                }
                writer.write_doc_records(&buf[start..end], Seg::Doc)?;
                writer.end_doc()?;
                doc_open = false;
                start = end;
            }
        }
        if start < want {
            if !doc_open {
                writer.begin_doc(None)?;
                doc_open = true;
            }
            writer.write_doc_records(&buf[start..want], Seg::Doc)?;
        }
    }
    if doc_open {
        writer.end_doc()?;
    }
    Ok(())
}

/// One JSON Lines document.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDoc<'a> {
    tokens: Vec<serde_json::Number>,
    #[serde(default, borrow)]
    meta: Option<&'a RawValue>,
    #[serde(default, borrow)]
    spans: Vec<JsonSpan<'a>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonSpan<'a> {
    start: u64,
    end: u64,
    #[serde(default, borrow)]
    meta: Option<&'a RawValue>,
}

fn write_jsonl(writer: &mut Writer, path: &Path) -> Result<()> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let token = writer.record.token_type();
    let (lo, hi) = token.int_range().expect("integer token type");
    let size = token.size();
    let mut line = String::new();
    let mut records = Vec::new();
    let mut number = 0u64;
    loop {
        line.clear();
        let n = reader
            .read_line(&mut line)
            .map_err(|e| Error::invalid(format!("{}:{}: {e}", path.display(), number + 1)))?;
        if n == 0 {
            return Ok(());
        }
        number += 1;
        if let Some(bar) = &writer.progress {
            bar.inc(n as u64);
        }
        let at = |why: String| Error::invalid(format!("{}:{number}: {why}", path.display()));
        if line.trim().is_empty() {
            return Err(at("empty line: every line must be one JSON document".into()));
        }
        if !line.trim_start().starts_with('{') {
            return Err(at(
                "not a valid document: expected a JSON object {\"tokens\": [...], ...}".into(),
            ));
        }
        let doc: JsonDoc<'_> = serde_json::from_str(&line).map_err(|e| {
            let why = e.to_string();
            if why.contains("missing field `tokens`") {
                at("missing \"tokens\" (each line is {\"tokens\": [...], \"meta\": ...})".into())
            } else {
                at(format!("not a valid document: {why}"))
            }
        })?;
        if doc.tokens.is_empty() {
            return Err(at(
                "\"tokens\" is empty: a document needs at least one token".into(),
            ));
        }
        records.clear();
        for (i, t) in doc.tokens.iter().enumerate() {
            let v = t
                .as_i128()
                .filter(|v| (lo..=hi).contains(v))
                .ok_or_else(|| {
                    at(format!(
                        "token {i} ({t}) is not a {token} value ({lo}..={hi})"
                    ))
                })?;
            records.extend_from_slice(&v.to_le_bytes()[..size]);
        }
        let len = doc.tokens.len() as u64;
        let mut prev_end = 0;
        for (i, s) in doc.spans.iter().enumerate() {
            if s.start >= s.end || s.end > len {
                return Err(at(format!(
                    "span {i} [{}, {}) is out of bounds: spans need start < end <= {len} \
                     (the number of tokens)",
                    s.start, s.end
                )));
            }
            if s.start < prev_end {
                return Err(at(format!(
                    "span {i} [{}, {}) overlaps or precedes the previous span: spans must be \
                     sorted and disjoint",
                    s.start, s.end
                )));
            }
            prev_end = s.end;
        }
        writer.begin_doc(doc.meta.map(RawValue::get))?;
        let mut pos = 0u64;
        for s in &doc.spans {
            if pos < s.start {
                writer.write_doc_records(
                    &records[(pos as usize) * size..(s.start as usize) * size],
                    Seg::Doc,
                )?;
            }
            let meta = s.meta.map_or("null", RawValue::get);
            writer.write_doc_records(
                &records[(s.start as usize) * size..(s.end as usize) * size],
                Seg::Span(meta),
            )?;
            pos = s.end;
        }
        if pos < len {
            writer.write_doc_records(&records[(pos as usize) * size..], Seg::Doc)?;
        }
        writer.end_doc()?;
    }
}

/// Which metadata a run of records carries.
#[derive(Clone, Copy)]
enum Seg<'a> {
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

struct Writer {
    dir: PathBuf,
    pack_id: String,
    record: RecordType,
    itemsize: u64,
    shard_bytes: u64,
    has_docs: bool,
    max_entries: u64,
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
    written: Written,
    progress: Option<indicatif::ProgressBar>,
    started: Instant,
}

impl Writer {
    fn new(dir: &Path, record: RecordType, shard_bytes: u64, has_docs: bool) -> Writer {
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

    fn begin_doc(&mut self, meta: Option<&str>) -> Result<()> {
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
            .map_err(|e| Error::io(&docs.tmps[2], e))?;
        docs.hashers[1].update(&offset);
        docs.hashers[2].update(&bytes);
        docs.meta_bytes += bytes.len() as u64;
        docs.entries += 1;
        docs.local.insert(entry, id);
        Ok(id)
    }

    fn write_doc_records(&mut self, mut bytes: &[u8], seg: Seg<'_>) -> Result<()> {
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
                    .map_err(|e| Error::io(&docs.tmps[0], e))?;
                docs.hashers[0].update(&ids);
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

    fn end_doc(&mut self) -> Result<()> {
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
                    .map_err(|e| Error::io(&docs.tmps[3], e))?;
                docs.hashers[3].update(&rec);
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
            self.doc_hashers[index][3].update(&rec);
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
                    .map_err(|e| Error::io(&d.tmps[1], e))?;
                d.hashers[1].update(&end);
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
                    ids,
                    index,
                    meta,
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
            docs,
            in_place_mtime_ns: None,
            in_place_guard: None,
            checksums,
        });
        Ok(())
    }

    /// Finishes the last shard; returns the shards, the document count and whether any
    /// metadata was seen.
    fn finish(&mut self) -> Result<(Vec<ShardEntry>, Option<u64>, bool)> {
        self.finish_shard()?;
        if self.shards.is_empty() {
            return Err(Error::invalid("the inputs hold no tokens"));
        }
        // Document-file hashes cover the files as finally written (some docs records were
        // appended after their shard was finished): the hash of the four files' hashes.
        // Their block checksums too: one file per shard, the checksums of .ids, .idx, .meta
        // and .docs one after the other.
        for i in 0..self.shards.len().min(self.doc_hashers.len()) {
            let hashers = self.doc_hashers[i].clone();
            let Some(d) = &self.shards[i].docs else {
                continue;
            };
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
fn new_pack_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let id = crate::shuffle::feistel::mix(nanos ^ (u64::from(std::process::id()) << 40));
    format!("{:08x}", id >> 32)
}

fn write_manifest(
    dir: &Path,
    shards: Vec<ShardEntry>,
    record: &RecordType,
    documents: Option<u64>,
    metadata: bool,
    written: &mut Written,
) -> Result<Manifest> {
    let mut manifest = Manifest {
        format: FORMAT_NAME.into(),
        version: VERSION,
        dtype: record.manifest_descr(),
        itemsize: record.itemsize() as u64,
        records: shards.iter().map(|s| s.records).sum(),
        content_hash: String::new(),
        shards,
        documents,
        metadata,
        created_by: format!("shufflefs {}", env!("CARGO_PKG_VERSION")),
    };
    manifest.content_hash = manifest.expected_content_hash();
    let tmp = dir.join(format!("{MANIFEST}.tmp"));
    let path = dir.join(MANIFEST);
    written.files.push(tmp.clone());
    let write = || -> io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(&manifest.to_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)
    };
    write().map_err(|e| Error::io(&path, e))?;
    // The dataset exists from the rename on; a failure to make it durable is worth a warning
    // but must not delete the shards it references.
    if let Err(e) = File::open(dir).and_then(|d| d.sync_all()) {
        log::warn!(
            "{}: fsync after writing the manifest failed: {e}",
            dir.display()
        );
    }
    Ok(manifest)
}

/// `shufflefs pack --in-place`: writes only a manifest that references the input files
/// themselves as shards, without copying them (it reads 16 pages of each). The inputs get the
/// checks a copy gets (one file is accepted by both or refused by both); a shard starts at its
/// records, after an llm.c or `.npy` header (`ShardEntry::offset`). Each file is identified by
/// its size and sampled content, and referenced by a path relative to the dataset directory
/// when it is inside it (so copies, archives and moves of the directory keep working and keep
/// the fingerprint), else by its absolute path. A mount refuses a file whose content samples
/// changed ([`reference_in_place`]).
pub fn pack_in_place(dir: &Path, inputs: &[PathBuf], options: &PackOptions) -> Result<Manifest> {
    if options.doc_sep.is_some() {
        return Err(Error::invalid(
            "--in-place cannot split documents (--doc-sep): documents need files pack writes",
        ));
    }
    let (checked, record) = check_inputs(inputs, options)?;
    let itemsize = record.itemsize() as u64;
    let mut shards = Vec::new();
    for input in checked {
        let (input, offset, bytes, kind) = match input {
            Input::Jsonl { path } => {
                return Err(Error::invalid(format!(
                    "{}: --in-place references token files (raw, .npy, llm.c) as they are; JSON \
                     Lines documents need files pack writes: pack it without --in-place",
                    path.display()
                )));
            }
            Input::Records {
                path,
                offset,
                bytes,
                kind,
            } => (path, offset, bytes, kind),
        };
        if bytes == 0 {
            // An input without records adds nothing (a copy skips it too).
            continue;
        }
        let abs = input.canonicalize().map_err(|e| Error::io(&input, e))?;
        if abs.to_str().is_none() {
            return Err(Error::invalid(format!(
                "{}: path is not UTF-8",
                abs.display()
            )));
        }
        shards.push((abs, offset, bytes, kind));
    }
    if shards.is_empty() {
        return Err(Error::invalid("the inputs hold no tokens"));
    }
    if dir.exists() && !dir.is_dir() {
        return Err(Error::invalid(format!(
            "{}: DATASET_DIR exists and is not a directory",
            dir.display()
        )));
    }
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let canonical_dir = dir.canonicalize().map_err(|e| Error::io(dir, e))?;
    let shards = shards
        .into_iter()
        .map(|(abs, offset, bytes, kind)| {
            reference_in_place(&canonical_dir, &abs, (offset, bytes, itemsize), kind)
        })
        .collect::<Result<Vec<_>>>()?;
    if dir.join(MANIFEST).exists() && !options.force {
        return Err(Error::invalid(format!(
            "{} already holds a dataset ({MANIFEST} exists): choose another directory or \
             pass --force to replace it",
            dir.display()
        )));
    }
    let mut written = Written::default();
    let result = write_manifest(dir, shards, &record, None, false, &mut written);
    if result.is_err() {
        written.cleanup();
    }
    result
}

/// The manifest entry of a file referenced in place (format version 4), its records starting
/// `offset` bytes into it: its path relative to the dataset directory `dir` (canonical) when
/// it is inside it, else absolute; its content identity from the size and the sampled pages of
/// the records (`format::sampled_identity`); its mtime and the guard that binds path and mtime
/// to that identity.
fn reference_in_place(
    dir: &Path,
    abs: &Path,
    (offset, bytes, itemsize): (u64, u64, u64),
    kind: Kind,
) -> Result<ShardEntry> {
    let file = File::open(abs).map_err(|e| Error::io(abs, e))?;
    let meta = file.metadata().map_err(|e| Error::io(abs, e))?;
    if meta.len() != offset + bytes {
        return Err(Error::invalid(format!(
            "{}: the file changed while packing; re-run pack when it is complete",
            abs.display()
        )));
    }
    let shard =
        crate::dataset::Shard::new(abs, bytes, std::sync::Arc::new(file)).with_offset(offset);
    let hash = shard.sampled_identity()?;
    let inside = abs
        .strip_prefix(dir)
        .ok()
        .and_then(Path::to_str)
        .filter(|rel| !rel.is_empty() && *rel != MANIFEST);
    let path = match inside {
        Some(rel) => rel.to_string(),
        None => abs.to_str().expect("checked UTF-8").to_string(),
    };
    let mtime = crate::storage::mtime_ns(&meta);
    Ok(ShardEntry {
        in_place_guard: Some(format::in_place_guard(&path, bytes, mtime, &hash)),
        hash,
        path,
        records: bytes / itemsize,
        bytes,
        offset,
        source_format: Some(kind.source_format().to_string()),
        docs: None,
        in_place_mtime_ns: Some(mtime),
        checksums: None,
    })
}

/// Writes `tokens` positional tokens of `dtype` to `path` (token `i` has value `i` modulo the
/// type's range): a dataset where every window names its own position. Used by the demo,
/// tests and benchmarks.
pub fn write_positional(path: &Path, dtype: ScalarType, tokens: u64) -> Result<()> {
    let mut f = File::create(path).map_err(|e| Error::io(path, e))?;
    let size = dtype.size();
    let per_chunk = (CHUNK / size) as u64;
    let mut buf = Vec::with_capacity(CHUNK);
    let mut i = 0u64;
    while i < tokens {
        buf.clear();
        let end = (i + per_chunk).min(tokens);
        for t in i..end {
            buf.extend_from_slice(&t.to_le_bytes()[..size]);
        }
        f.write_all(&buf).map_err(|e| Error::io(path, e))?;
        i = end;
    }
    f.sync_all().map_err(|e| Error::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("3k").unwrap(), 3072);
        assert_eq!(parse_size("2 TiB").unwrap(), 2 << 40);
        for bad in ["", "GiB", "1.5GiB", "-1", "1XB", "99999999999999999999"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert!(parse_size("16777216TiB").is_err(), "overflow");
    }
}

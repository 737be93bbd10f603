//! Hugging Face `datasets` token tables to a token stream and document lengths: Arrow IPC
//! streams (`save_to_disk`'s `data-XXXXX-of-YYYYY.arrow`, `.map` cache files), Arrow IPC
//! files (`ARROW1`) and parquet (`to_parquet`, `push_to_hub` shards), read with the arrow-rs
//! crates (`arrow-ipc`, `parquet`).
//!
//! One row is one document: the tokens are a list-of-integers column chosen by name
//! ([`Options::column`]; by default the first of [`DEFAULT_COLUMNS`], `input_ids` then
//! `tokens`). The column may be `list`, `large_list` or `fixed_size_list` (pre-packed rows,
//! each row then a "document") of int8..int64 or uint8..uint64 (HF `input_ids` is
//! `list<int32>`; pyarrow/pandas tables often `list<int64>` or `list<uint16|uint32>`). The
//! list's child field name (`item` in `.arrow`, `element` in parquet) does not matter.
//!
//! [`convert`] reads one record batch at a time (one IPC message; for parquet at most
//! [`Options::batch_size`] rows of one row group, reading only the chosen column), converts
//! its tokens to the output token type and hands them to a writer callback, and returns the
//! rows' lengths (O(rows) memory; the tokens are never all in memory). A value the output
//! type cannot hold is refused naming the file, the row and the value; a null row or token
//! too. Memory is bounded by one batch (by the largest row for huge rows).
//!
//! Untrusted input: sizes in an IPC file footer and parquet byte ranges are checked against
//! the file size before the crates allocate for them, and a panic inside the crates while
//! reading a damaged file becomes an error naming the file.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    ArrowPrimitiveType, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type,
    UInt32Type, UInt64Type,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Schema};
use bytes::Bytes;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::reader::{ChunkReader, Length};

use crate::error::{Error, Result};
use crate::format::dtype::ScalarType;

/// Token columns tried in order when none is named.
pub const DEFAULT_COLUMNS: [&str; 2] = ["input_ids", "tokens"];

/// What to convert.
#[derive(Clone, Debug)]
pub struct Options {
    /// The token column; `None`: the first of [`DEFAULT_COLUMNS`] the table has.
    pub column: Option<String>,
    /// The token type written.
    pub dtype: ScalarType,
    /// Rows per parquet batch (IPC batches are as written).
    pub batch_size: usize,
}

impl Options {
    /// Options writing `dtype` tokens from the default column.
    pub fn new(dtype: ScalarType) -> Options {
        Options {
            column: None,
            dtype,
            batch_size: 1024,
        }
    }
}

/// A table file's kind, from its first bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableKind {
    /// Parquet (`PAR1`).
    Parquet,
    /// Arrow IPC file (`ARROW1`, with a footer).
    ArrowFile,
    /// Arrow IPC stream (what `save_to_disk` writes).
    ArrowStream,
}

impl TableKind {
    /// The kind of a file starting with `head` (at least 8 bytes for a certain answer).
    pub fn detect(head: &[u8]) -> Option<TableKind> {
        if head.starts_with(b"PAR1") {
            Some(TableKind::Parquet)
        } else if head.starts_with(b"ARROW1") {
            Some(TableKind::ArrowFile)
        } else if head.starts_with(&[0xff; 4]) {
            Some(TableKind::ArrowStream)
        } else {
            None
        }
    }
}

/// Receives each batch: its tokens (little-endian bytes of the output type) and the lengths
/// of its rows.
pub type WriteBatch<'a> = dyn FnMut(&[u8], &[u64]) -> Result<()> + 'a;

/// What [`convert`] read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Converted {
    /// The file's kind.
    pub kind: TableKind,
    /// The column read.
    pub column: String,
    /// The column's type, as arrow names it (e.g. `List(Int32)`).
    pub column_type: String,
    /// Tokens written.
    pub tokens: u64,
    /// One length per row (document), in row order.
    pub doc_lens: Vec<u64>,
    /// Record batches read.
    pub batches: u64,
}

/// Converts the table `path` (kind from its content): calls `write` with each batch's tokens
/// as little-endian `opts.dtype` bytes, in row order, and the lengths of the batch's rows;
/// returns all rows' lengths.
pub fn convert(path: &Path, opts: &Options, write: &mut WriteBatch<'_>) -> Result<Converted> {
    if !opts.dtype.is_token_type() {
        return Err(Error::invalid(format!(
            "{} is not a token type",
            opts.dtype
        )));
    }
    let mut file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut head = [0u8; 8];
    let n = read_up_to(&mut file, &mut head).map_err(|e| Error::io(path, e))?;
    let kind = TableKind::detect(&head[..n]).ok_or_else(|| {
        Error::input(
            path,
            "not a parquet file, Arrow IPC file or Arrow IPC stream (no PAR1, ARROW1 or \
             continuation marker at the start)",
        )
    })?;
    let mut conv = Conversion {
        path,
        opts,
        write,
        out: Vec::new(),
        doc_lens: Vec::new(),
        tokens: 0,
        batches: 0,
        column: None,
    };
    match kind {
        TableKind::Parquet => conv.parquet(file, len)?,
        TableKind::ArrowFile => {
            check_ipc_footer(path, &mut file, len)?;
            file.seek(SeekFrom::Start(0))
                .map_err(|e| Error::io(path, e))?;
            let reader = guard(path, || {
                arrow_ipc::reader::FileReader::try_new_buffered(file, None)
            })?;
            let (index, _) = conv.choose(&reader.schema())?;
            conv.batches(reader, index)?;
        }
        TableKind::ArrowStream => {
            file.seek(SeekFrom::Start(0))
                .map_err(|e| Error::io(path, e))?;
            let reader = guard(path, || {
                arrow_ipc::reader::StreamReader::try_new_buffered(file, None)
            })?;
            let (index, _) = conv.choose(&reader.schema())?;
            conv.batches(reader, index)?;
        }
    }
    let (column, column_type) = conv.column.unwrap_or_default();
    Ok(Converted {
        kind,
        column,
        column_type,
        tokens: conv.tokens,
        doc_lens: conv.doc_lens,
        batches: conv.batches,
    })
}

fn read_up_to(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Runs a reader call, turning an arrow/parquet error or a panic into an error naming `path`.
fn guard<T, E: std::fmt::Display>(
    path: &Path,
    f: impl FnOnce() -> std::result::Result<T, E>,
) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::input(path, format!("cannot read it: {e}"))),
        Err(p) => {
            let what = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(Error::input(
                path,
                format!("cannot read it: the file is damaged (the reader failed: {what})"),
            ))
        }
    }
}

/// Checks an Arrow IPC file's footer before arrow-ipc allocates for it: the footer length
/// and every block's offset and lengths inside the file.
fn check_ipc_footer(path: &Path, file: &mut File, len: u64) -> Result<()> {
    let bad = |m: String| Error::input(path, format!("a damaged Arrow IPC file: {m}"));
    if len < 8 + 10 {
        return Err(bad(format!(
            "{len} bytes, shorter than its magic and footer"
        )));
    }
    let mut tail = [0u8; 10];
    file.seek(SeekFrom::Start(len - 10))
        .and_then(|_| file.read_exact(&mut tail))
        .map_err(|e| Error::io(path, e))?;
    if &tail[4..] != b"ARROW1" {
        return Err(bad("it does not end with ARROW1 (truncated?)".into()));
    }
    let footer_len = i32::from_le_bytes(tail[..4].try_into().expect("4"));
    let footer_len = u64::try_from(footer_len)
        .ok()
        .filter(|&f| f <= len - 18)
        .ok_or_else(|| bad(format!("footer length {footer_len} does not fit the file")))?;
    let mut footer = vec![0u8; footer_len as usize];
    file.seek(SeekFrom::Start(len - 10 - footer_len))
        .and_then(|_| file.read_exact(&mut footer))
        .map_err(|e| Error::io(path, e))?;
    let footer =
        arrow_ipc::root_as_footer(&footer).map_err(|e| bad(format!("unreadable footer ({e})")))?;
    let blocks = footer
        .recordBatches()
        .into_iter()
        .flatten()
        .chain(footer.dictionaries().into_iter().flatten());
    for b in blocks {
        let ok = u64::try_from(b.offset()).ok().and_then(|o| {
            let m = u64::try_from(b.metaDataLength()).ok()?;
            let body = u64::try_from(b.bodyLength()).ok()?;
            o.checked_add(m)?.checked_add(body)
        });
        if ok.is_none_or(|end| end > len) {
            return Err(bad(format!(
                "a block at offset {} ({} + {} bytes) is outside the {len}-byte file",
                b.offset(),
                b.metaDataLength(),
                b.bodyLength()
            )));
        }
    }
    Ok(())
}

/// A `File` as a parquet [`ChunkReader`] that refuses byte ranges beyond the file before
/// allocating for them (the crate's own `File` reader reserves the asked length first).
struct Bounded {
    file: File,
    len: u64,
}

impl Length for Bounded {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for Bounded {
    type T = <File as ChunkReader>::T;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        self.file.get_read(start)
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        if start
            .checked_add(length as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(parquet::errors::ParquetError::EOF(format!(
                "{length} bytes at offset {start} are beyond the {}-byte file",
                self.len
            )));
        }
        self.file.get_bytes(start, length)
    }
}

struct Conversion<'a> {
    path: &'a Path,
    opts: &'a Options,
    write: &'a mut WriteBatch<'a>,
    out: Vec<u8>,
    doc_lens: Vec<u64>,
    tokens: u64,
    batches: u64,
    column: Option<(String, String)>,
}

impl Conversion<'_> {
    /// The token column of `schema`: its index and name.
    fn choose(&mut self, schema: &Schema) -> Result<(usize, String)> {
        let names: Vec<&str> = match &self.opts.column {
            Some(c) => vec![c.as_str()],
            None => DEFAULT_COLUMNS.to_vec(),
        };
        let Some((index, field)) = names.iter().find_map(|n| schema.column_with_name(n)) else {
            let have: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            return Err(Error::input(
                self.path,
                format!(
                    "no token column {} (its columns: {}); name the column holding the token \
                     lists",
                    names.join(" or "),
                    have.join(", ")
                ),
            ));
        };
        let item = match field.data_type() {
            DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
                f.data_type()
            }
            _ => &DataType::Null,
        };
        if !item.is_integer() {
            return Err(Error::input(
                self.path,
                format!(
                    "column {} is {}, not a list of integer token ids",
                    field.name(),
                    field.data_type()
                ),
            ));
        }
        self.column = Some((field.name().clone(), field.data_type().to_string()));
        Ok((index, field.name().clone()))
    }

    fn batches<I, E>(&mut self, mut reader: I, index: usize) -> Result<()>
    where
        I: Iterator<Item = std::result::Result<RecordBatch, E>>,
        E: std::fmt::Display,
    {
        loop {
            let next = guard(self.path, || reader.next().transpose())?;
            let Some(batch) = next else { return Ok(()) };
            self.batch(batch.column(index).as_ref())?;
        }
    }

    fn parquet(&mut self, file: File, len: u64) -> Result<()> {
        let builder = guard(self.path, || {
            ParquetRecordBatchReaderBuilder::try_new(Bounded { file, len })
        })?;
        let (index, _) = self.choose(builder.schema())?;
        let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
        let reader = guard(self.path, || {
            builder
                .with_projection(mask)
                .with_batch_size(self.opts.batch_size.max(1))
                .build()
        })?;
        // The projected batches hold only the token column.
        self.batches(reader, 0)
    }

    /// Converts one batch of the token column.
    fn batch(&mut self, col: &dyn Array) -> Result<()> {
        self.batches += 1;
        self.out.clear();
        let first_row = self.doc_lens.len() as u64;
        let rows_before = self.doc_lens.len();
        if let Some(row) = (0..col.len()).find(|&r| col.is_null(r)) {
            return Err(self.refuse(first_row + row as u64, "is null (no token list)".into()));
        }
        let (offsets, values): (Vec<usize>, &dyn Array) = match col.data_type() {
            DataType::List(_) => {
                let l = col.as_list::<i32>();
                let o = l.value_offsets().iter().map(|&o| o as usize).collect();
                (o, l.values().as_ref())
            }
            DataType::LargeList(_) => {
                let l = col.as_list::<i64>();
                let o = l.value_offsets().iter().map(|&o| o as usize).collect();
                (o, l.values().as_ref())
            }
            DataType::FixedSizeList(_, n) => {
                let l = col.as_fixed_size_list();
                let n = *n as usize;
                let base = l.value_offset_at(0);
                (
                    (0..=l.len()).map(|r| base + r * n).collect(),
                    l.values().as_ref(),
                )
            }
            other => {
                return Err(Error::input(
                    self.path,
                    format!("a batch's token column is {other}, not a list"),
                ));
            }
        };
        match values.data_type() {
            DataType::Int8 => self.rows::<Int8Type>(&offsets, values, first_row)?,
            DataType::Int16 => self.rows::<Int16Type>(&offsets, values, first_row)?,
            DataType::Int32 => self.rows::<Int32Type>(&offsets, values, first_row)?,
            DataType::Int64 => self.rows::<Int64Type>(&offsets, values, first_row)?,
            DataType::UInt8 => self.rows::<UInt8Type>(&offsets, values, first_row)?,
            DataType::UInt16 => self.rows::<UInt16Type>(&offsets, values, first_row)?,
            DataType::UInt32 => self.rows::<UInt32Type>(&offsets, values, first_row)?,
            DataType::UInt64 => self.rows::<UInt64Type>(&offsets, values, first_row)?,
            other => {
                return Err(Error::input(
                    self.path,
                    format!("token lists of {other}, not integers"),
                ));
            }
        }
        if self.doc_lens.len() > rows_before {
            (self.write)(&self.out, &self.doc_lens[rows_before..])?;
        }
        Ok(())
    }

    fn refuse(&self, row: u64, what: String) -> Error {
        Error::input(self.path, format!("row {row}: {what}"))
    }

    fn rows<T>(&mut self, offsets: &[usize], values: &dyn Array, first_row: u64) -> Result<()>
    where
        T: ArrowPrimitiveType,
        T::Native: Into<i128>,
    {
        let values = values.as_primitive::<T>();
        let raw = values.values();
        let (lo, hi) = self.opts.dtype.int_range().expect("a token type");
        let size = self.opts.dtype.size();
        for (r, w) in offsets.windows(2).enumerate() {
            let row = first_row + r as u64;
            let (a, b) = (w[0], w[1]);
            if a > b || b > raw.len() {
                return Err(self.refuse(row, format!("list offsets {a}..{b} are damaged")));
            }
            if let Some(nulls) = values.nulls()
                && let Some(k) = (a..b).find(|&i| nulls.is_null(i))
            {
                return Err(self.refuse(row, format!("token {} is null", k - a)));
            }
            for (k, &v) in raw[a..b].iter().enumerate() {
                let v: i128 = v.into();
                if v < lo || v > hi {
                    return Err(self.refuse(
                        row,
                        format!(
                            "token {k} is {v}, which {} tokens cannot hold ({lo}..={hi}): choose \
                             a wider token type",
                            self.opts.dtype
                        ),
                    ));
                }
                self.out
                    .extend_from_slice(&(v as u64).to_le_bytes()[..size]);
            }
            self.doc_lens.push((b - a) as u64);
            self.tokens += (b - a) as u64;
        }
        Ok(())
    }
}

/// The shard files of a `save_to_disk` directory, in `state.json`'s `_data_files` order
/// (the order `load_from_disk` reads them). A `DatasetDict` directory (with
/// `dataset_dict.json`) is refused naming its splits.
pub fn disk_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let dict = dir.join("dataset_dict.json");
    if let Ok(text) = std::fs::read_to_string(&dict) {
        let splits = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| {
                v.get("splits")?.as_array().map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect::<Vec<_>>()
                })
            })
            .unwrap_or_default();
        return Err(Error::invalid(format!(
            "{}: a DatasetDict (splits: {}); name one split's directory, e.g. {}",
            dir.display(),
            splits.join(", "),
            dir.join(splits.first().map_or("train", |s| s.as_str()))
                .display()
        )));
    }
    let state = dir.join("state.json");
    let text = std::fs::read_to_string(&state).map_err(|e| Error::io(&state, e))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::input(&state, format!("not JSON: {e}")))?;
    let files = v
        .get("_data_files")
        .and_then(|f| f.as_array())
        .ok_or_else(|| Error::input(&state, "no _data_files list"))?;
    files
        .iter()
        .map(|f| {
            let name = f
                .get("filename")
                .and_then(|n| n.as_str())
                .ok_or_else(|| Error::input(&state, "a _data_files entry without filename"))?;
            let p = Path::new(name);
            if p.components().count() != 1 || p.file_name().is_none() {
                return Err(Error::input(
                    &state,
                    format!("_data_files names {name:?}, not a file in the directory"),
                ));
            }
            Ok(dir.join(p))
        })
        .collect()
}

#[cfg(test)]
mod tests;

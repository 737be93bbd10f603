//! datatrove / nanotron tokenized files, as datatrove's `TokenizedFile` writes them
//! (`DocumentTokenizer`, `DocumentTokenizerMerger`) and its merger and `DatatroveFileDataset`
//! read them:
//!
//! - `X.ds`: the tokens back to back, no header: uint16 (token size 2) or uint32 (4);
//! - `X.ds.index`: u64 little-endian *document ends*, in tokens, cumulative, exclusive, no
//!   leading 0 and no count (8 bytes per document; the last end is the token count; equal
//!   consecutive ends are empty documents);
//! - `X.ds.metadata`: text `"<tokenizer>|<token size>\n<token count>\n<humanized count>"` (no
//!   trailing newline; `"Unknown Tokenizer|2|2"` on the first line without a tokenizer name);
//! - `X.ds.loss` (optional): one byte (0 or 1) per token.
//!
//! The merger also writes a total `NAME.ds.metadata` **without** a `NAME.ds` beside its
//! `NNN_NAME.ds` parts: [`MergedTotal`] recognises it and checks its token count against the
//! parts.
//!
//! Documents are the index's ranges: document d is tokens `[end(d - 1), end(d))`, `end(-1) = 0`
//! (a document ends with its EOS when the tokenizer has one; datatrove's shuffled-chunk mode
//! records chunk ends as document ends, and they are read the same way).
//!
//! # Cost
//!
//! [`DatatroveFile::open`] reads the last index entry and checks the sizes (O(1)); a lookup
//! ([`DatatroveFile::document`]) is one positioned read of 16 bytes; [`DatatroveFile::verify`]
//! is the O(documents) check that the ends never decrease; [`DatatroveFile::verify_loss`] the
//! O(tokens) check of a loss file. Lookups take the index's byte source as an argument.

use std::ops::Range;
use std::path::{Path, PathBuf};

use super::index_io::{Blocks, bytes_at, u64_at};
use crate::error::{Error, Result};
use crate::format::dtype::ScalarType;
use crate::storage::ReadAt;

/// The companion files of `X.ds`: (`X.ds.index`, `X.ds.metadata`, `X.ds.loss`).
pub fn companions(ds: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let with = |suffix: &str| {
        let mut s = ds.as_os_str().to_owned();
        s.push(suffix);
        PathBuf::from(s)
    };
    (with(".index"), with(".metadata"), with(".loss"))
}

/// The first two lines of a `.ds.metadata` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// The tokenizer name or path (`None` for datatrove's "Unknown Tokenizer").
    pub tokenizer: Option<String>,
    /// Bytes per token: 2 (uint16) or 4 (uint32).
    pub token_size: u8,
    /// The token count (line 2).
    pub tokens: u64,
}

impl Metadata {
    /// The token type of the `.ds` file.
    pub fn dtype(&self) -> ScalarType {
        token_type(self.token_size).expect("checked at parse")
    }

    /// Parses the text of `path` (a `.ds.metadata`).
    pub fn parse(path: &Path, text: &[u8]) -> Result<Metadata> {
        let bad = |what: &str| {
            Error::input(
                path,
                format!(
                    "{what}: a datatrove .ds.metadata is \"<tokenizer>|<token size>\\n<token \
                     count>\\n<humanized count>\""
                ),
            )
        };
        let text = std::str::from_utf8(text).map_err(|_| bad("not UTF-8 text"))?;
        let mut lines = text.lines();
        let first = lines.next().unwrap_or("");
        let (name, size) = first
            .rsplit_once('|')
            .ok_or_else(|| bad("no '|' on the first line"))?;
        let token_size = match size.trim() {
            "2" => 2,
            "4" => 4,
            other => return Err(bad(&format!("token size {other:?} is neither 2 nor 4"))),
        };
        let tokenizer = match name.strip_prefix("Unknown Tokenizer") {
            Some(rest) if rest.is_empty() || rest == format!("|{token_size}") => None,
            _ => Some(name.to_string()),
        };
        let count = lines.next().ok_or_else(|| bad("no token count"))?;
        let tokens = count
            .trim()
            .parse::<u64>()
            .map_err(|_| bad(&format!("token count {count:?} is not a number")))?;
        Ok(Metadata {
            tokenizer,
            token_size,
            tokens,
        })
    }

    /// Reads and parses `path` (at most 64 KiB: a metadata file is three short lines).
    pub fn read(path: &Path) -> Result<Metadata> {
        let text = read_small(path, 64 << 10)?;
        Metadata::parse(path, &text)
    }
}

fn read_small(path: &Path, max: u64) -> Result<Vec<u8>> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut text = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut text)
        .map_err(|e| Error::io(path, e))?;
    if text.len() as u64 > max {
        return Err(Error::input(
            path,
            format!("more than {max} bytes: not a datatrove .ds.metadata"),
        ));
    }
    Ok(text)
}

/// The token type of a datatrove token size.
pub fn token_type(token_size: u8) -> Option<ScalarType> {
    match token_size {
        2 => Some(ScalarType::U16),
        4 => Some(ScalarType::U32),
        _ => None,
    }
}

/// What [`DatatroveFile::verify`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// Documents.
    pub documents: u64,
    /// Empty documents (equal consecutive ends).
    pub empty_documents: u64,
    /// Tokens.
    pub tokens: u64,
}

/// A `.ds` file with its `.ds.index`, checked against each other (and the metadata and loss
/// file when given).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatatroveFile {
    ds: PathBuf,
    index: PathBuf,
    dtype: ScalarType,
    tokens: u64,
    documents: u64,
    loss: Option<PathBuf>,
}

/// The sizes and metadata [`DatatroveFile::open`] checks.
#[derive(Clone, Debug)]
pub struct Parts<'a> {
    /// The `.ds` token file and its size.
    pub ds: (&'a Path, u64),
    /// The `.ds.index` and its size.
    pub index: (&'a Path, u64),
    /// The parsed `.ds.metadata`, if there is one.
    pub metadata: Option<&'a Metadata>,
    /// The token type when there is no metadata (datatrove's readers default to 2 bytes).
    /// Given with metadata, the two must agree.
    pub dtype: Option<ScalarType>,
    /// The `.ds.loss` and its size, if there is one.
    pub loss: Option<(&'a Path, u64)>,
}

impl DatatroveFile {
    /// Checks `parts` and the last index entry (read from `index`): O(1).
    pub fn open<R: ReadAt + ?Sized>(parts: &Parts<'_>, index: &R) -> Result<DatatroveFile> {
        let (ds, ds_len) = parts.ds;
        let (index_path, index_len) = parts.index;
        let dtype = match (parts.metadata, parts.dtype) {
            (Some(m), Some(t)) if m.dtype() != t => {
                return Err(Error::invalid(format!(
                    "{}: its metadata says {}-byte tokens ({}), not {t} as asked",
                    ds.display(),
                    m.token_size,
                    m.dtype()
                )));
            }
            (Some(m), _) => m.dtype(),
            (None, Some(t)) if matches!(t, ScalarType::U16 | ScalarType::U32) => t,
            (None, Some(t)) => {
                return Err(Error::invalid(format!(
                    "{}: datatrove token files are uint16 or uint32, not {t}",
                    ds.display()
                )));
            }
            (None, None) => {
                return Err(Error::invalid(format!(
                    "{}: no .ds.metadata beside it to give the token size: name the token type \
                     (--dtype u16 for 2-byte tokens, u32 for 4)",
                    ds.display()
                )));
            }
        };
        let size = dtype.size() as u64;
        if !ds_len.is_multiple_of(size) {
            return Err(Error::input(
                ds,
                format!("{ds_len} bytes is not a whole number of {size}-byte tokens"),
            ));
        }
        let tokens = ds_len / size;
        if !index_len.is_multiple_of(8) {
            return Err(Error::input(
                index_path,
                format!(
                    "{index_len} bytes is not a whole number of 8-byte document ends: it is \
                     truncated or not a datatrove .ds.index"
                ),
            ));
        }
        let documents = index_len / 8;
        let last = if documents == 0 {
            0
        } else {
            u64_at(index, index_path, index_len - 8)?
        };
        let file = DatatroveFile {
            ds: ds.to_path_buf(),
            index: index_path.to_path_buf(),
            dtype,
            tokens,
            documents,
            loss: parts.loss.map(|(p, _)| p.to_path_buf()),
        };
        if last != tokens {
            return Err(file.mismatch(format!(
                "its last document ends at token {last}, but {} holds {tokens} tokens",
                ds.display()
            )));
        }
        if let Some(m) = parts.metadata
            && m.tokens != tokens
        {
            return Err(Error::input(
                ds,
                format!(
                    "holds {tokens} tokens but its .ds.metadata says {}: the files do not \
                     belong together (or one is truncated)",
                    m.tokens
                ),
            ));
        }
        if let Some((loss, loss_len)) = parts.loss
            && loss_len != tokens
        {
            return Err(Error::input(
                loss,
                format!(
                    "{loss_len} bytes, but {} holds {tokens} tokens (one loss byte per token)",
                    ds.display()
                ),
            ));
        }
        Ok(file)
    }

    /// Opens `ds` (an `X.ds`) with the companions found beside it: `X.ds.index` (required),
    /// `X.ds.metadata` and `X.ds.loss` (optional; `dtype` is needed without metadata).
    /// Returns the file with the open index for lookups.
    pub fn open_files(
        ds: &Path,
        dtype: Option<ScalarType>,
    ) -> Result<(DatatroveFile, std::fs::File)> {
        let (index, metadata, loss) = companions(ds);
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len());
        let ds_len = size(ds).map_err(|e| Error::io(ds, e))?;
        let index_file = std::fs::File::open(&index).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::input(
                    ds,
                    format!(
                        "no {} beside it: its documents are unknown (pack it as raw tokens to \
                         read it as one stream)",
                        index.display()
                    ),
                )
            } else {
                Error::io(&index, e)
            }
        })?;
        let index_len = index_file
            .metadata()
            .map_err(|e| Error::io(&index, e))?
            .len();
        let metadata = match std::fs::symlink_metadata(&metadata) {
            Ok(_) => Some(Metadata::read(&metadata)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(&metadata, e)),
        };
        let loss_len = match size(&loss) {
            Ok(n) => Some(n),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(&loss, e)),
        };
        let parts = Parts {
            ds: (ds, ds_len),
            index: (&index, index_len),
            metadata: metadata.as_ref(),
            dtype,
            loss: loss_len.map(|n| (loss.as_path(), n)),
        };
        let file = DatatroveFile::open(&parts, &index_file)?;
        Ok((file, index_file))
    }

    fn mismatch(&self, what: String) -> Error {
        Error::input(
            &self.index,
            format!(
                "does not match {}: {what}; pack the .ds with the .ds.index written with it",
                self.ds.display()
            ),
        )
    }

    /// The `.ds` file.
    pub fn path(&self) -> &Path {
        &self.ds
    }

    /// The `.ds.index` file.
    pub fn index_path(&self) -> &Path {
        &self.index
    }

    /// The `.ds.loss` file, if there is one.
    pub fn loss_path(&self) -> Option<&Path> {
        self.loss.as_deref()
    }

    /// The token type (u16 or u32).
    pub fn dtype(&self) -> ScalarType {
        self.dtype
    }

    /// Tokens in the `.ds`.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Documents in the index.
    pub fn n_documents(&self) -> u64 {
        self.documents
    }

    /// The tokens of document `d`: a range of token offsets into the `.ds`. One read of 8 or
    /// 16 bytes; checks that the range is ordered and inside the file.
    pub fn document<R: ReadAt + ?Sized>(&self, index: &R, d: u64) -> Result<Range<u64>> {
        if d >= self.documents {
            return Err(Error::invalid(format!(
                "{}: document {d} out of range (the index has {})",
                self.index.display(),
                self.documents
            )));
        }
        let (start, end) = if d == 0 {
            (0, u64_at(index, &self.index, 0)?)
        } else {
            let b: [u8; 16] = bytes_at(index, &self.index, 8 * (d - 1))?;
            (
                u64::from_le_bytes(b[..8].try_into().expect("8")),
                u64::from_le_bytes(b[8..].try_into().expect("8")),
            )
        };
        if start > end || end > self.tokens {
            return Err(self.damaged(d, start, end));
        }
        Ok(start..end)
    }

    fn damaged(&self, d: u64, start: u64, end: u64) -> Error {
        Error::input(
            &self.index,
            format!(
                "document {d} runs from token {start} to {end}, not an ordered range inside the \
                 {} tokens of {}: the index is damaged",
                self.tokens,
                self.ds.display()
            ),
        )
    }

    /// Calls `f` with every document end in order, in one sequential pass, checking that the
    /// ends never decrease and stay inside the file.
    pub fn for_each_end<R: ReadAt + ?Sized>(
        &self,
        index: &R,
        mut f: impl FnMut(u64) -> Result<()>,
    ) -> Result<()> {
        let mut blocks = Blocks::new(index, &self.index, 0, 8 * self.documents);
        let (mut d, mut prev) = (0u64, 0u64);
        while let Some(b) = blocks.next_block()? {
            for e in b.chunks_exact(8) {
                let e = u64::from_le_bytes(e.try_into().expect("8"));
                if e < prev || e > self.tokens {
                    return Err(self.damaged(d, prev, e));
                }
                f(e)?;
                prev = e;
                d += 1;
            }
        }
        Ok(())
    }

    /// Checks the whole index (O(documents), sequential): the ends never decrease and the
    /// last is the token count.
    pub fn verify<R: ReadAt + ?Sized>(&self, index: &R) -> Result<Verified> {
        let (mut empty, mut prev) = (0u64, None);
        self.for_each_end(index, |e| {
            empty += u64::from(prev.map_or(e == 0, |p| p == e));
            prev = Some(e);
            Ok(())
        })?;
        if prev.unwrap_or(0) != self.tokens {
            return Err(self.mismatch(format!("its ends stop at token {}", prev.unwrap_or(0))));
        }
        Ok(Verified {
            documents: self.documents,
            empty_documents: empty,
            tokens: self.tokens,
        })
    }

    /// Checks the loss file (`loss`, the bytes of [`DatatroveFile::loss_path`]): every byte 0
    /// or 1 (O(tokens), sequential).
    pub fn verify_loss<R: ReadAt + ?Sized>(&self, loss: &R) -> Result<()> {
        let path = self.loss.as_deref().unwrap_or(Path::new(".ds.loss"));
        let mut blocks = Blocks::new(loss, path, 0, self.tokens);
        let mut at = 0u64;
        while let Some(b) = blocks.next_block()? {
            if let Some(i) = b.iter().position(|&v| v > 1) {
                return Err(Error::input(
                    path,
                    format!(
                        "byte {} is {}: a datatrove loss mask holds 0 or 1 per token",
                        at + i as u64,
                        b[i]
                    ),
                ));
            }
            at += b.len() as u64;
        }
        Ok(())
    }
}

/// A merger's total `NAME.ds.metadata` (no `NAME.ds` beside it) and its `NNN_NAME.ds` parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MergedTotal {
    /// The total metadata file.
    pub path: PathBuf,
    /// What it says (the token count is the total of the parts).
    pub metadata: Metadata,
    /// The parts `NNN_NAME.ds` in the same directory, sorted by name (the merger's order).
    pub parts: Vec<PathBuf>,
}

impl MergedTotal {
    /// `path` is a merger's total metadata when it is a `NAME.ds.metadata` without a
    /// `NAME.ds` beside it. Returns it with its parts (`NNN_NAME.ds`, three or more digits),
    /// or `None` when `path` is an ordinary metadata file.
    pub fn find(path: &Path) -> Result<Option<MergedTotal>> {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            return Ok(None);
        };
        let Some(stem) = name.strip_suffix(".ds.metadata") else {
            return Ok(None);
        };
        let ds = path.with_file_name(format!("{stem}.ds"));
        if std::fs::symlink_metadata(&ds).is_ok() {
            return Ok(None);
        }
        let metadata = Metadata::read(path)?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let want = format!("_{stem}.ds");
        let mut parts = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(|e| Error::io(&dir, e))? {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
            let n = entry.file_name();
            let Some(n) = n.to_str() else { continue };
            if let Some(num) = n.strip_suffix(&want)
                && num.len() >= 3
                && num.bytes().all(|b| b.is_ascii_digit())
            {
                parts.push(entry.path());
            }
        }
        parts.sort();
        Ok(Some(MergedTotal {
            path: path.to_path_buf(),
            metadata,
            parts,
        }))
    }

    /// Checks the total against the parts' token counts (in the order of `parts`).
    pub fn check(&self, part_tokens: &[u64]) -> Result<()> {
        let sum: u128 = part_tokens.iter().map(|&t| u128::from(t)).sum();
        if self.parts.is_empty() || sum != u128::from(self.metadata.tokens) {
            return Err(Error::input(
                &self.path,
                format!(
                    "a datatrove merger's total metadata ({} tokens) whose {} parts beside it \
                     hold {sum} tokens: some parts are missing or extra",
                    self.metadata.tokens,
                    self.parts.len()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

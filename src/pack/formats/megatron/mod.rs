//! Megatron-LM indexed datasets: `PREFIX.idx` (the index) beside `PREFIX.bin` (the tokens),
//! as `megatron/core/datasets/indexed_dataset.py` (`_IndexWriter`, `_IndexReader`) writes and
//! reads them.
//!
//! # Layout (little-endian)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 9 | magic `MMIDIDX\0\0` |
//! | 9 | 8 | u64 version, 1 |
//! | 17 | 1 | u8 dtype code of the tokens in `.bin` ([`dtype_of_code`]) |
//! | 18 | 8 | u64 S, the sequence count |
//! | 26 | 8 | u64 D, the document-index count (documents + 1) |
//! | 34 | 4 S | i32 sequence lengths, in tokens |
//! | 34 + 4 S | 8 S | i64 sequence pointers, **byte** offsets into `.bin` |
//! | 34 + 12 S | 8 D | i64 document indices: sequence ids, from 0 to S, non-decreasing |
//! | 34 + 12 S + 8 D | S | i8 sequence modes, only in multimodal datasets |
//!
//! The arrays start at byte 34, so they are unaligned: every value is read with
//! `from_le_bytes`. The file size is exactly `34 + 12 S + 8 D`, or `+ S` with the modes
//! trailer (the size says which). `.bin` holds the sequences back to back, no header, no
//! padding: its size is Σ lengths · itemsize, and pointer i is Σ_{j<i} lengths_j · itemsize.
//! The older fairseq layout (magic `TNTIDX\0\0`) is refused by name.
//!
//! # Sequences and documents
//!
//! A *sequence* is one entry of the index (`IndexedDataset[i]`); a *document* d is the run of
//! sequences `document_indices[d] .. document_indices[d + 1]` (several sequences per document
//! with `preprocess_data.py --split-sentences`; an empty text gives an empty document).
//! Megatron's own GPT training (`GPTDataset`) samples over *sequences*: its document index is
//! a shuffled list of sequence ids, so for training each sequence is a document. [`Unit`]
//! offers both; the default, [`Unit::Sequence`], is what `GPTDataset` uses. Without
//! `--split-sentences` the two coincide (apart from empty documents, which have no sequence).
//!
//! # Cost
//!
//! [`MegatronIndex::open`] reads the 34-byte header and three values (O(1), whatever S is): it
//! checks the file size against the counts (so no count read from the file is trusted to
//! size anything), the document indices' first and last entries, and the last sequence
//! against the `.bin` size. Lookups ([`MegatronIndex::sequence`], [`MegatronIndex::document`])
//! are one to three positioned reads of a few bytes; they check what they read (a range
//! inside `.bin`, in order) and nothing else. [`MegatronIndex::verify`] is the O(S) check
//! that every pointer is the sum of the lengths before it and the document indices are
//! ordered: run it once (at pack time) before trusting lookups to partition the stream.
//! [`MegatronIndex::for_each_end`] streams every unit's end in one sequential pass, the
//! input of a compact document index. Nothing reads more than [`super::index_io::BLOCK`]
//! bytes at a time.
//!
//! Lookups take the index's byte source as an argument (a `File`, any [`ReadAt`]): the
//! parsed [`MegatronIndex`] is plain data and holds no descriptor.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::index_io::{Blocks, bytes_at, i32_at, i64_at, mul_add, read_exact_at};
use crate::error::{Error, Result};
use crate::format::dtype::ScalarType;
use crate::storage::ReadAt;

/// The magic of a Megatron-LM (`MMIDIDX`) index.
pub const MAGIC: &[u8; 9] = b"MMIDIDX\0\0";
/// The magic of the older fairseq "lazy/cached" index, refused.
pub const LEGACY_MAGIC: &[u8; 8] = b"TNTIDX\0\0";
/// The only version Megatron-LM writes and reads.
pub const VERSION: u64 = 1;
/// Bytes before the sequence lengths.
pub const HEADER: u64 = 34;

/// Megatron-LM's `DType` codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
/// 7 float32, 8 uint16. Token datasets use 8 (vocabulary < 65,500) or 4.
pub fn dtype_of_code(code: u8) -> Option<ScalarType> {
    crate::format::sniff::megatron_dtype(Some(code))
}

/// What a "document" of a Megatron dataset is (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One sequence (an index entry): what `GPTDataset` samples as a document. The default.
    #[default]
    Sequence,
    /// The sequences between consecutive document indices (one input document of
    /// `preprocess_data.py`, possibly empty).
    Document,
}

/// What [`MegatronIndex::verify`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// Sequences (S).
    pub sequences: u64,
    /// Documents (D - 1).
    pub documents: u64,
    /// Documents without a sequence (an empty input text).
    pub empty_documents: u64,
    /// Sequences of length 0.
    pub empty_sequences: u64,
    /// Tokens in `.bin`.
    pub tokens: u64,
}

/// A parsed Megatron-LM index header, checked against its file size and the `.bin` size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MegatronIndex {
    path: PathBuf,
    bin: PathBuf,
    dtype: ScalarType,
    code: u8,
    sequences: u64,
    document_count: u64,
    multimodal: bool,
    tokens: u64,
}

/// `PREFIX.idx` for `PREFIX.bin` (or any path: its extension replaced).
pub fn idx_path(bin: &Path) -> PathBuf {
    bin.with_extension("idx")
}

/// `PREFIX.bin` for `PREFIX.idx`.
pub fn bin_path(idx: &Path) -> PathBuf {
    idx.with_extension("bin")
}

impl MegatronIndex {
    /// Parses the index `idx` (the file `path`, `idx_len` bytes) of a `.bin` of `bin_len`
    /// bytes (named in messages as `path` with the extension `.bin`). O(1): see the module docs.
    pub fn open<R: ReadAt + ?Sized>(
        path: &Path,
        idx: &R,
        idx_len: u64,
        bin_len: u64,
    ) -> Result<MegatronIndex> {
        let bad = |m: String| Error::input(path, m);
        let bin = bin_path(path);
        let mut head = [0u8; HEADER as usize];
        let n = (idx_len.min(HEADER)) as usize;
        read_exact_at(idx, path, &mut head[..n], 0)?;
        if head[..n].starts_with(LEGACY_MAGIC) {
            return Err(bad(
                "a legacy fairseq/Megatron \"TNTIDX\" index (lazy/cached IndexedDataset), not \
                 the MMIDIDX index of Megatron-LM's MMapIndexedDataset that shufflefs reads: \
                 re-run a current Megatron-LM tools/preprocess_data.py, or pack the .bin alone \
                 as raw tokens with --dtype (its documents are then not known)"
                    .into(),
            ));
        }
        let truncated = || {
            bad(format!(
                "a Megatron-LM index truncated to {idx_len} bytes (its header is {HEADER})"
            ))
        };
        if n < MAGIC.len() || head[..MAGIC.len()] != MAGIC[..] {
            return Err(
                if n > 0 && n < MAGIC.len() && MAGIC.starts_with(&head[..n]) {
                    truncated()
                } else {
                    bad("not a Megatron-LM index: it does not start with the magic MMIDIDX".into())
                },
            );
        }
        if n < HEADER as usize {
            return Err(truncated());
        }
        let u64_le = |at: usize| u64::from_le_bytes(head[at..at + 8].try_into().expect("8"));
        let version = u64_le(9);
        if version != VERSION {
            return Err(bad(format!(
                "index version {version}: Megatron-LM writes and reads only version {VERSION}"
            )));
        }
        let code = head[17];
        let dtype = match dtype_of_code(code) {
            Some(t) if t.is_token_type() => t,
            Some(t) => {
                return Err(bad(format!(
                    "dtype code {code} ({t}) is not a token type: Megatron token datasets use \
                     8 (uint16) or 4 (int32)"
                )));
            }
            None => {
                return Err(bad(format!(
                    "unknown dtype code {code}: Megatron-LM's codes are 1 uint8, 2 int8, 3 \
                     int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16"
                )));
            }
        };
        let sequences = u64_le(18);
        let document_count = u64_le(26);
        let overflow = || {
            bad(format!(
                "header counts {sequences} sequences and {document_count} document indices, \
                 more than any file can hold: the header is damaged"
            ))
        };
        let arrays = mul_add(sequences, 12, HEADER).ok_or_else(overflow)?;
        let plain = mul_add(document_count, 8, arrays).ok_or_else(overflow)?;
        let with_modes = plain.checked_add(sequences).ok_or_else(overflow)?;
        let multimodal = if idx_len == plain {
            false
        } else if idx_len == with_modes {
            true
        } else {
            return Err(bad(format!(
                "{idx_len} bytes, but its header counts {sequences} sequences and \
                 {document_count} document indices: {plain} bytes (or {with_modes} with \
                 multimodal modes); the index is truncated or damaged"
            )));
        };
        if document_count == 0 {
            return Err(bad(
                "0 document indices: a Megatron-LM index always has at least the leading 0".into(),
            ));
        }
        let size = dtype.size() as u64;
        if !bin_len.is_multiple_of(size) {
            return Err(Error::input(
                &bin,
                format!(
                    "{bin_len} bytes is not a whole number of {size}-byte {dtype} tokens (the \
                     dtype of {})",
                    path.display()
                ),
            ));
        }
        let index = MegatronIndex {
            path: path.to_path_buf(),
            bin,
            dtype,
            code,
            sequences,
            document_count,
            multimodal,
            tokens: bin_len / size,
        };
        // O(1) cross-checks: the ends of the document indices, the ends of the sequences.
        let first = index.document_index(idx, 0)?;
        let last = index.document_index(idx, document_count - 1)?;
        if first != 0 || last != sequences {
            return Err(bad(format!(
                "document indices run from {first} to {last}, not from 0 to the sequence count \
                 {sequences}: the index is damaged"
            )));
        }
        if sequences == 0 {
            if bin_len != 0 {
                return Err(index.mismatch(format!(
                    "the index has no sequence but it holds {bin_len} bytes"
                )));
            }
        } else {
            let p0 = index.sequence_pointer(idx, 0)?;
            if p0 != 0 {
                return Err(bad(format!(
                    "sequence 0 starts at byte {p0} of the .bin, not 0: the index is damaged"
                )));
            }
            let i = sequences - 1;
            let end = index
                .sequence_pointer(idx, i)?
                .checked_add(index.sequence_length(idx, i)? * size);
            if end != Some(bin_len) {
                let end = end.map_or("beyond 2^64".into(), |e| e.to_string());
                return Err(index.mismatch(format!(
                    "the index's last sequence ends at byte {end}, but it holds {bin_len} bytes"
                )));
            }
        }
        Ok(index)
    }

    /// Opens `PREFIX.idx` and `PREFIX.bin` for `prefix` (`PREFIX`, `PREFIX.bin` or
    /// `PREFIX.idx`) and parses the index; returns it with the open `.idx` for lookups.
    pub fn open_files(prefix: &Path) -> Result<(MegatronIndex, File)> {
        let idx = idx_path(prefix);
        let bin = bin_path(prefix);
        let idx_file = File::open(&idx).map_err(|e| Error::io(&idx, e))?;
        let idx_len = idx_file.metadata().map_err(|e| Error::io(&idx, e))?.len();
        let bin_len = std::fs::metadata(&bin)
            .map_err(|e| Error::io(&bin, e))?
            .len();
        let index = MegatronIndex::open(&idx, &idx_file, idx_len, bin_len)?;
        Ok((index, idx_file))
    }

    fn mismatch(&self, what: String) -> Error {
        Error::input(
            &self.bin,
            format!(
                "does not match its index {}: {what}; pack the .bin with the .idx written with \
                 it",
                self.path.display()
            ),
        )
    }

    fn damaged(&self, what: String) -> Error {
        Error::input(
            &self.path,
            format!("{what}: the index is damaged (re-write it with Megatron-LM)"),
        )
    }

    /// The `.idx` file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The `.bin` file (the `.idx` path with extension `.bin`).
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// The token type of `.bin`.
    pub fn dtype(&self) -> ScalarType {
        self.dtype
    }

    /// The dtype code in the header.
    pub fn dtype_code(&self) -> u8 {
        self.code
    }

    /// Sequences (S).
    pub fn n_sequences(&self) -> u64 {
        self.sequences
    }

    /// Documents (D - 1).
    pub fn n_documents(&self) -> u64 {
        self.document_count - 1
    }

    /// Units of kind `unit`.
    pub fn n_units(&self, unit: Unit) -> u64 {
        match unit {
            Unit::Sequence => self.n_sequences(),
            Unit::Document => self.n_documents(),
        }
    }

    /// Whether the index has the multimodal modes trailer.
    pub fn multimodal(&self) -> bool {
        self.multimodal
    }

    /// Tokens in `.bin`.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    fn lengths_at(&self) -> u64 {
        HEADER
    }

    fn pointers_at(&self) -> u64 {
        HEADER + 4 * self.sequences
    }

    fn doc_indices_at(&self) -> u64 {
        HEADER + 12 * self.sequences
    }

    fn modes_at(&self) -> u64 {
        self.doc_indices_at() + 8 * self.document_count
    }

    fn check_sequence(&self, i: u64) -> Result<()> {
        if i >= self.sequences {
            return Err(Error::invalid(format!(
                "{}: sequence {i} out of range (the index has {})",
                self.path.display(),
                self.sequences
            )));
        }
        Ok(())
    }

    /// Length of sequence `i`, in tokens.
    pub fn sequence_length<R: ReadAt + ?Sized>(&self, idx: &R, i: u64) -> Result<u64> {
        self.check_sequence(i)?;
        let n = i32_at(idx, &self.path, self.lengths_at() + 4 * i)?;
        u64::try_from(n).map_err(|_| self.damaged(format!("sequence {i} has length {n}")))
    }

    /// Byte offset of sequence `i` in `.bin`.
    pub fn sequence_pointer<R: ReadAt + ?Sized>(&self, idx: &R, i: u64) -> Result<u64> {
        self.check_sequence(i)?;
        let p = i64_at(idx, &self.path, self.pointers_at() + 8 * i)?;
        u64::try_from(p).map_err(|_| self.damaged(format!("sequence {i} starts at byte {p}")))
    }

    /// The first token of sequence `s` (`s == S`: the end of the stream).
    fn sequence_start<R: ReadAt + ?Sized>(&self, idx: &R, s: u64) -> Result<u64> {
        if s == self.sequences {
            return Ok(self.tokens);
        }
        let p = self.sequence_pointer(idx, s)?;
        let size = self.dtype.size() as u64;
        if !p.is_multiple_of(size) || p / size > self.tokens {
            return Err(self.damaged(format!(
                "sequence {s} starts at byte {p}, not a {size}-byte token boundary inside the \
                 {}-token .bin",
                self.tokens
            )));
        }
        Ok(p / size)
    }

    /// The tokens of sequence `i`: a range of token offsets into `.bin`.
    pub fn sequence<R: ReadAt + ?Sized>(&self, idx: &R, i: u64) -> Result<Range<u64>> {
        let start = self.sequence_start(idx, i)?;
        let len = self.sequence_length(idx, i)?;
        match start.checked_add(len) {
            Some(end) if end <= self.tokens => Ok(start..end),
            _ => Err(self.damaged(format!(
                "sequence {i} ({len} tokens from token {start}) ends beyond the {}-token .bin",
                self.tokens
            ))),
        }
    }

    /// Document index `k` (`0 <= k <= n_documents()`): the first sequence of document k.
    pub fn document_index<R: ReadAt + ?Sized>(&self, idx: &R, k: u64) -> Result<u64> {
        if k >= self.document_count {
            return Err(Error::invalid(format!(
                "{}: document index {k} out of range (the index has {})",
                self.path.display(),
                self.document_count
            )));
        }
        let v = i64_at(idx, &self.path, self.doc_indices_at() + 8 * k)?;
        match u64::try_from(v) {
            Ok(s) if s <= self.sequences => Ok(s),
            _ => Err(self.damaged(format!(
                "document index {k} is {v}, outside 0..={}",
                self.sequences
            ))),
        }
    }

    /// The sequences of document `d`.
    pub fn document_sequences<R: ReadAt + ?Sized>(&self, idx: &R, d: u64) -> Result<Range<u64>> {
        if d >= self.n_documents() {
            return Err(Error::invalid(format!(
                "{}: document {d} out of range (the index has {})",
                self.path.display(),
                self.n_documents()
            )));
        }
        let b: [u8; 16] = bytes_at(idx, &self.path, self.doc_indices_at() + 8 * d)?;
        let a = i64::from_le_bytes(b[..8].try_into().expect("8"));
        let z = i64::from_le_bytes(b[8..].try_into().expect("8"));
        match (u64::try_from(a), u64::try_from(z)) {
            (Ok(a), Ok(z)) if a <= z && z <= self.sequences => Ok(a..z),
            _ => Err(self.damaged(format!(
                "document {d} runs from sequence {a} to {z}, not an ordered range inside 0..={}",
                self.sequences
            ))),
        }
    }

    /// The tokens of document `d`: a range of token offsets into `.bin` (empty for an empty
    /// document).
    pub fn document<R: ReadAt + ?Sized>(&self, idx: &R, d: u64) -> Result<Range<u64>> {
        let seqs = self.document_sequences(idx, d)?;
        let start = self.sequence_start(idx, seqs.start)?;
        let end = if seqs.is_empty() {
            start
        } else {
            self.sequence_start(idx, seqs.end)?
        };
        if end < start {
            return Err(self.damaged(format!(
                "document {d} ends at token {end}, before its start {start}"
            )));
        }
        Ok(start..end)
    }

    /// The tokens of unit `k` of kind `unit`.
    pub fn unit<R: ReadAt + ?Sized>(&self, idx: &R, unit: Unit, k: u64) -> Result<Range<u64>> {
        match unit {
            Unit::Sequence => self.sequence(idx, k),
            Unit::Document => self.document(idx, k),
        }
    }

    /// The mode of sequence `i` (multimodal indexes only; `None` otherwise).
    pub fn sequence_mode<R: ReadAt + ?Sized>(&self, idx: &R, i: u64) -> Result<Option<i8>> {
        self.check_sequence(i)?;
        if !self.multimodal {
            return Ok(None);
        }
        let [m] = bytes_at::<1, R>(idx, &self.path, self.modes_at() + i)?;
        Ok(Some(m as i8))
    }

    /// Checks the whole index in one sequential pass (O(S + D) reads in bounded blocks): every
    /// length is at least 0, every pointer is the sum of the lengths before it times the
    /// token size, the lengths add up to the `.bin`, the document indices run from 0 to S
    /// without decreasing.
    pub fn verify<R: ReadAt + ?Sized>(&self, idx: &R) -> Result<Verified> {
        let size = self.dtype.size() as u64;
        let mut lengths = Blocks::new(idx, &self.path, self.lengths_at(), self.pointers_at());
        let mut pointers = Blocks::new(idx, &self.path, self.pointers_at(), self.doc_indices_at());
        let (mut i, mut cum, mut empty_sequences) = (0u64, 0u64, 0u64);
        // Pointer blocks hold twice as many entries as length blocks: read two length blocks
        // per pointer block.
        let mut pending: Vec<u8> = Vec::new();
        while let Some(pb) = pointers.next_block()? {
            while pending.len() / 4 < pb.len() / 8 {
                match lengths.next_block()? {
                    Some(lb) => pending.extend_from_slice(lb),
                    None => break,
                }
            }
            let take = pb.len() / 8 * 4;
            for (p, l) in pb.chunks_exact(8).zip(pending[..take].chunks_exact(4)) {
                let p = i64::from_le_bytes(p.try_into().expect("8"));
                let l = i32::from_le_bytes(l.try_into().expect("4"));
                let Ok(l) = u64::try_from(l) else {
                    return Err(self.damaged(format!("sequence {i} has length {l}")));
                };
                if u64::try_from(p).ok() != cum.checked_mul(size) {
                    return Err(self.damaged(format!(
                        "sequence {i} starts at byte {p} of the .bin, but the sequences before \
                         it hold {cum} tokens ({} bytes)",
                        cum as u128 * size as u128
                    )));
                }
                empty_sequences += u64::from(l == 0);
                cum += l;
                if cum > self.tokens {
                    return Err(self.mismatch(format!(
                        "the first {} sequences hold {cum} tokens, more than its {}",
                        i + 1,
                        self.tokens
                    )));
                }
                i += 1;
            }
            pending.drain(..take);
        }
        if cum != self.tokens {
            return Err(self.mismatch(format!(
                "the index's sequences hold {cum} tokens, the .bin {}",
                self.tokens
            )));
        }
        let mut empty_documents = 0u64;
        let mut k = 0u64;
        let mut prev = 0u64;
        self.for_each_document_index(idx, |v| {
            if k == 0 && v != 0 {
                return Err(self.damaged(format!("document index 0 is {v}, not 0")));
            }
            if v < prev {
                return Err(self.damaged(format!(
                    "document index {k} is {v}, less than the one before it ({prev})"
                )));
            }
            empty_documents += u64::from(k > 0 && v == prev);
            prev = v;
            k += 1;
            Ok(())
        })?;
        if prev != self.sequences {
            return Err(self.damaged(format!(
                "the last document index is {prev}, not the sequence count {}",
                self.sequences
            )));
        }
        Ok(Verified {
            sequences: self.sequences,
            documents: self.n_documents(),
            empty_documents,
            empty_sequences,
            tokens: self.tokens,
        })
    }

    /// Calls `f` with each document index in order (checked in `0..=S`).
    fn for_each_document_index<R: ReadAt + ?Sized>(
        &self,
        idx: &R,
        mut f: impl FnMut(u64) -> Result<()>,
    ) -> Result<()> {
        let mut blocks = Blocks::new(idx, &self.path, self.doc_indices_at(), self.modes_at());
        let mut k = 0u64;
        while let Some(b) = blocks.next_block()? {
            for v in b.chunks_exact(8) {
                let v = i64::from_le_bytes(v.try_into().expect("8"));
                match u64::try_from(v) {
                    Ok(s) if s <= self.sequences => f(s)?,
                    _ => {
                        return Err(self.damaged(format!(
                            "document index {k} is {v}, outside 0..={}",
                            self.sequences
                        )));
                    }
                }
                k += 1;
            }
        }
        Ok(())
    }

    /// Calls `f` with the end (exclusive token offset into `.bin`) of every unit of kind
    /// `unit`, in order, in one sequential pass over the lengths (and the document indices
    /// for [`Unit::Document`]): the cumulative document ends of a compact document index (an
    /// empty document repeats the previous end). The ends come from the lengths; they equal
    /// the pointers' when [`MegatronIndex::verify`] passed.
    pub fn for_each_end<R: ReadAt + ?Sized>(
        &self,
        idx: &R,
        unit: Unit,
        mut f: impl FnMut(u64) -> Result<()>,
    ) -> Result<()> {
        let mut lengths = Blocks::new(idx, &self.path, self.lengths_at(), self.pointers_at());
        let mut block: Vec<u8> = Vec::new();
        let mut at = 0usize; // next length in `block`
        let (mut seq, mut cum) = (0u64, 0u64);
        let mut next_length = |seq: u64| -> Result<u64> {
            if at == block.len() {
                block.clear();
                match lengths.next_block()? {
                    Some(b) => block.extend_from_slice(b),
                    None => return Err(self.damaged(format!("sequence {seq} has no length"))),
                }
                at = 0;
            }
            let l = i32::from_le_bytes(block[at..at + 4].try_into().expect("4"));
            at += 4;
            u64::try_from(l).map_err(|_| self.damaged(format!("sequence {seq} has length {l}")))
        };
        let mut advance = |to: u64, seq: &mut u64, cum: &mut u64| -> Result<u64> {
            while *seq < to {
                *cum += next_length(*seq)?;
                if *cum > self.tokens {
                    return Err(self.mismatch(format!(
                        "the first {} sequences hold {cum} tokens, more than its {}",
                        *seq + 1,
                        self.tokens
                    )));
                }
                *seq += 1;
            }
            Ok(*cum)
        };
        match unit {
            Unit::Sequence => {
                for s in 0..self.sequences {
                    f(advance(s + 1, &mut seq, &mut cum)?)?;
                }
            }
            Unit::Document => {
                let mut k = 0u64;
                self.for_each_document_index(idx, |v| {
                    if v < seq {
                        return Err(self.damaged(format!(
                            "document index {k} is {v}, less than the one before it ({seq})"
                        )));
                    }
                    let end = advance(v, &mut seq, &mut cum)?;
                    if k > 0 {
                        f(end)?;
                    }
                    k += 1;
                    Ok(())
                })?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

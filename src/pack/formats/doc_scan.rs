//! Document boundaries from a special token id, for token files without an index: one
//! sequential pass over the tokens (O(tokens) time at pack time) that produces a compact
//! document index, the cumulative document ends as u64 token offsets (O(documents) bytes;
//! the same layout as a datatrove `.ds.index`). No token is copied.
//!
//! Each format's own rule ([`Rule`]):
//! - **OLMo-core over Dolma token files** (`olmo_core/data/utils.py` `iter_document_indices`,
//!   per file): without a BOS id, a document ends at (and includes) each EOS; with a BOS id,
//!   a boundary is an EOS immediately followed by the BOS, plus a final EOS (so with
//!   eos = bos the pattern is the pair `EOS EOS`). Tokens after the last boundary belong to
//!   no document: OLMo leaves them out, and so does [`Rule::olmo`] ([`Tail::Exclude`]; they
//!   are reported as [`DocIndex::excluded`]). Dolma writes whole documents, so the tail is
//!   empty in files it wrote. OLMo scans each file on its own: use one [`Scanner`] per file.
//! - **nanoGPT** (`data/openwebtext/prepare.py` appends the EOT 50256): a document ends at and
//!   includes each EOT; trailing tokens without an EOT (not written by prepare.py) are a last
//!   document ([`Rule::nanogpt`], [`Tail::Document`]), as the reference reader counts them.
//! - **llm.c** (`dev/data/fineweb.py` prepends the EOT: 50256 for gpt-2, 128000
//!   `<|begin_of_text|>` for llama-3): a document starts at (and includes) each EOT and runs
//!   to the next; tokens before the first EOT are a document too (a shard read without its
//!   predecessor starts mid-document). Documents span shards: feed all shards, in order, to
//!   one [`Scanner`] ([`Rule::llmc`]).

use std::ops::Range;
use std::path::Path;

use super::index_io::Blocks;
use crate::error::{Error, Result};
use crate::format::dtype::ScalarType;
use crate::storage::ReadAt;

/// GPT-2's `<|endoftext|>` (nanoGPT's and llm.c gpt-2's EOT, Megatron's GPT-2 EOD).
pub const GPT2_EOT: u64 = 50_256;
/// Llama 3's `<|begin_of_text|>` (llm.c llama-3's EOT, prepended).
pub const LLAMA3_BOS: u64 = 128_000;

/// What happens to tokens after the last boundary of an EOS rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// They belong to no document (OLMo).
    Exclude,
    /// They are one more document (nanoGPT's reference reading).
    Document,
}

/// Where documents begin and end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// A document ends at and includes each `eos`.
    EosEnds {
        /// The end-of-sequence id.
        eos: u64,
        /// Tokens after the last EOS.
        tail: Tail,
    },
    /// A document ends at an `eos` immediately followed by `bos`, or at a final `eos`.
    EosBeforeBos {
        /// The end-of-sequence id.
        eos: u64,
        /// The beginning-of-sequence id.
        bos: u64,
        /// Tokens after the last boundary.
        tail: Tail,
    },
    /// A document starts at and includes each `bos`; tokens before the first are a document.
    BosStarts {
        /// The id that starts every document.
        bos: u64,
    },
}

impl Rule {
    /// OLMo-core's `iter_document_indices` (see the module docs).
    pub fn olmo(eos: u64, bos: Option<u64>) -> Rule {
        let tail = Tail::Exclude;
        match bos {
            None => Rule::EosEnds { eos, tail },
            Some(bos) => Rule::EosBeforeBos { eos, bos, tail },
        }
    }

    /// nanoGPT's `prepare.py`: EOT-terminated documents (`eos` is 50,256 there).
    pub fn nanogpt(eos: u64) -> Rule {
        Rule::EosEnds {
            eos,
            tail: Tail::Document,
        }
    }

    /// llm.c's `fineweb.py`: EOT-started documents (50,256 for gpt-2, 128,000 for llama-3).
    pub fn llmc(eot: u64) -> Rule {
        Rule::BosStarts { bos: eot }
    }

    fn ids(&self) -> Vec<u64> {
        match *self {
            Rule::EosEnds { eos, .. } => vec![eos],
            Rule::EosBeforeBos { eos, bos, .. } => vec![eos, bos],
            Rule::BosStarts { bos } => vec![bos],
        }
    }
}

/// A document index: documents are `[ends[d - 1], ends[d])` (`ends[-1]` = 0) of a stream of
/// `tokens` tokens; tokens after the last end belong to no document.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DocIndex {
    /// Cumulative document ends (exclusive token offsets), non-decreasing.
    pub ends: Vec<u64>,
    /// Tokens scanned.
    pub tokens: u64,
}

impl DocIndex {
    /// Documents.
    pub fn n_documents(&self) -> usize {
        self.ends.len()
    }

    /// The tokens of document `d`.
    pub fn document(&self, d: usize) -> Option<Range<u64>> {
        let end = *self.ends.get(d)?;
        let start = if d == 0 { 0 } else { self.ends[d - 1] };
        Some(start..end)
    }

    /// Tokens after the last document (excluded by an OLMo rule).
    pub fn excluded(&self) -> u64 {
        self.tokens - self.ends.last().copied().unwrap_or(0)
    }

    /// The ends as little-endian u64 (a datatrove `.ds.index`).
    pub fn to_le_bytes(&self) -> Vec<u8> {
        self.ends.iter().flat_map(|e| e.to_le_bytes()).collect()
    }
}

/// Finds document boundaries in tokens fed front to back (see the module docs).
#[derive(Clone, Debug)]
pub struct Scanner {
    rule: Rule,
    dtype: ScalarType,
    /// The rule's ids as the dtype's little-endian bytes (first `dtype.size()` bytes used).
    eos: [u8; 8],
    bos: [u8; 8],
    pos: u64,
    pending_eos: bool,
    carry: Vec<u8>,
    ends: Vec<u64>,
}

/// `id` as `dtype`'s little-endian bytes, if it fits.
fn id_bytes(id: u64, dtype: ScalarType) -> Option<[u8; 8]> {
    let (lo, hi) = dtype.int_range()?;
    if i128::from(id) < lo || i128::from(id) > hi {
        return None;
    }
    Some(id.to_le_bytes())
}

impl Scanner {
    /// A scanner of `dtype` tokens (an integer token type) by `rule`. An id that `dtype`
    /// cannot hold is refused (no token could match it).
    pub fn new(rule: Rule, dtype: ScalarType) -> Result<Scanner> {
        if !dtype.is_token_type() {
            return Err(Error::invalid(format!(
                "{dtype} is not a token type: document boundaries are found in integer tokens"
            )));
        }
        for id in rule.ids() {
            if id_bytes(id, dtype).is_none() {
                return Err(Error::invalid(format!(
                    "token id {id} does not fit {dtype} tokens: check --doc-sep (or --bos) and \
                     --dtype"
                )));
            }
        }
        let [first, second] = match rule {
            Rule::EosEnds { eos, .. } => [eos, eos],
            Rule::EosBeforeBos { eos, bos, .. } => [eos, bos],
            Rule::BosStarts { bos } => [bos, bos],
        }
        .map(|id| id.to_le_bytes());
        Ok(Scanner {
            rule,
            dtype,
            eos: first,
            bos: second,
            pos: 0,
            pending_eos: false,
            carry: Vec::new(),
            ends: Vec::new(),
        })
    }

    /// Tokens fed so far.
    pub fn tokens(&self) -> u64 {
        self.pos
    }

    /// Feeds the next tokens (little-endian `dtype` values; a token cut between two calls is
    /// joined).
    pub fn feed(&mut self, mut bytes: &[u8]) {
        let size = self.dtype.size();
        if !self.carry.is_empty() {
            let need = size - self.carry.len();
            let take = need.min(bytes.len());
            self.carry.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.carry.len() < size {
                return;
            }
            let token = std::mem::take(&mut self.carry);
            self.feed_whole(&token);
        }
        let whole = bytes.len() / size * size;
        self.feed_whole(&bytes[..whole]);
        self.carry.extend_from_slice(&bytes[whole..]);
    }

    fn feed_whole(&mut self, bytes: &[u8]) {
        match self.dtype.size() {
            1 => self.scan::<1>(bytes),
            2 => self.scan::<2>(bytes),
            4 => self.scan::<4>(bytes),
            _ => self.scan::<8>(bytes),
        }
    }

    fn scan<const N: usize>(&mut self, bytes: &[u8]) {
        let eos: [u8; N] = self.eos[..N].try_into().expect("N <= 8");
        let bos: [u8; N] = self.bos[..N].try_into().expect("N <= 8");
        let base = self.pos;
        let tokens = bytes
            .chunks_exact(N)
            .map(|c| -> [u8; N] { c.try_into().expect("N") });
        match self.rule {
            Rule::EosEnds { .. } => {
                for (i, t) in tokens.enumerate() {
                    if t == eos {
                        self.ends.push(base + i as u64 + 1);
                    }
                }
            }
            Rule::EosBeforeBos { .. } => {
                let mut pending = self.pending_eos;
                for (i, t) in tokens.enumerate() {
                    if pending && t == bos {
                        self.ends.push(base + i as u64);
                    }
                    pending = t == eos;
                }
                self.pending_eos = pending;
            }
            Rule::BosStarts { .. } => {
                for (i, t) in tokens.enumerate() {
                    let at = base + i as u64;
                    if t == bos && at > 0 {
                        self.ends.push(at);
                    }
                }
            }
        }
        self.pos += (bytes.len() / N) as u64;
    }

    /// The document index of everything fed. A partial token left over is an error.
    pub fn finish(mut self) -> Result<DocIndex> {
        if !self.carry.is_empty() {
            return Err(Error::invalid(format!(
                "the tokens end with {} bytes of a partial {}-byte token",
                self.carry.len(),
                self.dtype.size()
            )));
        }
        let last = self.ends.last().copied().unwrap_or(0);
        match self.rule {
            Rule::EosBeforeBos { tail, .. } => {
                if self.pending_eos || (tail == Tail::Document && last < self.pos) {
                    self.ends.push(self.pos);
                }
            }
            Rule::EosEnds { tail, .. } => {
                if tail == Tail::Document && last < self.pos {
                    self.ends.push(self.pos);
                }
            }
            Rule::BosStarts { .. } => {
                if self.pos > 0 {
                    self.ends.push(self.pos);
                }
            }
        }
        Ok(DocIndex {
            ends: self.ends,
            tokens: self.pos,
        })
    }

    /// Feeds `tokens` tokens at byte `offset` of `src` (the file `path`), read front to back
    /// in bounded blocks.
    pub fn feed_source<R: ReadAt + ?Sized>(
        &mut self,
        src: &R,
        path: &Path,
        offset: u64,
        tokens: u64,
    ) -> Result<()> {
        let bytes = tokens
            .checked_mul(self.dtype.size() as u64)
            .and_then(|b| b.checked_add(offset))
            .ok_or_else(|| Error::invalid(format!("{}: token count overflows", path.display())))?;
        let mut blocks = Blocks::new(src, path, offset, bytes);
        while let Some(b) = blocks.next_block()? {
            self.feed(b);
        }
        Ok(())
    }
}

/// The document index of one token file (`tokens` `dtype` tokens at byte `offset`) by
/// `rule`, in one sequential pass.
pub fn scan<R: ReadAt + ?Sized>(
    src: &R,
    path: &Path,
    offset: u64,
    tokens: u64,
    dtype: ScalarType,
    rule: Rule,
) -> Result<DocIndex> {
    let mut s = Scanner::new(rule, dtype)?;
    s.feed_source(src, path, offset, tokens)?;
    s.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16s(v: &[u16]) -> Vec<u8> {
        v.iter().flat_map(|t| t.to_le_bytes()).collect()
    }

    fn run(rule: Rule, toks: &[u16]) -> DocIndex {
        let mut s = Scanner::new(rule, ScalarType::U16).unwrap();
        s.feed(&u16s(toks));
        s.finish().unwrap()
    }

    const E: u16 = 9;
    const B: u16 = 8;

    #[test]
    fn olmo_without_bos() {
        let d = run(Rule::olmo(9, None), &[1, 2, E, 3, E, E, 4, 5]);
        assert_eq!(d.ends, [3, 5, 6]);
        assert_eq!((d.tokens, d.excluded()), (8, 2));
        assert_eq!(d.document(1), Some(3..5));
        assert_eq!(d.document(3), None);
        assert_eq!(run(Rule::olmo(9, None), &[1, 2]).ends, Vec::<u64>::new());
        assert_eq!(run(Rule::olmo(9, None), &[]).ends, Vec::<u64>::new());
    }

    #[test]
    fn olmo_with_bos() {
        // Boundary = EOS followed by BOS, plus a final EOS; a lone EOS inside is no boundary.
        let d = run(Rule::olmo(9, Some(8)), &[B, 1, E, B, 2, E, 3, E, B, 4, E]);
        assert_eq!(d.ends, [3, 8, 11]);
        assert_eq!(d.excluded(), 0);
        // Without a final EOS the tail is excluded.
        let d = run(Rule::olmo(9, Some(8)), &[B, 1, E, B, 2]);
        assert_eq!((d.ends.as_slice(), d.excluded()), (&[3u64][..], 2));
        // eos == bos: the pair EOS EOS (OLMo's dolma2_sigdig, gpt2).
        let d = run(Rule::olmo(9, Some(9)), &[E, 1, E, E, 2, E, E, E]);
        assert_eq!(d.ends, [3, 6, 7, 8]);
    }

    #[test]
    fn nanogpt_and_llmc() {
        let d = run(Rule::nanogpt(9), &[1, E, 2, 3, E, 4]);
        assert_eq!(d.ends, [2, 5, 6]);
        assert_eq!(run(Rule::nanogpt(9), &[1, E]).ends, [2]);
        let d = run(Rule::llmc(9), &[E, 1, 2, E, 3]);
        assert_eq!(d.ends, [3, 5]);
        // A shard that starts mid-document.
        let d = run(Rule::llmc(9), &[1, 2, E, 3]);
        assert_eq!(d.ends, [2, 4]);
        assert_eq!(run(Rule::llmc(9), &[]).ends, Vec::<u64>::new());
    }

    #[test]
    fn chunking_does_not_matter() {
        // Any split of the bytes (even inside a token, between EOS and BOS) gives the same
        // index as one feed.
        let toks: Vec<u16> = (0..500u32)
            .map(|i| [1, E, B, E, E, 3][(i * 7 % 11 % 6) as usize])
            .collect();
        let bytes = u16s(&toks);
        for rule in [
            Rule::olmo(9, None),
            Rule::olmo(9, Some(8)),
            Rule::olmo(9, Some(9)),
            Rule::nanogpt(9),
            Rule::llmc(9),
        ] {
            let want = run(rule, &toks);
            for step in [1usize, 2, 3, 5, 64, 999] {
                let mut s = Scanner::new(rule, ScalarType::U16).unwrap();
                for c in bytes.chunks(step) {
                    s.feed(c);
                }
                assert_eq!(s.finish().unwrap(), want, "{rule:?} step {step}");
            }
        }
    }

    #[test]
    fn wide_and_signed_types() {
        let toks: Vec<u8> = [5u32, 100_257, 7, 100_257]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        let d = scan(
            &toks,
            Path::new("t"),
            0,
            4,
            ScalarType::U32,
            Rule::olmo(100_257, None),
        )
        .unwrap();
        assert_eq!(d.ends, [2, 4]);
        let toks: Vec<u8> = [-1i32, 50_256, 3]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        let d = scan(
            &toks,
            Path::new("t"),
            0,
            3,
            ScalarType::I32,
            Rule::nanogpt(50_256),
        )
        .unwrap();
        assert_eq!(d.ends, [2, 3]);
        // An offset (an llm.c header), and the file shorter than the count.
        let mut f = vec![0u8; 4];
        f.extend(u16s(&[E, 1, E]));
        let d = scan(&f, Path::new("t"), 4, 3, ScalarType::U16, Rule::llmc(9)).unwrap();
        assert_eq!(d.ends, [2, 3]);
        assert!(scan(&f, Path::new("t"), 4, 4, ScalarType::U16, Rule::llmc(9)).is_err());
        assert!(
            scan(
                &f,
                Path::new("t"),
                4,
                u64::MAX,
                ScalarType::U16,
                Rule::llmc(9)
            )
            .is_err()
        );
    }

    #[test]
    fn refusals() {
        assert!(
            Scanner::new(Rule::olmo(100_257, None), ScalarType::U16)
                .unwrap_err()
                .to_string()
                .contains("does not fit u16")
        );
        assert!(Scanner::new(Rule::olmo(1, Some(256)), ScalarType::U8).is_err());
        assert!(Scanner::new(Rule::llmc(1), ScalarType::F32).is_err());
        let mut s = Scanner::new(Rule::llmc(1), ScalarType::U16).unwrap();
        s.feed(&[1, 0, 1]);
        assert!(s.finish().unwrap_err().to_string().contains("partial"));
        let d = DocIndex {
            ends: vec![2, 5],
            tokens: 6,
        };
        assert_eq!(d.to_le_bytes()[8..16], 5u64.to_le_bytes());
    }
}

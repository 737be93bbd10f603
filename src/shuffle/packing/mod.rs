//! Packed rows: BOS-aligned best-fit packing of documents into rows of exactly `window` tokens,
//! random-access per row and exact on resume (`--mode packed --bos ID`).
//!
//! The contract (the user-facing docs get it when the view serves packed rows):
//!
//! - A document of `L > 0` tokens occupies `l = L + 1` row tokens when a BOS is prepended (a BOS
//!   id is configured and the document does not already start with it), else `l = L`. Empty
//!   documents are never placed.
//! - Every row holds exactly `T = window` tokens, starts with a document's first token (its BOS),
//!   holds whole documents in non-increasing length, then at most one *crop*: a prefix of one
//!   more document filling the row exactly. No padding. A document's rest after a crop is lost.
//! - Each epoch `e` orders the documents by `perm_e = Permutation::new(n, seed, e)` and cuts that
//!   order into `blocks = ceil(n / block_docs)` blocks of consecutive positions (sizes differ by at
//!   most one). Every block yields exactly `rows_per_block` rows, so global row `g` is row
//!   `rowperm_{e,b}(g mod R)` of block `b = g div R`: O(1) arithmetic, then one block's packing
//!   (O(B log B) for a block of `B` documents, lengths read through a callback).
//! - Packing a block ([`pack_docs`]): take the shortest prefix of the block's order whose capped
//!   mass `sum min(l, T)` reaches `R*T`; documents of at least `T` tokens in it get a row of their
//!   own (cropped to `T`); the others go largest first into the remaining rows, each into the row
//!   with the least space that holds it (best fit decreasing); the block's remaining documents,
//!   in order, fill leftover space where they fit whole; every row still short gets a crop of one
//!   of the shortest documents left over. The block's unused documents are dropped for the
//!   epoch (they do not reach rows). Dropped documents are the longest set-aside ones, so a
//!   document of `l >= T` reaches rows when its position falls in its block's prefix (then it
//!   is an anchor): a chance of about `R*T / mass` (97% at the default block size on the
//!   baseline corpus) every epoch, independent of its length; no length starves for ever.
//! - `R` is calibrated once from the corpus (see [`Packer::new`]): an exact pass over the lengths
//!   plus the packing of a few sample blocks gives the expected capped mass of a block, its spread
//!   (an integer Bernstein margin) and the packing's own loss. A block that still falls short
//!   (rare by construction) borrows the dropped documents of the following blocks, which needs one
//!   pass over the epoch ([`Packer::epoch_stats`] runs the same pass); nothing else does.
//!
//! Everything is integer arithmetic and a function of (config, n, the lengths): the same rows on
//! every node, in every read order, after any resume. Floating point appears only in the
//! reporting helpers (`*_share`).

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use crate::shuffle::feistel::{Permutation, mix};

/// Name of the algorithm, for fingerprints: bump it when any rule or formula changes.
pub(crate) const ALGORITHM: &str = "bestfit-blocks-v1";

/// Default upper bound on the documents of one block (`--pack-block-docs`).
pub(crate) const DEFAULT_BLOCK_DOCS: u64 = 1 << 16;

/// Sample blocks packed to calibrate `rows_per_block` and estimate the crop share.
pub(crate) const CALIBRATION_SAMPLES: u64 = 4;

/// Bernstein exponent of the block-mass margin: a block of random documents falls short of the
/// calibrated mass with probability at most `exp(-14)` (under 1e-6), before the packing-loss
/// slack; a block that does borrows (slow path, still exact).
pub(crate) const MARGIN_LAMBDA: u128 = 14;

/// Largest window accepted (keeps every sum in range of the integer formulas).
pub(crate) const MAX_WINDOW: u64 = 1 << 32;

/// Largest `block_docs` accepted: a block's documents are held in memory while it is packed
/// (32 bytes each: 128 MiB at this bound).
pub(crate) const MAX_BLOCK_DOCS: u64 = 1 << 22;

/// Largest corpus accepted, in packed tokens (`sum l`): every token sum of the algorithm, a
/// lent document counted twice included, then fits in a `u64`.
pub(crate) const MAX_TOKENS: u64 = 1 << 62;

const DOMAIN_ROWS: u64 = 0x706b_726f_7773_3031; // "pkrows01"
const DOMAIN_CALIBRATE: u64 = 0x706b_6361_6c69_6231; // "pkcalib1"

/// What the packer is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PackConfig {
    /// Row length `T` in tokens (the window).
    pub(crate) window: u64,
    /// The BOS token id: documents not starting with it get it prepended. `None`: documents are
    /// used as they are (rows still start at a document's first token).
    pub(crate) bos: Option<u64>,
    /// Upper bound on the documents of a block (the cost of packing one block).
    pub(crate) block_docs: u64,
    /// The shuffle seed.
    pub(crate) seed: u64,
    /// Use exactly this many rows per block instead of the calibrated number.
    pub(crate) rows_per_block: Option<u64>,
}

impl PackConfig {
    /// Default block size, calibrated rows.
    pub(crate) fn new(window: u64, bos: Option<u64>, seed: u64) -> PackConfig {
        PackConfig {
            window,
            bos,
            block_docs: DEFAULT_BLOCK_DOCS,
            seed,
            rows_per_block: None,
        }
    }
}

/// A document as the length callback reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DocLen {
    /// Tokens of the document.
    pub(crate) tokens: u64,
    /// Whether its first token is the BOS id (ignored without a BOS id).
    pub(crate) starts_with_bos: bool,
}

impl DocLen {
    /// Row tokens the whole document occupies and whether a BOS is prepended.
    fn packed(self, bos: bool) -> (u64, bool) {
        if self.tokens == 0 {
            return (0, false);
        }
        let prepend = bos && !self.starts_with_bos;
        (self.tokens.saturating_add(u64::from(prepend)), prepend)
    }
}

/// One document's contribution to a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Piece {
    /// Document id (its index in the dataset's documents).
    pub(crate) doc: u64,
    /// Row tokens of the piece, the prepended BOS included.
    pub(crate) len: u64,
    /// The piece begins with a prepended BOS token, then the document's tokens.
    pub(crate) bos_prepended: bool,
    /// The piece is a strict prefix of the document (the row's last piece).
    pub(crate) cropped: bool,
}

impl Piece {
    /// The document's tokens in this piece: always a prefix `0..k` of the document.
    pub(crate) fn doc_tokens(&self) -> Range<u64> {
        0..self.len - u64::from(self.bos_prepended)
    }
}

/// Token and document counts of packed blocks. Shares are of packed tokens (a document's tokens
/// plus its prepended BOS).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TokenCounts {
    /// Blocks counted.
    pub(crate) blocks: u64,
    /// Rows made.
    pub(crate) rows: u64,
    /// Non-empty documents the blocks own.
    pub(crate) docs: u64,
    /// Documents in rows (whole or cropped, own or borrowed).
    pub(crate) docs_used: u64,
    /// Documents in rows as a crop (a strict prefix).
    pub(crate) docs_cropped: u64,
    /// Documents read but placed in no row.
    pub(crate) docs_dropped: u64,
    /// Documents borrowed from other blocks.
    pub(crate) docs_borrowed: u64,
    /// `rows * T`.
    pub(crate) row_tokens: u64,
    /// Packed tokens of the documents in rows.
    pub(crate) used_tokens: u64,
    /// `used_tokens - row_tokens`: the cropped-off rests.
    pub(crate) cropped_tokens: u64,
    /// Packed tokens of the dropped documents.
    pub(crate) dropped_tokens: u64,
}

impl TokenCounts {
    /// Saturating: the calibration adds up the same corpus several times.
    fn add(&mut self, o: &TokenCounts) {
        self.blocks = self.blocks.saturating_add(o.blocks);
        self.rows = self.rows.saturating_add(o.rows);
        self.docs = self.docs.saturating_add(o.docs);
        self.docs_used = self.docs_used.saturating_add(o.docs_used);
        self.docs_cropped = self.docs_cropped.saturating_add(o.docs_cropped);
        self.docs_dropped = self.docs_dropped.saturating_add(o.docs_dropped);
        self.docs_borrowed = self.docs_borrowed.saturating_add(o.docs_borrowed);
        self.row_tokens = self.row_tokens.saturating_add(o.row_tokens);
        self.used_tokens = self.used_tokens.saturating_add(o.used_tokens);
        self.cropped_tokens = self.cropped_tokens.saturating_add(o.cropped_tokens);
        self.dropped_tokens = self.dropped_tokens.saturating_add(o.dropped_tokens);
    }

    /// Cropped tokens over the tokens of the documents used (nanochat's "crop share").
    pub(crate) fn crop_share(&self) -> f64 {
        ratio(self.cropped_tokens, self.used_tokens)
    }

    /// Dropped tokens over all tokens read (used + dropped).
    pub(crate) fn drop_share(&self) -> f64 {
        ratio(self.dropped_tokens, self.used_tokens + self.dropped_tokens)
    }

    /// Tokens in rows over all tokens read.
    pub(crate) fn reach_share(&self) -> f64 {
        ratio(self.row_tokens, self.used_tokens + self.dropped_tokens)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The packed rows of one block, in row-index order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PackedBlock {
    /// Epoch.
    pub(crate) epoch: u64,
    /// Block index.
    pub(crate) block: u64,
    pieces: Vec<Piece>,
    ends: Vec<usize>,
    /// What the block used, cropped and dropped (borrowed documents included).
    pub(crate) counts: TokenCounts,
}

impl PackedBlock {
    /// Number of rows (`rows_per_block`).
    pub(crate) fn rows(&self) -> usize {
        self.ends.len()
    }

    /// Row `i`'s pieces in row order. Panics if `i >= rows()`.
    pub(crate) fn row(&self, i: usize) -> &[Piece] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.pieces[start..self.ends[i]]
    }

    /// All rows in row-index order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &[Piece]> {
        (0..self.rows()).map(|i| self.row(i))
    }
}

/// Where a global row is: block and row index within the block's [`PackedBlock`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RowRef {
    /// Block.
    pub(crate) block: u64,
    /// Row index in the block.
    pub(crate) row: u64,
}

/// Why packing failed.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum PackError<E> {
    /// The length callback failed.
    Len(E),
    /// The configuration cannot work (message says what to change).
    Config(String),
    /// The block cannot fill its rows even with every document the rest of the epoch drops.
    Infeasible {
        /// Epoch.
        epoch: u64,
        /// Block.
        block: u64,
    },
}

impl<E: fmt::Display> fmt::Display for PackError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PackError::Len(e) => write!(f, "reading a document length: {e}"),
            PackError::Config(m) => write!(f, "packing configuration: {m}"),
            PackError::Infeasible { epoch, block } => write!(
                f,
                "packing: block {block} of epoch {epoch} cannot fill its rows, even with the \
                 documents the other blocks drop; set fewer rows per block"
            ),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for PackError<E> {}

/// Exact, order-independent figures of the corpus, from one pass over the lengths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CorpusStats {
    /// Documents.
    pub(crate) docs: u64,
    /// Documents with at least one token.
    pub(crate) nonempty_docs: u64,
    /// Packed tokens `sum l`.
    pub(crate) tokens: u64,
    /// Capped mass `sum min(l, T)`: the most the corpus can put in rows.
    pub(crate) capped_tokens: u64,
    /// `sum min(l, T)^2` (for the margin).
    pub(crate) capped_sq: u128,
    /// Documents with `l > T`.
    pub(crate) long_docs: u64,
    /// `sum max(0, l - T)`: tokens no prefix-only packing can place.
    pub(crate) tokens_beyond_window: u64,
    /// Documents that get a BOS prepended.
    pub(crate) bos_prepended: u64,
}

impl CorpusStats {
    /// One pass over the `n_docs` lengths. Refuses a corpus of more than [`MAX_TOKENS`] packed
    /// tokens (a document of `u64::MAX` tokens with a BOS to prepend included).
    pub(crate) fn scan<E>(
        n_docs: u64,
        window: u64,
        bos: bool,
        mut len: impl FnMut(u64) -> Result<DocLen, E>,
    ) -> Result<CorpusStats, PackError<E>> {
        let mut s = CorpusStats {
            docs: n_docs,
            ..CorpusStats::default()
        };
        for doc in 0..n_docs {
            let d = len(doc).map_err(PackError::Len)?;
            let (l, prepend) = d.packed(bos);
            let total = s.tokens.checked_add(l).filter(|&t| t <= MAX_TOKENS);
            let (Some(total), false) = (total, d.tokens == u64::MAX && prepend) else {
                return Err(PackError::Config(format!(
                    "document {doc} ({} tokens) takes the corpus past {MAX_TOKENS} tokens, the \
                     most packed mode handles; split the dataset",
                    d.tokens
                )));
            };
            if l == 0 {
                continue;
            }
            let m = l.min(window);
            s.nonempty_docs += 1;
            s.tokens = total;
            s.capped_tokens += m;
            s.capped_sq += u128::from(m) * u128::from(m);
            s.long_docs += u64::from(l > window);
            s.tokens_beyond_window += l - m;
            s.bos_prepended += u64::from(prepend);
        }
        Ok(s)
    }
}

/// How `rows_per_block` was chosen, and what the sample blocks gave at that number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Calibration {
    /// Documents of the smallest block.
    pub(crate) min_block_docs: u64,
    /// Expected capped mass of the smallest block, `floor(Bmin * capped / n)`.
    pub(crate) block_mass: u64,
    /// The Bernstein margin on that mass (0 with a single block).
    pub(crate) margin: u64,
    /// Packing loss of each sample block, `mass - T * (most rows it can fill)`.
    pub(crate) sample_loss: Vec<u64>,
    /// The loss allowed for: `max(sample_loss) * 5/4 + T`.
    pub(crate) loss_allowance: u64,
    /// Counts of the sample blocks packed at the chosen `rows_per_block` (the estimate for
    /// `info.json`); samples that would have to borrow are left out and counted here.
    pub(crate) estimate: TokenCounts,
    /// Sample blocks that could not fill `rows_per_block` rows on their own.
    pub(crate) samples_short: u64,
}

/// Exact figures of one epoch (every block packed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct EpochStats {
    /// Epoch.
    pub(crate) epoch: u64,
    /// Counts over all blocks (a lent document counts once, as its borrower's).
    pub(crate) counts: TokenCounts,
    /// Blocks that borrowed.
    pub(crate) blocks_borrowing: u64,
    /// Blocks that could not fill their rows (their steps fail with [`PackError::Infeasible`]).
    pub(crate) blocks_infeasible: u64,
}

/// What `info.json` reports about packing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PackSummary {
    /// [`ALGORITHM`].
    pub(crate) algorithm: &'static str,
    /// Row length `T`.
    pub(crate) window: u64,
    /// BOS id.
    pub(crate) bos: Option<u64>,
    /// Blocks per epoch.
    pub(crate) blocks: u64,
    /// Documents per block (smallest, largest).
    pub(crate) block_docs: (u64, u64),
    /// Rows per block.
    pub(crate) rows_per_block: u64,
    /// Rows per epoch (`blocks * rows_per_block`), the same every epoch.
    pub(crate) rows_per_epoch: u64,
    /// Exact corpus figures.
    pub(crate) corpus: CorpusStats,
    /// Calibration, with the estimated crop and drop counts of its sample blocks.
    pub(crate) calibration: Calibration,
}

impl PackSummary {
    /// Real tokens over row tokens: 1 (no padding), exactly.
    pub(crate) fn utilisation(&self) -> f64 {
        1.0
    }

    /// Share of the corpus's packed tokens that reach rows each epoch: exact,
    /// `rows_per_epoch * T / corpus.tokens`.
    pub(crate) fn reach_share(&self) -> f64 {
        ratio(
            self.rows_per_epoch.saturating_mul(self.window),
            self.corpus.tokens,
        )
    }

    /// `tokens_beyond_window / tokens`: the crop no prefix-only packing avoids (exact).
    pub(crate) fn unavoidable_crop_share(&self) -> f64 {
        ratio(self.corpus.tokens_beyond_window, self.corpus.tokens)
    }

    /// Cropped over used tokens, estimated on the calibration blocks.
    pub(crate) fn crop_share_estimate(&self) -> f64 {
        self.calibration.estimate.crop_share()
    }
}

/// A document inside a packing: `ord` is its rank in the block's list (own documents by
/// position, then borrowed ones), the tie-break everywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Doc {
    id: u64,
    len: u64,
    bos: bool,
    ord: u64,
}

/// The result of [`pack_docs`].
struct Packing {
    pieces: Vec<Piece>,
    ends: Vec<usize>,
    counts: TokenCounts,
    /// Borrowed documents read, in order (to replay the packing).
    borrowed: Vec<Doc>,
    /// Own documents placed in no row, in position order (what this block can lend).
    unused_own: Vec<Doc>,
}

/// The documents a packing reads: its own, in order, then (only when they do not suffice) a
/// stream of borrowed ones.
struct Feed<'a> {
    own: &'a [Doc],
    next: usize,
    more: &'a mut dyn FnMut() -> Option<Doc>,
    borrowed: Vec<Doc>,
}

impl Feed<'_> {
    fn next_own(&mut self) -> Option<Doc> {
        while let Some(&d) = self.own.get(self.next) {
            self.next += 1;
            if d.len > 0 {
                return Some(d);
            }
        }
        None
    }

    fn next_any(&mut self) -> Option<Doc> {
        if let Some(d) = self.next_own() {
            return Some(d);
        }
        loop {
            let mut d = (self.more)()?;
            if d.len == 0 {
                continue;
            }
            d.ord = self.own.len() as u64 + self.borrowed.len() as u64;
            self.borrowed.push(d);
            return Some(d);
        }
    }
}

/// Best fit over a fixed number of rows: each document goes into the partly filled row with the
/// least space that holds it (ties: lowest row), else into the next empty row.
struct Fitter {
    window: u64,
    rows: u64,
    next_empty: u64,
    /// (space left, row) of partly filled rows with space left.
    partial: BTreeSet<(u64, u64)>,
    assign: Vec<(u64, Doc)>,
}

impl Fitter {
    fn place(&mut self, d: Doc) -> bool {
        let row = if let Some(&(space, row)) = self.partial.range((d.len, 0)..).next() {
            self.partial.remove(&(space, row));
            if space > d.len {
                self.partial.insert((space - d.len, row));
            }
            row
        } else if self.next_empty < self.rows && d.len <= self.window {
            let row = self.next_empty;
            self.next_empty += 1;
            if self.window > d.len {
                self.partial.insert((self.window - d.len, row));
            }
            row
        } else {
            return false;
        };
        self.assign.push((row, d));
        true
    }
}

/// Packs `own` (a block's documents in epoch order, `ord` = index) into exactly `rows` rows of
/// `window` tokens, reading `more` only when `own` does not suffice. `None`: `more` ran out.
///
/// 1. prefix: the shortest prefix whose capped mass `sum min(l, T)` reaches `rows * T`;
/// 2. its documents with `l >= T` get a row each ("anchor" rows, cropped to `T`), in order;
/// 3. its other documents, by (length descending, ord), best fit into the remaining rows;
///    a document that fits nowhere is set aside;
/// 4. the rest of `own`, in order: a document shorter than `T` that fits somewhere goes there
///    (best fit), any other is set aside;
/// 5. while fewer documents are set aside than rows have space left: the next document of
///    `more`, treated as in 4;
/// 6. crops: the rows with space left, by (space, row), take the set-aside documents by
///    (length, ord) one each, cropped to the space (every set-aside document is longer than any
///    space left: spaces only shrink and it fitted none when set aside); the others are dropped.
///
/// A row's pieces: its whole documents by (length descending, ord), then its crop.
fn pack_docs(
    window: u64,
    rows: u64,
    own: &[Doc],
    more: &mut dyn FnMut() -> Option<Doc>,
) -> Option<Packing> {
    let t = window;
    let need = u128::from(rows) * u128::from(t);
    let mut feed = Feed {
        own,
        next: 0,
        more,
        borrowed: Vec::new(),
    };
    let mut mass = 0u128;
    let mut prefix = Vec::new();
    while mass < need {
        let d = feed.next_any()?;
        mass += u128::from(d.len.min(t));
        prefix.push(d);
    }
    let (anchors, mut short): (Vec<Doc>, Vec<Doc>) = prefix.into_iter().partition(|d| d.len >= t);
    // Each anchor adds T to the mass and the prefix stops at the first document reaching
    // rows * T, so there are at most `rows` anchors.
    let bins = rows - anchors.len() as u64;
    short.sort_unstable_by_key(|d| (Reverse(d.len), d.ord));
    let mut fit = Fitter {
        window: t,
        rows: bins,
        next_empty: 0,
        partial: BTreeSet::new(),
        assign: Vec::with_capacity(short.len()),
    };
    let mut aside = Vec::new();
    for d in short {
        if !fit.place(d) {
            aside.push(d);
        }
    }
    while let Some(d) = feed.next_own() {
        if d.len >= t || !fit.place(d) {
            aside.push(d);
        }
    }
    while aside.len() < fit.partial.len() {
        let d = feed.next_any()?;
        if d.len >= t || !fit.place(d) {
            aside.push(d);
        }
    }
    aside.sort_unstable_by_key(|d| (d.len, d.ord));
    let n_crops = fit.partial.len();
    let mut crop_of = vec![None; bins as usize];
    for (&(space, row), &d) in fit.partial.iter().zip(&aside) {
        debug_assert!(d.len > space);
        crop_of[row as usize] = Some((d, space));
    }
    let dropped = &aside[n_crops..];

    let mut counts = TokenCounts {
        blocks: 1,
        rows,
        docs: own.iter().filter(|d| d.len > 0).count() as u64,
        docs_borrowed: feed.borrowed.len() as u64,
        row_tokens: rows * t,
        docs_dropped: dropped.len() as u64,
        dropped_tokens: dropped.iter().map(|d| d.len).sum(),
        ..TokenCounts::default()
    };
    let mut pieces = Vec::with_capacity(anchors.len() + fit.assign.len() + n_crops);
    let mut ends = Vec::with_capacity(rows as usize);
    let used = |d: &Doc, len: u64, counts: &mut TokenCounts| {
        counts.docs_used += 1;
        counts.used_tokens += d.len;
        counts.docs_cropped += u64::from(len < d.len);
        Piece {
            doc: d.id,
            len,
            bos_prepended: d.bos,
            cropped: len < d.len,
        }
    };
    for a in &anchors {
        pieces.push(used(a, t, &mut counts));
        ends.push(pieces.len());
    }
    fit.assign
        .sort_unstable_by_key(|&(row, d)| (row, Reverse(d.len), d.ord));
    let mut k = 0;
    for (row, crop) in crop_of.iter().enumerate() {
        while k < fit.assign.len() && fit.assign[k].0 == row as u64 {
            let d = fit.assign[k].1;
            pieces.push(used(&d, d.len, &mut counts));
            k += 1;
        }
        if let Some((d, space)) = crop {
            pieces.push(used(d, *space, &mut counts));
        }
        ends.push(pieces.len());
    }
    counts.cropped_tokens = counts.used_tokens - counts.row_tokens;
    let own_len = own.len() as u64;
    let mut unused_own: Vec<Doc> = dropped
        .iter()
        .filter(|d| d.ord < own_len)
        .copied()
        .collect();
    unused_own.sort_unstable_by_key(|d| d.ord);
    Some(Packing {
        pieces,
        ends,
        counts,
        borrowed: feed.borrowed,
        unused_own,
    })
}

#[cfg(test)]
mod figures;
mod packer;
#[cfg(test)]
mod tests;

pub(crate) use packer::Packer;

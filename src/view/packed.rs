//! Packed rows (`--mode packed --bos ID`): the view side of `shuffle/packing/`
//! (`bestfit-blocks-v1`). Row `p` of epoch `e` (`p = step * G + row * ranks + rank`, the
//! position the other modes permute) is the packer's global row `p`: block `p div R`, packed
//! on first use from its documents' lengths and kept in a small cache, so the steps that read
//! one block (about `R / G` of them in a row) pack it once.
//!
//! A row's bytes are its pieces in order: for each, the BOS record when the packer prepends
//! one, then the document's first records. Document lengths come from the dataset's
//! document index; whether a document already starts with the BOS from its first record.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::shuffle::packing::{
    ALGORITHM, DEFAULT_BLOCK_DOCS, DocLen, PackConfig, PackError, PackSummary, PackedBlock, Packer,
    Piece,
};

/// Packed blocks kept (two per epoch boundary, a few for ranks at different blocks).
const BLOCKS_KEPT: usize = 8;

/// The packer of a view and its packed blocks.
#[derive(Debug)]
pub(super) struct Packed {
    packer: Packer,
    blocks: Mutex<LruCache<(u64, u64), Arc<Block>>>,
}

/// A packed block and the first record of each of its documents (read while packing it).
#[derive(Debug)]
pub(super) struct Block {
    pub(super) rows: PackedBlock,
    starts: HashMap<u64, u64>,
}

impl Block {
    /// The first stream record of document `doc` of this block.
    pub(super) fn start(&self, dataset: &Dataset, doc: u64) -> Result<u64> {
        match self.starts.get(&doc) {
            Some(&s) => Ok(s),
            None => Ok(dataset.document(doc)?.start),
        }
    }
}

/// `info.json`'s `packing`: what the packer was told and what it measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PackingInfo {
    /// The algorithm (`bestfit-blocks-v1`).
    pub algorithm: &'static str,
    /// Row length.
    pub window: u64,
    /// The BOS token.
    pub bos: Option<u64>,
    /// Documents per block (at most).
    pub block_docs: u64,
    /// Blocks per epoch.
    pub blocks: u64,
    /// Rows every block yields.
    pub rows_per_block: u64,
    /// Rows per epoch (`blocks * rows_per_block`).
    pub rows_per_epoch: u64,
    /// Non-empty documents.
    pub documents: u64,
    /// Packed tokens (documents' tokens plus prepended BOS tokens).
    pub tokens: u64,
    /// Documents that get a BOS prepended.
    pub bos_prepended: u64,
    /// Row tokens that are document tokens: 1 (no padding, by construction).
    pub utilisation: f64,
    /// Share of the packed tokens that reach rows each epoch (exact).
    pub reach_share: f64,
    /// Share of the tokens of the documents used that a crop cuts off (estimated from the
    /// calibration blocks).
    pub crop_share_estimate: f64,
    /// Share of the packed tokens beyond the window in documents longer than a row: what no
    /// packing of prefixes can place (exact).
    pub tokens_beyond_window_share: f64,
}

impl Packed {
    /// The packer of `dataset`'s documents: one pass over their lengths (and, with a BOS, their
    /// first records) and the calibration (`Packer::new`).
    pub(super) fn new(
        dataset: &Dataset,
        window: u64,
        bos: Option<u64>,
        seed: u64,
        block_docs: Option<u64>,
    ) -> Result<Packed> {
        let n = dataset.n_documents().ok_or_else(|| {
            Error::invalid(
                "--mode packed needs a dataset with documents: pack it with its index \
                 (Megatron, datatrove), JSON Lines, a table, or --doc-sep / --doc-start",
            )
        })?;
        if bos.is_none() {
            return Err(Error::invalid(
                "--mode packed needs --bos ID: the BOS token every row starts with (documents \
                 that do not start with it get it prepended)",
            ));
        }
        let config = PackConfig {
            block_docs: block_docs.unwrap_or(DEFAULT_BLOCK_DOCS),
            ..PackConfig::new(window, bos, seed)
        };
        let mut lens = DocLens::new(dataset, bos);
        let packer = Packer::new(config, n, |d| lens.get(d)).map_err(packing_error)?;
        if packer.rows_per_epoch() == 0 {
            return Err(Error::invalid(format!(
                "--mode packed: the {n} documents fill no row of {window} tokens per block of \
                 {} documents; lower --window or raise --pack-block-docs",
                packer.config().block_docs
            )));
        }
        Ok(Packed {
            packer,
            blocks: Mutex::new(LruCache::new(
                NonZeroUsize::new(BLOCKS_KEPT).expect("non-zero"),
            )),
        })
    }

    /// Rows per epoch.
    pub(super) fn rows_per_epoch(&self) -> u64 {
        self.packer.rows_per_epoch()
    }

    /// What enters the fingerprint: the algorithm and everything that decides the rows.
    pub(super) fn fingerprint_line(&self) -> String {
        let c = self.packer.config();
        format!(
            "packing={ALGORITHM},bos={},block_docs={},rows_per_block={}\n",
            c.bos.map_or("none".to_string(), |b| b.to_string()),
            c.block_docs,
            self.packer.rows_per_block()
        )
    }

    /// `info.json`'s `packing`.
    pub(super) fn info(&self) -> PackingInfo {
        let s: PackSummary = self.packer.summary();
        let c = self.packer.config();
        let corpus = self.packer.corpus();
        PackingInfo {
            algorithm: ALGORITHM,
            window: c.window,
            bos: c.bos,
            block_docs: c.block_docs,
            blocks: self.packer.blocks(),
            rows_per_block: self.packer.rows_per_block(),
            rows_per_epoch: self.packer.rows_per_epoch(),
            documents: corpus.nonempty_docs,
            tokens: corpus.tokens,
            bos_prepended: corpus.bos_prepended,
            utilisation: s.utilisation(),
            reach_share: s.reach_share(),
            crop_share_estimate: s.crop_share_estimate(),
            tokens_beyond_window_share: s.unavoidable_crop_share(),
        }
    }

    /// The pieces of row `position` of epoch `epoch`.
    pub(super) fn row(
        &self,
        dataset: &Dataset,
        epoch: u64,
        position: u64,
    ) -> Result<(Arc<Block>, usize)> {
        let at = self.packer.locate(epoch, position).ok_or_else(|| {
            Error::invalid(format!("packed row {position} is past the epoch's rows"))
        })?;
        let key = (epoch, at.block);
        if let Some(b) = self.blocks.lock().expect("blocks lock").get(&key) {
            return Ok((b.clone(), at.row as usize));
        }
        let bos = self.packer.config().bos;
        let mut lens = DocLens::new(dataset, bos);
        lens.starts = Some(HashMap::new());
        let rows = self
            .packer
            .pack_block(epoch, at.block, |d| lens.get(d))
            .map_err(packing_error)?;
        let block = Arc::new(Block {
            rows,
            starts: lens.starts.take().unwrap_or_default(),
        });
        self.blocks
            .lock()
            .expect("blocks lock")
            .put(key, block.clone());
        Ok((block, at.row as usize))
    }
}

/// Bytes `[within, within + out.len())` of a packed row made of `pieces`: `bos` is the BOS
/// record as served; `read(start, within, out)` fills served bytes of the records from stream
/// record `start` on.
pub(super) fn fill_row(
    dataset: &Dataset,
    block: &Block,
    pieces: &[Piece],
    bos: &[u8],
    within: u64,
    out: &mut [u8],
    read: impl Fn(u64, u64, &mut [u8]) -> Result<()>,
) -> Result<()> {
    let size = bos.len() as u64;
    let end = within + out.len() as u64;
    let mut at = 0u64; // the piece's first byte in the row
    for p in pieces {
        let piece_end = at + p.len * size;
        if piece_end > within && at < end {
            let lo = within.max(at);
            let hi = end.min(piece_end);
            let mut pos = lo - at; // bytes into the piece
            let mut dst = &mut out[(lo - within) as usize..(hi - within) as usize];
            if p.bos_prepended && pos < size {
                let k = ((size - pos) as usize).min(dst.len());
                dst[..k].copy_from_slice(&bos[pos as usize..pos as usize + k]);
                dst = &mut dst[k..];
                pos += k as u64;
            }
            if !dst.is_empty() {
                let skip = pos - if p.bos_prepended { size } else { 0 };
                read(block.start(dataset, p.doc)?, skip, dst)?;
            }
        }
        at = piece_end;
    }
    Ok(())
}

/// Document lengths for the packer, read in batches when asked in order (the calibration's
/// pass), one by one otherwise.
struct DocLens<'a> {
    dataset: &'a Dataset,
    bos: Option<u64>,
    first: u64,
    extents: Vec<(u64, u64)>,
    /// When set, the first record of every document asked for.
    starts: Option<HashMap<u64, u64>>,
}

/// Documents whose extents one batched read fetches.
const BATCH: u64 = 4096;

impl<'a> DocLens<'a> {
    fn new(dataset: &'a Dataset, bos: Option<u64>) -> DocLens<'a> {
        DocLens {
            dataset,
            bos,
            first: 0,
            extents: Vec::new(),
            starts: None,
        }
    }

    fn get(&mut self, d: u64) -> Result<DocLen> {
        let cached = d >= self.first && d < self.first + self.extents.len() as u64;
        let (start, len) = if cached {
            self.extents[(d - self.first) as usize]
        } else if d == self.first + self.extents.len() as u64 && !self.extents.is_empty() || d == 0
        {
            self.extents = self.dataset.document_extents(d, BATCH)?;
            self.first = d;
            self.extents[0]
        } else {
            let doc = self.dataset.document(d)?;
            (doc.start, doc.len)
        };
        if let Some(starts) = self.starts.as_mut() {
            starts.insert(d, start);
        }
        let starts_with_bos = match self.bos {
            Some(bos) if len > 0 => self.dataset.token_at(start)? == i128::from(bos),
            _ => false,
        };
        Ok(DocLen {
            tokens: len,
            starts_with_bos,
        })
    }
}

fn packing_error(e: PackError<Error>) -> Error {
    match e {
        PackError::Len(e) => e,
        other => Error::invalid(other.to_string()),
    }
}

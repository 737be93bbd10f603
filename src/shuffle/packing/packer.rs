//! The packer: block layout, calibration, and the rows of any block of any epoch on demand.

use super::*;

/// The slow path of one epoch: which blocks borrow, and what.
#[derive(Debug)]
struct EpochPlan {
    epoch: u64,
    /// For each borrowing block: the borrowed documents in order, or `None` if infeasible.
    borrowed: HashMap<u64, Option<Vec<Doc>>>,
    stats: EpochStats,
}

/// Plans kept (the slow path is rare; two epochs cover a boundary).
const PLANS_KEPT: usize = 2;

/// The packing of a dataset's documents: the block layout, rows per block, and the rows of any
/// block of any epoch on demand.
#[derive(Debug)]
pub(crate) struct Packer {
    config: PackConfig,
    n_docs: u64,
    blocks: u64,
    corpus: CorpusStats,
    rows_per_block: u64,
    calibration: Calibration,
    plans: Mutex<Vec<Arc<EpochPlan>>>,
}

impl Packer {
    /// Scans the `n_docs` lengths once ([`CorpusStats::scan`]) and calibrates
    /// ([`Packer::with_corpus`]).
    pub(crate) fn new<E>(
        config: PackConfig,
        n_docs: u64,
        mut len: impl FnMut(u64) -> Result<DocLen, E>,
    ) -> Result<Packer, PackError<E>> {
        validate(&config)?;
        let corpus = CorpusStats::scan(n_docs, config.window, config.bos.is_some(), &mut len)?;
        Packer::with_corpus(config, n_docs, corpus, len)
    }

    /// Calibrates `rows_per_block` from the corpus figures and [`CALIBRATION_SAMPLES`] sample
    /// blocks (the smallest block size, documents from `Permutation::new(n, DOMAIN_CALIBRATE, c)`
    /// for sample `c`; seed-independent):
    ///
    /// ```text
    /// mass   = floor(Bmin * capped_tokens / n)                   expected capped mass of a block
    /// var    = ceil(capped_sq / n) - floor(capped_tokens / n)^2  per document
    /// V      = var * Bmin * (n - Bmin) / (n - 1)                 (sampling without replacement)
    /// a      = floor(lambda * T / 3)
    /// margin = a + isqrt(a^2 + 2 * lambda * V) + 1               (0 with a single block)
    /// loss_c = mass_c - T * rmax_c                               rmax_c: most rows sample c fills
    /// allow  = max_c loss_c + max_c loss_c / 4 + T
    /// R      = (mass - margin - allow) / T                       (0 if negative)
    /// ```
    ///
    /// `config.rows_per_block` replaces `R` (the samples are still packed for the estimate).
    pub(crate) fn with_corpus<E>(
        config: PackConfig,
        n_docs: u64,
        corpus: CorpusStats,
        mut len: impl FnMut(u64) -> Result<DocLen, E>,
    ) -> Result<Packer, PackError<E>> {
        validate(&config)?;
        if corpus.tokens > MAX_TOKENS {
            return Err(too_many_tokens());
        }
        let t = config.window;
        let blocks = n_docs.div_ceil(config.block_docs);
        let mut packer = Packer {
            config,
            n_docs,
            blocks,
            corpus,
            rows_per_block: 0,
            calibration: Calibration::default(),
            plans: Mutex::new(Vec::new()),
        };
        if blocks == 0 || packer.corpus.capped_tokens == 0 {
            packer.rows_per_block = packer.config.rows_per_block.unwrap_or(0);
            return Ok(packer);
        }
        let n = n_docs;
        let bmin = n / blocks;
        let mut cal = Calibration {
            min_block_docs: bmin,
            ..Calibration::default()
        };
        let (n128, b128) = (u128::from(n), u128::from(bmin));
        let capped = u128::from(packer.corpus.capped_tokens);
        cal.block_mass = sat64(b128 * capped / n128);
        if blocks > 1 {
            let mean = capped / n128;
            let var = packer
                .corpus
                .capped_sq
                .div_ceil(n128)
                .saturating_sub(mean * mean);
            let v = var.saturating_mul(b128).saturating_mul(n128 - b128) / (n128 - 1);
            let a = MARGIN_LAMBDA * u128::from(t) / 3;
            let root = (a * a)
                .saturating_add(v.saturating_mul(2 * MARGIN_LAMBDA))
                .isqrt();
            cal.margin = sat64(a + root + 1);
        }
        let mut samples = Vec::new();
        for c in 0..CALIBRATION_SAMPLES {
            let perm = Permutation::new(n, DOMAIN_CALIBRATE, c);
            let own = packer.docs_at(&perm, 0..bmin, &mut len)?;
            let mass: u64 = own.iter().map(|d| d.len.min(t)).sum();
            let rmax = most_rows(t, &own, mass / t);
            cal.sample_loss.push(mass - rmax * t);
            samples.push(own);
        }
        let worst = cal.sample_loss.iter().copied().max().unwrap_or(0);
        cal.loss_allowance = worst + worst / 4 + t;
        let rows = packer.config.rows_per_block.unwrap_or_else(|| {
            cal.block_mass
                .saturating_sub(cal.margin)
                .saturating_sub(cal.loss_allowance)
                / t
        });
        for own in &samples {
            match pack_docs(t, rows, own, &mut || None) {
                Some(p) => cal.estimate.add(&p.counts),
                None => cal.samples_short += 1,
            }
        }
        packer.rows_per_block = rows;
        packer.calibration = cal;
        Ok(packer)
    }

    /// The configuration.
    pub(crate) fn config(&self) -> &PackConfig {
        &self.config
    }

    /// Documents in the dataset.
    pub(crate) fn docs(&self) -> u64 {
        self.n_docs
    }

    /// Blocks per epoch: `ceil(n / block_docs)`.
    pub(crate) fn blocks(&self) -> u64 {
        self.blocks
    }

    /// Rows every block yields.
    pub(crate) fn rows_per_block(&self) -> u64 {
        self.rows_per_block
    }

    /// Rows of every epoch: `blocks * rows_per_block` (the same for each epoch).
    pub(crate) fn rows_per_epoch(&self) -> u64 {
        self.blocks.saturating_mul(self.rows_per_block)
    }

    /// `floor(rows_per_epoch / global_batch)` (the uneven tail is dropped, as in other modes).
    pub(crate) fn steps_per_epoch(&self, global_batch: u64) -> u64 {
        self.rows_per_epoch().checked_div(global_batch).unwrap_or(0)
    }

    /// Exact corpus figures.
    pub(crate) fn corpus(&self) -> &CorpusStats {
        &self.corpus
    }

    /// How the rows per block were chosen.
    pub(crate) fn calibration(&self) -> &Calibration {
        &self.calibration
    }

    /// Everything `info.json` needs: exact layout and corpus figures, estimated crop share.
    pub(crate) fn summary(&self) -> PackSummary {
        let (lo, hi) = match self.n_docs.checked_div(self.blocks) {
            Some(lo) => (lo, self.n_docs.div_ceil(self.blocks)),
            None => (0, 0),
        };
        PackSummary {
            algorithm: ALGORITHM,
            window: self.config.window,
            bos: self.config.bos,
            blocks: self.blocks,
            block_docs: (lo, hi),
            rows_per_block: self.rows_per_block,
            rows_per_epoch: self.rows_per_epoch(),
            corpus: self.corpus.clone(),
            calibration: self.calibration.clone(),
        }
    }

    /// Positions of block `b` in the epoch order:
    /// `[floor(b * n / blocks), floor((b + 1) * n / blocks))`.
    pub(crate) fn block_positions(&self, block: u64) -> Range<u64> {
        let at = |b: u64| sat64(u128::from(b) * u128::from(self.n_docs) / u128::from(self.blocks));
        at(block)..at(block + 1)
    }

    /// The epoch's document order: `Permutation::new(n, seed, epoch)`.
    pub(crate) fn doc_order(&self, epoch: u64) -> Permutation {
        Permutation::new(self.n_docs, self.config.seed, epoch)
    }

    /// The order of block `b`'s rows in epoch `e`:
    /// `Permutation::new(R, mix(mix(seed ^ DOMAIN_ROWS) ^ e), b)`.
    pub(crate) fn row_order(&self, epoch: u64, block: u64) -> Permutation {
        let key = mix(mix(self.config.seed ^ DOMAIN_ROWS) ^ epoch);
        Permutation::new(self.rows_per_block, key, block)
    }

    /// Global row `g` of epoch `e` (`g = step * G + row * ranks + rank`, as in the other modes):
    /// block `g div R`, row `row_order(e, block)(g mod R)`. `None` past the epoch's rows.
    pub(crate) fn locate(&self, epoch: u64, global_row: u64) -> Option<RowRef> {
        if global_row >= self.rows_per_epoch() {
            return None;
        }
        let r = self.rows_per_block;
        let block = global_row / r;
        let row = self.row_order(epoch, block).apply(global_row % r);
        Some(RowRef { block, row })
    }

    /// Packs block `block` of epoch `epoch`. Reads the lengths of the block's documents only,
    /// unless the block has to borrow (rare): then every block of the epoch is packed once (the
    /// plan is kept for the next calls).
    pub(crate) fn pack_block<E>(
        &self,
        epoch: u64,
        block: u64,
        mut len: impl FnMut(u64) -> Result<DocLen, E>,
    ) -> Result<PackedBlock, PackError<E>> {
        if block >= self.blocks {
            return Err(PackError::Config(format!(
                "block {block} out of range: the epoch has {} blocks",
                self.blocks
            )));
        }
        let own = self.docs_at(
            &self.doc_order(epoch),
            self.block_positions(block),
            &mut len,
        )?;
        let t = self.config.window;
        let r = self.rows_per_block;
        let packing = match pack_docs(t, r, &own, &mut || None) {
            Some(p) => p,
            None => {
                let plan = self.plan(epoch, &mut len)?;
                let infeasible = PackError::Infeasible { epoch, block };
                let Some(Some(list)) = plan.borrowed.get(&block) else {
                    return Err(infeasible);
                };
                let mut it = list.iter().copied();
                pack_docs(t, r, &own, &mut || it.next()).ok_or(infeasible)?
            }
        };
        Ok(PackedBlock {
            epoch,
            block,
            pieces: packing.pieces,
            ends: packing.ends,
            counts: packing.counts,
        })
    }

    /// Exact figures of an epoch: packs every block once (O(n log B), the lengths of all
    /// documents read once). The plan is kept for [`Packer::pack_block`].
    pub(crate) fn epoch_stats<E>(
        &self,
        epoch: u64,
        mut len: impl FnMut(u64) -> Result<DocLen, E>,
    ) -> Result<EpochStats, PackError<E>> {
        Ok(self.plan(epoch, &mut len)?.stats.clone())
    }

    fn plan<E>(
        &self,
        epoch: u64,
        len: &mut impl FnMut(u64) -> Result<DocLen, E>,
    ) -> Result<Arc<EpochPlan>, PackError<E>> {
        let cached = |plans: &Vec<Arc<EpochPlan>>| plans.iter().find(|p| p.epoch == epoch).cloned();
        if let Some(p) = cached(&self.plans.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(p);
        }
        let plan = Arc::new(self.epoch_plan(epoch, len)?);
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = cached(&plans) {
            return Ok(p);
        }
        if plans.len() >= PLANS_KEPT {
            plans.remove(0);
        }
        plans.push(plan.clone());
        Ok(plan)
    }

    /// Packs every block of the epoch; then each block that fell short, in block order, borrows
    /// the dropped documents of blocks `b+1, b+2, ...` (cyclically; blocks that fell short lend
    /// nothing), each lender's in position order, continuing where earlier borrowers stopped.
    /// A block the rest of the epoch cannot satisfy takes nothing and is infeasible.
    fn epoch_plan<E>(
        &self,
        epoch: u64,
        len: &mut impl FnMut(u64) -> Result<DocLen, E>,
    ) -> Result<EpochPlan, PackError<E>> {
        let (t, r, nb) = (self.config.window, self.rows_per_block, self.blocks);
        let order = self.doc_order(epoch);
        let mut stats = EpochStats {
            epoch,
            ..EpochStats::default()
        };
        let mut lendable: Vec<Option<Vec<Doc>>> = Vec::with_capacity(nb as usize);
        let mut short = Vec::new();
        let mut total = 0u64;
        for b in 0..nb {
            let own = self.docs_at(&order, self.block_positions(b), len)?;
            total = own
                .iter()
                .try_fold(total, |t, d| {
                    t.checked_add(d.len).filter(|&t| t <= MAX_TOKENS)
                })
                .ok_or_else(too_many_tokens)?;
            match pack_docs(t, r, &own, &mut || None) {
                Some(p) => {
                    stats.counts.add(&p.counts);
                    lendable.push(Some(p.unused_own));
                }
                None => {
                    lendable.push(None);
                    short.push((b, own));
                }
            }
        }
        let mut cursor = vec![0usize; nb as usize];
        let mut borrowed = HashMap::new();
        let (mut lent_docs, mut lent_tokens) = (0u64, 0u64);
        for (b, own) in short {
            let before = cursor.clone();
            let mut k = 1u64;
            let packed = pack_docs(t, r, &own, &mut || {
                while k < nb {
                    let c = ((b + k) % nb) as usize;
                    if let Some(list) = &lendable[c]
                        && let Some(&d) = list.get(cursor[c])
                    {
                        cursor[c] += 1;
                        return Some(d);
                    }
                    k += 1;
                }
                None
            });
            match packed {
                Some(p) => {
                    stats.blocks_borrowing += 1;
                    stats.counts.add(&p.counts);
                    lent_docs += p.borrowed.len() as u64;
                    lent_tokens += p.borrowed.iter().map(|d| d.len).sum::<u64>();
                    borrowed.insert(b, Some(p.borrowed));
                }
                None => {
                    cursor = before;
                    stats.blocks_infeasible += 1;
                    let docs = own.iter().filter(|d| d.len > 0);
                    stats.counts.blocks += 1;
                    stats.counts.docs += docs.clone().count() as u64;
                    stats.counts.docs_dropped += docs.clone().count() as u64;
                    stats.counts.dropped_tokens += docs.map(|d| d.len).sum::<u64>();
                    borrowed.insert(b, None);
                }
            }
        }
        // A lent document was counted dropped by its lender and read by its borrower.
        stats.counts.docs_dropped -= lent_docs;
        stats.counts.dropped_tokens -= lent_tokens;
        Ok(EpochPlan {
            epoch,
            borrowed,
            stats,
        })
    }

    /// The documents at `positions` of `order`, `ord` = index. Refuses a block of more than
    /// [`MAX_TOKENS`] packed tokens (lengths that changed since the scan).
    fn docs_at<E>(
        &self,
        order: &Permutation,
        positions: Range<u64>,
        len: &mut impl FnMut(u64) -> Result<DocLen, E>,
    ) -> Result<Vec<Doc>, PackError<E>> {
        let mut ids = vec![0u64; (positions.end - positions.start) as usize];
        order.apply_strided(positions.start, 1, &mut ids);
        let bos = self.config.bos.is_some();
        let mut total = 0u64;
        ids.into_iter()
            .enumerate()
            .map(|(i, id)| {
                let (l, prepend) = len(id).map_err(PackError::Len)?.packed(bos);
                total = total
                    .checked_add(l)
                    .filter(|&t| t <= MAX_TOKENS)
                    .ok_or_else(too_many_tokens)?;
                Ok(Doc {
                    id,
                    len: l,
                    bos: prepend,
                    ord: i as u64,
                })
            })
            .collect()
    }
}

fn too_many_tokens<E>() -> PackError<E> {
    PackError::Config(format!(
        "the documents hold more than {MAX_TOKENS} tokens, the most packed mode handles (or \
         their lengths changed since the packing was set up); split the dataset"
    ))
}

/// The most rows `own` fills on its own, searching down from `hi` (galloping, then bisecting).
fn most_rows(window: u64, own: &[Doc], hi: u64) -> u64 {
    let fills = |r: u64| pack_docs(window, r, own, &mut || None).is_some();
    if fills(hi) {
        return hi;
    }
    let (mut bad, mut step) = (hi, 1u64);
    let mut good = loop {
        let r = bad.saturating_sub(step);
        if r == 0 || fills(r) {
            break r;
        }
        bad = r;
        step = step.saturating_mul(2);
    };
    while bad - good > 1 {
        let mid = good + (bad - good) / 2;
        if fills(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    good
}

fn validate<E>(config: &PackConfig) -> Result<(), PackError<E>> {
    if config.window == 0 || config.window > MAX_WINDOW {
        return Err(PackError::Config(format!(
            "window {} must be between 1 and {MAX_WINDOW} tokens",
            config.window
        )));
    }
    if config.block_docs == 0 || config.block_docs > MAX_BLOCK_DOCS {
        return Err(PackError::Config(format!(
            "block_docs {} must be between 1 and {MAX_BLOCK_DOCS} documents",
            config.block_docs
        )));
    }
    Ok(())
}

fn sat64(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

//! Which observation the `j`-th draw from a source is, and the slot of the step it goes to.

use std::sync::{Arc, Mutex};

use super::*;
use crate::shuffle::feistel::{Permutation, mix};

/// A stable 64-bit key of a source name: FNV-1a over its UTF-8 bytes, then SplitMix64's mix.
pub(crate) fn name_key(name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name.as_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    mix(h)
}

/// The order in which one source's observations are drawn, and its held-out split.
///
/// - split (only when `val > 0`): `split = perm(len, key = mix(mix(split_seed ^ DOMAIN_SPLIT) ^
///   name_key))`, epoch 0; validation observation `i < val` is `split(i)`, training
///   observation `t < len - val` is `split(val + t)`. It depends on neither the run seed nor the
///   weights nor the batch, so the held-out set is stable when they change.
/// - draws: `draw j` is training observation `perm_e(j mod m)`, `e = j div m`, `m = len - val`,
///   `perm_e = Permutation::new(m, mix(mix(seed ^ DOMAIN_DRAW) ^ name_key), e)`.
#[derive(Clone, Debug)]
pub(crate) struct SourceOrder {
    len: u64,
    val: u64,
    key: u64,
    split: Option<Permutation>,
    /// Training positions never served (`quarantine`), when there are any.
    quarantine: Option<Arc<Quarantine>>,
}

/// A source's quarantined training positions: a source epoch is then `m' = m - q` draws,
/// positions `[0, m')` of the epoch's permutation; a quarantined one among them takes, in
/// position order, the next position of `[m', m)` that holds no quarantined observation
/// (there are exactly as many). Draws that hold no quarantined observation are unchanged
/// until the source's first wrap.
#[derive(Debug)]
struct Quarantine {
    /// Training positions, sorted, unique.
    positions: Vec<u64>,
    /// Per source epoch (a few kept): the permutation positions of the quarantined training
    /// positions below `m'` and at or above it, each sorted.
    epochs: Mutex<Vec<(u64, Arc<EpochQuarantine>)>>,
}

/// Where a source epoch's quarantined positions fall: sorted below `m'`, sorted at or above.
type EpochQuarantine = (Vec<u64>, Vec<u64>);

/// Source epochs whose quarantine positions are kept.
const QUARANTINE_EPOCHS_KEPT: usize = 4;

impl SourceOrder {
    /// The order of source `name` with `len` observations, `val` of them held out.
    pub(crate) fn new(
        name: &str,
        len: u64,
        val: u64,
        seed: u64,
        split_seed: u64,
    ) -> Result<SourceOrder> {
        if val >= len {
            return Err(MixtureError::new(format!(
                "source {name:?}: holding out {val} of {len} observations leaves none to train on"
            )));
        }
        let nk = name_key(name);
        let split =
            (val > 0).then(|| Permutation::new(len, mix(mix(split_seed ^ DOMAIN_SPLIT) ^ nk), 0));
        Ok(SourceOrder {
            len,
            val,
            key: mix(mix(seed ^ DOMAIN_DRAW) ^ nk),
            split,
            quarantine: None,
        })
    }

    /// The same order with observations `observations` never served (see [`Quarantine`]).
    /// Refuses an observation out of range or held out, and a list that leaves nothing.
    pub(crate) fn with_quarantine(mut self, name: &str, observations: &[u64]) -> Result<Self> {
        let mut positions = Vec::with_capacity(observations.len());
        for &o in observations {
            if o >= self.len {
                return Err(MixtureError::new(format!(
                    "quarantine: source {name:?} has {} observations, not {o}",
                    self.len
                )));
            }
            let t = match &self.split {
                Some(p) => match p.invert(o).checked_sub(self.val) {
                    Some(t) => t,
                    None => {
                        return Err(MixtureError::new(format!(
                            "quarantine: observation {o} of source {name:?} is held out \
                             ([split]); it is never trained on"
                        )));
                    }
                },
                None => o,
            };
            positions.push(t);
        }
        positions.sort_unstable();
        positions.dedup();
        if positions.len() as u64 >= self.train_len() {
            return Err(MixtureError::new(format!(
                "quarantine: it leaves source {name:?} no observation to train on"
            )));
        }
        self.quarantine = (!positions.is_empty()).then(|| {
            Arc::new(Quarantine {
                positions,
                epochs: Mutex::new(Vec::new()),
            })
        });
        Ok(self)
    }

    /// Quarantined observations.
    pub(crate) fn quarantined(&self) -> u64 {
        self.quarantine
            .as_ref()
            .map_or(0, |q| q.positions.len() as u64)
    }

    /// The quarantined training positions, sorted (fingerprints).
    pub(crate) fn quarantine_positions(&self) -> &[u64] {
        self.quarantine.as_ref().map_or(&[], |q| &q.positions)
    }

    /// Draws per source epoch: the training observations not quarantined.
    pub(crate) fn epoch_len(&self) -> u64 {
        self.train_len() - self.quarantined()
    }

    /// Observations of the source.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Whether the source has no observations (never: [`SourceOrder::new`] refuses).
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Observations drawn for training: one source epoch.
    pub(crate) fn train_len(&self) -> u64 {
        self.len - self.val
    }

    /// Held-out observations.
    pub(crate) fn val_len(&self) -> u64 {
        self.val
    }

    /// The permutation of training positions in source epoch `epoch`.
    pub(crate) fn epoch_permutation(&self, epoch: u64) -> Permutation {
        Permutation::new(self.train_len(), self.key, epoch)
    }

    /// Observation id of training position `t` (`< train_len`).
    pub(crate) fn train_observation(&self, t: u64) -> u64 {
        match &self.split {
            Some(p) => p.apply(self.val + t),
            None => t,
        }
    }

    /// The observation of draw `j` (the `j`-th row ever drawn from this source).
    pub(crate) fn observation(&self, j: u64) -> u64 {
        let m = self.epoch_len();
        let (e, p) = (j / m, j % m);
        let perm = self.epoch_permutation(e);
        let t = perm.apply(p);
        let Some(q) = &self.quarantine else {
            return self.train_observation(t);
        };
        if q.positions.binary_search(&t).is_err() {
            return self.train_observation(t);
        }
        // The i-th quarantined position below m' takes the i-th free position of [m', ..).
        let (head, tail) = &*q.epoch(e, &perm, m);
        let i = head
            .binary_search(&p)
            .expect("a quarantined position below m'") as u64;
        let mut x = m + i;
        for &b in tail {
            if b <= x {
                x += 1;
            } else {
                break;
            }
        }
        self.train_observation(perm.apply(x))
    }

    /// Observation id of validation row `i` (`< val_len`).
    pub(crate) fn val_observation(&self, i: u64) -> u64 {
        self.split.as_ref().expect("no held-out split").apply(i)
    }

    /// Whether observation `obs` is held out.
    pub(crate) fn is_val(&self, obs: u64) -> bool {
        self.split
            .as_ref()
            .is_some_and(|p| p.invert(obs) < self.val)
    }
}

impl Quarantine {
    /// Where the quarantined training positions fall in source epoch `epoch` (permutation
    /// `perm`, `m'` draws): sorted positions below `m'`, sorted positions at or above.
    fn epoch(&self, epoch: u64, perm: &Permutation, m: u64) -> Arc<EpochQuarantine> {
        let mut cache = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, v)) = cache.iter().find(|(e, _)| *e == epoch) {
            return v.clone();
        }
        let mut at: Vec<u64> = self.positions.iter().map(|&t| perm.invert(t)).collect();
        at.sort_unstable();
        let split = at.partition_point(|&p| p < m);
        let tail = at.split_off(split);
        let v = Arc::new((at, tail));
        if cache.len() >= QUARANTINE_EPOCHS_KEPT {
            cache.remove(0);
        }
        cache.push((epoch, v.clone()));
        v
    }
}

// ---------------------------------------------------------------------------------------------
// The mixture: counts, draws and slots together
// ---------------------------------------------------------------------------------------------

/// One source of a mixture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SourceSpec {
    /// Unique name (its draw and split keys derive from it).
    pub name: String,
    /// Observations in the source.
    pub len: u64,
    /// Observations held out for validation.
    pub val: u64,
}

/// A mixture plan: sources, their schedule, the seeds.
#[derive(Debug)]
pub(crate) struct Mixture {
    specs: Vec<SourceSpec>,
    orders: Vec<SourceOrder>,
    counter: Counter,
    seed: u64,
    split_seed: u64,
    slot_key: u64,
    /// Source indices by canonical rank (name order): the layout order of a step's positions.
    by_rank: Vec<usize>,
}

/// One row of a global step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Row {
    /// Source index (in the order the sources were given).
    pub source: usize,
    /// Draw index within the source: the `draw`-th row ever drawn from it.
    pub draw: u64,
    /// Observation id within the source.
    pub observation: u64,
}

impl Mixture {
    /// A mixture of `sources` (unique, non-empty names; `len > val`) on `schedule`, with the run
    /// `seed` (draw orders and slot shuffles) and the `split_seed` (held-out sets).
    pub(crate) fn new(
        sources: Vec<SourceSpec>,
        schedule: Schedule,
        seed: u64,
        split_seed: u64,
    ) -> Result<Mixture> {
        if sources.len() != schedule.sources() {
            return Err(MixtureError::new(format!(
                "{} sources but the schedule has {} weights",
                sources.len(),
                schedule.sources()
            )));
        }
        let mut names: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(MixtureError::new(format!(
                "source name {:?} is used twice",
                w[0]
            )));
        }
        if let Some(n) = names
            .iter()
            .find(|n| n.is_empty() || n.chars().any(char::is_control))
        {
            return Err(MixtureError::new(format!(
                "source name {n:?} is empty or has control characters"
            )));
        }
        let orders = sources
            .iter()
            .map(|s| SourceOrder::new(&s.name, s.len, s.val, seed, split_seed))
            .collect::<Result<Vec<_>>>()?;
        let rank = name_ranks(&sources.iter().map(|s| &s.name).collect::<Vec<_>>());
        let mut by_rank = vec![0; rank.len()];
        for (k, &r) in rank.iter().enumerate() {
            by_rank[r as usize] = k;
        }
        Ok(Mixture {
            by_rank,
            specs: sources,
            orders,
            counter: Counter::new(schedule, rank)?,
            seed,
            split_seed,
            slot_key: mix(seed ^ DOMAIN_SLOT),
        })
    }

    /// Quarantines `observations` of source `k` (see [`SourceOrder::with_quarantine`]).
    pub(crate) fn with_quarantine(mut self, k: usize, observations: &[u64]) -> Result<Mixture> {
        let order = self.orders[k].clone();
        self.orders[k] = order.with_quarantine(&self.specs[k].name, observations)?;
        Ok(self)
    }

    /// The sources, in the order given.
    pub(crate) fn sources(&self) -> &[SourceSpec] {
        &self.specs
    }

    /// The draw order of source `k`.
    pub(crate) fn order(&self, k: usize) -> &SourceOrder {
        &self.orders[k]
    }

    /// The counts.
    pub(crate) fn counter(&self) -> &Counter {
        &self.counter
    }

    /// Global step `step`: its counts and slot layout.
    pub(crate) fn batch(&self, step: u64) -> Batch<'_> {
        Batch::new(self, self.counter.counts(step))
    }

    /// The batch of `counts` (from [`Counter::counts`] or a [`Cursor`]).
    pub(crate) fn batch_of(&self, counts: StepCounts) -> Batch<'_> {
        Batch::new(self, counts)
    }

    /// Canonical `key=value` lines of everything that decides the rows of steps `0..=step`, for
    /// the mount's fingerprint text: algorithm, seeds, sources (name, size, held out, in order),
    /// and the schedule entries starting at or before `step`.
    pub(crate) fn canonical_text(&self, step: u64) -> String {
        let mut out = format!(
            "mixture={ALGORITHM}\nmixture_seed={}\nsplit_seed={}\n",
            self.seed, self.split_seed
        );
        for (s, o) in self.specs.iter().zip(&self.orders) {
            out.push_str(&format!("source={},{},{}\n", s.len, s.val, s.name));
            if o.quarantined() > 0 {
                // Only present with a quarantine, so other fingerprints are unchanged.
                let mut h = 0x7175_6172_616e_7431u64; // "quarant1"
                for &t in o.quarantine_positions() {
                    h = mix(h ^ t);
                }
                out.push_str(&format!(
                    "quarantine={},{h:016x},{}\n",
                    o.quarantined(),
                    s.name
                ));
            }
        }
        out.push_str(&self.counter.schedule().canonical_text(step));
        out
    }
}

/// The rows of one global step: `G` slots, each a (source, draw, observation).
#[derive(Debug)]
pub(crate) struct Batch<'a> {
    mixture: &'a Mixture,
    counts: StepCounts,
    /// `offsets[r]` = first position of the source of rank `r`; `offsets[K] = G`.
    offsets: Vec<u64>,
    slots: Permutation,
    /// Per source, the permutation of the source epoch of its first draw in this step.
    epochs: Vec<(u64, Permutation)>,
}

impl<'a> Batch<'a> {
    fn new(mixture: &'a Mixture, counts: StepCounts) -> Batch<'a> {
        let mut offsets = Vec::with_capacity(counts.counts.len() + 1);
        let mut at = 0;
        offsets.push(0);
        for &k in &mixture.by_rank {
            at += counts.counts[k];
            offsets.push(at);
        }
        let slots = Permutation::new(counts.global_batch, mixture.slot_key, counts.step);
        let epochs = mixture
            .orders
            .iter()
            .zip(&counts.drawn)
            .map(|(o, &j)| {
                let e = j / o.epoch_len();
                (e, o.epoch_permutation(e))
            })
            .collect();
        Batch {
            mixture,
            counts,
            offsets,
            slots,
            epochs,
        }
    }

    /// The counts of the step.
    pub(crate) fn counts(&self) -> &StepCounts {
        &self.counts
    }

    /// Slot `slot` (`< G`) of the step.
    pub(crate) fn slot(&self, slot: u64) -> Row {
        let p = self.slots.apply(slot);
        let r = self.offsets.partition_point(|&o| o <= p) - 1;
        let k = self.mixture.by_rank[r];
        let draw = self.counts.drawn[k] + (p - self.offsets[r]);
        let order = &self.mixture.orders[k];
        if order.quarantined() > 0 {
            return Row {
                source: k,
                draw,
                observation: order.observation(draw),
            };
        }
        let (m, (e, perm)) = (order.train_len(), &self.epochs[k]);
        let t = if draw / m == *e {
            perm.apply(draw % m)
        } else {
            // the step crosses into the source's next epoch
            order.epoch_permutation(draw / m).apply(draw % m)
        };
        Row {
            source: k,
            draw,
            observation: order.train_observation(t),
        }
    }

    /// Row `row` of rank `rank` out of `ranks` (`G = batch_size * ranks`): slot `row * ranks +
    /// rank`, as for a single dataset.
    pub(crate) fn rank_row(&self, rank: u64, ranks: u64, row: u64) -> Row {
        self.slot(row * ranks + rank)
    }
}

#[cfg(test)]
mod tests;

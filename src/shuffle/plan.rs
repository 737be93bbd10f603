//! Which observations a step holds: "step S of rank R in epoch E is rows perm_E(...)".
//!
//! The plan knows nothing about bytes. It maps (epoch, rank, step, row) to a position in the
//! epoch's shuffled order and through the permutation to an observation id, and back.
//!
//! ```text
//! G = batch_size * ranks                        (global batch)
//! steps_per_epoch = floor(n_observations / G)   (the uneven tail is dropped)
//! position(step, rank, row) = step*G + row*ranks + rank
//! observation = perm_epoch(position)
//! global_step(epoch, step) = epoch*steps_per_epoch + step   (the same for every rank)
//! ```
//!
//! A global batch (all ranks' rows of one step) is the position range `[step*G, (step+1)*G)`,
//! so it depends only on `G`: changing `ranks` while keeping `G` gives the same global batches.
//!
//! With a quarantine of `q` observations (`--quarantine`), `steps_per_epoch = floor((n - q) /
//! G)`; in epoch `e` the positions below `T*G` that hold a quarantined observation, in
//! position order, take the positions of `[T*G, n)` that hold none, in position order (there
//! are always enough). Every other position keeps its observation.

use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::shuffle::feistel::Permutation;

/// Identifies one step file: (epoch, rank, step).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StepKey {
    /// Epoch, `0..epochs`.
    pub epoch: u64,
    /// Rank, `0..ranks`.
    pub rank: u64,
    /// Step within the epoch, `0..steps_per_epoch`.
    pub step: u64,
}

/// Where an observation is trained in one epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Position in the epoch's shuffled order.
    pub position: u64,
    /// Step that holds it.
    pub step: u64,
    /// Rank that reads it.
    pub rank: u64,
    /// Row of that rank's step file.
    pub row: u64,
}

/// The shuffle and partition of `n_observations` over epochs, ranks and steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    n_observations: u64,
    batch_size: u64,
    ranks: u64,
    seed: u64,
    epochs: u64,
    global_batch: u64,
    quarantine: Option<Arc<Quarantine>>,
}

/// Observations never served, and where they fall in recent epochs.
#[derive(Debug)]
pub(crate) struct Quarantine {
    /// Observation ids, sorted, unique.
    observations: Vec<u64>,
    /// Per epoch (a few kept): the positions of the quarantined observations below the served
    /// range's end and at or after it, each sorted.
    epochs: Mutex<Vec<(u64, Arc<Placed>)>>,
}

/// Where one epoch's quarantined observations are: sorted positions served, sorted the rest.
type Placed = (Vec<u64>, Vec<u64>);

/// Epochs whose quarantine placement is kept.
const EPOCHS_KEPT: usize = 4;

impl PartialEq for Quarantine {
    fn eq(&self, other: &Quarantine) -> bool {
        self.observations == other.observations
    }
}

impl Eq for Quarantine {}

impl Quarantine {
    /// The placement in epoch `epoch` (permutation `perm`, `served` positions).
    fn placed(&self, epoch: u64, perm: &Permutation, served: u64) -> Arc<Placed> {
        let mut cache = self.epochs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, p)) = cache.iter().find(|(e, _)| *e == epoch) {
            return p.clone();
        }
        let mut at: Vec<u64> = self.observations.iter().map(|&o| perm.invert(o)).collect();
        at.sort_unstable();
        let tail = at.split_off(at.partition_point(|&p| p < served));
        let placed = Arc::new((at, tail));
        if cache.len() >= EPOCHS_KEPT {
            cache.remove(0);
        }
        cache.push((epoch, placed.clone()));
        placed
    }

    /// The observation served at `position` of epoch `epoch`, given that `perm` puts `value`
    /// there.
    fn fix(&self, epoch: u64, perm: &Permutation, served: u64, position: u64, value: u64) -> u64 {
        if self.observations.binary_search(&value).is_err() {
            return value;
        }
        let placed = self.placed(epoch, perm, served);
        let (head, tail) = &*placed;
        let i = head
            .binary_search(&position)
            .expect("a quarantined served position") as u64;
        let mut x = served + i;
        for &b in tail {
            if b <= x {
                x += 1;
            } else {
                break;
            }
        }
        perm.apply(x)
    }
}

impl Plan {
    /// Validates and builds a plan. Every count must be at least 1 and `batch_size * ranks`
    /// must fit in 64 bits.
    pub(crate) fn new(
        n_observations: u64,
        batch_size: u64,
        ranks: u64,
        seed: u64,
        epochs: u64,
    ) -> Result<Plan> {
        if batch_size == 0 {
            return Err(Error::invalid("--batch-size must be at least 1"));
        }
        if ranks == 0 {
            return Err(Error::invalid("--ranks must be at least 1"));
        }
        if epochs == 0 {
            return Err(Error::invalid("--epochs must be at least 1"));
        }
        let global_batch = batch_size.checked_mul(ranks).ok_or_else(|| {
            Error::invalid(format!(
                "--batch-size {batch_size} times --ranks {ranks} overflows 64 bits"
            ))
        })?;
        Ok(Plan {
            n_observations,
            batch_size,
            ranks,
            seed,
            epochs,
            global_batch,
            quarantine: None,
        })
    }

    /// The same plan never serving `observations` (see the module docs). Refuses an id out of
    /// range and a list that leaves no step.
    pub(crate) fn with_quarantine(mut self, mut observations: Vec<u64>) -> Result<Plan> {
        observations.sort_unstable();
        observations.dedup();
        if let Some(&o) = observations.iter().find(|&&o| o >= self.n_observations) {
            return Err(Error::invalid(format!(
                "--quarantine: observation {o} is out of range (the plan has {})",
                self.n_observations
            )));
        }
        self.quarantine = (!observations.is_empty()).then(|| {
            Arc::new(Quarantine {
                observations,
                epochs: Mutex::new(Vec::new()),
            })
        });
        Ok(self)
    }

    /// Quarantined observations.
    pub(crate) fn quarantined(&self) -> &[u64] {
        self.quarantine.as_ref().map_or(&[], |q| &q.observations)
    }

    /// Number of observations shuffled each epoch.
    pub fn n_observations(&self) -> u64 {
        self.n_observations
    }
    /// Rows per step file.
    pub fn batch_size(&self) -> u64 {
        self.batch_size
    }
    /// Number of ranks.
    pub fn ranks(&self) -> u64 {
        self.ranks
    }
    /// Shuffle seed.
    pub(crate) fn seed(&self) -> u64 {
        self.seed
    }
    /// Number of epochs exposed.
    pub fn epochs(&self) -> u64 {
        self.epochs
    }
    /// `batch_size * ranks`.
    pub fn global_batch(&self) -> u64 {
        self.global_batch
    }
    /// `floor((n_observations - quarantined) / global_batch)`.
    pub fn steps_per_epoch(&self) -> u64 {
        (self.n_observations - self.quarantined().len() as u64) / self.global_batch
    }
    /// Observations not served in an epoch (the tail and the quarantined ones).
    pub(crate) fn dropped_per_epoch(&self) -> u64 {
        self.n_observations - self.steps_per_epoch() * self.global_batch
    }

    /// Whether `key` names an existing step.
    pub fn contains(&self, key: StepKey) -> bool {
        key.epoch < self.epochs && key.rank < self.ranks && key.step < self.steps_per_epoch()
    }

    /// The permutation of epoch `epoch`.
    pub(crate) fn permutation(&self, epoch: u64) -> Permutation {
        Permutation::new(self.n_observations, self.seed, epoch)
    }

    /// The global step of `key`: the steps of all earlier epochs plus its own (the same for
    /// every rank). The one place of the formula (`S.json`, prefetch, prefill, `bench`).
    /// Saturating, so any key has one; a key of the plan never reaches the bound.
    pub(crate) fn global_step(&self, key: StepKey) -> u64 {
        key.epoch
            .saturating_mul(self.steps_per_epoch())
            .saturating_add(key.step)
    }

    /// Position in the shuffled order of `row` of `key`.
    pub(crate) fn position(&self, key: StepKey, row: u64) -> u64 {
        key.step * self.global_batch + row * self.ranks + key.rank
    }

    /// The observation ids of `key`, in row order. `key` must exist.
    pub(crate) fn observations(&self, key: StepKey) -> StepObservations {
        debug_assert!(self.contains(key));
        StepObservations {
            perm: self.permutation(key.epoch),
            next: self.position(key, 0),
            stride: self.ranks,
            left: self.batch_size,
            quarantine: self.quarantine.clone().map(|q| {
                let served = self.steps_per_epoch() * self.global_batch;
                (q, key.epoch, served)
            }),
        }
    }

    /// Where `observation` is trained in `epoch`, or `None` when it falls in the dropped tail.
    /// Runs the permutation backwards: O(1).
    pub fn locate(&self, epoch: u64, observation: u64) -> Option<Placement> {
        debug_assert!(observation < self.n_observations);
        let perm = self.permutation(epoch);
        let mut position = perm.invert(observation);
        if let Some(q) = &self.quarantine {
            if q.observations.binary_search(&observation).is_ok() {
                return None;
            }
            let served = self.steps_per_epoch() * self.global_batch;
            if position >= served {
                // A spare: it fills the i-th quarantined served position, if there is one.
                let placed = q.placed(epoch, &perm, served);
                let (head, tail) = &*placed;
                let i = position - served - tail.partition_point(|&b| b < position) as u64;
                position = *head.get(i as usize)?;
            }
        }
        let step = position / self.global_batch;
        if step >= self.steps_per_epoch() {
            return None;
        }
        let within = position % self.global_batch;
        Some(Placement {
            position,
            step,
            rank: within % self.ranks,
            row: within / self.ranks,
        })
    }
}

/// Iterator over a step's observation ids (see [`Plan::observations`]).
#[derive(Clone, Debug)]
pub(crate) struct StepObservations {
    perm: Permutation,
    next: u64,
    stride: u64,
    left: u64,
    /// The quarantine, the epoch and the served positions.
    quarantine: Option<(Arc<Quarantine>, u64, u64)>,
}

impl StepObservations {
    /// The observation of row `row` (0-based) counted from the iterator's start.
    #[cfg(test)]
    pub(crate) fn row(&self, row: u64) -> u64 {
        let position = self.next + row * self.stride;
        self.fixed(position, self.perm.apply(position))
    }

    /// The observation served at `position`, where the permutation puts `value`.
    fn fixed(&self, position: u64, value: u64) -> u64 {
        match &self.quarantine {
            Some((q, epoch, served)) => q.fix(*epoch, &self.perm, *served, position, value),
            None => value,
        }
    }

    /// The observations of rows `first ..` (counted from the iterator's start) into `out`,
    /// computed together ([`Permutation::apply_strided`]).
    pub(crate) fn fill(&self, first: u64, out: &mut [u64]) {
        let start = self.next + first * self.stride;
        self.perm.apply_strided(start, self.stride, out);
        if self.quarantine.is_some() {
            for (i, v) in out.iter_mut().enumerate() {
                *v = self.fixed(start + i as u64 * self.stride, *v);
            }
        }
    }
}

impl Iterator for StepObservations {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.left == 0 {
            return None;
        }
        let v = self.fixed(self.next, self.perm.apply(self.next));
        self.left -= 1;
        if self.left > 0 {
            self.next += self.stride;
        }
        Some(v)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.left).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(epoch: u64, rank: u64, step: u64) -> StepKey {
        StepKey { epoch, rank, step }
    }

    #[test]
    fn epoch_is_an_exact_partition_minus_tail() {
        for (n, b, r) in [
            (1u64, 1u64, 1u64),
            (10, 3, 1),
            (100, 4, 3),
            (1000, 7, 8),
            (97, 97, 1),
            (4096, 16, 2),
        ] {
            let plan = Plan::new(n, b, r, 11, 2).unwrap();
            let g = b * r;
            for epoch in 0..2 {
                let mut count = vec![0u32; n as usize];
                let mut per_rank: Vec<Vec<u64>> = vec![Vec::new(); r as usize];
                for step in 0..plan.steps_per_epoch() {
                    for rank in 0..r {
                        let obs: Vec<u64> = plan.observations(key(epoch, rank, step)).collect();
                        assert_eq!(obs.len() as u64, b);
                        for o in obs {
                            count[o as usize] += 1;
                            per_rank[rank as usize].push(o);
                        }
                    }
                }
                assert!(
                    count.iter().all(|&c| c <= 1),
                    "n={n}: duplicate observation"
                );
                let covered = count.iter().filter(|&&c| c == 1).count() as u64;
                assert_eq!(covered, plan.steps_per_epoch() * g);
                assert_eq!(n - covered, n % g, "tail is n mod G");
                assert!(n - covered < g);
                for a in 0..r as usize {
                    for c in a + 1..r as usize {
                        assert!(per_rank[a].iter().all(|o| !per_rank[c].contains(o)));
                    }
                }
            }
        }
    }

    #[test]
    fn quarantined_observations_are_replaced_by_the_epochs_spares() {
        for (n, b, r, bad) in [
            (100u64, 4u64, 3u64, vec![5u64, 17, 99, 0]),
            (50, 7, 1, vec![1, 2, 3, 4, 5, 6, 7, 8]),
            (1000, 16, 2, vec![999, 500, 1]),
        ] {
            let plain = Plan::new(n, b, r, 11, 3).unwrap();
            let plan = plain.clone().with_quarantine(bad.clone()).unwrap();
            let t = plan.steps_per_epoch();
            assert_eq!(t, (n - bad.len() as u64) / (b * r));
            for epoch in 0..3 {
                let mut seen = std::collections::HashSet::new();
                for step in 0..t {
                    for rank in 0..r {
                        let k = key(epoch, rank, step);
                        let obs: Vec<u64> = plan.observations(k).collect();
                        let mut filled = vec![0u64; b as usize];
                        plan.observations(k).fill(0, &mut filled);
                        assert_eq!(obs, filled);
                        for (row, &o) in obs.iter().enumerate() {
                            assert!(!bad.contains(&o), "epoch {epoch}: {o} is quarantined");
                            assert!(seen.insert(o), "epoch {epoch}: {o} twice");
                            let p = plan.locate(epoch, o).unwrap();
                            assert_eq!((p.step, p.rank, p.row), (step, rank, row as u64));
                            let before = plain.observations(k).nth(row).unwrap();
                            if t == plain.steps_per_epoch() && !bad.contains(&before) {
                                assert_eq!(o, before, "a row without a quarantined observation");
                            }
                        }
                    }
                }
                assert_eq!(seen.len() as u64, t * b * r);
                assert!(bad.iter().all(|&o| plan.locate(epoch, o).is_none()));
            }
        }
        assert!(
            Plan::new(10, 1, 1, 0, 1)
                .unwrap()
                .with_quarantine(vec![10])
                .is_err()
        );
    }

    #[test]
    fn global_batch_is_independent_of_rank_split() {
        let a = Plan::new(1000, 8, 4, 3, 1).unwrap();
        let b = Plan::new(1000, 16, 2, 3, 1).unwrap();
        let c = Plan::new(1000, 32, 1, 3, 1).unwrap();
        for step in 0..a.steps_per_epoch() {
            let global = |p: &Plan| {
                let mut v: Vec<u64> = (0..p.ranks())
                    .flat_map(|r| p.observations(key(0, r, step)))
                    .collect();
                v.sort_unstable();
                v
            };
            assert_eq!(global(&a), global(&b));
            assert_eq!(global(&a), global(&c));
        }
    }

    #[test]
    fn rows_follow_the_seed_formula() {
        let plan = Plan::new(500, 5, 3, 9, 3).unwrap();
        let perm = plan.permutation(2);
        let obs: Vec<u64> = plan.observations(key(2, 1, 7)).collect();
        for (j, o) in obs.iter().enumerate() {
            assert_eq!(*o, perm.apply(7 * 15 + j as u64 * 3 + 1));
        }
        let it = plan.observations(key(2, 1, 7));
        assert_eq!(it.row(4), obs[4]);
    }

    #[test]
    fn locate_inverts_the_plan() {
        let plan = Plan::new(103, 4, 5, 1, 2).unwrap();
        let mut placed = 0;
        for epoch in 0..2 {
            for obs in 0..103 {
                match plan.locate(epoch, obs) {
                    Some(p) => {
                        placed += 1;
                        let k = key(epoch, p.rank, p.step);
                        assert_eq!(plan.observations(k).nth(p.row as usize), Some(obs));
                        assert_eq!(plan.position(k, p.row), p.position);
                    }
                    None => assert!(plan.permutation(epoch).invert(obs) >= 100),
                }
            }
        }
        assert_eq!(placed, 2 * 100);
    }

    #[test]
    fn rejects_zero_and_overflow() {
        assert!(Plan::new(10, 0, 1, 0, 1).is_err());
        assert!(Plan::new(10, 1, 0, 0, 1).is_err());
        assert!(Plan::new(10, 1, 1, 0, 0).is_err());
        assert!(Plan::new(10, u64::MAX, 2, 0, 1).is_err());
        let p = Plan::new(10, 20, 1, 0, 1).unwrap();
        assert_eq!(p.steps_per_epoch(), 0);
    }
}

//! How many rows of each source a global step holds: the counting state, EDF with the
//! water-filling fallback, and checkpoints for random access (see the module docs of
//! `mixture`).

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::Mutex;

use super::*;

/// The counting state at the start of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CountState {
    /// The global step this state precedes.
    pub step: u64,
    /// `C_k(step)`: rows drawn from each source so far.
    pub drawn: Vec<u64>,
    /// `D * (E_k(step) - C_k(step))`, `D = 2^32`.
    pub lag: Vec<i64>,
}

/// A key in the total order of candidate rows: class (`-inf`, finite `x / n`, `+inf`), then the
/// canonical rank of the source.
#[derive(Clone, Copy, Debug)]
struct Key {
    class: u8,
    rank: u32,
    x: i64,
    n: i64,
}

impl Key {
    #[inline]
    fn finite(x: i64, n: i64, rank: u32) -> Key {
        Key {
            class: 1,
            rank,
            x,
            n,
        }
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Key {}
impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    #[inline]
    fn cmp(&self, other: &Key) -> Ordering {
        self.class
            .cmp(&other.class)
            .then_with(|| {
                if self.class == 1 {
                    // x / n vs x' / n' with n, n' > 0: exact 64 x 64 -> 128-bit products
                    (self.x as i128 * other.n as i128).cmp(&(other.x as i128 * self.n as i128))
                } else {
                    Ordering::Equal
                }
            })
            .then(self.rank.cmp(&other.rank))
    }
}

/// Reusable buffers of one counting pass (no allocation per step).
#[derive(Clone, Debug, Default)]
pub(super) struct Scratch {
    a: Vec<i64>,
    cap: Vec<u64>,
    count: Vec<u64>,
    sorted: Vec<i64>,
    best: Vec<Option<Key>>,
    heap: Vec<(Key, usize)>,
    rheap: Vec<Reverse<(Key, usize)>>,
}

/// Per-step row counts of a [`Schedule`] (the algorithm of the module documentation).
///
/// Value ranges (why `i64` is exact): `G <= 2^30` and `n_k <= 2^32`, so `a_k = l_k + G n_k` and
/// every key numerator `beta - a_k + (i - 1) D` stay below `2^62 + 2^40` in magnitude, and key
/// comparisons multiply two `i64` into an `i128`.
#[derive(Debug)]
pub(crate) struct Counter {
    schedule: Schedule,
    pub(super) rank: Vec<u32>,
    pub(super) beta: i64,
    /// First guess of the EDF threshold (rows of slack), centring the first guess on `G`.
    tau: i64,
    /// `bounds[j] = D * b_j` for `j` in `0..=K` (`bounds[0]` unused).
    pub(super) bounds: Vec<i64>,
    checkpoints: Mutex<Vec<CountState>>,
}

impl Counter {
    /// Counts for `schedule`, breaking ties by `rank` (see [`name_ranks`]; must be a permutation
    /// of `0..K`).
    pub(crate) fn new(schedule: Schedule, rank: Vec<u32>) -> Result<Counter> {
        let k = schedule.sources();
        let mut seen = vec![false; k];
        if rank.len() != k
            || !rank
                .iter()
                .all(|&r| (r as usize) < k && !std::mem::replace(&mut seen[r as usize], true))
        {
            return Err(MixtureError::new("source ranks are not a permutation"));
        }
        let d = D as i128;
        let beta = if k == 1 {
            0
        } else {
            d - d / (2 * k as i128 - 2)
        };
        let mut bounds = vec![0i128; k + 1];
        for j in (1..k).rev() {
            let mut b = j.min(k - j) as i128 * beta;
            for p in 1..=k - j {
                let num = j as i128 * (bounds[j + p] + p as i128 * d);
                let den = (j + p) as i128;
                b = b.max((num + den - 1) / den);
            }
            bounds[j] = b;
        }
        // Rows of slack <= tau number about G + tau - K (beta - 1/2) (each source's count
        // rounds down by 1/2 on average): tau = round(K (beta - 1/2)).
        let tau = ((k as i128 * (2 * beta - d) + d) / (2 * d)).max(0) as i64;
        let start = CountState {
            step: 0,
            drawn: vec![0; k],
            lag: vec![0; k],
        };
        Ok(Counter {
            schedule,
            rank,
            beta: beta as i64,
            tau,
            bounds: bounds.into_iter().map(|b| b as i64).collect(),
            checkpoints: Mutex::new(vec![start]),
        })
    }

    /// The schedule.
    pub(crate) fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// `beta` as a fraction `(numerator, 2^32)`: the bound on `C - E` always, and on `|C - E|`
    /// while the weights are those of step 0.
    pub(crate) fn beta(&self) -> (i64, i64) {
        (self.beta, D)
    }

    /// `b_1` as a fraction `(numerator, 2^32)`: the bound on `E - C` across any changes.
    pub(crate) fn upper_bound(&self) -> (i64, i64) {
        (self.bounds.get(1).copied().unwrap_or(0), D)
    }

    /// The state at the start of `step`: replays from the nearest checkpoint at or before it
    /// (at most [`CHECKPOINT_STEPS`] steps once the checkpoints up to `step` exist; the first
    /// call for a far step replays everything before it once).
    pub(crate) fn state_at(&self, step: u64) -> CountState {
        let mut scratch = Scratch::default();
        let mut state = {
            let mut cps = self.checkpoints.lock().unwrap_or_else(|e| e.into_inner());
            let want = step / CHECKPOINT_STEPS;
            while (cps.len() as u64) <= want {
                let mut s = cps.last().expect("checkpoint 0").clone();
                for _ in 0..CHECKPOINT_STEPS {
                    self.advance(&mut s, &mut scratch);
                }
                cps.push(s);
            }
            cps[want as usize].clone()
        };
        while state.step < step {
            self.advance(&mut state, &mut scratch);
        }
        state
    }

    /// The state at `step` replayed from step 0 without checkpoints: the reference for tests
    /// and for measuring the cost of a cold jump.
    pub(crate) fn state_at_uncached(&self, step: u64) -> CountState {
        let k = self.schedule.sources();
        let mut state = CountState {
            step: 0,
            drawn: vec![0; k],
            lag: vec![0; k],
        };
        let mut scratch = Scratch::default();
        while state.step < step {
            self.advance(&mut state, &mut scratch);
        }
        state
    }

    /// Rows of each source in `step`, and `C_k(step)` before it.
    pub(crate) fn counts(&self, step: u64) -> StepCounts {
        let mut state = self.state_at(step);
        let drawn = state.drawn.clone();
        let mut scratch = Scratch::default();
        self.advance(&mut state, &mut scratch);
        StepCounts {
            step,
            global_batch: self.schedule.segment(step).global_batch,
            first_row: self.schedule.rows_before(step),
            drawn,
            counts: scratch.count,
        }
    }

    /// An in-order reader of the counts from `step` on.
    pub(crate) fn cursor(&self, step: u64) -> Cursor<'_> {
        Cursor {
            counter: self,
            state: self.state_at(step),
            scratch: Scratch::default(),
        }
    }

    /// One step: leaves `c_k(state.step)` in `s.count` and moves `state` to the next step.
    fn advance(&self, state: &mut CountState, s: &mut Scratch) {
        let seg = self.schedule.segment(state.step);
        let g = seg.global_batch;
        if !self.edf(state, &seg.weights, g, s) || !self.in_p(s) {
            self.water_fill(g, s);
        }
        for (i, &c) in s.count.iter().enumerate() {
            state.drawn[i] += c;
            state.lag[i] = s.a[i] - c as i64 * D;
        }
        state.step += 1;
    }

    /// Step 1 of the algorithm into `s.count` (and `a_k` into `s.a`); false if fewer than `g`
    /// rows are eligible.
    pub(super) fn edf(&self, state: &CountState, n: &[u64], g: u64, s: &mut Scratch) -> bool {
        let (beta, tau) = (self.beta, self.tau);
        s.a.clear();
        s.cap.clear();
        s.count.clear();
        let mut eligible = 0u64;
        for (&lag, &n) in state.lag.iter().zip(n) {
            let n = n as i64;
            let a = lag + g as i64 * n;
            // rows with a - i >= -beta
            let cap = ((a + beta) >> 32).clamp(0, g as i64) as u64;
            // rows whose key is <= tau: slack <= tau (w > 0) or -inf (w = 0)
            let first = if n > 0 {
                ((a - beta + tau * n) >> 32) + 1
            } else {
                -((beta - a) >> 32)
            };
            s.a.push(a);
            s.cap.push(cap);
            s.count.push(first.clamp(0, cap as i64) as u64);
            eligible += cap;
        }
        if eligible < g {
            return false;
        }
        let (a, rank) = (&s.a, &self.rank);
        let key = |i: usize, unit: u64| -> Key {
            // the unit-th row of source i in this step (unit >= 1)
            let x = beta - a[i] + (unit as i64 - 1) * D;
            if n[i] > 0 {
                Key::finite(x, n[i] as i64, rank[i])
            } else {
                Key {
                    class: if x < 0 { 0 } else { 2 },
                    rank: rank[i],
                    x: 0,
                    n: 1,
                }
            }
        };
        select(
            &mut s.count,
            &s.cap,
            g,
            key,
            &mut s.best,
            &mut s.heap,
            &mut s.rheap,
        );
        true
    }

    /// Whether `a - count` is inside the box `|l| <= beta` or the polytope `P`.
    pub(super) fn in_p(&self, s: &mut Scratch) -> bool {
        let mut in_box = true;
        for (&a, &c) in s.a.iter().zip(&s.count) {
            in_box &= (a - c as i64 * D).abs() <= self.beta;
        }
        if in_box {
            return true;
        }
        s.sorted.clear();
        s.sorted
            .extend(s.a.iter().zip(&s.count).map(|(&a, &c)| a - c as i64 * D));
        s.sorted.sort_unstable_by(|a, b| b.cmp(a));
        let mut sum = 0i64;
        for j in 1..s.sorted.len() {
            sum += s.sorted[j - 1];
            if sum > self.bounds[j] {
                return false;
            }
        }
        true
    }

    /// Step 2 of the algorithm into `s.count` (`s.a` holds `a_k`).
    fn water_fill(&self, g: u64, s: &mut Scratch) {
        s.cap.clear();
        s.count.clear();
        for &a in &s.a {
            // values a - t > 0, i.e. t < a: ceil(a / D) of them
            let positive = -((-a) >> 32);
            s.cap.push(g);
            s.count.push(positive.clamp(0, g as i64) as u64);
        }
        let (a, rank) = (&s.a, &self.rank);
        let key = |i: usize, unit: u64| Key::finite((unit as i64 - 1) * D - a[i], 1, rank[i]);
        select(
            &mut s.count,
            &s.cap,
            g,
            key,
            &mut s.best,
            &mut s.heap,
            &mut s.rheap,
        );
    }
}

/// Adjusts `count` (per source, a prefix of its candidate rows that is a down-set of the key
/// order, at most `cap`) to the `g` candidates of least key: adds the least next rows or drops
/// the greatest taken ones. Usually a move or two: a linear scan for few sources, a heap for
/// many.
fn select(
    count: &mut [u64],
    cap: &[u64],
    g: u64,
    key: impl Fn(usize, u64) -> Key,
    best: &mut Vec<Option<Key>>,
    heap: &mut Vec<(Key, usize)>,
    rheap: &mut Vec<Reverse<(Key, usize)>>,
) {
    const SCAN: usize = 32;
    let k = count.len();
    let mut total: u64 = count.iter().sum();
    if total == g {
        return;
    }
    let adding = total < g;
    if k <= SCAN {
        // the candidate of each source: its next row (adding) or its last taken row (dropping)
        let candidate = |i: usize, count: &[u64]| -> Option<Key> {
            if adding {
                (count[i] < cap[i]).then(|| key(i, count[i] + 1))
            } else {
                (count[i] > 0).then(|| key(i, count[i]))
            }
        };
        best.clear();
        best.extend((0..k).map(|i| candidate(i, count)));
        while total != g {
            let mut pick: Option<(usize, Key)> = None;
            for (i, c) in best.iter().enumerate() {
                if let Some(c) = *c
                    && pick.is_none_or(|(_, p)| (c < p) == adding)
                {
                    pick = Some((i, c));
                }
            }
            let (i, _) = pick.expect("enough candidates");
            if adding {
                count[i] += 1;
                total += 1;
            } else {
                count[i] -= 1;
                total -= 1;
            }
            best[i] = candidate(i, count);
        }
    } else if adding {
        rheap.clear();
        rheap.extend(
            (0..k)
                .filter(|&i| count[i] < cap[i])
                .map(|i| Reverse((key(i, count[i] + 1), i))),
        );
        let mut h = BinaryHeap::from(std::mem::take(rheap));
        while total < g {
            let Reverse((_, i)) = h.pop().expect("enough candidates");
            count[i] += 1;
            total += 1;
            if count[i] < cap[i] {
                h.push(Reverse((key(i, count[i] + 1), i)));
            }
        }
        *rheap = h.into_vec();
    } else {
        heap.clear();
        heap.extend(
            (0..k)
                .filter(|&i| count[i] > 0)
                .map(|i| (key(i, count[i]), i)),
        );
        let mut h = BinaryHeap::from(std::mem::take(heap));
        while total > g {
            let (_, i) = h.pop().expect("taken rows to drop");
            count[i] -= 1;
            total -= 1;
            if count[i] > 0 {
                h.push((key(i, count[i]), i));
            }
        }
        *heap = h.into_vec();
    }
}

/// Rows of each source in one global step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StepCounts {
    /// The global step.
    pub step: u64,
    /// Its global batch `G`.
    pub global_batch: u64,
    /// Rows in all earlier steps.
    pub first_row: u128,
    /// `C_k(step)`: rows drawn from each source before this step.
    pub drawn: Vec<u64>,
    /// `c_k(step)`: rows of each source in this step (sum `G`).
    pub counts: Vec<u64>,
}

/// Reads the counts step after step, `O(K)` each for few sources (`O(K log K)` for many).
#[derive(Debug)]
pub(crate) struct Cursor<'a> {
    counter: &'a Counter,
    state: CountState,
    scratch: Scratch,
}

impl Cursor<'_> {
    /// The state before the next step.
    pub(crate) fn state(&self) -> &CountState {
        &self.state
    }

    /// Counts of the next step (its number is `state().step` before the call); moves on.
    pub(crate) fn advance(&mut self) -> &[u64] {
        self.counter.advance(&mut self.state, &mut self.scratch);
        &self.scratch.count
    }

    /// The counts of the next step with its context; moves on.
    pub(crate) fn next_counts(&mut self) -> StepCounts {
        let step = self.state.step;
        let drawn = self.state.drawn.clone();
        let counts = self.advance().to_vec();
        let schedule = self.counter.schedule();
        StepCounts {
            step,
            global_batch: schedule.segment(step).global_batch,
            first_row: schedule.rows_before(step),
            drawn,
            counts,
        }
    }
}

//! Weighted mixtures of sources: exact per-step row counts, which rows, and where they go, as a
//! pure function of the global step. Nothing is stored per step.
//!
//! # Definitions
//!
//! Sources `k = 0..K`. A [`Schedule`] is a list of segments starting at global steps
//! `0 = g_0 < g_1 < ...`; each fixes integer weights `n_k` with `sum n_k = D = 2^32` (so the
//! weight is the exact rational `w_k = n_k / D`, see [`normalize`]) and a global batch `G >= 1`
//! (rows per global step). Step `x` uses the last segment with `g_s <= x`.
//!
//! - `C_k(g)`: rows of source `k` in steps `0..g`; `E_k(g) = sum_{x<g} G_x w_k(x)`.
//! - lag `l_k(g) = E_k(g) - C_k(g)`; `sum_k l_k = 0`; every lag is a multiple of `1/D` and the
//!   code keeps `D * l_k` exactly in an `i64`. No floating point is used after [`normalize`].
//!
//! # One step (`O(K)`, `O(K log K)` for more than 32 sources)
//!
//! `a_k = l_k + G w_k` is the lag at the end of the step if `k` got no row. With
//! `beta = 1 - floor(D/(2K-2))/D` (so `1 - 1/(2K-2) <= beta < 1 - 1/(2K-2) + 2^-32`; 0 for K = 1):
//!
//! 1. EDF: the `i`-th row of `k` in this step (`i >= 1`) is *eligible* if `a_k - i >= -beta`; its
//!    *slack* is `(i - 1 + beta - a_k) / w_k` rows (how long after this step the lag of `k`,
//!    without that row, stays `<= beta`; for `w_k = 0`: `-inf` if `i - 1 + beta - a_k < 0`, else
//!    `+inf`). Take the `G` eligible rows of least slack (ties: the smaller canonical source rank,
//!    i.e. the smaller source name). `c_k` = rows taken from `k`.
//! 2. If fewer than `G` rows are eligible or the new lags `a_k - c_k` leave the polytope `P`,
//!    discard that and *water-fill* instead: take the `G` largest of the values `a_k - t`,
//!    `t = 0, 1, ...` (rows go one by one to the largest remaining lag; same ties).
//!
//! `P = { l : sum l = 0, sum_{k in S} l_k <= b_|S| for every set S with 1 <= |S| < K }` with
//! `b_K = 0`, `b_j = max(min(j, K-j) beta, max_{1<=p<=K-j} j (b_{j+p} + p) / (j+p))`, each
//! rounded up to a multiple of `1/D` (computed once; [`Counter::upper_bound`] is `b_1`).
//!
//! # Guarantees
//!
//! 1. Always, across any weight and batch changes: `-beta <= l_k <= b_1`. A source is never a
//!    whole row ahead (`C - E <= beta < 1`); it is at most `b_1` behind: `b_1 = 1/2, 7/8, 4/3,
//!    17/12, 26/15, 85/48` for `K = 2..7`, below `H_K - 2/3` up to `K = 128` (`H_K` the harmonic
//!    number).
//! 2. While the weights are those of step 0 (the global batch may change at any step):
//!    `|l_k| <= beta`, Tijdeman's bound `1 - 1/(2K-2)` (up to `2^-32`), which is `< 1`.
//! 3. The same `|l_k| <= beta` holds after a weight change whenever some assignment from the
//!    lags at the change keeps `|l| <= beta` under the new weights (EDF finds it).
//! 4. No rule can promise `< 1` across weight changes for `K >= 4`: "steps before `g_0` are
//!    identical to a run without the change" makes every rule online, and for every online rule
//!    there is a schedule that defeats it. With `G = 1`: weights `1/4` each at step 0, then `1/3`
//!    on the three sources not served at step 0, then `1/2` on the two not served yet; a source
//!    served twice is a whole row ahead, so the last one is `1/4 + 1/3 + 1/2 = 13/12` behind
//!    (`H_K - 1` with `K` sources). For `K <= 3`, 1 gives `< 1` always.
//!
//! *Proof of 1* (`l` stays in `P`; `0` is in `P`). EDF results are kept only inside `P`.
//! Water-filling has (*): if `c_m >= 1` then `l'_i <= l'_m + 1` for every `i` (the last value
//! taken from `m`, `l'_m + 1`, is at least every value not taken, such as `l'_i`). Let `|S| = j <
//! K`. If `sum_S c >= G sum_S w`, then `sum_S l' <= sum_S l <= b_j`. Otherwise the set `T` of
//! sources outside `S` that got rows has `p >= 1` members; `U = S + T` got all `G` rows, so
//! `sum_U l' <= sum_U l <= b_{j+p}`; by (*) each `l'_i`, `i in S`, is at most `mean_T l' + 1`,
//! so `sum_S l' (1 + p/j) - p <= sum_U l' <= b_{j+p}`, i.e. `sum_S l' <= j (b_{j+p} + p)/(j+p)
//! <= b_j`. Hence `l_k <= b_1` and `l_k = -sum_{i != k} l_i >= -b_{K-1} = -beta` (since `(K-1)/K
//! <= beta`). (Water-filling alone keeps `b_j = j (H_K - H_j)`, i.e. `l <= H_K - 1`, the online
//! optimum of 4, but not `< 1` under constant weights: 1.013 for `K = 5`, `G = 1`; the EDF box
//! costs the difference.)
//!
//! *Proof of 2 and 3.* The rows of source `k` are unit jobs `J = 1, 2, ...`; `J` may go in a step
//! ending at row `R` only if `J <= E_k(R) + beta` (release) and must go in a step ending no later
//! than the first step end with `E_k(R) - (J - 1) > beta` (deadline): placements obeying every
//! window are exactly the assignments with `|l| <= beta` at every step end. Tijdeman (J. Comb.
//! Theory A 15, 1973; Discrete Math. 32, 1980) gives a row-by-row assignment with `|l| <= 1 -
//! 1/(2K-2) <= beta` after every row for any weights; grouping its rows into steps gives a valid
//! placement for any sequence of `G`. With constant weights the deadline of a job is a monotone
//! function of its slack, so step 1 is earliest-deadline-first among released jobs, and the
//! exchange argument (a valid placement that agrees with EDF before step `s` stays valid when a
//! job EDF takes at `s` is swapped in for one with a later deadline) shows EDF keeps every window.
//! Its results lie in the box `|l| <= beta`, inside `P` (`sum_S l <= min(j, K-j) beta <= b_j`),
//! so they are kept.
//!
//! # Which rows, and where
//!
//! - The `j`-th row ever drawn from source `k` is observation `perm_{k,e}(j mod m_k)`, `e = j div
//!   m_k`, over the `m_k` training observations of `k` ([`SourceOrder`]), with the source key
//!   derived from the run seed and the source *name* (stable when sources are added, removed,
//!   reordered or reweighted).
//! - Step `x` holds draws `C_k(x) .. C_k(x) + c_k(x)` of each source, laid out source by source
//!   (in name order) in positions `[0, G)`; slot `s` holds position `perm_{slots,x}(s)`, a keyed
//!   permutation of the `G` slots of step `x`. Row `j` of rank `r` is slot `j * ranks + r`, so a
//!   global step depends only on `G` ([`Batch`]).
//! - Counts at step `x` depend only on the segments starting at or before `x`; draws continue
//!   across changes, so no row is repeated or skipped.
//!
//! | file | what |
//! | --- | --- |
//! | `weights.rs` | exact weights, their normalization, the schedule of segments |
//! | `counts.rs` | rows per source in a step: EDF, water-filling, checkpoints |
//! | `rows.rs` | which observation each draw is, and the slot it goes to |
//!
//! Random access replays the steps from the nearest checkpoint ([`CHECKPOINT_STEPS`] apart,
//! filled in lazily, `O(K)` memory each): nothing is stored per step, and no closed form is
//! known for a quota rule with more than two sources.

use std::fmt;

mod counts;
mod rows;
mod weights;

#[cfg(test)]
mod tests;

pub(crate) use counts::*;
pub(crate) use rows::*;
pub(crate) use weights::*;

/// Name of the counting and placement algorithm, for fingerprints. Bump it when any formula in
/// the module documentation changes.
pub(crate) const ALGORITHM: &str = "mixture-v1";

/// Weights are integers out of `WEIGHT_ONE = 2^32`.
pub(crate) const WEIGHT_ONE: u64 = 1 << 32;

/// Largest global batch (rows per global step) a schedule accepts: keeps the count path exact in
/// `i64` (see [`Counter`]).
pub(crate) const MAX_GLOBAL_BATCH: u64 = 1 << 30;

/// Largest number of sources.
pub(crate) const MAX_SOURCES: usize = 4096;

/// Largest weight accepted by [`Weight::parse`] (weights are relative, so this only bounds the
/// ratio of the largest to the smallest).
pub(crate) const MAX_WEIGHT: u64 = 1_000_000_000;

/// Random access keeps the counting state every `CHECKPOINT_STEPS` steps, once computed.
pub(crate) const CHECKPOINT_STEPS: u64 = 1 << 14;

const D: i64 = WEIGHT_ONE as i64;
const WEIGHT_DECIMALS: u32 = 18;
const DOMAIN_DRAW: u64 = 0x6d69_7864_7261_7731; // "mixdraw1"
const DOMAIN_SLOT: u64 = 0x6d69_7873_6c6f_7431; // "mixslot1"
const DOMAIN_SPLIT: u64 = 0x6d69_7873_706c_7431; // "mixsplt1"

/// What is wrong with a mixture's configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MixtureError(String);

impl MixtureError {
    fn new(msg: impl Into<String>) -> MixtureError {
        MixtureError(msg.into())
    }
}

impl fmt::Display for MixtureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for MixtureError {}

type Result<T> = std::result::Result<T, MixtureError>;

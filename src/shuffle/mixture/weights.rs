//! Weights as exact decimals, normalized to integers out of `2^32`, and the schedule of
//! segments (weights and global batch from a global step on).

use std::cmp::Reverse;

use super::*;

/// A non-negative weight as an exact decimal: units of `10^-18`, at most [`MAX_WEIGHT`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Weight(u128);

impl Weight {
    /// Parses decimal text such as `0.7`, `3`, `1e-3`, `2.5E+2`. Digits beyond the 18th decimal
    /// place are dropped (truncation). Negative, non-finite or larger than [`MAX_WEIGHT`] values
    /// are errors.
    pub(crate) fn parse(text: &str) -> Result<Weight> {
        let bad = || {
            MixtureError::new(format!(
                "weight {text:?} is not a non-negative decimal number such as 0.25 or 1e-3"
            ))
        };
        let s = text.trim();
        let s = s.strip_prefix('+').unwrap_or(s);
        if s.starts_with('-') {
            return Err(MixtureError::new(format!(
                "weight {text:?} is negative; weights must be >= 0"
            )));
        }
        let (mantissa, exponent) = match s.find(['e', 'E']) {
            Some(i) => (&s[..i], Some(&s[i + 1..])),
            None => (s, None),
        };
        let exponent: i64 = match exponent {
            Some(e) => e.parse().map_err(|_| bad())?,
            None => 0,
        };
        let (int, frac) = match mantissa.find('.') {
            Some(i) => (&mantissa[..i], &mantissa[i + 1..]),
            None => (mantissa, ""),
        };
        if int.is_empty() && frac.is_empty() {
            return Err(bad());
        }
        if !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        // value = digits * 10^(exponent - frac.len())
        let digits = format!("{int}{frac}");
        let digits = digits.trim_start_matches('0');
        let too_big = || {
            MixtureError::new(format!(
                "weight {text:?} is larger than {MAX_WEIGHT}; weights are relative, scale them down"
            ))
        };
        if digits.is_empty() {
            return Ok(Weight(0));
        }
        let shift = exponent
            .checked_sub(frac.len() as i64)
            .and_then(|e| e.checked_add(WEIGHT_DECIMALS as i64))
            .ok_or_else(bad)?;
        let units = if shift >= 0 {
            if digits.len() as i64 + shift > 39 {
                return Err(too_big());
            }
            let d: u128 = digits.parse().map_err(|_| too_big())?;
            10u128
                .checked_pow(shift as u32)
                .and_then(|p| d.checked_mul(p))
                .ok_or_else(too_big)?
        } else {
            // drop the last -shift digits (truncation)
            let keep = digits.len() as i64 + shift;
            if keep <= 0 {
                0
            } else if keep > 39 {
                return Err(too_big());
            } else {
                digits[..keep as usize].parse().map_err(|_| too_big())?
            }
        };
        if units > MAX_WEIGHT as u128 * 10u128.pow(WEIGHT_DECIMALS) {
            return Err(too_big());
        }
        Ok(Weight(units))
    }

    /// The weight a TOML float denotes: its shortest round-trip decimal (Rust's `{:e}`
    /// formatting; `0.7` is exactly `7/10`), then [`Weight::parse`].
    pub(crate) fn from_f64(value: f64) -> Result<Weight> {
        if !value.is_finite() {
            return Err(MixtureError::new(format!(
                "weight {value} is not a finite number"
            )));
        }
        Weight::parse(&format!("{value:e}"))
    }

    /// The weight in units of `10^-18`.
    pub(crate) fn units(self) -> u128 {
        self.0
    }

    /// Whether the weight is zero.
    pub(crate) fn is_zero(self) -> bool {
        self.0 == 0
    }
}

/// Normalises weights to integers summing exactly to [`WEIGHT_ONE`]: `n_k = floor(D x_k / X)`
/// (`X` the exact sum), then one more for the `D - sum n_k < K` largest remainders `D x_k mod X`
/// (ties: smaller `rank`, see [`name_ranks`]). A positive weight that would become 0 is an error
/// (it is below `2^-32` of the total); so are all-zero weights.
pub(crate) fn normalize(weights: &[Weight], rank: &[u32]) -> Result<Vec<u64>> {
    assert_eq!(weights.len(), rank.len(), "one rank per weight");
    if weights.is_empty() {
        return Err(MixtureError::new("a mixture needs at least one source"));
    }
    if weights.len() > MAX_SOURCES {
        return Err(MixtureError::new(format!(
            "{} sources; at most {MAX_SOURCES} are supported",
            weights.len()
        )));
    }
    let total: u128 = weights.iter().map(|w| w.0).sum();
    if total == 0 {
        return Err(MixtureError::new(
            "all weights are zero; at least one source needs a positive weight",
        ));
    }
    let one = WEIGHT_ONE as u128;
    let mut n: Vec<u64> = weights.iter().map(|w| (w.0 * one / total) as u64).collect();
    let short = WEIGHT_ONE - n.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&k| (Reverse(weights[k].0 * one % total), rank[k]));
    for &k in order.iter().take(short as usize) {
        n[k] += 1;
    }
    for (k, w) in weights.iter().enumerate() {
        if !w.is_zero() && n[k] == 0 {
            return Err(MixtureError::new(format!(
                "weight of source {k} is below 2^-32 of the total weight; raise it or make it 0"
            )));
        }
    }
    Ok(n)
}

/// Canonical ranks of sources by name (rank 0 for the smallest name in byte order): every tie is
/// broken by this rank, so listing the sources in another order changes nothing.
pub(crate) fn name_ranks<S: AsRef<str>>(names: &[S]) -> Vec<u32> {
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by(|&a, &b| names[a].as_ref().cmp(names[b].as_ref()).then(a.cmp(&b)));
    let mut rank = vec![0u32; names.len()];
    for (r, &k) in order.iter().enumerate() {
        rank[k] = r as u32;
    }
    rank
}

// ---------------------------------------------------------------------------------------------
// Schedule
// ---------------------------------------------------------------------------------------------

/// Weights and global batch from a global step on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    /// First global step of the segment.
    pub from_step: u64,
    /// Normalised weights, summing to [`WEIGHT_ONE`].
    pub weights: Vec<u64>,
    /// Rows per global step.
    pub global_batch: u64,
    /// Rows in all steps before `from_step`.
    pub first_row: u128,
}

/// The weights and global batch of every global step: segments from step 0 on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Schedule {
    segments: Vec<Segment>,
}

impl Schedule {
    /// A schedule with one segment from step 0.
    pub(crate) fn new(weights: Vec<u64>, global_batch: u64) -> Result<Schedule> {
        check_weights(&weights, None)?;
        check_batch(global_batch)?;
        Ok(Schedule {
            segments: vec![Segment {
                from_step: 0,
                weights,
                global_batch,
                first_row: 0,
            }],
        })
    }

    /// Adds an entry from `from_step` on (after every existing one): new weights, a new global
    /// batch, or both (`None` keeps the value in force).
    pub(crate) fn change(
        &mut self,
        from_step: u64,
        weights: Option<Vec<u64>>,
        global_batch: Option<u64>,
    ) -> Result<()> {
        let last = self.segments.last().expect("a schedule has a segment");
        if from_step <= last.from_step {
            return Err(MixtureError::new(format!(
                "schedule entry at step {from_step} does not come after the entry at step {}; \
                 list entries by increasing from_step",
                last.from_step
            )));
        }
        let weights = weights.unwrap_or_else(|| last.weights.clone());
        check_weights(&weights, Some(last.weights.len()))?;
        let global_batch = global_batch.unwrap_or(last.global_batch);
        check_batch(global_batch)?;
        let first_row =
            last.first_row + (from_step - last.from_step) as u128 * last.global_batch as u128;
        self.segments.push(Segment {
            from_step,
            weights,
            global_batch,
            first_row,
        });
        Ok(())
    }

    /// Number of sources.
    pub(crate) fn sources(&self) -> usize {
        self.segments[0].weights.len()
    }

    /// All segments, by step.
    pub(crate) fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Index of the segment in force at `step`.
    pub(crate) fn segment_index(&self, step: u64) -> usize {
        self.segments.partition_point(|s| s.from_step <= step) - 1
    }

    /// The segment in force at `step`.
    pub(crate) fn segment(&self, step: u64) -> &Segment {
        &self.segments[self.segment_index(step)]
    }

    /// Rows in steps `0..step`.
    pub(crate) fn rows_before(&self, step: u64) -> u128 {
        let s = self.segment(step);
        s.first_row + (step - s.from_step) as u128 * s.global_batch as u128
    }

    /// `D * E_k(step)` exactly: the expected rows of source `k` in steps `0..step`, times `2^32`.
    pub(crate) fn expected_scaled(&self, step: u64, k: usize) -> u128 {
        let mut total = 0u128;
        for (i, s) in self.segments.iter().enumerate() {
            if s.from_step >= step {
                break;
            }
            let end = self
                .segments
                .get(i + 1)
                .map_or(step, |n| n.from_step.min(step));
            total += (end - s.from_step) as u128 * s.global_batch as u128 * s.weights[k] as u128;
        }
        total
    }

    /// The canonical text of the entries that start at or before `step`: one line `segment=
    /// <from_step>,<global_batch>,<n_0>,...,<n_{K-1}>` each (weights normalised, in source
    /// order). Entries after `step` do not change what is served up to `step`, so a fingerprint
    /// built from this text survives adding future entries.
    pub(crate) fn canonical_text(&self, step: u64) -> String {
        let mut out = String::new();
        for s in self.segments.iter().take_while(|s| s.from_step <= step) {
            out.push_str(&format!("segment={},{}", s.from_step, s.global_batch));
            for w in &s.weights {
                out.push_str(&format!(",{w}"));
            }
            out.push('\n');
        }
        out
    }
}

fn check_weights(weights: &[u64], k: Option<usize>) -> Result<()> {
    if let Some(k) = k
        && weights.len() != k
    {
        return Err(MixtureError::new(format!(
            "schedule entry has {} weights for {k} sources",
            weights.len()
        )));
    }
    if weights.is_empty() || weights.len() > MAX_SOURCES {
        return Err(MixtureError::new(format!(
            "a mixture needs 1 to {MAX_SOURCES} sources, not {}",
            weights.len()
        )));
    }
    let sum: u128 = weights.iter().map(|&w| w as u128).sum();
    if sum != WEIGHT_ONE as u128 {
        return Err(MixtureError::new(format!(
            "normalised weights sum to {sum}, not 2^32 (use mixture::normalize)"
        )));
    }
    Ok(())
}

fn check_batch(global_batch: u64) -> Result<()> {
    if global_batch == 0 || global_batch > MAX_GLOBAL_BATCH {
        return Err(MixtureError::new(format!(
            "global batch {global_batch} is outside 1..={MAX_GLOBAL_BATCH}"
        )));
    }
    Ok(())
}

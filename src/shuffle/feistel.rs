//! The keyed permutation behind every shuffle: a balanced Feistel network with cycle walking.
//!
//! `Permutation::new(n, seed, epoch)` is a bijection on `[0, n)` computed on demand in O(1)
//! time and memory per index; nothing is precomputed and nothing is allocated.
//!
//! Construction (this is the exact, versioned algorithm `feistel-v1`; docs/SEMANTICS.md states
//! it as formulas, and the fingerprint of a mount includes [`ALGORITHM`]):
//!
//! - domain: the smallest even-bit power of two `D = 2^(2h) >= n`; a value `x < D` splits into
//!   `L = x >> h` and `R = x & (2^h - 1)`.
//! - keys: `base = mix(mix(seed) ^ epoch)`, `k_i = mix(base + i)` for `i` in `0..ROUNDS`
//!   (wrapping arithmetic), where `mix` is the SplitMix64 output function.
//! - round `i`: `(L, R) -> (R, L ^ F(R, k_i))`, with `F(R, k) = mix(R ^ k) & (2^h - 1)`.
//! - cycle walking: apply the network to `x`; while the result is `>= n`, apply it again. The
//!   network is a bijection on `[0, D)`, so the walk always returns into `[0, n)` and the
//!   restriction is a bijection on `[0, n)`. Since `D < 4n`, a walk takes under 4 steps on
//!   average.
//! - inverse: the rounds run backwards, `(L, R) -> (R ^ F(L, k_i), L)` for `i` from the
//!   last round down, with the same cycle walking. Used for reverse lookup (which step trains
//!   observation `i`).

/// Number of Feistel rounds. The seed article calls 5 plenty for a non-cryptographic shuffle;
/// one more costs little and gives margin.
pub(crate) const ROUNDS: usize = 6;

/// Name of the algorithm, part of every mount's fingerprint. Bump it when any formula above
/// changes, because the same seed would then produce a different order.
pub(crate) const ALGORITHM: &str = "feistel-v1";

/// Walks [`Permutation::apply_strided`] runs side by side.
pub(crate) const LANES: usize = 8;

/// SplitMix64's increment (the golden ratio in 64 bits).
pub const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: a fast, well-mixing bijection on u64.
#[inline(always)]
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A bijection on `[0, n)` keyed by `(seed, epoch)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    mask: u64,
    keys: [u64; ROUNDS],
}

impl Permutation {
    /// The permutation of `[0, n)` for `(seed, epoch)`.
    pub fn new(n: u64, seed: u64, epoch: u64) -> Permutation {
        let half_bits = half_bits_for(n);
        let base = mix(mix(seed) ^ epoch);
        let mut keys = [0u64; ROUNDS];
        for (i, key) in keys.iter_mut().enumerate() {
            *key = mix(base.wrapping_add(i as u64));
        }
        Permutation {
            n,
            half_bits,
            mask: (1u64 << half_bits) - 1,
            keys,
        }
    }

    /// Maps position `i` to its shuffled value. Panics if `i >= n` (cycle walking from outside
    /// the domain might never return); callers check bounds first.
    #[inline]
    pub fn apply(&self, i: u64) -> u64 {
        assert!(i < self.n, "index {i} out of range {}", self.n);
        let mut x = self.encrypt(i);
        while x >= self.n {
            x = self.encrypt(x);
        }
        x
    }

    /// `out[k] = apply(start + k * stride)` for every `k`: the same values as
    /// [`Permutation::apply`], computed [`LANES`] walks at a time. A lone walk is one long
    /// dependency chain (each round waits for the previous multiply) and its "walk again?"
    /// branch is a coin toss the CPU mispredicts; here the rounds of independent lanes
    /// interleave, and a finished lane takes the next position with a conditional move
    /// instead of a branch. Panics if the last position is `>= n`.
    pub(crate) fn apply_strided(&self, start: u64, stride: u64, out: &mut [u64]) {
        let len = out.len();
        if len == 0 {
            return;
        }
        let last = (len as u64 - 1)
            .checked_mul(stride)
            .and_then(|d| d.checked_add(start));
        assert!(
            last.is_some_and(|l| l < self.n),
            "positions {start} + k * {stride} for k < {len} leave the range {}",
            self.n
        );
        let position = |k: usize| start + k as u64 * stride;
        let mut next = 0usize;
        if len >= 2 * LANES {
            // Lane l holds the value to encrypt next (a fresh position or a value still
            // outside [0, n)) and the output slot it belongs to.
            let mut value = [0u64; LANES];
            let mut slot = [0usize; LANES];
            for l in 0..LANES {
                value[l] = position(l);
                slot[l] = l;
            }
            next = LANES;
            // Each pass hands out at most LANES new positions, so all of them exist.
            while next + LANES <= len {
                let x = self.encrypt_lanes(value);
                for l in 0..LANES {
                    out[slot[l]] = x[l];
                    let done = x[l] < self.n;
                    value[l] = if done { position(next) } else { x[l] };
                    slot[l] = if done { next } else { slot[l] };
                    next += usize::from(done);
                }
            }
            for l in 0..LANES {
                let mut x = self.encrypt(value[l]);
                while x >= self.n {
                    x = self.encrypt(x);
                }
                out[slot[l]] = x;
            }
        }
        for (k, o) in out.iter_mut().enumerate().skip(next) {
            *o = self.apply(position(k));
        }
    }

    /// [`Permutation::encrypt`] of [`LANES`] values, round by round across the lanes.
    #[inline(always)]
    fn encrypt_lanes(&self, x: [u64; LANES]) -> [u64; LANES] {
        let h = self.half_bits;
        let mut l = x.map(|v| hi(v, h));
        let mut r = x.map(|v| v & self.mask);
        for &k in &self.keys {
            for i in 0..LANES {
                let next = l[i] ^ self.round(r[i], k);
                l[i] = r[i];
                r[i] = next;
            }
        }
        std::array::from_fn(|i| join(l[i], r[i], h))
    }

    /// The inverse of [`Permutation::apply`]: the position whose value is `v`.
    #[inline]
    pub(crate) fn invert(&self, v: u64) -> u64 {
        assert!(v < self.n, "value {v} out of range {}", self.n);
        let mut x = self.decrypt(v);
        while x >= self.n {
            x = self.decrypt(x);
        }
        x
    }

    #[inline(always)]
    fn round(&self, r: u64, key: u64) -> u64 {
        mix(r ^ key) & self.mask
    }

    #[inline(always)]
    fn encrypt(&self, x: u64) -> u64 {
        let h = self.half_bits;
        let (mut l, mut r) = (hi(x, h), x & self.mask);
        for &k in &self.keys {
            let next = l ^ self.round(r, k);
            l = r;
            r = next;
        }
        join(l, r, h)
    }

    #[inline(always)]
    fn decrypt(&self, x: u64) -> u64 {
        let h = self.half_bits;
        let (mut l, mut r) = (hi(x, h), x & self.mask);
        for &k in self.keys.iter().rev() {
            let prev = r ^ self.round(l, k);
            r = l;
            l = prev;
        }
        join(l, r, h)
    }
}

/// `h` such that `2^(2h)` is the smallest even-bit power of two `>= n` (0 for n <= 1).
fn half_bits_for(n: u64) -> u32 {
    if n <= 1 {
        return 0;
    }
    let bits = 64 - (n - 1).leading_zeros();
    bits.div_ceil(2)
}

#[inline(always)]
fn hi(x: u64, h: u32) -> u64 {
    // h <= 32, so the shift is in range even for the full 64-bit domain.
    if h == 0 { 0 } else { x >> h }
}

#[inline(always)]
fn join(l: u64, r: u64, h: u32) -> u64 {
    if h == 0 { 0 } else { (l << h) | r }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exhaustive_bijection_small_domains() {
        let mut seen = vec![u32::MAX; 4097];
        let mut stamp = 0u32;
        for seed in [0u64, 1, 0xDEAD_BEEF] {
            for n in 1..=4096u64 {
                stamp += 1;
                let p = Permutation::new(n, seed, 3);
                for i in 0..n {
                    let v = p.apply(i);
                    assert!(v < n, "n={n} seed={seed}: {i} -> {v} out of range");
                    assert_ne!(seen[v as usize], stamp, "n={n} seed={seed}: {v} hit twice");
                    seen[v as usize] = stamp;
                    assert_eq!(p.invert(v), i, "n={n} seed={seed}: invert({v}) != {i}");
                }
            }
        }
    }

    #[test]
    fn domain_is_smallest_even_power_of_two() {
        assert_eq!(half_bits_for(0), 0);
        assert_eq!(half_bits_for(1), 0);
        assert_eq!(half_bits_for(2), 1);
        assert_eq!(half_bits_for(4), 1);
        assert_eq!(half_bits_for(5), 2);
        assert_eq!(half_bits_for(16), 2);
        assert_eq!(half_bits_for(17), 3);
        assert_eq!(half_bits_for(1 << 40), 20);
        assert_eq!(half_bits_for((1 << 40) + 1), 21);
        assert_eq!(half_bits_for(u64::MAX), 32);
    }

    #[test]
    fn large_domains_sampled() {
        for n in [1_000_003u64, 1 << 33, (1 << 40) + 7, u64::MAX / 3, u64::MAX] {
            let p = Permutation::new(n, 42, 0);
            let mut outputs = Vec::new();
            for k in 0..2000u64 {
                let i = mix(k) % n;
                let v = p.apply(i);
                assert!(v < n);
                assert_eq!(p.invert(v), i, "n={n} i={i}");
                outputs.push(v);
            }
            outputs.sort_unstable();
            outputs.dedup();
            // distinct inputs (with overwhelming probability) give distinct outputs
            assert!(outputs.len() >= 1990, "n={n}");
        }
    }

    #[test]
    fn position_index_correlation_near_zero() {
        let n = 1_000_000u64;
        for (seed, epoch) in [(0, 0), (7, 1), (123_456, 9)] {
            let p = Permutation::new(n, seed, epoch);
            let mean = (n - 1) as f64 / 2.0;
            let (mut sxy, mut sxx) = (0.0f64, 0.0f64);
            let mut displaced = 0u64;
            for i in 0..n {
                let v = p.apply(i);
                let (x, y) = (i as f64 - mean, v as f64 - mean);
                sxy += x * y;
                sxx += x * x;
                if v != i {
                    displaced += 1;
                }
            }
            let r = sxy / sxx; // var(x) == var(y) for a permutation
            assert!(
                r.abs() < 0.005,
                "seed={seed} epoch={epoch}: correlation {r}"
            );
            assert!(
                displaced > n - 100,
                "too many fixed points: {}",
                n - displaced
            );
        }
    }

    #[test]
    fn successive_positions_are_not_clustered() {
        // Neighbouring positions should land far apart: mean |p(i+1) - p(i)| ~ n/3.
        let n = 1_000_000u64;
        let p = Permutation::new(n, 5, 0);
        let total: f64 = (0..n - 1)
            .map(|i| (p.apply(i + 1) as f64 - p.apply(i) as f64).abs())
            .sum();
        let mean = total / (n - 1) as f64;
        let expected = n as f64 / 3.0;
        assert!((mean - expected).abs() / expected < 0.02, "mean gap {mean}");
    }

    #[test]
    fn seeds_and_epochs_give_different_orders() {
        let n = 10_000;
        let order = |seed, epoch| -> Vec<u64> {
            let p = Permutation::new(n, seed, epoch);
            (0..n).map(|i| p.apply(i)).collect()
        };
        let base = order(1, 0);
        assert_eq!(base, order(1, 0), "deterministic");
        for other in [order(2, 0), order(1, 1), order(0, 0)] {
            let same = base.iter().zip(&other).filter(|(a, b)| a == b).count();
            assert!(same < 20, "{same} positions agree between different keys");
        }
    }

    #[test]
    fn apply_strided_equals_apply() {
        for n in [1u64, 2, 3, 7, 16, 17, 1000, 65_537, 1 << 20, (1 << 33) + 5] {
            let p = Permutation::new(n, 9, 2);
            for (start, stride, len) in [(0, 1, 0), (0, 1, 1), (0, 1, 7), (0, 1, 8), (1, 1, 9)]
                .into_iter()
                .chain([
                    (0u64, 1u64, 300usize),
                    (5, 3, 200),
                    (2, 7, 33),
                    (0, 1, 4096),
                ])
            {
                if len > 0 && start + (len as u64 - 1) * stride >= n {
                    continue;
                }
                let mut out = vec![u64::MAX; len];
                p.apply_strided(start, stride, &mut out);
                let want: Vec<u64> = (0..len as u64)
                    .map(|k| p.apply(start + k * stride))
                    .collect();
                assert_eq!(out, want, "n={n} start={start} stride={stride} len={len}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "leave the range")]
    fn apply_strided_checks_the_last_position() {
        Permutation::new(100, 0, 0).apply_strided(90, 5, &mut [0; 3]);
    }

    #[test]
    fn regression_pinned_values() {
        // Pins the algorithm against an independent Python transcription of the formulas in
        // docs/SEMANTICS.md. If this changes, bump ALGORITHM: every seed's order changed.
        let p = Permutation::new(1000, 0, 0);
        let first: Vec<u64> = (0..8).map(|i| p.apply(i)).collect();
        assert_eq!(first, [660, 352, 373, 831, 970, 297, 987, 621]);
        let p = Permutation::new(1_000_000_000_039, 12345, 7);
        assert_eq!(p.apply(0), 77_998_821_512);
        assert_eq!(p.apply(1), 76_067_114_242);
        assert_eq!(p.apply(999_999_999_999), 580_557_518_584);
        assert_eq!(mix(0), 0xE220_A839_7B1D_CDAF);
    }
}

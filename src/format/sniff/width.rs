//! The token width of a raw input: does it look like tokens of another width than `--dtype`?
//!
//! [`width`] checks a raw input against the `--dtype` it is packed with, from a sample of at
//! most [`SAMPLE_BYTES`] (2 MiB): the whole records when they are that small, else
//! [`WINDOWS`] windows of [`WINDOW`] bytes at fixed offsets spread evenly from the first
//! record to the last (each starting 8-byte aligned relative to the first record), so the
//! check costs the same for any file size and gives the same answer every time. A value is
//! *small* when it is at most 7 or all ones (-1), and *beyond any vocabulary* above
//! [`BEYOND_VOCAB`] (2^19 = 524,288, twice the largest vocabulary in use, 262,144), or below
//! -65,536 for a signed type. Reading `--dtype` values in groups of `k` (`k * size` is 2, 4
//! or 8 bytes, the widest first):
//! - *looks wider*: in at least 25% of at least 256 groups the first value is not small,
//!   and the values after it are the high part of one wider token: all small in at least
//!   99.9% of the groups (u32 read as u16: every other u16 is 0 or 1, the high half of a token
//!   below 2^19), or the same as in the previous group in at least 99% while the first value
//!   changes in at least half (large positional values, whose high half grows slowly). Data
//!   of a small vocabulary stored at the declared width has no such alternation (its small
//!   values fall at every position), so it passes.
//! - *looks narrower* (`--dtype` of 4 or 8 bytes): at least half of at least 256 values are
//!   beyond any vocabulary, and their halves look like two tokens: the high half changes from
//!   one value to the next in at least half of them and its mean is at least a quarter of the
//!   low half's (u16 read as u32: the next token lands in the high half; large positional
//!   u32 values have a slowly growing high half and pass). The width named is the widest
//!   narrower one at which the values do not look narrower still.
//!
//! It cannot judge a file under 512 bytes of records, and a u8 `--dtype` only against wider
//! tokens below 2,048. A refusal names the width the file looks like; `--force` packs it as
//! declared.

use std::io;

use super::read_ranges;
use crate::format::dtype::ScalarType;
use crate::storage::ReadAt;

/// Sampled bytes at most: the whole records of a smaller input.
pub(crate) const SAMPLE_BYTES: u64 = 2 << 20;
/// Windows sampled from a larger input.
pub(crate) const WINDOWS: u64 = 16;
/// Bytes per window.
pub(crate) const WINDOW: u64 = SAMPLE_BYTES / WINDOWS;
/// Values above this are beyond any vocabulary (2^19).
pub(crate) const BEYOND_VOCAB: i128 = 1 << 19;
/// Fewest groups or values the width check judges.
const MIN_SAMPLES: u64 = 256;

/// The `(offset, length)` windows sampled from `bytes` bytes of records (offsets relative to
/// the first record): deterministic, 8-byte aligned, at most [`SAMPLE_BYTES`] in all.
pub(crate) fn sample_windows(bytes: u64) -> Vec<(u64, u64)> {
    if bytes <= SAMPLE_BYTES {
        return vec![(0, bytes)];
    }
    (0..WINDOWS)
        .map(|k| (((bytes - WINDOW) / (WINDOWS - 1) * k) & !7, WINDOW))
        .collect()
}

/// Why an input looks like tokens of another width.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WidthGuess {
    /// The token type the data looks like.
    pub looks_like: ScalarType,
    /// What the sample showed, for the message.
    pub evidence: String,
}

/// The token type of `size` bytes with the signedness of `like` where one exists.
fn of_width(size: usize, like: ScalarType) -> ScalarType {
    let signed = matches!(like, ScalarType::I32 | ScalarType::I64);
    ScalarType::TOKEN_TYPES
        .into_iter()
        .filter(|t| t.size() == size)
        .min_by_key(|t| matches!(t, ScalarType::I32 | ScalarType::I64) != signed)
        .expect("a token type of 1, 2, 4 or 8 bytes")
}

/// Value `i` of `bytes` read as `t` (little-endian; sign-extended for signed types).
fn value(bytes: &[u8], i: usize, t: ScalarType) -> i128 {
    let s = t.size();
    let mut le = [0u8; 16];
    le[..s].copy_from_slice(&bytes[i * s..(i + 1) * s]);
    let v = i128::from_le_bytes(le);
    match t {
        ScalarType::I32 | ScalarType::I64 => {
            let shift = 128 - 8 * s as u32;
            (v << shift) >> shift
        }
        _ => v,
    }
}

fn small(v: i128, t: ScalarType) -> bool {
    let ones = (1i128 << (8 * t.size())) - 1;
    (-1..=7).contains(&v) || v == ones
}

fn beyond_vocab(v: i128) -> bool {
    !(-65_536..=BEYOND_VOCAB).contains(&v)
}

fn percent(n: u64, of: u64) -> String {
    format!("{:.1}%", n as f64 * 100.0 / of.max(1) as f64)
}

/// Checks sampled record bytes (whole windows, see [`sample_windows`]) against `declared`:
/// `Some` when they look like tokens of another width (the module docs give the rule).
pub(crate) fn width_of_samples(samples: &[Vec<u8>], declared: ScalarType) -> Option<WidthGuess> {
    let s = declared.size();
    // Wider: in groups of k values, the values after the first are the high part of one
    // wider token: small, or (positional-like data) nearly constant while the first varies.
    for w in [8usize, 4, 2].into_iter().filter(|&w| w > s) {
        let k = w / s;
        let (mut groups, mut high_small, mut low_big) = (0u64, 0u64, 0u64);
        let (mut pairs, mut high_same, mut low_same) = (0u64, 0u64, 0u64);
        for sample in samples {
            let mut prev: Option<&[u8]> = None;
            for g in sample.chunks_exact(w) {
                groups += 1;
                high_small += u64::from((1..k).all(|i| small(value(g, i, declared), declared)));
                low_big += u64::from(!small(value(g, 0, declared), declared));
                if let Some(p) = prev {
                    pairs += 1;
                    high_same += u64::from(p[s..] == g[s..]);
                    low_same += u64::from(p[..s] == g[..s]);
                }
                prev = Some(g);
            }
        }
        let enough = groups >= MIN_SAMPLES && low_big * 4 >= groups;
        let mostly_small = high_small * 1000 >= groups * 999;
        let near_constant = high_same * 100 >= pairs * 99 && low_same * 2 <= pairs;
        if enough && (mostly_small || near_constant) {
            let looks_like = of_width(w, declared);
            let (high, is) = if k == 2 {
                ("every second value".to_string(), "is")
            } else {
                (format!("{} of every {k} values", k - 1), "are")
            };
            let evidence = if mostly_small {
                format!(
                    "{high} {is} 0 (or small) in {} of {groups} sampled groups",
                    percent(high_small, groups)
                )
            } else {
                format!(
                    "{high} {is} the same from one group to the next in {} of {pairs} sampled \
                     groups while the others change",
                    percent(high_same, pairs)
                )
            };
            return Some(WidthGuess {
                looks_like,
                evidence: format!("{evidence}, as the high part of wider tokens"),
            });
        }
    }
    // Narrower: the widest narrower type at which the sample does not look narrower still.
    let (n, beyond) = narrower(samples, declared)?;
    let looks_like = [s / 2, s / 4]
        .into_iter()
        .filter(|&w| w >= 2)
        .map(|w| of_width(w, declared))
        .find(|&t| narrower(samples, t).is_none())
        .expect("2-byte tokens never look narrower");
    Some(WidthGuess {
        looks_like,
        evidence: format!(
            "{} of {n} sampled values are beyond any vocabulary (above {BEYOND_VOCAB}) and \
             their high halves look like tokens too",
            percent(beyond, n)
        ),
    })
}

/// Whether values of `t` (4 or 8 bytes) look like two narrower tokens each: at least half
/// are beyond any vocabulary, and the high half changes from one value to the next and is
/// not much smaller than the low half (unlike large positional values, whose high half grows
/// slowly). Returns (values, values beyond) when they do.
fn narrower(samples: &[Vec<u8>], t: ScalarType) -> Option<(u64, u64)> {
    let s = t.size();
    if s < 4 {
        return None;
    }
    let half = s / 2;
    let unsigned = |b: &[u8]| -> u128 {
        let mut le = [0u8; 16];
        le[..b.len()].copy_from_slice(b);
        u128::from_le_bytes(le)
    };
    let (mut n, mut beyond, mut changes) = (0u64, 0u64, 0u64);
    let (mut sum_lo, mut sum_hi) = (0u128, 0u128);
    for sample in samples {
        let mut prev_hi = None;
        for (i, v) in sample.chunks_exact(s).enumerate() {
            n += 1;
            beyond += u64::from(beyond_vocab(value(sample, i, t)));
            let (lo, hi) = (unsigned(&v[..half]), unsigned(&v[half..]));
            sum_lo += lo;
            sum_hi += hi;
            changes += u64::from(prev_hi.is_some_and(|p| p != hi));
            prev_hi = Some(hi);
        }
    }
    let alike = changes * 2 >= n && sum_hi * 4 >= sum_lo;
    (n >= MIN_SAMPLES && beyond * 2 >= n && alike).then_some((n, beyond))
}

/// Samples `bytes` bytes of records at `offset` of `file` and checks them against `declared`
/// ([`width_of_samples`]).
pub(crate) fn width<R: ReadAt + ?Sized>(
    file: &R,
    offset: u64,
    bytes: u64,
    declared: ScalarType,
) -> io::Result<Option<WidthGuess>> {
    let ranges: Vec<(u64, usize)> = sample_windows(bytes)
        .into_iter()
        .map(|(at, len)| (offset + at, len as usize))
        .collect();
    let samples = read_ranges(file, &ranges)?;
    Ok(width_of_samples(&samples, declared))
}

//! `--out-dtype`: `.npy` files served in another integer type than the dataset's records, so
//! that `torch.from_numpy(np.load(path))` feeds an embedding without a cast (`u16` tokens as
//! `int64`). Every value converts exactly; a value the type cannot hold fails the read with
//! `EOVERFLOW` ([`Error::OutOfRange`]), never a wrapped number. `S.json`, observation ids and
//! document spans do not change; `info.json` reports the served `dtype` and `itemsize` and the
//! dataset's own as `dataset_dtype`, and the fingerprint changes with the served type.

use crate::error::{Error, Result};
use crate::format::dtype::{RecordType, ScalarType};

/// The types `--out-dtype` serves: the index types of PyTorch (`int64`) and JAX/TF (`int32`).
pub(crate) const OUT_TYPES: [ScalarType; 2] = [ScalarType::I32, ScalarType::I64];

/// A conversion of token records from the dataset's type to the served one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Convert {
    pub(crate) from: ScalarType,
    pub(crate) to: ScalarType,
    /// Whether every value of `from` fits `to` (no per-value check needed).
    widening: bool,
}

impl Convert {
    /// The conversion `out` asks of a dataset of `record`s: `None` when there is nothing to
    /// convert (no `--out-dtype`, or the dataset's own type).
    pub(crate) fn new(record: &RecordType, out: Option<ScalarType>) -> Result<Option<Convert>> {
        let Some(to) = out else {
            return Ok(None);
        };
        let Some(from) = record.scalar_type() else {
            return Err(Error::invalid(format!(
                "--out-dtype applies to datasets of tokens; this one has structured records \
                 ({}): drop --out-dtype and read the records in their own type",
                record.npy_descr()
            )));
        };
        if from == to {
            return Ok(None);
        }
        if !OUT_TYPES.contains(&to) {
            return Err(Error::invalid(format!(
                "--out-dtype {to} is not served: choose i32 or i64 (or leave it out for the \
                 dataset's {from})"
            )));
        }
        let (Some((flo, fhi)), Some((tlo, thi))) = (from.int_range(), to.int_range()) else {
            return Err(Error::invalid(format!(
                "--out-dtype converts integer tokens; this dataset holds {from}"
            )));
        };
        Ok(Some(Convert {
            from,
            to,
            widening: tlo <= flo && fhi <= thi,
        }))
    }

    /// Converts whole records: `src` holds `n` records of `from`, `dst` gets the same `n` as
    /// `to`. `first` is the stream index of the first record (named by an overflow error).
    pub(crate) fn convert(&self, src: &[u8], dst: &mut [u8], first: u64) -> Result<()> {
        debug_assert_eq!(src.len() / self.from.size(), dst.len() / self.to.size());
        // A tight loop per source type (every token type but u64 fits i64), the general one
        // for u64.
        let done = match self.from {
            ScalarType::U8 => self.run::<1>(src, dst, |b| i64::from(b[0])),
            ScalarType::I8 => self.run::<1>(src, dst, |b| i64::from(b[0] as i8)),
            ScalarType::U16 => self.run::<2>(src, dst, |b| i64::from(u16::from_le_bytes(b))),
            ScalarType::I16 => self.run::<2>(src, dst, |b| i64::from(i16::from_le_bytes(b))),
            ScalarType::U32 => self.run::<4>(src, dst, |b| i64::from(u32::from_le_bytes(b))),
            ScalarType::I32 => self.run::<4>(src, dst, |b| i64::from(i32::from_le_bytes(b))),
            ScalarType::I64 => self.run::<8>(src, dst, i64::from_le_bytes),
            _ => None,
        };
        match done {
            Some(None) => Ok(()),
            Some(Some(i)) => Err(self.out_of_range(
                value(self.from, &src[i * self.from.size()..][..self.from.size()]),
                first + i as u64,
            )),
            None => self.convert_any(src, dst, first),
        }
    }

    /// Converts records of `F` bytes decoded by `decode`: `None` when done, `Some(i)` for the
    /// first record that does not fit.
    fn run<const F: usize>(
        &self,
        src: &[u8],
        dst: &mut [u8],
        decode: impl Fn([u8; F]) -> i64,
    ) -> Option<Option<usize>> {
        let records = src
            .chunks_exact(F)
            .map(|c| decode(c.try_into().expect("F bytes")));
        match self.to {
            ScalarType::I64 => {
                for (v, d) in records.zip(dst.chunks_exact_mut(8)) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
            }
            _ => {
                for (i, (v, d)) in records.zip(dst.chunks_exact_mut(4)).enumerate() {
                    let Ok(v) = i32::try_from(v) else {
                        return Some(Some(i));
                    };
                    d.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        Some(None)
    }

    /// The general conversion through `i128` (u64 sources).
    fn convert_any(&self, src: &[u8], dst: &mut [u8], first: u64) -> Result<()> {
        let (fs, ts) = (self.from.size(), self.to.size());
        let (lo, hi) = self.to.int_range().expect("checked in new");
        for (i, (s, d)) in src
            .chunks_exact(fs)
            .zip(dst.chunks_exact_mut(ts))
            .enumerate()
        {
            let v = value(self.from, s);
            if !self.widening && (v < lo || v > hi) {
                return Err(self.out_of_range(v, first + i as u64));
            }
            d.copy_from_slice(&v.to_le_bytes()[..ts]);
        }
        Ok(())
    }

    fn out_of_range(&self, value: i128, record: u64) -> Error {
        Error::OutOfRange {
            value,
            record,
            out: self.to.name(),
        }
    }
}

/// The integer in the little-endian bytes `le` of type `t`.
fn value(t: ScalarType, le: &[u8]) -> i128 {
    let mut buf = [0u8; 16];
    buf[..le.len()].copy_from_slice(le);
    let raw = i128::from_le_bytes(buf);
    match t {
        ScalarType::I8 | ScalarType::I16 | ScalarType::I32 | ScalarType::I64 => {
            let shift = 128 - 8 * le.len() as u32;
            (raw << shift) >> shift
        }
        _ => raw,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(from: ScalarType, to: ScalarType) -> Convert {
        Convert::new(&RecordType::scalar(from), Some(to))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn widening_is_exact_for_every_token_type() {
        for from in ScalarType::TOKEN_TYPES {
            let Some((lo, hi)) = from.int_range() else {
                continue;
            };
            if matches!(from, ScalarType::I64 | ScalarType::U64) {
                continue;
            }
            let c = conv(from, ScalarType::I64);
            let values = [lo, lo + 1, 0.max(lo), hi - 1, hi];
            let mut src = Vec::new();
            for v in values {
                src.extend_from_slice(&v.to_le_bytes()[..from.size()]);
            }
            let mut dst = vec![0u8; values.len() * 8];
            c.convert(&src, &mut dst, 0).unwrap();
            for (v, d) in values.iter().zip(dst.chunks_exact(8)) {
                assert_eq!(
                    i64::from_le_bytes(d.try_into().unwrap()) as i128,
                    *v,
                    "{from}"
                );
            }
        }
    }

    #[test]
    fn a_value_that_does_not_fit_fails_naming_it() {
        let c = conv(ScalarType::U32, ScalarType::I32);
        let src: Vec<u8> = [7u32, i32::MAX as u32, 1 << 31]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let mut dst = vec![0u8; 12];
        c.convert(&src[..8], &mut dst[..8], 0).unwrap();
        assert_eq!(&dst[..8], &[7, 0, 0, 0, 0xff, 0xff, 0xff, 0x7f]);
        let e = c.convert(&src, &mut dst, 100).unwrap_err();
        assert_eq!(e.errno(), libc::EOVERFLOW);
        let m = e.to_string();
        assert!(
            m.contains("2147483648") && m.contains("102") && m.contains("i64"),
            "{m}"
        );
        let c = conv(ScalarType::U64, ScalarType::I64);
        let mut dst = vec![0u8; 8];
        assert!(c.convert(&u64::MAX.to_le_bytes(), &mut dst, 0).is_err());
    }

    /// The per-type loops agree with the general conversion on random bytes (values that fit
    /// and values that do not), for every pair.
    #[test]
    fn fast_loops_agree_with_the_general_conversion() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 24) as u8
        };
        for from in ScalarType::TOKEN_TYPES {
            for to in OUT_TYPES {
                let Some(c) = Convert::new(&RecordType::scalar(from), Some(to)).unwrap() else {
                    continue;
                };
                for round in 0..50 {
                    let n = 1 + round * 7;
                    // Small values (high bytes zero) most of the time, any value sometimes.
                    let src: Vec<u8> = (0..n * from.size())
                        .map(|i| {
                            if i % from.size() < 2 || round % 5 == 0 {
                                next()
                            } else {
                                0
                            }
                        })
                        .collect();
                    let (mut fast, mut slow) = (vec![0u8; n * to.size()], vec![0u8; n * to.size()]);
                    let a = c.convert(&src, &mut fast, 7).map_err(|e| e.to_string());
                    let b = c.convert_any(&src, &mut slow, 7).map_err(|e| e.to_string());
                    assert_eq!(a, b, "{from} -> {to}");
                    if a.is_ok() {
                        assert_eq!(fast, slow, "{from} -> {to}");
                    }
                }
            }
        }
    }

    #[test]
    fn nothing_to_convert_and_refusals() {
        let u16s = RecordType::scalar(ScalarType::U16);
        assert_eq!(Convert::new(&u16s, None).unwrap(), None);
        assert_eq!(Convert::new(&u16s, Some(ScalarType::U16)).unwrap(), None);
        let e = Convert::new(&u16s, Some(ScalarType::U32)).unwrap_err();
        assert!(e.to_string().contains("i32 or i64"), "{e}");
    }
}

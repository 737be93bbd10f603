//! Document-masking arrays of a step, for datasets with documents: `S.pos.npy` and
//! `S.doclens.npy`, both of shape `(batch_size, window)`, derived from the same plan as
//! `S.npy` and `S.json`, so they always agree with them.
//!
//! Each row of `S.npy` is cut into *segments*, the runs of tokens of one document:
//! - stream mode: the documents the window crosses (`Dataset::spans`, runs of one document
//!   merged); the first segment of a row that starts inside a document continues that
//!   document's positions (its true offset in the document), every other starts at 0;
//! - documents mode: the row's document (its first `window` tokens), then the padding as one
//!   more segment;
//! - packed mode: the row's pieces (a prepended BOS is position 0 of its piece).
//!
//! `S.pos.npy` holds each token's position in its segment's document (int32; int64 with
//! `--out-dtype i64`): what Megatron's `reset_position_ids` and a document-masked attention
//! need; a position int32 cannot hold (a document of 2^31 tokens or more) fails the read with
//! EOVERFLOW. `S.doclens.npy` (int32) holds each row's segment lengths in order, then zeros:
//! they add up to `window`, like OLMo's `doc_lens`; flash-attention's `cu_seqlens` over the
//! flattened batch is `[0] + cumsum(doclens[doclens > 0])`. Both are int64 when the window
//! is 2^31 tokens or more.
//!
//! A read renders only the rows its byte range touches (`read_step_mask`), so a large array
//! is never built whole; the filesystem caches the small ones (at most 1 MiB) whole.

use super::{Mode, View};
use crate::error::{Error, Result};
use crate::format::dtype::ScalarType;
use crate::format::npy;
use crate::shuffle::plan::StepKey;

/// Which masking array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mask {
    /// `S.pos.npy`.
    Positions,
    /// `S.doclens.npy`.
    DocLens,
}

/// One run of a row's tokens from one document: its length, and the position (offset in
/// the document) of its first token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    len: u64,
    first_position: u64,
}

impl Mask {
    /// The element type: int32, or int64 for positions with `--out-dtype i64`; both int64
    /// when a window of `2^31` tokens or more could hold a larger value.
    fn scalar(self, window: u64, out: Option<ScalarType>) -> ScalarType {
        let wide_positions = self == Mask::Positions && out == Some(ScalarType::I64);
        if wide_positions || window > i32::MAX as u64 {
            ScalarType::I64
        } else {
            ScalarType::I32
        }
    }

    /// Values `[cells.start, cells.end)` of one row (`cells` within the window) cut into
    /// `segments`, each passed to `push`.
    fn row_values(
        self,
        segments: &[Segment],
        cells: std::ops::Range<u64>,
        mut push: impl FnMut(u64) -> Result<()>,
    ) -> Result<()> {
        match self {
            Mask::Positions => {
                let mut at = 0;
                for s in segments {
                    let lo = cells.start.max(at);
                    let hi = cells.end.min(at + s.len);
                    for k in lo..hi {
                        push(s.first_position + (k - at))?;
                    }
                    at += s.len;
                }
            }
            Mask::DocLens => {
                for k in cells {
                    push(segments.get(k as usize).map_or(0, |s| s.len))?;
                }
            }
        }
        Ok(())
    }
}

/// Appends `value` to `out` as a little-endian `ty` (int32 or int64); a value int32 cannot
/// hold (only a position in a document of 2^31 tokens or more) is an error, never wrapped.
fn encode(value: u64, ty: ScalarType, out: &mut Vec<u8>) -> Result<()> {
    if ty == ScalarType::I64 {
        out.extend_from_slice(&value.to_le_bytes());
    } else {
        let v = i32::try_from(value).map_err(|_| Error::PositionOutOfRange { value })?;
        out.extend_from_slice(&v.to_le_bytes());
    }
    Ok(())
}

impl View {
    /// The element type of a masking array.
    fn mask_type(&self, mask: Mask) -> ScalarType {
        mask.scalar(self.window, self.out.map(|c| c.to))
    }

    /// The `.npy` header of a masking array.
    fn mask_header(&self, mask: Mask) -> Result<Vec<u8>> {
        let descr = format!("'{}'", self.mask_type(mask).descr());
        npy::header(&descr, &[self.plan.batch_size(), self.window])
    }

    /// The size of a masking array of every step (fixed by the plan).
    pub(crate) fn step_mask_len(&self, mask: Mask) -> Result<u64> {
        let cells = self.plan.batch_size() * self.window;
        Ok(self.mask_header(mask)?.len() as u64 + cells * self.mask_type(mask).size() as u64)
    }

    /// The bytes of `S.pos.npy` or `S.doclens.npy` of step `key`.
    pub(crate) fn step_mask_npy(&self, key: StepKey, mask: Mask) -> Result<Vec<u8>> {
        let mut out = vec![0; self.step_mask_len(mask)? as usize];
        let n = self.read_step_mask(key, mask, 0, &mut out)?;
        out.truncate(n);
        Ok(out)
    }

    /// Reads bytes `[offset, offset + buf.len())` of `S.pos.npy` or `S.doclens.npy` of step
    /// `key` (clamped to its end) into `buf`, rendering only the rows they touch (a large
    /// array is never built whole); returns the bytes read.
    pub(crate) fn read_step_mask(
        &self,
        key: StepKey,
        mask: Mask,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let header = self.mask_header(mask)?;
        let ty = self.mask_type(mask);
        let size = ty.size() as u64;
        let total = self.step_mask_len(mask)?;
        if offset >= total {
            return Ok(0);
        }
        let end = total.min(offset + buf.len() as u64);
        let h = header.len() as u64;
        let mut n = 0;
        if offset < h {
            let part = &header[offset as usize..h.min(end) as usize];
            buf[..part.len()].copy_from_slice(part);
            n = part.len();
        }
        if end <= h {
            return Ok(n);
        }
        // Body bytes [from, end - h): cells [c0, c1), rendered row by row.
        let from = offset.max(h) - h;
        let (c0, c1) = (from / size, (end - h).div_ceil(size));
        let mut cells = Vec::with_capacity(((c1 - c0) * size) as usize);
        let window = self.window;
        for row in c0 / window..c1.div_ceil(window) {
            let segments = self.row_segments(key, row)?;
            let base = row * window;
            let range = c0.max(base) - base..c1.min(base + window) - base;
            mask.row_values(&segments, range, |v| encode(v, ty, &mut cells))?;
        }
        let skip = (from - c0 * size) as usize;
        let want = (end - h - from) as usize;
        buf[n..n + want].copy_from_slice(&cells[skip..skip + want]);
        Ok(n + want)
    }

    /// The segments of row `row` of step `key` (see the module docs).
    fn row_segments(&self, key: StepKey, row: u64) -> Result<Vec<Segment>> {
        let window = self.window;
        if let Some(packed) = &self.packed {
            let (block, r) = packed.row(&self.dataset, key.epoch, self.plan.position(key, row))?;
            return Ok(block
                .rows
                .row(r)
                .iter()
                .map(|p| Segment {
                    len: p.len,
                    first_position: 0,
                })
                .collect());
        }
        let observation = self.plan.observations(key).nth(row as usize).unwrap_or(0);
        if self.mode == Mode::Documents {
            let used = self.dataset.document(observation)?.len.min(window);
            let mut out = vec![Segment {
                len: used,
                first_position: 0,
            }];
            if used < window {
                out.push(Segment {
                    len: window - used,
                    first_position: 0,
                });
            }
            return Ok(out);
        }
        let first = self.windows.first_record_in(key.epoch, observation);
        let mut out: Vec<(u64, Segment)> = Vec::new();
        for span in self.dataset.spans(first, window)? {
            match out.last_mut() {
                Some((doc, s)) if *doc == span.doc => s.len += span.end - span.start,
                _ => out.push((
                    span.doc,
                    Segment {
                        len: span.end - span.start,
                        first_position: 0,
                    },
                )),
            }
        }
        if let Some((doc, s)) = out.first_mut() {
            s.first_position = first - self.dataset.document(*doc)?.start;
        }
        Ok(out.into_iter().map(|(_, s)| s).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(len: u64, first_position: u64) -> Segment {
        Segment {
            len,
            first_position,
        }
    }

    fn values(mask: Mask, segments: &[Segment], cells: std::ops::Range<u64>) -> Vec<u64> {
        let mut out = Vec::new();
        mask.row_values(segments, cells, |v| {
            out.push(v);
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn any_cell_range_is_the_slice_of_the_whole_row() {
        // A row of 10 starting 5 tokens into a document, then documents of 3 and 2 tokens.
        let row = [seg(5, 5), seg(3, 0), seg(2, 0)];
        let pos = values(Mask::Positions, &row, 0..10);
        assert_eq!(pos, [5, 6, 7, 8, 9, 0, 1, 2, 0, 1]);
        let lens = values(Mask::DocLens, &row, 0..10);
        assert_eq!(lens, [5, 3, 2, 0, 0, 0, 0, 0, 0, 0]);
        for a in 0..=10 {
            for b in a..=10 {
                let r = a as usize..b as usize;
                assert_eq!(values(Mask::Positions, &row, a..b), pos[r.clone()]);
                assert_eq!(values(Mask::DocLens, &row, a..b), lens[r]);
            }
        }
    }

    #[test]
    fn int32_positions_fail_past_2_pow_31_and_wide_windows_use_int64() {
        let mut out = Vec::new();
        encode(i32::MAX as u64, ScalarType::I32, &mut out).unwrap();
        assert_eq!(out, i32::MAX.to_le_bytes());
        let e = encode(1 << 31, ScalarType::I32, &mut out).unwrap_err();
        assert_eq!(e.errno(), libc::EOVERFLOW);
        assert!(e.to_string().contains("--out-dtype i64"), "{e}");
        out.clear();
        encode(1 << 40, ScalarType::I64, &mut out).unwrap();
        assert_eq!(out, (1u64 << 40).to_le_bytes());

        let i64 = Some(ScalarType::I64);
        assert_eq!(Mask::Positions.scalar(2048, None), ScalarType::I32);
        assert_eq!(Mask::Positions.scalar(2048, i64), ScalarType::I64);
        assert_eq!(Mask::DocLens.scalar(2048, i64), ScalarType::I32);
        assert_eq!(Mask::DocLens.scalar(1 << 31, None), ScalarType::I64);
        assert_eq!(Mask::Positions.scalar(1 << 31, None), ScalarType::I64);
    }
}

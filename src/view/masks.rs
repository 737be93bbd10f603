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
//! need. `S.doclens.npy` (int32) holds each row's segment lengths in order, then zeros: they
//! add up to `window`, like OLMo's `doc_lens`; flash-attention's `cu_seqlens` over the
//! flattened batch is `[0] + cumsum(doclens[doclens > 0])`.

use super::{Mode, View};
use crate::error::Result;
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

impl View {
    /// The element type of a masking array.
    fn mask_type(&self, mask: Mask) -> ScalarType {
        match (mask, self.out.map(|c| c.to)) {
            (Mask::Positions, Some(ScalarType::I64)) => ScalarType::I64,
            _ => ScalarType::I32,
        }
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
        let mut out = self.mask_header(mask)?;
        let wide = self.mask_type(mask) == ScalarType::I64;
        let mut push = |v: u64| {
            if wide {
                out.extend_from_slice(&v.to_le_bytes());
            } else {
                // Positions and lengths are below the window, which is below 2^32.
                out.extend_from_slice(&(v as u32).to_le_bytes());
            }
        };
        for row in 0..self.plan.batch_size() {
            let segments = self.row_segments(key, row)?;
            match mask {
                Mask::Positions => {
                    for s in &segments {
                        for k in 0..s.len {
                            push(s.first_position + k);
                        }
                    }
                }
                Mask::DocLens => {
                    for s in &segments {
                        push(s.len);
                    }
                    for _ in segments.len() as u64..self.window {
                        push(0);
                    }
                }
            }
        }
        Ok(out)
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

//! `S.json` of packed rows and of mixtures: each built whole as a serde value (a few hundred
//! bytes per row; the measuring trick of the parent module is not needed).

use std::io::Write;

use serde::Serialize;

use super::{Ctx, PieceJson};
use crate::dataset::Meta;
use crate::error::{Error, Result};
use crate::shuffle::plan::StepKey;
use crate::view::{Mode, View};

/// `S.json` of packed mode: each row's pieces (documents) and where their tokens are.
#[derive(Serialize)]
struct PackedStepJson<'a> {
    epoch: u64,
    rank: u64,
    step: u64,
    global_step: u64,
    /// Each row's position in the epoch's packed rows.
    observations: Vec<u64>,
    rows: Vec<Vec<PackedPieceJson>>,
    files: Vec<Vec<PieceJson<'a>>>,
    fingerprint: &'a str,
}

/// `S.json` of a mixture: each row's source and observation within it.
#[derive(Serialize)]
struct MixtureStepJson<'a> {
    /// A held-out step (`/val`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    val: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    epoch: Option<u64>,
    rank: u64,
    step: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    global_step: Option<u64>,
    /// Each row's source name.
    sources: Vec<&'a str>,
    /// Each row's observation id within its source.
    observations: Vec<u64>,
    /// Each row's draw: the row is the `draw`-th ever drawn from its source.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    draws: Vec<u64>,
    /// Each row's first record in its source's stream.
    token_starts: Vec<u64>,
    files: Vec<Vec<PieceJson<'a>>>,
    /// The fingerprint of the steps up to this one (sources, weights, schedule entries so far).
    fingerprint: String,
}

/// One piece of a packed row: records `[start, end)` of the row hold document `doc`'s first
/// records (from stream record `token_start`), after a prepended BOS when `bos`.
#[derive(Serialize)]
struct PackedPieceJson {
    start: u64,
    end: u64,
    doc: u64,
    token_start: u64,
    bos: bool,
    cropped: bool,
    meta: Meta,
}

impl View {
    /// Writes `/val/rank/R/step/S.json`: the held-out rows of that step.
    pub(crate) fn write_val_json(&self, rank: u64, step: u64, w: &mut impl Write) -> Result<()> {
        let Some(mixed) = &self.mixed else {
            return Err(Error::NotFound);
        };
        let key = StepKey {
            epoch: crate::view::mixture::VAL_EPOCH,
            rank,
            step,
        };
        self.mixture_step_json(mixed, key, w)
    }

    /// Writes `S.json` of a mixture for `key` (held-out steps: epoch `VAL_EPOCH`, written as
    /// `"val": true` without the training keys).
    pub(super) fn mixture_step_json(
        &self,
        mixed: &crate::view::mixture::Mixed,
        key: StepKey,
        w: &mut impl Write,
    ) -> Result<()> {
        let val = key.epoch == crate::view::mixture::VAL_EPOCH;
        let global_step = if val { 0 } else { self.plan.global_step(key) };
        let rows = mixed.rows(key, self.plan.ranks(), 0, self.step_batch(key));
        let mut value = MixtureStepJson {
            val,
            epoch: (!val).then_some(key.epoch),
            rank: key.rank,
            step: key.step,
            global_step: (!val).then_some(global_step),
            sources: Vec::new(),
            observations: Vec::new(),
            draws: Vec::new(),
            token_starts: Vec::new(),
            files: Vec::new(),
            fingerprint: self.fingerprint_at(global_step),
        };
        for r in rows {
            let (name, source) = &mixed.sources[r.source];
            let (start, len) = match self.mode {
                Mode::Documents => {
                    let d = source.dataset.document(r.observation)?;
                    (d.start, d.len.min(self.window))
                }
                _ => (source.windows.first_record(r.observation), self.window),
            };
            let shards = &source.dataset.manifest().shards;
            value.sources.push(name);
            value.observations.push(r.observation);
            if !val {
                value.draws.push(r.draw);
            }
            value.token_starts.push(start);
            value.files.push(
                source
                    .dataset
                    .pieces(start, len)
                    .map(|(index, offset, records)| PieceJson {
                        file: &shards[index].path,
                        offset,
                        records,
                    })
                    .collect(),
            );
        }
        Ctx::new(self, None).write(w, &value)
    }

    /// Writes `S.json` of packed mode for `key`.
    pub(super) fn packed_step_json(
        &self,
        packed: &crate::view::packed::Packed,
        key: StepKey,
        w: &mut impl Write,
    ) -> Result<()> {
        let shards = &self.dataset.manifest().shards;
        let mut value = PackedStepJson {
            epoch: key.epoch,
            rank: key.rank,
            step: key.step,
            global_step: self.plan.global_step(key),
            observations: Vec::new(),
            rows: Vec::new(),
            files: Vec::new(),
            fingerprint: &self.info.fingerprint,
        };
        for row in 0..self.plan.batch_size() {
            let position = self.plan.position(key, row);
            let (block, r) = packed.row(&self.dataset, key.epoch, position)?;
            let (mut pieces, mut sources, mut at) = (Vec::new(), Vec::new(), 0u64);
            for p in block.rows.row(r) {
                let doc = self.dataset.document(p.doc)?;
                let tokens = p.doc_tokens().end;
                pieces.push(PackedPieceJson {
                    start: at,
                    end: at + p.len,
                    doc: p.doc,
                    token_start: doc.start,
                    bos: p.bos_prepended,
                    cropped: p.cropped,
                    meta: doc.meta,
                });
                at += p.len;
                sources.extend(self.dataset.pieces(doc.start, tokens).map(
                    |(index, offset, records)| PieceJson {
                        file: &shards[index].path,
                        offset,
                        records,
                    },
                ));
            }
            value.observations.push(position);
            value.rows.push(pieces);
            value.files.push(sources);
        }
        Ctx::new(self, None).write(w, &value)
    }
}

//! The JSON files of the tree, as serde structs: `S.json` ([`StepJson`]), `observation/I.json`
//! ([`ObservationJson`]) and `lookup/epoch/E/observation/I.json` ([`LookupJson`]). Metadata
//! is served as the JSON text it was packed as ([`Meta`], a raw value).
//!
//! The files are compact JSON and a newline. They are serialized as they stream out: lists
//! are drawn from their iterators while written, and each row's spans are read from the
//! document files when the row is reached. So [`json_len`] measures a file by writing it into
//! a counter, and [`json_range`] produces any byte range by writing until the range is
//! complete, neither keeping a copy of the whole file.
//!
//! `stat` needs the size of `S.json` without its cost: [`View::step_json_len`] serializes it
//! in a *measuring* mode, where each row's spans come from their shapes (read for sizes only,
//! `Dataset::span_shapes`) and are written as `[]`, and each document's metadata as `null`,
//! their true lengths added instead ([`spans_json_len`]). Equal to the length written whenever
//! the file can be written (a test checks every digit count).
//!
//! An error of the dataset met while serializing (a damaged document file) stops the writer;
//! [`Failed`] keeps it, so the caller sees it instead of serde's message.

use std::cell::{Cell, RefCell};
use std::io::Write;

use serde::ser::SerializeSeq;
use serde::{Serialize, Serializer};

use super::{Mode, View};
use crate::dataset::{Meta, Span, SpanShape};
use crate::error::{Error, Result};
use crate::shuffle::plan::StepKey;

mod steps;

/// `S.json`: the step's observations, where each row's records are in the stream, and the
/// documents and metadata of its records.
#[derive(Serialize)]
struct StepJson<'a> {
    epoch: u64,
    rank: u64,
    step: u64,
    global_step: u64,
    observations: Numbers<'a>,
    token_starts: Numbers<'a>,
    /// Documents mode: each row's document length, at most the window.
    #[serde(skip_serializing_if = "Option::is_none")]
    lengths: Option<Numbers<'a>>,
    /// Documents mode: whether each row's document is longer than the window.
    #[serde(skip_serializing_if = "Option::is_none")]
    truncated: Option<Vec<bool>>,
    /// Documents mode: each row's document metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    meta: Option<Metas<'a>>,
    /// With documents: each row's spans of records with one metadata entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    rows: Option<Rows<'a>>,
    /// Each row's records as stored: `{"file","offset","records"}` per shard piece.
    files: Sources<'a>,
    fingerprint: &'a str,
}

/// `observation/I.json`: where observation `I` is in the stream, and its metadata.
#[derive(Serialize)]
struct ObservationJson<'a> {
    observation: u64,
    mode: &'static str,
    token_start: u64,
    token_end: u64,
    /// Documents mode: the document (the observation itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    doc: Option<u64>,
    /// Documents mode: its metadata.
    #[serde(skip_serializing_if = "Option::is_none")]
    meta: Option<&'a Meta>,
    /// With documents: the spans of its records.
    #[serde(skip_serializing_if = "Option::is_none")]
    spans: Option<Spans<'a>>,
}

/// `lookup/epoch/E/observation/I.json`: where observation `I` is trained in epoch `E`.
#[derive(Serialize)]
struct LookupJson {
    epoch: u64,
    observation: u64,
    position: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rank: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    row: Option<u64>,
    /// In the tail an epoch drops (no step holds it).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    dropped: bool,
}

/// One span: `{"start","end","doc","meta"}`, or the padding of a row, `{"start","end",
/// "doc":null,"meta":null,"pad":true}`.
#[derive(Serialize)]
struct SpanJson<'a> {
    start: u64,
    end: u64,
    doc: Option<u64>,
    meta: Option<&'a Meta>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pad: bool,
}

/// A row's spans, and its padding span `(start, end)` if any.
struct Spans<'a>(&'a [Span], Option<(u64, u64)>);

impl Serialize for Spans<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let Spans(spans, pad) = *self;
        let padding = pad.map(|(start, end)| SpanJson {
            start,
            end,
            doc: None,
            meta: None,
            pad: true,
        });
        let spans = spans.iter().map(|s| SpanJson {
            start: s.start,
            end: s.end,
            doc: Some(s.doc),
            meta: Some(&s.meta),
            pad: false,
        });
        serializer.collect_seq(spans.chain(padding))
    }
}

/// A JSON array of the numbers an iterator yields, drawn while it is written.
struct Numbers<'a>(RefCell<Option<Box<dyn Iterator<Item = u64> + 'a>>>);

impl<'a> Numbers<'a> {
    fn new(items: impl Iterator<Item = u64> + 'a) -> Numbers<'a> {
        Numbers(RefCell::new(Some(Box::new(items))))
    }
}

impl Serialize for Numbers<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let items = self.0.borrow_mut().take().expect("serialized once");
        serializer.collect_seq(items)
    }
}

/// The metadata of each row's document (documents mode): the text, or in measuring mode
/// `null` and the text's length.
struct Metas<'a> {
    docs: &'a [Row],
    ctx: &'a Ctx<'a>,
}

impl Serialize for Metas<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.docs.len()))?;
        for d in self.docs {
            match &d.meta {
                RowMeta::Text(meta) => seq.serialize_element(meta)?,
                RowMeta::Len(len) => {
                    self.ctx.measured(*len, b"null".len() as u64);
                    seq.serialize_element(&())?;
                }
            }
        }
        seq.end()
    }
}

/// Each row's spans: `(first record, records, padding)` per row, read when the row is written;
/// in measuring mode written as `[]`, their length measured from their shapes.
struct Rows<'a> {
    rows: RefCell<Option<Box<RowList<'a>>>>,
    ctx: &'a Ctx<'a>,
}

type RowList<'a> = dyn Iterator<Item = (u64, u64, Option<(u64, u64)>)> + 'a;

impl Serialize for Rows<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let rows = self.rows.borrow_mut().take().expect("serialized once");
        let dataset = self.ctx.view.dataset();
        let mut seq = serializer.serialize_seq(None)?;
        for (record, count, pad) in rows {
            if self.ctx.measure.is_some() {
                let shapes = dataset
                    .span_shapes(record, count)
                    .map_err(|e| self.ctx.fail::<S::Error>(e))?;
                self.ctx
                    .measured(spans_json_len(&shapes, pad), b"[]".len() as u64);
                seq.serialize_element(&[(); 0])?;
            } else {
                let spans = dataset
                    .spans(record, count)
                    .map_err(|e| self.ctx.fail::<S::Error>(e))?;
                seq.serialize_element(&Spans(&spans, pad))?;
            }
        }
        seq.end()
    }
}

/// Each row's `(first record, records)`, written as the pieces of the shard files that hold
/// them (computed from the manifest, no I/O).
struct Sources<'a> {
    rows: RefCell<Option<Box<RowRanges<'a>>>>,
    view: &'a View,
}

type RowRanges<'a> = dyn Iterator<Item = (u64, u64)> + 'a;

/// One piece of a row: `records` records at byte `offset` of `file` (the manifest's path).
#[derive(Serialize)]
struct PieceJson<'a> {
    file: &'a str,
    offset: u64,
    records: u64,
}

impl Serialize for Sources<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let rows = self.rows.borrow_mut().take().expect("serialized once");
        let dataset = self.view.dataset();
        let shards = &dataset.manifest().shards;
        let mut seq = serializer.serialize_seq(None)?;
        for (record, count) in rows {
            let pieces: Vec<PieceJson> = dataset
                .pieces(record, count)
                .map(|(index, offset, records)| PieceJson {
                    file: &shards[index].path,
                    offset,
                    records,
                })
                .collect();
            seq.serialize_element(&pieces)?;
        }
        seq.end()
    }
}

/// A row of a documents-mode step: its document.
struct Row {
    start: u64,
    len: u64,
    meta: RowMeta,
}

/// A row's document metadata: the text, or (measuring) its length.
enum RowMeta {
    Text(Meta),
    Len(u64),
}

/// What serializing a file needs besides its value: the view, the measuring state, and where
/// a dataset error is kept.
struct Ctx<'a> {
    view: &'a View,
    measure: Option<&'a Measure>,
    failed: RefCell<Option<Error>>,
}

/// Measuring mode (see the module docs): the lengths of what was written as placeholders.
#[derive(Default)]
struct Measure {
    /// The true lengths of the parts written as placeholders.
    real: Cell<u64>,
    /// The lengths of the placeholders written instead.
    placeholders: Cell<u64>,
}

impl<'a> Ctx<'a> {
    fn new(view: &'a View, measure: Option<&'a Measure>) -> Ctx<'a> {
        Ctx {
            view,
            measure,
            failed: RefCell::new(None),
        }
    }

    /// Keeps `e` and returns the serializer error that stops the writer.
    fn fail<E: serde::ser::Error>(&self, e: Error) -> E {
        *self.failed.borrow_mut() = Some(e);
        E::custom("dataset error")
    }

    /// A part of true length `real` was written as a placeholder of `placeholder` bytes.
    fn measured(&self, real: u64, placeholder: u64) {
        if let Some(m) = self.measure {
            m.real.set(m.real.get() + real);
            m.placeholders.set(m.placeholders.get() + placeholder);
        }
    }

    /// Writes `value`, compact, and a newline to `w`.
    fn write(&self, w: &mut impl Write, value: &impl Serialize) -> Result<()> {
        let io = |e: std::io::Error| Error::io("<json>", e);
        serde_json::to_writer(&mut *w, value).map_err(|e| match self.failed.take() {
            Some(failed) => failed,
            None => io(e.into()),
        })?;
        w.write_all(b"\n").map_err(io)
    }
}

impl View {
    /// Writes `S.json` for `key` to `w`.
    pub(crate) fn write_step_json(&self, key: StepKey, w: &mut impl Write) -> Result<()> {
        if self.remote {
            // The rows' documents in a few round trips (storage/remote/ahead.rs).
            return crate::storage::remote::ahead::ahead(
                || self.warm_documents(key),
                || self.step_json_to(key, w, None),
            );
        }
        self.step_json_to(key, w, None)
    }

    /// The bytes of `S.json` for `key`.
    pub fn step_json(&self, key: StepKey) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_step_json(key, &mut out)?;
        Ok(out)
    }

    /// The size of `S.json` for `key`, at a fraction of the cost of writing it (see the module
    /// docs). Equal to the length `View::write_step_json` writes whenever that succeeds.
    pub fn step_json_len(&self, key: StepKey) -> Result<u64> {
        let measure = Measure::default();
        let written = json_len(|c| {
            if self.remote {
                return crate::storage::remote::ahead::ahead(
                    || self.warm_documents(key),
                    || self.step_json_to(key, c, Some(&measure)),
                );
            }
            self.step_json_to(key, c, Some(&measure))
        })?;
        Ok(written - measure.placeholders.get() + measure.real.get())
    }

    /// Writes `S.json` for `key` to `w`, or measures it (`measure`).
    fn step_json_to(
        &self,
        key: StepKey,
        w: &mut impl Write,
        measure: Option<&Measure>,
    ) -> Result<()> {
        if let Some(packed) = &self.packed {
            return self.packed_step_json(packed, key, w);
        }
        if let Some(mixed) = &self.mixed {
            return self.mixture_step_json(mixed, key, w);
        }
        let ctx = Ctx::new(self, measure);
        let plan = &self.plan;
        let observations = move || plan.observations(key);
        let window = self.window;
        let has_documents = self.dataset.has_documents();
        let docs: Vec<Row>;
        let mut step = StepJson {
            epoch: key.epoch,
            rank: key.rank,
            step: key.step,
            global_step: plan.global_step(key),
            observations: Numbers::new(observations()),
            token_starts: Numbers::new(std::iter::empty()),
            lengths: None,
            truncated: None,
            meta: None,
            rows: None,
            files: Sources {
                rows: RefCell::new(None),
                view: self,
            },
            fingerprint: &self.info.fingerprint,
        };
        match self.mode {
            Mode::Stream | Mode::Packed => {
                let first = move |o| self.windows.first_record_in(key.epoch, o);
                step.token_starts = Numbers::new(observations().map(first));
                *step.files.rows.borrow_mut() =
                    Some(Box::new(observations().map(move |o| (first(o), window))));
                let rows = observations().map(move |o| (first(o), window, None));
                step.rows = has_documents.then(|| Rows {
                    rows: RefCell::new(Some(Box::new(rows))),
                    ctx: &ctx,
                });
            }
            Mode::Documents => {
                docs = observations()
                    .map(|o| self.row_document(o, measure.is_some()))
                    .collect::<Result<_>>()?;
                step.token_starts = Numbers::new(docs.iter().map(|d| d.start));
                step.lengths = Some(Numbers::new(docs.iter().map(move |d| d.len.min(window))));
                step.truncated = Some(docs.iter().map(|d| d.len > window).collect());
                *step.files.rows.borrow_mut() = Some(Box::new(
                    docs.iter().map(move |d| (d.start, d.len.min(window))),
                ));
                step.meta = Some(Metas {
                    docs: &docs,
                    ctx: &ctx,
                });
                let rows = docs.iter().map(move |d| {
                    let used = d.len.min(window);
                    (d.start, used, (used < window).then_some((used, window)))
                });
                step.rows = Some(Rows {
                    rows: RefCell::new(Some(Box::new(rows))),
                    ctx: &ctx,
                });
            }
        }
        ctx.write(w, &step)
    }

    /// The document of a documents-mode row (`measuring`: its shape only).
    fn row_document(&self, observation: u64, measuring: bool) -> Result<Row> {
        Ok(if measuring {
            let d = self.dataset.document_shape(observation)?;
            Row {
                start: d.start,
                len: d.len,
                meta: RowMeta::Len(d.meta_len),
            }
        } else {
            let d = self.dataset.document(observation)?;
            Row {
                start: d.start,
                len: d.len,
                meta: RowMeta::Text(d.meta),
            }
        })
    }

    /// Writes `observation/I.json`: where observation `I` is in the stream and its metadata.
    pub(crate) fn write_observation_json(
        &self,
        observation: u64,
        w: &mut impl Write,
    ) -> Result<()> {
        let (start, len, meta) = match self.mode {
            Mode::Packed => return Err(Error::NotFound),
            Mode::Stream => (self.windows.first_record(observation), self.window, None),
            Mode::Documents => {
                let d = self.dataset.document(observation)?;
                (d.start, d.len, Some(d.meta))
            }
        };
        let spans = match self.dataset.has_documents() {
            true => Some(self.dataset.spans(start, len)?),
            false => None,
        };
        let value = ObservationJson {
            observation,
            mode: self.mode.name(),
            token_start: start,
            token_end: start + len,
            doc: meta.is_some().then_some(observation),
            meta: meta.as_ref(),
            spans: spans.as_deref().map(|s| Spans(s, None)),
        };
        Ctx::new(self, None).write(w, &value)
    }

    /// Writes `lookup/epoch/E/observation/I.json`: where observation `I` is trained in epoch
    /// `E`, found by running the permutation backwards.
    pub(crate) fn write_lookup_json(
        &self,
        epoch: u64,
        observation: u64,
        w: &mut impl Write,
    ) -> Result<()> {
        let placement = self.plan.locate(epoch, observation);
        let value = LookupJson {
            epoch,
            observation,
            position: match placement {
                Some(p) => p.position,
                None => self.plan.permutation(epoch).invert(observation),
            },
            step: placement.map(|p| p.step),
            rank: placement.map(|p| p.rank),
            row: placement.map(|p| p.row),
            dropped: placement.is_none(),
        };
        Ctx::new(self, None).write(w, &value)
    }
}

/// The length of what [`Spans`] writes for spans of these shapes.
fn spans_json_len(spans: &[SpanShape], pad: Option<(u64, u64)>) -> u64 {
    let digits = |v: u64| u64::from(v.checked_ilog10().unwrap_or(0)) + 1;
    // `[` and `]`, a comma between spans, and each `{"start":S,"end":E,"doc":D,"meta":M}`.
    let mut n = 2 + (spans.len() as u64).saturating_sub(1);
    for s in spans {
        n += 32 + digits(s.start) + digits(s.end) + digits(s.doc) + s.meta_len;
    }
    if let Some((start, end)) = pad {
        // `{"start":S,"end":E,"doc":null,"meta":null,"pad":true}`, after a comma if needed.
        n += u64::from(!spans.is_empty()) + 51 + digits(start) + digits(end);
    }
    n
}

/// Size of what `write` produces, computed by writing into a counter (no allocation).
pub(crate) fn json_len(write: impl FnOnce(&mut Counter) -> Result<()>) -> Result<u64> {
    let mut c = Counter(0);
    write(&mut c)?;
    Ok(c.0)
}

/// Appends bytes `[offset, offset + size)` of what `write` produces to `out`, stopping the
/// writer as soon as the range is complete.
pub(crate) fn json_range(
    offset: u64,
    size: u32,
    out: &mut Vec<u8>,
    write: impl FnOnce(&mut RangeWriter<'_>) -> Result<()>,
) -> Result<()> {
    let mut w = RangeWriter {
        pos: 0,
        start: offset,
        end: offset.saturating_add(u64::from(size)),
        out,
        done: false,
    };
    match write(&mut w) {
        Err(_) if w.done => Ok(()),
        other => other,
    }
}

/// Counts bytes written.
#[derive(Debug)]
pub(crate) struct Counter(u64);

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Keeps the bytes of `[start, end)` of what is written, and stops the writer once past it.
#[derive(Debug)]
pub(crate) struct RangeWriter<'a> {
    pos: u64,
    start: u64,
    end: u64,
    out: &'a mut Vec<u8>,
    done: bool,
}

impl Write for RangeWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.pos >= self.end {
            self.done = true;
            return Err(std::io::Error::other("range complete"));
        }
        let from = self.start.max(self.pos);
        let to = self.end.min(self.pos + buf.len() as u64);
        if from < to {
            self.out
                .extend_from_slice(&buf[(from - self.pos) as usize..(to - self.pos) as usize]);
        }
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_json_len_is_the_length_written() {
        // Every digit count (0, 9, 10, 99, 100, ... u64::MAX), with and without metadata text,
        // with and without padding.
        let values = [0u64, 1, 9, 10, 99, 100, 12_345, 999_999, 1 << 40, u64::MAX];
        let metas = ["null", "{\"a\": 1}", "\"x\"", "[1, 2, 3]"];
        for n in 0..4usize {
            for pad in [
                None,
                Some((0u64, 1u64)),
                Some((9, 10)),
                Some((12_345, u64::MAX)),
            ] {
                for k in 0..values.len() {
                    let spans: Vec<Span> = (0..n)
                        .map(|i| Span {
                            start: values[(k + i) % values.len()],
                            end: values[(k + 2 * i + 1) % values.len()],
                            doc: values[(k + 3 * i + 2) % values.len()],
                            entry: 0,
                            meta: Meta::new(metas[(k + i) % metas.len()]),
                        })
                        .collect();
                    let shapes: Vec<SpanShape> = spans
                        .iter()
                        .map(|s| SpanShape {
                            start: s.start,
                            end: s.end,
                            doc: s.doc,
                            meta_len: s.meta.len() as u64,
                        })
                        .collect();
                    let written = serde_json::to_vec(&Spans(&spans, pad)).unwrap();
                    assert_eq!(
                        spans_json_len(&shapes, pad),
                        written.len() as u64,
                        "{}",
                        String::from_utf8_lossy(&written)
                    );
                }
            }
        }
    }

    #[test]
    fn placeholders_are_what_the_measure_subtracts() {
        assert_eq!(serde_json::to_vec(&[(); 0]).unwrap(), b"[]");
        assert_eq!(serde_json::to_vec(&()).unwrap(), b"null");
    }
}

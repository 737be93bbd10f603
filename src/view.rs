//! The contents of every file in the tree: a dataset seen through a plan.
//!
//! `View` answers "what are the bytes of `epoch/E/rank/R/step/S.npy` (or `.json`,
//! `observation/I.npy`, `lookup/...`, `info.json`)?" without knowing about inodes or FUSE.
//!
//! A step file is a numpy `.npy` of shape `(batch_size, window)`: the fixed header, then row
//! `j` = observation `perm_E(S*G + j*ranks + rank)`. In stream mode an observation is a window
//! of the record stream; in documents mode it is a document's first `window` records, padded.
//! Any byte range of a file can be produced on its own, reading only the shard bytes that range
//! covers. JSON files are written by streaming writers, so their size (needed by `stat`) and any
//! byte range are produced without building per-request copies of whole files.

use std::io::Write;
use std::path::Path;

use serde::Serialize;

use crate::dataset::{Dataset, Span, SpanShape};
use crate::error::{Error, Result};
use crate::format::dtype::RecordType;
use crate::format::npy;
use crate::format::{self, ContentHasher};
use crate::shuffle::feistel;
use crate::shuffle::plan::{Plan, StepKey};
use crate::window::Windows;

/// What an observation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Observation `i` is the window of `window` records at record `i * stride`.
    Stream,
    /// Observation `i` is document `i`, truncated or padded to `window` records.
    Documents,
}

impl Mode {
    /// The name used on the command line and in `info.json`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Stream => "stream",
            Mode::Documents => "documents",
        }
    }
}

/// What the user chose at mount time (or for `shufflefs plan`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewConfig {
    /// Records per observation (`--window`).
    pub window: u64,
    /// Records between observation starts (`--stride`); `None` means `window`.
    pub stride: Option<u64>,
    /// Rows per step file (`--batch-size`).
    pub batch_size: u64,
    /// Number of ranks (`--ranks`).
    pub ranks: u64,
    /// Shuffle seed (`--seed`).
    pub seed: u64,
    /// Epochs exposed (`--epochs`).
    pub epochs: u64,
    /// Stream or documents (`--mode`).
    pub mode: Mode,
    /// Value of the first field of padding records in documents mode (`--pad-id`).
    pub pad_id: Option<i128>,
    /// Most names a directory listing shows (`--max-listing`; 0: no bound). Changes no byte
    /// of any file but `info.json`, which reports it.
    pub max_listing: u64,
}

impl ViewConfig {
    /// A stream-mode configuration.
    pub fn stream(
        window: u64,
        stride: u64,
        batch_size: u64,
        ranks: u64,
        seed: u64,
        epochs: u64,
    ) -> ViewConfig {
        ViewConfig {
            window,
            stride: Some(stride),
            batch_size,
            ranks,
            seed,
            epochs,
            mode: Mode::Stream,
            pad_id: None,
            max_listing: crate::fs::DEFAULT_MAX_LISTING,
        }
    }
}

/// `info.json`: the mount's parameters and identity.
#[derive(Clone, Debug, Serialize)]
pub struct Info {
    /// "stream" or "documents".
    pub mode: &'static str,
    /// Records (tokens) in the dataset.
    pub n_tokens: u64,
    /// Observations shuffled per epoch.
    pub n_observations: u64,
    /// Documents in the dataset (null without document structure).
    pub n_documents: Option<u64>,
    /// Whether documents or spans carry metadata. (`S.json` has `rows` whenever the dataset
    /// has documents.)
    pub metadata: bool,
    /// Records per observation (row length).
    pub window: u64,
    /// Records between observation starts (stream mode).
    pub stride: u64,
    /// Rows per step file.
    pub batch_size: u64,
    /// Ranks.
    pub ranks: u64,
    /// Shuffle seed.
    pub seed: u64,
    /// Epochs exposed.
    pub epochs: u64,
    /// Steps per epoch (the same for every rank).
    pub steps_per_epoch: u64,
    /// `batch_size * ranks`.
    pub global_batch: u64,
    /// Observations dropped at the end of each epoch.
    pub dropped_per_epoch: u64,
    /// numpy descr of the records: `<u4`, or a structured list literal.
    pub dtype: String,
    /// The fields of a structured record as `[name, descr]` pairs (for
    /// `np.dtype([tuple(f) for f in fields])`); null for a plain token stream.
    pub fields: Option<Vec<[String; 2]>>,
    /// Bytes per record.
    pub itemsize: u64,
    /// First-field value of padding records (documents mode).
    pub pad_id: Option<i128>,
    /// Shape of every step `.npy`.
    pub step_shape: [u64; 2],
    /// Size in bytes of every step `.npy`.
    pub step_file_bytes: u64,
    /// Size of the `.npy` header: the data of every step file starts at this offset.
    pub npy_header_bytes: u64,
    /// Number of shards.
    pub shards: usize,
    /// The dataset's content identity (from the manifest).
    pub content_hash: String,
    /// Dataset format version.
    pub format_version: u32,
    /// Permutation algorithm name.
    pub algorithm: &'static str,
    /// Hash of the data and the global plan: everything that determines the bytes and order
    /// of every global step (all ranks' rows of one step), and nothing else. Store it with a
    /// checkpoint and refuse to resume when it differs (`--expect-fingerprint`). Splitting the
    /// global batch over other ranks, or exposing more epochs, keeps it.
    pub fingerprint: String,
    /// Hash of `fingerprint` and the rank layout (`batch_size`, `ranks`, `epochs`): equal
    /// exactly when every file of the tree has the same bytes.
    pub layout_fingerprint: String,
    /// Most names a directory listing shows (`--max-listing`; 0: no bound).
    pub max_listing: u64,
    /// The directories whose listing that bound cuts short, with their true number of names
    /// (every name stays reachable by its path).
    pub truncated_listings: Vec<TruncatedListing>,
    /// The dataset directory (informational, not part of the fingerprint).
    pub dataset: String,
    /// The shufflefs version serving the mount (informational).
    pub shufflefs_version: &'static str,
}

/// A directory whose listing shows fewer names than it holds (`info.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TruncatedListing {
    /// The directory, as a path pattern (`epoch/E/rank/R/step`: every such directory).
    pub dir: &'static str,
    /// Names it holds.
    pub names: u64,
    /// Names its listing shows: the first ones in listing order.
    pub listed: u64,
}

/// The observation ids of a step and their first records (tests and tools).
#[derive(Clone, Debug, Serialize)]
pub struct StepInfo {
    /// Epoch.
    pub epoch: u64,
    /// Rank.
    pub rank: u64,
    /// Step within the epoch.
    pub step: u64,
    /// Observation ids, in row order.
    pub observations: Vec<u64>,
}

/// A dataset seen through a plan: the bytes of every file.
#[derive(Debug)]
pub struct View {
    dataset: Dataset,
    plan: Plan,
    mode: Mode,
    window: u64,
    /// Stream mode geometry (also used for `token_starts`).
    windows: Windows,
    itemsize: u64,
    npy_header: Vec<u8>,
    pad_record: Vec<u8>,
    info: Info,
    info_json: Vec<u8>,
}

/// One row's observation in documents mode.
#[derive(Clone, Debug)]
struct DocRow {
    start: u64,
    len: u64,
    meta: String,
}

impl From<crate::dataset::Document> for DocRow {
    fn from(d: crate::dataset::Document) -> DocRow {
        DocRow {
            start: d.start,
            len: d.len,
            meta: d.meta.to_string(),
        }
    }
}

impl View {
    /// Builds the view, refusing configurations that would serve nothing or overflow.
    pub fn new(dataset: Dataset, config: &ViewConfig) -> Result<View> {
        let record: RecordType = dataset.record_type().clone();
        let itemsize = record.itemsize() as u64;
        let stride = config.stride.unwrap_or(config.window);
        let windows = Windows::new(dataset.n_records(), config.window, stride, itemsize)?;
        let n_obs = match config.mode {
            Mode::Stream => windows.n_observations(),
            Mode::Documents => dataset.n_documents().ok_or_else(|| {
                Error::invalid(
                    "--mode documents needs a dataset with documents: pack JSON Lines inputs \
                     or use --doc-sep",
                )
            })?,
        };
        if config.mode == Mode::Documents && config.stride.is_some_and(|s| s != config.window) {
            return Err(Error::invalid(
                "--stride has no meaning in --mode documents",
            ));
        }
        if config.mode == Mode::Stream && config.pad_id.is_some() {
            return Err(Error::invalid("--pad-id only applies to --mode documents"));
        }
        if let Some(pad) = config.pad_id {
            let t = record.token_type();
            if t.int_range().is_none_or(|(lo, hi)| pad < lo || pad > hi) {
                return Err(Error::invalid(format!("--pad-id {pad} is not a {t} value")));
            }
        }
        let plan = Plan::new(
            n_obs,
            config.batch_size,
            config.ranks,
            config.seed,
            config.epochs,
        )?;
        if plan.steps_per_epoch() == 0 {
            let what = match config.mode {
                Mode::Stream => format!(
                    "the dataset has {} tokens, which make {n_obs} windows of {} (stride \
                     {stride})",
                    dataset.n_records(),
                    config.window
                ),
                Mode::Documents => format!("the dataset has {n_obs} documents"),
            };
            return Err(Error::invalid(format!(
                "{what}, fewer than one global batch of {} (batch size {} x {} ranks): \
                 nothing to serve; lower {}",
                plan.global_batch(),
                config.batch_size,
                config.ranks,
                match config.mode {
                    Mode::Stream => "--window, --batch-size or --ranks",
                    Mode::Documents => "--batch-size or --ranks",
                }
            )));
        }
        // Every file must be numberable (see fs.rs); checked here so `plan` and `bench` refuse
        // exactly what `mount` refuses.
        plan.epochs()
            .checked_mul(plan.ranks())
            .and_then(|er| er.checked_mul(plan.steps_per_epoch()))
            .and_then(|files| files.checked_add(plan.epochs().checked_mul(n_obs)?))
            .and_then(|files| files.checked_mul(2))
            .and_then(|files| files.checked_add(n_obs.checked_mul(2)?))
            .and_then(|files| {
                let dirs = plan.epochs().checked_mul(plan.ranks().checked_add(1)?)?;
                files.checked_add(dirs.checked_mul(8)?.checked_add(16)?)
            })
            .ok_or_else(|| {
                Error::invalid(format!(
                    "{} epochs x {} ranks x {} steps is too many files to number; lower \
                     --epochs",
                    plan.epochs(),
                    plan.ranks(),
                    plan.steps_per_epoch()
                ))
            })?;
        let npy_header = npy::header(&record.npy_descr(), &[config.batch_size, config.window])?;
        let data_bytes = config
            .batch_size
            .checked_mul(windows.row_bytes())
            .filter(|b| b.checked_add(npy_header.len() as u64).is_some())
            .ok_or_else(|| {
                Error::invalid("--batch-size times --window is too large for one file")
            })?;
        let step_file_bytes = npy_header.len() as u64 + data_bytes;
        let manifest = dataset.manifest();
        let fields = record.is_structured().then(|| {
            record
                .fields()
                .iter()
                .map(|f| [f.name.clone(), f.scalar.descr().to_string()])
                .collect()
        });
        let pad_id = (config.mode == Mode::Documents).then(|| config.pad_id.unwrap_or(0));
        let mut info = Info {
            mode: config.mode.name(),
            n_tokens: dataset.n_records(),
            n_observations: n_obs,
            n_documents: dataset.n_documents(),
            metadata: manifest.metadata,
            window: config.window,
            stride,
            batch_size: config.batch_size,
            ranks: config.ranks,
            seed: config.seed,
            epochs: config.epochs,
            steps_per_epoch: plan.steps_per_epoch(),
            global_batch: plan.global_batch(),
            dropped_per_epoch: plan.dropped_per_epoch(),
            dtype: manifest.dtype.clone(),
            fields,
            itemsize,
            pad_id,
            step_shape: [config.batch_size, config.window],
            step_file_bytes,
            npy_header_bytes: npy_header.len() as u64,
            shards: manifest.shards.len(),
            content_hash: manifest.content_hash.clone(),
            format_version: manifest.version,
            algorithm: feistel::ALGORITHM,
            fingerprint: String::new(),
            layout_fingerprint: String::new(),
            max_listing: config.max_listing,
            truncated_listings: crate::fs::listing_sizes(&plan)
                .into_iter()
                .filter(|&(_, names)| config.max_listing > 0 && names > config.max_listing)
                .map(|(dir, names)| TruncatedListing {
                    dir,
                    names,
                    listed: config.max_listing,
                })
                .collect(),
            dataset: dataset.dir().display().to_string(),
            shufflefs_version: env!("CARGO_PKG_VERSION"),
        };
        info.fingerprint = fingerprint(&info, manifest);
        info.layout_fingerprint = layout_fingerprint(&info);
        let mut info_json = serde_json::to_vec_pretty(&info).expect("info serializes");
        info_json.push(b'\n');
        Ok(View {
            pad_record: record.pad_record(pad_id.unwrap_or(0)),
            dataset,
            plan,
            mode: config.mode,
            window: config.window,
            windows,
            itemsize,
            npy_header,
            info,
            info_json,
        })
    }

    /// Opens the dataset at `dir` and builds the view.
    pub fn open(dir: &Path, config: &ViewConfig) -> Result<View> {
        View::new(Dataset::open(dir)?, config)
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The dataset.
    pub fn dataset(&self) -> &Dataset {
        &self.dataset
    }

    /// Stream or documents.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The parsed `info.json`.
    pub fn info(&self) -> &Info {
        &self.info
    }

    /// The bytes of `info.json`.
    pub fn info_json(&self) -> &[u8] {
        &self.info_json
    }

    /// The mount's fingerprint (16 hex digits).
    pub fn fingerprint(&self) -> &str {
        &self.info.fingerprint
    }

    /// `--expect-fingerprint`: an error unless `expected` (white space around it ignored, any
    /// case) is this view's fingerprint.
    pub fn check_fingerprint(&self, expected: &str) -> Result<()> {
        let fingerprint = &self.info.fingerprint;
        if expected.trim().eq_ignore_ascii_case(fingerprint) {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "--expect-fingerprint {expected} does not match this mount's fingerprint \
             {fingerprint}: the dataset (its content or checksums), the global plan (seed, \
             window, stride, global batch = batch size x ranks, mode, pad id) or the format or \
             algorithm version differ from the run being resumed (ranks, batch size and epochs \
             may change while batch size x ranks stays); compare `shufflefs plan DATASET_DIR \
             ... --info` outputs, or drop the flag to start a new order"
        )))
    }

    /// Size of every step `.npy` file.
    pub fn step_npy_len(&self) -> u64 {
        self.info.step_file_bytes
    }

    /// The observation ids of `key`, in row order.
    pub fn step_info(&self, key: StepKey) -> StepInfo {
        StepInfo {
            epoch: key.epoch,
            rank: key.rank,
            step: key.step,
            observations: self.plan.observations(key).collect(),
        }
    }

    fn doc_row(&self, observation: u64) -> Result<DocRow> {
        self.dataset.document(observation).map(DocRow::from)
    }

    /// Fills `buf` with the bytes of `S.npy` for `key` starting at `offset`, and returns how
    /// many bytes that is: `min(buf.len(), len - offset)`, 0 at or past the end. Only the
    /// shard bytes of the rows the range covers are read, one pread per row piece.
    pub fn read_step_npy(&self, key: StepKey, offset: u64, buf: &mut [u8]) -> Result<usize> {
        // The observations of the rows this range touches, computed together (batched
        // permutation), then looked up row by row.
        let header_len = self.npy_header.len() as u64;
        let row_bytes = self.window * self.itemsize;
        let data_start = offset.saturating_sub(header_len);
        let data_end = (offset + buf.len() as u64).saturating_sub(header_len);
        let first = (data_start / row_bytes).min(self.plan.batch_size());
        let end = data_end.div_ceil(row_bytes).min(self.plan.batch_size());
        let mut rows = vec![0u64; end.saturating_sub(first) as usize];
        self.plan.observations(key).fill(first, &mut rows);
        self.read_rows_npy(&self.npy_header, self.window, offset, buf, |row| {
            rows.get(row.wrapping_sub(first) as usize)
                .copied()
                .ok_or_else(|| Error::invalid(format!("row {row} outside the rows computed")))
        })
    }

    /// The whole `S.npy` for `key`.
    pub fn render_step_npy(&self, key: StepKey) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.step_npy_len() as usize];
        self.render_step_npy_into(key, &mut out)?;
        Ok(out)
    }

    /// The whole `S.npy` for `key` into `out`, which must be exactly its size.
    pub fn render_step_npy_into(&self, key: StepKey, out: &mut [u8]) -> Result<()> {
        if out.len() as u64 != self.step_npy_len() {
            return Err(Error::invalid(format!(
                "a step file is {} bytes, not {}",
                self.step_npy_len(),
                out.len()
            )));
        }
        let n = self.read_step_npy(key, 0, out)?;
        if n != out.len() {
            return Err(Error::invalid(format!(
                "step {key:?} assembled only {n} bytes"
            )));
        }
        Ok(())
    }

    /// Reads a `.npy` made of `header` and rows of `row_records` records, row `r` being
    /// observation `observation(r)`.
    fn read_rows_npy(
        &self,
        header: &[u8],
        row_records: u64,
        offset: u64,
        buf: &mut [u8],
        observation: impl Fn(u64) -> Result<u64>,
    ) -> Result<usize> {
        let header_len = header.len() as u64;
        let row_bytes = row_records * self.itemsize;
        let len = header_len + self.plan.batch_size() * row_bytes;
        if offset >= len {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(len - offset) as usize;
        let buf = &mut buf[..n];
        let mut filled = 0usize;
        if offset < header_len {
            let take = ((header_len - offset) as usize).min(n);
            buf[..take].copy_from_slice(&header[offset as usize..offset as usize + take]);
            filled = take;
        }
        if filled == n {
            return Ok(n);
        }
        // Data region, in bytes relative to the first row.
        let mut data_pos = offset + filled as u64 - header_len;
        let data_end = offset + n as u64 - header_len;
        let mut current: Option<(u64, DocRow)> = None;
        while data_pos < data_end {
            let row = data_pos / row_bytes;
            let within = data_pos % row_bytes;
            let take = (row_bytes - within).min(data_end - data_pos) as usize;
            let out = &mut buf[filled..filled + take];
            let obs = observation(row)?;
            match self.mode {
                Mode::Stream => {
                    self.dataset
                        .read_stream(self.windows.byte_offset(obs) + within, out)?;
                }
                Mode::Documents => {
                    if current.as_ref().is_none_or(|(r, _)| *r != row) {
                        current = Some((row, self.doc_row(obs)?));
                    }
                    let doc = &current.as_ref().expect("set above").1;
                    self.fill_doc_row(doc, row_records, within, out)?;
                }
            }
            filled += take;
            data_pos += take as u64;
        }
        Ok(n)
    }

    /// Bytes `[within, within + out.len())` of a padded document row.
    fn fill_doc_row(
        &self,
        doc: &DocRow,
        row_records: u64,
        within: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let data_bytes = doc.len.min(row_records) * self.itemsize;
        let end = within + out.len() as u64;
        let copy_end = end.min(data_bytes);
        let mut k = 0usize;
        if within < copy_end {
            k = (copy_end - within) as usize;
            self.dataset
                .read_stream(doc.start * self.itemsize + within, &mut out[..k])?;
        }
        for (i, b) in out[k..].iter_mut().enumerate() {
            let pos = within + (k + i) as u64;
            *b = self.pad_record[(pos % self.itemsize) as usize];
        }
        Ok(())
    }

    /// Writes `S.json` for `key` to `w`.
    pub fn write_step_json(&self, key: StepKey, w: &mut impl Write) -> Result<()> {
        self.step_json_to(key, w, None)
    }

    /// The size of `S.json` for `key`, at a fraction of the cost of writing it: the `rows`
    /// (the bulk of the file and of its cost) are measured from the span shapes, read for sizes
    /// only ([`Dataset::span_shapes`]), and nothing is formatted but the few numbers before
    /// them. Equal to the length [`View::write_step_json`] writes whenever that succeeds.
    pub fn step_json_len(&self, key: StepKey) -> Result<u64> {
        let mut rows = 0u64;
        let rest = json_len(|c| self.step_json_to(key, c, Some(&mut rows)))?;
        Ok(rest + rows)
    }

    /// Writes `S.json` for `key` to `w`; with `rows_len`, the `rows` are not written but their
    /// length is added to it, and the document files are read for sizes only.
    fn step_json_to(
        &self,
        key: StepKey,
        w: &mut impl Write,
        rows_len: Option<&mut u64>,
    ) -> Result<()> {
        let io = |e: std::io::Error| Error::io("<json>", e);
        let measure = rows_len.is_some();
        // The length of what is measured instead of written.
        let measured = std::cell::Cell::new(0u64);
        // One row's spans: written, or measured.
        let spans = |w: &mut dyn Write, record: u64, count: u64, pad| -> Result<()> {
            if measure {
                let shapes = self.dataset.span_shapes(record, count)?;
                measured.set(measured.get() + spans_json_len(&shapes, pad));
                Ok(())
            } else {
                write_spans(w, &self.dataset.spans(record, count)?, pad).map_err(io)
            }
        };
        write!(
            w,
            "{{\"epoch\":{},\"rank\":{},\"step\":{},\"global_step\":{},\"observations\":",
            key.epoch,
            key.rank,
            key.step,
            self.plan.global_step(key)
        )
        .map_err(io)?;
        write_list(w, self.plan.observations(key)).map_err(io)?;
        match self.mode {
            Mode::Stream => {
                w.write_all(b",\"token_starts\":").map_err(io)?;
                write_list(
                    w,
                    self.plan
                        .observations(key)
                        .map(|o| self.windows.first_record(o)),
                )
                .map_err(io)?;
                if self.dataset.has_documents() {
                    w.write_all(b",\"rows\":[").map_err(io)?;
                    for (j, o) in self.plan.observations(key).enumerate() {
                        if j > 0 {
                            w.write_all(b",").map_err(io)?;
                        }
                        spans(w, self.windows.first_record(o), self.window, None)?;
                    }
                    w.write_all(b"]").map_err(io)?;
                }
            }
            Mode::Documents => {
                let docs: Vec<DocRow> = self
                    .plan
                    .observations(key)
                    .map(|o| {
                        if measure {
                            self.dataset.document_shape(o).map(|d| DocRow {
                                start: d.start,
                                len: d.len,
                                meta: " ".repeat(d.meta_len as usize),
                            })
                        } else {
                            self.doc_row(o)
                        }
                    })
                    .collect::<Result<_>>()?;
                w.write_all(b",\"token_starts\":").map_err(io)?;
                write_list(w, docs.iter().map(|d| d.start)).map_err(io)?;
                w.write_all(b",\"lengths\":").map_err(io)?;
                write_list(w, docs.iter().map(|d| d.len.min(self.window))).map_err(io)?;
                w.write_all(b",\"truncated\":[").map_err(io)?;
                for (j, d) in docs.iter().enumerate() {
                    let sep = if j > 0 { "," } else { "" };
                    write!(w, "{sep}{}", d.len > self.window).map_err(io)?;
                }
                w.write_all(b"],\"meta\":[").map_err(io)?;
                for (j, d) in docs.iter().enumerate() {
                    let sep = if j > 0 { "," } else { "" };
                    write!(w, "{sep}{}", d.meta).map_err(io)?;
                }
                w.write_all(b"],\"rows\":[").map_err(io)?;
                for (j, d) in docs.iter().enumerate() {
                    if j > 0 {
                        w.write_all(b",").map_err(io)?;
                    }
                    let used = d.len.min(self.window);
                    let pad = (used < self.window).then_some((used, self.window));
                    spans(w, d.start, used, pad)?;
                }
                w.write_all(b"]").map_err(io)?;
            }
        }
        writeln!(w, ",\"fingerprint\":\"{}\"}}", self.info.fingerprint).map_err(io)?;
        if let Some(n) = rows_len {
            *n += measured.get();
        }
        Ok(())
    }

    /// The bytes of `S.json` for `key`.
    pub fn step_json(&self, key: StepKey) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_step_json(key, &mut out)?;
        Ok(out)
    }

    /// Size of `observation/I.npy`.
    pub fn observation_npy_len(&self, observation: u64) -> Result<u64> {
        let (header, records) = self.observation_shape(observation)?;
        Ok(header.len() as u64 + records * self.itemsize)
    }

    fn observation_shape(&self, observation: u64) -> Result<(Vec<u8>, u64)> {
        let records = match self.mode {
            Mode::Stream => self.window,
            Mode::Documents => self.dataset.document(observation)?.len,
        };
        let header = npy::header(&self.dataset.record_type().npy_descr(), &[records])?;
        Ok((header, records))
    }

    /// Reads `observation/I.npy`: the observation unshuffled (a window, or a whole document),
    /// shape `(records,)`.
    pub fn read_observation_npy(
        &self,
        observation: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let (header, records) = self.observation_shape(observation)?;
        let header_len = header.len() as u64;
        let len = header_len + records * self.itemsize;
        if offset >= len {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(len - offset) as usize;
        let buf = &mut buf[..n];
        let mut filled = 0;
        if offset < header_len {
            filled = ((header_len - offset) as usize).min(n);
            buf[..filled].copy_from_slice(&header[offset as usize..offset as usize + filled]);
        }
        if filled < n {
            let within = offset + filled as u64 - header_len;
            let start = match self.mode {
                Mode::Stream => self.windows.first_record(observation),
                Mode::Documents => self.dataset.document(observation)?.start,
            };
            self.dataset
                .read_stream(start * self.itemsize + within, &mut buf[filled..])?;
        }
        Ok(n)
    }

    /// Writes `observation/I.json`: where observation `I` is in the stream and its metadata.
    pub fn write_observation_json(&self, observation: u64, w: &mut impl Write) -> Result<()> {
        let io = |e: std::io::Error| Error::io("<json>", e);
        let (start, len, meta) = match self.mode {
            Mode::Stream => (self.windows.first_record(observation), self.window, None),
            Mode::Documents => {
                let d = self.dataset.document(observation)?;
                (d.start, d.len, Some(d.meta))
            }
        };
        write!(
            w,
            "{{\"observation\":{observation},\"mode\":\"{}\",\"token_start\":{start},\"token_end\":{}",
            self.mode.name(),
            start + len
        )
        .map_err(io)?;
        if let Some(meta) = meta {
            write!(w, ",\"doc\":{observation},\"meta\":{meta}").map_err(io)?;
        }
        if self.dataset.has_documents() {
            w.write_all(b",\"spans\":").map_err(io)?;
            let spans = self.dataset.spans(start, len)?;
            write_spans(w, &spans, None).map_err(io)?;
        }
        w.write_all(b"}\n").map_err(io)
    }

    /// Writes `lookup/epoch/E/observation/I.json`: where observation `I` is trained in epoch
    /// `E`, found by running the permutation backwards.
    pub fn write_lookup_json(
        &self,
        epoch: u64,
        observation: u64,
        w: &mut impl Write,
    ) -> Result<()> {
        let io = |e: std::io::Error| Error::io("<json>", e);
        match self.plan.locate(epoch, observation) {
            Some(p) => writeln!(
                w,
                "{{\"epoch\":{epoch},\"observation\":{observation},\"position\":{},\"step\":{},\
                 \"rank\":{},\"row\":{}}}",
                p.position, p.step, p.rank, p.row
            ),
            None => writeln!(
                w,
                "{{\"epoch\":{epoch},\"observation\":{observation},\"position\":{},\
                 \"dropped\":true}}",
                self.plan.permutation(epoch).invert(observation)
            ),
        }
        .map_err(io)
    }
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

fn write_list(w: &mut impl Write, items: impl Iterator<Item = u64>) -> std::io::Result<()> {
    w.write_all(b"[")?;
    for (i, v) in items.enumerate() {
        if i > 0 {
            w.write_all(b",")?;
        }
        write!(w, "{v}")?;
    }
    w.write_all(b"]")
}

/// The length of what [`write_spans`] writes for spans of these shapes.
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

/// Writes spans as `[{"start","end","doc","meta"}, ...]`, plus a padding span if given.
fn write_spans(w: &mut dyn Write, spans: &[Span], pad: Option<(u64, u64)>) -> std::io::Result<()> {
    w.write_all(b"[")?;
    for (i, s) in spans.iter().enumerate() {
        let sep = if i > 0 { "," } else { "" };
        write!(
            w,
            "{sep}{{\"start\":{},\"end\":{},\"doc\":{},\"meta\":{}}}",
            s.start, s.end, s.doc, s.meta
        )?;
    }
    if let Some((start, end)) = pad {
        let sep = if spans.is_empty() { "" } else { "," };
        write!(
            w,
            "{sep}{{\"start\":{start},\"end\":{end},\"doc\":null,\"meta\":null,\"pad\":true}}"
        )?;
    }
    w.write_all(b"]")
}

/// The fingerprint: a hash of the data and the global plan, that is of everything that
/// determines the bytes and the order of every global step (the `global_batch` rows of one
/// step, all ranks together, in position order), and of nothing else. It covers the formats
/// and the algorithm, the dataset identity, the geometry of an observation (mode, window,
/// stride, pad id), the seed and the global batch; it does not cover how the global batch is
/// split over ranks (`batch_size`, `ranks`) nor how many epochs are exposed (epoch `e` is the
/// same whatever `epochs`), so an elastic resume or a longer run keeps it.
///
/// Everything that changes a global step's bytes or order must enter here, and only here (a
/// schedule of mixtures, for one, will add its entries up to the step served).
fn fingerprint(info: &Info, manifest: &format::Manifest) -> String {
    // An explicit canonical text, one `key=value` line each in a fixed order, so the value
    // depends on nothing but these inputs.
    let mut canonical = format!(
        "format={}\nformat_version={}\nalgorithm={}\nnpy=1.0\nmode={}\ndtype={}\n\
         n_tokens={}\nwindow={}\nstride={}\nglobal_batch={}\nseed={}\ncontent_hash={}\n",
        format::FORMAT_NAME,
        manifest.version,
        feistel::ALGORITHM,
        info.mode,
        info.dtype,
        info.n_tokens,
        info.window,
        info.stride,
        info.global_batch,
        info.seed,
        manifest.content_hash,
    );
    if let Some(pad) = info.pad_id {
        canonical.push_str(&format!("pad_id={pad}\n"));
    }
    if let Some(n) = info.n_documents {
        canonical.push_str(&format!("documents={n}\nmetadata={}\n", info.metadata));
    }
    for s in &manifest.shards {
        canonical.push_str(&format!("shard={},{}\n", s.bytes, s.hash));
        if let Some(d) = &s.docs {
            canonical.push_str(&format!("shard_docs={},{}\n", d.documents, d.hash));
        }
    }
    hash_text(&canonical)
}

/// The layout fingerprint: the fingerprint plus the rank layout, so equal exactly when every
/// file of the tree (each rank's `S.npy` and `S.json`, and which epochs exist) is the same.
fn layout_fingerprint(info: &Info) -> String {
    hash_text(&format!(
        "fingerprint={}\nbatch_size={}\nranks={}\nepochs={}\n",
        info.fingerprint, info.batch_size, info.ranks, info.epochs
    ))
}

/// [`ContentHasher`] of `text`, as 16 hex digits.
fn hash_text(text: &str) -> String {
    let mut h = ContentHasher::new();
    h.update(text.as_bytes());
    format::format_hash(h.finish())
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
                            meta: crate::dataset::Meta::new(metas[(k + i) % metas.len()]),
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
                    let mut written = Vec::new();
                    write_spans(&mut written, &spans, pad).unwrap();
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
}

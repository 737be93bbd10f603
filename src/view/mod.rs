//! The bytes of every file of the tree: a dataset seen through a plan. Pure over a
//! [`Dataset`]: nothing here knows inodes or FUSE.
//!
//! A step file is a numpy `.npy` of shape `(batch_size, window)`: the fixed header, then row
//! `j` = observation `perm_E(S*G + j*ranks + rank)`. In stream mode an observation is a window
//! of the record stream; in documents mode it is a document's first `window` records, padded.
//! Any byte range of a file is produced on its own, reading only the shard bytes that range
//! covers. JSON files are serialized as they stream out, so their size (needed by `stat`) and
//! any byte range are produced without building per-request copies of whole files.
//!
//! | file | question |
//! | --- | --- |
//! | `window.rs` | which records make observation `i` (stream mode)? |
//! | `rows.rs` | what are the bytes of `S.npy` and `I.npy`? |
//! | `json.rs` | what are the bytes of `S.json`, `I.json` and `lookup/.../I.json`? |
//! | `info.rs` | what is in `info.json`, and what does the fingerprint cover? |

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::format::dtype::{RecordType, ScalarType};
use crate::format::npy;
use crate::inode::Inodes;
use crate::shuffle::plan::{Plan, StepKey};
pub use crate::tree::DEFAULT_MAX_LISTING;

/// A plan of a run configuration: its `[[plan]]` name (none for the one plan of a file
/// without them) and its view.
pub type NamedView = (Option<String>, View);
use crate::tree::Shape;

mod convert;
mod gather;
mod info;
mod json;
mod masks;
mod mixture;
mod packed;
mod rows;
mod window;

pub use info::{Info, TruncatedListing};
pub(crate) use json::{json_len, json_range};
pub(crate) use masks::Mask;
pub use mixture::{Datasets, MixtureInfo, OpenOptions, ScheduleInfo, SourceInfo};
pub use packed::PackingInfo;

use convert::Convert;
use info::Geometry;
use window::Windows;

/// What an observation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Observation `i` is the window of `window` records at record `i * stride`.
    Stream,
    /// Observation `i` is document `i`, truncated or padded to `window` records.
    Documents,
    /// Rows of whole documents packed best-fit, per epoch (`shuffle/packing/`).
    Packed,
}

impl Mode {
    /// The name used on the command line and in `info.json`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::Stream => "stream",
            Mode::Documents => "documents",
            Mode::Packed => "packed",
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
    /// The integer type `.npy` files are served in (`--out-dtype`); `None`: the dataset's own
    /// record type. Every value is converted exactly; one the type cannot hold fails the read
    /// (`EOVERFLOW`).
    pub out_dtype: Option<ScalarType>,
    /// The BOS token of packed mode (`--bos`).
    pub bos: Option<u64>,
    /// Documents per block of packed mode (`--pack-block-docs`; default 65,536).
    pub pack_block_docs: Option<u64>,
    /// Stream mode: each epoch's windows start at a phase drawn from (seed, epoch)
    /// (`--rewindow`).
    pub rewindow: bool,
    /// A file of observation ids never served (`--quarantine`).
    pub quarantine: Option<std::path::PathBuf>,
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
            max_listing: DEFAULT_MAX_LISTING,
            out_dtype: None,
            bos: None,
            pack_block_docs: None,
            rewindow: false,
            quarantine: None,
        }
    }
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
    dataset: Arc<Dataset>,
    plan: Plan,
    mode: Mode,
    window: u64,
    /// Stream mode geometry (also used for `token_starts`).
    windows: Windows,
    /// Bytes per record as stored in the dataset.
    itemsize: u64,
    /// The type `.npy` files are served in when it differs from the dataset's (`--out-dtype`).
    out: Option<Convert>,
    /// Bytes per record as served (`itemsize` unless converted).
    out_itemsize: u64,
    npy_header: Vec<u8>,
    pad_record: Vec<u8>,
    /// Packed mode: the packer and its blocks.
    packed: Option<packed::Packed>,
    /// Packed mode: the BOS record as served.
    bos_record: Vec<u8>,
    /// A mixture of datasets (`--config`): the sources and the mixture plan.
    mixed: Option<Box<mixture::Mixed>>,
    /// Some file of the dataset (of a source, for a mixture) is remote: the ranges of a step
    /// are fetched together (`gather.rs`).
    remote: bool,
    info: Info,
    info_json: Vec<u8>,
}

impl View {
    /// Builds the view, refusing configurations that would serve nothing or overflow.
    pub fn new(dataset: Dataset, config: &ViewConfig) -> Result<View> {
        View::shared(Arc::new(dataset), config)
    }

    /// [`View::new`] over a dataset other views may share (the sources of a mount's plans).
    pub(crate) fn shared(dataset: Arc<Dataset>, config: &ViewConfig) -> Result<View> {
        let record: &RecordType = dataset.record_type();
        let itemsize = record.itemsize() as u64;
        let stride = config.stride.unwrap_or(config.window);
        let out = Convert::new(record, config.out_dtype)?;
        let out_itemsize = out.map_or(itemsize, |c| c.to.size() as u64);
        let mut windows = Windows::new(
            dataset.n_records(),
            config.window,
            stride,
            itemsize.max(out_itemsize),
        )?;
        if config.rewindow {
            if config.mode != Mode::Stream {
                return Err(Error::invalid("--rewindow only applies to --mode stream"));
            }
            windows = windows.rewindowed(config.seed);
        }
        let packed = match config.mode {
            Mode::Packed => Some(packed::Packed::new(
                &dataset,
                config.window,
                config.bos,
                config.seed,
                config.pack_block_docs,
            )?),
            _ => None,
        };
        let n_obs = match &packed {
            Some(p) => {
                check_packed(config)?;
                p.rows_per_epoch()
            }
            None => observations(&dataset, config, &windows)?,
        };
        if config.mode != Mode::Packed && (config.bos.is_some() || config.pack_block_docs.is_some())
        {
            return Err(Error::invalid(
                "--bos and --pack-block-docs only apply to --mode packed",
            ));
        }
        let mut plan = Plan::new(
            n_obs,
            config.batch_size,
            config.ranks,
            config.seed,
            config.epochs,
        )?;
        if let Some(path) = &config.quarantine {
            if config.mode == Mode::Packed {
                return Err(Error::invalid(
                    "--quarantine applies to stream and documents rows, not --mode packed",
                ));
            }
            plan = plan.with_quarantine(read_ids(path)?)?;
        }
        check_serves(&dataset, config, &plan, stride)?;
        // Every file must be numberable; checked here so `plan` and `bench` refuse exactly
        // what `mount` refuses.
        let shape = shape_of(&plan, config, dataset.has_documents());
        Inodes::new(shape)?;
        let descr = out.map_or_else(
            || record.npy_descr(),
            |c| RecordType::scalar(c.to).npy_descr(),
        );
        let npy_header = npy::header(&descr, &[config.batch_size, config.window])?;
        let data_bytes = config
            .batch_size
            .checked_mul(config.window)
            .and_then(|records| records.checked_mul(out_itemsize))
            .filter(|b| b.checked_add(npy_header.len() as u64).is_some())
            .ok_or_else(|| {
                Error::invalid("--batch-size times --window is too large for one file")
            })?;
        let pad_id = (config.mode == Mode::Documents).then(|| config.pad_id.unwrap_or(0));
        let geometry = Geometry {
            mode: config.mode,
            window: config.window,
            stride,
            pad_id,
            step_file_bytes: npy_header.len() as u64 + data_bytes,
            npy_header_bytes: npy_header.len() as u64,
            max_listing: config.max_listing,
            out_dtype: out.map(|c| c.to),
            packing: packed.as_ref().map(|p| (p.info(), p.fingerprint_line())),
            rewindow: config.rewindow,
            shape,
        };
        let info = Info::new(&dataset, &plan, geometry);
        let served = |v: i128| match out {
            None => record.pad_record(v),
            Some(c) => RecordType::scalar(c.to).pad_record(v),
        };
        let pad_record = served(pad_id.unwrap_or(0));
        let bos_record = served(config.bos.map_or(0, i128::from));
        if let Some(bos) = config.bos {
            let t = out.map_or_else(|| record.token_type(), |c| c.to);
            if t.int_range().is_none_or(|(_, hi)| i128::from(bos) > hi) {
                return Err(Error::invalid(format!("--bos {bos} is not a {t} value")));
            }
        }
        Ok(View {
            pad_record,
            packed,
            bos_record,
            mixed: None,
            remote: dataset.is_remote(),
            info_json: info.to_json(),
            dataset,
            plan,
            mode: config.mode,
            window: config.window,
            windows,
            itemsize,
            out,
            out_itemsize,
            npy_header,
            info,
        })
    }

    /// Opens the dataset at `dir` and builds the view.
    pub fn open(dir: &Path, config: &ViewConfig) -> Result<View> {
        View::new(Dataset::open(dir)?, config)
    }

    /// The tree's shape: packed rows and rewindowed windows are per epoch, so those mounts
    /// have no `observation/` or `lookup/` entries; a dataset with documents has masks.
    pub(crate) fn shape(&self) -> Shape {
        let mut shape = Shape::of(&self.plan);
        if self.mode == Mode::Packed || self.info.rewindow || self.mixed.is_some() {
            shape.observations = 0;
        }
        shape.masks = self.mixed.is_none() && self.dataset.has_documents();
        shape.val_steps = self.val_steps();
        shape
    }

    /// Rows of step `key`'s file: `--batch-size`, or in a mixture whose schedule changes the
    /// batch, the batch of its global step.
    pub fn step_batch(&self, key: StepKey) -> u64 {
        match &self.mixed {
            Some(m) if key.epoch != mixture::VAL_EPOCH && m.batch_changes() => {
                m.global_batch_at(self.plan.global_step(key)) / self.plan.ranks()
            }
            _ => self.plan.batch_size(),
        }
    }

    /// Whether step files differ in size (a mixture whose schedule changes the batch).
    pub(crate) fn variable_step_sizes(&self) -> bool {
        self.mixed.as_ref().is_some_and(|m| m.batch_changes())
    }

    /// The `.npy` header of a step file of `rows` rows.
    fn step_header(&self, rows: u64) -> Result<std::borrow::Cow<'_, [u8]>> {
        if rows == self.plan.batch_size() {
            return Ok(std::borrow::Cow::Borrowed(&self.npy_header));
        }
        Ok(std::borrow::Cow::Owned(npy::header(
            &self.served_descr(),
            &[rows, self.window],
        )?))
    }

    /// Size of step `key`'s `.npy` file (see [`View::step_batch`]).
    pub fn step_npy_len_at(&self, key: StepKey) -> u64 {
        let rows = self.step_batch(key);
        if rows == self.plan.batch_size() {
            return self.step_npy_len();
        }
        let header = self.step_header(rows).map_or(0, |h| h.len() as u64);
        header + rows * self.window * self.out_itemsize
    }

    /// Held-out steps of each rank under `/val` (tests).
    #[doc(hidden)]
    pub fn val_steps_for_tests(&self) -> u64 {
        self.val_steps()
    }

    /// Held-out steps of each rank under `/val` (a mixture with a `[split]`).
    pub(crate) fn val_steps(&self) -> u64 {
        self.mixed
            .as_ref()
            .map_or(0, |m| m.val_rows() / self.plan.global_batch())
    }

    /// Reads `/val/rank/R/step/S.npy`: held-out rows `S * G + j * ranks + R`, in order.
    pub(crate) fn read_val_npy(
        &self,
        rank: u64,
        step: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let Some(m) = &self.mixed else {
            return Err(Error::NotFound);
        };
        let key = StepKey {
            epoch: mixture::VAL_EPOCH,
            rank,
            step,
        };
        if self.remote {
            return crate::storage::remote::ahead::ahead(
                || self.warm_documents(key),
                || gather::deferred(buf, |buf| self.read_mixture_npy(m, key, offset, buf)),
            );
        }
        self.read_mixture_npy(m, key, offset, buf)
    }

    /// A view of the mixture `config` describes (`--config RUN.toml`), its sources opened as
    /// `open` says.
    pub fn mixture(config: &crate::runconfig::RunConfig, open: &OpenOptions) -> Result<View> {
        View::mixture_in(config, open, &mut Datasets::default())
    }

    /// The views of the run configuration at `path` (`mount --config`): one per `[[plan]]`
    /// table (named), or the one plan of a file without them (unnamed); `plan` keeps only the
    /// plan of that name (unnamed then, as if alone). Every plan's sources are opened once
    /// for all of them; returns how many datasets that is. `max_listing` as the mount's flag.
    pub fn open_config(
        path: &Path,
        plan: Option<&str>,
        open: &OpenOptions,
        max_listing: u64,
    ) -> Result<(Vec<NamedView>, usize)> {
        let mut configs = crate::runconfig::RunConfig::read_plans(path)?;
        if let Some(name) = plan {
            let names: Vec<&str> = configs.iter().filter_map(|c| c.name.as_deref()).collect();
            let Some(k) = configs.iter().position(|c| c.name.as_deref() == Some(name)) else {
                return Err(Error::invalid(format!(
                    "{}: no [[plan]] named {name:?} (it has: {})",
                    path.display(),
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                )));
            };
            let mut one = configs.swap_remove(k);
            one.name = None;
            configs = vec![one];
        }
        let mut datasets = Datasets::default();
        let mut views = Vec::with_capacity(configs.len());
        for mut config in configs {
            config.view.max_listing = max_listing;
            let view =
                View::mixture_in(&config, open, &mut datasets).map_err(|e| match &config.name {
                    Some(name) => Error::invalid(format!("plan {name:?}: {e}")),
                    None => e,
                })?;
            views.push((config.name, view));
        }
        Ok((views, datasets.len()))
    }

    /// The one plan of `views` (as [`View::open_config`] opened them from `path`), or an error
    /// listing their names when there are several; `choose` says how to pick one
    /// (`--plan NAME`, `plan=NAME`).
    pub fn one_plan(mut views: Vec<NamedView>, path: &Path, choose: &str) -> Result<View> {
        if views.len() > 1 {
            let names: Vec<String> = views.iter().filter_map(|(n, _)| n.clone()).collect();
            return Err(Error::invalid(format!(
                "{} has several [[plan]] tables: choose one with {choose} ({})",
                path.display(),
                names.join(", ")
            )));
        }
        Ok(views.remove(0).1)
    }

    /// [`View::mixture`] with its datasets taken from `datasets` (opened there the first time):
    /// the plans of one mount share them.
    pub fn mixture_in(
        config: &crate::runconfig::RunConfig,
        open: &OpenOptions,
        datasets: &mut Datasets,
    ) -> Result<View> {
        let mixed = mixture::Mixed::open(config, open, datasets)?;
        let c = &config.view;
        let plan = Plan::new(
            mixed
                .steps_per_epoch
                .checked_mul(c.batch_size * c.ranks)
                .ok_or_else(|| {
                    Error::invalid("steps_per_epoch times the global batch overflows")
                })?,
            c.batch_size,
            c.ranks,
            c.seed,
            c.epochs,
        )?;
        let mut shape = Shape::of(&plan);
        shape.observations = 0;
        shape.val_steps = mixed.val_rows() / plan.global_batch();
        Inodes::new(shape)?;
        let first = &mixed.sources[0].1;
        let npy_header = npy::header(&first.served_descr(), &[c.batch_size, c.window])?;
        let step_file_bytes =
            npy_header.len() as u64 + c.batch_size * c.window * first.out_itemsize;
        let mut info = first.info.clone();
        info.n_tokens = mixed
            .sources
            .iter()
            .map(|(_, v)| v.dataset.n_records())
            .sum();
        info.n_observations = plan.n_observations();
        info.n_documents = None;
        info.metadata = false;
        info.batch_size = c.batch_size;
        info.ranks = c.ranks;
        info.epochs = c.epochs;
        info.steps_per_epoch = plan.steps_per_epoch();
        info.global_batch = plan.global_batch();
        info.dropped_per_epoch = 0;
        info.step_shape = [c.batch_size, c.window];
        info.step_file_bytes = step_file_bytes;
        info.npy_header_bytes = npy_header.len() as u64;
        info.shards = mixed.sources.iter().map(|(_, v)| v.info.shards).sum();
        info.content_hash = String::new();
        info.dataset = config.path.display().to_string();
        info.mixture = Some(mixed.info.clone());
        info.truncated_listings = info::truncated(&shape, c.max_listing);
        let view = View {
            dataset: first.dataset.clone(),
            plan,
            mode: c.mode,
            window: c.window,
            windows: first.windows,
            itemsize: first.itemsize,
            out: first.out,
            out_itemsize: first.out_itemsize,
            npy_header,
            pad_record: first.pad_record.clone(),
            packed: None,
            bos_record: Vec::new(),
            info_json: Vec::new(),
            info,
            remote: mixed.sources.iter().any(|(_, v)| v.remote),
            mixed: Some(Box::new(mixed)),
        };
        let mut view = view;
        view.info.fingerprint = view.fingerprint_at(0);
        view.info.layout_fingerprint = info::layout_fingerprint(&view.info);
        view.info_json = view.info.to_json();
        Ok(view)
    }

    /// [`View::mixture`] with the defaults of `shufflefs plan` (tests).
    #[doc(hidden)]
    pub fn mixture_for_tests(
        config: &crate::runconfig::RunConfig,
        max_open: usize,
    ) -> Result<View> {
        let open = OpenOptions {
            max_open,
            allow_other: false,
            verify_reads: false,
        };
        View::mixture(config, &open)
    }

    /// The fingerprint of the rows up to global step `step`: the mount's fingerprint for one
    /// dataset; for a mixture, it also covers the schedule entries starting at or before
    /// `step` (a later entry does not change it).
    pub(crate) fn fingerprint_at(&self, step: u64) -> String {
        let Some(m) = &self.mixed else {
            return self.info.fingerprint.clone();
        };
        let i = &self.info;
        info::hash_text(&format!(
            "format={}\nalgorithm={}\nnpy=1.0\nmode={}\ndtype={}\nwindow={}\nstride={}\n\
             global_batch={}\nseed={}\n{}",
            crate::format::FORMAT_NAME,
            crate::shuffle::feistel::ALGORITHM,
            i.mode,
            i.dtype,
            i.window,
            i.stride,
            i.global_batch,
            i.seed,
            m.canonical_text(step)
        ))
    }

    /// Bytes `[within, within + out.len())` of observation `observation` as one row of
    /// `window` records (a window, or a document truncated or padded).
    fn fill_observation_row(&self, observation: u64, within: u64, out: &mut [u8]) -> Result<()> {
        match self.mode {
            Mode::Documents => {
                let doc = self.dataset.document(observation)?;
                self.fill_doc_row(&doc, self.window, within, out)
            }
            _ => self.read_records(self.windows.first_record(observation), within, out),
        }
    }

    /// Whether some of its data is remote (S3, HTTP).
    pub fn is_remote(&self) -> bool {
        self.remote
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The dataset.
    pub fn dataset(&self) -> &Dataset {
        &self.dataset
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
    /// case) is the fingerprint of global step `resume_step` (`--resume-step`; for one dataset
    /// the mount's fingerprint, for a mixture the one that covers the schedule up to that
    /// step, as that step's `S.json` carries it).
    pub(crate) fn check_fingerprint(&self, expected: &str, resume_step: u64) -> Result<()> {
        let fingerprint = &self.fingerprint_at(resume_step);
        if expected.trim().eq_ignore_ascii_case(fingerprint) {
            return Ok(());
        }
        let compare = if self.mixed.is_some() {
            format!(
                "compare the `fingerprint` of `shufflefs plan --config RUN.toml --epoch E --rank \
                 0 --step S` (global step {resume_step}: the S.json the checkpoint kept) for \
                 both configurations, or pass the checkpoint's step as --resume-step"
            )
        } else {
            "compare `shufflefs plan DATASET_DIR ... --info` outputs".to_string()
        };
        Err(Error::invalid(format!(
            "--expect-fingerprint {expected} does not match this mount's fingerprint \
             {fingerprint}: the dataset (its content or checksums), the global plan (seed, \
             window, stride, global batch = batch size x ranks, mode, pad id) or the format or \
             algorithm version differ from the run being resumed (ranks, batch size and epochs \
             may change while batch size x ranks stays); {compare}, or drop the flag to start \
             a new order"
        )))
    }

    /// The numpy descr of the served `.npy` files: the dataset's records, or `--out-dtype`.
    fn served_descr(&self) -> String {
        match self.out {
            Some(c) => RecordType::scalar(c.to).npy_descr(),
            None => self.dataset.record_type().npy_descr(),
        }
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
}

/// How many observations `config` makes of `dataset`, refusing options of the other mode and a
/// pad id the record type cannot hold.
fn observations(dataset: &Dataset, config: &ViewConfig, windows: &Windows) -> Result<u64> {
    let n_obs = match config.mode {
        Mode::Stream => windows.n_observations(),
        Mode::Packed => unreachable!("packed mode counts its rows"),
        Mode::Documents => dataset.n_documents().ok_or_else(|| {
            Error::invalid(
                "--mode documents needs a dataset with documents: pack JSON Lines inputs or use \
                 --doc-sep",
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
        // Padding is served in the served type (`--out-dtype`, checked in `View::new`).
        let record = dataset.record_type();
        let t = match (record.scalar_type(), config.out_dtype) {
            (Some(_), Some(out)) => out,
            _ => record.token_type(),
        };
        if t.int_range().is_none_or(|(lo, hi)| pad < lo || pad > hi) {
            return Err(Error::invalid(format!("--pad-id {pad} is not a {t} value")));
        }
    }
    Ok(n_obs)
}

/// The observation ids of a `--quarantine` file: one per line, `#` starts a comment.
fn read_ids(path: &Path) -> Result<Vec<u64>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut ids = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        ids.push(line.parse().map_err(|_| {
            Error::invalid(format!(
                "{}:{}: {line:?} is not an observation id (one per line)",
                path.display(),
                n + 1
            ))
        })?);
    }
    Ok(ids)
}

/// The tree's shape of `plan` under `config` (see [`View::shape`]).
fn shape_of(plan: &Plan, config: &ViewConfig, masks: bool) -> Shape {
    let mut shape = Shape::of(plan);
    if config.mode == Mode::Packed || config.rewindow {
        shape.observations = 0;
    }
    shape.masks = masks;
    shape
}

/// Refuses options packed mode does not take.
fn check_packed(config: &ViewConfig) -> Result<()> {
    if config.stride.is_some_and(|s| s != config.window) {
        return Err(Error::invalid("--stride has no meaning in --mode packed"));
    }
    if config.pad_id.is_some() {
        return Err(Error::invalid(
            "--pad-id has no meaning in --mode packed: packed rows have no padding",
        ));
    }
    if config.rewindow {
        return Err(Error::invalid("--rewindow only applies to --mode stream"));
    }
    Ok(())
}

/// Refuses a plan of no step: fewer observations than one global batch.
fn check_serves(dataset: &Dataset, config: &ViewConfig, plan: &Plan, stride: u64) -> Result<()> {
    if plan.steps_per_epoch() > 0 {
        return Ok(());
    }
    let n_obs = plan.n_observations();
    let what = match config.mode {
        Mode::Stream => format!(
            "the dataset has {} tokens, which make {n_obs} windows of {} (stride {stride})",
            dataset.n_records(),
            config.window
        ),
        Mode::Documents => format!("the dataset has {n_obs} documents"),
        Mode::Packed => format!("the dataset packs into {n_obs} rows per epoch"),
    };
    Err(Error::invalid(format!(
        "{what}, fewer than one global batch of {} (batch size {} x {} ranks): nothing to \
         serve; lower {}",
        plan.global_batch(),
        config.batch_size,
        config.ranks,
        match config.mode {
            Mode::Stream | Mode::Packed => "--window, --batch-size or --ranks",
            Mode::Documents => "--batch-size or --ranks",
        }
    )))
}

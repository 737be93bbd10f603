//! The contents of every file in the tree: a dataset seen through a plan.
//!
//! `View` answers "what are the bytes of `epoch/E/rank/R/step/S.npy` (or `.json`, or
//! `info.json`)?" without knowing about inodes or FUSE. A step file is a numpy `.npy` of shape
//! `(batch_size, window)`: the fixed header, then row `j` = the window of observation
//! `perm_E(S*G + j*R + R_rank)`. Any byte range of it can be produced on its own, reading only
//! the shard bytes that range covers.

use std::path::Path;

use serde::Serialize;
use serde::ser::{SerializeStruct, Serializer};

use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::feistel;
use crate::format::{self, ContentHasher};
use crate::npy;
use crate::plan::{Plan, StepKey};
use crate::window::Windows;

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
}

/// `info.json`: the mount's parameters and identity.
#[derive(Clone, Debug, Serialize)]
pub struct Info {
    /// Always "stream" for now.
    pub mode: &'static str,
    /// Records (tokens) in the dataset.
    pub n_tokens: u64,
    /// Observations shuffled per epoch.
    pub n_observations: u64,
    /// Records per observation.
    pub window: u64,
    /// Records between observation starts.
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
    /// numpy descr of the records (`<u4`).
    pub dtype: String,
    /// Bytes per record.
    pub itemsize: u64,
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
    /// Hash of everything that determines the bytes served: store it with a checkpoint and
    /// refuse to resume when it differs.
    pub fingerprint: String,
    /// The dataset directory (informational, not part of the fingerprint).
    pub dataset: String,
    /// The shufflefs version serving the mount (informational).
    pub shufflefs_version: &'static str,
}

/// `S.json`: which observations a step holds.
#[derive(Clone, Debug, Serialize)]
pub struct StepInfo {
    /// Epoch.
    pub epoch: u64,
    /// Rank.
    pub rank: u64,
    /// Step within the epoch.
    pub step: u64,
    /// `epoch * steps_per_epoch + step`: the step counter a trainer checkpoints.
    pub global_step: u64,
    /// Observation ids, in row order.
    pub observations: Vec<u64>,
    /// First token (record index in the stream) of each row.
    pub token_starts: Vec<u64>,
    /// The mount's fingerprint.
    pub fingerprint: String,
}

/// A dataset seen through a plan: the bytes of every file.
#[derive(Debug)]
pub struct View {
    dataset: Dataset,
    plan: Plan,
    windows: Windows,
    npy_header: Vec<u8>,
    info: Info,
    info_json: Vec<u8>,
}

impl View {
    /// Builds the view, refusing configurations that would serve nothing or overflow.
    pub fn new(dataset: Dataset, config: &ViewConfig) -> Result<View> {
        let record = dataset.record_type().clone();
        let itemsize = record.itemsize() as u64;
        let stride = config.stride.unwrap_or(config.window);
        let windows = Windows::new(dataset.n_records(), config.window, stride, itemsize)?;
        let n_obs = windows.n_observations();
        let plan = Plan::new(
            n_obs,
            config.batch_size,
            config.ranks,
            config.seed,
            config.epochs,
        )?;
        if plan.steps_per_epoch() == 0 {
            return Err(Error::invalid(format!(
                "the dataset has {} tokens, which make {n_obs} windows of {} (stride {stride}), \
                 fewer than one global batch of {} (batch size {} x {} ranks): nothing to \
                 serve; lower --window, --batch-size or --ranks",
                dataset.n_records(),
                config.window,
                plan.global_batch(),
                config.batch_size,
                config.ranks
            )));
        }
        // Every file must be numberable (see fs.rs); checked here so `plan` and `bench` refuse
        // exactly what `mount` refuses.
        plan.epochs()
            .checked_mul(plan.ranks())
            .and_then(|er| er.checked_mul(plan.steps_per_epoch()))
            .and_then(|files| files.checked_mul(2))
            .and_then(|files| files.checked_add(4 * plan.epochs() * (plan.ranks() + 1)))
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
        let mut info = Info {
            mode: "stream",
            n_tokens: dataset.n_records(),
            n_observations: n_obs,
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
            itemsize,
            step_shape: [config.batch_size, config.window],
            step_file_bytes,
            npy_header_bytes: npy_header.len() as u64,
            shards: manifest.shards.len(),
            content_hash: manifest.content_hash.clone(),
            format_version: manifest.version,
            algorithm: feistel::ALGORITHM,
            fingerprint: String::new(),
            dataset: dataset.dir().display().to_string(),
            shufflefs_version: env!("CARGO_PKG_VERSION"),
        };
        info.fingerprint = fingerprint(&info, manifest);
        let mut info_json = serde_json::to_vec_pretty(&info).expect("info serializes");
        info_json.push(b'\n');
        Ok(View {
            dataset,
            plan,
            windows,
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

    /// Size of every step `.npy` file.
    pub fn step_npy_len(&self) -> u64 {
        self.info.step_file_bytes
    }

    /// The `S.json` record of `key`.
    pub fn step_info(&self, key: StepKey) -> StepInfo {
        let observations: Vec<u64> = self.plan.observations(key).collect();
        let token_starts = observations
            .iter()
            .map(|&o| self.windows.first_record(o))
            .collect();
        StepInfo {
            epoch: key.epoch,
            rank: key.rank,
            step: key.step,
            global_step: key.epoch * self.plan.steps_per_epoch() + key.step,
            observations,
            token_starts,
            fingerprint: self.info.fingerprint.clone(),
        }
    }

    /// The bytes of `S.json` for `key` (compact JSON and a newline).
    pub fn step_json(&self, key: StepKey) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_step_json(key, &mut out);
        out
    }

    /// Size of `S.json` for `key`, computed by serializing into a counter: O(batch_size) time,
    /// no allocation, whatever the batch size.
    pub fn step_json_len(&self, key: StepKey) -> u64 {
        let mut counter = Counter(0);
        self.write_step_json(key, &mut counter);
        counter.0
    }

    /// Appends bytes `[offset, offset + size)` of `S.json` for `key` to `out`, without
    /// building the whole file.
    pub fn read_step_json(&self, key: StepKey, offset: u64, size: u32, out: &mut Vec<u8>) {
        let end = offset.saturating_add(u64::from(size));
        let mut window = RangeWriter {
            pos: 0,
            start: offset,
            end,
            out,
        };
        self.write_step_json(key, &mut window);
    }

    fn write_step_json<W: std::io::Write>(&self, key: StepKey, w: &mut W) {
        // Errors only come from RangeWriter stopping early once its range is complete.
        let _ = serde_json::to_writer(&mut *w, &LazyStepInfo { view: self, key })
            .map_err(std::io::Error::from)
            .and_then(|()| w.write_all(b"\n"));
    }

    /// Fills `buf` with the bytes of `S.npy` for `key` starting at `offset`, and returns how
    /// many bytes that is: `min(buf.len(), len - offset)`, 0 at or past the end. Only the
    /// shard bytes of the rows the range covers are read, one pread per row piece.
    pub fn read_step_npy(&self, key: StepKey, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let len = self.step_npy_len();
        if offset >= len {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(len - offset) as usize;
        let buf = &mut buf[..n];
        let header_len = self.npy_header.len() as u64;
        let mut filled = 0usize;
        if offset < header_len {
            let take = ((header_len - offset) as usize).min(n);
            buf[..take].copy_from_slice(&self.npy_header[offset as usize..offset as usize + take]);
            filled = take;
        }
        if filled == n {
            return Ok(n);
        }
        // Data region, in bytes relative to the first row.
        let row_bytes = self.windows.row_bytes();
        let mut data_pos = offset + filled as u64 - header_len;
        let data_end = offset + n as u64 - header_len;
        let rows = self.plan.observations(key);
        while data_pos < data_end {
            let row = data_pos / row_bytes;
            let within = data_pos % row_bytes;
            let take = (row_bytes - within).min(data_end - data_pos) as usize;
            let observation = rows.row(row);
            let stream_offset = self.windows.byte_offset(observation) + within;
            self.dataset
                .read_stream(stream_offset, &mut buf[filled..filled + take])?;
            filled += take;
            data_pos += take as u64;
        }
        Ok(n)
    }

    /// The whole `S.npy` for `key`.
    pub fn render_step_npy(&self, key: StepKey) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.step_npy_len() as usize];
        let n = self.read_step_npy(key, 0, &mut out)?;
        debug_assert_eq!(n, out.len());
        Ok(out)
    }
}

/// The fingerprint covers every input that determines the served bytes and their order:
/// formats and algorithm, the plan parameters, and the dataset identity.
fn fingerprint(info: &Info, manifest: &format::Manifest) -> String {
    // An explicit canonical text, one `key=value` line each in a fixed order, so the value
    // depends on nothing but these inputs.
    let mut canonical = format!(
        "format={}\nformat_version={}\nalgorithm={}\nnpy=1.0\nmode={}\ndtype={}\n\
         n_tokens={}\nwindow={}\nstride={}\nbatch_size={}\nranks={}\nseed={}\nepochs={}\n\
         content_hash={}\n",
        format::FORMAT_NAME,
        manifest.version,
        feistel::ALGORITHM,
        info.mode,
        info.dtype,
        info.n_tokens,
        info.window,
        info.stride,
        info.batch_size,
        info.ranks,
        info.seed,
        info.epochs,
        manifest.content_hash,
    );
    for s in &manifest.shards {
        canonical.push_str(&format!("shard={},{}\n", s.bytes, s.hash));
    }
    let mut h = ContentHasher::new();
    h.update(canonical.as_bytes());
    format::format_hash(h.finish())
}

/// Serializes exactly like [`StepInfo`] but streams the observation lists from the
/// permutation instead of collecting them.
struct LazyStepInfo<'a> {
    view: &'a View,
    key: StepKey,
}

struct Seq<I>(std::cell::Cell<Option<I>>);

impl<I: Iterator<Item = u64>> Serialize for Seq<I> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.0.take().expect("serialized once"))
    }
}

impl Serialize for LazyStepInfo<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let (view, key) = (self.view, self.key);
        let windows = view.windows;
        let mut st = s.serialize_struct("StepInfo", 7)?;
        st.serialize_field("epoch", &key.epoch)?;
        st.serialize_field("rank", &key.rank)?;
        st.serialize_field("step", &key.step)?;
        st.serialize_field(
            "global_step",
            &(key.epoch * view.plan.steps_per_epoch() + key.step),
        )?;
        st.serialize_field(
            "observations",
            &Seq(std::cell::Cell::new(Some(view.plan.observations(key)))),
        )?;
        st.serialize_field(
            "token_starts",
            &Seq(std::cell::Cell::new(Some(
                view.plan
                    .observations(key)
                    .map(move |o| windows.first_record(o)),
            ))),
        )?;
        st.serialize_field("fingerprint", &view.info.fingerprint)?;
        st.end()
    }
}

/// Counts bytes written.
struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Keeps the bytes of `[start, end)` of what is written, and stops the writer once past it.
struct RangeWriter<'a> {
    pos: u64,
    start: u64,
    end: u64,
    out: &'a mut Vec<u8>,
}

impl std::io::Write for RangeWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.pos >= self.end {
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

//! A mixture of datasets (`--config RUN.toml`): the view side of `shuffle/mixture/`.
//!
//! Each source is a dataset seen with the run's window, stride and mode (a [`View`] of its
//! own, whose observations are its windows or documents). Global step `x = e * T + s` holds
//! `c_k(x)` rows of source `k` (`Counter`: `|C_k - E_k| < 1` while the weights of step 0 hold),
//! the `j`-th row ever drawn from `k` is its observation `perm_{k, j div m_k}(j mod m_k)`, and
//! the `G` rows are spread over the ranks by a keyed shuffle of the slots (`Batch`): row `j`
//! of rank `r` is slot `j * ranks + r`, as for one dataset. The counts of recent steps are
//! kept (a random access replays at most `CHECKPOINT_STEPS` steps from a checkpoint).

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lru::LruCache;
use serde::Serialize;

use super::{Mode, View};
use crate::dataset::Dataset;
use crate::error::{Error, Result};
use crate::runconfig::RunConfig;
use crate::shuffle::mixture::{
    ALGORITHM, Mixture, Row, Schedule, SourceSpec, StepCounts, name_ranks, normalize,
};
use crate::shuffle::plan::StepKey;

/// The epoch number that stands for the held-out steps (`/val`) in a [`StepKey`].
pub(super) const VAL_EPOCH: u64 = u64::MAX;

/// The global steps `info.json`'s `drawn_at_epoch_start` covers (a replay of 2^24 steps, about
/// a second at the counter's speed, at most, at mount).
pub(super) const INFO_STEPS: u64 = 1 << 24;

/// Steps whose counts are kept.
const COUNTS_KEPT: usize = 64;

/// How a mixture's datasets are opened (the single-dataset mount's options).
#[derive(Clone, Copy, Debug)]
pub struct OpenOptions {
    /// Most descriptors each dataset keeps open.
    pub max_open: usize,
    /// The mount lets other users read it.
    pub allow_other: bool,
    /// Check every shard read against its block checksums.
    pub verify_reads: bool,
}

impl Default for OpenOptions {
    /// The mount's defaults (`--max-open-shards 4096`, no `--allow-other` or
    /// `--verify-reads`).
    fn default() -> Self {
        OpenOptions {
            max_open: crate::storage::fdpool::DEFAULT_MAX_OPEN,
            allow_other: false,
            verify_reads: false,
        }
    }
}

/// The datasets of a mount's plans, each opened once (by its canonical directory), so plans
/// over the same sources share their descriptors and their reads.
#[derive(Debug, Default)]
pub struct Datasets(BTreeMap<PathBuf, Arc<Dataset>>);

impl Datasets {
    /// The dataset at `dir`, opened as `open` says the first time it is asked for.
    fn open(&mut self, dir: &Path, open: &OpenOptions) -> Result<Arc<Dataset>> {
        let key = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        if let Some(d) = self.0.get(&key) {
            return Ok(d.clone());
        }
        let mut dataset = Dataset::open_with(dir, open.max_open, open.allow_other)?;
        if open.verify_reads {
            dataset = dataset.with_verified_reads()?;
        }
        let dataset = Arc::new(dataset);
        self.0.insert(key, dataset.clone());
        Ok(dataset)
    }

    /// How many datasets are open.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The sources of a mixture view and its plan.
#[derive(Debug)]
pub(super) struct Mixed {
    /// Each source: its name and its view (the run's geometry over its dataset).
    pub(super) sources: Vec<(String, View)>,
    pub(super) mixture: Mixture,
    pub(super) steps_per_epoch: u64,
    counts: Mutex<LruCache<u64, Arc<StepCounts>>>,
    /// `info.json`'s `mixture`.
    pub(super) info: MixtureInfo,
    /// The held-out rows: sources in name order, `val_ends[i]` one past the last held-out
    /// position of the `i`-th of them.
    val_sources: Vec<usize>,
    val_ends: Vec<u64>,
}

/// `info.json`'s `mixture`: the sources, weights and schedule.
#[derive(Clone, Debug, Serialize)]
pub struct MixtureInfo {
    /// The counting and placement algorithm (`mixture-v1`).
    pub algorithm: &'static str,
    /// The run configuration file.
    pub config: String,
    /// Global steps per mixture epoch.
    pub steps_per_epoch: u64,
    /// The sources, in the order given.
    pub sources: Vec<SourceInfo>,
    /// Weight changes.
    pub schedule: Vec<ScheduleInfo>,
}

/// One source in `info.json`.
#[derive(Clone, Debug, Serialize)]
pub struct SourceInfo {
    /// Its name.
    pub name: String,
    /// Its dataset directory.
    pub path: String,
    /// The weight as written.
    pub weight: String,
    /// The weight as served: `n / 2^32`.
    pub weight_units: u64,
    /// Observations (windows or documents).
    pub observations: u64,
    /// Of them, held out of training (`[split]`), served under `/val`.
    pub held_out: u64,
    /// Of them, never served (`quarantine`).
    pub quarantined: u64,
    /// `C_k` at the start of each mixture epoch: rows drawn from the source before it.
    /// (For the epochs starting within [`INFO_STEPS`] global steps: the counts of later ones
    /// would cost the mount a replay of every step before them.)
    pub drawn_at_epoch_start: Vec<u64>,
}

/// One schedule entry in `info.json`.
#[derive(Clone, Debug, Serialize)]
pub struct ScheduleInfo {
    /// First global step.
    pub from_step: u64,
    /// The weights as written, in source order (empty: unchanged).
    pub weights: Vec<String>,
    /// Rows per rank per step from `from_step` on (`null`: unchanged).
    pub batch_size: Option<u64>,
}

impl Mixed {
    /// Opens every source of `config` with the run's geometry and builds the mixture. Each
    /// dataset is opened as a single-dataset mount opens it (`Dataset::open_with`: the owner
    /// rule, and for an `allow_other` mount the world-readable rule; `verify_reads` checks
    /// every shard read against its block checksums).
    pub(super) fn open(
        config: &RunConfig,
        open: &OpenOptions,
        datasets: &mut Datasets,
    ) -> Result<Mixed> {
        let at = |what: String| Error::invalid(format!("{}: {what}", config.path.display()));
        if config.view.rewindow || config.view.mode == Mode::Packed {
            return Err(at("a mixture serves stream or documents rows".into()));
        }
        let mut sources = Vec::with_capacity(config.sources.len());
        for s in &config.sources {
            let dataset = datasets
                .open(&s.path, open)
                .map_err(|e| at(format!("source {:?}: {e}", s.name)))?;
            // One observation per step: any source with at least one observation serves.
            let geometry = super::ViewConfig {
                batch_size: 1,
                ranks: 1,
                epochs: 1,
                ..config.view.clone()
            };
            let view = View::shared(dataset, &geometry)
                .map_err(|e| at(format!("source {:?}: {e}", s.name)))?;
            sources.push((s.name.clone(), view));
        }
        let served = sources[0].1.served_descr();
        if let Some((name, _)) = sources.iter().find(|(_, v)| v.served_descr() != served) {
            return Err(at(format!(
                "source {name:?} serves {} records but {:?} serves {served}: every source must \
                 have the same token type (or set the same out_dtype)",
                sources
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(String::new(), |(_, v)| v.served_descr()),
                sources[0].0
            )));
        }
        let names: Vec<&str> = sources.iter().map(|(n, _)| n.as_str()).collect();
        let rank = name_ranks(&names);
        let units = |ws: &[crate::shuffle::mixture::Weight]| {
            normalize(ws, &rank).map_err(|e| at(format!("weights: {e}")))
        };
        let g = config.view.batch_size * config.view.ranks;
        let first: Vec<_> = config.sources.iter().map(|s| s.weight).collect();
        let mut schedule =
            Schedule::new(units(&first)?, g).map_err(|e| at(format!("schedule: {e}")))?;
        for e in &config.schedule {
            let weights = e.weights.as_deref().map(&units).transpose()?;
            let g = e.batch_size.map(|b| b * config.view.ranks);
            schedule
                .change(e.from_step, weights, g)
                .map_err(|err| at(format!("schedule: {err}")))?;
        }
        let specs: Vec<SourceSpec> = sources
            .iter()
            .map(|(name, v)| SourceSpec {
                name: name.clone(),
                len: v.plan.n_observations(),
                val: config
                    .split
                    .map_or(0, |sp| sp.val.of(v.plan.n_observations())),
            })
            .collect();
        let split_seed = config.split.map_or(0, |sp| sp.seed);
        let mut val_sources: Vec<usize> = (0..specs.len()).collect();
        val_sources.sort_by_key(|&k| rank[k]);
        let mut val_ends = Vec::with_capacity(specs.len());
        let mut total = 0u64;
        for &k in &val_sources {
            total += specs[k].val;
            val_ends.push(total);
        }
        let mut mixture = Mixture::new(specs, schedule, config.view.seed, split_seed)
            .map_err(|e| at(format!("mixture: {e}")))?;
        for (k, list) in config.quarantine.iter().enumerate() {
            if !list.is_empty() {
                mixture = mixture
                    .with_quarantine(k, list)
                    .map_err(|e| at(e.to_string()))?;
            }
        }
        let spe = config.steps_per_epoch;
        let info = MixtureInfo {
            algorithm: ALGORITHM,
            config: config.path.display().to_string(),
            steps_per_epoch: spe,
            sources: sources
                .iter()
                .zip(&config.sources)
                .enumerate()
                .map(|(k, ((name, v), c))| SourceInfo {
                    name: name.clone(),
                    path: v.dataset.dir().display().to_string(),
                    weight: c.weight_text.clone(),
                    weight_units: mixture.counter().schedule().segments()[0].weights[k],
                    observations: v.plan.n_observations(),
                    held_out: mixture.sources()[k].val,
                    quarantined: mixture.order(k).quarantined(),
                    drawn_at_epoch_start: (0..config.view.epochs)
                        .take_while(|e| e.saturating_mul(spe) <= INFO_STEPS)
                        .map(|e| mixture.counter().state_at(e * spe).drawn[k])
                        .collect(),
                })
                .collect(),
            schedule: config
                .schedule
                .iter()
                .map(|e| ScheduleInfo {
                    from_step: e.from_step,
                    weights: e.weight_texts.clone(),
                    batch_size: e.batch_size,
                })
                .collect(),
        };
        Ok(Mixed {
            sources,
            mixture,
            steps_per_epoch: spe,
            counts: Mutex::new(LruCache::new(
                NonZeroUsize::new(COUNTS_KEPT).expect("non-zero"),
            )),
            info,
            val_sources,
            val_ends,
        })
    }

    /// Held-out rows in all.
    pub(super) fn val_rows(&self) -> u64 {
        self.val_ends.last().copied().unwrap_or(0)
    }

    /// Held-out row `q` (`< val_rows()`): the source and its observation. The held-out rows
    /// are the sources' held-out sets one after the other (sources by name), each in its split
    /// order.
    pub(super) fn val_row(&self, q: u64) -> (usize, u64) {
        let i = self.val_ends.partition_point(|&e| e <= q);
        let k = self.val_sources[i];
        let first = if i == 0 { 0 } else { self.val_ends[i - 1] };
        (k, self.mixture.order(k).val_observation(q - first))
    }

    /// The counts of global step `x`.
    fn counts(&self, x: u64) -> Arc<StepCounts> {
        if let Some(c) = self.counts.lock().expect("counts lock").get(&x) {
            return c.clone();
        }
        let c = Arc::new(self.mixture.counter().counts(x));
        self.counts.lock().expect("counts lock").put(x, c.clone());
        c
    }

    /// The rows `first..first + n` of rank `key.rank`'s step file.
    pub(super) fn rows(&self, key: StepKey, ranks: u64, first: u64, n: u64) -> Vec<Row> {
        if key.epoch == VAL_EPOCH {
            // Held-out step `key.step`: position `step * G + row * ranks + rank`, in order.
            let g = self.info_global_batch(ranks);
            return (first..first + n)
                .map(|row| {
                    let (source, observation) = self.val_row(key.step * g + row * ranks + key.rank);
                    Row {
                        source,
                        draw: 0,
                        observation,
                    }
                })
                .collect();
        }
        let x = key.epoch * self.steps_per_epoch + key.step;
        let batch = self.mixture.batch_of((*self.counts(x)).clone());
        (first..first + n)
            .map(|row| batch.rank_row(key.rank, ranks, row))
            .collect()
    }

    /// The global batch of the mixture's first segment (the batch of every held-out step).
    fn info_global_batch(&self, _ranks: u64) -> u64 {
        self.mixture.counter().schedule().segments()[0].global_batch
    }

    /// The global batch of global step `x`.
    pub(super) fn global_batch_at(&self, x: u64) -> u64 {
        self.mixture.counter().schedule().segment(x).global_batch
    }

    /// Whether the global batch changes anywhere in the schedule.
    pub(super) fn batch_changes(&self) -> bool {
        let segments = self.mixture.counter().schedule().segments();
        segments
            .iter()
            .any(|s| s.global_batch != segments[0].global_batch)
    }

    /// The canonical text of everything that decides the rows of global steps `0..=step`.
    pub(super) fn canonical_text(&self, step: u64) -> String {
        let mut out = format!("steps_per_epoch={}\n", self.steps_per_epoch);
        for (name, v) in &self.sources {
            out.push_str(&format!("source_data={},{}\n", v.info.fingerprint, name));
        }
        out.push_str(&self.mixture.canonical_text(step));
        out
    }
}

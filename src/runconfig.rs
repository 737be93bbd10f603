//! Run configuration files (`shufflefs mount --config RUN.toml MOUNTPOINT`): a plan over a
//! weighted mixture of datasets, with schedule changes, parsed with the `toml` crate.
//!
//! ```toml
//! window = 2049
//! stride = 2048
//! batch_size = 8          # rows per rank per step
//! ranks = 4
//! seed = 1234
//! steps_per_epoch = 1000  # a mixture epoch, in global steps
//! epochs = 3
//!
//! [[source]]
//! name = "web"
//! path = "/data/web"      # a dataset directory (relative to this file's) or s3:// / https:// URL
//! weight = 0.7
//!
//! [[source]]
//! name = "code"
//! path = "/data/code"
//! weight = 0.3
//!
//! [[schedule]]            # new weights from this global step on
//! from_step = 500         # epoch * steps_per_epoch + step
//! weights = { web = 0.5, code = 0.5 }
//! ```
//!
//! Weights are read exactly as written (`0.7` is the decimal 7/10, not the nearest double;
//! `shuffle/mixture/weights.rs`) and need not add up to 1. Any unknown key, a missing one, a
//! duplicate or unknown source name is an error naming the file and the key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::shuffle::mixture::Weight;
use crate::view::{Mode, ViewConfig};

/// Most `[[plan]]` tables of one configuration.
const MAX_PLANS: usize = 64;

/// Largest run configuration file read (a config is a few hundred bytes to a few KiB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A parsed run configuration.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The file it was read from (messages).
    pub path: PathBuf,
    /// The `[[plan]]` this is (`None`: the file has no `[[plan]]` tables).
    pub name: Option<String>,
    /// The plan options shared by every source (window, stride, batch, ranks, seed, epochs,
    /// mode, ...).
    pub view: ViewConfig,
    /// Global steps per mixture epoch.
    pub steps_per_epoch: u64,
    /// The sources, in the order given.
    pub sources: Vec<SourceConfig>,
    /// Weight changes, by increasing `from_step`.
    pub schedule: Vec<ScheduleEntry>,
    /// The held-out split (`[split]`), if any.
    pub split: Option<SplitConfig>,
    /// Per source (in source order), the observations never served (`quarantine = FILE`).
    pub quarantine: Vec<Vec<u64>>,
}

/// `[split]`: the observations of each source held out of training and served under `/val`.
#[derive(Clone, Copy, Debug)]
pub struct SplitConfig {
    /// How many of each source's observations are held out.
    pub val: SplitSize,
    /// The key of the held-out sets (`seed`, default 0): independent of the run's seed, so the
    /// sets stay when the training order, the weights or the batch change.
    pub seed: u64,
}

/// The size of a held-out set.
#[derive(Clone, Copy, Debug)]
pub enum SplitSize {
    /// A share of each source (`val = 0.001`): `floor(observations * share)`, the share read
    /// exactly as written.
    Share(u128),
    /// This many observations of each source (`val = 1000`).
    Count(u64),
}

impl SplitSize {
    /// Held-out observations of a source of `observations`.
    pub fn of(self, observations: u64) -> u64 {
        match self {
            // `units` is the share in units of 10^-18 (`Weight`).
            SplitSize::Share(units) => {
                (u128::from(observations) * units / 1_000_000_000_000_000_000) as u64
            }
            SplitSize::Count(n) => n,
        }
    }
}

/// One `[[source]]`.
#[derive(Clone, Debug)]
pub struct SourceConfig {
    /// Unique name.
    pub name: String,
    /// The dataset directory (resolved against the config file's directory).
    pub path: PathBuf,
    /// The weight, exactly as written.
    pub(crate) weight: Weight,
    /// The weight as written (for `info.json`).
    pub weight_text: String,
}

/// One `[[schedule]]` entry: the weights from global step `from_step` on.
#[derive(Clone, Debug)]
pub struct ScheduleEntry {
    /// The first global step it applies to.
    pub from_step: u64,
    /// The weights, in source order (`None`: those in force carry over).
    pub(crate) weights: Option<Vec<Weight>>,
    /// The weights as written, in source order (empty when they carry over).
    pub weight_texts: Vec<String>,
    /// The rows per rank per step from `from_step` on (`None`: carries over).
    pub batch_size: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    window: Option<u64>,
    stride: Option<u64>,
    batch_size: Option<u64>,
    ranks: Option<u64>,
    seed: Option<u64>,
    steps_per_epoch: Option<u64>,
    epochs: Option<u64>,
    mode: Option<String>,
    pad_id: Option<i64>,
    #[serde(rename = "source")]
    sources: Vec<RawSource>,
    #[serde(default, rename = "schedule")]
    schedule: Vec<RawEntry>,
    split: Option<RawSplit>,
    quarantine: Option<PathBuf>,
    #[serde(default, rename = "plan")]
    plans: Vec<RawPlan>,
}

/// One `[[plan]]`: a name, and the plan keys that differ from the top level's.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    name: String,
    window: Option<u64>,
    stride: Option<u64>,
    batch_size: Option<u64>,
    ranks: Option<u64>,
    seed: Option<u64>,
    steps_per_epoch: Option<u64>,
    epochs: Option<u64>,
    mode: Option<String>,
    pad_id: Option<i64>,
    /// Every source's weight (replaces the `[[source]]` weights).
    weights: Option<BTreeMap<String, toml::Value>>,
    /// Replaces the top level's `[[schedule]]`.
    schedule: Option<Vec<RawEntry>>,
}

/// The keys a `[[plan]]` may set, as given (`None`: not given).
#[derive(Clone, Default)]
struct Keys {
    window: Option<u64>,
    stride: Option<u64>,
    batch_size: Option<u64>,
    ranks: Option<u64>,
    seed: Option<u64>,
    steps_per_epoch: Option<u64>,
    epochs: Option<u64>,
    mode: Option<String>,
    pad_id: Option<i64>,
}

impl Keys {
    /// `self`'s keys, each replaced by `over`'s where given.
    fn under(&self, over: &Keys) -> Keys {
        let o = over.clone();
        let s = self.clone();
        Keys {
            window: o.window.or(s.window),
            stride: o.stride.or(s.stride),
            batch_size: o.batch_size.or(s.batch_size),
            ranks: o.ranks.or(s.ranks),
            seed: o.seed.or(s.seed),
            steps_per_epoch: o.steps_per_epoch.or(s.steps_per_epoch),
            epochs: o.epochs.or(s.epochs),
            mode: o.mode.or(s.mode),
            pad_id: o.pad_id.or(s.pad_id),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSplit {
    val: toml::Value,
    #[serde(default)]
    seed: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    name: String,
    path: PathBuf,
    weight: toml::Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    from_step: u64,
    weights: Option<BTreeMap<String, toml::Value>>,
    batch_size: Option<u64>,
}

impl RunConfig {
    /// Reads and checks `path`, a configuration of one plan (no `[[plan]]` tables).
    pub fn read(path: &Path) -> Result<RunConfig> {
        let mut plans = RunConfig::read_plans(path)?;
        match plans.len() {
            1 if plans[0].name.is_none() => Ok(plans.remove(0)),
            _ => Err(Error::invalid(format!(
                "{}: has [[plan]] tables: choose one ({})",
                path.display(),
                plans
                    .iter()
                    .filter_map(|p| p.name.as_deref())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Reads and checks `path`: its one plan, or each of its `[[plan]]` tables (named).
    pub fn read_plans(path: &Path) -> Result<Vec<RunConfig>> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if !meta.is_file() || meta.len() > MAX_CONFIG_BYTES {
            return Err(Error::invalid(format!(
                "{}: not a run configuration file (a regular file of at most 1 MiB)",
                path.display()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        RunConfig::parse_plans(&text, path)
    }

    /// Parses `text` (one plan, no `[[plan]]` tables), read from `path` (messages; relative
    /// source paths are resolved against its directory).
    pub fn parse(text: &str, path: &Path) -> Result<RunConfig> {
        let mut plans = RunConfig::parse_plans(text, path)?;
        if plans.len() != 1 || plans[0].name.is_some() {
            return Err(Error::invalid(format!(
                "{}: has [[plan]] tables: choose one",
                path.display()
            )));
        }
        Ok(plans.remove(0))
    }

    /// Parses `text`, read from `path`: its one plan (unnamed), or each of its `[[plan]]`
    /// tables, in the order given, each with the top level's keys where it gives none.
    pub fn parse_plans(text: &str, path: &Path) -> Result<Vec<RunConfig>> {
        let at = |what: String| Error::invalid(format!("{}: {what}", path.display()));
        let raw: Raw = toml::from_str(text).map_err(|e| at(e.to_string().trim().to_string()))?;
        if raw.sources.is_empty() {
            return Err(at(
                "no [[source]]: a mixture needs at least one source".into()
            ));
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let mut sources: Vec<SourceConfig> = Vec::with_capacity(raw.sources.len());
        for (i, s) in raw.sources.into_iter().enumerate() {
            if sources.iter().any(|o| o.name == s.name) {
                return Err(at(format!(
                    "source[{i}]: the name {:?} is used twice",
                    s.name
                )));
            }
            let (weight, weight_text) = weight(&s.weight)
                .map_err(|e| at(format!("source[{i}] ({}): weight: {e}", s.name)))?;
            // A dataset URL (s3://, http(s)://) stays as written.
            let path = if crate::storage::remote::is_remote(&s.path) {
                s.path.clone()
            } else {
                base.join(&s.path)
            };
            sources.push(SourceConfig {
                path,
                name: s.name,
                weight,
                weight_text,
            });
        }
        let split = match raw.split {
            None => None,
            Some(sp) => {
                let val = match &sp.val {
                    toml::Value::Integer(n) if *n >= 1 => SplitSize::Count(*n as u64),
                    toml::Value::Float(f) if *f > 0.0 && *f < 1.0 => SplitSize::Share(
                        Weight::from_f64(*f)
                            .map_err(|e| at(format!("split.val: {e}")))?
                            .units(),
                    ),
                    other => {
                        return Err(at(format!(
                            "split.val = {other}: a share of each source (0 < val < 1) or a \
                             count of observations (an integer >= 1)"
                        )));
                    }
                };
                Some(SplitConfig { val, seed: sp.seed })
            }
        };
        let quarantine = match &raw.quarantine {
            Some(file) => read_quarantine(&base.join(file), &sources, path)?,
            None => vec![Vec::new(); sources.len()],
        };
        let top = Keys {
            window: raw.window,
            stride: raw.stride,
            batch_size: raw.batch_size,
            ranks: raw.ranks,
            seed: raw.seed,
            steps_per_epoch: raw.steps_per_epoch,
            epochs: raw.epochs,
            mode: raw.mode,
            pad_id: raw.pad_id,
        };
        let shared = RunConfig {
            path: path.to_path_buf(),
            name: None,
            view: ViewConfig::stream(1, 1, 1, 1, 0, 1),
            steps_per_epoch: 1,
            sources,
            schedule: Vec::new(),
            split,
            quarantine,
        };
        if raw.plans.is_empty() {
            return Ok(vec![shared.plan(None, &top, &raw.schedule)?]);
        }
        if raw.plans.len() > MAX_PLANS {
            return Err(at(format!(
                "{} [[plan]] tables: at most {MAX_PLANS} (each plan has its own prefetch \
                 workers)",
                raw.plans.len()
            )));
        }
        // The top level's schedule names sources too, even when every plan replaces it.
        shared
            .schedule_entries(&raw.schedule)
            .map_err(|e| at(format!("the top level's {e}")))?;
        let mut plans: Vec<RunConfig> = Vec::with_capacity(raw.plans.len());
        let mut names = std::collections::HashSet::new();
        for (i, p) in raw.plans.into_iter().enumerate() {
            check_plan_name(&p.name).map_err(|e| at(format!("plan[{i}]: {e}")))?;
            if !names.insert(p.name.clone()) {
                return Err(at(format!(
                    "plan[{i}]: the name {:?} is used twice",
                    p.name
                )));
            }
            // Keys that only make sense together with others the plan does not give.
            if p.window.is_some() && p.stride.is_none() && top.stride.is_some() {
                return Err(at(format!(
                    "plan {:?} sets window but not stride: give its stride too (the top \
                     level's stride {} was chosen for the top level's window)",
                    p.name,
                    top.stride.unwrap_or(0)
                )));
            }
            let inherits_weights = raw.schedule.iter().any(|e| e.weights.is_some());
            if p.weights.is_some() && p.schedule.is_none() && inherits_weights {
                return Err(at(format!(
                    "plan {:?} sets weights but would inherit the top level's [[schedule]], \
                     whose weights replace them from its first step: give the plan its own \
                     [[plan.schedule]] entries, or `schedule = []` for none",
                    p.name
                )));
            }
            let mut this = shared.clone();
            if let Some(given) = &p.weights {
                let (ws, texts) = this
                    .weights_of(given)
                    .map_err(|e| at(format!("plan {:?}: weights: {e}", p.name)))?;
                for ((s, w), t) in this.sources.iter_mut().zip(ws).zip(texts) {
                    s.weight = w;
                    s.weight_text = t;
                }
            }
            let keys = top.under(&Keys {
                window: p.window,
                stride: p.stride,
                batch_size: p.batch_size,
                ranks: p.ranks,
                seed: p.seed,
                steps_per_epoch: p.steps_per_epoch,
                epochs: p.epochs,
                mode: p.mode,
                pad_id: p.pad_id,
            });
            let schedule = p.schedule.as_deref().unwrap_or(&raw.schedule);
            let plan = this
                .plan(Some(p.name.clone()), &keys, schedule)
                .map_err(|e| {
                    Error::invalid(e.to_string().replacen(
                        &format!("{}: ", path.display()),
                        &format!("{}: plan {:?}: ", path.display(), p.name),
                        1,
                    ))
                })?;
            plans.push(plan);
        }
        Ok(plans)
    }

    /// The sources' weights from a `weights = { NAME = W, ... }` table (every source named),
    /// and the weights as written.
    fn weights_of(
        &self,
        given: &BTreeMap<String, toml::Value>,
    ) -> std::result::Result<(Vec<Weight>, Vec<String>), String> {
        if let Some(name) = given
            .keys()
            .find(|n| !self.sources.iter().any(|s| &s.name == *n))
        {
            return Err(format!("no source named {name:?}"));
        }
        let mut ws = Vec::with_capacity(self.sources.len());
        let mut texts = Vec::with_capacity(self.sources.len());
        for s in &self.sources {
            let Some(v) = given.get(&s.name) else {
                return Err(format!(
                    "no weight for source {:?} (give every source's weight; 0 to leave one out)",
                    s.name
                ));
            };
            let (w, t) = weight(v).map_err(|err| format!("{:?}: {err}", s.name))?;
            ws.push(w);
            texts.push(t);
        }
        Ok((ws, texts))
    }

    /// The schedule entries `schedule` gives, checked (increasing steps, known sources).
    fn schedule_entries(
        &self,
        schedule: &[RawEntry],
    ) -> std::result::Result<Vec<ScheduleEntry>, String> {
        let mut entries: Vec<ScheduleEntry> = Vec::new();
        for (i, e) in schedule.iter().enumerate() {
            if entries.last().is_some_and(|p| p.from_step >= e.from_step) || e.from_step == 0 {
                return Err(format!(
                    "schedule[{i}]: from_step {} must be above 0 and above the entry before it",
                    e.from_step
                ));
            }
            if e.weights.is_none() && e.batch_size.is_none() {
                return Err(format!(
                    "schedule[{i}]: give weights, batch_size or both from step {}",
                    e.from_step
                ));
            }
            if e.batch_size == Some(0) {
                return Err(format!("schedule[{i}]: batch_size must be at least 1"));
            }
            let (weights, weight_texts) = match &e.weights {
                Some(given) => {
                    let (ws, texts) = self
                        .weights_of(given)
                        .map_err(|err| format!("schedule[{i}]: {err}"))?;
                    (Some(ws), texts)
                }
                None => (None, Vec::new()),
            };
            entries.push(ScheduleEntry {
                from_step: e.from_step,
                weights,
                weight_texts,
                batch_size: e.batch_size,
            });
        }
        Ok(entries)
    }

    /// This configuration's sources, split and quarantine with the plan `keys` and `schedule`
    /// describe, named `name`.
    fn plan(&self, name: Option<String>, keys: &Keys, schedule: &[RawEntry]) -> Result<RunConfig> {
        let at = |what: String| Error::invalid(format!("{}: {what}", self.path.display()));
        let need = |key: &str, v: Option<u64>| {
            v.ok_or_else(|| {
                at(format!(
                    "missing {key} (give it at the top level or in each [[plan]])"
                ))
            })
        };
        let window = need("window", keys.window)?;
        let batch_size = need("batch_size", keys.batch_size)?;
        let steps_per_epoch = need("steps_per_epoch", keys.steps_per_epoch)?;
        if steps_per_epoch == 0 {
            return Err(at("steps_per_epoch must be at least 1".into()));
        }
        let entries = self.schedule_entries(schedule).map_err(at)?;
        let mode = match keys.mode.as_deref() {
            None | Some("stream") => Mode::Stream,
            Some("documents") => Mode::Documents,
            Some(other) => {
                return Err(at(format!(
                    "mode {other:?}: a mixture serves \"stream\" or \"documents\" rows"
                )));
            }
        };
        let view = ViewConfig {
            mode,
            pad_id: keys.pad_id.map(i128::from),
            stride: keys.stride,
            ..ViewConfig::stream(
                window,
                keys.stride.unwrap_or(window),
                batch_size,
                keys.ranks.unwrap_or(1),
                keys.seed.unwrap_or(0),
                keys.epochs.unwrap_or(1),
            )
        };
        Ok(RunConfig {
            name,
            view,
            steps_per_epoch,
            schedule: entries,
            ..self.clone()
        })
    }
}

/// Checks a `[[plan]]` name: it is a directory name under `plan/`.
fn check_plan_name(name: &str) -> std::result::Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0']);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "name {name:?}: a plan's name is its directory under plan/ (1 to 255 bytes, no '/', \
             not . or ..)"
        ))
    }
}

/// The quarantine file `file` (lines `SOURCE OBSERVATION`, `#` comments) of the configuration
/// at `path`: per source, the observations never served.
fn read_quarantine(file: &Path, sources: &[SourceConfig], path: &Path) -> Result<Vec<Vec<u64>>> {
    let mut quarantine = vec![Vec::new(); sources.len()];
    let text = std::fs::read_to_string(file).map_err(|e| Error::io(file, e))?;
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = || {
            Error::invalid(format!(
                "{}:{}: {line:?}: each line is SOURCE OBSERVATION (a source name and an \
                 observation id within it)",
                file.display(),
                n + 1
            ))
        };
        let mut parts = line.split_whitespace();
        let (Some(name), Some(obs), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        let obs: u64 = obs.parse().map_err(|_| bad())?;
        let Some(k) = sources.iter().position(|s| s.name == name) else {
            return Err(Error::invalid(format!(
                "{}:{}: no source named {name:?} in {}",
                file.display(),
                n + 1,
                path.display()
            )));
        };
        quarantine[k].push(obs);
    }
    Ok(quarantine)
}

/// A weight as written: a number (read as the decimal it was written as) or a decimal string.
fn weight(v: &toml::Value) -> std::result::Result<(Weight, String), String> {
    let (w, text) = match v {
        toml::Value::Float(f) => (Weight::from_f64(*f), format!("{f}")),
        toml::Value::Integer(i) => (Weight::parse(&i.to_string()), i.to_string()),
        toml::Value::String(s) => (Weight::parse(s), s.clone()),
        other => return Err(format!("{other} is not a number")),
    };
    w.map(|w| (w, text)).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RunConfig> {
        RunConfig::parse(text, Path::new("/runs/a/run.toml"))
    }

    const BASE: &str = "window = 9\nbatch_size = 2\nranks = 2\nsteps_per_epoch = 10\n";

    #[test]
    fn the_issues_example_parses() {
        let text = format!(
            "{BASE}seed = 1234\nepochs = 3\n\
             [[source]]\nname = \"web\"\npath = \"/data/web\"\nweight = 0.7\n\
             [[source]]\nname = \"code\"\npath = \"code\"\nweight = 0.3\n\
             [[schedule]]\nfrom_step = 500\nweights = {{ web = 0.5, code = 0.5 }}\n"
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.sources.len(), 2);
        assert_eq!(c.sources[1].path, Path::new("/runs/a/code"));
        assert_eq!(c.sources[0].weight_text, "0.7");
        assert_eq!(c.schedule[0].from_step, 500);
        assert_eq!((c.view.window, c.view.seed, c.view.epochs), (9, 1234, 3));
    }

    #[test]
    fn mistakes_are_refused_naming_the_file_and_key() {
        let src = "[[source]]\nname = \"a\"\npath = \"a\"\nweight = 1\n";
        for (text, want) in [
            (BASE.to_string(), "source"),
            (format!("{BASE}{src}wieght = 2\n"), "wieght"),
            (format!("{BASE}{src}{src}"), "used twice"),
            (
                format!("{BASE}{src}[[schedule]]\nfrom_step = 0\nweights = {{ a = 1 }}\n"),
                "above 0",
            ),
            (
                format!("{BASE}{src}[[schedule]]\nfrom_step = 5\nweights = {{ b = 1 }}\n"),
                "no source named \"b\"",
            ),
            (
                format!("{BASE}[[source]]\nname = \"a\"\npath = \"a\"\nweight = -1\n"),
                "weight",
            ),
            (format!("{BASE}mode = \"packed\"\n{src}"), "stream"),
        ] {
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.starts_with("/runs/a/run.toml: "), "{e}");
            assert!(e.contains(want), "{e} lacks {want}");
        }
    }
}

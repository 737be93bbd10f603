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
//! path = "/data/web"      # a dataset directory; relative to this file's directory
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

/// Largest run configuration file read (a config is a few hundred bytes to a few KiB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A parsed run configuration.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The file it was read from (messages).
    pub path: PathBuf,
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
    window: u64,
    stride: Option<u64>,
    batch_size: u64,
    #[serde(default = "one")]
    ranks: u64,
    #[serde(default)]
    seed: u64,
    steps_per_epoch: u64,
    #[serde(default = "one")]
    epochs: u64,
    mode: Option<String>,
    pad_id: Option<i64>,
    #[serde(rename = "source")]
    sources: Vec<RawSource>,
    #[serde(default, rename = "schedule")]
    schedule: Vec<RawEntry>,
    split: Option<RawSplit>,
    quarantine: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSplit {
    val: toml::Value,
    #[serde(default)]
    seed: u64,
}

fn one() -> u64 {
    1
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
    /// Reads and checks `path`.
    pub fn read(path: &Path) -> Result<RunConfig> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if !meta.is_file() || meta.len() > MAX_CONFIG_BYTES {
            return Err(Error::invalid(format!(
                "{}: not a run configuration file (a regular file of at most 1 MiB)",
                path.display()
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        RunConfig::parse(&text, path)
    }

    /// Parses `text`, read from `path` (messages; relative source paths are resolved against
    /// its directory).
    pub fn parse(text: &str, path: &Path) -> Result<RunConfig> {
        let at = |what: String| Error::invalid(format!("{}: {what}", path.display()));
        let raw: Raw = toml::from_str(text).map_err(|e| at(e.to_string().trim().to_string()))?;
        if raw.sources.is_empty() {
            return Err(at(
                "no [[source]]: a mixture needs at least one source".into()
            ));
        }
        if raw.steps_per_epoch == 0 {
            return Err(at("steps_per_epoch must be at least 1".into()));
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
            sources.push(SourceConfig {
                path: base.join(&s.path),
                name: s.name,
                weight,
                weight_text,
            });
        }
        let mut schedule: Vec<ScheduleEntry> = Vec::new();
        for (i, e) in raw.schedule.into_iter().enumerate() {
            if schedule.last().is_some_and(|p| p.from_step >= e.from_step) || e.from_step == 0 {
                return Err(at(format!(
                    "schedule[{i}]: from_step {} must be above 0 and above the entry before it",
                    e.from_step
                )));
            }
            if e.weights.is_none() && e.batch_size.is_none() {
                return Err(at(format!(
                    "schedule[{i}]: give weights, batch_size or both from step {}",
                    e.from_step
                )));
            }
            if e.batch_size == Some(0) {
                return Err(at(format!("schedule[{i}]: batch_size must be at least 1")));
            }
            let mut weights = None;
            let mut weight_texts = Vec::new();
            if let Some(given) = &e.weights {
                if let Some(name) = given
                    .keys()
                    .find(|n| !sources.iter().any(|s| &s.name == *n))
                {
                    return Err(at(format!("schedule[{i}]: no source named {name:?}")));
                }
                let mut ws = Vec::with_capacity(sources.len());
                for s in &sources {
                    let Some(v) = given.get(&s.name) else {
                        return Err(at(format!(
                            "schedule[{i}]: no weight for source {:?} (give every source's \
                             weight; 0 to leave one out)",
                            s.name
                        )));
                    };
                    let (w, t) = weight(v)
                        .map_err(|err| at(format!("schedule[{i}] {:?}: {err}", s.name)))?;
                    ws.push(w);
                    weight_texts.push(t);
                }
                weights = Some(ws);
            }
            schedule.push(ScheduleEntry {
                from_step: e.from_step,
                weights,
                weight_texts,
                batch_size: e.batch_size,
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
        let mut quarantine = vec![Vec::new(); sources.len()];
        if let Some(file) = &raw.quarantine {
            let file = base.join(file);
            let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
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
                let (Some(name), Some(obs), None) = (parts.next(), parts.next(), parts.next())
                else {
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
        }
        let mode = match raw.mode.as_deref() {
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
            pad_id: raw.pad_id.map(i128::from),
            stride: raw.stride,
            ..ViewConfig::stream(
                raw.window,
                raw.stride.unwrap_or(raw.window),
                raw.batch_size,
                raw.ranks,
                raw.seed,
                raw.epochs,
            )
        };
        Ok(RunConfig {
            path: path.to_path_buf(),
            view,
            steps_per_epoch: raw.steps_per_epoch,
            sources,
            schedule,
            split,
            quarantine,
        })
    }
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

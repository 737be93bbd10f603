//! The one definition of correctness for a stream-mode tree (mountpoint-s3's
//! `reference.rs`): what every path of a mount is, and the bytes of every file, computed from
//! the dataset directory with `std::fs` and the formulas of SEMANTICS.md, sharing no code with
//! the read path. The shard bytes are read from disk and sliced here; the permutation of each
//! epoch is materialised naively (every position through `feistel::Permutation`, whose values
//! the library's own tests pin, then checked to be a bijection); step rows follow
//! `perm(s*G + j*R + r)`; the `.npy` header is numpy's writer, spelled out here; JSON files are
//! written here byte for byte. The one value taken from the code under test is the
//! fingerprint (pinned by `model::regression_fingerprint_is_pinned`), which `S.json` repeats.

use std::path::Path;

use serde_json::Value;
use shufflefs::dtype::ScalarType;
use shufflefs::feistel::Permutation;
use shufflefs::view::{Mode, ViewConfig};

/// A `.npy` header as numpy writes it (`numpy.lib.format._wrap_header`) for format `version`
/// (1, 2 or 3): the dict literal with `descr` (a Python literal: `'<u4'` with its quotes, or a
/// structured list), room for the first axis to grow to 21 digits, spaces to a multiple of 64
/// bytes, `\n`.
pub fn npy_header(version: u8, descr: &str, shape: &[u64]) -> Vec<u8> {
    let dims = match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut text = format!("{{'descr': {descr}, 'fortran_order': False, 'shape': {dims}, }}");
    text.push_str(&" ".repeat(21 - shape[0].to_string().len()));
    let len_bytes = if version == 1 { 2 } else { 4 };
    let preamble = 6 + 2 + len_bytes;
    text.push_str(&" ".repeat(64 - (preamble + text.len() + 1) % 64));
    text.push('\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[version, 0]);
    out.extend_from_slice(&(text.len() as u32).to_le_bytes()[..len_bytes]);
    out.extend_from_slice(text.as_bytes());
    assert_eq!(out.len() % 64, 0);
    out
}

/// The data part of a step file for positional data (token `t` has value `t`): the row of
/// observation `o` is tokens `o*stride .. o*stride+window`, little-endian.
pub fn expected_rows(observations: &[u64], cfg: &ViewConfig, dtype: ScalarType) -> Vec<u8> {
    let stride = cfg.stride.unwrap_or(cfg.window);
    let mut out = Vec::new();
    for &o in observations {
        for t in o * stride..o * stride + cfg.window {
            out.extend_from_slice(&t.to_le_bytes()[..dtype.size()]);
        }
    }
    out
}

/// The observation ids of a step from its `S.json` bytes.
pub fn json_observations(bytes: &[u8]) -> Vec<u64> {
    super::u64s(&super::json(bytes)["observations"])
}

/// Asserts that the union of `steps` (each a list of observation ids) is a set of distinct
/// observations of size `steps * G` out of `n`, so that exactly `n mod G` are dropped.
pub fn assert_exact_partition(all: &[Vec<u64>], n: u64, global_batch: u64) {
    let mut seen = std::collections::BTreeSet::new();
    for step in all {
        for &o in step {
            assert!(o < n, "observation {o} out of range {n}");
            assert!(seen.insert(o), "observation {o} served twice in one epoch");
        }
    }
    assert_eq!(
        n - seen.len() as u64,
        n % global_batch,
        "dropped tail must be n mod G"
    );
}

/// Whether `name` is the canonical decimal of a number below `bound` (what `to_string`
/// writes: no sign, no leading zero, ASCII digits), and which.
fn canonical_index(name: &[u8], bound: u64) -> Option<u64> {
    let text = std::str::from_utf8(name).ok()?;
    if !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let value: u64 = text.parse().ok()?;
    (value.to_string() == text && value < bound).then_some(value)
}

/// A path of the tree, by its grammar (SEMANTICS.md, the path grammar).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Entry {
    Root,
    Info,
    Stats,
    Epochs,
    Epoch(u64),
    Ranks(u64),
    Rank(u64, u64),
    Steps(u64, u64),
    StepNpy(u64, u64, u64),
    StepJson(u64, u64, u64),
    Observations,
    ObservationNpy(u64),
    ObservationJson(u64),
    Lookup,
    LookupEpochs,
    LookupEpoch(u64),
    LookupObservations(u64),
    LookupJson(u64, u64),
}

impl Entry {
    pub fn is_dir(self) -> bool {
        !matches!(
            self,
            Entry::Info
                | Entry::Stats
                | Entry::StepNpy(..)
                | Entry::StepJson(..)
                | Entry::ObservationNpy(_)
                | Entry::ObservationJson(_)
                | Entry::LookupJson(..)
        )
    }

    /// The path, relative to the mount ("" for the root).
    pub fn path(self) -> String {
        match self {
            Entry::Root => String::new(),
            Entry::Info => "info.json".into(),
            Entry::Stats => "stats.json".into(),
            Entry::Epochs => "epoch".into(),
            Entry::Epoch(e) => format!("epoch/{e}"),
            Entry::Ranks(e) => format!("epoch/{e}/rank"),
            Entry::Rank(e, r) => format!("epoch/{e}/rank/{r}"),
            Entry::Steps(e, r) => format!("epoch/{e}/rank/{r}/step"),
            Entry::StepNpy(e, r, s) => format!("epoch/{e}/rank/{r}/step/{s}.npy"),
            Entry::StepJson(e, r, s) => format!("epoch/{e}/rank/{r}/step/{s}.json"),
            Entry::Observations => "observation".into(),
            Entry::ObservationNpy(o) => format!("observation/{o}.npy"),
            Entry::ObservationJson(o) => format!("observation/{o}.json"),
            Entry::Lookup => "lookup".into(),
            Entry::LookupEpochs => "lookup/epoch".into(),
            Entry::LookupEpoch(e) => format!("lookup/epoch/{e}"),
            Entry::LookupObservations(e) => format!("lookup/epoch/{e}/observation"),
            Entry::LookupJson(e, o) => format!("lookup/epoch/{e}/observation/{o}.json"),
        }
    }

    /// The directory holding this entry (the root's is the root).
    pub fn parent(self) -> Entry {
        match self {
            Entry::Root
            | Entry::Info
            | Entry::Stats
            | Entry::Epochs
            | Entry::Observations
            | Entry::Lookup => Entry::Root,
            Entry::Epoch(_) => Entry::Epochs,
            Entry::Ranks(e) => Entry::Epoch(e),
            Entry::Rank(e, _) => Entry::Ranks(e),
            Entry::Steps(e, r) => Entry::Rank(e, r),
            Entry::StepNpy(e, r, _) | Entry::StepJson(e, r, _) => Entry::Steps(e, r),
            Entry::ObservationNpy(_) | Entry::ObservationJson(_) => Entry::Observations,
            Entry::LookupEpochs => Entry::Lookup,
            Entry::LookupEpoch(_) => Entry::LookupEpochs,
            Entry::LookupObservations(e) => Entry::LookupEpoch(e),
            Entry::LookupJson(e, _) => Entry::LookupObservations(e),
        }
    }
}

/// What a file of the tree holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Content {
    /// Exactly these bytes.
    Bytes(Vec<u8>),
    /// `info.json`: checked field by field ([`Reference::check_info`]).
    Info,
    /// `stats.json`: counters that change while mounted; valid JSON.
    Stats,
}

/// The reference model of one dataset seen through one stream-mode plan.
pub struct Reference {
    /// numpy descr without quotes (`<u4`).
    pub descr: String,
    pub itemsize: u64,
    /// The token stream, from the shard files.
    pub stream: Vec<u8>,
    pub shards: u64,
    /// Each shard's `(path as in the manifest, byte offset of its first record in the file,
    /// records)`, in stream order.
    pub shard_files: Vec<(String, u64, u64)>,
    pub content_hash: String,
    pub format_version: u64,
    pub window: u64,
    pub stride: u64,
    pub batch: u64,
    pub ranks: u64,
    pub seed: u64,
    pub epochs: u64,
    pub max_listing: u64,
    /// Observations per epoch.
    pub n: u64,
    /// Global batch `batch * ranks`.
    pub g: u64,
    pub steps: u64,
    /// Per epoch, the observation at each position.
    order: Vec<Vec<u64>>,
    /// Per epoch, the position of each observation.
    position: Vec<Vec<u64>>,
    /// Repeated in every `S.json`; set from `info.json` once it is checked.
    pub fingerprint: String,
}

impl Reference {
    /// The model of `dataset` under `cfg`, or why `mount` must refuse the plan.
    pub fn new(dataset: &Path, cfg: &ViewConfig) -> Result<Reference, String> {
        assert_eq!(cfg.mode, Mode::Stream, "the reference models stream mode");
        let m = super::manifest(dataset);
        let descr = m["dtype"].as_str().unwrap().to_string();
        let itemsize = m["itemsize"].as_u64().unwrap();
        let stream = super::stream(dataset);
        let n_tokens = stream.len() as u64 / itemsize;
        let (window, stride) = (cfg.window, cfg.stride.unwrap_or(cfg.window));
        let g = cfg.batch_size * cfg.ranks;
        let n = if n_tokens < window {
            0
        } else {
            (n_tokens - window) / stride + 1
        };
        if n < g {
            return Err(format!(
                "{n} windows of {window} (stride {stride}) from {n_tokens} tokens, fewer than \
                 one global batch of {g}"
            ));
        }
        let mut order = Vec::new();
        let mut position = Vec::new();
        for epoch in 0..cfg.epochs {
            let perm = Permutation::new(n, cfg.seed, epoch);
            let at: Vec<u64> = (0..n).map(|i| perm.apply(i)).collect();
            let mut inverse = vec![u64::MAX; n as usize];
            for (i, &o) in at.iter().enumerate() {
                assert!(
                    o < n,
                    "epoch {epoch}: position {i} holds {o}, out of range {n}"
                );
                assert_eq!(inverse[o as usize], u64::MAX, "epoch {epoch}: {o} twice");
                inverse[o as usize] = i as u64;
            }
            order.push(at);
            position.push(inverse);
        }
        Ok(Reference {
            descr,
            itemsize,
            shards: m["shards"].as_array().unwrap().len() as u64,
            shard_files: m["shards"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    (
                        s["path"].as_str().unwrap().to_string(),
                        s["offset"].as_u64().unwrap_or(0),
                        s["records"].as_u64().unwrap(),
                    )
                })
                .collect(),
            content_hash: m["content_hash"].as_str().unwrap().to_string(),
            format_version: m["version"].as_u64().unwrap(),
            stream,
            window,
            stride,
            batch: cfg.batch_size,
            ranks: cfg.ranks,
            seed: cfg.seed,
            epochs: cfg.epochs,
            max_listing: cfg.max_listing,
            n,
            g,
            steps: n / g,
            order,
            position,
            fingerprint: String::new(),
        })
    }

    pub fn n_tokens(&self) -> u64 {
        self.stream.len() as u64 / self.itemsize
    }

    /// The numpy header of an array of `shape` records.
    pub fn header(&self, shape: &[u64]) -> Vec<u8> {
        npy_header(1, &format!("'{}'", self.descr), shape)
    }

    /// The rows of step `s` of rank `r` in epoch `e`: `perm_e(s*G + j*R + r)` for row `j`.
    pub fn observations(&self, e: u64, r: u64, s: u64) -> Vec<u64> {
        (0..self.batch)
            .map(|j| self.order[e as usize][(s * self.g + j * self.ranks + r) as usize])
            .collect()
    }

    /// The tokens of observation `o`, as bytes.
    pub fn row(&self, o: u64) -> &[u8] {
        let start = (o * self.stride * self.itemsize) as usize;
        &self.stream[start..start + (self.window * self.itemsize) as usize]
    }

    /// Where observation `o` is trained in epoch `e`: `(position, Some((step, rank, row)))`, or
    /// no place when it falls in the dropped tail.
    pub fn placement(&self, e: u64, o: u64) -> (u64, Option<(u64, u64, u64)>) {
        let p = self.position[e as usize][o as usize];
        let (step, within) = (p / self.g, p % self.g);
        let place = (step < self.steps).then_some((step, within % self.ranks, within / self.ranks));
        (p, place)
    }

    pub fn step_npy(&self, e: u64, r: u64, s: u64) -> Vec<u8> {
        let mut out = self.header(&[self.batch, self.window]);
        for o in self.observations(e, r, s) {
            out.extend_from_slice(self.row(o));
        }
        out
    }

    pub fn step_json(&self, e: u64, r: u64, s: u64) -> Vec<u8> {
        let obs = self.observations(e, r, s);
        let list = |xs: &mut dyn Iterator<Item = u64>| {
            xs.map(|x| x.to_string()).collect::<Vec<_>>().join(",")
        };
        format!(
            "{{\"epoch\":{e},\"rank\":{r},\"step\":{s},\"global_step\":{},\"observations\":[{}],\
             \"token_starts\":[{}],\"files\":[{}],\"fingerprint\":\"{}\"}}\n",
            e * self.steps + s,
            list(&mut obs.iter().copied()),
            list(&mut obs.iter().map(|o| o * self.stride)),
            obs.iter()
                .map(|o| self.sources(o * self.stride, self.window))
                .collect::<Vec<_>>()
                .join(","),
            self.fingerprint
        )
        .into_bytes()
    }

    /// `S.json`'s pieces of records `[start, start + count)`: one `{"file","offset","records"}`
    /// per shard, found by walking the shard list.
    fn sources(&self, start: u64, count: u64) -> String {
        let mut pieces = Vec::new();
        let mut first = 0u64;
        for (path, offset, records) in &self.shard_files {
            let (lo, hi) = (start.max(first), (start + count).min(first + records));
            if lo < hi {
                pieces.push(format!(
                    "{{\"file\":{},\"offset\":{},\"records\":{}}}",
                    serde_json::to_string(path).unwrap(),
                    offset + (lo - first) * self.itemsize,
                    hi - lo
                ));
            }
            first += records;
        }
        format!("[{}]", pieces.join(","))
    }

    pub fn observation_npy(&self, o: u64) -> Vec<u8> {
        let mut out = self.header(&[self.window]);
        out.extend_from_slice(self.row(o));
        out
    }

    pub fn observation_json(&self, o: u64) -> Vec<u8> {
        let start = o * self.stride;
        format!(
            "{{\"observation\":{o},\"mode\":\"stream\",\"token_start\":{start},\"token_end\":{}}}\n",
            start + self.window
        )
        .into_bytes()
    }

    pub fn lookup_json(&self, e: u64, o: u64) -> Vec<u8> {
        match self.placement(e, o) {
            (p, Some((s, r, j))) => format!(
                "{{\"epoch\":{e},\"observation\":{o},\"position\":{p},\"step\":{s},\"rank\":{r},\
                 \"row\":{j}}}\n"
            ),
            (p, None) => {
                format!("{{\"epoch\":{e},\"observation\":{o},\"position\":{p},\"dropped\":true}}\n")
            }
        }
        .into_bytes()
    }

    /// What file `entry` holds (`None` for a directory).
    pub fn content(&self, entry: Entry) -> Option<Content> {
        Some(match entry {
            Entry::Info => Content::Info,
            Entry::Stats => Content::Stats,
            Entry::StepNpy(e, r, s) => Content::Bytes(self.step_npy(e, r, s)),
            Entry::StepJson(e, r, s) => Content::Bytes(self.step_json(e, r, s)),
            Entry::ObservationNpy(o) => Content::Bytes(self.observation_npy(o)),
            Entry::ObservationJson(o) => Content::Bytes(self.observation_json(o)),
            Entry::LookupJson(e, o) => Content::Bytes(self.lookup_json(e, o)),
            _ => return None,
        })
    }

    /// Every entry of directory `dir`, in listing order (before any `--max-listing` bound).
    pub fn children(&self, dir: Entry) -> Vec<(String, Entry)> {
        let numbered = |bound: u64, f: &dyn Fn(u64) -> Entry| -> Vec<(String, Entry)> {
            (0..bound).map(|i| (i.to_string(), f(i))).collect()
        };
        let files = |bound: u64, f: &dyn Fn(u64) -> [Entry; 2]| -> Vec<(String, Entry)> {
            (0..bound)
                .flat_map(|i| {
                    let [npy, json] = f(i);
                    [(format!("{i}.npy"), npy), (format!("{i}.json"), json)]
                })
                .collect()
        };
        let one = |name: &str, e: Entry| vec![(name.to_string(), e)];
        match dir {
            Entry::Root => [
                ("info.json", Entry::Info),
                ("stats.json", Entry::Stats),
                ("epoch", Entry::Epochs),
                ("observation", Entry::Observations),
                ("lookup", Entry::Lookup),
            ]
            .iter()
            .map(|(n, e)| (n.to_string(), *e))
            .collect(),
            Entry::Epochs => numbered(self.epochs, &Entry::Epoch),
            Entry::Epoch(e) => one("rank", Entry::Ranks(e)),
            Entry::Ranks(e) => numbered(self.ranks, &|r| Entry::Rank(e, r)),
            Entry::Rank(e, r) => one("step", Entry::Steps(e, r)),
            Entry::Steps(e, r) => files(self.steps, &|s| {
                [Entry::StepNpy(e, r, s), Entry::StepJson(e, r, s)]
            }),
            Entry::Observations => files(self.n, &|o| {
                [Entry::ObservationNpy(o), Entry::ObservationJson(o)]
            }),
            Entry::Lookup => one("epoch", Entry::LookupEpochs),
            Entry::LookupEpochs => numbered(self.epochs, &Entry::LookupEpoch),
            Entry::LookupEpoch(e) => one("observation", Entry::LookupObservations(e)),
            Entry::LookupObservations(e) => (0..self.n)
                .map(|o| (format!("{o}.json"), Entry::LookupJson(e, o)))
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The names a listing of `dir` shows: the first `max_listing` (0: all).
    pub fn listed(&self, dir: Entry) -> Vec<(String, Entry)> {
        let mut all = self.children(dir);
        if self.max_listing > 0 {
            all.truncate(self.max_listing as usize);
        }
        all
    }

    /// The entry named `name` in directory `dir`: only the canonical spelling of an entry of
    /// the listing (bounded or not) finds it.
    pub fn child(&self, dir: Entry, name: &[u8]) -> Option<Entry> {
        let file = |suffix: &[u8], bound: u64| -> Option<u64> {
            canonical_index(name.strip_suffix(suffix)?, bound)
        };
        let fixed = |want: &str, e: Entry| (name == want.as_bytes()).then_some(e);
        match dir {
            Entry::Root => self
                .children(Entry::Root)
                .into_iter()
                .find(|(n, _)| n.as_bytes() == name)
                .map(|(_, e)| e),
            Entry::Epochs => canonical_index(name, self.epochs).map(Entry::Epoch),
            Entry::Epoch(e) => fixed("rank", Entry::Ranks(e)),
            Entry::Ranks(e) => canonical_index(name, self.ranks).map(|r| Entry::Rank(e, r)),
            Entry::Rank(e, r) => fixed("step", Entry::Steps(e, r)),
            Entry::Steps(e, r) => file(b".npy", self.steps)
                .map(|s| Entry::StepNpy(e, r, s))
                .or_else(|| file(b".json", self.steps).map(|s| Entry::StepJson(e, r, s))),
            Entry::Observations => file(b".npy", self.n)
                .map(Entry::ObservationNpy)
                .or_else(|| file(b".json", self.n).map(Entry::ObservationJson)),
            Entry::Lookup => fixed("epoch", Entry::LookupEpochs),
            Entry::LookupEpochs => canonical_index(name, self.epochs).map(Entry::LookupEpoch),
            Entry::LookupEpoch(e) => fixed("observation", Entry::LookupObservations(e)),
            Entry::LookupObservations(e) => file(b".json", self.n).map(|o| Entry::LookupJson(e, o)),
            _ => None,
        }
    }

    /// The directories whose listings the bound cuts short, with their true name counts.
    pub fn truncated_listings(&self) -> Value {
        let bound = self.max_listing;
        let dirs = [
            ("epoch", self.epochs),
            ("epoch/E/rank", self.ranks),
            ("epoch/E/rank/R/step", 2 * self.steps),
            ("observation", 2 * self.n),
            ("lookup/epoch", self.epochs),
            ("lookup/epoch/E/observation", self.n),
        ];
        Value::Array(
            dirs.iter()
                .filter(|(_, names)| bound > 0 && *names > bound)
                .map(
                    |(dir, names)| serde_json::json!({"dir": dir, "names": names, "listed": bound}),
                )
                .collect(),
        )
    }

    /// Checks `info.json` field by field; on success remembers its fingerprint (which every
    /// `S.json` repeats).
    pub fn check_info(&mut self, bytes: &[u8]) -> Result<(), String> {
        let info: Value = serde_json::from_slice(bytes).map_err(|e| format!("info.json: {e}"))?;
        let header = self.header(&[self.batch, self.window]).len() as u64;
        let want = serde_json::json!({
            "mode": "stream",
            "n_tokens": self.n_tokens(),
            "n_observations": self.n,
            "n_documents": null,
            "window": self.window,
            "stride": self.stride,
            "batch_size": self.batch,
            "ranks": self.ranks,
            "seed": self.seed,
            "epochs": self.epochs,
            "steps_per_epoch": self.steps,
            "global_batch": self.g,
            "dropped_per_epoch": self.n % self.g,
            "dtype": self.descr,
            "itemsize": self.itemsize,
            "step_shape": [self.batch, self.window],
            "step_file_bytes": header + self.batch * self.window * self.itemsize,
            "npy_header_bytes": header,
            "shards": self.shards,
            "content_hash": self.content_hash,
            "format_version": self.format_version,
            "max_listing": self.max_listing,
            "truncated_listings": self.truncated_listings(),
        });
        for (key, value) in want.as_object().unwrap() {
            if &info[key] != value {
                return Err(format!("info.json: {key} is {}, not {value}", info[key]));
            }
        }
        for key in ["fingerprint", "layout_fingerprint"] {
            let fp = info[key].as_str().unwrap_or_default();
            if fp.len() != 16 || !fp.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!("info.json: {key} {fp:?} is not 16 hex digits"));
            }
        }
        self.fingerprint = info["fingerprint"].as_str().unwrap().to_string();
        Ok(())
    }
}

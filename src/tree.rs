//! The tree's names: the only place the path grammar is spelled.
//!
//! ```text
//! /                                    dir
//! /info.json                           file   the mount's parameters and fingerprint
//! /stats.json                          file   cache and prefetch counters (changes)
//! /epoch/                              dir    0 .. epochs-1
//! /epoch/E/                            dir    rank
//! /epoch/E/rank/                       dir    0 .. ranks-1
//! /epoch/E/rank/R/                     dir    step
//! /epoch/E/rank/R/step/                dir    0.npy 0.json 1.npy 1.json ... (steps_per_epoch pairs;
//!                                             with documents also 0.pos.npy 0.doclens.npy ...)
//! /observation/                        dir    0.npy 0.json ... (n_observations pairs): unshuffled
//! /lookup/epoch/E/observation/I.json   file   where observation I is trained in epoch E
//! /val/rank/R/step/S.npy, S.json       file   a mixture's held-out rows ([split]), in order
//! ```
//!
//! A mount of several plans (a run configuration's `[[plan]]` tables) has a top level of its
//! own ([`Top`]), and each plan's whole tree above under `plan/NAME/`:
//!
//! ```text
//! /info.json                           file   the plans, their directories and fingerprints
//! /stats.json                          file   the shared step cache's counters (changes)
//! /plan/NAME/                          dir    plan NAME's root: info.json, epoch/, val/ ...
//! ```
//!
//! Names have exactly one spelling: canonical decimals (`7`, never `07` or `+7`) below their
//! bound, and exact suffixes. Everything else is `ENOENT` ([`Shape::child`]). A directory is
//! listed in the order above ([`Shape::entry`]); the numbered directories can be long, and a
//! listing shows at most `--max-listing` names ([`DEFAULT_MAX_LISTING`]; every name stays
//! reachable by its path).

use crate::error::{Error, Result};
use crate::shuffle::plan::{Plan, StepKey};

/// Most names a directory listing shows by default (`--max-listing`).
pub const DEFAULT_MAX_LISTING: u64 = 10_000;

/// A node of the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    /// `/`
    Root,
    /// `/info.json`
    Info,
    /// `/stats.json` (cache and prefetch counters; changes while mounted)
    Stats,
    /// `/epoch`
    EpochList,
    /// `/epoch/E`
    Epoch(u64),
    /// `/epoch/E/rank`
    RankList(u64),
    /// `/epoch/E/rank/R`
    Rank(u64, u64),
    /// `/epoch/E/rank/R/step`
    StepList(u64, u64),
    /// `/epoch/E/rank/R/step/S.npy`
    StepNpy(StepKey),
    /// `/epoch/E/rank/R/step/S.json`
    StepJson(StepKey),
    /// `/epoch/E/rank/R/step/S.pos.npy` (datasets with documents): each token's position in
    /// its document
    StepPos(StepKey),
    /// `/epoch/E/rank/R/step/S.doclens.npy` (datasets with documents): each row's document
    /// lengths
    StepDocLens(StepKey),
    /// `/observation`
    ObservationList,
    /// `/observation/I.npy`
    ObservationNpy(u64),
    /// `/observation/I.json`
    ObservationJson(u64),
    /// `/lookup`
    Lookup,
    /// `/lookup/epoch`
    LookupEpochList,
    /// `/lookup/epoch/E`
    LookupEpoch(u64),
    /// `/lookup/epoch/E/observation`
    LookupObservationList(u64),
    /// `/lookup/epoch/E/observation/I.json`
    LookupJson(u64, u64),
    /// `/val` (a mixture with a held-out split)
    Val,
    /// `/val/rank`
    ValRankList,
    /// `/val/rank/R`
    ValRank(u64),
    /// `/val/rank/R/step`
    ValStepList(u64),
    /// `/val/rank/R/step/S.npy`
    ValStepNpy(u64, u64),
    /// `/val/rank/R/step/S.json`
    ValStepJson(u64, u64),
}

/// A node of the top level of a mount of several plans.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Top {
    /// `/`
    Root,
    /// `/info.json`: the plans
    Info,
    /// `/stats.json`: the shared cache's counters (changes while mounted)
    Stats,
    /// `/plan`: one directory per plan, its root
    Plans,
}

/// The names of a multi-plan mount's root, in listing order.
pub(crate) const TOP_NAMES: [(Top, &str); 3] = [
    (Top::Info, "info.json"),
    (Top::Stats, "stats.json"),
    (Top::Plans, "plan"),
];

impl Top {
    /// Every top node, in inode order (from [`crate::inode::ROOT_INO`]).
    pub(crate) const ALL: [Top; 4] = [Top::Root, Top::Info, Top::Stats, Top::Plans];

    /// File or directory.
    pub(crate) fn kind(self) -> Kind {
        match self {
            Top::Info | Top::Stats => Kind::File,
            Top::Root | Top::Plans => Kind::Directory,
        }
    }

    /// The node named `name` in the top root.
    pub(crate) fn child_of_root(name: &[u8]) -> Result<Top> {
        TOP_NAMES
            .iter()
            .find(|(_, n)| n.as_bytes() == name)
            .map(|(t, _)| *t)
            .ok_or(Error::NotFound)
    }
}

/// File or directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Directory,
    /// A regular file.
    File,
}

impl Node {
    /// Whether this node is a directory.
    pub(crate) fn kind(self) -> Kind {
        match self {
            Node::Info
            | Node::Stats
            | Node::StepNpy(_)
            | Node::StepJson(_)
            | Node::StepPos(_)
            | Node::StepDocLens(_)
            | Node::ObservationNpy(_)
            | Node::ObservationJson(_)
            | Node::LookupJson(..)
            | Node::ValStepNpy(..)
            | Node::ValStepJson(..) => Kind::File,
            Node::Root
            | Node::EpochList
            | Node::Epoch(_)
            | Node::RankList(_)
            | Node::Rank(..)
            | Node::StepList(..)
            | Node::ObservationList
            | Node::Lookup
            | Node::LookupEpochList
            | Node::LookupEpoch(_)
            | Node::LookupObservationList(_)
            | Node::Val
            | Node::ValRankList
            | Node::ValRank(_)
            | Node::ValStepList(_) => Kind::Directory,
        }
    }

    /// Whether the content changes while mounted (no attribute caching; no page cache, or with
    /// `--prefill` a changing mtime so the kernel drops old pages).
    pub(crate) fn is_volatile(self) -> bool {
        self == Node::Stats
    }

    /// The directory that holds this node (the root holds itself).
    pub(crate) fn parent(self) -> Node {
        match self {
            Node::Root
            | Node::Info
            | Node::Stats
            | Node::EpochList
            | Node::ObservationList
            | Node::Lookup
            | Node::Val => Node::Root,
            Node::Epoch(_) => Node::EpochList,
            Node::RankList(e) => Node::Epoch(e),
            Node::Rank(e, _) => Node::RankList(e),
            Node::StepList(e, r) => Node::Rank(e, r),
            Node::StepNpy(k) | Node::StepJson(k) | Node::StepPos(k) | Node::StepDocLens(k) => {
                Node::StepList(k.epoch, k.rank)
            }
            Node::ObservationNpy(_) | Node::ObservationJson(_) => Node::ObservationList,
            Node::LookupEpochList => Node::Lookup,
            Node::LookupEpoch(_) => Node::LookupEpochList,
            Node::LookupObservationList(e) => Node::LookupEpoch(e),
            Node::LookupJson(e, _) => Node::LookupObservationList(e),
            Node::ValRankList => Node::Val,
            Node::ValRank(_) => Node::ValRankList,
            Node::ValStepList(r) => Node::ValRank(r),
            Node::ValStepNpy(r, _) | Node::ValStepJson(r, _) => Node::ValStepList(r),
        }
    }
}

/// The names of the root directory, in listing order.
const ROOT_NAMES: [(Node, &str); 6] = [
    (Node::Info, "info.json"),
    (Node::Stats, "stats.json"),
    (Node::EpochList, "epoch"),
    (Node::ObservationList, "observation"),
    (Node::Lookup, "lookup"),
    (Node::Val, "val"),
];

/// The name of a file or directory of the mount's root (`info.json`, `stats.json`, ...).
pub(crate) fn root_name(node: Node) -> Option<&'static str> {
    ROOT_NAMES
        .iter()
        .find(|(n, _)| *n == node)
        .map(|(_, name)| *name)
}

/// The path of step `key`'s `.npy` (or, with `json`, `.json`) file inside the mount.
pub(crate) fn step_path(key: StepKey, json: bool) -> String {
    let ext = if json { "json" } else { "npy" };
    format!(
        "epoch/{}/rank/{}/step/{}.{ext}",
        key.epoch, key.rank, key.step
    )
}

/// How many of each numbered name the tree holds: a plan's epochs, ranks, steps per epoch and
/// observations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Epochs exposed.
    pub(crate) epochs: u64,
    /// Ranks.
    pub(crate) ranks: u64,
    /// Steps per epoch.
    pub(crate) steps: u64,
    /// Observations.
    pub(crate) observations: u64,
    /// Whether each step also has `S.pos.npy` and `S.doclens.npy` (datasets with documents).
    pub(crate) masks: bool,
    /// Steps of each rank under `/val` (0: no `/val`).
    pub(crate) val_steps: u64,
}

impl Shape {
    /// The tree of `plan`.
    pub(crate) fn of(plan: &Plan) -> Shape {
        Shape {
            epochs: plan.epochs(),
            ranks: plan.ranks(),
            steps: plan.steps_per_epoch(),
            observations: plan.n_observations(),
            masks: false,
            val_steps: 0,
        }
    }

    /// The names of the root, in listing order: `val` only with held-out steps.
    fn root_names(&self) -> &'static [(Node, &'static str)] {
        if self.val_steps > 0 {
            &ROOT_NAMES
        } else {
            &ROOT_NAMES[..5]
        }
    }

    /// Files per step: `S.npy`, `S.json`, and with masks `S.pos.npy`, `S.doclens.npy`.
    pub(crate) fn files_per_step(&self) -> u64 {
        if self.masks { 4 } else { 2 }
    }

    /// The node named `name` in directory `parent`: `NotADirectory` under a file, `NotFound`
    /// for any name not spelled as the grammar says.
    pub(crate) fn child(&self, parent: Node, name: &[u8]) -> Result<Node> {
        if parent.kind() == Kind::File {
            return Err(Error::NotADirectory);
        }
        let found = match parent {
            Node::Root => self
                .root_names()
                .iter()
                .find(|(_, n)| n.as_bytes() == name)
                .map(|(node, _)| *node),
            Node::Val => (name == b"rank").then_some(Node::ValRankList),
            Node::ValRankList => parse_index(name, self.ranks).map(Node::ValRank),
            Node::ValRank(r) => (name == b"step").then_some(Node::ValStepList(r)),
            Node::ValStepList(r) => parse_file(name, self.val_steps, b".npy")
                .map(|s| Node::ValStepNpy(r, s))
                .or_else(|| {
                    parse_file(name, self.val_steps, b".json").map(|s| Node::ValStepJson(r, s))
                }),
            Node::EpochList => parse_index(name, self.epochs).map(Node::Epoch),
            Node::Epoch(e) => (name == b"rank").then_some(Node::RankList(e)),
            Node::RankList(e) => parse_index(name, self.ranks).map(|r| Node::Rank(e, r)),
            Node::Rank(e, r) => (name == b"step").then_some(Node::StepList(e, r)),
            Node::StepList(epoch, rank) => {
                let key = |step| StepKey { epoch, rank, step };
                let mask = |suffix: &[u8], node: fn(StepKey) -> Node| {
                    self.masks
                        .then(|| parse_file(name, self.steps, suffix).map(|s| node(key(s))))
                        .flatten()
                };
                parse_file(name, self.steps, b".npy")
                    .map(|s| Node::StepNpy(key(s)))
                    .or_else(|| {
                        parse_file(name, self.steps, b".json").map(|s| Node::StepJson(key(s)))
                    })
                    .or_else(|| mask(b".pos.npy", Node::StepPos))
                    .or_else(|| mask(b".doclens.npy", Node::StepDocLens))
            }
            Node::ObservationList => parse_file(name, self.observations, b".npy")
                .map(Node::ObservationNpy)
                .or_else(|| {
                    parse_file(name, self.observations, b".json").map(Node::ObservationJson)
                }),
            Node::Lookup => (name == b"epoch").then_some(Node::LookupEpochList),
            Node::LookupEpochList => parse_index(name, self.epochs).map(Node::LookupEpoch),
            Node::LookupEpoch(e) => {
                (name == b"observation").then_some(Node::LookupObservationList(e))
            }
            Node::LookupObservationList(e) => {
                parse_file(name, self.observations, b".json").map(|o| Node::LookupJson(e, o))
            }
            // Files (checked above) have no children.
            _ => None,
        };
        found.ok_or(Error::NotFound)
    }

    /// Number of entries of directory `node`, `.` and `..` included.
    pub(crate) fn dir_len(&self, node: Node) -> u64 {
        2 + match node {
            Node::Root => self.root_names().len() as u64,
            Node::Val | Node::ValRank(_) => 1,
            Node::ValRankList => self.ranks,
            Node::ValStepList(_) => 2 * self.val_steps,
            Node::EpochList | Node::LookupEpochList => self.epochs,
            Node::Epoch(_) | Node::Rank(..) | Node::Lookup | Node::LookupEpoch(_) => 1,
            Node::RankList(_) => self.ranks,
            Node::StepList(..) => self.files_per_step() * self.steps,
            Node::ObservationList => 2 * self.observations,
            Node::LookupObservationList(_) => self.observations,
            _ => 0, // files
        }
    }

    /// Entry `index` (0-based, after `.` and `..`) of directory `node`, and its name.
    pub(crate) fn entry(&self, node: Node, index: u64) -> (Node, String) {
        let pair = |index: u64, npy: Node, json: Node, stem: u64| {
            if index.is_multiple_of(2) {
                (npy, format!("{stem}.npy"))
            } else {
                (json, format!("{stem}.json"))
            }
        };
        match node {
            Node::Root => {
                let (node, name) = self.root_names()[index as usize];
                (node, name.to_string())
            }
            Node::Val => (Node::ValRankList, "rank".to_string()),
            Node::ValRankList => (Node::ValRank(index), index.to_string()),
            Node::ValRank(r) => (Node::ValStepList(r), "step".to_string()),
            Node::ValStepList(r) => {
                let s = index / 2;
                pair(index, Node::ValStepNpy(r, s), Node::ValStepJson(r, s), s)
            }
            Node::EpochList => (Node::Epoch(index), index.to_string()),
            Node::Epoch(e) => (Node::RankList(e), "rank".to_string()),
            Node::RankList(e) => (Node::Rank(e, index), index.to_string()),
            Node::Rank(e, r) => (Node::StepList(e, r), "step".to_string()),
            Node::StepList(epoch, rank) => {
                let per = self.files_per_step();
                let key = StepKey {
                    epoch,
                    rank,
                    step: index / per,
                };
                match index % per {
                    2 => (Node::StepPos(key), format!("{}.pos.npy", key.step)),
                    3 => (Node::StepDocLens(key), format!("{}.doclens.npy", key.step)),
                    i => pair(i, Node::StepNpy(key), Node::StepJson(key), key.step),
                }
            }
            Node::ObservationList => {
                let o = index / 2;
                pair(index, Node::ObservationNpy(o), Node::ObservationJson(o), o)
            }
            Node::Lookup => (Node::LookupEpochList, "epoch".to_string()),
            Node::LookupEpochList => (Node::LookupEpoch(index), index.to_string()),
            Node::LookupEpoch(e) => (Node::LookupObservationList(e), "observation".to_string()),
            Node::LookupObservationList(e) => (Node::LookupJson(e, index), format!("{index}.json")),
            _ => unreachable!("files have no entries (readdir checks opendir)"),
        }
    }
}

/// The directories whose number of names grows with the plan, as path patterns, with that
/// number (every other directory holds one to five names). `info.json` reports those a
/// bounded listing cuts short.
pub(crate) fn listing_sizes(shape: &Shape) -> [(&'static str, u64); 6] {
    let (epochs, observations) = (shape.epochs, shape.observations);
    [
        ("epoch", epochs),
        ("epoch/E/rank", shape.ranks),
        (
            "epoch/E/rank/R/step",
            shape.steps.saturating_mul(shape.files_per_step()),
        ),
        ("observation", observations.saturating_mul(2)),
        ("lookup/epoch", epochs),
        ("lookup/epoch/E/observation", observations),
    ]
}

/// Splits `name` into a canonical index below `bound` and the suffix.
fn parse_file(name: &[u8], bound: u64, suffix: &[u8]) -> Option<u64> {
    name.strip_suffix(suffix)
        .and_then(|stem| parse_index(stem, bound))
}

/// Parses a canonical decimal below `bound`: ASCII digits only, no sign, no leading zero
/// (except `0` itself), no overflow.
fn parse_index(name: &[u8], bound: u64) -> Option<u64> {
    if name.is_empty() || name.len() > 20 || (name.len() > 1 && name[0] == b'0') {
        return None;
    }
    let mut v: u64 = 0;
    for &b in name {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    (v < bound).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_indices_only() {
        assert_eq!(parse_index(b"0", 10), Some(0));
        assert_eq!(parse_index(b"9", 10), Some(9));
        assert_eq!(parse_index(b"10", 10), None);
        for bad in [
            &b""[..],
            b"00",
            b"07",
            b"+7",
            b"-0",
            b" 7",
            b"7 ",
            b"0x7",
            b"7.0",
            b"\xd9\xa3", // Arabic-Indic digit three
            b"18446744073709551616",
            b"99999999999999999999999",
        ] {
            assert_eq!(parse_index(bad, u64::MAX), None, "{bad:?}");
        }
        assert_eq!(
            parse_index(b"18446744073709551614", u64::MAX),
            Some(u64::MAX - 1)
        );
        assert_eq!(parse_index(b"18446744073709551615", u64::MAX), None);
    }

    #[test]
    fn every_listed_name_resolves_to_its_node() {
        let shape = Shape {
            epochs: 2,
            ranks: 3,
            steps: 4,
            observations: 5,
            masks: true,
            val_steps: 0,
        };
        let mut dirs = vec![Node::Root];
        let mut seen = 0;
        while let Some(dir) = dirs.pop() {
            for i in 0..shape.dir_len(dir) - 2 {
                let (node, name) = shape.entry(dir, i);
                assert_eq!(shape.child(dir, name.as_bytes()).unwrap(), node, "{name}");
                assert_eq!(node.parent(), dir);
                if node.kind() == Kind::Directory {
                    dirs.push(node);
                }
                seen += 1;
            }
        }
        // Files: step files (npy, json, pos, doclens), observations, lookups, info and stats;
        // directories but the root.
        let files = 2 * 3 * 4 * 4 + 5 * 2 + 2 * 5 + 2;
        let dirs = 3 + 2 * (2 + 3 * 2) + 1 + 2 * 2;
        assert_eq!(seen, files + dirs);
        assert_eq!(
            step_path(
                StepKey {
                    epoch: 1,
                    rank: 2,
                    step: 3
                },
                false
            ),
            "epoch/1/rank/2/step/3.npy"
        );
    }
}

//! The filesystem, free of FUSE: one method per request (lookup, getattr, readdir, open,
//! access, read), each returning a plain value or an [`Error`] the adapter turns into an errno.
//! The tree's names are `tree.rs`'s, the inode numbers `inode.rs`'s, the bytes `view/`'s;
//! every modification is `EROFS`.
//!
//! A request whose answer may block on shard or document files does not run it here: the
//! adapter's methods (`ShuffleFs::read_or_job`, `ShuffleFs::attr_or_job`) answer at once
//! from memory (a cached step file, `info.json`, `stats.json`, a cached JSON file, most
//! attributes) or hand out the work as a value, a [`ReadJob`] or an [`AttrJob`], which the
//! adapter runs where blocking is allowed (`fuse/dispatch.rs`: inline, or on the deadline
//! pool). [`ShuffleFs::read`], [`ShuffleFs::getattr`] and [`ShuffleFs::lookup`] do both at
//! once, for tests and tools.
//!
//! A mount serves one plan, or several (a run configuration's `[[plan]]` tables) side by
//! side under `plan/NAME/` with a small top level of their own ([`Top`]), sharing the
//! datasets (opened once) and one step cache. Each plan is a [`PlanFs`] (`plan.rs`) speaking
//! its own [`Node`]s and numbering; [`ShuffleFs`] routes: a node is a [`Loc`], and plan `k`'s
//! inode `i` is the mount's `bases[k] + i - 1` (one plan: the same number).
//!
//! `read.rs` has the reads: the step cache and the prefetcher on a step file's miss, and the
//! JSON cache.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use crate::cache::StepCache;
use crate::error::{Error, Result};
use crate::prefetch::{PrefetchConfig, Prefetcher};
use crate::shuffle::plan::StepKey;
use crate::tree::TOP_NAMES;
use crate::view::View;

mod plan;
mod read;

use plan::PlanFs;
pub use read::{AttrJob, Bytes, Read, ReadJob, Stat};

// Also at the paths tests/it still name (until they use the crate root).
pub use crate::inode::ROOT_INO;
pub use crate::tree::{DEFAULT_MAX_LISTING, Kind, Node, Top};

/// Permission bits of files.
pub(crate) const FILE_PERM: u16 = 0o444;
/// Permission bits of directories.
pub(crate) const DIR_PERM: u16 = 0o555;

/// Who owns the files and their permission bits (the kernel enforces them: shufflefs always
/// mounts with `default_permissions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ownership {
    /// Owner of every file and directory.
    pub uid: u32,
    /// Group of every file and directory.
    pub gid: u32,
    /// Permission bits of files (write bits are refused: the tree is read-only).
    pub file_mode: u16,
    /// Permission bits of directories.
    pub dir_mode: u16,
}

impl Ownership {
    /// The calling process's user and group, files 0444 and directories 0555.
    pub(crate) fn current() -> Ownership {
        Ownership {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            file_mode: FILE_PERM,
            dir_mode: DIR_PERM,
        }
    }
}

/// Attributes of a node, in FUSE-independent form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// File or directory.
    pub kind: Kind,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// Permission bits.
    pub perm: u16,
    /// Link count.
    pub nlink: u32,
    /// The content changes while mounted: the kernel must not cache attributes or data.
    pub volatile: bool,
}

/// One directory entry produced by [`ShuffleFs::readdir`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Inode of the entry.
    pub ino: u64,
    /// The offset to resume listing after this entry.
    pub next_offset: u64,
    /// File or directory.
    pub kind: Kind,
    /// The entry's name.
    pub name: String,
}

/// Receives directory entries; returns `true` when it is full (FUSE's reply buffer).
pub trait DirSink {
    /// Adds one entry; `true` means "full, stop".
    fn add(&mut self, entry: DirEntry) -> bool;
}

impl DirSink for Vec<DirEntry> {
    fn add(&mut self, entry: DirEntry) -> bool {
        self.push(entry);
        false
    }
}

/// Where a node is: the top level of a mount of several plans, or plan `k`'s node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Loc {
    /// The top level of a mount of several plans.
    Top(Top),
    /// A node of plan `k` (the only plan, 0, of a mount of one).
    Plan(u32, Node),
}

impl Loc {
    /// File or directory.
    pub(crate) fn kind(self) -> Kind {
        match self {
            Loc::Top(t) => t.kind(),
            Loc::Plan(_, node) => node.kind(),
        }
    }

    /// Whether the content changes while mounted (a `stats.json`).
    pub(crate) fn is_volatile(self) -> bool {
        match self {
            Loc::Top(t) => t == Top::Stats,
            Loc::Plan(_, node) => node.is_volatile(),
        }
    }
}

/// The filesystem: one plan (a [`View`] and the tree around it), or several side by side.
#[derive(Debug)]
pub struct ShuffleFs {
    /// The plans, in the order configured (one for a mount of one).
    plans: Vec<PlanFs>,
    /// Several plans: their names, inode bases and the top `info.json`.
    named: Option<Named>,
    /// The step cache the plans share (for `stats.json`; each plan has its own handle).
    cache: Option<Arc<StepCache>>,
    /// `stats.json` has a fixed size (`--prefill`; see [`ShuffleFs::with_padded_stats`]).
    padded_stats: bool,
}

/// The top level of a mount of several plans.
#[derive(Debug)]
struct Named {
    /// Each plan's name (its directory under `plan/`).
    names: Vec<String>,
    /// `bases[k]`: the mount's inode number of plan `k`'s root.
    bases: Vec<u64>,
    /// The top `info.json`.
    info_json: Vec<u8>,
}

/// The top `info.json` of a mount of several plans.
#[derive(Serialize)]
struct PlansInfo<'a> {
    /// The run configuration file.
    config: String,
    /// Distinct dataset directories the plans read (each opened once).
    datasets: usize,
    plans: Vec<PlanInfo<'a>>,
}

/// One plan in the top `info.json`.
#[derive(Serialize)]
struct PlanInfo<'a> {
    name: &'a str,
    /// Its tree, relative to the mount point.
    path: String,
    fingerprint: &'a str,
    layout_fingerprint: &'a str,
    steps_per_epoch: u64,
    ranks: u64,
    epochs: u64,
    global_batch: u64,
}

/// Most step files the step cache holds, whatever the budget (its map is allocated up front).
const MAX_CACHE_ENTRIES: u64 = 1 << 16;

impl ShuffleFs {
    /// Wraps a view: a mount of one plan.
    pub fn new(view: View) -> Result<ShuffleFs> {
        Ok(ShuffleFs {
            plans: vec![PlanFs::new(view)?],
            named: None,
            cache: None,
            padded_stats: false,
        })
    }

    /// Several plans side by side (`[[plan]]` tables of the run configuration `config`), each
    /// `(name, view)` served under `plan/NAME/`; `datasets` is how many dataset directories
    /// their views share (`info.json`).
    pub fn with_plans(config: &Path, plans: Vec<(String, View)>, datasets: usize) -> Result<Self> {
        if plans.is_empty() {
            return Err(Error::invalid(format!("{}: no plan", config.display())));
        }
        let mut names = Vec::with_capacity(plans.len());
        let mut fss = Vec::with_capacity(plans.len());
        let mut bases = Vec::with_capacity(plans.len());
        let mut next = ROOT_INO + Top::ALL.len() as u64;
        for (name, view) in plans {
            let fs = PlanFs::new(view)?;
            bases.push(next);
            next = next.checked_add(fs.inodes.len()).ok_or_else(|| {
                Error::invalid(format!(
                    "{}: the plans have too many files to number together; lower their epochs",
                    config.display()
                ))
            })?;
            names.push(name);
            fss.push(fs);
        }
        let info = PlansInfo {
            config: config.display().to_string(),
            datasets,
            plans: names
                .iter()
                .zip(&fss)
                .map(|(name, fs)| {
                    let i = fs.view.info();
                    PlanInfo {
                        name,
                        path: format!("plan/{name}"),
                        fingerprint: &i.fingerprint,
                        layout_fingerprint: &i.layout_fingerprint,
                        steps_per_epoch: i.steps_per_epoch,
                        ranks: i.ranks,
                        epochs: i.epochs,
                        global_batch: i.global_batch,
                    }
                })
                .collect(),
        };
        let mut info_json = serde_json::to_vec_pretty(&info).expect("plans serialize");
        info_json.push(b'\n');
        Ok(ShuffleFs {
            plans: fss,
            named: Some(Named {
                names,
                bases,
                info_json,
            }),
            cache: None,
            padded_stats: false,
        })
    }

    /// Adds a step cache of `budget` bytes, shared by the plans, and a prefetcher per plan.
    /// Step files larger than half the budget are not cached (their reads go to the shards
    /// range by range); nor are the step files of a plan whose schedule changes the batch size.
    pub fn with_cache(mut self, budget: u64, prefetch: PrefetchConfig) -> ShuffleFs {
        let name = |k: usize| {
            self.named
                .as_ref()
                .map_or(String::new(), |n| format!(" (plan {:?})", n.names[k]))
        };
        let mut lens: Vec<Option<u64>> = Vec::with_capacity(self.plans.len());
        for (k, p) in self.plans.iter().enumerate() {
            let step = p.view.step_npy_len().max(1);
            lens.push(if p.view.variable_step_sizes() {
                // The cache recycles buffers of one size per plan.
                log::info!(
                    "the schedule changes the batch size{}: step cache and prefetch off",
                    name(k)
                );
                None
            } else if budget / step < 2 {
                log::info!(
                    "step files of {step} bytes{} do not fit a {budget}-byte cache twice: \
                     cache off",
                    name(k)
                );
                None
            } else {
                Some(step)
            });
        }
        let Some(step) = lens.iter().flatten().copied().max() else {
            return self;
        };
        // The LRU counts entries: size them for the largest step file cached, and bound the
        // count for tiny step files (the map is allocated up front).
        let entries = (budget / step).min(MAX_CACHE_ENTRIES) as usize;
        let store = StepCache::new(entries, step as usize);
        for (k, (p, len)) in self.plans.iter_mut().zip(lens).enumerate() {
            if let Some(len) = len {
                p.use_cache(store.for_plan(k as u32, len as usize), prefetch);
            }
        }
        self.cache = Some(Arc::new(store));
        self
    }

    /// Benchmarking only: answers every step read with step 0 of epoch 0, rank 0, from
    /// memory, so a benchmark measures the FUSE transport alone. Serves wrong data.
    pub(crate) fn with_stub_reads(mut self) -> Result<ShuffleFs> {
        let key = StepKey {
            epoch: 0,
            rank: 0,
            step: 0,
        };
        for p in &mut self.plans {
            p.stub = Some(p.view.render_step_npy(key)?.into());
        }
        Ok(self)
    }

    /// Gives every `stats.json` a fixed size (`--prefill`; see `stats.rs`).
    pub(crate) fn with_padded_stats(mut self) -> ShuffleFs {
        self.padded_stats = true;
        for p in &mut self.plans {
            p.padded_stats = true;
        }
        self
    }

    /// The step cache, if enabled (shared by the plans).
    /// Step files are handed to the kernel as memory files from now on (FUSE passthrough):
    /// the step cache keeps its steps in them, and `stats.json` shows `counters`.
    pub(crate) fn serve_by_passthrough(&self, counters: Arc<crate::stats::Passthrough>) {
        if let Some(c) = &self.cache {
            c.use_memfds();
        }
        for p in &self.plans {
            let _ = p.passthrough.set(counters.clone());
        }
    }

    pub fn cache(&self) -> Option<&StepCache> {
        self.cache.as_deref()
    }

    /// The prefetcher of the first plan, if enabled.
    pub fn prefetcher(&self) -> Option<&Prefetcher> {
        self.plans[0].prefetcher.as_ref()
    }

    /// Every plan's prefetcher, in plan order (`None`: that plan has none).
    pub fn prefetchers(&self) -> impl Iterator<Item = Option<&Prefetcher>> {
        self.plans.iter().map(|p| p.prefetcher.as_ref())
    }

    /// The bytes of `stats.json` of `loc`'s plan (or of the top level) now (see `stats.rs`).
    pub(crate) fn stats_json(&self, loc: Loc) -> Vec<u8> {
        match loc {
            Loc::Plan(k, _) => self.plans[k as usize].stats_json(),
            Loc::Top(_) => {
                let prefetchers: Vec<&Prefetcher> = self
                    .plans
                    .iter()
                    .filter_map(|p| p.prefetcher.as_ref())
                    .collect();
                crate::stats::render(
                    self.cache(),
                    &prefetchers,
                    self.plans
                        .first()
                        .and_then(|p| p.passthrough.get().map(|c| &**c)),
                    self.padded_stats,
                )
            }
        }
    }

    /// The view of the first plan (the only one of a mount of one).
    pub fn view(&self) -> &View {
        &self.plans[0].view
    }

    /// The plans' names and views (a mount of one: one, unnamed).
    pub fn plans(&self) -> impl Iterator<Item = (Option<&str>, &View)> {
        self.plans.iter().enumerate().map(|(k, p)| {
            let name = self.named.as_ref().map(|n| n.names[k].as_str());
            (name, &*p.view)
        })
    }

    /// The first plan's inode numbering (the mount's, for a mount of one).
    pub(crate) fn inodes(&self) -> &crate::inode::Inodes {
        &self.plans[0].inodes
    }

    /// Plan `k`.
    fn plan(&self, k: u32) -> &PlanFs {
        &self.plans[k as usize]
    }

    /// The inode number of `loc`.
    pub(crate) fn ino(&self, loc: Loc) -> u64 {
        match (loc, &self.named) {
            (Loc::Top(t), _) => {
                ROOT_INO + Top::ALL.iter().position(|&x| x == t).expect("a top node") as u64
            }
            (Loc::Plan(k, node), None) => self.plan(k).inodes.ino(node),
            (Loc::Plan(k, node), Some(named)) => {
                named.bases[k as usize] + self.plan(k).inodes.ino(node) - ROOT_INO
            }
        }
    }

    /// The node of inode `ino`, if it exists.
    pub fn node(&self, ino: u64) -> Result<Loc> {
        let Some(named) = &self.named else {
            let node = self.plans[0].inodes.node(ino).ok_or(Error::NotFound)?;
            return Ok(Loc::Plan(0, node));
        };
        if let Some(i) = ino.checked_sub(ROOT_INO)
            && let Some(&t) = Top::ALL.get(i as usize)
        {
            return Ok(Loc::Top(t));
        }
        let k = named
            .bases
            .partition_point(|&b| b <= ino)
            .checked_sub(1)
            .ok_or(Error::NotFound)?;
        let local = ino - named.bases[k] + ROOT_INO;
        let node = self.plans[k].inodes.node(local).ok_or(Error::NotFound)?;
        Ok(Loc::Plan(k as u32, node))
    }

    /// The directory that holds `loc` (the root holds itself).
    fn parent(&self, loc: Loc) -> Loc {
        match loc {
            Loc::Top(_) => Loc::Top(Top::Root),
            Loc::Plan(_, Node::Root) if self.named.is_some() => Loc::Top(Top::Plans),
            Loc::Plan(k, node) => Loc::Plan(k, node.parent()),
        }
    }

    /// Resolves `name` inside directory `parent`, and its attributes (which may read document
    /// files: the blocking form of `ShuffleFs::lookup_node` and `ShuffleFs::attr_or_job`).
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr> {
        self.stat(self.lookup_node(parent, name)?)
    }

    /// Attributes of inode `ino` (the blocking form of `ShuffleFs::attr_or_job`).
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.stat(self.node(ino)?)
    }

    /// The attributes of `loc`, running the job here when there is one.
    fn stat(&self, loc: Loc) -> Result<Attr> {
        match self.attr_or_job(loc)? {
            Stat::Ready(attr) => Ok(attr),
            Stat::Job(job) => job.run(self),
        }
    }

    /// The node named `name` in directory `parent`.
    pub(crate) fn lookup_node(&self, parent: u64, name: &OsStr) -> Result<Loc> {
        let name = name.as_bytes();
        match self.node(parent)? {
            Loc::Top(Top::Root) => Top::child_of_root(name).map(Loc::Top),
            Loc::Top(Top::Plans) => {
                let names = &self.named.as_ref().expect("a top level").names;
                let k = names
                    .iter()
                    .position(|n| n.as_bytes() == name)
                    .ok_or(Error::NotFound)?;
                Ok(Loc::Plan(k as u32, Node::Root))
            }
            Loc::Top(_) => Err(Error::NotADirectory),
            Loc::Plan(k, node) => {
                let child = self.plan(k).shape.child(node, name)?;
                Ok(Loc::Plan(k, child))
            }
        }
    }

    /// Whether inode `ino` exists (no work beyond decoding the number).
    pub(crate) fn exists(&self, ino: u64) -> Result<()> {
        self.node(ino).map(|_| ())
    }

    /// Checks that `ino` can be opened with the `open(2)` flags `flags`: files only, and
    /// nothing that writes (write access, `O_TRUNC`, `O_APPEND`, `O_CREAT`).
    pub fn open(&self, ino: u64, flags: i32) -> Result<Loc> {
        let loc = self.node(ino)?;
        if loc.kind() == Kind::Directory {
            return Err(Error::IsADirectory);
        }
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY
            || flags & (libc::O_TRUNC | libc::O_APPEND | libc::O_CREAT) != 0;
        if writes {
            return Err(Error::ReadOnly);
        }
        Ok(loc)
    }

    /// `access(2)` on `ino` with `mask` (`R_OK`, `W_OK`, `X_OK` bits): write is `EROFS`,
    /// execute on a file is `EACCES`, read and lookup are allowed.
    pub fn access(&self, ino: u64, mask: i32) -> Result<()> {
        let loc = self.node(ino)?;
        if mask & libc::W_OK != 0 {
            return Err(Error::ReadOnly);
        }
        if mask & libc::X_OK != 0 && loc.kind() == Kind::File {
            return Err(Error::PermissionDenied);
        }
        Ok(())
    }

    /// Checks that `ino` is a directory.
    pub(crate) fn opendir(&self, ino: u64) -> Result<Loc> {
        let loc = self.node(ino)?;
        if loc.kind() != Kind::Directory {
            return Err(Error::NotADirectory);
        }
        Ok(loc)
    }

    /// Lists directory `ino` from `offset` (0 = start; every entry carries the offset to
    /// resume after it) until `sink` is full. O(1) memory and O(1) work per entry, whatever
    /// the directory size. A bounded listing (`--max-listing N`, N > 0) shows `.`, `..` and
    /// the first N names in listing order; every name beyond them is still found by
    /// [`ShuffleFs::lookup`].
    pub fn readdir(&self, ino: u64, offset: u64, sink: &mut impl DirSink) -> Result<()> {
        let loc = self.opendir(ino)?;
        let (mut len, max_listing) = match loc {
            Loc::Top(Top::Root) => (2 + TOP_NAMES.len() as u64, 0),
            Loc::Top(_) => (2 + self.plans.len() as u64, 0),
            Loc::Plan(k, node) => {
                let p = self.plan(k);
                (p.shape.dir_len(node), p.max_listing)
            }
        };
        if max_listing > 0 {
            len = len.min(max_listing.saturating_add(2));
        }
        let mut i = offset;
        while i < len {
            let (child, name) = match i {
                0 => (loc, ".".to_string()),
                1 => (self.parent(loc), "..".to_string()),
                _ => self.entry(loc, i - 2),
            };
            let entry = DirEntry {
                ino: self.ino(child),
                next_offset: i + 1,
                kind: child.kind(),
                name,
            };
            if sink.add(entry) {
                break;
            }
            i += 1;
        }
        Ok(())
    }

    /// The `index`-th entry of directory `loc`, in listing order.
    fn entry(&self, loc: Loc, index: u64) -> (Loc, String) {
        match loc {
            Loc::Top(Top::Root) => {
                let (t, name) = TOP_NAMES[index as usize];
                (Loc::Top(t), name.to_string())
            }
            Loc::Top(_) => {
                let names = &self.named.as_ref().expect("a top level").names;
                (
                    Loc::Plan(index as u32, Node::Root),
                    names[index as usize].clone(),
                )
            }
            Loc::Plan(k, node) => {
                let (child, name) = self.plan(k).shape.entry(node, index);
                (Loc::Plan(k, child), name)
            }
        }
    }

    /// The attributes of `loc` now, or (when they may read document files: the size of a JSON
    /// file not cached yet, or of an observation, in a dataset with documents) the job that
    /// computes them.
    pub(crate) fn attr_or_job(&self, loc: Loc) -> Result<Stat> {
        let ino = self.ino(loc);
        let t = match loc {
            Loc::Plan(k, node) => return self.plan(k).attr_or_job(k, node, ino),
            Loc::Top(t) => t,
        };
        let (kind, size) = match t {
            Top::Root | Top::Plans => (Kind::Directory, 0),
            Top::Info => (Kind::File, self.top_info_json().len() as u64),
            Top::Stats => (Kind::File, self.stats_json(loc).len() as u64),
        };
        let file = kind == Kind::File;
        Ok(Stat::Ready(Attr {
            ino,
            kind,
            size,
            perm: if file { FILE_PERM } else { DIR_PERM },
            nlink: if file { 1 } else { 2 },
            volatile: loc.is_volatile(),
        }))
    }

    /// The top `info.json` (empty for a mount of one plan, which has no top level).
    fn top_info_json(&self) -> &[u8] {
        self.named.as_ref().map_or(&[], |n| &n.info_json)
    }
}

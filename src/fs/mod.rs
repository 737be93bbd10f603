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
//! `read.rs` has the reads: the step cache and the prefetcher on a step file's miss, and the
//! JSON cache.

use std::ffi::OsStr;
use std::num::NonZeroUsize;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, Mutex};

use lru::LruCache;

use crate::cache::StepCache;
use crate::error::{Error, Result};
use crate::inode::Inodes;
use crate::prefetch::{PrefetchConfig, Prefetcher};
use crate::shuffle::plan::StepKey;
use crate::tree::Shape;
use crate::view::{Mask, View};

mod read;

pub use read::{AttrJob, Bytes, Read, ReadJob, Stat};

// Also at the paths tests/it still name (until they use the crate root).
pub use crate::inode::ROOT_INO;
pub use crate::tree::{DEFAULT_MAX_LISTING, Kind, Node};

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

/// The filesystem: a [`View`] plus the tree around it.
#[derive(Debug)]
pub struct ShuffleFs {
    view: Arc<View>,
    /// Finished step files (none: every read assembles its range from the shards).
    cache: Option<Arc<StepCache>>,
    prefetcher: Option<Prefetcher>,
    /// Benchmarking only: every step read is answered from this one file.
    stub: Option<Arc<[u8]>>,
    shape: Shape,
    inodes: Inodes,
    /// Most names a listing shows (0: no bound); see [`ShuffleFs::readdir`].
    max_listing: u64,
    /// `stats.json` has a fixed size (`--prefill`; see [`ShuffleFs::with_padded_stats`]).
    padded_stats: bool,
    /// Recently rendered JSON files. A JSON file is rendered for `stat` (its size) and again
    /// for each READ (a reader's last READ, at EOF, included); with metadata rows that costs
    /// real reads, so the last few are kept. Bounded by [`JSON_CACHE_ENTRIES`] files of at most
    /// `read::JSON_CACHE_MAX_FILE` bytes each.
    json_cache: Mutex<LruCache<Node, Arc<[u8]>>>,
}

/// Most step files the step cache holds, whatever the budget (its map is allocated up front).
const MAX_CACHE_ENTRIES: u64 = 1 << 16;

/// Files the JSON cache keeps: a few per active reader.
const JSON_CACHE_ENTRIES: usize = 64;

impl ShuffleFs {
    /// Wraps a view.
    pub fn new(view: View) -> Result<ShuffleFs> {
        let shape = view.shape();
        let inodes = Inodes::new(shape)?;
        let max_listing = view.info().max_listing;
        Ok(ShuffleFs {
            view: Arc::new(view),
            cache: None,
            prefetcher: None,
            stub: None,
            shape,
            inodes,
            max_listing,
            padded_stats: false,
            json_cache: Mutex::new(LruCache::new(
                NonZeroUsize::new(JSON_CACHE_ENTRIES).expect("non-zero"),
            )),
        })
    }

    /// Adds a step cache of `budget` bytes and a prefetcher. Step files larger than half the
    /// budget are not cached (their reads go to the shards range by range).
    pub fn with_cache(mut self, budget: u64, prefetch: PrefetchConfig) -> ShuffleFs {
        if self.view.variable_step_sizes() {
            // The cache recycles buffers of one size.
            log::info!("the schedule changes the batch size: step cache and prefetch off");
            return self;
        }
        let step = self.view.step_npy_len().max(1);
        if budget / step < 2 {
            log::info!(
                "step files of {step} bytes do not fit a {budget}-byte cache twice: cache off"
            );
            return self;
        }
        // The LRU map is allocated up front: bound the entry count for tiny step files.
        let entries = (budget / step).min(MAX_CACHE_ENTRIES) as usize;
        let cache = Arc::new(StepCache::new(entries, step as usize));
        if prefetch.depth > 0 {
            let view = self.view.clone();
            self.prefetcher = Some(Prefetcher::new(
                prefetch,
                view.plan().clone(),
                cache.clone(),
                Box::new(move |key, buf: &mut [u8]| view.render_step_npy_into(key, buf)),
            ));
        }
        self.cache = Some(cache);
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
        self.stub = Some(self.view.render_step_npy(key)?.into());
        Ok(self)
    }

    /// Gives `stats.json` a fixed size (`--prefill`; see `stats.rs`).
    pub(crate) fn with_padded_stats(mut self) -> ShuffleFs {
        self.padded_stats = true;
        self
    }

    /// The step cache, if enabled.
    pub fn cache(&self) -> Option<&StepCache> {
        self.cache.as_deref()
    }

    /// The prefetcher, if enabled.
    pub fn prefetcher(&self) -> Option<&Prefetcher> {
        self.prefetcher.as_ref()
    }

    /// The bytes of `stats.json` now (see `stats.rs`).
    pub(crate) fn stats_json(&self) -> Vec<u8> {
        crate::stats::render(self.cache(), self.prefetcher(), self.padded_stats)
    }

    /// The view behind the tree.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// The inode numbering.
    pub(crate) fn inodes(&self) -> &Inodes {
        &self.inodes
    }

    /// The inode number of `node`.
    pub(crate) fn ino(&self, node: Node) -> u64 {
        self.inodes.ino(node)
    }

    /// The node of inode `ino`, if it exists.
    pub fn node(&self, ino: u64) -> Result<Node> {
        self.inodes.node(ino).ok_or(Error::NotFound)
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

    /// The attributes of `node`, running the job here when there is one.
    fn stat(&self, node: Node) -> Result<Attr> {
        match self.attr_or_job(node)? {
            Stat::Ready(attr) => Ok(attr),
            Stat::Job(job) => job.run(self),
        }
    }

    /// The node named `name` in directory `parent`.
    pub(crate) fn lookup_node(&self, parent: u64, name: &OsStr) -> Result<Node> {
        self.shape.child(self.node(parent)?, name.as_bytes())
    }

    /// Whether inode `ino` exists (no work beyond decoding the number).
    pub(crate) fn exists(&self, ino: u64) -> Result<()> {
        self.node(ino).map(|_| ())
    }

    /// Checks that `ino` can be opened with the `open(2)` flags `flags`: files only, and
    /// nothing that writes (write access, `O_TRUNC`, `O_APPEND`, `O_CREAT`).
    pub fn open(&self, ino: u64, flags: i32) -> Result<Node> {
        let node = self.node(ino)?;
        if node.kind() == Kind::Directory {
            return Err(Error::IsADirectory);
        }
        let writes = flags & libc::O_ACCMODE != libc::O_RDONLY
            || flags & (libc::O_TRUNC | libc::O_APPEND | libc::O_CREAT) != 0;
        if writes {
            return Err(Error::ReadOnly);
        }
        Ok(node)
    }

    /// `access(2)` on `ino` with `mask` (`R_OK`, `W_OK`, `X_OK` bits): write is `EROFS`,
    /// execute on a file is `EACCES`, read and lookup are allowed.
    pub fn access(&self, ino: u64, mask: i32) -> Result<()> {
        let node = self.node(ino)?;
        if mask & libc::W_OK != 0 {
            return Err(Error::ReadOnly);
        }
        if mask & libc::X_OK != 0 && node.kind() == Kind::File {
            return Err(Error::PermissionDenied);
        }
        Ok(())
    }

    /// Checks that `ino` is a directory.
    pub(crate) fn opendir(&self, ino: u64) -> Result<Node> {
        let node = self.node(ino)?;
        if node.kind() != Kind::Directory {
            return Err(Error::NotADirectory);
        }
        Ok(node)
    }

    /// Lists directory `ino` from `offset` (0 = start; every entry carries the offset to
    /// resume after it) until `sink` is full. O(1) memory and O(1) work per entry, whatever
    /// the directory size. A bounded listing (`--max-listing N`, N > 0) shows `.`, `..` and
    /// the first N names in listing order; every name beyond them is still found by
    /// [`ShuffleFs::lookup`].
    pub fn readdir(&self, ino: u64, offset: u64, sink: &mut impl DirSink) -> Result<()> {
        let node = self.opendir(ino)?;
        let mut len = self.shape.dir_len(node);
        if self.max_listing > 0 {
            len = len.min(self.max_listing.saturating_add(2));
        }
        let mut k = offset;
        while k < len {
            let (child, name) = match k {
                0 => (node, ".".to_string()),
                1 => (node.parent(), "..".to_string()),
                _ => self.shape.entry(node, k - 2),
            };
            let entry = DirEntry {
                ino: self.ino(child),
                next_offset: k + 1,
                kind: child.kind(),
                name,
            };
            if sink.add(entry) {
                break;
            }
            k += 1;
        }
        Ok(())
    }

    /// The attributes of `node`, computed here.
    fn attr(&self, node: Node) -> Result<Attr> {
        let (kind, size) = match node.kind() {
            Kind::Directory => (Kind::Directory, 0),
            Kind::File => (Kind::File, self.size(node)?),
        };
        Ok(Attr {
            ino: self.ino(node),
            kind,
            size,
            perm: if kind == Kind::File {
                FILE_PERM
            } else {
                DIR_PERM
            },
            nlink: if kind == Kind::File { 1 } else { 2 },
            volatile: node.is_volatile(),
        })
    }

    /// The attributes of `node` now, or (when they may read document files: the size of a JSON
    /// file not cached yet, or of an observation, in a dataset with documents) the job that
    /// computes them.
    pub(crate) fn attr_or_job(&self, node: Node) -> Result<Stat> {
        let needs_files = match node {
            Node::StepJson(_) | Node::ObservationJson(_) | Node::LookupJson(..) => {
                self.view.dataset().has_documents() && !self.json_is_cached(node)
            }
            Node::ValStepJson(..) => !self.json_is_cached(node),
            Node::ObservationNpy(_) => self.view.dataset().has_documents(),
            _ => false,
        };
        if needs_files {
            return Ok(Stat::Job(AttrJob { node }));
        }
        self.attr(node).map(Stat::Ready)
    }

    /// The size of file `node`.
    fn size(&self, node: Node) -> Result<u64> {
        let v = &self.view;
        Ok(match node {
            Node::Info => v.info_json().len() as u64,
            Node::Stats => self.stats_json().len() as u64,
            Node::StepNpy(key) => v.step_npy_len_at(key),
            Node::StepPos(_) => v.step_mask_len(Mask::Positions)?,
            Node::StepDocLens(_) => v.step_mask_len(Mask::DocLens)?,
            // Measured without writing it (a listing's `ls -l` stats thousands): see
            // `View::step_json_len`. A read renders it (and caches it) as before.
            Node::StepJson(key) => match self.json_if_cached(node) {
                Some(bytes) => bytes.len() as u64,
                None => v.step_json_len(key)?,
            },
            Node::ValStepNpy(..) => v.step_npy_len(),
            Node::ObservationJson(_) | Node::LookupJson(..) | Node::ValStepJson(..) => {
                match self.cached_json(node)? {
                    Ok(bytes) => bytes.len() as u64,
                    Err(len) => len,
                }
            }
            Node::ObservationNpy(i) => v.observation_npy_len(i)?,
            _ => 0,
        })
    }
}

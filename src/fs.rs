//! The filesystem semantics, free of FUSE: names, inodes, attributes, listings and reads.
//!
//! ```text
//! /                         dir
//! /info.json                file   the mount's parameters and fingerprint
//! /epoch/                   dir    0 .. epochs-1
//! /epoch/E/                 dir    rank
//! /epoch/E/rank/            dir    0 .. ranks-1
//! /epoch/E/rank/R/          dir    step
//! /epoch/E/rank/R/step/     dir    0.npy 0.json 1.npy 1.json ... (steps_per_epoch pairs)
//! /observation/             dir    0.npy 0.json ... (n_observations pairs): unshuffled data
//! /lookup/epoch/E/observation/I.json   where observation I is trained in epoch E
//! ```
//!
//! Inode numbers are computed, not stored: each kind of node owns a contiguous range, and a
//! node's number is the range start plus its index inside the kind (mixed radix over epoch,
//! rank and step). Nothing grows with the number of files read, `forget` is a no-op, and the
//! same configuration gives the same inode numbers on every mount.
//!
//! Names have exactly one spelling: canonical decimals (`7`, never `07` or `+7`) and exact
//! suffixes. Everything else is `ENOENT`. Every modification is `EROFS`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;

use crate::cache::StepCache;
use crate::error::{Error, Result};
use crate::inode::Inodes;
use crate::prefetch::{Claim, PrefetchConfig, Prefetcher};
use crate::shuffle::plan::StepKey;
use crate::tree::Shape;
use crate::view::{View, json_len, json_range};

// Also at the paths tests/it still name (until they use the crate root).
pub use crate::inode::ROOT_INO;
pub use crate::tree::{DEFAULT_MAX_LISTING, Kind, Node};

/// Permission bits of files.
pub(crate) const FILE_PERM: u16 = 0o444;
/// Permission bits of directories.
pub(crate) const DIR_PERM: u16 = 0o555;

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
    /// [`JSON_CACHE_MAX_FILE`] bytes each.
    json_cache: Mutex<LruCache<Node, Arc<[u8]>>>,
}

/// With `--prefill`, `stats.json` is padded to a multiple of this size (see
/// [`ShuffleFs::with_padded_stats`]).
const STATS_JSON_LEN: usize = 4096;

/// Most step files the step cache holds, whatever the budget (its map is allocated up front).
const MAX_CACHE_ENTRIES: u64 = 1 << 16;

/// Files the JSON cache keeps: a few per active reader.
const JSON_CACHE_ENTRIES: usize = 64;
/// Larger JSON files are rendered per request instead (range by range, never whole).
const JSON_CACHE_MAX_FILE: u64 = 1 << 20;

impl ShuffleFs {
    /// Wraps a view.
    pub fn new(view: View) -> Result<ShuffleFs> {
        let shape = Shape::of(view.plan());
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
    pub fn with_stub_reads(mut self) -> Result<ShuffleFs> {
        let key = StepKey {
            epoch: 0,
            rank: 0,
            step: 0,
        };
        self.stub = Some(self.view.render_step_npy(key)?.into());
        Ok(self)
    }

    /// The step cache, if enabled.
    pub fn cache(&self) -> Option<&StepCache> {
        self.cache.as_deref()
    }

    /// The prefetcher, if enabled.
    pub fn prefetcher(&self) -> Option<&Prefetcher> {
        self.prefetcher.as_ref()
    }

    /// Gives `stats.json` a fixed size (`--prefill`). A prefill mount reads every file through
    /// the page cache, which trusts the size `stat` returned, and the counters can change
    /// between that `stat` and the read: a rendering longer than the size would be cut,
    /// a shorter one zero-filled. So the JSON is padded to a multiple of 4,096 bytes with
    /// carriage returns before its final newline: JSON white space that a terminal does not
    /// show (each one moves the cursor back to the start of the line the closing brace is on).
    pub fn with_padded_stats(mut self) -> ShuffleFs {
        self.padded_stats = true;
        self
    }

    /// `stats.json`: cache and prefetch counters, pretty JSON and a newline. Without
    /// [`ShuffleFs::with_padded_stats`] it is exactly that; each open of the file reads one
    /// rendering (`fuse.rs` keeps a snapshot per open), and its size in `stat` is that of a
    /// rendering at the time of the `stat`.
    pub fn stats_json(&self) -> Vec<u8> {
        let stats = self.cache.as_ref().map(|c| c.stats());
        let mut out = serde_json::to_vec_pretty(&serde_json::json!({
            "cache_enabled": stats.is_some(),
            "cache": stats.unwrap_or_default(),
            "prefetch_active": self.prefetcher.as_ref().is_some_and(Prefetcher::is_active),
            "prefill": self.prefetcher.as_ref().and_then(|p| p.prefill()).map(|p| p.stats()),
        }))
        .expect("stats serialize");
        if self.padded_stats {
            let len = (out.len() + 1).next_multiple_of(STATS_JSON_LEN);
            out.resize(len - 1, b'\r');
        }
        out.push(b'\n');
        out
    }

    /// The inode of each step file, as a function that outlives `self`.
    pub fn step_ino_fn(&self) -> Box<dyn Fn(StepKey) -> u64 + Send + Sync> {
        let inodes = self.inodes.clone();
        Box::new(move |key| inodes.ino(Node::StepNpy(key)))
    }

    /// The view behind the tree.
    pub fn view(&self) -> &View {
        &self.view
    }

    /// The inode number of `node`.
    pub fn ino(&self, node: Node) -> u64 {
        self.inodes.ino(node)
    }

    /// The node of inode `ino`, if it exists.
    pub fn node(&self, ino: u64) -> Result<Node> {
        self.inodes.node(ino).ok_or(Error::NotFound)
    }

    /// Resolves `name` inside directory `parent`.
    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr> {
        let node = self.child(self.node(parent)?, name.as_bytes())?;
        self.attr(node)
    }

    fn child(&self, parent: Node, name: &[u8]) -> Result<Node> {
        self.shape.child(parent, name)
    }

    /// Attributes of inode `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.attr(self.node(ino)?)
    }

    /// The node named `name` in directory `parent`, without its attributes.
    pub fn lookup_node(&self, parent: u64, name: &OsStr) -> Result<Node> {
        self.child(self.node(parent)?, name.as_bytes())
    }

    /// The attributes of `node`.
    pub fn node_attr(&self, node: Node) -> Result<Attr> {
        self.attr(node)
    }

    /// Whether computing `node`'s attributes may read shard or document files (the size of a
    /// JSON file, or of an observation in documents mode, not cached yet).
    pub fn attr_needs_shards(&self, node: Node) -> bool {
        match node {
            Node::StepJson(_) | Node::ObservationJson(_) | Node::LookupJson(..) => {
                self.view.dataset().has_documents() && !self.json_is_cached(node)
            }
            Node::ObservationNpy(_) => self.view.dataset().has_documents(),
            _ => false,
        }
    }

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

    fn size(&self, node: Node) -> Result<u64> {
        let v = &self.view;
        Ok(match node {
            Node::Info => v.info_json().len() as u64,
            Node::Stats => self.stats_json().len() as u64,
            Node::StepNpy(_) => v.step_npy_len(),
            // Measured without writing it (a listing's `ls -l` stats thousands): see
            // `View::step_json_len`. A read renders it (and caches it) as before.
            Node::StepJson(key) => match self.json_if_cached(node) {
                Some(bytes) => bytes.len() as u64,
                None => v.step_json_len(key)?,
            },
            Node::ObservationJson(_) | Node::LookupJson(..) => match self.cached_json(node)? {
                Ok(bytes) => bytes.len() as u64,
                Err(len) => len,
            },
            Node::ObservationNpy(i) => v.observation_npy_len(i)?,
            _ => 0,
        })
    }

    fn write_json(&self, node: Node, w: &mut impl std::io::Write) -> Result<()> {
        let v = &self.view;
        match node {
            Node::StepJson(key) => v.write_step_json(key, w),
            Node::ObservationJson(i) => v.write_observation_json(i, w),
            Node::LookupJson(e, i) => v.write_lookup_json(e, i, w),
            _ => unreachable!("not a JSON file: {node:?}"),
        }
    }

    /// The bytes of JSON file `node` if they are in the JSON cache (not counted as a use).
    fn json_if_cached(&self, node: Node) -> Option<Arc<[u8]>> {
        self.json_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .peek(&node)
            .cloned()
    }

    /// Whether `node` is a JSON file whose bytes are in the JSON cache.
    fn json_is_cached(&self, node: Node) -> bool {
        self.json_cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&node)
    }

    /// The bytes of a JSON file from the cache, rendering and caching them when small;
    /// `Err(len)` for files too large to cache (rendered range by range instead).
    fn cached_json(&self, node: Node) -> Result<std::result::Result<Arc<[u8]>, u64>> {
        let lock = || self.json_cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(bytes) = lock().get(&node) {
            return Ok(Ok(bytes.clone()));
        }
        // Render once into a buffer that refuses to grow past the cap; only a file over the cap
        // is measured by a second, counting pass.
        let mut capped = Capped(Vec::new());
        if let Err(e) = self.write_json(node, &mut capped) {
            if capped.0.len() as u64 <= JSON_CACHE_MAX_FILE {
                return Err(e);
            }
            return Ok(Err(json_len(|w| self.write_json(node, w))?));
        }
        let bytes: Arc<[u8]> = capped.0.into();
        lock().put(node, bytes.clone());
        Ok(Ok(bytes))
    }

    /// Whether inode `ino` exists (no work beyond decoding the number).
    pub fn exists(&self, ino: u64) -> Result<()> {
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
    pub fn opendir(&self, ino: u64) -> Result<Node> {
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

    /// Reads up to `size` bytes of file `ino` at `offset` into `out` (cleared first). Returns
    /// exactly the file's bytes; nothing at or past the end.
    pub fn read(&self, ino: u64, offset: u64, size: u32, out: &mut Vec<u8>) -> Result<()> {
        let mut scratch = Vec::new();
        out.clear();
        match self.read_data(ino, offset, size, &mut scratch, Access::Any)? {
            ReadData::Scratch(n) => out.extend_from_slice(&scratch[..n]),
            ReadData::Shared(bytes, range) => out.extend_from_slice(&bytes[range]),
            ReadData::NeedsShards => unreachable!("Access::Any reads shards"),
        }
        Ok(())
    }

    /// Reads up to `size` bytes of file `ino` at `offset`: exactly the file's bytes, nothing at
    /// or past the end. The bytes are either written to the front of `scratch`, which is only
    /// ever grown (a FUSE worker keeps one, so a read neither allocates nor zero-fills), or are
    /// a range of a cached file, which the reply can send without copying. With
    /// [`Access::Memory`], a read that would have to read shard or document files returns
    /// [`ReadData::NeedsShards`] instead (and counts nothing).
    pub fn read_data(
        &self,
        ino: u64,
        offset: u64,
        size: u32,
        scratch: &mut Vec<u8>,
        access: Access,
    ) -> Result<ReadData> {
        let node = self.open(ino, libc::O_RDONLY)?;
        let memory_only = access == Access::Memory;
        let v = &self.view;
        // The first `n` bytes of scratch, grown (zero-filled) only when too short.
        let room = |scratch: &mut Vec<u8>, n: usize| {
            if scratch.len() < n {
                scratch.resize(n, 0);
            }
        };
        let shared = |bytes: Arc<[u8]>| {
            let start = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            let end = start.saturating_add(size as usize).min(bytes.len());
            ReadData::Shared(bytes, start..end)
        };
        let data = match node {
            Node::StepNpy(key) => {
                let len = v.step_npy_len();
                if offset >= len {
                    // The reader's end-of-file probe: nothing to read, count or prefetch.
                    return Ok(ReadData::Scratch(0));
                }
                if let Some(stub) = &self.stub {
                    return Ok(shared(stub.clone()));
                }
                // A hit is sent as is; a miss reads just the requested range from the shards
                // straight into the reply (only the prefetcher fills the cache). Before a
                // miss assembles, the prefetcher is asked (a step it is assembling is waited
                // for, never assembled twice) and told what comes next.
                // Each READ with data counts once: a hit (cached, or finished by the
                // prefetcher while this read waited) or a miss (assembled here).
                let hit = self.cache.as_ref().and_then(|c| c.get_if_cached(key));
                if let Some(bytes) = hit {
                    if let Some(p) = &self.prefetcher {
                        p.hint(key);
                    }
                    return Ok(shared(bytes));
                }
                if memory_only {
                    return Ok(ReadData::NeedsShards);
                }
                let _guard = match self
                    .prefetcher
                    .as_ref()
                    .map(|p| (p, p.claim(key, PREFETCH_WAIT)))
                {
                    Some((p, Claim::Ready(bytes))) => {
                        p.hint(key);
                        return Ok(shared(bytes));
                    }
                    Some((p, Claim::Yours(guard))) => {
                        p.hint(key);
                        Some(guard)
                    }
                    None => None,
                };
                if let Some(c) = &self.cache {
                    c.counters
                        .misses
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                let want = (u64::from(size)).min(len - offset) as usize;
                room(scratch, want);
                ReadData::Scratch(v.read_step_npy(key, offset, &mut scratch[..want])?)
            }
            Node::ObservationNpy(_)
            | Node::StepJson(_)
            | Node::ObservationJson(_)
            | Node::LookupJson(..)
                if memory_only && !self.json_is_cached(node) =>
            {
                return Ok(ReadData::NeedsShards);
            }
            Node::ObservationNpy(i) => {
                let len = v.observation_npy_len(i)?;
                if offset >= len {
                    return Ok(ReadData::Scratch(0));
                }
                let want = (u64::from(size)).min(len - offset) as usize;
                room(scratch, want);
                ReadData::Scratch(v.read_observation_npy(i, offset, &mut scratch[..want])?)
            }
            Node::StepJson(_) | Node::ObservationJson(_) | Node::LookupJson(..) => {
                match self.cached_json(node)? {
                    Ok(bytes) => shared(bytes),
                    Err(_) => {
                        scratch.clear();
                        json_range(offset, size, scratch, |w| self.write_json(node, w))?;
                        ReadData::Scratch(scratch.len())
                    }
                }
            }
            Node::Info => {
                scratch.clear();
                copy_range(v.info_json(), offset, size, scratch);
                ReadData::Scratch(scratch.len())
            }
            Node::Stats => {
                scratch.clear();
                copy_range(&self.stats_json(), offset, size, scratch);
                ReadData::Scratch(scratch.len())
            }
            _ => return Err(Error::IsADirectory),
        };
        Ok(data)
    }
}

/// What a read may touch (see [`ShuffleFs::read_data`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Only memory: cached files, `info.json`, `stats.json`.
    Memory,
    /// Shard and document files too.
    Any,
}

/// Where the bytes of a read are (see [`ShuffleFs::read_data`]).
#[derive(Debug)]
pub enum ReadData {
    /// The read needs shard or document files (only with [`Access::Memory`]).
    NeedsShards,
    /// The first `n` bytes of the caller's scratch buffer.
    Scratch(usize),
    /// A range of an immutable shared file (cached step file or JSON).
    Shared(Arc<[u8]>, std::ops::Range<usize>),
}

/// How long a read that missed the cache waits for the prefetcher to finish assembling the same
/// step before assembling it itself. A worker normally needs well under a millisecond; the
/// bound only matters when a shard read stalls.
const PREFETCH_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// A Vec that fails writes once it would exceed [`JSON_CACHE_MAX_FILE`] (by one byte past it,
/// so an overflow is recognisable).
struct Capped(Vec<u8>);

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if (self.0.len() + buf.len()) as u64 > JSON_CACHE_MAX_FILE {
            self.0.resize(JSON_CACHE_MAX_FILE as usize + 1, 0);
            return Err(std::io::Error::other("JSON file larger than the cache cap"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn copy_range(bytes: &[u8], offset: u64, size: u32, out: &mut Vec<u8>) {
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    let end = start.saturating_add(size as usize).min(bytes.len());
    out.extend_from_slice(&bytes[start..end]);
}

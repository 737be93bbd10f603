//! One plan's filesystem: a [`View`] with its tree, its numbering, its handle on the step
//! cache, its prefetcher and its JSON cache. [`ShuffleFs`](super::ShuffleFs) holds one per
//! plan and routes every request to it; everything here speaks the plan's own [`Node`]s.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use lru::LruCache;

use super::{Attr, DIR_PERM, FILE_PERM, Stat};
use crate::cache::StepCache;
use crate::error::Result;
use crate::fs::AttrJob;
use crate::inode::Inodes;
use crate::prefetch::{PrefetchConfig, Prefetcher};
use crate::tree::{Kind, Node, Shape};
use crate::view::{Mask, View};

/// Files the JSON cache keeps: a few per active reader.
const JSON_CACHE_ENTRIES: usize = 64;

/// One plan's filesystem (see the module docs).
#[derive(Debug)]
pub(super) struct PlanFs {
    pub(super) view: Arc<View>,
    /// This plan's handle on the step cache (none: every read assembles its range from the
    /// shards).
    pub(super) cache: Option<Arc<StepCache>>,
    pub(super) prefetcher: Option<Prefetcher>,
    /// Benchmarking only: every step read is answered from this one file.
    pub(super) stub: Option<Arc<[u8]>>,
    pub(super) shape: Shape,
    pub(super) inodes: Inodes,
    /// Most names a listing shows (0: no bound); see [`ShuffleFs::readdir`](super::ShuffleFs::readdir).
    pub(super) max_listing: u64,
    /// `stats.json` has a fixed size (`--prefill`).
    pub(super) padded_stats: bool,
    /// Recently rendered JSON files. A JSON file is rendered for `stat` (its size) and again
    /// for each READ (a reader's last READ, at EOF, included); with metadata rows that costs
    /// real reads, so the last few are kept. Bounded by [`JSON_CACHE_ENTRIES`] files of at most
    /// `read::JSON_CACHE_MAX_FILE` bytes each.
    pub(super) json_cache: Mutex<LruCache<Node, Arc<[u8]>>>,
    /// The mount's passthrough counters, once it serves step files that way.
    pub(super) passthrough: std::sync::OnceLock<Arc<crate::stats::Passthrough>>,
}

impl PlanFs {
    /// Wraps a view.
    pub(super) fn new(view: View) -> Result<PlanFs> {
        let shape = view.shape();
        let inodes = Inodes::new(shape)?;
        let max_listing = view.info().max_listing;
        Ok(PlanFs {
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
            passthrough: std::sync::OnceLock::new(),
        })
    }

    /// Uses `cache` (this plan's handle) and, with a depth, a prefetcher filling it.
    pub(super) fn use_cache(&mut self, cache: StepCache, prefetch: PrefetchConfig) {
        let cache = Arc::new(cache);
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
    }

    /// The bytes of this plan's `stats.json` now (see `stats.rs`).
    pub(super) fn stats_json(&self) -> Vec<u8> {
        crate::stats::render(
            self.cache.as_deref(),
            &self.prefetcher.iter().collect::<Vec<_>>(),
            self.passthrough.get().map(|c| &**c),
            self.padded_stats,
        )
    }

    /// The attributes of `node`, whose inode number is `ino`, computed here.
    pub(super) fn attr(&self, node: Node, ino: u64) -> Result<Attr> {
        let (kind, size) = match node.kind() {
            Kind::Directory => (Kind::Directory, 0),
            Kind::File => (Kind::File, self.size(node)?),
        };
        Ok(Attr {
            ino,
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

    /// The attributes of `node` (inode `ino`, of plan `plan`) now, or (when they may read
    /// document files: the size of a JSON file not cached yet, or of an observation, in a
    /// dataset with documents) the job that computes them.
    pub(super) fn attr_or_job(&self, plan: u32, node: Node, ino: u64) -> Result<Stat> {
        let needs_files = match node {
            Node::StepJson(_) | Node::ObservationJson(_) | Node::LookupJson(..) => {
                self.view.dataset().has_documents() && !self.json_is_cached(node)
            }
            Node::ValStepJson(..) => !self.json_is_cached(node),
            Node::ObservationNpy(_) => self.view.dataset().has_documents(),
            _ => false,
        };
        if needs_files {
            return Ok(Stat::Job(AttrJob { plan, node }));
        }
        self.attr(node, ino).map(Stat::Ready)
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

//! A bounded, node-wide LRU of finished step files, with counters.
//!
//! Step files all have the same size, so the byte budget becomes an entry count
//! (`budget / step_file_bytes`), which is what the `lru` crate bounds. Entries inserted by the
//! prefetcher are marked until a reader uses them: one evicted before use counts as prefetch
//! waste. Every counter is observable (`stats.json`) and asserted step by step in tests.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use lru::LruCache;
use serde::Serialize;

use crate::shuffle::plan::StepKey;
use crate::stepbuf::StepBuf;

struct Entry {
    bytes: Arc<StepBuf>,
    /// Inserted by the prefetcher and not read yet.
    unread_prefetch: bool,
}

/// Counters of the cache and the prefetcher (changed only through the cache's methods).
#[derive(Debug, Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    prefetched: AtomicU64,
    prefetch_used: AtomicU64,
    prefetch_wasted: AtomicU64,
    prefetch_failed: AtomicU64,
    prefetch_waited: AtomicU64,
    prefetch_claimed: AtomicU64,
    prefetch_paused: AtomicU64,
    evicted: AtomicU64,
}

/// A snapshot of the counters, as served in `stats.json` (whose keys have always been in
/// alphabetical order: the fields are).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Maximum entries.
    pub capacity: u64,
    /// Entries in the cache now.
    pub entries: u64,
    /// Entries evicted to stay within the budget.
    pub evicted: u64,
    /// Reads answered from the cache.
    pub hits: u64,
    /// Reads that had to assemble the step themselves.
    pub misses: u64,
    /// Reads that took over a step still queued for prefetch (the prefetcher was behind the
    /// reader).
    pub prefetch_claimed: u64,
    /// Prefetches that failed (the later foreground read retries on its own).
    pub prefetch_failed: u64,
    /// Periods prefetch was paused because reads were faster without it.
    pub prefetch_paused: u64,
    /// Prefetched steps later read from the cache.
    pub prefetch_used: u64,
    /// Reads that found their step being assembled by the prefetcher and waited for it
    /// instead of assembling it a second time.
    pub prefetch_waited: u64,
    /// Prefetched steps evicted before any read.
    pub prefetch_wasted: u64,
    /// Steps assembled by the prefetcher.
    pub prefetched: u64,
}

/// Evicted buffers kept for reuse.
const MAX_SPARE: usize = 8;

/// Most step files a cache keeps in memory files (see [`StepCache::use_memfds`]).
pub(crate) const MEMFD_ENTRIES_MAX: usize = 2048;

/// What the plans of a mount share: the entries, the budget, the spare buffers and the
/// counters.
struct Store {
    map: Mutex<LruCache<(u32, StepKey), Entry>>,
    capacity: usize,
    /// Plans that share the store ([`StepCache::for_plan`] handles; at least 1).
    plans: std::sync::atomic::AtomicUsize,
    /// Evicted files no reply still holds, reused by [`StepCache::buffer`]: the prefetcher
    /// then neither allocates, zero-fills nor page-faults in its steady state.
    spare: Mutex<Vec<Arc<StepBuf>>>,
    /// New buffers are memory files (the mount serves step files by passthrough).
    memfd: std::sync::atomic::AtomicBool,
    counters: Counters,
}

/// The step cache, as one plan of the mount sees it: its step files, in a store that the
/// mount's other plans (`[[plan]]`) share ([`StepCache::for_plan`]).
pub struct StepCache {
    store: Arc<Store>,
    /// The plan whose step files these are.
    plan: u32,
    /// The size of every step file of the plan.
    file_len: usize,
}

impl std::fmt::Debug for StepCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepCache")
            .field("capacity", &self.store.capacity)
            .field("plan", &self.plan)
            .finish()
    }
}

impl StepCache {
    /// A cache of at most `capacity` step files (at least 1) of `file_len` bytes each.
    pub(crate) fn new(capacity: usize, file_len: usize) -> StepCache {
        let capacity = capacity.max(1);
        let store = Store {
            map: Mutex::new(LruCache::new(
                NonZeroUsize::new(capacity).expect("at least 1"),
            )),
            capacity,
            plans: std::sync::atomic::AtomicUsize::new(0),
            spare: Mutex::new(Vec::new()),
            memfd: std::sync::atomic::AtomicBool::new(false),
            counters: Counters::default(),
        };
        StepCache {
            store: Arc::new(store),
            plan: 0,
            file_len,
        }
    }

    /// The same store seen by plan `plan`, whose step files have `file_len` bytes (a
    /// multi-plan mount: one budget and one set of counters for every plan). The store's
    /// capacity is in entries: size it for the largest step file.
    pub(crate) fn for_plan(&self, plan: u32, file_len: usize) -> StepCache {
        self.store
            .plans
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        StepCache {
            store: self.store.clone(),
            plan,
            file_len,
        }
    }

    /// How many step files of the cache one plan may count on: its share of the capacity
    /// when several plans share it.
    pub(crate) fn capacity(&self) -> usize {
        let plans = self
            .store
            .plans
            .load(std::sync::atomic::Ordering::Relaxed)
            .max(1);
        self.store.capacity / plans
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<(u32, StepKey), Entry>> {
        self.store.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn counters(&self) -> &Counters {
        &self.store.counters
    }

    /// The step file for `key`, counting a hit or a miss.
    #[cfg(test)]
    pub(crate) fn get(&self, key: StepKey) -> Option<Arc<StepBuf>> {
        let mut map = self.lock();
        match map.get_mut(&(self.plan, key)) {
            Some(entry) => {
                if std::mem::take(&mut entry.unread_prefetch) {
                    self.counters()
                        .prefetch_used
                        .fetch_add(1, Ordering::Relaxed);
                }
                self.counters().hits.fetch_add(1, Ordering::Relaxed);
                Some(entry.bytes.clone())
            }
            None => {
                self.counters().misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// The step file for `key` if cached, counting a hit; a miss counts nothing (the caller
    /// will ask again with [`StepCache::get`]).
    pub(crate) fn get_if_cached(&self, key: StepKey) -> Option<Arc<StepBuf>> {
        self.get_cached_if(key, |_| true)
    }

    /// [`StepCache::get_if_cached`] of a step file `wanted` accepts (under one lock): one it
    /// refuses is neither counted nor refreshed.
    pub(crate) fn get_cached_if(
        &self,
        key: StepKey,
        wanted: impl FnOnce(&StepBuf) -> bool,
    ) -> Option<Arc<StepBuf>> {
        let mut map = self.lock();
        if !wanted(&map.peek(&(self.plan, key))?.bytes) {
            return None;
        }
        let entry = map.get_mut(&(self.plan, key))?;
        if std::mem::take(&mut entry.unread_prefetch) {
            self.counters()
                .prefetch_used
                .fetch_add(1, Ordering::Relaxed);
        }
        self.counters().hits.fetch_add(1, Ordering::Relaxed);
        Some(entry.bytes.clone())
    }

    /// The step file for `key` if cached, without counting or refreshing it.
    pub(crate) fn peek(&self, key: StepKey) -> Option<Arc<StepBuf>> {
        self.lock().peek(&(self.plan, key)).map(|e| e.bytes.clone())
    }

    /// Whether `key` is cached (no counting, no LRU update).
    pub(crate) fn contains(&self, key: StepKey) -> bool {
        self.lock().contains(&(self.plan, key))
    }

    /// A buffer of one step file's size that nothing else references (its content is
    /// unspecified): a recycled evicted file when there is one. A memory file (which the
    /// kernel can serve by passthrough) if `memfd` and the store uses them, else heap memory.
    pub(crate) fn buffer(&self, memfd: bool) -> Arc<StepBuf> {
        let memfd = memfd && self.store.memfd.load(Ordering::Relaxed);
        let spare = {
            let mut spare = self.store.spare.lock().unwrap_or_else(|p| p.into_inner());
            // Several plans may have step files of several sizes.
            let found = spare
                .iter()
                .rposition(|b| b.len() == self.file_len && b.memfd_fd().is_some() == memfd);
            found.map(|i| spare.swap_remove(i))
        };
        spare.unwrap_or_else(|| {
            let buf = if memfd {
                StepBuf::memfd(self.file_len).unwrap_or_else(|e| {
                    log::debug!("no memory file for a step ({e}): heap memory instead");
                    StepBuf::heap(self.file_len)
                })
            } else {
                StepBuf::heap(self.file_len)
            };
            Arc::new(buf)
        })
    }

    /// Buffers asked for as memory files are memory files from now on (see `stepbuf.rs`),
    /// unless the store holds more than [`MEMFD_ENTRIES_MAX`] step files (each memory file is
    /// a descriptor and at least a page: many small step files stay on the heap).
    pub(crate) fn use_memfds(&self) {
        if self.store.capacity <= MEMFD_ENTRIES_MAX {
            self.store.memfd.store(true, Ordering::Relaxed);
        } else {
            log::info!(
                "the step cache holds up to {} step files: kept on the heap (memory files only \
                 up to {MEMFD_ENTRIES_MAX}), so step files are served by the daemon's replies",
                self.store.capacity
            );
        }
    }

    /// Inserts a finished step file, evicting the least recently used entry when full.
    pub(crate) fn insert(&self, key: StepKey, bytes: Arc<StepBuf>, prefetched: bool) {
        let key = (self.plan, key);
        let mut map = self.lock();
        if map.contains(&key) {
            return;
        }
        if prefetched {
            self.counters().prefetched.fetch_add(1, Ordering::Relaxed);
        }
        let entry = Entry {
            bytes,
            unread_prefetch: prefetched,
        };
        if let Some((old_key, mut old)) = map.push(key, entry)
            && old_key != key
        {
            self.counters().evicted.fetch_add(1, Ordering::Relaxed);
            if old.unread_prefetch {
                self.counters()
                    .prefetch_wasted
                    .fetch_add(1, Ordering::Relaxed);
            }
            drop(map);
            // Reused only when nothing else holds it (no reply) and it was never handed to the
            // kernel as a passthrough backing file.
            if Arc::get_mut(&mut old.bytes).is_some() && old.bytes.unshared() {
                let mut spare = self.store.spare.lock().unwrap_or_else(|p| p.into_inner());
                if spare.len() == MAX_SPARE {
                    // The oldest goes (a plan's steady state recycles its own size).
                    spare.remove(0);
                }
                spare.push(old.bytes);
            }
        }
    }

    /// A read that found nothing assembled assembles its range itself.
    pub(crate) fn count_miss(&self) {
        self.counters().misses.fetch_add(1, Ordering::Relaxed);
    }

    /// A prefetch failed (the reader retries on its own).
    pub(crate) fn count_prefetch_failed(&self) {
        self.counters()
            .prefetch_failed
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A read waits for the prefetcher to finish its step.
    pub(crate) fn count_prefetch_waited(&self) {
        self.counters()
            .prefetch_waited
            .fetch_add(1, Ordering::Relaxed);
    }

    /// A read took over a step still queued for prefetch.
    pub(crate) fn count_prefetch_claimed(&self) {
        self.counters()
            .prefetch_claimed
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The governor paused prefetch for a period.
    pub(crate) fn count_prefetch_paused(&self) {
        self.counters()
            .prefetch_paused
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The keys in the cache, most recently used first (tests).
    #[cfg(test)]
    pub(crate) fn keys(&self) -> Vec<StepKey> {
        let plan = self.plan;
        self.lock()
            .iter()
            .filter(|((p, _), _)| *p == plan)
            .map(|((_, k), _)| *k)
            .collect()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let c = self.counters();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Stats {
            hits: get(&c.hits),
            misses: get(&c.misses),
            prefetched: get(&c.prefetched),
            prefetch_used: get(&c.prefetch_used),
            prefetch_wasted: get(&c.prefetch_wasted),
            prefetch_failed: get(&c.prefetch_failed),
            prefetch_waited: get(&c.prefetch_waited),
            prefetch_claimed: get(&c.prefetch_claimed),
            prefetch_paused: get(&c.prefetch_paused),
            evicted: get(&c.evicted),
            entries: self.lock().len() as u64,
            capacity: self.store.capacity as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(step: u64) -> StepKey {
        StepKey {
            epoch: 0,
            rank: 0,
            step,
        }
    }

    fn bytes(v: u8) -> Arc<StepBuf> {
        Arc::new(vec![v; 4].into())
    }

    fn buf(v: Vec<u8>) -> Arc<StepBuf> {
        Arc::new(v.into())
    }

    #[test]
    fn hits_misses_and_lru_order_step_by_step() {
        let cache = StepCache::new(2, 4);
        assert!(cache.get(k(0)).is_none());
        assert_eq!(cache.stats().misses, 1);
        cache.insert(k(0), bytes(0), false);
        cache.insert(k(1), bytes(1), true);
        assert_eq!(cache.keys(), vec![k(1), k(0)]);
        assert_eq!(&**cache.get(k(0)).unwrap(), &[0; 4]);
        assert_eq!(cache.keys(), vec![k(0), k(1)], "a hit refreshes the entry");
        // Inserting a third evicts the least recently used: the unread prefetch of step 1.
        cache.insert(k(2), bytes(2), true);
        assert_eq!(cache.keys(), vec![k(2), k(0)]);
        let s = cache.stats();
        assert_eq!(
            (
                s.hits,
                s.misses,
                s.prefetched,
                s.prefetch_used,
                s.prefetch_wasted,
                s.evicted
            ),
            (1, 1, 2, 0, 1, 1)
        );
        assert_eq!(&**cache.get(k(2)).unwrap(), &[2; 4]);
        let s = cache.stats();
        assert_eq!(
            (s.hits, s.prefetch_used, s.entries, s.capacity),
            (2, 1, 2, 2)
        );
        // A second read of a used prefetch is a hit, not another use.
        cache.get(k(2)).unwrap();
        assert_eq!(cache.stats().prefetch_used, 1);
        // Re-inserting an existing key changes nothing.
        cache.insert(k(2), bytes(9), true);
        assert_eq!(&**cache.get(k(2)).unwrap(), &[2; 4]);
        assert_eq!(cache.stats().prefetched, 2);
    }

    #[test]
    fn plans_share_the_store_but_not_their_steps_or_buffer_sizes() {
        let a = StepCache::new(3, 4);
        let b = a.for_plan(1, 6);
        a.insert(k(0), bytes(1), true);
        assert!(b.get(k(0)).is_none(), "plan 1's step 0 is not plan 0's");
        b.insert(k(0), buf(vec![7; 6]), true);
        assert_eq!(&**a.get(k(0)).unwrap(), &[1; 4]);
        assert_eq!(&**b.get(k(0)).unwrap(), &[7; 6]);
        assert_eq!((a.keys(), b.keys()), (vec![k(0)], vec![k(0)]));
        // One budget: plan 1's inserts evict plan 0's least recently used entry.
        b.insert(k(1), buf(vec![8; 6]), false);
        b.insert(k(2), buf(vec![9; 6]), false);
        assert!(a.keys().is_empty());
        let s = b.stats();
        assert_eq!((s.entries, s.capacity, s.evicted), (3, 3, 1));
        assert_eq!(a.stats(), s, "one set of counters");
        // The evicted 4-byte file is recycled for plan 0 only; plan 1 gets its own size.
        assert_eq!(b.buffer(false).len(), 6);
        assert_eq!(a.buffer(false).len(), 4);
    }
}

//! Clairvoyant prefetch: the daemon knows every rank's future reads.
//!
//! When a reader reads step `s` of `(epoch, rank)`, `Prefetcher::hint` queues steps
//! `s+1 ..= s+depth` of the same rank (continuing into the next epoch's first steps), skipping
//! those already cached or being assembled; `depth` is at least `--prefetch-depth`, deeper
//! when assemblies take longer than reads (`depth.rs`). Background workers assemble each queued step with
//! the `render` function and insert it into the `StepCache` marked as prefetched. The queue is
//! bounded: when readers outrun the workers, the oldest hints are dropped (they would arrive
//! too late anyway). A failed prefetch is counted and logged; the later foreground read
//! assembles the step itself and reports any error then.
//!
//! A read that misses the cache asks `Prefetcher::claim` first, so a step is never assembled
//! twice: a step still queued is taken off the queue and the reader assembles it (the
//! prefetcher is behind); a step a worker is assembling right now is waited for (bounded), as
//! the worker has a head start. Without this, a prefetcher exactly as fast as the reader stays
//! one step behind forever and every step is assembled twice.
//!
//! With zero workers nothing runs in the background: [`Prefetcher::run_queued`] executes the
//! queue on the calling thread, which is how tests assert hits and misses without timing.

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroUsize;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

mod depth;
mod governor;

use depth::Meter;
use governor::Governor;

use log::trace;
use lru::LruCache;

use crate::cache::StepCache;
use crate::error::Result;
use crate::prefill::{PREFILL_DEPTH, Prefill, is_trigger};
use crate::shuffle::plan::{Plan, StepKey};

/// Assembles one whole step file into the buffer (exactly its size).
pub(crate) type Render = dyn Fn(StepKey, &mut [u8]) -> Result<()> + Send + Sync;

/// Prefetch settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefetchConfig {
    /// Steps ahead of the reader to assemble (0 disables prefetch).
    pub depth: u64,
    /// Background worker threads (0: only [`Prefetcher::run_queued`] runs them).
    pub workers: usize,
    /// Let the `Governor` pause prefetch when reads are faster without it (only with
    /// workers). Off in tests that count prefetches step by step.
    pub adaptive: bool,
}

impl Default for PrefetchConfig {
    fn default() -> Self {
        // A trainer reads one step at a time per rank; 4 steps ahead hides a burst of slow
        // reads without spending much of the cache on steps far in the future.
        PrefetchConfig {
            depth: 4,
            workers: 1,
            adaptive: true,
        }
    }
}

/// Most steps a hint looks ahead, whatever the configured depth (`--prefetch-depth` is bounded
/// to it as well): the work of one hint, under the prefetcher's lock, and the queue stay
/// bounded. Deeper would only evict prefetched steps before they are read.
pub(crate) const MAX_DEPTH: u64 = 1024;

/// How many recently read steps the prefetcher remembers, node-wide: steps within that many
/// reads of their reading are not prefetched again (a job restarted from an earlier checkpoint
/// is prefetched again after that many reads).
const RECENT_READS: NonZeroUsize = NonZeroUsize::new(1024).expect("non-zero");

/// Where a pending step is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    Queued,
    Assembling,
    /// A reader is assembling it itself (see [`Prefetcher::claim`]).
    Reading,
}

struct State {
    queue: VecDeque<StepKey>,
    /// Queued or being assembled.
    pending: HashMap<StepKey, Pending>,
    /// Steps read lately (bounded): never queued again while remembered.
    recent: LruCache<StepKey, ()>,
    /// Whether prefetching pays (only with background workers).
    governor: Option<Governor>,
    /// What sets the depth (only with background workers: `depth.rs`).
    meter: Option<Meter>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a step is queued (workers wait on it).
    wake: Condvar,
    /// Signalled when a step leaves `Assembling` (claiming readers wait on it).
    finished: Condvar,
    cache: Arc<StepCache>,
    render: Box<Render>,
    plan: Plan,
    depth: u64,
    max_queue: usize,
    /// Where finished steps are also pushed (the kernel page cache), once mounted.
    prefill: OnceLock<Arc<dyn Prefill>>,
    /// Steps assembled, and their count when a reader last needed a step the cache did not
    /// have: the prefetcher is ahead once [`AHEAD`] steps went by since.
    assembled: std::sync::atomic::AtomicU64,
    behind_at: std::sync::atomic::AtomicU64,
}

/// Steps assembled since a reader last waited for one, after which the prefetcher counts as
/// ahead of the readers: it then assembles into memory files the kernel serves by
/// passthrough, whose new pages cost CPU that readers which keep every core busy would miss
/// (measured: 2 unpaced readers on 2 vCPUs at 0.31x with every step in a new memory file).
const AHEAD: u64 = 16;

impl Shared {
    /// Whether the readers have not waited for a step in the last [`AHEAD`] assemblies.
    fn ahead(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.assembled.load(Relaxed) >= self.behind_at.load(Relaxed) + AHEAD
    }

    /// A reader needed a step the cache did not have.
    fn behind(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.behind_at.store(self.assembled.load(Relaxed), Relaxed);
    }

    /// The prefetch depth: the configured one, deeper with prefill, else as deep as the
    /// measured assemblies and reads need within the cache (`depth.rs`); never beyond
    /// [`MAX_DEPTH`].
    fn depth_now(&self, state: &State) -> u64 {
        let depth = if self.prefill.get().is_some() {
            self.depth.max(PREFILL_DEPTH)
        } else if let Some(meter) = &state.meter {
            meter.depth(self.depth, self.cache.capacity())
        } else {
            self.depth
        };
        depth.min(MAX_DEPTH)
    }
}

/// What [`Prefetcher::claim`] found.
#[derive(Debug)]
pub(crate) enum Claim<'a> {
    /// The prefetcher finished the step while the reader waited.
    Ready(Arc<crate::stepbuf::StepBuf>),
    /// The reader assembles the step; drop the guard when done.
    Yours(ReadGuard<'a>),
}

/// Keeps a step marked as being read by a reader (see [`Prefetcher::claim`]).
#[derive(Debug)]
pub(crate) struct ReadGuard<'a>(Option<(&'a Prefetcher, StepKey)>);

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        if let Some((p, key)) = self.0.take() {
            let mut state = p.shared.state.lock().unwrap_or_else(|p| p.into_inner());
            if state.pending.get(&key) == Some(&Pending::Reading) {
                state.pending.remove(&key);
            }
        }
    }
}

/// The prefetcher. Dropping it stops and joins the workers.
pub struct Prefetcher {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Prefetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prefetcher")
            .field("depth", &self.shared.depth)
            .field("workers", &self.workers.len())
            .finish()
    }
}

impl Prefetcher {
    /// Starts the workers.
    pub(crate) fn new(
        config: PrefetchConfig,
        plan: Plan,
        cache: Arc<StepCache>,
        render: Box<Render>,
    ) -> Prefetcher {
        // Enough for every worker's share of a few readers' windows, and for the cache's worth
        // of steps (the depth may grow: `depth.rs`).
        let max_queue = (config.depth.min(MAX_DEPTH) as usize)
            .saturating_mul(64)
            .max(1024)
            .max(cache.capacity());
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                pending: HashMap::new(),
                recent: LruCache::new(RECENT_READS),
                governor: (config.workers > 0 && config.adaptive)
                    .then(|| Governor::new(Instant::now())),
                meter: (config.workers > 0).then(Meter::new),
                shutdown: false,
            }),
            wake: Condvar::new(),
            finished: Condvar::new(),
            cache,
            render,
            plan,
            depth: config.depth,
            max_queue,
            prefill: OnceLock::new(),
            assembled: std::sync::atomic::AtomicU64::new(0),
            behind_at: std::sync::atomic::AtomicU64::new(0),
        });
        let workers = (0..config.workers)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new()
                    .name(format!("prefetch-{i}"))
                    .spawn(move || worker(&shared))
                    .expect("spawn prefetch worker")
            })
            .collect();
        Prefetcher { shared, workers }
    }

    /// The step after `key` in read order: the next step of the same rank, or the first step of
    /// the next epoch; `None` after the last epoch.
    pub(crate) fn next_key(plan: &Plan, key: StepKey) -> Option<StepKey> {
        if key.step + 1 < plan.steps_per_epoch() {
            Some(StepKey {
                step: key.step + 1,
                ..key
            })
        } else if key.epoch + 1 < plan.epochs() {
            Some(StepKey {
                epoch: key.epoch + 1,
                step: 0,
                ..key
            })
        } else {
            None
        }
    }

    /// Records that `key` is being read and queues the `depth` steps after it that are not
    /// cached, pending, or read recently. Remembering recent reads keeps readers that share a
    /// rank (a loader reading alternate steps with two workers) from queueing each other's
    /// steps after they were read: such readers drift apart, and one far behind would
    /// otherwise prefetch steps the other has long finished.
    pub(crate) fn hint(&self, key: StepKey) {
        let s = &self.shared;
        if s.depth == 0 {
            return;
        }
        let mut state = s.state.lock().unwrap_or_else(|p| p.into_inner());
        state.recent.put(key, ());
        // Another read of the step the rank read last walks ahead no further.
        let fresh = match &mut state.meter {
            Some(meter) => meter.read(key, Instant::now()),
            None => true,
        };
        // With prefill, most reads are served by the kernel and never reach this count, so
        // the governor's read rate would always favour prefetch off: it only runs without.
        if let Some(g) = state
            .governor
            .as_mut()
            .filter(|_| s.prefill.get().is_none())
        {
            let (on, paused) = g.tick(Instant::now());
            if paused {
                s.cache.count_prefetch_paused();
                log::debug!(
                    "prefetch paused for {:?}: reads are faster without it",
                    Governor::PERIOD
                );
            }
            if !on {
                return;
            }
        }
        if !fresh {
            return;
        }
        let mut next = key;
        let mut added = false;
        for _ in 0..s.depth_now(&state) {
            let Some(k) = Self::next_key(&s.plan, next) else {
                break;
            };
            next = k;
            let done = match s.prefill.get() {
                // Prefill: done once in the page cache (a cached step is stored from memory).
                Some(p) => p.is_stored(k),
                None => s.cache.contains(k),
            };
            if done || state.pending.contains_key(&k) || state.recent.contains(&k) {
                continue;
            }
            if state.queue.len() >= s.max_queue
                && let Some(old) = state.queue.pop_front()
            {
                state.pending.remove(&old);
            }
            trace!("prefetch queued {k:?}");
            state.queue.push_back(k);
            state.pending.insert(k, Pending::Queued);
            added = true;
        }
        drop(state);
        if added {
            s.wake.notify_all();
        }
    }

    /// Called by a read that missed the cache, before it assembles `key` itself. When a worker
    /// is assembling `key`, waits for it (at most `max_wait`) and returns the finished file
    /// (counted as a cache hit). Otherwise the step is the caller's: taken off the queue if it
    /// was queued, and marked as being read so no hint queues it until the returned guard is
    /// dropped.
    pub(crate) fn claim(&self, key: StepKey, max_wait: Duration) -> Claim<'_> {
        let s = &self.shared;
        s.behind();
        let mut state = s.state.lock().unwrap_or_else(|p| p.into_inner());
        match state.pending.get(&key) {
            Some(Pending::Assembling) => {
                s.cache.count_prefetch_waited();
                let deadline = Instant::now() + max_wait;
                while state.pending.get(&key) == Some(&Pending::Assembling) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Claim::Yours(ReadGuard(None));
                    }
                    state = s
                        .finished
                        .wait_timeout(state, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                drop(state);
                // Absent if the prefetch failed (the caller then reports the error itself).
                match s.cache.get_if_cached(key) {
                    Some(bytes) => Claim::Ready(bytes),
                    None => Claim::Yours(ReadGuard(None)),
                }
            }
            Some(Pending::Reading) => Claim::Yours(ReadGuard(None)),
            queued => {
                if queued.is_some() {
                    state.queue.retain(|k| *k != key);
                    s.cache.count_prefetch_claimed();
                }
                state.pending.insert(key, Pending::Reading);
                Claim::Yours(ReadGuard(Some((self, key))))
            }
        }
    }

    /// From now on, every prefetched step is also pushed to `prefill` (once).
    pub(crate) fn set_prefill(&self, prefill: Arc<dyn Prefill>) {
        let _ = self.shared.prefill.set(prefill);
    }

    /// The prefill target, if set.
    pub(crate) fn prefill(&self) -> Option<&Arc<dyn Prefill>> {
        self.shared.prefill.get()
    }

    /// How many steps ahead a read queues now (`depth.rs`).
    pub(crate) fn depth(&self) -> u64 {
        let state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        self.shared.depth_now(&state)
    }

    /// Whether prefetching is on now (the governor may pause it; see [`Governor`]).
    pub(crate) fn is_active(&self) -> bool {
        let state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        state.governor.as_ref().is_none_or(Governor::is_on)
    }

    /// Runs every queued prefetch on the calling thread (for zero-worker prefetchers).
    pub fn run_queued(&self) {
        while let Some(key) = take(&self.shared, false) {
            assemble(&self.shared, key);
        }
    }
}

/// The next queued key; with `wait`, blocks until there is one or shutdown.
fn take(s: &Shared, wait: bool) -> Option<StepKey> {
    let mut state = s.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        if state.shutdown {
            return None;
        }
        if let Some(k) = state.queue.pop_front() {
            state.pending.insert(k, Pending::Assembling);
            return Some(k);
        }
        if !wait {
            return None;
        }
        state = s.wake.wait(state).unwrap_or_else(|p| p.into_inner());
    }
}

fn assemble(s: &Shared, key: StepKey) {
    let mut rendered = None;
    let bytes = match s.cache.peek(key) {
        Some(bytes) => Some(bytes),
        None => {
            let started = Instant::now();
            let ahead = s.ahead();
            s.assembled
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut bytes = s.cache.buffer(ahead);
            let filled = match Arc::get_mut(&mut bytes) {
                Some(buf) => (s.render)(key, buf),
                None => Err(crate::error::Error::invalid("a recycled buffer is shared")),
            };
            match filled {
                Ok(()) => {
                    rendered = Some(started.elapsed());
                    s.cache.insert(key, bytes.clone(), true);
                    Some(bytes)
                }
                Err(e) => {
                    s.cache.count_prefetch_failed();
                    crate::log_limited!(
                        log::Level::Warn,
                        e.cause("prefetch"),
                        "prefetch of {key:?} failed (the reader will retry): {e}"
                    );
                    None
                }
            }
        }
    };
    // Readers waiting for this step go first: with prefill, a reader may be reading the step
    // through the page cache right now, its pages locked until the daemon answers, and a
    // store into those pages would wait for that answer.
    let (read_lately, depth) = {
        let mut state = s.state.lock().unwrap_or_else(|p| p.into_inner());
        state.pending.remove(&key);
        if let (Some(meter), Some(took)) = (&mut state.meter, rendered) {
            meter.assembled(took);
        }
        (state.recent.contains(&key), s.depth_now(&state))
    };
    s.finished.notify_all();
    if let (Some(p), Some(bytes)) = (s.prefill.get(), &bytes)
        && !read_lately
        && !p.is_stored(key)
    {
        p.store(key, bytes, is_trigger(&s.plan, key, depth));
    }
}

fn worker(s: &Shared) {
    while let Some(key) = take(s, true) {
        assemble(s, key);
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .shutdown = true;
        self.shared.wake.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    fn key(epoch: u64, step: u64) -> StepKey {
        StepKey {
            epoch,
            rank: 1,
            step,
        }
    }

    fn setup(depth: u64, capacity: usize, fail_step: Option<u64>) -> (Prefetcher, Arc<StepCache>) {
        let plan = Plan::new(100, 5, 2, 0, 2).unwrap(); // 10 steps per epoch, 2 epochs
        let cache = Arc::new(StepCache::new(capacity, 3));
        let render: Box<Render> = Box::new(move |k: StepKey, buf: &mut [u8]| {
            if Some(k.step) == fail_step {
                return Err(Error::invalid("injected"));
            }
            buf.fill(k.step as u8);
            Ok(())
        });
        let config = PrefetchConfig {
            depth,
            workers: 0,
            adaptive: false,
        };
        (Prefetcher::new(config, plan, cache.clone(), render), cache)
    }

    #[test]
    fn prefetches_the_next_steps_and_crosses_epochs() {
        let (p, cache) = setup(3, 8, None);
        p.hint(key(0, 7));
        p.run_queued();
        assert_eq!(cache.keys(), vec![key(1, 0), key(0, 9), key(0, 8)]);
        assert_eq!(cache.stats().prefetched, 3);
        // Already cached steps are not queued again.
        p.hint(key(0, 8));
        p.run_queued();
        assert_eq!(cache.stats().prefetched, 4, "only step 1 of epoch 1 is new");
        assert!(cache.contains(key(1, 1)));
        // The last step of the last epoch has nothing after it.
        p.hint(key(1, 9));
        p.run_queued();
        assert_eq!(cache.stats().prefetched, 4);
    }

    #[test]
    fn reads_after_prefetch_are_hits_and_waste_is_counted() {
        let (p, cache) = setup(2, 2, None);
        p.hint(key(0, 0));
        p.run_queued();
        assert_eq!(&**cache.get(key(0, 1)).unwrap(), &[1, 1, 1]);
        // Step 2 stays unread; hinting from step 2 queues steps 3 and 4.
        p.hint(key(0, 2));
        p.run_queued();
        let s = cache.stats();
        assert_eq!((s.hits, s.prefetched, s.prefetch_used), (1, 4, 1));
        // Capacity 2: inserting 3 and 4 evicted 1 (used) and 2 (never read: wasted).
        assert_eq!((s.evicted, s.prefetch_wasted), (2, 1));
        assert_eq!(cache.keys(), vec![key(0, 4), key(0, 3)]);
    }

    #[test]
    fn a_failed_prefetch_is_counted_and_leaves_no_entry() {
        let (p, cache) = setup(2, 8, Some(2));
        p.hint(key(0, 0));
        p.run_queued();
        assert!(cache.contains(key(0, 1)));
        assert!(!cache.contains(key(0, 2)));
        assert_eq!(cache.stats().prefetch_failed, 1);
        // A later hint tries again (the failure left nothing pending).
        p.hint(key(0, 1));
        p.run_queued();
        assert_eq!(cache.stats().prefetch_failed, 2);
        assert!(cache.contains(key(0, 3)));
    }

    #[test]
    fn readers_of_one_rank_do_not_queue_a_step_twice() {
        let (p, cache) = setup(4, 16, None);
        // Reader A reads step 0, reader B step 1; B's step 1 was claimed off the queue.
        p.hint(key(0, 0));
        let guard = p.claim(key(0, 1), Duration::ZERO);
        assert!(matches!(guard, Claim::Yours(_)));
        p.hint(key(0, 1));
        p.run_queued();
        drop(guard);
        // Steps 2..=5 were prefetched; step 1 (read by B itself) was not queued again.
        assert!(!cache.contains(key(0, 1)));
        assert_eq!(cache.stats().prefetched, 4);
        assert_eq!(cache.stats().prefetch_claimed, 1);
        // Reader A's late hint from step 0 does not queue step 1 while B reads it.
        let guard = p.claim(key(0, 1), Duration::ZERO);
        p.hint(key(0, 0));
        p.run_queued();
        drop(guard);
        assert!(!cache.contains(key(0, 1)));
        assert_eq!(cache.stats().prefetched, 4);
    }

    #[test]
    fn a_hint_does_bounded_work_whatever_the_depth() {
        // --prefetch-depth 2^64-1 over 10^12 epochs: the hint used to walk `depth` steps under
        // the lock (and queue up to depth * 64 of them). The watchdog only turns a hang into a
        // failure; the assertion is on the count.
        let plan = Plan::new(100, 5, 2, 0, 1_000_000_000_000).unwrap();
        let cache = Arc::new(StepCache::new(8, 3));
        let render: Box<Render> = Box::new(|k: StepKey, buf: &mut [u8]| {
            buf.fill(k.step as u8);
            Ok(())
        });
        let config = PrefetchConfig {
            depth: u64::MAX,
            workers: 0,
            adaptive: false,
        };
        let p = Arc::new(Prefetcher::new(config, plan, cache.clone(), render));
        let (tx, rx) = std::sync::mpsc::channel();
        let hinting = p.clone();
        std::thread::spawn(move || {
            hinting.hint(key(0, 0));
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("the hint returns (bounded work)");
        p.run_queued();
        assert_eq!(cache.stats().prefetched, MAX_DEPTH);
        // The last step queued is MAX_DEPTH steps after the hint (10 steps per epoch).
        let last = StepKey {
            epoch: MAX_DEPTH / 10,
            rank: 1,
            step: MAX_DEPTH % 10,
        };
        assert!(cache.contains(last), "{:?}", cache.keys());
    }

    #[test]
    fn background_workers_fill_the_cache() {
        let plan = Plan::new(100, 5, 2, 0, 2).unwrap();
        let cache = Arc::new(StepCache::new(16, 3));
        let render: Box<Render> = Box::new(|k: StepKey, buf: &mut [u8]| {
            buf.fill(k.step as u8);
            Ok(())
        });
        let config = PrefetchConfig {
            depth: 4,
            workers: 2,
            adaptive: false,
        };
        let p = Prefetcher::new(config, plan, cache.clone(), render);
        p.hint(key(0, 0));
        // Wait (bounded) for the workers; the assertion is about content, not speed.
        for _ in 0..2000 {
            if (1..=4).all(|s| cache.contains(key(0, s))) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        for s in 1..=4 {
            assert_eq!(&**cache.get(key(0, s)).unwrap(), &[s as u8; 3]);
        }
        drop(p);
    }
}

//! Page-cache prefill (`--prefill`): the policy, pure. The FUSE side (`fuse/kernel_cache.rs`)
//! only executes what is decided here: stores (`FUSE_NOTIFY_STORE`) and invalidations.
//!
//! With `--prefill` the kernel opens files itself (no OPEN, no RELEASE) and a stored file's
//! read never reaches the daemon, so:
//!
//! - every prefetched step file is pushed into the page cache ([`Prefill::store`]) unless it
//!   was read lately or is stored already;
//! - a *trigger* step ([`is_trigger`]: one every `depth / 2` global steps) is stored without
//!   its last page: reading it sends one small READ, the only sign that the reader got there,
//!   and the daemon then prefills further;
//! - on any READ of a step file ([`Prefilled::on_read`]), the pages of that rank's earlier
//!   stored steps are dropped (drop-behind), counting those read without a READ as served by
//!   the kernel; a step read from the daemon leaves its pages in the page cache too, so it is
//!   tracked and dropped the same way;
//! - pages the kernel reclaimed under memory pressure are read again: a READ of the missing
//!   range reaches the daemon and is served like any other (counted as a fallback);
//! - FORGET of an inode clears the belief that it is stored.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::shuffle::plan::{Plan, StepKey};

/// Steps ahead with prefill at least: the reader's reads of stored steps never reach the
/// daemon, which hears of it only at every trigger step (one every `depth / 2`), so the window
/// must be long for reads to stay ahead: 1 READ per 24 steps, ~96% of step files served by
/// the kernel alone.
pub(crate) const PREFILL_DEPTH: u64 = 48;

/// The page size of the page cache (the trigger steps leave their last page out).
pub(crate) const PAGE: usize = 4096;

/// A place finished step files can be pushed to ahead of the reader: the kernel page cache of
/// the mount (`fuse/kernel_cache.rs`). The prefetcher decides what and when; this knows how.
pub(crate) trait Prefill: Send + Sync {
    /// Pushes the step file; whether it is now stored. A `trigger` step is stored so that
    /// reading it still tells the daemon ([`is_trigger`]).
    fn store(&self, key: StepKey, bytes: &[u8], trigger: bool) -> bool;
    /// Whether the step file is believed to be in the page cache.
    fn is_stored(&self, key: StepKey) -> bool;
    /// Counters for `stats.json`.
    fn stats(&self) -> PrefillStats;
}

/// Whether step `key` is stored as a trigger step with prefetch depth `depth`: one every
/// `depth / 2` global steps.
pub(crate) fn is_trigger(plan: &Plan, key: StepKey, depth: u64) -> bool {
    plan.global_step(key).is_multiple_of((depth / 2).max(1))
}

/// How many bytes of a step file of `len` bytes to store: all, or for a trigger step all but
/// the last page (a file of one page is stored whole: its READ would be the file). Returns the
/// length and whether the step is stored as a trigger.
pub(crate) fn stored_len(len: usize, trigger: bool) -> (usize, bool) {
    let trigger = trigger && len > PAGE;
    let stored = if trigger {
        (len - 1) / PAGE * PAGE
    } else {
        len
    };
    (stored, trigger)
}

/// Prefill counters (`stats.json`, `"prefill"`), in the order `stats.json` has them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub(crate) struct PrefillStats {
    /// Stored steps whose pages were dropped behind their reader.
    pub(crate) dropped: u64,
    /// READs of stored steps whose pages the kernel no longer had.
    pub(crate) fallback_reads: u64,
    /// Stored steps read without a READ reaching the daemon.
    pub(crate) served_by_kernel: u64,
    /// Stores the kernel refused.
    pub(crate) store_failed: u64,
    /// Steps stored.
    pub(crate) stored: u64,
    /// Steps believed stored now.
    pub(crate) stored_now: u64,
    /// READs of trigger steps (the reader got there).
    pub(crate) trigger_reads: u64,
}

/// The step files believed to be in the page cache, and what to drop when a reader moves on.
#[derive(Debug)]
pub(crate) struct Prefilled {
    plan: Plan,
    stored: Mutex<HashMap<u64, Stored>>,
    counters: Counters,
}

/// A step file believed to be in the page cache.
#[derive(Clone, Copy, Debug)]
struct Stored {
    key: StepKey,
    /// Stored without its last page.
    trigger: bool,
    /// A READ of it reached the daemon.
    read: bool,
    /// Pushed by the prefetcher (not just read from the daemon).
    pushed: bool,
}

#[derive(Debug, Default)]
struct Counters {
    stored: AtomicU64,
    store_failed: AtomicU64,
    served_by_kernel: AtomicU64,
    trigger_reads: AtomicU64,
    fallback_reads: AtomicU64,
    dropped: AtomicU64,
}

impl Prefilled {
    /// Nothing stored yet, for steps of `plan`.
    pub(crate) fn new(plan: Plan) -> Prefilled {
        Prefilled {
            plan,
            stored: Mutex::new(HashMap::new()),
            counters: Counters::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Stored>> {
        self.stored.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Step `key` (inode `ino`) was stored (`trigger`: without its last page).
    pub(crate) fn stored(&self, ino: u64, key: StepKey, trigger: bool) {
        let stored = Stored {
            key,
            trigger,
            read: false,
            pushed: true,
        };
        self.lock().insert(ino, stored);
        self.counters.stored.fetch_add(1, Ordering::Relaxed);
    }

    /// A store was refused.
    pub(crate) fn store_failed(&self) {
        self.counters.store_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether step file `ino` is believed stored.
    pub(crate) fn is_stored(&self, ino: u64) -> bool {
        self.lock().contains_key(&ino)
    }

    /// A READ of step file `ino` (step `key`) reached the daemon: the reader is at `key`.
    /// Counts it, and returns the inodes of the same rank's earlier stored steps, whose pages
    /// are to be dropped (they are forgotten here).
    pub(crate) fn on_read(&self, ino: u64, key: StepKey) -> Vec<u64> {
        let c = &self.counters;
        let here = self.plan.global_step(key);
        let mut map = self.lock();
        match map.get_mut(&ino) {
            Some(s) if s.pushed => {
                let counter = if s.trigger && !s.read {
                    &c.trigger_reads
                } else {
                    &c.fallback_reads
                };
                counter.fetch_add(1, Ordering::Relaxed);
                s.read = true;
            }
            Some(_) => {}
            // A step read from the daemon also leaves its pages in the page cache: track it so
            // the next drop-behind of this rank drops them too.
            None => {
                let read = Stored {
                    key,
                    trigger: false,
                    read: true,
                    pushed: false,
                };
                map.insert(ino, read);
            }
        }
        let behind: Vec<(u64, Stored)> = map
            .iter()
            .filter(|(_, s)| s.key.rank == key.rank && self.plan.global_step(s.key) < here)
            .map(|(ino, s)| (*ino, *s))
            .collect();
        for (ino, _) in &behind {
            map.remove(ino);
        }
        drop(map);
        for (_, s) in &behind {
            if !s.read {
                c.served_by_kernel.fetch_add(1, Ordering::Relaxed);
            }
            c.dropped.fetch_add(1, Ordering::Relaxed);
        }
        behind.into_iter().map(|(ino, _)| ino).collect()
    }

    /// The kernel forgot inode `ino`: its pages are gone.
    pub(crate) fn forget(&self, ino: u64) {
        self.lock().remove(&ino);
    }

    /// A snapshot of the counters.
    pub(crate) fn stats(&self) -> PrefillStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PrefillStats {
            stored: get(&c.stored),
            store_failed: get(&c.store_failed),
            served_by_kernel: get(&c.served_by_kernel),
            trigger_reads: get(&c.trigger_reads),
            fallback_reads: get(&c.fallback_reads),
            dropped: get(&c.dropped),
            stored_now: self.lock().len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(step: u64, rank: u64) -> StepKey {
        StepKey {
            epoch: 0,
            rank,
            step,
        }
    }

    #[test]
    fn a_read_drops_the_earlier_steps_of_its_rank_and_counts_them() {
        let plan = Plan::new(100, 5, 2, 0, 1).unwrap(); // 10 steps per epoch
        let p = Prefilled::new(plan.clone());
        for step in 0..4 {
            p.stored(10 + step, key(step, 0), is_trigger(&plan, key(step, 0), 4));
        }
        p.stored(20, key(0, 1), false);
        // The reader of rank 0 reads step 2 (a trigger: 2 is a multiple of 4 / 2).
        let mut dropped = p.on_read(12, key(2, 0));
        dropped.sort_unstable();
        assert_eq!(dropped, [10, 11], "steps 0 and 1 of rank 0 only");
        let s = p.stats();
        assert_eq!((s.trigger_reads, s.served_by_kernel, s.dropped), (1, 2, 2));
        assert_eq!((s.stored, s.stored_now), (5, 3));
        // A step of rank 1 read from the daemon is tracked, then dropped behind.
        assert!(p.on_read(21, key(1, 1)).contains(&20));
        assert!(p.is_stored(21));
        p.forget(21);
        assert!(!p.is_stored(21));
        assert_eq!(stored_len(3 * PAGE, true), (2 * PAGE, true));
        assert_eq!(stored_len(2 * PAGE + 1, true), (2 * PAGE, true));
        assert_eq!(stored_len(PAGE, true), (PAGE, false));
    }
}

//! How far ahead to prefetch: far enough that a step is queued at least as long before its
//! rank reads it as its assembly takes (with a margin for slow assemblies), and never so far
//! that the steps prefetched for every active rank would not fit the step cache.
//!
//! Measured by the prefetcher itself, without a clock of its own: each assembly's duration
//! (a smoothed value and mean deviation, as TCP estimates a round trip: RFC 6298), and the
//! interval between two reads of one rank. Over local disk an assembly takes less than a
//! read interval and the configured depth (`--prefetch-depth`) holds; over a remote store an
//! assembly takes a round trip or more, and the depth grows to cover it and its spread. The
//! configured depth is the floor.

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use lru::LruCache;

use crate::shuffle::plan::StepKey;

/// Ranks whose last read is remembered (the active ranks are counted among them).
const RANKS: NonZeroUsize = NonZeroUsize::new(1024).expect("non-zero");

/// Gaps between two reads of a rank longer than this (a checkpoint, an evaluation) are not
/// read intervals.
const PAUSE: Duration = Duration::from_secs(10);

/// A rank is active if it read within this many read intervals (at least [`ACTIVE_MIN`]).
const ACTIVE_INTERVALS: f64 = 8.0;
const ACTIVE_MIN: Duration = Duration::from_secs(1);

/// What the meter remembers of a rank.
#[derive(Clone, Copy, Debug)]
struct Rank {
    last: StepKey,
    furthest: (u64, u64),
    at: Instant,
}

/// Deepest the measures take a depth (more only by `--prefetch-depth`): a hint walks this
/// many steps under the prefetcher's lock.
const ADAPTIVE_MAX: u64 = 256;

/// The measures (see the module docs).
#[derive(Debug)]
pub(super) struct Meter {
    /// Smoothed assembly time and its mean deviation, in seconds.
    srtt: f64,
    rttvar: f64,
    assembled: u64,
    /// Smoothed interval between two reads of one rank, in seconds.
    interval: f64,
    intervals: u64,
    /// Each rank's last step read, its furthest step read, and when that was first read.
    last_read: LruCache<u64, Rank>,
    /// Ranks read lately, counted every [`Meter::COUNT_EVERY`] reads.
    active: usize,
    reads: u64,
}

impl Meter {
    const COUNT_EVERY: u64 = 64;

    pub(super) fn new() -> Meter {
        Meter {
            srtt: 0.0,
            rttvar: 0.0,
            assembled: 0,
            interval: 0.0,
            intervals: 0,
            last_read: LruCache::new(RANKS),
            active: 1,
            reads: 0,
        }
    }

    /// A step took `took` to assemble.
    pub(super) fn assembled(&mut self, took: Duration) {
        let r = took.as_secs_f64();
        if self.assembled == 0 {
            self.srtt = r;
            self.rttvar = r / 2.0;
        } else {
            self.rttvar = 0.75 * self.rttvar + 0.25 * (self.srtt - r).abs();
            self.srtt = 0.875 * self.srtt + 0.125 * r;
        }
        self.assembled += 1;
    }

    /// A read of step `key` at `now`. Returns whether it is another step than the rank's
    /// last read (a step file takes several reads: the prefetcher walks ahead once per step).
    /// Read intervals count only reads past the rank's furthest step, so two loader workers
    /// reading alternate steps of one rank measure the rank's pace, not their interleaving;
    /// a rank that starts over (a resume) after a pause starts afresh.
    pub(super) fn read(&mut self, key: StepKey, now: Instant) -> bool {
        let pos = (key.epoch, key.step);
        let Some(rank) = self.last_read.get_mut(&key.rank) else {
            self.last_read.put(
                key.rank,
                Rank {
                    last: key,
                    furthest: pos,
                    at: now,
                },
            );
            self.count(now);
            return true;
        };
        let fresh = rank.last != key;
        rank.last = key;
        let gap = now.saturating_duration_since(rank.at);
        if pos > rank.furthest {
            rank.furthest = pos;
            rank.at = now;
            if gap < PAUSE {
                let g = gap.as_secs_f64();
                self.interval = if self.intervals == 0 {
                    g
                } else {
                    0.875 * self.interval + 0.125 * g
                };
                self.intervals += 1;
            }
        } else if fresh && gap >= PAUSE {
            *rank = Rank {
                last: key,
                furthest: pos,
                at: now,
            };
        }
        if fresh {
            self.count(now);
        }
        fresh
    }

    /// Counts the active ranks every [`Meter::COUNT_EVERY`] steps read.
    fn count(&mut self, now: Instant) {
        self.reads += 1;
        if self.reads % Self::COUNT_EVERY == 1 {
            let window = ACTIVE_MIN.max(Duration::from_secs_f64(
                (self.interval * ACTIVE_INTERVALS).min(PAUSE.as_secs_f64()),
            ));
            self.active = self
                .last_read
                .iter()
                .filter(|(_, r)| now.saturating_duration_since(r.at) <= window)
                .count()
                .max(1);
        }
    }

    /// The depth for a floor of `floor` steps and a cache of `capacity` step files.
    pub(super) fn depth(&self, floor: u64, capacity: usize) -> u64 {
        if self.assembled == 0 || self.intervals == 0 {
            return floor;
        }
        depth_for(
            self.srtt + 4.0 * self.rttvar,
            self.interval,
            floor,
            ((capacity / (2 * self.active)) as u64).min(ADAPTIVE_MAX),
        )
    }
}

/// The steps ahead needed for an assembly of `lead` seconds when a rank reads a step every
/// `interval` seconds: `ceil(lead / interval) + 1`, at least `floor`, and more than `floor`
/// only up to `bound` (half the cache's share of one active rank).
pub(super) fn depth_for(lead: f64, interval: f64, floor: u64, bound: u64) -> u64 {
    let needed = if interval > 0.0 {
        (lead / interval).ceil().min(1e9) as u64 + 1
    } else {
        u64::MAX
    };
    floor.max(needed.min(bound))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_covers_the_assembly_within_the_cache() {
        // Local disk: assembly far shorter than a read interval: the floor.
        assert_eq!(depth_for(0.000_1, 0.05, 4, 100), 4);
        // 20 ms round trips (and spread) with reads every 5 ms: 60 ms ahead, 13 steps.
        assert_eq!(depth_for(0.06, 0.005, 4, 100), 13);
        // ... bounded by the cache, never below the floor.
        assert_eq!(depth_for(0.06, 0.005, 4, 8), 8);
        assert_eq!(depth_for(0.06, 0.005, 4, 1), 4);
        // Readers as fast as they can: bounded.
        assert_eq!(depth_for(0.06, 0.0, 4, 50), 50);
    }

    #[test]
    fn the_meter_follows_the_assemblies_and_the_reads() {
        let mut m = Meter::new();
        assert_eq!(m.depth(4, 1024), 4, "nothing measured: the floor");
        let t0 = Instant::now();
        let key = |rank, step| StepKey {
            epoch: 0,
            rank,
            step,
        };
        for i in 0..200u32 {
            // Two ranks reading a step every 10 ms each, in three reads; assemblies of 50 ms.
            let t = t0 + Duration::from_millis(10) * i;
            for rank in 0..2 {
                for part in 0..3 {
                    m.read(key(rank, u64::from(i)), t + Duration::from_micros(part));
                }
            }
            m.assembled(Duration::from_millis(50));
        }
        // 50 ms (no spread left) over 10 ms: 5 + 1.
        assert!((m.interval - 0.01).abs() < 1e-9, "{}", m.interval);
        assert_eq!(m.active, 2);
        assert_eq!(m.depth(4, 1024), 6);
        // A cache of 8 files for 2 ranks: 2 each at most, so the floor.
        assert_eq!(m.depth(4, 8), 4);
        // A pause (a checkpoint) is not an interval.
        m.read(key(0, 1000), t0 + Duration::from_secs(60));
        assert!((m.interval - 0.01).abs() < 1e-9);
        // Two loader workers reading alternate steps of rank 5, each step in two reads,
        // interleaved: the rank's pace (a step every 5 ms), not the reads' microseconds.
        let mut m2 = Meter::new();
        for i in 0..400u32 {
            let t = t0 + Duration::from_millis(5) * i;
            assert!(m2.read(key(5, u64::from(i)), t));
            assert!(!m2.read(key(5, u64::from(i)), t + Duration::from_micros(1)));
            if i > 0 {
                // The other worker's last read of the step before.
                m2.read(key(5, u64::from(i - 1)), t + Duration::from_micros(2));
            }
        }
        assert!((m2.interval - 0.005).abs() < 1e-6, "{}", m2.interval);
        // A resume from an earlier step after a pause starts afresh.
        m2.read(key(5, 10), t0 + Duration::from_secs(100));
        m2.read(
            key(5, 11),
            t0 + Duration::from_secs(100) + Duration::from_millis(5),
        );
        assert!((m2.interval - 0.005).abs() < 1e-6, "{}", m2.interval);
        // Slow, spread assemblies go deeper.
        for ms in [20, 200, 20, 200, 20, 200] {
            m.assembled(Duration::from_millis(ms));
        }
        assert!(m.depth(4, 1024) > 10, "{}", m.depth(4, 1024));
    }
}

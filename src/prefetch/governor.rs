//! The governor: whether prefetching pays, decided from the read rate the readers achieve.

use std::time::{Duration, Instant};

/// Decides, from the read rate the readers achieve, whether prefetching helps.
///
/// Prefetch moves step assembly to other threads. When readers leave CPU idle (a trainer
/// computing between reads, or one reader on a multi-core node) that hides the assembly; when
/// unpaced readers already keep every core busy, it only adds hand-offs and cache-cold copies
/// (measured: two unpaced readers on 2 vCPUs lose ~20%). So the governor runs an experiment
/// every [`Governor::PERIOD`]: reads with prefetch off for [`Governor::PROBE`], then on for as
/// long, and keeps prefetch off for the next period only if reads were more than 5% faster
/// without it. Each win of prefetch doubles the time to the next experiment (up to
/// [`Governor::MAX_PERIOD`]), as an experiment costs a paced reader the steps it reads
/// without prefetch. A paced reader reads at the same rate either way, so the tie keeps prefetch on
/// (it still lowers the latency of each read). Driven by the reads themselves: no thread, no
/// timer; [`Governor::tick`] takes the time as an argument, so tests need no clock.
#[derive(Clone, Debug)]
pub(crate) struct Governor {
    phase: Phase,
    started: Instant,
    last: Instant,
    /// Time spent reading in the current probe: gaps between reads longer than
    /// [`Governor::GAP`] (nobody reading) do not count.
    active: Duration,
    reads: u64,
    rate_off: f64,
    on: bool,
    /// Time until the next experiment: doubles (up to [`Governor::MAX_PERIOD`]) each time
    /// prefetch wins, since each experiment costs a paced reader some prefetched steps.
    period: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Steady,
    ProbeOff,
    ProbeOn,
}

impl Governor {
    /// Time between experiments, at first and after prefetch lost one.
    pub(crate) const PERIOD: Duration = Duration::from_secs(5);
    /// Longest time between experiments.
    pub(crate) const MAX_PERIOD: Duration = Duration::from_secs(80);
    /// Reading time of each half of an experiment.
    pub(crate) const PROBE: Duration = Duration::from_millis(250);
    /// A pause between two reads counts as reading time up to this long (longer pauses are
    /// mostly idle time).
    pub(crate) const GAP: Duration = Duration::from_millis(50);

    /// Starts with prefetch on, first experiment after one period.
    pub(crate) fn new(now: Instant) -> Governor {
        Governor {
            phase: Phase::Steady,
            started: now,
            last: now,
            active: Duration::ZERO,
            reads: 0,
            rate_off: 0.0,
            on: true,
            period: Self::PERIOD,
        }
    }

    /// Records one read at `now`; returns whether prefetch is on, and whether this read just
    /// decided to pause it for a period.
    pub(crate) fn tick(&mut self, now: Instant) -> (bool, bool) {
        let since_last = now.saturating_duration_since(self.last).min(Self::GAP);
        self.last = now;
        let mut paused = false;
        match self.phase {
            Phase::Steady if now.saturating_duration_since(self.started) >= self.period => {
                self.phase = Phase::ProbeOff;
                self.active = Duration::ZERO;
                self.reads = 0;
                self.on = false;
            }
            Phase::Steady => {}
            Phase::ProbeOff | Phase::ProbeOn => {
                self.reads += 1;
                self.active += since_last;
                if self.active >= Self::PROBE {
                    let rate = self.reads as f64 / self.active.as_secs_f64();
                    if self.phase == Phase::ProbeOff {
                        self.rate_off = rate;
                        self.phase = Phase::ProbeOn;
                        self.on = true;
                    } else {
                        self.on = self.rate_off <= rate * 1.05;
                        paused = !self.on;
                        self.period = if self.on {
                            (self.period * 2).min(Self::MAX_PERIOD)
                        } else {
                            Self::PERIOD
                        };
                        self.phase = Phase::Steady;
                        self.started = now;
                    }
                    self.active = Duration::ZERO;
                    self.reads = 0;
                }
            }
        }
        (self.on, paused)
    }

    /// Whether prefetch is on.
    pub(crate) fn is_on(&self) -> bool {
        self.on
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn governor_pauses_prefetch_only_when_reads_are_faster_without_it() {
        let t0 = Instant::now();
        let us = |n: u64| t0 + Duration::from_micros(n);
        // Reads at a steady pace `off_us` apart without prefetch and `on_us` apart with it.
        let run = |off_us: u64, on_us: u64| {
            let mut g = Governor::new(t0);
            assert_eq!(g.tick(us(1_000_000)), (true, false), "steady at first");
            let mut t = 5_000_000;
            assert_eq!(g.tick(us(t)), (false, false), "the experiment starts: off");
            while !g.is_on() {
                t += off_us;
                g.tick(us(t));
            }
            let mut decided = (true, false);
            while g.phase == Phase::ProbeOn {
                t += on_us;
                decided = g.tick(us(t));
            }
            // An idle minute in the next period changes nothing until it ends.
            assert_eq!(g.tick(us(t + 4_000_000)).0, decided.0);
            decided
        };
        assert_eq!(run(100, 125), (false, true), "20% faster off: paused");
        assert_eq!(run(100, 100), (true, false), "a tie keeps prefetch on");
        assert_eq!(run(100, 103), (true, false), "within 5%: on");
        assert_eq!(run(200, 100), (true, false), "faster on: on");
    }
}

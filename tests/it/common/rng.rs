//! The one random number generator of the tests: SplitMix64 (the same generator as
//! `shufflefs::feistel::mix`, which is its output function), seeded, never the OS.
//!
//! A [`Rng`] can also replay a list of choices ([`Rng::replay`]): a proptest strategy then
//! generates the list, so a generator written against this type (`below`, `pick`, ...) gets
//! proptest's shrinking for free: shorter lists and smaller values are simpler choices (every
//! choice past the end of the list is 0, the first option).

/// One SplitMix64 step: advances `state` and returns the next value.
pub fn splitmix(state: &mut u64) -> u64 {
    let current = *state;
    *state = current.wrapping_add(shufflefs::feistel::GOLDEN);
    shufflefs::feistel::mix(current)
}

/// A seeded SplitMix64 stream, or a replayed list of choices.
#[derive(Clone, Debug)]
pub struct Rng(Source);

#[derive(Clone, Debug)]
enum Source {
    SplitMix(u64),
    Replay(Vec<u64>, usize),
}

impl Rng {
    /// SplitMix64 from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(Source::SplitMix(seed))
    }

    /// Replays `choices`, then 0 for ever.
    pub fn replay(choices: Vec<u64>) -> Rng {
        Rng(Source::Replay(choices, 0))
    }

    pub fn next(&mut self) -> u64 {
        match &mut self.0 {
            Source::SplitMix(state) => splitmix(state),
            Source::Replay(choices, at) => {
                let v = choices.get(*at).copied().unwrap_or(0);
                *at += 1;
                v
            }
        }
    }

    /// In `[0, n)`.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next() % n
    }

    /// In `[0, n)`, as an index.
    pub fn index(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.index(xs.len())]
    }

    pub fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            xs.swap(i, self.index(i + 1));
        }
    }
}

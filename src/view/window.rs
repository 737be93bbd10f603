//! Stream-mode observations: observation `i` is the window of `window` records starting at
//! record `i * stride`.
//!
//! ```text
//! n_observations = floor((n_records - window) / stride) + 1    (0 if n_records < window)
//! records of observation i = [i*stride, i*stride + window)
//! ```
//!
//! With `--rewindow`, epoch `e`'s windows start at a phase instead of record 0, so a token
//! sits at another position of its window each epoch; every epoch has as many windows as the
//! largest phase leaves room for:
//!
//! ```text
//! phase(e) = mix(mix(seed ^ "rewindow") ^ e) mod stride
//! n_observations = floor((n_records - (stride - 1) - window) / stride) + 1
//! records of observation i in epoch e = [phase(e) + i*stride, phase(e) + i*stride + window)
//! ```
//!
//! Windows may cross shard boundaries; the dataset read splits them.

use crate::error::{Error, Result};
use crate::shuffle::feistel::mix;

/// Domain of the rewindow phases ("rewindow" in ASCII).
const DOMAIN_REWINDOW: u64 = 0x7265_7769_6e64_6f77;

/// The window geometry over a stream of `n_records` records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Windows {
    n_records: u64,
    window: u64,
    stride: u64,
    /// `--rewindow`: the key of the epochs' phases.
    rewindow: Option<u64>,
}

impl Windows {
    /// Validates and builds the geometry; `itemsize` is the larger of the stored and the
    /// served record size (a row of either must stay under 4 GiB).
    pub(crate) fn new(n_records: u64, window: u64, stride: u64, itemsize: u64) -> Result<Windows> {
        if window == 0 {
            return Err(Error::invalid("--window must be at least 1"));
        }
        if stride == 0 {
            return Err(Error::invalid("--stride must be at least 1"));
        }
        let row_bytes = window.checked_mul(itemsize);
        if row_bytes.is_none_or(|b| b > u64::from(u32::MAX)) {
            return Err(Error::invalid(format!(
                "--window {window} is too large: one row would exceed 4 GiB"
            )));
        }
        Ok(Windows {
            n_records,
            window,
            stride,
            rewindow: None,
        })
    }

    /// The same geometry with `--rewindow` under `seed`.
    pub(crate) fn rewindowed(self, seed: u64) -> Windows {
        Windows {
            rewindow: Some(mix(seed ^ DOMAIN_REWINDOW)),
            ..self
        }
    }

    /// Number of complete windows in the stream (in every epoch).
    pub(crate) fn n_observations(&self) -> u64 {
        let room = match self.rewindow {
            Some(_) => self.window.saturating_add(self.stride - 1),
            None => self.window,
        };
        if self.n_records < room {
            0
        } else {
            (self.n_records - room) / self.stride + 1
        }
    }

    /// The first record of epoch `epoch`'s windows: 0, or with `--rewindow` its phase.
    pub(crate) fn phase(&self, epoch: u64) -> u64 {
        self.rewindow
            .map_or(0, |key| mix(key ^ epoch) % self.stride)
    }

    /// First record of observation `i` (of epoch 0 with `--rewindow`).
    pub(crate) fn first_record(&self, observation: u64) -> u64 {
        observation * self.stride
    }

    /// First record of observation `i` in epoch `epoch`.
    pub(crate) fn first_record_in(&self, epoch: u64, observation: u64) -> u64 {
        self.phase(epoch) + observation * self.stride
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_formula() {
        let w = |n, win, s| Windows::new(n, win, s, 4).unwrap().n_observations();
        assert_eq!(w(0, 1, 1), 0);
        assert_eq!(w(9, 10, 10), 0);
        assert_eq!(w(10, 10, 10), 1);
        assert_eq!(w(19, 10, 10), 1);
        assert_eq!(w(20, 10, 10), 2);
        assert_eq!(w(20, 11, 10), 1);
        assert_eq!(w(21, 11, 10), 2, "next-token windows T+1 with stride T");
        assert_eq!(w(100, 3, 1), 98);
        assert_eq!(w(u64::MAX, 1, 1), u64::MAX);
    }

    #[test]
    fn last_window_fits() {
        for n in 0..60u64 {
            for win in 1..8 {
                for s in 1..8 {
                    let g = Windows::new(n, win, s, 1).unwrap();
                    let k = g.n_observations();
                    if k > 0 {
                        assert!(g.first_record(k - 1) + win <= n);
                    }
                    assert!(g.first_record(k) + win > n);
                }
            }
        }
    }

    #[test]
    fn rewindowed_epochs_fit_and_cover_each_token_at_most_once() {
        for n in 0..80u64 {
            for win in 1..9 {
                for s in 1..9 {
                    let g = Windows::new(n, win, s, 1).unwrap().rewindowed(5);
                    let k = g.n_observations();
                    for e in 0..6 {
                        let phase = g.phase(e);
                        assert!(phase < s);
                        if k > 0 {
                            assert!(g.first_record_in(e, k - 1) + win <= n, "{n} {win} {s} {e}");
                            // At most the largest phase and one stride are lost at the ends.
                            assert!(n - (g.first_record_in(e, k - 1) + win) < 2 * s + win);
                        }
                    }
                }
            }
        }
        // The phases are spread over [0, stride).
        let g = Windows::new(1 << 20, 2049, 2048, 2).unwrap().rewindowed(1);
        let phases: std::collections::HashSet<u64> = (0..64).map(|e| g.phase(e)).collect();
        assert!(phases.len() > 60, "{phases:?}");
        assert_eq!(Windows::new(1 << 20, 2049, 2048, 2).unwrap().phase(3), 0);
    }

    #[test]
    fn rejects_bad_geometry() {
        assert!(Windows::new(10, 0, 1, 4).is_err());
        assert!(Windows::new(10, 1, 0, 4).is_err());
        assert!(Windows::new(10, 1 << 31, 1, 4).is_err());
    }
}

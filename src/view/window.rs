//! Stream-mode observations: observation `i` is the window of `window` records starting at
//! record `i * stride`.
//!
//! ```text
//! n_observations = floor((n_records - window) / stride) + 1    (0 if n_records < window)
//! records of observation i = [i*stride, i*stride + window)
//! ```
//!
//! Windows may cross shard boundaries; the dataset read splits them.

use crate::error::{Error, Result};

/// The window geometry over a stream of `n_records` records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Windows {
    n_records: u64,
    window: u64,
    stride: u64,
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
        })
    }

    /// Number of complete windows in the stream.
    pub(crate) fn n_observations(&self) -> u64 {
        if self.n_records < self.window {
            0
        } else {
            (self.n_records - self.window) / self.stride + 1
        }
    }

    /// First record of observation `i`.
    pub(crate) fn first_record(&self, observation: u64) -> u64 {
        observation * self.stride
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
    fn rejects_bad_geometry() {
        assert!(Windows::new(10, 0, 1, 4).is_err());
        assert!(Windows::new(10, 1, 0, 4).is_err());
        assert!(Windows::new(10, 1 << 31, 1, 4).is_err());
    }
}

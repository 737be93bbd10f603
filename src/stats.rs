//! `stats.json`: the counters of the step cache, the prefetcher and the page-cache prefill, as
//! pretty JSON and a newline (its keys in alphabetical order, as they have always been).
//!
//! The file changes while mounted. Each open of it reads one rendering (`fuse/handles.rs`
//! keeps a snapshot per open), and its size in `stat` is that of a rendering at the time of
//! the `stat`. With `--prefill` every file is read through the page cache, which trusts the
//! size `stat` returned, while the counters can change between that `stat` and the read: a
//! rendering longer than the size would be cut, a shorter one zero-filled. So the JSON is then
//! padded to a multiple of [`PADDED_LEN`] bytes with carriage returns before its final newline:
//! JSON white space that a terminal does not show (each one moves the cursor back to the start
//! of the line the closing brace is on).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::cache::{self, StepCache};
use crate::prefetch::Prefetcher;
use crate::prefill::PrefillStats;

/// With `--prefill`, `stats.json` is padded to a multiple of this size.
pub(crate) const PADDED_LEN: usize = 4096;

/// The content of `stats.json`.
#[derive(Serialize)]
struct Stats {
    cache: cache::Stats,
    cache_enabled: bool,
    /// Step files handed to the kernel as memory files (`null`: the mount does not).
    passthrough: Option<PassthroughStats>,
    prefetch_active: bool,
    /// Steps a read queues ahead now (the deepest of the plans; 0 without prefetch).
    prefetch_depth: u64,
    prefill: Option<PrefillStats>,
    /// Remote reads of the process (`null` before the first).
    remote: Option<serde_json::Value>,
}

/// Counters of the opens of step files with a backing memory file (FUSE passthrough), kept
/// by the FUSE adapter.
#[derive(Debug, Default)]
pub(crate) struct Passthrough {
    /// Opens of step files answered with a memory file as their backing file.
    pub(crate) opened: AtomicU64,
    /// Opens of step files answered the usual way (the step was not prefetched into a memory
    /// file, or the kernel refused it): their reads reach the daemon.
    pub(crate) plain: AtomicU64,
}

#[derive(Serialize)]
struct PassthroughStats {
    opened: u64,
    plain: u64,
}

impl Passthrough {
    fn stats(&self) -> PassthroughStats {
        PassthroughStats {
            opened: self.opened.load(Ordering::Relaxed),
            plain: self.plain.load(Ordering::Relaxed),
        }
    }
}

/// The bytes of `stats.json` (see the module docs; `padded` with `--prefill`).
pub(crate) fn render(
    cache: Option<&StepCache>,
    prefetchers: &[impl std::ops::Deref<Target = Prefetcher>],
    passthrough: Option<&Passthrough>,
    padded: bool,
) -> Vec<u8> {
    let stats = Stats {
        cache: cache.map(StepCache::stats).unwrap_or_default(),
        cache_enabled: cache.is_some(),
        prefetch_active: prefetchers.iter().any(|p| p.is_active()),
        prefetch_depth: prefetchers.iter().map(|p| p.depth()).max().unwrap_or(0),
        passthrough: passthrough.map(Passthrough::stats),
        prefill: prefetchers
            .iter()
            .find_map(|p| p.prefill())
            .map(|p| p.stats()),
        remote: crate::storage::remote::stats().json(),
    };
    let mut out = serde_json::to_vec_pretty(&stats).expect("stats serialize");
    if padded {
        let len = (out.len() + 1).next_multiple_of(PADDED_LEN);
        out.resize(len - 1, b'\r');
    }
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bytes_are_those_of_a_json_value_with_sorted_keys() {
        let cache = StepCache::new(4, 3);
        cache.insert(
            crate::shuffle::plan::StepKey {
                epoch: 0,
                rank: 0,
                step: 1,
            },
            std::sync::Arc::new(vec![1, 2, 3].into()),
            true,
        );
        let prefill = PrefillStats {
            stored: 3,
            dropped: 1,
            ..PrefillStats::default()
        };
        let stats = Stats {
            cache: cache.stats(),
            cache_enabled: true,
            prefetch_active: false,
            prefetch_depth: 4,
            passthrough: Some(PassthroughStats {
                opened: 5,
                plain: 1,
            }),
            prefill: Some(prefill),
            remote: Some(serde_json::json!({"requests": 1})),
        };
        // How stats.json was made before it was a struct: a serde_json::Value, whose maps
        // sort their keys.
        let value = serde_json::json!({
            "cache_enabled": true,
            "cache": cache.stats(),
            "prefetch_active": false,
            "prefetch_depth": 4,
            "passthrough": {"opened": 5, "plain": 1},
            "prefill": prefill,
            "remote": {"requests": 1},
        });
        assert_eq!(
            serde_json::to_vec_pretty(&stats).unwrap(),
            serde_json::to_vec_pretty(&value).unwrap()
        );
        let padded = render(Some(&cache), &[] as &[&Prefetcher], None, true);
        assert_eq!(padded.len() % PADDED_LEN, 0);
        let end = padded.iter().rposition(|&b| b == b'}').unwrap();
        assert!(
            padded[end + 1..padded.len() - 1]
                .iter()
                .all(|&b| b == b'\r')
        );
        assert_eq!(padded.last(), Some(&b'\n'));
    }
}

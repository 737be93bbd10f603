//! Per-open state, by file handle: the `stats.json` snapshot an open reads (file handle 0: an
//! open with no state, every other file).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The opens that carry state.
#[derive(Debug, Default)]
pub(super) struct Handles {
    next: AtomicU64,
    /// `stats.json`: the snapshot rendered at open, so every READ of this open sees one
    /// version (a file read in several READs never mixes two renderings).
    snapshots: Mutex<HashMap<u64, Arc<[u8]>>>,
}

impl Handles {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<[u8]>>> {
        self.snapshots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new open reading `snapshot`; returns its file handle (never 0).
    pub(super) fn open_snapshot(&self, snapshot: Arc<[u8]>) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.lock().insert(fh, snapshot);
        fh
    }

    /// The snapshot open `fh` reads, if it is one.
    pub(super) fn snapshot(&self, fh: u64) -> Option<Arc<[u8]>> {
        self.lock().get(&fh).cloned()
    }

    /// The size of the snapshot open `fh` reads, if it is one.
    pub(super) fn snapshot_len(&self, fh: u64) -> Option<u64> {
        self.lock().get(&fh).map(|bytes| bytes.len() as u64)
    }

    /// Open `fh` is closed.
    pub(super) fn release(&self, fh: u64) {
        self.lock().remove(&fh);
    }
}

//! The kernel page cache as a prefill target: executes what `prefill.rs` decides, with
//! `FUSE_NOTIFY_STORE` (push a finished step file) and `inval_inode` (drop a step's pages).
//!
//! The kernel ignores a store to an inode it does not hold, so each store first looks the file
//! up through the daemon's own mount (a cached dentry costs nothing). Such a lookup makes an
//! unmount fail `EBUSY` while it runs: [`KernelCache::stop`] stops stores and waits until none
//! is in flight (`shufflefs unmount` asks for it by looking up [`QUIESCE_NAME`] in the mount's
//! root; [`RESUME_NAME`] starts them again after an unmount that failed).

use std::path::PathBuf;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use fuser::{INodeNo, Notifier};
use log::debug;

use crate::fs::ShuffleFs;
use crate::inode::Inodes;
use crate::prefill::{Prefill, PrefillStats, Prefilled, stored_len};
use crate::shuffle::plan::StepKey;
use crate::tree::{Node, step_path};

/// Names the daemon answers in the mount's root for `shufflefs unmount`, from root or the
/// daemon's user only (always `ENOENT`, never listed, never cached): looking up
/// [`QUIESCE_NAME`] stops prefill stores and returns once none is in flight, so the daemon
/// itself holds no path in its mount when the unmount comes; [`RESUME_NAME`] starts them
/// again after an unmount that failed (busy).
pub(crate) const QUIESCE_NAME: &str = ".shufflefs-quiesce";
/// See [`QUIESCE_NAME`].
pub(crate) const RESUME_NAME: &str = ".shufflefs-resume";

/// The page cache of one mount.
pub(crate) struct KernelCache {
    notifier: Notifier,
    mountpoint: PathBuf,
    inodes: Inodes,
    /// What is stored, and what to drop.
    policy: Prefilled,
    /// Stores in flight, and whether stores are stopped (before an unmount).
    stores: Mutex<Stores>,
    stores_done: Condvar,
}

#[derive(Debug, Default)]
struct Stores {
    in_flight: u32,
    stopped: bool,
}

impl std::fmt::Debug for KernelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelCache")
            .field("mountpoint", &self.mountpoint)
            .finish()
    }
}

impl KernelCache {
    /// Prefill into the page cache of the mount at `mountpoint`, served by `fs`.
    pub(crate) fn new(notifier: Notifier, mountpoint: PathBuf, fs: &ShuffleFs) -> KernelCache {
        KernelCache {
            notifier,
            mountpoint,
            inodes: fs.inodes().clone(),
            policy: Prefilled::new(fs.view().plan().clone()),
            stores: Mutex::new(Stores::default()),
            stores_done: Condvar::new(),
        }
    }

    fn stores(&self) -> std::sync::MutexGuard<'_, Stores> {
        self.stores.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops prefill stores and waits, at most `max_wait`, until none is in flight. Returns
    /// whether none is.
    pub(crate) fn stop(&self, max_wait: Duration) -> bool {
        let mut stores = self.stores();
        stores.stopped = true;
        let (stores, _) = self
            .stores_done
            .wait_timeout_while(stores, max_wait, |s| s.in_flight > 0)
            .unwrap_or_else(|p| p.into_inner());
        stores.in_flight == 0
    }

    /// Starts prefill stores again (after an unmount that failed).
    pub(super) fn resume(&self) {
        self.stores().stopped = false;
    }

    fn ino(&self, key: StepKey) -> u64 {
        self.inodes.ino(Node::StepNpy(key))
    }

    /// A READ of step file `ino` (step `key`) reached the daemon: drops the pages the policy
    /// says to drop.
    pub(super) fn on_read(&self, ino: u64, key: StepKey) {
        for ino in self.policy.on_read(ino, key) {
            if let Err(e) = self.notifier.inval_inode(INodeNo(ino), 0, 0) {
                debug!("inval_inode {ino} failed: {e}");
            }
        }
    }

    /// The kernel forgot inode `ino`.
    pub(super) fn forget(&self, ino: u64) {
        self.policy.forget(ino);
    }
}

impl Prefill for KernelCache {
    fn store(&self, key: StepKey, bytes: &[u8], trigger: bool) -> bool {
        let ino = self.ino(key);
        let path = self.mountpoint.join(step_path(key, false));
        {
            let mut stores = self.stores();
            if stores.stopped {
                return false;
            }
            stores.in_flight += 1;
        }
        let (len, trigger) = stored_len(bytes.len(), trigger);
        // The lookup makes the kernel hold the inode (a cached dentry costs nothing).
        let result = std::fs::symlink_metadata(&path)
            .and_then(|_| self.notifier.store(INodeNo(ino), 0, &bytes[..len]));
        {
            let mut stores = self.stores();
            stores.in_flight -= 1;
            if stores.in_flight == 0 {
                self.stores_done.notify_all();
            }
        }
        match result {
            Ok(()) => {
                self.policy.stored(ino, key, trigger);
                true
            }
            Err(e) => {
                self.policy.store_failed();
                debug!("prefill of {} failed: {e}", path.display());
                false
            }
        }
    }

    fn is_stored(&self, key: StepKey) -> bool {
        self.policy.is_stored(self.ino(key))
    }

    fn stats(&self) -> PrefillStats {
        self.policy.stats()
    }
}

//! Step files served by the kernel (FUSE passthrough, Linux 6.9+): an open of a step file is
//! answered with a memory file holding the step (`stepbuf.rs`) as its backing file, so the
//! reader's reads, `mmap` and end-of-file probes never reach the daemon. A step the cache
//! holds in a memory file is handed over as it is; any other (a cache miss, a mount without
//! cache) is copied into one first.
//!
//! The kernel allows one backing file per inode at a time, so every open of an inode shares
//! the first open's until the last one closes.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use fuser::{BackingId, Errno, FileHandle, FopenFlags, ReplyOpen};

use crate::fs::Bytes;
use crate::stats::Passthrough;
use crate::stepbuf::StepBuf;

/// One inode's backing file, shared by every open of it.
#[derive(Debug)]
struct Backing {
    id: BackingId,
    buf: Arc<StepBuf>,
    opens: usize,
}

/// Backing files of the inodes open now, and memory files to copy steps into.
#[derive(Debug, Default)]
pub(super) struct Backings {
    by_ino: Mutex<HashMap<u64, Backing>>,
    /// Memory files no inode uses any more, reused for copies once nobody holds them.
    free: Mutex<VecDeque<StepBuf>>,
    /// Registering a backing file failed (the daemon lacks CAP_SYS_ADMIN): opens are
    /// answered the usual way from then on.
    failed: AtomicBool,
    /// Counters (`stats.json`).
    pub(super) counters: Arc<Passthrough>,
}

/// Most memory files kept for copies, and most bytes in them.
const FREE_FILES: usize = 8;
const FREE_BYTES: usize = 64 << 20;

/// The flags of a passthrough open: `close()` costs no round trip.
const FLAGS: FopenFlags = FopenFlags::FOPEN_NOFLUSH;

impl Backings {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Backing>> {
        self.by_ino.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn free(&self) -> std::sync::MutexGuard<'_, VecDeque<StepBuf>> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether opens still get backing files.
    pub(super) fn live(&self) -> bool {
        !self.failed.load(Ordering::Relaxed)
    }

    /// Answers an open of `ino` with the backing file an open of it already has; otherwise
    /// gives the reply back.
    pub(super) fn reopen(&self, ino: u64, reply: ReplyOpen) -> Option<ReplyOpen> {
        let mut map = self.lock();
        let Some(b) = map.get_mut(&ino) else {
            return Some(reply);
        };
        b.opens += 1;
        reply.opened_passthrough(FileHandle(0), FLAGS, &b.id);
        self.counters.opened.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// A memory file holding exactly `bytes`: the step cache's own when it is one, else a
    /// copy.
    pub(super) fn backing_file(&self, bytes: Bytes<'_>) -> std::io::Result<Arc<StepBuf>> {
        if let Bytes::Step(buf, range) = &bytes
            && *range == (0..buf.len())
            && buf.memfd_fd().is_some()
        {
            return Ok(buf.clone());
        }
        self.counters.copied.fetch_add(1, Ordering::Relaxed);
        let len = bytes.len();
        let reused = {
            let mut free = self.free();
            let found = free.iter().position(|b| b.len() == len && b.unshared());
            found.and_then(|i| free.remove(i))
        };
        let mut buf = match reused {
            Some(buf) => buf,
            None => StepBuf::memfd(len)?,
        };
        buf.copy_from_slice(&bytes);
        Ok(Arc::new(buf))
    }

    /// Answers an open of `ino` with `buf` as its backing file (or the one an open of `ino`
    /// got meanwhile). When the kernel refuses to register it, passthrough ends: this open
    /// and every later one are answered with `fallback` flags.
    pub(super) fn open(&self, ino: u64, buf: Arc<StepBuf>, reply: ReplyOpen, fallback: FopenFlags) {
        let Some(reply) = self.reopen(ino, reply) else {
            return self.retire(buf);
        };
        let Some(fd) = buf.memfd_fd() else {
            return reply.error(Errno::from_i32(libc::EIO));
        };
        let mut map = self.lock();
        match reply.open_backing(fd) {
            Ok(id) => {
                reply.opened_passthrough(FileHandle(0), FLAGS, &id);
                self.counters.opened.fetch_add(1, Ordering::Relaxed);
                map.insert(ino, Backing { id, buf, opens: 1 });
            }
            Err(e) => {
                drop(map);
                if !self.failed.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "the kernel refused a passthrough backing file ({e}; it needs \
                         CAP_SYS_ADMIN): step files are served by the daemon's replies"
                    );
                }
                self.fell_back(reply, fallback);
            }
        }
    }

    /// Answers an open the usual way (no backing file): its reads reach the daemon.
    pub(super) fn fell_back(&self, reply: ReplyOpen, fallback: FopenFlags) {
        self.counters.fallback.fetch_add(1, Ordering::Relaxed);
        reply.opened(FileHandle(0), fallback);
    }

    /// An open of `ino` is closed: the last one gives the backing file up.
    pub(super) fn release(&self, ino: u64) {
        let mut map = self.lock();
        let Some(b) = map.get_mut(&ino) else { return };
        b.opens -= 1;
        if b.opens > 0 {
            return;
        }
        let Some(b) = map.remove(&ino) else { return };
        drop(map);
        // The id first: no open can be given this file from now on.
        drop(b.id);
        self.retire(b.buf);
    }

    /// Keeps a memory file nothing else references for later copies.
    fn retire(&self, buf: Arc<StepBuf>) {
        let Ok(buf) = Arc::try_unwrap(buf) else {
            return;
        };
        if buf.memfd_fd().is_none() {
            return;
        }
        let mut free = self.free();
        free.push_back(buf);
        let mut bytes: usize = free.iter().map(|b| b.len()).sum();
        while free.len() > FREE_FILES || bytes > FREE_BYTES {
            let Some(old) = free.pop_front() else { break };
            bytes -= old.len();
        }
    }
}

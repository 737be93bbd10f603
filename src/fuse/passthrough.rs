//! Step files served by the kernel (FUSE passthrough, Linux 6.9+): an open of a step file the
//! cache holds in a memory file (`stepbuf.rs`; the prefetcher assembles into one while it is
//! ahead of the readers) is answered with that file as its backing file, so the reader's
//! reads, `mmap` and end-of-file probes never reach the daemon. Any other open (a cache miss,
//! a step on the heap) is a plain one, served by the daemon's replies. A memory file once
//! handed over is never written again (`StepBuf::hand_out`).
//!
//! The kernel allows one backing file per inode at a time (another open gets `EBUSY`, and a
//! plain open of an inode with one gets `EINVAL`: both fail the reader's open with `EIO`). So
//! every open of an inode shares the backing file of the opens still open, decided under one
//! lock, and a passthrough open carries [`PASSTHROUGH_FH`], so only its own RELEASE counts.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use fuser::{BackingId, FileHandle, FopenFlags, ReplyOpen};

use crate::stats::Passthrough;
use crate::stepbuf::StepBuf;

/// The file handle of every passthrough open (a plain open has 0, a `stats.json` open a
/// small number): a RELEASE with it gives up one open of the inode's backing file.
pub(super) const PASSTHROUGH_FH: u64 = u64::MAX;

/// One inode's backing file, shared by every open of it.
#[derive(Debug)]
struct Backing {
    id: BackingId,
    /// Keeps the memory file (and the cache's entry, if it is one) alive while open.
    _buf: Arc<StepBuf>,
    opens: usize,
}

/// Backing files of the inodes open now.
#[derive(Debug, Default)]
pub(super) struct Backings {
    by_ino: Mutex<HashMap<u64, Backing>>,
    /// The kernel refused to register a backing file for lack of privilege (`EPERM`): every
    /// open is answered the usual way from then on.
    failed: AtomicBool,
    /// Counters (`stats.json`).
    pub(super) counters: Arc<Passthrough>,
}

/// The flags of a passthrough open: `close()` costs no round trip.
const FLAGS: FopenFlags = FopenFlags::FOPEN_NOFLUSH;

impl Backings {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Backing>> {
        self.by_ino.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether opens still get backing files.
    pub(super) fn live(&self) -> bool {
        !self.failed.load(Ordering::Relaxed)
    }

    fn share(&self, b: &mut Backing, reply: ReplyOpen) {
        b.opens += 1;
        reply.opened_passthrough(FileHandle(PASSTHROUGH_FH), FLAGS, &b.id);
        self.counters.opened.fetch_add(1, Ordering::Relaxed);
    }

    /// Answers an open of `ino`: with the backing file its other opens share if there is one
    /// by now, else with memory file `buf` registered as its backing file. When the kernel
    /// refuses to register it the open is answered the usual way (`fallback` flags), and for
    /// lack of privilege passthrough ends for the mount.
    pub(super) fn open(&self, ino: u64, buf: Arc<StepBuf>, reply: ReplyOpen, fallback: FopenFlags) {
        let mut map = self.lock();
        if let Some(b) = map.get_mut(&ino) {
            return self.share(b, reply);
        }
        let Some(fd) = buf.memfd_fd() else {
            return self.plain(reply, fallback);
        };
        match reply.open_backing(fd) {
            Ok(id) => {
                // From here the kernel may give its pages to readers: never written again.
                buf.hand_out();
                reply.opened_passthrough(FileHandle(PASSTHROUGH_FH), FLAGS, &id);
                self.counters.opened.fetch_add(1, Ordering::Relaxed);
                map.insert(
                    ino,
                    Backing {
                        id,
                        _buf: buf,
                        opens: 1,
                    },
                );
            }
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                if !self.failed.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "the kernel refused a passthrough backing file ({e}: it needs \
                         CAP_SYS_ADMIN): step files are served by the daemon's replies"
                    );
                }
                self.plain(reply, fallback)
            }
            Err(e) => {
                crate::log_limited!(
                    log::Level::Warn,
                    "passthrough registration",
                    "the kernel refused a passthrough backing file ({e}): this open is served \
                     by the daemon's replies"
                );
                self.plain(reply, fallback)
            }
        }
    }

    /// Answers an open of `ino` whose step is not in a memory file: with the backing file
    /// its other opens share if there is one (the kernel refuses a plain open beside them),
    /// else the usual way: its reads reach the daemon.
    pub(super) fn open_plain(&self, ino: u64, reply: ReplyOpen, fallback: FopenFlags) {
        let mut map = self.lock();
        if let Some(b) = map.get_mut(&ino) {
            return self.share(b, reply);
        }
        self.plain(reply, fallback)
    }

    /// The usual open (called with the lock held, so no backing file appears meanwhile).
    fn plain(&self, reply: ReplyOpen, fallback: FopenFlags) {
        self.counters.plain.fetch_add(1, Ordering::Relaxed);
        reply.opened(FileHandle(0), fallback);
    }

    /// Open `fh` of `ino` is closed: a passthrough open gives up its share of the backing
    /// file, the last one the file itself.
    pub(super) fn release(&self, ino: u64, fh: u64) {
        if fh != PASSTHROUGH_FH {
            return;
        }
        let mut map = self.lock();
        let Some(b) = map.get_mut(&ino) else { return };
        b.opens -= 1;
        if b.opens == 0 {
            // Dropping the id closes it (the kernel dropped the inode's reference before
            // sending this RELEASE); the memory file goes with its last reference.
            map.remove(&ino);
        }
    }
}

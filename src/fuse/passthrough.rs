//! Step files served by the kernel (FUSE passthrough, Linux 6.9+): an open of a step file the
//! cache holds in a memory file (`stepbuf.rs`; the prefetcher assembles into one while it is
//! ahead of the readers) is answered with that file as its backing file, so the reader's
//! reads, `mmap` and end-of-file probes never reach the daemon. Any other open (a cache miss,
//! a step on the heap) is a plain one, served by the daemon's replies. A memory file once
//! handed over is never written again (`StepBuf::hand_out`).
//!
//! The kernel allows one backing file per inode at a time (another open gets `EBUSY`), refuses
//! a plain open of an inode with one (`EINVAL`) and a backing file for an inode a plain open
//! has mapped (`ETXTBSY`); each fails the reader's open with `EIO`. So the opens of every
//! inode are counted under one lock, each kind by its file handle ([`PASSTHROUGH_FH`],
//! [`PLAIN_FH`]): an open shares the backing file of the opens still open, and no backing
//! file is registered while a plain open of the inode is open.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use fuser::{BackingId, FileHandle, FopenFlags, ReplyOpen};

use crate::stats::Passthrough;
use crate::stepbuf::StepBuf;

/// The file handle of every passthrough open (a `stats.json` open has a small number): its
/// RELEASE gives up one open of the inode's backing file.
pub(super) const PASSTHROUGH_FH: u64 = u64::MAX;
/// The file handle of every plain open of a step file on a passthrough mount: while one is
/// open, no backing file is registered for its inode (the kernel would refuse one beside it,
/// or the plain open's mapping beside one).
pub(super) const PLAIN_FH: u64 = u64::MAX - 1;

/// The opens of one inode: its backing file while passthrough opens of it are open, and how
/// many plain opens of it are open.
#[derive(Debug, Default)]
struct Opens {
    /// The registered backing file (the id closes when dropped) and the memory file it is.
    backing: Option<(BackingId, Arc<StepBuf>)>,
    passthrough: usize,
    plain: usize,
}

/// The opens of the step files open now.
#[derive(Debug, Default)]
pub(super) struct Backings {
    by_ino: Mutex<HashMap<u64, Opens>>,
    /// The kernel refused to register a backing file for lack of privilege (`EPERM`): every
    /// open is answered the usual way from then on.
    failed: AtomicBool,
    /// Counters (`stats.json`).
    pub(super) counters: Arc<Passthrough>,
}

/// The flags of a passthrough open: `close()` costs no round trip.
const FLAGS: FopenFlags = FopenFlags::FOPEN_NOFLUSH;

impl Backings {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Opens>> {
        self.by_ino.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether opens still get backing files.
    pub(super) fn live(&self) -> bool {
        !self.failed.load(Ordering::Relaxed)
    }

    /// Answers an open of `ino`: with the backing file its other opens share if there is one,
    /// else with memory file `buf` (the step cache's, if it holds the step in one) registered
    /// as its backing file unless a plain open of it is open, else the usual way (`fallback`
    /// flags: its reads reach the daemon). For lack of privilege to register a backing file,
    /// passthrough ends for the mount.
    pub(super) fn open(
        &self,
        ino: u64,
        buf: Option<Arc<StepBuf>>,
        reply: ReplyOpen,
        fallback: FopenFlags,
    ) {
        let mut map = self.lock();
        let opens = map.entry(ino).or_default();
        if let Some((id, _)) = &opens.backing {
            opens.passthrough += 1;
            reply.opened_passthrough(FileHandle(PASSTHROUGH_FH), FLAGS, id);
            self.counters.opened.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Some(buf) = buf.filter(|_| opens.plain == 0) else {
            return self.plain(opens, reply, fallback);
        };
        let Some(fd) = buf.memfd_fd() else {
            return self.plain(opens, reply, fallback);
        };
        match reply.open_backing(fd) {
            Ok(id) => {
                // From here the kernel may give its pages to readers: never written again.
                buf.hand_out();
                reply.opened_passthrough(FileHandle(PASSTHROUGH_FH), FLAGS, &id);
                self.counters.opened.fetch_add(1, Ordering::Relaxed);
                opens.passthrough += 1;
                opens.backing = Some((id, buf));
            }
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                if !self.failed.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "the kernel refused a passthrough backing file ({e}: it needs \
                         CAP_SYS_ADMIN): step files are served by the daemon's replies"
                    );
                }
                self.plain(opens, reply, fallback)
            }
            Err(e) => {
                crate::log_limited!(
                    log::Level::Warn,
                    "passthrough registration",
                    "the kernel refused a passthrough backing file ({e}): this open is served \
                     by the daemon's replies"
                );
                self.plain(opens, reply, fallback)
            }
        }
    }

    /// The usual open, counted (with the lock held: no backing file appears meanwhile).
    fn plain(&self, opens: &mut Opens, reply: ReplyOpen, fallback: FopenFlags) {
        opens.plain += 1;
        self.counters.plain.fetch_add(1, Ordering::Relaxed);
        reply.opened(FileHandle(PLAIN_FH), fallback);
    }

    /// Open `fh` of `ino` is closed (the kernel dropped its state of the open before sending
    /// the RELEASE): the last passthrough open gives the backing file up.
    pub(super) fn release(&self, ino: u64, fh: u64) {
        let mut map = self.lock();
        let Some(opens) = map.get_mut(&ino) else {
            return;
        };
        match fh {
            PASSTHROUGH_FH => {
                opens.passthrough = opens.passthrough.saturating_sub(1);
                if opens.passthrough == 0 {
                    // Dropping the id closes it; the memory file goes with its last reference.
                    opens.backing = None;
                }
            }
            PLAIN_FH => opens.plain = opens.plain.saturating_sub(1),
            _ => return,
        }
        if opens.passthrough == 0 && opens.plain == 0 {
            map.remove(&ino);
        }
    }
}

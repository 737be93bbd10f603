//! Where work that may block on shard or document files runs: the one place that decides.
//!
//! The core hands out such work as a value ([`ReadJob`], [`AttrJob`]); this runs it and sends
//! the reply. Without a read deadline (`--read-timeout 0`) a job runs on the FUSE thread that
//! received the request. With one, it runs under the deadline of a [`DeadlinePool`]: on the
//! FUSE thread while fewer than `threads - 1` FUSE threads are doing so (a hand-off costs more
//! than most reads), else on the pool; either way the watchdog answers `EIO` once the deadline
//! passes, so a stalled file can block at most `threads - 1` FUSE threads and `stat`, `ls` and
//! other steps keep being served. Exactly one of the job's answer and the `EIO` reaches the
//! kernel: both share the reply, and the first to take it answers.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fuser::{Errno, ReplyAttr, ReplyData, ReplyEntry};

use super::deadline::DeadlinePool;
use super::guarded;
use crate::error::{Error, Result};
use crate::fs::{Attr, AttrJob, ReadJob, ShuffleFs};

/// Most threads reading shards at once: stalled reads hold threads, and this many leave room
/// for the rest (a request waits in the queue beyond it, still under its deadline).
pub(crate) const MAX_IO_THREADS: usize = 64;

/// Runs jobs: inline, or under the read deadline (see the module docs).
#[derive(Debug)]
pub(super) struct Dispatch {
    /// `None`: no deadline, every job runs on its FUSE thread.
    pool: Option<DeadlinePool>,
    /// FUSE threads running a job under the deadline right now, and how many may.
    inline_jobs: AtomicUsize,
    inline_limit: usize,
}

impl Dispatch {
    /// Jobs answer `EIO` after `read_timeout` (`None`: no deadline), with `threads` FUSE
    /// threads.
    pub(super) fn new(read_timeout: Option<Duration>, threads: usize) -> Dispatch {
        Dispatch {
            pool: read_timeout.map(|t| DeadlinePool::new(t, 1, MAX_IO_THREADS)),
            inline_jobs: AtomicUsize::new(0),
            inline_limit: threads.saturating_sub(1),
        }
    }

    /// Runs a read job and answers `reply` with its bytes or its error.
    pub(super) fn read(&self, fs: &Arc<ShuffleFs>, job: ReadJob, reply: ReplyData) {
        let (ino, offset, size) = (fs.ino(job.node()), job.offset(), job.size());
        let what = move || {
            let node = job.node();
            format!(
                "read ino={ino} node={:?} offset={offset} size={size}",
                Some(node)
            )
        };
        self.run(fs, "read", ino, reply, what, move |fs, take| {
            with_scratch(|scratch| {
                let result = job.run(fs, scratch);
                if let Some(reply) = take() {
                    match result {
                        Ok(bytes) => reply.data(&bytes),
                        Err(e) => reply.error(read_failed(fs, ino, offset, size, &e)),
                    }
                }
            })
        });
    }

    /// Runs an attribute job and has `answer` send the result.
    pub(super) fn attr<R: Answer>(
        &self,
        fs: &Arc<ShuffleFs>,
        op: &'static str,
        job: AttrJob,
        reply: R,
        answer: impl FnOnce(&ShuffleFs, R, Result<Attr>) + Send + 'static,
    ) {
        let node = job.node();
        let what = move || format!("{op} of {node:?}");
        self.run(fs, op, fs.ino(node), reply, what, move |fs, take| {
            let attr = job.run(fs);
            if let Some(reply) = take() {
                answer(fs, reply, attr);
            }
        });
    }

    /// Runs `work`, which does its reads, then calls `take` for the reply and answers with it
    /// (see the module docs; `what` names the request in the log line of an `EIO`).
    fn run<R: Answer>(
        &self,
        fs: &Arc<ShuffleFs>,
        op: &'static str,
        ino: u64,
        reply: R,
        what: impl FnOnce() -> String + Send + 'static,
        work: impl FnOnce(&ShuffleFs, &dyn Fn() -> Option<R>) + Send + 'static,
    ) {
        let Some(pool) = &self.pool else {
            let slot = Cell::new(Some(reply));
            return work(fs, &|| slot.take());
        };
        let inline = self.claim_inline();
        let slot = Arc::new(Mutex::new(Some(reply)));
        let timeout = pool.timeout();
        let on_timeout = {
            let slot = slot.clone();
            move || {
                let reply = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(reply) = reply {
                    crate::log_limited!(
                        log::Level::Error,
                        format_args!("{op} deadline EIO"),
                        "{} did not finish within the {timeout:?} read deadline \
                         (--read-timeout): answered EIO",
                        what()
                    );
                    reply.fail(Errno::from_i32(libc::EIO));
                }
            }
        };
        let fs = fs.clone();
        let job = move || {
            guarded(op, ino, || {
                // Taken only after the work: if the deadline passed meanwhile, EIO was sent.
                let take = || slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                work(&fs, &take)
            })
        };
        if inline {
            pool.run_here(job, on_timeout);
            self.inline_jobs.fetch_sub(1, Ordering::AcqRel);
        } else {
            pool.submit(job, on_timeout);
        }
    }

    /// Whether this FUSE thread may run a job itself (no hand-off to the pool). Up to
    /// `threads - 1` may at once; the last one never does. A `true` is given back by
    /// [`Dispatch::run`].
    fn claim_inline(&self) -> bool {
        self.inline_jobs
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.inline_limit).then_some(n + 1)
            })
            .is_ok()
    }
}

/// Runs `f` with this thread's read buffer: grown once, never zero-filled again.
fn with_scratch<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    thread_local! {
        static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(f)
}

/// Logs a failed read (once, at the level the error chose) and returns its errno.
pub(super) fn read_failed(fs: &ShuffleFs, ino: u64, offset: u64, size: u32, e: &Error) -> Errno {
    crate::log_limited!(
        e.level(),
        e.cause("read"),
        "read ino={ino} node={:?} offset={offset} size={size} failed with errno {}: {e}",
        fs.node(ino).ok(),
        e.errno()
    );
    Errno::from_i32(e.errno())
}

/// A reply that can answer with an error (what the deadline's timeout action sends).
pub(super) trait Answer: Send + 'static {
    fn fail(self, errno: Errno);
}

impl Answer for ReplyEntry {
    fn fail(self, errno: Errno) {
        self.error(errno)
    }
}

impl Answer for ReplyData {
    fn fail(self, errno: Errno) {
        self.error(errno)
    }
}

impl Answer for ReplyAttr {
    fn fail(self, errno: Errno) {
        self.error(errno)
    }
}

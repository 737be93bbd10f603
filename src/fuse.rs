//! The FUSE adapter: translates fuser requests into [`ShuffleFs`] calls and results into
//! replies. It makes no decisions; every answer comes from `fs.rs`. Each failed request is
//! logged once here, at the level the error chose, with its errno.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, Notifier, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};
use log::debug;

use crate::deadline::DeadlinePool;
use crate::error::Error;
use crate::fs::{Access, Attr, DirEntry, DirSink, Kind, Node, ReadData, ShuffleFs};
use crate::prefetch::Prefill;
use crate::shuffle::plan::{Plan, StepKey};

/// The tree never changes while mounted, so the kernel may cache names and attributes for as
/// long as it likes.
const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Most threads reading shards at once: stalled reads hold threads, and this many leave room
/// for the rest (a request waits in the queue beyond it, still under its deadline).
pub(crate) const MAX_IO_THREADS: usize = 64;

/// Runs a request handler; a panic is answered with `EIO` (the reply is dropped while
/// unwinding, and fuser answers an unanswered request with `EIO`) and logged, so a bug in one
/// request never costs the mount a worker thread.
fn guarded(op: &str, ino: u64, handler: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(handler)) {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        crate::log_limited!(
            log::Level::Error,
            format_args!("{op} panicked"),
            "{op} ino={ino} panicked ({what}): answered EIO; please report this bug"
        );
    }
}

/// Who owns the files and their permission bits (the kernel enforces them: shufflefs always
/// mounts with `default_permissions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ownership {
    /// Owner of every file and directory.
    pub uid: u32,
    /// Group of every file and directory.
    pub gid: u32,
    /// Permission bits of files (write bits are refused: the tree is read-only).
    pub file_mode: u16,
    /// Permission bits of directories.
    pub dir_mode: u16,
}

impl Ownership {
    /// The calling process's user and group, files 0444 and directories 0555.
    pub fn current() -> Ownership {
        Ownership {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
            file_mode: crate::fs::FILE_PERM,
            dir_mode: crate::fs::DIR_PERM,
        }
    }
}

/// Adapter state: the filesystem plus the ownership and timestamps every attribute carries.
#[derive(Debug)]
pub(crate) struct FuseAdapter {
    fs: Arc<ShuffleFs>,
    owner: Ownership,
    mtime: SystemTime,
    /// How files are opened; chosen at `init` from what the kernel supports.
    open_flags: FopenFlags,
    /// Runs reads that touch shards with a deadline; `None`: on the FUSE thread, no deadline.
    pool: Option<DeadlinePool>,
    /// FUSE threads reading shards right now, and how many may (`threads - 1`).
    inline_reads: AtomicUsize,
    inline_limit: usize,
    /// State of opens that need it, by file handle (0: none).
    opens: Opens,
    /// The page-cache prefill, once the session exists (`mount.rs` sets it with `--prefill`).
    prefill: Arc<OnceLock<Arc<KernelCache>>>,
    /// `--prefill`: files are opened without a round trip (OPEN answers ENOSYS once, and the
    /// kernel then opens every file itself, through the page cache).
    prefill_mode: bool,
}

/// What an open with a non-zero file handle carries.
#[derive(Debug)]
enum OpenState {
    /// `stats.json`: the snapshot rendered at open, so every READ of this open sees one
    /// version (a file read in several READs never mixes two renderings).
    Snapshot(Arc<[u8]>),
}

#[derive(Debug, Default)]
struct Opens {
    next: AtomicU64,
    map: Mutex<HashMap<u64, OpenState>>,
}

impl Opens {
    /// The size of the `stats.json` snapshot of open `fh`, if it is one.
    fn snapshot_len(&self, fh: u64) -> Option<u64> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&fh)
            .map(|OpenState::Snapshot(bytes)| bytes.len() as u64)
    }

    fn add(&self, state: OpenState) -> u64 {
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(fh, state);
        fh
    }
}

/// The kernel page cache as a [`Prefill`] target. With `--prefill` the kernel opens files
/// itself (no OPEN, no RELEASE) and a stored file's read never reaches the daemon, so:
///
/// - a finished step file is pushed with `FUSE_NOTIFY_STORE` after the daemon looks the file up
///   through its own mount (the kernel ignores a store to an inode it does not hold);
/// - a *trigger* step (the prefetcher picks one every `depth / 2` steps) is stored without its
///   last page: reading it sends one small READ, the only sign that the reader got there, and
///   the daemon then prefills further and drops the pages of that rank's earlier steps
///   (drop-behind, `inval_inode`), counting those that were read without a READ as served by
///   the kernel;
/// - pages the kernel reclaimed under memory pressure are read again: a READ of the missing
///   range reaches the daemon and is served like any other (counted as a fallback);
/// - FORGET of an inode clears the belief that it is stored.
pub(crate) struct KernelCache {
    notifier: Notifier,
    mountpoint: PathBuf,
    ino_of: Box<dyn Fn(StepKey) -> u64 + Send + Sync>,
    plan: Plan,
    stored: Mutex<HashMap<u64, Stored>>,
    counters: PrefillCounters,
    /// Stores in flight, and whether stores are stopped (before an unmount).
    stores: Mutex<Stores>,
    stores_done: Condvar,
}

#[derive(Debug, Default)]
struct Stores {
    in_flight: u32,
    stopped: bool,
}

/// Names the daemon answers in the mount's root for `shufflefs unmount`, from root or the
/// daemon's user only (always `ENOENT`, never listed, never cached): looking up
/// [`QUIESCE_NAME`] stops prefill stores and returns once none is in flight, so the daemon
/// itself holds no path in its mount when the unmount comes; [`RESUME_NAME`] starts them
/// again after an unmount that failed (busy).
pub(crate) const QUIESCE_NAME: &str = ".shufflefs-quiesce";
/// See [`QUIESCE_NAME`].
pub(crate) const RESUME_NAME: &str = ".shufflefs-resume";

/// A step file believed to be in the page cache.
#[derive(Clone, Copy, Debug)]
struct Stored {
    key: StepKey,
    /// Stored without its last page.
    trigger: bool,
    /// A READ of it reached the daemon.
    read: bool,
    /// Pushed by the prefetcher (not just read from the daemon).
    pushed: bool,
}

impl std::fmt::Debug for KernelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelCache")
            .field("mountpoint", &self.mountpoint)
            .finish()
    }
}

/// Prefill counters (`stats.json`, `"prefill"`).
#[derive(Debug, Default)]
struct PrefillCounters {
    stored: AtomicU64,
    store_failed: AtomicU64,
    served_by_kernel: AtomicU64,
    trigger_reads: AtomicU64,
    fallback_reads: AtomicU64,
    dropped: AtomicU64,
}

/// The page size of the page cache (the trigger steps leave their last page out).
const PAGE: usize = 4096;

impl KernelCache {
    /// Prefill into the page cache of the mount at `mountpoint`, served by `fs`.
    pub(crate) fn new(notifier: Notifier, mountpoint: PathBuf, fs: &ShuffleFs) -> KernelCache {
        KernelCache {
            notifier,
            mountpoint,
            ino_of: fs.step_ino_fn(),
            plan: fs.view().plan().clone(),
            stored: Mutex::new(HashMap::new()),
            counters: PrefillCounters::default(),
            stores: Mutex::new(Stores::default()),
            stores_done: Condvar::new(),
        }
    }

    fn stores(&self) -> std::sync::MutexGuard<'_, Stores> {
        self.stores.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops prefill stores (each looks its file up through the mount, which makes an unmount
    /// fail `EBUSY` while it runs) and waits, at most `max_wait`, until none is in flight.
    /// Returns whether none is.
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
    pub(crate) fn resume(&self) {
        self.stores().stopped = false;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Stored>> {
        self.stored.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ordinal(&self, key: StepKey) -> u64 {
        self.plan.global_step(key)
    }

    /// A READ of step file `ino` (step `key`) reached the daemon: the reader is at `key`.
    /// Counts it, and drops the pages of the same rank's earlier stored steps.
    fn on_read(&self, ino: u64, key: StepKey) {
        let c = &self.counters;
        let here = self.ordinal(key);
        let mut map = self.lock();
        match map.get_mut(&ino) {
            Some(s) if s.pushed => {
                let counter = if s.trigger && !s.read {
                    &c.trigger_reads
                } else {
                    &c.fallback_reads
                };
                counter.fetch_add(1, Ordering::Relaxed);
                s.read = true;
            }
            Some(_) => {}
            // A step read from the daemon also leaves its pages in the page cache: track it so
            // the next drop-behind of this rank drops them too.
            None => {
                map.insert(
                    ino,
                    Stored {
                        key,
                        trigger: false,
                        read: true,
                        pushed: false,
                    },
                );
            }
        }
        let behind: Vec<(u64, Stored)> = map
            .iter()
            .filter(|(_, s)| s.key.rank == key.rank && self.ordinal(s.key) < here)
            .map(|(ino, s)| (*ino, *s))
            .collect();
        for (ino, _) in &behind {
            map.remove(ino);
        }
        drop(map);
        for (ino, s) in behind {
            if !s.read {
                c.served_by_kernel.fetch_add(1, Ordering::Relaxed);
            }
            c.dropped.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = self.notifier.inval_inode(INodeNo(ino), 0, 0) {
                debug!("inval_inode {ino} failed: {e}");
            }
        }
    }

    fn forget(&self, ino: u64) {
        self.lock().remove(&ino);
    }
}

impl Prefill for KernelCache {
    fn store(&self, key: StepKey, bytes: &[u8], trigger: bool) -> bool {
        let ino = (self.ino_of)(key);
        let path = self.mountpoint.join(crate::tree::step_path(key, false));
        {
            let mut stores = self.stores();
            if stores.stopped {
                return false;
            }
            stores.in_flight += 1;
        }
        let trigger = trigger && bytes.len() > PAGE;
        let len = if trigger {
            (bytes.len() - 1) / PAGE * PAGE
        } else {
            bytes.len()
        };
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
                let stored = Stored {
                    key,
                    trigger,
                    read: false,
                    pushed: true,
                };
                self.lock().insert(ino, stored);
                self.counters.stored.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                self.counters.store_failed.fetch_add(1, Ordering::Relaxed);
                debug!("prefill of {} failed: {e}", path.display());
                false
            }
        }
    }

    fn is_stored(&self, key: StepKey) -> bool {
        self.lock().contains_key(&(self.ino_of)(key))
    }

    fn stats(&self) -> serde_json::Value {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "stored": get(&c.stored),
            "store_failed": get(&c.store_failed),
            "served_by_kernel": get(&c.served_by_kernel),
            "trigger_reads": get(&c.trigger_reads),
            "fallback_reads": get(&c.fallback_reads),
            "dropped": get(&c.dropped),
            "stored_now": self.lock().len(),
        })
    }
}

impl FuseAdapter {
    /// Wraps `fs`; files carry `owner` and are dated `mtime`. With `read_timeout`, reads that
    /// touch shards run off the FUSE threads and answer `EIO` once it has passed.
    pub(crate) fn new(
        fs: ShuffleFs,
        owner: Ownership,
        mtime: SystemTime,
        read_timeout: Option<Duration>,
        threads: usize,
        prefill: bool,
    ) -> FuseAdapter {
        FuseAdapter {
            fs: Arc::new(fs),
            owner,
            mtime,
            open_flags: FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
            pool: read_timeout.map(|t| DeadlinePool::new(t, 1, MAX_IO_THREADS)),
            inline_reads: AtomicUsize::new(0),
            inline_limit: threads.saturating_sub(1),
            opens: Opens::default(),
            prefill: Arc::new(OnceLock::new()),
            prefill_mode: prefill,
        }
    }

    /// The filesystem (shared with the session).
    pub(crate) fn fs(&self) -> &Arc<ShuffleFs> {
        &self.fs
    }

    /// A lookup of [`QUIESCE_NAME`] or [`RESUME_NAME`]: answered `ENOENT` once done. The wait
    /// for stores in flight runs on its own thread: a store's lookup needs a FUSE thread.
    fn control(&self, quiesce: bool, reply: ReplyEntry) {
        let Some(kernel) = self.prefill.get().cloned() else {
            return reply.error(Errno::from_i32(libc::ENOENT));
        };
        if !quiesce {
            kernel.resume();
            debug!("prefill stores resumed");
            return reply.error(Errno::from_i32(libc::ENOENT));
        }
        let wait = move || {
            if kernel.stop(Duration::from_secs(5)) {
                debug!("prefill stores stopped for an unmount");
            } else {
                log::warn!("prefill stores still in flight after 5 s; the unmount may be busy");
            }
            reply.error(Errno::from_i32(libc::ENOENT));
        };
        if let Err(e) = std::thread::Builder::new()
            .name("quiesce".into())
            .spawn(wait)
        {
            log::warn!("cannot start a thread to stop prefill stores: {e}");
        }
    }

    /// Where `mount.rs` puts the page-cache prefill once the session exists.
    pub(crate) fn prefill_slot(&self) -> Arc<OnceLock<Arc<KernelCache>>> {
        self.prefill.clone()
    }

    /// READ: answered on this thread when it needs no shard (a cache hit, `info.json`...) or
    /// when there is no deadline; otherwise on the deadline pool.
    fn read_guarded(&self, ino: u64, offset: u64, size: u32, reply: ReplyData) {
        let access = if self.pool.is_some() {
            Access::Memory
        } else {
            Access::Any
        };
        let reply = match with_scratch(|scratch| {
            match self.fs.read_data(ino, offset, size, scratch, access) {
                Ok(ReadData::NeedsShards) => Some(reply),
                result => {
                    answer_read(&self.fs, ino, offset, size, result, scratch, reply);
                    None
                }
            }
        }) {
            Some(reply) => reply,
            None => return,
        };
        let Some(pool) = &self.pool else {
            unreachable!("Access::Any always reads");
        };
        let inline = self.claim_inline();
        let fs = self.fs.clone();
        let what = move || {
            format!(
                "read ino={ino} node={:?} offset={offset} size={size}",
                fs.node(ino).ok()
            )
        };
        self.under_deadline(pool, inline, "read", ino, reply, what, move |fs, take| {
            with_scratch(|scratch| {
                let result = fs.read_data(ino, offset, size, scratch, Access::Any);
                if let Some(reply) = take() {
                    answer_read(fs, ino, offset, size, result, scratch, reply);
                }
            })
        });
        if inline {
            self.inline_reads.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether this FUSE thread may do work that reads shard or document files itself (no
    /// hand-off to the pool). Up to `threads - 1` may at once; the last one never does, so a
    /// stalled file can block at most those, and `stat`, `ls` and other steps keep being
    /// served while the pool takes the rest. A `true` must be given back (`inline_reads`).
    fn claim_inline(&self) -> bool {
        self.inline_reads
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.inline_limit).then_some(n + 1)
            })
            .is_ok()
    }

    /// Runs `work` under the read deadline, on this thread (`inline`) or on the pool. `work`
    /// does its reads, then calls `take` for the reply and answers with it; if the deadline
    /// passes first, the watchdog takes the reply instead and answers `EIO` with a log line
    /// naming `what`. Whoever takes the reply first answers; the other finds nothing.
    #[allow(clippy::too_many_arguments)]
    fn under_deadline<R: Answer>(
        &self,
        pool: &DeadlinePool,
        inline: bool,
        op: &'static str,
        ino: u64,
        reply: R,
        what: impl FnOnce() -> String + Send + 'static,
        work: impl FnOnce(&ShuffleFs, &dyn Fn() -> Option<R>) + Send + 'static,
    ) {
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
        let fs = self.fs.clone();
        let run = move || {
            guarded(op, ino, || {
                // Taken only after the work: if the deadline passed meanwhile, EIO was sent.
                let take = || slot.lock().unwrap_or_else(|p| p.into_inner()).take();
                work(&fs, &take)
            })
        };
        if inline {
            pool.run_here(run, on_timeout);
        } else {
            pool.submit(run, on_timeout);
        }
    }

    /// Turns core attributes into the reply's TTL and `FileAttr`, detached from `self` (so a
    /// pool thread can use it).
    fn attr_fn(&self) -> impl Fn(&Attr) -> (Duration, FileAttr) + Send + 'static {
        let (owner, mtime) = (self.owner, self.mtime);
        move |a: &Attr| (Self::ttl(a), file_attr(owner, mtime, a))
    }

    /// Computes `node`'s attributes and has `answer` send them: on this thread when they need
    /// no shard, or when there is no deadline; otherwise under the read deadline like a READ
    /// (`EIO` once it passes), so a stalled document file cannot hang `stat` or a FUSE thread.
    fn with_deadline<R: Answer>(
        &self,
        op: &'static str,
        node: Node,
        reply: R,
        answer: impl FnOnce(&ShuffleFs, R, crate::error::Result<Attr>) + Send + 'static,
    ) {
        let Some(pool) = self
            .pool
            .as_ref()
            .filter(|_| self.fs.attr_needs_shards(node))
        else {
            return answer(&self.fs, reply, self.fs.node_attr(node));
        };
        let ino = self.fs.ino(node);
        let what = move || format!("{op} of {node:?}");
        // Like a READ: on this thread when an inline slot is free (`ls -l` of a step directory
        // sizes thousands of S.json one after the other; a hand-off each costs more than the
        // size), else on the pool.
        let inline = self.claim_inline();
        self.under_deadline(pool, inline, op, ino, reply, what, move |fs, take| {
            let attr = fs.node_attr(node);
            if let Some(reply) = take() {
                answer(fs, reply, attr);
            }
        });
        if inline {
            self.inline_reads.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn ttl(a: &Attr) -> Duration {
        if a.volatile { Duration::ZERO } else { TTL }
    }
}

/// Runs `f` with this thread's read buffer: grown once, never zero-filled again.
fn with_scratch<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    thread_local! {
        static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(f)
}

/// Sends a read's result.
fn answer_read(
    fs: &ShuffleFs,
    ino: u64,
    offset: u64,
    size: u32,
    result: crate::error::Result<ReadData>,
    scratch: &[u8],
    reply: ReplyData,
) {
    match result {
        Ok(ReadData::Scratch(n)) => reply.data(&scratch[..n]),
        Ok(ReadData::Shared(bytes, range)) => reply.data(&bytes[range]),
        Ok(ReadData::NeedsShards) => reply.error(Errno::from_i32(libc::EIO)),
        Err(e) => {
            crate::log_limited!(
                e.level(),
                e.cause("read"),
                "read ino={ino} node={:?} offset={offset} size={size} failed with errno {}: {e}",
                fs.node(ino).ok(),
                e.errno()
            );
            reply.error(Errno::from_i32(e.errno()))
        }
    }
}

/// The attributes FUSE replies with.
fn file_attr(owner: Ownership, mtime: SystemTime, a: &Attr) -> FileAttr {
    // A file whose content changes (stats.json) is dated now, so a page-cache reader sees
    // every new version (`FUSE_AUTO_INVAL_DATA` compares mtimes).
    let mtime = if a.volatile { SystemTime::now() } else { mtime };
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: mtime,
        mtime,
        ctime: mtime,
        crtime: mtime,
        kind: file_type(a.kind),
        perm: match a.kind {
            Kind::File => owner.file_mode & 0o7555,
            Kind::Directory => owner.dir_mode & 0o7777,
        },
        nlink: a.nlink,
        uid: owner.uid,
        gid: owner.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

/// A reply that can answer with an error (what the deadline's timeout action sends).
trait Answer: Send + 'static {
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

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::Directory => FileType::Directory,
        Kind::File => FileType::RegularFile,
    }
}

fn fail(op: &str, ino: u64, e: &Error) -> Errno {
    crate::log_limited!(
        e.level(),
        e.cause(op),
        "{op} ino={ino} failed with errno {}: {e}",
        e.errno()
    );
    Errno::from_i32(e.errno())
}

struct FuseDirSink(ReplyDirectory);

impl DirSink for FuseDirSink {
    fn add(&mut self, e: DirEntry) -> bool {
        self.0
            .add(INodeNo(e.ino), e.next_offset, file_type(e.kind), &e.name)
    }
}

impl Filesystem for FuseAdapter {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Lookups in one directory run in parallel; mmap works on direct_io files.
        let mut wanted = InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        if self.prefill_mode {
            // Files are then read through the page cache, stats.json too: its mtime changes on
            // every GETATTR, and with AUTO_INVAL_DATA the kernel then drops its old pages.
            wanted |= InitFlags::FUSE_AUTO_INVAL_DATA;
            // A step file not stored is read through the page cache too: let one READ carry
            // a whole file rather than 128 KiB pieces.
            if let Err(max) = config.set_max_readahead(1 << 20) {
                let _ = config.set_max_readahead(max);
            }
        }
        let supported = wanted & config.capabilities();
        if let Err(missing) = config.add_capabilities(supported) {
            debug!("kernel refused capabilities {missing:?}");
        }
        // direct_io: every read comes to the daemon, which answers from the shards without
        // double-buffering in the page cache. Without DIRECT_IO_ALLOW_MMAP (Linux < 6.6) a
        // direct_io file cannot be mmapped (numpy's mmap_mode='r'), so fall back to the page
        // cache, which is always correct here because files never change.
        self.open_flags = if supported.contains(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP) {
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NOFLUSH
        } else {
            log::info!("kernel lacks FUSE_DIRECT_IO_ALLOW_MMAP: serving through the page cache");
            FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH
        };
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent.0 == crate::inode::ROOT_INO
            && (name == QUIESCE_NAME || name == RESUME_NAME)
            && (req.uid() == 0 || req.uid() == nix::unistd::geteuid().as_raw())
        {
            return self.control(name == QUIESCE_NAME, reply);
        }
        guarded("lookup", parent.0, || {
            let node = match self.fs.lookup_node(parent.0, name) {
                Ok(node) => node,
                Err(e) => {
                    debug!("lookup parent={} name={name:?}", parent.0);
                    return reply.error(fail("lookup", parent.0, &e));
                }
            };
            let attr_of = self.attr_fn();
            self.with_deadline(
                "lookup",
                node,
                reply,
                move |fs, reply: ReplyEntry, attr| match attr {
                    Ok(a) => {
                        let (ttl, attr) = attr_of(&a);
                        reply.entry(&ttl, &attr, Generation(0))
                    }
                    Err(e) => reply.error(fail("lookup", fs.ino(node), &e)),
                },
            );
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        guarded("getattr", ino.0, || {
            let node = match self.fs.node(ino.0) {
                Ok(node) => node,
                Err(e) => return reply.error(fail("getattr", ino.0, &e)),
            };
            // Asked through an open `stats.json` (the kernel passes the handle, e.g. for
            // `lseek(SEEK_END)`): the size of that open's snapshot, which its reads return.
            let snapshot_len = fh.and_then(|fh| self.opens.snapshot_len(fh.0));
            let attr_of = self.attr_fn();
            self.with_deadline(
                "getattr",
                node,
                reply,
                move |fs, reply: ReplyAttr, attr| match attr {
                    Ok(mut a) => {
                        a.size = snapshot_len.unwrap_or(a.size);
                        let (ttl, attr) = attr_of(&a);
                        reply.attr(&ttl, &attr)
                    }
                    Err(e) => reply.error(fail("getattr", fs.ino(node), &e)),
                },
            );
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        guarded("open", ino.0, || {
            if self.prefill_mode {
                // The check (a file, nothing that writes) still runs once; then ENOSYS tells the
                // kernel to open every file itself from now on (FOPEN_KEEP_CACHE), so a step
                // file in the page cache is opened and read without the daemon.
                return match self.fs.open(ino.0, flags.0) {
                    Ok(_) => reply.error(Errno::from_i32(libc::ENOSYS)),
                    Err(e) => reply.error(fail("open", ino.0, &e)),
                };
            }
            match self.fs.open(ino.0, flags.0) {
                // noflush: close() costs no round trip. A volatile file is always direct_io, so
                // the page cache never holds an old version.
                Ok(node) if node.is_volatile() => {
                    let fh = self
                        .opens
                        .add(OpenState::Snapshot(self.fs.stats_json().into()));
                    reply.opened(
                        FileHandle(fh),
                        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NOFLUSH,
                    )
                }
                Ok(_) => reply.opened(FileHandle(0), self.open_flags),
                Err(e) => reply.error(fail("open", ino.0, &e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if fh.0 != 0 {
            let mut opens = self.opens.map.lock().unwrap_or_else(|p| p.into_inner());
            match opens.get_mut(&fh.0) {
                Some(OpenState::Snapshot(bytes)) => {
                    let bytes = bytes.clone();
                    drop(opens);
                    let start = usize::try_from(offset)
                        .unwrap_or(usize::MAX)
                        .min(bytes.len());
                    let end = start.saturating_add(size as usize).min(bytes.len());
                    reply.data(&bytes[start..end]);
                    return;
                }
                None => {}
            }
        }
        if let Some(k) = self.prefill.get()
            && let Ok(Node::StepNpy(key)) = self.fs.node(ino.0)
        {
            k.on_read(ino.0, key);
        }
        guarded("read", ino.0, || {
            self.read_guarded(ino.0, offset, size, reply)
        });
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if fh.0 != 0 {
            self.opens
                .map
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&fh.0);
        }
        reply.ok();
    }

    fn forget(&self, _req: &Request, ino: INodeNo, _nlookup: u64) {
        if let Some(k) = self.prefill.get() {
            k.forget(ino.0);
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing to flush in a read-only tree. ENOSYS makes the kernel stop sending FLUSH at
        // all (it matters with --prefill, where files are opened without FOPEN_NOFLUSH).
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        guarded("opendir", ino.0, || match self.fs.opendir(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_CACHE_DIR),
            Err(e) => reply.error(fail("opendir", ino.0, &e)),
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        guarded("readdir", ino.0, || {
            let mut sink = FuseDirSink(reply);
            match self.fs.readdir(ino.0, offset, &mut sink) {
                Ok(()) => sink.0.ok(),
                Err(e) => sink.0.error(fail("readdir", ino.0, &e)),
            }
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // A read-only tree: no free space, no free inodes.
        reply.statfs(0, 0, 0, 0, 0, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        guarded("access", ino.0, || {
            match self.fs.access(ino.0, mask.bits()) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(fail("access", ino.0, &e)),
            }
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(fail("setattr", ino.0, &Error::ReadOnly));
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(fail("mknod", parent.0, &Error::ReadOnly));
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(fail("mkdir", parent.0, &Error::ReadOnly));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(fail("unlink", parent.0, &Error::ReadOnly));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(fail("rmdir", parent.0, &Error::ReadOnly));
    }

    fn symlink(
        &self,
        _req: &Request,
        parent: INodeNo,
        _link_name: &OsStr,
        _target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        reply.error(fail("symlink", parent.0, &Error::ReadOnly));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(fail("rename", parent.0, &Error::ReadOnly));
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(fail("link", ino.0, &Error::ReadOnly));
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: fuser::ReplyWrite,
    ) {
        reply.error(fail("write", ino.0, &Error::ReadOnly));
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: fuser::ReplyCreate,
    ) {
        reply.error(fail("create", parent.0, &Error::ReadOnly));
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _name: &OsStr,
        _value: &[u8],
        _flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        reply.error(fail("setxattr", ino.0, &Error::ReadOnly));
    }

    fn getxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // There are no extended attributes. ENOSYS makes the kernel answer every later
        // getxattr on the mount itself (EOPNOTSUPP), without a round trip: `ls -l` asks two
        // per file (security.selinux, system.posix_acl_access).
        debug!("getxattr ino={}: ENOSYS", ino.0);
        reply.error(Errno::from_i32(libc::ENOSYS));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        match self.fs.exists(ino.0) {
            Ok(()) if size == 0 => reply.size(0),
            Ok(()) => reply.data(&[]),
            Err(e) => reply.error(fail("listxattr", ino.0, &e)),
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // Python's open() probes every file with an ioctl (TCGETS, "is it a terminal?").
        reply.error(Errno::from_i32(libc::ENOTTY));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(fail("removexattr", ino.0, &Error::ReadOnly));
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(fail("fallocate", ino.0, &Error::ReadOnly));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_handler_is_caught_and_the_thread_goes_on() {
        // The reply moved into a handler is dropped while unwinding, and fuser answers an
        // unanswered request with EIO; here only the catching is observable.
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct Reply(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Reply {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let reply = Reply(dropped.clone());
        guarded("test", 7, move || {
            let _reply = reply;
            panic!("injected");
        });
        assert!(
            dropped.load(Ordering::SeqCst),
            "the reply was dropped (answered EIO)"
        );
        // The same thread serves the next request.
        let mut served = false;
        guarded("test", 8, || served = true);
        assert!(served);
    }
}

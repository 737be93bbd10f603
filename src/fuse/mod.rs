//! The FUSE adapter: translates fuser requests into [`ShuffleFs`] calls and results into
//! replies. It makes no decisions; every answer comes from `fs/`, and work that may block on
//! shard or document files runs where `dispatch.rs` decides. Each failed request is logged
//! once, at the level the error chose, with its errno.
//!
//! The rest of the folder: `attr.rs` (attributes as replies carry them), `handles.rs`
//! (per-open state), `kernel_cache.rs` (prefill's stores and invalidations), `deadline.rs`
//! (the pool that runs jobs under `--read-timeout`), `session.rs` (the fuser session).

use std::ffi::OsStr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};
use log::debug;

mod attr;
mod deadline;
mod dispatch;
mod handles;
mod kernel_cache;
mod passthrough;
pub(crate) mod session;

use attr::{file_attr, file_type};
use dispatch::{Answer, Dispatch, read_failed};
use handles::Handles;

pub(crate) use dispatch::MAX_IO_THREADS;
pub(crate) use kernel_cache::{KernelCache, QUIESCE_NAME, RESUME_NAME};

use crate::error::{Error, Result};
use crate::fs::{Attr, DirEntry, DirSink, Loc, Node, Ownership, Read, ShuffleFs, Stat};

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

/// Adapter state: the filesystem plus the ownership and timestamps every attribute carries.
#[derive(Debug)]
pub(crate) struct FuseAdapter {
    fs: Arc<ShuffleFs>,
    owner: Ownership,
    mtime: SystemTime,
    /// How files are opened; chosen at `init` from what the kernel supports.
    open_flags: FopenFlags,
    /// Where jobs run.
    dispatch: Dispatch,
    /// State of opens that need it, by file handle (0: none).
    handles: Handles,
    /// The page-cache prefill, once the session exists (`session.rs` sets it with `--prefill`).
    prefill: Arc<OnceLock<Arc<KernelCache>>>,
    /// `--prefill`: files are opened without a round trip (OPEN answers ENOSYS once, and the
    /// kernel then opens every file itself, through the page cache).
    prefill_mode: bool,
    /// Step files are opened with a memory file as their backing file (FUSE passthrough):
    /// asked for (`want_passthrough`), then chosen at `init` from what the kernel supports.
    passthrough: bool,
    want_passthrough: bool,
    backings: Arc<passthrough::Backings>,
}

impl FuseAdapter {
    /// Wraps `fs`; files carry `owner` and are dated `mtime`. With `read_timeout`, reads that
    /// touch shards answer `EIO` once it has passed (see `dispatch.rs`).
    pub(crate) fn new(
        fs: ShuffleFs,
        owner: Ownership,
        mtime: SystemTime,
        read_timeout: Option<Duration>,
        threads: usize,
        prefill: bool,
        passthrough: bool,
    ) -> FuseAdapter {
        FuseAdapter {
            fs: Arc::new(fs),
            owner,
            mtime,
            open_flags: FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
            dispatch: Dispatch::new(read_timeout, threads),
            handles: Handles::default(),
            prefill: Arc::new(OnceLock::new()),
            prefill_mode: prefill,
            passthrough: false,
            want_passthrough: passthrough && !prefill,
            backings: Arc::default(),
        }
    }

    /// The filesystem (shared with the session).
    pub(crate) fn fs(&self) -> &Arc<ShuffleFs> {
        &self.fs
    }

    /// Where the session puts the page-cache prefill once it exists.
    pub(crate) fn prefill_slot(&self) -> Arc<OnceLock<Arc<KernelCache>>> {
        self.prefill.clone()
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

    /// Opens step file `ino` (plan `k`'s step `key`) with the memory file the step cache holds
    /// it in as its backing file (`passthrough.rs`); a step not prefetched into one (a miss, a
    /// step on the heap) is opened the usual way, its reads served by the daemon exactly as
    /// without passthrough. Nothing here blocks: the FUSE thread answers at once.
    fn open_step(&self, ino: u64, k: u32, key: crate::shuffle::plan::StepKey, reply: ReplyOpen) {
        let fallback = self.open_flags;
        let cached = self
            .backings
            .live()
            .then(|| self.fs.memfd_step_if_cached(k, key));
        // A step not prefetched into a memory file is a plain open: its reads reach the daemon,
        // which counts a hit or a miss and tells the prefetcher for each.
        let cached = cached.flatten();
        let hit = cached.is_some();
        self.backings.open(ino, cached, reply, fallback);
        if hit {
            // Counted as a hit at open: the prefetcher hears of the reader now.
            self.fs.reader_at(k, key);
        }
    }

    /// Turns core attributes into the reply's TTL and `FileAttr`, detached from `self` (so a
    /// pool thread can use it).
    fn attr_fn(&self) -> impl Fn(&Attr) -> (Duration, FileAttr) + Send + 'static {
        let (owner, mtime) = (self.owner, self.mtime);
        move |a: &Attr| (attr::ttl(a), file_attr(owner, mtime, a))
    }

    /// Has `answer` send `node`'s attributes: computed now, or their job run where
    /// `dispatch.rs` decides.
    fn stat<R: Answer>(
        &self,
        op: &'static str,
        node: Loc,
        reply: R,
        answer: impl FnOnce(&ShuffleFs, R, Result<Attr>) + Send + 'static,
    ) {
        match self.fs.attr_or_job(node) {
            Ok(Stat::Ready(attr)) => answer(&self.fs, reply, Ok(attr)),
            Ok(Stat::Job(job)) => self.dispatch.attr(&self.fs, op, job, reply, answer),
            Err(e) => answer(&self.fs, reply, Err(e)),
        }
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
        // Registering a backing file needs CAP_SYS_ADMIN: a daemon without it (a user's mount
        // through fusermount3) does not ask. One refused anyway turns it off (passthrough.rs).
        if self.want_passthrough && nix::unistd::geteuid().is_root() {
            wanted |= InitFlags::FUSE_PASSTHROUGH;
        }
        let mut supported = wanted & config.capabilities();
        if let Err(missing) = config.add_capabilities(supported) {
            debug!("kernel refused capabilities {missing:?}");
            supported -= missing;
        }
        // A stacking depth of 1: the backing files (memory files) are on no stacked
        // filesystem, and this mount may itself be a lower layer of one (overlayfs).
        if supported.contains(InitFlags::FUSE_PASSTHROUGH) && config.set_max_stack_depth(1).is_ok()
        {
            self.passthrough = true;
            self.fs.serve_by_passthrough(self.backings.counters.clone());
            log::info!("passthrough: open step files are served by the kernel from memory files");
        } else if self.want_passthrough && !self.prefill_mode {
            log::info!(
                "no FUSE passthrough (Linux 6.9+ and a root daemon): the daemon answers every read"
            );
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
            self.stat(
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
            let snapshot_len = fh.and_then(|fh| self.handles.snapshot_len(fh.0));
            let attr_of = self.attr_fn();
            self.stat(
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
                Ok(loc) if loc.is_volatile() => {
                    let fh = self.handles.open_snapshot(self.fs.stats_json(loc).into());
                    reply.opened(
                        FileHandle(fh),
                        FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NOFLUSH,
                    )
                }
                Ok(Loc::Plan(k, Node::StepNpy(key))) if self.passthrough => {
                    self.open_step(ino.0, k, key, reply)
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
        if fh.0 != 0
            && let Some(bytes) = self.handles.snapshot(fh.0)
        {
            let start = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(bytes.len());
            let end = start.saturating_add(size as usize).min(bytes.len());
            return reply.data(&bytes[start..end]);
        }
        if let Some(k) = self.prefill.get()
            && let Ok(Loc::Plan(0, Node::StepNpy(key))) = self.fs.node(ino.0)
        {
            k.on_read(ino.0, key);
        }
        guarded("read", ino.0, || {
            match self.fs.read_or_job(ino.0, offset, size) {
                Ok(Read::Ready(bytes)) => reply.data(&bytes),
                Ok(Read::Job(job)) => self.dispatch.read(&self.fs, job, reply),
                Err(e) => reply.error(read_failed(&self.fs, ino.0, offset, size, &e)),
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if fh.0 == passthrough::PASSTHROUGH_FH || fh.0 == passthrough::PLAIN_FH {
            self.backings.release(ino.0, fh.0);
        } else if fh.0 != 0 {
            self.handles.release(fh.0);
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
    use std::sync::atomic::Ordering;

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

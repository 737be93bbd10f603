//! The FUSE adapter: translates fuser requests into [`ShuffleFs`] calls and results into
//! replies. It makes no decisions; every answer comes from `fs.rs`. Each failed request is
//! logged once here, at the level the error chose, with its errno.

use std::ffi::OsStr;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};
use log::{debug, log};

use std::cell::RefCell;

use crate::error::Error;
use crate::fs::{Attr, DirEntry, DirSink, Kind, ReadData, ShuffleFs};

/// The tree never changes while mounted, so the kernel may cache names and attributes for as
/// long as it likes.
const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// Adapter state: the filesystem plus the ownership and timestamps every attribute carries.
#[derive(Debug)]
pub struct FuseAdapter {
    fs: ShuffleFs,
    uid: u32,
    gid: u32,
    mtime: SystemTime,
    /// How files are opened; chosen at `init` from what the kernel supports.
    open_flags: FopenFlags,
}

impl FuseAdapter {
    /// Wraps `fs`; files are owned by `uid:gid` and dated `mtime`.
    pub fn new(fs: ShuffleFs, uid: u32, gid: u32, mtime: SystemTime) -> FuseAdapter {
        FuseAdapter {
            fs,
            uid,
            gid,
            mtime,
            open_flags: FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
        }
    }

    fn ttl(a: &Attr) -> Duration {
        if a.volatile { Duration::ZERO } else { TTL }
    }

    fn file_attr(&self, a: &Attr) -> FileAttr {
        FileAttr {
            ino: INodeNo(a.ino),
            size: a.size,
            blocks: a.size.div_ceil(512),
            atime: self.mtime,
            mtime: self.mtime,
            ctime: self.mtime,
            crtime: self.mtime,
            kind: file_type(a.kind),
            perm: a.perm,
            nlink: a.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::Directory => FileType::Directory,
        Kind::File => FileType::RegularFile,
    }
}

fn fail(op: &str, ino: u64, e: &Error) -> Errno {
    log!(
        e.level(),
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
        let wanted = InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
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

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(parent.0, name) {
            Ok(a) => reply.entry(&Self::ttl(&a), &self.file_attr(&a), Generation(0)),
            Err(e) => {
                debug!("lookup parent={} name={name:?}", parent.0);
                reply.error(fail("lookup", parent.0, &e))
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&Self::ttl(&a), &self.file_attr(&a)),
            Err(e) => reply.error(fail("getattr", ino.0, &e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open(ino.0, flags.0) {
            // noflush: close() costs no round trip. A volatile file is always direct_io, so
            // the page cache never holds an old version.
            Ok(node) if node.is_volatile() => reply.opened(
                FileHandle(0),
                FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NOFLUSH,
            ),
            Ok(_) => reply.opened(FileHandle(0), self.open_flags),
            Err(e) => reply.error(fail("open", ino.0, &e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        thread_local! {
            /// Each FUSE worker's read buffer: grown once, never zero-filled again.
            static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
        }
        SCRATCH.with_borrow_mut(|scratch| {
            match self.fs.read_data(ino.0, offset, size, scratch) {
                Ok(ReadData::Scratch(n)) => reply.data(&scratch[..n]),
                Ok(ReadData::Shared(bytes, range)) => reply.data(&bytes[range]),
                Err(e) => {
                    log!(
                        e.level(),
                        "read ino={} node={:?} offset={offset} size={size} failed with errno {}: {e}",
                        ino.0,
                        self.fs.node(ino.0).ok(),
                        e.errno()
                    );
                    reply.error(Errno::from_i32(e.errno()))
                }
            }
        })
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.opendir(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_CACHE_DIR),
            Err(e) => reply.error(fail("opendir", ino.0, &e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        reply: ReplyDirectory,
    ) {
        let mut sink = FuseDirSink(reply);
        match self.fs.readdir(ino.0, offset, &mut sink) {
            Ok(()) => sink.0.ok(),
            Err(e) => sink.0.error(fail("readdir", ino.0, &e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // A read-only tree: no free space, no free inodes.
        reply.statfs(0, 0, 0, 0, 0, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        match self.fs.access(ino.0, mask.bits()) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(fail("access", ino.0, &e)),
        }
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
        match self.fs.exists(ino.0) {
            Ok(()) => reply.error(Errno::from_i32(libc::ENODATA)),
            Err(e) => reply.error(fail("getxattr", ino.0, &e)),
        }
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

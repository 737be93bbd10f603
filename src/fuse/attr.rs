//! Attributes as FUSE replies carry them: the core's [`Attr`] with the mount's ownership, its
//! date, and how long the kernel may cache it.

use std::time::{Duration, SystemTime};

use fuser::{FileAttr, FileType, INodeNo};

use crate::fs::{Attr, Ownership};
use crate::tree::Kind;

/// The tree never changes while mounted, so the kernel may cache names and attributes for as
/// long as it likes.
const TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// How long the kernel may cache `a`: forever, or not at all for a file whose content changes.
pub(super) fn ttl(a: &Attr) -> Duration {
    if a.volatile { Duration::ZERO } else { TTL }
}

/// The attributes FUSE replies with: `a` owned by `owner`, dated `mtime`.
pub(super) fn file_attr(owner: Ownership, mtime: SystemTime, a: &Attr) -> FileAttr {
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

/// The FUSE file type of `kind`.
pub(super) fn file_type(kind: Kind) -> FileType {
    match kind {
        Kind::Directory => FileType::Directory,
        Kind::File => FileType::RegularFile,
    }
}

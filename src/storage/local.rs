//! Local files: opening the files a manifest lists, and reading `manifest.json`.
//!
//! A listed file is opened as the dataset's principals (`access.rs`), with `O_NOFOLLOW` (it
//! must be the file in the dataset directory, not a symbolic link that could expose another
//! file through the mount) and `O_NONBLOCK` (opening a FIFO must not wait for a writer, which
//! would hang the mount; the flag is cleared once the file is known to be regular). It must be
//! a regular file of a real filesystem: kernel interfaces (`/proc`, `/sys`, ...) are refused.
//! Shards are read at random, so the kernel is told not to read ahead around them
//! (`POSIX_FADV_RANDOM`, at open and at every reopen). When the dataset has more files than
//! `--max-open-shards`, each file's descriptor lives in the bounded pool of `fdpool.rs`;
//! otherwise every descriptor stays open, with no lock on the read path.
//!
//! `manifest.json` is opened the same way (every command that opens a dataset reads it here):
//! not a FIFO (which would block the open forever) nor a device such as `/dev/zero` (read
//! until memory runs out), not a symbolic link, at most [`MAX_MANIFEST_BYTES`].

use std::cell::RefCell;
use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;

use super::ReadAt;
use super::access::{OpenError, Policy};
use super::fdpool::{FdPool, PinnedFile};
use crate::error::{CorruptKind, Error, Result};
use crate::format::{MANIFEST, Manifest};

/// The largest `manifest.json` read: about 5 million shards. A larger file is not a manifest
/// pack wrote (or a device or a file still growing), and reading it could exhaust memory.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 30;

/// Modification time in nanoseconds since the epoch.
pub fn mtime_ns(meta: &Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    (meta.mtime() as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec() as u64)
}

/// Opens the files of one dataset (see the module docs).
pub(crate) struct LocalFiles {
    /// Who each file is opened as (`access.rs`); it learns the directories it walks.
    policy: RefCell<Policy>,
    /// The bounded descriptors, when the dataset has more files than it may keep open.
    pool: Option<Arc<FdPool>>,
}

impl LocalFiles {
    /// The opener of the files of the dataset in `dir` (canonical), whose manifest has
    /// `manifest` metadata and lists `files` files, keeping at most `max_open` descriptors;
    /// `allow_other`: the mount may be read by other users (`access.rs`).
    pub(crate) fn new(
        dir: &Path,
        manifest: &Metadata,
        allow_other: bool,
        files: usize,
        max_open: usize,
    ) -> Result<LocalFiles> {
        let policy = Policy::new(dir, manifest, allow_other).map_err(|e| Error::io(dir, e))?;
        // All descriptors stay open when they fit (no lock on the read path); otherwise each
        // file is pinned and its descriptor lives in a bounded pool.
        let pool = (files > max_open).then(|| {
            log::info!(
                "{files} files in the dataset, at most {max_open} open at once \
                 (--max-open-shards)"
            );
            FdPool::new(max_open)
        });
        Ok(LocalFiles {
            policy: RefCell::new(policy),
            pool,
        })
    }

    /// Opens the listed file `path` (`what`: "shard", "document file"; `random`: advise
    /// random reads) and checks it (see the module docs). Returns its byte source and its
    /// metadata.
    pub(crate) fn open(
        &self,
        path: &Path,
        what: &'static str,
        random: bool,
    ) -> Result<(Arc<dyn ReadAt>, Metadata)> {
        let opener = self
            .policy
            .borrow_mut()
            .opener(path)
            .map_err(|e| open_error(path, e))?;
        let file = opener.open(path).map_err(|e| listed_open_error(path, e))?;
        let meta = file.metadata().map_err(|e| Error::io(path, e))?;
        if !meta.is_file() {
            return Err(Error::dataset(path, CorruptKind::NotRegular { what }));
        }
        if let Some(fs) = pseudo_filesystem(&file) {
            return Err(Error::dataset(path, CorruptKind::PseudoFilesystem(fs)));
        }
        nix::fcntl::fcntl(
            &file,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
        )
        .map_err(|e| Error::io(path, e.into()))?;
        if random {
            advise_random(&file);
        }
        let source: Arc<dyn ReadAt> = match &self.pool {
            Some(pool) => {
                let pinned = PinnedFile::new(pool, path.to_path_buf(), file, &meta, opener);
                Arc::new(if random {
                    pinned.random_access()
                } else {
                    pinned
                })
            }
            None => Arc::new(file),
        };
        Ok((source, meta))
    }
}

/// Tells the kernel not to read ahead around reads of `file` (shard reads are random).
/// Advisory: a failure is harmless.
pub(super) fn advise_random(file: &File) {
    let _ = nix::fcntl::posix_fadvise(
        file,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM,
    );
}

/// The error of a listed file whose open failed with `e`.
fn open_error(path: &Path, e: io::Error) -> Error {
    let kind = match e.raw_os_error() {
        Some(libc::ENOENT) => CorruptKind::Missing,
        Some(libc::ELOOP) => CorruptKind::Symlink,
        Some(libc::EMFILE | libc::ENFILE) => CorruptKind::TooManyFiles(e),
        _ => CorruptKind::Unopenable(e),
    };
    Error::dataset(path, kind)
}

/// The error of a listed file an [`Opener`] could not open.
pub(crate) fn listed_open_error(path: &Path, e: OpenError) -> Error {
    match e {
        OpenError::Io(e) => open_error(path, e),
        OpenError::Denied { who, source } => {
            Error::dataset(path, CorruptKind::OwnerCannotRead { who, source })
        }
        OpenError::NotShared { who } => Error::dataset(path, CorruptKind::NotShared { who }),
    }
}

/// The pseudo filesystem `file` is on, if any: kernel interfaces, never dataset storage.
fn pseudo_filesystem(file: &File) -> Option<&'static str> {
    use nix::sys::statfs::*;
    let kind = fstatfs(file).ok()?.filesystem_type();
    [
        (PROC_SUPER_MAGIC, "proc"),
        (SYSFS_MAGIC, "sysfs"),
        (DEBUGFS_MAGIC, "debugfs"),
        (TRACEFS_MAGIC, "tracefs"),
        (SECURITYFS_MAGIC, "securityfs"),
        (SELINUX_MAGIC, "selinuxfs"),
        (SMACK_MAGIC, "smackfs"),
        (CGROUP_SUPER_MAGIC, "cgroup"),
        (CGROUP2_SUPER_MAGIC, "cgroup2"),
        (BPF_FS_MAGIC, "bpf"),
        (RDTGROUP_SUPER_MAGIC, "resctrl"),
        (NSFS_MAGIC, "nsfs"),
        (DEVPTS_SUPER_MAGIC, "devpts"),
        (XENFS_SUPER_MAGIC, "xenfs"),
        (OPENPROM_SUPER_MAGIC, "openpromfs"),
        (USBDEVICE_SUPER_MAGIC, "usbdevfs"),
    ]
    .into_iter()
    .find(|(magic, _)| *magic == kind)
    .map(|(_, name)| name)
}

/// Reads and validates `dir/manifest.json` (see the module docs). Returns the manifest and
/// the file's metadata.
pub(crate) fn read_manifest(dir: &Path) -> Result<(Manifest, Metadata)> {
    let path = dir.join(MANIFEST);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => Error::dataset(&path, CorruptKind::NoManifest),
            Some(libc::ELOOP) => Error::dataset(&path, CorruptKind::ManifestSymlink),
            _ => Error::io(&path, e),
        })?;
    let meta = file.metadata().map_err(|e| Error::io(&path, e))?;
    if !meta.is_file() {
        return Err(Error::dataset(&path, CorruptKind::ManifestNotRegular));
    }
    let too_big = |size: u64| {
        Error::dataset(
            &path,
            CorruptKind::ManifestTooBig {
                size,
                max: MAX_MANIFEST_BYTES,
            },
        )
    };
    if meta.len() > MAX_MANIFEST_BYTES {
        return Err(too_big(meta.len()));
    }
    // Read at most one byte past the bound: a file that grew since the stat is refused too.
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    (&file)
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::io(&path, e))?;
    if bytes.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(too_big(bytes.len() as u64));
    }
    Ok((Manifest::parse(&bytes, &path)?, meta))
}

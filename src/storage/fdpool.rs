//! A bounded set of open descriptors for the files of a dataset, each file pinned to its
//! identity at mount.
//!
//! A dataset with more files than `--max-open-shards` does not keep them all open: each file
//! is a [`PinnedFile`] whose descriptor lives in a node-wide LRU ([`FdPool`]). A read of a file
//! whose descriptor was closed reopens it (`O_NOFOLLOW`, as the principals it was opened as at
//! mount, `access.rs`: a file the dataset's owner may no longer read is EACCES) and checks
//! that it is still the file validated at mount: same device, inode, size and modification
//! time. A file deleted since fails with its open error (`ENOENT`, served as `EIO`); one
//! replaced (renamed over, rewritten with another size or mtime) fails with `ESTALE`. Either
//! way no byte of another file is ever served. A dataset that fits the bound keeps every
//! descriptor open for the life of the mount, with no lock on the read path (`local.rs`
//! decides). A reopened shard gets the same `POSIX_FADV_RANDOM` advice as at mount (the advice
//! belongs to the open file, not the inode).

use std::fs::{File, Metadata};
use std::io;
use std::num::NonZeroUsize;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use lru::LruCache;

use super::ReadAt;
use super::access::{OpenError, Opener};
use super::local::{advise_random, listed_open_error, mtime_ns};

/// Open descriptors kept by default (`--max-open-shards`): shards, checksum and document files
/// all count.
pub(crate) const DEFAULT_MAX_OPEN: usize = 4096;

/// What pins a file: it must still be this file when reopened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: u64,
}

impl Identity {
    /// The identity of an open file.
    pub(crate) fn of(meta: &Metadata) -> Identity {
        Identity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.len(),
            mtime_ns: mtime_ns(meta),
        }
    }
}

/// The open descriptors, least recently used closed first.
pub(crate) struct FdPool {
    open: Mutex<LruCache<usize, Arc<File>>>,
    next_id: AtomicUsize,
    reopened: AtomicU64,
}

impl std::fmt::Debug for FdPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdPool")
            .field("open", &self.lock().len())
            .finish()
    }
}

impl FdPool {
    /// A pool of at most `max_open` descriptors (at least 1).
    pub(crate) fn new(max_open: usize) -> Arc<FdPool> {
        Arc::new(FdPool {
            open: Mutex::new(LruCache::new(
                NonZeroUsize::new(max_open.max(1)).expect("at least 1"),
            )),
            next_id: AtomicUsize::new(0),
            reopened: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<usize, Arc<File>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Descriptors open now.
    #[cfg(test)]
    pub(crate) fn open_count(&self) -> usize {
        self.lock().len()
    }

    /// Files reopened so far (their descriptor had been closed to stay within the bound).
    #[cfg(test)]
    pub(crate) fn reopened(&self) -> u64 {
        self.reopened.load(Ordering::Relaxed)
    }
}

/// A dataset file read through an [`FdPool`].
#[derive(Debug)]
pub(crate) struct PinnedFile {
    pool: Arc<FdPool>,
    id: usize,
    path: PathBuf,
    identity: Identity,
    /// Reads are random: advise `POSIX_FADV_RANDOM` on every open (shards).
    random: bool,
    /// Reopens the file as it was opened at mount (`access.rs`: as the dataset's owners).
    opener: Arc<Opener>,
}

impl PinnedFile {
    /// Pins `file` (just opened by `opener` and validated at `path`) and hands its descriptor
    /// to `pool`.
    pub(crate) fn new(
        pool: &Arc<FdPool>,
        path: PathBuf,
        file: File,
        meta: &Metadata,
        opener: Arc<Opener>,
    ) -> PinnedFile {
        let id = pool.next_id.fetch_add(1, Ordering::Relaxed);
        pool.lock().put(id, Arc::new(file));
        PinnedFile {
            pool: pool.clone(),
            id,
            path,
            identity: Identity::of(meta),
            random: false,
            opener,
        }
    }

    /// Advises `POSIX_FADV_RANDOM` on every reopen (the caller advised the first open).
    pub(crate) fn random_access(mut self) -> PinnedFile {
        self.random = true;
        self
    }

    fn file(&self) -> io::Result<Arc<File>> {
        if let Some(f) = self.pool.lock().get(&self.id) {
            return Ok(f.clone());
        }
        let file = self.opener.open(&self.path).map_err(|e| match e {
            OpenError::Io(e) => e,
            denied => {
                crate::log_limited!(
                    log::Level::Error,
                    format_args!("reopen EACCES {}", self.path.display()),
                    "{}",
                    listed_open_error(&self.path, denied)
                );
                io::Error::from_raw_os_error(libc::EACCES)
            }
        })?;
        let meta = file.metadata()?;
        if !meta.is_file() || Identity::of(&meta) != self.identity {
            crate::log_limited!(
                log::Level::Error,
                format_args!("reopen ESTALE {}", self.path.display()),
                "{} is no longer the file validated at mount (device, inode, size or mtime \
                 changed): answering ESTALE; remount to serve the new dataset",
                self.path.display()
            );
            return Err(io::Error::from_raw_os_error(libc::ESTALE));
        }
        if self.random {
            advise_random(&file);
        }
        let file = Arc::new(file);
        self.pool.reopened.fetch_add(1, Ordering::Relaxed);
        self.pool.lock().put(self.id, file.clone());
        Ok(file)
    }
}

impl ReadAt for PinnedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(&*self.file()?, buf, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(path: &std::path::Path, bytes: &[u8]) {
        std::fs::File::create(path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
    }

    fn pinned(pool: &Arc<FdPool>, path: &std::path::Path) -> PinnedFile {
        let f = File::open(path).unwrap();
        let meta = f.metadata().unwrap();
        PinnedFile::new(pool, path.to_path_buf(), f, &meta, Opener::unchecked())
    }

    #[test]
    fn descriptors_stay_within_the_bound_and_reopen_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let pool = FdPool::new(2);
        let files: Vec<PinnedFile> = (0..5u8)
            .map(|i| {
                let p = dir.path().join(format!("f{i}"));
                write(&p, &[i; 10]);
                pinned(&pool, &p)
            })
            .collect();
        assert_eq!(pool.open_count(), 2);
        for _ in 0..3 {
            for (i, f) in files.iter().enumerate() {
                let mut buf = [0u8; 4];
                assert_eq!(f.read_at(&mut buf, 3).unwrap(), 4);
                assert_eq!(buf, [i as u8; 4]);
                assert!(pool.open_count() <= 2);
            }
        }
        assert!(pool.reopened() >= 10);
    }

    #[test]
    fn a_replaced_or_deleted_file_is_an_error_never_its_new_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let pool = FdPool::new(1);
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        write(&a, b"old bytes!");
        write(&b, b"other file");
        let fa = pinned(&pool, &a);
        let fb = pinned(&pool, &b); // closes a's descriptor
        // Replaced by another file of the same size (a new inode).
        let tmp = dir.path().join("t");
        write(&tmp, b"NEW BYTES!");
        std::fs::rename(&tmp, &a).unwrap();
        let mut buf = [0u8; 10];
        let err = fa.read_at(&mut buf, 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ESTALE));
        // Deleted while its descriptor is closed (a third file takes the only slot).
        std::fs::remove_file(&b).unwrap();
        let c = dir.path().join("c");
        write(&c, b"third file");
        let _fc = pinned(&pool, &c);
        let err = fb.read_at(&mut buf, 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
    }
}

//! An opened dataset: the manifest, one open descriptor per shard, and positioned reads of any
//! byte range of the record stream.
//!
//! Reads go through [`ReadAt`] (pread on a real file), straight into the caller's buffer: one
//! `pread` per shard a range touches. The shard holding a stream offset is found by binary
//! search over cumulative shard sizes. A shard that delivers fewer bytes than the manifest
//! promises yields [`Error::ShortRead`] (EIO), never zero-filled or partial data.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::dtype::RecordType;
use crate::error::{Error, Result};
use crate::format::{MANIFEST, Manifest};

/// A source of bytes at offsets: the seam between the read path and storage. Tests plug in
/// in-memory or failing sources.
pub trait ReadAt: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at EOF).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
}

impl ReadAt for Vec<u8> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

/// One shard: where it lives, how long it is, and how to read it.
pub struct Shard {
    path: PathBuf,
    len: u64,
    source: Arc<dyn ReadAt>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("path", &self.path)
            .field("len", &self.len)
            .finish()
    }
}

impl Shard {
    /// A shard over any byte source (tests, fault injection).
    pub fn new(path: impl Into<PathBuf>, len: u64, source: Arc<dyn ReadAt>) -> Shard {
        Shard {
            path: path.into(),
            len,
            source,
        }
    }

    /// Path of the shard file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the shard is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Fills `buf` from `offset`, retrying short and interrupted reads; a premature end of
    /// file is an error naming the shard.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.source.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => {
                    return Err(Error::ShortRead {
                        path: self.path.clone(),
                        offset,
                        wanted: buf.len(),
                        got: done,
                    });
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(Error::Io {
                        path: self.path.clone(),
                        offset: Some(offset + done as u64),
                        source,
                    });
                }
            }
        }
        Ok(())
    }
}

fn shard_open_error(path: &Path, e: &io::Error) -> Error {
    let message = match e.raw_os_error() {
        Some(libc::ENOENT) => {
            "shard listed in the manifest is missing; restore it or re-run `shufflefs pack`"
                .to_string()
        }
        Some(libc::ELOOP) => "shard is a symbolic link, which shufflefs refuses to follow; \
                              replace it with the file itself"
            .to_string(),
        Some(libc::EMFILE | libc::ENFILE) => format!(
            "cannot open shard: {e}; the dataset has more shards than this process may open: \
             raise the open-file limit (ulimit -n) or re-pack with a larger --shard-size"
        ),
        _ => format!("cannot open shard: {e}"),
    };
    Error::dataset(path, message)
}

/// An opened, validated dataset.
#[derive(Debug)]
pub struct Dataset {
    dir: PathBuf,
    manifest: Manifest,
    record: RecordType,
    shards: Vec<Shard>,
    /// `ends[i]` is the stream byte offset one past shard `i`.
    ends: Vec<u64>,
}

impl Dataset {
    /// Opens `dir`: parses and validates the manifest, opens every shard and checks its size
    /// against the manifest. Any doubt is an error naming the file.
    pub fn open(dir: &Path) -> Result<Dataset> {
        let dir = &dir.canonicalize().map_err(|e| Error::io(dir, e))?;
        let manifest_path = dir.join(MANIFEST);
        let bytes = std::fs::read(&manifest_path).map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                Error::dataset(
                    &manifest_path,
                    "no manifest: this directory holds no packed dataset (run `shufflefs pack` \
                     first; an interrupted pack leaves no manifest)",
                )
            } else {
                Error::io(&manifest_path, e)
            }
        })?;
        let manifest = Manifest::parse(&bytes, &manifest_path)?;
        let mut shards = Vec::with_capacity(manifest.shards.len());
        for entry in &manifest.shards {
            let path = dir.join(&entry.path);
            // O_NOFOLLOW: a shard must be the file in the dataset directory, not a symlink
            // that could expose another file through the mount.
            let file = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(|e| shard_open_error(&path, &e))?;
            let meta = file.metadata().map_err(|e| Error::io(&path, e))?;
            if !meta.is_file() {
                return Err(Error::dataset(&path, "shard is not a regular file"));
            }
            if meta.len() != entry.bytes {
                return Err(Error::dataset(
                    &path,
                    format!(
                        "shard is {} bytes but the manifest records {}: it was truncated or \
                         modified after packing; restore it or re-run `shufflefs pack`",
                        meta.len(),
                        entry.bytes
                    ),
                ));
            }
            // Reads are random: tell the kernel not to read ahead. Advisory, so failure is
            // harmless.
            let _ = nix::fcntl::posix_fadvise(
                &file,
                0,
                0,
                nix::fcntl::PosixFadviseAdvice::POSIX_FADV_RANDOM,
            );
            shards.push(Shard::new(path, entry.bytes, Arc::new(file)));
        }
        Ok(Dataset::from_parts(dir.to_path_buf(), manifest, shards))
    }

    /// Assembles a dataset from already-open shards (tests and fault injection). The shard
    /// lengths must match the manifest.
    pub fn from_parts(dir: PathBuf, manifest: Manifest, shards: Vec<Shard>) -> Dataset {
        let mut ends = Vec::with_capacity(shards.len());
        let mut end = 0u64;
        for s in &shards {
            end += s.len;
            ends.push(end);
        }
        Dataset {
            dir,
            record: manifest.record_type(),
            manifest,
            shards,
            ends,
        }
    }

    /// The dataset directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The validated manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The record type.
    pub fn record_type(&self) -> &RecordType {
        &self.record
    }

    /// Number of records in the stream.
    pub fn n_records(&self) -> u64 {
        self.manifest.records
    }

    /// Bytes in the stream.
    pub fn n_bytes(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// The shards, in stream order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }

    /// Reads `buf.len()` bytes of the stream starting at byte `offset`: one positioned read
    /// per shard touched, straight into `buf`.
    pub fn read_stream(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.n_bytes())
            .ok_or_else(|| {
                Error::dataset(
                    &self.dir,
                    format!(
                        "read of {} bytes at stream offset {offset} is past the end ({})",
                        buf.len(),
                        self.n_bytes()
                    ),
                )
            })?;
        if buf.is_empty() {
            return Ok(());
        }
        // First shard whose end is past `offset`.
        let mut index = self.ends.partition_point(|&e| e <= offset);
        let mut pos = offset;
        let mut filled = 0usize;
        while pos < end {
            let shard = &self.shards[index];
            let shard_start = self.ends[index] - shard.len;
            let take = (self.ends[index].min(end) - pos) as usize;
            shard.read_exact_at(&mut buf[filled..filled + take], pos - shard_start)?;
            filled += take;
            pos += take as u64;
            index += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{ShardEntry, content_hash, format_hash};

    /// A dataset of u8 records 0..total split into shards of the given sizes.
    fn memory_dataset(sizes: &[u64]) -> (Dataset, Vec<u8>) {
        let total: u64 = sizes.iter().sum();
        let stream: Vec<u8> = (0..total).map(|i| (i * 7 % 251) as u8).collect();
        let mut entries = Vec::new();
        let mut shards = Vec::new();
        let mut start = 0usize;
        for (i, &len) in sizes.iter().enumerate() {
            let bytes = stream[start..start + len as usize].to_vec();
            start += len as usize;
            entries.push(ShardEntry {
                path: format!("s{i}"),
                records: len,
                bytes: len,
                hash: format_hash(0),
            });
            shards.push(Shard::new(format!("s{i}"), len, Arc::new(bytes)));
        }
        let manifest = Manifest {
            format: crate::format::FORMAT_NAME.into(),
            version: crate::format::VERSION,
            dtype: "|u1".into(),
            itemsize: 1,
            records: total,
            content_hash: content_hash(&entries),
            shards: entries,
            created_by: "test".into(),
        };
        (Dataset::from_parts("mem".into(), manifest, shards), stream)
    }

    #[test]
    fn every_range_reads_exactly() {
        let (ds, stream) = memory_dataset(&[5, 1, 7, 3]);
        let n = stream.len() as u64;
        for start in 0..=n {
            for end in start..=n {
                let mut buf = vec![0xEE; (end - start) as usize];
                ds.read_stream(start, &mut buf).unwrap();
                assert_eq!(buf, &stream[start as usize..end as usize], "{start}..{end}");
            }
        }
        let mut buf = [0u8; 2];
        assert!(ds.read_stream(n - 1, &mut buf).is_err());
        assert!(ds.read_stream(u64::MAX, &mut buf).is_err());
    }

    struct Truncated(Vec<u8>);
    impl ReadAt for Truncated {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            // Delivers at most 3 bytes per call and pretends the file ends at byte 4.
            let short = self.0[..4].to_vec();
            let len = buf.len().min(3);
            short.read_at(&mut buf[..len], offset)
        }
    }

    #[test]
    fn short_source_is_an_error_never_partial_data() {
        let (mut ds, stream) = memory_dataset(&[10]);
        ds.shards[0] = Shard::new("s0", 10, Arc::new(Truncated(stream.clone())));
        let mut buf = [0u8; 4];
        ds.read_stream(0, &mut buf).unwrap();
        assert_eq!(&buf, &stream[..4], "short reads are retried");
        let mut buf = [0u8; 6];
        match ds.read_stream(2, &mut buf) {
            Err(Error::ShortRead {
                offset,
                wanted,
                got,
                ..
            }) => assert_eq!((offset, wanted, got), (2, 6, 2)),
            other => panic!("expected ShortRead, got {other:?}"),
        }
    }
}

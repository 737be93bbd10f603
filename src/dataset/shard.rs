//! One file of a dataset as the read path sees it: a [`Shard`] (the shard itself, a checksum
//! file or a document file) reads exact byte ranges through its [`ReadAt`] source.
//!
//! Reads go straight into the caller's buffer, retrying short and interrupted reads; a file
//! that ends early is [`Error::ShortRead`] (EIO), never zero-filled or partial data. A shard
//! may start `offset` bytes into its file (the header of an in-place llm.c or `.npy` file).
//!
//! Checked reads (`--verify-reads`, and every document-file read) read the whole checksum
//! blocks a range touches and compare each with the checksum file before copying a byte out.
//! A checksum file is *bound* to its shard: before the first read that relies on it, the whole
//! file is hashed once and compared with the hash the manifest records in the shard's entry,
//! so a checksum file of another shard (files swapped together, or copied from another
//! dataset) never vouches for this shard's bytes. The file is 1/8192 of its shard, so a mount
//! never reads all of them; the verdict is remembered.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use super::documents::DocFiles;
use crate::error::{CorruptKind, Error, Result};
use crate::format::checksum;
use crate::format::{self, ShardEntry};
use crate::storage::ReadAt;
use crate::storage::remote::RemoteObject;

/// One shard: where it lives, how long it is, and how to read it.
pub struct Shard {
    path: PathBuf,
    len: u64,
    /// Byte offset of the shard's first byte in its file (the header of an in-place llm.c or
    /// `.npy` shard): every read adds it.
    offset: u64,
    source: Arc<dyn ReadAt>,
    docs: Option<Box<DocFiles>>,
    /// The block checksum file (`format/checksum.rs`), when the manifest lists one.
    sums: Option<Box<Shard>>,
    /// For a checksum file: the content hash the manifest records for it, checked before the
    /// first read that relies on it.
    bound: Option<Box<Bound>>,
}

/// A replacement of byte sources (`Dataset::wrap_sources`): `wrap(path, source)`.
pub(super) type Wrap<'a> = dyn Fn(&Path, Arc<dyn ReadAt>) -> Arc<dyn ReadAt> + 'a;

/// The content hash a whole checksum file must have (see the module docs).
#[derive(Debug)]
struct Bound {
    want: u64,
    /// [`UNCHECKED`], [`INTACT`] or [`FOREIGN`].
    state: AtomicU8,
}

const UNCHECKED: u8 = 0;
const INTACT: u8 = 1;
const FOREIGN: u8 = 2;

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
    pub(crate) fn new(path: impl Into<PathBuf>, len: u64, source: Arc<dyn ReadAt>) -> Shard {
        Shard {
            path: path.into(),
            len,
            offset: 0,
            source,
            docs: None,
            sums: None,
            bound: None,
        }
    }

    /// Binds this file (a checksum file) to the content hash `want` the manifest records for
    /// it: no checksum is used before the whole file has been checked against it.
    pub(crate) fn bound_to(mut self, want: u64) -> Shard {
        self.bound = Some(Box::new(Bound {
            want,
            state: AtomicU8::new(UNCHECKED),
        }));
        self
    }

    /// Checks a bound file's whole content against its recorded hash, once (a mismatch is
    /// remembered too: the mount holds the file open, so it cannot become right). `of` is the
    /// file whose checksums these are, for the message.
    fn check_bound(&self, of: &Path) -> Result<()> {
        let Some(bound) = self.bound.as_deref() else {
            return Ok(());
        };
        let foreign = || {
            Error::dataset(
                &self.path,
                CorruptKind::ForeignChecksums {
                    want: crate::format::format_hash(bound.want),
                    of: of.to_path_buf(),
                },
            )
        };
        match bound.state.load(Ordering::Acquire) {
            INTACT => return Ok(()),
            FOREIGN => return Err(foreign()),
            _ => {}
        }
        let mut hasher = format::ContentHasher::new();
        let mut buf = vec![0u8; (1usize << 20).min(self.len as usize).max(1)];
        let mut at = 0u64;
        while at < self.len {
            let n = ((self.len - at) as usize).min(buf.len());
            // An I/O error leaves the file unchecked: the next read tries again.
            self.read_exact_at(&mut buf[..n], at)?;
            hasher.update(&buf[..n]);
            at += n as u64;
        }
        if hasher.finish() == bound.want {
            bound.state.store(INTACT, Ordering::Release);
            Ok(())
        } else {
            bound.state.store(FOREIGN, Ordering::Release);
            Err(foreign())
        }
    }

    /// Starts the shard `offset` bytes into its file (`ShardEntry::offset`).
    pub(crate) fn with_offset(mut self, offset: u64) -> Shard {
        self.offset = offset;
        self
    }

    /// Attaches the block checksum file.
    pub(crate) fn with_sums(mut self, sums: Shard) -> Shard {
        self.sums = Some(Box::new(sums));
        self
    }

    /// The block checksum file, if any.
    pub(crate) fn sums(&self) -> Option<&Shard> {
        self.sums.as_deref()
    }

    /// The remote object this shard's bytes are in, and where byte `offset` of the shard is in
    /// it (`None`: not remote).
    pub(super) fn remote_at(&self, offset: u64) -> Option<(&RemoteObject, u64)> {
        self.source.as_remote().map(|o| (o, self.offset + offset))
    }

    /// Fills `buf` from `offset` (see `Shard::read_exact_at`), public for `shufflefs verify`.
    pub fn read_exact(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.read_exact_at(buf, offset)
    }

    /// Like [`Shard::read_exact_at`], but reads every whole checksum block the range touches
    /// and checks each against the checksum file before copying any byte out: a block that
    /// changed after packing is an error, never served.
    pub(super) fn read_verified_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let Some(sums) = self.sums.as_deref() else {
            return Err(Error::dataset(&self.path, CorruptKind::NoChecksums));
        };
        self.read_checked_at(sums, checksum::BLOCK, 0, buf, offset)
    }

    /// The content identity of this shard as a file referenced in place: its size and the
    /// pages [`format::sample_ranges`] picks ([`format::sampled_identity`]). Reads at most
    /// 64 KiB.
    pub(crate) fn sampled_identity(&self) -> Result<String> {
        let ranges = format::sample_ranges(self.len);
        let mut sampled = vec![0u8; ranges.iter().map(|r| r.1 as usize).sum()];
        if let Some(object) = self.source.as_remote() {
            // Every sample in one round trip, not one each.
            let mut reads = Vec::with_capacity(ranges.len());
            let mut rest = &mut sampled[..];
            for &(offset, len) in &ranges {
                let (buf, tail) = rest.split_at_mut(len as usize);
                reads.push((object, self.offset + offset, buf));
                rest = tail;
            }
            crate::storage::remote::read_many(&mut reads).map_err(|e| Error::Io {
                path: self.path.clone(),
                offset: None,
                source: e.into(),
            })?;
            return Ok(format::sampled_identity(self.len, &sampled));
        }
        let mut at = 0usize;
        for (offset, len) in ranges {
            self.read_exact_at(&mut sampled[at..at + len as usize], offset)?;
            at += len as usize;
        }
        Ok(format::sampled_identity(self.len, &sampled))
    }

    /// The mount-time check of an in-place shard (format version 4) whose file has mtime
    /// `mtime`: trusted while its guard vouches for its path, mtime and identity and the mtime
    /// is unchanged (the live-mutation guard); otherwise sampled again and refused unless the
    /// content identity matches. A copy, an archive or a move of the dataset directory (new
    /// inodes, rounded mtimes) thus mounts under the same fingerprint.
    pub(super) fn check_in_place(
        &self,
        entry: &ShardEntry,
        mtime: u64,
        etag: Option<&str>,
    ) -> Result<()> {
        let Some(packed) = entry.in_place_mtime_ns else {
            return Ok(());
        };
        let guard = format::in_place_guard(&entry.path, entry.bytes, packed, &entry.hash);
        // A remote object with a recorded ETag is the packed one only while its ETag is: an
        // object replaced since (whatever its sampled pages say) is refused. Without one, its
        // mtime (a Last-Modified of one-second resolution, or none) is no guard alone.
        let remote = self.source.as_remote().is_some();
        if remote
            && let Some(want) = entry.etag.as_deref()
            && etag != Some(want)
        {
            return Err(Error::dataset(&self.path, CorruptKind::InPlaceModified));
        }
        let unchanged = !remote || (entry.etag.is_some() && mtime != 0);
        if unchanged && mtime == packed && entry.in_place_guard.as_deref() == Some(guard.as_str()) {
            return Ok(());
        }
        if self.sampled_identity()? != entry.hash {
            return Err(Error::dataset(
                &self.path,
                CorruptKind::InPlaceContent {
                    hash: entry.hash.clone(),
                    samples: crate::format::SAMPLES,
                },
            ));
        }
        log::debug!(
            "{}: mtime or path differs from `pack --in-place`, content samples match",
            self.path.display()
        );
        Ok(())
    }

    /// Replaces the byte source of this file, its checksum file and its document files with
    /// `wrap(path, source)` (see `Dataset::wrap_sources`).
    pub(super) fn wrap_sources(&mut self, wrap: &Wrap<'_>) {
        self.source = wrap(&self.path, self.source.clone());
        if let Some(sums) = self.sums.as_mut() {
            sums.wrap_sources(wrap);
        }
        if let Some(d) = self.docs.as_mut() {
            d.wrap_sources(wrap);
        }
    }

    /// Attaches document files.
    pub(crate) fn with_docs(mut self, docs: DocFiles) -> Shard {
        self.docs = Some(Box::new(docs));
        self
    }

    /// The document files, if the dataset has documents.
    pub(crate) fn docs(&self) -> Option<&DocFiles> {
        self.docs.as_deref()
    }

    /// Path of the shard file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Fills `buf` from `offset` (relative to the shard's first byte, [`Shard::with_offset`]),
    /// retrying short and interrupted reads; a premature end of file is an error naming the
    /// shard. Errors give file offsets.
    pub(super) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let offset = self.offset + offset;
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

    /// Reads the whole `block`-byte blocks the range touches, checks each against its
    /// checksum (block `k` of this file is checksum `base + k` of `sums`), then copies the
    /// range out.
    pub(super) fn read_checked_at(
        &self,
        sums: &Shard,
        block: u64,
        base: u64,
        buf: &mut [u8],
        offset: u64,
    ) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        sums.check_bound(&self.path)?;
        let first = offset / block;
        let last = (offset + buf.len() as u64 - 1) / block;
        let start = first * block;
        let end = ((last + 1) * block).min(self.len);
        if end < offset + buf.len() as u64 {
            return Err(Error::ShortRead {
                path: self.path.clone(),
                offset: self.offset + offset,
                wanted: buf.len(),
                got: end.saturating_sub(offset) as usize,
            });
        }
        let mut blocks = vec![0u8; (end - start) as usize];
        self.read_exact_at(&mut blocks, start)?;
        let mut want = vec![0u8; ((last - first + 1) * 8) as usize];
        sums.read_exact_at(&mut want, (base + first) * 8)?;
        for (k, (data, sum)) in blocks
            .chunks(block as usize)
            .zip(want.chunks_exact(8))
            .enumerate()
        {
            let sum = u64::from_le_bytes(sum.try_into().expect("8 bytes"));
            if checksum::block_sum(data) != sum {
                let at = start + k as u64 * block;
                return Err(Error::dataset(
                    &self.path,
                    CorruptKind::ChecksumMismatch {
                        start: at,
                        end: at + data.len() as u64,
                        block: first + k as u64,
                    },
                ));
            }
        }
        let skip = (offset - start) as usize;
        buf.copy_from_slice(&blocks[skip..skip + buf.len()]);
        Ok(())
    }
}

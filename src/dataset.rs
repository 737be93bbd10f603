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

use crate::access::{OpenError, Opener, Policy};
use crate::dtype::RecordType;
use crate::error::{Error, Result};
use crate::fdpool::{DEFAULT_MAX_OPEN, FdPool, PinnedFile};
use crate::format::{self, MANIFEST, Manifest};

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
    /// Byte offset of the shard's first byte in its file (the header of an in-place llm.c or
    /// `.npy` shard): every read adds it.
    offset: u64,
    source: Arc<dyn ReadAt>,
    docs: Option<Box<DocFiles>>,
    /// The block checksum file (`checksum.rs`), when the manifest lists one.
    sums: Option<Box<Shard>>,
    /// For a checksum file: the content hash the manifest records for it, checked before the
    /// first read that relies on it.
    bound: Option<Box<Bound>>,
}

/// The content hash a whole checksum file must have. The manifest records it in the shard's
/// entry, which binds the file to its shard: a checksum file of another shard (files swapped
/// together with their checksum files, or copied from another dataset) would otherwise vouch
/// for that shard's bytes. Checked on the first read that needs the file (the file is 1/8192
/// of its shard, so a mount never reads all of them), then remembered.
#[derive(Debug)]
struct Bound {
    want: u64,
    /// [`UNCHECKED`], [`INTACT`] or [`FOREIGN`].
    state: std::sync::atomic::AtomicU8,
}

const UNCHECKED: u8 = 0;
const INTACT: u8 = 1;
const FOREIGN: u8 = 2;

/// The document and metadata files of one shard (format.rs `ShardDocs`).
#[derive(Debug)]
pub struct DocFiles {
    /// One u32 entry id per record.
    pub ids: Shard,
    /// `entries + 1` u64 offsets into `meta`.
    pub index: Shard,
    /// The entries.
    pub meta: Shard,
    /// One 24-byte record per document starting in the shard.
    pub docs: Shard,
    /// Number of entries.
    pub entries: u64,
    /// Number of documents starting in the shard.
    pub documents: u64,
    /// The block checksums of the four files, when the manifest lists them.
    pub sums: Option<DocSums>,
}

/// The checksum file of a shard's document files.
#[derive(Debug)]
pub struct DocSums {
    /// The file: the checksums of ids, index, meta and docs, one after the other.
    pub file: Shard,
    /// The index of the first checksum of each of the four files.
    pub bases: [u64; 4],
}

impl DocFiles {
    /// Reads `buf.len()` bytes of document file `k` (0 ids, 1 index, 2 meta, 3 docs) at
    /// `offset`, checked against its block checksums when the dataset has them and `read` is
    /// [`DocRead::Checked`]: a changed document file is an error, never served.
    fn read_at(&self, k: usize, buf: &mut [u8], offset: u64, read: DocRead) -> Result<()> {
        let file = [&self.ids, &self.index, &self.meta, &self.docs][k];
        match &self.sums {
            Some(s) if read == DocRead::Checked => {
                file.read_checked_at(&s.file, crate::checksum::DOC_BLOCK, s.bases[k], buf, offset)
            }
            _ => file.read_exact_at(buf, offset),
        }
    }
}

/// How document files are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DocRead {
    /// Against their block checksums, metadata validated as JSON: for anything served.
    Checked,
    /// As they are, for sizes only (`stat` of a JSON file): no checksum reads, no JSON
    /// parsing. Whatever such a read yields is never served; a read of the file itself checks
    /// everything. The callers fall back to [`DocRead::Checked`] on any error, and reads whose
    /// extent comes from unchecked bytes are bounded ([`UNCHECKED_ENTRIES`]).
    ForSize,
}

/// Most entry index and metadata bytes an unchecked read (`DocRead::ForSize`) of one shard piece
/// reads; beyond it (rare metadata, or damaged files) the piece is read checked.
const UNCHECKED_ENTRIES: u64 = 1 << 20;

/// A run of records with one metadata entry, its metadata as `M` (see `Dataset::runs`).
struct Run<M> {
    start: u64,
    end: u64,
    doc: u64,
    entry: u64,
    meta: M,
}

/// The shape of a [`Span`] without its metadata text: what its JSON length depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanShape {
    /// First record of the run (relative).
    pub start: u64,
    /// One past the last record (relative).
    pub end: u64,
    /// The document the records belong to.
    pub doc: u64,
    /// Length of the metadata's JSON text.
    pub meta_len: u64,
}

/// A run of records that share one metadata entry, relative to the start of a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// First record of the run (relative).
    pub start: u64,
    /// One past the last record (relative).
    pub end: u64,
    /// The document the records belong to.
    pub doc: u64,
    /// The dataset-wide entry number (equal for the pieces of one document or span).
    pub entry: u64,
    /// The metadata, as JSON text (`null` where there is none).
    pub meta: String,
}

/// Where a document is and what it carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Document {
    /// First record in the stream.
    pub start: u64,
    /// Length in records.
    pub len: u64,
    /// The document's metadata, as JSON text (`null` where there is none).
    pub meta: String,
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
            offset: 0,
            source,
            docs: None,
            sums: None,
            bound: None,
        }
    }

    /// Binds this file (a checksum file) to the content hash `want` the manifest records for
    /// it: no checksum is used before the whole file has been checked against it.
    pub fn bound_to(mut self, want: u64) -> Shard {
        self.bound = Some(Box::new(Bound {
            want,
            state: std::sync::atomic::AtomicU8::new(UNCHECKED),
        }));
        self
    }

    /// Checks a bound file's whole content against its recorded hash, once (a mismatch is
    /// remembered too: the mount holds the file open, so it cannot become right). `of` is the
    /// file whose checksums these are, for the message.
    fn check_bound(&self, of: &Path) -> Result<()> {
        use std::sync::atomic::Ordering;
        let Some(bound) = self.bound.as_deref() else {
            return Ok(());
        };
        let foreign = || {
            Error::dataset(
                &self.path,
                format!(
                    "this checksum file does not hash to {}, the hash the manifest records \
                     for the checksums of {}: it is another shard's (files swapped, or copied \
                     from another dataset) or it changed after packing; restore the dataset's \
                     files or re-run `shufflefs pack` (`shufflefs verify` checks every file)",
                    format::format_hash(bound.want),
                    of.display()
                ),
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
    pub fn with_offset(mut self, offset: u64) -> Shard {
        self.offset = offset;
        self
    }

    /// Attaches the block checksum file.
    pub fn with_sums(mut self, sums: Shard) -> Shard {
        self.sums = Some(Box::new(sums));
        self
    }

    /// The block checksum file, if any.
    pub fn sums(&self) -> Option<&Shard> {
        self.sums.as_deref()
    }

    /// Fills `buf` from `offset` (see [`Shard::read_exact_at`]), public for `shufflefs verify`.
    pub fn read_exact(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.read_exact_at(buf, offset)
    }

    /// Like [`Shard::read_exact_at`], but reads every whole checksum block the range touches
    /// and checks each against the checksum file before copying any byte out: a block that
    /// changed after packing is an error, never served.
    fn read_verified_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let Some(sums) = self.sums.as_deref() else {
            return Err(Error::dataset(
                &self.path,
                "--verify-reads: this shard has no checksums; run `shufflefs verify \
                 --write-checksums DATASET_DIR`",
            ));
        };
        self.read_checked_at(sums, crate::checksum::BLOCK, 0, buf, offset)
    }

    /// The content identity of this shard as a file referenced in place: its size and the
    /// pages [`format::sample_ranges`] picks ([`format::sampled_identity`]). Reads at most
    /// 64 KiB.
    pub fn sampled_identity(&self) -> Result<String> {
        let ranges = format::sample_ranges(self.len);
        let mut sampled = vec![0u8; ranges.iter().map(|r| r.1 as usize).sum()];
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
    fn check_in_place(&self, entry: &format::ShardEntry, mtime: u64) -> Result<()> {
        let Some(packed) = entry.in_place_mtime_ns else {
            return Ok(());
        };
        let guard = format::in_place_guard(&entry.path, entry.bytes, packed, &entry.hash);
        if mtime == packed && entry.in_place_guard.as_deref() == Some(guard.as_str()) {
            return Ok(());
        }
        if self.sampled_identity()? != entry.hash {
            return Err(Error::dataset(
                &self.path,
                format!(
                    "this file is referenced in place and its content is not what `pack \
                     --in-place` referenced (its size and {} sampled pages hash to another \
                     identity than {}): it was modified, or is another file; restore it or \
                     re-run `shufflefs pack --in-place`",
                    format::SAMPLES,
                    entry.hash
                ),
            ));
        }
        log::debug!(
            "{}: mtime or path differs from `pack --in-place`, content samples match",
            self.path.display()
        );
        Ok(())
    }

    /// Attaches document files.
    pub fn with_docs(mut self, docs: DocFiles) -> Shard {
        self.docs = Some(Box::new(docs));
        self
    }

    /// The document files, if the dataset has documents.
    pub fn docs(&self) -> Option<&DocFiles> {
        self.docs.as_deref()
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

    /// Fills `buf` from `offset` (relative to the shard's first byte, [`Shard::with_offset`]),
    /// retrying short and interrupted reads; a premature end of file is an error naming the
    /// shard. Errors give file offsets.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
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
    fn read_checked_at(
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
            if crate::checksum::block_sum(data) != sum {
                let at = start + k as u64 * block;
                return Err(Error::dataset(
                    &self.path,
                    format!(
                        "bytes {at}..{} fail their checksum (block {}): the file changed \
                         after packing; restore it or re-run `shufflefs pack` (`shufflefs \
                         verify` checks every file)",
                        at + data.len() as u64,
                        first + k as u64
                    ),
                ));
            }
        }
        let skip = (offset - start) as usize;
        buf.copy_from_slice(&blocks[skip..skip + buf.len()]);
        Ok(())
    }
}

/// Modification time in nanoseconds since the epoch.
pub fn mtime_ns(meta: &std::fs::Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    (meta.mtime() as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec() as u64)
}

fn shard_open_error(path: &Path, e: &io::Error) -> Error {
    let message = match e.raw_os_error() {
        Some(libc::ENOENT) => {
            "file listed in the manifest is missing; restore it or re-run `shufflefs pack`"
                .to_string()
        }
        Some(libc::ELOOP) => "shard is a symbolic link, which shufflefs refuses to follow; \
                              replace it with the file itself"
            .to_string(),
        Some(libc::EMFILE | libc::ENFILE) => format!(
            "cannot open shard: {e}; the dataset has more files than this process may open: \
             mount with a lower --max-open-shards, raise the open-file limit (ulimit -n), or \
             re-pack with a larger --shard-size"
        ),
        _ => format!("cannot open shard: {e}; restore the file or re-run `shufflefs pack`"),
    };
    Error::dataset(path, message)
}

/// The message for a listed file an [`Opener`] could not open.
pub(crate) fn listed_open_error(path: &Path, e: OpenError) -> Error {
    match e {
        OpenError::Io(e) => shard_open_error(path, &e),
        OpenError::Denied { who, source } => Error::dataset(
            path,
            format!(
                "{who}, cannot read this file ({source}): a mount never serves bytes the \
                 dataset's owner could not read; make the file readable by them, or pack and \
                 mount the dataset as the file's owner (docs/OPERATIONS.md, \"Who may name \
                 which files\")"
            ),
        ),
        OpenError::NotShared { who } => Error::dataset(
            path,
            format!(
                "not every user may read this file, and others can choose what this dataset \
                 names ({who}): a mount with --allow-other by a user other than root serves \
                 only files every user may read; make it readable by all (o+r, and o+x on its \
                 directories), mount without --allow-other, or mount as root, which opens \
                 each file with the dataset owner's permissions (docs/OPERATIONS.md, \"Who \
                 may name which files\")"
            ),
        ),
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

/// Opens a file the manifest lists (`what`: "shard", "document file") as its principals
/// (`access.rs`: a mount never serves bytes the dataset's owner could not read) and checks
/// that it is a regular file of a real filesystem. `O_NOFOLLOW`: it must be the file in the
/// dataset directory, not a symbolic link that could expose another file through the mount.
/// `O_NONBLOCK`: opening a FIFO must not wait for a writer (it would hang the mount); the flag
/// is cleared again once the file is known to be regular. Returns the opener, which reopens
/// the file the same way.
fn open_listed(
    path: &Path,
    what: &str,
    policy: &std::cell::RefCell<Policy>,
) -> Result<(File, std::fs::Metadata, Arc<Opener>)> {
    let opener = policy
        .borrow_mut()
        .opener(path)
        .map_err(|e| shard_open_error(path, &e))?;
    let file = opener.open(path).map_err(|e| listed_open_error(path, e))?;
    let meta = file.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::dataset(
            path,
            format!(
                "{what} is not a regular file; replace it with the file `shufflefs pack` \
                 wrote, or re-run `shufflefs pack`"
            ),
        ));
    }
    if let Some(fs) = pseudo_filesystem(&file) {
        return Err(Error::dataset(
            path,
            format!(
                "this file is on a {fs} filesystem, a kernel interface and not dataset \
                 storage: a manifest may only name files of real filesystems; restore the \
                 manifest or re-run `shufflefs pack`"
            ),
        ));
    }
    nix::fcntl::fcntl(
        &file,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
    )
    .map_err(|e| Error::io(path, e.into()))?;
    Ok((file, meta, opener))
}

/// The largest `manifest.json` read: about 5 million shards. A larger file is not a manifest
/// pack wrote (or a device or a file still growing), and reading it could exhaust memory.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 30;

/// Reads and validates `dir/manifest.json`, opened like a listed file: a regular file (not a
/// FIFO, which would block the open forever, nor a device such as `/dev/zero`, read until
/// memory runs out), not a symbolic link, at most [`MAX_MANIFEST_BYTES`]. Every command that
/// opens a dataset reads its manifest here. Returns the manifest and the file's metadata.
pub(crate) fn read_manifest(dir: &Path) -> Result<(Manifest, std::fs::Metadata)> {
    use std::io::Read;
    let path = dir.join(MANIFEST);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => Error::dataset(
                &path,
                "no manifest: this directory holds no packed dataset (run `shufflefs pack` \
                 first; an interrupted pack leaves no manifest)",
            ),
            Some(libc::ELOOP) => Error::dataset(
                &path,
                "the manifest is a symbolic link, which shufflefs refuses to follow; replace \
                 it with the file itself (or mount the directory it is in)",
            ),
            _ => Error::io(&path, e),
        })?;
    let meta = file.metadata().map_err(|e| Error::io(&path, e))?;
    if !meta.is_file() {
        return Err(Error::dataset(
            &path,
            "the manifest is not a regular file (a FIFO, device or directory): restore the \
             manifest.json `shufflefs pack` wrote, or re-run `shufflefs pack`",
        ));
    }
    let too_big = |size: u64| {
        Error::dataset(
            &path,
            format!(
                "the manifest is {size} bytes, more than the {MAX_MANIFEST_BYTES} bytes a \
                 manifest may have: this is not a manifest `shufflefs pack` wrote; restore it \
                 or re-run `shufflefs pack`"
            ),
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

/// An opened, validated dataset.
#[derive(Debug)]
pub struct Dataset {
    dir: PathBuf,
    manifest: Manifest,
    record: RecordType,
    shards: Vec<Shard>,
    /// `ends[i]` is the stream byte offset one past shard `i`.
    ends: Vec<u64>,
    /// `doc_ends[i]` is one past the last document starting in shard `i` (with documents).
    doc_ends: Vec<u64>,
    /// Check every shard read against the block checksums (`--verify-reads`).
    verify_reads: bool,
}

impl Dataset {
    /// Opens `dir`: parses and validates the manifest, opens every shard and checks its size
    /// against the manifest. Any doubt is an error naming the file. Keeps at most
    /// [`DEFAULT_MAX_OPEN`] descriptors open (see [`Dataset::open_bounded`]).
    pub fn open(dir: &Path) -> Result<Dataset> {
        Dataset::open_bounded(dir, DEFAULT_MAX_OPEN)
    }

    /// [`Dataset::open`] keeping at most `max_open` file descriptors open. A dataset with more
    /// files (shards, checksum and document files) reads them through an [`FdPool`]: each file
    /// is reopened on demand and must still be the file validated here (`fdpool.rs`).
    pub fn open_bounded(dir: &Path, max_open: usize) -> Result<Dataset> {
        Dataset::open_with(dir, max_open, false)
    }

    /// [`Dataset::open_bounded`] for a mount that other users may read (`allow_other`): a
    /// non-root daemon then serves only files every user may read when others can choose what
    /// the dataset names (`access.rs`).
    pub fn open_with(dir: &Path, max_open: usize, allow_other: bool) -> Result<Dataset> {
        let dir = &dir.canonicalize().map_err(|e| Error::io(dir, e))?;
        let manifest_path = dir.join(MANIFEST);
        let (manifest, manifest_meta) = read_manifest(dir)?;
        let policy =
            Policy::new(dir, &manifest_meta, allow_other).map_err(|e| Error::io(dir, e))?;
        let policy = std::cell::RefCell::new(policy);
        let files: usize = manifest
            .shards
            .iter()
            .map(|s| {
                1 + usize::from(s.checksums.is_some())
                    + s.docs
                        .as_ref()
                        .map_or(0, |d| 4 + usize::from(d.checksums.is_some()))
            })
            .sum();
        // All descriptors stay open when they fit (no lock on the read path); otherwise each
        // file is pinned and its descriptor lives in a bounded pool.
        let pool = (files > max_open).then(|| {
            log::info!(
                "{} files in the dataset, at most {max_open} open at once (--max-open-shards)",
                files
            );
            FdPool::new(max_open)
        });
        let source = |path: &Path,
                      file: File,
                      meta: &std::fs::Metadata,
                      opener: Arc<Opener>|
         -> Arc<dyn ReadAt> {
            match &pool {
                Some(pool) => Arc::new(PinnedFile::new(
                    pool,
                    path.to_path_buf(),
                    file,
                    meta,
                    opener,
                )),
                None => Arc::new(file),
            }
        };
        // Shards are read at random: advised at open, and again at every reopen by the pool.
        let shard_source = |path: &Path,
                            file: File,
                            meta: &std::fs::Metadata,
                            opener: Arc<Opener>|
         -> Arc<dyn ReadAt> {
            crate::fdpool::advise_random(&file);
            match &pool {
                Some(pool) => Arc::new(
                    PinnedFile::new(pool, path.to_path_buf(), file, meta, opener).random_access(),
                ),
                None => Arc::new(file),
            }
        };
        let mut shards = Vec::with_capacity(manifest.shards.len());
        for entry in &manifest.shards {
            let path = dir.join(&entry.path);
            let (file, meta, opener) = open_listed(&path, "shard", &policy)?;
            if let Some(want) = entry.in_place_mtime_ns
                && manifest.version < 4
                && mtime_ns(&meta) != want
            {
                return Err(Error::dataset(
                    &path,
                    "this file is referenced in place and was modified after `pack \
                     --in-place`: re-run it to reference the new content",
                ));
            }
            // Validated: offset + bytes does not overflow.
            let want = entry.offset + entry.bytes;
            if meta.len() != want {
                let header = match entry.offset {
                    0 => String::new(),
                    n => format!(" ({n} header bytes and {} of records)", entry.bytes),
                };
                return Err(Error::dataset(
                    &path,
                    format!(
                        "shard is {} bytes but the manifest records {want}{header}: it was \
                         truncated or modified after packing; restore it or re-run `shufflefs \
                         pack`",
                        meta.len(),
                    ),
                ));
            }
            let shard_source = shard_source(&path, file, &meta, opener);
            let mut shard = Shard::new(path, entry.bytes, shard_source).with_offset(entry.offset);
            if manifest.version >= 4 {
                shard.check_in_place(entry, mtime_ns(&meta))?;
            }
            let open = |name: &str, want: Option<u64>| -> Result<Shard> {
                let path = dir.join(name);
                let (file, meta, opener) = open_listed(&path, "document file", &policy)?;
                let len = meta.len();
                match want {
                    Some(want) if len != want => Err(Error::dataset(
                        &path,
                        format!(
                            "file is {len} bytes but the manifest implies {want}: it was \
                             modified after packing; re-run `shufflefs pack`"
                        ),
                    )),
                    _ => Ok(Shard::new(
                        path.clone(),
                        len,
                        source(&path, file, &meta, opener),
                    )),
                }
            };
            let hash = |h: &str| format::parse_hash(h).expect("validated at parse");
            if let Some(c) = &entry.checksums {
                let sums = open(&c.file, Some(crate::checksum::file_len(entry.bytes)))?;
                shard = shard.with_sums(sums.bound_to(hash(&c.hash)));
            }
            if let Some(d) = &entry.docs {
                let sizes = (
                    entry.records.checked_mul(4),
                    d.entries.checked_add(1).and_then(|n| n.checked_mul(8)),
                    d.documents.checked_mul(format::DOC_RECORD),
                );
                let (Some(ids), Some(index), Some(docs)) = sizes else {
                    return Err(Error::dataset(
                        &manifest_path,
                        format!("document file sizes overflow{}", format::EDITED),
                    ));
                };
                let files = [
                    open(&d.ids, Some(ids))?,
                    open(&d.index, Some(index))?,
                    open(&d.meta, Some(d.meta_bytes))?,
                    open(&d.docs, Some(docs))?,
                ];
                let sums = match &d.checksums {
                    None => None,
                    Some(c) => {
                        let mut bases = [0u64; 4];
                        let mut total = 0u64;
                        for (base, f) in bases.iter_mut().zip(&files) {
                            *base = total;
                            total += f.len.div_ceil(crate::checksum::DOC_BLOCK);
                        }
                        Some(DocSums {
                            file: open(&c.file, Some(total * 8))?.bound_to(hash(&c.hash)),
                            bases,
                        })
                    }
                };
                let [ids, index, meta, docs] = files;
                shard = shard.with_docs(DocFiles {
                    ids,
                    index,
                    meta,
                    docs,
                    entries: d.entries,
                    documents: d.documents,
                    sums,
                });
            }
            shards.push(shard);
        }
        Ok(Dataset::from_parts(dir.to_path_buf(), manifest, shards))
    }

    /// Assembles a dataset from already-open shards (tests and fault injection). The shard
    /// lengths must match the manifest.
    pub fn from_parts(dir: PathBuf, manifest: Manifest, shards: Vec<Shard>) -> Dataset {
        let mut ends = Vec::with_capacity(shards.len());
        let mut doc_ends = Vec::new();
        let (mut end, mut doc_end) = (0u64, 0u64);
        for s in &shards {
            end += s.len;
            ends.push(end);
            if let Some(d) = s.docs() {
                doc_end += d.documents;
                doc_ends.push(doc_end);
            }
        }
        Dataset {
            dir,
            record: manifest.record_type(),
            manifest,
            shards,
            ends,
            doc_ends,
            verify_reads: false,
        }
    }

    /// Checks every shard read against the block checksums from now on (`--verify-reads`).
    /// Refused when a shard has no checksum file.
    pub fn with_verified_reads(mut self) -> Result<Dataset> {
        if let Some(s) = self.shards.iter().find(|s| s.sums.is_none()) {
            return Err(Error::dataset(
                &s.path,
                "--verify-reads needs block checksums, and this shard has none (an in-place \
                 dataset or one packed before format version 3): add them with `shufflefs \
                 verify --write-checksums DATASET_DIR`",
            ));
        }
        self.verify_reads = true;
        Ok(self)
    }

    /// Replaces the byte source of every file (shards and document files) with `wrap(path,
    /// source)`: the seam for counting reads and injecting faults in tests.
    pub fn wrap_sources(
        mut self,
        wrap: impl Fn(&Path, Arc<dyn ReadAt>) -> Arc<dyn ReadAt>,
    ) -> Dataset {
        for shard in &mut self.shards {
            shard.source = wrap(&shard.path, shard.source.clone());
            if let Some(sums) = shard.sums.as_mut() {
                sums.source = wrap(&sums.path, sums.source.clone());
            }
            if let Some(d) = shard.docs.as_mut() {
                for f in [&mut d.ids, &mut d.index, &mut d.meta, &mut d.docs] {
                    f.source = wrap(&f.path, f.source.clone());
                }
                if let Some(s) = d.sums.as_mut() {
                    s.file.source = wrap(&s.file.path, s.file.source.clone());
                }
            }
        }
        self
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

    /// Number of documents, when the dataset has document structure.
    pub fn n_documents(&self) -> Option<u64> {
        self.manifest.documents
    }

    /// Whether records carry document and metadata entries.
    pub fn has_documents(&self) -> bool {
        self.manifest.documents.is_some()
    }

    fn corrupt(&self, path: &Path, what: &str) -> Error {
        Error::dataset(
            path,
            format!("{what}: the document files are corrupt; re-run `shufflefs pack`"),
        )
    }

    /// Reads entries `lo..=hi` of a shard: one index read and one data read. Returns
    /// `(index offsets lo..=hi+1, data starting at offsets[0])`.
    fn read_entries(
        &self,
        d: &DocFiles,
        lo: u32,
        hi: u32,
        read: DocRead,
    ) -> Result<(Vec<u64>, Vec<u8>)> {
        if u64::from(hi) >= d.entries || lo > hi {
            return Err(self.corrupt(d.ids.path(), "entry id out of range"));
        }
        let count = (hi - lo) as usize + 2;
        if read == DocRead::ForSize && count as u64 * 8 > UNCHECKED_ENTRIES {
            return self.read_entries(d, lo, hi, DocRead::Checked);
        }
        let mut raw = vec![0u8; count * 8];
        d.read_at(1, &mut raw, u64::from(lo) * 8, read)?;
        let offsets: Vec<u64> = raw
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        // idx[0] = 0 and idx[entries] = meta_bytes, where the read reaches them.
        let first_ok = lo > 0 || offsets[0] == 0;
        let last_ok = u64::from(hi) + 1 < d.entries || offsets[count - 1] == d.meta.len();
        if offsets.windows(2).any(|w| w[1] < w[0].saturating_add(16))
            || offsets[count - 1] > d.meta.len()
            || !first_ok
            || !last_ok
        {
            return Err(self.corrupt(
                d.index.path(),
                "entry offsets not increasing or past the end",
            ));
        }
        let len = offsets[count - 1] - offsets[0];
        if read == DocRead::ForSize && len > UNCHECKED_ENTRIES {
            return self.read_entries(d, lo, hi, DocRead::Checked);
        }
        let mut data = vec![0u8; len as usize];
        d.read_at(2, &mut data, offsets[0], read)?;
        Ok((offsets, data))
    }

    /// Parses entry `id` out of a [`Dataset::read_entries`] result starting at `lo` (its
    /// metadata is validated as JSON unless `read` is [`DocRead::ForSize`]).
    fn entry<'a>(
        &self,
        d: &DocFiles,
        offsets: &[u64],
        data: &'a [u8],
        lo: u32,
        id: u32,
        read: DocRead,
    ) -> Result<(u64, u64, &'a [u8])> {
        let k = (id - lo) as usize;
        let base = offsets[0];
        let bytes = &data[(offsets[k] - base) as usize..(offsets[k + 1] - base) as usize];
        let doc = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        let entry = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
        if doc >= self.manifest.documents.unwrap_or(0) {
            return Err(self.corrupt(d.meta.path(), "metadata entry of a document out of range"));
        }
        let meta = &bytes[16..];
        let json = || {
            std::str::from_utf8(meta)
                .is_ok_and(|m| serde_json::from_str::<&serde_json::value::RawValue>(m).is_ok())
        };
        if read == DocRead::Checked && !json() {
            return Err(self.corrupt(d.meta.path(), "metadata entry is not valid JSON"));
        }
        // pack stores the value's own text, which neither starts nor ends with whitespace.
        let space = |b: Option<&u8>| b.is_some_and(|b| b" \t\n\r".contains(b));
        if space(meta.first()) || space(meta.last()) {
            return Err(self.corrupt(
                d.meta.path(),
                "metadata entry has whitespace around its JSON value",
            ));
        }
        Ok((doc, entry, meta))
    }

    /// The metadata runs of records `[record, record + count)`, in order, tiling the range.
    /// Per shard touched: one read of the ids, one of the entry index, one of the entry data.
    pub fn spans(&self, record: u64, count: u64) -> Result<Vec<Span>> {
        Ok(self
            .runs(record, count, DocRead::Checked, |m| {
                String::from_utf8_lossy(m).into_owned()
            })?
            .into_iter()
            .map(|r| Span {
                start: r.start,
                end: r.end,
                doc: r.doc,
                entry: r.entry,
                meta: r.meta,
            })
            .collect())
    }

    /// The shapes of [`Dataset::spans`] (the same runs, with the length of their metadata
    /// text), for sizes only: the document files are read without their checksums and the
    /// metadata is not parsed ([`DocRead::ForSize`]), falling back to checked reads on any
    /// error, so the shapes are those of the spans whenever the spans can be read.
    pub fn span_shapes(&self, record: u64, count: u64) -> Result<Vec<SpanShape>> {
        let shapes = |read| {
            self.runs(record, count, read, |m: &[u8]| m.len() as u64)
                .map(|runs| {
                    runs.into_iter()
                        .map(|r| SpanShape {
                            start: r.start,
                            end: r.end,
                            doc: r.doc,
                            meta_len: r.meta,
                        })
                        .collect()
                })
        };
        shapes(DocRead::ForSize).or_else(|_| shapes(DocRead::Checked))
    }

    /// The runs of [`Dataset::spans`], with `meta_of(metadata)` as their metadata (the
    /// metadata is valid UTF-8 JSON text when `read` is [`DocRead::Checked`]): the metadata of
    /// runs with equal entries must have equal `meta_of`.
    fn runs<M: PartialEq>(
        &self,
        record: u64,
        count: u64,
        read: DocRead,
        meta_of: impl Fn(&[u8]) -> M,
    ) -> Result<Vec<Run<M>>> {
        let itemsize = self.record.itemsize() as u64;
        let mut out: Vec<Run<M>> = Vec::new();
        let mut pos = record;
        let end = record + count;
        while pos < end {
            let index = self.ends.partition_point(|&e| e <= pos * itemsize);
            let shard = &self.shards[index];
            let d = shard
                .docs()
                .ok_or_else(|| Error::invalid("the dataset has no documents"))?;
            let shard_first = (self.ends[index] - shard.len) / itemsize;
            let shard_end = self.ends[index] / itemsize;
            let take = shard_end.min(end) - pos;
            let mut raw = vec![0u8; take as usize * 4];
            d.read_at(0, &mut raw, (pos - shard_first) * 4, read)?;
            let ids: Vec<u32> = raw
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect();
            // The runs of equal ids, as (first index, id): one pass, comparing sixteen ids at
            // a time without branching (runs are tens to thousands of records long).
            let mut starts: Vec<(usize, u32)> = Vec::new();
            let mut i = 0usize;
            while i < ids.len() {
                let id = ids[i];
                starts.push((i, id));
                let mut j = i + 1;
                while j + 16 <= ids.len()
                    && ids[j..j + 16].iter().fold(0, |a, &x| a | (x ^ id)) == 0
                {
                    j += 16;
                }
                while j < ids.len() && ids[j] == id {
                    j += 1;
                }
                i = j;
            }
            let lo = starts.iter().map(|r| r.1).min().expect("non-empty");
            let hi = starts.iter().map(|r| r.1).max().expect("non-empty");
            let (offsets, data) = self.read_entries(d, lo, hi, read)?;
            for (k, &(i, id)) in starts.iter().enumerate() {
                let j = starts.get(k + 1).map_or(ids.len(), |r| r.0);
                let (doc, entry, meta) = self.entry(d, &offsets, &data, lo, id, read)?;
                let meta = meta_of(meta);
                let (start, stop) = (pos - record + i as u64, pos - record + j as u64);
                // Documents are runs of consecutive records, and entries are numbered in
                // the order pack meets them: the next run belongs to the same document or
                // the next one, a run of the next document has a larger entry number, and
                // a run with the same entry number (continued from the previous shard) is
                // the same entry, document and metadata.
                if let Some(last) = out.last() {
                    let (last_doc, last_entry) = (last.doc, last.entry);
                    let fits = if entry == last_entry {
                        doc == last_doc && meta == last.meta
                    } else {
                        doc == last_doc
                            || (Some(doc) == last_doc.checked_add(1) && entry > last_entry)
                    };
                    if !fits {
                        let before = match self.shards[index.saturating_sub(1)].docs() {
                            Some(prev) if i == 0 => {
                                format!(" at the end of {}", prev.ids.path().display())
                            }
                            _ => String::new(),
                        };
                        return Err(self.corrupt(
                            d.ids.path(),
                            &format!(
                                "records of document {doc} (entry {entry}) follow records of \
                                 document {last_doc} (entry {last_entry}){before}"
                            ),
                        ));
                    }
                }
                match out.last_mut() {
                    Some(last) if last.entry == entry && last.end == start => last.end = stop,
                    _ => out.push(Run {
                        start,
                        end: stop,
                        doc,
                        entry,
                        meta,
                    }),
                }
            }
            pos += take;
        }
        Ok(out)
    }

    /// Document `doc`: one read of its shard's docs file, then its entry (index + data).
    pub fn document(&self, doc: u64) -> Result<Document> {
        self.document_with(doc, DocRead::Checked)
    }

    /// [`Dataset::document`] for sizes only ([`DocRead::ForSize`], with the same fallback as
    /// [`Dataset::span_shapes`]): its metadata text is not validated.
    pub fn document_for_size(&self, doc: u64) -> Result<Document> {
        self.document_with(doc, DocRead::ForSize)
            .or_else(|_| self.document_with(doc, DocRead::Checked))
    }

    fn document_with(&self, doc: u64, read: DocRead) -> Result<Document> {
        let index = self.doc_ends.partition_point(|&e| e <= doc);
        let shard = self.shards.get(index).ok_or(Error::NotFound)?;
        let d = shard
            .docs()
            .ok_or_else(|| Error::invalid("the dataset has no documents"))?;
        let local = doc - (self.doc_ends[index] - d.documents);
        // The record and its neighbours in this shard, in one read: documents tile the
        // stream, so each starts where the one before it ends.
        let first = local.saturating_sub(1);
        let last = (local + 1).min(d.documents - 1);
        let mut raw = vec![0u8; ((last - first + 1) * format::DOC_RECORD) as usize];
        d.read_at(3, &mut raw, first * format::DOC_RECORD, read)?;
        let record = |l: u64| {
            let at = ((l - first) * format::DOC_RECORD) as usize;
            let field = |k: usize| {
                u64::from_le_bytes(raw[at + k * 8..at + k * 8 + 8].try_into().expect("8"))
            };
            (field(0), field(1), field(2))
        };
        let (start, len, entry) = record(local);
        let entry = u32::try_from(entry)
            .map_err(|_| self.corrupt(d.docs.path(), "document entry out of range"))?;
        let end = start
            .checked_add(len)
            .filter(|&e| e <= self.n_records())
            .ok_or_else(|| self.corrupt(d.docs.path(), "document extends past the stream"))?;
        // A document is listed by the shard where it starts (or, when pack started a new
        // shard for its entries, the shard just before), and the last one listed there ends
        // at or after the shard's end: otherwise the next document would start in the shard.
        let itemsize = self.record.itemsize() as u64;
        let shard_first = (self.ends[index] - shard.len) / itemsize;
        let shard_end = self.ends[index] / itemsize;
        let follows = |(s, l, _): (u64, u64, u64)| s.checked_add(l) == Some(start);
        let placed = len > 0
            && (shard_first..=shard_end).contains(&start)
            && (local == 0 || follows(record(local - 1)))
            && if local + 1 < d.documents {
                record(local + 1).0 == end
            } else {
                end >= shard_end
            };
        if !placed {
            return Err(self.corrupt(
                d.docs.path(),
                &format!("document {doc} at records [{start}, {end}) does not fit its place"),
            ));
        }
        // Its entry (and the one before, in the same two reads) is the document's own: it
        // names the document, and pack stores it before any other entry of the document.
        let lo = entry.saturating_sub(1);
        let (offsets, data) = self.read_entries(d, lo, entry, read)?;
        let (owner, _, meta) = self.entry(d, &offsets, &data, lo, entry, read)?;
        let before = if entry > 0 {
            Some(self.entry(d, &offsets, &data, lo, lo, read)?.0)
        } else {
            None
        };
        if owner != doc || before == Some(doc) {
            return Err(self.corrupt(
                d.docs.path(),
                &format!("the entry of document {doc} is not its own"),
            ));
        }
        Ok(Document {
            start,
            len,
            meta: String::from_utf8_lossy(meta).into_owned(),
        })
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
            if self.verify_reads {
                shard.read_verified_at(&mut buf[filled..filled + take], pos - shard_start)?;
            } else {
                shard.read_exact_at(&mut buf[filled..filled + take], pos - shard_start)?;
            }
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
                offset: 0,
                source_format: None,
                docs: None,
                in_place_mtime_ns: None,
                in_place_guard: None,
                checksums: None,
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
            documents: None,
            metadata: false,
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

    /// Packs 1000 u16 tokens `p % 10` in shards of 1 KiB, with documents ended by token 9.
    fn packed(dir: &Path) -> (PathBuf, Manifest) {
        let input = dir.join("t.bin");
        let tokens: Vec<u8> = (0..1000u16).flat_map(|p| (p % 10).to_le_bytes()).collect();
        std::fs::write(&input, tokens).unwrap();
        let ds = dir.join("ds");
        let options = crate::pack::PackOptions {
            dtype: Some(crate::dtype::ScalarType::U16),
            shard_size: 1024,
            doc_sep: Some(9),
            ..crate::pack::PackOptions::default()
        };
        let manifest = crate::pack::pack(&ds, &[input], &options).unwrap();
        (ds.canonicalize().unwrap(), manifest)
    }

    #[test]
    fn a_fifo_or_directory_in_place_of_a_listed_file_is_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let (ds, manifest) = packed(tmp.path());
        let docs = manifest.shards[1].docs.clone().unwrap();
        for (name, make_fifo) in [
            (manifest.shards[0].path.clone(), true),
            (docs.meta.clone(), true),
            (docs.ids.clone(), false),
        ] {
            let path = ds.join(&name);
            let saved = std::fs::read(&path).unwrap();
            std::fs::remove_file(&path).unwrap();
            if make_fifo {
                nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o644))
                    .unwrap();
            } else {
                std::fs::create_dir(&path).unwrap();
            }
            // Opening a FIFO for reading used to wait for a writer: a mount that never
            // returned. Opened on a thread so that a regression fails instead of hanging.
            let (tx, rx) = std::sync::mpsc::channel();
            let dir = ds.clone();
            std::thread::spawn(move || tx.send(Dataset::open(&dir).map(|_| ())).unwrap());
            let result = rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .unwrap_or_else(|_| {
                    // Unblock the stuck open before failing.
                    let _ = std::fs::OpenOptions::new().write(true).open(&path);
                    panic!("{name}: Dataset::open blocked on a FIFO")
                });
            let msg = result.unwrap_err().to_string();
            assert!(
                msg.starts_with(&format!("{}: ", path.display()))
                    && msg.contains("is not a regular file")
                    && msg.contains("re-run `shufflefs pack`"),
                "{msg}"
            );
            if make_fifo {
                std::fs::remove_file(&path).unwrap();
            } else {
                std::fs::remove_dir(&path).unwrap();
            }
            std::fs::write(&path, saved).unwrap();
        }
        Dataset::open(&ds).unwrap();
    }

    /// JSON Lines documents `k` of `1 + (5k) % 7` u16 tokens (their positions); odd ones
    /// start with a one-token span. Shards of 16 records, at most `max_entries` entries each.
    fn packed_documents(dir: &Path, max_entries: u64) -> (PathBuf, Manifest, Vec<(u64, u64)>) {
        let mut lines = String::new();
        let (mut pos, mut docs) = (0u64, Vec::new());
        for k in 0..40u64 {
            let len = 1 + (k * 5) % 7;
            let tokens: Vec<u64> = (pos..pos + len).collect();
            let spans = if k % 2 == 1 {
                format!(r#", "spans": [{{"start": 0, "end": 1, "meta":  {{"s": {k}}}  }}]"#)
            } else {
                String::new()
            };
            // Whitespace around values: pack stores each value's own text.
            lines.push_str(&format!(
                "{{\"tokens\": {tokens:?}, \"meta\": \t {k} {spans}}}"
            ));
            lines.push('\n');
            docs.push((pos, len));
            pos += len;
        }
        let input = dir.join("docs.jsonl");
        std::fs::write(&input, lines).unwrap();
        let ds = dir.join("ds");
        let options = crate::pack::PackOptions {
            dtype: Some(crate::dtype::ScalarType::U16),
            shard_size: 32,
            max_entries_per_shard: Some(max_entries),
            ..crate::pack::PackOptions::default()
        };
        let manifest = crate::pack::pack(&ds, &[input], &options).unwrap();
        (ds, manifest, docs)
    }

    #[test]
    fn read_checks_accept_every_packed_document() {
        for max_entries in [2, 3, 4, 1 << 32] {
            let tmp = tempfile::tempdir().unwrap();
            let (ds, manifest, docs) = packed_documents(tmp.path(), max_entries);
            let dataset = Dataset::open(&ds).unwrap();
            for (d, &(start, len)) in docs.iter().enumerate() {
                let doc = dataset.document(d as u64).unwrap();
                assert_eq!((doc.start, doc.len, doc.meta), (start, len, d.to_string()));
                dataset.spans(start, len).unwrap();
            }
            for first in (0..manifest.records).step_by(5) {
                dataset.spans(first, manifest.records - first).unwrap();
            }
        }
    }

    /// (what, file name, edit, expected words of the error).
    type Damage<'a> = (
        &'static str,
        String,
        Box<dyn Fn(&mut Vec<u8>) + 'a>,
        &'static str,
    );

    #[test]
    fn same_size_damage_to_document_files_fails_the_read() {
        // Each edit keeps every file's size, so the dataset opens; before these checks each
        // served a wrong document range or wrong metadata under the same fingerprint.
        let tmp = tempfile::tempdir().unwrap();
        let (ds, mut manifest, docs) = packed_documents(tmp.path(), 1 << 32);
        // Without the document checksums (which would refuse every edit first), as a
        // dataset packed before them: these are the checks that remain.
        for s in &mut manifest.shards {
            if let Some(d) = s.docs.as_mut() {
                d.checksums = None;
            }
        }
        manifest.content_hash = manifest.expected_content_hash();
        std::fs::write(ds.join(MANIFEST), manifest.to_bytes()).unwrap();
        let shard = |k: usize| manifest.shards[k].docs.clone().unwrap();
        let edit = |name: &str, f: &dyn Fn(&mut Vec<u8>)| {
            let path = ds.join(name);
            let pristine = std::fs::read(&path).unwrap();
            let mut bytes = pristine.clone();
            f(&mut bytes);
            assert_eq!(bytes.len(), pristine.len());
            std::fs::write(&path, &bytes).unwrap();
            (path, pristine)
        };
        let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let put = |b: &mut Vec<u8>, i: usize, v: u64| b[i..i + 8].copy_from_slice(&v.to_le_bytes());
        // The first shard with at least two documents, and its first document's number.
        let k = (0..manifest.shards.len())
            .find(|&k| shard(k).documents >= 2)
            .unwrap();
        let cases: Vec<Damage<'_>> = vec![
            (
                "one more record in a document",
                shard(k).docs,
                Box::new(move |b| put(b, 8, u64_at(b, 8) + 1)),
                "does not fit its place",
            ),
            (
                "two document records swapped",
                shard(k).docs,
                Box::new(|b| {
                    let first: Vec<u8> = b[..24].to_vec();
                    b.copy_within(24..48, 0);
                    b[24..48].copy_from_slice(&first);
                }),
                "does not fit its place",
            ),
            (
                "a document's entry pointing at another entry",
                shard(k).docs,
                Box::new(move |b| put(b, 16, u64_at(b, 16) + 1)),
                "is not its own",
            ),
            (
                "an entry naming a document past the end",
                shard(k).meta,
                Box::new(|b| put(b, 0, 1 << 40)),
                "document out of range",
            ),
            (
                "an entry offset near u64::MAX (overflowed the check)",
                shard(k).index,
                Box::new(|b| put(b, 0, u64::MAX - 7)),
                "entry offsets",
            ),
            (
                "the first entry offset not 0",
                shard(k).index,
                Box::new(|b| put(b, 0, 1)),
                "entry offsets",
            ),
        ];
        for (what, name, f, want) in &cases {
            let (path, pristine) = edit(name, f.as_ref());
            let dataset = Dataset::open(&ds).unwrap();
            let mut errors = Vec::new();
            for (d, &(start, len)) in docs.iter().enumerate() {
                errors.extend(dataset.document(d as u64).err());
                errors.extend(dataset.spans(start, len).err());
            }
            let msg = errors
                .iter()
                .map(|e| e.to_string())
                .find(|m| m.contains(want))
                .unwrap_or_else(|| panic!("{what}: no error says {want:?}: {errors:?}"));
            assert!(msg.contains(&name[..name.len() - 4]), "{what}: {msg}");
            assert!(msg.ends_with("re-run `shufflefs pack`"), "{what}: {msg}");
            std::fs::write(&path, pristine).unwrap();
        }
        // Damage only a whole pass over the stream's metadata can see.
        let offsets = |k: usize| -> Vec<usize> {
            let idx = std::fs::read(ds.join(shard(k).index)).unwrap();
            idx.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
                .collect()
        };
        let idx = offsets(k);
        let whole: Vec<Damage<'_>> = vec![
            (
                "ids jumping to an entry of a document two or more away",
                shard(k).ids,
                Box::new(|b| {
                    let last = b.len() - 4;
                    b.copy_within(0..4, last);
                }),
                "follow records of document",
            ),
            (
                "every entry numbered 0",
                shard(k).meta,
                Box::new(move |b| {
                    for &at in &idx[..idx.len() - 1] {
                        b[at + 8..at + 16].fill(0);
                    }
                }),
                "follow records of document",
            ),
            (
                "metadata text with a trailing space",
                (0..manifest.shards.len())
                    .map(|j| shard(j).meta)
                    .find(|m| {
                        let b = std::fs::read(ds.join(m)).unwrap();
                        b.windows(5).any(|w| w == b"\"s\": ")
                    })
                    .unwrap(),
                Box::new(|b| {
                    let at = b.windows(5).position(|w| w == b"\"s\": ").unwrap();
                    let end = at + b[at..].iter().position(|&c| c == b'}').unwrap();
                    b.copy_within(at + 5..=end, at + 4);
                    b[end] = b' ';
                }),
                "whitespace around its JSON value",
            ),
        ];
        for (what, name, f, want) in &whole {
            let (path, pristine) = edit(name, f.as_ref());
            let dataset = Dataset::open(&ds).unwrap();
            let msg = dataset
                .spans(0, manifest.records)
                .expect_err(what)
                .to_string();
            assert!(msg.contains(want), "{what}: {msg}");
            std::fs::write(&path, pristine).unwrap();
        }
    }

    #[test]
    fn document_files_swapped_with_their_checksum_files_are_refused() {
        // Documents of 8 u16 tokens with one-digit metadata, two per 16-record shard: every
        // shard's files have the same sizes, so two shards' files can be swapped whole.
        let tmp = tempfile::tempdir().unwrap();
        let lines: String = (0..8u64)
            .map(|k| {
                let tokens: Vec<u64> = (k * 8..k * 8 + 8).collect();
                format!("{{\"tokens\": {tokens:?}, \"meta\": {k}}}\n")
            })
            .collect();
        let input = tmp.path().join("docs.jsonl");
        std::fs::write(&input, lines).unwrap();
        let ds = tmp.path().join("ds");
        let options = crate::pack::PackOptions {
            dtype: Some(crate::dtype::ScalarType::U16),
            shard_size: 32,
            ..crate::pack::PackOptions::default()
        };
        let manifest = crate::pack::pack(&ds, &[input], &options).unwrap();
        assert_eq!(manifest.shards.len(), 4);
        let pristine = Dataset::open(&ds).unwrap();
        let want: Vec<_> = (0..8).map(|d| pristine.document(d).unwrap()).collect();
        drop(pristine);
        let files = |k: usize| {
            let s = &manifest.shards[k];
            let d = s.docs.as_ref().unwrap();
            let c = d.checksums.as_ref().unwrap();
            [&s.path, &d.ids, &d.index, &d.meta, &d.docs, &c.file].map(|n| ds.join(n))
        };
        for (a, b) in files(1).iter().zip(files(2).iter()) {
            assert_eq!(
                std::fs::metadata(a).unwrap().len(),
                std::fs::metadata(b).unwrap().len()
            );
            let tmp = a.with_extension("swap");
            std::fs::rename(a, &tmp).unwrap();
            std::fs::rename(b, a).unwrap();
            std::fs::rename(&tmp, b).unwrap();
        }
        let dataset = Dataset::open(&ds).unwrap();
        let mut refused = 0;
        for (d, want) in want.iter().enumerate() {
            match dataset.document(d as u64) {
                Ok(doc) => assert_eq!(&doc, want, "document {d} served from another shard"),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains(".docsums: this checksum file does not hash to"),
                        "{msg}"
                    );
                    refused += 1;
                }
            }
        }
        assert_eq!(refused, 4, "the documents of the two swapped shards");
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

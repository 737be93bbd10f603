//! Reads: what [`ShuffleFs::read_or_job`] answers now, and the [`ReadJob`] it hands out for
//! what may block on shard or document files.
//!
//! A read returns exactly the file's bytes, nothing at or past the end. The bytes are
//! [`Bytes`]: borrowed (`info.json`, or the front of the caller's scratch buffer, which is only
//! ever grown: a FUSE worker keeps one, so a read neither allocates nor zero-fills), a range
//! of an immutable shared file (a cached step file or JSON file, which the reply sends without
//! copying), or owned (a `stats.json` rendering).
//!
//! A step file: a hit of the step cache is answered now, and tells the prefetcher where the
//! reader is. A miss is a job: it looks at the cache again (the prefetcher may have finished
//! the step meanwhile), asks the prefetcher (a step it is assembling is waited for, never
//! assembled twice; one still queued is taken over), tells it what comes next, and reads just
//! the requested range from the shards (only the prefetcher fills the cache). Each READ with
//! data counts once: a hit (cached, or finished by the prefetcher while this read waited) or
//! a miss (assembled here).

use std::io::Write;
use std::ops::{Deref, Range};
use std::sync::Arc;
use std::time::Duration;

use super::plan::PlanFs;
use super::{Attr, Loc, ShuffleFs, Top};
use crate::error::{Error, Result};
use crate::prefetch::Claim;
use crate::shuffle::plan::StepKey;
use crate::stepbuf::StepBuf;
use crate::tree::Node;
use crate::view::{Mask, json_len, json_range};

/// How long a read that missed the cache waits for the prefetcher to finish assembling the same
/// step before assembling it itself. A worker normally needs well under a millisecond; the
/// bound only matters when a shard read stalls.
const PREFETCH_WAIT: Duration = Duration::from_millis(500);

/// Larger JSON files are rendered per request instead of cached (range by range, never whole).
pub(super) const JSON_CACHE_MAX_FILE: u64 = 1 << 20;

/// The bytes of a read.
#[derive(Debug)]
pub enum Bytes<'a> {
    /// Borrowed: a file the filesystem holds, or the front of the caller's scratch buffer.
    Borrowed(&'a [u8]),
    /// A range of an immutable shared file (a cached JSON file).
    Shared(Arc<[u8]>, Range<usize>),
    /// A range of a finished step file (from the step cache).
    Step(Arc<StepBuf>, Range<usize>),
    /// Owned by the reply (a `stats.json` rendering).
    Owned(Vec<u8>),
}

impl Deref for Bytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Borrowed(bytes) => bytes,
            Bytes::Shared(bytes, range) => &bytes[range.clone()],
            Bytes::Step(bytes, range) => &bytes[range.clone()],
            Bytes::Owned(bytes) => bytes,
        }
    }
}

/// What a read answers: its bytes now, or the job that reads them.
#[derive(Debug)]
pub enum Read<'a> {
    /// Answered from memory.
    Ready(Bytes<'a>),
    /// Needs shard or document files: run it where blocking is allowed.
    Job(ReadJob),
}

/// A read that may block on shard or document files: a plain value, run by
/// `ReadJob::run` wherever the caller decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadJob {
    plan: u32,
    node: Node,
    offset: u64,
    size: u32,
}

/// What a lookup or getattr answers: the attributes now, or the job that computes them.
#[derive(Debug)]
pub enum Stat {
    /// Computed from memory.
    Ready(Attr),
    /// Needs document files: run it where blocking is allowed.
    Job(AttrJob),
}

/// Attributes that may read document files (the size of a JSON file not cached yet, or of an
/// observation in documents mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttrJob {
    pub(super) plan: u32,
    pub(super) node: Node,
}

impl AttrJob {
    /// The node whose attributes these are.
    pub(crate) fn node(&self) -> Loc {
        Loc::Plan(self.plan, self.node)
    }

    /// Computes the attributes.
    pub(crate) fn run(&self, fs: &ShuffleFs) -> Result<Attr> {
        fs.plan(self.plan).attr(self.node, fs.ino(self.node()))
    }
}

impl ReadJob {
    /// The file read.
    pub(crate) fn node(&self) -> Loc {
        Loc::Plan(self.plan, self.node)
    }

    /// Where the read starts.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// Most bytes it returns.
    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    /// Reads the bytes: into the front of `scratch` (grown when too short, never shrunk), or
    /// a range of a shared file.
    pub(crate) fn run<'s>(&self, fs: &ShuffleFs, scratch: &'s mut Vec<u8>) -> Result<Bytes<'s>> {
        let ReadJob {
            plan,
            node,
            offset,
            size,
        } = *self;
        let fs = fs.plan(plan);
        let v = &fs.view;
        match node {
            Node::StepNpy(key) => fs.read_step_miss(key, offset, size, scratch),
            Node::ObservationNpy(i) => {
                let len = v.observation_npy_len(i)?;
                if offset >= len {
                    return Ok(Bytes::Borrowed(&[]));
                }
                let buf = room(scratch, u64::from(size).min(len - offset) as usize);
                let n = v.read_observation_npy(i, offset, buf)?;
                Ok(Bytes::Borrowed(&scratch[..n]))
            }
            Node::StepPos(key) | Node::StepDocLens(key) => {
                let mask = match node {
                    Node::StepPos(_) => Mask::Positions,
                    _ => Mask::DocLens,
                };
                let len = v.step_mask_len(mask)?;
                if len <= JSON_CACHE_MAX_FILE {
                    return Ok(shared(fs.mask_bytes(node, key, mask)?, offset, size));
                }
                // Too large to cache: only the rows the range touches are rendered.
                if offset >= len {
                    return Ok(Bytes::Borrowed(&[]));
                }
                let buf = room(scratch, u64::from(size).min(len - offset) as usize);
                let n = v.read_step_mask(key, mask, offset, buf)?;
                Ok(Bytes::Borrowed(&scratch[..n]))
            }
            Node::ValStepNpy(rank, step) => {
                let len = v.step_npy_len();
                if offset >= len {
                    return Ok(Bytes::Borrowed(&[]));
                }
                let buf = room(scratch, u64::from(size).min(len - offset) as usize);
                let n = v.read_val_npy(rank, step, offset, buf)?;
                Ok(Bytes::Borrowed(&scratch[..n]))
            }
            Node::StepJson(_)
            | Node::ObservationJson(_)
            | Node::LookupJson(..)
            | Node::ValStepJson(..) => match fs.cached_json(node)? {
                Ok(bytes) => Ok(shared(bytes, offset, size)),
                Err(_) => {
                    scratch.clear();
                    json_range(offset, size, scratch, |w| fs.write_json(node, w))?;
                    Ok(Bytes::Borrowed(scratch))
                }
            },
            _ => unreachable!("{node:?} is answered by read_or_job"),
        }
    }
}

/// The first `n` bytes of `scratch`, grown (zero-filled) only when too short.
fn room(scratch: &mut Vec<u8>, n: usize) -> &mut [u8] {
    if scratch.len() < n {
        scratch.resize(n, 0);
    }
    &mut scratch[..n]
}

/// Bytes `[offset, offset + size)` of `bytes`, clamped to its end.
fn range(len: usize, offset: u64, size: u32) -> Range<usize> {
    let start = usize::try_from(offset).unwrap_or(usize::MAX).min(len);
    start..start.saturating_add(size as usize).min(len)
}

/// Bytes `[offset, offset + size)` of a finished step file.
fn step_range(bytes: Arc<StepBuf>, offset: u64, size: u32) -> Bytes<'static> {
    let range = range(bytes.len(), offset, size);
    Bytes::Step(bytes, range)
}

/// Bytes `[offset, offset + size)` of a shared file.
fn shared(bytes: Arc<[u8]>, offset: u64, size: u32) -> Bytes<'static> {
    let range = range(bytes.len(), offset, size);
    Bytes::Shared(bytes, range)
}

impl ShuffleFs {
    /// Reads up to `size` bytes of file `ino` at `offset` into `out` (cleared first), running
    /// the job here when there is one: the blocking form of `ShuffleFs::read_or_job`.
    pub fn read(&self, ino: u64, offset: u64, size: u32, out: &mut Vec<u8>) -> Result<()> {
        let mut scratch = Vec::new();
        let bytes = match self.read_or_job(ino, offset, size)? {
            Read::Ready(bytes) => bytes,
            Read::Job(job) => job.run(self, &mut scratch)?,
        };
        out.clear();
        out.extend_from_slice(&bytes);
        Ok(())
    }

    /// Up to `size` bytes of file `ino` at `offset`, exactly the file's bytes (nothing at or
    /// past the end): now when they are in memory, else the job that reads them (see the
    /// module docs).
    pub(crate) fn read_or_job(&self, ino: u64, offset: u64, size: u32) -> Result<Read<'_>> {
        let loc = self.open(ino, libc::O_RDONLY)?;
        let bytes = match loc {
            Loc::Plan(k, node) => return self.plan(k).read_or_job(k, node, offset, size),
            Loc::Top(Top::Info) => {
                let info = self.top_info_json();
                Bytes::Borrowed(&info[range(info.len(), offset, size)])
            }
            Loc::Top(Top::Stats) => owned_range(self.stats_json(loc), offset, size),
            Loc::Top(Top::Root | Top::Plans) => return Err(Error::IsADirectory),
        };
        Ok(Read::Ready(bytes))
    }
}

/// Bytes `[offset, offset + size)` of a rendering.
fn owned_range(mut bytes: Vec<u8>, offset: u64, size: u32) -> Bytes<'static> {
    let range = range(bytes.len(), offset, size);
    bytes.truncate(range.end);
    bytes.drain(..range.start);
    Bytes::Owned(bytes)
}

impl PlanFs {
    /// [`ShuffleFs::read_or_job`] of file `node` of this plan (plan `plan`).
    fn read_or_job(&self, plan: u32, node: Node, offset: u64, size: u32) -> Result<Read<'_>> {
        let job = Read::Job(ReadJob {
            plan,
            node,
            offset,
            size,
        });
        let bytes = match node {
            Node::StepNpy(key) => {
                if offset >= self.view.step_npy_len_at(key) {
                    // The reader's end-of-file probe: nothing to read, count or prefetch.
                    return Ok(Read::Ready(Bytes::Borrowed(&[])));
                }
                if let Some(stub) = &self.stub {
                    return Ok(Read::Ready(shared(stub.clone(), offset, size)));
                }
                match self.cached_step(key) {
                    Some(bytes) => step_range(bytes, offset, size),
                    None => return Ok(job),
                }
            }
            Node::ObservationNpy(_) | Node::ValStepNpy(..) => return Ok(job),
            Node::StepJson(_)
            | Node::ObservationJson(_)
            | Node::LookupJson(..)
            | Node::ValStepJson(..)
            | Node::StepPos(_)
            | Node::StepDocLens(_) => match self.json_cache_get(node) {
                Some(bytes) => shared(bytes, offset, size),
                None => return Ok(job),
            },
            Node::Info => {
                let info = self.view.info_json();
                Bytes::Borrowed(&info[range(info.len(), offset, size)])
            }
            Node::Stats => owned_range(self.stats_json(), offset, size),
            // Every other node is a directory.
            _ => return Err(Error::IsADirectory),
        };
        Ok(Read::Ready(bytes))
    }

    /// Step `key` from the step cache (counted as a hit), telling the prefetcher the reader is
    /// there.
    fn cached_step(&self, key: StepKey) -> Option<Arc<StepBuf>> {
        let bytes = self.cache.as_ref()?.get_if_cached(key)?;
        if let Some(p) = &self.prefetcher {
            p.hint(key);
        }
        Some(bytes)
    }

    /// A read of step `key` that missed the cache (see the module docs).
    fn read_step_miss<'s>(
        &self,
        key: StepKey,
        offset: u64,
        size: u32,
        scratch: &'s mut Vec<u8>,
    ) -> Result<Bytes<'s>> {
        if let Some(bytes) = self.cached_step(key) {
            return Ok(step_range(bytes, offset, size));
        }
        let _guard = match self
            .prefetcher
            .as_ref()
            .map(|p| (p, p.claim(key, PREFETCH_WAIT)))
        {
            Some((p, Claim::Ready(bytes))) => {
                p.hint(key);
                return Ok(step_range(bytes, offset, size));
            }
            Some((p, Claim::Yours(guard))) => {
                p.hint(key);
                Some(guard)
            }
            None => None,
        };
        if let Some(c) = &self.cache {
            c.count_miss();
        }
        let len = self.view.step_npy_len_at(key);
        let buf = room(scratch, u64::from(size).min(len - offset) as usize);
        let n = self.view.read_step_npy(key, offset, buf)?;
        Ok(Bytes::Borrowed(&scratch[..n]))
    }

    /// Writes JSON file `node`.
    pub(super) fn write_json(&self, node: Node, w: &mut impl Write) -> Result<()> {
        let v = &self.view;
        match node {
            Node::StepJson(key) => v.write_step_json(key, w),
            Node::ObservationJson(i) => v.write_observation_json(i, w),
            Node::LookupJson(e, i) => v.write_lookup_json(e, i, w),
            Node::ValStepJson(r, s) => v.write_val_json(r, s, w),
            _ => unreachable!("not a JSON file: {node:?}"),
        }
    }

    fn json_cache(&self) -> std::sync::MutexGuard<'_, lru::LruCache<Node, Arc<[u8]>>> {
        self.json_cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The bytes of JSON file `node` if they are in the JSON cache (a use: it stays longer).
    fn json_cache_get(&self, node: Node) -> Option<Arc<[u8]>> {
        self.json_cache().get(&node).cloned()
    }

    /// The bytes of JSON file `node` if they are in the JSON cache (not counted as a use).
    pub(super) fn json_if_cached(&self, node: Node) -> Option<Arc<[u8]>> {
        self.json_cache().peek(&node).cloned()
    }

    /// Whether `node` is a JSON file whose bytes are in the JSON cache.
    pub(super) fn json_is_cached(&self, node: Node) -> bool {
        self.json_cache().contains(&node)
    }

    /// The bytes of masking array `node` (`mask`) of step `key`, at most
    /// [`JSON_CACHE_MAX_FILE`] bytes, rendered once and kept in the JSON cache.
    fn mask_bytes(&self, node: Node, key: StepKey, mask: Mask) -> Result<Arc<[u8]>> {
        if let Some(bytes) = self.json_cache_get(node) {
            return Ok(bytes);
        }
        let bytes: Arc<[u8]> = self.view.step_mask_npy(key, mask)?.into();
        self.json_cache().put(node, bytes.clone());
        Ok(bytes)
    }

    /// The bytes of a JSON file from the cache, rendering and caching them when small;
    /// `Err(len)` for files too large to cache (rendered range by range instead).
    pub(super) fn cached_json(&self, node: Node) -> Result<std::result::Result<Arc<[u8]>, u64>> {
        if let Some(bytes) = self.json_cache_get(node) {
            return Ok(Ok(bytes));
        }
        // Render once into a buffer that refuses to grow past the cap; only a file over the cap
        // is measured by a second, counting pass.
        let mut capped = Capped(Vec::new());
        if let Err(e) = self.write_json(node, &mut capped) {
            if capped.0.len() as u64 <= JSON_CACHE_MAX_FILE {
                return Err(e);
            }
            return Ok(Err(json_len(|w| self.write_json(node, w))?));
        }
        let bytes: Arc<[u8]> = capped.0.into();
        self.json_cache().put(node, bytes.clone());
        Ok(Ok(bytes))
    }
}

/// A Vec that fails writes once it would exceed [`JSON_CACHE_MAX_FILE`] (by one byte past it,
/// so an overflow is recognisable).
struct Capped(Vec<u8>);

impl Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if (self.0.len() + buf.len()) as u64 > JSON_CACHE_MAX_FILE {
            self.0.resize(JSON_CACHE_MAX_FILE as usize + 1, 0);
            return Err(std::io::Error::other("JSON file larger than the cache cap"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ShuffleFs {
    /// Step file `key` of plan `plan` if the step cache holds it in a memory file (counted
    /// as a hit; a step on the heap is not counted, its reads will be). The prefetcher is not
    /// told: call [`ShuffleFs::reader_at`] once the reply is sent.
    pub(crate) fn memfd_step_if_cached(&self, plan: u32, key: StepKey) -> Option<Arc<StepBuf>> {
        let cache = self.plan(plan).cache.as_ref()?;
        cache.get_cached_if(key, |b| b.memfd_fd().is_some())
    }

    /// Tells plan `plan`'s prefetcher that a reader is at step `key` (it queues the next
    /// steps and may wake a worker: done after the reply, off the reader's wait).
    pub(crate) fn reader_at(&self, plan: u32, key: StepKey) {
        if let Some(p) = &self.plan(plan).prefetcher {
            p.hint(key);
        }
    }
}

//! Runs operations against the filesystem and compares every answer with the [`Reference`]:
//! [`Direct`] calls `ShuffleFs` without a mount, [`Mounted`] goes through a real mount with
//! `std::fs`; [`Checker`] holds the one comparison for both.
//!
//! Besides the reference's bytes and names, the checker holds the tree to its own word: an
//! entry keeps one inode whichever way it is reached (lookup under any spelling, listing,
//! stat), and no two entries share one.

use std::collections::HashMap;
use std::collections::hash_map::Entry as Entry_;
use std::ffi::OsStr;
use std::fs::File as StdFile;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt, MetadataExt, PermissionsExt};
use std::path::PathBuf;

use proptest::test_runner::TestCaseError;
use shufflefs::Error;
use shufflefs::fs::{DirEntry, DirSink, Kind, ShuffleFs};
use shufflefs::mount::MountOptions;
use shufflefs::prefetch::PrefetchConfig;
use shufflefs::view::View;

use super::generators::{Method, Name, Op, TreeCase, Vocab, one_component};
use crate::common::*;

/// What stat says about an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    pub is_dir: bool,
    pub size: u64,
    pub perm: u32,
}

/// One side of the comparison: the filesystem under test, reached one way.
pub trait Tree {
    /// `name` in directory `dir`: `Ok(None)` for ENOENT.
    fn lookup(&mut self, dir: Entry, name: &[u8]) -> Result<Option<Attr>, String>;
    /// `name` inside file `file`: must be ENOTDIR (`Ok(false)` when this side cannot ask).
    fn lookup_in_file(&mut self, file: Entry, name: &[u8]) -> Result<bool, String>;
    fn stat(&mut self, entry: Entry) -> Result<Attr, String>;
    /// Reads `size` bytes at `offset` of a file.
    fn read(
        &mut self,
        file: Entry,
        offset: u64,
        size: usize,
        method: Method,
    ) -> Result<Vec<u8>, String>;
    /// Lists `dir` from listing offset `from` (0 is `.`, 1 is `..`) in pages of `page`:
    /// `(first offset listed, [(name, inode, is a directory)])`.
    #[allow(clippy::type_complexity)]
    fn list(
        &mut self,
        dir: Entry,
        page: usize,
        from: u64,
    ) -> Result<(u64, Vec<(String, u64, bool)>), String>;
    /// Runs queued prefetches, where this side can.
    fn prefetch(&mut self);
}

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

/// The comparison of one tree with the reference.
pub struct Checker {
    pub r: Reference,
    info: Vec<u8>,
    inos: HashMap<Entry, u64>,
    entries: HashMap<u64, Entry>,
    /// Lookups that found / did not find an entry, and names the side could not ask.
    pub found: u64,
    pub missing: u64,
    pub skipped: u64,
}

impl Checker {
    /// Reads and checks `info.json` (which sets the fingerprint the reference's `S.json`
    /// repeats) and the root.
    pub fn new(mut r: Reference, tree: &mut dyn Tree) -> Result<Checker, String> {
        let info = tree.read(Entry::Info, 0, 1 << 20, Method::Pread)?;
        r.check_info(&info)?;
        let mut c = Checker {
            r,
            info,
            inos: HashMap::new(),
            entries: HashMap::new(),
            found: 0,
            missing: 0,
            skipped: 0,
        };
        let root = tree.stat(Entry::Root)?;
        c.attr(Entry::Root, &root)?;
        Ok(c)
    }

    /// The bytes of a file, except `stats.json`.
    pub fn bytes(&self, e: Entry) -> Option<Vec<u8>> {
        match self.r.content(e)? {
            Content::Bytes(b) => Some(b),
            Content::Info => Some(self.info.clone()),
            Content::Stats => None,
        }
    }

    /// Checks attributes against the reference and the inode seen before.
    fn attr(&mut self, e: Entry, a: &Attr) -> Result<(), String> {
        let path = e.path();
        check!(a.is_dir == e.is_dir(), "/{path}: is_dir {}", a.is_dir);
        let perm = if e.is_dir() { 0o555 } else { 0o444 };
        check!(a.perm == perm, "/{path}: mode {:o}, not {perm:o}", a.perm);
        if let Some(want) = self.bytes(e) {
            check!(
                a.size == want.len() as u64,
                "/{path}: size {} instead of {}",
                a.size,
                want.len()
            );
        }
        self.ino(e, a.ino)
    }

    fn ino(&mut self, e: Entry, ino: u64) -> Result<(), String> {
        if let Some(&known) = self.inos.get(&e) {
            check!(known == ino, "/{}: inode {ino}, before {known}", e.path());
        } else {
            if let Some(other) = self.entries.get(&ino) {
                return Err(format!(
                    "/{} and /{} share inode {ino}",
                    e.path(),
                    other.path()
                ));
            }
            self.inos.insert(e, ino);
            self.entries.insert(ino, e);
        }
        Ok(())
    }

    /// Applies one operation to `tree` and checks the answer.
    pub fn apply(&mut self, tree: &mut dyn Tree, op: &Op) -> Result<(), String> {
        match op {
            Op::Lookup(dir, name) => {
                let dir = dir.entry(&self.r);
                self.lookup(tree, dir, name)
            }
            Op::LookupInFile(file, name) => {
                let file = file.entry(&self.r);
                let name = name.spell(Vocab::of(Entry::Root, &self.r));
                if !tree.lookup_in_file(file, &name)? {
                    self.skipped += 1;
                }
                Ok(())
            }
            Op::Stat(file) => {
                let e = file.entry(&self.r);
                let a = tree.stat(e)?;
                self.attr(e, &a)
            }
            Op::StatDir(dir) => {
                let e = dir.entry(&self.r);
                let a = tree.stat(e)?;
                self.attr(e, &a)
            }
            Op::Read(file, offset, size, method) => {
                let e = file.entry(&self.r);
                let whole = self.bytes(e);
                let len = whole.as_ref().map_or(1 << 16, |w| w.len() as u64);
                let (offset, size) = (offset.at(len), size.of(len, offset.at(len)));
                let got = tree.read(e, offset, size, *method)?;
                match whole {
                    Some(whole) => {
                        let start = offset.min(len) as usize;
                        let end = offset.saturating_add(size as u64).min(len) as usize;
                        if let Some(why) = describe(&got, &whole[start..end]) {
                            return Err(format!("/{} at {offset} size {size}: {why}", e.path()));
                        }
                    }
                    None => {
                        // stats.json: whatever a snapshot holds, valid JSON when read whole.
                        check!(
                            got.len() <= size,
                            "stats.json: {} bytes for {size}",
                            got.len()
                        );
                        if offset == 0 && got.len() < size {
                            serde_json::from_slice::<serde_json::Value>(&got)
                                .map_err(|e| format!("stats.json: {e}"))?;
                        }
                    }
                }
                Ok(())
            }
            Op::Readdir(dir, page, from) => {
                let dir = dir.entry(&self.r);
                let from = from.of(self.r.listed(dir).len() as u64 + 3);
                self.listing(tree, dir, 1 + usize::from(page % 8), from)
            }
            Op::Prefetch => {
                tree.prefetch();
                Ok(())
            }
        }
    }

    /// Lists `dir` from offset `from` in pages of `page` and compares names, kinds and inodes
    /// with the reference's listing (`.`, `..`, then the first `max_listing` names).
    pub fn listing(
        &mut self,
        tree: &mut dyn Tree,
        dir: Entry,
        page: usize,
        from: u64,
    ) -> Result<(), String> {
        let mut want: Vec<(String, Entry)> = vec![(".".into(), dir), ("..".into(), dir.parent())];
        want.extend(self.r.listed(dir));
        let (first, got) = tree.list(dir, page, from)?;
        let want = &want[(first as usize).min(want.len())..];
        let names = |v: &mut dyn Iterator<Item = &str>| v.map(str::to_string).collect::<Vec<_>>();
        check!(
            got.len() == want.len(),
            "/{}: listing from {first}: {:?}, not {:?}",
            dir.path(),
            names(&mut got.iter().map(|g| g.0.as_str())),
            names(&mut want.iter().map(|w| w.0.as_str()))
        );
        for ((name, ino, is_dir), (want_name, e)) in got.iter().zip(want) {
            check!(
                name == want_name,
                "/{}: {name:?} listed for {want_name:?}",
                dir.path()
            );
            check!(
                *is_dir == e.is_dir(),
                "/{}: {name} is_dir {is_dir}",
                dir.path()
            );
            if name != "." && name != ".." {
                self.ino(*e, *ino)?;
            } else if let Some(&known) = self.inos.get(e) {
                check!(
                    known == *ino,
                    "/{}: {name} has inode {ino}, not {known}",
                    dir.path()
                );
            }
        }
        Ok(())
    }

    /// Looks `name` up in `dir` and compares with the reference's answer.
    pub fn lookup(&mut self, tree: &mut dyn Tree, dir: Entry, name: &Name) -> Result<(), String> {
        let bytes = name.spell(Vocab::of(dir, &self.r));
        let want = self.r.child(dir, &bytes);
        let shown = String::from_utf8_lossy(&bytes).into_owned();
        match (tree.lookup(dir, &bytes), want) {
            (Ok(Some(a)), Some(e)) => {
                self.found += 1;
                self.attr(e, &a)
                    .map_err(|why| format!("/{}/{shown:?}: {why}", dir.path()))
            }
            (Ok(None), None) => {
                self.missing += 1;
                Ok(())
            }
            (Err(why), _) if why == SKIPPED => {
                self.skipped += 1;
                Ok(())
            }
            (got, want) => Err(format!(
                "/{}/{shown:?}: lookup gave {got:?}, the reference {:?}",
                dir.path(),
                want.map(Entry::path)
            )),
        }
    }
}

/// What a side answers for a name it cannot ask (a mount cannot pass `/` or NUL).
const SKIPPED: &str = "skipped";

// ---------------------------------------------------------------------------------------------
// Without a mount

/// `ShuffleFs` called directly, as the FUSE adapter would.
pub struct Direct {
    pub fs: ShuffleFs,
    inos: HashMap<Entry, u64>,
}

impl Direct {
    pub fn new(fs: ShuffleFs) -> Direct {
        Direct {
            fs,
            inos: HashMap::new(),
        }
    }

    fn ino_of(&mut self, e: Entry) -> Result<u64, String> {
        if let Some(&ino) = self.inos.get(&e) {
            return Ok(ino);
        }
        let ino = walk(&self.fs, &e.path()).map_err(|err| format!("/{}: {err}", e.path()))?;
        self.inos.insert(e, ino);
        Ok(ino)
    }
}

fn attr_of(a: &shufflefs::fs::Attr) -> Attr {
    Attr {
        ino: a.ino,
        is_dir: a.kind == Kind::Directory,
        size: a.size,
        perm: u32::from(a.perm),
    }
}

/// A directory sink that holds `room` entries.
struct Page {
    entries: Vec<DirEntry>,
    room: usize,
}

impl DirSink for Page {
    fn add(&mut self, e: DirEntry) -> bool {
        if self.entries.len() == self.room {
            return true;
        }
        self.entries.push(e);
        false
    }
}

impl Tree for Direct {
    fn lookup(&mut self, dir: Entry, name: &[u8]) -> Result<Option<Attr>, String> {
        let ino = self.ino_of(dir)?;
        match self.fs.lookup(ino, OsStr::from_bytes(name)) {
            Ok(a) => Ok(Some(attr_of(&a))),
            Err(Error::NotFound) => Ok(None),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    fn lookup_in_file(&mut self, file: Entry, name: &[u8]) -> Result<bool, String> {
        let ino = self.ino_of(file)?;
        match self.fs.lookup(ino, OsStr::from_bytes(name)) {
            Err(Error::NotADirectory) => Ok(true),
            other => Err(format!("/{}/{name:?}: {other:?}, not ENOTDIR", file.path())),
        }
    }

    fn stat(&mut self, e: Entry) -> Result<Attr, String> {
        let ino = self.ino_of(e)?;
        let a = self
            .fs
            .getattr(ino)
            .map_err(|err| format!("/{}: {err}", e.path()))?;
        Ok(attr_of(&a))
    }

    fn read(
        &mut self,
        file: Entry,
        offset: u64,
        size: usize,
        _: Method,
    ) -> Result<Vec<u8>, String> {
        let ino = self.ino_of(file)?;
        read_at(&self.fs, ino, offset, u32::try_from(size).unwrap())
            .map_err(|e| format!("/{}: {e}", file.path()))
    }

    fn list(
        &mut self,
        dir: Entry,
        page: usize,
        from: u64,
    ) -> Result<(u64, Vec<(String, u64, bool)>), String> {
        let ino = self.ino_of(dir)?;
        let mut out = Vec::new();
        let mut offset = from;
        loop {
            let mut sink = Page {
                entries: Vec::new(),
                room: page,
            };
            self.fs
                .readdir(ino, offset, &mut sink)
                .map_err(|e| format!("/{}: readdir: {e}", dir.path()))?;
            if sink.entries.is_empty() {
                return Ok((from, out));
            }
            for e in sink.entries {
                check!(
                    e.next_offset == offset + 1,
                    "/{}: next offset {} after {offset}",
                    dir.path(),
                    e.next_offset
                );
                offset = e.next_offset;
                out.push((e.name, e.ino, e.kind == Kind::Directory));
            }
        }
    }

    fn prefetch(&mut self) {
        if let Some(p) = self.fs.prefetcher() {
            p.run_queued();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Through a mount

/// A real mount, read with `std::fs`.
pub struct Mounted {
    /// Open files (declared first: closed before the unmount, which would otherwise detach a
    /// busy mount lazily and wait for it).
    open: HashMap<Entry, StdFile>,
    pub m: TestMount,
    /// Names over the kernel's FUSE name limit (answered ENAMETOOLONG by the kernel).
    pub too_long: u64,
}

impl Mounted {
    pub fn new(m: TestMount) -> Mounted {
        Mounted {
            m,
            open: HashMap::new(),
            too_long: 0,
        }
    }

    fn path(&self, e: Entry) -> PathBuf {
        self.m.path().join(e.path())
    }

    /// Closes the open files and unmounts.
    pub fn unmount(mut self) {
        self.open.clear();
        self.m.unmount();
    }
}

fn attr_of_meta(meta: &std::fs::Metadata) -> Attr {
    Attr {
        ino: meta.ino(),
        is_dir: meta.is_dir(),
        size: meta.len(),
        perm: meta.permissions().mode() & 0o777,
    }
}

impl Tree for Mounted {
    fn lookup(&mut self, dir: Entry, name: &[u8]) -> Result<Option<Attr>, String> {
        if !one_component(name) {
            return Err(SKIPPED.into());
        }
        let path = self.path(dir).join(OsStr::from_bytes(name));
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => Ok(Some(attr_of_meta(&meta))),
            Err(e) if errno(&e) == libc::ENOENT => Ok(None),
            // Names over the kernel's FUSE limit never reach the daemon (Linux 6.18 passes
            // 4,000 bytes; older kernels stop at 1,024).
            Err(e) if errno(&e) == libc::ENAMETOOLONG && name.len() > 1024 => {
                self.too_long += 1;
                Ok(None)
            }
            Err(e) => Err(format!("{e}")),
        }
    }

    fn lookup_in_file(&mut self, file: Entry, name: &[u8]) -> Result<bool, String> {
        if !one_component(name) {
            return Ok(false);
        }
        let path = self.path(file).join(OsStr::from_bytes(name));
        match std::fs::symlink_metadata(&path) {
            Err(e) if errno(&e) == libc::ENOTDIR => Ok(true),
            Err(e) if errno(&e) == libc::ENAMETOOLONG && name.len() > 1024 => Ok(true),
            other => Err(format!("{path:?}: {other:?}, not ENOTDIR")),
        }
    }

    fn stat(&mut self, e: Entry) -> Result<Attr, String> {
        std::fs::symlink_metadata(self.path(e))
            .map(|m| attr_of_meta(&m))
            .map_err(|err| format!("/{}: {err}", e.path()))
    }

    fn read(
        &mut self,
        file: Entry,
        offset: u64,
        size: usize,
        method: Method,
    ) -> Result<Vec<u8>, String> {
        let path = self.path(file);
        let what = |e: std::io::Error| format!("{}: {e}", path.display());
        let mut f = match self.open.entry(file) {
            Entry_::Occupied(e) => &*e.into_mut(),
            Entry_::Vacant(e) => &*e.insert(StdFile::open(&path).map_err(what)?),
        };
        let mut buf = vec![0xA5u8; size];
        let n = match method {
            Method::Pread => f.read_at(&mut buf, offset).map_err(what)?,
            Method::SeekRead => {
                f.seek(SeekFrom::Start(offset)).map_err(what)?;
                f.read(&mut buf).map_err(what)?
            }
            Method::Mmap => {
                let len = f.metadata().map_err(what)?.len();
                // Map from the page holding `offset` (the whole file when it is at or past the
                // end: touching a page wholly past the end would be SIGBUS, not a short read).
                let page = if offset < len {
                    offset / 4096 * 4096
                } else {
                    0
                };
                if len == page {
                    return Ok(Vec::new());
                }
                // SAFETY: a read-only mapping of an immutable shufflefs file.
                let map = unsafe {
                    memmap2::MmapOptions::new()
                        .offset(page)
                        .len((len - page) as usize)
                        .map(f)
                        .map_err(what)?
                };
                let start = (offset.min(len) - page) as usize;
                let end = (offset.saturating_add(size as u64).min(len) - page) as usize;
                return Ok(map[start..end].to_vec());
            }
        };
        buf.truncate(n);
        Ok(buf)
    }

    fn list(
        &mut self,
        dir: Entry,
        _: usize,
        _: u64,
    ) -> Result<(u64, Vec<(String, u64, bool)>), String> {
        let path = self.path(dir);
        let entries = std::fs::read_dir(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .map(|e| {
                let e = e.map_err(|e| e.to_string())?;
                let is_dir = e.file_type().map_err(|e| e.to_string())?.is_dir();
                Ok((
                    e.file_name().to_string_lossy().into_owned(),
                    e.ino(),
                    is_dir,
                ))
            })
            .collect::<Result<Vec<_>, String>>()?;
        // The kernel answers `.` and `..` itself.
        Ok((2, entries))
    }

    fn prefetch(&mut self) {}
}

// ---------------------------------------------------------------------------------------------
// Running a case

/// Packs the case's dataset; `Err` when the plan must be refused (checked here).
pub fn dataset(case: &TreeCase) -> Result<Option<(Data, Reference)>, String> {
    let (data, input) = Data::random(case.tokens, case.shard_records, case.dtype, case.data_seed);
    let cfg = case.config();
    match Reference::new(&data.path(), &cfg) {
        Ok(r) => {
            check!(r.stream == input, "the shards concatenate to the input");
            Ok(Some((data, r)))
        }
        Err(why) => match View::open(&data.path(), &cfg) {
            Err(e) if e.to_string().contains("fewer than one global batch") => Ok(None),
            other => Err(format!("{why}: the plan must be refused, got {other:?}")),
        },
    }
}

/// The filesystem of a case (with its step cache; prefetch workers only when mounted).
pub fn filesystem(case: &TreeCase, data: &Data, workers: usize) -> ShuffleFs {
    let fs = data.fs(&case.config());
    match case.cache {
        Some((steps, depth)) => {
            let budget = steps * fs.view().step_npy_len();
            fs.with_cache(
                budget,
                PrefetchConfig {
                    depth,
                    workers,
                    adaptive: false,
                },
            )
        }
        None => fs,
    }
}

/// Runs `ops` on a fresh dataset of `case`, without a mount or through one.
pub fn run(case: &TreeCase, ops: &[Op], mounted: bool) -> Result<(), TestCaseError> {
    let fail = TestCaseError::fail;
    let Some((data, reference)) = dataset(case).map_err(fail)? else {
        return Ok(());
    };
    let mut tree: Box<dyn Tree> = if mounted {
        let options = MountOptions {
            threads: case.threads,
            ..MountOptions::default()
        };
        Box::new(Mounted::new(TestMount::with_options(
            filesystem(case, &data, 1),
            &options,
        )))
    } else {
        Box::new(Direct::new(filesystem(case, &data, 0)))
    };
    let mut checker = Checker::new(reference, tree.as_mut()).map_err(fail)?;
    for (i, op) in ops.iter().enumerate() {
        checker
            .apply(tree.as_mut(), op)
            .map_err(|why| fail(format!("op {i} {op:?}: {why}")))?;
    }
    Ok(())
}

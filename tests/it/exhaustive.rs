//! Exhaustive checks (issue #5). Every expectation comes from a reference that shares no
//! code with the read path: the shard bytes read from disk and sliced here, a numpy header
//! written here, `shufflefs::feistel::Permutation` (pinned separately) for the order, and
//! directory listings or canonical decimals for names. All randomness is seeded.
//!
//! - `epochs_are_byte_exact_against_the_shards`: every `S.npy` and `S.json` of epochs 0
//!   and 1, for 1, 2 and 8 ranks (u32, u16 and u64 random tokens, windows across shard
//!   boundaries, stride below, equal to and above the window, `n` not a multiple of `G`),
//!   plus every `observation/I.npy` and `lookup/epoch/E/observation/I.json`, through a mount.
//!   Each epoch uses every observation at most once and drops exactly `n mod G`.
//! - `bytes_are_identical_across_threads_cache_and_read_order`: every file of a tree, read
//!   directly (no FUSE) and through mounts with 1 and 4 FUSE threads, with the step cache
//!   and prefetch off and on (a tiny cache that always evicts, and a large one), in
//!   sequential, reverse and seeded random order (concurrently from 4 readers on 4-thread
//!   mounts). Every file's length and hash must agree everywhere.
//! - `random_reads_match_the_whole_file`: 10,000 random `(file, offset, length)` reads per
//!   method (`seek` + `read`, `pread`, `mmap`), including lengths past EOF and offsets at and
//!   far past it, on step `.npy` (larger than one FUSE request) and `.json`, observation
//!   files, lookup files and `info.json`.
//! - `name_fuzzing_gives_the_canonical_entry_or_enoent`: in each of the 11 directory levels,
//!   an adversarial list plus 100,000 generated names (canonical in and out of range,
//!   leading zeros, signs, whitespace, unicode digits, suffix variants, huge numbers, random
//!   bytes, edits of canonical names, dot-like names, names up to 4000 bytes), looked up
//!   twice: in `ShuffleFs::lookup` directly (no FUSE; `/` and NUL included) and, with fresh
//!   names, through the mount with `std::fs::symlink_metadata` (about 6 us per lookup here,
//!   so the full count fits in a few seconds). Every answer must be the entry the directory
//!   listing shows under exactly that name, or `ENOENT`: nothing else, except that a kernel
//!   with the old 1024-byte FUSE name limit answers longer names with `ENAMETOOLONG` itself
//!   (counted separately; Linux 6.18 passes 4000-byte names to the daemon). Names looked up
//!   inside files are `ENOTDIR`. At the end the daemon still serves correct bytes and is in
//!   the mount table.
//!
//! The whole module runs in about 10 s (the test profile builds with opt-level 2).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsStr;
use std::fs::{self, File};
use std::hash::{Hash, Hasher};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use shufflefs::Error;
use shufflefs::dtype::ScalarType;
use shufflefs::feistel::Permutation;
use shufflefs::fs::{DirEntry, Kind, ROOT_INO, ShuffleFs};
use shufflefs::pack::{PackOptions, pack};
use shufflefs::prefetch::PrefetchConfig;
use shufflefs::view::{View, ViewConfig};
use tempfile::TempDir;

use crate::common::*;

/// Generated names per directory level looked up through the mount (each a FUSE round trip).
const MOUNT_NAMES_PER_LEVEL: usize = 100_000;
/// Generated names per directory level given to `ShuffleFs::lookup` directly.
const DIRECT_NAMES_PER_LEVEL: usize = 100_000;
/// Random reads per method (seek+read, pread, mmap).
const READS_PER_METHOD: usize = 10_000;

// ---------------------------------------------------------------------------------------
// Fixtures

/// SplitMix64: a small seeded generator (tests never depend on OS randomness).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        splitmix(&mut self.0)
    }

    /// Uniform in `[0, n)`.
    fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `[lo, hi]`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }

    fn shuffle<T>(&mut self, xs: &mut [T]) {
        for i in (1..xs.len()).rev() {
            xs.swap(i, self.below(i as u64 + 1) as usize);
        }
    }
}

/// A dataset of random tokens (not positional: a misplaced window cannot look right by
/// accident), packed into many small shards.
struct RandomData {
    dir: TempDir,
    itemsize: usize,
    /// The packed input, byte for byte.
    input: Vec<u8>,
}

impl RandomData {
    fn new(tokens: u64, shard_records: u64, dtype: ScalarType, seed: u64) -> RandomData {
        let itemsize = dtype.size();
        let mut rng = Rng(seed);
        let len = tokens as usize * itemsize;
        let mut input = Vec::with_capacity(len + 8);
        while input.len() < len {
            input.extend_from_slice(&rng.next().to_le_bytes());
        }
        input.truncate(len);
        let dir = tempfile::tempdir().unwrap();
        let raw = dir.path().join("tokens.bin");
        fs::write(&raw, &input).unwrap();
        let options = PackOptions {
            dtype: Some(dtype),
            shard_size: shard_records * itemsize as u64,
            // Uniform random values are not tokens of any vocabulary: the width check
            // would call them two narrower tokens each.
            force: true,
            ..PackOptions::default()
        };
        pack(&dir.path().join("ds"), &[raw], &options).unwrap();
        RandomData {
            dir,
            itemsize,
            input,
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("ds")
    }

    fn fs(&self, cfg: &ViewConfig) -> ShuffleFs {
        ShuffleFs::new(View::open(&self.path(), cfg).unwrap()).unwrap()
    }

    /// The shard files' contents, read from disk in manifest order.
    fn shards(&self) -> Vec<Vec<u8>> {
        shard_paths(&self.path())
            .iter()
            .map(|p| fs::read(p).unwrap())
            .collect()
    }
}

/// A `.npy` format 1.0 header as numpy writes it (`numpy.lib.format._wrap_header`): the dict
/// literal, room for the first axis to grow to 21 digits, padding to a multiple of 64, `\n`.
fn numpy_header(descr: &str, shape: &[u64]) -> Vec<u8> {
    let dims = match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut text = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    text.push_str(&" ".repeat(21 - shape[0].to_string().len()));
    let pad = 64 - (10 + text.len() + 1) % 64;
    text.push_str(&" ".repeat(pad));
    text.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&u16::try_from(text.len()).unwrap().to_le_bytes());
    out.extend_from_slice(text.as_bytes());
    assert_eq!(out.len() % 64, 0);
    out
}

fn json(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| {
        panic!(
            "invalid JSON ({e}): {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
        )
    })
}

fn u64s(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error()
        .unwrap_or_else(|| panic!("no errno in {e:?}"))
}

/// Counts differing bytes (a length difference counts as that many mismatches).
fn mismatches(got: &[u8], want: &[u8]) -> usize {
    got.iter().zip(want).filter(|(a, b)| a != b).count() + got.len().abs_diff(want.len())
}

// ---------------------------------------------------------------------------------------
// 1. Byte-exact epochs

struct Case {
    dtype: ScalarType,
    descr: &'static str,
    tokens: u64,
    shard_records: u64,
    window: u64,
    stride: u64,
    batch: u64,
    ranks: u64,
    seed: u64,
}

#[test]
fn epochs_are_byte_exact_against_the_shards() {
    if !fuse_available() {
        return;
    }
    let cases = [
        // stride < window (overlapping, next-token style), 1 rank.
        Case {
            dtype: ScalarType::U32,
            descr: "<u4",
            tokens: 60_029,
            shard_records: 997,
            window: 17,
            stride: 16,
            batch: 3,
            ranks: 1,
            seed: 7,
        },
        // u16, stride == window, 2 ranks.
        Case {
            dtype: ScalarType::U16,
            descr: "<u2",
            tokens: 90_001,
            shard_records: 1499,
            window: 33,
            stride: 33,
            batch: 4,
            ranks: 2,
            seed: 1234,
        },
        // u64, stride > window (gaps never served), 8 ranks, a seed with the top bit set.
        Case {
            dtype: ScalarType::U64,
            descr: "<u8",
            tokens: 27_007,
            shard_records: 613,
            window: 10,
            stride: 13,
            batch: 2,
            ranks: 8,
            seed: u64::MAX - 2,
        },
    ];
    let (mut npy_files, mut json_files, mut other_files, mut bytes_checked, mut bad) =
        (0u64, 0u64, 0u64, 0u64, 0usize);
    let mut first_bad = None;
    for case in &cases {
        let data = RandomData::new(case.tokens, case.shard_records, case.dtype, case.seed);
        let item = data.itemsize as u64;
        // The stream is the shards concatenated; pack must have cut the input, not changed it.
        let shards = data.shards();
        let stream: Vec<u8> = shards.concat();
        assert_eq!(stream, data.input, "shards concatenate to the input");
        assert!(shards.len() >= 10);
        let mut boundaries = Vec::new();
        let mut at = 0u64;
        for s in &shards[..shards.len() - 1] {
            at += s.len() as u64 / item;
            boundaries.push(at);
        }
        let (w, s, b, r) = (case.window, case.stride, case.batch, case.ranks);
        let n = (case.tokens - w) / s + 1;
        let g = b * r;
        let steps = n / g;
        assert_ne!(n % g, 0, "n must not be a multiple of G");
        let crossing = (0..n)
            .filter(|o| boundaries.iter().any(|&x| o * s < x && x < o * s + w))
            .count();
        assert!(crossing > 0, "some windows cross shard boundaries");
        let row = |o: u64| &stream[(o * s * item) as usize..((o * s + w) * item) as usize];

        let cfg = config(w, s, b, r, case.seed, 2);
        let m = TestMount::new(data.fs(&cfg));
        let root = m.path();
        let info = json(&fs::read(root.join("info.json")).unwrap());
        let header = numpy_header(case.descr, &[b, w]);
        assert_eq!(info["n_observations"], n);
        assert_eq!(info["steps_per_epoch"], steps);
        assert_eq!(info["global_batch"], g);
        assert_eq!(info["dropped_per_epoch"], n % g);
        assert_eq!(info["npy_header_bytes"], header.len() as u64);
        assert_eq!(info["step_file_bytes"], header.len() as u64 + b * w * item);
        assert_eq!(info["dtype"], case.descr);
        let fingerprint = info["fingerprint"].as_str().unwrap().to_string();

        let mut orders = Vec::new();
        for epoch in 0..2u64 {
            let perm = Permutation::new(n, case.seed, epoch);
            // Where each observation was served: (step, rank, row).
            let mut served: Vec<Option<(u64, u64, u64)>> = vec![None; n as usize];
            let mut order = Vec::new();
            for step in 0..steps {
                for rank in 0..r {
                    let obs: Vec<u64> = (0..b)
                        .map(|j| perm.apply(step * g + j * r + rank))
                        .collect();
                    let mut want = header.clone();
                    for &o in &obs {
                        want.extend_from_slice(row(o));
                    }
                    let path = m.step(epoch, rank, step, "npy");
                    let got = fs::read(&path).unwrap();
                    assert_eq!(fs::metadata(&path).unwrap().len(), want.len() as u64);
                    let k = mismatches(&got, &want);
                    if k > 0 && first_bad.is_none() {
                        first_bad = Some(format!("{}: {k} bytes differ", path.display()));
                    }
                    bad += k;
                    bytes_checked += want.len() as u64;
                    npy_files += 1;

                    let meta = json(&fs::read(m.step(epoch, rank, step, "json")).unwrap());
                    json_files += 1;
                    assert_eq!(meta["epoch"], epoch);
                    assert_eq!(meta["rank"], rank);
                    assert_eq!(meta["step"], step);
                    assert_eq!(meta["global_step"], epoch * steps + step);
                    assert_eq!(u64s(&meta["observations"]), obs, "e{epoch} r{rank} s{step}");
                    let starts: Vec<u64> = obs.iter().map(|o| o * s).collect();
                    assert_eq!(u64s(&meta["token_starts"]), starts);
                    assert_eq!(meta["fingerprint"], fingerprint.as_str());
                    for (j, &o) in obs.iter().enumerate() {
                        let slot = &mut served[o as usize];
                        assert!(
                            slot.is_none(),
                            "epoch {epoch}: observation {o} served twice"
                        );
                        *slot = Some((step, rank, j as u64));
                    }
                    order.extend_from_slice(&obs);
                }
            }
            let used = served.iter().filter(|x| x.is_some()).count() as u64;
            assert_eq!(
                used,
                steps * g,
                "every served position is a distinct observation"
            );
            assert_eq!(n - used, n % g, "the dropped tail is n mod G");
            // The reverse lookup agrees for every observation, served or dropped; the
            // unshuffled observation files hold the same windows.
            for (o, place) in served.iter().enumerate() {
                let path = root.join(format!("lookup/epoch/{epoch}/observation/{o}.json"));
                let v = json(&fs::read(path).unwrap());
                other_files += 1;
                assert_eq!(v["observation"], o as u64);
                match place {
                    Some((step, rank, j)) => {
                        let at = (v["step"].as_u64(), v["rank"].as_u64(), v["row"].as_u64());
                        assert_eq!(
                            at,
                            (Some(*step), Some(*rank), Some(*j)),
                            "lookup of observation {o} in epoch {epoch}"
                        );
                    }
                    None => assert_eq!(v["dropped"], true, "observation {o} is dropped"),
                }
            }
            orders.push(order);
        }
        assert_ne!(orders[0], orders[1], "epochs 0 and 1 differ in order");
        let obs_header = numpy_header(case.descr, &[w]);
        for o in 0..n {
            let got = fs::read(root.join(format!("observation/{o}.npy"))).unwrap();
            let mut want = obs_header.clone();
            want.extend_from_slice(row(o));
            bad += mismatches(&got, &want);
            bytes_checked += want.len() as u64;
            other_files += 1;
        }
        m.unmount();
    }
    assert_eq!(bad, 0, "mismatching bytes; first: {first_bad:?}");
    eprintln!(
        "byte-exact: {npy_files} step .npy, {json_files} step .json, {other_files} \
         lookup/observation files, {bytes_checked} bytes compared, 0 mismatches"
    );
}

// ---------------------------------------------------------------------------------------
// 2. Determinism

/// Length and hash of a file's bytes.
fn digest(bytes: &[u8]) -> (usize, u64) {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    (bytes.len(), h.finish())
}

/// Every file under `root` (relative paths), except `stats.json`, whose counters change.
fn tree_files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(rel) = dirs.pop() {
        for entry in fs::read_dir(root.join(&rel)).unwrap() {
            let entry = entry.unwrap();
            let child = rel.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                dirs.push(child);
            } else if child != Path::new("stats.json") {
                out.push(child.to_str().unwrap().to_string());
            }
        }
    }
    out.sort();
    out
}

/// Reads a file through `ShuffleFs` alone (no FUSE), in 64 KiB pieces until a read returns
/// nothing.
fn read_direct(fs: &ShuffleFs, rel: &str) -> Vec<u8> {
    let mut ino = ROOT_INO;
    for part in rel.split('/') {
        ino = fs.lookup(ino, OsStr::new(part)).unwrap().ino;
    }
    let size = fs.getattr(ino).unwrap().size;
    let (mut all, mut piece) = (Vec::new(), Vec::new());
    loop {
        fs.read(ino, all.len() as u64, 65_536, &mut piece).unwrap();
        if piece.is_empty() {
            break;
        }
        all.extend_from_slice(&piece);
    }
    assert_eq!(all.len() as u64, size, "{rel}: getattr size");
    all
}

type Digests = BTreeMap<String, (usize, u64)>;

#[test]
fn bytes_are_identical_across_threads_cache_and_read_order() {
    if !fuse_available() {
        return;
    }
    let data = RandomData::new(4_001, 311, ScalarType::U16, 99);
    let cfg = config(9, 7, 3, 2, 5, 2);
    let direct = data.fs(&cfg);
    let step_len = direct.view().step_npy_len();
    // (FUSE threads, cache): the cache is (budget in step files, prefetch depth, workers).
    type Cache = Option<(u64, u64, usize)>;
    let variants: [(usize, Cache); 4] = [
        (1, None),
        (4, None),
        (1, Some((3, 4, 1))),
        (4, Some((1000, 8, 2))),
    ];
    let mut reference: Option<(Vec<String>, Digests)> = None;
    let (mut passes, mut reads) = (0u64, 0u64);
    for (threads, cache) in variants {
        let mut fs = data.fs(&cfg);
        if let Some((steps, depth, workers)) = cache {
            fs = fs.with_cache(
                steps * step_len,
                PrefetchConfig {
                    depth,
                    workers,
                    adaptive: false,
                },
            );
            assert!(fs.cache().is_some());
        }
        let m = TestMount::with_threads(fs, threads);
        let files = tree_files(m.path());
        let (names, want) = reference.get_or_insert_with(|| {
            let d: Digests = files
                .iter()
                .map(|f| (f.clone(), digest(&read_direct(&direct, f))))
                .collect();
            (files.clone(), d)
        });
        assert_eq!(&files, names, "the same tree on every mount");
        let mut rng = Rng(threads as u64 * 1000 + cache.map_or(0, |c| c.0));
        let mut shuffled = files.clone();
        rng.shuffle(&mut shuffled);
        let reversed: Vec<String> = files.iter().rev().cloned().collect();
        for (label, order) in [
            ("sequential", &files),
            ("reverse", &reversed),
            ("random", &shuffled),
        ] {
            // Random order on a 4-thread mount: 4 concurrent readers.
            let readers = if label == "random" && threads == 4 {
                4
            } else {
                1
            };
            let root = m.path();
            let got: Digests = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..readers)
                    .map(|t| {
                        scope.spawn(move || {
                            order
                                .iter()
                                .skip(t)
                                .step_by(readers)
                                .map(|f| (f.clone(), digest(&fs::read(root.join(f)).unwrap())))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap())
                    .collect()
            });
            let differ: Vec<&String> = want
                .iter()
                .filter(|(f, d)| got.get(*f) != Some(*d))
                .map(|(f, _)| f)
                .collect();
            assert!(
                differ.is_empty() && got.len() == want.len(),
                "threads {threads}, cache {cache:?}, {label} order: {} files differ, e.g. {:?}",
                differ.len(),
                differ.first()
            );
            passes += 1;
            reads += got.len() as u64;
        }
        let stats = json(&fs::read(m.path().join("stats.json")).unwrap());
        assert_eq!(stats["cache_enabled"], cache.is_some());
        m.unmount();
    }
    let (names, _) = reference.unwrap();
    eprintln!(
        "determinism: {} files x {passes} passes ({reads} file reads) identical to the \
         direct reads",
        names.len()
    );
}

// ---------------------------------------------------------------------------------------
// 3. Random reads

/// A random `(offset, length)` for a file of `len` bytes: offsets at 0, inside, at EOF, just
/// before it, past it and far past it; lengths 0, tiny, a page, up to the file, past EOF and
/// across several FUSE requests (128 KiB each).
fn random_range(rng: &mut Rng, len: u64) -> (u64, usize) {
    let offset = match rng.below(10) {
        0 => 0,
        1 => len,
        2 => len.saturating_sub(rng.between(1, 8)),
        3 => len + rng.between(1, 300_000),
        4 => *rng.pick(&[1 << 32, 1 << 40, 1 << 50, 1 << 62]),
        5 => rng.below(len / 4096 + 1) * 4096,
        _ => rng.below(len + 1),
    };
    let size = match rng.below(7) {
        0 => 0,
        1 => rng.between(1, 16),
        2 => rng.between(1, 4096),
        3 => rng.between(0, len),
        4 => len.saturating_sub(offset.min(len)),
        5 => len.saturating_sub(offset.min(len)) + rng.between(1, 5000),
        _ => rng.between(len, len + 300_000),
    };
    (offset, size as usize)
}

#[test]
fn random_reads_match_the_whole_file() {
    if !fuse_available() {
        return;
    }
    // Step files of 140 KiB (more than one FUSE READ), 2 ranks, 2 epochs.
    let data = RandomData::new(400_000, 70_001, ScalarType::U16, 3);
    let cfg = config(1025, 1000, 70, 2, 17, 2);
    let view_fs = data.fs(&cfg);
    let (n, steps) = (
        view_fs.view().plan().n_observations(),
        view_fs.view().plan().steps_per_epoch(),
    );
    assert!(view_fs.view().step_npy_len() > 131_072);
    let m = TestMount::new(view_fs);
    let mut rels = vec!["info.json".to_string()];
    for (e, r, s) in [(0, 0, 0), (0, 1, steps - 1), (1, 0, steps - 1), (1, 1, 0)] {
        rels.push(format!("epoch/{e}/rank/{r}/step/{s}.npy"));
        rels.push(format!("epoch/{e}/rank/{r}/step/{s}.json"));
    }
    for o in [0, n / 2, n - 1] {
        rels.push(format!("observation/{o}.npy"));
        rels.push(format!("observation/{o}.json"));
        rels.push(format!("lookup/epoch/1/observation/{o}.json"));
    }
    struct Target {
        rel: String,
        whole: Vec<u8>,
        file: File,
    }
    let targets: Vec<Target> = rels
        .into_iter()
        .map(|rel| {
            let path = m.path().join(&rel);
            let whole = fs::read(&path).unwrap();
            assert_eq!(
                fs::metadata(&path).unwrap().len(),
                whole.len() as u64,
                "{rel}"
            );
            assert!(!whole.is_empty());
            Target {
                rel,
                whole,
                file: File::open(&path).unwrap(),
            }
        })
        .collect();
    let mut rng = Rng(2024);
    let mut buf = vec![0u8; 1 << 20];
    let mut counts = [0usize; 3];
    let (mut past_eof, mut multi_request) = (0usize, 0usize);
    for i in 0..3 * READS_PER_METHOD {
        let t = rng.pick(&targets);
        let len = t.whole.len() as u64;
        let (offset, size) = random_range(&mut rng, len);
        let start = offset.min(len) as usize;
        let end = offset.saturating_add(size as u64).min(len) as usize;
        let want = &t.whole[start..end];
        let method = i % 3;
        let what = || format!("{}: method {method} offset {offset} length {size}", t.rel);
        match method {
            0 => {
                let mut f = &t.file;
                assert_eq!(f.seek(SeekFrom::Start(offset)).unwrap(), offset);
                buf[..size].fill(0xA5);
                let got = f
                    .read(&mut buf[..size])
                    .unwrap_or_else(|e| panic!("{}: {e}", what()));
                assert_eq!(got, want.len(), "{}", what());
                assert_eq!(&buf[..got], want, "{}", what());
            }
            1 => {
                buf[..size].fill(0x5A);
                let got = t
                    .file
                    .read_at(&mut buf[..size], offset)
                    .unwrap_or_else(|e| panic!("{}: {e}", what()));
                assert_eq!(got, want.len(), "{}", what());
                assert_eq!(&buf[..got], want, "{}", what());
            }
            _ => {
                // Map from the page holding `offset` (the whole file when it is at or past
                // EOF: touching a page wholly past EOF would be SIGBUS, not a short read).
                let page = if offset < len {
                    offset / 4096 * 4096
                } else {
                    0
                };
                // SAFETY: the mapped file is an immutable shufflefs file, mapped read-only.
                let map = unsafe {
                    memmap2::MmapOptions::new()
                        .offset(page)
                        .len((len - page) as usize)
                        .map(&t.file)
                        .unwrap_or_else(|e| panic!("{}: {e}", what()))
                };
                assert_eq!(page as usize + map.len(), t.whole.len());
                let got = &map[start - page as usize..end - page as usize];
                assert_eq!(got, want, "{}", what());
            }
        }
        counts[method] += 1;
        past_eof += usize::from(offset.saturating_add(size as u64) > len);
        multi_request += usize::from(want.len() > 131_072);
    }
    let files = targets.len();
    drop(targets);
    m.unmount();
    eprintln!(
        "random reads: {} seek+read, {} pread, {} mmap ({past_eof} reaching past EOF, \
         {multi_request} over 128 KiB) on {files} files, all byte-exact",
        counts[0], counts[1], counts[2]
    );
}

// ---------------------------------------------------------------------------------------
// 4. Name fuzzing

/// The names a directory level holds.
#[derive(Clone, Copy, Debug)]
enum Vocab {
    /// Fixed names.
    Fixed(&'static [&'static str]),
    /// Canonical decimals below the bound.
    Index(u64),
    /// Canonical decimals below the bound, each with every one of the suffixes.
    Files(u64, &'static [&'static str]),
}

impl Vocab {
    /// Every name of the level, built from the grammar (not from the code under test).
    fn all(self) -> BTreeSet<Vec<u8>> {
        match self {
            Vocab::Fixed(names) => names.iter().map(|n| n.as_bytes().to_vec()).collect(),
            Vocab::Index(bound) => (0..bound).map(|i| i.to_string().into_bytes()).collect(),
            Vocab::Files(bound, suffixes) => (0..bound)
                .flat_map(|i| suffixes.iter().map(move |s| format!("{i}{s}").into_bytes()))
                .collect(),
        }
    }

    fn bound(self) -> u64 {
        match self {
            Vocab::Fixed(_) => 10,
            Vocab::Index(b) | Vocab::Files(b, _) => b,
        }
    }

    fn suffixes(self) -> &'static [&'static str] {
        match self {
            Vocab::Files(_, s) => s,
            _ => &[""],
        }
    }
}

const ROOT_NAMES: &[&str] = &["info.json", "stats.json", "epoch", "observation", "lookup"];
const ALL_FIXED: &[&str] = &[
    "info.json",
    "stats.json",
    "epoch",
    "observation",
    "lookup",
    "rank",
    "step",
];

/// Whitespace, invisible and look-alike characters.
const SPACES: &[&str] = &[
    " ", "\t", "\n", "\r", "\x0b", "\x0c", "\u{a0}", "\u{2003}", "\u{3000}", "\u{200b}",
    "\u{feff}", "\u{85}",
];
/// Code points of the digit zero in scripts whose digits `char::is_numeric` accepts.
const UNICODE_ZEROS: &[u32] = &[
    0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xE50, 0xFF10, 0x1D7CE, 0x1D7D8, 0x1D7EC, 0x1D7F6,
    0x2080, 0x1040,
];
const SUFFIX_VARIANTS: &[&str] = &[
    ".NPY",
    ".Npy",
    ".nPy",
    ".npY",
    ".JSON",
    ".Json",
    ".jSON",
    ".npy.npy",
    ".json.json",
    ".npy.json",
    ".json.npy",
    ".npy.",
    ".json.",
    ".",
    "",
    ".np",
    ".npz",
    ".jsonl",
    ".js",
    ".txt",
    " .npy",
    ".npy ",
    "..npy",
    "..json",
    ".npy~",
    ".npy.swp",
    "_npy",
    "npy",
    "json",
    ".\u{ff4e}py",
    "\u{ff0e}npy",
    ".n\u{200b}py",
    ".npy\u{0}",
    ".json/",
    ".npy\n",
];
const DOTS: &[&str] = &[
    ".",
    "..",
    "...",
    "....",
    ". ",
    " .",
    ".\t",
    "./",
    "../",
    ".\u{2024}",
    "\u{ff0e}",
    "\u{2024}",
    "\u{2025}",
    ".npy",
    ".json",
    "..npy",
    "...npy",
    "..json",
    "0.",
    "0..npy",
    ".0",
    ".0.npy",
    "0.0",
    "0..",
    "5.",
    ".5",
    "5..",
    "..5",
    "./5",
    "5/.",
];
const HUGE: &[&str] = &[
    "18446744073709551615",
    "18446744073709551616",
    "18446744073709551614",
    "99999999999999999999",
    "100000000000000000000",
    "340282366920938463463374607431768211456",
    "4294967296",
    "9223372036854775808",
];

/// A canonical in-range name of the level.
fn canonical(rng: &mut Rng, vocab: Vocab) -> String {
    match vocab {
        Vocab::Fixed(names) => rng.pick(names).to_string(),
        Vocab::Index(b) => rng.below(b).to_string(),
        Vocab::Files(b, s) => format!("{}{}", rng.below(b), rng.pick(s)),
    }
}

/// A decimal at or above `bound`.
fn out_of_range(rng: &mut Rng, bound: u64) -> u64 {
    match rng.below(4) {
        0 => bound,
        1 => bound + rng.between(1, 1000),
        2 => u64::MAX - rng.below(3),
        _ => rng.between(bound, u64::MAX),
    }
}

fn unicode_digit(rng: &mut Rng, d: u32) -> char {
    let zero = *rng.pick(UNICODE_ZEROS);
    char::from_u32(zero + d).unwrap()
}

/// One generated name for a level (arbitrary bytes; the caller filters what a path cannot
/// carry).
fn fuzz_name(rng: &mut Rng, vocab: Vocab) -> Vec<u8> {
    let bound = vocab.bound();
    let sfx = *rng.pick(vocab.suffixes());
    let num = rng.below(bound).to_string();
    let name: String = match rng.below(100) {
        // Canonical, in range.
        0..20 => canonical(rng, vocab),
        // Canonical decimals out of range; names of other levels.
        20..28 => match vocab {
            Vocab::Fixed(_) => match rng.below(3) {
                0 => rng.pick(ALL_FIXED).to_string(),
                1 => rng.below(1000).to_string(),
                _ => format!("{}{}", rng.below(1000), rng.pick(&[".npy", ".json"])),
            },
            _ => format!("{}{sfx}", out_of_range(rng, bound)),
        },
        // Leading zeros.
        28..34 => format!("{}{num}{sfx}", "0".repeat(rng.between(1, 25) as usize)),
        // Signs.
        34..40 => {
            let sign = rng.pick(&["+", "-", "++", "+-", "\u{2212}", "\u{ff0b}", "-0", "+0"]);
            format!("{sign}{num}{sfx}")
        }
        // Whitespace around or inside.
        40..46 => {
            let base = canonical(rng, vocab);
            let at = rng.between(0, base.len() as u64) as usize;
            let at = if base.is_char_boundary(at) { at } else { 0 };
            format!("{}{}{}", &base[..at], rng.pick(SPACES), &base[at..])
        }
        // Unicode digits in place of ASCII ones.
        46..52 => {
            let mut out = String::new();
            for c in num.chars() {
                if rng.below(2) == 0 {
                    out.push(unicode_digit(rng, c.to_digit(10).unwrap()));
                } else {
                    out.push(c);
                }
            }
            if out == num {
                let d = rng.below(10) as u32;
                out = unicode_digit(rng, d).to_string();
            }
            format!("{out}{sfx}")
        }
        // Suffix variants on a canonical stem (and on fixed names).
        52..62 => match vocab {
            Vocab::Fixed(names) => {
                let base = rng.pick(names);
                match rng.below(4) {
                    0 => base.to_uppercase(),
                    1 => format!("{base}{}", rng.pick(SUFFIX_VARIANTS)),
                    2 => base[..rng.below(base.len() as u64) as usize].to_string(),
                    _ => format!("{}{base}", rng.pick(&[".", "_", "0", "5", " ", "\u{200b}"])),
                }
            }
            _ => format!("{num}{}", rng.pick(SUFFIX_VARIANTS)),
        },
        // Huge numbers.
        62..68 => {
            let digits = match rng.below(3) {
                0 => rng.pick(HUGE).to_string(),
                1 => (0..rng.between(20, 30))
                    .map(|_| char::from(b'1' + rng.below(9) as u8))
                    .collect(),
                _ => "9".repeat(rng.between(21, 300) as usize),
            };
            format!("{digits}{sfx}")
        }
        // Random bytes (any byte; mostly short).
        68..78 => {
            let len = if rng.below(10) == 0 {
                rng.between(1, 255)
            } else {
                rng.between(1, 12)
            };
            return (0..len).map(|_| rng.next() as u8).collect();
        }
        // Edits of a canonical name: replace, insert, delete, swap, duplicate.
        78..92 => {
            let mut b = canonical(rng, vocab).into_bytes();
            for _ in 0..rng.between(1, 3) {
                let at = rng.below(b.len() as u64 + 1) as usize;
                let byte = if rng.below(2) == 0 {
                    *rng.pick(b"0123456789.+- _njpysoNJPYSO")
                } else {
                    rng.next() as u8
                };
                match rng.below(5) {
                    0 if at < b.len() => b[at] = byte,
                    1 => b.insert(at, byte),
                    2 if at < b.len() && b.len() > 1 => {
                        b.remove(at);
                    }
                    3 if at + 1 < b.len() => b.swap(at, at + 1),
                    _ if at < b.len() => b.insert(at, b[at]),
                    _ => b.push(byte),
                }
            }
            return b;
        }
        // Dot-like names.
        92..97 => format!(
            "{}{}",
            rng.pick(DOTS),
            if rng.below(3) == 0 { sfx } else { "" }
        ),
        // Long names.
        _ => {
            let len = *rng.pick(&[21, 64, 255, 256, 1000, 1024, 1025, 4000]) as usize;
            let body = match rng.below(4) {
                0 => "1".repeat(len),
                1 => format!("{}{num}", "0".repeat(len)),
                2 => format!("{num}{}", " ".repeat(len)),
                _ => "a".repeat(len),
            };
            format!("{body}{sfx}")
        }
    };
    name.into_bytes()
}

/// The adversarial names every level gets.
fn adversarial() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let base = [
        "+5",
        "05",
        "00",
        "5 ",
        "\u{663}",
        "0x5",
        "-0",
        "18446744073709551616",
        "5.npy.",
        "5.NPY",
        "5.npy.npy",
        "5",
        "0",
        "5.npy",
        "5.json",
        "0.npy",
        "0.json",
        " 5",
        "5\t",
        "\u{ff15}",
        "\u{0665}.npy",
        "5e0",
        "5.0",
        "0b101",
        "0o5",
        "5_",
        "1_0",
        "٥",
        "INFO.JSON",
        "info.json ",
        "Info.json",
        "info.json.",
        "info",
        "Epoch",
        "epoch ",
        "epochs",
        "rank.",
        "ranks",
        "Rank",
        "steps",
        "Step",
        "observations",
        "Observation",
        "lookup ",
        "LOOKUP",
        "stats",
        "stats.JSON",
    ];
    for b in base {
        out.push(b.as_bytes().to_vec());
        for sfx in [".npy", ".json"] {
            out.push(format!("{b}{sfx}").into_bytes());
        }
    }
    for d in DOTS {
        out.push(d.as_bytes().to_vec());
    }
    for n in HUGE {
        out.push(n.as_bytes().to_vec());
        out.push(format!("{n}.npy").into_bytes());
    }
    for long in [
        "5".repeat(4000),
        format!("{}.npy", "5".repeat(3996)),
        format!("{}5.npy", "0".repeat(3995)),
        format!("{}.json", "1".repeat(3995)),
        "a".repeat(4000),
        format!("5.npy{}", " ".repeat(3995)),
        "5".repeat(255),
        "5".repeat(256),
    ] {
        out.push(long.into_bytes());
    }
    for raw in [
        &b"\xff"[..],
        b"5\xff",
        b"\xff.npy",
        b"5\xff.npy",
        b"5.npy\xff",
        b"\xc0\xb5",
        b"\xc0\xb5.npy",
        b"\xed\xa0\x80",
        b"5\x80.json",
        b"\xfe\xff",
        b"\xc3",
        b"\xf0\x9f\x98",
        b"\xe0\x80\xb5.npy",
        b"\x01",
        b"5\x7f.npy",
        b"5\x00.npy",
        b"5/",
        b"/",
        b"",
    ] {
        out.push(raw.to_vec());
    }
    out
}

/// A directory level: its directories (relative paths) and the names they hold.
struct Level {
    label: &'static str,
    dirs: Vec<String>,
    vocab: Vocab,
}

fn levels(epochs: u64, ranks: u64, steps: u64, n: u64) -> Vec<Level> {
    let per_epoch = |f: &dyn Fn(u64) -> String| (0..epochs).map(f).collect::<Vec<_>>();
    let per_rank = |f: &dyn Fn(u64, u64) -> String| {
        (0..epochs)
            .flat_map(|e| (0..ranks).map(move |r| (e, r)))
            .map(|(e, r)| f(e, r))
            .collect::<Vec<_>>()
    };
    vec![
        Level {
            label: "/",
            dirs: vec![String::new()],
            vocab: Vocab::Fixed(ROOT_NAMES),
        },
        Level {
            label: "epoch/",
            dirs: vec!["epoch".into()],
            vocab: Vocab::Index(epochs),
        },
        Level {
            label: "epoch/E/",
            dirs: per_epoch(&|e| format!("epoch/{e}")),
            vocab: Vocab::Fixed(&["rank"]),
        },
        Level {
            label: "epoch/E/rank/",
            dirs: per_epoch(&|e| format!("epoch/{e}/rank")),
            vocab: Vocab::Index(ranks),
        },
        Level {
            label: "epoch/E/rank/R/",
            dirs: per_rank(&|e, r| format!("epoch/{e}/rank/{r}")),
            vocab: Vocab::Fixed(&["step"]),
        },
        Level {
            label: "epoch/E/rank/R/step/",
            dirs: per_rank(&|e, r| format!("epoch/{e}/rank/{r}/step")),
            vocab: Vocab::Files(steps, &[".npy", ".json"]),
        },
        Level {
            label: "observation/",
            dirs: vec!["observation".into()],
            vocab: Vocab::Files(n, &[".npy", ".json"]),
        },
        Level {
            label: "lookup/",
            dirs: vec!["lookup".into()],
            vocab: Vocab::Fixed(&["epoch"]),
        },
        Level {
            label: "lookup/epoch/",
            dirs: vec!["lookup/epoch".into()],
            vocab: Vocab::Index(epochs),
        },
        Level {
            label: "lookup/epoch/E/",
            dirs: per_epoch(&|e| format!("lookup/epoch/{e}")),
            vocab: Vocab::Fixed(&["observation"]),
        },
        Level {
            label: "lookup/epoch/E/observation/",
            dirs: per_epoch(&|e| format!("lookup/epoch/{e}/observation")),
            vocab: Vocab::Files(n, &[".json"]),
        },
    ]
}

/// A directory's entries by name: (inode, is a directory).
type Listing = HashMap<Vec<u8>, (u64, bool)>;

fn direct_listing(fs: &ShuffleFs, ino: u64) -> Listing {
    let mut entries: Vec<DirEntry> = Vec::new();
    fs.readdir(ino, 0, &mut entries).unwrap();
    assert_eq!(entries[0].name, ".");
    assert_eq!(entries[1].name, "..");
    entries[2..]
        .iter()
        .map(|e| {
            (
                e.name.clone().into_bytes(),
                (e.ino, e.kind == Kind::Directory),
            )
        })
        .collect()
}

fn mount_listing(dir: &Path) -> Listing {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().as_bytes().to_vec(),
                (e.ino(), e.file_type().unwrap().is_dir()),
            )
        })
        .collect()
}

fn walk_direct(fs: &ShuffleFs, rel: &str) -> u64 {
    rel.split('/')
        .filter(|p| !p.is_empty())
        .fold(ROOT_INO, |ino, part| {
            fs.lookup(ino, OsStr::new(part)).unwrap().ino
        })
}

/// Whether a name can be a single path component (the kernel resolves `.` and `..` itself).
fn one_component(name: &[u8]) -> bool {
    !name.is_empty() && name != b"." && name != b".." && !name.contains(&b'/') && !name.contains(&0)
}

#[test]
fn name_fuzzing_gives_the_canonical_entry_or_enoent() {
    let data = Positional::new(2_000, 1_000);
    let (epochs, ranks) = (7, 6);
    let cfg = config(10, 10, 2, ranks, 3, epochs);
    let fs = data.fs(&cfg);
    let (steps, n) = (
        fs.view().plan().steps_per_epoch(),
        fs.view().plan().n_observations(),
    );
    assert!(
        steps > 5 && n > 5,
        "`5` is in range at every numbered level"
    );
    let levels = levels(epochs, ranks, steps, n);
    let adversarial = adversarial();

    // Without FUSE: every name, '/' and NUL included, straight into ShuffleFs::lookup.
    let mut rng = Rng(5);
    let mut summary = Vec::new();
    for level in &levels {
        let listings: Vec<(u64, Listing)> = level
            .dirs
            .iter()
            .map(|d| {
                let ino = walk_direct(&fs, d);
                let listing = direct_listing(&fs, ino);
                let names: BTreeSet<Vec<u8>> = listing.keys().cloned().collect();
                assert_eq!(names, level.vocab.all(), "{d}: listing");
                (ino, listing)
            })
            .collect();
        let (mut found, mut enoent) = (0usize, 0usize);
        let mut check = |dir: usize, name: &[u8]| {
            let (ino, listing) = &listings[dir];
            match (fs.lookup(*ino, OsStr::from_bytes(name)), listing.get(name)) {
                (Ok(a), Some(&(want, is_dir))) => {
                    assert_eq!((a.ino, a.kind == Kind::Directory), (want, is_dir));
                    found += 1;
                }
                (Err(Error::NotFound), None) => enoent += 1,
                (got, want) => panic!(
                    "{}/{:?}: lookup gave {got:?}, the listing has {want:?}",
                    level.dirs[dir],
                    String::from_utf8_lossy(name)
                ),
            }
        };
        for name in &adversarial {
            for dir in 0..listings.len() {
                check(dir, name);
            }
        }
        for _ in 0..DIRECT_NAMES_PER_LEVEL {
            let dir = rng.below(listings.len() as u64) as usize;
            let name = fuzz_name(&mut rng, level.vocab);
            check(dir, &name);
        }
        summary.push(format!("{} {found}+{enoent}", level.label));
    }
    // A name looked up inside a file is ENOTDIR, whatever the name.
    for file in [
        "info.json",
        "stats.json",
        "epoch/6/rank/5/step/0.npy",
        "epoch/0/rank/0/step/0.json",
        "observation/5.npy",
        "observation/5.json",
        "lookup/epoch/6/observation/5.json",
    ] {
        let ino = walk_direct(&fs, file);
        for name in &adversarial {
            let got = fs.lookup(ino, OsStr::from_bytes(name));
            assert!(
                matches!(got, Err(Error::NotADirectory)),
                "{file}/{name:?}: {got:?}"
            );
        }
    }
    eprintln!(
        "name fuzzing without FUSE (found+ENOENT): {}",
        summary.join(", ")
    );

    if !fuse_available() {
        return;
    }
    let m = TestMount::new(data.fs(&cfg));
    let root = m.path();
    let mut rng = Rng(6);
    let mut summary = Vec::new();
    for level in &levels {
        let listings: Vec<(PathBuf, Listing)> = level
            .dirs
            .iter()
            .map(|d| {
                let dir = root.join(d);
                let listing = mount_listing(&dir);
                let names: BTreeSet<Vec<u8>> = listing.keys().cloned().collect();
                assert_eq!(names, level.vocab.all(), "{d}: listing through the mount");
                // `.` and `..` are the kernel's: the directory itself and its parent.
                let own = fs::symlink_metadata(&dir).unwrap().ino();
                assert_eq!(fs::symlink_metadata(dir.join(".")).unwrap().ino(), own);
                if !d.is_empty() {
                    let parent = fs::symlink_metadata(dir.parent().unwrap()).unwrap().ino();
                    assert_eq!(fs::symlink_metadata(dir.join("..")).unwrap().ino(), parent);
                }
                (dir, listing)
            })
            .collect();
        let (mut found, mut enoent, mut too_long) = (0usize, 0usize, 0usize);
        let mut check = |dir: usize, name: &[u8]| {
            let (path, listing) = &listings[dir];
            let path = path.join(OsStr::from_bytes(name));
            match (fs::symlink_metadata(&path), listing.get(name)) {
                (Ok(meta), Some(&(want, is_dir))) => {
                    assert_eq!((meta.ino(), meta.is_dir()), (want, is_dir), "{path:?}");
                    found += 1;
                }
                (Err(e), None) if errno(&e) == libc::ENOENT => enoent += 1,
                // Names over the kernel's FUSE limit never reach the daemon.
                (Err(e), None) if errno(&e) == libc::ENAMETOOLONG && name.len() > 1024 => {
                    too_long += 1
                }
                (got, want) => {
                    panic!("{path:?}: symlink_metadata gave {got:?}, the listing has {want:?}")
                }
            }
        };
        for name in adversarial.iter().filter(|n| one_component(n)) {
            for dir in 0..listings.len() {
                check(dir, name);
            }
        }
        let mut generated = 0;
        while generated < MOUNT_NAMES_PER_LEVEL {
            let name = fuzz_name(&mut rng, level.vocab);
            if one_component(&name) {
                let dir = rng.below(listings.len() as u64) as usize;
                check(dir, &name);
                generated += 1;
            }
        }
        summary.push(format!("{} {found}+{enoent}+{too_long}", level.label));
    }
    eprintln!(
        "name fuzzing through the mount (found+ENOENT+ENAMETOOLONG): {}",
        summary.join(", ")
    );
    // The daemon is alive and still serves correct bytes.
    let path = m.step(6, 5, steps - 1, "npy");
    let got = fs::read(&path).unwrap();
    let obs = json_observations(&fs::read(m.step(6, 5, steps - 1, "json")).unwrap());
    let mut want = numpy_header("<u4", &[2, 10]);
    want.extend_from_slice(&expected_rows(&obs, &cfg, ScalarType::U32));
    assert_eq!(got, want);
    assert!(
        is_mounted(root),
        "the mount is still in /proc/self/mountinfo"
    );
    m.unmount();
}

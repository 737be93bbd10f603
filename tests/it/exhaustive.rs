//! Exhaustive checks (issue #5). Every expectation comes from a reference that shares no
//! code with the read path: the shard bytes read from disk and sliced here, a numpy header
//! written here, and `shufflefs::feistel::Permutation` (pinned separately) for the order.
//! All randomness is seeded.
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
//!
//! The whole module runs in a few seconds (the test profile builds with opt-level 2).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::hash::{Hash, Hasher};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use shufflefs::dtype::ScalarType;
use shufflefs::feistel::Permutation;
use shufflefs::fs::{ROOT_INO, ShuffleFs};
use shufflefs::pack::{PackOptions, pack};
use shufflefs::prefetch::PrefetchConfig;
use shufflefs::view::{View, ViewConfig};
use tempfile::TempDir;

use crate::common::*;

/// Random reads per method (seek+read, pread, mmap).
const READS_PER_METHOD: usize = 10_000;

// ---------------------------------------------------------------------------------------
// Fixtures

/// SplitMix64: a small seeded generator (tests never depend on OS randomness).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
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
            fs = fs.with_cache(steps * step_len, PrefetchConfig { depth, workers });
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

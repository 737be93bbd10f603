//! Exhaustive checks through a mount (issue #5), against the reference model
//! (`common::reference`: the shard bytes read from disk, the permutation materialised, numpy's
//! header and the JSON written out, sharing no code with the read path). Random reads and
//! name fuzzing moved to the reftests (`reftests::proptest_reads_through_mount`,
//! `reftests::names`).
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

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use shufflefs::dtype::ScalarType;
use shufflefs::prefetch::PrefetchConfig;

use crate::common::*;

struct Case {
    dtype: ScalarType,
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
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut first_bad = None;
    for case in &cases {
        let (data, input) = Data::random(case.tokens, case.shard_records, case.dtype, case.seed);
        let (w, s, b, r) = (case.window, case.stride, case.batch, case.ranks);
        let cfg = config(w, s, b, r, case.seed, 2);
        let mut reference = Reference::new(&data.path(), &cfg).unwrap();
        // The stream is the shards concatenated; pack must have cut the input, not changed it.
        assert_eq!(reference.stream, input, "shards concatenate to the input");
        let shards = shard_paths(&data.path());
        assert!(shards.len() >= 10);
        let mut boundaries = Vec::new();
        let mut at = 0u64;
        for p in &shards[..shards.len() - 1] {
            at += fs::metadata(p).unwrap().len() / reference.itemsize;
            boundaries.push(at);
        }
        let (n, g) = (reference.n, reference.g);
        assert_ne!(n % g, 0, "n must not be a multiple of G");
        let crossing = (0..n)
            .filter(|o| boundaries.iter().any(|&x| o * s < x && x < o * s + w))
            .count();
        assert!(crossing > 0, "some windows cross shard boundaries");

        let m = TestMount::new(data.fs(&cfg));
        let root = m.path();
        reference
            .check_info(&fs::read(root.join("info.json")).unwrap())
            .unwrap();
        let mut check = |path: PathBuf, want: Vec<u8>| {
            let got = fs::read(&path).unwrap();
            assert_eq!(
                fs::metadata(&path).unwrap().len(),
                want.len() as u64,
                "{path:?}"
            );
            let k = mismatches(&got, &want);
            if k > 0 && first_bad.is_none() {
                first_bad = Some(format!("{}: {k} bytes differ", path.display()));
            }
            bad += k;
            bytes_checked += want.len() as u64;
            got
        };
        let mut orders = Vec::new();
        for epoch in 0..2u64 {
            let mut steps = Vec::new();
            for step in 0..reference.steps {
                for rank in 0..r {
                    check(
                        m.step(epoch, rank, step, "npy"),
                        reference.step_npy(epoch, rank, step),
                    );
                    npy_files += 1;
                    let json = check(
                        m.step(epoch, rank, step, "json"),
                        reference.step_json(epoch, rank, step),
                    );
                    json_files += 1;
                    steps.push(json_observations(&json));
                }
            }
            assert_exact_partition(&steps, n, g);
            // The reverse lookup agrees for every observation, served or dropped.
            for o in 0..n {
                let path = root.join(format!("lookup/epoch/{epoch}/observation/{o}.json"));
                check(path, reference.lookup_json(epoch, o));
                other_files += 1;
            }
            orders.push(steps.concat());
        }
        assert_ne!(orders[0], orders[1], "epochs 0 and 1 differ in order");
        // The unshuffled observation files hold the same windows.
        for o in 0..n {
            check(
                root.join(format!("observation/{o}.npy")),
                reference.observation_npy(o),
            );
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

type Digests = BTreeMap<String, String>;

#[test]
fn bytes_are_identical_across_threads_cache_and_read_order() {
    if !fuse_available() {
        return;
    }
    let (data, _) = Data::random(4_001, 311, ScalarType::U16, 99);
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
                .map(|f| (f.clone(), digest(&read_all(&direct, f))))
                .collect();
            (files.clone(), d)
        });
        assert_eq!(&files, names, "the same tree on every mount");
        let mut rng = Rng::new(threads as u64 * 1000 + cache.map_or(0, |c| c.0));
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
        assert_eq!(stats(m.path())["cache_enabled"], cache.is_some());
        m.unmount();
    }
    let (names, _) = reference.unwrap();
    eprintln!(
        "determinism: {} files x {passes} passes ({reads} file reads) identical to the \
         direct reads",
        names.len()
    );
}

//! The filesystem model without FUSE, case by case: numpy's header, names, listings and their
//! bound, `info.json` and the fingerprint, elastic ranks, `S.json` ranges, open and access
//! flags, the step cache and prefetch counters. (Random datasets, plans and operations against
//! the reference model: `reftests`.)

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use shufflefs::Error;
use shufflefs::dtype::ScalarType;
use shufflefs::fs::{DirEntry, DirSink, Kind, Loc, Node, ShuffleFs};
use shufflefs::npy;
use shufflefs::plan::StepKey;
use shufflefs::view::ViewConfig;

use crate::common::*;

#[test]
fn header_matches_numpy_written_fixtures() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    for (file, descr, shape) in [
        ("step_u4_4x6.npy", "'<u4'", vec![4u64, 6]),
        ("step_u1_3x5.npy", "'|u1'", vec![3, 5]),
        ("step_i8_2x3.npy", "'<i8'", vec![2, 3]),
        ("tokens_u2_1d.npy", "'<u2'", vec![1000]),
    ] {
        let golden = std::fs::read(fixtures.join(file)).unwrap();
        let ours = npy::header(descr, &shape).unwrap();
        assert_eq!(&golden[..ours.len()], &ours[..], "{file}: header bytes");
        let item: u64 = match descr {
            "'|u1'" => 1,
            "'<u2'" => 2,
            "'<u4'" => 4,
            _ => 8,
        };
        assert_eq!(
            golden.len() as u64,
            ours.len() as u64 + shape.iter().product::<u64>() * item,
            "{file}: header length is all that precedes the data"
        );
    }
    // A mounted step file's data laid after our header reproduces numpy's file exactly.
    let golden = std::fs::read(fixtures.join("step_u4_4x6.npy")).unwrap();
    let data: Vec<u8> = (0..24u32).flat_map(|i| (i * 7).to_le_bytes()).collect();
    let mut ours = npy::header("'<u4'", &[4, 6]).unwrap();
    ours.extend_from_slice(&data);
    assert_eq!(ours, golden);
}

#[test]
fn names_have_one_spelling() {
    let data = Data::positional(2000, 1 << 20);
    let fs = data.fs(&config(10, 10, 2, 3, 0, 2));
    assert!(walk(&fs, "epoch/1/rank/2/step/32.npy").is_ok());
    assert!(walk(&fs, "info.json").is_ok());
    for bad in [
        "epoch/2",
        "epoch/01",
        "epoch/+1",
        "epoch/1/rank/3",
        "epoch/1/rank/-0",
        "epoch/1/ranks",
        "epoch/0/rank/0/step/33.npy",
        "epoch/0/rank/0/step/07.npy",
        "epoch/0/rank/0/step/+7.npy",
        "epoch/0/rank/0/step/ 7.npy",
        "epoch/0/rank/0/step/7 .npy",
        "epoch/0/rank/0/step/7.NPY",
        "epoch/0/rank/0/step/7.npy.npy",
        "epoch/0/rank/0/step/7.npy.",
        "epoch/0/rank/0/step/7",
        "epoch/0/rank/0/step/.npy",
        "epoch/0/rank/0/step/0x7.npy",
        "epoch/0/rank/0/step/18446744073709551616.npy",
        "epoch/0/rank/0/step/99999999999999999999999999.json",
        "Info.json",
        "info.json.",
        "epoch/0/rank/0/step/٣.npy",
    ] {
        match walk(&fs, bad) {
            Err(Error::NotFound) => {}
            other => panic!("{bad}: expected NotFound, got {other:?}"),
        }
    }
    let non_utf8 = OsStr::from_bytes(b"\xff\xfe.npy");
    let step_dir = walk(&fs, "epoch/0/rank/0/step").unwrap();
    assert!(matches!(
        fs.lookup(step_dir, non_utf8),
        Err(Error::NotFound)
    ));
    let long = "7".repeat(4000) + ".npy";
    assert!(matches!(
        fs.lookup(step_dir, OsStr::new(&long)),
        Err(Error::NotFound)
    ));
    let file = walk(&fs, "info.json").unwrap();
    assert!(matches!(
        fs.lookup(file, OsStr::new("x")),
        Err(Error::NotADirectory)
    ));
    assert!(matches!(fs.getattr(0), Err(Error::NotFound)));
    assert!(matches!(fs.getattr(u64::MAX), Err(Error::NotFound)));
    assert!(matches!(
        fs.open(file, libc::O_WRONLY),
        Err(Error::ReadOnly)
    ));
    assert!(matches!(
        fs.open(step_dir, libc::O_RDONLY),
        Err(Error::IsADirectory)
    ));
}

struct Pages {
    entries: Vec<DirEntry>,
    room: usize,
}

impl DirSink for Pages {
    fn add(&mut self, e: DirEntry) -> bool {
        if self.room == 0 {
            return true;
        }
        self.room -= 1;
        self.entries.push(e);
        false
    }
}

fn list_paged(fs: &ShuffleFs, ino: u64, page: usize) -> Vec<DirEntry> {
    let mut all: Vec<DirEntry> = Vec::new();
    let mut offset = 0;
    loop {
        let mut sink = Pages {
            entries: Vec::new(),
            room: page,
        };
        fs.readdir(ino, offset, &mut sink).unwrap();
        let Some(last) = sink.entries.last() else {
            return all;
        };
        offset = last.next_offset;
        all.extend(sink.entries);
    }
}

#[test]
fn listings_are_exact_and_page_with_offsets() {
    let data = Data::positional(2000, 1 << 20);
    let fs = data.fs(&config(10, 10, 2, 3, 0, 2));
    let names = |path: &str, page| -> Vec<String> {
        list_paged(&fs, walk(&fs, path).unwrap(), page)
            .into_iter()
            .map(|e| e.name)
            .collect()
    };
    assert_eq!(
        names("", 3),
        [
            ".",
            "..",
            "info.json",
            "stats.json",
            "epoch",
            "observation",
            "lookup"
        ]
    );
    assert_eq!(names("epoch", 1), [".", "..", "0", "1"]);
    assert_eq!(names("epoch/1", 3), [".", "..", "rank"]);
    assert_eq!(names("epoch/1/rank", 2), [".", "..", "0", "1", "2"]);
    let steps = names("epoch/1/rank/2/step", 3);
    let mut expected = vec![".".to_string(), "..".to_string()];
    for s in 0..33 {
        expected.push(format!("{s}.npy"));
        expected.push(format!("{s}.json"));
    }
    assert_eq!(steps, expected);
    // Every listed entry resolves by lookup to the same inode and kind.
    let dir = walk(&fs, "epoch/1/rank/2/step").unwrap();
    for e in list_paged(&fs, dir, 7).into_iter().skip(2) {
        let a = fs.lookup(dir, OsStr::new(&e.name)).unwrap();
        assert_eq!((a.ino, a.kind), (e.ino, Kind::File));
    }
}

#[test]
fn listings_are_bounded_and_every_name_beyond_resolves() {
    // 4,000 tokens, window 1, batch 1, 3 ranks: 1,333 steps per rank (2,666 names), 4,000
    // observations (8,000 names in observation/, 4,000 in lookup/epoch/E/observation/).
    let data = Data::positional_of(4000, 1 << 20, ScalarType::U8);
    for bound in [1u64, 2, 3, 1000, 2666, 2667] {
        let fs = data.fs(&ViewConfig {
            max_listing: bound,
            ..config(1, 1, 1, 3, 5, 4)
        });
        for (path, names, first) in [
            ("epoch/3/rank/2/step", 2666, ["0.npy", "0.json", "1.npy"]),
            ("observation", 8000, ["0.npy", "0.json", "1.npy"]),
            (
                "lookup/epoch/0/observation",
                4000,
                ["0.json", "1.json", "2.json"],
            ),
            ("epoch", 4, ["0", "1", "2"]),
            ("epoch/1/rank", 3, ["0", "1", "2"]),
        ] {
            let dir = walk(&fs, path).unwrap();
            let listed = list_paged(&fs, dir, 5);
            // `.`, `..`, then the first `bound` names in listing order.
            let shown = names.min(bound);
            assert_eq!(listed.len() as u64, 2 + shown, "{path} bound {bound}");
            assert_eq!((&*listed[0].name, &*listed[1].name), (".", ".."));
            for (e, want) in listed[2..].iter().zip(first) {
                assert_eq!(e.name, want, "{path} bound {bound}");
            }
            // A readdir past the bound returns nothing.
            let mut sink = Pages {
                entries: Vec::new(),
                room: 10,
            };
            fs.readdir(dir, 2 + shown, &mut sink).unwrap();
            assert!(sink.entries.is_empty(), "{path} bound {bound}");
        }
        // Every name beyond the bound still resolves.
        let step_dir = walk(&fs, "epoch/3/rank/2/step").unwrap();
        for name in ["1332.json", "1332.npy", "700.npy"] {
            let a = fs.lookup(step_dir, OsStr::new(name)).unwrap();
            assert_eq!(a.kind, Kind::File, "{name}");
        }
        assert_eq!(
            read_all(&fs, "epoch/3/rank/2/step/1332.npy").len() as u64,
            fs.view().step_npy_len()
        );
        for path in [
            "observation/3999.json",
            "lookup/epoch/3/observation/3999.json",
        ] {
            assert!(walk(&fs, path).is_ok(), "{path}");
        }
        // info.json names the truncated directories with their true counts.
        let info: serde_json::Value = json_at(&fs, "info.json");
        assert_eq!(info["max_listing"], bound);
        let mut want = Vec::new();
        for (dir, names) in [
            ("epoch", 4),
            ("epoch/E/rank", 3),
            ("epoch/E/rank/R/step", 2666),
            ("observation", 8000),
            ("lookup/epoch", 4),
            ("lookup/epoch/E/observation", 4000),
        ] {
            if names > bound {
                want.push(serde_json::json!({"dir": dir, "names": names, "listed": bound}));
            }
        }
        assert_eq!(
            info["truncated_listings"],
            serde_json::json!(want),
            "{bound}"
        );
    }
    // The default bound is 10,000 names (observation/ holds 12,000 here).
    let data = Data::positional_of(6000, 1 << 20, ScalarType::U8);
    let fs = data.fs(&config(1, 1, 1, 1, 5, 1));
    assert_eq!(fs.view().info().max_listing, 10_000);
    let dir = walk(&fs, "observation").unwrap();
    assert_eq!(list_paged(&fs, dir, 1000).len(), 10_002);
}

#[test]
fn huge_step_directory_lists_from_any_offset() {
    // 4M tokens of u8 with window 1 and batch 1: 4,000,000 steps, 8,000,002 entries, all
    // listed with --max-listing 0.
    let data = Data::positional_of(4_000_000, 1 << 30, ScalarType::U8);
    let fs = data.fs(&ViewConfig {
        max_listing: 0,
        ..config(1, 1, 1, 1, 5, 1)
    });
    assert!(fs.view().info().truncated_listings.is_empty());
    let dir = walk(&fs, "epoch/0/rank/0/step").unwrap();
    for offset in [2u64, 3, 1_000_001, 7_999_999, 8_000_001] {
        let mut sink = Pages {
            entries: Vec::new(),
            room: 2,
        };
        fs.readdir(dir, offset, &mut sink).unwrap();
        let first = &sink.entries[0];
        let k = offset - 2;
        let want = format!("{}.{}", k / 2, if k % 2 == 0 { "npy" } else { "json" });
        assert_eq!(first.name, want);
        assert_eq!(first.next_offset, offset + 1);
    }
    let mut sink = Pages {
        entries: Vec::new(),
        room: 2,
    };
    fs.readdir(dir, 8_000_002, &mut sink).unwrap();
    assert!(sink.entries.is_empty(), "listing ends exactly");
    let last = fs.lookup(dir, OsStr::new("3999999.json")).unwrap();
    assert_eq!(
        fs.node(last.ino).unwrap(),
        Loc::Plan(
            0,
            Node::StepJson(StepKey {
                epoch: 0,
                rank: 0,
                step: 3_999_999
            })
        )
    );
    assert!(fs.lookup(dir, OsStr::new("4000000.npy")).is_err());
}

#[test]
fn info_json_describes_the_mount() {
    let data = Data::positional(10_000, 4096);
    let fs = data.fs(&config(65, 64, 8, 4, 7, 3));
    let info: serde_json::Value = json_at(&fs, "info.json");
    let n_obs = (10_000 - 65) / 64 + 1;
    assert_eq!(info["n_tokens"], 10_000);
    assert_eq!(info["n_observations"], n_obs);
    assert_eq!(info["window"], 65);
    assert_eq!(info["stride"], 64);
    assert_eq!(info["batch_size"], 8);
    assert_eq!(info["ranks"], 4);
    assert_eq!(info["seed"], 7);
    assert_eq!(info["epochs"], 3);
    assert_eq!(info["steps_per_epoch"], n_obs / 32);
    assert_eq!(info["dtype"], "<u4");
    let fp = info["fingerprint"].as_str().unwrap();
    assert_eq!(fp.len(), 16);
    let layout = info["layout_fingerprint"].as_str().unwrap();
    assert_eq!(layout.len(), 16);
    // The fingerprint changes with every parameter of the global plan and stays put
    // otherwise: the split of the global batch over ranks and the number of epochs only
    // change the layout fingerprint.
    let same = data.fs(&config(65, 64, 8, 4, 7, 3));
    assert_eq!(same.view().fingerprint(), fp);
    assert_eq!(same.view().info().layout_fingerprint, layout);
    for layout_only in [
        config(65, 64, 16, 2, 7, 3),
        config(65, 64, 32, 1, 7, 3),
        config(65, 64, 8, 4, 7, 2),
        config(65, 64, 8, 4, 7, 30),
    ] {
        let view = data.view(&layout_only);
        assert_eq!(view.fingerprint(), fp, "{layout_only:?}");
        assert_ne!(view.info().layout_fingerprint, layout, "{layout_only:?}");
    }
    for other in [
        config(66, 64, 8, 4, 7, 3),
        config(65, 63, 8, 4, 7, 3),
        config(65, 64, 8, 2, 7, 3),
        config(65, 64, 16, 4, 7, 3),
        config(65, 64, 8, 4, 8, 3),
    ] {
        assert_ne!(data.fs(&other).view().fingerprint(), fp, "{other:?}");
    }
    // ... and with the dataset content.
    let other_data = Data::positional(10_001, 4096);
    assert_ne!(
        other_data
            .fs(&config(65, 64, 8, 4, 7, 3))
            .view()
            .fingerprint(),
        fp
    );
}

#[test]
fn same_global_batches_when_ranks_change_at_fixed_g() {
    let data = Data::positional(20_000, 1 << 20);
    let a = data.view(&config(50, 50, 8, 4, 3, 1));
    let b = data.view(&config(50, 50, 32, 1, 3, 1));
    for step in 0..a.plan().steps_per_epoch() {
        let mut ga: Vec<u64> = (0..4)
            .flat_map(|r| {
                a.step_info(StepKey {
                    epoch: 0,
                    rank: r,
                    step,
                })
                .observations
            })
            .collect();
        let mut gb = b
            .step_info(StepKey {
                epoch: 0,
                rank: 0,
                step,
            })
            .observations;
        ga.sort_unstable();
        gb.sort_unstable();
        assert_eq!(ga, gb, "step {step}");
    }
}

#[test]
fn too_small_dataset_is_refused_with_a_reason() {
    let data = Data::positional(100, 1 << 20);
    let err = shufflefs::view::View::open(&data.path(), &config(10, 10, 4, 4, 0, 1)).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("fewer than one global batch of 16"), "{msg}");
}

#[test]
fn step_json_ranges_match_the_whole_file() {
    let data = Data::positional(200_000, 1 << 20);
    // A large batch: S.json is produced in ranges without building it per request.
    let fs = data.fs(&config(2, 2, 40_000, 2, 9, 1));
    let view = fs.view();
    let key = StepKey {
        epoch: 0,
        rank: 1,
        step: 0,
    };
    let want = view.step_json(key).unwrap();
    let parsed: serde_json::Value = serde_json::from_slice(&want).unwrap();
    let obs = view.step_info(key).observations;
    assert_eq!(parsed["observations"], serde_json::json!(obs));
    let starts: Vec<u64> = obs.iter().map(|o| o * 2).collect();
    assert_eq!(parsed["token_starts"], serde_json::json!(starts));
    assert_eq!(parsed["global_step"], 0);
    assert_eq!(parsed["fingerprint"], view.fingerprint());
    assert_eq!(*want.last().unwrap(), b'\n');
    let ino = walk(&fs, "epoch/0/rank/1/step/0.json").unwrap();
    assert_eq!(fs.getattr(ino).unwrap().size, want.len() as u64);
    for (offset, size) in [
        (0u64, 7u32),
        (5, 131_072),
        (want.len() as u64 - 3, 100),
        (want.len() as u64, 5),
    ] {
        let out = read_at(&fs, ino, offset, size).unwrap();
        let start = (offset as usize).min(want.len());
        let end = (offset as usize + size as usize).min(want.len());
        assert_eq!(out, &want[start..end], "offset {offset} size {size}");
    }
}

#[test]
fn regression_fingerprint_is_pinned() {
    // Same tokens, same plan -> same fingerprint, on any machine and from any pack run (shard
    // file names do not count). If this changes, every user's checkpoint guard trips: only
    // change it together with a format or algorithm version bump.
    let a = Data::positional(10_000, 4096);
    let b = Data::positional(10_000, 4096);
    let fa = a
        .view(&config(65, 64, 8, 4, 7, 3))
        .fingerprint()
        .to_string();
    assert_eq!(fa, b.view(&config(65, 64, 8, 4, 7, 3)).fingerprint());
    // The rank layout (batch size 8 x 4 ranks, 3 epochs) is not part of it: only G = 32.
    assert_eq!(fa, b.view(&config(65, 64, 32, 1, 7, 1)).fingerprint());
    // Changed with format version 4 (the version is part of the content identity).
    assert_eq!(fa, "98348d1d570daa96");
}

#[test]
fn access_and_open_flags() {
    let data = Data::positional(2000, 1 << 20);
    let fs = data.fs(&config(10, 10, 2, 1, 0, 1));
    let file = walk(&fs, "epoch/0/rank/0/step/0.npy").unwrap();
    let dir = walk(&fs, "epoch/0/rank/0/step").unwrap();
    assert!(fs.access(file, libc::R_OK).is_ok());
    assert!(matches!(fs.access(file, libc::W_OK), Err(Error::ReadOnly)));
    assert!(matches!(
        fs.access(file, libc::X_OK),
        Err(Error::PermissionDenied)
    ));
    assert!(fs.access(dir, libc::X_OK | libc::R_OK).is_ok());
    for flags in [
        libc::O_WRONLY,
        libc::O_RDWR,
        libc::O_RDONLY | libc::O_TRUNC,
        libc::O_RDONLY | libc::O_APPEND,
    ] {
        assert!(
            matches!(fs.open(file, flags), Err(Error::ReadOnly)),
            "{flags:#x}"
        );
    }
    assert!(fs.open(file, libc::O_RDONLY).is_ok());
}

#[test]
fn cache_and_prefetch_step_by_step_with_identical_bytes() {
    use shufflefs::prefetch::PrefetchConfig;
    let data = Data::positional(20_000, 4096);
    let cfg = config(65, 64, 4, 2, 3, 2);
    let plain = data.fs(&cfg);
    let step_len = plain.view().step_npy_len();
    // Room for 6 step files; prefetch 3 ahead, run on this thread (no workers, no timing).
    let cached = data.fs(&cfg).with_cache(
        6 * step_len,
        PrefetchConfig {
            depth: 3,
            workers: 0,
            adaptive: false,
        },
    );
    let stats = |fs: &ShuffleFs| fs.cache().unwrap().stats();
    let read = |fs: &ShuffleFs, step: u64| read_all(fs, &format!("epoch/0/rank/1/step/{step}.npy"));
    assert_eq!(read(&cached, 0), read(&plain, 0));
    let s = stats(&cached);
    assert_eq!(
        (s.hits, s.misses, s.prefetched),
        (0, 1, 0),
        "first read assembles"
    );
    cached.prefetcher().unwrap().run_queued();
    assert_eq!(stats(&cached).prefetched, 3, "steps 1..=3 assembled ahead");
    for step in 1..=3 {
        assert_eq!(read(&cached, step), read(&plain, step));
    }
    let s = stats(&cached);
    assert_eq!((s.hits, s.misses, s.prefetch_used), (3, 1, 3));
    // Each read queued more steps; running them fills the cache up to its 6 entries.
    cached.prefetcher().unwrap().run_queued();
    let s = stats(&cached);
    assert_eq!((s.prefetched, s.entries, s.capacity), (6, 6, 6));
    // stats.json shows the same counters.
    let j: serde_json::Value = json_at(&cached, "stats.json");
    assert_eq!(j["cache"]["prefetched"], 6);
    assert_eq!(j["cache"]["hits"], 3);
    // Reading everything, every rank and epoch, in a scrambled order: identical bytes.
    let steps = plain.view().plan().steps_per_epoch();
    let mut order: Vec<(u64, u64, u64)> = (0..2)
        .flat_map(|e| (0..2).flat_map(move |r| (0..steps).map(move |s| (e, r, s))))
        .collect();
    Rng::new(3).shuffle(&mut order);
    for (e, r, s) in order {
        let path = format!("epoch/{e}/rank/{r}/step/{s}.npy");
        assert_eq!(read_all(&cached, &path), read_all(&plain, &path), "{path}");
        cached.prefetcher().unwrap().run_queued();
    }
    let s = stats(&cached);
    assert!(s.evicted > 0 && s.entries == 6);
    // Odd offsets come from the cached file.
    let ino = walk(&cached, "epoch/1/rank/0/step/5.npy").unwrap();
    let whole = read_all(&plain, "epoch/1/rank/0/step/5.npy");
    for (offset, size) in [
        (0u64, 1u32),
        (127, 3),
        (128, 1000),
        (whole.len() as u64 - 1, 10),
        (whole.len() as u64, 4),
    ] {
        let out = read_at(&cached, ino, offset, size).unwrap();
        let start = (offset as usize).min(whole.len());
        let end = (offset as usize + size as usize).min(whole.len());
        assert_eq!(out, &whole[start..end]);
    }
}

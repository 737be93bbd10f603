//! Several plans in one mount (`[[plan]]` tables): each plan's tree under `plan/NAME/` is
//! byte for byte the mount of that plan alone (written as its own configuration file, not
//! through the merging); the plans share their datasets (each opened once) and one step
//! cache; the top level lists them; `--plan NAME` serves one at the root; mistakes in
//! `[[plan]]` tables are refused naming the file and the plan.

use std::ffi::OsStr;
use std::path::Path;

use serde_json::Value;
use shufflefs::fs::{DirEntry, Kind, Loc, Node, ShuffleFs};
use shufflefs::plan::StepKey;
use shufflefs::runconfig::RunConfig;
use shufflefs::view::{Datasets, OpenOptions, View};

use crate::common::*;
use crate::mixture::sources;

const SOURCES: &str = "[[source]]\nname = \"a\"\npath = \"a\"\nweight = 0.6\n\
                       [[source]]\nname = \"b\"\npath = \"b\"\nweight = 0.3\n\
                       [[source]]\nname = \"c\"\npath = \"c\"\nweight = 0.1\n";

const TOP: &str = "window = 17\nstride = 17\nbatch_size = 2\nranks = 2\nseed = 1\n\
                   steps_per_epoch = 30\nepochs = 2\n";

/// The three plans of `run.toml`, and each written alone as the configuration a user would
/// mount by itself.
const PLANS: [(&str, &str, &str); 3] = [
    ("main", "[[plan]]\nname = \"main\"\n", ""),
    (
        "other",
        "[[plan]]\nname = \"other\"\nseed = 9\nwindow = 33\nstride = 33\nranks = 3\n\
         weights = { a = 1, b = 1, c = 0 }\n",
        "seed = 9\nwindow = 33\nstride = 33\nranks = 3\n",
    ),
    (
        "ramp",
        "[[plan]]\nname = \"ramp\"\nepochs = 1\n\
         [[plan.schedule]]\nfrom_step = 7\nbatch_size = 3\nweights = { a = 0, b = 1, c = 1 }\n",
        "epochs = 1\n",
    ),
];

/// `run.toml` (every plan) and `NAME.toml` (each plan alone) in `dir`.
fn write_configs(dir: &Path) {
    let mut run = format!("{TOP}{SOURCES}");
    for (_, table, _) in PLANS {
        run.push_str(table);
    }
    std::fs::write(dir.join("run.toml"), run).unwrap();
    for (name, _, keys) in PLANS {
        // Later keys of the same name win in no TOML: write the top level without them.
        let top: String = TOP
            .lines()
            .filter(|l| {
                let key = l.split('=').next().unwrap().trim();
                !keys
                    .lines()
                    .any(|k| k.split('=').next().unwrap().trim() == key)
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let mut sources = SOURCES.to_string();
        if name == "other" {
            sources = sources
                .replace("weight = 0.6", "weight = 1")
                .replace("weight = 0.3", "weight = 1")
                .replace("weight = 0.1", "weight = 0");
        }
        let mut text = format!("{top}{keys}{sources}");
        if name == "ramp" {
            text.push_str(
                "[[schedule]]\nfrom_step = 7\nbatch_size = 3\nweights = { a = 0, b = 1, c = 1 }\n",
            );
        }
        std::fs::write(dir.join(format!("{name}.toml")), text).unwrap();
    }
}

fn open() -> OpenOptions {
    OpenOptions {
        max_open: 64,
        allow_other: false,
        verify_reads: false,
    }
}

/// The mount of every plan of `run.toml`, as `shufflefs mount --config` builds it.
fn multi(dir: &Path, cache: bool) -> ShuffleFs {
    let path = dir.join("run.toml");
    let mut datasets = Datasets::default();
    let plans = RunConfig::read_plans(&path)
        .unwrap()
        .into_iter()
        .map(|c| {
            let view = View::mixture_in(&c, &open(), &mut datasets).unwrap();
            (c.name.unwrap(), view)
        })
        .collect();
    let fs = ShuffleFs::with_plans(&path, plans, datasets.len()).unwrap();
    if cache {
        let prefetch = shufflefs::PrefetchConfig {
            depth: 0,
            workers: 0,
            adaptive: false,
        };
        return fs.with_cache(64 << 20, prefetch);
    }
    fs
}

/// Plan `name` alone, from its own configuration file.
fn alone(dir: &Path, name: &str) -> View {
    View::mixture(
        &RunConfig::read(&dir.join(format!("{name}.toml"))).unwrap(),
        &open(),
    )
    .unwrap()
}

/// The inode of `path` (names separated by `/`) in `fs`.
fn walk(fs: &ShuffleFs, path: &str) -> u64 {
    let mut ino = shufflefs::ROOT_INO;
    for name in path.split('/').filter(|n| !n.is_empty()) {
        ino = fs
            .lookup(ino, OsStr::new(name))
            .unwrap_or_else(|e| panic!("{path}: {name}: {e}"))
            .ino;
    }
    ino
}

fn read(fs: &ShuffleFs, path: &str) -> Vec<u8> {
    let ino = walk(fs, path);
    let len = fs.getattr(ino).unwrap().size;
    let mut out = Vec::new();
    fs.read(ino, 0, len as u32 + 1, &mut out).unwrap();
    assert_eq!(out.len() as u64, len, "{path}: size and bytes agree");
    out
}

fn list(fs: &ShuffleFs, path: &str) -> Vec<DirEntry> {
    let mut entries = Vec::new();
    fs.readdir(walk(fs, path), 0, &mut entries).unwrap();
    entries
}

/// Every step of every rank of `view` (each `(key, S.npy path suffix)`), first `steps` steps.
fn keys(view: &View, steps: u64) -> Vec<StepKey> {
    let p = view.plan();
    let mut out = Vec::new();
    for epoch in 0..p.epochs() {
        for rank in 0..p.ranks() {
            for step in 0..p.steps_per_epoch().min(steps) {
                out.push(StepKey { epoch, rank, step });
            }
        }
    }
    out
}

#[test]
fn each_plan_is_served_as_the_mount_of_that_plan_alone() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    write_configs(dir.path());
    let fs = multi(dir.path(), false);
    for (name, _, _) in PLANS {
        let want = alone(dir.path(), name);
        let got = fs
            .plans()
            .find(|(n, _)| *n == Some(name))
            .map(|(_, v)| v)
            .unwrap();
        assert_eq!(got.fingerprint(), want.fingerprint(), "{name}");
        for key in keys(&want, 30) {
            let (e, r, st) = (key.epoch, key.rank, key.step);
            let base = format!("plan/{name}/epoch/{e}/rank/{r}/step/{st}");
            assert_eq!(
                read(&fs, &format!("{base}.npy")),
                want.render_step_npy(key).unwrap(),
                "{base}.npy"
            );
            assert_eq!(
                read(&fs, &format!("{base}.json")),
                want.step_json(key).unwrap(),
                "{base}.json"
            );
        }
        // Its info.json is the plan's own (the configuration file named is run.toml).
        let info: Value =
            serde_json::from_slice(&read(&fs, &format!("plan/{name}/info.json"))).unwrap();
        assert_eq!(info["fingerprint"].as_str(), Some(want.fingerprint()));
        assert_eq!(info["steps_per_epoch"], want.info().steps_per_epoch);
    }
    // The plans differ where their tables say: another seed and window, another batch.
    let other = alone(dir.path(), "other");
    assert_eq!((other.info().window, other.info().ranks), (33, 3));
    let ramp = alone(dir.path(), "ramp");
    assert_ne!(
        ramp.step_npy_len_at(StepKey {
            epoch: 0,
            rank: 0,
            step: 7
        }),
        ramp.step_npy_len()
    );
}

#[test]
fn the_top_level_lists_the_plans_and_numbers_every_node_once() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    write_configs(dir.path());
    let fs = multi(dir.path(), false);
    let names = |entries: Vec<DirEntry>| -> Vec<String> {
        entries.into_iter().skip(2).map(|e| e.name).collect()
    };
    assert_eq!(names(list(&fs, "")), ["info.json", "stats.json", "plan"]);
    assert_eq!(names(list(&fs, "plan")), ["main", "other", "ramp"]);
    // `..` of a plan's root is plan/; of plan/ the root.
    let plan_dir = walk(&fs, "plan");
    for (name, _, _) in PLANS {
        let entries = list(&fs, &format!("plan/{name}"));
        assert_eq!(entries[1].ino, plan_dir, "{name}/..");
        assert_eq!(entries[0].ino, walk(&fs, &format!("plan/{name}")));
        assert!(
            entries
                .iter()
                .any(|e| e.name == "epoch" && e.kind == Kind::Directory)
        );
    }
    assert_eq!(list(&fs, "plan")[1].ino, shufflefs::ROOT_INO);
    // The top info.json: every plan, its directory and fingerprint; the datasets opened once.
    let info: Value = serde_json::from_slice(&read(&fs, "info.json")).unwrap();
    assert_eq!(
        info["datasets"], 3,
        "three sources, each opened once for three plans"
    );
    let plans = info["plans"].as_array().unwrap();
    assert_eq!(plans.len(), 3);
    for (p, (name, v)) in plans.iter().zip(fs.plans()) {
        assert_eq!(p["name"].as_str(), name);
        assert_eq!(
            p["path"].as_str().unwrap(),
            format!("plan/{}", name.unwrap())
        );
        assert_eq!(p["fingerprint"].as_str(), Some(v.fingerprint()));
    }
    // Inode numbers: the same node of two plans never shares one, and every number maps back.
    let mut seen = std::collections::HashSet::new();
    for (name, _, _) in PLANS {
        for path in [
            String::new(),
            "epoch".into(),
            "epoch/0/rank/1/step".into(),
            "epoch/0/rank/1/step/5.npy".into(),
            "info.json".into(),
            "stats.json".into(),
        ] {
            let ino = walk(&fs, &format!("plan/{name}/{path}"));
            assert!(seen.insert(ino), "plan/{name}/{path}: inode {ino} twice");
            let loc = fs.node(ino).unwrap();
            assert!(matches!(loc, Loc::Plan(..)), "{loc:?}");
            assert_eq!(fs.getattr(ino).unwrap().ino, ino);
        }
    }
    let top = walk(&fs, "stats.json");
    assert!(seen.insert(top));
    // A name that is not a plan, a path under a file, an inode past the last plan.
    assert!(fs.lookup(plan_dir, OsStr::new("nope")).is_err());
    assert!(fs.lookup(walk(&fs, "info.json"), OsStr::new("x")).is_err());
    let last = walk(&fs, "plan/ramp/epoch/0/rank/1/step/29.json");
    assert!(fs.node(u64::MAX).is_err());
    assert!(last < u64::MAX);
    // A file of the top level is read-only and not executable; a plan's root is a directory.
    assert!(fs.open(top, libc::O_WRONLY).is_err());
    assert!(fs.open(walk(&fs, "plan/main"), libc::O_RDONLY).is_err());
    assert_eq!(
        fs.node(walk(&fs, "plan/other")).unwrap(),
        Loc::Plan(1, Node::Root)
    );
}

#[test]
fn the_plans_share_one_step_cache() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    write_configs(dir.path());
    let fs = multi(dir.path(), true);
    let cache = fs.cache().expect("a cache");
    // Reads of two plans: each a miss the first time (no prefetch here), then the same
    // plan's step again is a miss too (only the prefetcher fills the cache), and the two
    // plans' counters are the one cache's.
    let before = cache.stats();
    let main = read(&fs, "plan/main/epoch/0/rank/0/step/3.npy");
    let other = read(&fs, "plan/other/epoch/0/rank/0/step/3.npy");
    assert_ne!(main, other);
    let after = cache.stats();
    assert_eq!(after.misses - before.misses, 2, "{after:?}");
    // Every stats.json shows the one cache.
    for path in [
        "stats.json",
        "plan/main/stats.json",
        "plan/other/stats.json",
    ] {
        let s: Value = serde_json::from_slice(&read(&fs, path)).unwrap();
        assert_eq!(s["cache_enabled"], true, "{path}");
        assert_eq!(s["cache"]["misses"], after.misses, "{path}");
        assert_eq!(s["cache"]["capacity"], after.capacity, "{path}");
    }
    // The plan whose batch size changes has no cache of its own (step files of several sizes).
    let s: Value = serde_json::from_slice(&read(&fs, "plan/ramp/stats.json")).unwrap();
    assert_eq!(s["cache_enabled"], false);
}

#[test]
fn plans_with_prefetch_into_the_shared_cache_serve_their_own_bytes() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    write_configs(dir.path());
    // No worker threads: each read's prefetches run right after it (run_queued), so the
    // next reads find them in the cache.
    let prefetch = shufflefs::PrefetchConfig {
        depth: 4,
        workers: 0,
        adaptive: false,
    };
    let fs = multi(dir.path(), false).with_cache(64 << 20, prefetch);
    let (main, other) = (alone(dir.path(), "main"), alone(dir.path(), "other"));
    // Interleaved reads of two plans whose step keys are the same: each gets its own bytes,
    // whether the prefetcher or the read assembled them.
    for step in 0..20u64 {
        for (name, view) in [("main", &main), ("other", &other)] {
            let key = StepKey {
                epoch: 0,
                rank: 0,
                step,
            };
            let path = format!("plan/{name}/epoch/0/rank/0/step/{step}.npy");
            assert_eq!(
                read(&fs, &path),
                view.render_step_npy(key).unwrap(),
                "{path}"
            );
            for p in fs.prefetchers().flatten() {
                p.run_queued();
            }
        }
    }
    let stats = fs.cache().unwrap().stats();
    assert!(stats.prefetched >= 30 && stats.hits >= 30, "{stats:?}");
}

#[test]
fn a_plan_inherits_the_top_schedule_or_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    let schedule = "[[schedule]]\nfrom_step = 10\nweights = { a = 1, b = 1, c = 1 }\n";
    let run = format!(
        "{TOP}{SOURCES}{schedule}[[plan]]\nname = \"inherits\"\n\
         [[plan]]\nname = \"own\"\nweights = {{ a = 1, b = 0, c = 1 }}\nschedule = []\n"
    );
    std::fs::write(dir.path().join("run.toml"), run).unwrap();
    std::fs::write(
        dir.path().join("inherits.toml"),
        format!("{TOP}{SOURCES}{schedule}"),
    )
    .unwrap();
    let own_sources = SOURCES
        .replace("weight = 0.6", "weight = 1")
        .replace("weight = 0.3", "weight = 0")
        .replace("weight = 0.1", "weight = 1");
    std::fs::write(dir.path().join("own.toml"), format!("{TOP}{own_sources}")).unwrap();
    let fs = multi(dir.path(), false);
    for name in ["inherits", "own"] {
        let want = alone(dir.path(), name);
        let got = fs.plans().find(|(n, _)| *n == Some(name)).unwrap().1;
        assert_eq!(got.fingerprint(), want.fingerprint(), "{name}");
        for step in [0u64, 9, 10, 29] {
            let key = StepKey {
                epoch: 1,
                rank: 1,
                step,
            };
            assert_eq!(
                got.render_step_npy(key).unwrap(),
                want.render_step_npy(key).unwrap(),
                "{name} {key:?}"
            );
            assert_eq!(
                got.step_json(key).unwrap(),
                want.step_json(key).unwrap(),
                "{name} {key:?}"
            );
        }
    }
}

#[test]
fn a_mount_serves_every_plan_or_the_one_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    write_configs(dir.path());
    let run = dir.path().join("run.toml");
    // `shufflefs plan --config` needs --plan NAME with several plans, and then prints that
    // plan's S.json.
    let o = shufflefs(&["plan", "--config", s(&run), "--info"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--plan NAME"), "{}", stderr(&o));
    assert!(stderr(&o).contains("main, other, ramp"), "{}", stderr(&o));
    let other = alone(dir.path(), "other");
    let key = StepKey {
        epoch: 1,
        rank: 2,
        step: 4,
    };
    let o = shufflefs_ok(&[
        "plan",
        "--config",
        s(&run),
        "--plan",
        "other",
        "--epoch",
        "1",
        "--rank",
        "2",
        "--step",
        "4",
    ]);
    assert_eq!(o.stdout, other.step_json(key).unwrap());
    let o = shufflefs(&["plan", "--config", s(&run), "--plan", "nope", "--info"]);
    assert!(
        stderr(&o).contains("no [[plan]] named \"nope\""),
        "{}",
        stderr(&o)
    );
    if !fuse_available() {
        return;
    }
    let mnt = MountDir::new();
    shufflefs_ok(&["mount", "--config", s(&run), s(mnt.path())]);
    for (name, _, _) in PLANS {
        let want = alone(dir.path(), name);
        for key in keys(&want, 3) {
            let got = std::fs::read(step_path(
                &mnt.path().join("plan").join(name),
                key.epoch,
                key.rank,
                key.step,
                "npy",
            ))
            .unwrap();
            assert_eq!(got, want.render_step_npy(key).unwrap(), "{name} {key:?}");
        }
    }
    let bytes = std::fs::read(mnt.path().join("info.json")).unwrap();
    let len = std::fs::metadata(mnt.path().join("info.json"))
        .unwrap()
        .len();
    assert_eq!(
        bytes.len() as u64,
        len,
        "the top info.json's size is its bytes'"
    );
    let top: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(top["plans"].as_array().unwrap().len(), 3);
    // Every stats.json, opened through the kernel, is one snapshot of the shared cache.
    for path in [
        "stats.json",
        "plan/main/stats.json",
        "plan/other/stats.json",
    ] {
        let s: Value =
            serde_json::from_slice(&std::fs::read(mnt.path().join(path)).unwrap()).unwrap();
        assert_eq!(s["cache_enabled"], true, "{path}: {s}");
    }
    let mut names: Vec<String> = std::fs::read_dir(mnt.path().join("plan"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["main", "other", "ramp"]);
    unmount(mnt.path());
    // --plan NAME: that plan alone, at the root.
    let mnt = MountDir::new();
    shufflefs_ok(&[
        "mount",
        "--config",
        s(&run),
        "--plan",
        "other",
        s(mnt.path()),
    ]);
    let got = std::fs::read(step_path(mnt.path(), 1, 2, 4, "npy")).unwrap();
    assert_eq!(got, other.render_step_npy(key).unwrap());
    unmount(mnt.path());
}

#[test]
fn mistakes_in_plan_tables_are_refused_naming_the_file_and_the_plan() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.toml");
    let one = "[[plan]]\nname = \"x\"\n";
    for (text, want) in [
        (format!("{TOP}{SOURCES}{one}{one}"), "\"x\" is used twice"),
        (
            format!("{TOP}{SOURCES}[[plan]]\nname = \"a/b\"\n"),
            "no '/'",
        ),
        (
            format!("{TOP}{SOURCES}[[plan]]\nname = \"..\"\n"),
            "not . or ..",
        ),
        (
            format!("{TOP}{SOURCES}[[plan]]\nname = \"\"\n"),
            "1 to 255 bytes",
        ),
        (
            format!("{TOP}{SOURCES}[[plan]]\nname = \"x\"\nwindw = 3\n"),
            "windw",
        ),
        (
            format!("{TOP}{SOURCES}[[plan]]\nname = \"x\"\nweights = {{ a = 1 }}\n"),
            "plan \"x\": weights: no weight for source \"b\"",
        ),
        (
            format!("{TOP}{SOURCES}[[plan]]\nname = \"x\"\nsteps_per_epoch = 0\n"),
            "plan \"x\": steps_per_epoch must be at least 1",
        ),
        (
            format!("stride = 3\nbatch_size = 1\nsteps_per_epoch = 2\n{SOURCES}{one}"),
            "plan \"x\": missing window",
        ),
        (
            format!("{TOP}{SOURCES}[[plan]]\nname = \"x\"\nwindow = 33\n"),
            "plan \"x\" sets window but not stride",
        ),
        (
            format!(
                "{TOP}{SOURCES}[[schedule]]\nfrom_step = 5\nweights = {{ a = 1, b = 1, c = 1 }}\n\
                 [[plan]]\nname = \"x\"\nweights = {{ a = 1, b = 0, c = 0 }}\n"
            ),
            "would inherit the top level's [[schedule]]",
        ),
        (
            format!(
                "{TOP}{SOURCES}[[schedule]]\nfrom_step = 5\nweights = {{ zzz = 1 }}\n\
                 [[plan]]\nname = \"x\"\nschedule = []\n"
            ),
            "the top level's schedule[0]: no source named \"zzz\"",
        ),
        (
            format!(
                "{TOP}{SOURCES}{}",
                (0..65)
                    .map(|i| format!("[[plan]]\nname = \"p{i}\"\n"))
                    .collect::<String>()
            ),
            "65 [[plan]] tables: at most 64",
        ),
    ] {
        std::fs::write(&path, &text).unwrap();
        let e = RunConfig::read_plans(&path).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}: ", path.display())), "{e}");
        assert!(e.contains(want), "{e} lacks {want}");
    }
    // A file with [[plan]] tables is not one plan.
    std::fs::write(&path, format!("{TOP}{SOURCES}{one}")).unwrap();
    let e = RunConfig::read(&path).unwrap_err().to_string();
    assert!(e.contains("choose one (x)"), "{e}");
}

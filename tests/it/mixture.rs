//! Mixtures (`--config RUN.toml`), through the served files: every row is its source's
//! observation, byte for byte; per-source counts follow the weights within one row; each
//! source is drawn in the order of its own permutation, without repeats inside a source epoch,
//! wrapping into a fresh one when used up; a schedule change leaves every earlier step
//! byte-identical and continues each source where it was; the global batches do not depend on
//! the rank split; and a real mount serves the same bytes.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;
use shufflefs::plan::StepKey;
use shufflefs::runconfig::RunConfig;
use shufflefs::view::View;

use crate::common::*;

const WINDOW: u64 = 17;

/// Positional u32 datasets `a` (30,000 tokens), `b` (9,000) and `c` (2,000) in `dir`:
/// token `t` of source `s` is `s * 1,000,000 + t`.
pub(crate) fn sources(dir: &Path) {
    for (k, (name, n)) in [("a", 30_000u64), ("b", 9_000), ("c", 2_000)]
        .into_iter()
        .enumerate()
    {
        let bytes: Vec<u8> = (0..n)
            .flat_map(|t| (k as u32 * 1_000_000 + t as u32).to_le_bytes())
            .collect();
        let file = dir.join(format!("{name}.bin"));
        std::fs::write(&file, bytes).unwrap();
        shufflefs_ok(&[
            "pack",
            s(&dir.join(name)),
            s(&file),
            "--dtype",
            "u32",
            "--no-progress",
        ]);
    }
}

fn config(dir: &Path, head: &str, weights: &str, tail: &str) -> RunConfig {
    let mut text = format!("window = {WINDOW}\nstride = {WINDOW}\n{head}\n");
    for (name, w) in ["a", "b", "c"].iter().zip(weights.split(',')) {
        text.push_str(&format!(
            "[[source]]\nname = \"{name}\"\npath = \"{name}\"\nweight = {w}\n"
        ));
    }
    text.push_str(tail);
    let path = dir.join("run.toml");
    std::fs::write(&path, &text).unwrap();
    RunConfig::read(&path).unwrap()
}

/// The rows of an `S.json`: `(source, observation)` in row order.
fn row_ids(j: &Value) -> Vec<(String, u64)> {
    j["sources"]
        .as_array()
        .unwrap()
        .iter()
        .zip(j["observations"].as_array().unwrap())
        .map(|(s, o)| (s.as_str().unwrap().to_string(), o.as_u64().unwrap()))
        .collect()
}

fn json(view: &View, key: StepKey) -> Value {
    serde_json::from_slice(&view.step_json(key).unwrap()).unwrap()
}

/// Every step of every rank, in global order: (global step, rank, S.npy, S.json).
fn all_steps(view: &View) -> Vec<(u64, StepKey, Vec<u8>, Value)> {
    let plan = view.plan();
    let mut out = Vec::new();
    for epoch in 0..plan.epochs() {
        for step in 0..plan.steps_per_epoch() {
            for rank in 0..plan.ranks() {
                let key = StepKey { epoch, rank, step };
                let g = epoch * plan.steps_per_epoch() + step;
                out.push((g, key, view.render_step_npy(key).unwrap(), json(view, key)));
            }
        }
    }
    out
}

#[test]
fn mixture_rows_counts_and_orders_keep_their_contract() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    // c is small and heavily weighted: it is used up and wraps (upsampling); a is never used
    // up (downsampling).
    let cfg = config(
        dir.path(),
        "batch_size = 5\nranks = 3\nseed = 9\nsteps_per_epoch = 150\nepochs = 2",
        "0.5,0.2,0.3",
        "",
    );
    let view = View::mixture_for_tests(&cfg, 64).unwrap();
    let names = ["a", "b", "c"];
    let weights = [0.5, 0.2, 0.3];
    let lens = [30_000 / WINDOW, 9_000 / WINDOW, 2_000 / WINDOW];
    let g_rows = 15u64;
    let mut drawn = [0u64; 3];
    let mut by_source: Vec<Vec<(u64, u64)>> = vec![Vec::new(); 3]; // (draw, observation)
    let steps = all_steps(&view);
    for chunk in steps.chunks(3) {
        let g = chunk[0].0;
        let mut counts = [0u64; 3];
        for (_, key, npy, json) in chunk {
            let values: Vec<u32> = npy[npy.len() - 5 * WINDOW as usize * 4..]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            for (r, row) in values.chunks(WINDOW as usize).enumerate() {
                let name = json["sources"][r].as_str().unwrap();
                let k = names.iter().position(|n| *n == name).unwrap();
                let obs = json["observations"][r].as_u64().unwrap();
                let want: Vec<u32> = (0..WINDOW)
                    .map(|i| (k as u64 * 1_000_000 + obs * WINDOW + i) as u32)
                    .collect();
                assert_eq!(
                    row,
                    &want[..],
                    "{key:?} row {r}: source {name} observation {obs}"
                );
                counts[k] += 1;
                by_source[k].push((json["draws"][r].as_u64().unwrap(), obs));
            }
        }
        assert_eq!(counts.iter().sum::<u64>(), g_rows);
        for k in 0..3 {
            drawn[k] += counts[k];
            let expected = (g + 1) as f64 * g_rows as f64 * weights[k];
            assert!(
                (drawn[k] as f64 - expected).abs() < 1.0,
                "step {g}: source {} has {} rows, expected {expected}",
                names[k],
                drawn[k]
            );
        }
    }
    for k in 0..3 {
        let mut draws = by_source[k].clone();
        draws.sort_unstable();
        // Draws 0, 1, 2, ... exactly once each: nothing skipped or repeated.
        assert!(
            draws.iter().enumerate().all(|(i, d)| d.0 == i as u64),
            "{}",
            names[k]
        );
        // Within each source epoch every observation at most once.
        for epoch in draws.chunks(lens[k] as usize) {
            let seen: HashSet<u64> = epoch.iter().map(|d| d.1).collect();
            assert_eq!(
                seen.len(),
                epoch.len(),
                "{}: a repeat inside a source epoch",
                names[k]
            );
        }
    }
    assert!(
        drawn[2] > 2 * lens[2],
        "c wrapped into later epochs: {drawn:?}"
    );
    // info.json: the weights and the draws at each epoch start.
    let info: Value = serde_json::from_slice(view.info_json()).unwrap();
    let m = &info["mixture"];
    assert_eq!(m["sources"][0]["weight"], "0.5");
    // A long run: info.json reports the epochs starting in the first 2^24 steps only (a later
    // one would cost the mount a replay of every step before it).
    let long = View::mixture_for_tests(
        &config(
            dir.path(),
            "batch_size = 5\nranks = 3\nsteps_per_epoch = 10000000\nepochs = 100",
            "1,1,1",
            "",
        ),
        64,
    )
    .unwrap();
    let long: Value = serde_json::from_slice(long.info_json()).unwrap();
    assert_eq!(
        long["mixture"]["sources"][0]["drawn_at_epoch_start"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        m["sources"][2]["drawn_at_epoch_start"][1].as_u64(),
        Some(drawn[2] / 2)
    );
}

#[test]
fn a_schedule_change_keeps_the_past_and_continues_each_source() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    let head = "batch_size = 4\nranks = 2\nseed = 3\nsteps_per_epoch = 100\nepochs = 1";
    let before =
        View::mixture_for_tests(&config(dir.path(), head, "0.999,0.001,0", ""), 64).unwrap();
    let change = "[[schedule]]\nfrom_step = 40\nweights = { a = 1, b = 1, c = 1 }\n";
    let after =
        View::mixture_for_tests(&config(dir.path(), head, "0.999,0.001,0", change), 64).unwrap();
    let (x, y) = (all_steps(&before), all_steps(&after));
    let mut draws: Vec<Vec<u64>> = vec![Vec::new(); 3];
    for ((g, key, npy_a, json_a), (_, _, npy_b, json_b)) in x.iter().zip(&y) {
        if *g < 40 {
            assert_eq!(npy_a, npy_b, "{key:?}: a step before the change");
            assert_eq!(json_a, json_b, "{key:?}");
        }
        for r in 0..4 {
            let k = ["a", "b", "c"]
                .iter()
                .position(|n| *n == json_b["sources"][r].as_str().unwrap())
                .unwrap();
            draws[k].push(json_b["draws"][r].as_u64().unwrap());
        }
    }
    // Each source's draws are 0..n without a gap or a repeat across the change.
    for d in &mut draws {
        d.sort_unstable();
        assert!(d.iter().enumerate().all(|(i, &v)| v == i as u64));
    }
    assert!(!draws[2].is_empty(), "the new weights took effect");
    // The fingerprint of a step covers only the entries up to it.
    let fp = |v: &Value| v["fingerprint"].as_str().unwrap().to_string();
    assert_eq!(fp(&x[39 * 2].3), fp(&y[39 * 2].3));
    assert_ne!(fp(&x[41 * 2].3), fp(&y[41 * 2].3));
    assert_eq!(before.fingerprint(), after.fingerprint());
    // A resume at step 39 checks step 39's fingerprint: the entry at 40 does not matter; at
    // step 41 it does.
    let run = dir.path().join("run.toml"); // the configuration with the change
    let check = |fp: &str, step: &str| {
        shufflefs(&[
            "plan",
            "--config",
            s(&run),
            "--info",
            "--expect-fingerprint",
            fp,
            "--resume-step",
            step,
        ])
        .status
        .success()
    };
    assert!(check(&fp(&x[39 * 2].3), "39"));
    assert!(!check(&fp(&x[41 * 2].3), "41"));
    assert!(check(&fp(&y[41 * 2].3), "41"));
    // The refusal tells a mixture's user how to compare: the configuration's S.json.
    let o = shufflefs(&[
        "plan",
        "--config",
        s(&run),
        "--info",
        "--expect-fingerprint",
        &fp(&x[41 * 2].3),
        "--resume-step",
        "41",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--config RUN.toml") && err.contains("global step 41"),
        "{err}"
    );
}

#[test]
fn global_batches_do_not_depend_on_the_rank_split_and_a_mount_serves_them() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    let a = View::mixture_for_tests(
        &config(
            dir.path(),
            "batch_size = 6\nranks = 2\nsteps_per_epoch = 40",
            "1,1,1",
            "",
        ),
        64,
    )
    .unwrap();
    let b = View::mixture_for_tests(
        &config(
            dir.path(),
            "batch_size = 3\nranks = 4\nsteps_per_epoch = 40",
            "1,1,1",
            "",
        ),
        64,
    )
    .unwrap();
    assert_eq!(a.fingerprint(), b.fingerprint());
    let global = |v: &View, step: u64| {
        let mut rows: Vec<(String, u64)> = Vec::new();
        for rank in 0..v.plan().ranks() {
            let j = json(
                v,
                StepKey {
                    epoch: 0,
                    rank,
                    step,
                },
            );
            rows.extend(row_ids(&j));
        }
        rows.sort();
        rows
    };
    for step in 0..40 {
        assert_eq!(global(&a, step), global(&b, step), "step {step}");
    }
    if !fuse_available() {
        return;
    }
    // `shufflefs mount --config RUN.toml MNT` serves the same bytes.
    let mnt = MountDir::new();
    let path = dir.path().join("run.toml");
    shufflefs_ok(&["mount", "--config", s(&path), s(mnt.path())]);
    for step in [0u64, 7, 39] {
        for rank in 0..4 {
            let key = StepKey {
                epoch: 0,
                rank,
                step,
            };
            let got = std::fs::read(step_path(mnt.path(), 0, rank, step, "npy")).unwrap();
            assert_eq!(got, b.render_step_npy(key).unwrap(), "{key:?}");
        }
    }
    let info: Value =
        serde_json::from_slice(&std::fs::read(mnt.path().join("info.json")).unwrap()).unwrap();
    assert_eq!(info["fingerprint"].as_str(), Some(b.fingerprint()));
    unmount(mnt.path());
}

/// The held-out rows of a mixture: `(source, observation)` of every row under `/val`.
fn held_out(view: View) -> HashSet<(String, u64)> {
    let steps = view.val_steps_for_tests();
    let ranks = view.plan().ranks();
    let fs = shufflefs::fs::ShuffleFs::new(view).unwrap();
    let mut out = HashSet::new();
    for rank in 0..ranks {
        for step in 0..steps {
            let j = json_at(&fs, &format!("/val/rank/{rank}/step/{step}.json"));
            assert_eq!(j["val"], true);
            for row in row_ids(&j) {
                assert!(out.insert(row));
            }
            let npy = read_path(&fs, &format!("/val/rank/{rank}/step/{step}.npy")).unwrap();
            assert_eq!(npy.len() as u64, fs.view().step_npy_len());
        }
    }
    out
}

#[test]
fn a_held_out_split_is_disjoint_from_training_and_stable() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    let split = "[split]\nval = 0.05\nseed = 4\n";
    let a = View::mixture_for_tests(
        &config(
            dir.path(),
            "batch_size = 4\nranks = 2\nseed = 1\nsteps_per_epoch = 200\nepochs = 2",
            "0.5,0.3,0.2",
            split,
        ),
        64,
    )
    .unwrap();
    let info: Value = serde_json::from_slice(a.info_json()).unwrap();
    let held: Vec<u64> = (0..3)
        .map(|k| info["mixture"]["sources"][k]["held_out"].as_u64().unwrap())
        .collect();
    assert_eq!(
        held,
        vec![
            30_000 / WINDOW / 20,
            9_000 / WINDOW / 20,
            2_000 / WINDOW / 20
        ]
    );
    // Training never serves a held-out observation, in any epoch (c wraps several times).
    let mut train = HashSet::new();
    for (_, _, _, json) in all_steps(&a) {
        train.extend(row_ids(&json));
    }
    let val = held_out(a);
    assert!(!val.is_empty());
    assert!(val.is_disjoint(&train), "a held-out row was trained on");
    // Another seed, other weights, another batch: the same held-out set.
    let b = View::mixture_for_tests(
        &config(
            dir.path(),
            "batch_size = 2\nranks = 2\nseed = 99\nsteps_per_epoch = 50",
            "1,1,1",
            split,
        ),
        64,
    )
    .unwrap();
    let total: u64 = held.iter().sum();
    let vb = held_out(b);
    assert_eq!(vb.len() as u64, total / 4 * 4);
    assert!(vb.is_subset(&val) || val.is_subset(&vb));
}

#[test]
fn quarantined_observations_change_only_the_rows_that_held_them() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    let head = "batch_size = 4\nranks = 2\nseed = 5\nsteps_per_epoch = 100";
    // No source is used up in this epoch (about 560, 200 and 40 draws).
    let plain =
        View::mixture_for_tests(&config(dir.path(), head, "0.7,0.25,0.05", ""), 64).unwrap();
    let rows = |v: &View| -> Vec<(String, u64)> {
        all_steps(v)
            .iter()
            .flat_map(|(_, _, _, j)| row_ids(j))
            .collect()
    };
    let before = rows(&plain);
    // Quarantine five observations the plain run serves, and one it never reaches.
    let bad: Vec<(String, u64)> = [3usize, 50, 211, 400, 777]
        .iter()
        .map(|&i| before[i].clone())
        .collect();
    let mut list: String = bad.iter().map(|(s, o)| format!("{s} {o}\n")).collect();
    list.push_str("# a comment\na 1700\n");
    std::fs::write(dir.path().join("bad.txt"), list).unwrap();
    let q = View::mixture_for_tests(
        &config(
            dir.path(),
            &format!("{head}\nquarantine = \"bad.txt\""),
            "0.7,0.25,0.05",
            "",
        ),
        64,
    )
    .unwrap();
    let after = rows(&q);
    assert_eq!(before.len(), after.len());
    let mut seen = HashSet::new();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert!(seen.insert(a.clone()), "row {i}: {a:?} twice");
        assert!(
            !bad.contains(a) && a != &("a".to_string(), 1700),
            "row {i} serves {a:?}"
        );
        if bad.contains(b) {
            assert_eq!(a.0, b.0, "row {i}: replaced from the same source");
        } else {
            assert_eq!(a, b, "row {i} did not hold a quarantined observation");
        }
    }
    let info: Value = serde_json::from_slice(q.info_json()).unwrap();
    assert_eq!(
        info["mixture"]["sources"][0]["quarantined"]
            .as_u64()
            .unwrap() as usize,
        bad.iter().filter(|(s, _)| s == "a").count() + 1
    );
    assert_ne!(q.fingerprint(), plain.fingerprint());
}

#[test]
fn a_batch_size_change_continues_the_rows_exactly() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    let head = "batch_size = 4\nranks = 2\nseed = 8\nsteps_per_epoch = 60";
    let plain = View::mixture_for_tests(&config(dir.path(), head, "0.6,0.3,0.1", ""), 64).unwrap();
    let ramp = "[[schedule]]\nfrom_step = 30\nbatch_size = 6\n";
    let view = View::mixture_for_tests(&config(dir.path(), head, "0.6,0.3,0.1", ramp), 64).unwrap();
    let (x, y) = (all_steps(&plain), all_steps(&view));
    let mut draws: Vec<Vec<u64>> = vec![Vec::new(); 3];
    for ((g, key, npy_a, _), (_, _, npy_b, json_b)) in x.iter().zip(&y) {
        let rows = json_b["sources"].as_array().unwrap().len();
        if *g < 30 {
            assert_eq!(npy_a, npy_b, "{key:?}: before the change");
            assert_eq!(rows, 4);
        } else {
            assert_eq!(rows, 6, "{key:?}");
            let header = npy_b.len() - 6 * WINDOW as usize * 4;
            assert!(
                header.is_multiple_of(64) && npy_b[..header].windows(6).any(|w| w == b"(6, 17")
            );
        }
        assert_eq!(view.step_npy_len_at(*key), npy_b.len() as u64);
        for r in 0..rows {
            let k = ["a", "b", "c"]
                .iter()
                .position(|n| *n == json_b["sources"][r].as_str().unwrap())
                .unwrap();
            draws[k].push(json_b["draws"][r].as_u64().unwrap());
        }
    }
    // The global row counter continues: each source's draws are 0..n, none skipped or twice.
    for d in &mut draws {
        d.sort_unstable();
        assert!(d.iter().enumerate().all(|(i, &v)| v == i as u64));
    }
    assert_eq!(draws.iter().map(Vec::len).sum::<usize>(), 30 * 8 + 30 * 12);
    if !fuse_available() {
        return;
    }
    let mnt = MountDir::new();
    let path = dir.path().join("run.toml");
    shufflefs_ok(&["mount", "--config", s(&path), s(mnt.path())]);
    for step in [29u64, 30, 59] {
        let key = StepKey {
            epoch: 0,
            rank: 1,
            step,
        };
        let file = step_path(mnt.path(), 0, 1, step, "npy");
        assert_eq!(
            std::fs::metadata(&file).unwrap().len(),
            view.step_npy_len_at(key)
        );
        assert_eq!(
            std::fs::read(&file).unwrap(),
            view.render_step_npy(key).unwrap()
        );
    }
    unmount(mnt.path());
}

#[test]
fn every_range_of_a_mixture_step_file_is_its_bytes() {
    let dir = tempfile::tempdir().unwrap();
    sources(dir.path());
    let head = "batch_size = 3\nranks = 2\nseed = 5\nsteps_per_epoch = 10";
    let view = View::mixture_for_tests(
        &config(dir.path(), head, "0.5,0.3,0.2", "[split]\nval = 40\n"),
        64,
    )
    .unwrap();
    let key = StepKey {
        epoch: 0,
        rank: 1,
        step: 4,
    };
    let whole = view.render_step_npy(key).unwrap();
    let header = view.info().npy_header_bytes as usize;
    for offset in (0..header + 80).chain([whole.len() - 3, whole.len()]) {
        for size in [
            1usize,
            6,
            header - 1,
            header,
            header + 1,
            100,
            whole.len() + 5,
        ] {
            let mut buf = vec![0u8; size];
            let n = view.read_step_npy(key, offset as u64, &mut buf).unwrap();
            let end = (offset + size).min(whole.len());
            assert_eq!(
                &buf[..n],
                &whole[offset.min(end)..end],
                "offset {offset} size {size}"
            );
        }
    }
}

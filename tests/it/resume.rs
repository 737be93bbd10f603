//! Exact resumes (issue #10): the fingerprint covers the data and the global plan, nothing
//! else. An elastic resume (the same global batch split over other ranks) and a longer run
//! (more epochs) keep it and pass `--expect-fingerprint`; another seed, window, stride, global
//! batch, mode, pad id or content changes it and is refused. `plan` accepts a pasted mount
//! command line. Everything through the `shufflefs` binary; mounts are always unmounted.

use std::fs;
use std::path::{Path, PathBuf};

use crate::common::*;

/// A dataset of JSON Lines documents (so both modes apply), packed by the binary.
struct Docs {
    dir: tempfile::TempDir,
}

impl Docs {
    /// 400 documents of 5-15 tokens; `bump` changes the value of one token (other content).
    fn new(bump: bool) -> Docs {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("docs.jsonl");
        let mut text = String::new();
        let mut next = 0u32;
        for i in 0..400u32 {
            let len = 5 + i % 11;
            let tokens: Vec<String> = (next..next + len)
                .map(|t| if bump && t == 1234 { t + 1 } else { t })
                .map(|t| t.to_string())
                .collect();
            next += len;
            text.push_str(&format!(
                "{{\"tokens\": [{}], \"meta\": {{\"i\": {i}}}}}\n",
                tokens.join(", ")
            ));
        }
        fs::write(&input, text).unwrap();
        let ds = dir.path().join("ds");
        let o = shufflefs(&["pack", s(&ds), s(&input), "--dtype", "u32", "--no-progress"]);
        assert!(o.status.success(), "{}", stderr(&o));
        Docs { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("ds")
    }
}

/// The base plan of these tests: global batch 8 as 2 ranks x 4 rows, 2 epochs.
const BASE: [&str; 12] = [
    "--window",
    "9",
    "--stride",
    "8",
    "--batch-size",
    "4",
    "--ranks",
    "2",
    "--seed",
    "3",
    "--epochs",
    "2",
];

/// `BASE` with the values of `changes` (flag, value) replaced or added.
fn plan_with(changes: &[(&str, &str)]) -> Vec<String> {
    let mut args: Vec<String> = BASE.iter().map(|a| a.to_string()).collect();
    for (flag, value) in changes {
        match args.iter().position(|a| a == flag) {
            Some(i) if *value == "-" => {
                args.drain(i..i + 2);
            }
            Some(i) => args[i + 1] = value.to_string(),
            None => args.extend([flag.to_string(), value.to_string()]),
        }
    }
    args
}

/// `shufflefs plan DATASET <args> --info`, parsed.
fn info(dataset: &Path, args: &[String]) -> serde_json::Value {
    let mut all = vec!["plan", s(dataset)];
    all.extend(args.iter().map(String::as_str));
    all.push("--info");
    let o = shufflefs(&all);
    assert!(o.status.success(), "plan {args:?}: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn fingerprints(dataset: &Path, args: &[String]) -> (String, String) {
    let i = info(dataset, args);
    (
        i["fingerprint"].as_str().unwrap().to_string(),
        i["layout_fingerprint"].as_str().unwrap().to_string(),
    )
}

#[test]
fn fingerprint_changes_exactly_with_the_data_and_the_global_plan() {
    let data = Docs::new(false);
    let ds = data.path();
    let (fp, layout) = fingerprints(&ds, &plan_with(&[]));
    assert_eq!(fp.len(), 16);
    assert_ne!(fp, layout);
    // The same global steps: the fingerprint stays, the layout fingerprint does not.
    for same in [
        plan_with(&[("--batch-size", "8"), ("--ranks", "1")]),
        plan_with(&[("--batch-size", "2"), ("--ranks", "4")]),
        plan_with(&[("--batch-size", "1"), ("--ranks", "8")]),
        plan_with(&[("--epochs", "1")]),
        plan_with(&[("--epochs", "7")]),
        plan_with(&[("--epochs", "7"), ("--batch-size", "8"), ("--ranks", "1")]),
    ] {
        let (f, l) = fingerprints(&ds, &same);
        assert_eq!(f, fp, "{same:?} keeps the fingerprint");
        assert_ne!(l, layout, "{same:?} changes the layout fingerprint");
    }
    assert_eq!(fingerprints(&ds, &plan_with(&[])), (fp.clone(), layout));
    // Other global steps: the fingerprint changes.
    let mut seen = vec![fp.clone()];
    for other in [
        plan_with(&[("--seed", "4")]),
        plan_with(&[("--window", "10")]),
        plan_with(&[("--stride", "7")]),
        plan_with(&[("--stride", "-")]),
        plan_with(&[("--ranks", "3")]),
        plan_with(&[("--batch-size", "8")]),
        plan_with(&[("--batch-size", "3"), ("--ranks", "3")]),
        plan_with(&[("--mode", "documents"), ("--stride", "-")]),
        plan_with(&[
            ("--mode", "documents"),
            ("--stride", "-"),
            ("--pad-id", "5"),
        ]),
    ] {
        let (f, _) = fingerprints(&ds, &other);
        assert!(!seen.contains(&f), "{other:?} must change the fingerprint");
        seen.push(f);
    }
    // Other content, same plan.
    let bumped = Docs::new(true);
    let (f, _) = fingerprints(&bumped.path(), &plan_with(&[]));
    assert!(
        !seen.contains(&f),
        "other content must change the fingerprint"
    );
}

/// Reads step `step` of every rank in `epoch` through a mount and returns the global step's
/// rows in position order (row `j` of rank `r` is position `j * ranks + r`).
fn global_step(mnt: &Path, ranks: u64, epoch: u64, step: u64) -> Vec<Vec<u8>> {
    let info: serde_json::Value = json(&fs::read(mnt.join("info.json")).unwrap());
    let header = info["npy_header_bytes"].as_u64().unwrap() as usize;
    let row = (info["window"].as_u64().unwrap() * info["itemsize"].as_u64().unwrap()) as usize;
    let batch = info["batch_size"].as_u64().unwrap() as usize;
    let files: Vec<Vec<u8>> = (0..ranks)
        .map(|r| fs::read(mnt.join(format!("epoch/{epoch}/rank/{r}/step/{step}.npy"))).unwrap())
        .collect();
    let mut rows = Vec::new();
    for j in 0..batch {
        for f in &files {
            rows.push(f[header + j * row..header + (j + 1) * row].to_vec());
        }
    }
    rows
}

#[test]
fn elastic_resume_and_more_epochs_pass_expect_fingerprint() {
    if !fuse_available() {
        return;
    }
    let data = Docs::new(false);
    let ds = data.path();
    let base = plan_with(&[]);
    let (fp, _) = fingerprints(&ds, &base);
    let mount = |mnt: &MountDir, args: &[String], expect: &str| {
        let mut all = vec!["mount", s(&ds), s(mnt.path())];
        all.extend(args.iter().map(String::as_str));
        all.extend(["--expect-fingerprint", expect]);
        shufflefs(&all)
    };
    // The checkpointed run: 2 ranks x 4 rows, 2 epochs.
    let a = MountDir::new();
    let o = mount(&a, &base, &fp);
    assert!(o.status.success(), "{}", stderr(&o));
    // Resumed elastically (1 rank x 8 rows) with more epochs: the guard passes, and the
    // global steps both runs share are the same bytes.
    let b = MountDir::new();
    let resumed = plan_with(&[("--batch-size", "8"), ("--ranks", "1"), ("--epochs", "5")]);
    let o = mount(&b, &resumed, &fp);
    assert!(o.status.success(), "{}", stderr(&o));
    let c = MountDir::new();
    let split = plan_with(&[("--batch-size", "1"), ("--ranks", "8"), ("--epochs", "3")]);
    let o = mount(&c, &split, &fp);
    assert!(o.status.success(), "{}", stderr(&o));
    for (epoch, step) in [(0, 0), (0, 5), (1, 3)] {
        let want = global_step(a.path(), 2, epoch, step);
        assert_eq!(
            global_step(b.path(), 1, epoch, step),
            want,
            "{epoch}/{step}"
        );
        assert_eq!(
            global_step(c.path(), 8, epoch, step),
            want,
            "{epoch}/{step}"
        );
    }
    // S.json carries the same fingerprint on every layout.
    for m in [&a, &b, &c] {
        let j: serde_json::Value =
            serde_json::from_slice(&fs::read(m.path().join("epoch/0/rank/0/step/0.json")).unwrap())
                .unwrap();
        assert_eq!(j["fingerprint"], fp.as_str());
    }
    unmount(b.path());
    unmount(c.path());
    // Anything that changes a global step is refused before mounting.
    for other in [
        plan_with(&[("--seed", "4")]),
        plan_with(&[("--window", "10")]),
        plan_with(&[("--stride", "7")]),
        plan_with(&[("--ranks", "3")]),
        plan_with(&[("--mode", "documents"), ("--stride", "-")]),
    ] {
        let o = mount(&b, &other, &fp);
        assert_eq!(o.status.code(), Some(1), "{other:?} must be refused");
        assert!(stderr(&o).contains("does not match"), "{}", stderr(&o));
        assert!(!is_mounted(b.path()), "{other:?}");
    }
    // Other content under the same plan is refused too.
    let bumped = Docs::new(true);
    let bumped_ds = bumped.path();
    let mut all = vec!["mount", s(&bumped_ds), s(b.path())];
    all.extend(base.iter().map(String::as_str));
    all.extend(["--expect-fingerprint", &fp]);
    let o = shufflefs(&all);
    assert_eq!(o.status.code(), Some(1), "other content must be refused");
    assert!(stderr(&o).contains("does not match"), "{}", stderr(&o));
    unmount(a.path());
}

#[test]
fn plan_accepts_a_pasted_mount_command_line() {
    let data = Data::positional(5000, 4096);
    let ds = data.path();
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("daemon.log");
    let mnt = MountDir::new();
    // Every mount option, as a user would have them on the mount command line.
    let mount_flags: Vec<&str> = vec![
        "--window",
        "10",
        "--batch-size",
        "2",
        "--ranks",
        "2",
        "--seed",
        "5",
        "-f",
        "--threads",
        "3",
        "--allow-other",
        "--log-file",
        s(&log),
        "--cache-size",
        "64MiB",
        "--prefetch-depth",
        "2",
        "--prefetch-workers",
        "1",
        "--read-timeout",
        "10",
        "--uid",
        "0",
        "--gid",
        "0",
        "--file-mode",
        "0440",
        "--dir-mode",
        "0550",
        "--on-top",
        "--verify-reads",
        "--prefill",
        "--max-open-shards",
        "100",
        "--max-listing",
        "50",
    ];
    let plain = {
        let mut a = vec!["plan", s(&ds)];
        a.extend(&mount_flags[..8]);
        a.extend(["--max-listing", "50", "--info"]);
        shufflefs(&a)
    };
    assert!(plain.status.success(), "{}", stderr(&plain));
    // The mount line pasted after `plan`, mount point included.
    let mut pasted = vec!["plan", s(&ds), s(mnt.path())];
    pasted.extend(&mount_flags);
    pasted.push("--info");
    let o = shufflefs(&pasted);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(o.stdout, plain.stdout, "mount options change no byte");
    assert!(!log.exists(), "plan ignores --log-file");
    assert!(!is_mounted(mnt.path()), "plan mounts nothing");
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(info["max_listing"], 50);
    let fp = info["fingerprint"].as_str().unwrap().to_string();
    // --expect-fingerprint is checked, with --info and for a step.
    for tail in [
        &["--info"][..],
        &["--epoch", "0", "--rank", "1", "--step", "3"],
    ] {
        let run = |expect: &str| {
            let mut a = vec!["plan", s(&ds), s(mnt.path())];
            a.extend(&mount_flags);
            a.extend(["--expect-fingerprint", expect]);
            a.extend(tail);
            shufflefs(&a)
        };
        let ok = run(&fp.to_uppercase());
        assert!(ok.status.success(), "{}", stderr(&ok));
        let bad = run("0123456789abcdef");
        assert_eq!(bad.status.code(), Some(1));
        assert!(stderr(&bad).contains("does not match"), "{}", stderr(&bad));
        assert!(bad.stdout.is_empty());
    }
    // What plan prints is what the mount serves for the same command line.
    if fuse_available() {
        let mut m = vec!["mount", s(&ds), s(mnt.path())];
        m.extend(
            mount_flags
                .iter()
                .filter(|f| !["-f", "--prefill"].contains(*f)),
        );
        let o = shufflefs(&m);
        assert!(o.status.success(), "{}", stderr(&o));
        let served = fs::read(mnt.path().join("info.json")).unwrap();
        unmount(mnt.path());
        assert_eq!(served, plain.stdout);
    }
}

//! The golden set: the bytes the tree serves, pinned. Four datasets (positional stream,
//! JSON Lines documents with metadata, structured records, an in-place raw file) are packed
//! and mounted through the `shufflefs` binary only, and every file read through the mount
//! (step files, their JSON, observations, lookups, info.json) and the output of `plan` is
//! reduced to its length and a 64-bit FNV-1a digest, compared with
//! `tests/fixtures/golden.json`. Any change to a served byte, an S.json, an info.json or a
//! fingerprint fails here; an intended change is re-pinned with
//! `SHUFFLEFS_BLESS=1 cargo test --test it golden::` and shows in review as a diff of that file.
//!
//! Only the binary's interface is used, so the test survives any change to the code inside.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::common::{MountDir, fuse_available, s, shufflefs, splitmix, stderr};

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/golden.json");

/// FNV-1a, 64 bits: independent of every hash shufflefs uses.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn digest(bytes: &[u8]) -> String {
    format!("{}:{:016x}", bytes.len(), fnv(bytes))
}

fn run(args: &[&str]) -> Vec<u8> {
    let out = shufflefs(args);
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    out.stdout
}

/// What differs between two runs of the same case, replaced by fixed text: the dataset
/// directory's path (info.json), the temp dir of in-place inputs and the random part of shard
/// file names (S.json's `files`).
fn masked(bytes: &[u8], dataset: &Path) -> Vec<u8> {
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let path = dataset.canonicalize().unwrap();
    let quoted = serde_json::to_string(path.to_str().unwrap()).unwrap();
    let root = path.parent().unwrap().to_str().unwrap().to_string();
    let text = text.replace(&quoted, "\"DATASET\"").replace(&root, "ROOT");
    // "shard-" + 8 hex digits + "-": the nonce of one pack run.
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(i) = rest.find("shard-") {
        out.push_str(&rest[..i + 6]);
        rest = &rest[i + 6..];
        let nonce = rest
            .get(..9)
            .filter(|n| n.ends_with('-') && n[..8].bytes().all(|b| b.is_ascii_hexdigit()));
        if nonce.is_some() {
            out.push_str("XXXXXXXX-");
            rest = &rest[9..];
        }
    }
    out.push_str(rest);
    out.into_bytes()
}

/// A .npy file of structured records `[('token', '<u4'), ('concept', '<u2')]`, header laid
/// out as numpy 1.0 writes it (magic, version, u16 length, dict, spaces, newline, 64-aligned).
fn structured_npy(n: u64) -> Vec<u8> {
    let dict = format!(
        "{{'descr': [('token', '<u4'), ('concept', '<u2')], 'fortran_order': False, \
         'shape': ({n},), }}"
    );
    // numpy leaves room for the shape to grow (21 digits minus the current ones), then pads.
    let mut header = dict.into_bytes();
    header.resize(header.len() + 21 - n.to_string().len(), b' ');
    let total = (10 + header.len() + 1).next_multiple_of(64);
    header.resize(total - 10 - 1, b' ');
    header.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(&header);
    let mut state = 11u64;
    for i in 0..n {
        out.extend_from_slice(&((i * 7) as u32).to_le_bytes());
        out.extend_from_slice(&((splitmix(&mut state) % 500) as u16).to_le_bytes());
    }
    out
}

/// 300 JSON Lines documents of 1-60 tokens, with document metadata on most and span
/// metadata on some (values and whitespace vary, as real exports do).
fn documents_jsonl() -> String {
    let mut state = 5u64;
    let mut lines = String::new();
    for d in 0..300u64 {
        let len = 1 + splitmix(&mut state) % 60;
        let tokens: Vec<u64> = (0..len).map(|_| splitmix(&mut state) % 50_000).collect();
        let mut line = format!("{{\"tokens\": {tokens:?}");
        if d % 5 != 0 {
            line.push_str(&format!(
                ", \"meta\": {{\"url\": \"site{}.example/{d}\", \"lang\": \"{}\"}}",
                d % 7,
                ["en", "de", "fr"][d as usize % 3]
            ));
        }
        if d % 3 == 0 && len > 4 {
            line.push_str(&format!(
                ", \"spans\": [{{\"start\": 1, \"end\": {}, \"meta\": {{\"concept\":  {}}}}}]",
                len - 2,
                d % 11
            ));
        }
        line.push_str("}\n");
        lines.push_str(&line);
    }
    lines
}

struct Case {
    name: &'static str,
    dataset: PathBuf,
    plan: Vec<&'static str>,
    epochs: u64,
    ranks: u64,
}

/// Reads every file a user would read through the mount and records its digest.
fn walk(case: &Case, mnt: &Path, golden: &mut BTreeMap<String, String>) {
    let mut put = |key: String, bytes: &[u8]| {
        golden.insert(format!("{}/{key}", case.name), digest(bytes));
    };
    let info_bytes = std::fs::read(mnt.join("info.json")).unwrap();
    put("info.json".into(), &masked(&info_bytes, &case.dataset));
    let info: serde_json::Value = serde_json::from_slice(&info_bytes).unwrap();
    let steps = info["steps_per_epoch"].as_u64().unwrap().min(24);
    let n_obs = info["n_observations"].as_u64().unwrap();
    for e in 0..case.epochs {
        for r in 0..case.ranks {
            for st in 0..steps {
                for ext in ["npy", "json"] {
                    let rel = format!("epoch/{e}/rank/{r}/step/{st}.{ext}");
                    let bytes = std::fs::read(mnt.join(&rel)).unwrap();
                    let bytes = if ext == "json" {
                        masked(&bytes, &case.dataset)
                    } else {
                        bytes
                    };
                    put(rel.clone(), &bytes);
                }
            }
        }
        for i in [0, 1, n_obs / 2, n_obs - 1] {
            let rel = format!("lookup/epoch/{e}/observation/{i}.json");
            put(rel.clone(), &std::fs::read(mnt.join(&rel)).unwrap());
        }
    }
    for i in [0, 1, 2, n_obs / 3, n_obs - 1] {
        for ext in ["npy", "json"] {
            let rel = format!("observation/{i}.{ext}");
            put(rel.clone(), &std::fs::read(mnt.join(&rel)).unwrap());
        }
    }
}

fn build(tmp: &Path) -> Vec<Case> {
    let p = |rel: &str| tmp.join(rel);
    std::fs::create_dir_all(p("raw")).unwrap();
    run(&[
        "synth",
        s(&p("raw/tok32.bin")),
        "--tokens",
        "50000",
        "--dtype",
        "u32",
    ]);
    run(&[
        "pack",
        s(&p("stream")),
        s(&p("raw/tok32.bin")),
        "--dtype",
        "u32",
        "--shard-size",
        "64KiB",
    ]);
    std::fs::write(p("raw/docs.jsonl"), documents_jsonl()).unwrap();
    run(&[
        "pack",
        s(&p("docs")),
        s(&p("raw/docs.jsonl")),
        "--dtype",
        "u32",
        "--shard-size",
        "16KiB",
    ]);
    std::fs::write(p("raw/records.npy"), structured_npy(20_000)).unwrap();
    run(&[
        "pack",
        s(&p("records")),
        s(&p("raw/records.npy")),
        "--shard-size",
        "32KiB",
    ]);
    let mut state = 17u64;
    let tokens: Vec<u8> = (0..40_000)
        .flat_map(|_| ((splitmix(&mut state) % 50_257) as u16).to_le_bytes())
        .collect();
    std::fs::write(p("raw/tok16.bin"), tokens).unwrap();
    run(&[
        "pack",
        s(&p("inplace")),
        s(&p("raw/tok16.bin")),
        "--dtype",
        "u16",
        "--in-place",
    ]);
    let case = |name, dataset: &str, plan: &[&'static str], epochs, ranks| Case {
        name,
        dataset: p(dataset),
        plan: plan.to_vec(),
        epochs,
        ranks,
    };
    vec![
        case(
            "stream",
            "stream",
            &[
                "--window",
                "33",
                "--stride",
                "32",
                "--batch-size",
                "4",
                "--ranks",
                "2",
                "--epochs",
                "2",
                "--seed",
                "7",
            ],
            2,
            2,
        ),
        case(
            "docs-stream",
            "docs",
            &[
                "--window",
                "16",
                "--batch-size",
                "3",
                "--ranks",
                "2",
                "--epochs",
                "1",
                "--seed",
                "3",
            ],
            1,
            2,
        ),
        case(
            "docs-documents",
            "docs",
            &[
                "--mode",
                "documents",
                "--window",
                "24",
                "--pad-id",
                "0",
                "--batch-size",
                "2",
                "--ranks",
                "3",
                "--epochs",
                "2",
                "--seed",
                "4",
            ],
            2,
            3,
        ),
        case(
            "records",
            "records",
            &[
                "--window",
                "17",
                "--stride",
                "9",
                "--batch-size",
                "2",
                "--ranks",
                "1",
                "--epochs",
                "1",
            ],
            1,
            1,
        ),
        case(
            "inplace",
            "inplace",
            &[
                "--window",
                "65",
                "--stride",
                "64",
                "--batch-size",
                "8",
                "--ranks",
                "2",
                "--epochs",
                "1",
                "--seed",
                "99",
            ],
            1,
            2,
        ),
    ]
}

#[test]
fn served_bytes_match_the_golden_set() {
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut golden = BTreeMap::new();
    for case in build(tmp.path()) {
        let mnt = MountDir::new();
        let mut args = vec!["mount", s(&case.dataset), s(mnt.path())];
        args.extend(&case.plan);
        run(&args);
        walk(&case, mnt.path(), &mut golden);
        run(&["unmount", s(mnt.path())]);
        // `plan` prints the same info.json and S.json without a mount.
        let mut plan = vec!["plan", s(&case.dataset)];
        plan.extend(&case.plan);
        let mut info = plan.clone();
        info.push("--info");
        let printed = run(&info);
        golden.insert(
            format!("{}/plan --info", case.name),
            digest(&masked(&printed, &case.dataset)),
        );
        let mut step = plan.clone();
        step.extend(["--epoch", "0", "--rank", "0", "--step", "1"]);
        golden.insert(
            format!("{}/plan step 0/0/1", case.name),
            digest(&masked(&run(&step), &case.dataset)),
        );
    }
    let rendered = serde_json::to_string_pretty(&golden).unwrap() + "\n";
    if std::env::var_os("SHUFFLEFS_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(GOLDEN, &rendered).unwrap();
        eprintln!("wrote {GOLDEN} ({} entries)", golden.len());
        return;
    }
    let pinned: BTreeMap<String, String> = serde_json::from_slice(
        &std::fs::read(GOLDEN).expect("tests/fixtures/golden.json (bless with SHUFFLEFS_BLESS=1)"),
    )
    .unwrap();
    let keys: std::collections::BTreeSet<&String> = pinned.keys().chain(golden.keys()).collect();
    let differ: Vec<String> = keys
        .into_iter()
        .filter(|k| pinned.get(*k) != golden.get(*k))
        .map(|k| {
            format!(
                "{k}: pinned {:?}, served {:?}",
                pinned.get(k),
                golden.get(k)
            )
        })
        .collect();
    assert!(
        differ.is_empty(),
        "{} of {} golden entries differ (first 20):\n{}",
        differ.len(),
        pinned.len(),
        differ[..differ.len().min(20)].join("\n")
    );
}

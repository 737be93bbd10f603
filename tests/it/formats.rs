//! Every token format end to end: the files the real writers wrote (tests/fixtures/formats,
//! see parsers.rs) are packed with `shufflefs pack` as a user would (in place where the format
//! is a token file, converted where it is a table), and what the dataset serves is compared
//! with what the format's own reader sees (`expected-*.json`, tests/formats/read_format.py):
//! the token stream, every document, and every row of epoch 0 on three ranks, in stream and
//! documents mode. In place, the dataset directory holds only the manifest and the compact
//! document index (24 bytes per document), never a token.
//!
//! shufflefs's documents tile the stream and never span input files, so the expected
//! documents are normalised the same way (`normalise`): a document the format lets cross a
//! file boundary (llm.c) is two, tokens before the first or after the last boundary of a file
//! (an OLMo file cut mid-document) are one more document, and empty documents (Megatron,
//! datatrove) have no number.

use std::path::{Path, PathBuf};

use serde_json::Value;
use shufflefs::ScalarType;
use shufflefs::dataset::Dataset;
use shufflefs::fs::ShuffleFs;
use shufflefs::plan::StepKey;
use shufflefs::view::{Mode, View, ViewConfig};

use crate::common::*;
use crate::parsers::{expected, fixtures};

/// A case: a fixture directory, its expected reading, and how a user packs it.
struct Case {
    dir: &'static str,
    label: &'static str,
    /// The inputs: `None` for the files the expected reading lists, in its order.
    inputs: Option<Vec<&'static str>>,
    flags: Vec<&'static str>,
    /// The expected document list (`documents` or `sequences`).
    docs_key: &'static str,
    in_place: bool,
}

fn case(dir: &'static str, label: &'static str, flags: &[&'static str]) -> Case {
    Case {
        dir,
        label,
        inputs: None,
        flags: flags.to_vec(),
        docs_key: "documents",
        in_place: true,
    }
}

/// The tokens of the expected reading.
fn tokens(exp: &Value) -> Vec<i64> {
    exp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect()
}

/// The token count of each input file, in order.
fn file_tokens(exp: &Value) -> Vec<u64> {
    exp["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["tokens"].as_u64().unwrap())
        .collect()
}

/// The expected documents as shufflefs numbers them (see the module docs): non-empty,
/// tiling the stream, cut at every file boundary.
fn normalise(docs: &[(u64, u64)], file_ends: &[u64]) -> Vec<(u64, u64)> {
    let total = *file_ends.last().unwrap();
    let mut bounds: Vec<u64> = vec![0, total];
    for &(a, b) in docs {
        bounds.extend([a, b]);
    }
    bounds.extend_from_slice(file_ends);
    bounds.sort_unstable();
    bounds.dedup();
    bounds.windows(2).map(|w| (w[0], w[1])).collect()
}

fn ranges(v: &Value) -> Vec<(u64, u64)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| (d[0].as_u64().unwrap(), d[1].as_u64().unwrap()))
        .collect()
}

/// The payload of an `.npy` of i64 values.
fn i64s(npy: &[u8], n: usize) -> Vec<i64> {
    npy[npy.len() - 8 * n..]
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Every row of epoch 0 on every rank: `check(row tokens, S.json row index, S.json)`.
fn every_row(fs: &ShuffleFs, window: u64, mut check: impl FnMut(&[i64], usize, &Value)) {
    let view = fs.view();
    let plan = view.plan();
    for rank in 0..plan.ranks() {
        for step in 0..plan.steps_per_epoch() {
            let key = StepKey {
                epoch: 0,
                rank,
                step,
            };
            let json: Value = serde_json::from_slice(&view.step_json(key).unwrap()).unwrap();
            let rows = json["observations"].as_array().unwrap().len();
            let npy = view.render_step_npy(key).unwrap();
            let values = i64s(&npy, rows * window as usize);
            for (r, row) in values.chunks(window as usize).enumerate() {
                check(row, r, &json);
            }
        }
    }
}

fn run(c: &Case) {
    let exp = expected(c.dir, c.label);
    let base = fixtures().join(c.dir);
    let inputs: Vec<PathBuf> = match &c.inputs {
        Some(names) => names.iter().map(|n| base.join(n)).collect(),
        None => exp["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| base.join(f["path"].as_str().unwrap()))
            .collect(),
    };
    let want = tokens(&exp);
    let mut file_ends: Vec<u64> = Vec::new();
    if c.dir != "hf" {
        for n in file_tokens(&exp) {
            file_ends.push(file_ends.last().copied().unwrap_or(0) + n);
        }
    } else {
        file_ends.push(want.len() as u64);
    }
    let mut docs = ranges(&exp[c.docs_key]);
    if c.dir == "hf" {
        // A table's rows are its documents, and they may span the Arrow shards.
        file_ends = vec![want.len() as u64];
        docs.retain(|(a, b)| a < b);
    }
    let docs = normalise(&docs, &file_ends);

    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    let mut args = vec!["pack", s(&ds)];
    args.extend(inputs.iter().map(|p| s(p)));
    args.extend(&c.flags);
    args.push("--no-progress");
    if c.in_place {
        args.push("--in-place");
    }
    shufflefs_ok(&args);
    let what = format!("{} {}", c.dir, c.label);

    // The stream and the documents, as the dataset reads them.
    let dataset = Dataset::open(&ds).unwrap();
    let m = manifest(&ds);
    let size = m["itemsize"].as_u64().unwrap() as usize;
    let signed = m["dtype"].as_str().unwrap().contains('i');
    let mut raw = vec![0u8; want.len() * size];
    dataset.read_stream(0, &mut raw).unwrap();
    let got: Vec<i64> = raw
        .chunks_exact(size)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(c);
            let v = u64::from_le_bytes(b);
            if signed && size == 4 {
                i64::from(v as u32 as i32)
            } else {
                v as i64
            }
        })
        .collect();
    assert_eq!(got, want, "{what}: the token stream");
    assert_eq!(m["documents"], docs.len(), "{what}: documents");
    for (d, &(a, b)) in docs.iter().enumerate() {
        let doc = dataset.document(d as u64).unwrap();
        assert_eq!(
            (doc.start, doc.start + doc.len),
            (a, b),
            "{what}: document {d}"
        );
    }
    let doc_of = |r: u64| docs.partition_point(|&(_, b)| b <= r) as u64;
    for start in (0..want.len() as u64).step_by(5) {
        let count = 9.min(want.len() as u64 - start);
        for span in dataset.spans(start, count).unwrap() {
            for r in span.start..span.end {
                assert_eq!(span.doc, doc_of(start + r), "{what}: record {}", start + r);
            }
        }
    }
    if c.in_place {
        // Only the manifest and the compact document index: no token was copied.
        let mut docs_bytes = 0;
        for e in std::fs::read_dir(&ds).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            assert!(
                name == "manifest.json" || name.ends_with(".docs"),
                "{what}: {name}"
            );
            docs_bytes += u64::from(name.ends_with(".docs")) * e.metadata().unwrap().len();
        }
        assert_eq!(docs_bytes, 24 * docs.len() as u64, "{what}");
    }

    // Every row of epoch 0 on three ranks (one for the smallest files), served as i64:
    // stream mode...
    let window = (want.len() as u64 / 6).clamp(1, 7);
    let (batch, ranks) = if docs.len() >= 6 { (2, 3) } else { (1, 1) };
    let config = |mode| ViewConfig {
        mode,
        pad_id: (mode == Mode::Documents).then_some(0),
        out_dtype: Some(ScalarType::I64),
        ..config(window, window, batch, ranks, 11, 1)
    };
    let fs = ShuffleFs::new(View::open(&ds, &config(Mode::Stream)).unwrap()).unwrap();
    let mut rows = 0;
    every_row(&fs, window, |row, r, json| {
        let start = json["token_starts"][r].as_u64().unwrap() as usize;
        assert_eq!(
            row,
            &want[start..start + window as usize],
            "{what}: window at {start}"
        );
        rows += 1;
    });
    assert!(rows > 0, "{what}");
    // The same files through a real mount (the FUSE adapter only translates).
    if fuse_available() {
        let reference = View::open(&ds, &config(Mode::Stream)).unwrap();
        let mount = TestMount::new(fs);
        for step in 0..reference.plan().steps_per_epoch() {
            let key = StepKey {
                epoch: 0,
                rank: 0,
                step,
            };
            let read = std::fs::read(mount.step(0, 0, step, "npy")).unwrap();
            assert_eq!(
                read,
                reference.render_step_npy(key).unwrap(),
                "{what}: step {step}"
            );
        }
    }
    // ... and documents mode: each row a document, truncated to the window or padded.
    let fs = ShuffleFs::new(View::open(&ds, &config(Mode::Documents)).unwrap()).unwrap();
    every_row(&fs, window, |row, r, json| {
        let d = json["observations"][r].as_u64().unwrap() as usize;
        let (a, b) = docs[d];
        let n = ((b - a) as usize).min(window as usize);
        assert_eq!(
            &row[..n],
            &want[a as usize..a as usize + n],
            "{what}: document {d}"
        );
        assert!(row[n..].iter().all(|&v| v == 0), "{what}: padding");
    });
}

#[test]
fn megatron_datasets_in_place_with_their_documents_or_sequences() {
    run(&case("megatron_split", "all", &[]));
    run(&Case {
        docs_key: "sequences",
        ..case("megatron_split", "all", &["--megatron-unit", "sequence"])
    });
    // int32 tokens (vocabulary >= 65,500) and a multimodal index (modes trailer).
    run(&case("megatron_i32_mm", "all", &[]));
    run(&case("megatron_merged", "all", &[]));
    // Two prefixes: two shards, the documents of each.
    run(&case("megatron_files", "all", &[]));
}

#[test]
fn datatrove_files_in_place_with_their_documents() {
    run(&case("datatrove_loss", "all", &[]));
    run(&case("datatrove_merged_u32", "all", &[]));
}

#[test]
fn llmc_shards_in_place_with_eot_started_documents() {
    run(&case("llmc_gpt2", "all", &["--doc-start", "50256"]));
    run(&case("llmc_llama3", "all", &["--doc-start", "128000"]));
}

#[test]
fn nanogpt_and_olmo_token_files_in_place_with_eos_documents() {
    run(&case(
        "nanogpt",
        "train",
        &["--dtype", "u16", "--doc-sep", "50256"],
    ));
    run(&case(
        "nanogpt",
        "val",
        &["--dtype", "u16", "--doc-sep", "50256"],
    ));
    run(&case(
        "olmo_dolma1",
        "all",
        &["--dtype", "u16", "--doc-sep", "50279"],
    ));
    run(&case(
        "olmo_dolma2",
        "all",
        &["--dtype", "u32", "--doc-sep", "100257"],
    ));
    run(&case(
        "olmo_dolma2",
        "cut",
        &["--dtype", "u32", "--doc-sep", "100257"],
    ));
    let bos = [
        "--dtype",
        "u32",
        "--doc-sep",
        "100257",
        "--doc-bos",
        "100257",
    ];
    run(&case("olmo_dolma2_bos", "all", &bos));
    run(&case("olmo_dolma2_bos", "cut", &bos));
}

#[test]
fn hugging_face_tables_are_converted_with_one_document_per_row() {
    let table = |label, inputs: Vec<&'static str>, flags: &[&'static str]| Case {
        inputs: Some(inputs),
        in_place: false,
        ..case("hf", label, flags)
    };
    // save_to_disk's directory: its Arrow streams in state.json's order.
    run(&table("disk", vec!["disk"], &["--dtype", "u32"]));
    run(&table("parquet", vec!["hf.parquet"], &["--dtype", "u32"]));
    run(&table(
        "int64",
        vec!["pa_int64.parquet"],
        &["--dtype", "u32"],
    ));
    let tokens = ["--dtype", "u16", "--tokens-field", "tokens"];
    run(&table("uint16", vec!["pa_uint16.parquet"], &tokens));
}

#[test]
fn a_format_directory_packs_as_its_token_files_in_name_order() {
    // The directory of a Megatron data dir (two prefixes) and of a datatrove folder: the
    // same datasets as their files named one by one.
    for (dir, pattern) in [("megatron_files", ".bin"), ("datatrove_loss", ".ds")] {
        let tmp = tempfile::tempdir().unwrap();
        let copy = tmp.path().join("data");
        std::fs::create_dir(&copy).unwrap();
        let mut named = Vec::new();
        for e in std::fs::read_dir(fixtures().join(dir)).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            if name.starts_with("expected") {
                continue;
            }
            std::fs::copy(&p, copy.join(&name)).unwrap();
            if name.ends_with(pattern) {
                named.push(copy.join(&name));
            }
        }
        named.sort();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        shufflefs_ok(&["pack", s(&a), s(&copy), "--in-place", "--no-progress"]);
        let mut args = vec!["pack", s(&b)];
        args.extend(named.iter().map(|p| s(p)));
        args.extend(["--in-place", "--no-progress"]);
        shufflefs_ok(&args);
        let fp = |ds: &Path| {
            let view = View::open(ds, &config(7, 7, 2, 3, 11, 1)).unwrap();
            view.fingerprint().to_string()
        };
        assert_eq!(fp(&a), fp(&b), "{dir}");
        assert_eq!(
            manifest(&a)["documents"],
            manifest(&b)["documents"],
            "{dir}"
        );
    }
}

#[test]
fn json_lines_with_another_tokens_field() {
    // Lines as a tokenizer's `datasets.map` exports them: input_ids beside other fields.
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("tok.jsonl");
    std::fs::write(
        &input,
        "{\"text\": \"a b\", \"input_ids\": [5, 6, 7], \"attention_mask\": [1, 1, 1]}\n\
         {\"text\": \"c\", \"input_ids\": [8], \"attention_mask\": [1], \"meta\": {\"id\": 2}}\n",
    )
    .unwrap();
    let ds = tmp.path().join("ds");
    let o = shufflefs(&["pack", s(&ds), s(&input), "--dtype", "u16"]);
    assert!(stderr(&o).contains("--tokens-field"), "{}", stderr(&o));
    shufflefs_ok(&[
        "pack",
        s(&ds),
        s(&input),
        "--dtype",
        "u16",
        "--tokens-field",
        "input_ids",
    ]);
    let dataset = Dataset::open(&ds).unwrap();
    let mut raw = vec![0u8; 8];
    dataset.read_stream(0, &mut raw).unwrap();
    assert_eq!(raw, [5, 0, 6, 0, 7, 0, 8, 0]);
    let m = manifest(&ds);
    assert_eq!(
        (m["documents"].as_u64(), m["metadata"].as_bool()),
        (Some(2), Some(true))
    );
    assert_eq!(dataset.document(1).unwrap().meta.to_string(), "{\"id\": 2}");
}

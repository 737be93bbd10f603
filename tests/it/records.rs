//! Multi-field records, documents and metadata: structured .npy inputs, JSON Lines with
//! document and span metadata, documents mode, --doc-sep, provenance and reverse lookup.

use std::fs;
use std::path::Path;

use serde_json::{Value, json};
use shufflefs::dtype::ScalarType;
use shufflefs::fs::ShuffleFs;
use shufflefs::npy;
use shufflefs::pack::{PackOptions, pack};
use shufflefs::plan::StepKey;
use shufflefs::view::{Mode, View, ViewConfig};

use crate::common::*;

fn options(dtype: Option<ScalarType>, shard_size: u64) -> PackOptions {
    PackOptions {
        dtype,
        shard_size,
        ..PackOptions::default()
    }
}

fn docs_config(window: u64, batch: u64, ranks: u64, pad: Option<i128>) -> ViewConfig {
    ViewConfig {
        mode: Mode::Documents,
        stride: None,
        pad_id: pad,
        ..ViewConfig::stream(window, window, batch, ranks, 5, 2)
    }
}

#[test]
fn structured_npy_round_trip_is_byte_exact() {
    let dir = tempfile::tempdir().unwrap();
    let descr = "[('token', '<u4'), ('concept', '<u2')]";
    // The header shufflefs writes for a structured array is numpy's, byte for byte.
    let golden =
        fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/structured_tc_1d.npy"))
            .unwrap();
    let header = npy::header(descr, &[5]).unwrap();
    assert_eq!(&golden[..header.len()], &header[..]);
    // 10,000 records: token i, concept i % 7.
    let n = 10_000u32;
    let mut file = npy::header(descr, &[u64::from(n)]).unwrap();
    let mut stream = Vec::new();
    for i in 0..n {
        stream.extend_from_slice(&i.to_le_bytes());
        stream.extend_from_slice(&((i % 7) as u16).to_le_bytes());
    }
    file.extend_from_slice(&stream);
    let input = dir.path().join("records.npy");
    fs::write(&input, &file).unwrap();
    let ds = dir.path().join("ds");
    pack(&ds, &[input], &options(None, 6 * 1000)).unwrap();
    let cfg = ViewConfig::stream(9, 8, 4, 2, 3, 1);
    let fs = ShuffleFs::new(View::open(&ds, &cfg).unwrap()).unwrap();
    let info = json_at(&fs, "info.json");
    assert_eq!(info["dtype"], descr);
    assert_eq!(
        info["fields"],
        json!([["token", "<u4"], ["concept", "<u2"]])
    );
    assert_eq!(info["itemsize"], 6);
    let step_header = npy::header(descr, &[4, 9]).unwrap();
    for step in 0..fs.view().plan().steps_per_epoch() {
        for rank in 0..2 {
            let path = format!("epoch/0/rank/{rank}/step/{step}");
            let obs = json_observations(&read_all(&fs, &format!("{path}.json")));
            let bytes = read_all(&fs, &format!("{path}.npy"));
            assert_eq!(&bytes[..step_header.len()], &step_header[..]);
            let want: Vec<u8> = obs
                .iter()
                .flat_map(|&o| stream[(o * 8 * 6) as usize..((o * 8 + 9) * 6) as usize].to_vec())
                .collect();
            assert_eq!(&bytes[step_header.len()..], &want[..], "{path}");
        }
    }
    // Every record field travels with its token: observation/I.npy is the window itself.
    let obs = read_all(&fs, "observation/3.npy");
    let h = npy::header(descr, &[9]).unwrap();
    assert_eq!(&obs[..h.len()], &h[..]);
    assert_eq!(&obs[h.len()..], &stream[3 * 8 * 6..(3 * 8 + 9) * 6]);
}

fn corpus(n_docs: u64, shard_bytes: u64) -> Corpus {
    Corpus::new(n_docs, shard_bytes)
}

/// Checks that `spans` tile `[0, len)` and that every token of a span is owned by the span's
/// document and metadata, for tokens starting at stream position `first`.
fn check_spans(spans: &Value, first: u64, len: u64, owners: &[(u64, Value)], what: &str) {
    let spans = spans.as_array().unwrap();
    let mut at = 0u64;
    for s in spans {
        let (start, end) = (s["start"].as_u64().unwrap(), s["end"].as_u64().unwrap());
        assert_eq!(start, at, "{what}: spans tile the row");
        assert!(end > start, "{what}: empty span");
        for t in start..end {
            let (doc, meta) = &owners[(first + t) as usize];
            assert_eq!(s["doc"], json!(doc), "{what}: token {t} document");
            assert_eq!(&s["meta"], meta, "{what}: token {t} metadata");
        }
        at = end;
    }
    assert_eq!(at, len, "{what}: spans cover the row");
}

#[test]
fn stream_rows_carry_span_metadata_that_tiles_each_window() {
    // Shards of 64 tokens: documents and spans cross shard boundaries.
    let c = corpus(300, 64 * 4);
    let n_tokens = c.owners.len() as u64;
    let cfg = ViewConfig::stream(17, 16, 4, 2, 1, 2);
    let fs = ShuffleFs::new(View::open(&c.ds, &cfg).unwrap()).unwrap();
    let info = json_at(&fs, "info.json");
    assert_eq!(info["n_documents"], 300);
    assert_eq!(info["metadata"], true);
    assert_eq!(info["n_tokens"], n_tokens);
    for epoch in 0..2 {
        for step in 0..fs.view().plan().steps_per_epoch() {
            for rank in 0..2 {
                let path = format!("epoch/{epoch}/rank/{rank}/step/{step}");
                let j = json_at(&fs, &format!("{path}.json"));
                let rows = j["rows"].as_array().unwrap();
                assert_eq!(rows.len(), 4);
                for (r, row) in rows.iter().enumerate() {
                    let first = j["token_starts"][r].as_u64().unwrap();
                    check_spans(row, first, 17, &c.owners, &format!("{path} row {r}"));
                }
                // The tokens are positions, so the .npy rows are the windows themselves.
                let npy_bytes = read_all(&fs, &format!("{path}.npy"));
                let obs = json_observations(&read_all(&fs, &format!("{path}.json")));
                assert_eq!(
                    &npy_bytes[npy_bytes.len() - 4 * 17 * 4..],
                    &expected_rows(&obs, &cfg, ScalarType::U32)[..]
                );
            }
        }
    }
    // observation/I.json carries the same spans, unshuffled.
    let o = json_at(&fs, "observation/5.json");
    assert_eq!(o["token_start"], 80);
    check_spans(&o["spans"], 80, 17, &c.owners, "observation 5");
}

#[test]
fn documents_mode_rows_lengths_padding_and_partition() {
    let c = corpus(203, 64 * 4);
    let cfg = docs_config(6, 4, 3, Some(999_999));
    let fs = ShuffleFs::new(View::open(&c.ds, &cfg).unwrap()).unwrap();
    let plan = fs.view().plan().clone();
    assert_eq!(plan.n_observations(), 203);
    let header = npy::header("'<u4'", &[4, 6]).unwrap();
    for epoch in 0..2 {
        let mut all = Vec::new();
        for step in 0..plan.steps_per_epoch() {
            for rank in 0..3 {
                let path = format!("epoch/{epoch}/rank/{rank}/step/{step}");
                let j = json_at(&fs, &format!("{path}.json"));
                let docs: Vec<u64> = j["observations"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect();
                let bytes = read_all(&fs, &format!("{path}.npy"));
                assert_eq!(&bytes[..header.len()], &header[..]);
                for (r, &d) in docs.iter().enumerate() {
                    let (start, len, meta) = &c.docs[d as usize];
                    let used = (*len).min(6);
                    assert_eq!(j["lengths"][r], used, "{path} row {r}");
                    assert_eq!(j["truncated"][r], *len > 6);
                    assert_eq!(&j["meta"][r], meta);
                    assert_eq!(j["token_starts"][r], *start);
                    let row: Vec<u32> = bytes[header.len() + r * 24..header.len() + (r + 1) * 24]
                        .chunks_exact(4)
                        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                        .collect();
                    for (t, v) in row.iter().enumerate() {
                        let want = if (t as u64) < used {
                            (start + t as u64) as u32
                        } else {
                            999_999
                        };
                        assert_eq!(*v, want, "{path} row {r} col {t}");
                    }
                    // Spans tile the used part; padding is one span of its own.
                    let spans = j["rows"][r].as_array().unwrap();
                    let real: Vec<Value> = spans
                        .iter()
                        .filter(|s| s.get("pad").is_none())
                        .cloned()
                        .collect();
                    check_spans(
                        &Value::Array(real),
                        *start,
                        used,
                        &c.owners,
                        &format!("{path} row {r}"),
                    );
                    if used < 6 {
                        assert_eq!(spans.last().unwrap()["start"], used);
                        assert_eq!(spans.last().unwrap()["end"], 6);
                    }
                }
                all.push(docs);
            }
        }
        assert_exact_partition(&all, 203, 12);
    }
    // Any byte range of a padded step file equals the slice of the whole file.
    let ino = walk(&fs, "epoch/1/rank/2/step/3.npy").unwrap();
    let whole = read_all(&fs, "epoch/1/rank/2/step/3.npy");
    for offset in 0..=whole.len() as u64 + 2 {
        for size in [1u32, 3, 5, 24, 97] {
            let out = read_at(&fs, ino, offset, size).unwrap();
            let start = (offset as usize).min(whole.len());
            let end = (offset as usize + size as usize).min(whole.len());
            assert_eq!(out, &whole[start..end], "offset {offset} size {size}");
        }
    }
    // observation/I.npy is the whole document, unpadded.
    let (start, len, _) = c.docs[11];
    let bytes = read_all(&fs, "observation/11.npy");
    let h = npy::header("'<u4'", &[len]).unwrap();
    assert_eq!(&bytes[..h.len()], &h[..]);
    let want: Vec<u8> = (start..start + len)
        .flat_map(|t| (t as u32).to_le_bytes())
        .collect();
    assert_eq!(&bytes[h.len()..], &want[..]);
    // Padding of a stream-mode flag is refused, and documents mode needs documents.
    assert!(
        View::open(
            &c.ds,
            &ViewConfig {
                pad_id: Some(1),
                ..ViewConfig::stream(6, 6, 4, 3, 5, 2)
            }
        )
        .is_err()
    );
    let plain = Data::positional(1000, 4096);
    let err = View::open(&plain.path(), &docs_config(6, 4, 3, None)).unwrap_err();
    assert!(
        err.to_string().contains("needs a dataset with documents"),
        "{err}"
    );
}

#[test]
fn doc_sep_splits_raw_tokens_into_documents() {
    let dir = tempfile::tempdir().unwrap();
    // Tokens p % 10 for p in 0..1005; separator 9: documents of 10 tokens, then a tail of 5.
    let raw: Vec<u8> = (0..1005u32).flat_map(|p| (p % 10).to_le_bytes()).collect();
    let input = dir.path().join("train.bin");
    fs::write(&input, &raw).unwrap();
    let ds = dir.path().join("ds");
    let m = pack(
        &ds,
        &[input],
        &PackOptions {
            doc_sep: Some(9),
            ..options(Some(ScalarType::U32), 64 * 4)
        },
    )
    .unwrap();
    assert_eq!(m.documents, Some(101));
    assert!(!m.metadata);
    let fs = ShuffleFs::new(View::open(&ds, &docs_config(12, 2, 1, None)).unwrap()).unwrap();
    for d in [0u64, 1, 37, 99, 100] {
        let o = json_at(&fs, &format!("observation/{d}.json"));
        assert_eq!(o["token_start"], d * 10);
        let len = if d == 100 { 5 } else { 10 };
        assert_eq!(o["token_end"], d * 10 + len);
        assert_eq!(o["meta"], Value::Null);
        assert_eq!(
            o["spans"],
            json!([{"start": 0, "end": len, "doc": d, "meta": null}])
        );
    }
    // Every row is 0..=9 then padding zeros (the tail document 0..=4).
    for step in 0..fs.view().plan().steps_per_epoch() {
        let bytes = read_all(&fs, &format!("epoch/0/rank/0/step/{step}.npy"));
        let h = npy::header("'<u4'", &[2, 12]).unwrap();
        for row in bytes[h.len()..].chunks_exact(48) {
            let vals: Vec<u32> = row
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let len = if vals[5] == 5 { 10 } else { 5 };
            for (t, v) in vals.iter().enumerate() {
                assert_eq!(*v, if t < len { t as u32 } else { 0 });
            }
        }
    }
}

#[test]
fn lookup_agrees_with_step_files_for_every_observation() {
    for (cfg, c) in [
        (ViewConfig::stream(5, 3, 4, 3, 9, 3), corpus(120, 200)),
        (docs_config(5, 4, 3, None), corpus(121, 200)),
    ] {
        let fs = ShuffleFs::new(View::open(&c.ds, &cfg).unwrap()).unwrap();
        let plan = fs.view().plan().clone();
        for epoch in 0..plan.epochs() {
            let mut placed = std::collections::HashMap::new();
            for step in 0..plan.steps_per_epoch() {
                for rank in 0..3 {
                    let obs = fs
                        .view()
                        .step_info(StepKey { epoch, rank, step })
                        .observations;
                    for (row, o) in obs.into_iter().enumerate() {
                        placed.insert(o, (step, rank, row as u64));
                    }
                }
            }
            for o in 0..plan.n_observations() {
                let j = json_at(&fs, &format!("lookup/epoch/{epoch}/observation/{o}.json"));
                match placed.get(&o) {
                    Some(&(step, rank, row)) => {
                        assert_eq!(
                            (j["step"].as_u64(), j["rank"].as_u64(), j["row"].as_u64()),
                            (Some(step), Some(rank), Some(row))
                        );
                        assert_eq!(j["position"], step * 12 + row * 3 + rank);
                    }
                    None => assert_eq!(j["dropped"], true, "observation {o}"),
                }
            }
        }
    }
}

#[test]
fn bad_jsonl_is_refused_with_the_line_and_leaves_nothing() {
    let cases: &[(&str, &str)] = &[
        (
            "{\"tokens\": [1, 2]}\nnot json\n",
            "docs.jsonl:2: not a valid document",
        ),
        (
            "{\"tokens\": [1]}\n{\"meta\": 1}\n",
            "docs.jsonl:2: missing \"tokens\"",
        ),
        (
            "{\"tokens\": [1, 65536]}\n",
            "docs.jsonl:1: token 1 (65536) is not a u16 value",
        ),
        (
            "{\"tokens\": [1, -1]}\n",
            "docs.jsonl:1: token 1 (-1) is not a u16 value",
        ),
        (
            "{\"tokens\": [1, 2.5]}\n",
            "docs.jsonl:1: token 1 (2.5) is not a u16 value",
        ),
        (
            "{\"tokens\": [1, 2], \"spans\": [{\"start\": 1, \"end\": 3}]}\n",
            "docs.jsonl:1: span 0 [1, 3) is out of bounds",
        ),
        (
            "{\"tokens\": [1, 2, 3], \"spans\": [{\"start\": 1, \"end\": 3}, {\"start\": 0, \"end\": 1}]}\n",
            "docs.jsonl:1: span 1 [0, 1) overlaps",
        ),
        ("{\"tokens\": []}\n", "docs.jsonl:1: \"tokens\" is empty"),
        (
            "[[1, 2], null, []]\n",
            "docs.jsonl:1: not a valid document: expected a JSON object",
        ),
        ("{\"tokens\": [1]}\n\n", "docs.jsonl:2: empty line"),
        (
            "{\"tokens\": [1], \"extra\": 2}\n",
            "docs.jsonl:1: not a valid document: unknown field `extra`",
        ),
    ];
    for (text, want) in cases {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("docs.jsonl");
        // Enough good lines first that shards are written before the bad line is reached.
        let good: String = (0..300)
            .map(|i| format!("{{\"tokens\": [{i}, {i}]}}\n"))
            .collect();
        fs::write(&input, good + text).unwrap();
        let ds = dir.path().join("ds");
        let err = pack(&ds, &[input], &options(Some(ScalarType::U16), 64)).unwrap_err();
        let msg = err.to_string();
        let want = want.replacen(":1:", ":301:", 1).replacen(":2:", ":302:", 1);
        assert!(msg.contains(&want), "{msg:?} lacks {want:?}");
        let left: Vec<_> = fs::read_dir(&ds)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{want}: left {left:?}");
    }
}

#[test]
fn mounted_metadata_and_lookup_files() {
    if !fuse_available() {
        return;
    }
    let c = corpus(150, 256);
    let cfg = ViewConfig::stream(9, 9, 2, 2, 4, 1);
    let reference = ShuffleFs::new(View::open(&c.ds, &cfg).unwrap()).unwrap();
    let m = TestMount::new(ShuffleFs::new(View::open(&c.ds, &cfg).unwrap()).unwrap());
    for step in [0u64, 1, 5] {
        for ext in ["json", "npy"] {
            let path = format!("epoch/0/rank/1/step/{step}.{ext}");
            assert_eq!(
                fs::read(m.path().join(&path)).unwrap(),
                read_all(&reference, &path),
                "{path}"
            );
        }
    }
    for path in [
        "observation/7.json",
        "observation/7.npy",
        "lookup/epoch/0/observation/7.json",
        "info.json",
    ] {
        assert_eq!(
            fs::read(m.path().join(path)).unwrap(),
            read_all(&reference, path),
            "{path}"
        );
    }
    let names: Vec<String> = fs::read_dir(m.path().join("lookup/epoch/0/observation"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len() as u64, reference.view().plan().n_observations());
    assert_eq!(names[3], "3.json");
    m.unmount();
}

/// Counts reads per file kind (by extension).
struct Counting {
    inner: std::sync::Arc<dyn shufflefs::dataset::ReadAt>,
    count: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl shufflefs::dataset::ReadAt for Counting {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
        self.count
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.read_at(buf, offset)
    }
}

#[test]
fn metadata_of_a_window_costs_three_reads_per_shard_touched() {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    // Short documents (1..13 tokens) with span metadata; shards of 256 tokens.
    let c = corpus(2000, 256 * 4);
    let counters: BTreeMap<&str, Arc<AtomicU64>> =
        ["bin", "sums", "ids", "idx", "meta", "docs", "docsums"]
            .into_iter()
            .map(|k| (k, Arc::new(AtomicU64::new(0))))
            .collect();
    let dataset = shufflefs::dataset::Dataset::open(&c.ds)
        .unwrap()
        .wrap_sources(|path, inner| {
            let ext = path.extension().unwrap().to_str().unwrap().to_string();
            let count = counters[ext.as_str()].clone();
            Arc::new(Counting { inner, count })
        });
    let counts = || -> Vec<u64> {
        counters
            .values()
            .map(|c| c.load(Ordering::Relaxed))
            .collect()
    };
    let reset = || {
        counters
            .values()
            .for_each(|c| c.store(0, Ordering::Relaxed))
    };
    // order of `counts`: bin, docs, docsums, ids, idx, meta, sums (the shard checksums, never
    // read without --verify-reads). Each document-file read also reads its block checksums.
    // The first read of a shard's document files also checks its whole checksum file against
    // the manifest, once: a pass over the stream does that for every shard first.
    dataset.spans(0, dataset.n_records()).unwrap();
    for (first, len, shards) in [
        (10u64, 200u64, 1u64),
        (200, 100, 2),
        (0, 256, 1),
        (250, 600, 4),
    ] {
        reset();
        let spans = dataset.spans(first, len).unwrap();
        assert!(spans.len() > 10, "many documents per window");
        assert_eq!(
            counts(),
            vec![0, 0, 3 * shards, shards, shards, shards, 0],
            "window {first}+{len}"
        );
    }
    reset();
    dataset.document(777).unwrap();
    assert_eq!(
        counts(),
        vec![0, 1, 3, 0, 1, 1, 0],
        "a document: docs, index, data"
    );
    // For sizes only (the size of S.json in `stat`): the same reads without their checksums.
    for (first, len, shards) in [(10u64, 200u64, 1u64), (250, 600, 4)] {
        reset();
        let shapes = dataset.span_shapes(first, len).unwrap();
        let spans = dataset.spans(first, len).unwrap();
        assert_eq!(shapes.len(), spans.len());
        for (shape, span) in shapes.iter().zip(&spans) {
            assert_eq!(
                (shape.start, shape.end, shape.doc, shape.meta_len),
                (span.start, span.end, span.doc, span.meta.len() as u64)
            );
        }
        assert_eq!(
            counts()[..2],
            [0, 0],
            "window {first}+{len}: no shard reads"
        );
        let (unchecked_and_checked, checked_only) = (shards, 3 * shards);
        assert_eq!(
            counts()[2..6],
            [
                checked_only,
                2 * unchecked_and_checked,
                2 * shards,
                2 * shards
            ],
            "window {first}+{len}: spans() reads the checksums, span_shapes() does not"
        );
    }
    reset();
    let d = dataset.document_for_size(777).unwrap();
    assert_eq!(d, dataset.document(777).unwrap());
    assert_eq!(counts(), vec![0, 2, 3, 0, 2, 2, 0]);
}

/// The size of `S.json` in `stat` is measured without writing the file (span shapes read for
/// sizes only): it must equal the length of the file, in both modes, with spans and
/// documents across shard boundaries, padding, and several rows per step.
#[test]
fn step_json_size_is_exact_without_rendering() {
    // Shards of 64 tokens: documents and spans cross shard boundaries.
    let c = corpus(300, 64 * 4);
    for cfg in [
        ViewConfig::stream(17, 16, 4, 2, 1, 2),
        ViewConfig::stream(40, 3, 16, 1, 2, 1),
        docs_config(6, 4, 3, Some(999_999)),
        docs_config(13, 8, 1, None),
    ] {
        let view = View::open(&c.ds, &cfg).unwrap();
        let plan = view.plan().clone();
        for epoch in 0..plan.epochs() {
            for rank in 0..plan.ranks() {
                for step in 0..plan.steps_per_epoch() {
                    let key = StepKey { epoch, rank, step };
                    let len = view.step_json(key).unwrap().len() as u64;
                    assert_eq!(view.step_json_len(key).unwrap(), len, "{cfg:?} {key:?}");
                }
            }
        }
        // Through the filesystem: `stat` first (nothing cached), then the bytes.
        let fs = ShuffleFs::new(View::open(&c.ds, &cfg).unwrap()).unwrap();
        for step in [0, plan.steps_per_epoch() - 1] {
            let path = format!("epoch/0/rank/0/step/{step}.json");
            let size = fs.getattr(walk(&fs, &path).unwrap()).unwrap().size;
            assert_eq!(size, read_all(&fs, &path).len() as u64, "{cfg:?} {path}");
        }
    }
}

/// Sizes read without checksums never serve damaged bytes: the read of the file checks them.
/// Damage that makes the unchecked reads fail (an entry id out of range) falls back to the
/// checked reads, whose error names the file.
#[test]
fn a_damaged_document_file_fails_the_read_not_the_size() {
    let c = corpus(300, 64 * 4);
    let cfg = ViewConfig::stream(17, 16, 4, 2, 1, 1);
    let meta = shard_paths(&c.ds)[0].with_extension("meta");
    let ids = shard_paths(&c.ds)[0].with_extension("ids");
    let (meta_bytes, ids_bytes) = (fs::read(&meta).unwrap(), fs::read(&ids).unwrap());
    // The row of the first window is observation 0.
    let view = View::open(&c.ds, &cfg).unwrap();
    let key = (0..view.plan().steps_per_epoch())
        .flat_map(|step| {
            (0..2).map(move |rank| StepKey {
                epoch: 0,
                rank,
                step,
            })
        })
        .find(|&k| view.step_info(k).observations.contains(&0))
        .unwrap();
    let len = view.step_json_len(key).unwrap();
    // Same-size damage to the metadata text: the size is still measured, the read fails.
    let mut damaged = meta_bytes.clone();
    let at = damaged.iter().position(|&b| b == b'"').unwrap();
    damaged[at] = b'\'';
    fs::write(&meta, &damaged).unwrap();
    let view = View::open(&c.ds, &cfg).unwrap();
    assert_eq!(view.step_json_len(key).unwrap(), len);
    let err = view.step_json(key).unwrap_err().to_string();
    assert!(err.contains(".meta") && err.contains("checksum"), "{err}");
    fs::write(&meta, &meta_bytes).unwrap();
    // An entry id far out of range: the unchecked read is refused, the checked one names the
    // damage.
    let mut damaged = ids_bytes.clone();
    damaged[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    fs::write(&ids, &damaged).unwrap();
    let view = View::open(&c.ds, &cfg).unwrap();
    let err = view.step_json_len(key).unwrap_err().to_string();
    assert!(err.contains(".ids") && err.contains("checksum"), "{err}");
    assert!(view.step_json(key).is_err());
    fs::write(&ids, &ids_bytes).unwrap();
    assert_eq!(
        View::open(&c.ds, &cfg).unwrap().step_json_len(key).unwrap(),
        len
    );
}

#[test]
fn pack_starts_a_new_shard_before_entry_ids_overflow() {
    // At most 5 entries per shard (2^32 in real use): shards end early, documents and spans
    // continue in the next shard with their entries written again.
    let c = Corpus::with_entries(60, 1 << 20, Some(5));
    let m: Value = manifest(&c.ds);
    let shards = m["shards"].as_array().unwrap();
    assert!(shards.len() > 10, "{} shards", shards.len());
    for s in shards {
        assert!(s["docs"]["entries"].as_u64().unwrap() <= 5);
    }
    let fs =
        ShuffleFs::new(View::open(&c.ds, &ViewConfig::stream(7, 5, 2, 1, 3, 1)).unwrap()).unwrap();
    for step in 0..fs.view().plan().steps_per_epoch() {
        let j = json_at(&fs, &format!("epoch/0/rank/0/step/{step}.json"));
        for r in 0..2 {
            let first = j["token_starts"][r].as_u64().unwrap();
            check_spans(
                &j["rows"][r],
                first,
                7,
                &c.owners,
                &format!("step {step} row {r}"),
            );
        }
    }
    let docs = ShuffleFs::new(View::open(&c.ds, &docs_config(4, 2, 1, None)).unwrap()).unwrap();
    for d in 0..60u64 {
        let o = json_at(&docs, &format!("observation/{d}.json"));
        let (start, len, meta) = &c.docs[d as usize];
        assert_eq!(
            (o["token_start"].as_u64(), o["token_end"].as_u64()),
            (Some(*start), Some(start + len))
        );
        assert_eq!(&o["meta"], meta);
        check_spans(
            &o["spans"],
            *start,
            *len,
            &c.owners,
            &format!("document {d}"),
        );
    }
}

//! `--mode packed --bos ID`: the exact contract of packed rows, against a reference built from
//! the pack inputs. Every row of two epochs on three ranks: exactly `window` tokens, starting
//! with BOS, no padding; its pieces are whole documents (BOS prepended where the document does
//! not start with it) by non-increasing length, then at most one cropped prefix; no document
//! twice in an epoch. The same bytes from a fresh view in reversed order, from a resumed step,
//! through a real mount and after a remount.

use std::collections::HashSet;

use serde_json::Value;
use shufflefs::ScalarType;
use shufflefs::plan::StepKey;
use shufflefs::view::{Mode, View, ViewConfig};

use crate::common::*;

const BOS: u64 = 1;
const WINDOW: u64 = 64;

/// 3,000 documents of 1 to ~400 tokens (a heavy tail), every seventh starting with the BOS
/// already; tokens are `2 + (d * 31 + k) % 60000`, so no other token is the BOS.
fn corpus() -> (String, Vec<Vec<u64>>) {
    let mut docs = Vec::new();
    let mut text = String::new();
    let mut x = 12345u64;
    for d in 0..3000u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let u = (x >> 33) % 1000;
        let len = 1 + (u * u * u) / 2_500_000 + (x >> 20) % 24;
        let mut tokens: Vec<u64> = (0..len).map(|k| 2 + (d * 31 + k) % 60000).collect();
        if d % 7 == 0 {
            tokens[0] = BOS;
        }
        text.push_str(&format!("{{\"tokens\": {tokens:?}}}\n"));
        docs.push(tokens);
    }
    (text, docs)
}

fn packed_config(seed: u64) -> ViewConfig {
    ViewConfig {
        mode: Mode::Packed,
        bos: Some(BOS),
        pack_block_docs: Some(700),
        stride: None,
        ..config(WINDOW, WINDOW, 4, 3, seed, 2)
    }
}

fn u16s(npy: &[u8], n: usize) -> Vec<u64> {
    npy[npy.len() - 2 * n..]
        .chunks_exact(2)
        .map(|c| u64::from(u16::from_le_bytes([c[0], c[1]])))
        .collect()
}

fn keys(view: &View) -> Vec<StepKey> {
    let plan = view.plan();
    let mut out = Vec::new();
    for epoch in 0..plan.epochs() {
        for step in 0..plan.steps_per_epoch() {
            for rank in 0..plan.ranks() {
                out.push(StepKey { epoch, rank, step });
            }
        }
    }
    out
}

#[test]
fn packed_rows_keep_their_contract() {
    let (text, docs) = corpus();
    let data = Data::jsonl(&text, ScalarType::U16, 16 << 10, None);
    let view = data.view(&packed_config(7));
    let info: Value = serde_json::from_slice(view.info_json()).unwrap();
    let p = &info["packing"];
    assert_eq!(p["algorithm"], "bestfit-blocks-v1");
    assert_eq!(p["utilisation"], 1.0);
    assert_eq!(info["mode"], "packed");
    let batch = view.plan().batch_size() as usize;
    assert!(view.plan().steps_per_epoch() > 10, "{info}");

    let mut rendered = Vec::new();
    for epoch in 0..2 {
        let mut seen = HashSet::new();
        for key in keys(&view).into_iter().filter(|k| k.epoch == epoch) {
            let npy = view.render_step_npy(key).unwrap();
            let tokens = u16s(&npy, batch * WINDOW as usize);
            let json: Value = serde_json::from_slice(&view.step_json(key).unwrap()).unwrap();
            for (r, row) in tokens.chunks(WINDOW as usize).enumerate() {
                assert_eq!(row[0], BOS, "{key:?} row {r}: starts with BOS");
                let pieces = json["rows"][r].as_array().unwrap();
                let mut want: Vec<u64> = Vec::new();
                let mut last_whole = u64::MAX;
                for (i, piece) in pieces.iter().enumerate() {
                    let d = piece["doc"].as_u64().unwrap() as usize;
                    assert!(seen.insert(d), "epoch {epoch}: document {d} twice");
                    let (start, end) = (
                        piece["start"].as_u64().unwrap(),
                        piece["end"].as_u64().unwrap(),
                    );
                    assert_eq!(start, want.len() as u64, "pieces tile the row");
                    let bos = piece["bos"].as_bool().unwrap();
                    assert_eq!(bos, docs[d][0] != BOS, "BOS prepended iff missing");
                    let mut full: Vec<u64> = Vec::new();
                    if bos {
                        full.push(BOS);
                    }
                    full.extend(&docs[d]);
                    let len = end - start;
                    let cropped = piece["cropped"].as_bool().unwrap();
                    if cropped {
                        assert_eq!(i, pieces.len() - 1, "the crop is the row's last piece");
                        assert!(len < full.len() as u64);
                    } else {
                        assert_eq!(len, full.len() as u64, "a whole document");
                        assert!(
                            len <= last_whole,
                            "whole documents by non-increasing length"
                        );
                        last_whole = len;
                    }
                    want.extend(&full[..len as usize]);
                }
                assert_eq!(want.len() as u64, WINDOW, "exactly one window, no padding");
                assert_eq!(row, &want[..], "{key:?} row {r}");
            }
            rendered.push((key, npy));
        }
    }

    // A fresh view (a remount) in reversed order, and a resume at one step: the same bytes.
    let fresh = data.view(&packed_config(7));
    assert_eq!(fresh.fingerprint(), view.fingerprint());
    for (key, npy) in rendered.iter().rev() {
        assert_eq!(&fresh.render_step_npy(*key).unwrap(), npy, "{key:?}");
    }
    // Resume: a fresh view whose first read is a random step (of either epoch).
    let mut rng = Rng::new(7);
    for _ in 0..4 {
        let (key, npy) = &rendered[rng.index(rendered.len())];
        assert_eq!(
            &data.view(&packed_config(7)).render_step_npy(*key).unwrap(),
            npy,
            "resumed at {key:?}"
        );
    }

    // Through a real mount: byte ranges and whole files.
    if fuse_available() {
        let mount = TestMount::new(data.fs(&packed_config(7)));
        for (key, npy) in rendered.iter().step_by(5) {
            let path = mount.step(key.epoch, key.rank, key.step, "npy");
            assert_eq!(&std::fs::read(&path).unwrap(), npy, "{key:?}");
            let json = std::fs::read(mount.step(key.epoch, key.rank, key.step, "json")).unwrap();
            assert_eq!(json, view.step_json(*key).unwrap());
        }
        assert!(
            std::fs::read_dir(mount.path().join("observation"))
                .unwrap()
                .next()
                .is_none()
        );
        drop(mount);
        // A remount, read in reversed order: the same bytes.
        let mount = TestMount::new(data.fs(&packed_config(7)));
        for (key, npy) in rendered.iter().rev().step_by(3) {
            let path = mount.step(key.epoch, key.rank, key.step, "npy");
            assert_eq!(&std::fs::read(&path).unwrap(), npy, "remounted: {key:?}");
        }
    }

    // The packing is part of the identity; epochs differ.
    let other = data.view(&ViewConfig {
        bos: Some(2),
        ..packed_config(7)
    });
    assert_ne!(other.fingerprint(), view.fingerprint());
    let stream = data.view(&config(WINDOW, WINDOW, 4, 3, 7, 2));
    assert_ne!(stream.fingerprint(), view.fingerprint());
    assert_ne!(rendered[0].1, rendered[rendered.len() / 2 + 1].1);
}

#[test]
fn packed_mode_refuses_what_it_cannot_serve() {
    let data = Data::positional(10_000, 1 << 20);
    let e = View::open(&data.path(), &packed_config(1))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--mode packed needs a dataset with documents"),
        "{e}"
    );
    let (text, _) = corpus();
    let docs = Data::jsonl(&text, ScalarType::U16, 16 << 10, None);
    let no_bos = ViewConfig {
        bos: None,
        ..packed_config(1)
    };
    let e = View::open(&docs.path(), &no_bos).unwrap_err().to_string();
    assert!(e.contains("--mode packed needs --bos"), "{e}");
    let bos_in_stream = ViewConfig {
        bos: Some(1),
        ..config(WINDOW, WINDOW, 4, 3, 1, 1)
    };
    let e = View::open(&docs.path(), &bos_in_stream)
        .unwrap_err()
        .to_string();
    assert!(e.contains("only apply to --mode packed"), "{e}");
    let big_bos = ViewConfig {
        bos: Some(70_000),
        ..packed_config(1)
    };
    let e = View::open(&docs.path(), &big_bos).unwrap_err().to_string();
    assert!(e.contains("--bos 70000 is not a u16 value"), "{e}");
}

#[test]
fn every_range_of_a_packed_step_file_is_its_bytes() {
    let (text, _) = corpus();
    let data = Data::jsonl(&text, ScalarType::U16, 1 << 12, None);
    let view = data.view(&packed_config(3));
    let key = keys(&view)[1];
    let whole = view.render_step_npy(key).unwrap();
    let header = view.info().npy_header_bytes as usize;
    // Every range starting in the header or the first rows, of sizes from 1 byte (numpy's
    // first read of a file is 6 bytes) to past the end.
    for offset in (0..header + 70).chain([whole.len() - 3, whole.len()]) {
        for size in [
            1usize,
            6,
            10,
            header - 1,
            header,
            header + 1,
            333,
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

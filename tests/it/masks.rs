//! `S.pos.npy` and `S.doclens.npy` (docs/SEMANTICS.md, masking arrays): for every row of every
//! step, each token's position in its document and the row's document lengths, against a
//! reference computed from the pack inputs, in stream mode (rows starting mid-document
//! continue their document's positions; also with `--rewindow`), documents mode (padding is
//! one more segment) and packed mode (a prepended BOS is position 0), through a real mount.

use serde_json::Value;
use shufflefs::ScalarType;
use shufflefs::plan::StepKey;
use shufflefs::view::{Mode, ViewConfig};

use crate::common::*;

/// 400 documents of 1 to 60 tokens (the first token of each is 1, the BOS).
fn corpus() -> (String, Vec<u64>) {
    let mut text = String::new();
    let mut starts = Vec::new();
    let mut at = 0u64;
    for d in 0..400u64 {
        let len = 1 + (d * 37 + d * d) % 60;
        let tokens: Vec<u64> = (0..len).map(|k| if k == 0 { 1 } else { 2 + d }).collect();
        text.push_str(&format!("{{\"tokens\": {tokens:?}}}\n"));
        starts.push(at);
        at += len;
    }
    starts.push(at);
    (text, starts)
}

fn ints(npy: &[u8], n: usize, size: usize) -> Vec<u64> {
    npy[npy.len() - n * size..]
        .chunks_exact(size)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..size].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect()
}

/// Checks every step's masks through `mount` against `segments(json, row)`: the row's
/// `(length, first position)` runs.
fn check(
    mount: &TestMount,
    cfg: &ViewConfig,
    steps: u64,
    pos_size: usize,
    segments: impl Fn(&Value, usize) -> Vec<(u64, u64)>,
) {
    let (b, w) = (cfg.batch_size as usize, cfg.window as usize);
    for epoch in 0..cfg.epochs {
        for rank in 0..cfg.ranks {
            for step in 0..steps {
                let path = |ext| mount.step(epoch, rank, step, ext);
                let json: Value =
                    serde_json::from_slice(&std::fs::read(path("json")).unwrap()).unwrap();
                let pos = ints(&std::fs::read(path("pos.npy")).unwrap(), b * w, pos_size);
                let lens = ints(&std::fs::read(path("doclens.npy")).unwrap(), b * w, 4);
                for r in 0..b {
                    let segs = segments(&json, r);
                    let mut want_pos = Vec::new();
                    let mut want_lens = Vec::new();
                    for &(len, first) in &segs {
                        want_pos.extend(first..first + len);
                        want_lens.push(len);
                    }
                    want_lens.resize(w, 0);
                    let key = StepKey { epoch, rank, step };
                    assert_eq!(&pos[r * w..(r + 1) * w], &want_pos[..], "{key:?} row {r}");
                    assert_eq!(&lens[r * w..(r + 1) * w], &want_lens[..], "{key:?} row {r}");
                }
            }
        }
    }
}

/// The `(length, first position)` runs of the stream window of `window` tokens at `start`,
/// from the documents' first tokens `starts` (and the end).
fn stream_segments(starts: &[u64], start: u64, window: u64) -> Vec<(u64, u64)> {
    let doc_of = |t: u64| starts.partition_point(|&s| s <= t) - 1;
    let mut segs: Vec<(u64, u64)> = Vec::new();
    for t in start..start + window {
        let d = doc_of(t);
        match segs.last_mut() {
            Some(s) if t > start && doc_of(t - 1) == d => s.0 += 1,
            _ => segs.push((1, t - starts[d])),
        }
    }
    segs
}

#[test]
fn masks_follow_the_documents_in_every_mode() {
    if !fuse_available() {
        return;
    }
    let (text, starts) = corpus();
    let data = Data::jsonl(&text, ScalarType::U16, 4 << 10, None);

    // Stream: windows cross documents and start inside them; with --rewindow at each
    // epoch's phase.
    for rewindow in [false, true] {
        let cfg = ViewConfig {
            rewindow,
            ..config(50, 37, 3, 2, 5, 2)
        };
        let fs = data.fs(&cfg);
        let steps = fs.view().plan().steps_per_epoch();
        let mount = TestMount::new(fs);
        check(&mount, &cfg, steps, 4, |json, r| {
            stream_segments(&starts, json["token_starts"][r].as_u64().unwrap(), 50)
        });
    }

    // Documents mode, positions as int64 with --out-dtype i64.
    let cfg = ViewConfig {
        mode: Mode::Documents,
        stride: None,
        out_dtype: Some(ScalarType::I64),
        ..config(40, 40, 4, 2, 5, 1)
    };
    let fs = data.fs(&cfg);
    let steps = fs.view().plan().steps_per_epoch();
    let mount = TestMount::new(fs);
    check(&mount, &cfg, steps, 8, |json, r| {
        let d = json["observations"][r].as_u64().unwrap() as usize;
        let used = (starts[d + 1] - starts[d]).min(40);
        let mut segs = vec![(used, 0)];
        if used < 40 {
            segs.push((40 - used, 0));
        }
        segs
    });
    drop(mount);

    // Packed: one segment per piece.
    let cfg = ViewConfig {
        mode: Mode::Packed,
        bos: Some(1),
        stride: None,
        ..config(64, 64, 2, 2, 5, 2)
    };
    let fs = data.fs(&cfg);
    let steps = fs.view().plan().steps_per_epoch();
    let mount = TestMount::new(fs);
    check(&mount, &cfg, steps, 4, |json, r| {
        json["rows"][r]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["end"].as_u64().unwrap() - p["start"].as_u64().unwrap(), 0))
            .collect()
    });
    let listing: Vec<String> = std::fs::read_dir(mount.path().join("epoch/0/rank/0/step"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(listing.len() as u64, 4 * steps);
    assert!(listing.contains(&"0.pos.npy".to_string()));
}

#[test]
fn a_dataset_without_documents_has_no_masks() {
    let data = Data::positional(10_000, 1 << 20);
    let fs = data.fs(&config(10, 10, 2, 1, 1, 1));
    assert!(read_path(&fs, "/epoch/0/rank/0/step/0.npy").is_ok());
    assert!(read_path(&fs, "/epoch/0/rank/0/step/0.pos.npy").is_err());
    assert!(read_path(&fs, "/epoch/0/rank/0/step/0.doclens.npy").is_err());
}

/// Documents of 1 to ~3,000 tokens, `n_tokens` in all (u16 token `1 + d % 60000`).
fn long_corpus(n_tokens: u64) -> (String, Vec<u64>) {
    let mut text = String::new();
    let mut starts = Vec::new();
    let (mut at, mut d) = (0u64, 0u64);
    while at < n_tokens {
        let len = (1 + (d * 7919) % 3000).min(n_tokens - at);
        let token = 1 + d % 60000;
        text.push_str(&format!(
            "{{\"tokens\": {:?}}}\n",
            vec![token; len as usize]
        ));
        starts.push(at);
        at += len;
        d += 1;
    }
    starts.push(at);
    (text, starts)
}

#[test]
fn masks_larger_than_the_json_cache_are_served_range_by_range() {
    // 64 rows of 4,200 tokens: S.pos.npy in int64 is 2.1 MB, S.doclens.npy 1.1 MB, both past
    // the 1 MiB a cached file may have, so reads render only the rows they touch.
    let (b, w) = (64u64, 4200u64);
    let (text, starts) = long_corpus(2 * b * w + 999);
    let data = Data::jsonl(&text, ScalarType::U16, 256 << 10, None);
    let cfg = ViewConfig {
        out_dtype: Some(ScalarType::I64),
        ..config(w, w - 3, b, 1, 11, 1)
    };
    let fs = data.fs(&cfg);
    let steps = fs.view().plan().steps_per_epoch();
    assert!(steps >= 2);
    for step in 0..steps {
        let dir = format!("/epoch/0/rank/0/step/{step}");
        let json: Value = serde_json::from_slice(&read_all(&fs, &format!("{dir}.json"))).unwrap();
        let mut want_pos = Vec::new();
        let mut want_lens = Vec::new();
        for r in 0..b as usize {
            let start = json["token_starts"][r].as_u64().unwrap();
            let segs = stream_segments(&starts, start, w);
            for &(len, first) in &segs {
                want_pos.extend(first..first + len);
            }
            want_lens.extend(segs.iter().map(|s| s.0));
            want_lens.resize((r + 1) * w as usize, 0);
        }
        for (ext, size, want) in [("pos.npy", 8, &want_pos), ("doclens.npy", 4, &want_lens)] {
            let path = format!("{dir}.{ext}");
            // One read of the whole file (its size is getattr's), then odd ranges.
            let whole = read_all(&fs, &path);
            assert!(whole.len() > 1 << 20, "{path}: {} bytes", whole.len());
            assert_eq!(&ints(&whole, (b * w) as usize, size), want, "{path}");
            let ino = walk(&fs, &path).unwrap();
            let mut at = 0;
            let mut chunk = 1;
            while at < whole.len() {
                let got = read_at(&fs, ino, at as u64, chunk).unwrap();
                let end = (at + chunk as usize).min(whole.len());
                assert_eq!(got, &whole[at..end], "{path} at {at} (+{chunk})");
                at = end;
                chunk = chunk * 3 + 7;
            }
            assert!(
                read_at(&fs, ino, whole.len() as u64, 10)
                    .unwrap()
                    .is_empty()
            );
        }
    }
}

//! `S.json`'s `files`: for every row, the pieces of shard files holding its records. Each
//! piece read straight from the file it names, at its offset, must be that part of the row in
//! `S.npy` (copied shards, rows across shard boundaries, documents mode, an in-place llm.c
//! file whose tokens start 1,024 bytes in).

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

use shufflefs::dtype::ScalarType;
use shufflefs::fs::ShuffleFs;
use shufflefs::view::{Mode, View, ViewConfig};

use crate::common::*;

/// Checks every row of every step of epoch 0 on every rank against its sources.
fn check_sources(fs: &ShuffleFs, dataset: &Path) -> usize {
    let info = fs.view().info().clone();
    let (itemsize, header) = (info.itemsize as usize, info.npy_header_bytes as usize);
    let row_bytes = info.window as usize * itemsize;
    let mut pieces_seen = 0;
    for r in 0..info.ranks {
        for st in 0..info.steps_per_epoch {
            let npy = read_all(fs, &format!("epoch/0/rank/{r}/step/{st}.npy"));
            let json = json_at(fs, &format!("epoch/0/rank/{r}/step/{st}.json"));
            let rows = json["files"].as_array().unwrap();
            assert_eq!(rows.len() as u64, info.batch_size);
            for (j, pieces) in rows.iter().enumerate() {
                let row = &npy[header + j * row_bytes..][..row_bytes];
                let mut at = 0usize;
                for p in pieces.as_array().unwrap() {
                    let file = Path::new(p["file"].as_str().unwrap());
                    let file = if file.is_absolute() {
                        file.to_path_buf()
                    } else {
                        dataset.join(file)
                    };
                    let n = p["records"].as_u64().unwrap() as usize * itemsize;
                    let mut got = vec![0u8; n];
                    fs::File::open(&file)
                        .unwrap()
                        .read_exact_at(&mut got, p["offset"].as_u64().unwrap())
                        .unwrap();
                    assert_eq!(got, row[at..at + n], "rank {r} step {st} row {j}: {p}");
                    at += n;
                    pieces_seen += 1;
                }
                // Stream rows are covered whole; document rows up to their length.
                let real = match json.get("lengths") {
                    Some(l) => l[j].as_u64().unwrap() as usize * itemsize,
                    None => row_bytes,
                };
                assert_eq!(at, real, "rank {r} step {st} row {j}");
            }
        }
    }
    pieces_seen
}

#[test]
fn sources_name_the_bytes_of_every_row() {
    // 4 KiB shards of u32: windows of 300 records cross shard boundaries.
    let data = Data::positional(60_000, 4 << 10);
    let fs = data.fs(&config(300, 250, 4, 2, 11, 1));
    let pieces = check_sources(&fs, &data.path());
    let rows = 2 * fs.view().info().steps_per_epoch * 4;
    assert!(pieces as u64 > rows, "some rows span two shards");
}

#[test]
fn sources_of_documents_rows_cover_their_real_records() {
    let mut text = String::new();
    for d in 0..60u64 {
        let tokens: Vec<u64> = (0..1 + d % 17).map(|k| d * 100 + k).collect();
        text.push_str(&format!("{{\"tokens\": {tokens:?}}}\n"));
    }
    let data = Data::jsonl(&text, ScalarType::U16, 64, None);
    let fs = data.fs(&ViewConfig {
        mode: Mode::Documents,
        stride: None,
        ..config(12, 12, 3, 2, 4, 1)
    });
    check_sources(&fs, &data.path());
}

#[test]
fn sources_of_an_in_place_llmc_file_include_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("fineweb_train_000001.bin");
    let tokens: Vec<u16> = (0..20_000u32).map(|i| (i * 7 % 50_257) as u16).collect();
    let mut header = [0i32; 256];
    header[..3].copy_from_slice(&[20240520, 1, tokens.len() as i32]);
    let mut bytes: Vec<u8> = header.iter().flat_map(|h| h.to_le_bytes()).collect();
    bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
    fs::write(&input, bytes).unwrap();
    let ds = dir.path().join("ds");
    shufflefs_ok(&["pack", s(&ds), s(&input), "--in-place", "--no-progress"]);
    let view = View::open(&ds, &config(129, 128, 4, 2, 5, 1)).unwrap();
    let fs = ShuffleFs::new(view).unwrap();
    check_sources(&fs, &ds);
    let first = json_at(&fs, "epoch/0/rank/0/step/0.json");
    let offset = first["files"][0][0]["offset"].as_u64().unwrap();
    assert!(
        offset >= 1024 && (offset - 1024).is_multiple_of(2),
        "{first}"
    );
}

//! Block checksums: `pack` writes them, `shufflefs verify` checks every byte (and adds
//! checksums to an in-place dataset), and `--verify-reads` refuses to serve a block that
//! changed after packing, while `--verify-reads` off serves exactly the same bytes otherwise.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Output;

use shufflefs::dataset::Dataset;
use shufflefs::fs::ShuffleFs;
use shufflefs::view::View;

use crate::common::*;

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every step file of epoch 0, read through the model (no FUSE).
fn all_steps(fs: &ShuffleFs) -> Vec<Result<Vec<u8>, String>> {
    let plan = fs.view().plan().clone();
    (0..plan.steps_per_epoch())
        .map(|step| {
            let key = shufflefs::plan::StepKey {
                epoch: 0,
                rank: 0,
                step,
            };
            fs.view().render_step_npy(key).map_err(|e| e.to_string())
        })
        .collect()
}

#[test]
fn verify_passes_then_finds_the_changed_block() {
    // A copied dataset of positional u32 tokens in 256 KiB shards (4 checksum blocks each).
    let data = Data::positional(300_000, 256 << 10);
    let ds = data.path();
    let manifest: serde_json::Value = manifest(&ds);
    // Version 4: the oldest that expresses a dataset without compact documents.
    assert_eq!(manifest["version"], 4);
    for s in manifest["shards"].as_array().unwrap() {
        let file = s["checksums"]["file"].as_str().unwrap();
        let bytes = s["bytes"].as_u64().unwrap();
        assert_eq!(
            fs::metadata(ds.join(file)).unwrap().len(),
            bytes.div_ceil(65536) * 8
        );
    }
    let o = shufflefs(&["verify", ds.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("0 problem(s)"), "{}", text(&o));

    // One byte of shard 1, in its second block, changes (same size, so a mount still opens).
    let shard = shard_paths(&ds)[1].clone();
    let f = fs::OpenOptions::new().write(true).open(&shard).unwrap();
    f.write_at(&[0xFF], 65_536 + 1000).unwrap();
    drop(f);
    let o = shufflefs(&["verify", ds.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains(shard.file_name().unwrap().to_str().unwrap()),
        "{out}"
    );
    assert!(
        out.contains("1 of 4 blocks fail their checksum (bytes 65536..131072)"),
        "{out}"
    );
    assert!(out.contains("content hash"), "{out}");
}

#[test]
fn verified_reads_refuse_changed_blocks_and_serve_the_rest_unchanged() {
    // A copied dataset of positional u32 tokens in 256 KiB shards (4 checksum blocks each).
    let data = Data::positional(300_000, 256 << 10);
    let ds = data.path();
    let cfg = config(100, 100, 8, 1, 3, 1);
    let plain = ShuffleFs::new(View::new(Dataset::open(&ds).unwrap(), &cfg).unwrap()).unwrap();
    let before = all_steps(&plain);
    let verified = |ds: &Path| {
        let dataset = Dataset::open(ds).unwrap().with_verified_reads().unwrap();
        ShuffleFs::new(View::new(dataset, &cfg).unwrap()).unwrap()
    };
    assert_eq!(
        all_steps(&verified(&ds)),
        before,
        "same bytes with verification on"
    );

    let shard = shard_paths(&ds)[2].clone();
    let f = fs::OpenOptions::new().write(true).open(&shard).unwrap();
    f.write_at(&[0xAB; 3], 3 * 65_536 + 5).unwrap();
    drop(f);
    let after_plain = all_steps(&plain);
    let after = all_steps(&verified(&ds));
    let (mut failed, mut same) = (0, 0);
    for ((b, p), v) in before.iter().zip(&after_plain).zip(&after) {
        let b = b.as_ref().unwrap();
        match v {
            Ok(bytes) => {
                assert_eq!(bytes, b, "a verified read served changed bytes");
                same += 1;
            }
            Err(e) => {
                assert!(e.contains("fail their checksum"), "{e}");
                assert!(
                    e.contains(shard.file_name().unwrap().to_str().unwrap()),
                    "{e}"
                );
                // Only steps whose bytes did change (seen without verification) may fail:
                // a failure elsewhere would be a false alarm.
                failed += 1;
                assert!(p.as_ref().unwrap() != b || e.contains("block 3"), "{e}");
            }
        }
    }
    assert!(failed > 0 && same > failed, "failed {failed}, same {same}");
}

#[test]
fn in_place_datasets_get_checksums_from_verify() {
    let tmp = tempfile::tempdir().unwrap();
    let raw = tmp.path().join("t.bin");
    shufflefs::pack::write_positional(&raw, shufflefs::dtype::ScalarType::U16, 200_000).unwrap();
    let ds = tmp.path().join("ip");
    let o = shufflefs(&[
        "pack",
        ds.to_str().unwrap(),
        raw.to_str().unwrap(),
        "--dtype",
        "u16",
        "--in-place",
        "--no-progress",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let err = Dataset::open(&ds)
        .unwrap()
        .with_verified_reads()
        .unwrap_err();
    assert!(err.to_string().contains("--write-checksums"), "{err}");
    let cfg = config(64, 64, 4, 1, 1, 1);
    let before =
        all_steps(&ShuffleFs::new(View::new(Dataset::open(&ds).unwrap(), &cfg).unwrap()).unwrap());
    let fp_before = View::new(Dataset::open(&ds).unwrap(), &cfg)
        .unwrap()
        .info()
        .fingerprint
        .clone();

    let o = shufflefs(&["verify", ds.to_str().unwrap(), "--write-checksums"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("1 checksum file(s) written"),
        "{}",
        text(&o)
    );
    let dataset = Dataset::open(&ds).unwrap().with_verified_reads().unwrap();
    let view = View::new(dataset, &cfg).unwrap();
    assert_ne!(
        view.info().fingerprint.clone(),
        fp_before,
        "checksums are part of the identity"
    );
    assert_eq!(all_steps(&ShuffleFs::new(view).unwrap()), before);
    // A second run finds every block checked and writes nothing.
    let o = shufflefs(&[
        "verify",
        ds.to_str().unwrap(),
        "--write-checksums",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["checksums_written"], 0);
    assert_eq!(report["blocks_checked"], 400_000u64.div_ceil(65_536));
}

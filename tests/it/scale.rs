//! In-place datasets and scale: nothing at mount grows with the dataset, and no listing
//! grows with it either.

use std::fs;

use shufflefs::dtype::ScalarType;
use shufflefs::fs::ShuffleFs;
use shufflefs::pack::{PackOptions, pack_in_place, write_positional};
use shufflefs::plan::StepKey;
use shufflefs::view::View;

use crate::common::*;

fn in_place_options() -> PackOptions {
    PackOptions {
        dtype: Some(ScalarType::U32),
        ..PackOptions::default()
    }
}

#[test]
fn in_place_dataset_serves_the_same_bytes_as_a_packed_one() {
    let packed = Data::positional(30_000, 8192);
    let dir = tempfile::tempdir().unwrap();
    // The same stream as two raw files referenced in place.
    let a = dir.path().join("a.bin");
    let b = dir.path().join("b.bin");
    write_positional(&a, ScalarType::U32, 30_000).unwrap();
    let all = fs::read(&a).unwrap();
    fs::write(&a, &all[..50_000]).unwrap();
    fs::write(&b, &all[50_000..]).unwrap();
    let ds = dir.path().join("ds");
    let m = pack_in_place(&ds, &[a.clone(), b.clone()], &in_place_options()).unwrap();
    assert_eq!(m.records, 30_000);
    assert_eq!(
        fs::read_dir(&ds).unwrap().count(),
        1,
        "only the manifest is written"
    );
    let cfg = config(33, 32, 4, 3, 8, 2);
    let reference = packed.fs(&cfg);
    let in_place = ShuffleFs::new(View::open(&ds, &cfg).unwrap()).unwrap();
    let plan = reference.view().plan().clone();
    for epoch in 0..2 {
        for rank in 0..3 {
            for step in 0..plan.steps_per_epoch() {
                let key = StepKey { epoch, rank, step };
                assert_eq!(
                    in_place.view().render_step_npy(key).unwrap(),
                    reference.view().render_step_npy(key).unwrap()
                );
            }
        }
    }
    // A referenced file that changes afterwards is refused, naming it.
    fs::write(&b, &all[50_000..all.len() - 4]).unwrap();
    let err = View::open(&ds, &cfg).unwrap_err().to_string();
    assert!(err.contains("b.bin"), "{err}");
    // Replacing an in-place dataset never deletes the referenced files.
    fs::write(&b, &all[50_000..]).unwrap();
    let force = PackOptions {
        force: true,
        ..in_place_options()
    };
    shufflefs::pack::pack(&ds, std::slice::from_ref(&a), &force).unwrap();
    assert!(a.exists() && b.exists());
    // In-place inputs get the checks of a copy (an .npy of another dtype is refused).
    let npy =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokens_u2_1d.npy");
    let err = pack_in_place(&dir.path().join("x"), &[npy], &in_place_options()).unwrap_err();
    assert!(
        err.to_string()
            .contains("array dtype is u16 (<u2) but the dataset's records are <u4"),
        "{err}"
    );
}

#[test]
fn a_4_tib_sparse_dataset_mounts_and_serves_step_0() {
    // Four sparse 1 TiB files: 1.1 T u32 tokens. Nothing at mount reads or indexes them.
    let dir = tempfile::tempdir().unwrap();
    let mut inputs = Vec::new();
    for i in 0..4 {
        let p = dir.path().join(format!("part{i}.bin"));
        let f = fs::File::create(&p).unwrap();
        if f.set_len(1 << 40).is_err() {
            eprintln!("skipped: this filesystem has no sparse 1 TiB files");
            return;
        }
        inputs.push(p);
    }
    // Make the first window of each part recognisable.
    for (i, p) in inputs.iter().enumerate() {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(p).unwrap();
        f.write_all_at(&(i as u32 + 1).to_le_bytes(), 0).unwrap();
    }
    let ds = dir.path().join("ds");
    let m = pack_in_place(&ds, &inputs, &in_place_options()).unwrap();
    assert_eq!(m.records, 1 << 40);
    let cfg = config(2049, 2048, 32, 64, 1, 2);
    let fs = ShuffleFs::new(View::open(&ds, &cfg).unwrap()).unwrap();
    let info = fs.view().info().clone();
    assert_eq!(info.n_tokens, 1 << 40);
    assert_eq!(info.n_observations, ((1u64 << 40) - 2049) / 2048 + 1);
    let key = StepKey {
        epoch: 1,
        rank: 63,
        step: info.steps_per_epoch - 1,
    };
    let bytes = fs.view().render_step_npy(key).unwrap();
    assert_eq!(bytes.len() as u64, info.step_file_bytes);
    // The observation starting at a part boundary shows that part's marker.
    let first_of_part2 = (2u64 << 40) / 4 / 2048; // observation whose window starts part 2
    let placement = fs.view().plan().locate(0, first_of_part2).unwrap();
    let key = StepKey {
        epoch: 0,
        rank: placement.rank,
        step: placement.step,
    };
    let bytes = fs.view().render_step_npy(key).unwrap();
    let row = (info.npy_header_bytes + placement.row * 2049 * 4) as usize;
    assert_eq!(&bytes[row..row + 4], &3u32.to_le_bytes());
    if fuse_available() {
        let m = TestMount::new(fs);
        let got = fs::read(m.step(0, placement.rank, placement.step, "npy")).unwrap();
        assert_eq!(got, bytes);
        m.unmount();
    }
}

/// Every path under `root`, `root` included, as `find ROOT` prints them (a directory's type
/// comes from the listing, as `find` takes it; nothing is opened or read).
fn find(root: &std::path::Path) -> u64 {
    let mut count = 1;
    for entry in fs::read_dir(root).unwrap() {
        let entry = entry.unwrap();
        count += if entry.file_type().unwrap().is_dir() {
            find(&entry.path())
        } else {
            1
        };
    }
    count
}

#[test]
fn a_4_tib_sparse_dataset_lists_a_bounded_tree() {
    // Four sparse 1 TiB files of u16 tokens (2^41 tokens) with window 2049 and batch 8:
    // 1.07 G observations and 134 M steps, so observation/ holds 2.15 G names and the step
    // directory 268 M. `find`, `ls -R` and `du` of such a mount used to run for hours and `ls`
    // of one step directory ran out of memory; every listing now shows at most 10,000 names
    // (no timing is asserted: the count is the bound), and every name still resolves.
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut inputs = Vec::new();
    for i in 0..4 {
        let p = dir.path().join(format!("part{i}.bin"));
        let f = fs::File::create(&p).unwrap();
        if f.set_len(1 << 40).is_err() {
            eprintln!("skipped: this filesystem has no sparse 1 TiB files");
            return;
        }
        inputs.push(p);
    }
    let ds = dir.path().join("ds");
    let options = PackOptions {
        dtype: Some(ScalarType::U16),
        ..PackOptions::default()
    };
    pack_in_place(&ds, &inputs, &options).unwrap();
    let cfg = config(2049, 2049, 8, 1, 0, 1);
    let fs = ShuffleFs::new(View::open(&ds, &cfg).unwrap()).unwrap();
    let n_obs = ((1u64 << 41) - 2049) / 2049 + 1;
    let steps = n_obs / 8;
    let info = fs.view().info().clone();
    assert_eq!((info.n_observations, info.steps_per_epoch), (n_obs, steps));
    let truncated: Vec<(&str, u64, u64)> = info
        .truncated_listings
        .iter()
        .map(|t| (t.dir, t.names, t.listed))
        .collect();
    assert_eq!(
        truncated,
        [
            ("epoch/E/rank/R/step", 2 * steps, 10_000),
            ("observation", 2 * n_obs, 10_000),
            ("lookup/epoch/E/observation", n_obs, 10_000),
        ]
    );
    let m = TestMount::new(fs);
    let root = m.path();
    // The root, its 5 names, epoch/0/rank/0/step (4 paths) and lookup/epoch/0/observation
    // (3 paths), and 10,000 names in each of the three large directories.
    let want = 1 + 5 + 4 + 3 + 3 * 10_000;
    assert_eq!(find(root), want);
    if let Ok(o) = std::process::Command::new("find").arg(root).output() {
        assert!(o.status.success());
        assert_eq!(
            o.stdout.iter().filter(|&&b| b == b'\n').count() as u64,
            want
        );
    }
    let step_dir = root.join("epoch/0/rank/0/step");
    let listed: Vec<String> = fs::read_dir(&step_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(listed.len(), 10_000);
    assert_eq!(listed[..3], ["0.npy", "0.json", "1.npy"]);
    assert_eq!(listed[9_999], "4999.json");
    // Names beyond the bound resolve, and serve their bytes.
    let last = step_dir.join(format!("{}.npy", steps - 1));
    assert_eq!(fs::metadata(&last).unwrap().len(), info.step_file_bytes);
    assert_eq!(fs::read(&last).unwrap().len() as u64, info.step_file_bytes);
    let obs: serde_json::Value = serde_json::from_slice(
        &fs::read(root.join(format!("observation/{}.json", n_obs - 1))).unwrap(),
    )
    .unwrap();
    assert_eq!(obs["token_start"], (n_obs - 1) * 2049);
    assert!(
        fs::metadata(root.join(format!("lookup/epoch/0/observation/{}.json", n_obs - 1))).is_ok()
    );
    assert!(fs::metadata(step_dir.join(format!("{steps}.npy"))).is_err());
    m.unmount();
}

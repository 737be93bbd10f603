//! Bounded descriptors (`--max-open-shards`): a dataset with more files than the bound is read
//! byte-exact with at most that many of its files open, and a shard replaced under the mount
//! is never served (ESTALE, or its old bytes while its descriptor is still open).

use std::fs;
use std::path::Path;

use shufflefs::dataset::Dataset;
use shufflefs::fs::ShuffleFs;
use shufflefs::plan::StepKey;
use shufflefs::view::View;

use crate::common::*;

/// Descriptors of this process open on files in `dir`.
fn open_in(dir: &Path) -> usize {
    let dir = dir.canonicalize().unwrap();
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(&dir))
        .count()
}

#[test]
fn at_most_max_open_files_and_replaced_shards_are_never_served() {
    if !fuse_available() {
        return;
    }
    // 16 shards of 4 KiB (+ 16 checksum files): 32 files, at most 5 open.
    let data = Positional::new(16 * 1024, 4096);
    let cfg = config(100, 100, 4, 1, 9, 1);
    // The expected files, computed first: the reference keeps every file open.
    let reference = data.fs(&cfg);
    let steps = reference.view().plan().steps_per_epoch();
    let expected: Vec<Vec<u8>> = (0..steps)
        .map(|step| {
            let key = StepKey {
                epoch: 0,
                rank: 0,
                step,
            };
            reference.view().render_step_npy(key).unwrap()
        })
        .collect();
    drop(reference);
    let want = |step: u64| expected[step as usize].clone();
    let dataset = Dataset::open_bounded(&data.path(), 5).unwrap();
    let fs_ = ShuffleFs::new(View::new(dataset, &cfg).unwrap()).unwrap();
    assert!(
        open_in(&data.path()) <= 5,
        "{} open at mount",
        open_in(&data.path())
    );
    let m = TestMount::new(fs_);
    for _ in 0..2 {
        for step in 0..steps {
            assert_eq!(fs::read(m.step(0, 0, step, "npy")).unwrap(), want(step));
            assert!(open_in(&data.path()) <= 5, "{} open", open_in(&data.path()));
        }
    }
    // Shard 7 is replaced by a file of the same size with other bytes.
    let shard = shard_paths(&data.path())[7].clone();
    let tmp = shard.with_extension("new");
    fs::write(
        &tmp,
        vec![0xEEu8; fs::metadata(&shard).unwrap().len() as usize],
    )
    .unwrap();
    fs::rename(&tmp, &shard).unwrap();
    let (mut stale, mut same) = (0, 0);
    for _ in 0..2 {
        for step in 0..steps {
            match fs::read(m.step(0, 0, step, "npy")) {
                Ok(bytes) => {
                    assert_eq!(bytes, want(step), "step {step}: never the new bytes");
                    same += 1;
                }
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "step {step}: {e}");
                    stale += 1;
                }
            }
        }
    }
    assert!(stale > 0 && same > 0, "stale {stale}, same {same}");
    m.unmount();
}

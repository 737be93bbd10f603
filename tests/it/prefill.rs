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
    // Rank 0 read in order across both epochs. Step 0 is read from the shards (nothing is
    // stored yet) and starts the prefetcher; from then on, before step s is read the daemon
    // has stored steps 1 ..= s + 1, and reading s from the page cache (no READ reaches the
    // daemon) moves the window one step on.
    let order: Vec<(u64, u64)> = (0..2)
        .flat_map(|e| (0..steps).map(move |s| (e, s)))
        .collect();
    let last = order.len() as u64 - 1;
    let drop_at = order.len() as u64 * 3 / 4;
    let mut dropped = false;
    for (i, &(epoch, step)) in order.iter().enumerate() {
        let i = i as u64;
        if i > 0 && !dropped {
            let stored = (i + 1).min(last);
            wait_for(&format!("{stored} steps stored"), || {
                prefill_counter(m, "stored") == stored
            });
        }
        if i == drop_at {
            // The kernel drops every stored page (and may FORGET the inodes): reads fall back
            // to the daemon and stay byte-exact; counters are no longer predictable.
            dropped = drop_caches();
        }
        assert_eq!(
            fs::read(path(epoch, 0, step)).unwrap(),
            want(epoch, 0, step),
            "epoch {epoch} step {step}"
        );
        if i > 0 && !dropped {
            // RELEASE reaches the daemon after close() returns: wait for it.
            wait_for(&format!("step {i} served by the kernel"), || {
                prefill_counter(m, "served_by_kernel") == i
            });
            assert_eq!(prefill_counter(m, "fallback_reads"), 0);
            assert_eq!(prefill_counter(m, "evicted_before_read"), 0);
        }
    }
    let s = stats(m);
    let p = &s["prefill"];
    eprintln!("prefill counters: {p} (drop_caches ran: {dropped})");
    assert!(
        p["served_by_kernel"].as_u64().unwrap() >= drop_at - 1,
        "{p}"
    );
    assert_eq!(p["store_failed"], 0);
    // Step 0 was read from the shards.
    assert!(s["cache"]["misses"].as_u64().unwrap() >= 1);
    mounted.take().unwrap().unmount().unwrap();

    // A remount with prefill serves the same bytes.
    let mounted = mount(new_fs(), dir.path(), &options).unwrap();
    for step in 0..steps.min(20) {
        assert_eq!(fs::read(path(0, 1, step)).unwrap(), want(0, 1, step));
    }
    mounted.unmount().unwrap();
    assert!(!is_mounted(dir.path()));
}

//! Page-cache prefill (`--prefill`): the prefetcher pushes step files into the kernel page
//! cache (FUSE_NOTIFY_STORE), files are opened without the daemon (OPEN answers ENOSYS), and a
//! reader's open + read of a stored file never reaches the daemon; one step in 24 (a trigger)
//! is stored without its last page, so reading it tells the daemon where the reader is. Bytes
//! must be identical with prefill on and off, after the kernel drops the stored pages
//! (drop_caches, which also FORGETs inodes), and after a remount. Counters are asserted step
//! by step: the test waits for the prefetcher to report steps stored (an event, not a duration)
//! before reading them.

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
    let data = Positional::new(400_000, 1 << 16);
    let cfg = config(257, 256, 8, 2, 5, 2);
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
    // Rank 0 read in order across both epochs (ordinal = epoch * steps + step). Step 0 is read
    // from the shards and starts the prefetcher, which stores 48 steps ahead; the steps
    // between two triggers (every 24th ordinal) are then read with no request reaching the
    // daemon, and each trigger's read moves the window on and drops the steps behind it.
    let order: Vec<(u64, u64)> = (0..2)
        .flat_map(|e| (0..steps).map(move |s| (e, s)))
        .collect();
    let last = order.len() as u64 - 1;
    let reads = |m: &Path| {
        let c = &stats(m)["cache"];
        c["hits"].as_u64().unwrap() + c["misses"].as_u64().unwrap()
    };
    let read = |i: u64| {
        let (epoch, step) = order[i as usize];
        assert_eq!(
            fs::read(path(epoch, 0, step)).unwrap(),
            want(epoch, 0, step),
            "epoch {epoch} step {step}"
        );
    };
    read(0);
    let drop_at = 3 * 24 + 5;
    let mut k = 0;
    while 24 * (k + 1) <= last && 24 * k + 24 < drop_at {
        let stored = (48 + 24 * k).min(last);
        wait_for(&format!("{stored} steps stored"), || {
            prefill_counter(m, "stored") == stored
        });
        let before = reads(m);
        for i in 24 * k + 1..24 * (k + 1) {
            read(i);
        }
        assert_eq!(
            reads(m),
            before,
            "steps {}..{} never reached the daemon",
            24 * k + 1,
            24 * (k + 1) - 1
        );
        read(24 * (k + 1));
        assert!(
            reads(m) > before,
            "the trigger step's last page is read from the daemon"
        );
        k += 1;
        wait_for(&format!("{} steps served by the kernel", 23 * k), || {
            prefill_counter(m, "served_by_kernel") == 23 * k
        });
        assert_eq!(prefill_counter(m, "fallback_reads"), 0);
    }
    // The kernel drops every stored page (and FORGETs inodes): reads fall back to the daemon
    // and stay byte-exact; prefill goes on.
    let dropped = drop_caches();
    for i in 24 * k + 1..=last {
        read(i);
    }
    let s = stats(m);
    let p = &s["prefill"];
    eprintln!("prefill counters: {p} (drop_caches ran: {dropped})");
    assert!(p["served_by_kernel"].as_u64().unwrap() >= 23 * k, "{p}");
    assert_eq!(p["store_failed"], 0);
    mounted.take().unwrap().unmount().unwrap();

    // A remount with prefill serves the same bytes.
    let mounted = mount(new_fs(), dir.path(), &options).unwrap();
    for step in 0..steps.min(20) {
        assert_eq!(fs::read(path(0, 1, step)).unwrap(), want(0, 1, step));
    }
    mounted.unmount().unwrap();
    assert!(!is_mounted(dir.path()));
}

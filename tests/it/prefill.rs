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

use shufflefs::mount::{MountOptions, mount};
use shufflefs::plan::StepKey;
use shufflefs::prefetch::PrefetchConfig;

use crate::common::*;

fn prefill_counter(mnt: &Path, name: &str) -> u64 {
    stats(mnt)["prefill"][name].as_u64().unwrap()
}

fn drop_caches() -> bool {
    fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

#[test]
fn prefilled_steps_are_served_by_the_kernel_with_identical_bytes() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(400_000, 1 << 16);
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

/// What a terminal `cols` wide shows after printing `bytes` at the start of a line: its rows
/// (trailing blanks trimmed, trailing empty rows dropped) and where the cursor ends. A line feed
/// also returns the carriage (the tty's `onlcr`), a carriage return goes back to column 0, any
/// other byte is drawn and moves the cursor right, wrapping at the last column.
fn screen(bytes: &[u8], cols: usize) -> (Vec<String>, (usize, usize)) {
    let mut rows: Vec<Vec<u8>> = vec![Vec::new()];
    let (mut row, mut col) = (0usize, 0usize);
    for &b in bytes {
        match b {
            b'\n' => (row, col) = (row + 1, 0),
            b'\r' => col = 0,
            _ => {
                if col == cols {
                    (row, col) = (row + 1, 0);
                }
                while rows.len() <= row {
                    rows.push(Vec::new());
                }
                let line = &mut rows[row];
                if line.len() <= col {
                    line.resize(col + 1, b' ');
                }
                line[col] = b;
                col += 1;
            }
        }
    }
    let mut text: Vec<String> = rows
        .into_iter()
        .map(|r| String::from_utf8(r).unwrap().trim_end().to_string())
        .collect();
    while text.last().is_some_and(String::is_empty) {
        text.pop();
    }
    (text, (row, col))
}

/// `cat FILE`'s output.
fn cat(path: &Path) -> Vec<u8> {
    let o = std::process::Command::new("cat")
        .arg(path)
        .output()
        .unwrap();
    assert!(o.status.success(), "cat {}", path.display());
    o.stdout
}

/// `stats.json` is valid JSON with and without `--prefill`, and `cat` shows nothing but the
/// JSON: without prefill it is exactly the pretty JSON and a newline (its size in `stat` is
/// that, and an open file keeps its snapshot's size); with prefill (fixed size, for the page
/// cache) the padding is carriage returns before the final newline, and a terminal shows the
/// same screen as for the JSON alone, cursor included (spaces would wrap into dozens of
/// blank lines).
#[test]
fn stats_json_is_valid_json_and_cat_shows_no_padding() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(100_000, 1 << 16);
    let cfg = config(257, 256, 8, 2, 5, 1);
    let step_len = data.fs(&cfg).view().step_npy_len();
    let pretty = |v: &serde_json::Value| {
        let mut b = serde_json::to_vec_pretty(v).unwrap();
        b.push(b'\n');
        b
    };
    // Without prefill (and without prefetch, so only the reads below change counters).
    let fs = data.fs(&cfg).with_cache(
        16 * step_len,
        PrefetchConfig {
            depth: 0,
            workers: 0,
            adaptive: false,
        },
    );
    let m = TestMount::new(fs);
    let path = m.path().join("stats.json");
    let bytes = cat(&path);
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["cache_enabled"], true);
    assert_eq!(bytes, pretty(&v), "exactly the pretty JSON and a newline");
    assert_eq!(fs::metadata(&path).unwrap().len(), bytes.len() as u64);
    // An open file is one snapshot, and its size (asked through it) is the snapshot's, while
    // `stat` by path follows the counters ("misses": 0 becomes 10).
    {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = fs::File::open(&path).unwrap();
        for step in 0..10 {
            fs::read(m.step(0, 0, step, "npy")).unwrap();
        }
        let now = cat(&path);
        let now_v: serde_json::Value = serde_json::from_slice(&now).unwrap();
        assert_eq!(now_v["cache"]["misses"], 10);
        // Counters went from 0 to 10 (misses, and with passthrough its plain opens).
        assert_eq!(now, pretty(&now_v));
        assert!(now.len() > bytes.len(), "{}", String::from_utf8_lossy(&now));
        assert_eq!(fs::metadata(&path).unwrap().len(), now.len() as u64);
        assert_eq!(f.seek(SeekFrom::End(0)).unwrap(), bytes.len() as u64);
        f.seek(SeekFrom::Start(0)).unwrap();
        let mut snapshot = Vec::new();
        f.read_to_end(&mut snapshot).unwrap();
        assert_eq!(snapshot, bytes);
    }
    m.unmount();

    // With prefill: a fixed size, padded invisibly.
    let fs = data.fs(&cfg).with_cache(
        64 * step_len,
        PrefetchConfig {
            depth: 2,
            workers: 1,
            adaptive: false,
        },
    );
    let options = MountOptions {
        prefill: true,
        threads: 3,
        ..MountOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mounted = mount(fs, dir.path(), &options).unwrap();
    let path = dir.path().join("stats.json");
    for round in 0..3 {
        let bytes = cat(&path);
        assert_eq!(fs::metadata(&path).unwrap().len(), 4096);
        assert_eq!(bytes.len(), 4096, "round {round}");
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert!(v["prefill"].is_object(), "{v}");
        let json = pretty(&v);
        let (body, pad) = bytes.split_at(json.len() - 1);
        assert_eq!(body, &json[..json.len() - 1]);
        assert!(
            pad[..pad.len() - 1].iter().all(|&b| b == b'\r') && pad.ends_with(b"\n"),
            "padding: carriage returns, then the newline"
        );
        for cols in [80, 132, 4096] {
            assert_eq!(screen(&bytes, cols), screen(&json, cols), "{cols} columns");
        }
        // Reads between renderings change the counters, never the size or the validity.
        fs::read(dir.path().join(format!("epoch/0/rank/0/step/{round}.npy"))).unwrap();
    }
    mounted.unmount().unwrap();
    assert!(!is_mounted(dir.path()));
}

#[test]
fn the_screen_model_sees_the_old_space_padding() {
    // The test above would have failed on space padding: the cursor ends 40-odd rows lower.
    let json = b"{\n  \"a\": 1\n}\n";
    let mut spaced = json[..json.len() - 1].to_vec();
    spaced.resize(4095, b' ');
    spaced.push(b'\n');
    assert_ne!(screen(&spaced, 80), screen(json, 80));
    let mut returns = json[..json.len() - 1].to_vec();
    returns.resize(4095, b'\r');
    returns.push(b'\n');
    assert_eq!(screen(&returns, 80), screen(json, 80));
}

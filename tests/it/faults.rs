//! Faults under load (issue #5): a long concurrent soak through a real mount with the step
//! cache and prefetch, SIGKILLs of a `shufflefs mount -f` daemon during a verifying read load,
//! and shards mutated under a live mount.
//!
//! Every expected byte is computed before the load, through the model (`View`, no FUSE), and
//! the model itself is checked against the positional reference (`expected_rows`). Each test
//! skips where /dev/fuse cannot be opened, and every mount has a guard that unmounts it, also
//! on panic. Nothing depends on timing except the explicit generous bounds (a read may take
//! up to 20 s; a daemon has 20 s to come up or exit).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use shufflefs::dtype::ScalarType;
use shufflefs::fs::ShuffleFs;
use shufflefs::npy;
use shufflefs::plan::StepKey;
use shufflefs::prefetch::PrefetchConfig;
use shufflefs::view::{View, ViewConfig};

use crate::common::*;

/// No single read may wait longer than this (a generous bound, not a speed assertion).
const READ_BOUND: Duration = Duration::from_secs(20);

/// Every step file of a plan, rendered once through the model before any load.
struct Expected {
    epochs: u64,
    ranks: u64,
    steps: u64,
    header_len: usize,
    row_bytes: usize,
    npy: Vec<Vec<u8>>,
    json: Vec<Vec<u8>>,
    info: Vec<u8>,
}

impl Expected {
    /// Renders every `S.npy` and `S.json` of `cfg` (u32 positional data) through the model and
    /// checks each `.npy` against the independent positional reference.
    fn build(data: &Data, cfg: &ViewConfig) -> Expected {
        let expected = Expected::render(data.fs(cfg).view());
        let header = npy::header("'<u4'", &[cfg.batch_size, cfg.window]).unwrap();
        assert_eq!(expected.header_len, header.len());
        for key in expected.keys() {
            let (npy, json) = (expected.bytes(key, "npy"), expected.bytes(key, "json"));
            assert_eq!(&npy[..header.len()], &header[..], "{key:?}");
            assert_eq!(
                &npy[header.len()..],
                &expected_rows(&json_observations(json), cfg, ScalarType::U32)[..],
                "the model disagrees with the positional reference at {key:?}"
            );
        }
        expected
    }

    /// Renders every `S.npy` and `S.json` of a u32 view through the model.
    fn render(view: &View) -> Expected {
        let plan = view.plan().clone();
        let info = view.info();
        let mut expected = Expected {
            epochs: plan.epochs(),
            ranks: plan.ranks(),
            steps: plan.steps_per_epoch(),
            header_len: info.npy_header_bytes as usize,
            row_bytes: info.window as usize * 4,
            npy: Vec::new(),
            json: Vec::new(),
            info: view.info_json().to_vec(),
        };
        for key in expected.keys() {
            let npy = view.render_step_npy(key).unwrap();
            let json = view.step_json(key).unwrap();
            assert_eq!(
                json_observations(&json),
                view.step_info(key).observations,
                "{key:?}"
            );
            assert_eq!(
                npy.len(),
                expected.header_len + plan.batch_size() as usize * expected.row_bytes
            );
            expected.npy.push(npy);
            expected.json.push(json);
        }
        expected
    }

    /// All step keys, in the order of `npy` and `json`.
    fn keys(&self) -> Vec<StepKey> {
        let mut keys = Vec::new();
        for epoch in 0..self.epochs {
            for rank in 0..self.ranks {
                for step in 0..self.steps {
                    keys.push(StepKey { epoch, rank, step });
                }
            }
        }
        keys
    }

    fn index(&self, key: StepKey) -> usize {
        ((key.epoch * self.ranks + key.rank) * self.steps + key.step) as usize
    }

    fn random_key(&self, rng: &mut Rng) -> StepKey {
        StepKey {
            epoch: rng.below(self.epochs),
            rank: rng.below(self.ranks),
            step: rng.below(self.steps),
        }
    }

    fn bytes(&self, key: StepKey, ext: &str) -> &[u8] {
        match ext {
            "npy" => &self.npy[self.index(key)],
            _ => &self.json[self.index(key)],
        }
    }
}

fn key_path(root: &Path, key: StepKey, ext: &str) -> PathBuf {
    step_path(root, key.epoch, key.rank, key.step, ext)
}

/// Reads `size` bytes at `offset` with one `pread` and checks them against `want` (the whole
/// file): `Ok(Err(why))` for wrong bytes, `Err` for a failed read.
fn check_range(
    path: &Path,
    want: &[u8],
    offset: u64,
    size: usize,
) -> io::Result<Result<(), String>> {
    let f = File::open(path)?;
    let mut buf = vec![0xA5u8; size];
    let n = f.read_at(&mut buf, offset)?;
    let start = (offset as usize).min(want.len());
    let end = (offset as usize).saturating_add(size).min(want.len());
    Ok(
        describe(&buf[..n], &want[start..end]).map_or(Ok(()), |why| {
            Err(format!(
                "{}: offset {offset} size {size}: {why}",
                path.display()
            ))
        }),
    )
}

/// The FUSE connection of a mount, so a watchdog can abort it (every waiting request then
/// fails) instead of letting a hung read hang the test.
struct FuseConnection(PathBuf);

impl FuseConnection {
    fn of(mountpoint: &Path) -> FuseConnection {
        let dev = fs::metadata(mountpoint).unwrap().dev();
        // fusectl names a connection by the kernel's dev_t (major << 20 | minor).
        let id = (u64::from(libc::major(dev)) << 20) | u64::from(libc::minor(dev));
        FuseConnection(PathBuf::from(format!(
            "/sys/fs/fuse/connections/{id}/abort"
        )))
    }

    fn abort(&self) {
        if let Err(e) = fs::write(&self.0, b"1") {
            eprintln!(
                "cannot abort the FUSE connection at {}: {e}",
                self.0.display()
            );
        }
    }
}

/// Sets a flag when dropped: stops reader threads when the controlling thread finishes or
/// panics, so a scope never waits for readers that would run forever.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Keeps the first few failure descriptions.
#[derive(Default)]
struct Samples(Mutex<Vec<String>>);

impl Samples {
    fn push(&self, s: String) {
        let mut v = self.0.lock().unwrap();
        if v.len() < 10 {
            v.push(s);
        }
    }

    fn get(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

fn soak_secs() -> u64 {
    std::env::var("SHUFFLEFS_SOAK_SECS")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(60)
}

/// Counters of the soak, shared by all readers.
#[derive(Default)]
struct SoakCounters {
    reads: AtomicU64,
    bytes: AtomicU64,
    mismatches: AtomicU64,
    errors: AtomicU64,
    max_latency_us: AtomicU64,
    /// Reads by kind: trainer npy, range npy, json, info, stats.
    by_kind: [AtomicU64; 5],
    failures: Samples,
}

/// The bytes a read delivered and whether they were the expected ones (`Err(why)` if not);
/// the outer `Err` is a failed read.
type SoakOutcome = io::Result<(u64, Result<(), String>)>;

/// One soak read: which kind, and what came back.
fn soak_read(
    rng: &mut Rng,
    cursor: &mut StepKey,
    root: &Path,
    expected: &Expected,
) -> (usize, SoakOutcome) {
    let whole = |path: PathBuf, want: &[u8]| -> SoakOutcome {
        let got = fs::read(&path)?;
        Ok((
            got.len() as u64,
            describe(&got, want).map_or(Ok(()), |why| Err(format!("{}: {why}", path.display()))),
        ))
    };
    match rng.below(100) {
        // A trainer: the next step of its own rank, crossing into the next epoch, which is
        // what the prefetcher predicts.
        0..40 => {
            let key = *cursor;
            cursor.step += 1;
            if cursor.step == expected.steps {
                cursor.step = 0;
                cursor.epoch = (cursor.epoch + 1) % expected.epochs;
            }
            (
                0,
                whole(key_path(root, key, "npy"), expected.bytes(key, "npy")),
            )
        }
        // Any range of any step, past the end included (the file is > 128 KiB, so a large
        // range takes more than one FUSE READ).
        40..65 => {
            let key = expected.random_key(rng);
            let want = expected.bytes(key, "npy");
            let offset = rng.below(want.len() as u64 + 2);
            let size = 1 + rng.below(300_000) as usize;
            let r = check_range(&key_path(root, key, "npy"), want, offset, size);
            (1, r.map(|c| (size as u64, c)))
        }
        65..90 => {
            let key = expected.random_key(rng);
            (
                2,
                whole(key_path(root, key, "json"), expected.bytes(key, "json")),
            )
        }
        90..95 => (3, whole(root.join("info.json"), &expected.info)),
        _ => {
            // One READ, so one rendering: a read in pieces mixes renderings (see
            // `regression_stats_json_read_in_pieces_is_one_snapshot`).
            let r = File::open(root.join("stats.json")).and_then(|f| {
                let mut buf = vec![0u8; 64 << 10];
                let n = f.read_at(&mut buf, 0)?;
                let b = &buf[..n];
                let ok = serde_json::from_slice::<serde_json::Value>(b)
                    .is_ok_and(|v| v["cache_enabled"] == true);
                Ok((
                    n as u64,
                    if ok {
                        Ok(())
                    } else {
                        Err(format!("stats.json: {}", String::from_utf8_lossy(b)))
                    },
                ))
            });
            (4, r)
        }
    }
}

/// Issue #5, soak: 64 readers for `SHUFFLEFS_SOAK_SECS` (default 60) seconds read random step
/// files of several epochs and ranks through a mount with the step cache (smaller than the
/// working set, so it evicts) and two prefetch workers, served by two FUSE threads. Every
/// byte is verified; no read may fail or wait more than 20 s; the unmount leaves nothing.
#[test]
fn soak_64_readers_through_cache_and_prefetch() {
    if !fuse_available() {
        return;
    }
    const READERS: usize = 64;
    let secs = soak_secs();
    // 2 M u32 tokens in 16 shards; step files of 8 rows x 4097 tokens (131 KiB: two READs).
    let data = Data::positional(2_000_000, 512 << 10);
    let cfg = config(4097, 4096, 8, 4, 1234, 4);
    let expected = Expected::build(&data, &cfg);
    let step_len = expected.npy[0].len() as u64;
    let fs = data.fs(&cfg).with_cache(
        96 * step_len,
        PrefetchConfig {
            depth: 4,
            workers: 2,
            adaptive: false,
        },
    );
    let m = TestMount::with_threads(fs, 2);
    let root = m.path().to_path_buf();
    let connection = FuseConnection::of(&root);
    let counters = SoakCounters::default();
    let per_reader: Vec<AtomicU64> = (0..READERS).map(|_| AtomicU64::new(0)).collect();
    // Per reader: start of the read in flight, in ms since `t0`, plus one (0: idle).
    let in_flight: Vec<AtomicU64> = (0..READERS).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let finished = AtomicUsize::new(0);
    let hung = AtomicBool::new(false);
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(secs);
    std::thread::scope(|scope| {
        let _stop = SetOnDrop(&stop);
        for t in 0..READERS {
            let (root, expected, counters) = (&root, &expected, &counters);
            let (stop, finished) = (&stop, &finished);
            let (mine, busy) = (&per_reader[t], &in_flight[t]);
            scope.spawn(move || {
                let mut rng = Rng::new(t as u64);
                let t = t as u64;
                let mut cursor = StepKey {
                    epoch: t % expected.epochs,
                    rank: t % expected.ranks,
                    step: (t * 7) % expected.steps,
                };
                // At least one read each, however short the soak.
                loop {
                    let start = Instant::now();
                    busy.store(t0.elapsed().as_millis() as u64 + 1, Ordering::SeqCst);
                    let (kind, outcome) = soak_read(&mut rng, &mut cursor, root, expected);
                    busy.store(0, Ordering::SeqCst);
                    let us = start.elapsed().as_micros() as u64;
                    counters.max_latency_us.fetch_max(us, Ordering::Relaxed);
                    counters.reads.fetch_add(1, Ordering::Relaxed);
                    counters.by_kind[kind].fetch_add(1, Ordering::Relaxed);
                    mine.fetch_add(1, Ordering::Relaxed);
                    match outcome {
                        Ok((n, Ok(()))) => {
                            counters.bytes.fetch_add(n, Ordering::Relaxed);
                        }
                        Ok((_, Err(why))) => {
                            counters.mismatches.fetch_add(1, Ordering::Relaxed);
                            counters.failures.push(format!("reader {t}: {why}"));
                        }
                        Err(e) => {
                            counters.errors.fetch_add(1, Ordering::Relaxed);
                            counters
                                .failures
                                .push(format!("reader {t}: kind {kind}: {e}"));
                        }
                    }
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                }
                finished.fetch_add(1, Ordering::SeqCst);
            });
        }
        // Watchdog: a read stuck well past the bound would hang the test; abort the FUSE
        // connection instead, so the stuck read fails (and the test with it).
        while finished.load(Ordering::SeqCst) < READERS {
            std::thread::sleep(Duration::from_millis(100));
            if Instant::now() >= deadline {
                stop.store(true, Ordering::SeqCst);
            }
            let now = t0.elapsed().as_millis() as u64 + 1;
            let limit = (READ_BOUND + Duration::from_secs(10)).as_millis() as u64;
            let stuck = in_flight.iter().any(|b| {
                let s = b.load(Ordering::SeqCst);
                s != 0 && now.saturating_sub(s) > limit
            });
            if stuck && !hung.swap(true, Ordering::SeqCst) {
                eprintln!("a read is stuck for more than {limit} ms: aborting the connection");
                stop.store(true, Ordering::SeqCst);
                connection.abort();
            }
        }
    });
    let elapsed = t0.elapsed();
    let load = |a: &AtomicU64| a.load(Ordering::SeqCst);
    let stats: serde_json::Value = stats(&root);
    let reads = load(&counters.reads);
    let kinds: Vec<u64> = counters.by_kind.iter().map(load).collect();
    let least = per_reader.iter().map(load).min().unwrap();
    eprintln!(
        "soak: {READERS} readers, {:.1} s, {reads} reads ({:.0}/s; trainer npy {}, npy ranges \
         {}, json {}, info {}, stats {}; fewest by one reader {least}), {} MiB verified, \
         {} mismatches, {} errors, slowest read {:.3} s; cache {}",
        elapsed.as_secs_f64(),
        reads as f64 / elapsed.as_secs_f64(),
        kinds[0],
        kinds[1],
        kinds[2],
        kinds[3],
        kinds[4],
        load(&counters.bytes) >> 20,
        load(&counters.mismatches),
        load(&counters.errors),
        load(&counters.max_latency_us) as f64 / 1e6,
        stats["cache"]
    );
    let failures = counters.failures.get();
    assert!(!hung.load(Ordering::SeqCst), "a read hung: {failures:#?}");
    assert_eq!(load(&counters.mismatches), 0, "wrong bytes: {failures:#?}");
    assert_eq!(load(&counters.errors), 0, "failed reads: {failures:#?}");
    assert!(
        Duration::from_micros(load(&counters.max_latency_us)) <= READ_BOUND,
        "a read waited more than {READ_BOUND:?}"
    );
    assert!(least > 0, "every reader completed reads");
    // Each kind is at least 5% of the choices: absent only in a very short soak.
    assert!(
        reads < 10_000 || kinds.iter().all(|&k| k > 0),
        "every kind of read ran: {kinds:?}"
    );
    assert_eq!(stats["cache_enabled"], true);
    m.unmount();
    assert!(
        !is_mounted(&root),
        "the unmount leaves no mount table entry"
    );
}

// ---------------------------------------------------------------------------------------------
// Kill and restart

/// How many times the daemon is SIGKILLed.
const KILLS: usize = 20;

/// Errors a reader may see from a killed daemon's mount: the connection is gone (`ENOTCONN`
/// for new requests, `ECONNABORTED` for those in flight when it died).
const NOT_CONNECTED: [i32; 2] = [libc::ENOTCONN, libc::ECONNABORTED];

/// Starts `shufflefs mount -f` with its log (stderr) in `log`, and waits until the mount
/// serves `info.json` with the expected bytes (before that it is the stale mount, ENOTCONN, or
/// the bare directory).
fn start_foreground(args: &[&str], mountpoint: &Path, log: &Path, info: &[u8]) -> Daemon {
    Daemon::start(args, log, || {
        fs::read(mountpoint.join("info.json")).is_ok_and(|b| b == info)
    })
}

/// Counters of the kill test, shared by the readers.
#[derive(Default)]
struct KillCounters {
    ok: AtomicU64,
    mismatches: AtomicU64,
    errors: AtomicU64,
    errnos: Mutex<BTreeMap<i32, u64>>,
    failures: Samples,
}

/// Issue #5, kill and restart: a few readers verify every byte they get while the
/// `shufflefs mount -f` daemon is SIGKILLed 20 times. A reader sees the right bytes or a
/// "not connected" error, never other bytes. After each kill the next `shufflefs mount` at
/// the same path clears the stale mount (and logs it) and serves identical bytes; at the end
/// `shufflefs unmount` leaves nothing in the mount table.
#[test]
fn sigkilled_daemon_restarts_on_its_stale_mount() {
    if !fuse_available() {
        return;
    }
    const READERS: u64 = 4;
    // 600 k u32 tokens in 10 shards; step files of 8 x 4097 tokens (131 KiB: two READs each,
    // so a kill can fall between the READs of one file).
    let data = Data::positional(600_000, 256 << 10);
    let cfg = config(4097, 4096, 8, 2, 99, 2);
    let expected = Expected::build(&data, &cfg);
    let mnt = MountDir::new();
    let logs = tempfile::tempdir().unwrap();
    let ds = data.path();
    let args = [
        "mount",
        s(&ds),
        s(mnt.path()),
        "--window",
        "4097",
        "--stride",
        "4096",
        "--batch-size",
        "8",
        "--ranks",
        "2",
        "--seed",
        "99",
        "--epochs",
        "2",
        "--threads",
        "2",
        "-f",
    ];
    let root = mnt.path().to_path_buf();
    let counters = KillCounters::default();
    let stop = AtomicBool::new(false);
    // Readers hold it shared for each read; a restart holds it exclusively, so no reader looks
    // at the bare directory between the clearing of the stale mount and the new mount.
    let gate = RwLock::new(());
    let t0 = Instant::now();
    let mut cycle_secs = Vec::new();
    let mut daemon = start_foreground(&args, &root, &logs.path().join("0.log"), &expected.info);
    std::thread::scope(|scope| {
        let _stop = SetOnDrop(&stop);
        for t in 0..READERS {
            let (root, expected, counters, stop, gate) =
                (&root, &expected, &counters, &stop, &gate);
            scope.spawn(move || {
                let mut rng = Rng::new(1000 + t);
                while !stop.load(Ordering::Relaxed) {
                    let _shared = gate.read().unwrap();
                    let key = expected.random_key(&mut rng);
                    let choice = rng.below(10);
                    let ext = if choice < 8 { "npy" } else { "json" };
                    let path = key_path(root, key, ext);
                    let want = expected.bytes(key, ext);
                    let outcome = if choice == 7 {
                        let offset = rng.below(want.len() as u64);
                        check_range(&path, want, offset, 1 + rng.below(200_000) as usize)
                    } else {
                        fs::read(&path).map(|got| {
                            describe(&got, want)
                                .map_or(Ok(()), |why| Err(format!("{}: {why}", path.display())))
                        })
                    };
                    match outcome {
                        Ok(Ok(())) => {
                            counters.ok.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(Err(why)) => {
                            counters.mismatches.fetch_add(1, Ordering::SeqCst);
                            counters.failures.push(why);
                        }
                        Err(e) => {
                            let errno = e.raw_os_error().unwrap_or(-1);
                            *counters.errnos.lock().unwrap().entry(errno).or_default() += 1;
                            counters.errors.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                }
            });
        }
        let wait_for = |counter: &AtomicU64, target: u64, what: &str| {
            let deadline = Instant::now() + DAEMON_BOUND;
            while counter.load(Ordering::SeqCst) < target {
                assert!(Instant::now() < deadline, "{what}");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        let mut rng = Rng::new(7);
        for cycle in 1..=KILLS {
            let start = Instant::now();
            // Some verified reads on the live mount, then a kill at a varying moment.
            let ok = counters.ok.load(Ordering::SeqCst);
            wait_for(
                &counters.ok,
                ok + 8,
                "readers make progress on the live mount",
            );
            // A file kept open across the kill: the stale mount is busy when it is cleared.
            let held_key = expected.random_key(&mut rng);
            let held = File::open(key_path(&root, held_key, "npy")).unwrap();
            std::thread::sleep(Duration::from_millis(rng.below(40)));
            daemon.kill();
            // The readers run into the stale mount.
            let errors = counters.errors.load(Ordering::SeqCst);
            wait_for(
                &counters.errors,
                errors + 4,
                "readers see the stale mount fail",
            );
            // Restart on the stale mount, readers held off.
            let exclusive = gate.write().unwrap();
            assert!(is_mounted(&root), "the killed daemon left a stale mount");
            let log = logs.path().join(format!("{cycle}.log"));
            daemon = start_foreground(&args, &root, &log, &expected.info);
            let text = fs::read_to_string(&log).unwrap();
            assert!(
                text.contains("stale") && text.contains("clearing it"),
                "cycle {cycle}: clearing the stale mount is logged: {text}"
            );
            for k in 0..4 {
                let key = expected.random_key(&mut rng);
                for ext in ["npy", "json"] {
                    let got = fs::read(key_path(&root, key, ext)).unwrap();
                    assert!(
                        got == expected.bytes(key, ext),
                        "cycle {cycle}: the new daemon serves other bytes for {key:?}.{ext} ({k})"
                    );
                }
            }
            drop(exclusive);
            // The descriptor still belongs to the dead connection and never reaches the new
            // daemon: it fails, or (a passthrough open, whose bytes the kernel holds in its
            // memory file) it still reads exactly the step's bytes.
            let mut buf = vec![0u8; 4096];
            match held.read_at(&mut buf, 0) {
                Err(e) => assert!(
                    NOT_CONNECTED.contains(&e.raw_os_error().unwrap_or(-1)),
                    "cycle {cycle}: a descriptor of the killed mount: {e}"
                ),
                Ok(n) => assert!(
                    buf[..n] == expected.bytes(held_key, "npy")[..n] && n > 0,
                    "cycle {cycle}: a passthrough descriptor of the killed mount read other bytes"
                ),
            }
            drop(held);
            cycle_secs.push(start.elapsed().as_secs_f64());
        }
        let ok = counters.ok.load(Ordering::SeqCst);
        wait_for(
            &counters.ok,
            ok + 8,
            "readers make progress on the last mount",
        );
    });
    let elapsed = t0.elapsed();
    let errnos = counters.errnos.lock().unwrap().clone();
    let named: BTreeMap<String, u64> = errnos
        .iter()
        .map(|(&e, &n)| (io::Error::from_raw_os_error(e).to_string(), n))
        .collect();
    eprintln!(
        "kill: {KILLS} SIGKILLs in {:.1} s (cycle max {:.2} s, mean {:.2} s), {} verified \
         reads, {} mismatches, {} errors {named:?}",
        elapsed.as_secs_f64(),
        cycle_secs.iter().cloned().fold(0.0, f64::max),
        cycle_secs.iter().sum::<f64>() / cycle_secs.len().max(1) as f64,
        counters.ok.load(Ordering::SeqCst),
        counters.mismatches.load(Ordering::SeqCst),
        counters.errors.load(Ordering::SeqCst),
    );
    assert_eq!(
        counters.mismatches.load(Ordering::SeqCst),
        0,
        "readers got wrong bytes: {:#?}",
        counters.failures.get()
    );
    // With passthrough an open in flight when the daemon dies can also fail with EIO (the
    // kernel cannot attach the backing file of a connection going away): seen once in
    // ~75,000 errors; never more than one per kill.
    let eio = errnos.get(&libc::EIO).copied().unwrap_or(0);
    assert!(
        errnos
            .keys()
            .all(|e| NOT_CONNECTED.contains(e) || *e == libc::EIO)
            && eio <= KILLS as u64,
        "only 'not connected' errors: {named:?}"
    );
    unmount(&root);
    assert_eq!(daemon.wait_exit(), Some(0), "the last daemon exits cleanly");
    assert!(!is_mounted(&root), "nothing remains in the mount table");
}

// ---------------------------------------------------------------------------------------------
// Shards mutated under a live mount

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mutation {
    /// `truncate` to half its size.
    Truncate,
    /// `unlink`.
    Delete,
    /// A new file with different bytes and another size, renamed over the shard.
    ReplaceResized,
    /// A new file with different bytes and the same size, renamed over the shard.
    ReplaceSameSize,
    /// Mode 000.
    Chmod000,
    /// A range overwritten in place with different bytes (same size, same inode).
    OverwriteInPlace,
}

/// The shard that gets mutated, and which of its bytes (stream offsets) become wrong or
/// unreadable for a reader that would look at the file now.
struct Target {
    path: PathBuf,
    start: u64,
    end: u64,
    damaged: std::ops::Range<u64>,
}

fn mutate(mutation: Mutation, target: &Target) {
    let path = &target.path;
    let len = target.end - target.start;
    let different = |n: u64| -> Vec<u8> { (0..n).map(|i| (i * 31 + 7) as u8 | 0x80).collect() };
    match mutation {
        Mutation::Truncate => {
            let f = fs::OpenOptions::new().write(true).open(path).unwrap();
            f.set_len(len / 2).unwrap();
        }
        Mutation::Delete => fs::remove_file(path).unwrap(),
        Mutation::ReplaceResized | Mutation::ReplaceSameSize => {
            let size = if mutation == Mutation::ReplaceResized {
                len + 4096
            } else {
                len
            };
            let tmp = path.with_extension("new");
            fs::write(&tmp, different(size)).unwrap();
            fs::rename(&tmp, path).unwrap();
        }
        Mutation::Chmod000 => {
            chmod(path, 0o000);
        }
        Mutation::OverwriteInPlace => {
            let f = fs::OpenOptions::new().write(true).open(path).unwrap();
            let at = target.damaged.start - target.start;
            f.write_all_at(&different(target.damaged.end - target.damaged.start), at)
                .unwrap();
            f.sync_all().unwrap();
        }
    }
}

/// Outcomes of the reads after a mutation.
#[derive(Default, Debug)]
struct MutationTally {
    old_bytes: u64,
    errors: BTreeMap<String, u64>,
    violations: Vec<String>,
}

impl MutationTally {
    /// Records one read: `want` is the file's old content (or the range of it).
    fn record(&mut self, what: &str, outcome: io::Result<Result<(), String>>) -> Option<i32> {
        match outcome {
            Ok(Ok(())) => {
                self.old_bytes += 1;
                None
            }
            Ok(Err(why)) => {
                self.violations.push(format!("{what}: {why}"));
                None
            }
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(-1);
                if ![libc::EIO, libc::ESTALE].contains(&errno) {
                    self.violations
                        .push(format!("{what}: unexpected error {e}"));
                }
                *self.errors.entry(e.to_string()).or_default() += 1;
                Some(errno)
            }
        }
    }
}

/// Mounts a fresh dataset (through the library, plain or with cache and prefetch), reads
/// every step file once, applies `mutation` to one shard, then reads again every step file
/// that needs that shard, whole and row by row: each read must give the old bytes or EIO /
/// ESTALE. Steps that do not need the shard must still read correctly. After the unmount, a
/// new `shufflefs mount` must refuse the dataset naming the shard where the size changed or
/// the file is gone.
fn mutation_under_live_mount(mutation: Mutation) {
    if !fuse_available() {
        return;
    }
    for cached in [false, true] {
        // 60 k u32 tokens in 8 shards of 32 KiB; 2 epochs x 2 ranks x 29 steps of 4 x 257.
        let data = Data::positional(60_000, 32 << 10);
        let cfg = config(257, 256, 4, 2, 9, 2);
        let expected = Expected::build(&data, &cfg);
        let shards = shard_paths(&data.path());
        let sizes: Vec<u64> = shards
            .iter()
            .map(|p| fs::metadata(p).unwrap().len())
            .collect();
        let k = 3;
        let start: u64 = sizes[..k].iter().sum();
        let end = start + sizes[k];
        let len = sizes[k];
        let damaged = match mutation {
            Mutation::Truncate => start + len / 2..end,
            Mutation::OverwriteInPlace => start + len / 4..start + len / 4 + 4096,
            _ => start..end,
        };
        let target = Target {
            path: shards[k].clone(),
            start,
            end,
            damaged,
        };
        let stride = cfg.stride.unwrap();
        let row_range = |o: u64| o * stride * 4..(o * stride + cfg.window) * 4;
        let overlaps =
            |r: &std::ops::Range<u64>, s: &std::ops::Range<u64>| r.start < s.end && s.start < r.end;
        // In-place overwrites are only caught by block checksums: mount with --verify-reads.
        let open = || {
            let dataset = shufflefs::dataset::Dataset::open(&data.path()).unwrap();
            let dataset = if matches!(mutation, Mutation::OverwriteInPlace) {
                dataset.with_verified_reads().unwrap()
            } else {
                dataset
            };
            ShuffleFs::new(View::new(dataset, &cfg).unwrap()).unwrap()
        };
        let fs_model = if cached {
            open().with_cache(
                // Room for 8 step files: some reads hit old bytes, most go to the shards.
                8 * expected.npy[0].len() as u64,
                PrefetchConfig {
                    depth: 4,
                    workers: 1,
                    adaptive: false,
                },
            )
        } else {
            open()
        };
        let m = TestMount::new(fs_model);
        let root = m.path().to_path_buf();
        for key in expected.keys() {
            for ext in ["npy", "json"] {
                assert!(
                    fs::read(key_path(&root, key, ext)).unwrap() == expected.bytes(key, ext),
                    "{key:?}.{ext} before the mutation"
                );
            }
        }
        mutate(mutation, &target);
        let mut tally = MutationTally::default();
        let (mut affected, mut unaffected) = (0, 0);
        for key in expected.keys() {
            let observations = json_observations(expected.bytes(key, "json"));
            let rows: Vec<_> = observations.iter().map(|&o| row_range(o)).collect();
            let needs_shard = rows.iter().any(|r| overlaps(r, &(start..end)));
            let npy = key_path(&root, key, "npy");
            let want = expected.bytes(key, "npy");
            if !needs_shard {
                // Stream-mode S.json needs no shard bytes, and neither does this S.npy.
                unaffected += 1;
                for (path, want) in [
                    (&npy, want),
                    (&key_path(&root, key, "json"), expected.bytes(key, "json")),
                ] {
                    let got = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    assert!(
                        got == want,
                        "{}: a step that does not need the shard changed",
                        path.display()
                    );
                }
                continue;
            }
            affected += 1;
            let whole = fs::read(&npy).map(|got| describe(&got, want).map_or(Ok(()), Err));
            let errno = tally.record(&format!("{}", npy.display()), whole);
            if mutation == Mutation::Truncate && !cached {
                // Documented (SEMANTICS section 9): EIO for exactly the reads that touch the
                // missing bytes.
                let lost = rows.iter().any(|r| overlaps(r, &target.damaged));
                assert_eq!(
                    errno,
                    lost.then_some(libc::EIO),
                    "{}: whole read",
                    npy.display()
                );
            }
            let json = key_path(&root, key, "json");
            let outcome = fs::read(&json)
                .map(|got| describe(&got, expected.bytes(key, "json")).map_or(Ok(()), Err));
            tally.record(&format!("{}", json.display()), outcome);
            // The header alone, then row by row.
            let header = check_range(&npy, want, 0, expected.header_len);
            assert_eq!(
                tally.record(&format!("{} header", npy.display()), header),
                None
            );
            for (j, r) in rows.iter().enumerate() {
                let offset = (expected.header_len + j * expected.row_bytes) as u64;
                let outcome = check_range(&npy, want, offset, expected.row_bytes);
                let errno = tally.record(&format!("{} row {j}", npy.display()), outcome);
                if !cached && mutation == Mutation::Truncate {
                    let lost = overlaps(r, &target.damaged);
                    assert_eq!(
                        errno,
                        lost.then_some(libc::EIO),
                        "{} row {j}: EIO exactly where bytes are missing",
                        npy.display()
                    );
                }
            }
        }
        // One READ: see `regression_stats_json_read_in_pieces_is_one_snapshot`.
        let mut stats = vec![0u8; 64 << 10];
        let n = File::open(root.join("stats.json"))
            .and_then(|f| f.read_at(&mut stats, 0))
            .unwrap();
        let stats: serde_json::Value = serde_json::from_slice(&stats[..n]).unwrap();
        eprintln!(
            "{mutation:?} ({}): {affected} steps need shard {k}, {unaffected} do not; reads \
             after the mutation: {} old bytes, errors {:?}, {} violations; cache {}",
            if cached { "cache+prefetch" } else { "plain" },
            tally.old_bytes,
            tally.errors,
            tally.violations.len(),
            stats["cache"]
        );
        assert!(affected > 0 && unaffected > 0, "the layout exercises both");
        assert!(
            tally.violations.is_empty(),
            "{mutation:?} ({}): reads gave bytes that are neither the old ones nor an \
             error: {:#?}",
            if cached { "cache+prefetch" } else { "plain" },
            &tally.violations[..tally.violations.len().min(10)]
        );
        m.unmount();
        assert!(!is_mounted(&root));
        remount_after(mutation, &data, &target, &expected);
    }
}

/// A new mount of the mutated dataset: refused, naming the shard, when the shard's size
/// changed or it is gone. A chmod 000 shard is refused unless the mounter is root (root
/// opens it anyway, and its bytes are unchanged).
fn remount_after(mutation: Mutation, data: &Data, target: &Target, expected: &Expected) {
    let name = target
        .path
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let old = target.end - target.start;
    let root = nix::unistd::geteuid().is_root();
    let want = match mutation {
        Mutation::Truncate => format!(
            "{name}: shard is {} bytes but the manifest records {old}",
            old / 2
        ),
        Mutation::ReplaceResized => {
            format!(
                "{name}: shard is {} bytes but the manifest records {old}",
                old + 4096
            )
        }
        Mutation::Delete => format!("{name}: file listed in the manifest is missing"),
        Mutation::Chmod000 if !root => format!("{name}: cannot open shard: Permission denied"),
        Mutation::Chmod000 => String::new(),
        // Same size: not detected at mount (content hashes are not checked).
        Mutation::ReplaceSameSize | Mutation::OverwriteInPlace => return,
    };
    let mnt = MountDir::new();
    let log = data.dir.path().join("remount.log");
    let ds = data.path();
    let o = shufflefs(&[
        "mount",
        s(&ds),
        s(mnt.path()),
        "--window",
        "257",
        "--stride",
        "256",
        "--batch-size",
        "4",
        "--ranks",
        "2",
        "--seed",
        "9",
        "--epochs",
        "2",
        "--log-file",
        s(&log),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    if want.is_empty() {
        // Root: the mount works and serves the unchanged bytes.
        assert!(o.status.success(), "{stderr}");
        for key in expected.keys() {
            assert!(
                fs::read(key_path(mnt.path(), key, "npy")).unwrap() == expected.bytes(key, "npy"),
                "{key:?}"
            );
        }
        unmount(mnt.path());
        return;
    }
    assert_eq!(
        o.status.code(),
        Some(1),
        "{mutation:?}: the mount is refused: {stderr}"
    );
    assert!(
        stderr.contains(&want),
        "{mutation:?}: want {want:?} in {stderr}"
    );
    assert!(!is_mounted(mnt.path()));
}

#[test]
fn truncated_shard_under_live_mount() {
    mutation_under_live_mount(Mutation::Truncate);
}

#[test]
fn deleted_shard_under_live_mount() {
    mutation_under_live_mount(Mutation::Delete);
}

#[test]
fn shard_replaced_by_rename_under_live_mount() {
    mutation_under_live_mount(Mutation::ReplaceResized);
    mutation_under_live_mount(Mutation::ReplaceSameSize);
}

#[test]
fn chmod_000_shard_under_live_mount() {
    mutation_under_live_mount(Mutation::Chmod000);
}

/// A dataset with documents: each row of `S.json` carries its span metadata, read from the
/// shard's `.meta` file. That file truncated under a live mount: every `S.json` gives its old
/// bytes or EIO (never partial JSON), and every `S.npy` (which needs no metadata) its old
/// bytes. A new mount is refused, naming the file.
#[test]
fn truncated_metadata_file_under_live_mount() {
    if !fuse_available() {
        return;
    }
    let mut lines = String::new();
    let mut pos = 0u64;
    for k in 0..400u64 {
        let len = 1 + (k * 7) % 13;
        let tokens: Vec<u64> = (pos..pos + len).collect();
        let meta = serde_json::json!({"doc": k, "text": "x".repeat((k % 17) as usize)});
        lines.push_str(&serde_json::json!({"tokens": tokens, "meta": meta}).to_string());
        lines.push('\n');
        pos += len;
    }
    let data = Data::jsonl(&lines, ScalarType::U32, 2048, None);
    let ds = data.path();
    let cfg = config(9, 9, 2, 2, 5, 1);
    let expected = Expected::render(&View::open(&ds, &cfg).unwrap());
    let name = manifest(&ds)["shards"][2]["docs"]["meta"]
        .as_str()
        .unwrap()
        .to_string();
    let meta = ds.join(&name);
    let old = fs::metadata(&meta).unwrap().len();
    let m = TestMount::new(ShuffleFs::new(View::open(&ds, &cfg).unwrap()).unwrap());
    let root = m.path().to_path_buf();
    for key in expected.keys() {
        for ext in ["npy", "json"] {
            assert!(
                fs::read(key_path(&root, key, ext)).unwrap() == expected.bytes(key, ext),
                "{key:?}.{ext} before the mutation"
            );
        }
    }
    let f = fs::OpenOptions::new().write(true).open(&meta).unwrap();
    f.set_len(old / 2).unwrap();
    drop(f);
    let mut tally = MutationTally::default();
    for key in expected.keys() {
        let npy = key_path(&root, key, "npy");
        let got = fs::read(&npy).unwrap_or_else(|e| panic!("{}: {e}", npy.display()));
        assert!(got == expected.bytes(key, "npy"), "{}", npy.display());
        let json = key_path(&root, key, "json");
        let want = expected.bytes(key, "json");
        let outcome = fs::read(&json).map(|got| describe(&got, want).map_or(Ok(()), Err));
        tally.record(&json.display().to_string(), outcome);
        let outcome = check_range(&json, want, want.len() as u64 / 2, 64);
        tally.record(&format!("{} middle", json.display()), outcome);
    }
    eprintln!(
        "truncated {name}: {} S.json reads: {} old bytes, errors {:?}, {} violations",
        2 * expected.keys().len(),
        tally.old_bytes,
        tally.errors,
        tally.violations.len()
    );
    assert!(tally.violations.is_empty(), "{:#?}", tally.violations);
    assert!(
        !tally.errors.is_empty(),
        "the steps whose metadata is gone fail (documented: EIO)"
    );
    m.unmount();
    assert!(!is_mounted(&root));
    let mnt = MountDir::new();
    let o = shufflefs(&[
        "mount",
        s(&ds),
        s(mnt.path()),
        "--window",
        "9",
        "--batch-size",
        "2",
        "--ranks",
        "2",
        "--seed",
        "5",
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    let want = format!(
        "{name}: file is {} bytes but the manifest implies {old}",
        old / 2
    );
    assert!(stderr.contains(&want), "want {want:?} in {stderr}");
    assert!(!is_mounted(mnt.path()));
}

/// A range of a shard overwritten in place with different bytes of the same size: the
/// daemon's open descriptor sees the new bytes; with `--verify-reads` every block is checked
/// against its checksum before it is served, so the affected reads are EIO (or old bytes from
/// the step cache), never the new bytes.
#[test]
fn shard_overwritten_in_place_under_live_mount() {
    mutation_under_live_mount(Mutation::OverwriteInPlace);
}

/// `stats.json` changes while mounted, and every READ renders it anew, so a reader that
/// reads it in more than one READ (a small buffer; or `fs::read` / Python's `read()` when the
/// counters grew a digit between `fstat` and `read`) gets the head of one rendering and the
/// tail of another: torn, invalid JSON. The soak found it (64 readers, 5 of ~4,000 reads of
/// `stats.json` in 10 s with `fs::read`). Expected: an open file is one snapshot.
#[test]
fn regression_stats_json_read_in_pieces_is_one_snapshot() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(60_000, 32 << 10);
    let cfg = config(257, 256, 4, 2, 9, 1);
    let step_len = data.fs(&cfg).view().step_npy_len();
    // No prefetch: only the reads below change the counters.
    let fs = data.fs(&cfg).with_cache(
        8 * step_len,
        PrefetchConfig {
            depth: 0,
            workers: 0,
            adaptive: false,
        },
    );
    let m = TestMount::new(fs);
    let stats = File::open(m.path().join("stats.json")).unwrap();
    let mut first = vec![0u8; 64 << 10];
    let n = stats.read_at(&mut first, 0).unwrap();
    first.truncate(n);
    // A reader with a small buffer: the head first, past the "misses" line.
    let split = n - 8;
    let mut whole = vec![0u8; split];
    assert_eq!(stats.read_at(&mut whole, 0).unwrap(), split);
    // Ten misses: "misses": 0 becomes "misses": 10, one byte longer.
    for step in 0..10 {
        fs::read(m.step(0, 0, step, "npy")).unwrap();
    }
    loop {
        let mut buf = vec![0u8; 4096];
        let k = stats.read_at(&mut buf, whole.len() as u64).unwrap();
        if k == 0 {
            break;
        }
        whole.extend_from_slice(&buf[..k]);
    }
    drop(stats);
    m.unmount();
    assert!(
        whole == first,
        "one open stats.json is one snapshot; got {:?} after {:?}",
        String::from_utf8_lossy(&whole),
        String::from_utf8_lossy(&first)
    );
}

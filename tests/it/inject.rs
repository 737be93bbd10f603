//! Fault injection through the backend seam (`Dataset::wrap_sources`), read through a real
//! mount with a 1 s read deadline (issue #5). A shared controller decides per shard read, from
//! a seeded PRNG, to fail with `EIO`, deliver fewer bytes than asked, report an early end of
//! file, stall (until released, or for longer than the deadline), or pass through. Thousands of
//! faults must give 0 wrong bytes, every failed read must be `EIO` within deadline + 1 s,
//! `stat`, `ls`, `info.json`, cache hits and other steps must be served while shard reads are
//! stalled, and once faults stop every read must be correct again: without a cache, and with
//! the step cache and prefetch (whose failed prefetches must never fail or corrupt a later
//! foreground read).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use shufflefs::dataset::{Dataset, ReadAt};
use shufflefs::dtype::ScalarType;
use shufflefs::fs::ShuffleFs;
use shufflefs::mount::MountOptions;
use shufflefs::plan::StepKey;
use shufflefs::prefetch::PrefetchConfig;
use shufflefs::view::{View, ViewConfig};

use crate::common::*;

/// The mount's read deadline.
const DEADLINE: Duration = Duration::from_secs(1);
/// A failed read must return within this of its start. The contract is deadline + 1 s; the
/// stalled sources here hold until released, so an EIO at all proves the deadline answered and
/// this bound is only a generous watchdog (a loaded machine may schedule the answer late; the
/// latency itself is measured by benchmarks, not asserted).
const ERROR_BOUND: Duration = Duration::from_secs(10);
/// A random stall lasts this long unless released: past the deadline, so the watchdog answers.
const RANDOM_STALL: Duration = Duration::from_millis(2500);
/// Faults injected per variant (each of the two variants injects at least this many).
const FAULTS_PER_VARIANT: u64 = 2500;
/// Random stalls per variant (each costs a reader about one deadline).
const RANDOM_STALLS: u64 = 10;
/// Stalls held at once while the responsiveness of the mount is checked.
const HELD_STALLS: u64 = 3;
/// Reader threads during the random phase.
const READERS: u64 = 6;
/// What a faulty source scribbles into the bytes it did not deliver.
const JUNK: u8 = 0xEE;
/// Bound on any phase, so a broken build fails instead of hanging.
const PHASE_CAP: Duration = Duration::from_secs(40);

/// The two variants share two cores: run them one after the other.
static SERIAL: Mutex<()> = Mutex::new(());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Fault kinds, as indices of [`Faults::counts`].
const EIO: usize = 0;
const SHORT: usize = 1;
const EOF: usize = 2;
const STALL: usize = 3;
const KIND_NAMES: [&str; 4] = ["eio", "short", "eof", "stall"];

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Every read passes through.
    Off,
    /// Per read, out of 10,000: EIO, a short count, an early EOF, a stall (bounded by
    /// [`RANDOM_STALL`], while the stall budget lasts).
    Random {
        eio: u64,
        short: u64,
        eof: u64,
        stall: u64,
    },
    /// The next `n` reads stall until released: on the prefetch workers only (`prefetch`), or
    /// on every other thread only.
    StallNext { n: u64, prefetch: bool },
}

struct Control {
    mode: Mode,
    rng: Rng,
    stalls_left: u64,
    /// Told each time a stall begins (after it is counted in [`Gate::stalled`]).
    stall_started: Option<mpsc::Sender<()>>,
}

struct Gate {
    /// Stalls end at once (and new ones pass straight through) while open.
    open: bool,
    /// Reads blocked in a stall right now.
    stalled: u64,
}

enum Action {
    Pass,
    Eio,
    Short(u64),
    Eof,
    Stall(Option<Duration>, Option<mpsc::Sender<()>>),
}

/// The shared fault controller.
struct Faults {
    control: Mutex<Control>,
    gate: Mutex<Gate>,
    gate_changed: Condvar,
    counts: [AtomicU64; 4],
    passed: AtomicU64,
}

impl Faults {
    fn new(seed: u64) -> Faults {
        Faults {
            control: Mutex::new(Control {
                mode: Mode::Off,
                rng: Rng::new(seed),
                stalls_left: 0,
                stall_started: None,
            }),
            gate: Mutex::new(Gate {
                open: false,
                stalled: 0,
            }),
            gate_changed: Condvar::new(),
            counts: Default::default(),
            passed: AtomicU64::new(0),
        }
    }

    fn decide(&self) -> Action {
        let mut c = lock(&self.control);
        match c.mode {
            Mode::Off => Action::Pass,
            Mode::StallNext { n, prefetch } => {
                let on_prefetch = std::thread::current()
                    .name()
                    .is_some_and(|t| t.starts_with("prefetch"));
                if n > 0 && on_prefetch == prefetch {
                    c.mode = Mode::StallNext { n: n - 1, prefetch };
                    Action::Stall(None, c.stall_started.clone())
                } else {
                    Action::Pass
                }
            }
            Mode::Random {
                eio,
                short,
                eof,
                stall,
            } => {
                let r = c.rng.next();
                let x = r % 10_000;
                if x < eio {
                    Action::Eio
                } else if x < eio + short {
                    Action::Short(r >> 20)
                } else if x < eio + short + eof {
                    Action::Eof
                } else if x < eio + short + eof + stall && c.stalls_left > 0 {
                    c.stalls_left -= 1;
                    Action::Stall(Some(RANDOM_STALL), c.stall_started.clone())
                } else {
                    Action::Pass
                }
            }
        }
    }

    fn hit(&self, kind: usize) {
        self.counts[kind].fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self, kind: usize) -> u64 {
        self.counts[kind].load(Ordering::Relaxed)
    }

    fn total(&self) -> u64 {
        (0..4).map(|k| self.count(k)).sum()
    }

    fn stalls_left(&self) -> u64 {
        lock(&self.control).stalls_left
    }

    /// Blocks the calling read until the gate opens (or `limit` passes).
    fn stall(&self, limit: Option<Duration>, started: Option<mpsc::Sender<()>>) {
        let mut gate = lock(&self.gate);
        gate.stalled += 1;
        if let Some(tx) = started {
            let _ = tx.send(());
        }
        // Even an "until released" stall ends eventually, so a failing test cannot hang.
        let limit = limit.unwrap_or(Duration::from_secs(30));
        let (mut gate, _) = self
            .gate_changed
            .wait_timeout_while(gate, limit, |g| !g.open)
            .unwrap_or_else(|p| p.into_inner());
        gate.stalled -= 1;
        self.gate_changed.notify_all();
    }

    fn stalled_now(&self) -> u64 {
        lock(&self.gate).stalled
    }

    fn set_mode(&self, mode: Mode, stalls: u64, started: Option<mpsc::Sender<()>>) {
        lock(&self.gate).open = false;
        let mut c = lock(&self.control);
        c.mode = mode;
        c.stalls_left = stalls;
        c.stall_started = started;
    }

    /// Stops injecting, ends every stall, and waits (bounded) until no read is stalled.
    fn release(&self) {
        {
            let mut c = lock(&self.control);
            c.mode = Mode::Off;
            c.stall_started = None;
        }
        let mut gate = lock(&self.gate);
        gate.open = true;
        self.gate_changed.notify_all();
        let (gate, _) = self
            .gate_changed
            .wait_timeout_while(gate, Duration::from_secs(10), |g| g.stalled > 0)
            .unwrap_or_else(|p| p.into_inner());
        assert_eq!(gate.stalled, 0, "released stalls end");
    }

    fn summary(&self) -> String {
        let kinds: Vec<String> = (0..4)
            .map(|k| format!("{}={}", KIND_NAMES[k], self.count(k)))
            .collect();
        format!(
            "{} (total {}; {} reads passed through)",
            kinds.join(" "),
            self.total(),
            self.passed.load(Ordering::Relaxed)
        )
    }
}

/// A shard or document file behind the fault controller.
struct Faulty {
    inner: Arc<dyn ReadAt>,
    faults: Arc<Faults>,
}

impl ReadAt for Faulty {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let f = &self.faults;
        match f.decide() {
            Action::Eio => {
                f.hit(EIO);
                buf.fill(JUNK);
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
            Action::Short(r) if buf.len() > 1 => {
                f.hit(SHORT);
                let k = 1 + (r % (buf.len() as u64 - 1)) as usize;
                let n = self.inner.read_at(&mut buf[..k], offset)?;
                buf[n..].fill(JUNK);
                Ok(n)
            }
            Action::Eof => {
                // A short count followed by EOF: the dataset must report ShortRead (EIO).
                f.hit(EOF);
                buf.fill(JUNK);
                Ok(0)
            }
            Action::Stall(limit, started) => {
                f.hit(STALL);
                f.stall(limit, started);
                self.inner.read_at(buf, offset)
            }
            Action::Pass | Action::Short(_) => {
                f.passed.fetch_add(1, Ordering::Relaxed);
                self.inner.read_at(buf, offset)
            }
        }
    }
}

/// Mounts the dataset at `dir` with every file behind `faults`: 3 FUSE threads and a 1 s read
/// deadline, optionally with the step cache and one prefetch worker.
fn faulty_mount(dir: &Path, cfg: &ViewConfig, faults: &Arc<Faults>, with_cache: bool) -> TestMount {
    let dataset = Dataset::open(dir).unwrap().wrap_sources(|_, inner| {
        Arc::new(Faulty {
            inner,
            faults: faults.clone(),
        })
    });
    let mut fs = ShuffleFs::new(View::new(dataset, cfg).unwrap()).unwrap();
    if with_cache {
        fs = fs.with_cache(
            1 << 20,
            PrefetchConfig {
                depth: 4,
                workers: 1,
                adaptive: false,
            },
        );
    }
    let options = MountOptions {
        threads: 3,
        read_timeout: Some(DEADLINE),
        ..MountOptions::default()
    };
    TestMount::with_options(fs, &options)
}

/// A file of the mount and its bytes from the fault-free model.
struct Target {
    name: String,
    path: PathBuf,
    want: Vec<u8>,
}

/// Every step file of the plan (in (epoch, rank, step) order) and every 17th observation file,
/// with bytes from a fault-free [`ShuffleFs`], themselves checked against the definition.
fn targets(m: &TestMount, reference: &ShuffleFs, cfg: &ViewConfig) -> Vec<Target> {
    let view = reference.view();
    let plan = view.plan();
    let header_len = view.info().npy_header_bytes as usize;
    let mut out = Vec::new();
    for epoch in 0..plan.epochs() {
        for rank in 0..plan.ranks() {
            for step in 0..plan.steps_per_epoch() {
                let key = StepKey { epoch, rank, step };
                let want = view.render_step_npy(key).unwrap();
                let obs = view.step_info(key).observations;
                assert_eq!(
                    &want[header_len..],
                    &expected_rows(&obs, cfg, ScalarType::U32)[..],
                    "model of {key:?}"
                );
                out.push(Target {
                    name: format!("epoch/{epoch}/rank/{rank}/step/{step}.npy"),
                    path: m.step(epoch, rank, step, "npy"),
                    want,
                });
            }
        }
    }
    for i in (0..plan.n_observations()).step_by(17) {
        let mut want = vec![0u8; view.observation_npy_len(i).unwrap() as usize];
        assert_eq!(
            view.read_observation_npy(i, 0, &mut want).unwrap(),
            want.len()
        );
        let rows = expected_rows(&[i], cfg, ScalarType::U32);
        assert_eq!(
            &want[want.len() - rows.len()..],
            &rows[..],
            "observation {i}"
        );
        let name = format!("observation/{i}.npy");
        out.push(Target {
            path: m.path().join(&name),
            name,
            want,
        });
    }
    out
}

/// What the readers saw.
#[derive(Default)]
struct Tally {
    ok: u64,
    failed: u64,
    wrong_bytes: u64,
    problems: Vec<String>,
    max_error_latency: Duration,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.ok += other.ok;
        self.failed += other.failed;
        self.wrong_bytes += other.wrong_bytes;
        self.problems.extend(other.problems);
        self.max_error_latency = self.max_error_latency.max(other.max_error_latency);
    }

    /// Reads `t` through the mount: either exactly its bytes, or EIO within [`ERROR_BOUND`].
    fn read(&mut self, t: &Target) {
        let start = Instant::now();
        let result = fs::read(&t.path);
        let took = start.elapsed();
        match result {
            Ok(got) => {
                self.ok += 1;
                let wrong = mismatches(&got, &t.want);
                if wrong > 0 {
                    self.wrong_bytes += wrong;
                    self.problems
                        .push(format!("{}: {wrong} wrong bytes", t.name));
                }
            }
            Err(e) => {
                self.failed += 1;
                self.max_error_latency = self.max_error_latency.max(took);
                if e.raw_os_error() != Some(libc::EIO) {
                    self.problems
                        .push(format!("{}: {e} (expected EIO)", t.name));
                }
                if took > ERROR_BOUND {
                    self.problems.push(format!(
                        "{}: failed after {took:?} (bound {ERROR_BOUND:?})",
                        t.name
                    ));
                }
            }
        }
    }
}

fn fuse_mounts() -> usize {
    fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter(|l| l.contains("fuse"))
        .count()
}

/// Differences of stats.json cache counters.
fn delta(before: &serde_json::Value, after: &serde_json::Value, counter: &str) -> u64 {
    after["cache"][counter].as_u64().unwrap() - before["cache"][counter].as_u64().unwrap()
}

/// Reads `t` and asserts it succeeds with exact bytes.
fn read_exact(t: &Target) {
    let got = fs::read(&t.path).unwrap_or_else(|e| panic!("{}: {e}", t.name));
    assert_eq!(mismatches(&got, &t.want), 0, "{}", t.name);
}

/// On a fresh mount with a cache: the prefetch worker stalls on the step after the one read.
/// The reader of that step waits for the worker (bounded), then reads it itself and gets exact
/// bytes; the next step, still queued behind the stalled one, is taken over by its reader.
/// Once released, the worker's late copy is cached, and it is exact too.
fn a_stalled_prefetch_never_fails_a_read(
    m: &TestMount,
    faults: &Arc<Faults>,
    step: &dyn Fn(u64, u64, u64) -> usize,
    targets: &[Target],
) {
    let (started_tx, started_rx) = mpsc::channel();
    faults.set_mode(
        Mode::StallNext {
            n: 1,
            prefetch: true,
        },
        0,
        Some(started_tx),
    );
    let before = stats(m.path());
    assert_eq!(delta(&before, &before, "prefetched"), 0);
    // Queues steps 51..=54 of rank 1; the (single) worker takes 51 first and stalls.
    read_exact(&targets[step(0, 1, 50)]);
    started_rx
        .recv_timeout(PHASE_CAP)
        .expect("the prefetch worker stalled");
    read_exact(&targets[step(0, 1, 51)]);
    read_exact(&targets[step(0, 1, 52)]);
    let during = stats(m.path());
    assert_eq!(delta(&before, &during, "prefetch_waited"), 1, "{during}");
    assert_eq!(delta(&before, &during, "prefetch_claimed"), 1, "{during}");
    assert_eq!(delta(&before, &during, "prefetched"), 0, "{during}");
    assert_eq!(faults.stalled_now(), 1, "the worker is still stalled");
    faults.release();
    // The worker finishes step 51 after all: wait (bounded) until it is cached.
    let start = Instant::now();
    while delta(&before, &stats(m.path()), "prefetched") == 0 {
        assert!(start.elapsed() < PHASE_CAP, "the worker never finished");
        std::thread::sleep(Duration::from_millis(5));
    }
    let hits = stats(m.path());
    read_exact(&targets[step(0, 1, 51)]);
    assert_eq!(
        delta(&hits, &stats(m.path()), "hits"),
        1,
        "the late prefetch is served"
    );
}

/// A stall released before the deadline delays a read; it does not fail it.
fn a_stall_shorter_than_the_deadline_is_no_error(faults: &Arc<Faults>, t: &Target) {
    let (started_tx, started_rx) = mpsc::channel();
    faults.set_mode(
        Mode::StallNext {
            n: 1,
            prefetch: false,
        },
        0,
        Some(started_tx),
    );
    let (done_tx, done_rx) = mpsc::channel();
    let path = t.path.clone();
    std::thread::spawn(move || {
        let _ = done_tx.send(fs::read(&path));
    });
    started_rx
        .recv_timeout(PHASE_CAP)
        .expect("the read stalled");
    faults.release();
    let got = done_rx
        .recv_timeout(PHASE_CAP)
        .unwrap()
        .unwrap_or_else(|e| panic!("{}: a short stall failed the read: {e}", t.name));
    assert_eq!(mismatches(&got, &t.want), 0, "{}", t.name);
}

/// Holds [`HELD_STALLS`] reads stalled (two of them block FUSE threads, one a pool thread) and
/// checks that everything else is served meanwhile, that the stalled reads fail with EIO at
/// the deadline while their shard reads are still blocked, and that they read correctly after.
fn stalled_reads_leave_the_mount_responsive(
    m: &TestMount,
    faults: &Arc<Faults>,
    reference: &ShuffleFs,
    step: &dyn Fn(u64, u64, u64) -> usize,
    targets: &[Target],
    with_cache: bool,
) {
    let plan = reference.view().plan();
    let (started_tx, started_rx) = mpsc::channel();
    faults.set_mode(
        Mode::StallNext {
            n: HELD_STALLS,
            prefetch: false,
        },
        0,
        Some(started_tx),
    );
    let (done_tx, done_rx) = mpsc::channel();
    // Steps far apart, so no prefetch of one covers another.
    let stalled: Vec<usize> = (0..HELD_STALLS).map(|k| step(0, 1, 10 + 10 * k)).collect();
    for &t in &stalled {
        let (path, done_tx) = (targets[t].path.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            let result = fs::read(&path);
            let _ = done_tx.send((t, result, start.elapsed()));
        });
        started_rx
            .recv_timeout(PHASE_CAP)
            .expect("the read reached the shards and stalled");
    }
    assert_eq!(faults.stalled_now(), HELD_STALLS);
    let ops_start = Instant::now();
    // stat of a file never looked up (a LOOKUP reaches the daemon).
    let meta = fs::metadata(m.step(1, 0, 7, "npy")).unwrap();
    assert_eq!(meta.len(), reference.view().step_npy_len());
    // ls of a directory.
    let names = fs::read_dir(m.path().join("epoch/1/rank/0/step"))
        .unwrap()
        .count() as u64;
    assert_eq!(names, 2 * plan.steps_per_epoch());
    // info.json and stats.json.
    assert_eq!(
        fs::read(m.path().join("info.json")).unwrap(),
        reference.view().info_json()
    );
    let before = stats(m.path());
    // Another step, which needs the shards (a pool thread reads it).
    let other = &targets[step(0, 0, 40)];
    assert_eq!(mismatches(&fs::read(&other.path).unwrap(), &other.want), 0);
    if with_cache {
        // Cached by the prefetch worker in `a_stalled_prefetch_never_fails_a_read`.
        let hit = &targets[step(0, 1, 51)];
        assert_eq!(mismatches(&fs::read(&hit.path).unwrap(), &hit.want), 0);
        let after = stats(m.path());
        assert!(
            after["cache"]["hits"].as_u64() > before["cache"]["hits"].as_u64(),
            "a cache hit was served: {before} -> {after}"
        );
    }
    let ops_took = ops_start.elapsed();
    // Ordering, not absolute time: all of the above was answered while every stalled shard
    // read was still blocked, and before any stalled read got its answer.
    assert_eq!(
        faults.stalled_now(),
        HELD_STALLS,
        "served while {HELD_STALLS} shard reads were stalled"
    );
    assert!(
        done_rx.try_recv().is_err(),
        "metadata, info.json and other steps were served before the stalled reads' deadline \
         (they took {ops_took:?})"
    );
    for _ in 0..HELD_STALLS {
        let (t, result, took) = done_rx
            .recv_timeout(PHASE_CAP)
            .expect("stalled read returns");
        let e = result.expect_err("a stalled read fails");
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EIO),
            "{}: {e}",
            targets[t].name
        );
        assert!(
            took >= DEADLINE && took <= ERROR_BOUND,
            "{}: EIO after {took:?}, expected within [{DEADLINE:?}, {ERROR_BOUND:?}]",
            targets[t].name
        );
    }
    assert_eq!(
        faults.stalled_now(),
        HELD_STALLS,
        "the stalled reads were answered by the deadline, not by their shard reads"
    );
    faults.release();
    for &t in &stalled {
        assert_eq!(
            mismatches(&fs::read(&targets[t].path).unwrap(), &targets[t].want),
            0,
            "{} after its stall",
            targets[t].name
        );
    }
}

/// Random faults from `READERS` threads until [`FAULTS_PER_VARIANT`] faults and
/// [`RANDOM_STALLS`] stalls were injected.
fn random_faults(faults: &Arc<Faults>, targets: &[Target], seed: u64, stalls: u64) -> Tally {
    let base = faults.total();
    faults.set_mode(
        Mode::Random {
            eio: 1000,
            short: 800,
            eof: 700,
            stall: 100,
        },
        stalls,
        None,
    );
    let start = Instant::now();
    let mut tally = Tally::default();
    std::thread::scope(|scope| {
        let readers: Vec<_> = (0..READERS)
            .map(|r| {
                scope.spawn(move || {
                    let mut rng = Rng::new(seed ^ (r + 1).wrapping_mul(0x1234_5678_9ABC_DEF1));
                    let mut tally = Tally::default();
                    while (faults.total() - base < FAULTS_PER_VARIANT || faults.stalls_left() > 0)
                        && start.elapsed() < PHASE_CAP
                    {
                        let t = rng.pick(targets);
                        tally.read(t);
                    }
                    tally
                })
            })
            .collect();
        for r in readers {
            tally.merge(r.join().unwrap());
        }
    });
    faults.release();
    assert!(
        faults.total() - base >= FAULTS_PER_VARIANT && faults.stalls_left() == 0,
        "not enough faults within {PHASE_CAP:?}: {}",
        faults.summary()
    );
    tally
}

/// Reads every target once (3 threads); returns how many were exactly right.
fn clean_pass(targets: &[Target]) -> Tally {
    let mut tally = Tally::default();
    std::thread::scope(|scope| {
        let chunk = targets.len().div_ceil(3);
        let readers: Vec<_> = targets
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let mut tally = Tally::default();
                    for t in part {
                        tally.read(t);
                    }
                    tally
                })
            })
            .collect();
        for r in readers {
            tally.merge(r.join().unwrap());
        }
    });
    tally
}

fn run_variant(with_cache: bool, seed: u64) {
    let _serial = lock(&SERIAL);
    let began = Instant::now();
    let fuse_before = fuse_mounts();
    // 120,000 u32 tokens in shards of 1,000 tokens: windows of 33 often straddle two shards.
    let data = Data::positional(120_000, 4000);
    let cfg = config(33, 32, 4, 2, seed, 2);
    let reference = data.fs(&cfg);
    let faults = Arc::new(Faults::new(seed));
    let m = faulty_mount(&data.path(), &cfg, &faults, with_cache);
    let mountpoint = m.path().to_path_buf();
    let targets = targets(&m, &reference, &cfg);
    let plan = reference.view().plan().clone();
    let step = move |e: u64, r: u64, s: u64| {
        (((e * plan.ranks()) + r) * plan.steps_per_epoch() + s) as usize
    };

    if with_cache {
        a_stalled_prefetch_never_fails_a_read(&m, &faults, &step, &targets);
    }
    a_stall_shorter_than_the_deadline_is_no_error(&faults, &targets[step(1, 0, 60)]);
    stalled_reads_leave_the_mount_responsive(&m, &faults, &reference, &step, &targets, with_cache);
    let random = random_faults(&faults, &targets, seed, RANDOM_STALLS);
    let clean = clean_pass(&targets);
    let stats = stats(m.path());

    let variant = if with_cache {
        "cache+prefetch"
    } else {
        "no cache"
    };
    eprintln!(
        "inject [{variant}]: faults {}; random phase: {} reads ok, {} failed (EIO), {} wrong \
         bytes, slowest failure {:?}; after faults: {}/{} reads exact; stats {}; {:?}",
        faults.summary(),
        random.ok,
        random.failed,
        random.wrong_bytes,
        random.max_error_latency,
        clean.ok - clean.problems.len().min(clean.ok as usize) as u64,
        targets.len(),
        stats["cache"],
        began.elapsed()
    );
    assert!(random.problems.is_empty(), "{:#?}", random.problems);
    assert_eq!(random.wrong_bytes, 0);
    assert!(
        random.ok > 0 && random.failed > 0,
        "faults both failed and spared reads"
    );
    for kind in [EIO, SHORT, EOF] {
        assert!(
            faults.count(kind) > 0,
            "no {} fault: {}",
            KIND_NAMES[kind],
            faults.summary()
        );
    }
    let prefetch_stalls = u64::from(with_cache);
    assert_eq!(
        faults.count(STALL),
        prefetch_stalls + 1 + HELD_STALLS + RANDOM_STALLS
    );
    assert!(clean.problems.is_empty(), "{:#?}", clean.problems);
    assert_eq!(
        (clean.ok, clean.failed),
        (targets.len() as u64, 0),
        "100% of reads are correct once faults stop"
    );
    if with_cache {
        assert!(
            stats["cache"]["prefetch_failed"].as_u64().unwrap() > 0,
            "some prefetches failed (and no later read suffered): {stats}"
        );
    }
    m.unmount();
    assert!(!is_mounted(&mountpoint), "no mount left at {mountpoint:?}");
    let fuse_after = fuse_mounts();
    if fuse_after != fuse_before {
        // Other processes may mount and unmount meanwhile: informational only.
        eprintln!("inject [{variant}]: FUSE mounts in /proc/mounts {fuse_before} -> {fuse_after}");
    }
}

#[test]
fn faults_without_cache_never_give_wrong_bytes() {
    if !fuse_available() {
        return;
    }
    run_variant(false, 0x5EED_0001);
}

#[test]
fn faults_with_cache_and_prefetch_never_give_wrong_bytes() {
    if !fuse_available() {
        return;
    }
    run_variant(true, 0x5EED_0002);
}

/// Faults in the shards and the document files of a dataset with documents, through every
/// kind of file that reads them (S.npy, S.json with metadata spans, observation/I.npy and
/// I.json): no wrong byte, every failure EIO within deadline + 1 s, all exact afterwards.
#[test]
fn faults_in_document_files_never_give_wrong_json() {
    if !fuse_available() {
        return;
    }
    let _serial = lock(&SERIAL);
    let began = Instant::now();
    let corpus = Corpus::new(400, 1024);
    let ds = corpus.ds.clone();
    let cfg = config(8, 8, 2, 2, 11, 2);
    let reference = ShuffleFs::new(View::open(&ds, &cfg).unwrap()).unwrap();
    let faults = Arc::new(Faults::new(0x5EED_0003));
    let m = faulty_mount(&ds, &cfg, &faults, false);
    let mountpoint = m.path().to_path_buf();
    let plan = reference.view().plan().clone();
    let mut names = Vec::new();
    for e in 0..plan.epochs() {
        for r in 0..plan.ranks() {
            for st in 0..plan.steps_per_epoch() {
                for ext in ["npy", "json"] {
                    names.push(format!("epoch/{e}/rank/{r}/step/{st}.{ext}"));
                }
            }
        }
    }
    for i in 0..plan.n_observations() {
        names.push(format!("observation/{i}.npy"));
        names.push(format!("observation/{i}.json"));
    }
    let targets: Vec<Target> = names
        .into_iter()
        .map(|name| Target {
            path: m.path().join(&name),
            want: read_all(&reference, &name),
            name,
        })
        .collect();
    // The model's S.json carries metadata rows: the document files are really read.
    let json = String::from_utf8(read_all(&reference, "epoch/0/rank/0/step/0.json")).unwrap();
    assert!(
        json.contains("\"rows\"") && json.contains("\"doc\""),
        "{json}"
    );
    // Look every file up first, fault-free: the kernel then keeps names and sizes (the TTL is a
    // year), so the stalls below reach only READs, which have a deadline. (A stalled LOOKUP
    // of a JSON file has none: see the ignored test below.)
    for t in &targets {
        assert_eq!(fs::metadata(&t.path).unwrap().len(), t.want.len() as u64);
    }
    let random = random_faults(&faults, &targets, 0x5EED_0003, RANDOM_STALLS);
    let clean = clean_pass(&targets);
    eprintln!(
        "inject [documents]: faults {}; random phase: {} reads ok, {} failed (EIO), {} wrong \
         bytes, slowest failure {:?}; after faults: {}/{} reads exact; {:?}",
        faults.summary(),
        random.ok,
        random.failed,
        random.wrong_bytes,
        random.max_error_latency,
        clean.ok,
        targets.len(),
        began.elapsed()
    );
    assert!(random.problems.is_empty(), "{:#?}", random.problems);
    assert_eq!(random.wrong_bytes, 0);
    assert!(random.ok > 0 && random.failed > 0);
    assert_eq!(faults.count(STALL), RANDOM_STALLS);
    assert!(clean.problems.is_empty(), "{:#?}", clean.problems);
    assert_eq!((clean.ok, clean.failed), (targets.len() as u64, 0));
    m.unmount();
    assert!(!is_mounted(&mountpoint));
}

/// Ends every stall when dropped (also when an assertion fails), so stalled threads finish and
/// the mount can be unmounted.
struct ReleaseOnDrop(Arc<Faults>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// In a dataset with documents, the size of `S.json` (and `observation/I.json`) depends on the
/// metadata spans, so `stat` reads the document files. Those reads stall like any other: `stat`
/// must then fail with EIO within deadline + 1 s, and the mount must keep serving others.
#[test]
fn stat_that_reads_document_files_has_a_deadline() {
    if !fuse_available() {
        return;
    }
    let _serial = lock(&SERIAL);
    let corpus = Corpus::new(400, 1024);
    let ds = corpus.ds.clone();
    let cfg = config(8, 8, 2, 2, 3, 2);
    let faults = Arc::new(Faults::new(7));
    let m = faulty_mount(&ds, &cfg, &faults, false);
    let _release = ReleaseOnDrop(faults.clone());
    let (started_tx, started_rx) = mpsc::channel();
    faults.set_mode(
        Mode::StallNext {
            n: 3,
            prefetch: false,
        },
        0,
        Some(started_tx),
    );
    let (done_tx, done_rx) = mpsc::channel();
    // Three files in three directories, never looked up before.
    for (e, r) in [(0, 0), (0, 1), (1, 0)] {
        let (path, done_tx) = (m.step(e, r, 5, "json"), done_tx.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            let result = fs::metadata(&path);
            let _ = done_tx.send((path, result.map(|m| m.len()), start.elapsed()));
        });
        started_rx
            .recv_timeout(PHASE_CAP)
            .expect("stat reached the document files and stalled");
    }
    let (info_tx, info_rx) = mpsc::channel();
    let info = m.path().join("info.json");
    std::thread::spawn(move || {
        let _ = info_tx.send(fs::read(info));
    });
    for _ in 0..3 {
        let (path, result, took) = done_rx
            .recv_timeout(ERROR_BOUND)
            .expect("a stalled stat returns within deadline + 1 s");
        let e = result.expect_err("a stalled stat fails");
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{path:?}: {e}");
        assert!(took <= ERROR_BOUND, "{path:?}: {took:?}");
    }
    let served = info_rx.recv_timeout(ERROR_BOUND);
    assert!(
        matches!(served, Ok(Ok(_))),
        "info.json is served while three stats are stalled: {served:?}"
    );
}

/// Every shard-reading thread stalled: the two FUSE threads that may read shards and all 64
/// threads of the deadline pool. Further reads wait in the pool's queue and still fail with EIO
/// within deadline + 1 s; `stat`, `ls` and `info.json` are still served; after the release the
/// queued reads' late answers are discarded and every read is exact.
#[test]
fn a_saturated_pool_still_answers_within_the_deadline() {
    if !fuse_available() {
        return;
    }
    let _serial = lock(&SERIAL);
    /// FUSE threads that read shards (threads - 1) plus the pool's cap (fuse.rs).
    const ALL_SHARD_THREADS: u64 = 2 + 64;
    let data = Data::positional(120_000, 4000);
    let cfg = config(33, 32, 4, 2, 9, 2);
    let reference = data.fs(&cfg);
    let faults = Arc::new(Faults::new(9));
    let m = faulty_mount(&data.path(), &cfg, &faults, false);
    let mountpoint = m.path().to_path_buf();
    let release = ReleaseOnDrop(faults.clone());
    let targets = targets(&m, &reference, &cfg);
    let (started_tx, started_rx) = mpsc::channel();
    faults.set_mode(
        Mode::StallNext {
            n: ALL_SHARD_THREADS,
            prefetch: false,
        },
        0,
        Some(started_tx),
    );
    let (done_tx, done_rx) = mpsc::channel();
    let spawn_reader = |t: usize| {
        let (path, done_tx) = (targets[t].path.clone(), done_tx.clone());
        std::thread::spawn(move || {
            let start = Instant::now();
            let result = fs::read(&path);
            let _ = done_tx.send((t, result, start.elapsed()));
        });
    };
    for k in 0..ALL_SHARD_THREADS as usize {
        spawn_reader(k);
        started_rx
            .recv_timeout(PHASE_CAP)
            .unwrap_or_else(|_| panic!("read {k} reached the shards and stalled"));
    }
    assert_eq!(faults.stalled_now(), ALL_SHARD_THREADS);
    // No thread is left to read shards: these wait in the queue.
    let queued = 100..105;
    for k in queued.clone() {
        spawn_reader(k);
    }
    assert_eq!(
        fs::read(m.path().join("info.json")).unwrap(),
        reference.view().info_json()
    );
    assert_eq!(
        fs::read_dir(m.path().join("epoch/1/rank/1/step"))
            .unwrap()
            .count() as u64,
        2 * reference.view().plan().steps_per_epoch()
    );
    assert!(fs::metadata(m.step(1, 1, 3, "json")).is_ok());
    let mut failed = 0;
    for _ in 0..ALL_SHARD_THREADS as usize + queued.len() {
        let (t, result, took) = done_rx.recv_timeout(PHASE_CAP).expect("every read returns");
        let e = result.expect_err("no shard read could complete");
        assert_eq!(
            e.raw_os_error(),
            Some(libc::EIO),
            "{}: {e}",
            targets[t].name
        );
        assert!(
            took <= ERROR_BOUND,
            "{}: EIO after {took:?}",
            targets[t].name
        );
        failed += 1;
    }
    assert_eq!(
        faults.stalled_now(),
        ALL_SHARD_THREADS,
        "all answered by the deadline while every shard read was stalled"
    );
    drop(release);
    let clean = clean_pass(&targets);
    assert!(clean.problems.is_empty(), "{:#?}", clean.problems);
    assert_eq!(clean.ok, targets.len() as u64);
    eprintln!(
        "inject [saturated pool]: {} stalls, {failed} reads failed with EIO within {ERROR_BOUND:?}, \
         then {}/{} exact",
        faults.count(STALL),
        clean.ok,
        targets.len()
    );
    m.unmount();
    assert!(!is_mounted(&mountpoint));
}

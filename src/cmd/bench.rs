//! `shufflefs bench`: times reading step files, straight from the shards or through a mount,
//! and prints one JSON line. `scripts/bench.sh` runs it in interleaved repetitions.
//!
//! `--source direct` is the physical limit a FUSE filesystem is compared against: for each
//! step file it preads exactly the windows of its rows from the shards into one reusable
//! buffer (one pread per window piece), with no FUSE in the way. `--source mount` opens each
//! `S.npy` under the mount point and reads it whole into a reusable buffer.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::cli::{BenchArgs, BenchFile, BenchSource};
use crate::error::{Error, Result};
use crate::prefill::PREFILL_DEPTH;
use crate::shuffle::plan::StepKey;
use crate::view::{View, ViewConfig};

/// Runs `bench`.
pub(crate) fn run(args: BenchArgs) -> Result<()> {
    let view = View::open(&args.dataset_dir, &ViewConfig::from(&args.plan))?;
    if args.source == BenchSource::Permutation {
        return bench_permutation(&view, args.files);
    }
    let plan = view.plan();
    let per_epoch = plan.steps_per_epoch() * plan.ranks();
    let available = per_epoch * plan.epochs();
    if args.files.saturating_add(args.skip) > available {
        return Err(Error::invalid(format!(
            "--skip {} + --files {} is more than the {available} step files of this plan; \
             raise --epochs",
            args.skip, args.files
        )));
    }
    let key = |i: u64| {
        let i = i + args.skip;
        StepKey {
            epoch: i / per_epoch,
            step: (i % per_epoch) / plan.ranks(),
            rank: i % plan.ranks(),
        }
    };
    let readers = args.readers.max(1) as u64;
    let mountpoint = match (args.source, &args.mountpoint) {
        (BenchSource::Mount, Some(m)) => Some(m.as_path()),
        (BenchSource::Mount, None) => {
            return Err(Error::invalid("--source mount needs --mountpoint"));
        }
        (BenchSource::Direct, _) => None,
        (BenchSource::Permutation, _) => unreachable!("handled above"),
    };
    let len = view.step_npy_len() as usize;
    let syscalls_before = read_syscalls();
    let start = Instant::now();
    let bytes: Result<(u64, Vec<u32>, Duration)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..readers)
            .map(|t| {
                let view = &view;
                scope.spawn(move || -> Result<(u64, Vec<u32>, Duration)> {
                    // Page-aligned, as a loader's pinned buffer would be (a malloc'ed buffer
                    // at page + 16 copies measurably slower from the page cache).
                    let mut raw = vec![0u8; len + 1 + 4096];
                    let off = raw.as_ptr().align_offset(4096);
                    let buf = &mut raw[off..off + len + 1];
                    let mut total = 0u64;
                    let mut json = Vec::new();
                    let mut latencies = Vec::new();
                    // --prestored: only reads of steps already in the page cache are timed.
                    let mut timed = Duration::ZERO;
                    let mut timed_bytes = 0u64;
                    let mut first = true;
                    for i in (t..args.files).step_by(readers as usize) {
                        let k = key(i);
                        let ordinal = plan.global_step(k);
                        let signal =
                            args.prestored && (first || ordinal.is_multiple_of(PREFILL_DEPTH / 2));
                        first = false;
                        let began = Instant::now();
                        total += match (mountpoint, args.file) {
                            (None, BenchFile::Npy) => view.read_step_npy(key(i), 0, buf)? as u64,
                            (None, BenchFile::Json) => {
                                json.clear();
                                view.write_step_json(key(i), &mut json)?;
                                json.len() as u64
                            }
                            (Some(m), file) => read_file(m, key(i), file, buf)?,
                        };
                        if args.pace_us > 0 {
                            latencies.push(began.elapsed().as_micros() as u32);
                            std::thread::sleep(Duration::from_micros(args.pace_us));
                        }
                        if args.prestored {
                            if signal {
                                // The daemon hears of this read and stores the next steps:
                                // give it time to (a benchmark, not a test).
                                std::thread::sleep(Duration::from_millis(40));
                            } else {
                                timed += began.elapsed();
                                timed_bytes += len as u64;
                            }
                        }
                    }
                    if args.prestored {
                        return Ok((timed_bytes, latencies, timed));
                    }
                    Ok((total, latencies, Duration::ZERO))
                })
            })
            .collect();
        let mut total = 0;
        let mut all = Vec::new();
        let mut timed = Duration::ZERO;
        for h in handles {
            let (bytes, latencies, t) = h.join().expect("reader thread")?;
            total += bytes;
            all.extend(latencies);
            timed = timed.max(t);
        }
        Ok((total, all, timed))
    });
    let (bytes, mut latencies, timed) = bytes?;
    latencies.sort_unstable();
    let percentile = |p: f64| {
        (!latencies.is_empty())
            .then(|| latencies[((latencies.len() - 1) as f64 * p).round() as usize])
    };
    let mut secs = start.elapsed().as_secs_f64();
    let syscalls = read_syscalls().zip(syscalls_before).map(|(a, b)| a - b);
    let expected = args.files * len as u64;
    let mut files = args.files;
    if args.prestored {
        // Only the timed reads count (the slowest reader's time: they ran in parallel).
        secs = timed.as_secs_f64();
        files = bytes / len as u64;
    } else if args.file == BenchFile::Npy && bytes != expected {
        return Err(Error::invalid(format!(
            "read {bytes} bytes, expected {expected}: short step files"
        )));
    }
    let tokens = files * plan.batch_size() * view.info().window;
    say!(
        "{}",
        serde_json::json!({
            "source": match args.source {
                BenchSource::Direct => "direct",
                BenchSource::Mount => "mount",
                BenchSource::Permutation => "permutation",
            },
            "file": match args.file { BenchFile::Npy => "npy", BenchFile::Json => "json" },
            "readers": readers,
            "files": files,
            "bytes": bytes,
            "secs": secs,
            "files_per_s": files as f64 / secs,
            "tokens_per_s": tokens as f64 / secs,
            "mib_per_s": bytes as f64 / secs / (1 << 20) as f64,
            "read_syscalls_per_file": syscalls.map(|n| n as f64 / args.files as f64),
            "pace_us": args.pace_us,
            "latency_p50_us": percentile(0.5),
            "latency_p99_us": percentile(0.99),
        })
    );
    Ok(())
}

/// `--files` million permutation indices on one thread (the cost of the shuffle itself).
fn bench_permutation(view: &View, millions: u64) -> Result<()> {
    let plan = view.plan();
    let perm = plan.permutation(0);
    let n = millions * 1_000_000;
    let domain = plan.n_observations();
    // Batched (what the read path uses), then one index at a time, over the same indices.
    let mut buf = vec![0u64; 4096];
    let start = Instant::now();
    let mut acc = 0u64;
    let mut done = 0u64;
    while done < n {
        let pos = done % domain;
        let chunk = (buf.len() as u64).min(domain - pos).min(n - done) as usize;
        perm.apply_strided(pos, 1, &mut buf[..chunk]);
        acc = buf[..chunk].iter().fold(acc, |a, &v| a ^ v);
        done += chunk as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let mut scalar_acc = 0u64;
    let mut done = 0u64;
    while done < n {
        let chunk = domain.min(n - done);
        for i in 0..chunk {
            scalar_acc ^= perm.apply(i);
        }
        done += chunk;
    }
    let scalar_secs = start.elapsed().as_secs_f64();
    if scalar_acc != acc {
        return Err(Error::invalid("batched and scalar permutation disagree"));
    }
    say!(
        "{}",
        serde_json::json!({
            "source": "permutation",
            "indices": n,
            "secs": secs,
            "indices_per_s": n as f64 / secs,
            "scalar_indices_per_s": n as f64 / scalar_secs,
            "domain": plan.n_observations(),
            "checksum": acc,
        })
    );
    Ok(())
}

/// Read system calls (read, pread, ...) this process has made, from /proc/self/io.
fn read_syscalls() -> Option<u64> {
    std::fs::read_to_string("/proc/self/io")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("syscr:"))
        .and_then(|v| v.trim().parse().ok())
}

fn read_file(mountpoint: &Path, key: StepKey, file: BenchFile, buf: &mut [u8]) -> Result<u64> {
    let path = mountpoint.join(crate::tree::step_path(key, file == BenchFile::Json));
    let mut f = File::open(&path).map_err(|e| Error::io(&path, e))?;
    let mut filled = 0;
    loop {
        let n = f
            .read(&mut buf[filled..])
            .map_err(|e| Error::io(&path, e))?;
        if n == 0 {
            return Ok(filled as u64);
        }
        filled += n;
        if filled == buf.len() {
            return Err(Error::invalid(format!(
                "{}: longer than stat says",
                path.display()
            )));
        }
    }
}

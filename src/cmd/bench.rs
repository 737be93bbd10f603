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
use std::time::Instant;

use crate::cli::{BenchArgs, BenchSource};
use crate::error::{Error, Result};
use crate::plan::StepKey;
use crate::view::{View, ViewConfig};

/// Runs `bench`.
pub fn run(args: BenchArgs) -> Result<()> {
    let view = View::open(&args.dataset_dir, &ViewConfig::from(&args.plan))?;
    let plan = view.plan();
    let per_epoch = plan.steps_per_epoch() * plan.ranks();
    let available = per_epoch * plan.epochs();
    if args.files > available {
        return Err(Error::invalid(format!(
            "--files {} is more than the {available} step files of this plan; raise --epochs",
            args.files
        )));
    }
    let key = |i: u64| StepKey {
        epoch: i / per_epoch,
        step: (i % per_epoch) / plan.ranks(),
        rank: i % plan.ranks(),
    };
    let readers = args.readers.max(1) as u64;
    let mountpoint = match (args.source, &args.mountpoint) {
        (BenchSource::Mount, Some(m)) => Some(m.as_path()),
        (BenchSource::Mount, None) => {
            return Err(Error::invalid("--source mount needs --mountpoint"));
        }
        (BenchSource::Direct, _) => None,
    };
    let len = view.step_npy_len() as usize;
    let start = Instant::now();
    let bytes: Result<u64> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..readers)
            .map(|t| {
                let view = &view;
                scope.spawn(move || -> Result<u64> {
                    let mut buf = vec![0u8; len + 1];
                    let mut total = 0u64;
                    for i in (t..args.files).step_by(readers as usize) {
                        total += match mountpoint {
                            None => view.read_step_npy(key(i), 0, &mut buf)? as u64,
                            Some(m) => read_file(m, key(i), &mut buf)?,
                        };
                    }
                    Ok(total)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("reader thread"))
            .sum()
    });
    let bytes = bytes?;
    let secs = start.elapsed().as_secs_f64();
    let expected = args.files * len as u64;
    if bytes != expected {
        return Err(Error::invalid(format!(
            "read {bytes} bytes, expected {expected}: short step files"
        )));
    }
    let tokens = args.files * plan.batch_size() * view.info().window;
    println!(
        "{}",
        serde_json::json!({
            "source": match args.source { BenchSource::Direct => "direct", BenchSource::Mount => "mount" },
            "readers": readers,
            "files": args.files,
            "bytes": bytes,
            "secs": secs,
            "files_per_s": args.files as f64 / secs,
            "tokens_per_s": tokens as f64 / secs,
            "mib_per_s": bytes as f64 / secs / (1 << 20) as f64,
        })
    );
    Ok(())
}

fn read_file(mountpoint: &Path, key: StepKey, buf: &mut [u8]) -> Result<u64> {
    let path = mountpoint.join(format!(
        "epoch/{}/rank/{}/step/{}.npy",
        key.epoch, key.rank, key.step
    ));
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

//! Remote storage benchmark: the same dataset mounted from local disk and from S3 (a loopback
//! S3 server, `s3.rs`, behind a proxy that adds a fixed latency to every request), read by a
//! paced trainer (read a step, compute, repeat) and an unpaced reader; then a 1 TiB dataset of
//! virtual objects, to show the daemon's memory stays within its bound.
//!
//! ```sh
//! cargo build --release --bin shufflefs --example remote_bench
//! target/release/examples/remote_bench --bin target/release/shufflefs [--quick]
//! ```
//!
//! Prints one table of rows (medians where repeated); no thresholds.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[path = "../../tests/it/common/proxy.rs"]
#[allow(dead_code)]
mod proxy;
mod s3;

/// The plan every mount uses: one rank reading its steps in order.
const PLAN: [&str; 8] = [
    "--window",
    "2048",
    "--batch-size",
    "32",
    "--ranks",
    "1",
    "--seed",
    "7",
];

struct Args {
    bin: PathBuf,
    latency: Duration,
    compute: Duration,
    paced_steps: u64,
    unpaced_steps: u64,
    tokens: u64,
    tib: u64,
}

fn args() -> Args {
    let mut a = Args {
        bin: PathBuf::from("target/release/shufflefs"),
        latency: Duration::from_millis(20),
        compute: Duration::from_millis(50),
        paced_steps: 600,
        unpaced_steps: 1000,
        tokens: 128 << 20,
        tib: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().expect("a value after the flag");
        match flag.as_str() {
            "--bin" => a.bin = PathBuf::from(value()),
            "--latency-ms" => a.latency = Duration::from_millis(value().parse().unwrap()),
            "--compute-ms" => a.compute = Duration::from_millis(value().parse().unwrap()),
            "--paced-steps" => a.paced_steps = value().parse().unwrap(),
            "--unpaced-steps" => a.unpaced_steps = value().parse().unwrap(),
            "--tib" => a.tib = value().parse().unwrap(),
            "--quick" => {
                a.paced_steps = 40;
                a.unpaced_steps = 100;
                a.tokens = 8 << 20;
            }
            other => panic!("unknown flag {other}"),
        }
    }
    a.bin = std::path::absolute(&a.bin).unwrap();
    a
}

/// A mounted source: its mount point and daemon pid; unmounted when dropped.
struct Mounted<'a> {
    bin: &'a Path,
    dir: tempfile::TempDir,
    pid: u32,
    /// Mount command to first step read.
    first: Duration,
}

impl Drop for Mounted<'_> {
    fn drop(&mut self) {
        let _ = Command::new(self.bin)
            .arg("unmount")
            .arg(self.dir.path())
            .output();
    }
}

/// Mounts `source` (a directory or URL) with `env`, and reads step 0.
fn mount<'a>(bin: &'a Path, source: &str, env: &[(String, String)]) -> Mounted<'a> {
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let o = Command::new(bin)
        .args(["mount", source])
        .arg(dir.path())
        .args(PLAN)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mount {source}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read(step(dir.path(), 0)).unwrap();
    let first = started.elapsed();
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    let pid = text
        .split("daemon pid ")
        .nth(1)
        .and_then(|t| t.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    Mounted {
        bin,
        dir,
        pid,
        first,
    }
}

fn step(mnt: &Path, s: u64) -> PathBuf {
    mnt.join(format!("epoch/0/rank/0/step/{s}.npy"))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn quantile(v: &[Duration], q: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[((v.len() - 1) as f64 * q).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Reads steps `1..=n` of a mount, `compute` apart: each read's latency and the total time.
fn paced(m: &Mounted, n: u64, compute: Duration) -> (Vec<Duration>, Duration) {
    let started = Instant::now();
    let mut lat = Vec::with_capacity(n as usize);
    for s in 1..=n {
        let t = Instant::now();
        std::fs::read(step(m.dir.path(), s)).unwrap();
        lat.push(t.elapsed());
        std::thread::sleep(compute);
    }
    (lat, started.elapsed())
}

/// Reads steps `1..=n` as fast as possible: bytes per second.
fn unpaced(m: &Mounted, n: u64) -> f64 {
    let started = Instant::now();
    let mut bytes = 0;
    for s in 1..=n {
        bytes += std::fs::read(step(m.dir.path(), s)).unwrap().len();
    }
    bytes as f64 / started.elapsed().as_secs_f64()
}

/// The daemon's peak resident memory (VmHWM), in MiB.
fn peak_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// A packed dataset's manifest over `shards` virtual objects of `size` bytes of u16 tokens.
fn virtual_manifest(shards: u64, size: u64) -> Vec<u8> {
    let entries: Vec<serde_json::Value> = (0..shards)
        .map(|i| {
            serde_json::json!({
                "path": format!("shard-{i:05}.bin"),
                "records": size / 2,
                "bytes": size,
                "hash": format!("{:016x}", i + 1),
            })
        })
        .collect();
    let mut m: shufflefs::Manifest = serde_json::from_value(serde_json::json!({
        "format": "shufflefs-dataset",
        "version": 4,
        "dtype": "<u2",
        "itemsize": 2,
        "records": shards * size / 2,
        "shards": entries,
        "content_hash": "",
        "created_by": "remote_bench",
    }))
    .unwrap();
    m.content_hash = m.expected_content_hash();
    m.to_bytes()
}

fn main() {
    let a = args();
    let root = tempfile::tempdir().unwrap();
    // The dataset: synthetic u16 tokens, packed (copied into shards), served from `root`.
    let tokens = root.path().join("tokens.bin");
    let ds = root.path().join("ds");
    let run = |args: &[&str]| {
        let o = Command::new(&a.bin).args(args).output().unwrap();
        assert!(
            o.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    let t = a.tokens.to_string();
    run(&[
        "synth",
        tokens.to_str().unwrap(),
        "--tokens",
        &t,
        "--dtype",
        "u16",
    ]);
    run(&[
        "pack",
        ds.to_str().unwrap(),
        tokens.to_str().unwrap(),
        "--dtype",
        "u16",
        "--no-progress",
    ]);
    std::fs::remove_file(&tokens).unwrap();
    // 1 TiB of virtual objects: 256 shards of 4 GiB (only the manifest is a file).
    let shard_size: u64 = 4 << 30;
    let shards = (a.tib << 40) / shard_size;
    let tib_dir = root.path().join("virtual/tib");
    std::fs::create_dir_all(&tib_dir).unwrap();
    std::fs::write(
        tib_dir.join("manifest.json"),
        virtual_manifest(shards, shard_size),
    )
    .unwrap();

    let server = s3::start(root.path().to_path_buf(), shard_size);
    let slow = proxy::FaultProxy::start(server);
    slow.set(a.latency, &[], false);
    let env = |endpoint: String| -> Vec<(String, String)> {
        [
            ("AWS_ACCESS_KEY_ID", "bench"),
            ("AWS_SECRET_ACCESS_KEY", "bench"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ENDPOINT_URL", endpoint.as_str()),
            ("AWS_METADATA_ENDPOINT", "http://127.0.0.1:9"),
            ("AWS_CONFIG_FILE", "/nonexistent"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    };
    let direct = env(format!("http://{server}"));
    let delayed = env(slow.url());
    let local = ds.to_str().unwrap().to_string();
    let url = "s3://bench/ds".to_string();
    let lat_ms = a.latency.as_millis();

    println!("| row | local disk | S3, 0 ms | S3, {lat_ms} ms per request | ratio |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    // Mount + first step: medians of 5, interleaved.
    let (mut l, mut d, mut s) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        l.push(mount(&a.bin, &local, &[]).first);
        d.push(mount(&a.bin, &url, &direct).first);
        s.push(mount(&a.bin, &url, &delayed).first);
    }
    let (l, d, s) = (median(l), median(d), median(s));
    println!(
        "| mount + first step | {} | {} | {} | {:.1} round trips |",
        ms(l),
        ms(d),
        ms(s),
        (s.saturating_sub(d)).as_secs_f64() / a.latency.as_secs_f64()
    );
    // The paced trainer.
    let lm = mount(&a.bin, &local, &[]);
    let (l_lat, l_total) = paced(&lm, a.paced_steps, a.compute);
    drop(lm);
    let sm = mount(&a.bin, &url, &delayed);
    let (s_lat, s_total) = paced(&sm, a.paced_steps, a.compute);
    drop(sm);
    println!(
        "| paced loop ({} steps, {} ms compute): total | {:.2} s | | {:.2} s | {:.3}x |",
        a.paced_steps,
        a.compute.as_millis(),
        l_total.as_secs_f64(),
        s_total.as_secs_f64(),
        s_total.as_secs_f64() / l_total.as_secs_f64()
    );
    for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
        let (lq, sq) = (quantile(&l_lat, q), quantile(&s_lat, q));
        println!(
            "| paced read latency {name} | {} | | {} | {:.2}x |",
            ms(lq),
            ms(sq),
            sq.as_secs_f64() / lq.as_secs_f64()
        );
    }
    let waited = s_lat[5.min(s_lat.len())..]
        .iter()
        .filter(|d| **d >= a.latency)
        .count();
    println!("| paced reads after step 5 waiting >= one round trip | | | {waited} | |");
    // Unpaced.
    let lm = mount(&a.bin, &local, &[]);
    let lb = unpaced(&lm, a.unpaced_steps);
    drop(lm);
    let dm = mount(&a.bin, &url, &direct);
    let db = unpaced(&dm, a.unpaced_steps);
    drop(dm);
    println!(
        "| unpaced ({} steps) | {:.0} MB/s | {:.0} MB/s | | {:.2}x |",
        a.unpaced_steps,
        lb / 1e6,
        db / 1e6,
        db / lb
    );
    // Memory: a 1 TiB dataset, 256 MiB cache (the default), read unpaced.
    let tm = mount(&a.bin, "s3://bench/virtual/tib", &direct);
    let tb = unpaced(&tm, a.unpaced_steps);
    println!(
        "| {} TiB virtual dataset: daemon peak memory after {} steps | | {:.0} MiB ({:.0} MB/s) | | cache 256 MiB |",
        a.tib,
        a.unpaced_steps + 1,
        peak_mib(tm.pid),
        tb / 1e6
    );
}

//! `shufflefs mount DATASET_DIR MOUNTPOINT --window W --batch-size B [...]`
//!
//! Everything that can fail for a user reason (bad dataset, bad plan, bad mount point) is
//! checked in the calling process, so the error reaches the terminal and the exit code is
//! non-zero. Then, unless `--foreground`, the process forks: the child mounts, reports
//! readiness through a pipe and serves until SIGINT/SIGTERM/SIGHUP or an external unmount;
//! the parent returns once the mount is ready (exit 0) or the child failed (its exit code).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use log::{error, info};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, fork, setsid};

use crate::cli::MountArgs;
use crate::error::{Error, Result};
use crate::fs::ShuffleFs;
use crate::fuse::Ownership;
use crate::logging;
use crate::mount::{MountOptions, default_threads, mount, prepare_mountpoint};
use crate::prefetch::PrefetchConfig;
use crate::view::{View, ViewConfig};

/// More FUSE workers than this only add contention (the kernel serves one queue).
const MAX_THREADS: usize = 256;

/// A duration in seconds (`0`: none).
fn parse_seconds(flag: &str, text: &str) -> Result<Option<Duration>> {
    let secs: f64 = text
        .trim()
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s >= 0.0 && *s <= 1e9)
        .ok_or_else(|| {
            Error::invalid(format!(
                "{flag} {text}: expected a number of seconds such as 30 or 0.5 (0 disables)"
            ))
        })?;
    Ok((secs > 0.0).then(|| Duration::from_secs_f64(secs)))
}

/// Octal permission bits without write bits.
fn parse_mode(flag: &str, text: &str) -> Result<u16> {
    let mode = u16::from_str_radix(text.trim().trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| {
            Error::invalid(format!("{flag} {text}: expected octal bits such as 0444"))
        })?;
    if mode & 0o222 != 0 {
        return Err(Error::invalid(format!(
            "{flag} {text}: shufflefs is read-only; drop the write bits (e.g. {:04o})",
            mode & !0o222
        )));
    }
    Ok(mode)
}

/// Runs `mount`.
pub fn run(mut args: MountArgs) -> Result<()> {
    raise_open_file_limit();
    if let Some(path) = &args.log_file {
        // The daemon changes directory to /: resolve the path now, and prove it is writable
        // while errors still reach the terminal.
        let abs = std::path::absolute(path).map_err(|e| Error::io(path, e))?;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&abs)
            .map_err(|e| Error::io(&abs, e))?;
        args.log_file = Some(abs);
    }
    if args.max_open_shards == 0 {
        return Err(Error::invalid("--max-open-shards must be at least 1"));
    }
    let mut dataset =
        crate::dataset::Dataset::open_bounded(&args.dataset_dir, args.max_open_shards)?;
    if args.verify_reads {
        dataset = dataset.with_verified_reads()?;
        info!("--verify-reads: every shard read is checked against the block checksums");
    }
    let view = View::new(dataset, &ViewConfig::from(&args.plan))?;
    let info = view.info();
    info!(
        "dataset {}: {} tokens, {} observations of {} (stride {}), {} steps/epoch x {} ranks x \
         {} epochs, fingerprint {}",
        args.dataset_dir.display(),
        info.n_tokens,
        info.n_observations,
        info.window,
        info.stride,
        info.steps_per_epoch,
        info.ranks,
        info.epochs,
        info.fingerprint
    );
    let cache_size = crate::pack::parse_size(&args.cache_size)?;
    if args.prefetch_workers > MAX_THREADS {
        return Err(Error::invalid(format!(
            "--prefetch-workers {} is out of range: use 0 to {MAX_THREADS}",
            args.prefetch_workers
        )));
    }
    if let Some(expected) = &args.expect_fingerprint
        && !expected.trim().eq_ignore_ascii_case(&info.fingerprint)
    {
        return Err(Error::invalid(format!(
            "--expect-fingerprint {expected} does not match this mount's fingerprint {}: the \
             dataset (its content or checksums), the plan options (seed, window, stride, batch \
             size, ranks, epochs, mode, pad id) or the format or algorithm version differ from \
             the run being resumed; compare `shufflefs plan DATASET_DIR ... --info` outputs, or \
             drop the flag to start a new order",
            info.fingerprint
        )));
    }
    let read_timeout = parse_seconds("--read-timeout", &args.read_timeout)?;
    let owner = Ownership {
        uid: args.uid.unwrap_or_else(|| nix::unistd::getuid().as_raw()),
        gid: args.gid.unwrap_or_else(|| nix::unistd::getgid().as_raw()),
        file_mode: parse_mode("--file-mode", &args.file_mode)?,
        dir_mode: parse_mode("--dir-mode", &args.dir_mode)?,
    };
    if cache_size > 0 && args.prefetch_depth > 0 && args.prefetch_workers == 0 {
        return Err(Error::invalid(
            "--prefetch-workers 0 would queue prefetches that never run: use --prefetch-depth 0 \
             to turn prefetch off",
        ));
    }
    if args.prefill && (cache_size == 0 || args.prefetch_depth == 0) {
        return Err(Error::invalid(
            "--prefill pushes prefetched steps into the page cache: it needs the step cache \
             and prefetch (drop --cache-size 0 / --prefetch-depth 0)",
        ));
    }
    let mut fs = ShuffleFs::new(view)?;
    if args.stub_reads {
        log::warn!("--stub-reads: every step file serves the same bytes (benchmarking only)");
        fs = fs.with_stub_reads()?;
    }
    // Threads (prefetch workers) may only start after the fork: serve() adds the cache.
    let cache = (cache_size > 0).then_some((
        cache_size,
        PrefetchConfig {
            depth: args.prefetch_depth,
            workers: args.prefetch_workers,
            adaptive: true,
        },
    ));
    let mountpoint = prepare_mountpoint(&args.mountpoint, args.on_top)?;
    let dataset = args
        .dataset_dir
        .canonicalize()
        .unwrap_or_else(|_| args.dataset_dir.clone());
    let threads = args.threads.unwrap_or_else(default_threads);
    if !(1..=MAX_THREADS).contains(&threads) {
        return Err(Error::invalid(format!(
            "--threads {threads} is out of range: use 1 to {MAX_THREADS} (default: cores + 1)"
        )));
    }
    let options = MountOptions {
        threads,
        allow_other: args.allow_other,
        fsname: dataset.display().to_string(),
        owner,
        read_timeout,
        on_top: args.on_top,
        prefill: args.prefill,
    };
    if args.foreground {
        return serve(fs, cache, &mountpoint, &options, None);
    }
    // Close-on-exec, so helpers spawned while mounting (fusermount3) do not hold the pipe.
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::io("pipe", e.into()))?;
    if thread_count() != Some(1) {
        return Err(Error::invalid(
            "internal error: threads exist before fork; run with --foreground",
        ));
    }
    // SAFETY: the process is single-threaded (checked just above), so the child may run
    // arbitrary code after fork.
    match unsafe { fork() }.map_err(|e| Error::io("fork", e.into()))? {
        ForkResult::Parent { child } => {
            drop(write_end);
            let mut status = [0u8; 1];
            let mut pipe = File::from(read_end);
            let ready = loop {
                match pipe.read(&mut status) {
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    other => break other.ok() == Some(1),
                }
            };
            if ready && status[0] == b'1' {
                say!(
                    "mounted {} at {} (daemon pid {child}, fingerprint {})",
                    dataset.display(),
                    mountpoint.display(),
                    fs_fingerprint_hint(&mountpoint)
                );
                return Ok(());
            }
            // The child reported its error on stderr; pass on its exit code.
            let code = match waitpid(child, None) {
                Ok(WaitStatus::Exited(_, code)) if code != 0 => code,
                _ => 1,
            };
            std::process::exit(code);
        }
        ForkResult::Child => {
            drop(read_end);
            let _ = setsid();
            let _ = std::env::set_current_dir("/");
            redirect_to_null(&[0, 1]);
            let background = Background {
                ready: write_end,
                log_file: args.log_file.clone(),
            };
            if let Err(e) = serve(fs, cache, &mountpoint, &options, Some(background)) {
                // Before readiness this reaches the terminal (the parent relays the exit
                // code); after it, the log file or syslog.
                if logging::is_stderr() {
                    eprintln!("error: {e}");
                } else {
                    error!("{e}");
                }
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

/// The fingerprint as served by the fresh mount (read back through it, which also proves the
/// mount answers).
fn fs_fingerprint_hint(mountpoint: &Path) -> String {
    std::fs::read(mountpoint.join("info.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["fingerprint"].as_str().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Number of threads of this process, from /proc/self/status.
fn thread_count() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

/// One descriptor stays open per shard: raise the soft open-file limit to the hard limit.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// What a background daemon does once mounted.
struct Background {
    ready: OwnedFd,
    log_file: Option<PathBuf>,
}

fn redirect_to_null(fds: &[i32]) {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for &fd in fds {
            // SAFETY: dup2 onto a standard descriptor number; `null` is a valid open fd.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// Mounts and serves until a signal or an external unmount, then unmounts cleanly.
fn serve(
    fs: ShuffleFs,
    cache: Option<(u64, PrefetchConfig)>,
    mountpoint: &Path,
    options: &MountOptions,
    background: Option<Background>,
) -> Result<()> {
    // Block the shutdown signals before any thread exists, so every thread inherits the mask
    // and only the sigtimedwait below receives them.
    let mut signals = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        signals.add(s);
    }
    signals
        .thread_block()
        .map_err(|e| Error::io("sigprocmask", e.into()))?;
    let fs = match cache {
        Some((budget, prefetch)) => fs.with_cache(budget, prefetch),
        None => fs,
    };
    let mounted = mount(fs, mountpoint, options)?;
    match background {
        Some(bg) => {
            match &bg.log_file {
                Some(path) => logging::to_file(path)?,
                None => logging::to_syslog(),
            }
            info!("serving {} in the background", mountpoint.display());
            redirect_to_null(&[2]);
            let mut ready = File::from(bg.ready);
            let _ = ready.write_all(b"1");
        }
        None => info!(
            "serving {} in the foreground; Ctrl-C or SIGTERM unmounts",
            mountpoint.display()
        ),
    }
    let timeout = libc::timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    loop {
        // SAFETY: `signals` is a valid sigset_t, the info pointer may be null, and `timeout`
        // outlives the call.
        let sig = unsafe { libc::sigtimedwait(signals.as_ref(), std::ptr::null_mut(), &timeout) };
        if sig > 0 {
            let name = Signal::try_from(sig).map_or("signal", |s| s.as_str());
            info!("received {name}: unmounting {}", mountpoint.display());
            break;
        }
        if mounted.is_finished() {
            info!("{} was unmounted", mountpoint.display());
            break;
        }
    }
    mounted.unmount()?;
    info!("unmounted {}", mountpoint.display());
    Ok(())
}

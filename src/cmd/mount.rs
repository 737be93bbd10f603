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
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use log::{error, info};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, fork, setsid};

use crate::cli::MountArgs;
use crate::error::{Error, Result};
use crate::fs::Ownership;
use crate::fs::ShuffleFs;
use crate::logging;
use crate::mount::{MountOptions, default_threads, mount, prepare_mountpoint};
use crate::prefetch::PrefetchConfig;
use crate::storage::fdpool::DEFAULT_MAX_OPEN;
use crate::view::{View, ViewConfig};

/// More FUSE workers than this only add contention (the kernel serves one queue).
const MAX_THREADS: usize = crate::cli::MAX_THREADS as usize;

/// Runs `mount`.
pub(crate) fn run(command: MountArgs) -> Result<()> {
    let MountArgs {
        dataset_dir,
        mountpoint,
        plan,
        options: args,
    } = command;
    // With --config the one path given is the mount point.
    let (dataset_dir, mountpoint) = match (&plan.config, mountpoint) {
        (Some(config), None) => (config.clone(), dataset_dir),
        (Some(_), Some(_)) => {
            return Err(Error::invalid(
                "with --config give only MOUNTPOINT: the run configuration names the datasets",
            ));
        }
        (None, Some(m)) => (dataset_dir, m),
        (None, None) => return Err(Error::invalid("MOUNTPOINT is required")),
    };
    let fd_limit = raise_open_file_limit();
    // Taken before anything else opens files: the daemon points its standard descriptors at
    // /dev/null even when the dataset uses every other descriptor it may (a caller's stderr
    // kept open makes `$(shufflefs mount ...)` wait for the daemon to exit).
    let null = open_dev_null()?;
    // The daemon changes directory to /: resolve the path now, and open it (checked: no
    // symbolic link, owned by us) while errors still reach the terminal.
    let log_file = match &args.log_file {
        Some(path) => {
            let abs = std::path::absolute(path).map_err(|e| Error::io(path, e))?;
            Some(logging::open_log_file(&abs)?)
        }
        None => None,
    };
    crate::mount::check_fuse_device()?;
    let threads = args
        .threads
        .unwrap_or_else(|| default_threads().min(MAX_THREADS));
    let (open_now, reserved) = (
        open_descriptors(),
        reserved_descriptors(threads, args.prefetch_workers),
    );
    let max_open = descriptor_budget(args.max_open_shards, fd_limit, open_now, reserved)?;
    // The step cache's memory files (passthrough) hold a descriptor each: what is left.
    crate::stepbuf::set_memfd_budget(memfd_budget(
        fd_limit,
        open_now + reserved + max_open as u64,
    ));
    // Remote reads fail (EIO) at the read deadline like local ones; without one, after a
    // minute of retries.
    if !args.read_timeout.is_zero() {
        crate::storage::remote::configure(crate::storage::remote::Config {
            read_timeout: args.read_timeout,
            ..Default::default()
        });
    }
    let fs = open_fs(&dataset_dir, &plan, &args, max_open)?;
    let cache_size = args.cache_size;
    check_cache_size(cache_size, memory_limit())?;
    // 0 disables the deadline.
    let read_timeout = (!args.read_timeout.is_zero()).then_some(args.read_timeout);
    let owner = Ownership {
        uid: args.uid.unwrap_or_else(|| nix::unistd::getuid().as_raw()),
        gid: args.gid.unwrap_or_else(|| nix::unistd::getgid().as_raw()),
        file_mode: args.file_mode,
        dir_mode: args.dir_mode,
    };
    check_prefetch_flags(&args)?;
    let mut fs = fs;
    if args.stub_reads {
        log::warn!("--stub-reads: every step file serves the same bytes (benchmarking only)");
        fs = fs.with_stub_reads()?;
    }
    // Threads (prefetch workers) may only start after the fork: serve() adds the cache.
    // A remote store's latency is what prefetch hides: never pause it (the governor would
    // time reads without prefetch, each a round trip).
    let remote = fs.plans().any(|(_, v)| v.is_remote());
    let cache = (cache_size > 0).then_some((
        cache_size,
        PrefetchConfig {
            depth: args.prefetch_depth,
            workers: args.prefetch_workers,
            adaptive: !remote,
        },
    ));
    let mountpoint = prepare_mountpoint(&mountpoint, args.on_top)?;
    let dataset = dataset_dir
        .canonicalize()
        .unwrap_or_else(|_| dataset_dir.clone());
    let options = MountOptions {
        threads,
        allow_other: args.allow_other,
        fsname: dataset.display().to_string(),
        owner,
        read_timeout,
        on_top: args.on_top,
        prefill: args.prefill,
        passthrough: !args.no_passthrough,
    };
    if args.foreground {
        return serve(fs, cache, &mountpoint, &options, None);
    }
    daemonize(fs, cache, &mountpoint, &options, &dataset, (null, log_file))
}

/// A plan's name (`None`: the only plan) and its view.
pub(crate) type Named = crate::view::NamedView;

/// The plans of the run configuration `path` (`--config`), each with its name (`None`: the
/// file has no `[[plan]]` tables; with `--plan NAME` only that plan, unnamed), their views
/// sharing their datasets, and how many datasets they open. The plan flags come from the
/// file, so giving them too is refused.
pub(crate) fn open_plans(
    path: &Path,
    plan: &crate::cli::PlanOptions,
    args: &crate::cli::MountFlags,
    max_open: usize,
) -> Result<(Vec<Named>, usize)> {
    if plan.window.is_some() || plan.batch_size.is_some() || plan.stride.is_some() {
        return Err(Error::invalid(
            "--config defines the plan: give --window, --batch-size and --stride in the run \
             configuration, not on the command line",
        ));
    }
    let open = crate::view::OpenOptions {
        max_open,
        allow_other: args.allow_other,
        verify_reads: args.verify_reads,
    };
    View::open_config(path, plan.plan.as_deref(), &open, args.max_listing)
}

/// The view of the run configuration `path` (`--config`), which has one plan (or `--plan`
/// chooses one).
pub(crate) fn open_mixture(
    path: &Path,
    plan: &crate::cli::PlanOptions,
    args: &crate::cli::MountFlags,
    max_open: usize,
) -> Result<View> {
    let (views, _) = open_plans(path, plan, args, max_open)?;
    View::one_plan(views, path, "--plan NAME")
}

/// The filesystem the flags describe: one dataset, or the plans of a run configuration; the
/// fingerprint checked when one is expected.
fn open_fs(
    dataset_dir: &Path,
    plan: &crate::cli::PlanOptions,
    args: &crate::cli::MountFlags,
    max_open: usize,
) -> Result<ShuffleFs> {
    let expect = |view: &View| match &args.expect_fingerprint {
        Some(expected) => view.check_fingerprint(expected, args.resume_step.unwrap_or(0)),
        None => Ok(()),
    };
    let Some(path) = &plan.config else {
        let view = open_view(dataset_dir, plan, args, max_open)?;
        expect(&view)?;
        return ShuffleFs::new(view);
    };
    let (mut views, datasets) = open_plans(path, plan, args, max_open)?;
    for (name, view) in &views {
        info!(
            "mixture {}{}: {} sources, {} steps/epoch x {} ranks x {} epochs, fingerprint {}",
            path.display(),
            name.as_ref()
                .map_or(String::new(), |n| format!(" plan {n:?}")),
            view.info().mixture.as_ref().map_or(0, |m| m.sources.len()),
            view.info().steps_per_epoch,
            view.info().ranks,
            view.info().epochs,
            view.fingerprint()
        );
    }
    if views.len() == 1 && views[0].0.is_none() {
        let view = views.remove(0).1;
        expect(&view)?;
        return ShuffleFs::new(view);
    }
    if args.expect_fingerprint.is_some() {
        return Err(Error::invalid(format!(
            "{} has several [[plan]] tables: --expect-fingerprint checks one plan (add --plan \
             NAME to mount it alone), or compare plan/NAME/info.json's fingerprint",
            path.display()
        )));
    }
    if args.prefill {
        return Err(Error::invalid(format!(
            "{} has several [[plan]] tables: --prefill serves one plan (add --plan NAME)",
            path.display()
        )));
    }
    let named = views
        .into_iter()
        .map(|(name, view)| (name.unwrap_or_default(), view))
        .collect();
    ShuffleFs::with_plans(path, named, datasets)
}

/// Opens the dataset and its view as the flags say (one dataset), and logs what it serves.
fn open_view(
    dataset_dir: &Path,
    plan: &crate::cli::PlanOptions,
    args: &crate::cli::MountFlags,
    max_open: usize,
) -> Result<View> {
    let mut dataset = crate::dataset::Dataset::open_with(dataset_dir, max_open, args.allow_other)?;
    if args.verify_reads {
        dataset = dataset.with_verified_reads()?;
        info!("--verify-reads: every shard read is checked against the block checksums");
    }
    let config = ViewConfig {
        max_listing: args.max_listing,
        ..ViewConfig::from(plan)
    };
    let view = View::new(dataset, &config)?;
    let info = view.info();
    info!(
        "dataset {}: {} tokens, {} observations of {} (stride {}), {} steps/epoch x {} ranks x \
         {} epochs, fingerprint {}",
        dataset_dir.display(),
        info.n_tokens,
        info.n_observations,
        info.window,
        info.stride,
        info.steps_per_epoch,
        info.ranks,
        info.epochs,
        info.fingerprint
    );
    Ok(view)
}

/// Refuses flag combinations that cannot work.
fn check_prefetch_flags(args: &crate::cli::MountFlags) -> Result<()> {
    if args.cache_size > 0 && args.prefetch_depth > 0 && args.prefetch_workers == 0 {
        return Err(Error::invalid(
            "--prefetch-workers 0 would queue prefetches that never run: use --prefetch-depth 0 \
             to turn prefetch off",
        ));
    }
    if args.prefill && (args.cache_size == 0 || args.prefetch_depth == 0) {
        return Err(Error::invalid(
            "--prefill pushes prefetched steps into the page cache: it needs the step cache \
             and prefetch (drop --cache-size 0 / --prefetch-depth 0)",
        ));
    }
    Ok(())
}

/// Forks: the parent waits until the child reports the mount ready (or relays its exit
/// code); the child detaches (new session, `/`, standard descriptors to /dev/null) and serves.
fn daemonize(
    fs: ShuffleFs,
    cache: Option<(u64, PrefetchConfig)>,
    mountpoint: &Path,
    options: &MountOptions,
    dataset: &Path,
    (null, log_file): (File, Option<File>),
) -> Result<()> {
    // Close-on-exec, so helpers spawned while mounting (fusermount3) do not hold the pipe.
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| Error::io("pipe", e.into()))?;
    // Remote datasets were opened on an I/O runtime: its threads stop here and start again in
    // the daemon on the first read.
    crate::storage::remote::quiesce();
    // A runtime's threads have finished their work when quiesce returns, but may take a moment
    // to leave /proc/self/task: wait for them (bounded) before counting.
    let settle = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while thread_count().is_ok_and(|n| n > 1) && std::time::Instant::now() < settle {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    match thread_count() {
        Ok(1) => {}
        Ok(n) => {
            return Err(Error::invalid(format!(
                "internal error: {n} threads exist before fork; run with --foreground"
            )));
        }
        Err(e) => return Err(Error::io("/proc/self/task", e)),
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
                    fs_fingerprint_hint(mountpoint)
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
            redirect_to_null(&null, &[0, 1]);
            let background = Background {
                ready: write_end,
                log_file,
                null,
            };
            if let Err(e) = serve(fs, cache, mountpoint, options, Some(background)) {
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
    let info = crate::tree::root_name(crate::tree::Node::Info).expect("a root file");
    std::fs::read(mountpoint.join(info))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| match v["fingerprint"].as_str() {
            Some(fp) => Some(fp.to_string()),
            // Several plans: each has its own.
            None => v["plans"].as_array().map(|plans| {
                plans
                    .iter()
                    .map(|p| {
                        format!(
                            "{} {}",
                            p["name"].as_str().unwrap_or("?"),
                            p["fingerprint"].as_str().unwrap_or("?")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            }),
        })
        .unwrap_or_else(|| "?".into())
}

/// Number of threads of this process: `/proc/self/task` has one link per thread plus two, and
/// `stat` needs no descriptor (reading /proc/self/status failed when the dataset had taken
/// every descriptor, which read as "threads exist").
fn thread_count() -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/self/task")?
        .nlink()
        .saturating_sub(2))
}

/// One descriptor stays open per dataset file: raises the soft open-file limit to the hard
/// limit. Returns the soft limit now (`None`: unlimited or unknown).
fn raise_open_file_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                limit = raised;
            }
        }
    }
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Descriptors open in this process now (inherited ones count against the limit too).
fn open_descriptors() -> u64 {
    // The directory's own descriptor is listed as well.
    std::fs::read_dir("/proc/self/fd").map_or(3, |d| d.count().saturating_sub(1) as u64)
}

/// Descriptors the daemon needs besides the dataset's files: its own (standard streams,
/// /dev/fuse, the log, the readiness pipe, syslog, /proc and /etc reads) and one per thread that
/// may hold a reopened file while the pool closes another.
fn reserved_descriptors(threads: usize, prefetch_workers: usize) -> u64 {
    32 + (threads + prefetch_workers + crate::fuse::MAX_IO_THREADS) as u64
}

/// Most memory files for step files (`stepbuf.rs`) when the open-file limit leaves room.
const MAX_MEMFDS: u64 = 16384;

/// How many memory files fit beside `used` descriptors under the open-file limit `limit`
/// (`None`: unlimited), at most [`MAX_MEMFDS`].
fn memfd_budget(limit: Option<u64>, used: u64) -> usize {
    limit
        .map_or(MAX_MEMFDS, |l| l.saturating_sub(used))
        .min(MAX_MEMFDS) as usize
}

/// The fewest dataset files worth mounting with: below it the limit is a mistake.
const MIN_OPEN_FILES: u64 = 8;

/// `--max-open-shards`: the default (4096) capped to what the open-file limit leaves after
/// the descriptors already open and those the daemon keeps for itself; an explicit value above
/// that is lowered with a warning, since the mount would otherwise fail on its first reopen.
fn descriptor_budget(
    requested: Option<usize>,
    limit: Option<u64>,
    open_now: u64,
    reserved: u64,
) -> Result<usize> {
    let Some(limit) = limit else {
        return Ok(requested.unwrap_or(DEFAULT_MAX_OPEN));
    };
    let room = limit.saturating_sub(open_now + reserved);
    if room < MIN_OPEN_FILES {
        return Err(Error::invalid(format!(
            "the open-file limit is {limit} (ulimit -n; {open_now} already open, {reserved} \
             kept for the daemon's own use), which leaves no room for dataset files: raise it \
             (`ulimit -n 4096` in the shell, LimitNOFILE= in a systemd unit)"
        )));
    }
    let room = usize::try_from(room).unwrap_or(usize::MAX);
    Ok(match requested {
        None => DEFAULT_MAX_OPEN.min(room),
        Some(n) if n > room => {
            log::warn!(
                "--max-open-shards {n} is more than the open-file limit allows (ulimit -n \
                 {limit}; {open_now} already open, {reserved} kept for the daemon): using \
                 {room}; raise the limit (LimitNOFILE=, ulimit -n) to keep more files open"
            );
            room
        }
        Some(n) => n,
    })
}

/// The memory this process may use: physical memory, or less under a cgroup limit
/// (`memory.max` of its cgroup and the cgroups above it, as in a container or a unit with
/// `MemoryMax=`). `None` when unknown.
fn memory_limit() -> Option<u64> {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let physical = (pages > 0 && page > 0).then(|| pages as u64 * page as u64);
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| {
            let path = text
                .lines()
                .find_map(|l| l.strip_prefix("0::"))?
                .to_string();
            let mut dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
            let mut lowest: Option<u64> = None;
            loop {
                if let Some(v) = std::fs::read_to_string(dir.join("memory.max"))
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                {
                    lowest = Some(lowest.map_or(v, |l| l.min(v)));
                }
                if dir == Path::new("/sys/fs/cgroup") || !dir.pop() {
                    break;
                }
            }
            lowest
        });
    match (physical, cgroup) {
        (Some(p), Some(c)) => Some(p.min(c)),
        (p, c) => p.or(c),
    }
}

/// `--cache-size` against the memory the daemon may use (`memory`): more than all of it is
/// refused (the cache fills as steps are read, so the daemon would be killed mid-training, not
/// at mount); more than half is allowed with a warning.
fn check_cache_size(cache_size: u64, memory: Option<u64>) -> Result<()> {
    let Some(memory) = memory else {
        return Ok(());
    };
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    if cache_size > memory {
        return Err(Error::invalid(format!(
            "--cache-size {:.1} GiB is more than the memory this node lets shufflefs use \
             ({:.1} GiB, physical memory or the cgroup's memory.max): the cache fills as \
             steps are read and the daemon would be killed mid-training; use at most {} MiB \
             (a few step files per rank and prefetch depth are enough)",
            gib(cache_size),
            gib(memory),
            (memory / 2) >> 20
        )));
    }
    if cache_size > memory / 2 {
        log::warn!(
            "--cache-size {:.1} GiB is more than half of the memory this node lets shufflefs \
             use ({:.1} GiB): the trainers and the page cache compete with it",
            gib(cache_size),
            gib(memory)
        );
    }
    Ok(())
}

/// What a background daemon does once mounted.
struct Background {
    ready: OwnedFd,
    log_file: Option<File>,
    /// /dev/null, opened before the dataset.
    null: File,
}

fn open_dev_null() -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/null")
        .map_err(|e| Error::io("/dev/null", e))
}

fn redirect_to_null(null: &File, fds: &[i32]) {
    for &fd in fds {
        // SAFETY: dup2 onto a standard descriptor number; `null` is a valid open fd. dup2
        // needs no free descriptor.
        unsafe { libc::dup2(null.as_raw_fd(), fd) };
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
            match bg.log_file {
                Some(file) => logging::to_file(file),
                None => logging::to_syslog(),
            }
            info!("serving {} in the background", mountpoint.display());
            redirect_to_null(&bg.null, &[2]);
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
    let mut ticks = 0u64;
    loop {
        ticks += 1;
        if ticks.is_multiple_of(10) {
            logging::flush_suppressed(false);
        }
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
    logging::flush_suppressed(true);
    info!("unmounted {}", mountpoint.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_open_files_fit_the_open_file_limit() {
        // Unlimited: the default or the value asked for.
        assert_eq!(descriptor_budget(None, None, 5, 100).unwrap(), 4096);
        assert_eq!(descriptor_budget(Some(9), None, 5, 100).unwrap(), 9);
        // ulimit -n 1024 with 5 open and 100 kept: the default becomes 919.
        assert_eq!(descriptor_budget(None, Some(1024), 5, 100).unwrap(), 919);
        assert_eq!(
            descriptor_budget(Some(500), Some(1024), 5, 100).unwrap(),
            500
        );
        // An explicit value above it is lowered (with a warning).
        assert_eq!(
            descriptor_budget(Some(4096), Some(1024), 5, 100).unwrap(),
            919
        );
        // A large limit keeps the default.
        assert_eq!(
            descriptor_budget(None, Some(1 << 20), 5, 100).unwrap(),
            4096
        );
        // No room left: an error naming the limit.
        let e = descriptor_budget(None, Some(110), 5, 100).unwrap_err();
        assert!(e.to_string().contains("the open-file limit is 110"), "{e}");
    }

    #[test]
    fn memory_files_get_what_the_open_file_limit_leaves() {
        assert_eq!(memfd_budget(None, 5000), 16384);
        assert_eq!(memfd_budget(Some(1 << 20), 5000), 16384);
        assert_eq!(memfd_budget(Some(8192), 5000), 3192);
        assert_eq!(memfd_budget(Some(1024), 5000), 0);
    }

    #[test]
    fn cache_size_is_checked_against_memory() {
        let gib = 1u64 << 30;
        assert!(check_cache_size(64 * gib, None).is_ok(), "unknown memory");
        assert!(check_cache_size(256 << 20, Some(23 * gib)).is_ok());
        assert!(
            check_cache_size(20 * gib, Some(23 * gib)).is_ok(),
            "a warning only"
        );
        let e = check_cache_size(64 * gib, Some(23 * gib))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--cache-size 64.0 GiB is more than the memory")
                && e.contains("(23.0 GiB")
                && e.contains("use at most 11776 MiB"),
            "{e}"
        );
    }
}

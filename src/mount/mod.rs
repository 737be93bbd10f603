//! Mount lifecycle: preparing the mount point (clearing a stale mount, refusing to stack on a
//! live one), starting the FUSE session (`fuse/session.rs`), and unmounting cleanly.
//! `table.rs` reads the mount table; `unmount.rs` is `shufflefs unmount` and the lazy detach.
//!
//! [`mount`] returns once the kernel has completed the FUSE handshake, so the tree is ready
//! when it returns. [`Mounted`] unmounts when dropped; if the mount is busy (a shell has its
//! working directory inside) it falls back to a lazy detach, so the daemon never leaves a
//! stale mount behind.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use log::{info, warn};

mod table;
mod unmount;

pub(crate) use table::{MountEntry, MountState, absolute_mountpoint, find_mount, mount_state};
pub use unmount::detach;
pub(crate) use unmount::unmount_path;

use crate::error::{Error, Result};
pub use crate::fs::Ownership;
use crate::fs::ShuffleFs;
use crate::fuse::session::{self, Session, SessionOptions};
use crate::logging::user_name;
use table::mount_stack;

/// The prefix of a shufflefs mount's source in the mount table (`shufflefs:/path/to/dataset`):
/// how a live or stale shufflefs mount is recognised.
pub(crate) const SOURCE_PREFIX: &str = "shufflefs:";

/// How the session is run.
#[derive(Clone, Debug)]
pub struct MountOptions {
    /// FUSE worker threads.
    pub threads: usize,
    /// Let other users read the mount (`allow_other`, needs `user_allow_other` in
    /// /etc/fuse.conf for non-root mounters).
    pub allow_other: bool,
    /// The source shown in the mount table, after `SOURCE_PREFIX` (the dataset path).
    pub fsname: String,
    /// Owner, group and permission bits of the tree.
    pub owner: Ownership,
    /// Reads that touch shards answer `EIO` after this long (`None`: no deadline; they then
    /// run on the FUSE threads).
    pub read_timeout: Option<Duration>,
    /// Mount over a live shufflefs mount instead of refusing.
    pub on_top: bool,
    /// Push prefetched step files into the kernel page cache (needs the cache and prefetch).
    pub prefill: bool,
    /// Hand open step files to the kernel as memory files (FUSE passthrough) when the kernel
    /// and the daemon's privileges allow it (never with `prefill`).
    pub passthrough: bool,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            threads: default_threads(),
            allow_other: false,
            fsname: String::new(),
            owner: Ownership::current(),
            read_timeout: Some(DEFAULT_READ_TIMEOUT),
            on_top: false,
            prefill: false,
            passthrough: true,
        }
    }
}

/// The read deadline by default: far beyond any healthy read (a local shard read takes
/// microseconds, a network filesystem milliseconds), short enough that a trainer sees an error
/// instead of hanging.
pub(crate) const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// FUSE worker threads by default: one per core, plus the one that never reads shards (so a
/// stalled shard cannot block `stat`, `ls` and other steps; see `fuse/dispatch.rs`).
pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()) + 1
}

/// A live mount. Dropping it unmounts.
#[derive(Debug)]
pub struct Mounted {
    mountpoint: PathBuf,
    /// Our mount's id in the mount table, recorded once mounted.
    mount_id: Option<u64>,
    /// Our mount's source in the mount table (how it is recognised without an id).
    source: String,
    /// The fuser session serving it.
    session: Session,
}

/// The FUSE device every mount needs read-write.
pub(crate) const FUSE_DEVICE: &str = "/dev/fuse";

/// Checks that this user can open [`FUSE_DEVICE`]; the error names it and the fixes.
pub(crate) fn check_fuse_device() -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(FUSE_DEVICE)
    {
        Ok(_) => Ok(()),
        Err(e) => Err(fuse_device_error(&e)),
    }
}

fn fuse_device_error(e: &io::Error) -> Error {
    let user = user_name(nix::unistd::geteuid().as_raw());
    let fix = match e.kind() {
        io::ErrorKind::NotFound => "the fuse module is not loaded or the device was not \
             created: run `modprobe fuse` as root, or install fuse3; in a container, pass the \
             device in (docs/OPERATIONS.md, section Containers)"
            .to_string(),
        io::ErrorKind::PermissionDenied => format!(
            "user {user} may not open it read-write (`ls -l {FUSE_DEVICE}` shows who may): give \
             it the mode fuse3 installs (`chmod 0666 {FUSE_DEVICE}` as root) or add {user} to \
             the group that owns it, or mount as root; in a container, see \
             docs/OPERATIONS.md, section Containers"
        ),
        _ => "every FUSE mount needs it (docs/OPERATIONS.md, section Containers)".to_string(),
    };
    Error::invalid(format!("cannot open {FUSE_DEVICE} ({e}): {fix}"))
}

/// Mounts `fs` at `mountpoint` and serves it from background threads. Returns once the mount
/// is ready. Clears a stale mount at `mountpoint` first and refuses a live shufflefs mount.
pub fn mount(fs: ShuffleFs, mountpoint: &Path, options: &MountOptions) -> Result<Mounted> {
    let mountpoint = prepare_mountpoint(mountpoint, options.on_top)?;
    check_fuse_device()?;
    let mtime = fs::metadata(fs.view().dataset().dir().join(crate::format::MANIFEST))
        .and_then(|m| m.modified())
        .unwrap_or(UNIX_EPOCH);
    // Without a prefetcher there is nothing to push: serve as a plain mount.
    let prefill = options.prefill && fs.prefetcher().is_some();
    if options.prefill && !prefill {
        warn!("--prefill needs the step cache and prefetch; it is off for this mount");
    }
    // Files are then read through the page cache, which trusts the size `stat` returned.
    let fs = if prefill { fs.with_padded_stats() } else { fs };
    // Mount options are comma-separated: keep commas out of the source name.
    let source = format!("{SOURCE_PREFIX}{}", options.fsname.replace(',', "_"));
    let session_options = SessionOptions {
        source: source.clone(),
        threads: options.threads.max(1),
        allow_other: options.allow_other,
        owner: options.owner,
        mtime,
        read_timeout: options.read_timeout,
        prefill,
        // The environment can turn it off too (the test suite runs its mounts both ways).
        passthrough: options.passthrough
            && !prefill
            && std::env::var_os("SHUFFLEFS_NO_PASSTHROUGH").is_none(),
    };
    // The step cache's memory files (passthrough) hold a descriptor each: at most half of
    // what the open-file limit leaves now (`shufflefs mount` sets a closer budget first).
    crate::stepbuf::limit_memfd_budget(memfd_room());
    let session = session::start(fs, &mountpoint, &session_options)?;
    info!("mounted at {}", mountpoint.display());
    let mount_id = find_mount(&mountpoint).ok().flatten().map(|m| m.id);
    if mount_id.is_none() {
        warn!(
            "{} is not in /proc/self/mountinfo right after mounting; unmount will recognise \
             this mount by its source {source}",
            mountpoint.display()
        );
    }
    Ok(Mounted {
        mountpoint,
        mount_id,
        source,
        session,
    })
}

impl Mounted {
    /// Whether the session ended (someone unmounted the filesystem from outside).
    pub(crate) fn is_finished(&self) -> bool {
        self.session.is_finished()
    }

    /// Unmounts and waits (up to a few seconds) for the session threads to finish. A busy
    /// mount is detached lazily rather than left behind.
    pub fn unmount(mut self) -> Result<()> {
        self.shutdown()
    }

    /// Whether our mount is in the table under another mount at the same path (`--on-top`).
    fn is_covered(&self) -> bool {
        let Some(id) = self.mount_id else {
            return false;
        };
        let stack = mount_stack(&self.mountpoint).unwrap_or_default();
        stack.iter().any(|m| m.id == id) && stack.last().is_some_and(|m| m.id != id)
    }

    fn shutdown(&mut self) -> Result<()> {
        let mut result = Ok(());
        // A mount covered by a newer one cannot be unmounted without taking that one down
        // (it sits on our root): keep serving until it is gone, then unmount.
        if self.is_covered() {
            warn!(
                "{} is covered by a newer mount (--on-top): this mount stays until that one is \
                 unmounted, then unmounts",
                self.mountpoint.display()
            );
            while self.is_covered() && !self.is_finished() {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let ended = self.session.is_finished();
        let ours = |m: &MountEntry| match self.mount_id {
            Some(id) => id == m.id,
            None => m.source == self.source,
        };
        let still_ours = || find_mount(&self.mountpoint).is_ok_and(|m| m.is_some_and(|m| ours(&m)));
        if !ended {
            self.session.stop_prefill(Duration::from_secs(5));
        }
        // Once the session has ended (someone unmounted us), the mount is gone: never touch
        // the mount point again, a newer mount may live there now.
        if !ended {
            match self.session.unmount() {
                Some(Err(e)) => {
                    warn!(
                        "unmount of {} failed ({e}); detaching lazily",
                        self.mountpoint.display()
                    );
                }
                Some(Ok(())) => {}
                None if still_ours() => {
                    if let Err(e) = nix::mount::umount(&self.mountpoint) {
                        warn!(
                            "unmount of {} failed ({e}); detaching lazily",
                            self.mountpoint.display()
                        );
                    }
                }
                None => {}
            }
            // fuser reports success for some failed unmounts (the fusermount path): trust the
            // mount table, and detach our mount (by id) if it is still there.
            if still_ours() {
                result = detach(&self.mountpoint);
            }
        }
        // After unmount the kernel ends the session; a lazily detached mount ends when its
        // last user leaves, so do not wait forever.
        self.session.join(&self.mountpoint, Duration::from_secs(3));
        result
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            warn!("{e}");
        }
    }
}
/// Resolves the mount point, clears a stale FUSE mount left by a killed daemon, and refuses
/// to mount over a live shufflefs mount unless `on_top` (the new mount then hides it until
/// unmounted). Returns the absolute mount point.
pub(crate) fn prepare_mountpoint(mountpoint: &Path, on_top: bool) -> Result<PathBuf> {
    let abs = absolute_mountpoint(mountpoint)?;
    match mount_state(&abs)? {
        MountState::NotMounted => {}
        MountState::Stale(entry) if !entry.is_shufflefs() => {
            return Err(Error::invalid(format!(
                "{} holds a dead {} mount of {} that is not shufflefs's; unmount it first \
                 (`umount -l {}` or `fusermount3 -u -z {}`)",
                abs.display(),
                entry.fstype,
                entry.source,
                abs.display(),
                abs.display()
            )));
        }
        MountState::Stale(entry) => {
            warn!(
                "{} holds a stale {} mount of {} (its daemon died); clearing it",
                abs.display(),
                entry.fstype,
                entry.source
            );
            detach(&abs)?;
        }
        MountState::Live(entry) if entry.is_shufflefs() && on_top => {
            info!(
                "{} is a live shufflefs mount of {}: mounting on top of it (--on-top)",
                abs.display(),
                entry.source
            );
        }
        MountState::Live(entry) if entry.is_shufflefs() => {
            return Err(Error::invalid(format!(
                "{} is already a live shufflefs mount: unmount it first \
                 (`shufflefs unmount {}`), or pass --on-top to mount over it",
                abs.display(),
                abs.display()
            )));
        }
        MountState::Live(_) => {}
    }
    if abs.parent().is_none() {
        return Err(Error::invalid("refusing to mount over /"));
    }
    let meta = fs::metadata(&abs).map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::NotFound {
            format!("; create it first (mkdir -p {})", abs.display())
        } else {
            String::new()
        };
        Error::io(
            &abs,
            io::Error::new(e.kind(), format!("mount point is not usable: {e}{hint}")),
        )
    })?;
    if !meta.is_dir() {
        return Err(Error::invalid(format!(
            "mount point {} is not a directory",
            abs.display()
        )));
    }
    if !on_top && fs::read_dir(&abs).is_ok_and(|mut d| d.next().is_some()) {
        warn!(
            "{} is not empty: its contents are hidden while shufflefs is mounted there",
            abs.display()
        );
    }
    Ok(abs)
}

/// Half the descriptors the open-file limit leaves this process now (`usize::MAX` when
/// unlimited or unknown).
fn memfd_room() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid pointer to an rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0
        || limit.rlim_cur == libc::RLIM_INFINITY
    {
        return usize::MAX;
    }
    let open = fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    (limit.rlim_cur.saturating_sub(open) / 2) as usize
}

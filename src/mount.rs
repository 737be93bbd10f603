//! Mount lifecycle: preparing the mount point (clearing a stale mount, refusing to stack on a
//! live one), running the FUSE session, and unmounting cleanly.
//!
//! [`mount`] returns once the kernel has completed the FUSE handshake, so the tree is ready
//! when it returns. [`Mounted`] unmounts when dropped; if the mount is busy (a shell has its
//! working directory inside) it falls back to a lazy detach, so the daemon never leaves a
//! stale mount behind.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, UNIX_EPOCH};

use fuser::{MountOption, SessionACL, SessionUnmounter};
use log::{info, warn};

use crate::error::{Error, Result};
use crate::fs::Ownership;
use crate::fs::ShuffleFs;
use crate::fuse::{FuseAdapter, KernelCache, QUIESCE_NAME, RESUME_NAME};
use crate::logging::user_name;

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
    /// The source shown in the mount table, after [`SOURCE_PREFIX`] (the dataset path).
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
    unmounter: Option<SessionUnmounter>,
    thread: Option<JoinHandle<io::Result<()>>>,
    /// The page-cache prefill, stopped before unmounting (its stores look files up through
    /// the mount, which makes the unmount fail `EBUSY` while they run).
    prefill: Option<Arc<KernelCache>>,
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
    // Files are then read through the page cache, which trusts the size `stat` returned.
    let fs = if prefill { fs.with_padded_stats() } else { fs };
    let adapter = FuseAdapter::new(
        fs,
        options.owner,
        mtime,
        options.read_timeout,
        options.threads.max(1),
        prefill,
    );
    let (shared_fs, prefill_slot) = (adapter.fs().clone(), adapter.prefill_slot());
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
        // Mount options are comma-separated: keep commas out of the source name.
        MountOption::FSName(format!(
            "{SOURCE_PREFIX}{}",
            options.fsname.replace(',', "_")
        )),
        MountOption::Subtype("shufflefs".into()),
        // The kernel checks the mode bits (--file-mode, --dir-mode) against the caller.
        MountOption::DefaultPermissions,
    ];
    if options.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(options.threads.max(1));
    let source = format!("{SOURCE_PREFIX}{}", options.fsname.replace(',', "_"));
    let cannot = |e: io::Error| {
        Error::io(
            &mountpoint,
            io::Error::new(e.kind(), format!("cannot mount: {e}")),
        )
    };
    // As root, shufflefs mounts by itself and hands the device to fuser: fuser 0.18 reads a
    // disconnected device as still mounted and, when its session ends after an external
    // unmount, unmounts *by path*, which would take down a newer mount at the same place.
    // Without root the mount needs fusermount3, which only fuser's own path implements.
    let (session, unmounter) = if nix::unistd::geteuid().is_root() {
        let fd = mount_as_root(&mountpoint, &source, options.allow_other).map_err(cannot)?;
        let session = fuser::Session::from_fd(adapter, fd, config.acl, config).map_err(|e| {
            let _ = detach(&mountpoint);
            cannot(e)
        })?;
        (session, None)
    } else {
        let mut session = fuser::Session::new(adapter, &mountpoint, &config).map_err(cannot)?;
        let unmounter = session.unmount_callable();
        (session, Some(unmounter))
    };
    let mut prefill_target = None;
    if options.prefill {
        match shared_fs.prefetcher() {
            Some(prefetcher) => {
                let kernel = Arc::new(KernelCache::new(
                    session.notifier(),
                    mountpoint.clone(),
                    &shared_fs,
                ));
                prefetcher.set_prefill(kernel.clone());
                let _ = prefill_slot.set(kernel.clone());
                prefill_target = Some(kernel);
                info!("prefill: prefetched step files are pushed into the page cache");
            }
            None => warn!("--prefill needs the step cache and prefetch; it is off for this mount"),
        }
    }
    let thread = std::thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || session.run())
        .map_err(|e| Error::io(&mountpoint, e))?;
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
        unmounter,
        thread: Some(thread),
        prefill: prefill_target,
    })
}

impl Mounted {
    /// The (absolute) mount point.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Whether the session ended (someone unmounted the filesystem from outside).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
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
        let ended = self.thread.as_ref().is_none_or(|t| t.is_finished());
        let ours = |m: &MountEntry| match self.mount_id {
            Some(id) => id == m.id,
            None => m.source == self.source,
        };
        let still_ours = || find_mount(&self.mountpoint).is_ok_and(|m| m.is_some_and(|m| ours(&m)));
        if !ended && let Some(kernel) = &self.prefill {
            kernel.stop(Duration::from_secs(5));
        }
        // Once the session has ended (someone unmounted us), the mount is gone: never touch
        // the mount point again, a newer mount may live there now.
        if !ended {
            match self.unmounter.take() {
                Some(mut unmounter) => {
                    if let Err(e) = unmounter.unmount() {
                        warn!(
                            "unmount of {} failed ({e}); detaching lazily",
                            self.mountpoint.display()
                        );
                    }
                }
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
        if let Some(thread) = self.thread.take() {
            // After unmount the kernel ends the session; a lazily detached mount ends when its
            // last user leaves, so do not wait forever.
            let deadline = Instant::now() + Duration::from_secs(3);
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if thread.is_finished() {
                match thread.join() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => warn!("FUSE session ended with an error: {e}"),
                    Err(_) => warn!("FUSE session thread panicked"),
                }
            } else {
                warn!(
                    "{} is detached but still in use; its last reader will see ENOTCONN once \
                     this process exits",
                    self.mountpoint.display()
                );
            }
        }
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

/// Mounts a FUSE filesystem at `mountpoint` with the mount syscall (root only) and returns
/// the connected `/dev/fuse` descriptor.
fn mount_as_root(
    mountpoint: &Path,
    source: &str,
    allow_other: bool,
) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::MetadataExt;
    let device = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let root_mode = fs::metadata(mountpoint)?.mode() & libc::S_IFMT;
    let mut data = format!(
        "fd={},rootmode={root_mode:o},user_id={},group_id={}",
        std::os::fd::AsRawFd::as_raw_fd(&device),
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw()
    );
    data.push_str(",default_permissions");
    if allow_other {
        data.push_str(",allow_other");
    }
    let flags = nix::mount::MsFlags::MS_RDONLY
        | nix::mount::MsFlags::MS_NOSUID
        | nix::mount::MsFlags::MS_NODEV;
    nix::mount::mount(
        Some(source),
        mountpoint,
        Some("fuse.shufflefs"),
        flags,
        Some(data.as_str()),
    )?;
    Ok(device.into())
}

/// What the mount table says about one mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct MountEntry {
    /// The kernel's mount id (first field of mountinfo): unique among live mounts, so a
    /// daemon can tell its own mount from a newer one at the same path.
    pub id: u64,
    /// Filesystem type (`fuse` for shufflefs).
    pub fstype: String,
    /// Source (`shufflefs:/path/to/dataset` for shufflefs).
    pub source: String,
    /// The user who mounted it (a FUSE mount's `user_id=` option), when known.
    pub owner: Option<u32>,
}

impl MountEntry {
    /// Whether this is a shufflefs mount.
    pub(crate) fn is_shufflefs(&self) -> bool {
        self.fstype.starts_with("fuse") && self.source.starts_with(SOURCE_PREFIX)
    }
}

/// What occupies a mount point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum MountState {
    /// Nothing is mounted there.
    NotMounted,
    /// A working mount.
    Live(MountEntry),
    /// A FUSE mount whose daemon is gone (`ENOTCONN`).
    Stale(MountEntry),
}

/// Absolute form of `path`, resolving symbolic links but never calling `stat` on the mount
/// point itself (a dead FUSE mount answers `ENOTCONN`, where `canonicalize` fails).
pub(crate) fn absolute_mountpoint(path: &Path) -> Result<PathBuf> {
    let mut path = path.to_path_buf();
    for _ in 0..40 {
        let Some(name) = path.file_name().map(|n| n.to_os_string()) else {
            // `.`, `..` or `/`: no mount point can be dead there from our point of view.
            return path.canonicalize().map_err(|e| Error::io(&path, e));
        };
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let parent = parent.canonicalize().map_err(|e| {
            Error::io(
                &path,
                io::Error::new(
                    e.kind(),
                    format!(
                        "the mount point's parent {} is not usable ({e}); create the mount \
                         point first (mkdir -p)",
                        parent.display()
                    ),
                ),
            )
        })?;
        let candidate = parent.join(&name);
        // lstat works on a dead mount point; only a symlink needs resolving.
        match fs::symlink_metadata(&candidate) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = fs::read_link(&candidate).map_err(|e| Error::io(&candidate, e))?;
                path = parent.join(target);
            }
            _ => return Ok(candidate),
        }
    }
    Err(Error::invalid(format!(
        "{}: too many levels of symbolic links",
        path.display()
    )))
}

/// The top mount at `mountpoint` (absolute) in /proc/self/mountinfo, if any.
pub(crate) fn find_mount(mountpoint: &Path) -> Result<Option<MountEntry>> {
    // The last match is the top of a stack of mounts.
    Ok(mount_stack(mountpoint)?.pop())
}

/// Every mount at `mountpoint` (absolute), bottom first.
pub(crate) fn mount_stack(mountpoint: &Path) -> Result<Vec<MountEntry>> {
    let table = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::io("/proc/self/mountinfo", e))?;
    let target = mountpoint.as_os_str().as_encoded_bytes();
    let mut found = Vec::new();
    for line in table.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() > dash + 2 && fields.len() > 4 && unescape(fields[4]) == target {
            let owner = fields.get(dash + 3).and_then(|options| {
                options
                    .split(',')
                    .find_map(|o| o.strip_prefix("user_id=")?.parse().ok())
            });
            found.push(MountEntry {
                id: fields[0].parse().unwrap_or(0),
                fstype: fields[dash + 1].to_string(),
                source: String::from_utf8_lossy(&unescape(fields[dash + 2])).into_owned(),
                owner,
            });
        }
    }
    Ok(found)
}

/// How long a FUSE daemon may take to answer the liveness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Inspects what is mounted at `mountpoint` (absolute) and whether a FUSE mount's daemon is
/// alive.
pub(crate) fn mount_state(mountpoint: &Path) -> Result<MountState> {
    let Some(entry) = find_mount(mountpoint)? else {
        return Ok(MountState::NotMounted);
    };
    if !entry.fstype.starts_with("fuse") {
        return Ok(MountState::Live(entry));
    }
    // statfs always reaches the daemon (stat may be answered from the kernel's attribute
    // cache), so it tells a dead FUSE connection (ENOTCONN / ECONNABORTED) from a live one.
    // A hung daemon never answers: probe from a thread and give up after a timeout.
    let (tx, rx) = std::sync::mpsc::channel();
    let probe_path = mountpoint.to_path_buf();
    let Ok(probe) = std::thread::Builder::new()
        .name("statfs-probe".into())
        .spawn(move || {
            let _ = tx.send(nix::sys::statfs::statfs(&probe_path).map(|_| ()));
        })
    else {
        return Ok(MountState::Live(entry));
    };
    let answer = rx.recv_timeout(PROBE_TIMEOUT);
    if answer.is_ok() {
        // The probe has answered: wait for its thread to end, so the caller is
        // single-threaded again (the background mount forks after this).
        let _ = probe.join();
    }
    match answer {
        Err(_) => Err(Error::invalid(format!(
            "{}: the {} mount of {} does not answer (its daemon hangs); unmount it with \
             `shufflefs unmount --lazy {}`",
            mountpoint.display(),
            entry.fstype,
            entry.source,
            mountpoint.display()
        ))),
        Ok(Err(nix::errno::Errno::ENOTCONN | nix::errno::Errno::ECONNABORTED)) => {
            Ok(MountState::Stale(entry))
        }
        Ok(_) => Ok(MountState::Live(entry)),
    }
}

/// Undoes the octal escapes (`\040` for space) of a mountinfo path field.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        let value = octal.map(|d| d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0')));
        match value.and_then(|v| u8::try_from(v).ok()) {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
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

/// Lazily detaches whatever is mounted at `mountpoint`: `umount2(MNT_DETACH)` as root,
/// `fusermount3 -u -z` otherwise.
pub fn detach(mountpoint: &Path) -> Result<()> {
    match nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => fusermount(mountpoint, &["-u", "-z"]),
        Err(e) => Err(Error::io(mountpoint, e.into())),
    }
}

/// Unmounts `mountpoint` (for `shufflefs unmount`): a plain unmount that fails if the mount is
/// busy, or a lazy detach when `lazy`. Before a plain unmount the daemon is asked to stop its
/// prefill stores ([`QUIESCE_NAME`]), which look files up through the mount and would make it
/// busy; they start again if the unmount fails.
pub(crate) fn unmount_path(mountpoint: &Path, lazy: bool) -> Result<()> {
    let abs = absolute_mountpoint(mountpoint)?;
    // Decide from the mount table alone: probing a hung daemon would hang here too.
    let entry = match find_mount(&abs)? {
        None => {
            return Err(Error::invalid(format!("{} is not mounted", abs.display())));
        }
        Some(entry) if !entry.is_shufflefs() => {
            return Err(Error::invalid(format!(
                "{} is a {} mount of {}, not shufflefs; refusing to unmount it",
                abs.display(),
                entry.fstype,
                entry.source
            )));
        }
        Some(entry) => entry,
    };
    let me = nix::unistd::getuid().as_raw();
    if !nix::unistd::geteuid().is_root()
        && let Some(owner) = entry.owner.filter(|o| *o != me)
    {
        let dataset = entry
            .source
            .strip_prefix(SOURCE_PREFIX)
            .unwrap_or(&entry.source);
        return Err(Error::invalid(format!(
            "{} is a shufflefs mount of {dataset} made by {} (uid {owner}); you are {} (uid \
             {me}): only its owner or root can unmount it. Run `sudo shufflefs unmount {}`, \
             or ask {} to",
            abs.display(),
            user_name(owner),
            user_name(me),
            abs.display(),
            user_name(owner)
        )));
    }
    if lazy {
        return detach(&abs);
    }
    control(&abs, QUIESCE_NAME)?;
    let result = match nix::mount::umount(&abs) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EPERM) => fusermount(&abs, &["-u"]),
        Err(nix::errno::Errno::EBUSY) => Err(Error::invalid(format!(
            "{} is busy (a process has a file open or its working directory inside); \
             close it, or detach lazily with `shufflefs unmount --lazy`",
            abs.display()
        ))),
        Err(e) => Err(Error::io(&abs, e.into())),
    };
    if result.is_err() {
        let _ = control(&abs, RESUME_NAME);
    }
    result
}

/// Looks up the control name `name` in the mount's root (see [`QUIESCE_NAME`]): returns once
/// the daemon has answered (its answer is always "no such file"; a dead mount's, or a refusal
/// to a user without access, changes nothing). From a thread with a timeout: a hung daemon is
/// an error that says what to do.
fn control(mountpoint: &Path, name: &str) -> Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let path = mountpoint.join(name);
    let Ok(probe) = std::thread::Builder::new()
        .name("unmount-control".into())
        .spawn(move || {
            let _ = tx.send(fs::symlink_metadata(&path).map(|_| ()));
        })
    else {
        return Ok(());
    };
    match rx.recv_timeout(PROBE_TIMEOUT) {
        Ok(_) => {
            let _ = probe.join();
            Ok(())
        }
        Err(_) => Err(Error::invalid(format!(
            "{}: the shufflefs daemon does not answer (it hangs); unmount with `shufflefs \
             unmount --lazy {}`",
            mountpoint.display(),
            mountpoint.display()
        ))),
    }
}

fn fusermount(mountpoint: &Path, args: &[&str]) -> Result<()> {
    let output = std::process::Command::new("fusermount3")
        .args(args)
        .arg(mountpoint)
        .output()
        .map_err(|e| Error::io("fusermount3", e))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "fusermount3 {} {} failed: {}",
            args.join(" "),
            mountpoint.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_unescape() {
        assert_eq!(unescape("/tmp/a\\040b"), b"/tmp/a b");
        assert_eq!(unescape("/plain"), b"/plain");
        assert_eq!(unescape("/x\\134y"), b"/x\\y");
        assert_eq!(unescape("/trail\\04"), b"/trail\\04");
        assert_eq!(unescape("/big\\777"), b"/big\\777");
    }

    #[test]
    fn absolute_mountpoint_keeps_last_component() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("not-yet");
        assert_eq!(
            absolute_mountpoint(&p).unwrap(),
            dir.path().canonicalize().unwrap().join("not-yet")
        );
        assert_eq!(absolute_mountpoint(Path::new("/")).unwrap(), Path::new("/"));
        let real = dir.path().join("real");
        fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("link")).unwrap();
        assert_eq!(
            absolute_mountpoint(&dir.path().join("link")).unwrap(),
            real.canonicalize().unwrap()
        );
    }
}

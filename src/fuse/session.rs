//! The fuser session of a mount: the kernel mount (`mount(2)` directly as root, `fusermount3`
//! through fuser otherwise), the session's thread, the page-cache prefill wired to the
//! session's notifier, and the session's end. `mount/` owns the mount point and the mount
//! table; this owns everything that speaks fuser.
//!
//! As root, shufflefs mounts by itself and hands the device to fuser: fuser 0.18 reads a
//! disconnected device as still mounted and, when its session ends after an external unmount,
//! unmounts *by path*, which would take down a newer mount at the same place. Without root the
//! mount needs fusermount3, which only fuser's own path implements.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use fuser::{MountOption, SessionACL, SessionUnmounter};
use log::{info, warn};

use super::{FuseAdapter, KernelCache};
use crate::error::{Error, Result};
use crate::fs::{Ownership, ShuffleFs};

/// How a session serves its mount.
#[derive(Clone, Debug)]
pub(crate) struct SessionOptions {
    /// The source shown in the mount table (`shufflefs:/path/to/dataset`, no commas).
    pub(crate) source: String,
    /// FUSE worker threads (at least 1).
    pub(crate) threads: usize,
    /// Let other users read the mount.
    pub(crate) allow_other: bool,
    /// Owner, group and permission bits of the tree.
    pub(crate) owner: Ownership,
    /// The date of every file.
    pub(crate) mtime: SystemTime,
    /// The read deadline (`None`: none).
    pub(crate) read_timeout: Option<Duration>,
    /// Push prefetched step files into the page cache (the filesystem has a prefetcher).
    pub(crate) prefill: bool,
    /// Hand open step files to the kernel (FUSE passthrough) where it can.
    pub(crate) passthrough: bool,
}

/// A running session.
#[derive(Debug)]
pub(crate) struct Session {
    /// fuser's unmount (the fusermount3 path); `None` when mounted as root.
    unmounter: Option<SessionUnmounter>,
    thread: Option<JoinHandle<io::Result<()>>>,
    /// The page-cache prefill, stopped before unmounting (its stores look files up through
    /// the mount, which makes the unmount fail `EBUSY` while they run).
    prefill: Option<Arc<KernelCache>>,
}

/// Mounts `fs` at `mountpoint` (absolute, prepared) and serves it from a background thread.
pub(crate) fn start(fs: ShuffleFs, mountpoint: &Path, options: &SessionOptions) -> Result<Session> {
    let adapter = FuseAdapter::new(
        fs,
        options.owner,
        options.mtime,
        options.read_timeout,
        options.threads,
        options.prefill,
        options.passthrough,
    );
    let (shared_fs, prefill_slot) = (adapter.fs().clone(), adapter.prefill_slot());
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::FSName(options.source.clone()),
        MountOption::Subtype("shufflefs".into()),
        // The kernel checks the mode bits (--file-mode, --dir-mode) against the caller.
        MountOption::DefaultPermissions,
    ];
    if options.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(options.threads);
    let cannot = |e: io::Error| {
        Error::io(
            mountpoint,
            io::Error::new(e.kind(), format!("cannot mount: {e}")),
        )
    };
    let (session, unmounter) = if nix::unistd::geteuid().is_root() {
        let fd = mount_as_root(mountpoint, &options.source, options.allow_other).map_err(cannot)?;
        let session = fuser::Session::from_fd(adapter, fd, config.acl, config).map_err(|e| {
            // Root mounted it: detach it again (no fusermount3 needed).
            let _ = nix::mount::umount2(mountpoint, nix::mount::MntFlags::MNT_DETACH);
            cannot(e)
        })?;
        (session, None)
    } else {
        let mut session = fuser::Session::new(adapter, mountpoint, &config).map_err(cannot)?;
        let unmounter = session.unmount_callable();
        (session, Some(unmounter))
    };
    let mut prefill = None;
    if let Some(prefetcher) = shared_fs.prefetcher().filter(|_| options.prefill) {
        let kernel = Arc::new(KernelCache::new(
            session.notifier(),
            mountpoint.to_path_buf(),
            &shared_fs,
        ));
        prefetcher.set_prefill(kernel.clone());
        let _ = prefill_slot.set(kernel.clone());
        prefill = Some(kernel);
        info!("prefill: prefetched step files are pushed into the page cache");
    }
    let thread = std::thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || session.run())
        .map_err(|e| Error::io(mountpoint, e))?;
    Ok(Session {
        unmounter,
        thread: Some(thread),
        prefill,
    })
}

impl Session {
    /// Whether the session ended (someone unmounted the filesystem).
    pub(crate) fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Stops prefill stores and waits for those in flight (at most `max_wait`).
    pub(crate) fn stop_prefill(&self, max_wait: Duration) {
        if let Some(kernel) = &self.prefill {
            kernel.stop(max_wait);
        }
    }

    /// Unmounts through fuser when it mounted (`fusermount3`); `None` when mounted as root
    /// (the caller unmounts with `umount(2)`).
    pub(crate) fn unmount(&mut self) -> Option<io::Result<()>> {
        self.unmounter.take().map(|mut u| u.unmount())
    }

    /// Waits, at most `max_wait`, for the session's thread to end (the kernel ends the session
    /// after an unmount; a lazily detached mount ends when its last user leaves).
    pub(crate) fn join(&mut self, mountpoint: &Path, max_wait: Duration) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        let deadline = Instant::now() + max_wait;
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
                mountpoint.display()
            );
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
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let root_mode = std::fs::metadata(mountpoint)?.mode() & libc::S_IFMT;
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

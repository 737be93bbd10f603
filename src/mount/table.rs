//! The mount table: what is mounted at a path (`/proc/self/mountinfo`), whether a FUSE mount's
//! daemon is alive, and a mount point's absolute form (found without `stat` on it, which a dead
//! mount answers `ENOTCONN`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::SOURCE_PREFIX;
use crate::error::{Error, Result};

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
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

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

//! Unmounting: `shufflefs unmount` (a plain unmount that asks the daemon to stop its prefill
//! stores first, or a lazy detach), and the lazy detach a busy or stale mount gets.

use std::fs;
use std::path::Path;

use super::SOURCE_PREFIX;
use super::table::{PROBE_TIMEOUT, absolute_mountpoint, find_mount};
use crate::error::{Error, Result};
use crate::fuse::{QUIESCE_NAME, RESUME_NAME};
use crate::logging::user_name;

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

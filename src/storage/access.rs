//! Who the files a manifest names are opened as: a mount never serves bytes the dataset's
//! owner could not read.
//!
//! A manifest names files (shards, in place anywhere; checksum and document files), and
//! whoever can write the manifest, or change what a listed path resolves to, chooses which
//! bytes a mount serves. Each such party is a *principal* of the file:
//! - the owner of `manifest.json`, and the members of its group or every user when it is
//!   group- or world-writable;
//! - the owner of every directory a lookup passes through on the way to the dataset directory
//!   and to the file (resolved component by component, symbolic links included), and the
//!   members of its group or every user when it is group- or world-writable (a directory with
//!   an ACL and a group-write mask counts as world-writable); in a sticky writable directory
//!   (like `/tmp`), where others cannot replace an entry, the owner of the file itself;
//! - never root (it can read everything already), nor the daemon's own user.
//!
//! When the daemon runs as root (the documented `--allow-other` deployment), every listed file
//! is opened once as each of its principals: the calling thread takes the principal's fsuid,
//! fsgid and supplementary groups (raw syscalls, which change only that thread, unlike the libc
//! wrappers), opens, and takes its own credentials back before anything else runs on it. The
//! kernel thus applies its whole permission check as each principal: mode bits, ACLs, search
//! permission on every directory of the path, LSMs. A hard link to a file a principal cannot
//! read is refused like the file itself, whatever `protected_hardlinks` allowed. All opens
//! must find the same inode. Reopens through the descriptor pool (`fdpool.rs`) go through the
//! same [`Opener`]. No thread is started (the daemon forks after opening the dataset, and must
//! be single-threaded then). The principals are computed before the fork (NSS lookups).
//!
//! A non-root daemon cannot take another user's credentials. Without `--allow-other` only its
//! own user (and root) can read the mount, so it serves nothing that user could not read
//! anyway. With `--allow-other` and any principal besides itself, every listed file must be
//! readable by every user (mode `o+r`, and `o+x` on every directory of its path), or the mount
//! is refused.
//!
//! Independent of owners, `local.rs` refuses anything but regular files, symbolic links as
//! the last component, and files of pseudo filesystems (`/proc`, `/sys`, ...).

use std::collections::HashMap;
use std::ffi::{CString, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// The uid and gid with no rights of their own (`nobody`, `nogroup`): the credentials of "the
/// members of a group" (with that group added) and of "every user".
const NOBODY: u32 = 65534;

/// Symbolic links followed in one path before giving up (the kernel's limit).
const MAX_LINKS: usize = 40;

/// Someone whose read permission a listed file must pass.
#[derive(Clone, Debug)]
pub(crate) struct Principal {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    /// Who, and why they count ("user alice (uid 1001), owner of /srv/ds").
    who: String,
}

impl Principal {
    /// A user, with their primary and supplementary groups from the user database (no groups
    /// but `nogroup` for a uid the database does not know).
    fn user(uid: u32, why: &str) -> Principal {
        let found = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten();
        let (name, gid, groups) = match found {
            Some(u) => {
                let groups = CString::new(u.name.clone())
                    .ok()
                    .and_then(|name| nix::unistd::getgrouplist(&name, u.gid).ok())
                    .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
                    .unwrap_or_else(|| vec![u.gid.as_raw()]);
                (u.name, u.gid.as_raw(), groups)
            }
            None => (uid.to_string(), NOBODY, Vec::new()),
        };
        Principal {
            uid,
            gid,
            groups,
            who: format!("user {name} (uid {uid}), {why}"),
        }
    }

    /// Any member of group `gid`.
    fn group(gid: u32, why: &str) -> Principal {
        let name = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
            .ok()
            .flatten()
            .map_or_else(|| gid.to_string(), |g| g.name);
        Principal {
            uid: NOBODY,
            gid,
            groups: vec![gid],
            who: format!("the members of group {name} (gid {gid}), {why}"),
        }
    }

    /// Every user.
    fn anyone(why: &str) -> Principal {
        Principal {
            uid: NOBODY,
            gid: NOBODY,
            groups: Vec::new(),
            who: format!("every user, {why}"),
        }
    }

    /// Who this is and why it counts.
    pub(crate) fn who(&self) -> &str {
        &self.who
    }
}

/// Adds `p` unless a principal with the same credentials is there already.
fn push(list: &mut Vec<Principal>, p: Principal) {
    if !list
        .iter()
        .any(|q| (q.uid, q.gid, &q.groups) == (p.uid, p.gid, &p.groups))
    {
        list.push(p);
    }
}

/// How the files are opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// As the daemon: non-root, and only its own user reads the mount.
    Unchecked,
    /// As every principal: the daemon is root.
    Impersonate,
    /// As the daemon, but files must be readable by everyone when a principal is not the
    /// daemon's user: non-root with `--allow-other`.
    WorldReadable,
}

/// What a walk down a directory path found.
#[derive(Clone, Debug, Default)]
struct Walked {
    principals: Vec<Principal>,
    /// Every directory passed is searchable by everyone (`o+x`).
    world: bool,
    /// The last directory is sticky and writable by others than its owner.
    sticky_writable: bool,
}

/// The rule for one dataset: computes the principals of each listed file (see the module
/// docs). Used while the dataset is opened.
#[derive(Debug)]
pub(crate) struct Policy {
    mode: Mode,
    euid: u32,
    /// Principals of the dataset as a whole: the manifest and the dataset directory's path.
    base: Walked,
    /// Openers of files in each directory (not for sticky writable ones).
    by_dir: HashMap<PathBuf, Arc<Opener>>,
    /// Walks of directories.
    walks: HashMap<PathBuf, Walked>,
    /// Users looked up so far (one user database lookup per owner, not per directory).
    users: std::cell::RefCell<HashMap<u32, Principal>>,
}

impl Policy {
    /// The rule for the dataset in `dir` (canonical), whose manifest has metadata `manifest`.
    /// `serve_to_others`: the mount will be readable by other users (`--allow-other`).
    pub(crate) fn new(
        dir: &Path,
        manifest: &Metadata,
        serve_to_others: bool,
    ) -> io::Result<Policy> {
        let euid = nix::unistd::geteuid().as_raw();
        let mode = if euid == 0 {
            Mode::Impersonate
        } else if serve_to_others {
            Mode::WorldReadable
        } else {
            Mode::Unchecked
        };
        let mut policy = Policy {
            mode,
            euid,
            base: Walked::default(),
            by_dir: HashMap::new(),
            walks: HashMap::new(),
            users: Default::default(),
        };
        if mode == Mode::Unchecked {
            return Ok(policy);
        }
        let mut base = policy.walk(dir)?;
        policy.walks.insert(dir.to_path_buf(), base.clone());
        let name = dir.join(crate::format::MANIFEST);
        let why = format!("owner of {}", name.display());
        if manifest.uid() != 0 && manifest.uid() != euid {
            push(&mut base.principals, policy.user(manifest.uid(), &why));
        }
        let why = format!("who may write {}", name.display());
        let mode_bits = manifest.mode();
        if mode_bits & 0o002 != 0 || (mode_bits & 0o020 != 0 && has_acl(&name)) {
            push(&mut base.principals, Principal::anyone(&why));
        } else if mode_bits & 0o020 != 0 {
            push(&mut base.principals, Principal::group(manifest.gid(), &why));
        }
        policy.base = base;
        Ok(policy)
    }

    /// The opener of the listed file at `path` (absolute).
    pub(crate) fn opener(&mut self, path: &Path) -> io::Result<Arc<Opener>> {
        if self.mode == Mode::Unchecked {
            return Ok(Opener::unchecked());
        }
        let parent = path.parent().unwrap_or(Path::new("/")).to_path_buf();
        if let Some(opener) = self.by_dir.get(&parent) {
            return Ok(opener.clone());
        }
        if !self.walks.contains_key(&parent) {
            let walked = self.walk(&parent)?;
            self.walks.insert(parent.clone(), walked);
        }
        let walked = &self.walks[&parent];
        let mut principals = self.base.principals.clone();
        for p in &walked.principals {
            push(&mut principals, p.clone());
        }
        let sticky = walked.sticky_writable;
        if sticky
            && let Ok(meta) = std::fs::symlink_metadata(path)
            && meta.uid() != 0
            && meta.uid() != self.euid
        {
            let why = format!(
                "owner of {}, in a directory others may write",
                path.display()
            );
            push(&mut principals, self.user(meta.uid(), &why));
        }
        let opener = Arc::new(Opener {
            mode: self.mode,
            principals,
            world_searchable: self.base.world && walked.world,
        });
        if !sticky {
            self.by_dir.insert(parent, opener.clone());
        }
        Ok(opener)
    }

    /// User `uid` as a principal (looked up once), with the reason `why`.
    fn user(&self, uid: u32, why: &str) -> Principal {
        let mut users = self.users.borrow_mut();
        let known = users.entry(uid).or_insert_with(|| Principal::user(uid, ""));
        let mut p = known.clone();
        p.who = format!("{}{why}", p.who);
        p
    }

    /// Resolves the directory `path` (absolute) component by component from `/`, following
    /// symbolic links, and collects the principals of every directory a lookup passes.
    fn walk(&self, path: &Path) -> io::Result<Walked> {
        let mut walked = Walked {
            world: true,
            ..Walked::default()
        };
        let mut pending: Vec<OsString> = Vec::new();
        push_components(&mut pending, path);
        let mut current = PathBuf::from("/");
        self.record(&current, &std::fs::symlink_metadata(&current)?, &mut walked);
        let mut links = 0;
        while let Some(name) = pending.pop() {
            if name == ".." {
                // Every ancestor of `current` was recorded on the way down to it.
                current.pop();
                continue;
            }
            let next = current.join(&name);
            let meta = std::fs::symlink_metadata(&next)?;
            if meta.file_type().is_symlink() {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = std::fs::read_link(&next)?;
                if target.is_absolute() {
                    current = PathBuf::from("/");
                }
                push_components(&mut pending, &target);
                continue;
            }
            if !meta.is_dir() {
                return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
            }
            self.record(&next, &meta, &mut walked);
            current = next;
        }
        Ok(walked)
    }

    /// The principals of one directory a lookup passes.
    fn record(&self, dir: &Path, meta: &Metadata, walked: &mut Walked) {
        let mode = meta.mode();
        if meta.uid() != 0 && meta.uid() != self.euid {
            let why = format!("owner of {}", dir.display());
            push(&mut walked.principals, self.user(meta.uid(), &why));
        }
        let (group_w, other_w, sticky) = (mode & 0o020 != 0, mode & 0o002 != 0, mode & 0o1000 != 0);
        if (group_w || other_w) && !sticky {
            let why = format!("who may write {}", dir.display());
            if other_w || has_acl(dir) {
                push(&mut walked.principals, Principal::anyone(&why));
            } else {
                push(&mut walked.principals, Principal::group(meta.gid(), &why));
            }
        }
        walked.sticky_writable = sticky && (group_w || other_w);
        walked.world &= mode & 0o001 != 0;
    }
}

/// Pushes the components of `path` onto `pending` so that they pop in order (`..` as is;
/// `/` and `.` dropped).
fn push_components(pending: &mut Vec<OsString>, path: &Path) {
    for c in path.components().rev() {
        match c {
            Component::Normal(name) => pending.push(name.to_owned()),
            Component::ParentDir => pending.push("..".into()),
            _ => {}
        }
    }
}

/// Whether `path` has a POSIX access ACL (its group bits are then the ACL mask, and named
/// users or groups may have rights the mode does not show).
fn has_acl(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return true;
    };
    // SAFETY: a NUL-terminated path and attribute name; a null buffer of size 0 asks for the
    // attribute's size only.
    let n = unsafe {
        libc::lgetxattr(
            c.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    n > 0
}

/// Why an [`Opener`] could not open a file.
#[derive(Debug)]
pub(crate) enum OpenError {
    /// The open failed for everyone (missing file, a symbolic link, ...).
    Io(io::Error),
    /// A principal may not read the file.
    Denied {
        /// Who.
        who: String,
        /// The kernel's answer (EACCES, EPERM).
        source: io::Error,
    },
    /// A non-root `--allow-other` mount of a file not every user may read.
    NotShared {
        /// The principals besides the daemon's user.
        who: String,
    },
}

/// Opens one listed file (or the files of one directory) as its principals.
#[derive(Debug)]
pub(crate) struct Opener {
    mode: Mode,
    principals: Vec<Principal>,
    /// Every directory of the path is searchable by everyone.
    world_searchable: bool,
}

impl Opener {
    /// Opens as the daemon, without checks (a non-root daemon serving only its own user;
    /// tests).
    pub(crate) fn unchecked() -> Arc<Opener> {
        Arc::new(Opener {
            mode: Mode::Unchecked,
            principals: Vec::new(),
            world_searchable: true,
        })
    }

    /// Opens `path` read-only, `O_NOFOLLOW | O_NONBLOCK` (the caller checks that it is a
    /// regular file and clears `O_NONBLOCK`), as every principal.
    pub(crate) fn open(&self, path: &Path) -> Result<File, OpenError> {
        let open = || {
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(path)
        };
        match self.mode {
            Mode::Impersonate if !self.principals.is_empty() => {
                let mut first: Option<(File, (u64, u64))> = None;
                for p in &self.principals {
                    let file =
                        as_principal(p, open).map_err(OpenError::Io)?.map_err(|e| {
                            match e.raw_os_error() {
                                Some(libc::EACCES | libc::EPERM) => OpenError::Denied {
                                    who: p.who.clone(),
                                    source: e,
                                },
                                _ => OpenError::Io(e),
                            }
                        })?;
                    let meta = file.metadata().map_err(OpenError::Io)?;
                    let id = (meta.dev(), meta.ino());
                    match &first {
                        None => first = Some((file, id)),
                        Some((_, first_id)) if *first_id != id => {
                            // Replaced between two opens: try again at the next mount.
                            return Err(OpenError::Io(io::Error::from_raw_os_error(libc::ESTALE)));
                        }
                        Some(_) => {}
                    }
                }
                Ok(first.expect("at least one principal").0)
            }
            Mode::WorldReadable if !self.principals.is_empty() => {
                let file = open().map_err(OpenError::Io)?;
                let meta = file.metadata().map_err(OpenError::Io)?;
                if meta.mode() & 0o004 == 0 || !self.world_searchable {
                    let who: Vec<&str> = self.principals.iter().map(|p| p.who()).collect();
                    return Err(OpenError::NotShared {
                        who: who.join("; "),
                    });
                }
                Ok(file)
            }
            _ => open().map_err(OpenError::Io),
        }
    }
}

/// Runs `f` on this thread with the credentials of `p` for file access, then restores them.
fn as_principal<T>(p: &Principal, f: impl FnOnce() -> T) -> io::Result<T> {
    let switched = Switched::to(p)?;
    let result = f();
    drop(switched);
    Ok(result)
}

/// This thread's file-access credentials, taken back on drop.
struct Switched {
    fsuid: u32,
    fsgid: u32,
    groups: Vec<libc::gid_t>,
}

/// `setfsuid(2)` / `setfsgid(2)` as raw syscalls (this thread only); `u32::MAX` (invalid)
/// changes nothing. Returns the previous value.
fn set_fs_id(call: libc::c_long, id: u32) -> u32 {
    // SAFETY: setfsuid/setfsgid take one integer and touch only this thread's credentials.
    unsafe { libc::syscall(call, libc::c_long::from(id)) as u32 }
}

/// `setgroups(2)` as a raw syscall: this thread only (glibc's wrapper changes every thread).
fn set_groups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: a valid pointer to `groups.len()` gids.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// This thread's supplementary groups.
fn thread_groups() -> io::Result<Vec<libc::gid_t>> {
    // SAFETY: size 0 with a null pointer asks for the count only.
    let n = unsafe { libc::syscall(libc::SYS_getgroups, 0, std::ptr::null_mut::<libc::gid_t>()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0; n as usize];
    // SAFETY: a buffer of `n` gids.
    let got = unsafe { libc::syscall(libc::SYS_getgroups, n, groups.as_mut_ptr()) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(got as usize);
    Ok(groups)
}

impl Switched {
    fn to(p: &Principal) -> io::Result<Switched> {
        let switched = Switched {
            groups: thread_groups()?,
            fsuid: set_fs_id(libc::SYS_setfsuid, u32::MAX),
            fsgid: set_fs_id(libc::SYS_setfsgid, u32::MAX),
        };
        let refused = |what: &str| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "cannot take the {what} of {} to open the file as them (the daemon needs \
                     CAP_SETUID and CAP_SETGID)",
                    p.who
                ),
            )
        };
        set_groups(&p.groups).map_err(|_| refused("groups"))?;
        set_fs_id(libc::SYS_setfsgid, p.gid);
        if set_fs_id(libc::SYS_setfsgid, u32::MAX) != p.gid {
            return Err(refused("group id"));
        }
        set_fs_id(libc::SYS_setfsuid, p.uid);
        if set_fs_id(libc::SYS_setfsuid, u32::MAX) != p.uid {
            return Err(refused("user id"));
        }
        Ok(switched)
    }
}

impl Drop for Switched {
    fn drop(&mut self) {
        // The uid first: going back to root's fsuid restores the file capabilities.
        set_fs_id(libc::SYS_setfsuid, self.fsuid);
        set_fs_id(libc::SYS_setfsgid, self.fsgid);
        let groups = set_groups(&self.groups);
        if set_fs_id(libc::SYS_setfsuid, u32::MAX) != self.fsuid || groups.is_err() {
            // Only ever fewer rights than before: later opens on this thread fail, none
            // gains access.
            log::error!("could not restore this thread's file credentials: {groups:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn switching_credentials_is_per_thread_and_restored() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"root only").unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let nobody = Principal::anyone("a test");
        let before = thread_groups().unwrap();
        // Another thread (started before the switch: a new thread inherits its creator's
        // credentials) keeps root's credentials meanwhile.
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn({
            let secret = secret.clone();
            move || {
                wait.recv().unwrap();
                std::fs::read(secret).is_ok()
            }
        });
        let denied = as_principal(&nobody, || {
            go.send(()).unwrap();
            (
                std::fs::read(&secret).unwrap_err().kind(),
                other.join().unwrap(),
            )
        })
        .unwrap();
        assert_eq!(denied, (io::ErrorKind::PermissionDenied, true));
        assert_eq!(thread_groups().unwrap(), before);
        assert_eq!(set_fs_id(libc::SYS_setfsuid, u32::MAX), 0);
        assert_eq!(std::fs::read(&secret).unwrap(), b"root only");
    }

    #[test]
    fn walks_collect_owners_of_every_directory_passed_and_writers() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let chown = |p: &Path, uid: u32| std::os::unix::fs::chown(p, Some(uid), None).unwrap();
        let chmod = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap()
        };
        // root/a (uid 4001) / b (root), and root/link -> a/b, a symbolic link in root's dir.
        let (a, b) = (root.join("a"), root.join("a/b"));
        std::fs::create_dir_all(&b).unwrap();
        chown(&a, 4001);
        std::os::unix::fs::symlink("a/b", root.join("link")).unwrap();
        let policy = Policy {
            mode: Mode::Impersonate,
            euid: 0,
            base: Walked::default(),
            by_dir: HashMap::new(),
            walks: HashMap::new(),
            users: Default::default(),
        };
        let uids = |w: &Walked| w.principals.iter().map(|p| p.uid).collect::<Vec<_>>();
        assert_eq!(uids(&policy.walk(&b).unwrap()), [4001]);
        assert_eq!(uids(&policy.walk(&root.join("link")).unwrap()), [4001]);
        assert_eq!(uids(&policy.walk(&root.join("a/b/../b")).unwrap()), [4001]);
        // A world-writable directory adds every user; a sticky one does not.
        chmod(&b, 0o777);
        let w = policy.walk(&b).unwrap();
        assert_eq!(uids(&w), [4001, NOBODY]);
        assert!(w.principals[1].who.starts_with("every user, who may write"));
        chmod(&b, 0o1777);
        let w = policy.walk(&b).unwrap();
        assert_eq!(uids(&w), [4001]);
        assert!(w.sticky_writable);
        // A group-writable one adds its group's members.
        chmod(&b, 0o775);
        std::os::unix::fs::chown(&b, None, Some(4002)).unwrap();
        let w = policy.walk(&b).unwrap();
        assert_eq!((w.principals[1].uid, w.principals[1].gid), (NOBODY, 4002));
        assert_eq!(
            policy.walk(&root.join("a/missing")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }
}

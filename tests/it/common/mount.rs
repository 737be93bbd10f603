//! Mounts and the binary: the library mount guard ([`TestMount`]), the mount-point guard for
//! the binary ([`MountDir`]), the binary runner ([`command`], [`shufflefs`], [`Daemon`]) and
//! the mount table. Every mount a test makes is unmounted by a guard, also when it fails.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use shufflefs::fs::ShuffleFs;
use shufflefs::mount::{MountOptions, Mounted, mount};
use tempfile::TempDir;

/// How long a daemon may take to come up or to exit: a bound against a hang, not a speed
/// assertion.
pub const DAEMON_BOUND: Duration = Duration::from_secs(20);

/// Whether real mounts can run here. Prints why not; with `SHUFFLEFS_REQUIRE_FUSE=1` (set by
/// .ci/run) a missing /dev/fuse fails the test instead of skipping it.
pub fn fuse_available() -> bool {
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(_) => true,
        Err(e) if std::env::var_os("SHUFFLEFS_REQUIRE_FUSE").is_some_and(|v| v == "1") => {
            panic!("SHUFFLEFS_REQUIRE_FUSE=1 but /dev/fuse cannot be opened: {e}")
        }
        Err(e) => {
            eprintln!("skipped: cannot open /dev/fuse ({e})");
            false
        }
    }
}

/// A library mount (`shufflefs::mount::mount`) in a temp dir, unmounted when dropped.
pub struct TestMount {
    mounted: Option<Mounted>,
    dir: TempDir,
}

impl TestMount {
    /// Two FUSE threads, default options.
    pub fn new(fs: ShuffleFs) -> TestMount {
        TestMount::with_threads(fs, 2)
    }

    pub fn with_threads(fs: ShuffleFs, threads: usize) -> TestMount {
        let options = MountOptions {
            threads,
            ..MountOptions::default()
        };
        TestMount::with_options(fs, &options)
    }

    /// A mount with any options (read deadline, threads, owner...).
    pub fn with_options(fs: ShuffleFs, options: &MountOptions) -> TestMount {
        let dir = tempfile::tempdir().unwrap();
        let mounted = mount(fs, dir.path(), options).unwrap();
        TestMount {
            mounted: Some(mounted),
            dir,
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `epoch/E/rank/R/step/S.EXT` of this mount.
    pub fn step(&self, epoch: u64, rank: u64, step: u64, ext: &str) -> PathBuf {
        step_path(self.path(), epoch, rank, step, ext)
    }

    /// Unmounts and checks that it worked.
    pub fn unmount(mut self) {
        self.mounted.take().unwrap().unmount().unwrap();
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        drop(self.mounted.take());
    }
}

/// `ROOT/epoch/E/rank/R/step/S.EXT`.
pub fn step_path(root: &Path, epoch: u64, rank: u64, step: u64, ext: &str) -> PathBuf {
    root.join(format!("epoch/{epoch}/rank/{rank}/step/{step}.{ext}"))
}

/// How many mounts (a stack counts each) /proc/self/mountinfo lists at `path`.
pub fn mount_entries(path: &Path) -> usize {
    let canonical = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let target = canonical.to_str().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(target))
        .count()
}

/// Whether `path` appears as a mount point in /proc/self/mountinfo.
pub fn is_mounted(path: &Path) -> bool {
    mount_entries(path) > 0
}

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_shufflefs");

/// The binary with `args`, no stdin and without `RUST_LOG` (so its stderr is what the flags
/// say): the base of every run of the binary.
pub fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args).env_remove("RUST_LOG").stdin(Stdio::null());
    cmd
}

/// Runs the binary to completion.
pub fn shufflefs(args: &[&str]) -> Output {
    command(args).output().unwrap()
}

/// Runs the binary, which must succeed.
pub fn shufflefs_ok(args: &[&str]) -> Output {
    let o = shufflefs(args);
    assert!(o.status.success(), "shufflefs {args:?}: {}", stderr(&o));
    o
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `shufflefs unmount MNT`, which must succeed (retried a few times while the mount is busy:
/// another test's child may hold a descriptor between fork and exec); then the mount is gone
/// from the table (the one below it, of a stack, stays).
pub fn unmount(mnt: &Path) {
    let before = mount_entries(mnt);
    for _ in 0..20 {
        let o = shufflefs(&["unmount", s(mnt)]);
        if o.status.success() {
            break;
        }
        assert!(stderr(&o).contains("is busy"), "unmount: {}", stderr(&o));
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + DAEMON_BOUND;
    while mount_entries(mnt) >= before {
        assert!(Instant::now() < deadline, "{} stays mounted", mnt.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// [`unmount`], then waits for the daemon `pid` to exit.
pub fn unmount_and_wait(mnt: &Path, pid: i32) {
    unmount(mnt);
    assert!(wait_gone(pid), "daemon {pid} exits after the unmount");
}

/// Waits (bounded) for a process to disappear or become a zombie. Returns whether it did.
pub fn wait_gone(pid: i32) -> bool {
    let deadline = Instant::now() + DAEMON_BOUND;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Waits for `child` to exit and returns its status; kills it and fails the test if it still
/// runs after `bound` (a generous watchdog against a hang, not a speed assertion).
pub fn wait_bounded(child: &mut Child, bound: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + bound;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still runs after {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` runs (exists and is not a zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| !st.contains(") Z "))
}

/// A directory used as a mount point by the binary under test: whatever is still mounted
/// there (stale, live or stacked) is detached when it is dropped, so a failing test leaves no
/// mount behind.
pub struct MountDir(TempDir);

impl MountDir {
    pub fn new() -> MountDir {
        MountDir(tempfile::tempdir().unwrap())
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for MountDir {
    fn drop(&mut self) {
        for _ in 0..10 {
            if !is_mounted(self.path()) {
                return;
            }
            if let Err(e) = shufflefs::mount::detach(self.path()) {
                eprintln!("cannot detach {}: {e}", self.path().display());
            }
        }
    }
}

/// The daemon's pid from `shufflefs mount`'s output (`... (daemon pid N, ...)`).
pub fn daemon_pid(o: &Output) -> i32 {
    let out = String::from_utf8_lossy(&o.stdout);
    let at = out.find("daemon pid ").expect("pid in mount output") + "daemon pid ".len();
    out[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A `shufflefs mount -f` daemon, SIGKILLed and reaped when dropped.
pub struct Daemon(Option<Child>);

impl Daemon {
    /// Starts `shufflefs ARGS` (a foreground mount) with its stderr in `log`, and waits until
    /// `ready` holds (typically: the mount serves `info.json`).
    pub fn start(args: &[&str], log: &Path, ready: impl Fn() -> bool) -> Daemon {
        let mut daemon = Daemon(Some(
            command(args)
                .stdout(Stdio::null())
                .stderr(File::create(log).unwrap())
                .spawn()
                .unwrap(),
        ));
        let deadline = Instant::now() + DAEMON_BOUND;
        loop {
            if let Some(status) = daemon.child().try_wait().unwrap() {
                daemon.0 = None;
                panic!(
                    "the daemon exited with {status} before serving: {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            if ready() {
                return daemon;
            }
            assert!(
                Instant::now() < deadline,
                "the mount did not come up: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("daemon")
    }

    /// SIGKILLs the daemon and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits (bounded) for the daemon to exit by itself and returns its exit code.
    pub fn wait_exit(&mut self) -> Option<i32> {
        let status = wait_bounded(self.child(), DAEMON_BOUND, "the daemon");
        self.0 = None;
        status.code()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `ROOT/stats.json`, parsed (one open: one snapshot).
pub fn stats(root: &Path) -> serde_json::Value {
    crate::common::json(&std::fs::read(root.join("stats.json")).unwrap())
}

/// A second, unprivileged user: `(name, uid, gid)`. Created once with useradd (idempotent: an
/// existing user is reused; CI runs as root on a fresh machine). `None`, with a message, when
/// not root.
pub fn other_user() -> Option<(String, u32, u32)> {
    const NAME: &str = "shufflefs-test";
    static USER: std::sync::Mutex<()> = std::sync::Mutex::new(());
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: creating a second user needs root");
        return None;
    }
    let _serial = USER.lock().unwrap_or_else(|p| p.into_inner());
    let find = || nix::unistd::User::from_name(NAME).ok().flatten();
    if find().is_none() {
        let o = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                NAME,
            ])
            .output()
            .expect("useradd (passwd package) creates the second user");
        // Exit 9: created meanwhile by another process.
        assert!(
            o.status.success() || o.status.code() == Some(9),
            "useradd {NAME}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let user = find().expect("the second user exists");
    Some((user.name, user.uid.as_raw(), user.gid.as_raw()))
}

/// The binary where `uid` can run it: the build's own when every directory above it lets
/// others through, else a copy in a temp dir (kept while the guard lives).
pub struct BinFor {
    pub path: PathBuf,
    _dir: Option<TempDir>,
}

impl BinFor {
    pub fn new() -> BinFor {
        use std::os::unix::fs::PermissionsExt;
        let bin = Path::new(BIN);
        let reachable = bin
            .ancestors()
            .skip(1)
            .all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
            && std::fs::metadata(bin).is_ok_and(|m| m.permissions().mode() & 0o005 == 0o005);
        if reachable {
            return BinFor {
                path: bin.to_path_buf(),
                _dir: None,
            };
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("shufflefs");
        std::fs::copy(bin, &path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        BinFor {
            path,
            _dir: Some(dir),
        }
    }

    /// Runs the binary as `uid:gid` (no supplementary groups), without stdin or RUST_LOG.
    pub fn run_as(&self, uid: u32, gid: u32, args: &[&str]) -> Output {
        use std::os::unix::process::CommandExt;
        Command::new(&self.path)
            .args(args)
            .uid(uid)
            .gid(gid)
            .current_dir("/")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Runs the binary as `uid:gid` in a private mount namespace where `node` is bound over
    /// `/dev/fuse` (unshare and setpriv, util-linux): a device node the user may open, or a
    /// plain file to show what a user without access sees.
    pub fn run_as_with_dev_fuse(&self, uid: u32, gid: u32, node: &Path, args: &[&str]) -> Output {
        let script = r#"node="$1" u="$2" g="$3"; shift 3
            mount --bind "$node" /dev/fuse && exec setpriv --reuid="$u" --regid="$g" --clear-groups -- "$@""#;
        Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(node)
            .args([&uid.to_string(), &gid.to_string()])
            .arg(&self.path)
            .args(args)
            .current_dir("/")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .expect("unshare and setpriv (util-linux)")
    }
}

pub fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
}

pub fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Lets every user through `path` (and read it): temp dirs are 0700.
pub fn open_to_all(path: &Path) {
    chmod(path, if path.is_dir() { 0o755 } else { 0o644 });
}

/// Waits (bounded, generously) until `cond` holds; the bound only turns a hang into a failure.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

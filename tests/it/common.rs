//! Shared fixtures: positional datasets, an independent reference for step files, and a
//! mount guard that always unmounts.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use shufflefs::dtype::ScalarType;
use shufflefs::fs::ShuffleFs;
use shufflefs::mount::{MountOptions, Mounted, mount};
use shufflefs::pack::{PackOptions, pack, write_positional};
use shufflefs::view::{View, ViewConfig};
use tempfile::TempDir;

/// A packed dataset of positional tokens (token i has value i) in a temp dir.
pub struct Positional {
    pub dir: TempDir,
}

impl Positional {
    /// `tokens` u32 positional tokens split into shards of `shard_size` bytes.
    pub fn new(tokens: u64, shard_size: u64) -> Positional {
        Positional::with_dtype(tokens, shard_size, ScalarType::U32)
    }

    pub fn with_dtype(tokens: u64, shard_size: u64, dtype: ScalarType) -> Positional {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("tokens.bin");
        write_positional(&input, dtype, tokens).unwrap();
        let options = PackOptions {
            dtype: Some(dtype),
            shard_size,
            ..PackOptions::default()
        };
        pack(&dir.path().join("ds"), &[input], &options).unwrap();
        Positional { dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("ds")
    }

    pub fn view(&self, config: &ViewConfig) -> View {
        View::open(&self.path(), config).unwrap()
    }

    pub fn fs(&self, config: &ViewConfig) -> ShuffleFs {
        ShuffleFs::new(self.view(config)).unwrap()
    }
}

pub fn config(
    window: u64,
    stride: u64,
    batch: u64,
    ranks: u64,
    seed: u64,
    epochs: u64,
) -> ViewConfig {
    ViewConfig::stream(window, stride, batch, ranks, seed, epochs)
}

/// The data part of a step file, computed independently of the read path: the row of
/// observation `o` is tokens `o*stride .. o*stride+window`, little-endian, and for positional
/// data token `t` has value `t`.
pub fn expected_rows(observations: &[u64], cfg: &ViewConfig, dtype: ScalarType) -> Vec<u8> {
    let stride = cfg.stride.unwrap_or(cfg.window);
    let mut out = Vec::new();
    for &o in observations {
        for t in o * stride..o * stride + cfg.window {
            out.extend_from_slice(&t.to_le_bytes()[..dtype.size()]);
        }
    }
    out
}

/// The observation ids of a step from its S.json bytes.
pub fn json_observations(bytes: &[u8]) -> Vec<u64> {
    let v: serde_json::Value = serde_json::from_slice(bytes).unwrap();
    v["observations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Asserts that the union of `steps` (each a list of observation ids) is a set of distinct
/// observations of size `steps * G` out of `n`, so that exactly `n mod G` are dropped.
pub fn assert_exact_partition(all: &[Vec<u64>], n: u64, global_batch: u64) {
    let mut seen = BTreeSet::new();
    for step in all {
        for &o in step {
            assert!(o < n, "observation {o} out of range {n}");
            assert!(seen.insert(o), "observation {o} served twice in one epoch");
        }
    }
    assert_eq!(
        n - seen.len() as u64,
        n % global_batch,
        "dropped tail must be n mod G"
    );
}

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

/// The shard file names of a packed dataset, in stream order.
pub fn shard_paths(dataset: &Path) -> Vec<PathBuf> {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dataset.join("manifest.json")).unwrap()).unwrap();
    m["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| dataset.join(s["path"].as_str().unwrap()))
        .collect()
}

/// A mount in a temp dir that is always unmounted on drop.
pub struct TestMount {
    pub mounted: Option<Mounted>,
    pub dir: TempDir,
}

impl TestMount {
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

    pub fn step(&self, epoch: u64, rank: u64, step: u64, ext: &str) -> PathBuf {
        self.path()
            .join(format!("epoch/{epoch}/rank/{rank}/step/{step}.{ext}"))
    }

    pub fn unmount(mut self) {
        self.mounted.take().unwrap().unmount().unwrap();
    }
}

impl Drop for TestMount {
    fn drop(&mut self) {
        drop(self.mounted.take());
    }
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

/// One SplitMix64 step: advances `state` and returns the next value (the same generator as
/// `shufflefs::feistel::mix`, which is its output function).
pub fn splitmix(state: &mut u64) -> u64 {
    let current = *state;
    *state = current.wrapping_add(shufflefs::feistel::GOLDEN);
    shufflefs::feistel::mix(current)
}

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_shufflefs");

/// Runs the binary with no stdin and without `RUST_LOG` (so its stderr is what the flags say).
pub fn shufflefs(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Waits (bounded) for a process to disappear or become a zombie. Returns whether it did.
pub fn wait_gone(pid: i32) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|st| st.contains(") Z "))
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
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
}

/// Lets every user through `path` (and read it): temp dirs are 0700.
pub fn open_to_all(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = if path.is_dir() { 0o755 } else { 0o644 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

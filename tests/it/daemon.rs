//! The daemon's resources and edges, through the `shufflefs` binary (issue #10): the log file
//! (no symbolic links, no other user's files), file-descriptor pressure (the default
//! `--max-open-shards` capped to the open-file limit, the caller's stderr released), repeated
//! errors rate-limited in the log, `--cache-size` against memory, bounds of every numeric
//! flag, unmounting another user's mount, unmounting right after reading a `--prefill` mount,
//! and a `/dev/fuse` the user cannot open. Tests that need a second user create one
//! (`common::other_user`). No assertion depends on timing; waits are bounded only so that a
//! hang fails instead of blocking.

use std::fs;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use shufflefs::plan::StepKey;

use crate::common::*;

const PLAN: [&str; 6] = ["--window", "10", "--batch-size", "2", "--ranks", "2"];

fn mount_args<'a>(ds: &'a Path, mnt: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["mount", s(ds), s(mnt)];
    args.extend(PLAN);
    args.extend(extra);
    args
}

#[test]
fn log_file_symlinks_and_other_users_files_are_refused() {
    let data = Data::positional(5000, 4096);
    let dir = data.dir.path();
    let mnt = MountDir::new();
    // A user's symlink x.log -> a root-only file: root's daemon must not append to it.
    let secret = dir.join("root-only");
    fs::write(&secret, b"root's file\n").unwrap();
    let link = dir.join("x.log");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let ds = data.path();
    let o = shufflefs(&mount_args(&ds, mnt.path(), &["--log-file", s(&link)]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is a symbolic link, which the daemon does not follow"),
        "{}",
        stderr(&o)
    );
    assert_eq!(fs::read(&secret).unwrap(), b"root's file\n");
    assert!(!is_mounted(mnt.path()));
    // A file owned by another user.
    if let Some((name, uid, gid)) = other_user() {
        let theirs = dir.join("theirs.log");
        fs::write(&theirs, b"").unwrap();
        nix::unistd::chown(
            &theirs,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        )
        .unwrap();
        let o = shufflefs(&mount_args(&ds, mnt.path(), &["--log-file", s(&theirs)]));
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let want = format!("is owned by uid {uid} ({name}), not by the daemon's user");
        assert!(stderr(&o).contains(&want), "{}", stderr(&o));
        assert_eq!(fs::read(&theirs).unwrap(), b"");
    }
}

/// A dataset of 600 files (300 shards and their checksum files) mounted by a process whose
/// open-file limit is 512, 100 of them already taken by descriptors it inherited: the default
/// `--max-open-shards` is capped to what is left, the mount serves exact bytes through the
/// pool, and `shufflefs mount` with its stdout and stderr captured returns as soon as the mount
/// is ready (the daemon holds neither pipe). The step cache's memory files get only what is
/// left.
#[test]
fn descriptor_pressure_pools_files_and_releases_the_callers_pipes() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(300 * 1024, 4096);
    assert_eq!(shard_paths(&data.path()).len(), 300);
    let mnt = MountDir::new();
    let ds = data.path();
    let mut child = command(&mount_args(&ds, mnt.path(), &[]));
    child.stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: only async-signal-safe calls (setrlimit, dup2) between fork and exec.
    unsafe {
        child.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 512,
                rlim_max: 512,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // 100 inherited descriptors (not close-on-exec), as a parent may leave.
            for fd in 20..120 {
                libc::dup2(0, fd);
            }
            Ok(())
        });
    }
    let mut child = child.spawn().unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut o, mut e) = (String::new(), String::new());
        let _ = out.read_to_string(&mut o);
        let _ = err.read_to_string(&mut e);
        let _ = tx.send((o, e));
    });
    // Both pipes reach end of file once `mount` exits, unless the daemon holds one: the
    // watchdog turns that into a failure instead of a hang.
    let (stdout, stderr) = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the daemon released the caller's stdout and stderr");
    let status = child.wait().unwrap();
    assert!(status.success(), "{stderr}");
    assert!(!stderr.contains("threads exist"), "{stderr}");
    assert!(
        stderr.contains("600 files in the dataset, at most"),
        "pooled: {stderr}"
    );
    let at = stdout.find("daemon pid ").expect("pid") + "daemon pid ".len();
    let pid: i32 = stdout[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let reference = data.fs(&config(10, 10, 2, 2, 0, 1));
    for step in [0, 17, 3000, 7000] {
        let key = StepKey {
            epoch: 0,
            rank: 1,
            step,
        };
        let path = mnt.path().join(format!("epoch/0/rank/1/step/{step}.npy"));
        assert_eq!(
            fs::read(path).unwrap(),
            reference.view().render_step_npy(key).unwrap()
        );
    }
    // Many more steps than the cache holds: the step cache's memory files (passthrough)
    // take only what the limit leaves, never a descriptor the pool needs.
    for step in 0..600 {
        let key = StepKey {
            epoch: 0,
            rank: 0,
            step,
        };
        let path = mnt.path().join(format!("epoch/0/rank/0/step/{step}.npy"));
        assert!(fs::read(path).unwrap() == reference.view().render_step_npy(key).unwrap());
    }
    let open = fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    assert!(open < 512, "{open} descriptors open in the daemon");
    unmount_and_wait(mnt.path(), pid);
}

/// A shard truncated under the mount fails every read (the cause: read, EIO, that shard).
/// 300 failed reads write at most [`shufflefs::logging::BURST`] ERROR lines per minute for
/// that cause and, at unmount, one line counting the rest.
#[test]
fn repeated_read_errors_are_rate_limited_per_cause() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(20_000, 1 << 20);
    let shards = shard_paths(&data.path());
    assert_eq!(shards.len(), 1);
    let mnt = MountDir::new();
    let log = data.dir.path().join("daemon.log");
    let ds = data.path();
    let o = shufflefs(&mount_args(
        &ds,
        mnt.path(),
        &["--cache-size", "0", "--log-file", s(&log)],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let pid = daemon_pid(&o);
    fs::OpenOptions::new()
        .write(true)
        .open(&shards[0])
        .unwrap()
        .set_len(0)
        .unwrap();
    let started = Instant::now();
    const READS: u64 = 300;
    for step in 0..READS {
        let path = mnt.path().join(format!("epoch/0/rank/0/step/{step}.npy"));
        let e = fs::read(path).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
    }
    let minutes = started.elapsed().as_secs() / 60 + 1;
    unmount_and_wait(mnt.path(), pid);
    let text = fs::read_to_string(&log).unwrap();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains(" ERROR ")).collect();
    let failures = errors
        .iter()
        .filter(|l| l.contains("failed with errno 5"))
        .count();
    let summaries: Vec<&str> = errors
        .iter()
        .copied()
        .filter(|l| l.contains("suppressed"))
        .collect();
    let burst = 5u64;
    assert!(
        failures as u64 <= burst * minutes,
        "{failures} ERROR lines for one cause in {minutes} minute(s):\n{text}"
    );
    assert!(
        !summaries.is_empty(),
        "a count of suppressed lines:\n{text}"
    );
    // Each failed read reached the daemon at least once: every one is shown or counted.
    let counted: u64 = summaries
        .iter()
        .map(|l| {
            l.split(" ERROR ")
                .nth(1)
                .unwrap()
                .split(']')
                .nth(1)
                .unwrap()
                .trim()
                .split(' ')
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert!(
        failures as u64 + counted >= READS,
        "{failures} shown + {counted} counted < {READS}:\n{text}"
    );
    assert!(summaries[0].contains(s(&shards[0])), "{}", summaries[0]);
}

/// `--cache-size` beyond the node's memory is refused before mounting, naming both sizes.
#[test]
fn cache_size_beyond_memory_is_refused() {
    if !fuse_available() {
        return;
    }
    let meminfo = fs::read_to_string("/proc/meminfo").unwrap();
    let total_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    let data = Data::positional(5000, 4096);
    let mnt = MountDir::new();
    let ds = data.path();
    let twice = format!("{}KiB", 2 * total_kib);
    let o = shufflefs(&mount_args(&ds, mnt.path(), &["--cache-size", &twice]));
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("is more than the memory this node lets shufflefs use"),
        "{}",
        stderr(&o)
    );
    assert!(!is_mounted(mnt.path()));
    // The default is far below: no warning.
    let o = shufflefs(&mount_args(&ds, mnt.path(), &[]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("--cache-size"), "{}", stderr(&o));
    unmount_and_wait(mnt.path(), daemon_pid(&o));
}

/// Every numeric flag of every command is bounded to what it can mean; clap's message names
/// the range (exit code 2, nothing mounted or written). The largest prefetch depth and epoch
/// count still serve exactly, and no daemon thread outlives the unmount.
#[test]
fn numeric_flags_are_bounded_and_the_largest_values_serve() {
    let data = Data::positional(5000, 4096);
    let mnt = MountDir::new();
    let ds = data.path();
    let max = u64::MAX.to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--prefetch-depth", &max], "is not in 0..=1024"),
        (vec!["--epochs", "1000000000000"], "is not in 1..=1000000"),
        (vec!["--epochs", "0"], "is not in 1..=1000000"),
        (vec!["--window", "4294967296"], "is not in 1..=4294967295"),
        (vec!["--batch-size", "0"], "is not in 1..=1048576"),
        (vec!["--ranks", "2000000"], "is not in 1..=1048576"),
        (vec!["--stride", "0"], "is not in 1..="),
        (vec!["--threads", "0"], "is not in 1..=256"),
        (vec!["--prefetch-workers", "257"], "is not in 0..=256"),
        (vec!["--max-open-shards", "0"], "is not in 1..=1048576"),
        (vec!["--uid", "4294967295"], "is not in 0..=4294967294"),
    ];
    for (flags, want) in &cases {
        // The plan flags of PLAN, with this case's flag instead of its own.
        let mut args = vec!["mount", s(&ds), s(mnt.path())];
        for pair in PLAN.chunks(2).filter(|p| p[0] != flags[0]) {
            args.extend(pair);
        }
        args.extend(flags);
        let o = shufflefs(&args);
        assert_eq!(o.status.code(), Some(2), "{flags:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{flags:?}: {}", stderr(&o));
        assert!(!is_mounted(mnt.path()));
    }
    let out = data.dir.path().join("synth.bin");
    for (args, want) in [
        (
            vec!["synth", s(&out), "--tokens", &max],
            "is not in 1..=1099511627776",
        ),
        (
            vec![
                "bench",
                s(&ds),
                "--window",
                "10",
                "--batch-size",
                "2",
                "--source",
                "direct",
                "--readers",
                "0",
            ],
            "is not in 1..=1024",
        ),
        (
            vec![
                "bench",
                s(&ds),
                "--window",
                "10",
                "--batch-size",
                "2",
                "--source",
                "direct",
                "--pace-us",
                &max,
            ],
            "is not in 0..=60000000",
        ),
        (
            vec![
                "plan",
                s(&ds),
                "--window",
                "10",
                "--batch-size",
                "2",
                "--epochs",
                &max,
                "--info",
            ],
            "is not in 1..=1000000",
        ),
    ] {
        let o = shufflefs(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    assert!(!out.exists());
    if !fuse_available() {
        return;
    }
    // The largest depth and epoch count: the first reads are served (a hint does bounded
    // work), and the daemon, with all its threads, is gone after the unmount.
    let o = shufflefs(&mount_args(
        &ds,
        mnt.path(),
        &[
            "--prefetch-depth",
            "1024",
            "--epochs",
            "1000000",
            "--read-timeout",
            "30",
        ],
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let pid = daemon_pid(&o);
    let reference = data.fs(&config(10, 10, 2, 2, 0, 1_000_000));
    for (epoch, step) in [(0, 0), (0, 1), (999_999, 5)] {
        let key = StepKey {
            epoch,
            rank: 0,
            step,
        };
        let path = mnt
            .path()
            .join(format!("epoch/{epoch}/rank/0/step/{step}.npy"));
        assert_eq!(
            fs::read(path).unwrap(),
            reference.view().render_step_npy(key).unwrap()
        );
    }
    unmount_and_wait(mnt.path(), pid);
}

/// `shufflefs unmount` of root's mount by another user says whose mount it is and what to
/// run (it said `fusermount3: entry for ... not found in /etc/mtab`); the mount stays.
#[test]
fn unmount_of_another_users_mount_names_the_owner() {
    if !fuse_available() {
        return;
    }
    let Some((name, uid, gid)) = other_user() else {
        return;
    };
    let data = Data::positional(5000, 4096);
    let mnt = MountDir::new();
    open_to_all(mnt.path());
    let ds = data.path();
    let o = shufflefs(&mount_args(&ds, mnt.path(), &["--allow-other"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let pid = daemon_pid(&o);
    let bin = BinFor::new();
    for extra in [&[][..], &["--lazy"][..]] {
        let mut args = vec!["unmount", s(mnt.path())];
        args.extend(extra);
        let o = bin.run_as(uid, gid, &args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        for want in [
            format!("made by root (uid 0); you are {name} (uid {uid})"),
            "only its owner or root can unmount it".into(),
            format!("sudo shufflefs unmount {}", mnt.path().display()),
        ] {
            assert!(err.contains(&want), "{extra:?}: {err:?} lacks {want:?}");
        }
        assert!(!err.contains("mtab"), "{err}");
        assert!(is_mounted(mnt.path()), "the mount stays");
    }
    unmount_and_wait(mnt.path(), pid);
}

/// Reading a `--prefill` mount sets the daemon storing the next steps through its own mount;
/// an unmount right after the read used to fail `busy` about half the time. It must succeed
/// the first time, 20 times in a row.
#[test]
fn unmount_right_after_reading_a_prefill_mount_succeeds_every_time() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(400_000, 1 << 16);
    let mnt = MountDir::new();
    let ds = data.path();
    let plan = [
        "--window",
        "257",
        "--stride",
        "256",
        "--batch-size",
        "8",
        "--ranks",
        "2",
    ];
    for round in 0..20 {
        let mut args = vec!["mount", s(&ds), s(mnt.path()), "--prefill"];
        args.extend(plan);
        let o = shufflefs(&args);
        assert!(o.status.success(), "round {round}: {}", stderr(&o));
        let pid = daemon_pid(&o);
        for step in 0..3 {
            let path = mnt.path().join(format!("epoch/0/rank/0/step/{step}.npy"));
            assert!(fs::read(path).is_ok());
        }
        eprintln!("round {round}");
        unmount_and_wait(mnt.path(), pid);
    }
}

/// A user who cannot open `/dev/fuse` is told so, with the fixes (it said `cannot mount:
/// Permission denied (os error 13)`). The device is made unreadable for this one command only:
/// in a private mount namespace (unshare), a root-only file is bind-mounted over it, then the
/// second user runs `shufflefs mount` there (setpriv).
#[test]
fn an_inaccessible_dev_fuse_is_named_with_the_fix() {
    if !fuse_available() {
        return;
    }
    let Some((name, uid, gid)) = other_user() else {
        return;
    };
    let data = Data::positional(5000, 4096);
    for p in [data.dir.path().to_path_buf(), data.path()] {
        open_to_all(&p);
    }
    for f in fs::read_dir(data.path()).unwrap() {
        open_to_all(&f.unwrap().path());
    }
    let mnt = MountDir::new();
    open_to_all(mnt.path());
    chown(mnt.path(), uid, gid);
    let cover = data.dir.path().join("no-fuse");
    fs::write(&cover, b"").unwrap();
    chmod(&cover, 0o600);
    let ds = data.path();
    let args = [
        "mount",
        s(&ds),
        s(mnt.path()),
        "--window",
        "10",
        "--batch-size",
        "2",
    ];
    let o = BinFor::new().run_as_with_dev_fuse(uid, gid, &cover, &args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    for want in [
        "cannot open /dev/fuse (Permission denied".to_string(),
        format!("user {name} may not open it read-write"),
        "chmod 0666 /dev/fuse".into(),
        "or mount as root".into(),
        "docs/OPERATIONS.md, section Containers".into(),
    ] {
        assert!(err.contains(&want), "{err:?} lacks {want:?}");
    }
    assert!(!is_mounted(mnt.path()));
}

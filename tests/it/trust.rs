//! Trust (issue #10): what a dataset directory can make a mount serve. The manifest is opened
//! like a shard (no FIFO, device or symbolic link), checksum files are bound to their shards,
//! in-place shards are identified by their content (so copies, moves and archives of the
//! dataset directory keep their fingerprint), and a mount never serves bytes the dataset's
//! owner could not read (tested with a real second user).

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// Runs the binary like [`shufflefs`], but fails instead of hanging: a generous watchdog (60 s
/// for commands that fail in milliseconds), not a timing assert. The address space is capped
/// at 4 GiB, so a command that reads an endless file fails instead of exhausting the node.
fn shufflefs_watched(args: &[&str]) -> Output {
    let mut cmd = command(args);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 4 << 30,
                rlim_max: 4 << 30,
            };
            libc::setrlimit(libc::RLIMIT_AS, &limit);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "shufflefs {args:?} still running after 60 s: {}",
                stderr(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

// ---------------------------------------------------------------------------------------------
// manifest.json is opened like a shard.

#[test]
fn a_fifo_or_device_manifest_is_refused_promptly_by_every_command() {
    let data = Data::positional(1000, 1024);
    let ds = data.path();
    let manifest = ds.join("manifest.json");
    let saved = fs::read(&manifest).unwrap();
    let mnt = MountDir::new();
    let d = s(&ds).to_string();
    let m = s(mnt.path()).to_string();
    let plan = ["--window", "4", "--batch-size", "2"];
    let commands: Vec<Vec<&str>> = vec![
        vec!["inspect", &d],
        vec!["verify", &d],
        [&["plan", &d, "--info"][..], &plan].concat(),
        [&["mount", &d, &m][..], &plan].concat(),
    ];
    for (kind, want) in [
        ("fifo", "is not a regular file"),
        ("symlink to /dev/zero", "is a symbolic link"),
        ("directory", "is not a regular file"),
    ] {
        fs::remove_file(&manifest).unwrap();
        match kind {
            "fifo" => {
                nix::unistd::mkfifo(&manifest, nix::sys::stat::Mode::from_bits_truncate(0o644))
                    .unwrap()
            }
            "directory" => fs::create_dir(&manifest).unwrap(),
            _ => std::os::unix::fs::symlink("/dev/zero", &manifest).unwrap(),
        }
        for args in &commands {
            let out = shufflefs_watched(args);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{kind}: {args:?}: {err}");
            assert!(
                err.contains(&format!("{}: the manifest {want}", manifest.display())),
                "{kind}: {args:?}: {err}"
            );
            assert!(!is_mounted(mnt.path()), "{kind}: {args:?} mounted");
        }
        if kind == "directory" {
            fs::remove_dir(&manifest).unwrap();
        } else {
            fs::remove_file(&manifest).unwrap();
        }
        fs::write(&manifest, &saved).unwrap();
    }
    // A manifest larger than the bound is refused before it is read.
    let f = fs::File::options().append(true).open(&manifest).unwrap();
    f.set_len(shufflefs::dataset::MAX_MANIFEST_BYTES + 1)
        .unwrap();
    let out = shufflefs_watched(&["inspect", &d]);
    assert!(
        stderr(&out).contains("more than the 1073741824 bytes a manifest may have"),
        "{}",
        stderr(&out)
    );
    // `pack --force` over such a directory replaces the dataset instead of hanging.
    fs::remove_file(&manifest).unwrap();
    nix::unistd::mkfifo(&manifest, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let input = data.dir.path().join("tokens.bin");
    let out = shufflefs_watched(&[
        "pack",
        &d,
        s(&input),
        "--dtype",
        "u32",
        "--force",
        "--no-progress",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(shufflefs_watched(&["inspect", &d]).status.success());
}

// ---------------------------------------------------------------------------------------------
// Checksum files are bound to their shards.

/// Swaps the names of two files.
fn swap_files(a: &Path, b: &Path) {
    let tmp = a.with_extension("swap");
    fs::rename(a, &tmp).unwrap();
    fs::rename(b, a).unwrap();
    fs::rename(&tmp, b).unwrap();
}

#[test]
fn shards_swapped_with_their_checksum_files_fail_verified_reads() {
    if !fuse_available() {
        return;
    }
    // 21 shards of 64 KiB (one checksum block each) of positional u32 tokens.
    let data = Data::positional(330_000, 64 << 10);
    let ds = data.path();
    let cfg = config(64, 64, 16, 1, 5, 1);
    let reference = shufflefs::fs::ShuffleFs::new(data.view(&cfg)).unwrap();
    let steps = reference.view().plan().steps_per_epoch();
    let expected: Vec<Vec<u8>> = (0..steps)
        .map(|step| {
            let key = shufflefs::plan::StepKey {
                epoch: 0,
                rank: 0,
                step,
            };
            reference.view().render_step_npy(key).unwrap()
        })
        .collect();
    let manifest: serde_json::Value = manifest(&ds);
    let shards = manifest["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 21);
    for (a, b) in [(3, 4), (17, 18)] {
        for key in ["/path", "/checksums/file"] {
            let name = |i: usize| {
                shards[i]
                    .pointer(key)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_string()
            };
            swap_files(&ds.join(name(a)), &ds.join(name(b)));
        }
    }
    let mnt = MountDir::new();
    let log = data.dir.path().join("daemon.log");
    let out = shufflefs(&[
        "mount",
        s(&ds),
        s(mnt.path()),
        "--window",
        "64",
        "--batch-size",
        "16",
        "--seed",
        "5",
        "--verify-reads",
        "--log-file",
        s(&log),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (mut wrong, mut eio, mut same) = (0, 0, 0);
    for (step, want) in expected.iter().enumerate() {
        let path = mnt.path().join(format!("epoch/0/rank/0/step/{step}.npy"));
        match fs::read(&path) {
            Ok(bytes) if bytes == *want => same += 1,
            Ok(_) => wrong += 1,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "step {step}: {e}");
                eio += 1;
            }
        }
    }
    unmount(mnt.path());
    eprintln!("{steps} steps: {same} served right, {eio} EIO, {wrong} wrong");
    assert_eq!(wrong, 0, "steps served with another shard's bytes");
    assert!(eio > 0 && same > 0, "{same} right, {eio} EIO");
    let log = fs::read_to_string(&log).unwrap();
    let sums3 = shards[3]["checksums"]["file"].as_str().unwrap();
    assert!(
        log.lines().any(|l| l.contains(sums3)
            && l.contains("this checksum file does not hash to")
            && l.contains(shards[3]["path"].as_str().unwrap())),
        "{log}"
    );
}

// ---------------------------------------------------------------------------------------------
// In-place shards are identified by their content.

/// Writes `n` u16 tokens `t * 3 + k` with an mtime that has nanoseconds (which tar rounds).
fn token_file(path: &Path, n: u16, k: u16) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let bytes: Vec<u8> = (0..n)
        .flat_map(|t| t.wrapping_mul(3).wrapping_add(k).to_le_bytes())
        .collect();
    fs::write(path, bytes).unwrap();
    let mtime = std::time::UNIX_EPOCH + Duration::new(1_700_000_000 + u64::from(k), 123_456_789);
    fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
}

const PLAN: [&str; 8] = [
    "--window",
    "33",
    "--stride",
    "32",
    "--batch-size",
    "4",
    "--seed",
    "9",
];

fn fingerprint(ds: &Path) -> Result<String, String> {
    let out = shufflefs_watched(&[&["plan", s(ds), "--info"][..], &PLAN].concat());
    if !out.status.success() {
        return Err(stderr(&out));
    }
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Ok(info["fingerprint"].as_str().unwrap().to_string())
}

/// Mounts `ds`, reads steps 0..n of rank 0 and unmounts.
fn mounted_steps(ds: &Path, n: u64) -> Vec<Vec<u8>> {
    let mnt = MountDir::new();
    let out = shufflefs(&[&["mount", s(ds), s(mnt.path())][..], &PLAN].concat());
    assert!(out.status.success(), "{}: {}", ds.display(), stderr(&out));
    let steps = (0..n)
        .map(|k| fs::read(mnt.path().join(format!("epoch/0/rank/0/step/{k}.npy"))).unwrap())
        .collect();
    unmount(mnt.path());
    steps
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {}", stderr(&out));
}

#[test]
fn in_place_copies_archives_and_moves_keep_the_fingerprint() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    for (k, n) in [(0u16, 40_000u16), (1, 50_000), (2, 3_000)] {
        token_file(&ds.join(format!("data/part{k}.bin")), n, k);
    }
    let outside = tmp.path().join("outside/ext.bin");
    token_file(&outside, 45_000, 3);
    let inputs: Vec<String> = (0..3)
        .map(|k| s(&ds.join(format!("data/part{k}.bin"))).to_string())
        .chain([s(&outside).to_string()])
        .collect();
    let mut args = vec!["pack", s(&ds)];
    args.extend(inputs.iter().map(String::as_str));
    args.extend(["--dtype", "u16", "--in-place", "--no-progress"]);
    let out = shufflefs(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    // Paths inside the dataset directory are relative, the one outside stays absolute.
    let manifest: serde_json::Value = manifest(&ds);
    let paths: Vec<&str> = manifest["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "data/part0.bin",
            "data/part1.bin",
            "data/part2.bin",
            s(&outside)
        ]
    );
    let want = fingerprint(&ds).unwrap();
    let reference = mounted_steps(&ds, 20);
    // Each copy is checked with the original moved away: it must not be what is served.
    let away = tmp.path().join("away");
    let check = |copy: &Path, how: &str| {
        fs::rename(&ds, &away).unwrap();
        assert_eq!(fingerprint(copy).as_deref(), Ok(want.as_str()), "{how}");
        assert!(mounted_steps(copy, 20) == reference, "{how}: other bytes");
        fs::rename(&away, &ds).unwrap();
    };
    let copy = tmp.path().join("cp-a");
    run(Command::new("cp").arg("-a").arg(&ds).arg(&copy));
    check(&copy, "cp -a");
    let archive = tmp.path().join("ds.tar");
    run(Command::new("tar")
        .arg("-C")
        .arg(tmp.path())
        .arg("-cf")
        .arg(&archive)
        .arg("ds"));
    let untarred = tmp.path().join("untarred");
    fs::create_dir(&untarred).unwrap();
    run(Command::new("tar")
        .arg("-C")
        .arg(&untarred)
        .arg("-xf")
        .arg(&archive));
    let mtime = |p: &Path| shufflefs::dataset::mtime_ns(&fs::metadata(p).unwrap());
    assert_ne!(
        mtime(&untarred.join("ds/data/part0.bin")),
        mtime(&ds.join("data/part0.bin")),
        "tar rounds mtimes to seconds: the mount samples the content instead"
    );
    check(&untarred.join("ds"), "tar");
    if Command::new("rsync").arg("--version").output().is_ok() {
        let synced = tmp.path().join("rsync-a");
        run(Command::new("rsync")
            .arg("-a")
            .arg(format!("{}/", ds.display()))
            .arg(&synced));
        check(&synced, "rsync -a");
    } else {
        eprintln!("skipped the rsync -a case: rsync is not installed");
    }
    let moved = tmp.path().join("moved");
    fs::rename(&ds, &moved).unwrap();
    assert_eq!(fingerprint(&moved).as_deref(), Ok(want.as_str()), "mv");
    assert!(mounted_steps(&moved, 20) == reference, "mv: other bytes");
}

#[test]
fn in_place_content_changes_are_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    // Equal sizes and equal mtimes: only the content tells the files apart.
    for k in 0..2 {
        token_file(&ds.join(format!("part{k}.bin")), 40_000, 0);
        let f = fs::File::options()
            .write(true)
            .open(ds.join(format!("part{k}.bin")))
            .unwrap();
        std::os::unix::fs::FileExt::write_at(&f, &[k as u8 + 1], 0).unwrap();
        f.set_modified(std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
            .unwrap();
    }
    let out = shufflefs(&[
        "pack",
        s(&ds),
        s(&ds.join("part0.bin")),
        s(&ds.join("part1.bin")),
        "--dtype",
        "u16",
        "--in-place",
        "--no-progress",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let want = fingerprint(&ds).unwrap();
    let manifest = ds.join("manifest.json");
    let pristine = fs::read_to_string(&manifest).unwrap();
    let refused = |what: &str, file: &str| {
        let err = fingerprint(&ds).expect_err(what);
        assert!(
            err.contains(&format!(
                "{}: this file is referenced in place",
                ds.join(file).display()
            )) && err.contains("content is not what `pack --in-place` referenced"),
            "{what}: {err}"
        );
    };
    // The two paths swapped in the manifest (sizes and mtimes still match).
    let swapped = pristine
        .replace("part0.bin", "PART")
        .replace("part1.bin", "part0.bin")
        .replace("PART", "part1.bin");
    fs::write(&manifest, swapped).unwrap();
    refused("swapped paths", "part1.bin");
    fs::write(&manifest, &pristine).unwrap();
    assert_eq!(fingerprint(&ds).as_deref(), Ok(want.as_str()));
    // A byte of a sampled page rewritten (same size, new mtime).
    let f = fs::File::options()
        .write(true)
        .open(ds.join("part1.bin"))
        .unwrap();
    std::os::unix::fs::FileExt::write_at(&f, &[0xEE], 40_000 * 2 - 1).unwrap();
    drop(f);
    refused("a rewritten byte", "part1.bin");
}

#[test]
fn version_3_in_place_datasets_still_mount_and_verify_upgrades_them() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    let part = ds.join("data/part0.bin");
    token_file(&part, 50_000, 0);
    let out = shufflefs(&[
        "pack",
        s(&ds),
        s(&part),
        "--dtype",
        "u16",
        "--in-place",
        "--no-progress",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let manifest = ds.join("manifest.json");
    let v4: serde_json::Value = serde_json::from_slice(&fs::read(&manifest).unwrap()).unwrap();
    // The same dataset as a version 3 pack wrote it: absolute path, identity of path, size
    // and mtime.
    let mut v3 = v4.clone();
    v3["version"] = 3.into();
    let shard = v3["shards"][0].as_object_mut().unwrap();
    shard.remove("in_place_guard");
    let (bytes, mtime) = (
        shard["bytes"].as_u64().unwrap(),
        shard["in_place_mtime_ns"].as_u64().unwrap(),
    );
    let abs = s(&part.canonicalize().unwrap()).to_string();
    shard.insert(
        "hash".into(),
        shufflefs::format::in_place_hash(&abs, bytes, mtime).into(),
    );
    shard.insert("path".into(), abs.into());
    let mut m: shufflefs::format::Manifest = serde_json::from_value(v3).unwrap();
    m.content_hash = m.expected_content_hash();
    fs::write(&manifest, m.to_bytes()).unwrap();
    let v3_fingerprint = fingerprint(&ds).unwrap();
    let out = shufflefs(&["verify", s(&ds), "--write-checksums"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let upgraded: serde_json::Value =
        serde_json::from_slice(&fs::read(&manifest).unwrap()).unwrap();
    // Version 4: the oldest that expresses a dataset without compact documents.
    assert_eq!(upgraded["version"], 4);
    let shard = &upgraded["shards"][0];
    assert_eq!(shard["path"], "data/part0.bin");
    assert_eq!(
        shard["hash"], v4["shards"][0]["hash"],
        "the content identity"
    );
    assert!(shard["checksums"].is_object());
    let fp = fingerprint(&ds).unwrap();
    assert_ne!(fp, v3_fingerprint);
    // A same-size change with the mtime put back is trusted at mount (the guard vouches for
    // an unmodified file), but `verify` (and --verify-reads) check every block.
    let f = fs::File::options().write(true).open(&part).unwrap();
    std::os::unix::fs::FileExt::write_at(&f, &[0xEE], 5_000).unwrap();
    f.set_modified(std::time::UNIX_EPOCH + Duration::from_nanos(mtime))
        .unwrap();
    drop(f);
    assert_eq!(fingerprint(&ds).as_deref(), Ok(fp.as_str()));
    let out = shufflefs(&["verify", s(&ds)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 of 2 blocks fail their checksum"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

// ---------------------------------------------------------------------------------------------
// A mount never serves bytes the dataset's owner could not read (a real second user).

/// The second user's (uid, gid) (`common::other_user`, created if missing). `None`, with a
/// message, when the tests do not run as root (only root creates users and mounts as root),
/// unless `SHUFFLEFS_REQUIRE_FUSE=1` asks for every test to run.
fn second_user() -> Option<(u32, u32)> {
    assert!(
        nix::unistd::geteuid().is_root()
            || std::env::var_os("SHUFFLEFS_REQUIRE_FUSE").is_none_or(|v| v != "1"),
        "SHUFFLEFS_REQUIRE_FUSE=1 but the owner rule needs root (to create a second user)"
    );
    other_user().map(|(_, uid, gid)| (uid, gid))
}

/// A manifest as an unprivileged user can write it for today's readers: version 3, u8
/// records, every file in place by absolute path, each identity hash recomputed (path, size
/// and mtime, which `stat` tells anyone).
fn in_place_manifest(files: &[PathBuf]) -> Vec<u8> {
    let shards: Vec<serde_json::Value> = files
        .iter()
        .map(|p| {
            let meta = fs::metadata(p).unwrap();
            let mtime = shufflefs::dataset::mtime_ns(&meta);
            serde_json::json!({
                "path": s(p),
                "records": meta.len(),
                "bytes": meta.len(),
                "hash": shufflefs::format::in_place_hash(s(p), meta.len(), mtime),
                "in_place_mtime_ns": mtime,
            })
        })
        .collect();
    let records: u64 = files.iter().map(|p| fs::metadata(p).unwrap().len()).sum();
    let mut m: shufflefs::format::Manifest = serde_json::from_value(serde_json::json!({
        "format": "shufflefs-dataset",
        "version": 3,
        "dtype": "|u1",
        "itemsize": 1,
        "records": records,
        "shards": shards,
        "content_hash": "",
        "created_by": "an unprivileged user",
    }))
    .unwrap();
    m.content_hash = m.expected_content_hash();
    m.to_bytes()
}

/// `shufflefs mount DS MNT --window 1 --batch-size 1 --allow-other` (as root).
fn mount_allow_other(ds: &Path, mnt: &Path, extra: &[&str]) -> Output {
    let args = [
        &[
            "mount",
            s(ds),
            s(mnt),
            "--window",
            "1",
            "--batch-size",
            "1",
            "--allow-other",
        ][..],
        extra,
    ]
    .concat();
    shufflefs_watched(&args)
}

#[test]
fn a_users_manifest_cannot_make_roots_mount_serve_files_the_user_cannot_read() {
    let Some((uid, gid)) = second_user() else {
        return;
    };
    if !fuse_available() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    chmod(&base, 0o755);
    // Root's files: a 0600 file, and a readable file in a 0700 directory.
    let secret = base.join("secret.bin");
    fs::write(&secret, b"root's secret bytes").unwrap();
    chmod(&secret, 0o600);
    let private = base.join("private");
    fs::create_dir(&private).unwrap();
    chmod(&private, 0o700);
    let hidden = private.join("open.bin");
    fs::write(&hidden, b"readable, in a private directory").unwrap();
    chmod(&hidden, 0o644);
    // The user's dataset directory, with a token file of their own, a hard link to root's
    // secret (protected_hardlinks stops the user making it, not root: as if it were off) and
    // a symbolic link to /etc as a directory on the way to a file.
    let ds = base.join("ds");
    fs::create_dir(&ds).unwrap();
    let own = ds.join("own.bin");
    fs::write(&own, b"the user's own tokens").unwrap();
    fs::hard_link(&secret, ds.join("link.bin")).unwrap();
    std::os::unix::fs::symlink("/etc", ds.join("etc")).unwrap();
    for p in [&ds, &own] {
        chown(p, uid, gid);
    }
    let mut targets = vec![secret.clone(), hidden, ds.join("link.bin")];
    if Path::new("/etc/shadow").exists() {
        targets.extend([PathBuf::from("/etc/shadow"), ds.join("etc/shadow")]);
    }
    let manifest = ds.join("manifest.json");
    let mnt = MountDir::new();
    for target in &targets {
        fs::write(&manifest, in_place_manifest(&[own.clone(), target.clone()])).unwrap();
        chown(&manifest, uid, gid);
        let out = mount_allow_other(&ds, mnt.path(), &[]);
        let err = stderr(&out);
        let mounted = is_mounted(mnt.path());
        if mounted {
            let leaked = fs::read(mnt.path().join("observation/21.npy"));
            let _ = shufflefs(&["unmount", s(mnt.path())]);
            panic!(
                "{}: mounted, observation 21 is {leaked:?}",
                target.display()
            );
        }
        assert_eq!(out.status.code(), Some(1), "{}: {err}", target.display());
        assert!(
            err.contains(&format!(
                "{}: user shufflefs-test (uid {uid}), owner of",
                target.display()
            )) && err.contains(
                "cannot read this file (Permission denied (os error 13)): a mount never \
                 serves bytes the dataset's owner could not read"
            ),
            "{}: {err}",
            target.display()
        );
    }
    // The user's dataset naming only their own file mounts and serves it.
    fs::write(&manifest, in_place_manifest(std::slice::from_ref(&own))).unwrap();
    chown(&manifest, uid, gid);
    let out = mount_allow_other(&ds, mnt.path(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let row = fs::read(mnt.path().join("observation/4.npy")).unwrap();
    assert_eq!(row.last(), Some(&b"the user's own tokens"[4]));
    unmount(mnt.path());
    // The same dataset owned by root names what root chooses.
    fs::write(&manifest, in_place_manifest(&[own.clone(), secret.clone()])).unwrap();
    for p in [&ds, &own, &manifest] {
        chown(p, 0, 0);
    }
    let out = mount_allow_other(&ds, mnt.path(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let row = fs::read(mnt.path().join("observation/21.npy")).unwrap();
    assert_eq!(row.last(), Some(&b'r'), "the first byte of root's file");
    unmount(mnt.path());
}

#[test]
fn pseudo_filesystems_are_refused_whoever_owns_the_dataset() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = tmp.path().join("ds");
    fs::create_dir(&ds).unwrap();
    let own = ds.join("own.bin");
    fs::write(&own, b"tokens").unwrap();
    // /proc/self/status is a regular file of size 0, so the attack needs a size: forge one.
    let mut m: serde_json::Value =
        serde_json::from_slice(&in_place_manifest(std::slice::from_ref(&own))).unwrap();
    let status = serde_json::json!({
        "path": "/proc/self/status",
        "records": 100,
        "bytes": 100,
        "hash": shufflefs::format::in_place_hash("/proc/self/status", 100, 0),
        "in_place_mtime_ns": 0,
    });
    m["shards"].as_array_mut().unwrap().push(status);
    m["records"] = 106.into();
    let mut m: shufflefs::format::Manifest = serde_json::from_value(m).unwrap();
    m.content_hash = m.expected_content_hash();
    fs::write(ds.join("manifest.json"), m.to_bytes()).unwrap();
    let out = shufflefs_watched(&["inspect", s(&ds)]);
    assert!(
        stderr(&out).contains(
            "/proc/self/status: this file is on a proc filesystem, a kernel interface and not \
             dataset storage"
        ),
        "{}",
        stderr(&out)
    );
}

#[test]
fn files_reopened_through_the_descriptor_pool_keep_the_owner_rule() {
    let Some((uid, gid)) = second_user() else {
        return;
    };
    if !fuse_available() {
        return;
    }
    // The user's dataset: 4 shards of 1,024 u32 tokens (the files root packed, given to them).
    let data = Data::positional(4000, 4096);
    chmod(data.dir.path(), 0o755);
    let ds = data.path();
    for entry in fs::read_dir(&ds).unwrap() {
        chown(&entry.unwrap().path(), uid, gid);
    }
    chown(&ds, uid, gid);
    let mnt = MountDir::new();
    let out = mount_allow_other(&ds, mnt.path(), &["--max-open-shards", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let token = |i: u32| {
        fs::read(mnt.path().join(format!("observation/{i}.npy")))
            .map(|b| u32::from_le_bytes(b[b.len() - 4..].try_into().unwrap()))
    };
    for i in [10, 1100, 2100, 3100, 10] {
        assert_eq!(token(i).unwrap(), i, "observation {i}");
    }
    // Root takes shard 2 away from the user (its mtime, size and inode stay): once its
    // descriptor was closed, the pool reopens it as the user and is refused.
    let shard = shard_paths(&ds)[2].clone();
    chown(&shard, 0, 0);
    chmod(&shard, 0o600);
    assert_eq!(token(10).unwrap(), 10, "closes shard 2's descriptor");
    let err = token(2100).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
    assert_eq!(token(3100).unwrap(), 3100);
    unmount(mnt.path());
}

/// Runs `shufflefs ARGS` as `uid:gid`. Where that user may not open `/dev/fuse` (mode 0600:
/// `mount` checks it first), the command runs in a private mount namespace with a 0666 node of
/// the same device bound over it (unshare and setpriv, util-linux), for this command only.
fn shufflefs_as(uid: u32, gid: u32, args: &[&str]) -> Output {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let bin = BinFor::new();
    let fuse = fs::metadata("/dev/fuse").unwrap();
    if fuse.permissions().mode() & 0o006 == 0o006 {
        return bin.run_as(uid, gid, args);
    }
    assert!(fuse.file_type().is_char_device());
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("fuse");
    nix::sys::stat::mknod(
        &node,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        std::os::unix::fs::MetadataExt::rdev(&fuse),
    )
    .unwrap();
    chmod(&node, 0o666);
    bin.run_as_with_dev_fuse(uid, gid, &node, args)
}

#[test]
fn a_non_root_allow_other_mount_serves_only_files_everyone_may_read() {
    let Some((uid, gid)) = second_user() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let base = tmp.path().canonicalize().unwrap();
    chmod(&base, 0o755);
    // A file only the second user may read, named by a dataset of another user (nobody).
    let mine = base.join("mine.bin");
    fs::write(&mine, b"the daemon user's private bytes").unwrap();
    chown(&mine, uid, gid);
    chmod(&mine, 0o600);
    let ds = base.join("ds");
    fs::create_dir(&ds).unwrap();
    fs::write(
        ds.join("manifest.json"),
        in_place_manifest(std::slice::from_ref(&mine)),
    )
    .unwrap();
    for p in [&ds, &ds.join("manifest.json")] {
        chown(p, 65534, 65534);
    }
    // A mount point the user cannot use: whatever passes the dataset checks stops there, so
    // nothing is ever mounted.
    let mnt = tempfile::tempdir().unwrap();
    let mnt = mnt.path().join("private");
    fs::create_dir(&mnt).unwrap();
    let as_user = |allow_other: bool| {
        let mut args = vec![
            "mount",
            s(&ds),
            s(&mnt),
            "--window",
            "1",
            "--batch-size",
            "1",
        ];
        if allow_other {
            args.push("--allow-other");
        }
        let out = shufflefs_as(uid, gid, &args);
        assert!(!out.status.success());
        stderr(&out)
    };
    let err = as_user(true);
    assert!(
        err.contains(&format!(
            "{}: not every user may read this file",
            mine.display()
        )) && err.contains("user nobody (uid 65534), owner of"),
        "{err}"
    );
    // Without --allow-other only the daemon's user reads the mount: no such check.
    let err = as_user(false);
    assert!(
        !err.contains("not every user may read") && err.contains(s(&mnt)),
        "{err}"
    );
    chmod(&mine, 0o644);
    let err = as_user(true);
    assert!(
        !err.contains("not every user may read") && err.contains(s(&mnt)),
        "{err}"
    );
}

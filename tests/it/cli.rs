//! The `shufflefs` binary as a user runs it: exit codes, messages, the background daemon,
//! signals and stale mounts.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

#[test]
fn pack_inspect_plan_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("t.bin");
    let ds = dir.path().join("ds");
    assert!(
        shufflefs(&["synth", s(&tokens), "--tokens", "10000", "--dtype", "u16"])
            .status
            .success()
    );
    let o = shufflefs(&[
        "pack",
        s(&ds),
        s(&tokens),
        "--dtype",
        "u16",
        "--shard-size",
        "4KiB",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("packed 10000 records"));
    assert_eq!(
        fs::read_dir(&ds).unwrap().count(),
        11,
        "5 shards + 5 checksum files + manifest, no temp files"
    );
    let o = shufflefs(&["inspect", s(&ds), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["n_tokens"], 10000);
    assert_eq!(v["dtype"], "<u2");
    let o = shufflefs(&[
        "plan",
        s(&ds),
        "--window",
        "9",
        "--stride",
        "8",
        "--batch-size",
        "4",
        "--ranks",
        "2",
        "--seed",
        "5",
        "--epoch",
        "0",
        "--rank",
        "1",
        "--step",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let view = shufflefs::view::View::open(&ds, &config(9, 8, 4, 2, 5, 1)).unwrap();
    let key = shufflefs::plan::StepKey {
        epoch: 0,
        rank: 1,
        step: 3,
    };
    assert_eq!(
        o.stdout,
        view.step_json(key).unwrap(),
        "plan prints exactly S.json"
    );
    let o = shufflefs(&[
        "plan",
        s(&ds),
        "--window",
        "9",
        "--batch-size",
        "4",
        "--epoch",
        "0",
        "--rank",
        "1",
        "--step",
        "0",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no such step: epoch 0 rank 1"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn pack_refuses_bad_inputs_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let p = |name: &str| dir.path().join(name);
    fs::write(p("odd.bin"), [1u8, 2, 3]).unwrap();
    fs::write(p("ok.bin"), [0u8; 16]).unwrap();
    fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokens_u2_1d.npy"),
        p("u2.npy"),
    )
    .unwrap();
    fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/step_u4_4x6.npy"),
        p("2d.npy"),
    )
    .unwrap();
    let cases: &[(&[&str], &str)] = &[
        (
            &["odd.bin", "--dtype", "u16"],
            "odd.bin: 3 bytes is not a whole number of <u2 records",
        ),
        (
            &["u2.npy", "--dtype", "u32"],
            "u2.npy: array dtype is u16 (<u2) but the dataset's records are <u4",
        ),
        (
            &["2d.npy", "--dtype", "u32"],
            "2d.npy: array has shape [4, 6]",
        ),
        (
            &["ok.bin", "missing.bin", "--dtype", "u32"],
            "missing.bin: No such file",
        ),
        (
            &["ok.bin", "--dtype", "f32"],
            "--dtype \"f32\" (f32) is not a token type",
        ),
        (
            &["ok.bin", "--dtype", "u32", "--shard-size", "2"],
            "smaller than one record",
        ),
        (
            &["ok.bin", "--dtype", "u32", "--shard-size", "1.5GiB"],
            "invalid size",
        ),
    ];
    for (args, want) in cases {
        let out_dir = p("ds");
        let mut full = vec!["pack", s(&out_dir)];
        let inputs: Vec<String> = args
            .iter()
            .map(|a| {
                if a.contains('.') && !a.starts_with('-') && !a.contains("GiB") {
                    s(&p(a)).to_string()
                } else {
                    a.to_string()
                }
            })
            .collect();
        full.extend(inputs.iter().map(String::as_str));
        let o = shufflefs(&full);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
        assert!(
            !out_dir.exists() || fs::read_dir(&out_dir).unwrap().count() == 0,
            "{args:?} left files behind"
        );
    }
    // A valid .npy input packs; packing over an existing dataset needs --force.
    let ds = p("npyds");
    assert!(
        shufflefs(&["pack", s(&ds), s(&p("u2.npy")), "--dtype", "u16"])
            .status
            .success()
    );
    let o = shufflefs(&["pack", s(&ds), s(&p("u2.npy")), "--dtype", "u16"]);
    assert!(
        stderr(&o).contains("already holds a dataset"),
        "{}",
        stderr(&o)
    );
    let o = shufflefs(&[
        "pack",
        s(&ds),
        s(&p("u2.npy")),
        s(&p("u2.npy")),
        "--dtype",
        "u16",
        "--force",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&shufflefs(&["inspect", s(&ds), "--json"]).stdout).unwrap();
    assert_eq!(v["n_tokens"], 2000);
    // The packed stream is the .npy payload, byte for byte, concatenated in order.
    let raw = fs::read(p("u2.npy")).unwrap();
    let payload = &raw[128..];
    let shard = fs::read(&shard_paths(&ds)[0]).unwrap();
    assert_eq!(&shard[..2000], payload);
    assert_eq!(&shard[2000..], payload);
}

#[test]
fn usage_errors_exit_2() {
    let o = shufflefs(&["mount", "/nonexistent"]);
    assert_eq!(o.status.code(), Some(2));
    let o = shufflefs(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn mount_refuses_broken_datasets_naming_the_file() {
    let data = Data::positional(5000, 4096);
    let mnt = tempfile::tempdir().unwrap();
    let ds = data.path();
    let mount = |ds: &Path| {
        shufflefs(&[
            "mount",
            s(ds),
            s(mnt.path()),
            "--window",
            "10",
            "--batch-size",
            "2",
        ])
    };
    // Truncated shard.
    let shard = shard_paths(&ds)[1].clone();
    let name = shard.file_name().unwrap().to_str().unwrap().to_string();
    let original = fs::read(&shard).unwrap();
    fs::write(&shard, &original[..100]).unwrap();
    let o = mount(&ds);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains(&format!(
            "{name}: shard is 100 bytes but the manifest records 4096"
        )),
        "{}",
        stderr(&o)
    );
    // Missing shard.
    fs::remove_file(&shard).unwrap();
    let o = mount(&ds);
    assert!(
        stderr(&o).contains(&format!("{name}: file listed in the manifest is missing")),
        "{}",
        stderr(&o)
    );
    // A symlink in place of a shard is refused (it could expose another file).
    std::os::unix::fs::symlink("/etc/hostname", &shard).unwrap();
    let o = mount(&ds);
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    fs::remove_file(&shard).unwrap();
    fs::write(&shard, &original).unwrap();
    // Corrupt manifest.
    let manifest = ds.join("manifest.json");
    let good = fs::read(&manifest).unwrap();
    fs::write(&manifest, &good[..good.len() / 2]).unwrap();
    let o = mount(&ds);
    assert!(
        stderr(&o).contains("manifest.json: not a valid shufflefs manifest"),
        "{}",
        stderr(&o)
    );
    // No manifest (e.g. a pack that crashed before its last step).
    fs::remove_file(&manifest).unwrap();
    let o = mount(&ds);
    assert!(stderr(&o).contains("no manifest"), "{}", stderr(&o));
    fs::write(&manifest, &good).unwrap();
    // Bad plan and bad mount point.
    let o = shufflefs(&[
        "mount",
        s(&ds),
        s(mnt.path()),
        "--window",
        "0",
        "--batch-size",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("invalid value '0' for '--window <WINDOW>': 0 is not in 1..="),
        "{}",
        stderr(&o)
    );
    let o = shufflefs(&[
        "mount",
        s(&ds),
        "/nonexistent/dir",
        "--window",
        "10",
        "--batch-size",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(!is_mounted(mnt.path()));
}

#[test]
fn background_daemon_mounts_serves_and_unmounts() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(5000, 4096);
    let mnt = MountDir::new();
    let o = shufflefs(&[
        "mount",
        s(&data.path()),
        s(mnt.path()),
        "--window",
        "10",
        "--batch-size",
        "2",
        "--ranks",
        "2",
        "--epochs",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let pid = daemon_pid(&o);
    let info: serde_json::Value = json(&fs::read(mnt.path().join("info.json")).unwrap());
    assert_eq!(info["epochs"], 3);
    assert!(fs::read(mnt.path().join("epoch/2/rank/1/step/0.npy")).is_ok());
    // A second mount on a live shufflefs mount is refused.
    let o2 = shufflefs(&[
        "mount",
        s(&data.path()),
        s(mnt.path()),
        "--window",
        "10",
        "--batch-size",
        "2",
    ]);
    assert_eq!(o2.status.code(), Some(1));
    assert!(
        stderr(&o2).contains("already a live shufflefs mount"),
        "{}",
        stderr(&o2)
    );
    unmount_and_wait(mnt.path(), pid);
}

#[test]
fn sigterm_and_sigint_unmount_cleanly() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(5000, 4096);
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGTERM, libc::SIGINT] {
        let mnt = MountDir::new();
        let mut child = command(&[
            "mount",
            s(&data.path()),
            s(mnt.path()),
            "--window",
            "10",
            "--batch-size",
            "2",
            "--foreground",
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        let deadline = Instant::now() + DAEMON_BOUND;
        while !mnt.path().join("info.json").exists() {
            assert!(Instant::now() < deadline, "mount did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Keep a file open: the unmount must still leave nothing behind.
        let open = fs::File::open(mnt.path().join("info.json")).unwrap();
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(child.id() as i32, signal) };
        let status = wait_bounded(
            &mut child,
            DAEMON_BOUND,
            &format!("the daemon after signal {signal}"),
        );
        assert_eq!(status.code(), Some(0), "signal {signal}");
        assert!(!is_mounted(mnt.path()), "signal {signal} left a mount");
        drop(open);
    }
}

#[test]
fn stale_mount_of_a_killed_daemon_is_cleared() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(5000, 4096);
    let mnt = MountDir::new();
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
    let o = shufflefs(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let before = fs::read(mnt.path().join("epoch/0/rank/0/step/7.npy")).unwrap();
    let pid = daemon_pid(&o);
    // SAFETY: killing the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(wait_gone(pid));
    let e = fs::File::open(mnt.path().join("info.json")).unwrap_err();
    assert!(
        matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED)),
        "a killed daemon leaves a stale mount: {e:?}"
    );
    let o = shufflefs_ok(&args);
    assert!(
        stderr(&o).contains("stale"),
        "clearing is logged: {}",
        stderr(&o)
    );
    let after = fs::read(mnt.path().join("epoch/0/rank/0/step/7.npy")).unwrap();
    assert_eq!(before, after);
    unmount_and_wait(mnt.path(), daemon_pid(&o));
}

#[test]
fn npy_is_recognised_by_content_not_name() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokens_u2_1d.npy");
    let disguised = dir.path().join("tokens.bin");
    fs::copy(&fixture, &disguised).unwrap();
    let ds = dir.path().join("ds");
    let o = shufflefs(&["pack", s(&ds), s(&disguised), "--dtype", "u16"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let payload = &fs::read(&fixture).unwrap()[128..];
    assert_eq!(
        fs::read(&shard_paths(&ds)[0]).unwrap(),
        payload,
        "header not packed as tokens"
    );
    // A headerless .npy (as Dolma writes OLMo's token files) is raw tokens: --dtype says
    // their type.
    let raw = dir.path().join("part-0-00000.NPY");
    fs::write(&raw, [7u8; 64]).unwrap();
    let o = shufflefs(&["pack", s(&dir.path().join("ds2")), s(&raw)]);
    assert!(
        stderr(&o).contains("headerless .npy") && stderr(&o).contains("--dtype"),
        "{}",
        stderr(&o)
    );
    shufflefs_ok(&[
        "pack",
        s(&dir.path().join("ds2")),
        s(&raw),
        "--dtype",
        "u16",
    ]);
}

/// Runs `f` with a 1 MiB tmpfs mounted at a temp dir; skips where mounting needs privileges
/// this process lacks.
fn with_small_tmpfs(f: impl FnOnce(&Path)) {
    let dir = tempfile::tempdir().unwrap();
    let ok = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            "size=1m",
            "shufflefs-test",
            s(dir.path()),
        ])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|st| st.success());
    if !ok {
        eprintln!("skipped: cannot mount a tmpfs (needs root)");
        return;
    }
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(dir.path())));
    let _ = Command::new("umount").arg(dir.path()).status();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn failed_pack_cleans_up_and_force_replaces_atomically() {
    let inputs = tempfile::tempdir().unwrap();
    let small = inputs.path().join("small.bin");
    let big = inputs.path().join("big.bin");
    shufflefs::pack::write_positional(&small, shufflefs::dtype::ScalarType::U32, 50_000).unwrap();
    shufflefs::pack::write_positional(&big, shufflefs::dtype::ScalarType::U32, 400_000).unwrap();
    with_small_tmpfs(|fsdir| {
        let ds = fsdir.join("ds");
        // 200 KB fits in 1 MiB; 1.6 MB does not: the disk fills in the middle of the pack.
        let o = shufflefs(&[
            "pack",
            s(&ds),
            s(&small),
            "--dtype",
            "u32",
            "--shard-size",
            "64KiB",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let before = fs::read(ds.join("manifest.json")).unwrap();
        let mut names: Vec<_> = fs::read_dir(&ds)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        let o = shufflefs(&[
            "pack",
            s(&ds),
            s(&big),
            "--dtype",
            "u32",
            "--shard-size",
            "64KiB",
            "--force",
        ]);
        assert_eq!(o.status.code(), Some(1));
        assert!(stderr(&o).contains("No space left"), "{}", stderr(&o));
        let mut after: Vec<_> = fs::read_dir(&ds)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        after.sort();
        assert_eq!(after, names, "the failed pack removed everything it wrote");
        assert_eq!(fs::read(ds.join("manifest.json")).unwrap(), before);
        let o = shufflefs(&["inspect", s(&ds)]);
        assert!(
            o.status.success(),
            "the old dataset is intact: {}",
            stderr(&o)
        );
        // A successful --force switches to the new dataset and deletes the old shards.
        let o = shufflefs(&[
            "pack",
            s(&ds),
            s(&small),
            s(&small),
            "--dtype",
            "u32",
            "--force",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let shards = shard_paths(&ds);
        // Each shard has its checksum file.
        assert_eq!(fs::read_dir(&ds).unwrap().count(), 2 * shards.len() + 1);
    });
}

#[test]
fn symlinked_mount_point_is_resolved() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(5000, 4096);
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    fs::create_dir(&real).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let ds = data.path();
    let args = [
        "mount",
        s(&ds),
        s(&link),
        "--window",
        "10",
        "--batch-size",
        "2",
    ];
    let o = shufflefs(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let pid = daemon_pid(&o);
    assert!(is_mounted(&real));
    let o2 = shufflefs(&args);
    assert!(
        stderr(&o2).contains("already a live shufflefs mount"),
        "{}",
        stderr(&o2)
    );
    unmount_and_wait(&link, pid);
    assert!(!is_mounted(&real));
}

#[test]
fn an_old_daemon_never_touches_a_newer_mount_at_the_same_path() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(5000, 4096);
    let mnt = MountDir::new();
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
    let first = shufflefs(&args);
    assert!(first.status.success(), "{}", stderr(&first));
    let old = daemon_pid(&first);
    assert!(shufflefs(&["unmount", s(mnt.path())]).status.success());
    // Mount again at once, while the old daemon may still be shutting down.
    let second = shufflefs(&args);
    assert!(second.status.success(), "{}", stderr(&second));
    let new = daemon_pid(&second);
    assert!(wait_gone(old), "the old daemon exits");
    assert!(
        is_mounted(mnt.path()),
        "the new mount survives the old daemon's exit"
    );
    assert!(fs::read(mnt.path().join("epoch/0/rank/0/step/3.npy")).is_ok());
    unmount_and_wait(mnt.path(), new);
}

#[test]
fn mount_point_errors_say_what_to_do() {
    let data = Data::positional(5000, 4096);
    let ds = data.path();
    let o = shufflefs(&["mount", s(&ds), "/", "--window", "10", "--batch-size", "2"]);
    assert!(
        stderr(&o).contains("refusing to mount over /"),
        "{}",
        stderr(&o)
    );
    let o = shufflefs(&[
        "mount",
        s(&ds),
        "/nonexistent-parent/dir",
        "--window",
        "10",
        "--batch-size",
        "2",
    ]);
    assert!(stderr(&o).contains("mkdir -p"), "{}", stderr(&o));
    let o = shufflefs(&[
        "mount",
        s(&ds),
        "/tmp",
        "--window",
        "10",
        "--batch-size",
        "2",
        "--threads",
        "100000",
    ]);
    assert!(
        stderr(&o).contains("100000 is not in 1..=256"),
        "{}",
        stderr(&o)
    );
    let file = data.dir.path().join("file");
    fs::write(&file, b"x").unwrap();
    let o = shufflefs(&["pack", s(&file), s(&file), "--dtype", "u8"]);
    assert!(
        stderr(&o).contains("DATASET_DIR exists and is not a directory"),
        "{}",
        stderr(&o)
    );
}

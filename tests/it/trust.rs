//! Trust (issue #10): what a dataset directory can make a mount serve. The manifest is opened
//! like a shard (no FIFO, device or symbolic link), checksum files are bound to their shards,
//! in-place shards are identified by their content (so copies, moves and archives of the
//! dataset directory keep their fingerprint), and a mount never serves bytes the dataset's
//! owner could not read (tested with a real second user).

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// Runs the binary like [`shufflefs`], but fails instead of hanging: a generous watchdog (60 s
/// for commands that fail in milliseconds), not a timing assert. The address space is capped
/// at 4 GiB, so a command that reads an endless file fails instead of exhausting the node.
fn shufflefs_watched(args: &[&str]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
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
    let data = Positional::new(1000, 1024);
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
    let data = Positional::new(330_000, 64 << 10);
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
    let manifest: serde_json::Value =
        serde_json::from_slice(&fs::read(ds.join("manifest.json")).unwrap()).unwrap();
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
    let unmount = shufflefs(&["unmount", s(mnt.path())]);
    assert!(unmount.status.success(), "{}", stderr(&unmount));
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

//! Trust (issue #10): what a dataset directory can make a mount serve. The manifest is opened
//! like a shard (no FIFO, device or symbolic link), checksum files are bound to their shards,
//! in-place shards are identified by their content (so copies, moves and archives of the
//! dataset directory keep their fingerprint), and a mount never serves bytes the dataset's
//! owner could not read (tested with a real second user).

use std::fs;
use std::os::unix::process::CommandExt;
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

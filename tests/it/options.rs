//! Mount flags through the `shufflefs` binary: the fingerprint guard (--expect-fingerprint),
//! ownership and permission bits (--uid, --gid, --file-mode, --dir-mode), mounting over a live
//! mount (--on-top), the read deadline (--read-timeout), prefetch workers and the listing bound
//! (--max-listing). Every mount is
//! unmounted by the test, and a guard detaches whatever a failing test leaves behind.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};

use crate::common::*;

/// A small positional dataset and the plan flags every test mounts it with.
struct Setup {
    data: Data,
    mnt: MountDir,
}

const PLAN: [&str; 6] = ["--window", "10", "--batch-size", "2", "--ranks", "2"];

impl Setup {
    fn new() -> Setup {
        Setup {
            data: Data::positional(5000, 4096),
            mnt: MountDir::new(),
        }
    }

    /// `shufflefs mount DATASET MNT <plan> <extra>` in the background.
    fn mount(&self, extra: &[&str]) -> Output {
        let ds = self.data.path();
        let mut args = vec!["mount", s(&ds), s(self.mnt.path())];
        args.extend(PLAN);
        args.extend(extra);
        shufflefs(&args)
    }

    /// Mounts (must succeed) and returns the daemon's pid.
    fn mount_ok(&self, extra: &[&str]) -> i32 {
        let o = self.mount(extra);
        assert!(o.status.success(), "mount {extra:?}: {}", stderr(&o));
        daemon_pid(&o)
    }

    /// A refused mount: exit code 1, the message contains `want`, nothing is mounted.
    fn refused(&self, extra: &[&str], want: &str) -> String {
        let before = mount_entries(self.mnt.path());
        let o = self.mount(extra);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "mount {extra:?}: {err}");
        assert!(
            err.contains(want),
            "mount {extra:?}: {err:?} lacks {want:?}"
        );
        assert_eq!(
            mount_entries(self.mnt.path()),
            before,
            "a refused mount {extra:?} mounts nothing"
        );
        err
    }

    fn unmount(&self, pid: i32) {
        unmount_and_wait(self.mnt.path(), pid);
    }

    fn info(&self) -> serde_json::Value {
        json(&fs::read(self.mnt.path().join("info.json")).unwrap())
    }

    /// The fingerprint `shufflefs plan` prints for this dataset and plan (with `extra` flags).
    fn planned_fingerprint(&self, extra: &[&str]) -> String {
        let ds = self.data.path();
        let mut args = vec!["plan", s(&ds)];
        args.extend(PLAN);
        args.extend(extra);
        args.extend(["--epoch", "0", "--rank", "0", "--step", "0"]);
        let o = shufflefs(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        json["fingerprint"].as_str().unwrap().to_string()
    }
}

#[test]
fn expect_fingerprint_guards_the_resumed_order() {
    if !fuse_available() {
        return;
    }
    let t = Setup::new();
    let right = t.planned_fingerprint(&["--seed", "7"]);
    assert_eq!(right.len(), 16, "{right}");
    // The right fingerprint mounts (any case), and the mount serves exactly it.
    for given in [right.clone(), right.to_uppercase()] {
        let o = t.mount(&["--seed", "7", "--expect-fingerprint", &given]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            stdout(&o).contains(&format!("fingerprint {right}")),
            "{}",
            stdout(&o)
        );
        assert_eq!(t.info()["fingerprint"], right.as_str());
        t.unmount(daemon_pid(&o));
        assert_eq!(mount_entries(t.mnt.path()), 0);
    }
    // A wrong one (here: the fingerprint of another seed) is refused before anything is
    // mounted, and the message names both.
    let other = t.planned_fingerprint(&["--seed", "8"]);
    assert_ne!(other, right);
    let err = t.refused(
        &["--seed", "7", "--expect-fingerprint", &other],
        "does not match",
    );
    assert!(err.contains(&other) && err.contains(&right), "{err}");
    t.refused(
        &["--seed", "7", "--expect-fingerprint", "0123456789abcdef"],
        &right,
    );
    // In the foreground too: it exits at once instead of serving.
    let ds = t.data.path();
    let mut args = vec!["mount", s(&ds), s(t.mnt.path())];
    args.extend(PLAN);
    args.extend(["--seed", "7", "--expect-fingerprint", &other, "-f"]);
    let mut child = command(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_bounded(
        &mut child,
        DAEMON_BOUND,
        "a foreground mount with a wrong fingerprint",
    );
    assert_eq!(status.code(), Some(1));
    assert_eq!(mount_entries(t.mnt.path()), 0);
}

#[test]
fn the_remedy_named_by_a_fingerprint_mismatch_exists() {
    let t = Setup::new();
    let err = t.refused(
        &["--expect-fingerprint", "0123456789abcdef"],
        "does not match",
    );
    assert!(
        err.contains("shufflefs plan DATASET_DIR ... --info"),
        "{err}"
    );
    let ds = t.data.path();
    let mut args = vec!["plan", s(&ds)];
    args.extend(PLAN);
    args.push("--info");
    let o = shufflefs(&args);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn owner_and_modes_are_what_the_flags_say() {
    if !fuse_available() {
        return;
    }
    let t = Setup::new();
    let root_user = nix::unistd::geteuid().is_root();
    let mut flags = vec!["--file-mode", "0440", "--dir-mode", "0o550"];
    if root_user {
        flags.extend(["--uid", "1234", "--gid", "1234"]);
    }
    let pid = t.mount_ok(&flags);
    let (uid, gid) = if root_user {
        (1234, 1234)
    } else {
        (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        )
    };
    let mnt = t.mnt.path();
    for (rel, mode) in [
        ("", 0o550),
        ("epoch", 0o550),
        ("epoch/0/rank/1/step", 0o550),
        ("observation", 0o550),
        ("info.json", 0o440),
        ("stats.json", 0o440),
        ("epoch/0/rank/1/step/3.npy", 0o440),
        ("epoch/0/rank/1/step/3.json", 0o440),
        ("observation/5.npy", 0o440),
    ] {
        let m = fs::metadata(mnt.join(rel)).unwrap();
        assert_eq!(m.mode() & 0o7777, mode, "{rel:?}: mode {:o}", m.mode());
        assert_eq!((m.uid(), m.gid()), (uid, gid), "{rel:?}");
    }
    // Still readable by the mounting user.
    assert!(fs::read(mnt.join("epoch/0/rank/1/step/3.npy")).is_ok());
    t.unmount(pid);
    if root_user {
        // The kernel enforces the bits (default_permissions) for other users (allow_other).
        let pid = t.mount_ok(&[
            "--allow-other",
            "--file-mode",
            "0440",
            "--dir-mode",
            "0550",
            "--uid",
            "1234",
            "--gid",
            "1234",
        ]);
        let info = mnt.join("info.json");
        let cat_as = |uid: u32, gid: u32| {
            Command::new("cat")
                .arg(&info)
                .uid(uid)
                .gid(gid)
                .stdin(Stdio::null())
                .output()
                .unwrap()
        };
        for (uid, gid, allowed) in [(1234, 1234, true), (4321, 1234, true), (4321, 4321, false)] {
            let o = cat_as(uid, gid);
            assert_eq!(
                o.status.success(),
                allowed,
                "uid {uid} gid {gid}: {}",
                stderr(&o)
            );
            if allowed {
                assert_eq!(o.stdout, fs::read(&info).unwrap());
            } else {
                assert!(stderr(&o).contains("Permission denied"), "{}", stderr(&o));
            }
        }
        t.unmount(pid);
    }
    // Without the flags: the mounting user, 0444 and 0555.
    let pid = t.mount_ok(&[]);
    let (dir, file) = (
        fs::metadata(mnt).unwrap(),
        fs::metadata(mnt.join("info.json")).unwrap(),
    );
    assert_eq!((dir.mode() & 0o7777, file.mode() & 0o7777), (0o555, 0o444));
    let me = (
        nix::unistd::getuid().as_raw(),
        nix::unistd::getgid().as_raw(),
    );
    assert_eq!((file.uid(), file.gid()), me);
    t.unmount(pid);
    // Write bits are refused with the mode to use instead; bad octal is refused.
    t.refused(&["--file-mode", "0644"], "drop the write bits (e.g. 0444)");
    t.refused(&["--dir-mode", "0775"], "drop the write bits (e.g. 0555)");
    t.refused(
        &["--file-mode", "0002"],
        "--file-mode 0002: shufflefs is read-only",
    );
    for bad in ["0999", "abc", "0x1ff", "77777", ""] {
        t.refused(&["--file-mode", bad], "expected octal bits");
        t.refused(&["--dir-mode", bad], "expected octal bits");
    }
    // Not numbers at all: the argument parser refuses (exit 2).
    for (flag, bad) in [("--uid", "abc"), ("--gid", "-1")] {
        let o = t.mount(&[flag, bad]);
        assert_eq!(o.status.code(), Some(2), "{flag} {bad}: {}", stderr(&o));
    }
    assert_eq!(mount_entries(mnt), 0);
}

#[test]
fn on_top_mounts_over_a_live_mount_only_when_asked() {
    if !fuse_available() {
        return;
    }
    let t = Setup::new();
    let (fp1, fp2) = (
        t.planned_fingerprint(&["--seed", "1"]),
        t.planned_fingerprint(&["--seed", "2"]),
    );
    let lower = t.mount_ok(&["--seed", "1"]);
    assert_eq!(t.info()["fingerprint"], fp1.as_str());
    let err = t.refused(&["--seed", "2"], "--on-top");
    assert!(err.contains("already a live shufflefs mount"), "{err}");
    assert_eq!(
        t.info()["fingerprint"],
        fp1.as_str(),
        "the refused mount changed nothing"
    );
    // With --on-top the new mount serves, stacked over the old one.
    let upper = t.mount_ok(&["--seed", "2", "--on-top"]);
    assert_eq!(mount_entries(t.mnt.path()), 2);
    assert_eq!(t.info()["fingerprint"], fp2.as_str());
    let step = t.mnt.path().join("epoch/0/rank/1/step/4.npy");
    let upper_bytes = fs::read(&step).unwrap();
    assert!(alive(lower), "the covered daemon keeps running");
    // Unmounting the top reveals the old mount, still serving.
    t.unmount(upper);
    assert_eq!(mount_entries(t.mnt.path()), 1);
    assert_eq!(t.info()["fingerprint"], fp1.as_str());
    let lower_bytes = fs::read(&step).unwrap();
    assert_ne!(
        lower_bytes, upper_bytes,
        "different seeds, different batches"
    );
    // The top mount's daemon ended on its own and did not take the old mount with it.
    assert!(alive(lower));
    t.unmount(lower);
    assert_eq!(mount_entries(t.mnt.path()), 0);
}

#[test]
fn sigterm_to_the_upper_daemon_unmounts_only_its_own_mount() {
    if !fuse_available() {
        return;
    }
    let t = Setup::new();
    let fp1 = t.planned_fingerprint(&["--seed", "1"]);
    let lower = t.mount_ok(&["--seed", "1"]);
    let upper = t.mount_ok(&["--seed", "2", "--on-top"]);
    assert_eq!(mount_entries(t.mnt.path()), 2);
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(upper, libc::SIGTERM) };
    assert!(wait_gone(upper));
    assert_eq!(mount_entries(t.mnt.path()), 1);
    assert_eq!(t.info()["fingerprint"], fp1.as_str());
    assert!(alive(lower));
    t.unmount(lower);
    assert_eq!(mount_entries(t.mnt.path()), 0);
}

/// SIGTERM to a daemon whose mount is covered by an `--on-top` mount: it cannot unmount
/// without taking the newer mount down (that one sits on its root), so it keeps serving until
/// the newer one is unmounted, then unmounts and exits. No mount-table entry is left behind.
#[test]
fn sigterm_to_a_covered_daemon_leaves_no_mount_behind() {
    if !fuse_available() {
        return;
    }
    let t = Setup::new();
    let fp2 = t.planned_fingerprint(&["--seed", "2"]);
    let lower = t.mount_ok(&["--seed", "1"]);
    let upper = t.mount_ok(&["--seed", "2", "--on-top"]);
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(lower, libc::SIGTERM) };
    assert_eq!(
        t.info()["fingerprint"],
        fp2.as_str(),
        "the top mount still serves"
    );
    t.unmount(upper);
    // Uncovered, the signalled daemon unmounts its own mount and exits.
    assert!(wait_gone(lower));
    // Section 10: a signal never leaves a mount-table entry behind.
    let left = mount_entries(t.mnt.path());
    let probe = fs::read(t.mnt.path().join("info.json")).map(|b| b.len());
    assert_eq!(left, 0, "left behind: {probe:?}");
}

#[test]
fn read_timeout_values() {
    if !fuse_available() {
        return;
    }
    let t = Setup::new();
    for bad in ["-1", "abc", "nan", "inf", "1e10", ""] {
        t.refused(
            &[&format!("--read-timeout={bad}")],
            "expected a number of seconds",
        );
    }
    // As a separate argument, "-1" looks like a flag to the argument parser (exit 2).
    let o = t.mount(&["--read-timeout", "-1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(mount_entries(t.mnt.path()), 0);
    let reference = t.data.fs(&config(10, 10, 2, 2, 0, 1));
    let want = reference
        .view()
        .render_step_npy(shufflefs::plan::StepKey {
            epoch: 0,
            rank: 1,
            step: 9,
        })
        .unwrap();
    // 0 disables the deadline; decimals are accepted. Both serve exact bytes.
    for ok in ["0", "0.5", "30"] {
        let pid = t.mount_ok(&["--read-timeout", ok]);
        assert_eq!(
            fs::read(t.mnt.path().join("epoch/0/rank/1/step/9.npy")).unwrap(),
            want,
            "--read-timeout {ok}"
        );
        t.unmount(pid);
    }
    assert_eq!(mount_entries(t.mnt.path()), 0);
}

#[test]
fn prefetch_workers_zero_needs_prefetch_off() {
    if !fuse_available() {
        return;
    }
    let t = Setup::new();
    t.refused(
        &["--prefetch-workers", "0"],
        "--prefetch-workers 0 would queue prefetches that never run: use --prefetch-depth 0",
    );
    let o = t.mount(&["--prefetch-workers", "1000"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1000 is not in 0..=256"),
        "{}",
        stderr(&o)
    );
    let pid = t.mount_ok(&["--prefetch-workers", "0", "--prefetch-depth", "0"]);
    let before = stats(t.mnt.path());
    assert_eq!(before["cache_enabled"], true, "{before}");
    for step in 0..5 {
        assert!(fs::read(t.mnt.path().join(format!("epoch/0/rank/0/step/{step}.npy"))).is_ok());
    }
    let after = stats(t.mnt.path());
    assert_eq!(after["cache"]["prefetched"], 0, "{after}");
    t.unmount(pid);
    assert_eq!(mount_entries(t.mnt.path()), 0);
}

#[test]
fn max_listing_bounds_every_listing_and_zero_lists_all() {
    if !fuse_available() {
        return;
    }
    // 500 observations of 10 tokens, 125 steps per rank: 250 names in a step directory,
    // 1,000 in observation/, 500 in lookup/epoch/0/observation/.
    let t = Setup::new();
    let names = |dir: &str| -> Vec<String> {
        fs::read_dir(t.mnt.path().join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    for (flag, shown) in [("7", 7usize), ("250", 250), ("0", usize::MAX)] {
        let pid = t.mount_ok(&["--max-listing", flag]);
        for (dir, all, first) in [
            ("epoch/0/rank/1/step", 250, "0.npy"),
            ("observation", 1000, "0.npy"),
            ("lookup/epoch/0/observation", 500, "0.json"),
        ] {
            let listed = names(dir);
            assert_eq!(listed.len(), all.min(shown), "--max-listing {flag}: {dir}");
            assert_eq!(listed[0], first);
        }
        // Names past the bound are there all the same.
        for path in [
            "epoch/0/rank/1/step/124.npy",
            "epoch/0/rank/1/step/124.json",
            "observation/499.json",
            "lookup/epoch/0/observation/499.json",
        ] {
            assert!(fs::read(t.mnt.path().join(path)).is_ok(), "{path}");
        }
        let info = t.info();
        assert_eq!(info["max_listing"].to_string(), flag);
        let truncated: Vec<&str> = info["truncated_listings"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["dir"].as_str().unwrap())
            .collect();
        let want: &[&str] = match flag {
            "7" => &[
                "epoch/E/rank/R/step",
                "observation",
                "lookup/epoch/E/observation",
            ],
            "250" => &["observation", "lookup/epoch/E/observation"],
            _ => &[],
        };
        assert_eq!(truncated, want, "--max-listing {flag}");
        t.unmount(pid);
    }
}

//! Node operations (deploy/): the mount(8) helper `mount.fuse.shufflefs`, run directly as
//! mount(8) would run it (never installed into /sbin), and the systemd unit files.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use shufflefs::dtype::ScalarType;

use crate::common::*;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Runs the helper with `SHUFFLEFS` pointing at the binary under test.
fn helper(args: &[&str]) -> Output {
    Command::new(repo("deploy/mount.fuse.shufflefs"))
        .args(args)
        .env("SHUFFLEFS", BIN)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The command the helper prints with -v, without its `mount.fuse.shufflefs: BIN` prefix.
fn printed_command(o: &Output) -> String {
    let err = stderr(o);
    assert!(o.status.success(), "{err}");
    let line = err.trim_end();
    let prefix = format!("mount.fuse.shufflefs: {} ", sh_quote(BIN));
    assert!(line.starts_with(&prefix), "{err}");
    line[prefix.len()..].to_string()
}

/// `word` as the helper prints it: as is, or in single quotes when it holds other characters
/// than `A-Za-z0-9_./=:,+@%-`.
fn sh_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_./=:,+@%-".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

#[test]
fn helper_translates_options_and_drops_generic_ones() {
    // -f (fake) runs nothing; -v prints the command it would run.
    let o = helper(&[
        "/data/ds",
        "/mnt/train",
        "-f",
        "-v",
        "-o",
        "ro,window=2049,stride=2048,batch_size=8,ranks=64,seed=1234,epochs=4,pad-id=-1,\
         allow_other,log_file=/var/log/s.log,cache-size=1GiB",
    ]);
    assert_eq!(
        printed_command(&o),
        "mount /data/ds /mnt/train --window=2049 --stride=2048 --batch-size=8 --ranks=64 \
         --seed=1234 --epochs=4 --pad-id=-1 --allow-other --log-file=/var/log/s.log \
         --cache-size=1GiB"
    );
    assert!(o.stdout.is_empty());
    // Every generic mount(8) option is dropped, wherever it stands; several -o are joined;
    // flags may be combined; -t, -s and -n change nothing.
    let generic = "defaults,ro,rw,default_permissions,auto,noauto,user,user=bob,users,nouser,nousers,owner,noowner,\
                   group,nogroup,nofail,_netdev,dev,nodev,suid,nosuid,exec,noexec,sync,async,\
                   dirsync,atime,noatime,diratime,nodiratime,relatime,norelatime,strictatime,\
                   nostrictatime,lazytime,nolazytime,iversion,noiversion,mand,nomand,silent,\
                   loud,comment=fstab,x-systemd.automount,x-systemd.requires-mounts-for=/data,\
                   X-mount.mkdir,helper=x,uhelper=y,,";
    let o = helper(&[
        "/data/ds",
        "/mnt/train",
        "-sfnv",
        "-o",
        generic,
        "-t",
        "fuse.shufflefs",
        "-owindow=9",
        "-o",
        "batch_size=2,seed=3",
    ]);
    assert_eq!(
        printed_command(&o),
        "mount /data/ds /mnt/train --window=9 --batch-size=2 --seed=3"
    );
    // Quoted values keep their commas; values with spaces or quotes are printed quoted.
    let o = helper(&[
        "/data/my ds",
        "/mnt/x",
        "-f",
        "-v",
        "-o",
        "ro,log_file=\"/var/log/a,b c.log\",seed=it's",
    ]);
    assert_eq!(
        printed_command(&o),
        "mount '/data/my ds' /mnt/x '--log-file=/var/log/a,b c.log' '--seed=it'\\''s'"
    );
    // mount -N: the mount runs in that mount namespace.
    let o = helper(&["a", "b", "-fv", "-N", "/proc/1/ns/mnt", "-o", "ro"]);
    let err = stderr(&o);
    if o.status.success() {
        assert!(err.contains("nsenter --mount=/proc/1/ns/mnt -- "), "{err}");
    } else {
        assert!(err.contains("-N /proc/1/ns/mnt needs nsenter(1)"), "{err}");
    }
}

#[test]
fn helper_refuses_what_mount_cannot_do() {
    let cases: &[(&[&str], &str)] = &[
        (&["-o", "ro,remount"], "cannot be remounted"),
        (
            &["-o", "ro,foreground"],
            "run `shufflefs mount -f` directly",
        ),
        (
            &["-o", "ro,--window=3"],
            "invalid mount option \"--window=3\"",
        ),
        (
            &["-o", "ro,win dow=3"],
            "invalid mount option \"win dow=3\"",
        ),
        (&["-o", "ro,seed=\"1"], "unbalanced double quote"),
        (&["-o"], "-o needs an argument"),
        (&["-x"], "unknown flag -x"),
    ];
    for (args, want) in cases {
        for fake in [false, true] {
            let mut full = vec!["/nonexistent/ds", "/nonexistent/mnt"];
            if fake {
                full.push("-f");
            }
            full.extend_from_slice(args);
            let o = helper(&full);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
            assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
            assert!(
                !stderr(&o).contains(BIN),
                "{args:?}: refused before running shufflefs"
            );
        }
    }
    let o = helper(&["/data/ds", "-o", "ro"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("expected DATASET_DIR and MOUNTPOINT, got 1"),
        "{}",
        stderr(&o)
    );
    let o = helper(&["--help"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("usage: mount.fuse.shufflefs"));
}

#[test]
fn helper_passes_on_shufflefs_errors_and_exit_codes() {
    let data = Data::positional(5000, 4096);
    let mnt = MountDir::new();
    let ds = data.path();
    let run = |opts: &str| helper(&[s(&ds), s(mnt.path()), "-o", opts]);
    // An unknown option: shufflefs's usage error and its exit code 2.
    let o = run("ro,window=10,batch_size=2,frobnicate=3");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("unexpected argument '--frobnicate'"),
        "{}",
        stderr(&o)
    );
    // A required plan option missing.
    let o = run("ro,window=10");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--batch-size"), "{}", stderr(&o));
    // A value flag given without a value, a bare flag given a value.
    let o = run("ro,window,batch_size=2");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = run("ro,window=10,batch_size=2,allow_other=yes");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    // A value out of the flag's range: clap's error (naming the range) and exit code 2.
    let o = run("ro,window=0,batch_size=2");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("0 is not in 1..="), "{}", stderr(&o));
    // A value this dataset cannot serve: shufflefs's own error and exit code 1.
    let o = run("ro,window=6000,batch_size=2");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("nothing to serve"), "{}", stderr(&o));
    assert!(!is_mounted(mnt.path()));
}

#[test]
fn helper_finds_shufflefs_through_path_or_says_why_not() {
    let bin_dir = tempfile::tempdir().unwrap();
    let link = bin_dir.path().join("shufflefs");
    std::os::unix::fs::symlink(BIN, &link).unwrap();
    let run = |path: &Path, shufflefs_env: Option<&str>| {
        let mut cmd = Command::new(repo("deploy/mount.fuse.shufflefs"));
        // mount(8) runs helpers with a cleaned environment.
        cmd.env_clear()
            .env("PATH", path)
            .args(["/data/ds", "/mnt/x", "-fv", "-o", "ro,window=3"]);
        if let Some(v) = shufflefs_env {
            cmd.env("SHUFFLEFS", v);
        }
        cmd.output().unwrap()
    };
    let o = run(bin_dir.path(), None);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!(
            "{} mount /data/ds /mnt/x --window=3",
            sh_quote(s(&link))
        )),
        "{}",
        stderr(&o)
    );
    let empty = tempfile::tempdir().unwrap();
    let o = run(empty.path(), None);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("cannot find shufflefs on PATH") && stderr(&o).contains("SHUFFLEFS"),
        "{}",
        stderr(&o)
    );
    let o = run(empty.path(), Some("/nonexistent/shufflefs"));
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("SHUFFLEFS=/nonexistent/shufflefs is not an executable file"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn helper_mounts_the_same_tree_as_shufflefs_mount() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(5000, 4096);
    let ds = data.path();
    let by_helper = MountDir::new();
    let by_cli = MountDir::new();
    let o = helper(&[
        s(&ds),
        s(by_helper.path()),
        "-o",
        "ro,defaults,nosuid,nodev,noatime,nofail,_netdev,x-systemd.automount,comment=ops,\
         window=10,stride=7,batch-size=2,ranks=2,seed=5,epochs=2,threads=2,cache_size=0",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("mounted"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let plan = [
        "--window",
        "10",
        "--stride",
        "7",
        "--batch-size",
        "2",
        "--ranks",
        "2",
        "--seed",
        "5",
        "--epochs",
        "2",
    ];
    let mut args = vec!["mount", s(&ds), s(by_cli.path()), "--threads", "2"];
    args.extend_from_slice(&plan);
    let o = shufflefs(&args);
    assert!(o.status.success(), "{}", stderr(&o));

    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = mountinfo
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(s(by_helper.path())))
        .expect("the helper's mount is in the mount table");
    let source = format!("shufflefs:{}", ds.canonicalize().unwrap().display());
    assert!(line.contains(&source), "{line}");

    let info = |m: &MountDir| -> serde_json::Value {
        json(&fs::read(m.path().join("info.json")).unwrap())
    };
    let (a, b) = (info(&by_helper), info(&by_cli));
    assert_eq!(a["fingerprint"], b["fingerprint"]);
    assert_eq!(a, b, "same plan, same info.json");
    let header = a["npy_header_bytes"].as_u64().unwrap() as usize;
    let cfg = config(10, 7, 2, 2, 5, 2);
    for (epoch, rank, step) in [(0, 0, 0), (1, 1, 3), (1, 0, 177)] {
        let npy = fs::read(step_path(by_helper.path(), epoch, rank, step, "npy")).unwrap();
        assert_eq!(
            npy,
            fs::read(step_path(by_cli.path(), epoch, rank, step, "npy")).unwrap()
        );
        let json = fs::read(step_path(by_helper.path(), epoch, rank, step, "json")).unwrap();
        let (e, r, st) = (epoch.to_string(), rank.to_string(), step.to_string());
        let mut args = vec!["plan", s(&ds)];
        args.extend_from_slice(&plan);
        args.extend_from_slice(&["--epoch", &e, "--rank", &r, "--step", &st]);
        let planned = shufflefs(&args);
        assert!(planned.status.success(), "{}", stderr(&planned));
        assert_eq!(
            json, planned.stdout,
            "S.json is what `shufflefs plan` prints"
        );
        let rows = expected_rows(&json_observations(&json), &cfg, ScalarType::U32);
        assert_eq!(&npy[header..], &rows[..], "rows are the planned windows");
    }
    // The same dataset cannot be mounted twice at one place: shufflefs's refusal, passed on.
    let o = helper(&[
        s(&ds),
        s(by_helper.path()),
        "-o",
        "ro,window=10,batch_size=2",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("already a live shufflefs mount"),
        "{}",
        stderr(&o)
    );
}

/// `KEY=VALUE` lines of one `[Section]` of a systemd unit file.
fn unit_section(text: &str, section: &str) -> Vec<(String, String)> {
    let mut current = String::new();
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(header) = line.strip_prefix('[') {
            let name = header.strip_suffix(']');
            current = name
                .unwrap_or_else(|| panic!("bad section {line:?}"))
                .to_string();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not KEY=VALUE: {line:?}"));
        assert!(!current.is_empty(), "{line:?} outside any section");
        if current == section {
            out.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    out
}

fn unit_value(keys: &[(String, String)], key: &str) -> String {
    let values: Vec<&String> = keys
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        values.len(),
        1,
        "{key} must be set exactly once: {values:?}"
    );
    values[0].clone()
}

/// The long flags of `shufflefs mount` according to its --help (`--window`, ...).
fn mount_flags() -> BTreeSet<String> {
    let o = shufflefs(&["mount", "--help"]);
    assert!(o.status.success());
    String::from_utf8(o.stdout)
        .unwrap()
        .split_whitespace()
        .filter(|w| w.starts_with("--"))
        .map(|w| {
            w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                .to_string()
        })
        .collect()
}

#[test]
fn systemd_units_have_their_keys_and_verify() {
    let service = fs::read_to_string(repo("deploy/shufflefs@.service")).unwrap();
    let target = fs::read_to_string(repo("deploy/shufflefs.target")).unwrap();
    let unit = unit_section(&service, "Unit");
    let svc = unit_section(&service, "Service");
    let install = unit_section(&service, "Install");
    assert!(unit_value(&unit, "Description").contains("%i"));
    assert_eq!(unit_value(&unit, "Before"), "shufflefs.target");
    assert_eq!(unit_value(&svc, "Type"), "forking");
    assert_eq!(
        unit_value(&svc, "EnvironmentFile"),
        "/etc/shufflefs/%i.conf"
    );
    assert_eq!(
        unit_value(&svc, "ExecStart"),
        "/usr/local/bin/shufflefs mount ${DATASET} ${MOUNTPOINT} $OPTIONS"
    );
    assert_eq!(
        unit_value(&svc, "ExecStop"),
        "-/usr/local/bin/shufflefs unmount ${MOUNTPOINT}"
    );
    assert_eq!(unit_value(&svc, "Restart"), "on-failure");
    assert_eq!(unit_value(&install, "WantedBy"), "shufflefs.target");
    assert_eq!(
        unit_value(&unit_section(&target, "Install"), "WantedBy"),
        "multi-user.target"
    );
    let namespaced = [
        "PrivateTmp",
        "PrivateMounts",
        "ProtectSystem",
        "ProtectHome",
        "ReadOnlyPaths",
        "TemporaryFileSystem",
    ];
    for (k, _) in &svc {
        assert!(
            !namespaced.contains(&k.as_str()),
            "{k} would hide the mount in a private namespace"
        );
    }

    // The example configuration defines what the unit uses, with real `shufflefs mount` flags.
    let conf = fs::read_to_string(repo("deploy/shufflefs.conf.example")).unwrap();
    let vars: Vec<(&str, &str)> = conf
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| l.split_once('=').expect("KEY=VALUE"))
        .collect();
    let keys: Vec<&str> = vars.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, ["DATASET", "MOUNTPOINT", "OPTIONS"]);
    let help = mount_flags();
    for flag in vars[2].1.split_whitespace().filter(|w| w.starts_with("--")) {
        assert!(help.contains(flag), "{flag} is not a mount flag");
    }

    let Ok(version) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze is absent: checked the keys only");
        return;
    };
    assert!(version.status.success());
    // Verify an instance, with the binary under test in place of /usr/local/bin/shufflefs
    // (verify checks that the commands exist).
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("shufflefs@.service"),
        service.replace("/usr/local/bin/shufflefs", BIN),
    )
    .unwrap();
    fs::write(dir.path().join("shufflefs.target"), &target).unwrap();
    let o = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(dir.path().join("shufflefs@ops.service"))
        .arg(dir.path().join("shufflefs.target"))
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    // verify only warns (exit 0) about unknown keys and bad values: no line may name ours.
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("shufflefs")).collect();
    assert!(ours.is_empty(), "systemd-analyze verify: {ours:?}");
}

#[test]
fn fstab_example_lines_translate_to_mount_flags() {
    let fstab = fs::read_to_string(repo("deploy/fstab.example")).unwrap();
    let help = mount_flags();
    let mut lines = 0;
    for line in fstab.lines() {
        // The example lines are commented out: `#/path  /mnt  fuse.shufflefs  OPTIONS  0  0`.
        let Some(entry) = line.strip_prefix("#/") else {
            continue;
        };
        let fields: Vec<&str> = entry.split_whitespace().collect();
        assert_eq!(fields.len(), 6, "{line}");
        assert_eq!(fields[2], "fuse.shufflefs", "{line}");
        let o = helper(&["/data/ds", "/mnt/x", "-fv", "-o", fields[3]]);
        assert!(o.status.success(), "{line}: {}", stderr(&o));
        let printed = printed_command(&o);
        // fstab users write `defaults` (rw) as often as `ro`: both mean the same mount.
        let rest = fields[3]
            .split(',')
            .filter(|o| !["ro", "rw", "defaults"].contains(o))
            .collect::<Vec<_>>()
            .join(",");
        for first in ["ro", "rw", "defaults"] {
            let o = helper(&[
                "/data/ds",
                "/mnt/x",
                "-fv",
                "-o",
                &format!("{first},{rest}"),
            ]);
            assert!(o.status.success(), "{first},{rest}: {}", stderr(&o));
            assert_eq!(printed_command(&o), printed, "{first},{rest}");
        }
        for flag in printed.split(' ').skip(3) {
            let name = flag.split('=').next().unwrap();
            assert!(help.contains(name), "{name} is not a mount flag");
        }
        lines += 1;
    }
    assert!(lines >= 3);
    // The header says what the helper does with ro/rw (it used to claim rw was refused).
    let header: String = fstab.lines().filter(|l| !l.starts_with("#/")).collect();
    assert!(
        header.contains("`rw`") && !header.contains("refuse"),
        "deploy/fstab.example must say rw is accepted: {header}"
    );
}

/// The demo mounts over `mount/`: it holds nothing a mount would hide (the operations files
/// live in `deploy/`).
#[test]
fn demo_mount_point_holds_only_its_placeholder() {
    let names: Vec<String> = fs::read_dir(repo("mount"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".gitkeep")
        .collect();
    // A live demo mount hides the placeholder too: only an unmounted mount/ is checked.
    if !is_mounted(&repo("mount")) {
        assert!(names.is_empty(), "mount/ must stay empty: {names:?}");
    }
    for f in [
        "mount.fuse.shufflefs",
        "shufflefs@.service",
        "shufflefs.target",
        "fstab.example",
        "shufflefs.conf.example",
    ] {
        assert!(repo("deploy").join(f).is_file(), "deploy/{f}");
    }
}

/// The README's training loop reads each step into a buffer no earlier batch points into: the
/// buffer passed to `readinto` is created inside the step loop (a batch still in use by an
/// asynchronous copy or a prefetch thread is never overwritten by the next read).
#[test]
fn readme_training_loop_never_refills_a_buffer_in_use() {
    let readme = fs::read_to_string(repo("README.md")).unwrap();
    let block = readme
        .split("```python")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .find(|b| b.contains("readinto("))
        .expect("README has a training loop with readinto");
    let indent = |l: &str| l.len() - l.trim_start().len();
    let lines: Vec<&str> = block.lines().collect();
    let step_loop = lines
        .iter()
        .position(|l| l.trim_start().starts_with("for step in"))
        .expect("a step loop");
    let read = lines.iter().position(|l| l.contains(".readinto(")).unwrap();
    let name = lines[read].split(".readinto(").nth(1).unwrap();
    let name = name.split(')').next().unwrap().trim();
    let assigned = lines
        .iter()
        .position(|l| l.trim_start().starts_with(&format!("{name} = ")))
        .unwrap_or_else(|| panic!("{name} is assigned in the README loop"));
    assert!(
        assigned > step_loop && indent(lines[assigned]) > indent(lines[step_loop]),
        "`{}` must be created inside the step loop, not reused across steps",
        lines[assigned].trim()
    );
}

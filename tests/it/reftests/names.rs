//! Names: in every directory of one tree (7 epochs, 6 ranks: the 11 directory levels), looked
//! up under generated spellings (canonical in and out of range, leading zeros, signs,
//! whitespace, digits of other scripts, suffix variants, huge numbers, random bytes, edits of
//! canonical names, dot-like names, names up to 4,000 bytes) and under a fixed adversarial
//! list. Every answer must be the entry the listing shows under exactly that name, or ENOENT;
//! a name inside a file is ENOTDIR. Without a mount every name goes to `ShuffleFs::lookup` (`/`
//! and NUL included); through the mount, names that can be one path component go to
//! `symlink_metadata`, and a kernel with the old 1,024-byte FUSE name limit may answer longer
//! ones ENAMETOOLONG itself.

use std::cell::RefCell;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;

use super::generators::*;
use super::harness::*;
use crate::common::*;

/// The tree every name test looks names up in.
fn tree() -> (Data, shufflefs::view::ViewConfig, Reference) {
    let (data, _) = Data::random(2_000, 250, shufflefs::dtype::ScalarType::U32, 3);
    let cfg = config(10, 10, 2, 6, 3, 7);
    let reference = Reference::new(&data.path(), &cfg).unwrap();
    assert!(
        reference.steps > 5 && reference.n > 5,
        "`5` is in range at every numbered level"
    );
    (data, cfg, reference)
}

/// Names looked up in directories, and inside files.
type Lookups = (Vec<(Dir, Name)>, Vec<(File, Name)>);

/// Names in random directories and inside random files.
fn lookups() -> impl Strategy<Value = Lookups> {
    (
        prop::collection::vec((dir(), name()), 1..=64),
        prop::collection::vec((file(), name()), 0..=2),
    )
}

fn run_lookups(
    tree: &mut dyn Tree,
    checker: &mut Checker,
    (names, in_files): &Lookups,
) -> Result<(), TestCaseError> {
    for (dir, name) in names {
        let op = Op::Lookup(*dir, name.clone());
        checker
            .apply(tree, &op)
            .map_err(|why| TestCaseError::fail(format!("{op:?}: {why}")))?;
    }
    for (file, name) in in_files {
        let op = Op::LookupInFile(*file, name.clone());
        checker
            .apply(tree, &op)
            .map_err(|why| TestCaseError::fail(format!("{op:?}: {why}")))?;
    }
    Ok(())
}

#[test]
fn proptest_names_without_mount() {
    let (data, cfg, reference) = tree();
    let mut tree = Direct::new(data.fs(&cfg));
    let checker = Checker::new(reference, &mut tree).unwrap();
    let state = RefCell::new((tree, checker));
    TestRunner::new(proptest_config(10_000))
        .run(&lookups(), |case| {
            let (tree, checker) = &mut *state.borrow_mut();
            run_lookups(tree, checker, &case)
        })
        .unwrap();
    let (_, c) = state.into_inner();
    eprintln!(
        "names without a mount: {} found, {} ENOENT",
        c.found, c.missing
    );
    assert!(c.found > 0 && c.missing > 0);
}

#[test]
fn proptest_names_through_mount() {
    if !fuse_available() {
        return;
    }
    let (data, cfg, reference) = tree();
    let mut tree = Mounted::new(TestMount::new(data.fs(&cfg)));
    let checker = Checker::new(reference, &mut tree).unwrap();
    let state = RefCell::new((tree, checker));
    TestRunner::new(proptest_config(3000))
        .run(&lookups(), |case| {
            let (tree, checker) = &mut *state.borrow_mut();
            run_lookups(tree, checker, &case)
        })
        .unwrap();
    let (tree, c) = state.into_inner();
    eprintln!(
        "names through the mount: {} found, {} ENOENT ({} ENAMETOOLONG), {} not one component",
        c.found, c.missing, tree.too_long, c.skipped
    );
    assert!(c.found > 0 && c.missing > 0);
    // The daemon is alive and still serves correct bytes.
    let want = c.r.step_npy(6, 5, c.r.steps - 1);
    assert_eq!(
        std::fs::read(tree.m.step(6, 5, c.r.steps - 1, "npy")).unwrap(),
        want
    );
    assert!(
        is_mounted(tree.m.path()),
        "the mount is still in /proc/self/mountinfo"
    );
    tree.unmount();
}

/// The adversarial names every directory level gets.
fn adversarial() -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let base = [
        "+5",
        "05",
        "00",
        "5 ",
        "\u{663}",
        "0x5",
        "-0",
        "18446744073709551616",
        "5.npy.",
        "5.NPY",
        "5.npy.npy",
        "5",
        "0",
        "5.npy",
        "5.json",
        "0.npy",
        "0.json",
        " 5",
        "5\t",
        "\u{ff15}",
        "\u{0665}.npy",
        "5e0",
        "5.0",
        "0b101",
        "0o5",
        "5_",
        "1_0",
        "٥",
        "INFO.JSON",
        "info.json ",
        "Info.json",
        "info.json.",
        "info",
        "Epoch",
        "epoch ",
        "epochs",
        "rank.",
        "ranks",
        "Rank",
        "steps",
        "Step",
        "observations",
        "Observation",
        "lookup ",
        "LOOKUP",
        "stats",
        "stats.JSON",
    ];
    for b in base {
        out.push(b.as_bytes().to_vec());
        for sfx in [".npy", ".json"] {
            out.push(format!("{b}{sfx}").into_bytes());
        }
    }
    for d in DOTS {
        out.push(d.as_bytes().to_vec());
    }
    for n in HUGE {
        out.push(n.as_bytes().to_vec());
        out.push(format!("{n}.npy").into_bytes());
    }
    for long in [
        "5".repeat(4000),
        format!("{}.npy", "5".repeat(3996)),
        format!("{}5.npy", "0".repeat(3995)),
        format!("{}.json", "1".repeat(3995)),
        "a".repeat(4000),
        format!("5.npy{}", " ".repeat(3995)),
        "5".repeat(255),
        "5".repeat(256),
    ] {
        out.push(long.into_bytes());
    }
    for raw in [
        &b"\xff"[..],
        b"5\xff",
        b"\xff.npy",
        b"5\xff.npy",
        b"5.npy\xff",
        b"\xc0\xb5",
        b"\xc0\xb5.npy",
        b"\xed\xa0\x80",
        b"5\x80.json",
        b"\xfe\xff",
        b"\xc3",
        b"\xf0\x9f\x98",
        b"\xe0\x80\xb5.npy",
        b"\x01",
        b"5\x7f.npy",
        b"5\x00.npy",
        b"5/",
        b"/",
        b"",
    ] {
        out.push(raw.to_vec());
    }
    out
}

/// Every directory of the tree, and every file kind.
fn every_dir(r: &Reference) -> Vec<Entry> {
    let mut dirs = vec![
        Entry::Root,
        Entry::Epochs,
        Entry::Observations,
        Entry::Lookup,
        Entry::LookupEpochs,
    ];
    for e in 0..r.epochs {
        dirs.extend([Entry::Epoch(e), Entry::Ranks(e)]);
        dirs.extend([Entry::LookupEpoch(e), Entry::LookupObservations(e)]);
        for k in 0..r.ranks {
            dirs.extend([Entry::Rank(e, k), Entry::Steps(e, k)]);
        }
    }
    dirs
}

const FILES: [Entry; 7] = [
    Entry::Info,
    Entry::Stats,
    Entry::StepNpy(6, 5, 0),
    Entry::StepJson(0, 0, 0),
    Entry::ObservationNpy(5),
    Entry::ObservationJson(5),
    Entry::LookupJson(6, 5),
];

/// The listing of every directory, then the adversarial list in every directory and inside
/// every kind of file.
fn adversarial_names(tree: &mut dyn Tree, checker: &mut Checker) {
    let dirs = every_dir(&checker.r);
    for &dir in &dirs {
        checker.listing(tree, dir, 3, 0).unwrap();
        for name in adversarial() {
            checker.lookup(tree, dir, &Name::Literal(name)).unwrap();
        }
    }
    for file in FILES {
        for name in adversarial() {
            tree.lookup_in_file(file, &name).unwrap();
        }
    }
}

#[test]
fn regression_adversarial_names_without_mount() {
    let (data, cfg, reference) = tree();
    let mut tree = Direct::new(data.fs(&cfg));
    let mut checker = Checker::new(reference, &mut tree).unwrap();
    adversarial_names(&mut tree, &mut checker);
}

#[test]
fn regression_adversarial_names_through_mount() {
    if !fuse_available() {
        return;
    }
    let (data, cfg, reference) = tree();
    let mut tree = Mounted::new(TestMount::new(data.fs(&cfg)));
    let mut checker = Checker::new(reference, &mut tree).unwrap();
    adversarial_names(&mut tree, &mut checker);
    // `.` and `..` are the kernel's: the directory itself and its parent.
    let root = tree.m.path().to_path_buf();
    use std::os::unix::fs::MetadataExt;
    let ino = |p: &std::path::Path| std::fs::symlink_metadata(p).unwrap().ino();
    for dir in every_dir(&checker.r) {
        let path = root.join(dir.path());
        assert_eq!(ino(&path.join(".")), ino(&path));
        if dir != Entry::Root {
            assert_eq!(ino(&path.join("..")), ino(path.parent().unwrap()));
        }
    }
    tree.unmount();
}

//! Real FUSE mounts in a TempDir, read with std::fs. Each test skips (with a message) where
//! /dev/fuse cannot be opened, and every mount is unmounted by its guard.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};

use shufflefs::dtype::ScalarType;
use shufflefs::npy;

use crate::common::*;

#[test]
fn step_files_are_byte_exact_and_partition_each_epoch() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(6000, 1000);
    let cfg = config(17, 16, 4, 2, 42, 2);
    let reference = data.fs(&cfg);
    let m = TestMount::new(data.fs(&cfg));
    let plan = reference.view().plan().clone();
    let header = npy::header("'<u4'", &[4, 17]).unwrap();
    for epoch in 0..2 {
        let mut all = Vec::new();
        for step in 0..plan.steps_per_epoch() {
            for rank in 0..2 {
                let json = fs::read(m.step(epoch, rank, step, "json")).unwrap();
                let obs = json_observations(&json);
                let npy = fs::read(m.step(epoch, rank, step, "npy")).unwrap();
                assert_eq!(
                    fs::metadata(m.step(epoch, rank, step, "npy"))
                        .unwrap()
                        .len(),
                    npy.len() as u64
                );
                assert_eq!(&npy[..header.len()], &header[..]);
                assert_eq!(
                    &npy[header.len()..],
                    &expected_rows(&obs, &cfg, ScalarType::U32)[..]
                );
                all.push(obs);
            }
        }
        assert_exact_partition(&all, plan.n_observations(), plan.global_batch());
    }
    m.unmount();
}

#[test]
fn odd_offsets_sizes_and_past_eof() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional_of(50_000, 3001 * 2, ScalarType::U16);
    let cfg = config(2049, 2048, 8, 1, 1, 1);
    let reference = data.fs(&cfg);
    let m = TestMount::new(data.fs(&cfg));
    let path = m.step(0, 0, 2, "npy");
    let whole = fs::read(&path).unwrap();
    let len = whole.len() as u64;
    assert_eq!(len, reference.view().step_npy_len());
    let file = File::open(&path).unwrap();
    for offset in [
        0u64,
        1,
        63,
        64,
        127,
        128,
        129,
        4095,
        4096,
        30_000,
        len - 1,
        len,
        len + 1,
        len + 70_000,
    ] {
        for size in [1usize, 2, 3, 70_000, 131_072, 200_000] {
            let mut buf = vec![0xAAu8; size];
            let n = file.read_at(&mut buf, offset).unwrap();
            let start = offset.min(len) as usize;
            let end = (offset + size as u64).min(len) as usize;
            assert_eq!(n, end - start, "offset {offset} size {size}");
            assert_eq!(&buf[..n], &whole[start..end], "offset {offset} size {size}");
        }
    }
    // Sequential reads with a weird buffer size and a seek.
    let mut f = File::open(&path).unwrap();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 70_001];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, whole);
    f.seek(SeekFrom::Start(len - 5)).unwrap();
    let mut tail = Vec::new();
    f.read_to_end(&mut tail).unwrap();
    assert_eq!(tail, &whole[whole.len() - 5..]);
    // mmap (numpy's mmap_mode='r') sees the same bytes.
    let map = unsafe_map(&File::open(&path).unwrap());
    assert_eq!(&map[..], &whole[..]);
    // Closed before the unmount, which would otherwise detach a busy mount and wait for it.
    drop((map, file, f));
    m.unmount();
}

fn unsafe_map(f: &File) -> memmap2::Mmap {
    // SAFETY: the mapped file is an immutable shufflefs step file.
    unsafe { memmap2::Mmap::map(f).unwrap() }
}

#[test]
fn listings_names_and_read_only() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(30_000, 1 << 20);
    // 5,000 steps: the step directory takes many READDIR round trips with offsets.
    let m = TestMount::new(data.fs(&config(3, 3, 2, 1, 0, 2)));
    let root = m.path();
    let names = |p: &std::path::Path| -> Vec<String> {
        fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    assert_eq!(
        names(root),
        ["info.json", "stats.json", "epoch", "observation", "lookup"]
    );
    assert_eq!(names(&root.join("epoch")), ["0", "1"]);
    assert_eq!(names(&root.join("epoch/1/rank")), ["0"]);
    let steps = names(&root.join("epoch/1/rank/0/step"));
    assert_eq!(steps.len(), 10_000);
    for (i, name) in steps.iter().enumerate() {
        let want = format!("{}.{}", i / 2, if i % 2 == 0 { "npy" } else { "json" });
        assert_eq!(name, &want);
    }
    let meta = fs::metadata(root.join("epoch/0/rank/0/step/4999.npy")).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.permissions().mode() & 0o777, 0o444);
    assert_eq!(
        fs::metadata(root.join("epoch"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o555
    );
    let step_dir = root.join("epoch/0/rank/0/step");
    for bad in [
        "5000.npy",
        "07.npy",
        "+7.npy",
        "7.NPY",
        "7.npy.npy",
        "5.npy.",
        " 5.npy",
        "5 .npy",
        "0x5.npy",
        "-0.npy",
        "18446744073709551616.npy",
        "٣.npy",
        "5",
        "5.",
        ".npy",
    ] {
        let e = fs::metadata(step_dir.join(bad)).unwrap_err();
        assert_eq!(errno(&e), libc::ENOENT, "{bad}");
    }
    for bad in [
        "epoch/2",
        "epoch/00",
        "epoch/0/rank/1",
        "epoch/0/ranks",
        "nope",
        "epoch/0/rank/0/step/1.npy/x",
    ] {
        let e = fs::metadata(root.join(bad)).unwrap_err();
        assert!([libc::ENOENT, libc::ENOTDIR].contains(&errno(&e)), "{bad}");
    }
    let long = "5".repeat(250) + ".npy";
    assert_eq!(
        errno(&fs::metadata(step_dir.join(long)).unwrap_err()),
        libc::ENOENT
    );
    // Every modification is EROFS.
    let file = step_dir.join("3.npy");
    assert_eq!(
        errno(&File::create(step_dir.join("new.npy")).unwrap_err()),
        libc::EROFS
    );
    assert_eq!(
        errno(&OpenOptions::new().write(true).open(&file).unwrap_err()),
        libc::EROFS
    );
    assert_eq!(
        errno(&OpenOptions::new().append(true).open(&file).unwrap_err()),
        libc::EROFS
    );
    assert_eq!(errno(&fs::remove_file(&file).unwrap_err()), libc::EROFS);
    assert_eq!(
        errno(&fs::rename(&file, step_dir.join("4.npy")).unwrap_err()),
        libc::EROFS
    );
    assert_eq!(
        errno(&fs::create_dir(root.join("x")).unwrap_err()),
        libc::EROFS
    );
    assert_eq!(
        errno(&fs::remove_dir(root.join("epoch")).unwrap_err()),
        libc::EROFS
    );
    assert_eq!(
        errno(&fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap_err()),
        libc::EROFS
    );
    assert_eq!(
        errno(&std::os::unix::fs::symlink("a", root.join("l")).unwrap_err()),
        libc::EROFS
    );
    let e = File::open(&file).unwrap().set_len(0).unwrap_err();
    assert!(matches!(
        e.raw_os_error(),
        Some(libc::EROFS) | Some(libc::EINVAL) | Some(libc::EBADF)
    ));
    assert_eq!(
        fs::read(&file).unwrap().len() as u64,
        fs::metadata(&file).unwrap().len()
    );
    m.unmount();
}

#[test]
fn remount_serves_identical_bytes_and_inodes() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(8000, 3000);
    let cfg = config(33, 32, 3, 2, 77, 2);
    let snapshot = |m: &TestMount| -> BTreeMap<String, (u64, Vec<u8>)> {
        let mut out = BTreeMap::new();
        for (e, r, s) in [(0, 0, 0), (0, 1, 5), (1, 0, 39), (1, 1, 40)] {
            for ext in ["npy", "json"] {
                let p = m.step(e, r, s, ext);
                out.insert(
                    format!("{e}/{r}/{s}.{ext}"),
                    (fs::metadata(&p).unwrap().ino(), fs::read(&p).unwrap()),
                );
            }
        }
        out.insert(
            "info".into(),
            (0, fs::read(m.path().join("info.json")).unwrap()),
        );
        out
    };
    let first = TestMount::new(data.fs(&cfg));
    let a = snapshot(&first);
    let mountpoint = first.path().to_path_buf();
    first.unmount();
    assert!(
        !is_mounted(&mountpoint),
        "unmount leaves no mount table entry"
    );
    let second = TestMount::with_threads(data.fs(&cfg), 1);
    assert_eq!(snapshot(&second), a);
    second.unmount();
}

#[test]
fn concurrent_readers_see_the_same_bytes() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(100_000, 1 << 16);
    let cfg = config(129, 128, 16, 1, 3, 1);
    let reference = data.fs(&cfg);
    let m = TestMount::new(data.fs(&cfg));
    let steps = reference.view().plan().steps_per_epoch();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let m = &m;
            let reference = &reference;
            scope.spawn(move || {
                for s in (t..steps).step_by(4).chain(0..4) {
                    let bytes = fs::read(m.step(0, 0, s, "npy")).unwrap();
                    let want = reference
                        .view()
                        .render_step_npy(shufflefs::plan::StepKey {
                            epoch: 0,
                            rank: 0,
                            step: s,
                        })
                        .unwrap();
                    assert_eq!(bytes, want, "step {s}");
                }
            });
        }
    });
    m.unmount();
}

#[test]
fn dropping_the_guard_unmounts() {
    if !fuse_available() {
        return;
    }
    let data = Data::positional(1000, 1 << 20);
    let m = TestMount::new(data.fs(&config(10, 10, 2, 1, 0, 1)));
    let path = m.path().to_path_buf();
    assert!(is_mounted(&path));
    // A file kept open does not prevent the drop from cleaning up (lazy detach).
    let open = File::open(m.step(0, 0, 0, "npy")).unwrap();
    drop(m);
    assert!(!is_mounted(&path));
    drop(open);
}

#[test]
fn prefetching_mount_serves_identical_bytes() {
    if !fuse_available() {
        return;
    }
    use shufflefs::prefetch::PrefetchConfig;
    let data = Data::positional(60_000, 1 << 14);
    let cfg = config(129, 128, 8, 2, 11, 2);
    let reference = data.fs(&cfg);
    let step_len = reference.view().step_npy_len();
    let fs = data.fs(&cfg).with_cache(
        16 * step_len,
        PrefetchConfig {
            depth: 4,
            workers: 2,
            adaptive: false,
        },
    );
    let m = TestMount::new(fs);
    let steps = reference.view().plan().steps_per_epoch();
    let mut reads = 0u64;
    for epoch in 0..2 {
        for step in 0..steps {
            for rank in 0..2 {
                let got = fs::read(m.step(epoch, rank, step, "npy")).unwrap();
                let want = reference
                    .view()
                    .render_step_npy(shufflefs::plan::StepKey { epoch, rank, step })
                    .unwrap();
                assert_eq!(got, want, "epoch {epoch} rank {rank} step {step}");
                reads += 1;
            }
        }
    }
    let stats: serde_json::Value = stats(m.path());
    let c = &stats["cache"];
    assert_eq!(stats["cache_enabled"], true);
    // Every READ with data was a hit or a miss (one per file: files < 1 MiB; the reader's
    // end-of-file READ is not counted).
    assert_eq!(
        c["hits"].as_u64().unwrap() + c["misses"].as_u64().unwrap(),
        reads
    );
    assert!(c["prefetched"].as_u64().unwrap() > 0);
    m.unmount();
}

//! The manifest's tests: round trips, every refused edit, names, in-place identities, and
//! validation of 500k shards in bounded time.

use std::path::Path;

use super::hash::SAMPLE_BYTES;
use super::manifest::pack_shard_number;
use super::*;
use crate::error::{EDITED, Result};

fn sample() -> Manifest {
    let shards = vec![
        ShardEntry {
            path: shard_name("p", 0),
            records: 10,
            bytes: 40,
            hash: format_hash(1),
            offset: 0,
            source_format: None,
            etag: None,
            docs: None,
            in_place_mtime_ns: None,
            in_place_guard: None,
            checksums: None,
        },
        ShardEntry {
            path: shard_name("p", 1),
            records: 5,
            bytes: 20,
            hash: format_hash(2),
            offset: 0,
            source_format: None,
            etag: None,
            docs: None,
            in_place_mtime_ns: None,
            in_place_guard: None,
            checksums: None,
        },
    ];
    let mut m = Manifest {
        format: FORMAT_NAME.into(),
        version: VERSION,
        dtype: "<u4".into(),
        itemsize: 4,
        records: 15,
        content_hash: String::new(),
        shards,
        documents: None,
        metadata: false,
        created_by: "test".into(),
    };
    m.content_hash = m.expected_content_hash();
    m
}

#[test]
fn round_trip() {
    let m = sample();
    let parsed = Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
    assert_eq!(parsed, m);
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = sample().to_bytes();
    for cut in 0..bytes.len() - 2 {
        assert!(
            Manifest::parse(&bytes[..cut], Path::new("m")).is_err(),
            "cut {cut}"
        );
    }
}

#[test]
fn rejects_inconsistent_manifests() {
    let check = |f: &dyn Fn(&mut Manifest), want: &str| {
        let mut m = sample();
        f(&mut m);
        let err = Manifest::parse(&m.to_bytes(), Path::new("/d/manifest.json")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("/d/manifest.json: "), "{msg}");
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
    };
    check(&|m| m.version = 1, "version 1");
    check(&|m| m.format = "x".into(), "format");
    check(&|m| m.dtype = "<c8".into(), "dtype");
    check(&|m| m.itemsize = 2, "itemsize");
    check(&|m| m.records = 16, "records is 16");
    check(&|m| m.shards[1].bytes = 21, "bytes 21");
    check(&|m| m.shards[0].path = "../x.bin".into(), "plain file name");
    check(
        &|m| {
            m.version = 3;
            m.shards[0].path = "rel.bin".into();
            m.shards[0].in_place_mtime_ns = Some(1);
        },
        "must be absolute",
    );
    check(
        &|m| {
            m.shards[0].path = "rel.bin".into();
            m.shards[0].in_place_mtime_ns = Some(1);
        },
        "shards[0] is in place but has no in_place_guard",
    );
    check(
        &|m| m.shards[0].path = "/etc/passwd".into(),
        "plain file name",
    );
    check(&|m| m.shards[0].path = "a/b".into(), "plain file name");
    check(&|m| m.shards[0].hash = "zz".into(), "hex");
    check(&|m| m.shards[0].hash = format_hash(9), "content_hash");
    check(&|m| m.version = 6, "version 6");
    let sums = |file: &str| ShardChecksums {
        file: file.into(),
        block: checksum::BLOCK,
        hash: format_hash(7),
    };
    let with_sums = |m: &mut Manifest, c: ShardChecksums| {
        m.shards[0].checksums = Some(c);
        m.content_hash = m.expected_content_hash();
    };
    check(
        &|m| {
            with_sums(m, sums("a.sums"));
            m.version = 2;
        },
        "needs manifest version 3",
    );
    check(
        &|m| {
            with_sums(
                m,
                ShardChecksums {
                    block: 4096,
                    ..sums("a.sums")
                },
            )
        },
        "block is 4096",
    );
    check(&|m| with_sums(m, sums("../a.sums")), "plain file name");
    check(
        &|m| with_sums(m, sums(&m.shards[1].path.clone())),
        "is also shards[0].checksums.file",
    );
    check(
        &|m| {
            with_sums(
                m,
                ShardChecksums {
                    hash: "x".into(),
                    ..sums("a.sums")
                },
            )
        },
        "hex",
    );
    // Checksums count in the identity; a version 2 manifest without them still reads.
    let mut m = sample();
    let before = m.content_hash.clone();
    with_sums(&mut m, sums("a.sums"));
    assert_ne!(m.content_hash, before);
    Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
    let mut v2 = sample();
    v2.version = 2;
    v2.content_hash = content_hash(&v2.shards);
    Manifest::parse(&v2.to_bytes(), Path::new("m")).unwrap();
    // From version 3 the dtype and the metadata flag are part of the identity.
    check(&|m| m.dtype = "<f4".into(), "does not match the shard list");
    check(&|m| m.metadata = true, "metadata is true but");
    check(
        &|m| m.shards[0].hash = format_hash(9),
        "does not match the shard list",
    );
    // Every message says what to do.
    check(&|m| m.format = "x".into(), EDITED);
    check(&|m| m.itemsize = 2, EDITED);
    check(&|m| m.shards[0].path = "../x.bin".into(), EDITED);
    check(&|m| m.shards[0].hash = format_hash(9), EDITED);
    check(
        &|m| m.version = 1,
        "re-run `shufflefs pack` with this version",
    );
    let mut value: serde_json::Value = serde_json::from_slice(&sample().to_bytes()).unwrap();
    value["extra"] = 1.into();
    let err = Manifest::parse(value.to_string().as_bytes(), Path::new("m")).unwrap_err();
    assert!(err.to_string().contains("unknown field"));
}

/// Three shards named as pack names them, with document files.
fn with_docs() -> Manifest {
    let shards: Vec<ShardEntry> = (0..3)
        .map(|k| {
            let path = shard_name("0123abcd", k);
            let stem = path.trim_end_matches(".bin");
            ShardEntry {
                records: 4,
                bytes: 8,
                hash: format_hash(k as u64),
                docs: Some(ShardDocs {
                    ids: Some(format!("{stem}.ids")),
                    index: Some(format!("{stem}.idx")),
                    meta: Some(format!("{stem}.meta")),
                    entries: 1,
                    meta_bytes: 20,
                    docs: format!("{stem}.docs"),
                    documents: 1,
                    hash: format_hash(10 + k as u64),
                    checksums: None,
                }),
                in_place_mtime_ns: None,
                in_place_guard: None,
                checksums: None,
                offset: 0,
                source_format: None,
                etag: None,
                path,
            }
        })
        .collect();
    let mut m = Manifest {
        format: FORMAT_NAME.into(),
        version: VERSION,
        dtype: "<u2".into(),
        itemsize: 2,
        records: 12,
        content_hash: String::new(),
        shards,
        documents: Some(3),
        metadata: false,
        created_by: "test".into(),
    };
    m.content_hash = m.expected_content_hash();
    m
}

#[test]
fn names_cannot_point_at_another_listed_file_or_be_swapped() {
    Manifest::parse(&with_docs().to_bytes(), Path::new("m")).unwrap();
    // None of these edits changes content_hash, which covers no name: before the check
    // each opened and served another file's bytes under the same fingerprint.
    let check = |f: &dyn Fn(&mut Manifest), want: &str| {
        let mut m = with_docs();
        f(&mut m);
        assert_eq!(m.content_hash, m.expected_content_hash());
        let msg = Manifest::parse(&m.to_bytes(), Path::new("/d/manifest.json"))
            .unwrap_err()
            .to_string();
        assert!(msg.starts_with("/d/manifest.json: "), "{msg}");
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
        assert!(msg.ends_with(EDITED), "{msg}");
    };
    let docs = |m: &mut Manifest, k: usize| m.shards[k].docs.clone().unwrap();
    check(
        &|m| m.shards[1].path = docs(m, 0).ids.unwrap(),
        "shards[1].path \"shard-0123abcd-00000.ids\" is also shards[0].docs.ids",
    );
    check(
        &|m| m.shards[2].docs.as_mut().unwrap().meta = docs(m, 1).meta,
        "shards[2].docs.meta \"shard-0123abcd-00001.meta\" is also shards[1].docs.meta",
    );
    check(
        &|m| m.shards[0].docs.as_mut().unwrap().docs = m.shards[0].path.clone(),
        "shards[0].docs.docs \"shard-0123abcd-00000.bin\" is also shards[0].path",
    );
    check(
        &|m| {
            let p0 = m.shards[0].path.clone();
            m.shards[0].path = std::mem::replace(&mut m.shards[1].path, p0);
        },
        "shards[0].path \"shard-0123abcd-00001.bin\" is the name pack gives shard 1",
    );
    check(
        &|m| {
            let (a, b) = (docs(m, 0).ids, docs(m, 2).ids);
            m.shards[0].docs.as_mut().unwrap().ids = b;
            m.shards[2].docs.as_mut().unwrap().ids = a;
        },
        "shards[0].docs.ids \"shard-0123abcd-00002.ids\" is not named after its shard",
    );
    check(
        &|m| m.shards[1].docs.as_mut().unwrap().index = Some("shard-0123abcd-00001.meta2".into()),
        "shards[1].docs.index",
    );
    // Names of another form are the writer's business, but must still be distinct.
    let mut m = with_docs();
    m.shards[0].path = "first.bin".into();
    m.shards[1].path = "shard-0123abcd-000001.bin".into();
    m.shards[1].docs.as_mut().unwrap().ids = Some("any.ids".into());
    Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
    assert_eq!(
        pack_shard_number("shard-0123abcd-100000.bin"),
        Some((100000, "shard-0123abcd-100000"))
    );
    assert_eq!(pack_shard_number("shard-0123ABCD-00001.bin"), None);
    assert_eq!(pack_shard_number("shard-p-00001.bin"), None);
}

#[test]
fn a_version_3_in_place_shard_hash_binds_its_path() {
    let mut m = sample();
    m.version = 3;
    for (k, s) in m.shards.iter_mut().enumerate() {
        s.path = format!("/data/part{k}.bin");
        s.bytes = 40;
        s.records = 10;
        s.in_place_mtime_ns = Some(1_700_000_000_000_000_000);
        s.hash = in_place_hash(&s.path, s.bytes, 1_700_000_000_000_000_000);
    }
    m.records = 20;
    m.content_hash = m.expected_content_hash();
    Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
    // Swapped paths (equal sizes and mtimes) keep content_hash: before the check this
    // served the two files in the wrong order under the same fingerprint.
    let mut swapped = m.clone();
    swapped.shards[0].path = m.shards[1].path.clone();
    swapped.shards[1].path = m.shards[0].path.clone();
    let msg = Manifest::parse(&swapped.to_bytes(), Path::new("m"))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("shards[0].hash") && msg.contains("is not the in-place identity"),
        "{msg}"
    );
    let mut moved = m.clone();
    moved.shards[1].path = "/data/other.bin".into();
    assert!(Manifest::parse(&moved.to_bytes(), Path::new("m")).is_err());
}

#[test]
fn version_4_in_place_paths_and_guards() {
    let in_place = |paths: &[&str]| {
        let mut m = sample();
        for (s, p) in m.shards.iter_mut().zip(paths) {
            s.path = p.to_string();
            s.in_place_mtime_ns = Some(7);
            s.in_place_guard = Some(in_place_guard(&s.path, s.bytes, 7, &s.hash));
        }
        m.content_hash = m.expected_content_hash();
        m
    };
    let parse = |m: &Manifest| Manifest::parse(&m.to_bytes(), Path::new("m"));
    // Inside the dataset directory (relative, any depth) or outside (absolute).
    parse(&in_place(&["part0.bin", "data/x/part1.bin"])).unwrap();
    parse(&in_place(&["/srv/a.bin", "b.bin"])).unwrap();
    for bad in [
        "../x.bin",
        "data/../x.bin",
        "./x.bin",
        "data/./x.bin",
        "data//x.bin",
        "data/",
        "",
        "/",
        "//srv/a.bin",
        "/srv/../a.bin",
        "manifest.json",
    ] {
        let msg = parse(&in_place(&[bad, "b.bin"])).unwrap_err().to_string();
        assert!(msg.contains("in canonical form"), "{bad:?}: {msg}");
    }
    let msg = parse(&in_place(&["a.bin", "a.bin"]))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("shards[1].path \"a.bin\" is also shards[0].path"),
        "{msg}"
    );
    // The guard is a hex hash, only in version 4 and only in place; the paths are not in
    // the identity (copies and moves keep it), the content hashes are.
    let mut m = in_place(&["a.bin", "b.bin"]);
    m.shards[0].in_place_guard = Some("x".into());
    assert!(
        parse(&m)
            .unwrap_err()
            .to_string()
            .contains("not 16 hex digits")
    );
    let mut m = in_place(&["a.bin", "b.bin"]);
    m.shards[0].in_place_mtime_ns = None;
    assert!(
        parse(&m)
            .unwrap_err()
            .to_string()
            .contains("without in_place_mtime_ns")
    );
    let mut m = in_place(&["/a.bin", "/b.bin"]);
    m.version = 3;
    m.content_hash = m.expected_content_hash();
    assert!(
        parse(&m)
            .unwrap_err()
            .to_string()
            .contains("needs manifest version 4")
    );
    assert_eq!(
        in_place(&["a.bin", "b.bin"]).content_hash,
        in_place(&["/elsewhere/a.bin", "c/b.bin"]).content_hash
    );
    // A guard that does not match (an edited path or mtime) is not an error here: the
    // mount samples the file instead of trusting it.
    let mut m = in_place(&["a.bin", "b.bin"]);
    m.shards[1].path = "c.bin".into();
    parse(&m).unwrap();
}

#[test]
fn sample_ranges_cover_small_shards_and_spread_over_large_ones() {
    assert_eq!(sample_ranges(10), vec![(0, 10)]);
    assert_eq!(sample_ranges(65_536), vec![(0, 65_536)]);
    for bytes in [65_537, 1 << 30, 3 << 40, u64::MAX] {
        let r = sample_ranges(bytes);
        assert_eq!(r.len() as u64, SAMPLES);
        assert_eq!(r[0], (0, SAMPLE_BYTES));
        assert_eq!(
            r[15],
            (bytes - SAMPLE_BYTES, SAMPLE_BYTES),
            "ends at the end"
        );
        assert!(r.windows(2).all(|w| w[0].0 < w[1].0), "{bytes}: {r:?}");
        assert!(r[..15].iter().all(|&(at, _)| at % SAMPLE_BYTES == 0));
    }
    assert_ne!(
        sampled_identity(4, &[1, 2, 3, 4]),
        sampled_identity(5, &[1, 2, 3, 4])
    );
    assert_ne!(
        sampled_identity(4, &[1, 2, 3, 4]),
        sampled_identity(4, &[1, 2, 3, 5])
    );
}

/// A manifest of `n` shards named as pack names them, each with a checksum file.
fn many_shards(n: usize) -> Manifest {
    let mut m = sample();
    m.shards = (0..n)
        .map(|k| ShardEntry {
            path: shard_name("0123abcd", k),
            records: 4,
            bytes: 16,
            hash: format_hash(k as u64),
            offset: 0,
            source_format: None,
            etag: None,
            docs: None,
            in_place_mtime_ns: None,
            in_place_guard: None,
            checksums: Some(ShardChecksums {
                file: format!("shard-0123abcd-{k:05}.sums"),
                block: checksum::BLOCK,
                hash: format_hash(!(k as u64)),
            }),
        })
        .collect();
    m.records = 4 * n as u64;
    m.content_hash = m.expected_content_hash();
    m
}

/// Parses `bytes` on another thread, failing instead of hanging: a generous watchdog
/// (validation was quadratic, 500k shards did not finish in 40 s), not a timing assert.
fn parse_watched(bytes: Vec<u8>) -> Result<Manifest> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let result = Manifest::parse(&bytes, Path::new("m"));
        eprintln!("parsed {} bytes in {:.2?}", bytes.len(), started.elapsed());
        let _ = tx.send(result);
    });
    rx.recv_timeout(std::time::Duration::from_secs(600))
        .expect("manifest validation did not finish in 10 minutes")
}

#[test]
fn validation_of_500k_shards_finishes_and_still_finds_duplicates() {
    for n in [40_000, 500_000] {
        let m = many_shards(n);
        assert_eq!(parse_watched(m.to_bytes()).unwrap().shards.len(), n);
    }
    let n = 500_000;
    // A shard path listed twice (the last shard names the first one's file).
    let mut m = many_shards(n);
    m.shards[n - 1].path = m.shards[3].path.clone();
    m.content_hash = m.expected_content_hash();
    let msg = parse_watched(m.to_bytes()).unwrap_err().to_string();
    assert!(
        msg.contains(&format!("shards[{}].path", n - 1)) && msg.contains("shards[3].path"),
        "{msg}"
    );
    // A checksum file shared by two shards.
    let mut m = many_shards(n);
    m.shards[n - 2].checksums.as_mut().unwrap().file =
        m.shards[7].checksums.as_ref().unwrap().file.clone();
    m.content_hash = m.expected_content_hash();
    let msg = parse_watched(m.to_bytes()).unwrap_err().to_string();
    assert!(
        msg.contains(&format!("shards[{}].checksums.file", n - 2))
            && msg.contains("shards[7].checksums.file"),
        "{msg}"
    );
}

#[test]
fn offset_only_in_place_and_bound_to_the_identity() {
    let mut m = sample();
    for (k, s) in m.shards.iter_mut().enumerate() {
        s.path = format!("/data/part{k}.bin");
        s.in_place_mtime_ns = Some(5);
        s.in_place_guard = Some(in_place_guard(&s.path, s.bytes, 5, &s.hash));
    }
    m.content_hash = m.expected_content_hash();
    let plain = m.content_hash.clone();
    m.shards[0].offset = 1024;
    m.shards[0].source_format = Some("llmc".into());
    m.content_hash = m.expected_content_hash();
    assert_ne!(m.content_hash, plain, "the offset is part of the identity");
    let parsed = Manifest::parse(&m.to_bytes(), Path::new("m")).unwrap();
    assert_eq!(parsed, m);
    let text = String::from_utf8(m.to_bytes()).unwrap();
    assert_eq!(
        text.matches("\"offset\"").count(),
        1,
        "omitted when 0: {text}"
    );
    // An edited offset changes what is served: refused unless the identity follows.
    let mut edited = m.clone();
    edited.shards[0].offset = 1000;
    let msg = Manifest::parse(&edited.to_bytes(), Path::new("m"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("does not match the shard list"), "{msg}");
    let check = |f: &dyn Fn(&mut Manifest), want: &str| {
        let mut bad = m.clone();
        f(&mut bad);
        bad.content_hash = bad.expected_content_hash();
        let msg = Manifest::parse(&bad.to_bytes(), Path::new("m"))
            .unwrap_err()
            .to_string();
        assert!(msg.contains(want), "{msg:?} lacks {want:?}");
    };
    check(&|b| b.shards[0].offset = u64::MAX - 10, "overflows 64 bits");
    check(
        &|b| b.shards[1].source_format = Some("parquet".into()),
        "source_format \"parquet\" is not one of",
    );
    let mut copied = sample();
    copied.shards[1].offset = 8;
    copied.content_hash = copied.expected_content_hash();
    let msg = Manifest::parse(&copied.to_bytes(), Path::new("m"))
        .unwrap_err()
        .to_string();
    assert!(msg.contains("only an in-place shard has a header"), "{msg}");
}

#[test]
fn hasher_is_split_invariant() {
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
    let mut whole = ContentHasher::new();
    whole.update(&data);
    for split in [0, 1, 7, 8, 9, 500, 999, 1000] {
        let mut h = ContentHasher::new();
        h.update(&data[..split]);
        h.update(&data[split..]);
        assert_eq!(h.finish(), whole.finish(), "split {split}");
    }
    let mut other = ContentHasher::new();
    other.update(&data[..999]);
    assert_ne!(other.finish(), whole.finish());
    let mut zero_padded = ContentHasher::new();
    zero_padded.update(&[1, 2, 3]);
    let mut longer = ContentHasher::new();
    longer.update(&[1, 2, 3, 0]);
    assert_ne!(
        zero_padded.finish(),
        longer.finish(),
        "length is part of the hash"
    );
}

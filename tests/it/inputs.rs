//! Pack inputs written as the real tools write them (issue #10, "wrong data served
//! silently"): llm.c shards, `.npy` of every format version, in place and copied, known
//! non-token files, token width and numpy's dtype spellings. Every accepted file is checked
//! token for token against what the format's own reader sees, through the View (and a mount
//! for llm.c); every refusal says what the file is and what to do, the same for a copy and
//! `--in-place`. Files come from the test's own writers (byte for byte as llm.c and numpy
//! write them, checked against tests/fixtures/inputs, written by the tools themselves with
//! scripts/gen_fixtures.py).

use std::fs;
use std::path::{Path, PathBuf};

use shufflefs::fs::ShuffleFs;
use shufflefs::view::View;

use crate::common::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/inputs")
        .join(name)
}

/// An llm.c shard as llm.c's `dev/data/data_common.py` `write_datafile` writes it: 256 int32
/// little-endian header words (magic, version, token count, zeros), then the tokens.
fn llmc(magic: i32, version: i32, count: i32, tokens: &[u8]) -> Vec<u8> {
    let mut header = [0i32; 256];
    header[..3].copy_from_slice(&[magic, version, count]);
    let mut out: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
    out.extend_from_slice(tokens);
    out
}

/// The tokens gen_fixtures.py writes: GPT-2 ids as u16 and Llama-3 ids as u32.
fn gpt2_tokens(n: u64) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i * 37 % 50257) as u16).to_le_bytes())
        .collect()
}

fn llama3_tokens(n: u64) -> Vec<u8> {
    (0..n)
        .flat_map(|i| ((i * 7919 % 128256) as u32).to_le_bytes())
        .collect()
}

/// Every record the View serves, in stream order: observation `i` of a window of 1 is record
/// `i` (the bytes after the observation file's `.npy` header).
fn served(ds: &Path) -> Vec<u8> {
    let view = View::open(ds, &config(1, 1, 1, 1, 0, 1)).unwrap();
    let itemsize = view.dataset().record_type().itemsize() as u64;
    let mut out = Vec::new();
    for o in 0..view.dataset().n_records() {
        let len = view.observation_npy_len(o).unwrap();
        let mut buf = vec![0u8; len as usize];
        assert_eq!(
            view.read_observation_npy(o, 0, &mut buf).unwrap(),
            buf.len()
        );
        out.extend_from_slice(&buf[(len - itemsize) as usize..]);
    }
    out
}

/// `shufflefs pack DS ARGS...` and `shufflefs pack DS2 ARGS... --in-place`: (copy, in place).
fn pack_both(dir: &Path, args: &[&str]) -> (std::process::Output, std::process::Output) {
    let (copy, in_place) = (dir.join("copy"), dir.join("in-place"));
    let _ = fs::remove_dir_all(&copy);
    let _ = fs::remove_dir_all(&in_place);
    let mut a = vec!["pack", s(&copy)];
    a.extend_from_slice(args);
    let c = shufflefs(&a);
    let mut b = vec!["pack", s(&in_place)];
    b.extend_from_slice(args);
    b.push("--in-place");
    (c, shufflefs(&b))
}

#[test]
fn llmc_shards_serve_exactly_their_tokens_copied_and_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("llmc_gpt2.bin", 20240520, 1, gpt2_tokens(1000), "<u2"),
        ("llmc_llama3.bin", 20240801, 7, llama3_tokens(600), "<u4"),
    ];
    for (name, magic, version, tokens, dtype) in &cases {
        let count = (tokens.len() / if *dtype == "<u2" { 2 } else { 4 }) as i32;
        let bytes = llmc(*magic, *version, count, tokens);
        assert_eq!(
            bytes,
            fs::read(fixture(name)).unwrap(),
            "{name}: as llm.c writes it"
        );
        let file = dir.path().join(name);
        fs::write(&file, &bytes).unwrap();
        // No --dtype needed: the header says it. Before: "raw input needs --dtype", and with
        // --dtype the 1,024 header bytes were packed as 512 (or 256) tokens.
        let (copy, in_place) = pack_both(dir.path(), &[s(&file)]);
        for (mode, o, ds) in [("copy", &copy, "copy"), ("in place", &in_place, "in-place")] {
            assert!(o.status.success(), "{name} {mode}: {}", stderr(o));
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.contains(&format!("packed {count} records")), "{out}");
            let ds = dir.path().join(ds);
            assert_eq!(manifest(&ds)["dtype"], *dtype);
            // What llm.c's loader reads: the tokens after the 1,024-byte header.
            assert_eq!(&served(&ds), tokens, "{name} {mode}: every token served");
        }
        let m = manifest(&dir.path().join("in-place"));
        assert_eq!(m["shards"][0]["offset"], 1024, "{m}");
        assert_eq!(m["shards"][0]["source_format"], "llmc");
        assert_eq!(m["shards"][0]["bytes"], tokens.len());
        // The matching --dtype is accepted; another is refused, naming both.
        let flag = if *dtype == "<u2" { "u16" } else { "u32" };
        let (c, i) = pack_both(dir.path(), &[s(&file), "--dtype", flag]);
        assert!(c.status.success() && i.status.success());
        let other = if *dtype == "<u2" { "u32" } else { "u16" };
        let (c, i) = pack_both(dir.path(), &[s(&file), "--dtype", other]);
        for o in [&c, &i] {
            assert_eq!(o.status.code(), Some(1));
            let want = format!(
                "{name}: llm.c shard of {flag} tokens (magic {magic}, version {version}) but \
                 --dtype is {other}: leave --dtype out"
            );
            assert!(stderr(o).contains(&want), "{}", stderr(o));
        }
    }
    // The issue's repro: 4 tokens behind the header, --dtype u16 --in-place. Before: "packed
    // 516 records".
    let repro = dir.path().join("s.bin");
    let four: Vec<u8> = (0..4u16).flat_map(u16::to_le_bytes).collect();
    fs::write(&repro, llmc(20240520, 1, 4, &four)).unwrap();
    let (c, i) = pack_both(dir.path(), &[s(&repro), "--dtype", "u16"]);
    for o in [&c, &i] {
        assert!(String::from_utf8_lossy(&o.stdout).contains("packed 4 records"));
    }
    assert_eq!(served(&dir.path().join("in-place")), four);
    // A raw file after an llm.c shard takes the header's dtype.
    let raw = dir.path().join("more.bin");
    fs::write(&raw, gpt2_tokens(300)).unwrap();
    let (c, i) = pack_both(dir.path(), &[s(&repro), s(&raw)]);
    assert!(c.status.success() && i.status.success(), "{}", stderr(&i));
    let mut both = four.clone();
    both.extend_from_slice(&gpt2_tokens(300));
    assert_eq!(served(&dir.path().join("copy")), both);
    assert_eq!(served(&dir.path().join("in-place")), both);
}

#[test]
fn llmc_header_count_and_version_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = gpt2_tokens(1000);
    let cases: [(&str, Vec<u8>, &str); 4] = [
        (
            "long.bin",
            llmc(20240520, 1, 1001, &tokens),
            "whose header says 1001 tokens (2002 bytes) but which holds 2000 bytes after its \
             1,024-byte header",
        ),
        (
            "short.bin",
            llmc(20240520, 1, 999, &tokens),
            "says 999 tokens (1998 bytes) but which holds 2000 bytes",
        ),
        (
            "v2.bin",
            llmc(20240520, 2, 1000, &tokens),
            "llm.c shard of an unknown version (magic 20240520, version 2): this shufflefs reads \
             magic 20240520 version 1 (u16 tokens), magic 20240801 version 7 (u32 tokens)",
        ),
        (
            "eval.bin",
            llmc(20240522, 1, 10, &tokens),
            "llm.c eval file (multiple-choice examples, magic 20240522), not token ids",
        ),
    ];
    for (name, bytes, want) in cases {
        let file = dir.path().join(name);
        fs::write(&file, bytes).unwrap();
        let (c, i) = pack_both(dir.path(), &[s(&file), "--dtype", "u16"]);
        for o in [&c, &i] {
            assert_eq!(o.status.code(), Some(1), "{name}");
            assert!(stderr(o).contains(want), "{name}: {}", stderr(o));
        }
        assert_eq!(stderr(&c), stderr(&i).replace("in-place", "copy"), "{name}");
    }
}

#[test]
fn llmc_in_place_through_a_mount_and_verified_reads() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tokens = gpt2_tokens(1000);
    let file = dir.path().join("train_000001.bin");
    fs::write(&file, llmc(20240520, 1, 1000, &tokens)).unwrap();
    let ds = dir.path().join("ds");
    let o = shufflefs(&["pack", s(&ds), s(&file), "--in-place"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let token = |i: u64| &tokens[(i * 2) as usize..(i * 2 + 2) as usize];
    let (window, batch) = (8u64, 4u64);
    let cfg = config(window, window, batch, 1, 7, 1);
    let mnt = TestMount::new(ShuffleFs::new(View::open(&ds, &cfg).unwrap()).unwrap());
    let steps = 1000 / window / batch;
    for step in 0..steps {
        let npy = fs::read(mnt.step(0, 0, step, "npy")).unwrap();
        let obs = json_observations(&fs::read(mnt.step(0, 0, step, "json")).unwrap());
        let header = shufflefs::npy::header("'<u2'", &[batch, window]).unwrap();
        let mut want = header.clone();
        for o in &obs {
            for t in o * window..(o + 1) * window {
                want.extend_from_slice(token(t));
            }
        }
        assert_eq!(npy, want, "step {step}: exactly the llm.c tokens");
    }
    mnt.unmount();
    // Checksums cover the records [1024, 1024 + bytes), not the header: written, verified,
    // and every read checked against them serves the same tokens.
    let o = shufflefs(&["verify", "--write-checksums", s(&ds)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = shufflefs(&["verify", s(&ds)]);
    assert!(o.status.success(), "{}", stderr(&o));
    let sums = manifest(&ds)["shards"][0]["checksums"]["file"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        fs::metadata(ds.join(sums)).unwrap().len(),
        8,
        "one 64 KiB block of records"
    );
    let dataset = shufflefs::dataset::Dataset::open(&ds)
        .unwrap()
        .with_verified_reads()
        .unwrap();
    let mut all = vec![0u8; 2000];
    dataset.read_stream(0, &mut all).unwrap();
    assert_eq!(all, tokens);
}

#[test]
fn npy_of_every_version_is_served_in_place_from_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let structured: Vec<u8> = (0..5u32)
        .flat_map(|k| {
            let mut r = (k * 3).to_le_bytes().to_vec();
            r.extend_from_slice(&(k as u16 + 100).to_le_bytes());
            r
        })
        .collect();
    let cases: Vec<(&str, PathBuf, Vec<u8>, Vec<u8>)> = vec![
        (
            "1.0 u16",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokens_u2_1d.npy"),
            npy_header(1, "'<u2'", &[1000]),
            (0..1000u16).flat_map(u16::to_le_bytes).collect(),
        ),
        (
            "2.0 u32",
            fixture("npy_v2_u4.npy"),
            npy_header(2, "'<u4'", &[600]),
            llama3_tokens(600),
        ),
        (
            "3.0 i64",
            fixture("npy_v3_i8.npy"),
            npy_header(3, "'<i8'", &[300]),
            (-50..250i64).flat_map(i64::to_le_bytes).collect(),
        ),
        (
            "1.0 structured",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/structured_tc_1d.npy"),
            npy_header(1, "[('token', '<u4'), ('concept', '<u2')]", &[5]),
            structured,
        ),
    ];
    for (what, golden, preamble, data) in cases {
        // Our writer reproduces numpy's file byte for byte.
        let mut ours = preamble.clone();
        ours.extend_from_slice(&data);
        assert_eq!(ours, fs::read(&golden).unwrap(), "{what}: numpy's bytes");
        let file = dir.path().join("array.npy");
        fs::write(&file, &ours).unwrap();
        // Before: --in-place refused every .npy ("references raw token files only") that a
        // copy accepted.
        let (c, i) = pack_both(dir.path(), &[s(&file)]);
        assert!(c.status.success(), "{what}: {}", stderr(&c));
        assert!(i.status.success(), "{what}: {}", stderr(&i));
        let m = manifest(&dir.path().join("in-place"));
        assert_eq!(m["shards"][0]["offset"], preamble.len(), "{what}");
        assert_eq!(m["shards"][0]["source_format"], "npy");
        // np.load(file) is the data after the preamble.
        assert_eq!(
            served(&dir.path().join("in-place")),
            data,
            "{what}: in place"
        );
        assert_eq!(served(&dir.path().join("copy")), data, "{what}: copied");
    }
}

#[test]
fn every_input_is_accepted_by_both_modes_or_refused_by_both() {
    let dir = tempfile::tempdir().unwrap();
    let mut names: Vec<String> = fs::read_dir(fixture(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert!(names.len() >= 25, "{names:?}");
    for name in &names {
        if is_table(name) {
            // Tables are converted by a copy and refused in place (tables_are_converted...).
            continue;
        }
        for dtype in [None, Some("u8"), Some("u16")] {
            let mut args = vec![s(&fixture(name)).to_string()];
            if let Some(t) = dtype {
                args.extend(["--dtype".to_string(), t.to_string()]);
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (c, i) = pack_both(dir.path(), &args);
            assert_eq!(
                c.status.success(),
                i.status.success(),
                "{name} {dtype:?}: copy {} / in place {}",
                stderr(&c),
                stderr(&i)
            );
            assert_eq!(stderr(&c), stderr(&i), "{name} {dtype:?}: the same message");
        }
    }
}

#[test]
fn known_non_token_files_are_refused_saying_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    // (fixture, what it is, what to do). Each was packed as tokens before (--dtype u8 takes
    // any size).
    let cases = [
        (
            "megatron_text_document.idx",
            "Megatron-LM index (.idx) of u16 tokens, not token ids",
            "pack the matching PREFIX.bin instead",
        ),
        (
            "00000_unshuffled.ds.index",
            "datatrove document index (.ds.index: u64 document ends), not token ids",
            "pack the matching .ds token file instead",
        ),
        (
            "00000_unshuffled.ds.metadata",
            "datatrove metadata",
            "leave .ds.metadata out of the glob",
        ),
        (
            "tokens.bin.gz",
            "gzip-compressed file, not token ids",
            "gunzip -k",
        ),
        (
            "tokens.bin.zst",
            "zstd-compressed file, not token ids",
            "zstd -d",
        ),
        (
            "tokens.bin.bz2",
            "bzip2-compressed file, not token ids",
            "bunzip2 -k",
        ),
        (
            "tokens.bin.xz",
            "xz-compressed file, not token ids",
            "xz -dk",
        ),
        (
            "tokens.bin.lz4",
            "lz4 frame (compressed), not token ids",
            "lz4 -d",
        ),
        ("tokens.zip", "zip archive, not token ids", "unzip FILE"),
        (
            "tokens.pt",
            "PyTorch checkpoint (torch.save zip archive)",
            "torch.load(FILE).numpy()",
        ),
        ("tokens.tar", "tar archive, not token ids", "tar -xf"),
        (
            "tokens.json",
            "JSON text, not token ids",
            "write them as a 1-D .npy",
        ),
        (
            "docs.txt",
            "JSON Lines text, not token ids",
            "name it .jsonl",
        ),
        (
            "corpus.txt",
            "plain text, not token ids",
            "tokenize it first",
        ),
        (
            "npy_fortran_2d.npy",
            "Fortran-order array of shape [3, 4]",
            "np.ascontiguousarray",
        ),
        ("npy_c_2d.npy", "array has shape [3, 4]", "arr.reshape(-1)"),
        (
            "npy_object.npy",
            "array of Python objects (dtype object)",
            "dtype='uint32'",
        ),
        (
            "npy_big_endian.npy",
            "big-endian dtype \">u2\" is not supported",
            "astype",
        ),
    ];
    for (name, what, todo) in cases {
        let file = fixture(name);
        // An .npy defines its dtype; u8 takes a file of any size.
        let mut args = vec![s(&file)];
        if !name.ends_with(".npy") {
            args.extend(["--dtype", "u8"]);
        }
        let (c, i) = pack_both(dir.path(), &args);
        for (mode, o) in [("copy", &c), ("in place", &i)] {
            let err = stderr(o);
            assert_eq!(o.status.code(), Some(1), "{name} {mode}: {err}");
            assert!(err.contains(&format!("{name}: ")), "{name} {mode}: {err}");
            assert!(
                err.contains(what) && err.contains(todo),
                "{name} {mode}: {err}"
            );
        }
        assert!(!dir.path().join("copy/manifest.json").exists());
        assert!(!dir.path().join("in-place/manifest.json").exists());
        // Text is recognised by a heuristic: --force packs it (byte-level u8 tokens).
        let heuristic = name.ends_with(".txt") || name.ends_with(".json");
        args.push("--force");
        let (c, _) = pack_both(dir.path(), &args);
        assert_eq!(
            c.status.success(),
            heuristic,
            "{name} --force: {}",
            stderr(&c)
        );
        if heuristic {
            assert!(stderr(&i).contains("if these bytes really are token ids, pass --force"));
        }
    }
    // The token files beside the index files pack, and serve the tokens their readers see.
    let glob_ds = fixture("00000_unshuffled.ds");
    let (c, i) = pack_both(dir.path(), &[s(&glob_ds), "--dtype", "u16"]);
    assert!(c.status.success() && i.status.success(), "{}", stderr(&c));
    assert_eq!(served(&dir.path().join("in-place")), gpt2_tokens(1000));
    let megatron_bin = fixture("megatron_text_document.bin");
    let (c, _) = pack_both(dir.path(), &[s(&megatron_bin), "--dtype", "u16"]);
    assert!(c.status.success(), "{}", stderr(&c));
    assert_eq!(served(&dir.path().join("copy")), gpt2_tokens(1000));
    // A glob that catches the index with the tokens takes the index as the token file's
    // companion: the same dataset, with the index's two documents.
    let (c, i) = pack_both(
        dir.path(),
        &[
            s(&glob_ds),
            s(&fixture("00000_unshuffled.ds.index")),
            "--dtype",
            "u16",
        ],
    );
    assert!(c.status.success() && i.status.success(), "{}", stderr(&c));
    assert_eq!(manifest(&dir.path().join("in-place"))["documents"], 2);
    assert_eq!(served(&dir.path().join("in-place")), gpt2_tokens(1000));
}

#[test]
fn a_file_of_another_token_width_is_refused_naming_the_width() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: Vec<u8>| {
        let p = dir.path().join(name);
        fs::write(&p, bytes).unwrap();
        p
    };
    // 3 M Llama-3 ids (12 MiB: sampled in 16 windows) as u32; as u64; GPT-2 ids as u16.
    let u32s = write("u32.bin", llama3_tokens(3_000_000));
    let u64s = write(
        "u64.bin",
        (0..300_000u64)
            .flat_map(|i| (i * 7919 % 128256).to_le_bytes())
            .collect(),
    );
    let u16s = write("u16.bin", gpt2_tokens(300_000));
    let cases = [
        (
            &u32s,
            "u16",
            "u32",
            "every second value is 0 (or small) in 100.0% of",
        ),
        (&u32s, "uint16", "u32", "the high part of wider tokens"),
        (&u64s, "u32", "u64", "every second value is 0 (or small)"),
        (&u64s, "i32", "i64", "every second value is 0 (or small)"),
        (&u64s, "u16", "u64", "3 of every 4 values are 0 (or small)"),
        (&u16s, "u32", "u16", "beyond any vocabulary (above 524288)"),
        (&u16s, "i64", "u16", "beyond any vocabulary"),
        (&u32s, "u64", "u32", "beyond any vocabulary"),
        (&u32s, "i64", "i32", "beyond any vocabulary"),
    ];
    for (file, declared, like, evidence) in cases {
        let (c, i) = pack_both(dir.path(), &[s(file), "--dtype", declared]);
        for o in [&c, &i] {
            let err = stderr(o);
            assert_eq!(o.status.code(), Some(1), "{declared}: {err}");
            assert!(
                err.contains(&format!(
                    "this looks like {like} tokens; pass --dtype {like}, or --force"
                )),
                "{declared}: {err}"
            );
            assert!(err.contains(evidence), "{declared}: {err}");
        }
        // --force packs it as declared.
        let (c, i) = pack_both(dir.path(), &[s(file), "--dtype", declared, "--force"]);
        assert!(c.status.success() && i.status.success(), "{}", stderr(&c));
    }
    // Real token data at its width passes: GPT-2 u16, Llama-3 u32, character-level u16
    // (vocabulary 65), positional u32 past any vocabulary, a sparse (all zero) 1 TiB file.
    let char_level = write(
        "char.bin",
        (0..1_000_000u64)
            .flat_map(|i| (((i * 31 + i / 7) % 65) as u16).to_le_bytes())
            .collect(),
    );
    let positional = dir.path().join("positional.bin");
    shufflefs::pack::write_positional(&positional, shufflefs::dtype::ScalarType::U32, 3_000_000)
        .unwrap();
    let sparse = dir.path().join("sparse.bin");
    fs::File::create(&sparse).unwrap().set_len(1 << 40).unwrap();
    for (file, dtype) in [
        (&u16s, "u16"),
        (&u32s, "u32"),
        (&u32s, "i32"),
        (&u64s, "u64"),
        (&char_level, "u16"),
        (&positional, "u32"),
    ] {
        let (c, i) = pack_both(dir.path(), &[s(file), "--dtype", dtype]);
        assert!(
            c.status.success() && i.status.success(),
            "{dtype}: {}",
            stderr(&c)
        );
    }
    let o = shufflefs(&[
        "pack",
        s(&dir.path().join("big")),
        s(&sparse),
        "--dtype",
        "u16",
        "--in-place",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn dtype_takes_numpy_spellings() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.bin");
    fs::write(&file, gpt2_tokens(1000)).unwrap();
    for spelling in [
        "u16",
        "uint16",
        "np.uint16",
        "numpy.uint16",
        "<u2",
        "=u2",
        "u2",
    ] {
        let (c, i) = pack_both(dir.path(), &[s(&file), "--dtype", spelling]);
        assert!(c.status.success(), "{spelling}: {}", stderr(&c));
        assert!(i.status.success(), "{spelling}: {}", stderr(&i));
        assert_eq!(
            manifest(&dir.path().join("copy"))["dtype"],
            "<u2",
            "{spelling}"
        );
    }
    for (spelling, descr) in [
        ("|u1", "|u1"),
        ("uint8", "|u1"),
        ("int32", "<i4"),
        ("<i8", "<i8"),
    ] {
        let (c, _) = pack_both(dir.path(), &[s(&file), "--dtype", spelling, "--force"]);
        assert!(c.status.success(), "{spelling}: {}", stderr(&c));
        assert_eq!(
            manifest(&dir.path().join("copy"))["dtype"],
            descr,
            "{spelling}"
        );
    }
    let (c, _) = pack_both(dir.path(), &[s(&file), "--dtype", ">u2"]);
    assert_eq!(c.status.code(), Some(1));
    assert!(
        stderr(&c).contains("--dtype \">u2\" is big-endian")
            && stderr(&c).contains("astype('<u2')"),
        "{}",
        stderr(&c)
    );
}

fn is_table(name: &str) -> bool {
    name.ends_with(".parquet") || name.ends_with(".arrow")
}

#[test]
fn tables_are_converted_by_a_copy_and_refused_in_place() {
    let dir = tempfile::tempdir().unwrap();
    // The same two-row table ([[1, 2, 3], [4, 5]] in an `input_ids` column) as parquet, an
    // Arrow IPC file and a save_to_disk Arrow stream.
    for name in ["table.parquet", "table.arrow", "data-00000-of-00001.arrow"] {
        let (c, i) = pack_both(dir.path(), &[s(&fixture(name)), "--dtype", "u32"]);
        assert!(c.status.success(), "{name}: {}", stderr(&c));
        let m = manifest(&dir.path().join("copy"));
        assert_eq!(m["documents"], 2, "{name}: one document per row");
        let want: Vec<u8> = [1u32, 2, 3, 4, 5]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        assert_eq!(served(&dir.path().join("copy")), want, "{name}");
        assert_eq!(i.status.code(), Some(1), "{name}");
        let err = stderr(&i);
        assert!(
            err.contains("a table of token lists") && err.contains("pack it without --in-place"),
            "{name}: {err}"
        );
    }
}

//! Manifest and index corruption (issue #5): seeded mutations of packed datasets (a u16 token
//! stream, JSON Lines documents with metadata and spans, an in-place dataset). Opening each
//! damaged copy the way `mount` does (`View::open`, `ShuffleFs::new`) must either fail with an
//! error that names the damaged file (the manifest, or the file it points at) and says what to
//! do, or succeed and serve every file of the plan (steps, observations, lookups, info.json)
//! byte-identical under the same fingerprint; a read that touches damaged document data may
//! fail instead (EIO), naming a file of the damaged shard. Asserted: no different bytes, no
//! panic, no error without the file's name, and five refusals through the real binary.
//!
//! Two outcomes are failures as well, closed by format version 3 (FORMAT.md, sections 5 and 6):
//! - `SameSizeContent`: a document file whose content changed but not its size, served as it
//!   reads. The document files' block checksums (`.docsums`, checked on every document-file
//!   read) turn it into `ReadErrors`; the read checks of `Dataset` remain for datasets
//!   without them.
//! - `NewIdentity`: an edit of `dtype` (to another type of the same size) or of `metadata`
//!   that opens under a different fingerprint. `content_hash` covers both since version 3.
//!
//! Each case is one mutation of a pristine copy rebuilt at the same path (so `info.json`, which
//! names the directory, is comparable). `reftest_mutations_are_refused_or_harmless` draws the
//! mutations with proptest: a mutation is a list of choices replayed through `common::Rng`, so
//! a failure shrinks to the simplest failing mutation and prints its choices and what it did;
//! it is then pasted back as a `regression_*` test with the literal edit, like the ones at the
//! end (the damage the harness found before the fix that closed it).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use serde_json::{Value, json};
use shufflefs::Error;
use shufflefs::dtype::ScalarType;
use shufflefs::fs::ShuffleFs;
use shufflefs::pack::{PackOptions, pack, pack_in_place, write_positional};
use shufflefs::view::{Mode, View, ViewConfig};
use tempfile::TempDir;

use crate::common::{
    Rng, corpus_jsonl, is_mounted, proptest_config, read_path, s, scratch_dir, shufflefs,
};

/// The pack id every fixture's file names are rewritten to.
const PACK_ID: &str = "5eed5eed";

/// The kinds of damage run once each through `shufflefs mount`.
const CLI_KINDS: [&str; 5] = [
    "manifest-bytes/bit-flip",
    "manifest-json/number",
    "manifest-json/path",
    "index/truncate",
    "shard/size",
];

/// Words a refusal uses to say what to do.
const ADVICE: &[&str] = &["re-run", "restore", "replace", "re-pack", "raise the"];

/// The bytes every reference file of one plan serves on the pristine dataset.
struct Plan {
    label: &'static str,
    config: ViewConfig,
    /// The plan as `shufflefs mount` flags.
    cli: Vec<String>,
    fingerprint: String,
    files: Vec<(String, Vec<u8>)>,
}

/// One shard's file names, from the pristine manifest.
#[derive(Clone)]
struct ShardFiles {
    bin: String,
    /// ids, index, meta, docs, and the shard's entry count.
    docs: Option<([String; 4], u64)>,
}

/// A pristine packed dataset, and the fixed path where each case rebuilds a copy of it.
struct Fixture {
    label: &'static str,
    _tmp: TempDir,
    work: PathBuf,
    /// Every file of the dataset directory (name, bytes).
    files: Vec<(String, Vec<u8>)>,
    manifest_text: String,
    manifest: Value,
    itemsize: u64,
    shards: Vec<ShardFiles>,
    plans: Vec<Plan>,
    /// Files of `work` the current case wrote.
    written: RefCell<BTreeSet<String>>,
}

impl Fixture {
    /// Reads the packed dataset in `tmp/packed`, moves it to `tmp/work/ds` by copy (the path
    /// every case rebuilds) and records the reference of each plan there.
    fn new(label: &'static str, tmp: TempDir, plans: Vec<(&'static str, ViewConfig)>) -> Self {
        let packed = tmp.path().join("packed");
        let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(&packed)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().into_string().unwrap(),
                    fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        // The pack id is random: replace it with a fixed one, so that every case (a bit flip
        // in a name, say) is the same on every run.
        let mut manifest_text =
            String::from_utf8(fs::read(packed.join("manifest.json")).unwrap()).unwrap();
        if let Some(at) = manifest_text.find("\"shard-") {
            let id = manifest_text[at + 7..at + 15].to_string();
            let (from, to) = (format!("shard-{id}-"), format!("shard-{PACK_ID}-"));
            manifest_text = manifest_text.replace(&from, &to);
            for (name, _) in &mut files {
                *name = name.replace(&from, &to);
            }
            let manifest = files
                .iter_mut()
                .find(|(n, _)| n == "manifest.json")
                .unwrap();
            manifest.1 = manifest_text.clone().into_bytes();
        }
        files.sort();
        fs::create_dir(tmp.path().join("work")).unwrap();
        let work = tmp.path().join("work").canonicalize().unwrap().join("ds");
        let manifest: Value = serde_json::from_str(&manifest_text).unwrap();
        assert_eq!(
            emit(&manifest, &KeyOps::default()),
            manifest_text,
            "the test's JSON writer reproduces pack's manifest byte for byte"
        );
        let shards = manifest["shards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| ShardFiles {
                bin: s["path"].as_str().unwrap().to_string(),
                docs: s.get("docs").map(|d| {
                    let name = |k: &str| d[k].as_str().unwrap().to_string();
                    (
                        [name("ids"), name("index"), name("meta"), name("docs")],
                        d["entries"].as_u64().unwrap(),
                    )
                }),
            })
            .collect();
        let mut fx = Fixture {
            label,
            work,
            files,
            itemsize: manifest["itemsize"].as_u64().unwrap(),
            manifest_text,
            manifest,
            shards,
            plans: Vec::new(),
            written: RefCell::default(),
            _tmp: tmp,
        };
        fx.restore();
        for (label, config) in plans {
            let fs = ShuffleFs::new(View::open(&fx.work, &config).unwrap()).unwrap();
            let files: Vec<(String, Vec<u8>)> = reference_paths(&fs)
                .into_iter()
                .map(|p| {
                    let bytes = read_path(&fs, &p).unwrap_or_else(|e| panic!("{p}: {e}"));
                    (p, bytes)
                })
                .collect();
            fx.plans.push(Plan {
                label,
                cli: cli_flags(&config),
                fingerprint: fs.view().fingerprint().to_string(),
                files,
                config,
            });
        }
        fx
    }

    /// Makes `work` the pristine copy again: builds it the first time, then rewrites only
    /// the files the last case wrote and removes the ones it added.
    fn restore(&self) {
        if !self.work.exists() {
            fs::create_dir(&self.work).unwrap();
            for (name, bytes) in &self.files {
                fs::write(self.work.join(name), bytes).unwrap();
            }
            return;
        }
        for entry in fs::read_dir(&self.work).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            if self.files.iter().all(|(n, _)| *n != name) {
                if entry.file_type().unwrap().is_dir() {
                    fs::remove_dir_all(entry.path()).unwrap();
                } else {
                    fs::remove_file(entry.path()).unwrap();
                }
            }
        }
        for name in self.written.take() {
            fs::write(self.work.join(&name), self.pristine(&name)).unwrap();
        }
    }

    fn pristine(&self, name: &str) -> &[u8] {
        &self
            .files
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no file {name}"))
            .1
    }

    fn has_documents(&self) -> bool {
        self.shards.iter().all(|s| s.docs.is_some())
    }

    /// Whether the shards are files outside the dataset directory (`pack --in-place`).
    fn in_place(&self) -> bool {
        self.manifest["shards"][0]
            .get("in_place_mtime_ns")
            .is_some()
    }

    fn write(&self, name: &str, bytes: &[u8]) {
        fs::write(self.work.join(name), bytes).unwrap();
        self.written.borrow_mut().insert(name.to_string());
    }
}

/// Every file a plan serves: info.json, every step file, every observation file, and lookup
/// files (which depend on the plan alone).
fn reference_paths(fs: &ShuffleFs) -> Vec<String> {
    let plan = fs.view().plan();
    let mut paths = vec!["info.json".to_string()];
    for epoch in 0..plan.epochs() {
        for rank in 0..plan.ranks() {
            for step in 0..plan.steps_per_epoch() {
                for ext in ["npy", "json"] {
                    paths.push(format!("epoch/{epoch}/rank/{rank}/step/{step}.{ext}"));
                }
            }
        }
    }
    for o in 0..plan.n_observations() {
        for ext in ["npy", "json"] {
            paths.push(format!("observation/{o}.{ext}"));
        }
    }
    for o in [0, plan.n_observations() - 1] {
        paths.push(format!("lookup/epoch/0/observation/{o}.json"));
    }
    paths
}

fn cli_flags(c: &ViewConfig) -> Vec<String> {
    let mut flags = vec![
        "--window".to_string(),
        c.window.to_string(),
        "--batch-size".into(),
        c.batch_size.to_string(),
        "--ranks".into(),
        c.ranks.to_string(),
        "--seed".into(),
        c.seed.to_string(),
        "--epochs".into(),
        c.epochs.to_string(),
    ];
    if let Some(s) = c.stride {
        flags.extend(["--stride".to_string(), s.to_string()]);
    }
    if c.mode == Mode::Documents {
        flags.extend(["--mode".to_string(), "documents".into()]);
    }
    if let Some(p) = c.pad_id {
        flags.extend(["--pad-id".to_string(), p.to_string()]);
    }
    flags
}

/// A u16 token stream of positional tokens in 3 shards (1024, 1024 and 952 records).
fn stream_fixture() -> Fixture {
    let tmp = scratch_dir();
    let input = tmp.path().join("tokens.bin");
    write_positional(&input, ScalarType::U16, 3000).unwrap();
    let options = PackOptions {
        dtype: Some(ScalarType::U16),
        shard_size: 2048,
        ..PackOptions::default()
    };
    pack(&tmp.path().join("packed"), &[input], &options).unwrap();
    Fixture::new(
        "stream",
        tmp,
        vec![("stream", ViewConfig::stream(33, 32, 4, 2, 11, 1))],
    )
}

/// JSON Lines documents with document and span metadata, u32 tokens (their stream positions)
/// in shards of 64 records, so documents, spans and entries continue across shards.
fn documents_fixture() -> Fixture {
    let tmp = scratch_dir();
    let (lines, _, _) = corpus_jsonl(48);
    let input = tmp.path().join("docs.jsonl");
    fs::write(&input, lines).unwrap();
    let options = PackOptions {
        dtype: Some(ScalarType::U32),
        shard_size: 64 * 4,
        ..PackOptions::default()
    };
    pack(&tmp.path().join("packed"), &[input], &options).unwrap();
    let documents = ViewConfig {
        mode: Mode::Documents,
        stride: None,
        pad_id: Some(7777),
        ..ViewConfig::stream(6, 6, 2, 2, 5, 1)
    };
    Fixture::new(
        "documents",
        tmp,
        vec![
            ("stream", ViewConfig::stream(9, 8, 2, 2, 3, 1)),
            ("documents", documents),
        ],
    )
}

/// `pack --in-place` over two raw u16 files of equal size and equal mtime, so that swapping
/// their paths in the manifest keeps every size and mtime check satisfied.
fn in_place_fixture() -> Fixture {
    let tmp = scratch_dir();
    let raw = tmp.path().join("raw");
    fs::create_dir(&raw).unwrap();
    let mtime = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    let inputs: Vec<PathBuf> = (0..2u16)
        .map(|k| {
            let path = raw.join(format!("part{k}.bin"));
            let tokens: Vec<u8> = (0..700u16)
                .flat_map(|t| (t * 3 + k).to_le_bytes())
                .collect();
            fs::write(&path, tokens).unwrap();
            fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(mtime)
                .unwrap();
            path
        })
        .collect();
    let options = PackOptions {
        dtype: Some(ScalarType::U16),
        ..PackOptions::default()
    };
    pack_in_place(&tmp.path().join("packed"), &inputs, &options).unwrap();
    Fixture::new(
        "in-place",
        tmp,
        vec![("stream", ViewConfig::stream(17, 16, 4, 2, 2, 1))],
    )
}

// ---------------------------------------------------------------------------------------------
// The manifest as JSON text, written the way pack writes it, with optional key edits.

/// Key-level edits the writer applies: a duplicated key, a shuffled object.
#[derive(Default)]
struct KeyOps {
    /// (object pointer, key): the key is written twice.
    duplicate: Option<(String, String)>,
    /// (object pointer, seed): the object's keys are written in a shuffled order.
    shuffle: Option<(String, u64)>,
}

/// The key order pack writes, per kind of object.
fn key_order(map: &serde_json::Map<String, Value>) -> &'static [&'static str] {
    if map.contains_key("format") {
        &[
            "format",
            "version",
            "dtype",
            "itemsize",
            "records",
            "shards",
            "content_hash",
            "documents",
            "metadata",
            "created_by",
        ]
    } else if map.contains_key("path") {
        &[
            "path",
            "records",
            "bytes",
            "hash",
            "docs",
            "in_place_mtime_ns",
            "in_place_guard",
            "checksums",
            "offset",
            "source_format",
        ]
    } else if map.contains_key("block") {
        &["file", "block", "hash"]
    } else {
        &[
            "ids",
            "index",
            "meta",
            "entries",
            "meta_bytes",
            "docs",
            "documents",
            "hash",
        ]
    }
}

/// Pretty JSON with 2-space indentation and a final newline, keys in pack's order.
fn emit(v: &Value, ops: &KeyOps) -> String {
    let mut out = String::new();
    emit_value(v, "", 0, ops, &mut out);
    out.push('\n');
    out
}

fn emit_value(v: &Value, ptr: &str, depth: usize, ops: &KeyOps, out: &mut String) {
    let pad = |n: usize| "  ".repeat(n);
    match v {
        Value::Object(map) if !map.is_empty() => {
            let order = key_order(map);
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by_key(|k| order.iter().position(|o| o == k).unwrap_or(usize::MAX));
            if let Some((p, seed)) = &ops.shuffle
                && p == ptr
            {
                Rng::new(*seed).shuffle(&mut keys);
            }
            if let Some((p, key)) = &ops.duplicate
                && p == ptr
                && let Some(i) = keys.iter().position(|k| *k == key)
            {
                keys.insert(i + 1, keys[i]);
            }
            out.push_str("{\n");
            for (i, k) in keys.iter().enumerate() {
                out.push_str(&pad(depth + 1));
                out.push_str(&serde_json::to_string(k).unwrap());
                out.push_str(": ");
                emit_value(&map[*k], &format!("{ptr}/{k}"), depth + 1, ops, out);
                out.push_str(if i + 1 < keys.len() { ",\n" } else { "\n" });
            }
            out.push_str(&pad(depth));
            out.push('}');
        }
        Value::Array(items) if !items.is_empty() => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                out.push_str(&pad(depth + 1));
                emit_value(item, &format!("{ptr}/{i}"), depth + 1, ops, out);
                out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
            }
            out.push_str(&pad(depth));
            out.push(']');
        }
        other => out.push_str(&serde_json::to_string(other).unwrap()),
    }
}

/// Pointers to every leaf of `v` for which `want` holds.
fn leaves(v: &Value, ptr: String, want: &dyn Fn(&str, &Value) -> bool, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                leaves(x, format!("{ptr}/{k}"), want, out);
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                leaves(x, format!("{ptr}/{i}"), want, out);
            }
        }
        leaf => {
            if want(&ptr, leaf) {
                out.push(ptr);
            }
        }
    }
}

/// Pointers to every object of `v` (the top level is "").
fn objects(v: &Value, ptr: String, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            out.push(ptr.clone());
            for (k, x) in map {
                objects(x, format!("{ptr}/{k}"), out);
            }
        }
        Value::Array(items) => {
            for (i, x) in items.iter().enumerate() {
                objects(x, format!("{ptr}/{i}"), out);
            }
        }
        _ => {}
    }
}

fn is_file_name_key(ptr: &str) -> bool {
    ["/path", "/ids", "/index", "/meta", "/docs"]
        .iter()
        .any(|k| ptr.ends_with(k))
}

// ---------------------------------------------------------------------------------------------
// Mutations.

/// What a case damaged, for judging the error it gets.
enum Scope {
    /// The manifest (its mutated text): a refusal may name the manifest or any file the
    /// mutated manifest names.
    Manifest(String),
    /// One data or document file (its name): errors must name it (refusal) or a file of the
    /// same shard (a failed read).
    File {
        name: String,
        /// Whether the file kept its size: a change of content that FORMAT.md, section 5,
        /// says `mount` does not detect (only the hashes cover contents, and opening does
        /// not read them).
        same_size: bool,
    },
}

struct Mutation {
    /// Family, for the outcome table.
    kind: &'static str,
    /// The exact change, for failure messages.
    what: String,
    scope: Scope,
}

impl Mutation {
    fn manifest(kind: &'static str, what: String, text: String) -> Mutation {
        Mutation {
            kind,
            what,
            scope: Scope::Manifest(text),
        }
    }
}

/// Applies one mutation to the freshly restored copy in `fx.work`.
fn mutate(fx: &Fixture, rng: &mut Rng) -> Mutation {
    let roll = rng.index(100);
    if fx.has_documents() {
        match roll {
            0..30 => manifest_bytes(fx, rng),
            30..65 => manifest_json(fx, rng),
            65..95 => document_file(fx, rng),
            _ => shard_size(fx, rng),
        }
    } else if fx.in_place() {
        match roll {
            0..40 => manifest_bytes(fx, rng),
            _ => manifest_json(fx, rng),
        }
    } else {
        match roll {
            0..45 => manifest_bytes(fx, rng),
            45..90 => manifest_json(fx, rng),
            _ => shard_size(fx, rng),
        }
    }
}

/// The manifest as bytes: bit flips, inserted and deleted bytes, truncation, extension.
fn manifest_bytes(fx: &Fixture, rng: &mut Rng) -> Mutation {
    let mut b = fx.manifest_text.as_bytes().to_vec();
    let len = b.len();
    let (kind, what) = match rng.index(5) {
        0 => {
            let (i, bit) = (rng.index(len), rng.index(8));
            let old = b[i];
            b[i] ^= 1 << bit;
            (
                "manifest-bytes/bit-flip",
                format!("byte {i} {:?} -> {:?}", old as char, b[i] as char),
            )
        }
        1 => {
            let i = rng.index(len + 1);
            let byte = *rng.pick(&[
                b' ', b'0', b'9', b'"', b',', b'{', b'}', b'[', b']', b'-', b'.', b'e', b'\n',
                b':', 0, 0xff,
            ]);
            b.insert(i, byte);
            (
                "manifest-bytes/insert",
                format!("insert {:?} at {i}", byte as char),
            )
        }
        2 => {
            let i = rng.index(len);
            let n = (1 + rng.index(3)).min(len - i);
            let gone = String::from_utf8_lossy(&b[i..i + n]).into_owned();
            b.drain(i..i + n);
            ("manifest-bytes/delete", format!("delete {gone:?} at {i}"))
        }
        3 => {
            let n = rng.index(len);
            b.truncate(n);
            ("manifest-bytes/truncate", format!("truncate to {n} bytes"))
        }
        _ => {
            let tails: [&[u8]; 8] = [
                b"\n".as_slice(),
                b" \t\r\n",
                b"x",
                b"{}",
                b",",
                b"\0",
                b"\n{\"format\": \"shufflefs-dataset\"}\n",
                b"]",
            ];
            let tail: &[u8] = rng.pick::<&[u8]>(&tails);
            b.extend_from_slice(tail);
            (
                "manifest-bytes/extend",
                format!("append {:?}", String::from_utf8_lossy(tail)),
            )
        }
    };
    fx.write("manifest.json", &b);
    Mutation::manifest(kind, what, String::from_utf8_lossy(&b).into_owned())
}

/// Replacement values for a number `n`.
fn number_variants(n: u64) -> Vec<(String, Value)> {
    let mut v = vec![
        (format!("{n}+1"), json!(n.wrapping_add(1))),
        ("0".to_string(), json!(0)),
        ("u64::MAX".to_string(), json!(u64::MAX)),
        ("-1".to_string(), json!(-1)),
        (format!("-{n}"), json!(-(n as i64))),
        (format!("{n}.5"), json!(n as f64 + 0.5)),
        (format!("{n}.0"), json!(n as f64)),
        (format!("\"{n}\""), json!(n.to_string())),
        ("null".to_string(), Value::Null),
        ("true".to_string(), json!(true)),
        (format!("2*{n}"), json!(n.wrapping_mul(2))),
        (format!("{n}+2^32"), json!(n.wrapping_add(1 << 32))),
        ("2^63".to_string(), json!(1u64 << 63)),
        ("2^32".to_string(), json!(1u64 << 32)),
        (format!("[{n}]"), json!([n])),
    ];
    if n > 0 {
        v.push((format!("{n}-1"), json!(n - 1)));
    }
    v
}

fn manifest_json(fx: &Fixture, rng: &mut Rng) -> Mutation {
    let mut m = fx.manifest.clone();
    let mut ops = KeyOps::default();
    let n_shards = fx.shards.len();
    let (kind, what): (&'static str, String) = match rng.index(100) {
        0..28 => {
            let mut ptrs = Vec::new();
            leaves(&m, String::new(), &|_, v| v.is_number(), &mut ptrs);
            let ptr = rng.pick(&ptrs).clone();
            let n = m.pointer(&ptr).unwrap().as_u64().unwrap();
            let variants = number_variants(n);
            let (label, value) = rng.pick(&variants).clone();
            *m.pointer_mut(&ptr).unwrap() = value;
            ("manifest-json/number", format!("{ptr} = {label}"))
        }
        28..42 => {
            let mut ptrs = Vec::new();
            leaves(
                &m,
                String::new(),
                &|p, v| v.is_string() && !is_file_name_key(p),
                &mut ptrs,
            );
            ptrs.push("/version".into());
            ptrs.push("/metadata".into());
            let ptr = rng.pick(&ptrs).clone();
            let value = string_variant(&m, &ptr, rng);
            let what = format!("{ptr} = {value}");
            match m.pointer_mut(&ptr) {
                Some(slot) => *slot = value,
                None => {
                    // An absent optional key (metadata): add it.
                    let key = ptr.trim_start_matches('/').to_string();
                    m.as_object_mut().unwrap().insert(key, value);
                }
            }
            ("manifest-json/string", what)
        }
        42..58 => {
            let what = path_variant(fx, &mut m, rng);
            ("manifest-json/path", what)
        }
        58..64 => {
            let mut objs = Vec::new();
            objects(&m, String::new(), &mut objs);
            let ptr = rng.pick(&objs).clone();
            let obj = m.pointer_mut(&ptr).unwrap().as_object_mut().unwrap();
            let keys: Vec<String> = obj.keys().cloned().collect();
            let key = rng.pick(&keys).clone();
            obj.remove(&key);
            ("manifest-json/drop-key", format!("remove {ptr}/{key}"))
        }
        64..67 => {
            let mut objs = Vec::new();
            objects(&m, String::new(), &mut objs);
            let ptr = rng.pick(&objs).clone();
            let obj = m.pointer_mut(&ptr).unwrap().as_object_mut().unwrap();
            obj.insert("comment".into(), json!("added"));
            ("manifest-json/unknown-key", format!("add {ptr}/comment"))
        }
        67..71 => {
            let mut objs = Vec::new();
            objects(&m, String::new(), &mut objs);
            let ptr = rng.pick(&objs).clone();
            let keys: Vec<String> = m
                .pointer(&ptr)
                .unwrap()
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            let key = rng.pick(&keys).clone();
            let what = format!("duplicate {ptr}/{key}");
            ops.duplicate = Some((ptr, key));
            ("manifest-json/duplicate-key", what)
        }
        71..75 => {
            let mut objs = Vec::new();
            objects(&m, String::new(), &mut objs);
            let ptr = rng.pick(&objs).clone();
            let seed = rng.next();
            let what = format!("shuffle the keys of {ptr:?} (seed {seed:#x})");
            ops.shuffle = Some((ptr, seed));
            ("manifest-json/reorder-keys", what)
        }
        75..85 => {
            let shards = m["shards"].as_array_mut().unwrap();
            let (i, j) = (rng.index(n_shards), rng.index(n_shards));
            let what = match rng.index(6) {
                0 if i != j => {
                    shards.swap(i, j);
                    format!("swap shards {i} and {j}")
                }
                1 => {
                    let copy = shards[i].clone();
                    shards.insert(j, copy);
                    format!("copy shard {i} to position {j}")
                }
                2 => {
                    shards.remove(i);
                    format!("remove shard {i}")
                }
                3 => {
                    shards.reverse();
                    "reverse the shards".to_string()
                }
                4 => {
                    shards.clear();
                    "empty the shard list".to_string()
                }
                _ => {
                    let s = shards.remove(i);
                    shards.push(s);
                    format!("move shard {i} to the end")
                }
            };
            ("manifest-json/shards", what)
        }
        85..93 => {
            let (i, j) = (rng.index(n_shards), (rng.index(n_shards - 1) + 1));
            let j = (i + j) % n_shards;
            let mut fields = vec!["path", "records", "bytes", "hash"];
            if fx.has_documents() {
                fields.extend([
                    "docs",
                    "docs/ids",
                    "docs/index",
                    "docs/meta",
                    "docs/docs",
                    "docs/entries",
                    "docs/meta_bytes",
                    "docs/documents",
                    "docs/hash",
                ]);
            }
            let field = *rng.pick(&fields);
            let (a, b) = (
                format!("/shards/{i}/{field}"),
                format!("/shards/{j}/{field}"),
            );
            let va = m.pointer(&a).unwrap().clone();
            let vb = std::mem::replace(m.pointer_mut(&b).unwrap(), va);
            *m.pointer_mut(&a).unwrap() = vb;
            ("manifest-json/swap-field", format!("swap {a} and {b}"))
        }
        93..97 => {
            let what = match rng.index(4) {
                0 => {
                    let top = m.as_object_mut().unwrap();
                    let was = top
                        .get("metadata")
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    top.insert("metadata".into(), json!(!was));
                    format!("metadata = {}", !was)
                }
                1 => {
                    m.as_object_mut().unwrap().remove("documents");
                    "remove documents".to_string()
                }
                2 => {
                    m["documents"] = Value::Null;
                    "documents = null".to_string()
                }
                _ => {
                    let i = rng.index(n_shards);
                    m["shards"][i]["docs"] = Value::Null;
                    format!("shards[{i}].docs = null")
                }
            };
            ("manifest-json/documents", what)
        }
        _ => {
            let what = in_place_variant(fx, &mut m, rng);
            ("manifest-json/in-place", what)
        }
    };
    let text = emit(&m, &ops);
    fx.write("manifest.json", text.as_bytes());
    Mutation::manifest(kind, what, text)
}

fn string_variant(m: &Value, ptr: &str, rng: &mut Rng) -> Value {
    let current = m.pointer(ptr).cloned().unwrap_or(Value::Null);
    match ptr {
        "/format" => json!(rng.pick(&[
            "shufflefs-datasets",
            "",
            "SHUFFLEFS-DATASET",
            "shufflefs-dataset ",
        ])),
        "/version" => rng
            .pick(&[
                json!("2"),
                json!(1),
                json!(3),
                json!(2.0),
                json!(-2),
                json!(u64::MAX),
            ])
            .clone(),
        "/metadata" => rng
            .pick(&[
                json!("true"),
                json!(1),
                json!(false),
                json!(true),
                json!(null),
            ])
            .clone(),
        "/created_by" => json!(rng.pick(&["", "someone else", "shufflefs 9.9.9"])),
        "/dtype" => {
            let common = [
                "<u2",
                "<i2",
                "<f2",
                "|u1",
                "<u4",
                "<i4",
                "<f4",
                "<u8",
                "=u2",
                ">u2",
                "u2",
                "'<u2'",
                "<U2",
                "|b1",
                "<c8",
                "",
                "<u2 ",
                "[('token', '<u2')]",
                "[('token', '<u4')]",
                "[('a', '|u1'), ('b', '|u1')]",
                "[('a', '<u2'), ('b', '<u2')]",
                "[('a', '<u2'), ('a', '<u2')]",
                "[('token','<u2')]",
            ];
            json!(rng.pick(&common))
        }
        _ => {
            // A hash.
            let h = current.as_str().unwrap_or("").to_string();
            let mut other = Vec::new();
            leaves(
                m,
                String::new(),
                &|p, _| p.ends_with("hash") && p != ptr,
                &mut other,
            );
            match rng.index(7) {
                0 if !h.is_empty() => {
                    let mut c: Vec<char> = h.chars().collect();
                    let i = rng.index(c.len());
                    let digits: Vec<char> =
                        "0123456789abcdef".chars().filter(|&d| d != c[i]).collect();
                    c[i] = *rng.pick(&digits);
                    json!(c.into_iter().collect::<String>())
                }
                1 => json!(h.to_uppercase()),
                2 => json!(h.get(..h.len().saturating_sub(1)).unwrap_or("")),
                3 => json!(format!("{h}0")),
                4 if !other.is_empty() => m.pointer(rng.pick(&other).as_str()).unwrap().clone(),
                5 => json!("0000000000000000"),
                _ => json!(rng.pick(&["", "gggggggggggggggg", " 0000000000000000"])),
            }
        }
    }
}

/// Points a file name of the manifest somewhere else: outside the directory, at another
/// listed file, at a symbolic link, a hard link, a directory, a FIFO, a missing file.
fn path_variant(fx: &Fixture, m: &mut Value, rng: &mut Rng) -> String {
    let mut ptrs = Vec::new();
    leaves(m, String::new(), &|p, _| is_file_name_key(p), &mut ptrs);
    let ptr = rng.pick(&ptrs).clone();
    let name = m.pointer(&ptr).unwrap().as_str().unwrap().to_string();
    let base = Path::new(&name)
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let target = fx.work.join(&name);
    let other = m.pointer(rng.pick(&ptrs).as_str()).unwrap().clone();
    let (label, value) = match rng.index(16) {
        0 => ("..", json!("..")),
        1 => ("../NAME", json!(format!("../{base}"))),
        2 => ("absolute", json!(target.to_str().unwrap())),
        3 => ("empty", json!("")),
        4 => (".", json!(".")),
        5 => ("a/NAME", json!(format!("a/{base}"))),
        6 => ("manifest.json", json!("manifest.json")),
        7 => ("./NAME", json!(format!("./{base}"))),
        8 => ("NAME/", json!(format!("{base}/"))),
        9 => ("missing", json!(format!("{base}.missing"))),
        10 => ("another listed file", other),
        11 => {
            std::os::unix::fs::symlink(&target, fx.work.join("link")).unwrap();
            ("symlink to it", json!("link"))
        }
        12 => {
            // A hard link is the file itself under another name: harmless.
            if target.is_file() && !fx.in_place() {
                fs::hard_link(&target, fx.work.join("hard")).unwrap();
            }
            ("hard link to it", json!("hard"))
        }
        13 => {
            fs::create_dir(fx.work.join("sub")).unwrap();
            ("a directory", json!("sub"))
        }
        14 => {
            nix::unistd::mkfifo(
                &fx.work.join("fifo"),
                nix::sys::stat::Mode::from_bits_truncate(0o644),
            )
            .unwrap();
            ("a FIFO", json!("fifo"))
        }
        _ => ("/dev/zero", json!("/dev/zero")),
    };
    let what = format!("{ptr} = {value} ({label})");
    *m.pointer_mut(&ptr).unwrap() = value;
    what
}

/// Adds, removes or edits `in_place_mtime_ns` and absolute paths.
fn in_place_variant(fx: &Fixture, m: &mut Value, rng: &mut Rng) -> String {
    let i = rng.index(fx.shards.len());
    let shard = m["shards"][i].as_object_mut().unwrap();
    let path = shard["path"].as_str().unwrap().to_string();
    let file = fx.work.join(&path);
    let mtime = fs::metadata(&file)
        .map(|meta| shufflefs::dataset::mtime_ns(&meta))
        .unwrap_or(0);
    match (shard.contains_key("in_place_mtime_ns"), rng.index(3)) {
        (false, 0) => {
            shard.insert("path".into(), json!(file.to_str().unwrap()));
            shard.insert("in_place_mtime_ns".into(), json!(mtime));
            format!("shards[{i}]: absolute path and its true mtime")
        }
        (false, 1) => {
            shard.insert("in_place_mtime_ns".into(), json!(mtime));
            format!("shards[{i}]: relative path with in_place_mtime_ns")
        }
        (false, _) => {
            shard.insert("path".into(), json!(file.to_str().unwrap()));
            shard.insert("in_place_mtime_ns".into(), json!(mtime + 1));
            format!("shards[{i}]: absolute path and a wrong mtime")
        }
        (true, 0) => {
            shard.remove("in_place_mtime_ns");
            format!("shards[{i}]: remove in_place_mtime_ns")
        }
        (true, 1) => {
            let t = shard["in_place_mtime_ns"].as_u64().unwrap();
            shard.insert("in_place_mtime_ns".into(), json!(t + 1));
            format!("shards[{i}]: in_place_mtime_ns + 1")
        }
        (true, _) => {
            let other = fx._tmp.path().join("raw").join("elsewhere.bin");
            fs::copy(&path, &other).unwrap();
            let t = fs::metadata(&path)
                .map(|meta| shufflefs::dataset::mtime_ns(&meta))
                .unwrap();
            fs::File::options()
                .write(true)
                .open(&other)
                .unwrap()
                .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(t))
                .unwrap();
            shard.insert("path".into(), json!(other.to_str().unwrap()));
            format!("shards[{i}]: path to a copy with the same size and mtime")
        }
    }
}

/// A document file: bit flips, truncation, extension, swapped records, edited fields, a
/// sibling shard's file, emptied.
fn document_file(fx: &Fixture, rng: &mut Rng) -> Mutation {
    let k = rng.index(fx.shards.len());
    let (names, entries) = fx.shards[k].docs.clone().unwrap();
    let which = rng.index(4);
    let name = names[which].clone();
    let mut b = fx.pristine(&name).to_vec();
    let record = [4usize, 8, 8, 24][which];
    let mut op = rng.index(100);
    if b.is_empty() && op < 70 {
        op = 75; // nothing to flip or edit: extend instead
    }
    let (kind, what): (&'static str, String) = match op {
        0..35 => {
            let (i, bit) = (rng.index(b.len()), rng.index(8));
            b[i] ^= 1 << bit;
            ("index/bit-flip", format!("flip bit {bit} of byte {i}"))
        }
        35..47 => {
            let n = b.len() - 1 - rng.index(b.len().min(record * 2));
            b.truncate(n);
            ("index/truncate", format!("truncate to {n} bytes"))
        }
        47..55 if b.len() >= 2 * record => {
            let n = b.len() / record;
            let (i, j) = (rng.index(n), rng.index(n));
            for x in 0..record {
                b.swap(i * record + x, j * record + x);
            }
            ("index/swap-records", format!("swap records {i} and {j}"))
        }
        47..70 => {
            let what = edit_field(&mut b, which, entries, rng);
            ("index/edit-field", what)
        }
        70..82 => {
            let n = 1 + rng.index(2 * record);
            let fill = if rng.index(2) == 0 {
                0
            } else {
                rng.next() as u8
            };
            b.extend(std::iter::repeat_n(fill, n));
            ("index/extend", format!("append {n} bytes of {fill:#x}"))
        }
        82..94 => {
            let j = (k + 1 + rng.index(fx.shards.len() - 1)) % fx.shards.len();
            let sibling = fx.shards[j].docs.as_ref().unwrap().0[which].clone();
            b = fx.pristine(&sibling).to_vec();
            ("index/sibling", format!("replaced by {sibling}"))
        }
        _ => {
            b.clear();
            ("index/empty", "emptied".to_string())
        }
    };
    fx.write(&name, &b);
    Mutation {
        kind,
        what: format!("{name}: {what}"),
        scope: Scope::File {
            same_size: b.len() == fx.pristine(&name).len(),
            name,
        },
    }
}

/// Edits one field of a document file to a plausible wrong value.
fn edit_field(b: &mut [u8], which: usize, entries: u64, rng: &mut Rng) -> String {
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    match which {
        0 => {
            let n = b.len() / 4;
            let i = rng.index(n);
            let old = u32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap());
            let new = if entries > 1 && rng.index(4) != 0 {
                // Another id in range: the hardest case.
                ((u64::from(old) + 1 + rng.index(entries as usize - 1) as u64) % entries) as u32
            } else {
                entries as u32
            };
            b[i * 4..i * 4 + 4].copy_from_slice(&new.to_le_bytes());
            format!("id of record {i}: {old} -> {new}")
        }
        1 => {
            let n = b.len() / 8;
            let i = rng.index(n);
            let old = u64_at(b, i * 8);
            let delta = *rng.pick(&[1i64, -1, 8, -8, 16, -16, 17]);
            let new = old.wrapping_add_signed(delta);
            b[i * 8..i * 8 + 8].copy_from_slice(&new.to_le_bytes());
            format!("offset {i}: {old} -> {new}")
        }
        2 => {
            // .meta: a byte of an entry's header or text, changed to a similar byte.
            let i = rng.index(b.len());
            let old = b[i];
            let new = match old {
                b'0'..=b'9' => b'0' + (old - b'0' + 1 + rng.index(9) as u8) % 10,
                b'a'..=b'z' => b'a' + (old - b'a' + 1 + rng.index(25) as u8) % 26,
                0 => 1,
                _ => old.wrapping_add(1),
            };
            b[i] = new;
            format!("byte {i}: {:?} -> {:?}", old as char, new as char)
        }
        _ => {
            let n = b.len() / 24;
            let (r, f) = (rng.index(n), rng.index(3));
            let at = r * 24 + f * 8;
            let old = u64_at(b, at);
            let new = match rng.index(4) {
                0 => old.wrapping_add(1),
                1 => old.wrapping_sub(1),
                2 => 0,
                _ => u64::MAX,
            };
            b[at..at + 8].copy_from_slice(&new.to_le_bytes());
            let field = ["start", "len", "entry"][f];
            format!("document record {r} {field}: {old} -> {new}")
        }
    }
}

/// A shard file one byte or one record shorter or longer, or empty.
fn shard_size(fx: &Fixture, rng: &mut Rng) -> Mutation {
    let k = rng.index(fx.shards.len());
    let name = fx.shards[k].bin.clone();
    let mut b = fx.pristine(&name).to_vec();
    let item = fx.itemsize as usize;
    let what = match rng.index(6) {
        0 => {
            b.pop();
            "one byte shorter".to_string()
        }
        1 => {
            b.truncate(b.len() - item);
            "one record shorter".to_string()
        }
        2 => {
            b.clear();
            "emptied".to_string()
        }
        3 => {
            b.push(0);
            "one byte longer".to_string()
        }
        4 => {
            b.extend(std::iter::repeat_n(0xab, item));
            "one record longer".to_string()
        }
        _ => {
            b.extend(std::iter::repeat_n(0, 4096));
            "4096 bytes longer".to_string()
        }
    };
    fx.write(&name, &b);
    Mutation {
        kind: "shard/size",
        what: format!("{name}: {what}"),
        scope: Scope::File {
            name,
            same_size: false,
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Judging a case.

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    /// Opened; every reference file identical, same fingerprint.
    Harmless,
    /// Opened, same fingerprint; some reads failed with an error naming the damaged shard's
    /// file, every other file identical.
    ReadErrors,
    /// Refused at open with an error naming the file.
    Refused,
    /// Opened under a different fingerprint.
    NewIdentity,
    /// Opened, same fingerprint, different bytes, after a change of a file's content that
    /// kept its size: what FORMAT.md, section 5, says `mount` does not detect.
    SameSizeContent,
    /// An error that names no file, or the wrong one.
    BadMessage,
    /// Opened, same fingerprint, different bytes.
    WrongBytes,
    Panic,
}

const OUTCOMES: [Outcome; 8] = [
    Outcome::Refused,
    Outcome::Harmless,
    Outcome::ReadErrors,
    Outcome::NewIdentity,
    Outcome::SameSizeContent,
    Outcome::BadMessage,
    Outcome::WrongBytes,
    Outcome::Panic,
];

fn error_path(e: &Error) -> Option<&Path> {
    match e {
        Error::Dataset { path, .. } | Error::ShortRead { path, .. } | Error::Io { path, .. } => {
            Some(path)
        }
        _ => None,
    }
}

/// Whether a refusal names the damaged file (or, for a manifest edit, the manifest or a file
/// the edited manifest names).
fn refusal_names_file(e: &Error, fx: &Fixture, scope: &Scope) -> bool {
    let Some(path) = error_path(e) else {
        return false;
    };
    let name = path
        .file_name()
        .and_then(OsStr::to_str)
        .unwrap_or_default()
        .to_string();
    let named = match scope {
        Scope::Manifest(text) => {
            path == fx.work.join("manifest.json") || (!name.is_empty() && text.contains(&name))
        }
        Scope::File { name: damaged, .. } => path == fx.work.join(damaged),
    };
    named && e.to_string().contains(&path.display().to_string())
}

/// Whether a failed read is a data error (EIO) naming a file of the damaged shard (or of the
/// dataset, for a manifest edit).
fn read_error_names_file(e: &Error, fx: &Fixture, scope: &Scope) -> bool {
    let Some(path) = error_path(e) else {
        return false;
    };
    if e.errno() != libc::EIO {
        return false;
    }
    match scope {
        Scope::Manifest(_) => path.starts_with(&fx.work) || path.is_absolute(),
        Scope::File { name, .. } => {
            let stem = Path::new(name).file_stem().unwrap().to_str().unwrap();
            e.to_string()
                .contains(&format!("{}/{stem}.", fx.work.display()))
        }
    }
}

/// Opens the damaged copy with every plan, as `mount` does, and compares what it serves.
fn judge(fx: &Fixture, m: &Mutation, notes: &mut Notes) -> (Outcome, String) {
    let mut worst = (Outcome::Harmless, String::new());
    let mut raise = |o: Outcome, detail: String| {
        if o > worst.0 {
            worst = (o, detail);
        }
    };
    for plan in &fx.plans {
        let opened = View::open(&fx.work, &plan.config).and_then(ShuffleFs::new);
        let fs = match opened {
            Err(Error::InvalidInput(msg)) if matches!(m.scope, Scope::Manifest(_)) => {
                // The edit was accepted as another dataset, which this plan does not fit
                // (a --pad-id outside a new dtype, say).
                raise(
                    Outcome::NewIdentity,
                    format!("{}: plan refused for the edited dataset: {msg}", plan.label),
                );
                continue;
            }
            Err(e) => {
                let msg = e.to_string();
                if !ADVICE.iter().any(|a| msg.contains(a)) {
                    notes.no_advice.insert(generalize(&msg, &fx.work));
                }
                if refusal_names_file(&e, fx, &m.scope) {
                    raise(Outcome::Refused, format!("{}: {msg}", plan.label));
                } else {
                    raise(
                        Outcome::BadMessage,
                        format!("{}: refused without naming the file: {msg}", plan.label),
                    );
                }
                continue;
            }
            Ok(fs) => fs,
        };
        if fs.view().fingerprint() != plan.fingerprint {
            raise(
                Outcome::NewIdentity,
                format!(
                    "{}: accepted with fingerprint {} instead of {}",
                    plan.label,
                    fs.view().fingerprint(),
                    plan.fingerprint
                ),
            );
            continue;
        }
        let (mut failed, mut differ, mut bad) = (0usize, Vec::new(), Vec::new());
        for (path, want) in &plan.files {
            match read_path(&fs, path) {
                Ok(bytes) if bytes == *want || same_but_sources(&bytes, want) => {}
                Ok(_) => differ.push(path.clone()),
                Err(e) if read_error_names_file(&e, fx, &m.scope) => {
                    failed += 1;
                    notes
                        .read_errors
                        .insert(generalize(&e.to_string(), &fx.work));
                }
                Err(e) => bad.push(format!("{path}: {e}")),
            }
        }
        let same_size = matches!(
            m.scope,
            Scope::File {
                same_size: true,
                ..
            }
        );
        if !differ.is_empty() {
            raise(
                if same_size {
                    Outcome::SameSizeContent
                } else {
                    Outcome::WrongBytes
                },
                format!(
                    "{}: {} file(s) differ under the same fingerprint, first {}",
                    plan.label,
                    differ.len(),
                    differ[0]
                ),
            );
        } else if !bad.is_empty() {
            raise(
                Outcome::BadMessage,
                format!(
                    "{}: read error names no damaged file: {}",
                    plan.label, bad[0]
                ),
            );
        } else if failed > 0 {
            raise(
                Outcome::ReadErrors,
                format!("{}: {failed} read(s) failed", plan.label),
            );
        }
    }
    worst
}

/// Messages with the directory and numbers replaced, so that alike messages count once.
fn generalize(msg: &str, work: &Path) -> String {
    let msg = msg.replace(&work.display().to_string(), "DIR");
    let mut out = String::new();
    let mut digits = false;
    for c in msg.chars() {
        if c.is_ascii_digit() {
            if !digits {
                out.push('N');
            }
            digits = true;
        } else {
            digits = false;
            out.push(c);
        }
    }
    out
}

#[derive(Default)]
struct Notes {
    no_advice: BTreeSet<String>,
    read_errors: BTreeSet<String>,
}

/// `shufflefs mount` on the damaged copy: non-zero exit, the file named on stderr, no mount.
fn cli_refuses(fx: &Fixture, plan: &Plan, file: &str) -> Result<(), String> {
    let mountpoint = tempfile::tempdir().unwrap();
    let mut args = vec!["mount", s(&fx.work), s(mountpoint.path())];
    args.extend(plan.cli.iter().map(String::as_str));
    let out = shufflefs(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mp = mountpoint.path().display().to_string();
    if out.status.success() {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(mountpoint.path())
            .status();
        return Err(format!(
            "mount succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    if !stderr.contains(file) {
        return Err(format!("stderr does not name {file}: {stderr}"));
    }
    if is_mounted(mountpoint.path()) || mountinfo.contains(&mp) {
        return Err(format!("{mp} is in /proc/self/mountinfo"));
    }
    Ok(())
}

/// What the cases of one fixture came to.
#[derive(Default)]
struct Tally {
    /// (fixture, kind) -> outcome -> count
    table: BTreeMap<(&'static str, &'static str), BTreeMap<Outcome, usize>>,
    examples: BTreeMap<(Outcome, &'static str), Vec<String>>,
    notes: Notes,
    cli_kinds: BTreeSet<&'static str>,
    total: usize,
}

/// Whether an outcome is a failure: different bytes (under the same fingerprint, or after a
/// same-size content change), an error that names no file, a new identity, a panic.
fn is_failure(outcome: Outcome) -> bool {
    !matches!(
        outcome,
        Outcome::Refused | Outcome::Harmless | Outcome::ReadErrors
    )
}

/// One case: `mutation` applied to a pristine copy, judged, tallied; a few refusals are also
/// run through the real binary (one per kind of damage in [`CLI_KINDS`]).
fn case(
    fx: &Fixture,
    mutation: impl FnOnce(&Fixture) -> Mutation,
    tally: &mut Tally,
) -> Result<Outcome, String> {
    fx.restore();
    let m = mutation(fx);
    let (outcome, detail) = judge(fx, &m, &mut tally.notes);
    tally.total += 1;
    *tally
        .table
        .entry((fx.label, m.kind))
        .or_default()
        .entry(outcome)
        .or_default() += 1;
    let ex = tally.examples.entry((outcome, m.kind)).or_default();
    if ex.len() < 3 {
        ex.push(format!("{}: {} => {detail}", fx.label, m.what));
    }
    if is_failure(outcome) {
        return Err(format!(
            "{} [{}] {}: {outcome:?}: {detail}",
            fx.label, m.kind, m.what
        ));
    }
    if outcome == Outcome::Refused
        && CLI_KINDS.contains(&m.kind)
        && !tally.cli_kinds.contains(m.kind)
    {
        let plan = &fx.plans[0];
        let err = View::open(&fx.work, &plan.config).unwrap_err();
        let file = error_path(&err)
            .and_then(Path::file_name)
            .and_then(OsStr::to_str)
            .unwrap()
            .to_string();
        cli_refuses(fx, plan, &file)
            .map_err(|e| format!("{} [{}] {}: CLI: {e}", fx.label, m.kind, m.what))?;
        tally.cli_kinds.insert(m.kind);
    }
    Ok(outcome)
}

/// The outcome table, with examples of everything that was neither refused nor harmless.
fn report(tally: &Tally) -> (String, BTreeMap<Outcome, usize>) {
    let mut totals: BTreeMap<Outcome, usize> = BTreeMap::new();
    let mut report = String::new();
    let _ = writeln!(
        report,
        "{:<10} {:<30} {}",
        "dataset",
        "mutation",
        OUTCOMES
            .iter()
            .map(|o| format!("{:>16}", format!("{o:?}")))
            .collect::<String>()
    );
    for ((label, kind), counts) in &tally.table {
        let _ = write!(report, "{label:<10} {kind:<30} ");
        for o in OUTCOMES {
            let n = counts.get(&o).copied().unwrap_or(0);
            *totals.entry(o).or_default() += n;
            let _ = write!(report, "{n:>16}");
        }
        report.push('\n');
    }
    let _ = write!(
        report,
        "{:<10} {:<30} ",
        "all",
        format!("{} cases", tally.total)
    );
    for o in OUTCOMES {
        let _ = write!(report, "{:>16}", totals.get(&o).copied().unwrap_or(0));
    }
    report.push('\n');
    for ((outcome, kind), ex) in &tally.examples {
        if *outcome != Outcome::Refused && *outcome != Outcome::Harmless {
            for e in ex {
                let _ = writeln!(report, "  {outcome:?} [{kind}] {e}");
            }
        }
    }
    for m in &tally.notes.no_advice {
        let _ = writeln!(report, "  refusal without advice: {m}");
    }
    for m in &tally.notes.read_errors {
        let _ = writeln!(report, "  read error: {m}");
    }
    (report, totals)
}

/// Random mutations of the three fixtures (700, 2,000 and 300 cases): each is refused naming
/// the file and saying what to do, or harmless, or fails only reads of the damaged shard with
/// EIO; never different bytes, a new identity, an error without the file's name, or a panic.
/// A mutation is chosen by a list of numbers (`Rng::replay`), so a failure shrinks to the
/// simplest mutation that fails, printed with its choices.
#[test]
fn reftest_mutations_are_refused_or_harmless() {
    let started = Instant::now();
    let fixtures = [
        (stream_fixture(), 700),
        (documents_fixture(), 2000),
        (in_place_fixture(), 300),
    ];
    eprintln!(
        "corruption: fixtures packed and referenced in {:.1?}",
        started.elapsed()
    );
    let tally = RefCell::new(Tally::default());
    let choices = prop::collection::vec(any::<u64>(), 0..=12);
    for (fx, cases) in &fixtures {
        let result = TestRunner::new(proptest_config(*cases)).run(&choices, |choices| {
            let mut rng = Rng::replay(choices);
            let outcome = case(fx, |fx| mutate(fx, &mut rng), &mut tally.borrow_mut());
            outcome.map(|_| ()).map_err(TestCaseError::fail)
        });
        if let Err(e) = result {
            eprintln!("{}", report(&tally.borrow()).0);
            panic!("{}: {e}", fx.label);
        }
    }
    let tally = tally.into_inner();
    let (report, totals) = report(&tally);
    eprintln!(
        "{report}corruption: {} cases, CLI checked for {:?}, in {:.1?}",
        tally.total,
        tally.cli_kinds,
        started.elapsed()
    );
    let count = |o| totals.get(&o).copied().unwrap_or(0);
    assert!(tally.total >= 3000, "{} cases", tally.total);
    assert_eq!(
        tally.cli_kinds.len(),
        5,
        "five refusals run through the CLI"
    );
    // Every kind of answer occurs, and none of the failures.
    assert!(count(Outcome::Refused) > 0, "refused");
    assert!(count(Outcome::Harmless) > 0, "harmless");
    assert!(count(Outcome::ReadErrors) > 0, "reads failing with EIO");
    for o in OUTCOMES.into_iter().filter(|&o| is_failure(o)) {
        assert_eq!(count(o), 0, "{o:?}");
    }
    assert!(
        tally.notes.no_advice.is_empty(),
        "refusals that do not say what to do: {:#?}",
        tally.notes.no_advice
    );
}

// ---------------------------------------------------------------------------------------------
// Regressions: damage the harness found served (or hanging) before the fix named.

/// The manifest edited as JSON by `edit`, written the way pack writes it.
fn edit_manifest(
    kind: &'static str,
    what: &str,
    edit: impl FnOnce(&Fixture, &mut Value),
) -> impl FnOnce(&Fixture) -> Mutation {
    move |fx| {
        let mut m = fx.manifest.clone();
        edit(fx, &mut m);
        let text = emit(&m, &KeyOps::default());
        fx.write("manifest.json", text.as_bytes());
        Mutation::manifest(kind, what.to_string(), text)
    }
}

/// Whether two `S.json` files differ only in `files`: the provenance names shard files as
/// the manifest lists them, which the fingerprint (content, not names) does not cover
/// (docs/SEMANTICS.md section 7).
fn same_but_sources(a: &[u8], b: &[u8]) -> bool {
    let strip = |bytes: &[u8]| {
        let mut v: serde_json::Value = serde_json::from_slice(bytes).ok()?;
        v.as_object_mut()?.remove("files")?;
        Some(v)
    };
    matches!((strip(a), strip(b)), (Some(x), Some(y)) if x == y)
}

/// A file of the dataset edited by `edit`.
fn edit_file(
    name: impl Fn(&Fixture) -> String,
    edit: impl FnOnce(&mut Vec<u8>),
) -> impl FnOnce(&Fixture) -> Mutation {
    move |fx| {
        let name = name(fx);
        let mut b = fx.pristine(&name).to_vec();
        edit(&mut b);
        fx.write(&name, &b);
        Mutation {
            kind: "index/edit-field",
            what: format!("{name} edited"),
            scope: Scope::File {
                same_size: b.len() == fx.pristine(&name).len(),
                name,
            },
        }
    }
}

fn expect(fx: &Fixture, mutation: impl FnOnce(&Fixture) -> Mutation, want: Outcome) {
    let mut tally = Tally::default();
    let got = case(fx, mutation, &mut tally).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(got, want, "{}", report(&tally).0);
    assert!(
        tally.notes.no_advice.is_empty(),
        "{:?}",
        tally.notes.no_advice
    );
}

/// A shard path naming a FIFO hung `mount` (open(2) waited for a writer): refused at once.
#[test]
fn regression_a_fifo_listed_as_a_shard_is_refused() {
    let fx = stream_fixture();
    let edit = edit_manifest("manifest-json/path", "/shards/1/path = fifo", |fx, m| {
        nix::unistd::mkfifo(
            &fx.work.join("fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        m["shards"][1]["path"] = json!("fifo");
    });
    expect(&fx, edit, Outcome::Refused);
}

/// Shard paths swapped, or a shard path naming another listed file of the same size, served
/// the other file's bytes under the same fingerprint (content_hash covers no name).
#[test]
fn regression_swapped_or_borrowed_file_names_are_refused() {
    let fx = stream_fixture();
    let swap = edit_manifest(
        "manifest-json/swap-field",
        "swap shard paths 0 and 1",
        |_, m| {
            let a = m["shards"][0]["path"].clone();
            m["shards"][0]["path"] = m["shards"][1]["path"].clone();
            m["shards"][1]["path"] = a;
        },
    );
    expect(&fx, swap, Outcome::Refused);
    let fx = documents_fixture();
    let ids = edit_manifest(
        "manifest-json/swap-field",
        "swap docs/ids of shards 0 and 2",
        |_, m| {
            let a = m["shards"][0]["docs"]["ids"].clone();
            m["shards"][0]["docs"]["ids"] = m["shards"][2]["docs"]["ids"].clone();
            m["shards"][2]["docs"]["ids"] = a;
        },
    );
    expect(&fx, ids, Outcome::Refused);
    let borrowed = edit_manifest(
        "manifest-json/path",
        "/shards/0/path = its .ids file",
        |_, m| {
            m["shards"][0]["path"] = m["shards"][0]["docs"]["ids"].clone();
        },
    );
    expect(&fx, borrowed, Outcome::Refused);
}

/// The paths of two in-place shards of equal size and mtime swapped served each other's bytes
/// under the same fingerprint; a copy of a shard (same content) is the shard.
#[test]
fn regression_swapped_in_place_shards_are_refused() {
    let fx = in_place_fixture();
    let swap = edit_manifest(
        "manifest-json/swap-field",
        "swap in-place paths 0 and 1",
        |_, m| {
            let a = m["shards"][0]["path"].clone();
            m["shards"][0]["path"] = m["shards"][1]["path"].clone();
            m["shards"][1]["path"] = a;
        },
    );
    expect(&fx, swap, Outcome::Refused);
    let copy = edit_manifest("manifest-json/in-place", "shard 0 at a copy", |fx, m| {
        let path = fx.work.join(m["shards"][0]["path"].as_str().unwrap());
        let other = fx._tmp.path().join("raw").join("copy.bin");
        fs::copy(&path, &other).unwrap();
        m["shards"][0]["path"] = json!(other.to_str().unwrap());
    });
    expect(&fx, copy, Outcome::Harmless);
}

/// An edit of `dtype` (to another type of the same size) or of `metadata` opened under a new
/// fingerprint before format version 3: content_hash covers both.
#[test]
fn regression_dtype_and_metadata_edits_are_refused() {
    let fx = stream_fixture();
    let dtype = edit_manifest("manifest-json/string", "/dtype = <i2", |_, m| {
        m["dtype"] = json!("<i2");
    });
    expect(&fx, dtype, Outcome::Refused);
    let fx = documents_fixture();
    let metadata = edit_manifest("manifest-json/documents", "metadata = false", |_, m| {
        m["metadata"] = json!(false);
    });
    expect(&fx, metadata, Outcome::Refused);
}

/// Same-size damage to the document files (a flipped bit of a metadata entry, an `.idx`
/// offset moved by one so an entry's text gains a space, an entry id changed to another
/// entry, a document's start set to u64::MAX) served other rows or metadata under the same fingerprint: the block checksums of
/// the document files make the reads that need them fail with EIO.
#[test]
fn regression_same_size_document_damage_fails_reads() {
    let fx = documents_fixture();
    let docs = |k: usize| move |fx: &Fixture| fx.shards[k].docs.as_ref().unwrap().0.clone();
    let meta = edit_file(move |fx| docs(1)(fx)[2].clone(), |b| b[3] ^= 0x04);
    expect(&fx, meta, Outcome::ReadErrors);
    let index = edit_file(
        move |fx| docs(1)(fx)[1].clone(),
        |b| b[8] = b[8].wrapping_add(1),
    );
    expect(&fx, index, Outcome::ReadErrors);
    let ids = edit_file(move |fx| docs(2)(fx)[0].clone(), |b| b[4] ^= 1);
    expect(&fx, ids, Outcome::ReadErrors);
    // A document record's start near u64::MAX overflowed a check (a panic in debug builds).
    let start = edit_file(
        move |fx| docs(3)(fx)[3].clone(),
        |b| b[..8].copy_from_slice(&u64::MAX.to_le_bytes()),
    );
    expect(&fx, start, Outcome::ReadErrors);
}

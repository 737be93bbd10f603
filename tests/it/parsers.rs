//! The format parsers (`megatron`, `datatrove`, `doc_scan`, `hf`) against each format's own
//! reader: every token and every document boundary they report equals what
//! `tests/formats/read_format.py` prints for the same files.
//!
//! The files are written by the reference writers of `tests/formats` (the real libraries'
//! code) through `tests/fixtures/formats/generate.sh`: when the formats venv exists
//! (`$FORMATS_VENV`, default /work/venv-formats; `tests/formats/setup_venv.sh`) the script runs
//! into target/ for this test run, otherwise the committed output in tests/fixtures/formats/
//! is used (the same script wrote it).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;
use shufflefs::datatrove::{DatatroveFile, MergedTotal};
use shufflefs::doc_scan::{self, Rule, Scanner};
use shufflefs::dtype::ScalarType;
use shufflefs::hf;
use shufflefs::megatron::{MegatronIndex, Unit};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var_os("FORMATS_VENV").map_or("/work/venv-formats".into(), PathBuf::from);
    let py = venv.join("bin/python");
    py.exists().then_some(py)
}

/// The fixtures directory: freshly written by the reference writers when the venv exists,
/// else the committed copy.
pub(crate) fn fixtures() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let committed = repo().join("tests/fixtures/formats");
        let Some(py) = venv_python() else {
            eprintln!("parsers: no formats venv, using the committed fixtures");
            return committed;
        };
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("format-fixtures");
        let status = Command::new(committed.join("generate.sh"))
            .arg(&out)
            .arg(&py)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("run generate.sh");
        assert!(
            status.success(),
            "tests/fixtures/formats/generate.sh failed"
        );
        eprintln!(
            "parsers: fixtures written by the reference writers into {}",
            out.display()
        );
        out
    })
}

pub(crate) fn expected(case: &str, label: &str) -> Value {
    let p = fixtures().join(case).join(format!("expected-{label}.json"));
    serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap()
}

fn spans(v: &Value) -> Vec<(u64, u64)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| (s[0].as_u64().unwrap(), s[1].as_u64().unwrap()))
        .collect()
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap())
        .collect()
}

/// `n` tokens of `dtype` at byte `offset` of `path`, as i64.
fn tokens_of(path: &Path, offset: u64, n: u64, dtype: ScalarType) -> Vec<i64> {
    let mut buf = vec![0u8; n as usize * dtype.size()];
    File::open(path)
        .unwrap()
        .read_exact_at(&mut buf, offset)
        .unwrap();
    decode(&buf, dtype)
}

fn decode(bytes: &[u8], dtype: ScalarType) -> Vec<i64> {
    bytes
        .chunks_exact(dtype.size())
        .map(|c| match dtype {
            ScalarType::U8 => i64::from(c[0]),
            ScalarType::U16 => i64::from(u16::from_le_bytes(c.try_into().unwrap())),
            ScalarType::U32 => i64::from(u32::from_le_bytes(c.try_into().unwrap())),
            ScalarType::I32 => i64::from(i32::from_le_bytes(c.try_into().unwrap())),
            ScalarType::I64 => i64::from_le_bytes(c.try_into().unwrap()),
            t => panic!("{t}"),
        })
        .collect()
}

fn dtype_of(exp: &Value) -> ScalarType {
    ScalarType::from_name(exp["dtype"].as_str().unwrap()).unwrap()
}

fn file_names(exp: &Value) -> Vec<String> {
    exp["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().or(f["path"].as_str()).unwrap().to_string())
        .collect()
}

fn shift(base: u64, r: std::ops::Range<u64>) -> (u64, u64) {
    (base + r.start, base + r.end)
}

fn check_megatron(case: &str) {
    let exp = expected(case, "all");
    let dir = fixtures().join(case);
    let (mut stream, mut seqs, mut docs) = (Vec::new(), Vec::new(), Vec::new());
    for (k, name) in file_names(&exp).iter().enumerate() {
        let (ix, idx) = MegatronIndex::open_files(&dir.join(name).with_extension("")).unwrap();
        let f = &exp["files"][k];
        assert_eq!(ix.dtype(), dtype_of(&exp), "{case}");
        assert_eq!(
            ix.multimodal(),
            f["multimodal"].as_bool().unwrap(),
            "{case}"
        );
        assert_eq!(ix.n_sequences(), f["sequences"].as_u64().unwrap());
        assert_eq!(ix.n_documents() + 1, f["document_count"].as_u64().unwrap());
        let v = ix.verify(&idx).unwrap();
        assert_eq!(v.tokens, f["tokens"].as_u64().unwrap());
        let base = stream.len() as u64;
        stream.extend(tokens_of(ix.bin(), 0, ix.tokens(), ix.dtype()));
        for unit in [Unit::Sequence, Unit::Document] {
            let ranges: Vec<_> = (0..ix.n_units(unit))
                .map(|i| ix.unit(&idx, unit, i).unwrap())
                .collect();
            let mut ends = Vec::new();
            ix.for_each_end(&idx, unit, |e| {
                ends.push(e);
                Ok(())
            })
            .unwrap();
            assert_eq!(ends, ranges.iter().map(|r| r.end).collect::<Vec<_>>());
            let out = if unit == Unit::Sequence {
                &mut seqs
            } else {
                &mut docs
            };
            out.extend(ranges.into_iter().map(|r| shift(base, r)));
        }
        let di: Vec<i64> = (0..=ix.n_documents())
            .map(|d| ix.document_index(&idx, d).unwrap() as i64)
            .collect();
        assert_eq!(di, ints(&exp["document_indices"][k]));
    }
    assert_eq!(stream, ints(&exp["tokens"]), "{case}: tokens");
    assert_eq!(seqs, spans(&exp["sequences"]), "{case}: sequences");
    assert_eq!(docs, spans(&exp["documents"]), "{case}: documents");
    assert!(
        docs.iter().any(|(a, b)| a == b),
        "{case}: the writer's empty document"
    );
}

#[test]
fn megatron_sequences_and_documents_as_megatron_reads_them() {
    for case in [
        "megatron_split",
        "megatron_i32_mm",
        "megatron_merged",
        "megatron_files",
    ] {
        check_megatron(case);
    }
    // --split-sentences: documents and sequences differ.
    let exp = expected("megatron_split", "all");
    assert!(
        exp["sequences"].as_array().unwrap().len() > exp["documents"].as_array().unwrap().len()
    );
}

fn check_datatrove(case: &str) -> Vec<u64> {
    let exp = expected(case, "all");
    let dir = fixtures().join(case);
    let (mut stream, mut docs, mut loss, mut counts) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for name in file_names(&exp) {
        let (f, index) = DatatroveFile::open_files(&dir.join(&name), None).unwrap();
        assert_eq!(f.dtype(), dtype_of(&exp));
        let v = f.verify(&index).unwrap();
        assert_eq!(v.documents, f.n_documents());
        let base = stream.len() as u64;
        stream.extend(tokens_of(f.path(), 0, f.tokens(), f.dtype()));
        docs.extend((0..f.n_documents()).map(|d| shift(base, f.document(&index, d).unwrap())));
        if let Some(l) = f.loss_path() {
            let lf = File::open(l).unwrap();
            f.verify_loss(&lf).unwrap();
            loss.extend(std::fs::read(l).unwrap().into_iter().map(i64::from));
        }
        counts.push(f.tokens());
    }
    assert_eq!(stream, ints(&exp["tokens"]), "{case}: tokens");
    assert_eq!(docs, spans(&exp["documents"]), "{case}: documents");
    if exp.get("loss").is_some() {
        assert_eq!(loss, ints(&exp["loss"]), "{case}: loss");
    }
    counts
}

#[test]
fn datatrove_documents_as_the_merger_reads_them() {
    check_datatrove("datatrove_loss");
    let counts = check_datatrove("datatrove_merged_u32");
    // The merger's total metadata (no merged.ds beside it) and its parts.
    let dir = fixtures().join("datatrove_merged_u32");
    let total = MergedTotal::find(&dir.join("merged.ds.metadata"))
        .unwrap()
        .unwrap();
    let names: Vec<_> = total
        .parts
        .iter()
        .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
        .collect();
    assert_eq!(names, file_names(&expected("datatrove_merged_u32", "all")));
    total.check(&counts).unwrap();
    assert_eq!(total.metadata.token_size, 4);
    assert!(
        MergedTotal::find(&dir.join("000_merged.ds.metadata"))
            .unwrap()
            .is_none()
    );
}

/// Documents of token files scanned by `rule`, one scanner per file (`per_file`) or one for
/// the whole stream, against the expected reading.
fn check_scan(case: &str, label: &str, offset: u64, rule: Rule, per_file: bool) {
    let exp = expected(case, label);
    let dir = fixtures().join(case);
    let dtype = dtype_of(&exp);
    let (mut stream, mut docs) = (Vec::new(), Vec::new());
    let mut whole = Scanner::new(rule, dtype).unwrap();
    let mut excluded = 0;
    for (k, name) in file_names(&exp).iter().enumerate() {
        let path = dir.join(name);
        let n = exp["files"][k]["tokens"].as_u64().unwrap();
        assert_eq!(exp["files"][k]["offset"].as_u64().unwrap(), offset);
        let file = File::open(&path).unwrap();
        let base = stream.len() as u64;
        stream.extend(tokens_of(&path, offset, n, dtype));
        if per_file {
            let ix = doc_scan::scan(&file, &path, offset, n, dtype, rule).unwrap();
            excluded += ix.excluded();
            docs.extend((0..ix.n_documents()).map(|d| shift(base, ix.document(d).unwrap())));
        } else {
            whole.feed_source(&file, &path, offset, n).unwrap();
        }
    }
    if !per_file {
        let ix = whole.finish().unwrap();
        excluded = ix.excluded();
        docs.extend((0..ix.n_documents()).map(|d| shift(0, ix.document(d).unwrap())));
    }
    assert_eq!(stream, ints(&exp["tokens"]), "{case}/{label}: tokens");
    assert_eq!(docs, spans(&exp["documents"]), "{case}/{label}: documents");
    let covered: u64 = docs.iter().map(|(a, b)| b - a).sum();
    assert_eq!(covered + excluded, stream.len() as u64);
}

#[test]
fn olmo_documents_by_eos_scan_as_olmo_core_finds_them() {
    check_scan("olmo_dolma1", "all", 0, Rule::olmo(50_279, None), true);
    check_scan("olmo_dolma2", "all", 0, Rule::olmo(100_257, None), true);
    check_scan(
        "olmo_dolma2_bos",
        "all",
        0,
        Rule::olmo(100_257, Some(100_257)),
        true,
    );
    // Cut inside a document: the tail is in no document, as in OLMo.
    check_scan("olmo_dolma2", "cut", 0, Rule::olmo(100_257, None), true);
    check_scan(
        "olmo_dolma2_bos",
        "cut",
        0,
        Rule::olmo(100_257, Some(100_257)),
        true,
    );
    let exp = expected("olmo_dolma2", "cut");
    let last = spans(&exp["documents"]).last().unwrap().1;
    assert!(last < exp["tokens"].as_array().unwrap().len() as u64);
}

#[test]
fn nanogpt_documents_end_with_the_eot() {
    check_scan(
        "nanogpt",
        "train",
        0,
        Rule::nanogpt(doc_scan::GPT2_EOT),
        true,
    );
    check_scan("nanogpt", "val", 0, Rule::nanogpt(doc_scan::GPT2_EOT), true);
}

#[test]
fn llmc_documents_start_with_the_eot_and_span_shards() {
    for (case, eot) in [
        ("llmc_gpt2", doc_scan::GPT2_EOT),
        ("llmc_llama3", doc_scan::LLAMA3_BOS),
    ] {
        let exp = expected(case, "all");
        assert_eq!(exp["eot"].as_u64().unwrap(), eot);
        // The header's magic and version give the dtype (sniff's table), word 2 the count.
        for (k, name) in file_names(&exp).iter().enumerate() {
            let head = std::fs::read(fixtures().join(case).join(name)).unwrap();
            let word = |i: usize| u32::from_le_bytes(head[4 * i..4 * i + 4].try_into().unwrap());
            let (_, _, t) = shufflefs::sniff::LLMC
                .iter()
                .find(|(m, v, _)| *m == word(0) && *v == word(1))
                .unwrap();
            assert_eq!(*t, dtype_of(&exp));
            assert_eq!(
                u64::from(word(2)),
                exp["files"][k]["tokens"].as_u64().unwrap()
            );
        }
        check_scan(
            case,
            "all",
            shufflefs::sniff::LLMC_HEADER,
            Rule::llmc(eot),
            false,
        );
        // A document crosses a shard boundary (the writer splits one).
        let mut start = 0;
        let bounds: Vec<u64> = exp["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                start += f["tokens"].as_u64().unwrap();
                start
            })
            .collect();
        assert!(
            spans(&exp["documents"])
                .iter()
                .any(|(a, b)| bounds.iter().any(|x| a < x && x < b))
        );
    }
}

fn convert_all(
    paths: &[PathBuf],
    column: Option<&str>,
    dtype: ScalarType,
) -> (Vec<i64>, Vec<(u64, u64)>) {
    let (mut bytes, mut docs) = (Vec::new(), Vec::new());
    let mut opts = hf::Options::new(dtype);
    opts.column = column.map(str::to_string);
    opts.batch_size = 4; // several batches per row group
    for p in paths {
        let c = hf::convert(p, &opts, &mut |b, _| {
            bytes.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert_eq!(c.tokens, c.doc_lens.iter().sum::<u64>());
        for l in c.doc_lens {
            let s = docs.last().map_or(0, |&(_, e)| e);
            docs.push((s, s + l));
        }
    }
    (decode(&bytes, dtype), docs)
}

#[test]
fn hf_tables_convert_to_the_rows_datasets_and_pyarrow_read() {
    let dir = fixtures().join("hf");
    // save_to_disk: Arrow IPC streams in state.json order.
    let exp = expected("hf", "disk");
    let shards = hf::disk_files(&dir.join("disk")).unwrap();
    assert_eq!(
        shards
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap().to_string())
            .collect::<Vec<_>>(),
        file_names(&exp)
    );
    let (tokens, docs) = convert_all(&shards, None, ScalarType::I32);
    assert_eq!(tokens, ints(&exp["tokens"]));
    assert_eq!(docs, spans(&exp["documents"]));
    // Parquet: datasets' to_parquet (list<int32>), pyarrow list<int64>, list<uint16> `tokens`.
    for (label, file, dtype) in [
        ("parquet", "hf.parquet", ScalarType::U32),
        ("int64", "pa_int64.parquet", ScalarType::I64),
        ("uint16", "pa_uint16.parquet", ScalarType::U16),
    ] {
        let exp = expected("hf", label);
        let column = exp["column"].as_str();
        let (tokens, docs) = convert_all(&[dir.join(file)], column, dtype);
        assert_eq!(tokens, ints(&exp["tokens"]), "{file}");
        assert_eq!(docs, spans(&exp["documents"]), "{file}");
        // The default column finds `tokens` too.
        assert_eq!(convert_all(&[dir.join(file)], None, dtype).0, tokens);
    }
    // Out of range for the output type: refused naming the file, row and value.
    let mut opts = hf::Options::new(ScalarType::U8);
    opts.column = Some("input_ids".into());
    let e = hf::convert(&dir.join("hf.parquet"), &opts, &mut |_, _| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("hf.parquet: row 0: token 0 is") && e.contains("u8 tokens cannot hold"),
        "{e}"
    );
    // large_list in an Arrow IPC file and in parquet (pyarrow), with empty rows.
    let dir = fixtures().join("arrow_variants");
    let lines = std::fs::read_to_string(dir.join("expected.jsonl")).unwrap();
    for line in lines.lines() {
        let exp: Value = serde_json::from_str(line).unwrap();
        let path = dir.join(exp["path"].as_str().unwrap());
        let (tokens, docs) = convert_all(&[path], exp["column"].as_str(), ScalarType::U32);
        assert_eq!(tokens, ints(&exp["tokens"]), "{line}");
        assert_eq!(docs, spans(&exp["documents"]), "{line}");
        assert!(docs.iter().any(|(a, b)| a == b));
    }
    let e = hf::convert(
        &dir.join("large_list.arrow"),
        &hf::Options::new(ScalarType::U16),
        &mut |_, _| Ok(()),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("large_list.arrow: row 0: token 0 is 70000"),
        "{e}"
    );
}

/// With the venv, the committed fixtures are what the writers write today (else regenerate
/// them: tests/fixtures/formats/generate.sh).
#[test]
fn committed_fixtures_match_the_reference_writers() {
    if venv_python().is_none() {
        eprintln!("parsers: no formats venv, nothing to compare");
        return;
    }
    let committed = repo().join("tests/fixtures/formats");
    for entry in std::fs::read_dir(&committed).unwrap() {
        let case = entry.unwrap().path();
        if !case.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&case).unwrap() {
            let f = f.unwrap().path();
            let name = f.file_name().unwrap().to_str().unwrap().to_string();
            if !name.starts_with("expected") {
                continue;
            }
            let fresh = fixtures().join(case.file_name().unwrap()).join(&name);
            assert_eq!(
                std::fs::read(&f).unwrap(),
                std::fs::read(&fresh).unwrap(),
                "{} differs from what the writers write now: run tests/fixtures/formats/generate.sh",
                f.display()
            );
        }
    }
}

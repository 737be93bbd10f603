//! `--out-dtype`: `.npy` files served as i32/i64 with the same values as the dataset's tokens,
//! `info.json` and the fingerprint following the served type, and a token the type cannot hold
//! failing its reads with EOVERFLOW instead of a wrapped number.

use std::fs;

use shufflefs::dtype::ScalarType;
use shufflefs::view::ViewConfig;

use crate::common::*;

const PLAN: [&str; 10] = [
    "--window",
    "33",
    "--stride",
    "32",
    "--batch-size",
    "4",
    "--ranks",
    "2",
    "--seed",
    "3",
];

/// Little-endian integers of `size` bytes (unsigned, or signed when `signed`).
fn ints(bytes: &[u8], size: usize, signed: bool) -> Vec<i128> {
    bytes
        .chunks_exact(size)
        .map(|c| {
            let mut b = [0u8; 16];
            b[..size].copy_from_slice(c);
            let v = i128::from_le_bytes(b);
            if signed {
                let shift = 128 - 8 * size as u32;
                (v << shift) >> shift
            } else {
                v
            }
        })
        .collect()
}

fn info(ds: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["plan", ds];
    args.extend(PLAN);
    args.extend(extra);
    args.push("--info");
    json(&shufflefs_ok(&args).stdout)
}

#[test]
fn info_and_fingerprint_follow_the_served_type() {
    let data = Data::positional_of(40_000, 64 << 10, ScalarType::U16);
    let ds = data.path();
    let plain = info(s(&ds), &[]);
    let wide = info(s(&ds), &["--out-dtype", "int64"]);
    assert_eq!(plain["dtype"], "<u2");
    assert!(plain.get("dataset_dtype").is_none(), "{plain}");
    assert_eq!(wide["dtype"], "<i8");
    assert_eq!(wide["dataset_dtype"], "<u2");
    assert_eq!(wide["itemsize"], 8);
    let rows = 4 * 33;
    assert_eq!(
        wide["step_file_bytes"].as_u64().unwrap() - wide["npy_header_bytes"].as_u64().unwrap(),
        rows * 8
    );
    assert_ne!(wide["fingerprint"], plain["fingerprint"]);
    assert_ne!(
        info(s(&ds), &["--out-dtype", "i32"])["fingerprint"],
        wide["fingerprint"]
    );
    // The dataset's own type is no conversion: the same bytes, the same fingerprint.
    let own = info(s(&ds), &["--out-dtype", "uint16"]);
    assert_eq!(own, plain);
    // Only i32 and i64 are served.
    let mut args = vec!["plan", s(&ds)];
    args.extend(PLAN);
    args.extend(["--out-dtype", "u32", "--info"]);
    let o = shufflefs(&args);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("i32 or i64"), "{}", stderr(&o));
}

#[test]
fn step_and_observation_files_hold_the_same_values_widened() {
    let data = Data::positional_of(40_000, 64 << 10, ScalarType::U16);
    let cfg = config(33, 32, 4, 2, 3, 2);
    let plain = data.fs(&cfg);
    for (out, size) in [(ScalarType::I64, 8), (ScalarType::I32, 4)] {
        let wide = data.fs(&ViewConfig {
            out_dtype: Some(out),
            ..cfg.clone()
        });
        let steps = plain.view().info().steps_per_epoch;
        let mut paths = vec!["observation/5.npy".to_string()];
        for e in 0..2 {
            for r in 0..2 {
                for st in 0..steps {
                    paths.push(format!("epoch/{e}/rank/{r}/step/{st}.npy"));
                }
            }
        }
        for path in &paths {
            let a = read_all(&plain, path);
            let b = read_all(&wide, path);
            let header = npy_header_len(&b);
            let descr = format!("'descr': '{}'", out_descr(out));
            assert!(
                String::from_utf8_lossy(&b[..header]).contains(&descr),
                "{path}"
            );
            let want = ints(&a[npy_header_len(&a)..], 2, false);
            assert_eq!(ints(&b[header..], size, true), want, "{path} as {out:?}");
            // Any range of the file: the bytes of the whole file at that range.
            let ino = walk(&wide, path).unwrap();
            for (off, len) in [
                (header as u64 + 3, 13u32),
                (1, 70),
                (b.len() as u64 - 5, 64),
            ] {
                let got = read_at(&wide, ino, off, len).unwrap();
                let end = (off as usize + len as usize).min(b.len());
                assert_eq!(got, &b[off as usize..end], "{path} at {off}+{len}");
            }
        }
    }
}

/// The header length of a version 1 `.npy` file.
fn npy_header_len(npy: &[u8]) -> usize {
    assert_eq!(&npy[..8], b"\x93NUMPY\x01\x00");
    10 + u16::from_le_bytes([npy[8], npy[9]]) as usize
}

fn out_descr(t: ScalarType) -> &'static str {
    match t {
        ScalarType::I32 => "<i4",
        _ => "<i8",
    }
}

/// u32 tokens, one of them 3,000,000,000: `--out-dtype i32` cannot hold it. The step files
/// whose rows contain it fail with EOVERFLOW (through the model and through a mount); every
/// other step file is served exactly; `--out-dtype i64` serves them all.
#[test]
fn a_token_that_does_not_fit_fails_its_reads_with_eoverflow() {
    const BIG: u32 = 3_000_000_000;
    const AT: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("t.bin");
    let mut tokens: Vec<u32> = (0..8000u32).map(|i| i % 50_000).collect();
    tokens[AT] = BIG;
    fs::write(
        &input,
        tokens
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let data = Data::pack(dir, &[input], ScalarType::U32, 16 << 10, true);
    let cfg = config(16, 16, 2, 1, 9, 1);
    let narrow = data.fs(&ViewConfig {
        out_dtype: Some(ScalarType::I32),
        ..cfg.clone()
    });
    let wide = data.fs(&ViewConfig {
        out_dtype: Some(ScalarType::I64),
        ..cfg.clone()
    });
    let header = narrow.view().info().npy_header_bytes as usize;
    let wide_header = wide.view().info().npy_header_bytes as usize;
    let mut failed = Vec::new();
    for st in 0..narrow.view().info().steps_per_epoch {
        let path = format!("epoch/0/rank/0/step/{st}.npy");
        let all = ints(&read_all(&wide, &path)[wide_header..], 8, true);
        match read_path(&narrow, &path) {
            Ok(b) => assert_eq!(ints(&b[header..], 4, true), all, "{path}"),
            Err(e) => {
                assert_eq!(e.errno(), libc::EOVERFLOW, "{path}: {e}");
                assert!(
                    all.contains(&(BIG as i128)),
                    "{path} fails without the token"
                );
                failed.push(path);
            }
        }
    }
    assert_eq!(
        failed.len(),
        1,
        "the window holding record {AT} is in one step"
    );
    if !fuse_available() {
        return;
    }
    let m = TestMount::new(narrow);
    let e = fs::read(m.path().join(&failed[0])).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EOVERFLOW), "{e}");
    let other = if failed[0].ends_with("/0.npy") {
        "1"
    } else {
        "0"
    };
    fs::read(m.path().join(format!("epoch/0/rank/0/step/{other}.npy"))).unwrap();
    m.unmount();
}

/// Documents mode: each row is a document's tokens, then padding in the served type (a
/// `--pad-id` of -1 is an i64 value even though the dataset holds u16 tokens).
#[test]
fn documents_rows_are_padded_in_the_served_type() {
    let mut text = String::new();
    for d in 0..40u64 {
        let tokens: Vec<u64> = (0..1 + d % 11).map(|k| d * 100 + k).collect();
        text.push_str(&format!("{{\"tokens\": {tokens:?}}}\n"));
    }
    let data = Data::jsonl(&text, ScalarType::U16, 4096, None);
    let documents = |pad: i128, out: Option<ScalarType>| {
        data.fs(&ViewConfig {
            mode: shufflefs::view::Mode::Documents,
            stride: None,
            pad_id: Some(pad),
            out_dtype: out,
            ..config(8, 8, 4, 2, 5, 1)
        })
    };
    let plain = documents(65_535, None);
    let wide = documents(-1, Some(ScalarType::I64));
    // Without --out-dtype, -1 is no u16 value.
    let unconverted = ViewConfig {
        mode: shufflefs::view::Mode::Documents,
        stride: None,
        pad_id: Some(-1),
        ..config(8, 8, 4, 2, 5, 1)
    };
    let e = shufflefs::view::View::open(&data.path(), &unconverted).unwrap_err();
    assert!(e.to_string().contains("not a u16 value"), "{e}");
    for r in 0..2 {
        for st in 0..plain.view().info().steps_per_epoch {
            for file in [
                format!("epoch/0/rank/{r}/step/{st}.npy"),
                format!("observation/{st}.npy"),
            ] {
                let a = read_all(&plain, &file);
                let b = read_all(&wide, &file);
                let want: Vec<i128> = ints(&a[npy_header_len(&a)..], 2, false)
                    .into_iter()
                    .map(|v| if v == 65_535 { -1 } else { v })
                    .collect();
                assert_eq!(ints(&b[npy_header_len(&b)..], 8, true), want, "{file}");
            }
        }
    }
}

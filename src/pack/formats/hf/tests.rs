use super::*;
use arrow_array::builder::{Int64Builder, ListBuilder};
use arrow_array::{ArrayRef, Int32Array};
use arrow_schema::Field;
use std::sync::Arc;

fn list_batch(rows: &[Option<Vec<Option<i64>>>]) -> RecordBatch {
    let mut b = ListBuilder::new(Int64Builder::new());
    for r in rows {
        match r {
            Some(v) => {
                for t in v {
                    b.values().append_option(*t);
                }
                b.append(true);
            }
            None => b.append(false),
        }
    }
    let col: ArrayRef = Arc::new(b.finish());
    let text: ArrayRef = Arc::new(Int32Array::from(vec![7; rows.len()]));
    RecordBatch::try_from_iter([("other", text), ("tokens", col)]).unwrap()
}

fn write_stream(path: &Path, batches: &[RecordBatch]) {
    let f = File::create(path).unwrap();
    let mut w = arrow_ipc::writer::StreamWriter::try_new(f, &batches[0].schema()).unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    w.finish().unwrap();
}

fn write_file(path: &Path, batches: &[RecordBatch]) {
    let f = File::create(path).unwrap();
    let mut w = arrow_ipc::writer::FileWriter::try_new(f, &batches[0].schema()).unwrap();
    for b in batches {
        w.write(b).unwrap();
    }
    w.finish().unwrap();
}

fn run(path: &Path, opts: &Options) -> Result<(Converted, Vec<u8>)> {
    let mut bytes = Vec::new();
    let c = convert(path, opts, &mut |b, _| {
        bytes.extend_from_slice(b);
        Ok(())
    })?;
    Ok((c, bytes))
}

#[test]
fn stream_and_file_with_defaults_and_batches() {
    let dir = tempfile::tempdir().unwrap();
    let b1 = list_batch(&[Some(vec![Some(1), Some(2)]), Some(vec![])]);
    let b2 = list_batch(&[Some(vec![Some(70_000)])]);
    for (name, w) in [
        ("s.arrow", write_stream as fn(&Path, &[RecordBatch])),
        ("f.arrow", write_file),
    ] {
        let p = dir.path().join(name);
        w(&p, &[b1.clone(), b2.clone()]);
        let (c, bytes) = run(&p, &Options::new(ScalarType::U32)).unwrap();
        assert_eq!(c.column, "tokens");
        assert_eq!(c.doc_lens, [2, 0, 1]);
        assert_eq!((c.tokens, c.batches), (3, 2));
        let want: Vec<u8> = [1u32, 2, 70_000]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect();
        assert_eq!(bytes, want);
        // 70,000 does not fit u16: refused naming the file, the row and the value.
        let e = run(&p, &Options::new(ScalarType::U16))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(name) && e.contains("row 2: token 0 is 70000"),
            "{e}"
        );
        // A named column that is not there, one that is not a list.
        let mut o = Options::new(ScalarType::U32);
        o.column = Some("input_ids".into());
        let e = run(&p, &o).unwrap_err().to_string();
        assert!(
            e.contains("no token column input_ids (its columns: other, tokens)"),
            "{e}"
        );
        o.column = Some("other".into());
        assert!(
            run(&p, &o)
                .unwrap_err()
                .to_string()
                .contains("not a list of integer")
        );
    }
    assert_eq!(TableKind::detect(b"PAR1xxxx"), Some(TableKind::Parquet));
}

#[test]
fn nulls_and_negative_values_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("n.arrow");
    write_stream(&p, &[list_batch(&[Some(vec![Some(1)]), None])]);
    let e = run(&p, &Options::new(ScalarType::I64))
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 1: is null"), "{e}");
    write_stream(&p, &[list_batch(&[Some(vec![Some(1), None])])]);
    let e = run(&p, &Options::new(ScalarType::I64))
        .unwrap_err()
        .to_string();
    assert!(e.contains("row 0: token 1 is null"), "{e}");
    write_stream(&p, &[list_batch(&[Some(vec![Some(-3)])])]);
    assert!(run(&p, &Options::new(ScalarType::U32)).is_err());
    let (_, b) = run(&p, &Options::new(ScalarType::I32)).unwrap();
    assert_eq!(b, (-3i32).to_le_bytes());
}

#[test]
fn sliced_and_fixed_size_lists() {
    let dir = tempfile::tempdir().unwrap();
    // A list column sliced so its offsets do not start at 0.
    let full = list_batch(&[
        Some(vec![Some(9)]),
        Some(vec![Some(4), Some(5)]),
        Some(vec![Some(6)]),
    ]);
    let p = dir.path().join("sl.arrow");
    write_stream(&p, &[full.slice(1, 2)]);
    let (c, b) = run(&p, &Options::new(ScalarType::U8)).unwrap();
    assert_eq!((c.doc_lens, b), (vec![2, 1], vec![4, 5, 6]));
    // Fixed-size lists: pre-packed rows.
    let values = Arc::new(arrow_array::UInt16Array::from(vec![1u16, 2, 3, 4, 5, 6]));
    let fsl = arrow_array::FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::UInt16, false)),
        3,
        values,
        None,
    );
    let batch = RecordBatch::try_from_iter([("input_ids", Arc::new(fsl) as ArrayRef)]).unwrap();
    let p = dir.path().join("fsl.arrow");
    write_stream(&p, &[batch]);
    let (c, b) = run(&p, &Options::new(ScalarType::U16)).unwrap();
    assert_eq!(c.doc_lens, [3, 3]);
    assert_eq!(
        b,
        [1u16, 2, 3, 4, 5, 6]
            .iter()
            .flat_map(|t| t.to_le_bytes())
            .collect::<Vec<_>>()
    );
}

#[test]
fn damaged_tables_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let b = list_batch(&[Some(vec![Some(1), Some(2)]), Some(vec![Some(3)])]);
    let s = dir.path().join("s.arrow");
    write_stream(&s, std::slice::from_ref(&b));
    let f = dir.path().join("f.arrow");
    write_file(&f, &[b]);
    for src in [&s, &f] {
        let good = std::fs::read(src).unwrap();
        // Truncations at many points, and single-byte corruptions.
        for cut in (1..good.len()).step_by(7) {
            let p = dir.path().join("cut.arrow");
            std::fs::write(&p, &good[..cut]).unwrap();
            let _ = run(&p, &Options::new(ScalarType::I64));
        }
        for at in (0..good.len()).step_by(3) {
            let mut bad = good.clone();
            bad[at] ^= 0xa5;
            let p = dir.path().join("flip.arrow");
            std::fs::write(&p, &bad).unwrap();
            let _ = run(&p, &Options::new(ScalarType::I64));
        }
    }
    // An IPC file footer whose block claims a huge body: refused before any allocation.
    let mut good = std::fs::read(&f).unwrap();
    let n = good.len();
    let footer_len = i32::from_le_bytes(good[n - 10..n - 6].try_into().unwrap()) as usize;
    let footer = &mut good[n - 10 - footer_len..n - 10];
    let fb = arrow_ipc::root_as_footer(footer).unwrap();
    let block = fb.recordBatches().unwrap().get(0);
    let body = block.bodyLength().to_le_bytes();
    let pos = footer.windows(8).position(|w| w == body).unwrap();
    footer[pos..pos + 8].copy_from_slice(&(i64::MAX / 2).to_le_bytes());
    let p = dir.path().join("huge.arrow");
    std::fs::write(&p, &good).unwrap();
    let e = run(&p, &Options::new(ScalarType::I64))
        .unwrap_err()
        .to_string();
    assert!(e.contains("outside the"), "{e}");
    // Not a table at all.
    let p = dir.path().join("x.bin");
    std::fs::write(&p, b"hello").unwrap();
    assert!(
        run(&p, &Options::new(ScalarType::I64))
            .unwrap_err()
            .to_string()
            .contains("not a parquet")
    );
}

#[test]
fn disk_files_in_state_order() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("state.json"),
        r#"{"_data_files": [{"filename": "data-00001-of-00002.arrow"}, {"filename": "data-00000-of-00002.arrow"}]}"#,
    )
    .unwrap();
    assert_eq!(
        disk_files(d).unwrap(),
        [
            d.join("data-00001-of-00002.arrow"),
            d.join("data-00000-of-00002.arrow")
        ]
    );
    std::fs::write(
        d.join("state.json"),
        r#"{"_data_files": [{"filename": "../x.arrow"}]}"#,
    )
    .unwrap();
    assert!(disk_files(d).is_err());
    std::fs::write(
        d.join("dataset_dict.json"),
        r#"{"splits": ["train", "test"]}"#,
    )
    .unwrap();
    let e = disk_files(d).unwrap_err().to_string();
    assert!(e.contains("splits: train, test"), "{e}");
}

use super::*;

fn index(ends: &[u64]) -> Vec<u8> {
    ends.iter().flat_map(|e| e.to_le_bytes()).collect()
}

fn open(
    ends: &[u64],
    ds_len: u64,
    meta: Option<&Metadata>,
    loss: Option<u64>,
) -> Result<DatatroveFile> {
    let idx = index(ends);
    let parts = Parts {
        ds: (Path::new("x.ds"), ds_len),
        index: (Path::new("x.ds.index"), idx.len() as u64),
        metadata: meta,
        dtype: Some(ScalarType::U16),
        loss: loss.map(|n| (Path::new("x.ds.loss"), n)),
    };
    DatatroveFile::open(&parts, &idx)
}

#[test]
fn metadata_forms() {
    let p = Path::new("m");
    let m = Metadata::parse(p, b"gpt2|2\n4358\n4.36 kT").unwrap();
    assert_eq!(
        m,
        Metadata {
            tokenizer: Some("gpt2".into()),
            token_size: 2,
            tokens: 4358
        }
    );
    assert_eq!(m.dtype(), ScalarType::U16);
    let m = Metadata::parse(p, b"Unknown Tokenizer|4|4\n7\n7 T").unwrap();
    assert_eq!((m.tokenizer, m.token_size, m.tokens), (None, 4, 7));
    let m = Metadata::parse(p, b"/a|b/tok.json|4\n0\n0 T").unwrap();
    assert_eq!(m.tokenizer.as_deref(), Some("/a|b/tok.json"));
    for bad in [
        &b"gpt2\n3\n"[..],
        b"gpt2|3\n1\n",
        b"gpt2|2\n",
        b"gpt2|2\nx\n",
        b"\xff|2\n1",
    ] {
        assert!(Metadata::parse(p, bad).is_err(), "{bad:?}");
    }
}

#[test]
fn documents_from_ends() {
    let ends = [2u64, 2, 5, 9];
    let idx = index(&ends);
    let f = open(&ends, 18, None, Some(9)).unwrap();
    assert_eq!(
        (f.tokens(), f.n_documents(), f.dtype()),
        (9, 4, ScalarType::U16)
    );
    let docs: Vec<_> = (0..4).map(|d| f.document(&idx, d).unwrap()).collect();
    assert_eq!(docs, [0..2, 2..2, 2..5, 5..9]);
    assert!(f.document(&idx, 4).is_err());
    assert_eq!(
        f.verify(&idx).unwrap(),
        Verified {
            documents: 4,
            empty_documents: 1,
            tokens: 9
        }
    );
    let mut got = Vec::new();
    f.for_each_end(&idx, |e| {
        got.push(e);
        Ok(())
    })
    .unwrap();
    assert_eq!(got, ends);
    f.verify_loss(&vec![0u8, 1, 1, 0, 1, 1, 1, 1, 0]).unwrap();
    let e = f
        .verify_loss(&vec![0u8, 1, 2, 0, 1, 1, 1, 1, 0])
        .unwrap_err();
    assert!(e.to_string().contains("byte 2 is 2"), "{e}");
    // Empty file, empty index.
    let f = open(&[], 0, None, None).unwrap();
    assert_eq!(f.n_documents(), 0);
    f.verify(&Vec::new()).unwrap();
}

#[test]
fn refusals() {
    let meta = Metadata {
        tokenizer: None,
        token_size: 2,
        tokens: 9,
    };
    let msg = |r: Result<DatatroveFile>| r.unwrap_err().to_string();
    // Truncated index (not a multiple of 8), last end != tokens (both ways).
    let mut idx = index(&[2, 9]);
    idx.pop();
    let parts = Parts {
        ds: (Path::new("x.ds"), 18),
        index: (Path::new("x.ds.index"), idx.len() as u64),
        metadata: None,
        dtype: Some(ScalarType::U16),
        loss: None,
    };
    assert!(msg(DatatroveFile::open(&parts, &idx)).contains("x.ds.index: 15 bytes"));
    assert!(msg(open(&[2, 8], 18, None, None)).contains("ends at token 8"));
    assert!(msg(open(&[2, 10], 18, None, None)).contains("ends at token 10"));
    assert!(msg(open(&[2, 9], 17, None, None)).contains("whole number"));
    // Metadata token count or loss size that disagree.
    assert!(msg(open(&[2, 10], 20, Some(&meta), None)).contains("metadata says 9"));
    assert!(msg(open(&[2, 9], 18, None, Some(8))).contains("x.ds.loss: 8 bytes"));
    // Metadata and --dtype that disagree; no metadata and no dtype.
    let mut parts = parts.clone();
    let idx = index(&[9]);
    parts.index.1 = 8;
    let wide = Metadata {
        token_size: 4,
        ..meta.clone()
    };
    parts.metadata = Some(&wide);
    assert!(msg(DatatroveFile::open(&parts, &idx)).contains("not u16"));
    parts.metadata = None;
    parts.dtype = None;
    assert!(msg(DatatroveFile::open(&parts, &idx)).contains("--dtype"));
    parts.dtype = Some(ScalarType::I64);
    assert!(msg(DatatroveFile::open(&parts, &idx)).contains("uint16 or uint32"));
    // Ends out of order: open passes (only the last is read), the lookup and verify refuse.
    let ends = [5u64, 3, 9];
    let idx = index(&ends);
    let f = open(&ends, 18, None, None).unwrap();
    assert!(
        f.document(&idx, 1)
            .unwrap_err()
            .to_string()
            .contains("from token 5 to 3")
    );
    assert!(f.verify(&idx).is_err());
    // An end beyond the file in the middle.
    let ends = [50u64, 9];
    let idx = index(&ends);
    let f = open(&ends, 18, None, None).unwrap();
    assert!(f.document(&idx, 0).is_err());
    assert!(f.verify(&idx).is_err());
}

#[test]
fn huge_index_claims_allocate_nothing() {
    // An index that claims 2^60 bytes: open reads the last 8 (which are not there).
    let idx = index(&[9]);
    let parts = Parts {
        ds: (Path::new("x.ds"), 18),
        index: (Path::new("x.ds.index"), 1 << 60),
        metadata: None,
        dtype: Some(ScalarType::U16),
        loss: None,
    };
    let e = DatatroveFile::open(&parts, &idx).unwrap_err().to_string();
    assert!(e.contains("ends at byte"), "{e}");
}

#[test]
fn merger_total_is_found_with_its_parts() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (n, t) in [("000_m.ds", 4u64), ("001_m.ds", 6), ("x_m.ds", 1)] {
        std::fs::write(d.join(n), vec![0u8; 2 * t as usize]).unwrap();
        std::fs::write(
            d.join(format!("{n}.metadata")),
            format!("tok|2\n{t}\n{t} T"),
        )
        .unwrap();
    }
    std::fs::write(d.join("m.ds.metadata"), "tok|2\n10\n10 T").unwrap();
    let total = MergedTotal::find(&d.join("m.ds.metadata"))
        .unwrap()
        .unwrap();
    assert_eq!(total.parts, [d.join("000_m.ds"), d.join("001_m.ds")]);
    assert_eq!(total.metadata.tokens, 10);
    total.check(&[4, 6]).unwrap();
    assert!(total.check(&[4]).is_err());
    // An ordinary metadata file (its .ds exists) is not a total.
    assert_eq!(
        MergedTotal::find(&d.join("000_m.ds.metadata")).unwrap(),
        None
    );
    assert_eq!(MergedTotal::find(&d.join("000_m.ds")).unwrap(), None);
}

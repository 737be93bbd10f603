use super::*;

/// An index as `_IndexWriter` writes it, from per-document sequence lengths.
pub(crate) fn write_index(code: u8, docs: &[&[i32]], modes: bool) -> Vec<u8> {
    let size = dtype_of_code(code).map_or(2, |t| t.size()) as i64;
    let lengths: Vec<i32> = docs.iter().flat_map(|d| d.iter().copied()).collect();
    let mut doc_idx = vec![0i64];
    for d in docs {
        doc_idx.push(doc_idx.last().unwrap() + d.len() as i64);
    }
    let mut out = MAGIC.to_vec();
    out.extend_from_slice(&1u64.to_le_bytes());
    out.push(code);
    out.extend_from_slice(&(lengths.len() as u64).to_le_bytes());
    out.extend_from_slice(&(doc_idx.len() as u64).to_le_bytes());
    for l in &lengths {
        out.extend_from_slice(&l.to_le_bytes());
    }
    let mut p = 0i64;
    for l in &lengths {
        out.extend_from_slice(&p.to_le_bytes());
        p += i64::from(*l) * size;
    }
    for d in &doc_idx {
        out.extend_from_slice(&d.to_le_bytes());
    }
    if modes {
        out.extend(lengths.iter().enumerate().map(|(i, _)| i as u8 % 2));
    }
    out
}

fn open(idx: &[u8], bin_len: u64) -> Result<MegatronIndex> {
    MegatronIndex::open(Path::new("c.idx"), &idx.to_vec(), idx.len() as u64, bin_len)
}

fn ends(ix: &MegatronIndex, idx: &Vec<u8>, unit: Unit) -> Vec<u64> {
    let mut v = Vec::new();
    ix.for_each_end(idx, unit, |e| {
        v.push(e);
        Ok(())
    })
    .unwrap();
    v
}

#[test]
fn sequences_documents_and_ends() {
    // Documents: [3, 2], [] (empty), [4], [0, 1] (an empty sentence).
    let idx = write_index(8, &[&[3, 2], &[], &[4], &[0, 1]], false);
    let ix = open(&idx, 2 * 10).unwrap();
    assert_eq!(ix.dtype(), ScalarType::U16);
    assert_eq!(
        (ix.n_sequences(), ix.n_documents(), ix.tokens()),
        (5, 4, 10)
    );
    assert!(!ix.multimodal());
    let seqs: Vec<_> = (0..5).map(|i| ix.sequence(&idx, i).unwrap()).collect();
    assert_eq!(seqs, [0..3, 3..5, 5..9, 9..9, 9..10]);
    let docs: Vec<_> = (0..4).map(|d| ix.document(&idx, d).unwrap()).collect();
    assert_eq!(docs, [0..5, 5..5, 5..9, 9..10]);
    assert_eq!(ix.document_sequences(&idx, 1).unwrap(), 2..2);
    assert_eq!(ends(&ix, &idx, Unit::Sequence), [3, 5, 9, 9, 10]);
    assert_eq!(ends(&ix, &idx, Unit::Document), [5, 5, 9, 10]);
    assert_eq!(Unit::default(), Unit::Sequence);
    let v = ix.verify(&idx).unwrap();
    assert_eq!(
        v,
        Verified {
            sequences: 5,
            documents: 4,
            empty_documents: 1,
            empty_sequences: 1,
            tokens: 10
        }
    );
    assert_eq!(ix.sequence_mode(&idx, 0).unwrap(), None);
    assert!(ix.sequence(&idx, 5).is_err());
    assert!(ix.document(&idx, 4).is_err());
}

#[test]
fn multimodal_trailer_and_int32() {
    let idx = write_index(4, &[&[1, 2], &[3]], true);
    let ix = open(&idx, 4 * 6).unwrap();
    assert!(ix.multimodal());
    assert_eq!(ix.dtype(), ScalarType::I32);
    assert_eq!(ix.sequence_mode(&idx, 1).unwrap(), Some(1));
    assert_eq!(ix.sequence(&idx, 2).unwrap(), 3..6);
    assert_eq!(ix.verify(&idx).unwrap().tokens, 6);
}

#[test]
fn empty_index() {
    let idx = write_index(8, &[], false);
    let ix = open(&idx, 0).unwrap();
    assert_eq!((ix.n_sequences(), ix.n_documents()), (0, 0));
    assert_eq!(ends(&ix, &idx, Unit::Document), Vec::<u64>::new());
    ix.verify(&idx).unwrap();
    assert!(open(&idx, 2).is_err());
}

fn err(idx: &[u8], bin_len: u64) -> String {
    open(idx, bin_len).unwrap_err().to_string()
}

#[test]
fn refusals_at_open() {
    let good = write_index(8, &[&[3, 2], &[4]], false);
    // Legacy fairseq magic.
    let mut legacy = b"TNTIDX\0\0".to_vec();
    legacy.extend_from_slice(&[0; 40]);
    assert!(err(&legacy, 18).contains("TNTIDX"), "{}", err(&legacy, 18));
    // Not an index.
    assert!(err(b"hello world, this is text!!!!!!!!!!!", 0).contains("not a Megatron-LM index"));
    // Truncated: inside the header, inside the arrays.
    for cut in [5, 20, 33, good.len() - 1] {
        let e = err(&good[..cut], 18);
        assert!(e.contains("truncated"), "cut {cut}: {e}");
    }
    // Version and dtype.
    let mut v2 = good.clone();
    v2[9] = 2;
    assert!(err(&v2, 18).contains("version 2"));
    for (code, want) in [
        (0u8, "unknown dtype code 0"),
        (9, "unknown dtype code 9"),
        (6, "f64"),
    ] {
        let mut d = good.clone();
        d[17] = code;
        assert!(err(&d, 18).contains(want), "{code}: {}", err(&d, 18));
    }
    // Index / bin size mismatch, both ways, and a partial token.
    assert!(
        err(&good, 16).contains("c.bin: does not match"),
        "{}",
        err(&good, 16)
    );
    assert!(err(&good, 20).contains("holds 20 bytes"));
    assert!(err(&good, 17).contains("whole number"));
    // Document indices that do not end at S, or start elsewhere than 0.
    let mut last = good.clone();
    let at = last.len() - 8;
    last[at..].copy_from_slice(&2i64.to_le_bytes());
    assert!(err(&last, 18).contains("from 0 to 2"), "{}", err(&last, 18));
    // First pointer not 0.
    let mut p0 = good.clone();
    p0[34 + 12..34 + 20].copy_from_slice(&2i64.to_le_bytes());
    assert!(err(&p0, 18).contains("sequence 0 starts at byte 2"));
    // Zero document indices.
    let mut d0 = good[..34].to_vec();
    d0[18..26].copy_from_slice(&0u64.to_le_bytes());
    d0[26..34].copy_from_slice(&0u64.to_le_bytes());
    assert!(err(&d0, 0).contains("0 document indices"));
}

#[test]
fn overflowing_and_huge_counts_allocate_nothing() {
    let good = write_index(8, &[&[3]], false);
    for (s, d) in [
        (u64::MAX, 1),
        (1, u64::MAX),
        (u64::MAX / 12, u64::MAX / 16),
        (1 << 61, 1 << 61),
    ] {
        let mut h = good.clone();
        h[18..26].copy_from_slice(&s.to_le_bytes());
        h[26..34].copy_from_slice(&d.to_le_bytes());
        let e = err(&h, 6);
        assert!(
            e.contains("damaged") || e.contains("truncated"),
            "{s} {d}: {e}"
        );
    }
    // A huge but representable count on a "file" that claims to be that large: open reads
    // only a few values at the ends (here, far beyond the bytes there are).
    let mut h = good.clone();
    let s = 100_000_000u64;
    h[18..26].copy_from_slice(&s.to_le_bytes());
    h[26..34].copy_from_slice(&2u64.to_le_bytes());
    let claimed = 34 + 12 * s + 16;
    let e = MegatronIndex::open(Path::new("c.idx"), &h, claimed, 6)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ends at byte"), "{e}");
}

#[test]
fn verify_finds_what_open_does_not() {
    let good = write_index(8, &[&[3, 2], &[4]], false);
    let ptr = |i: usize| 34 + 4 * 3 + 8 * i;
    // Pointers out of order (sequence 1 points at byte 0): open passes, lookups return
    // the range the pointer names, verify refuses.
    let mut p = good.clone();
    p[ptr(1)..ptr(1) + 8].copy_from_slice(&0i64.to_le_bytes());
    let ix = open(&p, 18).unwrap();
    assert_eq!(ix.sequence(&p, 1).unwrap(), 0..2);
    assert!(
        ix.verify(&p)
            .unwrap_err()
            .to_string()
            .contains("sequence 1 starts at byte 0")
    );
    // A pointer inside a token, and one beyond the .bin: refused by the lookup itself.
    for (bad, want) in [
        (3i64, "token boundary"),
        (1 << 40, "token boundary"),
        (-2, "starts at byte -2"),
    ] {
        let mut q = good.clone();
        q[ptr(1)..ptr(1) + 8].copy_from_slice(&bad.to_le_bytes());
        let ix = open(&q, 18).unwrap();
        let e = ix.sequence(&q, 1).unwrap_err().to_string();
        assert!(e.contains(want), "{bad}: {e}");
    }
    // A negative length (not the last, which open checks).
    let mut n = good.clone();
    n[34 + 4..34 + 8].copy_from_slice(&(-1i32).to_le_bytes());
    let ix = open(&n, 18).unwrap();
    assert!(
        ix.sequence(&n, 1)
            .unwrap_err()
            .to_string()
            .contains("length -1")
    );
    assert!(ix.verify(&n).is_err());
    // Lengths that do not add up to the .bin (the last sequence still ends there).
    let mut l = good.clone();
    l[34..38].copy_from_slice(&2i32.to_le_bytes());
    let ix = open(&l, 18).unwrap();
    assert!(ix.verify(&l).is_err());
    // Document indices that decrease.
    let mut d = write_index(8, &[&[3], &[2], &[4]], false);
    let di = 34 + 12 * 3;
    d[di + 8..di + 16].copy_from_slice(&2i64.to_le_bytes());
    d[di + 16..di + 24].copy_from_slice(&1i64.to_le_bytes());
    let ix = open(&d, 18).unwrap();
    let e = ix.verify(&d).unwrap_err().to_string();
    assert!(e.contains("less than the one before"), "{e}");
    assert!(
        ix.document(&d, 1)
            .unwrap_err()
            .to_string()
            .contains("not an ordered range")
    );
    let mut v = Vec::new();
    assert!(
        ix.for_each_end(&d, Unit::Document, |e| {
            v.push(e);
            Ok(())
        })
        .is_err()
    );
}

#[test]
fn verify_streams_across_blocks() {
    // More sequences than one block of pointers holds (BLOCK / 8 = 131,072).
    let n = 300_000usize;
    let lens: Vec<i32> = (0..n).map(|i| (i % 7) as i32).collect();
    let idx = write_index(8, &[&lens[..100_000], &lens[100_000..]], false);
    let tokens: u64 = lens.iter().map(|&l| l as u64).sum();
    let ix = open(&idx, 2 * tokens).unwrap();
    let v = ix.verify(&idx).unwrap();
    assert_eq!(v.sequences, n as u64);
    assert_eq!(
        v.empty_sequences,
        lens.iter().filter(|&&l| l == 0).count() as u64
    );
    let e = ends(&ix, &idx, Unit::Sequence);
    assert_eq!(e.len(), n);
    assert_eq!(*e.last().unwrap(), tokens);
    assert_eq!(ix.sequence(&idx, 200_000).unwrap().end, e[200_000]);
    let first: u64 = lens[..100_000].iter().map(|&l| l as u64).sum();
    assert_eq!(ends(&ix, &idx, Unit::Document), [first, tokens]);
}

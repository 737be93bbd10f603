//! Every format in the tables, the refusals, and the width heuristic on synthetic tokens.

use super::*;

fn probe<'a>(name: &'a str, bytes: &'a [u8]) -> Probe<'a> {
    let cut = bytes.len().min(PROBE);
    Probe {
        name,
        head: &bytes[..cut],
        tail: &bytes[bytes.len() - cut..],
        len: bytes.len() as u64,
    }
}

fn refused(name: &str, bytes: &[u8]) -> Refusal {
    sniff(&probe(name, bytes)).expect_err(name)
}

/// `n` u16 tokens of a GPT-2-like vocabulary.
fn u16_tokens(n: usize) -> Vec<u8> {
    (0..n as u64)
        .map(|i| ((i * 7919 + 13) % 50257) as u16)
        .flat_map(u16::to_le_bytes)
        .collect()
}

fn u32_tokens(n: usize, vocab: u64) -> Vec<u8> {
    (0..n as u64)
        .flat_map(|i| (((i * 7919 + 13) % vocab) as u32).to_le_bytes())
        .collect()
}

fn llmc_file(magic: i32, version: i32, count: i32, tokens: &[u8]) -> Vec<u8> {
    let mut header = [0i32; 256];
    header[..3].copy_from_slice(&[magic, version, count]);
    let mut out: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
    out.extend_from_slice(tokens);
    out
}

#[test]
fn llmc_shards_of_both_versions() {
    let f = llmc_file(20240520, 1, 500, &u16_tokens(500));
    assert_eq!(
        sniff(&probe("a.bin", &f)),
        Ok(Kind::Llmc {
            magic: 20240520,
            version: 1,
            dtype: ScalarType::U16,
            tokens: 500
        })
    );
    let f = llmc_file(20240801, 7, 300, &u32_tokens(300, 128256));
    assert!(matches!(
        sniff(&probe("b.bin", &f)),
        Ok(Kind::Llmc {
            dtype: ScalarType::U32,
            tokens: 300,
            ..
        })
    ));
    let empty = llmc_file(20240520, 1, 0, &[]);
    assert!(matches!(
        sniff(&probe("e.bin", &empty)),
        Ok(Kind::Llmc { tokens: 0, .. })
    ));
    let r = refused("v.bin", &llmc_file(20240520, 2, 500, &u16_tokens(500)));
    assert!(
        r.what.contains("unknown version") && r.what.contains("version 2"),
        "{r:?}"
    );
    assert!(
        r.todo.contains("magic 20240801 version 7 (u32 tokens)"),
        "{r:?}"
    );
    let r = refused("n.bin", &llmc_file(20240520, 1, 501, &u16_tokens(500)));
    assert!(
        r.what.contains("says 501 tokens (1002 bytes)") && r.what.contains("holds 1000 bytes"),
        "{r:?}"
    );
    let r = refused("neg.bin", &llmc_file(20240801, 7, -4, &u32_tokens(4, 9)));
    assert!(r.what.contains("says -4 tokens"), "{r:?}");
    let r = refused("short.bin", &20240520u32.to_le_bytes());
    assert!(
        r.what.contains("shorter than its 1,024-byte header"),
        "{r:?}"
    );
    let r = refused("eval.bin", &llmc_file(20240522, 1, 10, &u16_tokens(100)));
    assert!(r.what.contains("llm.c eval file"), "{r:?}");
}

#[test]
fn npy_and_jsonl() {
    let h = npy::header("'<u2'", &[3]).unwrap();
    let mut f = h.clone();
    f.extend_from_slice(&[1, 0, 2, 0, 3, 0]);
    assert_eq!(sniff(&probe("x.bin", &f)), Ok(Kind::Npy));
    // Headerless, as Dolma writes OLMo's token files: raw.
    assert_eq!(sniff(&probe("x.npy", &u16_tokens(100))), Ok(Kind::Raw));
    let doc = b"{\"tokens\": [1, 2, 3]}\n{\"tokens\": [4]}\n";
    assert_eq!(sniff(&probe("d.jsonl", doc)), Ok(Kind::Jsonl));
    assert_eq!(sniff(&probe("d.NDJSON", doc)), Ok(Kind::Jsonl));
    let r = refused("d.bin", doc);
    assert!(r.heuristic && r.what == "JSON Lines text, not token ids" && r.todo.contains(".jsonl"));
}

#[test]
fn each_magic_is_refused_with_what_to_do() {
    let tokens = u16_tokens(64);
    let with = |head: &[u8], end: &[u8]| {
        let mut v = head.to_vec();
        v.extend_from_slice(&tokens);
        v.extend_from_slice(end);
        v
    };
    let mut megatron = b"MMIDIDX\0\0".to_vec();
    megatron.extend_from_slice(&1u64.to_le_bytes());
    megatron.push(8);
    megatron.extend_from_slice(&[0; 32]);
    let mut tar = vec![0u8; 1024];
    tar[257..263].copy_from_slice(b"ustar\0");
    // A local file header (30 bytes, the name length at 26) naming archive/data.pkl.
    let mut zip = b"PK\x03\x04\x14\0".to_vec();
    zip.resize(26, 0);
    zip.extend_from_slice(&[16, 0, 0, 0]);
    zip.extend_from_slice(b"archive/data.pkl");
    zip.extend_from_slice(&tokens);
    zip.extend_from_slice(b"PK\x05\x06\0\0\0\0\x01\0\x01\0\0\0\0\0\0\0\0\0\0\0");
    // Tables of token lists are recognised as tables (a copy converts them).
    for (name, bytes) in [
        ("t.parquet", with(b"PAR1", b"PAR1")),
        ("t.arrow", with(b"ARROW1\0\0", b"ARROW1")),
    ] {
        assert_eq!(sniff(&probe(name, &bytes)), Ok(Kind::Table), "{name}");
    }
    let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        (
            "t.idx",
            megatron,
            "Megatron-LM index (.idx) of u16",
            "PREFIX.bin instead",
        ),
        (
            "a.ds.index",
            u16_tokens(16),
            "datatrove document index",
            ".ds token file",
        ),
        (
            "a.ds.loss",
            vec![1; 64],
            "datatrove loss mask",
            ".ds token file",
        ),
        (
            "a.ds.metadata",
            b"gpt2\n1000\n1.0 kT".to_vec(),
            "datatrove metadata",
            ".ds",
        ),
        (
            "t.gz",
            with(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 2, 3], b""),
            "gzip",
            "gunzip",
        ),
        (
            "t.zst",
            with(&[0x28, 0xb5, 0x2f, 0xfd, 0x60], b""),
            "zstd",
            "zstd -d",
        ),
        ("t.bz2", with(b"BZh91AY&SY", b""), "bzip2", "bunzip2"),
        (
            "t.xz",
            with(&[0xfd, b'7', b'z', b'X', b'Z', 0, 0, 4], b""),
            "xz",
            "xz -dk",
        ),
        (
            "t.lz4",
            with(&[0x04, 0x22, 0x4d, 0x18, 0x64, 0x40], b""),
            "lz4",
            "lz4 -d",
        ),
        ("t.pt", zip.clone(), "PyTorch checkpoint", "torch.load"),
        ("t.tar", tar, "tar archive", "tar -xf"),
    ];
    for (name, bytes, what, todo) in cases {
        let r = refused(name, &bytes);
        assert!(!r.heuristic, "{name}");
        assert!(r.what.contains(what), "{name}: {r:?}");
        assert!(r.todo.contains(todo), "{name}: {r:?}");
    }
    let mut plain_zip = zip;
    plain_zip[30..46].copy_from_slice(b"archive/data.bin");
    assert_eq!(
        refused("t.zip", &plain_zip).what,
        "zip archive, not token ids"
    );
}

#[test]
fn arrow_stream_as_pyarrow_writes_it() {
    // The first 48 bytes pyarrow 26 writes for a stream (a Schema message), then padding.
    let mut f = hex(
        "ff ff ff ff 08 01 00 00 10 00 00 00 00 00 0a 00 0e 00 06 00 05 00 08 00 0a 00 00 00 \
         00 01 04 00 10 00 00 00 00 00 0a 00 0c 00 00 00 04 00 08 00",
    );
    f.resize(8 + 0x108 + 64, 0);
    assert_eq!(
        sniff(&probe("data-00000-of-00001.arrow", &f)),
        Ok(Kind::Table)
    );
    // A header type other than Schema, or random bytes after the marker, are not.
    let mut record_batch = f.clone();
    record_batch[29] = 3;
    assert_eq!(sniff(&probe("x.bin", &record_batch)), Ok(Kind::Raw));
    let mut noise = vec![0xff; 4];
    noise.extend_from_slice(&u16_tokens(200));
    assert_eq!(sniff(&probe("x.bin", &noise)), Ok(Kind::Raw));
}

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn text_is_refused_by_heuristic_and_tokens_are_not_text() {
    let r = refused(
        "c.txt",
        b"First Citizen:\nBefore we proceed any further, hear me.\n",
    );
    assert!(
        r.heuristic && r.what == "plain text, not token ids",
        "{r:?}"
    );
    let r = refused("j.bin", b"  {\"input_ids\": [1, 2, 3, 4, 5, 6]}");
    assert!(r.heuristic && r.what == "JSON text, not token ids", "{r:?}");
    let r = refused("j.bin", "[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n".as_bytes());
    assert_eq!(r.what, "JSON text, not token ids");
    // UTF-8 cut at the end of the head of a longer file is still text.
    let mut long = format!("a{}", "é".repeat(PROBE));
    long.push('\n');
    assert!(
        refused("u.txt", long.as_bytes())
            .what
            .starts_with("plain text")
    );
    // Token data is not text: positional u8, u16 and u32 tokens, a short file.
    let u8s: Vec<u8> = (0..=255u8).collect();
    for bytes in [
        u8s,
        u16_tokens(4096),
        u32_tokens(4096, 128256),
        b"abcdefgh".to_vec(),
    ] {
        assert_eq!(sniff(&probe("t.bin", &bytes)), Ok(Kind::Raw));
    }
}

/// The width check on a whole buffer.
fn guess(bytes: &[u8], declared: ScalarType) -> Option<ScalarType> {
    width_of_samples(&[bytes.to_vec()], declared).map(|g| g.looks_like)
}

#[test]
fn width_of_wider_tokens_read_narrow() {
    use ScalarType::*;
    for vocab in [50257, 128256, 262144] {
        let u32s = u32_tokens(100_000, vocab);
        assert_eq!(guess(&u32s, U16), Some(U32), "vocab {vocab}");
        assert_eq!(guess(&u32s, U32), None);
        let u64s: Vec<u8> = u32s
            .chunks(4)
            .flat_map(|c| u64::from(u32::from_le_bytes(c.try_into().unwrap())).to_le_bytes())
            .collect();
        assert_eq!(guess(&u64s, U32), Some(U64));
        assert_eq!(guess(&u64s, I32), Some(I64));
        assert_eq!(guess(&u64s, U16), Some(U64));
        assert_eq!(guess(&u64s, U64), None);
    }
    // i64 with -100 (ignore index) among the tokens, read as i32.
    let i64s: Vec<u8> = (0..10_000i64)
        .flat_map(|i| (if i % 10 == 0 { -100 } else { i * 31 % 50257 }).to_le_bytes())
        .collect();
    assert_eq!(guess(&i64s, I32), Some(I64));
    assert_eq!(guess(&i64s, I64), None);
    // Small u16 tokens read as u8.
    let small: Vec<u8> = (0..10_000u16)
        .flat_map(|i| (i % 2000).to_le_bytes())
        .collect();
    assert_eq!(guess(&small, U8), Some(U16));
}

#[test]
fn width_of_narrower_tokens_read_wide() {
    use ScalarType::*;
    let u16s = u16_tokens(100_000);
    assert_eq!(guess(&u16s, U32), Some(U16));
    assert_eq!(guess(&u16s, I32), Some(U16));
    assert_eq!(guess(&u16s, U64), Some(U16));
    assert_eq!(guess(&u16s, I64), Some(U16));
    let u32s = u32_tokens(100_000, 128256);
    assert_eq!(guess(&u32s, U64), Some(U32));
    assert_eq!(guess(&u32s, I64), Some(I32));
    let g = width_of_samples(&[u16s], U32).unwrap();
    assert!(
        g.evidence.contains("beyond any vocabulary (above 524288)"),
        "{g:?}"
    );
}

#[test]
fn width_accepts_real_token_data_of_any_vocabulary() {
    use ScalarType::*;
    // Character-level u16 (vocabulary 65), byte-level u8, DNA (vocabulary 4), a
    // constant stream, GPT-2 u16, Llama-3 and Gemma u32, and positional data.
    let char_level: Vec<u8> = (0..50_000u64)
        .map(|i| ((i * 31 + i / 7) % 65) as u16)
        .flat_map(u16::to_le_bytes)
        .collect();
    let dna: Vec<u8> = (0..50_000u64)
        .map(|i| ((i * 2654435761) >> 7) as u16 % 4)
        .flat_map(u16::to_le_bytes)
        .collect();
    let bytes: Vec<u8> = (0..100_000u64).map(|i| (i * 131 % 251) as u8).collect();
    let zeros = vec![0u8; 100_000];
    let positional: Vec<u8> = (0..100_000u32)
        .flat_map(|i| (i as u16).to_le_bytes())
        .collect();
    let positional32: Vec<u8> = (0..100_000u32).flat_map(u32::to_le_bytes).collect();
    for (what, data, t) in [
        ("char-level", &char_level, U16),
        ("dna", &dna, U16),
        ("bytes", &bytes, U8),
        ("zeros u16", &zeros, U16),
        ("zeros u32", &zeros, U32),
        ("gpt-2", &u16_tokens(100_000), U16),
        ("llama-3", &u32_tokens(100_000, 128256), U32),
        ("llama-3 i32", &u32_tokens(100_000, 128256), I32),
        ("gemma", &u32_tokens(100_000, 262144), U32),
        ("positional u16", &positional, U16),
        ("positional u32", &positional32, U32),
    ] {
        assert_eq!(guess(data, t), None, "{what}");
    }
    // Large positional values (token i is i) at their own width, and read narrow.
    let pos32: Vec<u8> = (0..500_000u32)
        .map(|i| i * 20)
        .flat_map(u32::to_le_bytes)
        .collect();
    assert_eq!(
        guess(&pos32, U32),
        None,
        "positional u32 beyond the vocabulary bound"
    );
    assert_eq!(guess(&pos32, U64), Some(U32));
    let pos64: Vec<u8> = (0..200_000u64)
        .map(|i| i * 30_000)
        .flat_map(u64::to_le_bytes)
        .collect();
    assert_eq!(guess(&pos64, U64), None);
    assert_eq!(guess(&pos32, U16), Some(U32), "near-constant high halves");
    // Too few values to judge.
    assert_eq!(guess(&u32_tokens(100, 50257), U16), None);
}

#[test]
fn sample_windows_are_fixed_aligned_and_bounded() {
    assert_eq!(sample_windows(1000), vec![(0, 1000)]);
    assert_eq!(sample_windows(SAMPLE_BYTES), vec![(0, SAMPLE_BYTES)]);
    for bytes in [SAMPLE_BYTES + 1, 1 << 30, 5 << 40, u64::MAX / 2] {
        let w = sample_windows(bytes);
        assert_eq!(w.len() as u64, WINDOWS);
        assert_eq!(w[0].0, 0);
        assert!(
            w.iter()
                .all(|&(at, len)| at % 8 == 0 && len == WINDOW && at + len <= bytes)
        );
        assert!(
            w.windows(2).all(|p| p[0].0 + p[0].1 <= p[1].0),
            "disjoint, in order"
        );
        assert!(
            w[15].0 + WINDOW > bytes - 32,
            "the last window reaches the end"
        );
    }
}

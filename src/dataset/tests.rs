//! The dataset's unit tests: exact reads of every range over in-memory shards, files that are
//! not regular refused without blocking, and damaged document files refused naming the file.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::format::{MANIFEST, Manifest, ShardEntry, content_hash, format_hash};

/// A dataset of u8 records 0..total split into shards of the given sizes.
fn memory_dataset(sizes: &[u64]) -> (Dataset, Vec<u8>) {
    let total: u64 = sizes.iter().sum();
    let stream: Vec<u8> = (0..total).map(|i| (i * 7 % 251) as u8).collect();
    let mut entries = Vec::new();
    let mut shards = Vec::new();
    let mut start = 0usize;
    for (i, &len) in sizes.iter().enumerate() {
        let bytes = stream[start..start + len as usize].to_vec();
        start += len as usize;
        entries.push(ShardEntry {
            path: format!("s{i}"),
            records: len,
            bytes: len,
            hash: format_hash(0),
            offset: 0,
            source_format: None,
            etag: None,
            docs: None,
            in_place_mtime_ns: None,
            in_place_guard: None,
            checksums: None,
        });
        shards.push(Shard::new(format!("s{i}"), len, Arc::new(bytes)));
    }
    let manifest = Manifest {
        format: crate::format::FORMAT_NAME.into(),
        version: crate::format::VERSION,
        dtype: "|u1".into(),
        itemsize: 1,
        records: total,
        content_hash: content_hash(&entries),
        shards: entries,
        documents: None,
        metadata: false,
        created_by: "test".into(),
    };
    (Dataset::from_parts("mem".into(), manifest, shards), stream)
}

#[test]
fn every_range_reads_exactly() {
    let (ds, stream) = memory_dataset(&[5, 1, 7, 3]);
    let n = stream.len() as u64;
    for start in 0..=n {
        for end in start..=n {
            let mut buf = vec![0xEE; (end - start) as usize];
            ds.read_stream(start, &mut buf).unwrap();
            assert_eq!(buf, &stream[start as usize..end as usize], "{start}..{end}");
        }
    }
    let mut buf = [0u8; 2];
    assert!(ds.read_stream(n - 1, &mut buf).is_err());
    assert!(ds.read_stream(u64::MAX, &mut buf).is_err());
}

/// Packs 1000 u16 tokens `p % 10` in shards of 1 KiB, with documents ended by token 9.
fn packed(dir: &Path) -> (PathBuf, Manifest) {
    let input = dir.join("t.bin");
    let tokens: Vec<u8> = (0..1000u16).flat_map(|p| (p % 10).to_le_bytes()).collect();
    std::fs::write(&input, tokens).unwrap();
    let ds = dir.join("ds");
    let options = crate::pack::PackOptions {
        dtype: Some(crate::format::dtype::ScalarType::U16),
        shard_size: 1024,
        doc_sep: Some(9),
        ..crate::pack::PackOptions::default()
    };
    let manifest = crate::pack::pack(&ds, &[input], &options).unwrap();
    (ds.canonicalize().unwrap(), manifest)
}

#[test]
fn a_fifo_or_directory_in_place_of_a_listed_file_is_refused_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    let (ds, manifest) = packed(tmp.path());
    let docs = manifest.shards[1].docs.clone().unwrap();
    for (name, make_fifo) in [
        (manifest.shards[0].path.clone(), true),
        (docs.docs.clone(), true),
        (docs.docs.clone(), false),
    ] {
        let path = ds.join(&name);
        let saved = std::fs::read(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        if make_fifo {
            nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        } else {
            std::fs::create_dir(&path).unwrap();
        }
        // Opening a FIFO for reading used to wait for a writer: a mount that never
        // returned. Opened on a thread so that a regression fails instead of hanging.
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = ds.clone();
        std::thread::spawn(move || tx.send(Dataset::open(&dir).map(|_| ())).unwrap());
        let result = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| {
                // Unblock the stuck open before failing.
                let _ = std::fs::OpenOptions::new().write(true).open(&path);
                panic!("{name}: Dataset::open blocked on a FIFO")
            });
        let msg = result.unwrap_err().to_string();
        assert!(
            msg.starts_with(&format!("{}: ", path.display()))
                && msg.contains("is not a regular file")
                && msg.contains("re-run `shufflefs pack`"),
            "{msg}"
        );
        if make_fifo {
            std::fs::remove_file(&path).unwrap();
        } else {
            std::fs::remove_dir(&path).unwrap();
        }
        std::fs::write(&path, saved).unwrap();
    }
    Dataset::open(&ds).unwrap();
}

/// JSON Lines documents `k` of `1 + (5k) % 7` u16 tokens (their positions); odd ones
/// start with a one-token span. Shards of 16 records, at most `max_entries` entries each.
fn packed_documents(dir: &Path, max_entries: u64) -> (PathBuf, Manifest, Vec<(u64, u64)>) {
    let mut lines = String::new();
    let (mut pos, mut docs) = (0u64, Vec::new());
    for k in 0..40u64 {
        let len = 1 + (k * 5) % 7;
        let tokens: Vec<u64> = (pos..pos + len).collect();
        let spans = if k % 2 == 1 {
            format!(r#", "spans": [{{"start": 0, "end": 1, "meta":  {{"s": {k}}}  }}]"#)
        } else {
            String::new()
        };
        // Whitespace around values: pack stores each value's own text.
        lines.push_str(&format!(
            "{{\"tokens\": {tokens:?}, \"meta\": \t {k} {spans}}}"
        ));
        lines.push('\n');
        docs.push((pos, len));
        pos += len;
    }
    let input = dir.join("docs.jsonl");
    std::fs::write(&input, lines).unwrap();
    let ds = dir.join("ds");
    let options = crate::pack::PackOptions {
        dtype: Some(crate::format::dtype::ScalarType::U16),
        shard_size: 32,
        max_entries_per_shard: Some(max_entries),
        ..crate::pack::PackOptions::default()
    };
    let manifest = crate::pack::pack(&ds, &[input], &options).unwrap();
    (ds, manifest, docs)
}

#[test]
fn read_checks_accept_every_packed_document() {
    for max_entries in [2, 3, 4, 1 << 32] {
        let tmp = tempfile::tempdir().unwrap();
        let (ds, manifest, docs) = packed_documents(tmp.path(), max_entries);
        let dataset = Dataset::open(&ds).unwrap();
        for (d, &(start, len)) in docs.iter().enumerate() {
            let doc = dataset.document(d as u64).unwrap();
            assert_eq!(
                (doc.start, doc.len, doc.meta.get()),
                (start, len, d.to_string().as_str())
            );
            dataset.spans(start, len).unwrap();
        }
        for first in (0..manifest.records).step_by(5) {
            dataset.spans(first, manifest.records - first).unwrap();
        }
    }
}

/// (what, file name, edit, expected words of the error).
type Damage<'a> = (
    &'static str,
    String,
    Box<dyn Fn(&mut Vec<u8>) + 'a>,
    &'static str,
);

#[test]
fn same_size_damage_to_document_files_fails_the_read() {
    // Each edit keeps every file's size, so the dataset opens; before these checks each
    // served a wrong document range or wrong metadata under the same fingerprint.
    let tmp = tempfile::tempdir().unwrap();
    let (ds, mut manifest, docs) = packed_documents(tmp.path(), 1 << 32);
    // Without the document checksums (which would refuse every edit first), as a
    // dataset packed before them: these are the checks that remain.
    for s in &mut manifest.shards {
        if let Some(d) = s.docs.as_mut() {
            d.checksums = None;
        }
    }
    manifest.content_hash = manifest.expected_content_hash();
    std::fs::write(ds.join(MANIFEST), manifest.to_bytes()).unwrap();
    let shard = |k: usize| manifest.shards[k].docs.clone().unwrap();
    let edit = |name: &str, f: &dyn Fn(&mut Vec<u8>)| {
        let path = ds.join(name);
        let pristine = std::fs::read(&path).unwrap();
        let mut bytes = pristine.clone();
        f(&mut bytes);
        assert_eq!(bytes.len(), pristine.len());
        std::fs::write(&path, &bytes).unwrap();
        (path, pristine)
    };
    let u64_at = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    let put = |b: &mut Vec<u8>, i: usize, v: u64| b[i..i + 8].copy_from_slice(&v.to_le_bytes());
    // The first shard with at least two documents, and its first document's number.
    let k = (0..manifest.shards.len())
        .find(|&k| shard(k).documents >= 2)
        .unwrap();
    let cases: Vec<Damage<'_>> = vec![
        (
            "one more record in a document",
            shard(k).docs,
            Box::new(move |b| put(b, 8, u64_at(b, 8) + 1)),
            "does not fit its place",
        ),
        (
            "two document records swapped",
            shard(k).docs,
            Box::new(|b| {
                let first: Vec<u8> = b[..24].to_vec();
                b.copy_within(24..48, 0);
                b[24..48].copy_from_slice(&first);
            }),
            "does not fit its place",
        ),
        (
            "a document's entry pointing at another entry",
            shard(k).docs,
            Box::new(move |b| put(b, 16, u64_at(b, 16) + 1)),
            "is not its own",
        ),
        (
            "an entry naming a document past the end",
            shard(k).meta.unwrap(),
            Box::new(|b| put(b, 0, 1 << 40)),
            "document out of range",
        ),
        (
            "an entry offset near u64::MAX (overflowed the check)",
            shard(k).index.unwrap(),
            Box::new(|b| put(b, 0, u64::MAX - 7)),
            "entry offsets",
        ),
        (
            "the first entry offset not 0",
            shard(k).index.unwrap(),
            Box::new(|b| put(b, 0, 1)),
            "entry offsets",
        ),
    ];
    for (what, name, f, want) in &cases {
        let (path, pristine) = edit(name, f.as_ref());
        let dataset = Dataset::open(&ds).unwrap();
        let mut errors = Vec::new();
        for (d, &(start, len)) in docs.iter().enumerate() {
            errors.extend(dataset.document(d as u64).err());
            errors.extend(dataset.spans(start, len).err());
        }
        let msg = errors
            .iter()
            .map(|e| e.to_string())
            .find(|m| m.contains(want))
            .unwrap_or_else(|| panic!("{what}: no error says {want:?}: {errors:?}"));
        assert!(msg.contains(&name[..name.len() - 4]), "{what}: {msg}");
        assert!(msg.ends_with("re-run `shufflefs pack`"), "{what}: {msg}");
        std::fs::write(&path, pristine).unwrap();
    }
    // Damage only a whole pass over the stream's metadata can see.
    let offsets = |k: usize| -> Vec<usize> {
        let idx = std::fs::read(ds.join(shard(k).index.unwrap())).unwrap();
        idx.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()) as usize)
            .collect()
    };
    let idx = offsets(k);
    let whole: Vec<Damage<'_>> = vec![
        (
            "ids jumping to an entry of a document two or more away",
            shard(k).ids.unwrap(),
            Box::new(|b| {
                let last = b.len() - 4;
                b.copy_within(0..4, last);
            }),
            "follow records of document",
        ),
        (
            "every entry numbered 0",
            shard(k).meta.unwrap(),
            Box::new(move |b| {
                for &at in &idx[..idx.len() - 1] {
                    b[at + 8..at + 16].fill(0);
                }
            }),
            "follow records of document",
        ),
        (
            "metadata text with a trailing space",
            (0..manifest.shards.len())
                .map(|j| shard(j).meta.unwrap())
                .find(|m| {
                    let b = std::fs::read(ds.join(m)).unwrap();
                    b.windows(5).any(|w| w == b"\"s\": ")
                })
                .unwrap(),
            Box::new(|b| {
                let at = b.windows(5).position(|w| w == b"\"s\": ").unwrap();
                let end = at + b[at..].iter().position(|&c| c == b'}').unwrap();
                b.copy_within(at + 5..=end, at + 4);
                b[end] = b' ';
            }),
            "whitespace around its JSON value",
        ),
    ];
    for (what, name, f, want) in &whole {
        let (path, pristine) = edit(name, f.as_ref());
        let dataset = Dataset::open(&ds).unwrap();
        let msg = dataset
            .spans(0, manifest.records)
            .expect_err(what)
            .to_string();
        assert!(msg.contains(want), "{what}: {msg}");
        std::fs::write(&path, pristine).unwrap();
    }
}

#[test]
fn document_files_swapped_with_their_checksum_files_are_refused() {
    // Documents of 8 u16 tokens with one-digit metadata, two per 16-record shard: every
    // shard's files have the same sizes, so two shards' files can be swapped whole.
    let tmp = tempfile::tempdir().unwrap();
    let lines: String = (0..8u64)
        .map(|k| {
            let tokens: Vec<u64> = (k * 8..k * 8 + 8).collect();
            format!("{{\"tokens\": {tokens:?}, \"meta\": {k}}}\n")
        })
        .collect();
    let input = tmp.path().join("docs.jsonl");
    std::fs::write(&input, lines).unwrap();
    let ds = tmp.path().join("ds");
    let options = crate::pack::PackOptions {
        dtype: Some(crate::format::dtype::ScalarType::U16),
        shard_size: 32,
        ..crate::pack::PackOptions::default()
    };
    let manifest = crate::pack::pack(&ds, &[input], &options).unwrap();
    assert_eq!(manifest.shards.len(), 4);
    let pristine = Dataset::open(&ds).unwrap();
    let want: Vec<_> = (0..8).map(|d| pristine.document(d).unwrap()).collect();
    drop(pristine);
    let files = |k: usize| {
        let s = &manifest.shards[k];
        let d = s.docs.as_ref().unwrap();
        let c = d.checksums.as_ref().unwrap();
        [
            &s.path,
            d.ids.as_ref().unwrap(),
            d.index.as_ref().unwrap(),
            d.meta.as_ref().unwrap(),
            &d.docs,
            &c.file,
        ]
        .map(|n| ds.join(n))
    };
    for (a, b) in files(1).iter().zip(files(2).iter()) {
        assert_eq!(
            std::fs::metadata(a).unwrap().len(),
            std::fs::metadata(b).unwrap().len()
        );
        let tmp = a.with_extension("swap");
        std::fs::rename(a, &tmp).unwrap();
        std::fs::rename(b, a).unwrap();
        std::fs::rename(&tmp, b).unwrap();
    }
    let dataset = Dataset::open(&ds).unwrap();
    let mut refused = 0;
    for (d, want) in want.iter().enumerate() {
        match dataset.document(d as u64) {
            Ok(doc) => assert_eq!(&doc, want, "document {d} served from another shard"),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(".docsums: this checksum file does not hash to"),
                    "{msg}"
                );
                refused += 1;
            }
        }
    }
    // The documents of the two swapped shards, and the last one before them (its end is
    // checked against the next shard's first document).
    assert_eq!(refused, 5, "the documents of the two swapped shards");
}

struct Truncated(Vec<u8>);
impl ReadAt for Truncated {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        // Delivers at most 3 bytes per call and pretends the file ends at byte 4.
        let short = self.0[..4].to_vec();
        let len = buf.len().min(3);
        short.read_at(&mut buf[..len], offset)
    }
}

#[test]
fn short_source_is_an_error_never_partial_data() {
    let (mut ds, stream) = memory_dataset(&[10]);
    ds.shards[0] = Shard::new("s0", 10, Arc::new(Truncated(stream.clone())));
    let mut buf = [0u8; 4];
    ds.read_stream(0, &mut buf).unwrap();
    assert_eq!(&buf, &stream[..4], "short reads are retried");
    let mut buf = [0u8; 6];
    match ds.read_stream(2, &mut buf) {
        Err(Error::ShortRead {
            offset,
            wanted,
            got,
            ..
        }) => assert_eq!((offset, wanted, got), (2, 6, 2)),
        other => panic!("expected ShortRead, got {other:?}"),
    }
}

/// Every single-field change to a compact docs file (no checksums: an in-place dataset) is
/// either refused or changes nothing the dataset answers: never a wrong document or span.
#[test]
fn damaged_compact_docs_never_give_a_wrong_document() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("t.bin");
    // u16 tokens; a document ends after each 9: lengths 1..=10, over 3 shards' worth.
    let tokens: Vec<u8> = (0..600u32)
        .flat_map(|p| (if p % 11 == 5 || p % 7 == 0 { 9u16 } else { 1 }).to_le_bytes())
        .collect();
    let half = tokens.len() / 2;
    std::fs::write(&input, &tokens[..half]).unwrap();
    let input2 = tmp.path().join("u.bin");
    std::fs::write(&input2, &tokens[half..]).unwrap();
    let ds = tmp.path().join("ds");
    let options = crate::pack::PackOptions {
        dtype: Some(crate::format::dtype::ScalarType::U16),
        doc_sep: Some(9),
        ..crate::pack::PackOptions::default()
    };
    let manifest = crate::pack::pack_in_place(&ds, &[input, input2], &options).unwrap();
    let n_docs = manifest.documents.unwrap();
    assert!(
        manifest
            .shards
            .iter()
            .all(|s| s.docs.as_ref().unwrap().is_compact())
    );
    let answers = |d: &Dataset| {
        let docs: Vec<_> = (0..n_docs)
            .map(|k| d.document(k).map(|x| (x.start, x.len)).ok())
            .collect();
        let spans: Vec<_> = (0..300u64)
            .step_by(7)
            .map(|r| {
                d.spans(r, 13.min(300 - r))
                    .map(|v| {
                        v.iter()
                            .map(|s| (s.start, s.end, s.doc))
                            .collect::<Vec<_>>()
                    })
                    .ok()
            })
            .collect();
        (docs, spans)
    };
    let (good_docs, good_spans) = answers(&Dataset::open(&ds).unwrap());
    assert!(good_docs.iter().all(Option::is_some) && good_spans.iter().all(Option::is_some));
    for shard in &manifest.shards {
        let path = ds.join(&shard.docs.as_ref().unwrap().docs);
        let saved = std::fs::read(&path).unwrap();
        // Each 8-byte field of each record, one up and one down.
        for field in 0..saved.len() / 8 {
            for delta in [1i64, -1] {
                let mut bytes = saved.clone();
                let at = field * 8;
                let v = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
                bytes[at..at + 8].copy_from_slice(&v.wrapping_add_signed(delta).to_le_bytes());
                std::fs::write(&path, &bytes).unwrap();
                let Ok(d) = Dataset::open(&ds) else { continue };
                let (docs, spans) = answers(&d);
                for (k, (got, want)) in docs.iter().zip(&good_docs).enumerate() {
                    assert!(
                        got.is_none() || got == want,
                        "field {field} {delta:+}: doc {k}"
                    );
                }
                for (got, want) in spans.iter().zip(&good_spans) {
                    assert!(
                        got.is_none() || got == want,
                        "field {field} {delta:+}: spans"
                    );
                }
            }
        }
        std::fs::write(&path, &saved).unwrap();
    }
}

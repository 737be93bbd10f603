//! The contract of `bestfit-blocks-v1`, checked by hand-made cases and a proptest.

use super::*;
use proptest::prelude::*;
use std::collections::HashSet;
use std::convert::Infallible;

pub(super) type Len = Result<DocLen, Infallible>;

pub(super) fn with_bos(tokens: &[u64]) -> Vec<DocLen> {
    tokens
        .iter()
        .map(|&tokens| DocLen {
            tokens,
            starts_with_bos: true,
        })
        .collect()
}

pub(super) fn reader(docs: &[DocLen]) -> impl FnMut(u64) -> Len + '_ {
    |d| Ok(docs[d as usize])
}

pub(super) fn config(window: u64, block_docs: u64, seed: u64) -> PackConfig {
    PackConfig {
        block_docs,
        ..PackConfig::new(window, Some(1), seed)
    }
}

pub(super) fn own(lens: &[u64]) -> Vec<Doc> {
    lens.iter()
        .enumerate()
        .map(|(i, &len)| Doc {
            id: 100 + i as u64,
            len,
            bos: false,
            ord: i as u64,
        })
        .collect()
}

pub(super) fn piece(doc: u64, len: u64, cropped: bool) -> Piece {
    Piece {
        doc,
        len,
        bos_prepended: false,
        cropped,
    }
}

#[test]
fn pack_docs_by_hand() {
    // T = 10, 3 rows. Prefix by capped mass 10+6+4+5+3+9 = 37 >= 30: the first six.
    // 12 anchors row 0; 9, 6, 5, 4, 3 best fit into two rows: [9] (1 left), [6, 4];
    // 5 and 3 fit nowhere; the rest (2, 8) fits nowhere; the one short row crops the
    // shortest set-aside document (2) to 1; 5, 3 and 8 are dropped.
    let docs = own(&[12, 6, 4, 5, 3, 9, 2, 8]);
    let p = pack_docs(10, 3, &docs, &mut || None).unwrap();
    let rows: Vec<&[Piece]> = (0..3)
        .map(|i| &p.pieces[if i == 0 { 0 } else { p.ends[i - 1] }..p.ends[i]])
        .collect();
    assert_eq!(rows[0], [piece(100, 10, true)]);
    assert_eq!(rows[1], [piece(105, 9, false), piece(106, 1, true)]);
    assert_eq!(rows[2], [piece(101, 6, false), piece(102, 4, false)]);
    let c = p.counts;
    assert_eq!((c.rows, c.docs, c.docs_used, c.docs_cropped), (3, 8, 5, 2));
    assert_eq!((c.used_tokens, c.cropped_tokens), (33, 3));
    assert_eq!((c.docs_dropped, c.dropped_tokens), (3, 16));
    let unused: Vec<u64> = p.unused_own.iter().map(|d| d.id).collect();
    assert_eq!(unused, [103, 104, 107]);
    assert!(p.borrowed.is_empty());
    // Five rows need a capped mass of 50 > 47: the block borrows what it needs (7), only.
    assert!(pack_docs(10, 5, &docs, &mut || None).is_none());
    let extra = own(&[7, 3]);
    let mut it = extra.iter().copied();
    let p = pack_docs(10, 5, &docs, &mut || it.next()).unwrap();
    assert_eq!(p.counts.docs_borrowed, 1);
    assert_eq!(p.borrowed[0].ord, 8);
    assert_eq!(p.counts.rows, 5);
    assert_eq!(p.ends.len(), 5);
}

#[test]
fn bos_is_prepended_only_when_missing_and_empty_documents_are_skipped() {
    let d = |tokens, starts_with_bos| DocLen {
        tokens,
        starts_with_bos,
    };
    assert_eq!(d(5, false).packed(true), (6, true));
    assert_eq!(d(5, true).packed(true), (5, false));
    assert_eq!(d(5, false).packed(false), (5, false));
    assert_eq!(d(0, false).packed(true), (0, false));
    let p = Piece {
        doc: 0,
        len: 4,
        bos_prepended: true,
        cropped: true,
    };
    assert_eq!(p.doc_tokens(), 0..3);
}

/// Checks one epoch's rows against the contract; returns the documents used per block.
pub(super) fn check_epoch(
    p: &Packer,
    epoch: u64,
    docs: &[DocLen],
    allow_infeasible: bool,
) -> Vec<u64> {
    let t = p.config().window;
    let bos = p.config().bos.is_some();
    let mut seen = HashSet::new();
    let mut used = Vec::new();
    for b in 0..p.blocks() {
        let block = match p.pack_block(epoch, b, reader(docs)) {
            Ok(block) => block,
            Err(PackError::Infeasible { .. }) if allow_infeasible => continue,
            Err(e) => panic!("epoch {epoch} block {b}: {e:?}"),
        };
        assert_eq!(block.rows() as u64, p.rows_per_block());
        for row in block.iter() {
            assert_eq!(row.iter().map(|x| x.len).sum::<u64>(), t, "{row:?}");
            let first = row[0];
            assert!(!bos || first.bos_prepended || docs[first.doc as usize].starts_with_bos);
            for (i, x) in row.iter().enumerate() {
                let (l, prepend) = docs[x.doc as usize].packed(bos);
                assert!(l > 0 && x.len > 0);
                assert_eq!(x.bos_prepended, prepend);
                assert_eq!(x.cropped, x.len < l, "{row:?}");
                assert!(x.len <= l);
                assert!(!x.cropped || i == row.len() - 1, "crop not last: {row:?}");
                if i > 0 && !x.cropped {
                    assert!(row[i - 1].len >= x.len, "not largest first: {row:?}");
                }
                assert!(
                    seen.insert(x.doc),
                    "document {} twice in epoch {epoch}",
                    x.doc
                );
                used.push(x.doc);
            }
        }
    }
    used
}

#[test]
fn rows_are_exact_and_documents_used_once() {
    let lens: Vec<u64> = (0..3000u64).map(|i| 1 + mix(i) % 300).collect();
    let docs = with_bos(&lens);
    let p = Packer::new(config(128, 500, 7), lens.len() as u64, reader(&docs)).unwrap();
    assert_eq!(p.blocks(), 6);
    assert!(p.rows_per_block() > 0);
    for epoch in 0..3 {
        check_epoch(&p, epoch, &docs, false);
    }
}

#[test]
fn same_rows_across_calls_orders_and_resumes() {
    let lens: Vec<u64> = (0..4000u64).map(|i| 1 + mix(i ^ 9) % 700).collect();
    let docs = with_bos(&lens);
    let n = lens.len() as u64;
    let a = Packer::new(config(256, 700, 3), n, reader(&docs)).unwrap();
    let rows_of = |p: &Packer, e: u64, g: u64| {
        let r = p.locate(e, g).unwrap();
        p.pack_block(e, r.block, reader(&docs))
            .unwrap()
            .row(r.row as usize)
            .to_vec()
    };
    let total = a.rows_per_epoch();
    let forward: Vec<Vec<Piece>> = (0..total).map(|g| rows_of(&a, 1, g)).collect();
    // A fresh packer (a resume) reading in another order, starting anywhere.
    let b = Packer::new(config(256, 700, 3), n, reader(&docs)).unwrap();
    assert_eq!(a.rows_per_block(), b.rows_per_block());
    for g in (0..total).rev().step_by(7) {
        assert_eq!(rows_of(&b, 1, g), forward[g as usize]);
    }
    for start in [0, total / 3, total - 1] {
        let c = Packer::new(config(256, 700, 3), n, reader(&docs)).unwrap();
        for g in start..total.min(start + 40) {
            assert_eq!(rows_of(&c, 1, g), forward[g as usize]);
        }
    }
    // One packer serves every thread of a mount.
    fn shared<T: Send + Sync>(_: &T) {}
    shared(&a);
    // Every block row is served exactly once per epoch.
    let mut refs = HashSet::new();
    for g in 0..total {
        assert!(refs.insert(a.locate(1, g).unwrap()));
    }
    assert_eq!(a.locate(1, total), None);
    // Other epochs and seeds give other rows.
    assert_ne!(rows_of(&a, 2, 0), forward[0]);
    let d = Packer::new(config(256, 700, 4), n, reader(&docs)).unwrap();
    assert_ne!(rows_of(&d, 1, 0), forward[0]);
}

#[test]
fn a_block_reads_only_its_own_documents() {
    let lens: Vec<u64> = (0..5000u64).map(|i| 1 + mix(i ^ 5) % 400).collect();
    let docs = with_bos(&lens);
    let p = Packer::new(config(200, 1000, 11), lens.len() as u64, reader(&docs)).unwrap();
    for b in 0..p.blocks() {
        let mut read = Vec::new();
        let block = p
            .pack_block(2, b, |d| {
                read.push(d);
                Ok::<_, Infallible>(docs[d as usize])
            })
            .unwrap();
        assert_eq!(block.counts.docs_borrowed, 0);
        let order = p.doc_order(2);
        let own: Vec<u64> = p.block_positions(b).map(|i| order.apply(i)).collect();
        assert_eq!(read, own, "block {b} read other documents");
    }
}

#[test]
fn short_blocks_borrow_exactly_and_the_rest_is_infeasible() {
    let lens: Vec<u64> = (0..2000u64).map(|i| 1 + mix(i ^ 3) % 500).collect();
    let docs = with_bos(&lens);
    let n = lens.len() as u64;
    let calibrated = Packer::new(config(256, 250, 1), n, reader(&docs)).unwrap();
    let r = calibrated.rows_per_block();
    assert_eq!(
        calibrated
            .epoch_stats(0, reader(&docs))
            .unwrap()
            .blocks_borrowing,
        0
    );
    // Force more rows than calibrated, the fewest that make some block borrow while the
    // epoch still fills every block.
    let forced = |rows| {
        let mut cfg = config(256, 250, 1);
        cfg.rows_per_block = Some(rows);
        let p = Packer::new(cfg.clone(), n, reader(&docs)).unwrap();
        let stats = p.epoch_stats(0, reader(&docs)).unwrap();
        (cfg, p, stats)
    };
    let (cfg, p, stats) = (r..2 * r)
        .map(forced)
        .find(|(_, _, s)| s.blocks_borrowing > 0)
        .unwrap();
    assert_eq!(stats.blocks_infeasible, 0, "{stats:?}");
    let c = stats.counts;
    assert_eq!(c.docs, n);
    assert_eq!(c.docs_used + c.docs_dropped, n);
    assert_eq!(c.used_tokens + c.dropped_tokens, p.corpus().tokens);
    assert_eq!(c.rows, p.rows_per_epoch());
    check_epoch(&p, 0, &docs, false);
    // A fresh packer, borrowing blocks first: the same rows.
    let fresh = Packer::new(cfg, n, reader(&docs)).unwrap();
    for b in (0..p.blocks()).rev() {
        assert_eq!(
            fresh.pack_block(0, b, reader(&docs)).unwrap(),
            p.pack_block(0, b, reader(&docs)).unwrap()
        );
    }
    // Far too many rows: the epoch cannot be filled; an error, never a panic or bad row.
    let (_, p, stats) = forced(2 * r);
    assert!(stats.blocks_infeasible > 0);
    let c = stats.counts;
    assert_eq!(c.docs_used + c.docs_dropped, n);
    check_epoch(&p, 0, &docs, true);
    let failing = (0..p.blocks())
        .find(|&b| p.pack_block(0, b, reader(&docs)).is_err())
        .unwrap();
    let err = p.pack_block(0, failing, reader(&docs)).unwrap_err();
    assert_eq!(
        err,
        PackError::Infeasible {
            epoch: 0,
            block: failing
        }
    );
    assert!(err.to_string().contains("fewer rows per block"));
}

#[test]
fn degenerate_inputs() {
    let none: Vec<DocLen> = Vec::new();
    let p = Packer::new(config(8, 4, 0), 0, reader(&none)).unwrap();
    assert_eq!(
        (p.blocks(), p.rows_per_epoch(), p.locate(0, 0)),
        (0, 0, None)
    );
    let empty = with_bos(&[0, 0, 0]);
    let p = Packer::new(config(8, 4, 0), 3, reader(&empty)).unwrap();
    assert_eq!(p.rows_per_epoch(), 0);
    let tiny = with_bos(&[3]);
    let p = Packer::new(config(8, 4, 0), 1, reader(&tiny)).unwrap();
    assert_eq!(p.rows_per_epoch(), 0);
    let b = p.pack_block(0, 0, reader(&tiny)).unwrap();
    assert_eq!((b.rows(), b.counts.docs_dropped), (0, 1));
    assert!(matches!(
        p.pack_block(0, 1, reader(&tiny)),
        Err(PackError::Config(_))
    ));
    for bad in [
        config(0, 4, 0),
        config(8, 0, 0),
        config(MAX_WINDOW + 1, 4, 0),
    ] {
        assert!(matches!(
            Packer::new(bad, 1, reader(&tiny)),
            Err(PackError::Config(_))
        ));
    }
    // The length callback's error comes back as it is.
    let err = Packer::new(config(8, 4, 0), 5, |d| {
        if d == 3 {
            Err("index unreadable")
        } else {
            Ok(DocLen::default())
        }
    })
    .unwrap_err();
    assert_eq!(err, PackError::Len("index unreadable"));
    // Every document longer than a row: each is one cropped row.
    let long = with_bos(&[50; 40]);
    let p = Packer::new(config(8, 40, 0), 40, reader(&long)).unwrap();
    let b = p.pack_block(0, 0, reader(&long)).unwrap();
    assert!(b.rows() > 30);
    assert!(
        b.iter()
            .all(|r| r.len() == 1 && r[0].cropped && r[0].len == 8)
    );
}

#[test]
fn window_of_one_token_rows_are_single_first_tokens() {
    // T = 1: a row is one document's first token: its prepended BOS, or its own first token
    // when it already starts with the BOS.
    let docs: Vec<DocLen> = (0..300u64)
        .map(|i| DocLen {
            tokens: i % 5,
            starts_with_bos: i % 3 == 0,
        })
        .collect();
    for bos in [Some(1), None] {
        let cfg = PackConfig {
            block_docs: 64,
            ..PackConfig::new(1, bos, 9)
        };
        let p = Packer::new(cfg, 300, reader(&docs)).unwrap();
        assert!(p.rows_per_block() > 0);
        check_epoch(&p, 0, &docs, false);
        let b = p.pack_block(0, 0, reader(&docs)).unwrap();
        for row in b.iter() {
            let x = row[0];
            assert_eq!(row.len(), 1);
            let d = docs[x.doc as usize];
            assert_eq!(x.bos_prepended, bos.is_some() && !d.starts_with_bos);
            let expect = if x.bos_prepended { 0..0 } else { 0..1 };
            assert_eq!(x.doc_tokens(), expect);
            assert_eq!(x.cropped, d.tokens + u64::from(x.bos_prepended) > 1);
        }
    }
}

#[test]
fn fewer_documents_than_one_block() {
    let lens: Vec<u64> = (0..50u64).map(|i| 1 + mix(i) % 90).collect();
    let docs = with_bos(&lens);
    let p = Packer::new(PackConfig::new(64, Some(1), 5), 50, reader(&docs)).unwrap();
    assert_eq!((p.blocks(), p.block_positions(0)), (1, 0..50));
    assert!(p.rows_per_block() > 0);
    for epoch in 0..4 {
        check_epoch(&p, epoch, &docs, false);
    }
    assert_eq!(p.epoch_stats(3, reader(&docs)).unwrap().blocks_borrowing, 0);
}

#[test]
fn one_huge_document() {
    // Alone: a single block keeps a row's worth of slack (its loss in another order is not
    // known), so one document gives an empty epoch, not a panic.
    let huge = with_bos(&[1 << 40]);
    let p = Packer::new(PackConfig::new(2048, Some(1), 0), 1, reader(&huge)).unwrap();
    assert_eq!((p.blocks(), p.rows_per_epoch()), (1, 0));
    assert_eq!(p.corpus().tokens_beyond_window, (1 << 40) - 2048);
    let b = p.pack_block(0, 0, reader(&huge)).unwrap();
    assert_eq!((b.rows(), b.counts.docs_dropped), (0, 1));
    // Forced to one row: the row is its first T tokens.
    let cfg = PackConfig {
        rows_per_block: Some(1),
        ..PackConfig::new(2048, Some(1), 0)
    };
    let p = Packer::new(cfg, 1, reader(&huge)).unwrap();
    let b = p.pack_block(0, 0, reader(&huge)).unwrap();
    assert_eq!(b.row(0), [piece(0, 2048, true)]);
    // Among others: it is at most one row, cropped to T, once per epoch.
    let mut lens: Vec<u64> = (0..2000u64).map(|i| 1 + mix(i) % 600).collect();
    lens[777] = 1 << 40;
    let docs = with_bos(&lens);
    let p = Packer::new(config(512, 500, 2), 2000, reader(&docs)).unwrap();
    for epoch in 0..4 {
        let used = check_epoch(&p, epoch, &docs, false);
        assert!(used.iter().filter(|&&d| d == 777).count() <= 1);
    }
}

#[test]
fn lengths_near_u64_limits_are_refused_cleanly() {
    let d = |tokens, starts_with_bos| DocLen {
        tokens,
        starts_with_bos,
    };
    let refused = |docs: &[DocLen], bos| {
        let cfg = PackConfig::new(2048, bos, 0);
        match Packer::new(cfg, docs.len() as u64, reader(docs)) {
            Err(PackError::Config(m)) => assert!(m.contains("split the dataset"), "{m}"),
            other => panic!("{other:?}"),
        }
    };
    refused(&[d(u64::MAX, false)], Some(1));
    refused(&[d(u64::MAX, true)], Some(1));
    refused(&[d(u64::MAX, false)], None);
    refused(&[d(MAX_TOKENS, false)], Some(1));
    refused(
        &[d(MAX_TOKENS / 2 + 1, true), d(MAX_TOKENS / 2, true)],
        Some(1),
    );
    refused(&[d(1, true), d(MAX_TOKENS, true)], None);
    // At the limit: accepted, and packing it does not overflow.
    let ok = [d(MAX_TOKENS / 2, true), d(MAX_TOKENS / 2 - 1, false)];
    let cfg = PackConfig {
        rows_per_block: Some(2),
        ..PackConfig::new(MAX_WINDOW, Some(1), 0)
    };
    let p = Packer::new(cfg.clone(), 2, reader(&ok)).unwrap();
    assert_eq!(p.corpus().tokens, MAX_TOKENS);
    let b = p.pack_block(0, 0, reader(&ok)).unwrap();
    assert_eq!(b.counts.cropped_tokens, MAX_TOKENS - 2 * MAX_WINDOW);
    // Lengths that grew after the scan: an error, not an overflow.
    let grown = [d(MAX_TOKENS, true), d(MAX_TOKENS, true)];
    assert!(matches!(
        p.pack_block(0, 0, reader(&grown)),
        Err(PackError::Config(_))
    ));
    assert!(matches!(
        p.epoch_stats(1, reader(&grown)),
        Err(PackError::Config(_))
    ));
    // Summaries computed from outside are checked too, and huge blocks are refused.
    let corpus = CorpusStats {
        tokens: MAX_TOKENS + 1,
        ..p.corpus().clone()
    };
    assert!(matches!(
        Packer::with_corpus(cfg, 2, corpus, reader(&ok)),
        Err(PackError::Config(_))
    ));
    let cfg = PackConfig {
        block_docs: MAX_BLOCK_DOCS + 1,
        ..PackConfig::new(8, None, 0)
    };
    assert!(matches!(
        Packer::new(cfg, 2, reader(&ok)),
        Err(PackError::Config(_))
    ));
    // Huge document counts are arithmetic only: no allocation beyond one block.
    let cfg = PackConfig::new(8, None, 0);
    let p = Packer::new(cfg, 0, reader(&ok)).unwrap();
    assert_eq!(p.locate(u64::MAX, u64::MAX), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn contract_holds_for_any_corpus(
        window in 1u64..48,
        lens in proptest::collection::vec((0u64..150, any::<bool>()), 0..260),
        bos in any::<bool>(),
        block_docs in 1u64..80,
        seed in any::<u64>(),
        force in proptest::option::of(0u64..40),
    ) {
        let docs: Vec<DocLen> = lens
            .iter()
            .map(|&(tokens, starts_with_bos)| DocLen { tokens, starts_with_bos })
            .collect();
        let cfg = PackConfig {
            window,
            bos: bos.then_some(7),
            block_docs,
            seed,
            rows_per_block: force,
        };
        let n = docs.len() as u64;
        let p = Packer::new(cfg.clone(), n, reader(&docs)).unwrap();
        let stats = p.epoch_stats(1, reader(&docs)).unwrap();
        if force.is_none() && p.blocks() > 0 {
            // Calibrated rows never leave a block short of the whole epoch's documents.
            prop_assert_eq!(stats.blocks_infeasible, 0, "{:?}", stats);
        }
        let used = check_epoch(&p, 1, &docs, true);
        let c = stats.counts;
        prop_assert_eq!(c.docs, p.corpus().nonempty_docs);
        prop_assert_eq!(c.docs_used + c.docs_dropped, c.docs);
        prop_assert_eq!(c.used_tokens + c.dropped_tokens, p.corpus().tokens);
        prop_assert_eq!(c.docs_used, used.len() as u64);
        prop_assert_eq!(c.cropped_tokens + c.row_tokens, c.used_tokens);
        // A fresh packer (resume) gives the same blocks, read backwards.
        let q = Packer::new(cfg, n, reader(&docs)).unwrap();
        for b in (0..p.blocks()).rev() {
            prop_assert_eq!(
                q.pack_block(1, b, reader(&docs)).ok(),
                p.pack_block(1, b, reader(&docs)).ok()
            );
        }
    }
}

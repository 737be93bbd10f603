//! Reference tests (mountpoint-s3's reftests): random operation sequences run against the
//! filesystem and compared with one model of the tree and its bytes.
//!
//! - `common::reference`: the model, the one definition of correctness (the shard bytes read
//!   with `std::fs`, the permutation materialised, `.npy` and JSON written out);
//! - [`generators`]: proptest strategies for datasets and plans, operations (lookup under any
//!   spelling, stat, reads at any offset and size by `pread`, `lseek`+`read` or `mmap`,
//!   paged listings, prefetch runs) and storage faults;
//! - [`harness`]: runs the operations without a mount (`ShuffleFs`) or through a real mount
//!   (`std::fs`) and compares every answer with the model.
//!
//! Tests are named `reftest_*` (random datasets and plans), `proptest_*` (one fixed dataset,
//! random operations) and `regression_*` (literal inputs: cases that once failed or that pin
//! an exhaustive sweep). The runner keeps no failure file (`failure_persistence: None`): a
//! failure prints its shrunk input, which is pasted back here as a named `regression_*` test.
//! Case counts are set in code ([`crate::common::proptest_config`]; `PROPTEST_CASES`
//! overrides them for a longer search).

mod faults;
mod generators;
mod harness;
mod names;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use shufflefs::dtype::ScalarType;

use crate::common::*;
use generators::*;
use harness::*;

/// Random datasets and plans, random operations, no mount.
#[test]
fn reftest_tree_without_mount() {
    let strategy = (tree_case(), ops(48));
    TestRunner::new(proptest_config(1024))
        .run(&strategy, |(case, ops)| run(&case, &ops, false))
        .unwrap();
}

/// Random datasets and plans, random operations, through a real mount (one per case).
#[test]
fn reftest_tree_through_mount() {
    if !fuse_available() {
        return;
    }
    let strategy = (tree_case(), ops(40));
    TestRunner::new(proptest_config(64))
        .run(&strategy, |(case, ops)| run(&case, &ops, true))
        .unwrap();
}

/// Random reads of every kind of file of one mount whose step files are larger than one FUSE
/// request (140 KiB), 2 ranks, 2 epochs: by `pread`, `lseek` + `read` and `mmap`, at offsets
/// at, before, past and far past the end, of lengths from 0 to the file plus 300 KB.
#[test]
fn proptest_reads_through_mount() {
    if !fuse_available() {
        return;
    }
    let (data, _) = Data::random(400_000, 70_001, ScalarType::U16, 3);
    let cfg = config(1025, 1000, 70, 2, 17, 2);
    let reference = Reference::new(&data.path(), &cfg).unwrap();
    let m = TestMount::new(data.fs(&cfg));
    let mut tree = Mounted::new(m);
    let checker = Checker::new(reference, &mut tree).unwrap();
    assert!(checker.r.step_npy(0, 0, 0).len() > 131_072);
    let state = std::cell::RefCell::new((tree, checker));
    let read = (file(), offset(), size(), method()).prop_map(|(f, o, s, m)| Op::Read(f, o, s, m));
    TestRunner::new(proptest_config(1500))
        .run(&prop::collection::vec(read, 1..=24), |reads| {
            let (tree, checker) = &mut *state.borrow_mut();
            for op in &reads {
                checker
                    .apply(tree, op)
                    .map_err(|why| TestCaseError::fail(format!("{op:?}: {why}")))?;
            }
            Ok(())
        })
        .unwrap();
    let (tree, _) = state.into_inner();
    tree.unmount();
}

/// Whole epochs of three layouts (windows across shard boundaries, strides below, at and
/// above the window, 1 to 8 ranks): every step file read whole, so each epoch serves every
/// observation at most once and drops exactly `n mod G` (the reference's permutation is a
/// bijection).
#[test]
fn regression_every_step_of_three_layouts() {
    for (window, stride, batch, ranks) in [(17, 16, 4, 2), (10, 10, 3, 1), (33, 7, 2, 8)] {
        let case = TreeCase {
            dtype: ScalarType::U32,
            tokens: 5000,
            shard_records: 250,
            data_seed: 99,
            window,
            stride,
            batch,
            ranks,
            seed: 99,
            epochs: 2,
            max_listing: 0,
            cache: None,
            threads: 2,
        };
        let (data, reference) = dataset(&case).unwrap().unwrap();
        let whole = |f| Op::Read(f, Offset::Zero, Size::ToEnd, Method::Pread);
        let mut ops = Vec::new();
        for e in 0..2 {
            for r in 0..ranks as u32 {
                for s in 0..reference.steps as u32 {
                    let key = (generators::Sel(e), generators::Sel(r), generators::Sel(s));
                    ops.push(whole(File::StepJson(key.0, key.1, key.2)));
                    ops.push(whole(File::StepNpy(key.0, key.1, key.2)));
                }
            }
        }
        let mut all = Vec::new();
        for e in 0..2 {
            for s in 0..reference.steps {
                for r in 0..ranks {
                    all.push(reference.observations(e, r, s));
                }
            }
            assert_exact_partition(&all, reference.n, reference.g);
            all.clear();
        }
        let mut tree = Direct::new(filesystem(&case, &data, 0));
        let mut checker = Checker::new(reference, &mut tree).unwrap();
        for op in &ops {
            checker.apply(&mut tree, op).unwrap();
        }
    }
}

/// Every offset of one step file (and a few past its end) with sizes around the 64- and
/// 128-byte marks and a page, without a mount.
#[test]
fn regression_every_range_of_a_step_file() {
    let case = TreeCase {
        dtype: ScalarType::U16,
        tokens: 3000,
        shard_records: 350,
        data_seed: 1,
        window: 21,
        stride: 13,
        batch: 5,
        ranks: 3,
        seed: 1,
        epochs: 1,
        max_listing: 0,
        cache: None,
        threads: 2,
    };
    let (data, reference) = dataset(&case).unwrap().unwrap();
    let len = reference.step_npy(0, 2, 11).len() as u64;
    let mut tree = Direct::new(filesystem(&case, &data, 0));
    let mut checker = Checker::new(reference, &mut tree).unwrap();
    let file = File::StepNpy(generators::Sel(0), generators::Sel(2), generators::Sel(11));
    for offset in (0..=len + 3).chain([u64::MAX]) {
        for size in [0u32, 1, 2, 3, 41, 64, 127, 128, 129, 4096] {
            let op = Op::Read(file, Offset::At(offset), Size::Exactly(size), Method::Pread);
            checker.apply(&mut tree, &op).unwrap();
        }
    }
}

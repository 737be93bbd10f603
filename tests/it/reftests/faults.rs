//! Storage faults behind the read path, without a mount: every shard read (and checksum-file
//! read, with `--verify-reads`) goes through a script of faults (EIO, a short count, an early
//! end of file, or a pass). Each read then gives exactly the reference's bytes or fails with
//! EIO, never other bytes; queued prefetches meet the faults too and never fail or corrupt a
//! later read; once the script is spent, every file read is exact. (Through a mount, with
//! stalls and a read deadline: `inject`.)

use std::cell::Cell;
use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use shufflefs::dataset::{Dataset, ReadAt};
use shufflefs::fs::ShuffleFs;
use shufflefs::prefetch::PrefetchConfig;
use shufflefs::view::View;

use super::generators::*;
use super::harness::*;
use crate::common::*;

/// The faults the next reads of any file meet, in order; a pass once it is empty.
type Script = Arc<Mutex<VecDeque<Fault>>>;

struct Scripted {
    inner: Arc<dyn ReadAt>,
    script: Script,
}

impl ReadAt for Scripted {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let fault = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Fault::Pass);
        match fault {
            Fault::Eio => {
                buf.fill(0xEE);
                Err(io::Error::from_raw_os_error(libc::EIO))
            }
            Fault::Short(k) if buf.len() > 1 => {
                let n = 1 + k as usize % (buf.len() - 1);
                let got = self.inner.read_at(&mut buf[..n], offset)?;
                buf[got..].fill(0xEE);
                Ok(got)
            }
            Fault::Eof => {
                buf.fill(0xEE);
                Ok(0)
            }
            Fault::Pass | Fault::Short(_) => self.inner.read_at(buf, offset),
        }
    }
}

/// One case: reads under faults, then a clean read of every file touched.
fn faulty_case(
    case: &TreeCase,
    verified: bool,
    reads: &[FaultyRead],
    outcomes: &Cell<(u64, u64)>,
) -> Result<(), TestCaseError> {
    let fail = TestCaseError::fail;
    let Some((data, reference)) = dataset(case).map_err(fail)? else {
        return Ok(());
    };
    let script: Script = Arc::default();
    let mut dataset = Dataset::open(&data.path()).unwrap();
    if verified {
        dataset = dataset.with_verified_reads().unwrap();
    }
    let dataset = dataset.wrap_sources(|_, inner| {
        Arc::new(Scripted {
            inner,
            script: script.clone(),
        })
    });
    let mut fs = ShuffleFs::new(View::new(dataset, &case.config()).unwrap()).unwrap();
    if let Some((steps, depth)) = case.cache {
        let budget = steps * fs.view().step_npy_len();
        let prefetch = PrefetchConfig {
            depth,
            workers: 0,
            adaptive: false,
        };
        fs = fs.with_cache(budget, prefetch);
    }
    let mut tree = Direct::new(fs);
    let checker = Checker::new(reference, &mut tree).map_err(fail)?;
    let mut touched = Vec::new();
    let (mut ok, mut eio) = (0u64, 0u64);
    for (i, read) in reads.iter().enumerate() {
        script.lock().unwrap().extend(&read.faults);
        if read.prefetch {
            tree.prefetch();
        }
        let e = read.file.entry(&checker.r);
        let Some(whole) = checker.bytes(e) else {
            continue;
        };
        let len = whole.len() as u64;
        let offset = read.offset.at(len);
        let size = read.size.of(len, offset);
        let ino = walk(&tree.fs, &e.path()).unwrap();
        match read_at(&tree.fs, ino, offset, u32::try_from(size).unwrap()) {
            Ok(got) => {
                let start = offset.min(len) as usize;
                let end = offset.saturating_add(size as u64).min(len) as usize;
                if let Some(why) = describe(&got, &whole[start..end]) {
                    return Err(fail(format!("read {i} {read:?}: /{}: {why}", e.path())));
                }
                ok += 1;
            }
            Err(err) if err.errno() == libc::EIO => eio += 1,
            Err(err) => return Err(fail(format!("read {i} {read:?}: {err} is not EIO"))),
        }
        touched.push(e);
    }
    script.lock().unwrap().clear();
    tree.prefetch();
    for e in touched {
        let got = read_path(&tree.fs, &e.path())
            .map_err(|err| fail(format!("/{} after the faults: {err}", e.path())))?;
        if let Some(why) = describe(&got, &checker.bytes(e).unwrap()) {
            return Err(fail(format!("/{} after the faults: {why}", e.path())));
        }
    }
    let (all_ok, all_eio) = outcomes.get();
    outcomes.set((all_ok + ok, all_eio + eio));
    Ok(())
}

#[test]
fn reftest_faulty_storage_without_mount() {
    let strategy = (
        tree_case(),
        any::<bool>(),
        prop::collection::vec(faulty_read(), 1..=24),
    );
    let outcomes = Cell::new((0, 0));
    TestRunner::new(proptest_config(512))
        .run(&strategy, |(case, verified, reads)| {
            faulty_case(&case, verified, &reads, &outcomes)
        })
        .unwrap();
    let (ok, eio) = outcomes.get();
    eprintln!("faulty storage: {ok} reads exact, {eio} EIO, 0 other bytes");
    assert!(ok > 0 && eio > 0, "faults both failed and spared reads");
}

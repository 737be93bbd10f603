//! Reads whose ranges depend on bytes read before them (a row's document record, found
//! through a fence read first), for many rows, in a few round trips instead of one per read.
//!
//! [`ahead`] runs `warm` (the reads of every row, results ignored) while each read of a remote
//! object that is not fetched yet is only noted and fails; fetches every noted range at once
//! ([`read_many`]); and runs `warm` again, until a pass notes nothing (the depth of the
//! dependency chain: two or three passes) or [`MAX_PASSES`]. Then `run` does the real work,
//! its reads served from what was fetched (a read not fetched is read then). Everything stays
//! on this thread and is dropped when `ahead` returns.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;

use super::{RemoteObject, read_many};
use crate::error::Result;

/// Passes of `warm` at most (each one round trip).
const MAX_PASSES: usize = 6;

/// Ranges fetched: by (object URL, offset, length).
type Fetched = HashMap<(String, u64, usize), Vec<u8>>;

struct Scope {
    fetched: Fetched,
    /// Ranges noted by the current pass (`None`: not noting, reads not fetched are read).
    noting: Option<Vec<(RemoteObject, u64, usize)>>,
}

thread_local! {
    static SCOPE: RefCell<Option<Scope>> = const { RefCell::new(None) };
}

/// The error of a read noted for later (never leaves [`ahead`]'s `warm` passes).
#[derive(Debug)]
struct Noted;

impl std::fmt::Display for Noted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("read noted for a batch")
    }
}

impl std::error::Error for Noted {}

/// A read of `buf.len()` bytes of `object` at `offset` inside [`ahead`]: `Some(Ok)` when
/// fetched (copied into `buf`), `Some(Err)` when noted for the next batch, `None` outside
/// (or when the scope reads now).
pub(super) fn lookup(object: &RemoteObject, offset: u64, buf: &mut [u8]) -> Option<io::Result<()>> {
    SCOPE.with_borrow_mut(|scope| {
        let scope = scope.as_mut()?;
        let key = (object.url(), offset, buf.len());
        if let Some(bytes) = scope.fetched.get(&key) {
            buf.copy_from_slice(bytes);
            return Some(Ok(()));
        }
        let noting = scope.noting.as_mut()?;
        noting.push((object.clone(), offset, buf.len()));
        Some(Err(io::Error::other(Noted)))
    })
}

/// Runs `warm` until its remote reads are all fetched (see the module docs), then `run`.
pub(crate) fn ahead<R>(warm: impl Fn(), run: impl FnOnce() -> Result<R>) -> Result<R> {
    if SCOPE.with_borrow(Option::is_some) {
        return run();
    }
    SCOPE.with_borrow_mut(|s| {
        *s = Some(Scope {
            fetched: HashMap::new(),
            noting: Some(Vec::new()),
        })
    });
    // Cleared however this returns (a panic in `warm` or `run` included: a FUSE thread
    // catches it and serves on).
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            SCOPE.with_borrow_mut(|s| *s = None);
        }
    }
    let _clear = Clear;
    fetch_ahead(&warm);
    SCOPE.with_borrow_mut(|s| s.as_mut().expect("set above").noting = None);
    run()
}

/// The passes of [`ahead`]: `warm`, then a batch of what it noted, until it notes nothing.
fn fetch_ahead(warm: &impl Fn()) {
    for _ in 0..MAX_PASSES {
        warm();
        let noted = SCOPE.with_borrow_mut(|s| {
            let s = s.as_mut().expect("set above");
            s.noting.replace(Vec::new()).unwrap_or_default()
        });
        if noted.is_empty() {
            break;
        }
        let mut bufs: Vec<Vec<u8>> = noted.iter().map(|(_, _, n)| vec![0u8; *n]).collect();
        let mut reads: Vec<(&RemoteObject, u64, &mut [u8])> = noted
            .iter()
            .zip(bufs.iter_mut())
            .map(|((o, off, _), b)| (o, *off, &mut b[..]))
            .collect();
        // A failed batch: `run` reads (and reports) for itself.
        if read_many(&mut reads).is_err() {
            break;
        }
        SCOPE.with_borrow_mut(|s| {
            let s = s.as_mut().expect("set above");
            for ((o, off, n), b) in noted.iter().zip(bufs) {
                s.fetched.insert((o.url(), *off, *n), b);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_leaves_no_scope_behind() {
        let r = std::panic::catch_unwind(|| ahead(|| {}, || -> Result<()> { panic!("inside") }));
        assert!(r.is_err());
        assert!(SCOPE.with_borrow(Option::is_none));
        assert_eq!(ahead(|| {}, || Ok(7)).unwrap(), 7);
    }
}

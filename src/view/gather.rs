//! Reads of remote datasets issued together: a step file of a remote dataset needs one range
//! per row piece, and one round trip each in turn would cost the latency times the rows.
//! While [`deferred`] runs, [`View::read_records`](super::View) does not read: it notes where
//! the bytes go (an offset in the caller's buffer), and [`deferred`] then fetches every noted
//! range at once (`Dataset::read_many`: all remote ranges in parallel) and places them,
//! converting (`--out-dtype`) where noted. Everything else a read writes (headers, padding,
//! BOS tokens) is written in place as before, so the bytes are exactly those of a direct read.

use std::cell::RefCell;
use std::sync::Arc;

use super::convert::Convert;
use crate::dataset::Dataset;
use crate::error::{Error, Result};

/// One noted read: `len` bytes of `dataset`'s stream at `stream` (the records read, when
/// converted), to be placed at `dst` bytes into the buffer.
struct Pending {
    dataset: Arc<Dataset>,
    dst: usize,
    len: usize,
    stream: u64,
    /// With `--out-dtype`: the bytes read are whole records from `first`; the served bytes
    /// are their conversion, from byte `skip` on.
    convert: Option<(Convert, u64, usize, usize)>,
}

/// The reads noted while [`deferred`] runs on this thread: the buffer's address and length,
/// and the reads.
struct Noted {
    base: usize,
    len: usize,
    reads: Vec<Pending>,
}

thread_local! {
    static NOTED: RefCell<Option<Noted>> = const { RefCell::new(None) };
}

/// Runs `fill(buf)` with reads noted instead of done, then does them all at once (see the
/// module docs). Nested calls run `fill` as it is.
pub(super) fn deferred<R>(buf: &mut [u8], fill: impl FnOnce(&mut [u8]) -> Result<R>) -> Result<R> {
    let active = NOTED.with_borrow(Option::is_some);
    if active {
        return fill(buf);
    }
    NOTED.with_borrow_mut(|n| {
        *n = Some(Noted {
            base: buf.as_ptr().addr(),
            len: buf.len(),
            reads: Vec::new(),
        })
    });
    // Cleared however `fill` returns (a panic included: a FUSE thread catches it and serves
    // on, and a stale scope would swallow the reads of its next request).
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            NOTED.with_borrow_mut(|n| *n = None);
        }
    }
    let clear = Clear;
    let result = fill(buf);
    let noted = NOTED.with_borrow_mut(Option::take).expect("set above");
    drop(clear);
    let value = result?;
    place(noted.reads, buf)?;
    Ok(value)
}

/// Notes a read of `out.len()` bytes of `dataset`'s stream at `stream` into `out` (`convert`:
/// see [`Pending`]) when [`deferred`] runs on this thread; returns `false` when it does not
/// (the caller reads now).
pub(super) fn note(
    dataset: &Arc<Dataset>,
    stream: u64,
    out: &mut [u8],
    convert: Option<(Convert, u64, usize, usize)>,
) -> bool {
    NOTED.with_borrow_mut(|n| {
        let Some(n) = n else {
            return false;
        };
        let addr = out.as_ptr().addr();
        let Some(dst) = addr.checked_sub(n.base).filter(|d| d + out.len() <= n.len) else {
            // Not inside the buffer being filled (a scratch buffer of the caller's): read now.
            return false;
        };
        n.reads.push(Pending {
            dataset: dataset.clone(),
            dst,
            len: out.len(),
            stream,
            convert,
        });
        true
    })
}

/// Fetches every noted read at once and places its bytes in `buf`.
fn place(reads: Vec<Pending>, buf: &mut [u8]) -> Result<()> {
    if reads.is_empty() {
        return Ok(());
    }
    let mut fetched: Vec<Vec<u8>> = reads
        .iter()
        .map(|p| vec![0u8; p.convert.as_ref().map_or(p.len, |c| c.3)])
        .collect();
    let mut batch: Vec<(&Dataset, u64, &mut [u8])> = reads
        .iter()
        .zip(fetched.iter_mut())
        .map(|(p, b)| (&*p.dataset, p.stream, &mut b[..]))
        .collect();
    Dataset::read_many(&mut batch)?;
    for (p, bytes) in reads.iter().zip(&fetched) {
        let out = buf
            .get_mut(p.dst..p.dst + p.len)
            .ok_or_else(|| Error::invalid("a noted read lies outside its buffer"))?;
        match &p.convert {
            None => out.copy_from_slice(bytes),
            Some((convert, first, skip, _)) => {
                let records = bytes.len() / convert.from.size();
                let mut wide = vec![0u8; records * convert.to.size()];
                convert.convert(bytes, &mut wide, *first)?;
                out.copy_from_slice(&wide[*skip..*skip + p.len]);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_leaves_no_scope_behind() {
        let mut buf = [0u8; 4];
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            deferred(&mut buf, |_| -> Result<()> { panic!("inside") })
        }));
        assert!(r.is_err());
        assert!(NOTED.with_borrow(Option::is_none));
        // The next call notes into its own buffer, and with nothing noted places nothing.
        assert_eq!(deferred(&mut buf, |b| Ok(b.len())).unwrap(), 4);
    }
}

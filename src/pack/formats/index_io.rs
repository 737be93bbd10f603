//! Positioned little-endian reads for the index parsers ([`super::megatron`],
//! [`super::datatrove`], [`super::doc_scan`]): exact reads that name the file and offset on
//! failure, and a sequential reader of a byte range in bounded blocks.
//!
//! The parsers never load a whole index: they read the few bytes a lookup needs, and scans
//! read [`BLOCK`] bytes at a time, so memory never depends on a count read from a file.

use std::io;
use std::path::Path;

use crate::error::{Error, Result};
use crate::storage::ReadAt;

/// Bytes a sequential scan reads at a time (a multiple of every item width).
pub(crate) const BLOCK: usize = 1 << 20;

/// Reads exactly `buf.len()` bytes at `offset` of `src` (the file `path`). A file that ends
/// early is a [`Error::Dataset`] naming it (it is shorter than its header says, or changed).
pub(crate) fn read_exact_at<R: ReadAt + ?Sized>(
    src: &R,
    path: &Path,
    buf: &mut [u8],
    offset: u64,
) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let at = offset + done as u64;
        match src.read_at(&mut buf[done..], at) {
            Ok(0) => {
                return Err(Error::input(
                    path,
                    format!(
                        "ends at byte {at}, inside the {} bytes at offset {offset} it should \
                         hold: it is truncated or changed while being read",
                        buf.len()
                    ),
                ));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(Error::Io {
                    path: path.to_path_buf(),
                    offset: Some(at),
                    source,
                });
            }
        }
    }
    Ok(())
}

/// The little-endian `N`-byte value at `offset`.
pub(crate) fn bytes_at<const N: usize, R: ReadAt + ?Sized>(
    src: &R,
    path: &Path,
    offset: u64,
) -> Result<[u8; N]> {
    let mut b = [0u8; N];
    read_exact_at(src, path, &mut b, offset)?;
    Ok(b)
}

/// The little-endian u64 at `offset`.
pub(crate) fn u64_at<R: ReadAt + ?Sized>(src: &R, path: &Path, offset: u64) -> Result<u64> {
    bytes_at::<8, R>(src, path, offset).map(u64::from_le_bytes)
}

/// The little-endian i64 at `offset`.
pub(crate) fn i64_at<R: ReadAt + ?Sized>(src: &R, path: &Path, offset: u64) -> Result<i64> {
    bytes_at::<8, R>(src, path, offset).map(i64::from_le_bytes)
}

/// The little-endian i32 at `offset`.
pub(crate) fn i32_at<R: ReadAt + ?Sized>(src: &R, path: &Path, offset: u64) -> Result<i32> {
    bytes_at::<4, R>(src, path, offset).map(i32::from_le_bytes)
}

/// Bytes a scan of a remote object fetches at a time (in parallel requests), handed out
/// [`BLOCK`] by [`BLOCK`]: one round trip per 64 MiB, not per block.
const REMOTE_AHEAD: usize = 64 * BLOCK;

/// Reads bytes `[start, end)` of a source front to back, [`BLOCK`] bytes at a time.
pub(crate) struct Blocks<'a, R: ReadAt + ?Sized> {
    src: &'a R,
    path: &'a Path,
    pos: u64,
    end: u64,
    buf: Vec<u8>,
    /// Where `buf` starts in the source (remote sources read [`REMOTE_AHEAD`] at a time).
    buf_at: u64,
}

impl<'a, R: ReadAt + ?Sized> Blocks<'a, R> {
    /// A reader of `[start, end)` of `src` (the file `path`).
    pub(crate) fn new(src: &'a R, path: &'a Path, start: u64, end: u64) -> Blocks<'a, R> {
        Blocks {
            src,
            path,
            pos: start,
            end: end.max(start),
            buf: Vec::new(),
            buf_at: start,
        }
    }

    /// The next block (at most [`BLOCK`] bytes, every block but the last exactly that), or
    /// `None` at the end. Blocks start at `start + k * BLOCK`, so items of a width dividing
    /// [`BLOCK`] never straddle two blocks.
    pub(crate) fn next_block(&mut self) -> Result<Option<&[u8]>> {
        if self.pos >= self.end {
            return Ok(None);
        }
        let n = (self.end - self.pos).min(BLOCK as u64) as usize;
        if let Some(object) = self.src.as_remote() {
            let held = self.pos >= self.buf_at
                && self.pos + n as u64 <= self.buf_at + self.buf.len() as u64;
            if !held {
                let len = (self.end - self.pos).min(REMOTE_AHEAD as u64) as usize;
                self.buf.resize(len, 0);
                crate::storage::remote::read_parallel(object, &mut self.buf, self.pos).map_err(
                    |e| Error::Io {
                        path: self.path.to_path_buf(),
                        offset: Some(self.pos),
                        source: e.into(),
                    },
                )?;
                self.buf_at = self.pos;
            }
            let from = (self.pos - self.buf_at) as usize;
            self.pos += n as u64;
            return Ok(Some(&self.buf[from..from + n]));
        }
        self.buf.resize(n, 0);
        read_exact_at(self.src, self.path, &mut self.buf, self.pos)?;
        self.pos += n as u64;
        Ok(Some(&self.buf))
    }
}

/// `a * b + c` in u64, or `None` on overflow.
pub(crate) fn mul_add(a: u64, b: u64, c: u64) -> Option<u64> {
    a.checked_mul(b)?.checked_add(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_file_names_the_file_and_offset() {
        let src = vec![1u8, 2, 3];
        let e = u64_at(&src, Path::new("x.idx"), 0).unwrap_err();
        let msg = e.to_string();
        assert!(msg.starts_with("x.idx: ends at byte 3"), "{msg}");
        assert!(msg.contains("8 bytes at offset 0"), "{msg}");
    }

    #[test]
    fn blocks_cover_the_range_exactly() {
        let src: Vec<u8> = (0..(BLOCK * 2 + 10)).map(|i| i as u8).collect();
        let path = Path::new("b");
        let mut blocks = Blocks::new(&src, path, 3, src.len() as u64);
        let mut got = Vec::new();
        let mut sizes = Vec::new();
        while let Some(b) = blocks.next_block().unwrap() {
            sizes.push(b.len());
            got.extend_from_slice(b);
        }
        assert_eq!(got, src[3..]);
        assert_eq!(sizes, [BLOCK, BLOCK, 7]);
        assert!(
            Blocks::new(&src, path, 5, 2)
                .next_block()
                .unwrap()
                .is_none()
        );
    }
}

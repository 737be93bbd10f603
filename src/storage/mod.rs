//! Where bytes come from: the seam between the read path and storage.
//!
//! Every file of a dataset (shards, checksum and document files) is read through [`ReadAt`],
//! positioned reads into the caller's buffer. A local file is a `File` (pread), or a
//! [`fdpool::PinnedFile`] when the dataset has more files than descriptors it may keep open;
//! tests plug in memory (`Vec<u8>`) and failing or counting sources
//! (`Dataset::wrap_sources`). A remote backend (object stores, HTTP ranges) is one more
//! implementation beside `local.rs`, opened by the same `dataset/open.rs` steps.
//!
//! | file | question |
//! | --- | --- |
//! | `local.rs` | how is a listed local file opened and checked, and `manifest.json` read? |
//! | `access.rs` | as whom is each listed file opened (a mount never serves bytes the dataset's owner could not read)? |
//! | `fdpool.rs` | how does a dataset with more files than descriptors stay readable, and never serve a replaced file? |

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

pub(crate) mod access;
pub(crate) mod fdpool;
mod local;
pub(crate) mod remote;

pub(crate) use local::{LocalFiles, read_manifest};
pub use local::{MAX_MANIFEST_BYTES, mtime_ns};

/// A source of bytes at offsets: the seam between the read path and storage. Tests plug in
/// in-memory or failing sources.
pub trait ReadAt: Send + Sync {
    /// Reads up to `buf.len()` bytes at `offset`; returns how many were read (0 at EOF).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;

    /// The remote object this reads, if it is one (its reads can be issued together:
    /// `remote::read_many`). Crate-internal: other implementations keep the default.
    #[doc(hidden)]
    #[allow(private_interfaces)]
    fn as_remote(&self) -> Option<&remote::RemoteObject> {
        None
    }
}

impl ReadAt for File {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        FileExt::read_at(self, buf, offset)
    }
}

impl ReadAt for Vec<u8> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

//! The memory a finished step file lives in: plain heap memory, or a memory file (`memfd`)
//! that the kernel can serve readers from directly (FUSE passthrough, `fuse/passthrough.rs`),
//! so a step's bytes are copied once by the daemon (from the shards into the buffer) and once
//! by the kernel (into the reader), with no request per read.
//!
//! A memory file handed to the kernel may still be read or mapped by a reader long after the
//! daemon is done with it: it is rewritten only once [`StepBuf::unshared`] says no file but
//! the daemon's own has it open or mapped.

use std::fs::File;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use memmap2::MmapMut;

/// A step file's buffer (see the module docs).
#[derive(Debug)]
pub struct StepBuf(Inner);

#[derive(Debug)]
enum Inner {
    Heap(Box<[u8]>),
    Memfd(MemFile),
}

/// A memory file mapped into the daemon, and a read-only descriptor of it that checks
/// whether anybody else holds it.
#[derive(Debug)]
struct MemFile {
    map: MmapMut,
    /// The file's length (the mapping has at least one byte).
    len: usize,
    file: File,
    /// `None` when `/proc` could not reopen it: then it is never reused.
    ro: Option<OwnedFd>,
}

impl StepBuf {
    /// `len` zero bytes on the heap.
    pub fn heap(len: usize) -> StepBuf {
        StepBuf(Inner::Heap(vec![0; len].into_boxed_slice()))
    }

    /// `len` bytes (zero) in a new memory file, mapped and populated.
    pub fn memfd(len: usize) -> std::io::Result<StepBuf> {
        // SAFETY: a C string and flags; the result is checked.
        let fd = unsafe { libc::memfd_create(c"shufflefs-step".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        file.set_len(len as u64)?;
        // A zero-length mapping is refused: an empty file is never served anyway, but keep
        // the type total with one page.
        // SAFETY: the file is ours alone (unnamed, never resized): the mapping's bytes change
        // only through it.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .len(len.max(1))
                .populate()
                .map_mut(&file)?
        };
        let ro = File::open(format!("/proc/self/fd/{fd}"))
            .ok()
            .map(OwnedFd::from);
        Ok(StepBuf(Inner::Memfd(MemFile { map, len, file, ro })))
    }

    /// The memory file, when the bytes are in one.
    pub fn memfd_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.0 {
            Inner::Heap(_) => None,
            Inner::Memfd(m) => Some(std::os::fd::AsFd::as_fd(&m.file)),
        }
    }

    /// Whether only the daemon holds these bytes, so they may be rewritten: always for heap
    /// memory; for a memory file, when no other open file or mapping of it exists (a write
    /// lease is granted only then).
    pub fn unshared(&self) -> bool {
        let Inner::Memfd(m) = &self.0 else {
            return true;
        };
        let Some(ro) = &m.ro else { return false };
        let fd = ro.as_raw_fd();
        // SAFETY: fcntl on a descriptor we own; a lease taken is given back at once.
        if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK) } != 0 {
            return false;
        }
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
        true
    }
}

impl Deref for StepBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Inner::Heap(b) => b,
            Inner::Memfd(m) => &m.map[..m.len],
        }
    }
}

impl DerefMut for StepBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Inner::Heap(b) => b,
            Inner::Memfd(m) => &mut m.map[..m.len],
        }
    }
}

impl From<Vec<u8>> for StepBuf {
    fn from(v: Vec<u8>) -> StepBuf {
        StepBuf(Inner::Heap(v.into_boxed_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_file_is_unshared_until_someone_opens_or_maps_it() {
        let mut b = StepBuf::memfd(10_000).unwrap();
        b[..3].copy_from_slice(b"abc");
        assert_eq!(&b[..4], b"abc\0");
        assert_eq!(b.len(), 10_000);
        assert!(b.unshared());
        let fd = b.memfd_fd().unwrap().as_raw_fd();
        let other = File::open(format!("/proc/self/fd/{fd}")).unwrap();
        assert!(!b.unshared());
        // SAFETY: a read-only mapping; the test writes the file only before mapping it.
        let map = unsafe { memmap2::Mmap::map(&other) }.unwrap();
        drop(other);
        assert!(!b.unshared(), "a mapping outlives its file");
        assert_eq!(&map[..3], b"abc");
        drop(map);
        assert!(b.unshared());
        assert!(StepBuf::heap(5).unshared());
    }
}

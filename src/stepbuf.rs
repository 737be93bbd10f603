//! The memory a finished step file lives in: plain heap memory, or a memory file (`memfd`)
//! that the kernel can serve readers from directly (FUSE passthrough, `fuse/passthrough.rs`),
//! so a step's bytes are copied once by the daemon (from the shards into the buffer) and once
//! by the kernel (into the reader), with no request per read.
//!
//! A memory file handed to the kernel may still be read or mapped by a reader long after the
//! daemon is done with it: it is rewritten only once [`StepBuf::unshared`] says no file but
//! the daemon's own has it open or mapped.
//!
//! Each memory file holds a descriptor: at most [`set_memfd_budget`] of them live at once
//! (what the open-file limit leaves beside the dataset's files); past it buffers are heap
//! memory, which a passthrough open copies.

use std::fs::File;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use memmap2::MmapMut;

/// Memory files alive now.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Most memory files alive at once (see [`set_memfd_budget`]).
static BUDGET: AtomicUsize = AtomicUsize::new(DEFAULT_BUDGET);
/// The budget unless the mount sets one.
const DEFAULT_BUDGET: usize = 4096;

/// At most `n` memory files live at once from now on (each holds a descriptor).
pub(crate) fn set_memfd_budget(n: usize) {
    BUDGET.store(n, Ordering::Relaxed);
}

/// A step file's buffer (see the module docs).
#[derive(Debug)]
pub struct StepBuf(Inner);

#[derive(Debug)]
enum Inner {
    Heap(Box<[u8]>),
    Memfd(MemFile),
}

/// A memory file mapped into the daemon.
#[derive(Debug)]
struct MemFile {
    map: MmapMut,
    /// The file's length (the mapping has at least one byte).
    len: usize,
    file: File,
}

impl Drop for MemFile {
    fn drop(&mut self) {
        LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

impl StepBuf {
    /// `len` zero bytes on the heap.
    pub fn heap(len: usize) -> StepBuf {
        StepBuf(Inner::Heap(vec![0; len].into_boxed_slice()))
    }

    /// `len` bytes (zero) in a new memory file, mapped and populated; an error once the
    /// budget of memory files is reached.
    pub fn memfd(len: usize) -> std::io::Result<StepBuf> {
        if LIVE.fetch_add(1, Ordering::Relaxed) >= BUDGET.load(Ordering::Relaxed) {
            LIVE.fetch_sub(1, Ordering::Relaxed);
            return Err(std::io::Error::other(
                "the budget of memory files is reached",
            ));
        }
        // Counted from here: a failure below gives it back.
        struct Undo(bool);
        impl Drop for Undo {
            fn drop(&mut self) {
                if self.0 {
                    LIVE.fetch_sub(1, Ordering::Relaxed);
                }
            }
        }
        let mut undo = Undo(true);
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
        undo.0 = false;
        Ok(StepBuf(Inner::Memfd(MemFile { map, len, file })))
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
        // A lease is taken on a read-only open of the file (the daemon's own descriptor, made
        // by memfd_create, counts as no open): granted only if no other open or mapping exists.
        let Ok(ro) = File::open(format!("/proc/self/fd/{}", m.file.as_raw_fd())) else {
            return false;
        };
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

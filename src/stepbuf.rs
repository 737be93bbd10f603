//! The memory a finished step file lives in: plain heap memory, or a memory file (`memfd`)
//! that the kernel can serve readers from directly (FUSE passthrough, `fuse/passthrough.rs`),
//! so a step's bytes are copied once by the daemon (from the shards into the buffer) and once
//! by the kernel (into the reader), with no request per read.
//!
//! A memory file handed to the kernel ([`StepBuf::hand_out`]) is never written again: a
//! reader may hold it open or mapped long after the daemon is done with it, and its pages can
//! outlive every open file and mapping (a pipe or socket a reader spliced or `sendfile`d them
//! into, pages pinned for direct I/O), which no check can see. Such a buffer is freed with
//! its last reference; only buffers never handed out are reused ([`StepBuf::unshared`]).
//!
//! Each memory file holds a descriptor: at most [`set_memfd_budget`] of them live at once
//! (what the open-file limit leaves beside the dataset's files); past it buffers are heap
//! memory, which a passthrough open copies.

use std::fs::File;
use std::ops::{Deref, DerefMut};
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use memmap2::MmapMut;

/// Memory files alive now.
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Most memory files alive at once (see [`set_memfd_budget`]).
static BUDGET: AtomicUsize = AtomicUsize::new(DEFAULT_BUDGET);
/// The budget unless a mount lowers it (`shufflefs mount` to what its open-file limit
/// leaves, a library mount to half of what the limit leaves the process).
const DEFAULT_BUDGET: usize = 16384;

/// At most `n` memory files live at once from now on (each holds a descriptor).
pub(crate) fn set_memfd_budget(n: usize) {
    BUDGET.store(n, Ordering::Relaxed);
}

/// Lowers the budget to `n` if it is higher.
pub(crate) fn limit_memfd_budget(n: usize) {
    BUDGET.fetch_min(n, Ordering::Relaxed);
}

/// A step file's buffer (see the module docs).
#[derive(Debug)]
pub struct StepBuf(Inner, AtomicBool);

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
        StepBuf(
            Inner::Heap(vec![0; len].into_boxed_slice()),
            AtomicBool::new(false),
        )
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
        Ok(StepBuf(
            Inner::Memfd(MemFile { map, len, file }),
            AtomicBool::new(false),
        ))
    }

    /// The memory file, when the bytes are in one.
    pub fn memfd_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.0 {
            Inner::Heap(_) => None,
            Inner::Memfd(m) => Some(std::os::fd::AsFd::as_fd(&m.file)),
        }
    }

    /// The memory file is handed to the kernel (a passthrough open's backing file): it is
    /// never written again.
    pub fn hand_out(&self) {
        self.1.store(true, Ordering::Relaxed);
    }

    /// Whether these bytes may be rewritten once nothing else references the buffer: heap
    /// memory always (readers get copies), a memory file only if it was never handed out.
    pub fn unshared(&self) -> bool {
        matches!(self.0, Inner::Heap(_)) || !self.1.load(Ordering::Relaxed)
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
        StepBuf(Inner::Heap(v.into_boxed_slice()), AtomicBool::new(false))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn a_memory_file_holds_its_bytes_and_is_never_reused_once_handed_out() {
        let mut b = StepBuf::memfd(10_000).unwrap();
        b[..3].copy_from_slice(b"abc");
        assert_eq!(&b[..4], b"abc\0");
        assert_eq!(b.len(), 10_000);
        let fd = b.memfd_fd().unwrap().as_raw_fd();
        let mut seen = Vec::new();
        File::open(format!("/proc/self/fd/{fd}"))
            .unwrap()
            .read_to_end(&mut seen)
            .unwrap();
        assert_eq!(&seen[..3], b"abc", "the file holds what the mapping wrote");
        assert!(b.unshared());
        b.hand_out();
        assert!(!b.unshared());
        assert!(StepBuf::heap(5).unshared());
    }
}

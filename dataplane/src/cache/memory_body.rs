//! The body of a memory-tier entry. Bodies of at least [`SEALED_MIN`] bytes live in a sealed
//! memfd mapped read-only: the bytes stay in memory (shared memory, counted in the process's
//! RSS through the mapping) and a hit can `sendfile(2)` them to the client, which hands the
//! socket page references instead of copying the body through user space. Smaller bodies go
//! out with their response head in one write and stay a plain vector.

use std::ops::Deref;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Below this a body is written together with its head (see `serve::INLINE_BODY`).
pub const SEALED_MIN: usize = 64 << 10;

/// Each sealed body holds a descriptor; past this many the rest stay on the heap, so a memory
/// tier full of mid-sized objects cannot eat the descriptors connections need.
const MAX_SEALED: usize = 4096;

static SEALED: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug)]
pub enum MemoryBody {
    Heap(Vec<u8>),
    Sealed { map: memmap2::Mmap, fd: OwnedFd },
}

impl MemoryBody {
    /// Seals large bodies into a memfd; keeps the vector when that fails (e.g. no memfd
    /// support), so storing never fails on this account.
    pub fn new(bytes: Vec<u8>) -> Self {
        if bytes.len() < SEALED_MIN {
            return Self::Heap(bytes);
        }
        // Fills of large objects only: a count every core writes, but rarely.
        if SEALED.fetch_add(1, Relaxed) >= MAX_SEALED {
            SEALED.fetch_sub(1, Relaxed);
            return Self::Heap(bytes);
        }
        match crate::sys::sealed_memfd(c"switchyard-cache", &bytes) {
            Ok((fd, map)) => Self::Sealed { map, fd },
            Err(e) => {
                SEALED.fetch_sub(1, Relaxed);
                tracing::debug!(error = %e, "memfd for a cached body failed; kept on the heap");
                Self::Heap(bytes)
            }
        }
    }

    /// The descriptor `sendfile(2)` reads the body from, when it is sealed in a memfd.
    pub fn fd(&self) -> Option<RawFd> {
        match self {
            Self::Heap(_) => None,
            Self::Sealed { fd, .. } => Some(fd.as_raw_fd()),
        }
    }
}

impl Drop for MemoryBody {
    fn drop(&mut self) {
        if let Self::Sealed { .. } = self {
            SEALED.fetch_sub(1, Relaxed);
        }
    }
}

impl Deref for MemoryBody {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Self::Heap(v) => v,
            Self::Sealed { map, .. } => map,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_bodies_are_sealed_and_read_back_exactly() {
        let small = MemoryBody::new(vec![7u8; 100]);
        assert!(small.fd().is_none());
        assert_eq!(&small[..], &[7u8; 100][..]);
        let data: Vec<u8> = (0..SEALED_MIN * 3).map(|i| (i % 253) as u8).collect();
        let big = MemoryBody::new(data.clone());
        let fd = big.fd().expect("sealed in a memfd");
        assert_eq!(&big[..], &data[..]);
        // The seals hold: nobody can shrink or rewrite what a hit is sending.
        let file = std::fs::File::from(crate::sys::dup(fd).expect("dup"));
        assert!(file.set_len(1).is_err());
        assert!(std::io::Write::write(&mut &file, b"x").is_err());
    }
}

//! Per-core pool of relay buffers. A buffer is borrowed only while bytes are in hand (between a
//! successful read and the end of the write), never while a socket waits to become readable, so
//! thousands of idle tunnels hold no buffers at all.

use std::cell::RefCell;

pub const BUFFER_SIZE: usize = 256 * 1024;
const MAX_POOLED: usize = 32;

thread_local! {
    static POOL: RefCell<Vec<Box<[u8]>>> = const { RefCell::new(Vec::new()) };
}

pub fn take() -> Box<[u8]> {
    POOL.with(|p| p.borrow_mut().pop())
        .unwrap_or_else(|| vec![0u8; BUFFER_SIZE].into_boxed_slice())
}

pub fn give(buf: Box<[u8]>) {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        if p.len() < MAX_POOLED {
            p.push(buf);
        }
    });
}

#[cfg(test)]
mod tests {
    #[test]
    fn reuses_buffers() {
        let a = super::take();
        let ptr = a.as_ptr();
        super::give(a);
        let b = super::take();
        assert_eq!(b.as_ptr(), ptr);
        assert_eq!(b.len(), super::BUFFER_SIZE);
    }
}

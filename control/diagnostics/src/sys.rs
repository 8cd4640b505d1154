//! The two libc calls this crate needs: glibc's allocator statistics and the clock tick rate.
#![allow(unsafe_code)]

/// glibc `mallinfo2()` figures, summed over every arena (bytes unless named a count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MallInfo {
    /// Non-mmapped bytes the arenas obtained from the system (`arena`).
    pub arena: u64,
    /// Free chunks (`ordblks`).
    pub free_chunks: u64,
    /// Free fastbin chunks (`smblks`).
    pub fastbin_chunks: u64,
    /// Blocks allocated directly with mmap (`hblks`).
    pub mmapped_blocks: u64,
    /// Bytes in blocks allocated with mmap (`hblkhd`).
    pub mmapped_bytes: u64,
    /// Bytes in freed fastbin chunks (`fsmblks`).
    pub fastbin_free_bytes: u64,
    /// Bytes in chunks in use (`uordblks`).
    pub in_use_bytes: u64,
    /// Bytes in free chunks (`fordblks`).
    pub free_bytes: u64,
    /// Releasable bytes at the top of the main heap (`keepcost`).
    pub top_releasable: u64,
}

/// The allocator's statistics, or `None` where the C library is not glibc (then the heap
/// figures of the API are 0). glibc locks each arena briefly while it sums them.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn mallinfo() -> Option<MallInfo> {
    // SAFETY: mallinfo2 takes no arguments, only reads the allocator's own state under its
    // arena locks and returns a plain struct by value (glibc >= 2.33).
    let m = unsafe { libc::mallinfo2() };
    Some(MallInfo {
        arena: m.arena as u64,
        free_chunks: m.ordblks as u64,
        fastbin_chunks: m.smblks as u64,
        mmapped_blocks: m.hblks as u64,
        mmapped_bytes: m.hblkhd as u64,
        fastbin_free_bytes: m.fsmblks as u64,
        in_use_bytes: m.uordblks as u64,
        free_bytes: m.fordblks as u64,
        top_releasable: m.keepcost as u64,
    })
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn mallinfo() -> Option<MallInfo> {
    None
}

/// Clock ticks per second of `/proc/*/stat` CPU times (`_SC_CLK_TCK`), 100 if unknown.
pub fn clock_ticks_per_second() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as u64
    } else {
        100
    }
}

/// Returns free memory at the top of the heap and in free arena pages to the system
/// (glibc `malloc_trim(0)`); a no-op elsewhere.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn release_free_heap() {
    // SAFETY: malloc_trim only walks the allocator's own arenas under their locks.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_heap() {}

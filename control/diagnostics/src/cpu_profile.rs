//! CPU profiles for `/debug/pprof/profile`: the `pprof` crate samples every thread of the
//! process on `SIGPROF` (setitimer `ITIMER_PROF`, so CPU time, like Go's profiler), and the
//! result is encoded as pprof protobuf and gzip-compressed, as Go serves it. One profile at a
//! time: the sampler is process-wide.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Samples per second (Go's default rate).
pub const SAMPLE_HZ: i32 = 100;
/// Accepted `seconds`.
pub const SECONDS: std::ops::RangeInclusive<u64> = 1..=300;
/// `seconds` when none is given.
pub const DEFAULT_SECONDS: u64 = 30;

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("a CPU profile is already being taken; try again when it ends")]
    Busy,
    #[error("seconds must be between {lo} and {hi}, got {0}", lo = SECONDS.start(), hi = SECONDS.end())]
    Seconds(u64),
    #[error("starting the CPU profiler: {0}")]
    Start(String),
    #[error("building the CPU profile: {0}")]
    Report(String),
}

/// Hands out the one profiling slot of the process. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct CpuProfiler {
    busy: Arc<AtomicBool>,
}

/// Holds the slot; frees it when dropped, also when the request is cancelled.
struct Slot(Arc<AtomicBool>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl CpuProfiler {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }

    fn take_slot(&self) -> Result<Slot, ProfileError> {
        self.busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| Slot(self.busy.clone()))
            .map_err(|_| ProfileError::Busy)
    }

    /// Profiles the whole process for `seconds` and returns the gzip'd pprof protobuf.
    /// Dropping the future stops the sampler at once.
    pub async fn profile(&self, seconds: u64) -> Result<Vec<u8>, ProfileError> {
        if !SECONDS.contains(&seconds) {
            return Err(ProfileError::Seconds(seconds));
        }
        let slot = self.take_slot()?;
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(SAMPLE_HZ)
            // Samples whose innermost frame is in these libraries are skipped: unwinding from
            // there inside a signal handler can deadlock (pprof-rs's advice).
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .map_err(|e| ProfileError::Start(e.to_string()))?;
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        // Symbolising and encoding take a while: off the async workers.
        let encoded = tokio::task::spawn_blocking(move || {
            let result = encode(&guard);
            drop(guard);
            // Symbolising parsed this binary's debug information into a process-wide cache.
            backtrace::clear_symbol_cache();
            // The profiler frees a sample table of tens of MiB (and allocates a fresh one it
            // keeps); hand the freed pages back rather than keep them resident.
            crate::sys::release_free_heap();
            drop(slot);
            result
        })
        .await
        .map_err(|e| ProfileError::Report(e.to_string()))??;
        Ok(encoded)
    }
}

fn encode(guard: &pprof::ProfilerGuard<'_>) -> Result<Vec<u8>, ProfileError> {
    use pprof::protos::Message as _;
    let report = guard
        .report()
        .build()
        .map_err(|e| ProfileError::Report(e.to_string()))?;
    let profile = report
        .pprof()
        .map_err(|e| ProfileError::Report(e.to_string()))?;
    let raw = profile.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw)
        .and_then(|_| gz.finish())
        .map_err(|e| ProfileError::Report(e.to_string()))
}

//! Hands blocking or tokio-only work (DNS, bcrypt) from a data-plane core to the control plane's
//! tokio runtime and awaits the answer; glommio wakes the waiting task from the tokio thread.
//! The number of jobs in flight is bounded: over the bound the caller fails fast instead of
//! queueing without limit.

use crate::error::DataplaneError;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct Offload {
    handle: tokio::runtime::Handle,
    in_flight: Arc<AtomicUsize>,
    limit: usize,
}

struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Offload {
    pub fn new(handle: tokio::runtime::Handle, limit: usize) -> Self {
        Self {
            handle,
            in_flight: Arc::new(AtomicUsize::new(0)),
            limit: limit.max(1),
        }
    }

    fn reserve(&self) -> Result<InFlight, DataplaneError> {
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let guard = InFlight(self.in_flight.clone());
        if before >= self.limit {
            return Err(DataplaneError::Overloaded(
                "control-plane work queue is full",
            ));
        }
        Ok(guard)
    }

    /// Runs a blocking closure on tokio's blocking pool.
    pub async fn blocking<F, R>(&self, f: F) -> Result<R, DataplaneError>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let guard = self.reserve()?;
        let out = self.handle.spawn_blocking(f).await;
        drop(guard);
        out.map_err(|_| DataplaneError::Overloaded("control-plane worker failed"))
    }

    /// Runs a future on the tokio runtime.
    pub async fn spawn<F>(&self, fut: F) -> Result<F::Output, DataplaneError>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let guard = self.reserve()?;
        let out = self.handle.spawn(fut).await;
        drop(guard);
        out.map_err(|_| DataplaneError::Overloaded("control-plane worker failed"))
    }
}

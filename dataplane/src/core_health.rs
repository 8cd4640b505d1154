//! Measured state of each data-plane core, written by the thread that supervises it (never by
//! the core itself) and read by the control plane for `/api/v1/health` and the
//! `switchyard_core_up` / `switchyard_core_failures_total` metrics.
//!
//! A core is `up` from the moment its executor reports ready until its thread ends; every end
//! counts a failure with its reason. Reads are atomics; the last reason sits behind a mutex that
//! only the supervisor and API readers take, so no core ever waits on it.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[derive(Debug, Default)]
struct CoreSlot {
    up: AtomicBool,
    failures: AtomicU64,
    last_failure: Mutex<Option<String>>,
}

/// One core's state, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreState {
    pub index: usize,
    pub cpu: usize,
    pub up: bool,
    pub failures: u64,
    pub last_failure: Option<String>,
}

#[derive(Debug)]
pub struct CoreHealth {
    cpus: Vec<usize>,
    slots: Box<[CoreSlot]>,
}

impl CoreHealth {
    /// Every core starts down until it reports ready.
    pub fn new(cpus: &[usize]) -> Self {
        Self {
            cpus: cpus.to_vec(),
            slots: cpus.iter().map(|_| CoreSlot::default()).collect(),
        }
    }

    pub fn mark_up(&self, index: usize) {
        if let Some(s) = self.slots.get(index) {
            s.up.store(true, Ordering::Release);
        }
    }

    /// The core stopped (failed to start, panicked, or its executor ended).
    pub fn mark_failed(&self, index: usize, reason: &str) {
        if let Some(s) = self.slots.get(index) {
            s.up.store(false, Ordering::Release);
            s.failures.fetch_add(1, Ordering::AcqRel);
            *s.last_failure.lock() = Some(reason.to_owned());
        }
    }

    pub fn states(&self) -> Vec<CoreState> {
        self.slots
            .iter()
            .zip(&self.cpus)
            .enumerate()
            .map(|(index, (s, &cpu))| CoreState {
                index,
                cpu,
                up: s.up.load(Ordering::Acquire),
                failures: s.failures.load(Ordering::Acquire),
                last_failure: s.last_failure.lock().clone(),
            })
            .collect()
    }

    /// Why the data plane is not whole: one line per core that is down.
    pub fn problems(&self) -> Vec<String> {
        self.states()
            .into_iter()
            .filter(|c| !c.up)
            .map(|c| {
                format!(
                    "data-plane core {} (cpu {}) is down: {}",
                    c.index,
                    c.cpu,
                    c.last_failure.as_deref().unwrap_or("not started")
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_until_ready_and_failures_are_kept() {
        let h = CoreHealth::new(&[2, 3]);
        assert_eq!(h.problems().len(), 2);
        h.mark_up(0);
        h.mark_up(1);
        assert!(h.problems().is_empty());
        h.mark_failed(1, "panicked: boom");
        let problems = h.problems();
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("core 1 (cpu 3)") && problems[0].contains("boom"));
        h.mark_up(1);
        assert!(h.problems().is_empty());
        let s = &h.states()[1];
        assert_eq!(
            (s.failures, s.last_failure.as_deref()),
            (1, Some("panicked: boom"))
        );
        h.mark_failed(9, "out of range is ignored");
    }
}

//! Measured state of each data-plane core, read by the control plane for `/api/v1/health`, the
//! `switchyard_core_*` metrics and the service watchdog.
//!
//! Two kinds of evidence, kept apart by who writes them. The thread that supervises a core
//! records that it is `up` (from its executor reporting ready until its thread ends) and every
//! end as a failure with its reason. The core itself proves that it still runs tasks: a timer
//! task on it stores a heartbeat every [`HEARTBEAT_INTERVAL`] (one atomic store into the core's
//! own cache line), so a core whose executor is wedged (a task that never yields, a thread
//! blocked in a syscall or stopped by a debugger) stops beating and is reported
//! [`CoreState::stalled`] once it has been silent for [`STALL_THRESHOLD`].
//!
//! Reads are atomics; the last failure reason sits behind a mutex that only the supervisor and
//! API readers take, so no core ever waits on it.

use crate::cores::CpuLabel;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often a running core proves it runs tasks. One timer wake-up per core per second: an
/// idle box (issue 14 counts its wake-ups) pays one wake-up a second per core, and a core is
/// silent for at most ~1 s between beats, a third of [`STALL_THRESHOLD`].
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(1);

/// How long a core that is up may go without a heartbeat before it counts as not responding:
/// three beats missed. A loaded core's timer fires late by its longest task slice (glommio
/// preempts at 100 ms), far below this; a wedged core is named within 3–4 s, well inside the
/// service watchdog's 30 s.
pub const STALL_THRESHOLD: Duration = Duration::from_secs(3);

#[derive(Debug, Default)]
struct CoreSlot {
    up: AtomicBool,
    failures: AtomicU64,
    /// Milliseconds from [`CoreHealth`]'s epoch to the core's last heartbeat.
    heartbeat_ms: AtomicU64,
    /// Stalls the control plane saw begin (metrics).
    stalls: AtomicU64,
    last_failure: Mutex<Option<String>>,
}

/// One core's state, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreState {
    pub index: usize,
    /// The CPU the core is pinned to (`None`: unpinned).
    pub cpu: Option<usize>,
    pub up: bool,
    pub failures: u64,
    pub last_failure: Option<String>,
    /// Time since the core's last heartbeat (its start counts as one).
    pub silent_for: Duration,
    /// Stalls that began so far (counted by the control plane's watch).
    pub stalls: u64,
}

impl CoreState {
    /// The core is up but has not run its heartbeat task for longer than [`STALL_THRESHOLD`].
    pub fn stalled(&self) -> bool {
        self.up && self.silent_for > STALL_THRESHOLD
    }

    /// Up and running tasks.
    pub fn serving(&self) -> bool {
        self.up && !self.stalled()
    }

    /// Why this core does not serve, in words for the health endpoint; `None` when it serves.
    pub fn problem(&self) -> Option<String> {
        if !self.up {
            Some(format!(
                "data-plane core {} ({}) is down: {}",
                self.index,
                CpuLabel(self.cpu),
                self.last_failure.as_deref().unwrap_or("not started")
            ))
        } else if self.stalled() {
            Some(format!(
                "data-plane core {} ({}) not responding for {:.1} s",
                self.index,
                CpuLabel(self.cpu),
                self.silent_for.as_secs_f64()
            ))
        } else {
            None
        }
    }
}

#[derive(Debug)]
pub struct CoreHealth {
    cpus: Vec<Option<usize>>,
    epoch: Instant,
    slots: Box<[CachePadded<CoreSlot>]>,
}

impl CoreHealth {
    /// Every core starts down until it reports ready.
    pub fn new(cpus: &[Option<usize>]) -> Self {
        Self {
            cpus: cpus.to_vec(),
            epoch: Instant::now(),
            slots: cpus.iter().map(|_| CachePadded::default()).collect(),
        }
    }

    /// Called on the core when it is ready: up, and a first heartbeat (a restarted core is not
    /// judged by its predecessor's last beat).
    pub fn mark_up(&self, index: usize) {
        self.beat(index);
        if let Some(s) = self.slots.get(index) {
            s.up.store(true, Ordering::Release);
        }
    }

    /// The core ran its heartbeat task: one store into its own slot, no lock.
    pub fn beat(&self, index: usize) {
        self.beat_at(index, Instant::now());
    }

    fn beat_at(&self, index: usize, now: Instant) {
        if let Some(s) = self.slots.get(index) {
            let ms = now.saturating_duration_since(self.epoch).as_millis();
            s.heartbeat_ms
                .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Release);
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

    /// The control plane saw a stall of this core begin.
    pub fn count_stall(&self, index: usize) {
        if let Some(s) = self.slots.get(index) {
            s.stalls.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn states(&self) -> Vec<CoreState> {
        self.states_at(Instant::now())
    }

    fn states_at(&self, now: Instant) -> Vec<CoreState> {
        let since_epoch = now.saturating_duration_since(self.epoch);
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
                silent_for: since_epoch.saturating_sub(Duration::from_millis(
                    s.heartbeat_ms.load(Ordering::Acquire),
                )),
                stalls: s.stalls.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Why the data plane is not whole: one line per core that is down or not responding.
    pub fn problems(&self) -> Vec<String> {
        self.states()
            .iter()
            .filter_map(CoreState::problem)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_until_ready_and_failures_are_kept() {
        let h = CoreHealth::new(&[Some(2), Some(3)]);
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

    #[test]
    fn a_core_silent_past_the_threshold_is_stalled_until_it_beats_again() {
        let h = CoreHealth::new(&[Some(0), None]);
        let start = h.epoch;
        h.mark_up(0);
        h.mark_up(1);
        h.beat_at(0, start);
        h.beat_at(1, start);
        let at = |secs: f64| start + Duration::from_secs_f64(secs);
        // at the threshold exactly: still serving
        let states = h.states_at(at(3.0));
        assert!(states.iter().all(CoreState::serving), "{states:?}");
        // core 1 keeps beating, core 0 does not
        h.beat_at(1, at(3.5));
        let states = h.states_at(at(4.2));
        assert!(states[0].stalled() && !states[1].stalled(), "{states:?}");
        assert_eq!(
            states[0].problem().as_deref(),
            Some("data-plane core 0 (cpu 0) not responding for 4.2 s")
        );
        assert_eq!(states[1].problem(), None);
        // a beat ends the stall
        h.beat_at(0, at(4.3));
        assert!(h.states_at(at(4.4)).iter().all(CoreState::serving));
    }

    #[test]
    fn a_core_that_is_down_is_reported_down_not_stalled() {
        let h = CoreHealth::new(&[Some(5)]);
        h.mark_up(0);
        h.mark_failed(0, "panicked: x");
        let s = &h.states_at(h.epoch + Duration::from_secs(60))[0];
        assert!(!s.stalled(), "{s:?}");
        assert!(s.problem().is_some_and(|p| p.contains("is down")), "{s:?}");
    }
}

//! Watches the data-plane cores' heartbeats from the control plane and feeds the systemd
//! watchdog with what it sees.
//!
//! [`StallTracker`] is the plain logic: given the cores' measured states, which stalls began
//! and which ended since the last look (so each stall is logged once, when it starts, and once
//! when it ends). [`run`] looks twice a second: it logs the changes, counts each stall
//! (`switchyard_core_stalls_total`), keeps the unit's `STATUS=` naming the stalled cores, and
//! sends `WATCHDOG=1` every half `WATCHDOG_USEC` only while no core is stalled. Since the task
//! runs on the control plane's runtime, a wedged control plane stops the keep-alives as well:
//! either way systemd restarts the service.

use crate::systemd_notify::Notifier;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_dataplane::core_health::{CoreHealth, CoreState};
use switchyard_dataplane::cores::CpuLabel;

/// A change the tracker saw between two looks.
#[derive(Debug, Clone, PartialEq)]
pub enum StallChange {
    /// The core is up but silent past the threshold.
    Began {
        index: usize,
        cpu: Option<usize>,
        silent_for: Duration,
    },
    /// It beats again (or went down, which the supervisor reports on its own).
    Ended { index: usize, cpu: Option<usize> },
}

#[derive(Debug, Default)]
pub struct StallTracker {
    stalled: Vec<bool>,
}

impl StallTracker {
    pub fn observe(&mut self, cores: &[CoreState]) -> Vec<StallChange> {
        self.stalled.resize(cores.len(), false);
        let mut changes = Vec::new();
        for (c, was) in cores.iter().zip(self.stalled.iter_mut()) {
            let now = c.stalled();
            match (*was, now) {
                (false, true) => changes.push(StallChange::Began {
                    index: c.index,
                    cpu: c.cpu,
                    silent_for: c.silent_for,
                }),
                (true, false) => changes.push(StallChange::Ended {
                    index: c.index,
                    cpu: c.cpu,
                }),
                _ => {}
            }
            *was = now;
        }
        changes
    }

    pub fn any_stalled(&self) -> bool {
        self.stalled.iter().any(|s| *s)
    }
}

/// How often the cores are looked at.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// Looks at the cores until the process ends; see the module documentation.
pub async fn run(health: Arc<CoreHealth>, notifier: Arc<Notifier>, serving_status: String) {
    let ping_every = notifier.watchdog_timeout().map(|t| t / 2);
    let look_every = ping_every.map_or(LOOK_EVERY, |p| p.min(LOOK_EVERY));
    let mut tick = tokio::time::interval(look_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tracker = StallTracker::default();
    let mut last_ping: Option<Instant> = None;
    loop {
        tick.tick().await;
        let states = health.states();
        let changes = tracker.observe(&states);
        for change in &changes {
            match *change {
                StallChange::Began {
                    index,
                    cpu,
                    silent_for,
                } => {
                    health.count_stall(index);
                    tracing::warn!(
                        core = index,
                        cpu = %CpuLabel(cpu),
                        silent_for_secs = silent_for.as_secs_f64(),
                        "data-plane core not responding (no heartbeat); the systemd watchdog is no longer fed"
                    );
                }
                StallChange::Ended { index, cpu } => {
                    tracing::info!(core = index, cpu = %CpuLabel(cpu), "data-plane core responding again");
                }
            }
        }
        if !changes.is_empty() {
            let problems: Vec<String> = states.iter().filter_map(CoreState::problem).collect();
            if tracker.any_stalled() {
                notifier.status(&problems.join("; "));
            } else {
                notifier.status(&serving_status);
            }
        }
        let Some(every) = ping_every else { continue };
        if !tracker.any_stalled() && last_ping.is_none_or(|t| t.elapsed() >= every) {
            notifier.watchdog();
            last_ping = Some(Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core(index: usize, up: bool, silent_ms: u64) -> CoreState {
        CoreState {
            index,
            cpu: Some(index + 4),
            up,
            failures: 0,
            last_failure: None,
            silent_for: Duration::from_millis(silent_ms),
            stalls: 0,
        }
    }

    #[test]
    fn a_stall_is_reported_once_when_it_begins_and_once_when_it_ends() {
        let mut t = StallTracker::default();
        assert!(t
            .observe(&[core(0, true, 100), core(1, true, 900)])
            .is_empty());
        assert!(!t.any_stalled());
        // past the threshold: one Began
        let changes = t.observe(&[core(0, true, 600), core(1, true, 3100)]);
        assert_eq!(
            changes,
            vec![StallChange::Began {
                index: 1,
                cpu: Some(5),
                silent_for: Duration::from_millis(3100)
            }]
        );
        assert!(t.any_stalled());
        // still stalled, longer: nothing new
        assert!(t
            .observe(&[core(0, true, 100), core(1, true, 9000)])
            .is_empty());
        assert!(t.any_stalled());
        // it beats again: one Ended
        assert_eq!(
            t.observe(&[core(0, true, 100), core(1, true, 10)]),
            vec![StallChange::Ended {
                index: 1,
                cpu: Some(5)
            }]
        );
        assert!(!t.any_stalled());
        // a second stall is a second Began
        assert_eq!(
            t.observe(&[core(0, true, 100), core(1, true, 4000)]).len(),
            1
        );
    }

    #[test]
    fn at_the_threshold_or_down_is_no_stall() {
        let mut t = StallTracker::default();
        let threshold = switchyard_dataplane::core_health::STALL_THRESHOLD.as_millis() as u64;
        assert!(t
            .observe(&[core(0, true, threshold), core(1, false, 60_000)])
            .is_empty());
        assert!(!t.any_stalled());
        // a stalled core that goes down ends its stall (the supervisor reports the failure)
        t.observe(&[core(0, true, threshold + 1)]);
        assert!(t.any_stalled());
        assert_eq!(
            t.observe(&[core(0, false, threshold + 500)]),
            vec![StallChange::Ended {
                index: 0,
                cpu: Some(4)
            }]
        );
    }
}

//! How long a data-plane thread keeps looking for work after its last piece before it sleeps.
//!
//! A packet pipeline crosses threads at every hand-off (device reader → owner core → socket →
//! the peer's core → device). A thread that sleeps as soon as it finds nothing is woken by the
//! next packet through the scheduler, and on a virtual machine waking an idle vCPU costs an
//! inter-processor interrupt through the hypervisor: tens of microseconds per hand-off, which
//! bounds a single flow's rate on a quiet machine (measured: the mesh moved more under a
//! compiler's load than on an idle box). Polling a little longer before sleeping keeps a busy
//! pipeline awake and costs an idle one at most this budget per burst.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The default budget: a few packet times of a fast stream, a negligible share of a core
/// for traffic that arrives in bursts further apart.
const DEFAULT_MICROS: u64 = 50;

/// The busy-poll budget: `SWITCHYARD_BUSY_POLL_US` (0 turns it off), else [`DEFAULT_MICROS`].
pub fn budget() -> Duration {
    static BUDGET: OnceLock<Duration> = OnceLock::new();
    *BUDGET.get_or_init(|| {
        let micros = std::env::var("SWITCHYARD_BUSY_POLL_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(DEFAULT_MICROS);
        Duration::from_micros(micros)
    })
}

/// A plain thread's side: after each empty non-blocking read, whether to try again at once
/// rather than sleep in poll(2).
#[derive(Debug)]
pub struct Spin {
    budget: Duration,
    idle_since: Option<Instant>,
}

impl Spin {
    pub fn new(budget: Duration) -> Self {
        Spin {
            budget,
            idle_since: None,
        }
    }

    /// Work was found: the next idle spell starts a fresh budget.
    pub fn worked(&mut self) {
        self.idle_since = None;
    }

    /// Nothing was found: true while the idle spell is within the budget (try again), false
    /// once it is spent (sleep; the budget restarts after the sleep).
    pub fn keep_polling(&mut self) -> bool {
        if self.budget.is_zero() {
            return false;
        }
        let now = Instant::now();
        match self.idle_since {
            None => {
                self.idle_since = Some(now);
                true
            }
            Some(since) if now.duration_since(since) < self.budget => {
                std::hint::spin_loop();
                true
            }
            Some(_) => {
                self.idle_since = None;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_budget_never_spins() {
        let mut spin = Spin::new(Duration::ZERO);
        assert!(!spin.keep_polling());
        assert!(!spin.keep_polling());
    }

    #[test]
    fn spins_within_the_budget_then_sleeps_and_starts_again() {
        let mut spin = Spin::new(Duration::from_secs(3600));
        assert!(spin.keep_polling());
        assert!(spin.keep_polling());
        let mut spent = Spin::new(Duration::from_nanos(1));
        assert!(spent.keep_polling());
        std::thread::sleep(Duration::from_millis(1));
        assert!(!spent.keep_polling(), "budget spent: sleep");
        assert!(spent.keep_polling(), "a new idle spell after the sleep");
        spent.worked();
        assert!(spent.keep_polling());
    }
}

//! A backend's health: one verdict that three sources of evidence move, kept in an atomic cell
//! that a data-plane core reads on every route selection without a lock.
//!
//! - **Passive**: a core reports each connect through the backend; [`FAILURES_TO_UNHEALTHY`]
//!   consecutive failures take it out, the next success brings it back. So that a backend out
//!   for failing connects is ever tried again when nothing checks it actively, it is offered
//!   one connection every [`PASSIVE_RETRY`] ([`BackendHealth::claim_retry`]).
//! - **Tunnel probe**: a tunnel backend (WireGuard) reports whether its peer answers.
//! - **Active checks**: the control plane's scheduler connects through the backend to a
//!   target every interval; [`CheckStreak`] turns the results into "checks failing" after
//!   `unhealthy_after` failures and "checks passing" after `healthy_after` passes.
//!
//! [`next`] is the whole policy: a backend taken out by its checks comes back only by its
//! checks, so a lucky connect (or a tunnel handshake) cannot flap it in and out between two
//! checks; checks that pass bring back a backend that any source took out; checks that stop
//! (turned off, backend disabled) release their verdict.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Consecutive failed connects that take a backend out (passive detection).
pub const FAILURES_TO_UNHEALTHY: u32 = 3;

/// How long a backend out for failing connects waits before one connection tries it again
/// (as nginx's `fail_timeout`); each failed try restarts the wait.
pub const PASSIVE_RETRY: Duration = Duration::from_secs(10);

/// Milliseconds on a process-wide monotonic clock.
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = EPOCH.get_or_init(Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Whether a backend may be picked, and if not, which evidence took it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Verdict {
    Healthy = 0,
    /// Its last [`FAILURES_TO_UNHEALTHY`] or more connects failed.
    ConnectsFailing = 1,
    /// Its active health checks failed `unhealthy_after` times in a row.
    ChecksFailing = 2,
    /// Its tunnel's peer does not answer.
    TunnelDown = 3,
}

impl Verdict {
    fn from_u8(v: u8) -> Verdict {
        match v {
            1 => Verdict::ConnectsFailing,
            2 => Verdict::ChecksFailing,
            3 => Verdict::TunnelDown,
            _ => Verdict::Healthy,
        }
    }

    /// Why the backend is out, in words (empty when healthy).
    pub fn reason(self) -> &'static str {
        match self {
            Verdict::Healthy => "",
            Verdict::ConnectsFailing => "its last connects failed",
            Verdict::ChecksFailing => "its health checks fail",
            Verdict::TunnelDown => "its tunnel's peer does not answer",
        }
    }
}

/// Evidence about a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// [`FAILURES_TO_UNHEALTHY`] connects in a row failed.
    ConnectsFailed,
    ConnectSucceeded,
    ChecksFailed,
    ChecksPassed,
    /// Active checks of the backend ended (turned off, backend disabled).
    ChecksStopped,
    TunnelDown,
    TunnelUp,
}

/// The verdict after `signal`.
pub fn next(verdict: Verdict, signal: Signal) -> Verdict {
    use Signal as S;
    use Verdict as V;
    match (verdict, signal) {
        (_, S::ChecksFailed) => V::ChecksFailing,
        (_, S::ChecksPassed) => V::Healthy,
        (V::ChecksFailing, S::ChecksStopped) => V::Healthy,
        // Only the checks that took it out bring it back.
        (V::ChecksFailing, _) => V::ChecksFailing,
        (V::Healthy, S::ConnectsFailed) => V::ConnectsFailing,
        (V::Healthy | V::ConnectsFailing, S::TunnelDown) => V::TunnelDown,
        (V::ConnectsFailing | V::TunnelDown, S::ConnectSucceeded | S::TunnelUp) => V::Healthy,
        (v, _) => v,
    }
}

/// The shared, lock-free cell of one backend's health (shared across snapshots by name).
#[derive(Debug, Default)]
pub struct BackendHealth {
    verdict: AtomicU8,
    /// Consecutive failed connects (passive).
    failures: AtomicU32,
    /// While out for failing connects: when (see [`now_ms`]) one connection may try it again.
    retry_at: AtomicU64,
}

impl BackendHealth {
    pub fn is_healthy(&self) -> bool {
        self.verdict() == Verdict::Healthy
    }

    pub fn verdict(&self) -> Verdict {
        Verdict::from_u8(self.verdict.load(Ordering::Acquire))
    }

    /// Applies `signal`; returns the new healthiness when it changed.
    pub fn apply(&self, signal: Signal) -> Option<bool> {
        let mut current = self.verdict.load(Ordering::Acquire);
        loop {
            let new = next(Verdict::from_u8(current), signal);
            if new as u8 == current {
                return None;
            }
            match self.verdict.compare_exchange_weak(
                current,
                new as u8,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    let was = Verdict::from_u8(current) == Verdict::Healthy;
                    let is = new == Verdict::Healthy;
                    return (was != is).then_some(is);
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// A tunnel's probe: whether its peer answers. Returns the new healthiness when it changed.
    pub fn set(&self, healthy: bool) -> Option<bool> {
        if healthy {
            self.failures.store(0, Ordering::Relaxed);
            self.apply(Signal::TunnelUp)
        } else {
            self.apply(Signal::TunnelDown)
        }
    }

    /// Records a connect outcome (passive); returns the new healthiness when it changed.
    pub fn record(&self, success: bool) -> Option<bool> {
        self.record_at(success, now_ms())
    }

    fn record_at(&self, success: bool, now: u64) -> Option<bool> {
        if success {
            // Every core records every successful connect: read first, so the common case (no
            // failures, healthy) writes nothing to this line that all cores share.
            if self.failures.load(Ordering::Relaxed) != 0 {
                self.failures.store(0, Ordering::Relaxed);
            }
            if self.verdict() == Verdict::Healthy {
                return None;
            }
            return self.apply(Signal::ConnectSucceeded);
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        if failures < FAILURES_TO_UNHEALTHY {
            return None;
        }
        let changed = self.apply(Signal::ConnectsFailed);
        if self.verdict() == Verdict::ConnectsFailing {
            self.retry_at
                .store(now.saturating_add(retry_ms()), Ordering::Release);
        }
        changed
    }

    /// For a backend out for failing connects whose retry time has come: claims the one
    /// connection that tries it again (true for exactly one caller per [`PASSIVE_RETRY`]).
    pub fn claim_retry(&self) -> bool {
        self.verdict() == Verdict::ConnectsFailing && self.claim_retry_at(now_ms())
    }

    fn claim_retry_at(&self, now: u64) -> bool {
        if self.verdict() != Verdict::ConnectsFailing {
            return false;
        }
        let at = self.retry_at.load(Ordering::Acquire);
        now >= at
            && self
                .retry_at
                .compare_exchange(
                    at,
                    now.saturating_add(retry_ms()),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }
}

fn retry_ms() -> u64 {
    u64::try_from(PASSIVE_RETRY.as_millis()).unwrap_or(u64::MAX)
}

/// Thresholds of a backend's active checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    pub unhealthy_after: u32,
    pub healthy_after: u32,
}

/// Counts a backend's consecutive check results (control plane, one per checked backend).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckStreak {
    passes: u32,
    failures: u32,
    /// Whether any check has finished yet: the first result decides at once, so a backend
    /// that is down at start is not offered traffic for `unhealthy_after` intervals.
    checked: bool,
    /// The backend's healthiness as of the previous result: when another source took it out
    /// since, the passes that count towards its return start over.
    was_healthy: bool,
}

impl CheckStreak {
    /// Counts one check result; `healthy_now` is the backend's current healthiness. Returns the
    /// signal to apply, if any.
    pub fn record(&mut self, passed: bool, healthy_now: bool, t: Thresholds) -> Option<Signal> {
        if self.checked && self.was_healthy && !healthy_now {
            self.passes = 0;
        }
        let first = !self.checked;
        self.checked = true;
        self.was_healthy = healthy_now;
        if passed {
            self.passes = self.passes.saturating_add(1);
            self.failures = 0;
            (!healthy_now && (first || self.passes >= t.healthy_after))
                .then_some(Signal::ChecksPassed)
        } else {
            self.failures = self.failures.saturating_add(1);
            self.passes = 0;
            (first || self.failures >= t.unhealthy_after).then_some(Signal::ChecksFailed)
        }
    }

    /// Whether a check has finished since the streak began.
    pub fn checked(&self) -> bool {
        self.checked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Thresholds = Thresholds {
        unhealthy_after: 3,
        healthy_after: 2,
    };

    #[test]
    fn passive_health_turns_after_consecutive_failures() {
        let h = BackendHealth::default();
        assert_eq!(h.record(false), None);
        assert_eq!(h.record(false), None);
        assert_eq!(h.record(false), Some(false));
        assert_eq!(h.record(false), None);
        assert!(!h.is_healthy());
        assert_eq!(h.verdict(), Verdict::ConnectsFailing);
        assert_eq!(h.record(true), Some(true));
        assert_eq!(h.record(true), None);
    }

    #[test]
    fn a_backend_out_for_failing_connects_is_retried_once_per_period() {
        let h = BackendHealth::default();
        let period = retry_ms();
        assert!(!h.claim_retry_at(0), "healthy: nothing to retry");
        for _ in 0..3 {
            h.record_at(false, 1000);
        }
        assert!(!h.claim_retry_at(1000 + period - 1), "too early");
        assert!(h.claim_retry_at(1000 + period));
        assert!(!h.claim_retry_at(1000 + period), "one try per period");
        // The try fails: the wait starts over from then.
        assert_eq!(h.record_at(false, 1000 + period + 5), None);
        assert!(!h.claim_retry_at(1000 + 2 * period));
        assert!(h.claim_retry_at(1000 + 2 * period + 5));
        assert_eq!(h.record_at(true, 1000 + 2 * period + 6), Some(true));
        assert!(!h.claim_retry_at(u64::MAX), "healthy again");
        // Out by checks or by the tunnel: those sources decide, no passive retries.
        h.apply(Signal::ChecksFailed);
        assert!(!h.claim_retry_at(u64::MAX));
        h.apply(Signal::ChecksStopped);
        h.set(false);
        assert!(!h.claim_retry_at(u64::MAX));
    }

    #[test]
    fn a_backend_never_checked_is_healthy_and_its_first_check_decides() {
        let h = BackendHealth::default();
        assert!(h.is_healthy());
        let mut s = CheckStreak::default();
        assert!(!s.checked());
        assert_eq!(
            s.record(false, h.is_healthy(), T),
            Some(Signal::ChecksFailed)
        );
        assert_eq!(h.apply(Signal::ChecksFailed), Some(false));
        assert!(s.checked());

        let mut s = CheckStreak::default();
        assert_eq!(s.record(true, true, T), None, "healthy stays, no signal");
    }

    #[test]
    fn checks_need_their_thresholds_to_turn() {
        let h = BackendHealth::default();
        let mut s = CheckStreak::default();
        let mut step = |passed: bool| {
            s.record(passed, h.is_healthy(), T)
                .and_then(|sig| h.apply(sig))
        };
        assert_eq!(step(true), None);
        assert_eq!(step(false), None);
        assert_eq!(step(false), None);
        assert_eq!(step(true), None, "a pass resets the failure count");
        assert_eq!(step(false), None);
        assert_eq!(step(false), None);
        assert_eq!(step(false), Some(false), "third failure in a row");
        assert_eq!(step(false), None);
        assert_eq!(step(true), None, "one pass is not enough");
        assert_eq!(step(false), None, "a failure restarts the count of passes");
        assert_eq!(step(true), None);
        assert_eq!(step(true), Some(true), "second pass in a row");
    }

    #[test]
    fn a_backend_out_by_checks_does_not_flap_on_connects_or_tunnel_probes() {
        let h = BackendHealth::default();
        assert_eq!(h.apply(Signal::ChecksFailed), Some(false));
        assert_eq!(h.record(true), None);
        assert_eq!(h.set(true), None);
        assert_eq!(h.set(false), None);
        assert_eq!(h.verdict(), Verdict::ChecksFailing);
        assert_eq!(h.apply(Signal::ChecksPassed), Some(true));
    }

    #[test]
    fn passing_checks_bring_back_a_backend_taken_out_by_connects_after_a_fresh_streak() {
        let h = BackendHealth::default();
        let mut s = CheckStreak::default();
        assert_eq!(s.record(true, h.is_healthy(), T), None);
        assert_eq!(s.record(true, h.is_healthy(), T), None);
        for _ in 0..3 {
            h.record(false);
        }
        assert_eq!(h.verdict(), Verdict::ConnectsFailing);
        // The two passes before it went out do not count.
        assert_eq!(s.record(true, h.is_healthy(), T), None);
        let sig = s.record(true, h.is_healthy(), T);
        assert_eq!(sig, Some(Signal::ChecksPassed));
        assert_eq!(h.apply(Signal::ChecksPassed), Some(true));
    }

    #[test]
    fn stopped_checks_release_their_verdict_only() {
        let h = BackendHealth::default();
        h.apply(Signal::ChecksFailed);
        assert_eq!(h.apply(Signal::ChecksStopped), Some(true));
        h.set(false);
        assert_eq!(h.apply(Signal::ChecksStopped), None);
        assert_eq!(h.verdict(), Verdict::TunnelDown);
    }

    #[test]
    fn tunnel_probe_and_connects() {
        let h = BackendHealth::default();
        assert_eq!(h.set(false), Some(false));
        assert_eq!(h.set(false), None);
        assert_eq!(h.set(true), Some(true));
        for _ in 0..3 {
            h.record(false);
        }
        assert_eq!(
            h.set(false),
            None,
            "already out; the tunnel reason replaces it"
        );
        assert_eq!(h.verdict(), Verdict::TunnelDown);
        assert_eq!(h.record(true), Some(true));
    }

    #[test]
    fn every_state_has_an_answer_to_every_signal() {
        use Signal as S;
        use Verdict as V;
        let verdicts = [
            V::Healthy,
            V::ConnectsFailing,
            V::ChecksFailing,
            V::TunnelDown,
        ];
        let signals = [
            S::ConnectsFailed,
            S::ConnectSucceeded,
            S::ChecksFailed,
            S::ChecksPassed,
            S::ChecksStopped,
            S::TunnelDown,
            S::TunnelUp,
        ];
        for v in verdicts {
            assert_eq!(next(v, S::ChecksPassed), V::Healthy);
            assert_eq!(next(v, S::ChecksFailed), V::ChecksFailing);
            for s in signals {
                assert_eq!(Verdict::from_u8(next(v, s) as u8), next(v, s));
            }
        }
    }
}

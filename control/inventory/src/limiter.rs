//! Bruteforce limits, runtime-free: a sliding window of attempt times per key
//! (`ip:ADDR`, `account:EMAIL`, `register:ADDR`). The caller passes the clock in.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Attempts per key within a window.
#[derive(Debug, Default)]
pub struct Limiter {
    hits: HashMap<String, VecDeque<Instant>>,
}

/// Keys kept at most; past it, stale keys are swept (bounds memory under a spray of IPs).
const SWEEP_AT: usize = 10_000;

impl Limiter {
    /// `Err(retry_after)` when `key` already has `limit` attempts within `window` before `now`.
    pub fn check(
        &mut self,
        key: &str,
        limit: u32,
        window: Duration,
        now: Instant,
    ) -> Result<(), Duration> {
        let Some(q) = self.hits.get_mut(key) else {
            return Ok(());
        };
        while q
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= window)
        {
            q.pop_front();
        }
        if q.len() >= limit as usize {
            let oldest = q.front().copied().unwrap_or(now);
            return Err(window.saturating_sub(now.saturating_duration_since(oldest)));
        }
        Ok(())
    }

    /// Count one attempt of `key` at `now`.
    pub fn record(&mut self, key: &str, window: Duration, now: Instant) {
        if self.hits.len() >= SWEEP_AT {
            self.hits.retain(|_, q| {
                q.back()
                    .is_some_and(|t| now.saturating_duration_since(*t) < window)
            });
        }
        self.hits.entry(key.to_string()).or_default().push_back(now);
    }

    /// Forget `key` (a successful sign-in clears the account's failures).
    pub fn clear(&mut self, key: &str) {
        self.hits.remove(key);
    }
}

/// Seconds for a `Retry-After` header (rounded up, at least 1).
pub fn retry_after_secs(d: Duration) -> u64 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    s.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_slides() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        let w = Duration::from_secs(60);
        for i in 0..3 {
            assert!(l.check("k", 3, w, t0 + Duration::from_secs(i)).is_ok());
            l.record("k", w, t0 + Duration::from_secs(i));
        }
        let r = l.check("k", 3, w, t0 + Duration::from_secs(10));
        assert_eq!(r, Err(Duration::from_secs(50)));
        assert!(l.check("other", 3, w, t0).is_ok());
        assert!(l.check("k", 3, w, t0 + Duration::from_secs(60)).is_ok());
        l.clear("k");
        assert!(l.check("k", 1, w, t0).is_ok());
        assert_eq!(retry_after_secs(Duration::from_millis(1500)), 2);
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
    }
}

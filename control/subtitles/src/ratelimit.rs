//! Optional fixed-window request limits per client IP and per provider key (runtime-free; the
//! caller passes the time). Keys are kept only as SHA-256 digests, in memory.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sha2::{Digest as _, Sha256};

/// Counts requests per key within fixed windows; `limit` 0 is off.
#[derive(Debug)]
pub struct WindowLimiter {
    limit: u32,
    window: Duration,
    counts: HashMap<[u8; 32], (Instant, u32)>,
}

impl WindowLimiter {
    pub fn new(limit: u32, window: Duration) -> Self {
        WindowLimiter {
            limit,
            window,
            counts: HashMap::new(),
        }
    }

    /// Counts one request for `key`; `Err(seconds until the window ends)` when over the limit.
    pub fn check(&mut self, key: &str, now: Instant) -> Result<(), u64> {
        if self.limit == 0 {
            return Ok(());
        }
        if self.counts.len() > 10_000 {
            let window = self.window;
            self.counts
                .retain(|_, (start, _)| now.saturating_duration_since(*start) < window);
        }
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let entry = self.counts.entry(digest).or_insert((now, 0));
        if now.saturating_duration_since(entry.0) >= self.window {
            *entry = (now, 0);
        }
        if entry.1 >= self.limit {
            let left = self
                .window
                .saturating_sub(now.saturating_duration_since(entry.0));
            return Err(left.as_secs().max(1));
        }
        entry.1 += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_key_and_window() {
        let t0 = Instant::now();
        let mut l = WindowLimiter::new(2, Duration::from_secs(60));
        assert_eq!(l.check("a", t0), Ok(()));
        assert_eq!(l.check("a", t0), Ok(()));
        assert_eq!(l.check("a", t0 + Duration::from_secs(10)), Err(50));
        assert_eq!(l.check("b", t0), Ok(()), "other keys are separate");
        assert_eq!(
            l.check("a", t0 + Duration::from_secs(60)),
            Ok(()),
            "new window"
        );
        let mut off = WindowLimiter::new(0, Duration::from_secs(1));
        for _ in 0..100 {
            assert_eq!(off.check("a", t0), Ok(()));
        }
    }
}

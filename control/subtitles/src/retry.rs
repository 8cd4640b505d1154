//! Retry policy for provider calls (runtime-free): which failures are worth another try and how
//! long to wait — exponential backoff with "equal jitter", or the provider's `Retry-After`,
//! never longer than the configured maximum.

use std::time::Duration;

/// How a provider call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// An HTTP status, with the `Retry-After` delay when the provider sent one.
    Status {
        status: u16,
        retry_after: Option<Duration>,
    },
    /// No connection, reset, or timed out.
    Transport,
    /// The fetch guard refused the address (a caller's `api_url` or a redirect from it).
    Refused,
}

impl Failure {
    /// 408, 429 and 5xx (except 501) are transient; so are transport failures.
    pub fn is_retryable(&self) -> bool {
        match self {
            Failure::Status { status, .. } => {
                matches!(*status, 408 | 429) || (*status >= 500 && *status != 501)
            }
            Failure::Transport => true,
            Failure::Refused => false,
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries in all, the first included.
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl RetryPolicy {
    /// After try number `attempt` (1-based) failed with `failure`: the delay before the next
    /// try, or `None` to give up. `jitter` in `[0, 1]` spreads concurrent clients (the caller
    /// passes a random number; tests pass fixed ones).
    pub fn next_delay(&self, attempt: u32, failure: &Failure, jitter: f64) -> Option<Duration> {
        if attempt >= self.max_attempts || !failure.is_retryable() {
            return None;
        }
        if let Failure::Status {
            retry_after: Some(d),
            ..
        } = failure
        {
            return Some((*d).min(self.max_delay));
        }
        let exp = self
            .base_delay
            .saturating_mul(1u32 << (attempt - 1).min(20))
            .min(self.max_delay);
        let jitter = jitter.clamp(0.0, 1.0);
        Some(exp.mul_f64(0.5 + jitter / 2.0))
    }
}

/// `Retry-After` in delay-seconds form; HTTP dates are not used by the providers we talk to
/// and give `None` (the backoff applies).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let secs: u64 = value.trim().parse().ok()?;
    Some(Duration::from_secs(secs))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const POLICY: RetryPolicy = RetryPolicy {
        max_attempts: 4,
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_millis(1000),
    };

    fn status(s: u16) -> Failure {
        Failure::Status {
            status: s,
            retry_after: None,
        }
    }

    #[test]
    fn what_is_retried() {
        for s in [408, 429, 500, 502, 503, 504, 529] {
            assert!(status(s).is_retryable(), "{s}");
        }
        for s in [400, 401, 403, 404, 413, 422, 501] {
            assert!(!status(s).is_retryable(), "{s}");
        }
        assert!(Failure::Transport.is_retryable());
        assert!(!Failure::Refused.is_retryable());
        assert_eq!(POLICY.next_delay(1, &status(401), 0.0), None);
    }

    #[test]
    fn exponential_with_jitter_capped_and_bounded() {
        assert_eq!(
            POLICY.next_delay(1, &status(503), 0.0),
            Some(Duration::from_millis(50))
        );
        assert_eq!(
            POLICY.next_delay(1, &status(503), 1.0),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            POLICY.next_delay(2, &status(429), 1.0),
            Some(Duration::from_millis(200))
        );
        assert_eq!(
            POLICY.next_delay(3, &Failure::Transport, 1.0),
            Some(Duration::from_millis(400))
        );
        assert_eq!(
            POLICY.next_delay(4, &status(503), 1.0),
            None,
            "attempts used up"
        );
        let long = RetryPolicy {
            max_attempts: 100,
            ..POLICY
        };
        assert_eq!(
            long.next_delay(60, &status(503), 1.0),
            Some(Duration::from_millis(1000))
        );
    }

    #[test]
    fn retry_after_wins_but_is_capped() {
        let f = Failure::Status {
            status: 429,
            retry_after: parse_retry_after(" 0 "),
        };
        assert_eq!(POLICY.next_delay(1, &f, 0.7), Some(Duration::ZERO));
        let f = Failure::Status {
            status: 429,
            retry_after: parse_retry_after("3600"),
        };
        assert_eq!(
            POLICY.next_delay(1, &f, 0.7),
            Some(Duration::from_millis(1000))
        );
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }
}

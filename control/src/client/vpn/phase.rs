//! The VPN state machine (`GET /api/v1/vpn/status` → `status`). Runtime-free.
//!
//! ```text
//!            enable                 everything up
//! disabled ─────────▶ connecting ─────────────────▶ connected
//!    ▲  ▲                 │ a step failed               │ the TUN path stopped
//!    │  │                 ▼                             ▼
//!    │  └── disable ─── error ◀───────────────────────────
//!    └───── disable (from connecting or connected)
//!                       error ── enable ──▶ connecting (a retry)
//! ```
//!
//! `enable` creates the TUN device, starts the split tunnel (policy routing and the eBPF or
//! nftables classifier), the DNS interception when configured, and the TUN pump; a failing step
//! undoes every earlier one, so `error` leaves nothing on the host but the reason. `disable` (from
//! any state) stops the pump, removes the split tunnel's rules, routes, nft table, bpf links and
//! pins, and closes the TUN device (which the kernel then deletes): the host is as before
//! `enable`. The split rules themselves are configuration and stay saved.

use chrono::{DateTime, Utc};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    Disabled,
    Connecting,
    Connected { since: DateTime<Utc> },
    Error { reason: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Enable,
    /// Every part is up.
    Up,
    Failed(String),
    Disable,
}

/// A step that makes no sense in the current phase.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the VPN is {from}: cannot {step}")]
pub struct Refused {
    pub from: &'static str,
    pub step: &'static str,
}

impl Phase {
    /// The API's `status` value.
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Disabled => "disabled",
            Phase::Connecting => "connecting",
            Phase::Connected { .. } => "connected",
            Phase::Error { .. } => "error",
        }
    }

    /// Whether the VPN is wanted on (enabled), whatever its progress.
    pub fn enabled(&self) -> bool {
        matches!(self, Phase::Connecting | Phase::Connected { .. })
    }

    pub fn since(&self) -> Option<DateTime<Utc>> {
        match self {
            Phase::Connected { since } => Some(*since),
            _ => None,
        }
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            Phase::Error { reason } => Some(reason),
            _ => None,
        }
    }

    /// The phase after `step` at `now`.
    pub fn next(&self, step: Step, now: DateTime<Utc>) -> Result<Phase, Refused> {
        let refuse = |step: &'static str| Refused {
            from: self.as_str(),
            step,
        };
        match (self, step) {
            (Phase::Disabled | Phase::Error { .. }, Step::Enable) => Ok(Phase::Connecting),
            (_, Step::Enable) => Err(refuse("enable")),
            (Phase::Connecting, Step::Up) => Ok(Phase::Connected { since: now }),
            (_, Step::Up) => Err(refuse("come up")),
            (Phase::Connecting | Phase::Connected { .. }, Step::Failed(reason)) => {
                Ok(Phase::Error { reason })
            }
            (_, Step::Failed(_)) => Err(refuse("fail")),
            (_, Step::Disable) => Ok(Phase::Disabled),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(s, 0).expect("time")
    }

    #[test]
    fn enable_connects_and_disable_returns_to_disabled() {
        let p = Phase::Disabled.next(Step::Enable, t(1)).expect("enable");
        assert_eq!(p, Phase::Connecting);
        assert!(p.enabled());
        let p = p.next(Step::Up, t(2)).expect("up");
        assert_eq!(p.as_str(), "connected");
        assert_eq!(p.since(), Some(t(2)));
        let p = p.next(Step::Disable, t(3)).expect("disable");
        assert_eq!(p, Phase::Disabled);
        assert!(!p.enabled());
        assert_eq!(p.since(), None);
    }

    #[test]
    fn a_failure_is_an_error_with_its_reason_and_enable_retries() {
        let p = Phase::Connecting
            .next(Step::Failed("no /dev/net/tun".into()), t(1))
            .expect("fail");
        assert_eq!(p.as_str(), "error");
        assert_eq!(p.reason(), Some("no /dev/net/tun"));
        assert!(!p.enabled());
        assert_eq!(p.next(Step::Enable, t(2)), Ok(Phase::Connecting));
        let lost = Phase::Connected { since: t(0) }
            .next(Step::Failed("pump stopped".into()), t(3))
            .expect("lost");
        assert_eq!(lost.reason(), Some("pump stopped"));
        assert_eq!(lost.next(Step::Disable, t(4)), Ok(Phase::Disabled));
    }

    #[test]
    fn steps_out_of_order_are_refused() {
        let connected = Phase::Connected { since: t(0) };
        for p in [Phase::Connecting, connected.clone()] {
            assert!(p.next(Step::Enable, t(1)).is_err(), "{p:?}");
        }
        for p in [
            Phase::Disabled,
            connected,
            Phase::Error { reason: "x".into() },
        ] {
            assert!(p.next(Step::Up, t(1)).is_err(), "{p:?}");
        }
        assert!(Phase::Disabled
            .next(Step::Failed("x".into()), t(1))
            .is_err());
        assert_eq!(
            Phase::Disabled.next(Step::Disable, t(1)),
            Ok(Phase::Disabled)
        );
    }
}

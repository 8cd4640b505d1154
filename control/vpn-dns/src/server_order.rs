//! The order in which upstream servers are tried: as configured, except that a server which
//! failed lately goes to the back for a while, so one dead first server does not cost every
//! query a full timeout. A server is never skipped: with all of them failing, all are tried.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// How long a failed server stays at the back of the order.
pub const PENALTY: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
pub struct ServerHealth {
    failed_at: HashMap<SocketAddr, Instant>,
}

impl ServerHealth {
    /// `servers` in configured order, those that failed within [`PENALTY`] of `now` moved to the
    /// back (in configured order among themselves).
    pub fn order(&self, servers: &[SocketAddr], now: Instant) -> Vec<SocketAddr> {
        let penalised = |s: &SocketAddr| {
            self.failed_at
                .get(s)
                .is_some_and(|&t| now.saturating_duration_since(t) < PENALTY)
        };
        let (mut healthy, back): (Vec<_>, Vec<_>) = servers.iter().partition(|s| !penalised(s));
        healthy.extend(back);
        healthy
    }

    pub fn failed(&mut self, server: SocketAddr, now: Instant) {
        self.failed_at.insert(server, now);
    }

    pub fn succeeded(&mut self, server: SocketAddr) {
        self.failed_at.remove(&server);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn failed_servers_go_to_the_back_for_a_while() {
        let s: Vec<SocketAddr> = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let t0 = Instant::now();
        let mut h = ServerHealth::default();
        assert_eq!(h.order(&s, t0), s);
        h.failed(s[0], t0);
        h.failed(s[1], t0);
        assert_eq!(h.order(&s, t0 + Duration::from_secs(1)), [s[2], s[0], s[1]]);
        assert_eq!(h.order(&s, t0 + PENALTY), s, "penalty over");
        h.succeeded(s[0]);
        assert_eq!(h.order(&s, t0 + Duration::from_secs(1)), [s[0], s[2], s[1]]);
    }
}

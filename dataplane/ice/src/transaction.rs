//! STUN request retransmission over UDP (RFC 8489 §6.2.1): the request is sent again after RTO,
//! 2·RTO, 4·RTO … up to Rc = 7 sends, then the client waits Rm = 16 RTO for an answer. The whole
//! transaction is also capped by a configured timeout (`mesh.stun.timeout`).

use std::time::{Duration, Instant};

/// Initial retransmission timeout recommended by RFC 8489 for unknown paths.
pub const INITIAL_RTO: Duration = Duration::from_millis(500);
const MAX_SENDS: u32 = 7;
const LAST_WAIT_FACTOR: u32 = 16;

#[derive(Debug, Clone)]
pub struct Retransmit {
    sends: u32,
    rto: Duration,
    next: Instant,
    deadline: Instant,
}

/// What the timer says at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimerAction {
    Wait,
    Resend,
    TimedOut,
}

impl Retransmit {
    /// A transaction whose first send happens now.
    pub fn start(now: Instant, initial_rto: Duration, cap: Duration) -> Retransmit {
        // Sends at 0, 1, 3, 7 … 63 RTO, then a last wait of Rm RTO: 39.5 s with RTO 500 ms.
        let full = initial_rto * ((1 << (MAX_SENDS - 1)) - 1) + initial_rto * LAST_WAIT_FACTOR;
        Retransmit {
            sends: 1,
            rto: initial_rto,
            next: now + initial_rto,
            deadline: now + full.min(cap),
        }
    }

    /// The instant this transaction next needs attention.
    pub fn next_timeout(&self) -> Instant {
        if self.sends >= MAX_SENDS {
            self.deadline
        } else {
            self.next.min(self.deadline)
        }
    }

    pub fn poll(&mut self, now: Instant) -> TimerAction {
        if now >= self.deadline {
            return TimerAction::TimedOut;
        }
        if self.sends < MAX_SENDS && now >= self.next {
            self.sends += 1;
            self.rto *= 2;
            self.next = now + self.rto;
            return TimerAction::Resend;
        }
        TimerAction::Wait
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn doubles_then_times_out_at_rfc_total() {
        let t0 = Instant::now();
        let mut r = Retransmit::start(t0, INITIAL_RTO, Duration::from_secs(3600));
        let mut resends = Vec::new();
        let mut t;
        loop {
            t = r.next_timeout();
            match r.poll(t) {
                TimerAction::Resend => resends.push(t - t0),
                TimerAction::TimedOut => break,
                TimerAction::Wait => panic!("woken for nothing"),
            }
        }
        let ms: Vec<u128> = resends.iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, [500, 1500, 3500, 7500, 15500, 31500]);
        assert_eq!((t - t0).as_millis(), 39500);
    }

    #[test]
    fn cap_cuts_the_transaction_short() {
        let t0 = Instant::now();
        let mut r = Retransmit::start(t0, INITIAL_RTO, Duration::from_secs(2));
        assert_eq!(r.poll(t0 + Duration::from_millis(100)), TimerAction::Wait);
        assert_eq!(r.poll(t0 + Duration::from_millis(500)), TimerAction::Resend);
        assert_eq!(
            r.poll(t0 + Duration::from_millis(1500)),
            TimerAction::Resend
        );
        assert_eq!(r.next_timeout(), t0 + Duration::from_secs(2));
        assert_eq!(r.poll(t0 + Duration::from_secs(2)), TimerAction::TimedOut);
    }
}

//! Echo requests (ping) through the VPN, answered on the cores.
//!
//! The tunnel carries TCP and UDP, so the client answers an echo request for the destination:
//! it probes the destination over the route the client's rules choose for it and answers as
//! the probe says. The probe is a TCP connect to port [`PROBE_PORT`] with the route's own
//! [`crate::connector::Dialer`] — through the server (CONNECT or SOCKS5) or direct — within
//! [`PROBE_TIMEOUT`]. A host that accepts the connection or refuses it is up: echo reply, sent
//! when the probe ends (the RTT `ping` shows is the probe's). A backend that says the host or
//! its network cannot be reached (SOCKS5 replies 3 and 4, `Proxy-Status:
//! destination_ip_unroutable`, `EHOSTUNREACH`/`ENETUNREACH` direct): "host unreachable" from the
//! TUN's gateway. No route, or a route that carries nothing there: "administratively
//! prohibited". No verdict within the bound (a timeout, a failure of the server itself, an HTTP
//! proxy that does not say why CONNECT failed): no answer, which `ping` counts as a lost packet.
//! Port 443 because a host that answers pings on the internet most often serves HTTPS or, when
//! it does not, answers its closed port with a reset; a host that silently drops port 443 shows
//! as losses. A `direct` route is probed the same way from the client's own socket (its cgroup
//! bypasses the tunnel) rather than with an unprivileged ICMP socket: those need
//! `net.ipv4.ping_group_range` to include the client's group, which a fresh network namespace
//! (default "1 0") and many systems do not, and one probe for every route keeps one behaviour.
//!
//! Hand-off: the pump writes each request into the TUN as the payload of a UDP datagram from a
//! carrier port of the gateway to the VPN UDP socket ([`super::icmp::carry`]); the kernel
//! delivers it to a core like any UDP flow, and the core sends its answer (the whole IP packet)
//! back to the carrier port, which the pump unwraps into the TUN. Chosen over a queue between
//! the pump and the cores because the kernel already wakes both sides (glommio cannot poll a
//! generic descriptor, the pump sleeps in `poll(2)` on the device), it needs no state in the
//! pump, and the carrier port is a function of the destination, so `SO_REUSEPORT` brings all
//! requests to one destination to one core, which coalesces them without sharing anything.
//!
//! Bounded per core: [`MAX_PROBES_PER_CORE`] probes in flight, one per destination (requests to
//! a destination being probed wait for its verdict, at most [`MAX_WAITING`] of them), and at
//! most [`PROBES_PER_SECOND`] new probes a second; what does not fit is counted
//! (`echo_limited`) and not answered. A ping flood so opens at most one connection at a time
//! per destination.

use super::icmp::{self, Refusal};
use crate::engine::CoreContext;
use crate::error::DataplaneError;
use crate::snapshot::BackendKind;
use glommio::net::UdpSocket;
use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// The port the probe connects to.
pub const PROBE_PORT: u16 = 443;
/// How long a probe may take (at most the route's connect timeout).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// Probes one core runs at once.
pub const MAX_PROBES_PER_CORE: usize = 64;
/// Requests that wait for one destination's probe.
pub const MAX_WAITING: usize = 16;
/// New probes one core starts per second.
pub const PROBES_PER_SECOND: u32 = 50;

/// What a probe says about its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Reachable,
    Unreachable,
    /// The rules refuse the destination.
    Prohibited,
    /// No verdict: no answer.
    Unknown,
}

/// The verdict of a probe's connect through a backend of `kind`.
pub(crate) fn judge(kind: &BackendKind, result: &Result<(), DataplaneError>) -> Verdict {
    // a socket of the client's own reached the destination itself: its errors are the host's
    let own_socket = matches!(kind, BackendKind::Direct | BackendKind::Openvpn(_));
    match result {
        Ok(()) | Err(DataplaneError::OriginRefused { .. }) => Verdict::Reachable,
        Err(DataplaneError::Unreachable { .. }) => Verdict::Unreachable,
        Err(
            DataplaneError::NoRoute(_)
            | DataplaneError::BackendUnavailable(_)
            | DataplaneError::Blocked(_),
        ) => Verdict::Prohibited,
        Err(DataplaneError::Refused { .. }) if own_socket => Verdict::Reachable,
        Err(DataplaneError::Connect { source, .. })
            if own_socket && crate::error::is_unreachable(source) =>
        {
            Verdict::Unreachable
        }
        Err(_) => Verdict::Unknown,
    }
}

/// What a request asking for a probe gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// Start a probe of the destination; the request waits for it.
    Start,
    /// The destination is being probed; the request waits for that probe.
    Joined,
    /// Over a bound: not answered.
    Limited,
}

/// A core's probes in flight and the requests waiting for each. Runtime-free.
pub(crate) struct Probes<W> {
    waiting: HashMap<IpAddr, Vec<W>>,
    /// The second (since `epoch`) of the last start, and the starts in it.
    second: u64,
    started: u32,
    epoch: Instant,
}

impl<W> Probes<W> {
    pub fn new(epoch: Instant) -> Self {
        Probes {
            waiting: HashMap::new(),
            second: 0,
            started: 0,
            epoch,
        }
    }

    /// Adds `waiter` for the verdict on `dst` at `now`.
    pub fn join(&mut self, dst: IpAddr, waiter: W, now: Instant) -> Join {
        if let Some(waiters) = self.waiting.get_mut(&dst) {
            if waiters.len() >= MAX_WAITING {
                return Join::Limited;
            }
            waiters.push(waiter);
            return Join::Joined;
        }
        if self.waiting.len() >= MAX_PROBES_PER_CORE {
            return Join::Limited;
        }
        let second = now.saturating_duration_since(self.epoch).as_secs();
        if second != self.second {
            self.second = second;
            self.started = 0;
        }
        if self.started >= PROBES_PER_SECOND {
            return Join::Limited;
        }
        self.started += 1;
        self.waiting.insert(dst, vec![waiter]);
        Join::Start
    }

    /// Ends the probe of `dst`: the requests that waited for it.
    pub fn finish(&mut self, dst: IpAddr) -> Vec<W> {
        self.waiting.remove(&dst).unwrap_or_default()
    }
}

/// A request waiting for its answer: the carrier address to answer, and the request.
type Waiter = (SocketAddr, Vec<u8>);
pub(crate) type CoreProbes = Rc<RefCell<Probes<Waiter>>>;

pub(crate) fn core_probes() -> CoreProbes {
    Rc::new(RefCell::new(Probes::new(Instant::now())))
}

/// A carried echo request from `carrier` arrived on the VPN UDP socket: answers it once its
/// destination's probe ends (starting the probe when none runs).
pub(crate) fn handle(
    ctx: &Rc<CoreContext>,
    socket: &Rc<UdpSocket>,
    probes: &CoreProbes,
    carrier: SocketAddr,
    request: &[u8],
) {
    let Some(vpn) = ctx.vpn.as_ref() else {
        return;
    };
    let Some(dst) = icmp::parse_echo(request).map(|e| e.dst) else {
        vpn.stats.echo_dropped.fetch_add(1, Relaxed);
        return;
    };
    let joined = probes
        .borrow_mut()
        .join(dst, (carrier, request.to_vec()), Instant::now());
    match joined {
        Join::Joined => {}
        Join::Limited => {
            vpn.stats.echo_limited.fetch_add(1, Relaxed);
            tracing::debug!(%dst, "echo request over the probe bounds: not answered");
        }
        Join::Start => {
            let (ctx, socket, probes) = (ctx.clone(), socket.clone(), probes.clone());
            glommio::spawn_local(async move {
                let verdict = probe(&ctx, dst).await;
                let waiters = probes.borrow_mut().finish(dst);
                answer(&ctx, &socket, dst, verdict, waiters).await;
            })
            .detach();
        }
    }
}

/// Probes `dst` over the route the client's rules choose for it.
async fn probe(ctx: &CoreContext, dst: IpAddr) -> Verdict {
    let Some(vpn) = ctx.vpn.as_ref() else {
        return Verdict::Unknown;
    };
    // routed like the destination's flows: by the name the application resolved, if known
    let ip = dst.to_string();
    let host = vpn
        .names
        .load()
        .get(&dst)
        .cloned()
        .unwrap_or_else(|| ip.clone());
    let snapshot = ctx.snapshot.load_full();
    let Some((_, backend)) = snapshot.select(&host) else {
        return Verdict::Prohibited;
    };
    let backend = backend.clone();
    let timeout = PROBE_TIMEOUT.min(snapshot.timeouts.connect);
    // the connect is dropped at once: a probe carries nothing
    let result = crate::proxied::probe(ctx, &backend, &ip, PROBE_PORT, timeout)
        .await
        .map(drop);
    let verdict = judge(&backend.kind, &result);
    tracing::debug!(%host, backend = %backend.name, ?verdict, outcome = ?result.err(), "echo probe");
    verdict
}

/// Sends each waiting request its answer for `verdict` (counted by the pump as it writes it
/// into the TUN); counts the requests that get none.
async fn answer(
    ctx: &CoreContext,
    socket: &UdpSocket,
    dst: IpAddr,
    verdict: Verdict,
    waiters: Vec<Waiter>,
) {
    let Some(vpn) = ctx.vpn.as_ref() else {
        return;
    };
    let gateway = match dst {
        IpAddr::V4(_) => Some(IpAddr::V4(vpn.gateway)),
        IpAddr::V6(_) => vpn.v6.map(|a| IpAddr::V6(a.gateway)),
    };
    let refused = |request: &[u8], why| gateway.and_then(|g| icmp::error_reply(request, g, why));
    for (carrier, request) in waiters {
        let reply = match verdict {
            Verdict::Reachable => icmp::echo_reply(&request),
            Verdict::Unreachable => refused(&request, Refusal::HostUnreachable),
            Verdict::Prohibited => refused(&request, Refusal::Prohibited),
            Verdict::Unknown => None,
        };
        let sent = match reply {
            Some(reply) => socket.send_to(&reply, carrier).await.is_ok(),
            None => false,
        };
        if !sent {
            vpn.stats.echo_dropped.fetch_add(1, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn requests_to_one_destination_share_its_probe_within_the_bounds() {
        let t0 = Instant::now();
        let mut p = Probes::new(t0);
        assert_eq!(p.join(ip("192.0.2.1"), 1, t0), Join::Start);
        for n in 2..=MAX_WAITING {
            assert_eq!(p.join(ip("192.0.2.1"), n, t0), Join::Joined);
        }
        assert_eq!(p.join(ip("192.0.2.1"), 99, t0), Join::Limited);
        assert_eq!(
            p.finish(ip("192.0.2.1")),
            (1..=MAX_WAITING).collect::<Vec<_>>()
        );
        assert!(p.finish(ip("192.0.2.1")).is_empty());
        // the next request starts a new probe
        assert_eq!(p.join(ip("192.0.2.1"), 1, t0), Join::Start);
    }

    #[test]
    fn probes_in_flight_and_starts_per_second_are_bounded() {
        let t0 = Instant::now();
        let dst = |i: usize| IpAddr::from([10, 0, (i >> 8) as u8, i as u8]);
        let second = |n: usize| t0 + Duration::from_secs(n as u64);
        // at most PROBES_PER_SECOND start in a second, however fast they end
        let mut p = Probes::new(t0);
        for i in 0..PROBES_PER_SECOND as usize {
            assert_eq!(p.join(dst(i), i, t0), Join::Start, "{i}");
            p.finish(dst(i));
        }
        assert_eq!(p.join(dst(9999), 0, t0), Join::Limited, "rate");
        assert_eq!(p.join(dst(9999), 0, second(1)), Join::Start);
        // at most MAX_PROBES_PER_CORE run at once, however slowly they start
        let mut p = Probes::new(t0);
        for i in 0..MAX_PROBES_PER_CORE {
            assert_eq!(p.join(dst(i), i, second(i)), Join::Start, "{i}");
        }
        let later = second(MAX_PROBES_PER_CORE);
        assert_eq!(p.join(dst(9999), 0, later), Join::Limited, "in flight");
        // one ending makes room, and a destination being probed still takes waiters
        assert_eq!(p.join(dst(3), 0, later), Join::Joined);
        assert_eq!(p.finish(dst(0)), vec![0]);
        assert_eq!(p.join(dst(9999), 0, later), Join::Start);
    }

    #[test]
    fn a_refusing_host_is_up_and_only_the_backend_that_saw_it_says_unreachable() {
        let socks = BackendKind::Socks5 {
            host: "192.0.2.9".into(),
            port: 1080,
            credentials: None,
        };
        let refused = || Err(DataplaneError::Refused { target: "x".into() });
        let unreachable = |errno| {
            Err(DataplaneError::Connect {
                target: "x".into(),
                source: io::Error::from_raw_os_error(errno),
            })
        };
        for kind in [&BackendKind::Direct, &socks] {
            assert_eq!(judge(kind, &Ok(())), Verdict::Reachable);
            assert_eq!(
                judge(
                    kind,
                    &Err(DataplaneError::OriginRefused {
                        proxy: "p".into(),
                        target: "x".into()
                    })
                ),
                Verdict::Reachable
            );
            assert_eq!(
                judge(
                    kind,
                    &Err(DataplaneError::Unreachable {
                        proxy: "p".into(),
                        target: "x".into()
                    })
                ),
                Verdict::Unreachable
            );
            assert_eq!(
                judge(kind, &Err(DataplaneError::NoRoute("x".into()))),
                Verdict::Prohibited
            );
            assert_eq!(
                judge(
                    kind,
                    &Err(DataplaneError::ConnectTimeout { target: "x".into() })
                ),
                Verdict::Unknown
            );
        }
        // direct, the errors are the destination's; through a proxy they are the proxy's own
        assert_eq!(judge(&BackendKind::Direct, &refused()), Verdict::Reachable);
        assert_eq!(judge(&socks, &refused()), Verdict::Unknown);
        for errno in [libc::EHOSTUNREACH, libc::ENETUNREACH] {
            assert_eq!(
                judge(&BackendKind::Direct, &unreachable(errno)),
                Verdict::Unreachable
            );
            assert_eq!(judge(&socks, &unreachable(errno)), Verdict::Unknown);
        }
        // an HTTP proxy's bare 502 says nothing about the host
        let bare = Err(DataplaneError::UpstreamProxy {
            proxy: "p".into(),
            reason: "CONNECT x answered 502 Bad Gateway".into(),
            refused: true,
        });
        assert_eq!(judge(&socks, &bare), Verdict::Unknown);
    }
}

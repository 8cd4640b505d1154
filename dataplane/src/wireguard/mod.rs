//! `wireguard` backends in user space: boringtun does the Noise handshake and the packet
//! crypto, smoltcp is the TCP/IP stack that originates each proxied connection inside the
//! tunnel, and a glommio UDP socket carries the encrypted datagrams to the endpoint.
//!
//! One core owns a tunnel. WireGuard keeps one current session per peer and the peer answers
//! the endpoint it heard from last, so several cores handshaking as the same peer would take
//! the session (and the reply address) from each other; a per-core key is not possible
//! either, because the peer knows one public key. The first core that needs the tunnel
//! starts it ([`WireguardBackend::ensure_started`]) and runs it to the end; a connection on
//! any core asks the owner for a flow through a bounded request queue and then moves its
//! bytes through a [`FlowStream`] (lock-free channels, cross-core wake-ups), so the relay code
//! treats a tunnelled flow like any other upstream stream.
//!
//! A tunnel outlives a panic of its owner core: the owner stamps a heartbeat on every turn of
//! its loop (at least every 250 ms), and when the stamp is older than [`OWNER_LOST`] the next
//! connection starts the tunnel again on its own core (a core that panics is restarted empty).
//!
//! Health is measured, not assumed: the owner probes a quiet tunnel with a handshake and marks
//! the backend unhealthy when the peer does not answer (peer down, or keys that do not match),
//! healthy again on the next answer, with a `backend.health` event on each change.

pub mod datagrams;
mod device;
pub mod flow;
mod ports;
mod runner;

pub use datagrams::DatagramPort;
pub use flow::FlowStream;

use crate::connector::Dialer;
use crate::error::DataplaneError;
use crate::snapshot::BackendHealth;
use flow::Wake;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_config::wireguard::WireguardSettings;

/// How long a UDP port request waits for the owner core.
const OWNER_ANSWER: Duration = Duration::from_secs(5);
/// Open requests waiting for the owner core; more fail at once as overload.
const MAX_PENDING_OPENS: usize = 1024;
/// An owner that has not stamped its heartbeat for this long is gone (its core panicked). Longer
/// than the owner's slowest turn: the 5 s pause between endpoint resolution attempts.
const OWNER_LOST: Duration = Duration::from_secs(15);

/// Which task runs the tunnel, and whether it still does.
#[derive(Debug)]
pub(crate) struct Owner {
    epoch: Instant,
    /// Milliseconds since `epoch` at the owner's last turn.
    beat: AtomicU64,
    /// Bumped for each new owner; an older owner that finds it changed stops.
    generation: AtomicU64,
}

impl Owner {
    pub(crate) fn new() -> Self {
        Self {
            epoch: Instant::now(),
            beat: AtomicU64::new(0),
            generation: AtomicU64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Stamps the heartbeat; false when a newer owner has taken over.
    pub(crate) fn beat(&self, generation: u64) -> bool {
        self.beat.store(self.now_ms(), Ordering::Release);
        self.generation.load(Ordering::Acquire) == generation
    }

    /// Takes over from an owner that stopped beating; the new generation, or None when the
    /// owner is alive or another core took over first.
    pub(crate) fn take_over_if_lost(&self) -> Option<u64> {
        let seen = self.beat.load(Ordering::Acquire);
        let now = self.now_ms();
        if now.saturating_sub(seen) < OWNER_LOST.as_millis() as u64 {
            return None;
        }
        self.beat
            .compare_exchange(seen, now, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        Some(self.generation.fetch_add(1, Ordering::AcqRel) + 1)
    }

    pub(crate) fn start(&self) -> u64 {
        self.beat.store(self.now_ms(), Ordering::Release);
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the calling core must run the owner task: the first call (flagged in
    /// `started`), or a take-over from a lost owner. The generation to run with, and whether it
    /// is a take-over; None when a live core owns it already.
    pub(crate) fn claim(&self, started: &AtomicBool) -> Option<(u64, bool)> {
        if started.load(Ordering::Acquire) {
            return self.take_over_if_lost().map(|g| (g, true));
        }
        started
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        Some((self.start(), false))
    }
}

/// Where a flow goes: an address, or a name the tunnel's DNS servers resolve.
#[derive(Debug)]
pub(crate) enum Destination {
    Addr(SocketAddr),
    Name(String, u16),
}

pub(crate) struct OpenRequest {
    pub destination: Destination,
    pub reply: futures::channel::oneshot::Sender<Result<FlowStream, DataplaneError>>,
}

/// What a core asks of the tunnel's owner.
pub(crate) enum Request {
    /// A TCP flow.
    Open(OpenRequest),
    /// A UDP port for one SOCKS5 association.
    Datagrams(futures::channel::oneshot::Sender<Result<DatagramPort, DataplaneError>>),
}

/// One configured WireGuard backend: its settings and the door to the core that runs it.
/// Snapshots share it by name while the settings stay the same, so a reload keeps the tunnel.
pub struct WireguardBackend {
    pub name: String,
    pub settings: WireguardSettings,
    requests: async_channel::Sender<Request>,
    requests_rx: async_channel::Receiver<Request>,
    started: AtomicBool,
    owner: Arc<Owner>,
    wake: Arc<Wake>,
}

impl std::fmt::Debug for WireguardBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireguardBackend")
            .field("name", &self.name)
            .field("endpoint", &self.settings.endpoint)
            .finish_non_exhaustive()
    }
}

impl WireguardBackend {
    pub fn new(name: &str, settings: WireguardSettings) -> Self {
        let (requests, requests_rx) = async_channel::bounded(MAX_PENDING_OPENS);
        Self {
            name: name.to_owned(),
            settings,
            requests,
            requests_rx,
            started: AtomicBool::new(false),
            owner: Arc::new(Owner::new()),
            wake: Arc::new(Wake::default()),
        }
    }

    /// Starts the tunnel on the calling core unless a live core runs it already.
    pub(crate) fn ensure_started(
        &self,
        ctx: &crate::engine::CoreContext,
        health: &Arc<BackendHealth>,
    ) {
        let Some((generation, take_over)) = self.owner.claim(&self.started) else {
            return;
        };
        if take_over {
            tracing::warn!(backend = %self.name, core = ctx.core, silent_for = ?OWNER_LOST,
                "the core running the WireGuard tunnel stopped; starting it again here");
        }
        tracing::info!(backend = %self.name, core = ctx.core, endpoint = %self.settings.endpoint,
            "starting WireGuard tunnel");
        let args = runner::RunnerArgs {
            owner: self.owner.clone(),
            generation,
            name: self.name.clone(),
            settings: self.settings.clone(),
            requests: self.requests_rx.clone(),
            wake: self.wake.clone(),
            health: health.clone(),
            events: ctx.events.clone(),
            resolver: ctx.resolver.clone(),
            offload: ctx.offload.clone(),
        };
        glommio::spawn_local(runner::run(args)).detach();
    }

    /// Opens a TCP flow to `host:port` inside the tunnel, within `deadline`.
    pub(crate) async fn open(
        &self,
        dialer: &Dialer<'_>,
        host: &str,
        port: u16,
        deadline: Instant,
    ) -> Result<FlowStream, DataplaneError> {
        let destination = match host.parse::<IpAddr>() {
            Ok(ip) => Destination::Addr(SocketAddr::new(ip, port)),
            Err(_) if !self.settings.dns.is_empty() => Destination::Name(host.to_owned(), port),
            Err(_) => {
                // No DNS servers in the tunnel: the host resolves, the tunnel carries.
                let addrs = dialer.resolver.resolve(dialer.offload, host, port).await?;
                let pick = addrs
                    .iter()
                    .find(|a| {
                        self.settings.allows(a.ip()) && self.settings.source_for(a.ip()).is_some()
                    })
                    .or(addrs.first())
                    .copied()
                    .ok_or_else(|| DataplaneError::Resolve {
                        host: host.to_owned(),
                        reason: "no addresses".into(),
                    })?;
                Destination::Addr(pick)
            }
        };
        let (reply, answer) = futures::channel::oneshot::channel();
        self.requests
            .try_send(Request::Open(OpenRequest { destination, reply }))
            .map_err(|_| DataplaneError::Overloaded("WireGuard tunnel request queue full"))?;
        self.wake.notify();
        let target = crate::http_proxy::host_port_label(host, port);
        let left = deadline.saturating_duration_since(Instant::now());
        let outcome = futures_lite::future::or(async { Some(answer.await) }, async {
            glommio::timer::sleep(left).await;
            None
        })
        .await;
        match outcome {
            Some(Ok(result)) => result,
            Some(Err(_canceled)) => Err(DataplaneError::Tunnel {
                backend: self.name.clone(),
                reason: "the tunnel stopped".into(),
            }),
            None => Err(DataplaneError::ConnectTimeout { target }),
        }
    }

    /// Opens a UDP port inside the tunnel for one SOCKS5 association (the tunnel must have
    /// been started, see [`Self::ensure_started`]).
    pub(crate) async fn open_datagrams(&self) -> Result<DatagramPort, DataplaneError> {
        let (reply, answer) = futures::channel::oneshot::channel();
        self.requests
            .try_send(Request::Datagrams(reply))
            .map_err(|_| DataplaneError::Overloaded("WireGuard tunnel request queue full"))?;
        self.wake.notify();
        let stopped = |reason: &str| DataplaneError::Tunnel {
            backend: self.name.clone(),
            reason: reason.into(),
        };
        // An owner that answers nothing (its core is gone) must not stall the association.
        futures_lite::future::or(
            async {
                answer
                    .await
                    .unwrap_or_else(|_| Err(stopped("the tunnel stopped")))
            },
            async {
                glommio::timer::sleep(OWNER_ANSWER).await;
                Err(stopped("the tunnel's core did not answer"))
            },
        )
        .await
    }

    /// Whether `ip` is a destination the tunnel carries (in `allowed_ips`, with a source
    /// address of its family).
    pub(crate) fn carries(&self, ip: IpAddr) -> bool {
        self.settings.allows(ip) && self.settings.source_for(ip).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner_silent_for(d: Duration) -> Owner {
        let owner = Owner::new();
        let past = Instant::now()
            .checked_sub(d)
            .expect("clock far enough from boot");
        Owner {
            epoch: past,
            ..owner
        }
    }

    #[test]
    fn a_live_owner_keeps_its_tunnel() {
        let owner = Owner::new();
        let generation = owner.start();
        assert_eq!(owner.take_over_if_lost(), None);
        assert!(owner.beat(generation));
    }

    #[test]
    fn a_silent_owner_is_replaced_once_and_the_old_one_stops() {
        let owner = owner_silent_for(OWNER_LOST + Duration::from_secs(1));
        // Started at the epoch and silent since.
        let first = 0;
        let second = owner.take_over_if_lost().expect("taken over");
        assert_ne!(second, first);
        // A second core arriving just after sees a fresh beat: one new owner only.
        assert_eq!(owner.take_over_if_lost(), None);
        assert!(!owner.beat(first), "the old owner learns it was replaced");
        assert!(owner.beat(second));
    }

    #[test]
    fn an_owner_silent_for_less_than_the_limit_is_kept() {
        let owner = owner_silent_for(OWNER_LOST - Duration::from_secs(2));
        assert_eq!(owner.take_over_if_lost(), None);
    }
}

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
//! Health is measured, not assumed: the owner probes a quiet tunnel with a handshake and marks
//! the backend unhealthy when the peer does not answer (peer down, or keys that do not match),
//! healthy again on the next answer, with a `backend.health` event on each change.

mod device;
pub mod flow;
mod runner;

pub use flow::FlowStream;

use crate::connector::Dialer;
use crate::error::DataplaneError;
use crate::snapshot::BackendHealth;
use flow::Wake;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use switchyard_config::wireguard::WireguardSettings;

/// Open requests waiting for the owner core; more fail at once as overload.
const MAX_PENDING_OPENS: usize = 1024;

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

/// One configured WireGuard backend: its settings and the door to the core that runs it.
/// Snapshots share it by name while the settings stay the same, so a reload keeps the tunnel.
pub struct WireguardBackend {
    pub name: String,
    pub settings: WireguardSettings,
    requests: async_channel::Sender<OpenRequest>,
    requests_rx: async_channel::Receiver<OpenRequest>,
    started: AtomicBool,
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
            wake: Arc::new(Wake::default()),
        }
    }

    /// Starts the tunnel on the calling core unless a core runs it already.
    pub(crate) fn ensure_started(
        &self,
        ctx: &crate::engine::CoreContext,
        health: &Arc<BackendHealth>,
    ) {
        if self.started.load(Ordering::Acquire)
            || self
                .started
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return;
        }
        tracing::info!(backend = %self.name, core = ctx.core, endpoint = %self.settings.endpoint,
            "starting WireGuard tunnel");
        let args = runner::RunnerArgs {
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
            .try_send(OpenRequest { destination, reply })
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
}

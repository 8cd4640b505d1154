//! VPN (TUN) mode of `switchyard client`: the control-plane side.
//!
//! [`VpnManager`] drives the [`phase`] state machine. Enabling creates the TUN device
//! (`vpn.interface_name`, `vpn.mtu`, `vpn.tun.address`), starts the split tunnel
//! (`switchyard-split-tunnel`: policy routing into the TUN, eBPF or nftables classification of
//! `vpn.split` with `always_bypass` plus the server's addresses and — unless
//! `vpn.split.allow_lan` is off — the directly connected LAN), and starts the TUN
//! pump of the data plane (`switchyard_dataplane::tun`), whose flows the glommio cores relay to
//! the selected server or direct by the client's routes. The client's own sockets never loop
//! into the TUN: the client's cgroup is a bypass cgroup of the classifier (it moves into
//! `<scope>/switchyard-client` if it runs in the classified scope itself), so its sockets carry
//! no tunnel mark and take the main table.
//!
//! Crash safety: every host change of the split tunnel is journalled in the data directory and
//! undone by [`startup_cleanup`] before anything else starts; the TUN device is not persistent,
//! so the kernel deletes it with the process. With `vpn.lockdown` the journalled state is the
//! point: it stays when the process stops or dies (the TUN's table then routes nothing), the next
//! start takes it over, and [`unlock`] (`switchyard client vpn-unlock`) removes it.

pub mod host;
pub mod phase;

use chrono::Utc;
use parking_lot::Mutex;
use phase::{Phase, Step};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use switchyard_api::client::{
    VpnAppExecs, VpnBlockedStats, VpnConnection, VpnIcmpStats, VpnStatus,
};
use switchyard_config::client::{ClientConfig, VpnSplitConfig};
use switchyard_config::client::{ClientServerConfig, ServerProtocol};
use switchyard_dataplane::events::Protocol;
use switchyard_dataplane::live::LiveTable;
use switchyard_dataplane::tun::{
    NatAddresses, NatAddresses6, Translator, TunPump, UdpNat, VpnPath,
};
use switchyard_dataplane::SnapshotHandle;
use switchyard_split_tunnel::exec_watch::ExecStats;
use switchyard_split_tunnel::{
    cgroup, AppRule, DnsRedirect, MechanismChoice, SplitRules, SplitTunnel, SplitTunnelConfig,
    SplitTunnelStatus, TcpRedirect,
};
use switchyard_vpn_dns::{DnsInterceptor, ProxyProtocol, ResolverConfig, Upstream};

/// Undoes what a previous run left on the host (split-tunnel journal, a stale TUN device).
/// Runs at start, before the data plane and the VPN.
/// With `vpn.lockdown` the split tunnel's state stays: enabling takes it over.
pub fn startup_cleanup(data_dir: &Path, cfg: &ClientConfig) {
    if cfg.vpn.lockdown {
        tracing::info!("vpn.lockdown: what a previous run left of the VPN stays installed until the VPN takes it over (tunnelled apps have no network until then)");
        host::remove_leftover_tun(&cfg.vpn.interface_name);
        return;
    }
    match switchyard_split_tunnel::recover(data_dir) {
        Ok(0) => {}
        Ok(n) => tracing::info!(undone = n, "removed VPN leftovers of a previous run"),
        Err(e) => {
            tracing::warn!(error = %e, "could not remove every VPN leftover of a previous run")
        }
    }
    host::remove_leftover_tun(&cfg.vpn.interface_name);
}

/// `switchyard client vpn-unlock`: removes what the split-tunnel journal of `data_dir` lists
/// (routes, rules, nft table, eBPF pins and links, cgroups, mounts) — the lockdown state of a
/// stopped client. Returns a line per change removed.
pub fn unlock(data_dir: &Path) -> Result<Vec<String>, switchyard_split_tunnel::Error> {
    let journal = switchyard_split_tunnel::journal::Journal::new(data_dir);
    let listed = journal
        .entries()
        .map_err(|e| switchyard_split_tunnel::Error::Journal(journal.path().to_path_buf(), e))?;
    switchyard_split_tunnel::recover(data_dir)?;
    let mut removed: Vec<String> = Vec::new();
    for change in listed.iter().rev() {
        let line = change.to_string();
        if !removed.contains(&line) {
            removed.push(line);
        }
    }
    Ok(removed)
}

/// The split tunnel, shared with the resolver's `on_resolved` hook (control plane only).
type SharedSplit = Arc<Mutex<Option<SplitTunnel>>>;

/// The VPN's running parts; dropping the device closes the TUN.
struct Active {
    split: SharedSplit,
    dns: Option<DnsInterceptor>,
    pump: TunPump,
    _device: std::fs::File,
    /// The server's addresses: never tunnelled, kept for rule edits.
    server_nets: Vec<String>,
    /// The directly connected networks found at enable: not tunnelled unless
    /// `vpn.split.allow_lan` is off.
    lan: Vec<String>,
}

pub struct VpnManager {
    phase: Mutex<Phase>,
    /// Serialises enable, disable and rule edits (all control plane).
    active: tokio::sync::Mutex<Option<Active>>,
    split_status: Mutex<Option<SplitTunnelStatus>>,
    /// The nftables exec watch's counters while the VPN is on (read live by the status).
    exec_stats: Mutex<Option<Arc<ExecStats>>>,
    path: Option<Arc<VpnPath>>,
    listen_port: Option<u16>,
    live: Arc<LiveTable>,
    data_dir: PathBuf,
    /// The engine's routing as the cores see it: the resolver refuses names it blocks.
    snapshot: SnapshotHandle,
    /// DNS questions the resolver refused since start (counted by its refusal rule).
    dns_refused: Arc<std::sync::atomic::AtomicU64>,
}

/// `vpn.dns.servers` entry: `ip` (port 53) or `ip:port`.
fn dns_server(s: &str) -> Option<std::net::SocketAddr> {
    let s = s.trim();
    s.parse()
        .ok()
        .or_else(|| s.parse::<std::net::IpAddr>().ok().map(|ip| (ip, 53).into()))
}

/// The split-tunnel rules of the configuration plus what is never tunnelled besides
/// `always_bypass`: the server's own addresses (`server_nets`, so the tunnel itself keeps
/// working) and, with `allow_lan`, the directly connected networks (`lan`).
pub fn split_rules(split: &VpnSplitConfig, server_nets: &[String], lan: &[String]) -> SplitRules {
    let mut always_bypass = split.always_bypass.clone();
    let lan = if split.allow_lan { lan } else { &[] };
    for net in server_nets.iter().chain(lan) {
        if !always_bypass.contains(net) {
            always_bypass.push(net.clone());
        }
    }
    SplitRules {
        mode: split.mode,
        apps: split
            .apps
            .iter()
            .map(|a| AppRule {
                name: a.name.clone(),
                path: a.path.clone(),
                cgroup: a.cgroup.clone(),
                bundle_id: a.bundle_id.clone(),
            })
            .collect(),
        domains: split.domains.clone(),
        ips: split.ips.clone(),
        always_bypass,
    }
}

/// Where the resolver forwards queries: through the server traffic goes to, else direct.
/// A QUIC server's queries go through its TCP fallback (the resolver runs on the control plane
/// and speaks only the TCP proxy protocols), or direct without one.
fn dns_upstream(server: Option<&ClientServerConfig>) -> Upstream {
    let proxy = |address: &str, protocol: ServerProtocol, s: &ClientServerConfig| Upstream::Proxy {
        address: address.to_owned(),
        protocol: match protocol {
            ServerProtocol::Socks5 => ProxyProtocol::Socks5,
            _ => ProxyProtocol::Http,
        },
        username: s.username.clone(),
        password: s.password.clone(),
    };
    match server {
        Some(s) if s.protocol != ServerProtocol::Quic => proxy(&s.address, s.protocol, s),
        Some(s) => match &s.fallback {
            Some(f) => proxy(&f.address, f.protocol, s),
            None => Upstream::Direct { mark: None },
        },
        None => Upstream::Direct { mark: None },
    }
}

/// Where the eBPF classifier sends tunnelled TCP instead of the TUN (`vpn.tcp_redirect`): the
/// data plane's loopback listeners; IPv6 only when the tunnel carries IPv6 (otherwise the TUN
/// refuses it, as before).
fn tcp_redirect(cfg: &ClientConfig, path: &VpnPath, v6: bool) -> Option<TcpRedirect> {
    let acquire = std::sync::atomic::Ordering::Acquire;
    let port4 = path.redirect_port4.load(acquire);
    let port6 = if v6 {
        path.redirect_port6.load(acquire)
    } else {
        0
    };
    (cfg.vpn.tcp_redirect && (port4 != 0 || port6 != 0)).then_some(TcpRedirect { port4, port6 })
}

/// Lets go of a split tunnel whose enable failed later on: undone, or kept with `lockdown`.
fn release(split: SplitTunnel, lockdown: bool) {
    if lockdown {
        split.keep();
    } else if let Err(undo) = split.disable() {
        tracing::warn!(error = %undo, "undoing the split tunnel after a failed enable was incomplete: the next start removes what is left");
    }
}

fn classifier(cfg: &ClientConfig) -> MechanismChoice {
    match cfg.vpn.classifier.as_str() {
        "ebpf" => MechanismChoice::Ebpf,
        "nftables" => MechanismChoice::Nftables,
        _ => MechanismChoice::Auto,
    }
}

impl VpnManager {
    pub fn new(
        path: Option<Arc<VpnPath>>,
        listen_port: Option<u16>,
        live: Arc<LiveTable>,
        data_dir: PathBuf,
        snapshot: SnapshotHandle,
    ) -> Self {
        VpnManager {
            phase: Mutex::new(Phase::Disabled),
            active: tokio::sync::Mutex::new(None),
            split_status: Mutex::new(None),
            exec_stats: Mutex::new(None),
            path,
            listen_port,
            live,
            data_dir,
            snapshot,
            dns_refused: Arc::default(),
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase.lock().clone()
    }

    fn step(&self, step: Step) -> Result<(), phase::Refused> {
        let mut phase = self.phase.lock();
        *phase = phase.next(step, Utc::now())?;
        Ok(())
    }

    /// Brings the VPN up; on failure the VPN is in `error` with the reason and nothing it
    /// created is left. Enabling an enabled VPN does nothing.
    pub async fn enable(
        &self,
        cfg: &ClientConfig,
        server: Option<&ClientServerConfig>,
    ) -> Result<(), String> {
        let mut active = self.active.lock().await;
        if self.phase().enabled() {
            return Ok(());
        }
        self.step(Step::Enable).map_err(|e| e.to_string())?;
        tracing::info!(device = %cfg.vpn.interface_name, "VPN connecting");
        let split: SharedSplit = Arc::new(Mutex::new(None));
        let up = match self.start_resolver(cfg, server, &split).await {
            Ok(dns) => {
                // the resolver listens on 127.0.0.1 and ::1 (see start_resolver)
                let redirect = dns.as_ref().map(|d| DnsRedirect {
                    intercept_port: cfg.vpn.dns.intercept_port,
                    resolver4: match d.local_addr() {
                        std::net::SocketAddr::V4(v4) => Some(v4),
                        std::net::SocketAddr::V6(_) => None,
                    },
                    resolver6: match d.local_addr6() {
                        Some(std::net::SocketAddr::V6(v6)) => Some(v6),
                        _ => None,
                    },
                });
                let address = server.map(|s| s.address.as_str());
                match tokio::task::block_in_place(|| self.bring_up(cfg, address, redirect)) {
                    Ok(mut a) => {
                        let tunnel = a.split.lock().take();
                        *split.lock() = tunnel;
                        a.split = split;
                        a.dns = dns;
                        Ok(a)
                    }
                    Err(e) => {
                        if let Some(d) = dns {
                            d.shutdown().await;
                        }
                        Err(e)
                    }
                }
            }
            Err(e) => Err(e),
        };
        match up {
            Ok(a) => {
                {
                    let split = a.split.lock();
                    *self.split_status.lock() = split.as_ref().map(SplitTunnel::status);
                    *self.exec_stats.lock() = split.as_ref().and_then(SplitTunnel::exec_stats);
                }
                *active = Some(a);
                let _ = self.step(Step::Up);
                tracing::info!(device = %cfg.vpn.interface_name, "VPN connected");
                Ok(())
            }
            Err(reason) => {
                tracing::error!(%reason, "VPN could not be enabled");
                let _ = self.step(Step::Failed(reason.clone()));
                Err(reason)
            }
        }
    }

    /// The DNS interception resolver (when `vpn.dns.enabled` with servers): forwards through
    /// the selected server, and reports answers to the split tunnel and the VPN listener.
    async fn start_resolver(
        &self,
        cfg: &ClientConfig,
        server: Option<&ClientServerConfig>,
        split: &SharedSplit,
    ) -> Result<Option<DnsInterceptor>, String> {
        let dns = &cfg.vpn.dns;
        if !dns.enabled || dns.servers.is_empty() {
            return Ok(None);
        }
        let servers = dns
            .servers
            .iter()
            .map(|s| {
                dns_server(s).ok_or_else(|| format!("vpn.dns.servers: {s:?} is not an address"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let upstream = dns_upstream(server);
        let (hook_split, path) = (split.clone(), self.path.clone());
        let on_resolved: switchyard_vpn_dns::OnResolved = Arc::new(move |name, addrs| {
            if let Some(path) = &path {
                path.learn_names(name, addrs);
            }
            if let Some(split) = hook_split.lock().as_mut() {
                if let Err(e) = split.on_resolved(name, addrs) {
                    tracing::warn!(%name, error = %e, "adding resolved addresses to the split tunnel failed");
                }
            }
        });
        // IPv6 questions are redirected to ::1 — unless the namespace has no IPv6 loopback
        // (IPv6 disabled), where no IPv6 question can leave either
        let loopback6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 0));
        let listen6 = std::net::UdpSocket::bind(loopback6)
            .is_ok()
            .then_some(loopback6);
        if listen6.is_none() {
            tracing::warn!("no IPv6 loopback: the VPN's resolver takes IPv4 questions only");
        }
        let config = ResolverConfig {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            listen6,
            servers,
            cache_ttl: dns.cache_ttl.as_std(),
            upstream,
            ..ResolverConfig::default()
        };
        let dns = DnsInterceptor::start(config, on_resolved)
            .await
            .map_err(|e| format!("DNS resolver: {e}"))?;
        // Set before the split tunnel redirects the first question here. A name the engine
        // blocks is answered REFUSED: it is never forwarded, neither through the server (not
        // connected) nor direct (the kill switch).
        let (snapshot, refused) = (self.snapshot.clone(), self.dns_refused.clone());
        dns.set_refuse(Some(Arc::new(move |name| {
            let blocked = crate::client::engine_config::is_blocked(&snapshot.load(), name);
            if blocked {
                refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            blocked
        })));
        Ok(Some(dns))
    }

    fn bring_up(
        &self,
        cfg: &ClientConfig,
        server: Option<&str>,
        dns: Option<DnsRedirect>,
    ) -> Result<Active, String> {
        let vpn = &cfg.vpn;
        let (Some(path), Some(listen_port)) = (&self.path, self.listen_port) else {
            return Err(format!(
                "the VPN path is not running: vpn.tun.address ({}) and vpn.tun.gateway ({}) must be IPv4",
                vpn.tun.address, vpn.tun.gateway
            ));
        };
        let (ip, prefix) = host::tun_address(&vpn.tun.address)
            .ok_or_else(|| format!("vpn.tun.address {:?} is not an IPv4 CIDR", vpn.tun.address))?;
        let name = &vpn.interface_name;
        let device = switchyard_dataplane::tun::open_device(name)
            .map_err(|e| format!("creating the TUN device {name}: {e}"))?;
        // from here on, returning drops (and so deletes) the device
        host::configure_tun(name, ip, prefix, vpn.mtu).map_err(|e| e.to_string())?;
        // IPv6 through the tunnel when the path has its addresses and the device takes them;
        // otherwise tunnelled IPv6 has no way out (the split tunnel's IPv6 route table is
        // unreachable or the pump drops it), never a way around
        let v6 = path.v6.filter(|a| {
            let prefix = host::tun_address6(&vpn.tun.address6).map_or(64, |(_, p)| p);
            match host::configure_tun6(name, a.tun_ip, prefix) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "the TUN device takes no IPv6 address: tunnelled IPv6 is refused");
                    false
                }
            }
        });
        // the visible cgroup2 mount, or a private one when none is (under `ip netns exec`)
        let mount = switchyard_split_tunnel::prepare_cgroup2(&self.data_dir, vpn.lockdown)
            .map_err(|e| format!("split tunnel: {e}"))?;
        let scope = if vpn.scope_cgroup.is_empty() {
            mount.clone()
        } else {
            cgroup::resolve(&mount, &vpn.scope_cgroup)
        };
        let own = host::own_bypass_cgroup(&scope).map_err(|e| e.to_string())?;
        let mut split_cfg = SplitTunnelConfig::new(&self.data_dir, &scope, name);
        split_cfg.bpf_pin_dir = self.data_dir.join("bpffs");
        split_cfg.bypass_cgroups = vec![own];
        split_cfg.tun_sources = std::iter::once(IpAddr::V4(ip))
            .chain(v6.map(|a| IpAddr::V6(a.tun_ip)))
            .collect();
        split_cfg.mechanism = classifier(cfg);
        split_cfg.dns = dns;
        split_cfg.tcp_redirect = tcp_redirect(cfg, path, v6.is_some());
        split_cfg.lockdown = vpn.lockdown;
        let lan = host::lan_networks(name);
        let server_nets = server.map(host::server_addresses).unwrap_or_default();
        let rules = split_rules(&vpn.split, &server_nets, &lan);
        let split =
            SplitTunnel::start(split_cfg, rules).map_err(|e| format!("split tunnel: {e}"))?;
        // the listeners serve redirected flows from now on (the programs are attached: a
        // connection may already be waiting)
        path.redirect_origins
            .store(split.flow_origins().map(Arc::new));
        let translator = Translator::new(
            NatAddresses {
                tun_ip: path.tun_ip,
                listen_port,
                gateway: path.gateway,
            },
            path.nat.clone(),
        );
        let acquire = std::sync::atomic::Ordering::Acquire;
        let (listen_port6, udp_port6) = (
            path.listen_port6.load(acquire),
            path.udp_port6.load(acquire),
        );
        let v6_at = |port: u16| {
            v6.filter(|_| port != 0).map(|a| NatAddresses6 {
                tun_ip: a.tun_ip,
                listen_port: port,
                gateway: a.gateway,
            })
        };
        let translator = match v6_at(listen_port6) {
            Some(addrs6) => translator.with_v6(addrs6),
            None => translator,
        };
        // UDP is relayed when the data plane has its VPN UDP socket (else dropped and counted)
        let udp_port = path.udp_port.load(acquire);
        let translator = if udp_port == 0 {
            translator
        } else {
            let udp = UdpNat::new(
                NatAddresses {
                    tun_ip: path.tun_ip,
                    listen_port: udp_port,
                    gateway: path.gateway,
                },
                path.udp_nat.clone(),
            );
            translator.with_udp(match v6_at(udp_port6) {
                Some(addrs6) => udp.with_v6(addrs6),
                None => udp,
            })
        };
        let pump = device
            .try_clone()
            .and_then(|d| TunPump::start(d, translator, path.stats.clone()));
        let pump = match pump {
            Ok(p) => p,
            Err(e) => {
                path.redirect_origins.store(None);
                release(split, vpn.lockdown);
                return Err(format!("starting the TUN pump: {e}"));
            }
        };
        Ok(Active {
            split: Arc::new(Mutex::new(Some(split))),
            dns: None,
            pump,
            _device: device,
            server_nets,
            lan,
        })
    }

    /// Takes everything down (from any phase); the VPN is `disabled` afterwards. An explicit
    /// disable is the user's choice: it removes a lockdown's state too.
    pub async fn disable(&self) -> Result<(), String> {
        self.take_down(false).await
    }

    /// The client stops (SIGTERM/SIGINT): with `lockdown` the split tunnel stays installed
    /// (tunnelled apps have no network until the next start takes it over), else as
    /// [`VpnManager::disable`].
    pub async fn shutdown(&self, lockdown: bool) -> Result<(), String> {
        self.take_down(lockdown).await
    }

    async fn take_down(&self, keep_split: bool) -> Result<(), String> {
        let mut active = self.active.lock().await;
        let result = match active.take() {
            Some(a) => {
                if let Some(dns) = a.dns {
                    dns.shutdown().await;
                }
                let split = a.split.lock().take();
                let pump = a.pump;
                tokio::task::block_in_place(|| {
                    pump.stop();
                    match split {
                        Some(s) if keep_split => {
                            s.keep();
                            Ok(())
                        }
                        Some(s) => s.disable().map_err(|e| e.to_string()),
                        None => Ok(()),
                    }
                })
                // the device closes when `a._device` drops here
            }
            // a lockdown's state kept from the previous run (startup_cleanup left it for the
            // enable to take over): an explicit disable removes it too
            None if !keep_split => tokio::task::block_in_place(|| {
                switchyard_split_tunnel::recover(&self.data_dir)
                    .map(drop)
                    .map_err(|e| e.to_string())
            }),
            None => Ok(()),
        };
        if let Some(path) = &self.path {
            path.redirect_origins.store(None);
        }
        *self.split_status.lock() = None;
        *self.exec_stats.lock() = None;
        let _ = self.step(Step::Disable);
        match &result {
            Ok(()) => tracing::info!("VPN disabled"),
            Err(e) => {
                tracing::warn!(error = %e, "VPN disabled; some host changes stay for the next start to undo")
            }
        }
        result
    }

    /// Applies the configuration's split rules to the running split tunnel (no-op when off).
    pub async fn apply_split(&self, split: &VpnSplitConfig) -> Result<(), String> {
        let mut active = self.active.lock().await;
        let Some(a) = active.as_mut() else {
            return Ok(());
        };
        let rules = split_rules(split, &a.server_nets, &a.lan);
        let mut tunnel = a.split.lock();
        let Some(tunnel) = tunnel.as_mut() else {
            return Ok(());
        };
        tokio::task::block_in_place(|| tunnel.set_rules(rules)).map_err(|e| e.to_string())?;
        *self.split_status.lock() = Some(tunnel.status());
        Ok(())
    }

    /// The server traffic goes to changed (selected, connected or disconnected): the resolver
    /// forwards through the new one (direct while disconnected, like every other flow) and the
    /// new server's addresses replace the old ones in the bypass set, so a running VPN follows
    /// the switch without being disabled and enabled again. Idempotent; no-op while the VPN is
    /// off.
    pub async fn follow_server(&self, split: &VpnSplitConfig, server: Option<&ClientServerConfig>) {
        let mut active = self.active.lock().await;
        let Some(a) = active.as_mut() else {
            return;
        };
        let upstream = dns_upstream(server);
        let dns_changed = a.dns.as_ref().is_some_and(|d| d.upstream() != upstream);
        if let Some(dns) = a.dns.as_ref().filter(|_| dns_changed) {
            dns.set_upstream(upstream);
        }
        let server_nets = server
            .map(|s| host::server_addresses(&s.address))
            .unwrap_or_default();
        let bypass_changed = server_nets != a.server_nets;
        if bypass_changed {
            a.server_nets = server_nets;
            let rules = split_rules(split, &a.server_nets, &a.lan);
            if let Some(tunnel) = a.split.lock().as_mut() {
                match tokio::task::block_in_place(|| tunnel.set_rules(rules)) {
                    Ok(()) => *self.split_status.lock() = Some(tunnel.status()),
                    Err(e) => {
                        tracing::warn!(error = %e, "the new server's addresses could not be added to the VPN bypass")
                    }
                }
            }
        }
        if dns_changed || bypass_changed {
            tracing::info!(
                server = server.map_or("(none: direct)", |s| s.name.as_str()),
                "VPN follows the server change"
            );
        }
    }

    /// Moves newly started processes of name/path app rules into the apps cgroup.
    pub async fn refresh_apps(&self) {
        let mut active = self.active.lock().await;
        if let Some(a) = active.as_mut() {
            if let Some(tunnel) = a.split.lock().as_mut() {
                if let Err(e) = tokio::task::block_in_place(|| tunnel.refresh_apps()) {
                    tracing::debug!(error = %e, "refreshing split-tunnel apps failed");
                }
            }
        }
    }

    /// The resolver's cache (empty and `enabled: false` while the VPN or its DNS is off).
    pub async fn dns_cache(&self) -> switchyard_api::client::DnsCacheView {
        let active = self.active.lock().await;
        match active.as_ref().and_then(|a| a.dns.as_ref()) {
            Some(dns) => dns.cache_view(),
            None => switchyard_api::client::DnsCacheView {
                enabled: false,
                entries: Vec::new(),
                count: 0,
            },
        }
    }

    /// What the kill switch refused since start: the TUN path's counters and the resolver's.
    fn blocked(&self) -> VpnBlockedStats {
        use std::sync::atomic::Ordering::Relaxed;
        let (tcp_flows, udp_datagrams) = self.path.as_ref().map_or((0, 0), |p| {
            (
                p.stats.blocked_tcp.load(Relaxed),
                p.udp_stats.blocked.load(Relaxed),
            )
        });
        VpnBlockedStats {
            tcp_flows,
            udp_datagrams,
            dns_refused: self.dns_refused.load(Relaxed),
        }
    }

    pub fn status(&self, cfg: &ClientConfig) -> VpnStatus {
        let phase = self.phase();
        let (sent, received, flows, dropped, tcp_redirected) =
            self.path.as_ref().map_or((0, 0, 0, 0, 0), |p| {
                use std::sync::atomic::Ordering::Relaxed;
                (
                    p.stats.bytes_sent.load(Relaxed),
                    p.stats.bytes_received.load(Relaxed),
                    p.stats.flows.load(Relaxed),
                    p.stats.dropped.load(Relaxed) + p.udp_stats.dropped.load(Relaxed),
                    p.stats.redirected_tcp.load(Relaxed),
                )
            });
        let icmp = self.path.as_ref().map_or_else(VpnIcmpStats::default, |p| {
            use std::sync::atomic::Ordering::Relaxed;
            let s = &p.stats;
            VpnIcmpStats {
                echo_requests: s.echo_requests.load(Relaxed),
                echo_answered: s.echo_answered.load(Relaxed),
                echo_unreachable: s.echo_unreachable.load(Relaxed),
                echo_prohibited: s.echo_prohibited.load(Relaxed),
                echo_dropped: s.echo_dropped.load(Relaxed),
                echo_limited: s.echo_limited.load(Relaxed),
            }
        });
        let split = self.split_status.lock().clone();
        let app_execs = self.exec_stats.lock().as_ref().map(|s| {
            use std::sync::atomic::Ordering::Relaxed;
            VpnAppExecs {
                seen: s.seen.load(Relaxed),
                moved: s.moved.load(Relaxed),
            }
        });
        let ip = host::tun_address(&cfg.vpn.tun.address)
            .map(|(ip, _)| ip.to_string())
            .unwrap_or_default();
        // IPv6 of the TUN: both or neither (an empty address6 means no IPv6)
        let (ip6, gateway6) = host::tun_address6(&cfg.vpn.tun.address6)
            .map(|(ip6, _)| (ip6.to_string(), cfg.vpn.tun.gateway6.clone()))
            .unwrap_or_default();
        let dns = if cfg.vpn.dns.enabled {
            cfg.vpn.dns.servers.clone()
        } else {
            Vec::new()
        };
        VpnStatus {
            status: phase.as_str().into(),
            enabled: phase.enabled(),
            tunnel_type: cfg.vpn.mode.clone(),
            interface_name: cfg.vpn.interface_name.clone(),
            mtu: cfg.vpn.mtu,
            port: self.listen_port.unwrap_or(0),
            encryption: "none".into(),
            bytes_sent: sent,
            bytes_received: received,
            gateway: cfg.vpn.tun.gateway.clone(),
            local_ip: ip.clone(),
            ip,
            ip6,
            gateway6,
            dns_servers: dns.clone(),
            dns,
            connected_at: phase.since(),
            connected_since: phase.since(),
            mechanism: split.as_ref().map(|s| s.mechanism.to_string()),
            fallback_reason: split.and_then(|s| s.fallback_reason),
            error: phase.reason().map(str::to_string),
            flows,
            tcp_redirected,
            dropped,
            icmp,
            app_execs,
            blocked: self.blocked(),
        }
    }

    /// The live flows of the TUN path, TCP and UDP (measured by the relay).
    pub fn connections(&self) -> Vec<VpnConnection> {
        use std::sync::atomic::Ordering::Relaxed;
        self.live
            .list()
            .into_iter()
            .filter_map(|c| {
                let protocol = match c.protocol {
                    Protocol::Vpn => "tcp",
                    Protocol::VpnUdp => "udp",
                    _ => return None,
                };
                Some((c, protocol))
            })
            .map(|(c, protocol)| VpnConnection {
                id: c.id.to_string(),
                remote_addr: c.host.clone(),
                local_addr: c.client.to_string(),
                protocol: protocol.into(),
                started_at: c.started.into(),
                bytes_sent: c.bytes_recv.load(Relaxed),
                bytes_received: c.bytes_sent.load(Relaxed),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_lan_is_bypassed_unless_allow_lan_is_off_and_the_server_always_is() {
        let server = strings(&["10.210.0.1/32"]);
        let lan = strings(&["10.210.0.0/24", "192.168.1.0/24", "fd00:1::/64"]);
        let mut split = VpnSplitConfig {
            always_bypass: strings(&["192.168.1.0/24", "172.16.0.0/12"]),
            ..VpnSplitConfig::default()
        };
        assert!(split.allow_lan, "the default keeps today's behaviour");
        assert_eq!(
            split_rules(&split, &server, &lan).always_bypass,
            strings(&[
                "192.168.1.0/24",
                "172.16.0.0/12",
                "10.210.0.1/32",
                "10.210.0.0/24",
                "fd00:1::/64"
            ])
        );
        split.allow_lan = false;
        // a LAN network the user listed in always_bypass stays bypassed: that is their rule
        assert_eq!(
            split_rules(&split, &server, &lan).always_bypass,
            strings(&["192.168.1.0/24", "172.16.0.0/12", "10.210.0.1/32"])
        );
        assert_eq!(
            split_rules(&split, &[], &lan).always_bypass,
            strings(&["192.168.1.0/24", "172.16.0.0/12"])
        );
    }

    #[test]
    fn allow_lan_defaults_to_true_in_the_configuration_and_can_be_turned_off() {
        let cfg = ClientConfig::from_yaml_str("vpn: {split: {mode: include}}", &|_| None)
            .expect("config");
        assert!(cfg.vpn.split.allow_lan);
        let cfg = ClientConfig::from_yaml_str("vpn: {split: {allow_lan: false}}", &|_| None)
            .expect("config");
        assert!(!cfg.vpn.split.allow_lan);
    }
}

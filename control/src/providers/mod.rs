//! Provider backends on the control plane: fetch each provider's server list (cached 6 h),
//! pick a server for every provider backend, do the provider's key and session calls, and turn
//! the backend into the `wireguard` or `openvpn` backend it resolved to when the data-plane
//! snapshot is compiled ([`Providers::effective`]): the data plane never sees provider kinds.
//!
//! A background task ([`run`]) resolves backends after start and after configuration changes,
//! refetches expired lists, refreshes PIA tokens and renews forwarded ports. When a provider's
//! API is down, slow or answers garbage, the backend carries the error (shown by the API and
//! logged) and the last good list stays in use.

pub mod cache;
pub mod http;
pub mod keys;
pub mod mullvad;
pub mod nordvpn;
pub mod pia;
pub mod protonvpn;
pub mod resolve;
pub mod select;

use crate::server::ServerState;
use cache::{ListCache, ListKey};
use http::ApiError;
use parking_lot::Mutex;
use select::Server;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use switchyard_config::provider::{ProviderKind, ProviderSettings, VpnProtocol};
use switchyard_config::{BackendType, ServerConfig};

/// How often the background task looks at lists, tokens and forwarded ports.
const TICK: Duration = Duration::from_secs(60);

/// A backend's resolution: the server and the settings it became.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub server: Server,
    pub protocol: VpnProtocol,
    /// The `wireguard` or `openvpn` settings object.
    pub settings: serde_json::Value,
    pub resolved_at: chrono::DateTime<chrono::Utc>,
    /// PIA port forwarding: the port, and when it was last bound.
    pub forward: Option<(pia::Forward, Instant)>,
    /// PIA: the base URL of the server's own API (addKey, port forwarding).
    pub server_api: Option<String>,
}

#[derive(Debug, Default)]
struct BackendState {
    /// The options the resolution was made for; other options mean resolving again.
    options: Option<ProviderSettings>,
    resolved: Option<Resolved>,
    error: Option<String>,
}

#[derive(Default)]
struct State {
    lists: ListCache,
    backends: HashMap<String, BackendState>,
    /// PIA tokens by (token URL, user name).
    tokens: HashMap<(String, String), (String, Instant)>,
}

/// What the API shows of a provider backend.
#[derive(Debug, Clone)]
pub struct View {
    pub provider: ProviderKind,
    pub resolved: Option<Resolved>,
    pub error: Option<String>,
    pub list_fetched_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// One list's state after a refresh.
#[derive(Debug, Clone)]
pub struct ListStatus {
    pub provider: ProviderKind,
    pub servers: usize,
    pub fetched_at: Option<chrono::DateTime<chrono::Utc>>,
    pub error: Option<String>,
}

pub struct Providers {
    state: Mutex<State>,
    /// Built on first use: most servers have no provider backend, and building it loads and
    /// parses the system's CA certificates (memory and start-up time for nothing).
    http: std::sync::OnceLock<Result<reqwest::Client, String>>,
    /// Serialises resolution passes (the task's and the refresh endpoints').
    pass: tokio::sync::Mutex<()>,
    wake: tokio::sync::Notify,
    data_dir: PathBuf,
}

/// The provider backends of `cfg` with their parsed options (invalid ones are skipped:
/// validation reported them already).
fn provider_backends(cfg: &ServerConfig) -> Vec<(String, bool, ProviderSettings)> {
    cfg.backends
        .iter()
        .filter_map(|b| match b.kind {
            BackendType::Provider(kind) => {
                let o = ProviderSettings::from_value(kind, b.other.as_ref()?).ok()?;
                Some((b.name.clone(), b.enabled && o.enabled, o))
            }
            _ => None,
        })
        .collect()
}

fn list_key(o: &ProviderSettings) -> ListKey {
    (o.kind, o.api_url.clone())
}

/// The client for the providers' APIs. On a system without CA certificates (a minimal image
/// without `ca-certificates`) the platform verifier cannot be built: the server still starts,
/// with a client that trusts no certificate, so each HTTPS provider call fails with a TLS error
/// and the log says what to install.
fn api_client() -> Result<reqwest::Client, reqwest::Error> {
    switchyard_service::tls::use_ring_provider();
    let builder =
        || reqwest::Client::builder().user_agent(concat!("switchyard/", env!("CARGO_PKG_VERSION")));
    builder().build().or_else(|e| {
        tracing::error!(error = %e, "no usable CA certificates on this system: provider APIs over HTTPS will fail (install ca-certificates)");
        builder().tls_certs_only(Vec::new()).build()
    })
}

impl Providers {
    /// The client for the providers' APIs, built on first use.
    fn http(&self) -> Result<&reqwest::Client, ApiError> {
        self.http
            .get_or_init(|| api_client().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| ApiError::Refused(format!("the HTTP client for provider APIs: {e}")))
    }

    pub fn new(data_dir: PathBuf) -> Self {
        Providers {
            state: Mutex::new(State::default()),
            http: std::sync::OnceLock::new(),
            pass: tokio::sync::Mutex::new(()),
            wake: tokio::sync::Notify::new(),
            data_dir,
        }
    }

    /// Asks the background task to look at the configuration again (after a change).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// `cfg` with every resolved provider backend replaced by the backend it resolved to.
    /// Unresolved ones stay (the data plane holds them as unavailable).
    pub fn effective(&self, cfg: &ServerConfig) -> ServerConfig {
        let state = self.state.lock();
        let mut out = cfg.clone();
        for b in out.backends.iter_mut() {
            let BackendType::Provider(kind) = b.kind else {
                continue;
            };
            let Some(o) = b
                .other
                .as_ref()
                .and_then(|v| ProviderSettings::from_value(kind, v).ok())
            else {
                continue;
            };
            let Some(r) = state
                .backends
                .get(&b.name)
                .filter(|s| s.options.as_ref() == Some(&o))
                .and_then(|s| s.resolved.as_ref())
            else {
                continue;
            };
            // Name, counters and the backend's own health checks stay; the kind and settings
            // become those of the tunnel.
            b.kind = match r.protocol {
                VpnProtocol::Wireguard => BackendType::Wireguard,
                VpnProtocol::Openvpn => BackendType::Openvpn,
            };
            b.enabled = b.enabled && o.enabled;
            b.other = Some(r.settings.clone());
        }
        out
    }

    /// The provider state of backend `name`, if it is a provider backend.
    pub fn view(&self, cfg: &ServerConfig, name: &str) -> Option<View> {
        let b = cfg.backends.iter().find(|b| b.name == name)?;
        let BackendType::Provider(kind) = b.kind else {
            return None;
        };
        let state = self.state.lock();
        let o = b
            .other
            .as_ref()
            .and_then(|v| ProviderSettings::from_value(kind, v).ok());
        let s = state.backends.get(name);
        let current = s.filter(|s| s.options == o);
        let list = o.as_ref().and_then(|o| state.lists.last_good(&list_key(o)));
        let list_error = o.as_ref().and_then(|o| state.lists.error(&list_key(o)));
        let error = current
            .and_then(|s| s.error.clone())
            .or(list_error.map(|e| format!("server list: {e}")))
            .or_else(|| {
                current
                    .and_then(|s| s.resolved.as_ref())
                    .is_none()
                    .then(|| "not resolved yet".to_owned())
            });
        Some(View {
            provider: kind,
            resolved: current.and_then(|s| s.resolved.clone()),
            error,
            list_fetched_at: list.map(|l| l.fetched_at_utc),
        })
    }

    /// The list for `o`: the cached one while fresh (unless `force`), else fetched; a failed
    /// fetch falls back to the last good list and reports the error with it.
    async fn list(
        &self,
        o: &ProviderSettings,
        force: bool,
    ) -> (Option<Arc<Vec<Server>>>, Option<String>) {
        let key = list_key(o);
        if !force {
            let state = self.state.lock();
            if let Some(l) = state.lists.fresh(&key, Instant::now()) {
                // A failed refresh stays reported until a fetch succeeds.
                return (Some(l.servers), state.lists.error(&key));
            }
        }
        let fetched = match self.http() {
            Err(e) => Err(e),
            Ok(http) => match o.kind {
                ProviderKind::Nordvpn => nordvpn::fetch(http, &o.api_url).await,
                ProviderKind::Mullvad => mullvad::fetch(http, &o.api_url).await.map(|l| l.servers),
                ProviderKind::PrivateInternetAccess => {
                    pia::fetch(http, &pia::Endpoints::of(o).list).await
                }
                ProviderKind::Protonvpn => protonvpn::fetch(http, &o.api_url).await,
            },
        };
        let mut state = self.state.lock();
        match fetched {
            Ok(servers) => {
                tracing::info!(provider = %o.kind, servers = servers.len(), "provider server list fetched");
                (
                    Some(state.lists.store(key, servers, Instant::now()).servers),
                    None,
                )
            }
            Err(e) => {
                let last = state.lists.last_good(&key);
                tracing::warn!(provider = %o.kind, error = %e, kept_last_good = last.is_some(), "provider server list fetch failed");
                state.lists.failed(key, e.to_string());
                (last.map(|l| l.servers), Some(e.to_string()))
            }
        }
    }

    /// One pass over the configured provider backends: lists (refetched when expired or
    /// `force`d for `only`), selection, key and session calls. Returns whether any
    /// resolution changed (the snapshot must be recompiled).
    pub async fn resolve_all(
        &self,
        cfg: &ServerConfig,
        force: Option<Option<ProviderKind>>,
    ) -> bool {
        let _pass = self.pass.lock().await;
        let backends = provider_backends(cfg);
        let mut changed = false;
        {
            let mut state = self.state.lock();
            let before = state.backends.len();
            state
                .backends
                .retain(|name, _| backends.iter().any(|(n, _, _)| n == name));
            changed |= state.backends.len() != before;
        }
        let mut forced: Vec<ListKey> = Vec::new();
        for (name, enabled, o) in &backends {
            let force_this = match force {
                Some(None) => true,
                Some(Some(k)) => k == o.kind,
                None => false,
            };
            // A list is refetched once per pass even when several backends use it.
            let key = list_key(o);
            let force_list = force_this && !forced.contains(&key);
            if force_list {
                forced.push(key);
            }
            if !enabled && !force_list {
                continue;
            }
            let (list, list_error) = self.list(o, force_list).await;
            if !enabled {
                continue;
            }
            changed |= self.resolve_one(name, o, list, list_error).await;
        }
        changed |= self.renew_forwards().await;
        changed
    }

    async fn resolve_one(
        &self,
        name: &str,
        o: &ProviderSettings,
        list: Option<Arc<Vec<Server>>>,
        list_error: Option<String>,
    ) -> bool {
        let current = {
            let state = self.state.lock();
            state
                .backends
                .get(name)
                .filter(|s| s.options.as_ref() == Some(o))
                .and_then(|s| s.resolved.clone())
        };
        let set_error = |error: Option<String>| {
            let mut state = self.state.lock();
            let s = state.backends.entry(name.to_owned()).or_default();
            if s.options.as_ref() != Some(o) {
                s.options = Some(o.clone());
                s.resolved = None;
            }
            let changed = s.error != error;
            s.error = error;
            changed
        };
        let Some(list) = list else {
            let e = list_error.unwrap_or_else(|| "no server list".into());
            tracing::error!(backend = name, provider = %o.kind, error = %e, "provider backend unresolved");
            return set_error(Some(format!("server list: {e}")));
        };
        let keep = current.as_ref().map(|r| r.server.id.as_str());
        let server = match select::select(&list, o, keep) {
            Ok(s) => s.clone(),
            Err(e) => {
                tracing::error!(backend = name, provider = %o.kind, error = %e, "no provider server fits");
                let was_resolved = current.is_some();
                let mut state = self.state.lock();
                let s = state.backends.entry(name.to_owned()).or_default();
                s.options = Some(o.clone());
                s.resolved = None;
                s.error = Some(e.to_string());
                return was_resolved;
            }
        };
        if current.as_ref().is_some_and(|r| r.server == server) {
            // Same server: the tunnel stays. A list error is shown, not acted on.
            return set_error(
                list_error
                    .map(|e| format!("server list refresh failed (last good list in use): {e}")),
            );
        }
        match self.build(name, o, &server).await {
            Ok(resolved) => {
                tracing::info!(
                    backend = name, provider = %o.kind, server = %server.hostname,
                    protocol = o.protocol.name(), "provider backend resolved"
                );
                let mut state = self.state.lock();
                let s = state.backends.entry(name.to_owned()).or_default();
                s.options = Some(o.clone());
                s.resolved = Some(resolved);
                s.error = list_error
                    .map(|e| format!("server list refresh failed (last good list in use): {e}"));
                true
            }
            Err(e) => {
                tracing::error!(backend = name, provider = %o.kind, server = %server.hostname, error = %e, "provider backend could not be set up");
                set_error(Some(e))
            }
        }
    }

    /// The provider calls that turn a chosen server into tunnel settings.
    async fn build(
        &self,
        name: &str,
        o: &ProviderSettings,
        server: &Server,
    ) -> Result<Resolved, String> {
        let mut forward = None;
        let mut server_api = None;
        let settings = match o.protocol {
            VpnProtocol::Openvpn => resolve::openvpn(server, o)
                .ok_or_else(|| format!("server {} has no OpenVPN port", server.hostname))?,
            VpnProtocol::Wireguard => {
                let wg = server.wireguard.as_ref().ok_or_else(|| {
                    format!("server {} has no WireGuard endpoint", server.hostname)
                })?;
                match o.kind {
                    ProviderKind::Nordvpn => {
                        let key = wg.public_key.as_deref().ok_or_else(|| {
                            format!("server {} lists no WireGuard public_key", server.hostname)
                        })?;
                        let dns: Vec<String> =
                            nordvpn::DNS.iter().map(|d| (*d).to_owned()).collect();
                        resolve::wireguard(
                            wg.ip,
                            wg.port,
                            key,
                            o.private_key.as_deref().unwrap_or_default(),
                            &[nordvpn::NORDLYNX_ADDRESS.to_owned()],
                            &dns,
                        )
                    }
                    ProviderKind::Mullvad => {
                        let key = wg.public_key.as_deref().ok_or_else(|| {
                            format!("relay {} lists no public_key", server.hostname)
                        })?;
                        let device = self.mullvad_device(name, o).await?;
                        let mut address = vec![device.ipv4_address.clone()];
                        address.extend(device.ipv6_address.clone());
                        let dns: Vec<String> = wg.dns.iter().cloned().collect();
                        resolve::wireguard(wg.ip, wg.port, key, &device.private_key, &address, &dns)
                    }
                    ProviderKind::PrivateInternetAccess => {
                        let ep = pia::Endpoints::of(o);
                        let token = self.pia_token(o).await?;
                        let (private, public) = keys::generate()?;
                        let (client, base) = match &ep.server {
                            Some(base) => (
                                self.http().map_err(|e| e.to_string())?.clone(),
                                base.clone(),
                            ),
                            None => (
                                pia::server_client(
                                    &server.hostname,
                                    wg.ip,
                                    wg.port,
                                    o.server_ca.as_deref(),
                                )
                                .map_err(|e| e.to_string())?,
                                format!("https://{}:{}", server.hostname, wg.port),
                            ),
                        };
                        let added = match pia::add_key(&client, &base, &token, &public).await {
                            Ok(a) => a,
                            Err(e) => {
                                // A refused or expired token: the next attempt logs in again.
                                self.forget_pia_token(o);
                                return Err(format!("addKey: {e}"));
                            }
                        };
                        let ip: std::net::IpAddr = added.server_ip.parse().unwrap_or(wg.ip);
                        let settings = resolve::wireguard(
                            ip,
                            added.server_port,
                            &added.server_key,
                            &private,
                            &[format!("{}/32", added.peer_ip)],
                            &added.dns_servers,
                        );
                        if o.port_forwarding {
                            // The port-forwarding API lives on the server's tunnel address
                            // (server_vip:19999); with `api_url` it is the stand-in.
                            let pf_base = match &ep.server {
                                Some(base) => base.clone(),
                                None => format!(
                                    "https://{}:19999",
                                    added
                                        .server_vip
                                        .clone()
                                        .unwrap_or_else(|| added.server_ip.clone())
                                ),
                            };
                            let f = match pia::get_signature(&client, &pf_base, &token).await {
                                Ok(f) => f,
                                Err(e) => {
                                    self.forget_pia_token(o);
                                    return Err(format!("port forwarding (getSignature): {e}"));
                                }
                            };
                            pia::bind_port(&client, &pf_base, &f)
                                .await
                                .map_err(|e| format!("port forwarding (bindPort): {e}"))?;
                            tracing::info!(
                                backend = name,
                                port = f.port,
                                "PIA forwarded port bound"
                            );
                            forward = Some((f, Instant::now()));
                            server_api = Some(pf_base);
                        }
                        settings
                    }
                    ProviderKind::Protonvpn => {
                        return Err("protonvpn backends use openvpn".into());
                    }
                }
            }
        };
        Ok(Resolved {
            server: server.clone(),
            protocol: o.protocol,
            settings,
            resolved_at: chrono::Utc::now(),
            forward,
            server_api,
        })
    }

    /// The Mullvad device of backend `name`: from the key file, or a new key registered.
    async fn mullvad_device(
        &self,
        name: &str,
        o: &ProviderSettings,
    ) -> Result<keys::StoredDevice, String> {
        let account = o.account_id.as_deref().unwrap_or_default();
        let path = keys::device_file(&self.data_dir, name);
        if let Some(stored) = keys::load(&path, account) {
            tracing::info!(backend = name, file = %path.display(), "Mullvad key reused from the key file");
            return Ok(stored);
        }
        let (private, public) = keys::generate()?;
        let http = self.http().map_err(|e| e.to_string())?;
        let device = mullvad::register(http, &o.api_url, account, &public)
            .await
            .map_err(|e| format!("key registration: {e}"))?;
        let stored = keys::StoredDevice {
            account_sha256: keys::account_hash(account),
            private_key: private,
            public_key: public,
            ipv4_address: device.ipv4_address,
            ipv6_address: device.ipv6_address,
            device_id: device.id,
        };
        keys::store(&path, &stored)?;
        tracing::info!(backend = name, file = %path.display(), address = %stored.ipv4_address, "Mullvad key registered and stored");
        Ok(stored)
    }

    /// A PIA token younger than its lifetime, fetching a new one when needed.
    async fn pia_token(&self, o: &ProviderSettings) -> Result<String, String> {
        let ep = pia::Endpoints::of(o);
        let user = o.username.clone().unwrap_or_default();
        let key = (ep.token.clone(), user.clone());
        if let Some((t, at)) = self.state.lock().tokens.get(&key) {
            if at.elapsed() < pia::TOKEN_LIFETIME {
                return Ok(t.clone());
            }
        }
        let token = pia::token(
            self.http().map_err(|e| e.to_string())?,
            &ep.token,
            &user,
            o.password.as_deref().unwrap_or_default(),
        )
        .await
        .map_err(|e| format!("token: {e}"))?;
        self.state
            .lock()
            .tokens
            .insert(key, (token.clone(), Instant::now()));
        Ok(token)
    }

    fn forget_pia_token(&self, o: &ProviderSettings) {
        let key = (
            pia::Endpoints::of(o).token,
            o.username.clone().unwrap_or_default(),
        );
        self.state.lock().tokens.remove(&key);
    }

    /// Binds forwarded ports again every 15 minutes. A failed renewal is the backend's error.
    async fn renew_forwards(&self) -> bool {
        let due: Vec<(String, String, pia::Forward)> = {
            let state = self.state.lock();
            state
                .backends
                .iter()
                .filter_map(|(name, s)| {
                    let r = s.resolved.as_ref()?;
                    let (f, at) = r.forward.as_ref()?;
                    let base = r.server_api.clone()?;
                    (at.elapsed() >= pia::BIND_INTERVAL).then(|| (name.clone(), base, f.clone()))
                })
                .collect()
        };
        let mut changed = false;
        for (name, base, f) in due {
            let result = match self.http() {
                Ok(http) => pia::bind_port(http, &base, &f).await,
                Err(e) => Err(e),
            };
            let mut state = self.state.lock();
            let Some(s) = state.backends.get_mut(&name) else {
                continue;
            };
            match result {
                Ok(()) => {
                    if let Some(r) = s.resolved.as_mut() {
                        r.forward = Some((f, Instant::now()));
                    }
                    changed |= s.error.take().is_some();
                }
                Err(e) => {
                    tracing::warn!(backend = %name, error = %e, "renewing the forwarded port failed");
                    s.error = Some(format!("port forwarding renewal: {e}"));
                }
            }
        }
        changed
    }

    /// Refetches the lists of `only` (or all providers in use) now and resolves again.
    /// Returns the state of every list the configuration uses.
    pub async fn refresh(
        &self,
        cfg: &ServerConfig,
        only: Option<ProviderKind>,
    ) -> (bool, Vec<ListStatus>) {
        let changed = self.resolve_all(cfg, Some(only)).await;
        let keys: Vec<ListKey> = {
            let mut k: Vec<ListKey> = provider_backends(cfg)
                .iter()
                .map(|(_, _, o)| list_key(o))
                .filter(|k| only.is_none_or(|p| p == k.0))
                .collect();
            k.sort();
            k.dedup();
            k
        };
        let state = self.state.lock();
        let statuses = keys
            .iter()
            .map(|k| {
                let list = state.lists.last_good(k);
                ListStatus {
                    provider: k.0,
                    servers: list.as_ref().map_or(0, |l| l.servers.len()),
                    fetched_at: list.map(|l| l.fetched_at_utc),
                    error: state.lists.error(k),
                }
            })
            .collect();
        (changed, statuses)
    }

    /// Whether `cfg` has a backend of `kind`.
    pub fn in_use(cfg: &ServerConfig, kind: ProviderKind) -> bool {
        provider_backends(cfg)
            .iter()
            .any(|(_, _, o)| o.kind == kind)
    }
}

/// The background task: resolves after start and changes, refetches expired lists, renews
/// forwarded ports; republishes the snapshot when a resolution changed.
pub async fn run(state: Arc<ServerState>) {
    loop {
        let cfg = state.config.load_full();
        if state.providers.resolve_all(&cfg, None).await {
            republish(&state).await;
        }
        tokio::select! {
            _ = state.providers.wake.notified() => {}
            _ = tokio::time::sleep(TICK) => {}
        }
    }
}

/// Recompiles the snapshot from the running configuration (new resolutions take effect).
pub async fn republish(state: &ServerState) {
    if let Err(e) = crate::config_store::republish(state).await {
        tracing::error!(error = %e, "publishing resolved provider backends failed");
    }
}

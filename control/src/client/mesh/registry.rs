//! The client side of the server's mesh registry (`/api/v1/mesh/networks/{id}/...`):
//! registration, heartbeats, the peer list, leaving, and the request that opens the
//! network's event WebSocket. Authenticates with a Bearer credential: `mesh.discovery.token`
//! (the server's admin token, for an admin-run peer) when configured; otherwise the peer's own
//! credential, which the first registration (with `mesh.discovery.enrollment_key`) returns and
//! which is kept in the data directory.
//!
//! TLS: an `https://` registry is checked by one rustls configuration shared by the REST calls
//! and the event stream (wss://): the certificate pinned by `mesh.discovery.fingerprint` (the
//! QUIC transport's [`PinnedCert`]: its SHA-256 decides, no CA), else the system's CA roots
//! (rustls-platform-verifier, what reqwest uses by default).

use parking_lot::RwLock;
use reqwest::StatusCode;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use switchyard_api::{
    MeshEndpoint, MeshHeartbeat, MeshPeer, MeshPeerList, MeshPeerRegistration, MeshPeerUpdate,
    MeshRegisterRequest, MeshRegisterResponse,
};
use switchyard_dataplane::quic::tls::{provider, PinnedCert};

/// Longest wait for one registry call.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("the registry at {url} cannot be reached: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("the registry answered {status} to {what}: {message}")]
    Refused {
        what: &'static str,
        status: u16,
        message: String,
    },
    #[error("the registry's answer to {what} is not understood: {reason}")]
    Invalid { what: &'static str, reason: String },
    #[error("the registry at {url} presented a certificate this peer does not trust: {reason}")]
    Untrusted { url: String, reason: String },
    #[error("TLS for the registry: {0}")]
    Tls(String),
}

/// Where the CA roots of an unpinned `https://` registry come from (rustls-platform-verifier
/// on Linux: rustls-native-certs, which reads these variables before the system's bundle).
const SYSTEM_ROOTS: &str = "SSL_CERT_FILE / SSL_CERT_DIR when set, else the system's CA bundle";

/// Why the registry's certificate was refused, in words that say what to change; `None` when
/// `e` (a connection error with its sources) is not a certificate refusal. The verifier's
/// error sits inside `io::Error`s (tokio-rustls's, and reqwest's around it), whose `source()`
/// skips what they wrap.
fn untrusted_certificate(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    use rustls::CertificateError as C;
    let mut next = Some(e);
    let refusal = loop {
        let err = next?;
        if let Some(rustls::Error::InvalidCertificate(c)) = err.downcast_ref::<rustls::Error>() {
            break c;
        }
        next = match err.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => err.source(),
        };
    };
    Some(match refusal {
        C::UnknownIssuer => format!(
            "it is not issued by a CA among this peer's roots ({SYSTEM_ROOTS}): add the CA \
             there, or pin the certificate with mesh.discovery.fingerprint"
        ),
        C::NotValidForName | C::NotValidForNameContext { .. } => format!(
            "{refusal}: the host of mesh.discovery.server must be one of the certificate's names"
        ),
        other => other.to_string(),
    })
}

/// What a heartbeat found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heartbeat {
    /// 204: lease renewed.
    Renewed,
    /// 409: the lease is gone; register again.
    NoLease,
    /// 404: the registry does not know the network or this peer.
    Unknown,
}

/// What the peer can present to the registry (`mesh.discovery`).
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// `mesh.discovery.token`: the admin's token, for every call.
    pub admin: Option<String>,
    /// `mesh.discovery.enrollment_key`: for a registration without a credential of our own.
    pub enrollment_key: Option<String>,
    /// Where the peer's own credential is kept; `None`: in memory only.
    pub token_file: Option<PathBuf>,
}

/// The network's event stream (ws:// or wss://).
pub type EventStream = tokio_tungstenite::WebSocketStream<Box<dyn EventIo>>;

/// The connection under [`EventStream`]: plain TCP or TLS over it.
pub trait EventIo: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> EventIo for T {}

/// The TLS of every registry connection: the pinned certificate, else the system's CA roots.
fn tls_config(pin: Option<[u8; 32]>) -> Result<Arc<rustls::ClientConfig>, RegistryError> {
    let tls_error = |e: rustls::Error| RegistryError::Tls(e.to_string());
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?
        .dangerous();
    let builder = match pin {
        Some(pin) => builder.with_custom_certificate_verifier(Arc::new(PinnedCert::new(pin))),
        // never unchecked: without a pin, the system's roots and the host name decide
        None => builder.with_custom_certificate_verifier(Arc::new(
            rustls_platform_verifier::Verifier::new(provider).map_err(|e| {
                RegistryError::Tls(format!(
                    "the CA roots ({SYSTEM_ROOTS}) cannot check an https registry: {e}; \
                     install CA certificates or pin the registry with mesh.discovery.fingerprint"
                ))
            })?,
        )),
    };
    Ok(Arc::new(builder.with_no_client_auth()))
}

#[derive(Clone)]
pub struct RegistryClient {
    http: reqwest::Client,
    /// What [`Self::http`] checks an https registry with; the event stream uses it too.
    tls: Arc<rustls::ClientConfig>,
    /// `http://host:port`, no trailing slash.
    base: String,
    creds: Credentials,
    /// The peer's own credential (from the token file, then from registrations).
    peer_token: Arc<RwLock<Option<String>>>,
    network: String,
}

/// `mesh.discovery.server` as a base URL: `host:port` is read as `http://host:port`.
pub fn base_url(server: &str) -> Option<String> {
    let s = server.trim().trim_end_matches('/');
    if s.is_empty() {
        return None;
    }
    if s.starts_with("http://") || s.starts_with("https://") {
        Some(s.to_owned())
    } else {
        Some(format!("http://{s}"))
    }
}

impl RegistryClient {
    /// `pin`: `mesh.discovery.fingerprint`, decoded.
    pub fn new(
        base: String,
        creds: Credentials,
        network: String,
        pin: Option<[u8; 32]>,
    ) -> Result<Self, RegistryError> {
        let tls = tls_config(pin)?;
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .tls_backend_preconfigured((*tls).clone())
            .build()
            .map_err(|e| RegistryError::Tls(crate::providers::http::with_sources(&e)))?;
        let saved = creds
            .token_file
            .as_deref()
            .and_then(super::identity::saved_peer_token);
        Ok(Self {
            http,
            tls,
            base,
            creds,
            peer_token: Arc::new(RwLock::new(saved)),
            network,
        })
    }

    /// The Bearer credential of every call but a first registration: the admin token, else
    /// the peer's own.
    fn bearer(&self) -> Option<String> {
        self.creds
            .admin
            .clone()
            .or_else(|| self.peer_token.read().clone())
    }

    /// Keeps the credential a registration returned (in the token file when there is one).
    fn keep_peer_token(&self, token: &str) {
        if self.creds.admin.is_some() || self.peer_token.read().as_deref() == Some(token) {
            return;
        }
        if let Some(path) = &self.creds.token_file {
            match super::identity::save_peer_token(path, token) {
                Ok(()) => tracing::info!(path = %path.display(), "mesh registry credential saved"),
                Err(e) => tracing::warn!(path = %path.display(), error = %e,
                    "cannot save the mesh registry credential: it lasts until the client stops"),
            }
        }
        *self.peer_token.write() = Some(token.to_owned());
    }

    fn url(&self, tail: &str) -> String {
        format!("{}/api/v1/mesh/networks/{}{tail}", self.base, self.network)
    }

    fn request(&self, method: reqwest::Method, tail: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, self.url(tail));
        match self.bearer() {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    async fn send(
        &self,
        what: &'static str,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, RegistryError> {
        let resp = req
            .send()
            .await
            .map_err(|e| match untrusted_certificate(&e) {
                Some(reason) => RegistryError::Untrusted {
                    url: self.base.clone(),
                    reason,
                },
                None => RegistryError::Unreachable {
                    url: self.base.clone(),
                    // the source chain names the cause (refused, TLS: a certificate not matching
                    // the pin)
                    reason: crate::providers::http::with_sources(&e.without_url()),
                },
            })?;
        tracing::trace!(what, status = %resp.status(), "registry call");
        Ok(resp)
    }

    async fn refused(what: &'static str, resp: reqwest::Response) -> RegistryError {
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap_or_default();
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_owned))
            .unwrap_or(body);
        RegistryError::Refused {
            what,
            status,
            message,
        }
    }

    pub async fn register(
        &self,
        peer: MeshPeerRegistration,
    ) -> Result<MeshRegisterResponse, RegistryError> {
        let what = "the registration";
        let body = MeshRegisterRequest {
            network_id: Some(self.network.clone()),
            peer,
        };
        let post = |bearer: Option<&str>| {
            let req = self.http.post(self.url("/peers")).json(&body);
            match bearer {
                Some(t) => req.bearer_auth(t),
                None => req,
            }
        };
        let own = self.bearer();
        let key = self.creds.enrollment_key.as_deref();
        let mut resp = self.send(what, post(own.as_deref().or(key))).await?;
        let refused = matches!(
            resp.status(),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        );
        if refused && own.is_some() && self.creds.admin.is_none() && key.is_some() {
            // Our saved credential is unknown (the peer was deleted or forgotten) or belongs
            // elsewhere (another network): enroll again with the key (a single-use key that
            // was used is refused too).
            tracing::warn!(
                "the registry refused this peer's credential; registering with the enrollment key"
            );
            resp = self.send(what, post(key)).await?;
        }
        if !resp.status().is_success() {
            return Err(Self::refused(what, resp).await);
        }
        let answer: MeshRegisterResponse =
            resp.json().await.map_err(|e| RegistryError::Invalid {
                what,
                reason: e.to_string(),
            })?;
        if let Some(token) = &answer.peer_token {
            self.keep_peer_token(token);
        }
        Ok(answer)
    }

    pub async fn heartbeat(
        &self,
        peer_id: &str,
        body: &MeshHeartbeat,
    ) -> Result<Heartbeat, RegistryError> {
        let what = "a heartbeat";
        let tail = format!("/peers/{peer_id}/heartbeat");
        let resp = self
            .send(what, self.request(reqwest::Method::POST, &tail).json(body))
            .await?;
        match resp.status() {
            s if s.is_success() => Ok(Heartbeat::Renewed),
            StatusCode::CONFLICT => Ok(Heartbeat::NoLease),
            StatusCode::NOT_FOUND => Ok(Heartbeat::Unknown),
            _ => Err(Self::refused(what, resp).await),
        }
    }

    /// Every peer holding a lease (this one included).
    pub async fn peers(&self) -> Result<Vec<MeshPeer>, RegistryError> {
        let what = "the peer list";
        let resp = self
            .send(what, self.request(reqwest::Method::GET, "/peers"))
            .await?;
        if !resp.status().is_success() {
            return Err(Self::refused(what, resp).await);
        }
        resp.json::<MeshPeerList>()
            .await
            .map(|l| l.peers)
            .map_err(|e| RegistryError::Invalid {
                what,
                reason: e.to_string(),
            })
    }

    pub async fn update_endpoints(
        &self,
        peer_id: &str,
        endpoints: Vec<MeshEndpoint>,
    ) -> Result<(), RegistryError> {
        let body = MeshPeerUpdate {
            endpoints: Some(endpoints),
            metadata: None,
        };
        self.update_peer(peer_id, body).await
    }

    /// Replaces this peer's endpoints and/or metadata (`PATCH …/peers/{id}`).
    pub async fn update_peer(
        &self,
        peer_id: &str,
        body: MeshPeerUpdate,
    ) -> Result<(), RegistryError> {
        let what = "the peer update";
        let tail = format!("/peers/{peer_id}");
        let resp = self
            .send(
                what,
                self.request(reqwest::Method::PATCH, &tail).json(&body),
            )
            .await?;
        if !resp.status().is_success() {
            return Err(Self::refused(what, resp).await);
        }
        Ok(())
    }

    /// Leaves the network (the others see `peer.left` at once instead of at lease expiry).
    pub async fn leave(&self, peer_id: &str) -> Result<(), RegistryError> {
        let what = "leaving";
        let tail = format!("/peers/{peer_id}");
        let resp = self
            .send(what, self.request(reqwest::Method::DELETE, &tail))
            .await?;
        if !resp.status().is_success() && resp.status() != StatusCode::NOT_FOUND {
            return Err(Self::refused(what, resp).await);
        }
        Ok(())
    }

    /// The upgrade request of the network's event stream.
    pub fn events_request(
        &self,
    ) -> Result<tokio_tungstenite::tungstenite::handshake::client::Request, String> {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
        let url = self.url("/events");
        let url = url
            .strip_prefix("http")
            .map(|rest| format!("ws{rest}"))
            .unwrap_or(url);
        let mut req = url.into_client_request().map_err(|e| e.to_string())?;
        if let Some(t) = self.bearer() {
            let value = format!("Bearer {t}")
                .parse()
                .map_err(|_| "token is not a header value".to_string())?;
            req.headers_mut().insert("authorization", value);
        }
        Ok(req)
    }

    /// Opens the network's event stream: wss:// (checked like the REST calls) for an https
    /// registry, ws:// for an http one; connection and handshakes within [`CALL_TIMEOUT`].
    pub async fn open_events(&self) -> Result<EventStream, String> {
        tokio::time::timeout(CALL_TIMEOUT, self.connect_events())
            .await
            .map_err(|_| "the event stream did not open in time".to_string())?
    }

    async fn connect_events(&self) -> Result<EventStream, String> {
        let req = self.events_request()?;
        let uri = req.uri().clone();
        let host = uri
            .host()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_owned())
            .ok_or_else(|| format!("{uri} has no host"))?;
        let secure = uri.scheme_str() == Some("wss");
        let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("connecting to {host}:{port}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn EventIo> = if secure {
            let name = rustls::pki_types::ServerName::try_from(host.clone())
                .map_err(|e| format!("{host}: {e}"))?;
            let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| match untrusted_certificate(&e) {
                    Some(reason) => RegistryError::Untrusted {
                        url: self.base.clone(),
                        reason,
                    }
                    .to_string(),
                    None => format!(
                        "TLS with {host}:{port}: {}",
                        crate::providers::http::with_sources(&e)
                    ),
                })?;
            Box::new(tls)
        } else {
            Box::new(tcp)
        };
        let (ws, _) = tokio_tungstenite::client_async(req, io)
            .await
            .map_err(|e| e.to_string())?;
        Ok(ws)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TLS server presenting a self-signed certificate for "switchyard" (kept in `dir`).
    fn self_signed_server(
        dir: &std::path::Path,
    ) -> (
        switchyard_dataplane::quic::tls::ServerIdentity,
        Arc<rustls::ServerConfig>,
    ) {
        let identity =
            switchyard_dataplane::quic::tls::server_identity(None, dir).expect("identity");
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(identity.chain.clone(), identity.key.clone_key())
            .expect("server config");
        (identity, Arc::new(server))
    }

    /// A TLS handshake in memory between `client` and `server` (named "switchyard"): the
    /// client's verdict.
    fn handshake(
        client: Arc<rustls::ClientConfig>,
        server: Arc<rustls::ServerConfig>,
    ) -> Result<(), rustls::Error> {
        let name = rustls::pki_types::ServerName::try_from("switchyard").expect("name");
        let mut c = rustls::ClientConnection::new(client, name)?;
        let mut s = rustls::ServerConnection::new(server)?;
        for _ in 0..10 {
            if !c.is_handshaking() {
                return Ok(());
            }
            let mut wire = Vec::new();
            c.write_tls(&mut wire).expect("client writes");
            if !wire.is_empty() {
                s.read_tls(&mut wire.as_slice()).expect("server reads");
                s.process_new_packets()?;
            }
            wire.clear();
            s.write_tls(&mut wire).expect("server writes");
            if !wire.is_empty() {
                c.read_tls(&mut wire.as_slice()).expect("client reads");
                c.process_new_packets()?;
            }
        }
        Err(rustls::Error::HandshakeNotComplete)
    }

    /// A registry call and the event stream to an https registry whose certificate no CA root
    /// vouches for both fail as [`RegistryError::Untrusted`] (reqwest's and tokio-rustls'
    /// wrapping of the verifier's error both seen through).
    #[tokio::test]
    async fn an_untrusted_registry_is_named_as_such_by_calls_and_the_event_stream() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, server) = self_signed_server(dir.path());
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let port = listener.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let _ = acceptor.accept(tcp).await;
            }
        });
        let client = RegistryClient::new(
            format!("https://localhost:{port}"),
            Credentials::default(),
            "office".into(),
            None,
        )
        .expect("client");
        let err = client
            .peers()
            .await
            .expect_err("an untrusted registry answered");
        assert!(matches!(err, RegistryError::Untrusted { .. }), "{err}");
        let err = client.open_events().await.err().expect("events refused");
        assert!(err.contains("does not trust"), "{err}");
    }

    /// Without `mesh.discovery.fingerprint` a certificate no CA root vouches for is refused
    /// (the default never skips verification); pinned, the same certificate passes. The
    /// refusal reads as an untrusted certificate with what to change, also from inside the
    /// `io::Error` a TLS stream returns.
    #[test]
    fn an_unpinned_registry_certificate_must_come_from_a_ca_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (identity, server) = self_signed_server(dir.path());
        let unpinned = tls_config(None).expect("the system's CA roots");
        let refused = handshake(unpinned, server.clone()).expect_err("an unknown issuer passed");
        assert_eq!(
            refused,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)
        );
        let pinned = tls_config(Some(identity.fingerprint)).expect("config");
        assert_eq!(handshake(pinned, server), Ok(()));

        // as reqwest returns it: tokio-rustls' io::Error inside another
        let as_stream_error = std::io::Error::other(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            refused,
        ));
        let reason = untrusted_certificate(&as_stream_error).expect("a certificate refusal");
        assert!(
            reason.contains("SSL_CERT_FILE") && reason.contains("mesh.discovery.fingerprint"),
            "{reason}"
        );
        let wrong_name = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName),
        );
        assert!(untrusted_certificate(&wrong_name)
            .is_some_and(|r| r.contains("host of mesh.discovery.server")));
        // not a certificate refusal: a wrong pin (its own words), a refused connection
        let pin = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::General("fingerprint does not match".into()),
        );
        assert_eq!(untrusted_certificate(&pin), None);
        let refused_tcp = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(untrusted_certificate(&refused_tcp), None);
    }

    #[test]
    fn the_discovery_server_is_a_url_or_host_and_port() {
        assert_eq!(
            base_url("10.0.0.1:7082").as_deref(),
            Some("http://10.0.0.1:7082")
        );
        assert_eq!(
            base_url("https://reg.example/").as_deref(),
            Some("https://reg.example")
        );
        assert_eq!(base_url("  "), None);
        let c = RegistryClient::new(
            "https://reg.example".into(),
            Credentials {
                admin: Some("t".into()),
                ..Credentials::default()
            },
            "office".into(),
            None,
        )
        .expect("client");
        let req = c.events_request().expect("request");
        assert_eq!(
            req.uri().to_string(),
            "wss://reg.example/api/v1/mesh/networks/office/events"
        );
        assert_eq!(req.headers()["authorization"], "Bearer t");
    }
}

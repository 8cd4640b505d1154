//! The client side of the server's mesh registry (`/api/v1/mesh/networks/{id}/...`):
//! registration, heartbeats, the peer list, leaving, and the request that opens the
//! network's event WebSocket. Authenticates with `mesh.discovery.token` as a Bearer token
//! (the server API's token) when one is configured.

use reqwest::StatusCode;
use std::time::Duration;
use switchyard_api::{
    MeshEndpoint, MeshHeartbeat, MeshPeer, MeshPeerList, MeshPeerRegistration, MeshPeerUpdate,
    MeshRegisterRequest, MeshRegisterResponse,
};

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

#[derive(Clone)]
pub struct RegistryClient {
    http: reqwest::Client,
    /// `http://host:port`, no trailing slash.
    base: String,
    token: Option<String>,
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
    pub fn new(base: String, token: Option<String>, network: String) -> Self {
        switchyard_service::tls::use_ring_provider();
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .build()
            .unwrap_or_default();
        Self {
            http,
            base,
            token,
            network,
        }
    }

    fn url(&self, tail: &str) -> String {
        format!("{}/api/v1/mesh/networks/{}{tail}", self.base, self.network)
    }

    fn request(&self, method: reqwest::Method, tail: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, self.url(tail));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    async fn send(
        &self,
        what: &'static str,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, RegistryError> {
        let resp = req.send().await.map_err(|e| RegistryError::Unreachable {
            url: self.base.clone(),
            reason: e.to_string(),
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
        let resp = self
            .send(
                what,
                self.request(reqwest::Method::POST, "/peers").json(&body),
            )
            .await?;
        if !resp.status().is_success() {
            return Err(Self::refused(what, resp).await);
        }
        resp.json().await.map_err(|e| RegistryError::Invalid {
            what,
            reason: e.to_string(),
        })
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
        let what = "the endpoint update";
        let body = MeshPeerUpdate {
            endpoints: Some(endpoints),
            metadata: None,
        };
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
        if let Some(t) = &self.token {
            let value = format!("Bearer {t}")
                .parse()
                .map_err(|_| "token is not a header value".to_string())?;
            req.headers_mut().insert("authorization", value);
        }
        Ok(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            Some("t".into()),
            "office".into(),
        );
        let req = c.events_request().expect("request");
        assert_eq!(
            req.uri().to_string(),
            "wss://reg.example/api/v1/mesh/networks/office/events"
        );
        assert_eq!(req.headers()["authorization"], "Bearer t");
    }
}

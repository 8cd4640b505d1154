//! TLS for the management API listener (`api.tls.cert`, `api.tls.key`): rustls with the
//! ring provider, TLS 1.2 and 1.3, ALPN `http/1.1` (the WebSocket upgrade is HTTP/1.1).
//! Kernel TLS offload is not used: the API carries little traffic, and the kernels this runs on
//! often lack it. Connections are served by hyper-util with upgrades enabled, each request
//! carrying the peer address like `axum::serve` does.

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

/// A handshake that takes longer than this is abandoned.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("api.tls.cert {path}: {reason}")]
    Cert { path: PathBuf, reason: String },
    #[error("api.tls.key {path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("api.tls: the certificate and key do not make a usable TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Loads the PEM certificate chain and key and builds the acceptor.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    use switchyard_dataplane::pem::{load_pem_pair, PemPairError};
    let (chain, key_der) = load_pem_pair(cert, key).map_err(|e| match e {
        PemPairError::Cert(reason) => TlsError::Cert {
            path: cert.to_owned(),
            reason,
        },
        PemPairError::Key(reason) => TlsError::Key {
            path: key.to_owned(),
            reason,
        },
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `app` over TLS on `listener` until the process ends.
pub async fn serve(listener: TcpListener, acceptor: TlsAcceptor, app: Router) {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "API listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(client = %peer, error = %e, "API TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(client = %peer, "API TLS handshake timed out");
                    return;
                }
            };
            let svc = tower::ServiceExt::map_request(
                app,
                move |mut req: axum::http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ConnectInfo(peer));
                    req
                },
            );
            let result = Builder::new(TokioExecutor::new())
                .serve_connection_with_upgrades(TokioIo::new(tls), TowerToHyperService::new(svc))
                .await;
            if let Err(e) = result {
                tracing::debug!(client = %peer, error = %e, "API TLS connection ended with an error");
            }
        });
    }
}

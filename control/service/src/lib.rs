//! What every `switchyard` service command shares at its edges: log set-up from the `logging`
//! section and the runtime they run on, binding its listener (`:PORT` = every interface), and
//! waiting for SIGINT/SIGTERM.
#![forbid(unsafe_code)]

pub mod logging;
pub mod tls;

pub use logging::{
    init as init_logging, init_with_layer as init_logging_with_layer, ExtraLayer, LoggingError,
};

/// Why a service command could not start its runtime.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Logging(#[from] LoggingError),
    #[error("building the tokio runtime: {0}")]
    Runtime(std::io::Error),
}

/// Sets up logging from `logging` (plus `extra_directives`), builds a multi-thread tokio runtime
/// whose threads are named `name`, and runs `serve` on it to the end.
pub fn run<T>(
    name: &str,
    logging: &switchyard_config::LoggingConfig,
    extra_directives: &str,
    serve: impl std::future::Future<Output = T>,
) -> Result<T, StartError> {
    init_logging(logging, extra_directives)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(name)
        .build()
        .map_err(StartError::Runtime)?;
    Ok(rt.block_on(serve))
}

#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("listen address {value:?}: {reason}")]
    Address { value: String, reason: String },
    #[error("cannot listen on {addr}: {source}")]
    Io {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("no address to listen on for {0:?}")]
    NoAddress(String),
}

/// Binds `listen` (e.g. `:3000`, `127.0.0.1:15151`), trying each candidate address in turn.
pub async fn bind(listen: &str) -> Result<tokio::net::TcpListener, BindError> {
    let addr = switchyard_config::parse_listen(listen).map_err(|e| BindError::Address {
        value: listen.to_owned(),
        reason: e.reason,
    })?;
    let mut last = None;
    for a in addr.socket_addrs_all_interfaces() {
        match tokio::net::TcpListener::bind(a).await {
            Ok(l) => return Ok(l),
            Err(source) => last = Some(BindError::Io { addr: a, source }),
        }
    }
    Err(last.unwrap_or_else(|| BindError::NoAddress(listen.to_owned())))
}

/// Resolves on SIGINT or SIGTERM (for graceful shutdown).
pub async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!("cannot watch SIGTERM: {e}");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
    tracing::info!("shutting down");
}

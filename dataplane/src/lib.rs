//! The glommio thread-per-core data plane of `switchyard server`.
//!
//! One pinned glommio `LocalExecutor` per core accepts on its own `SO_REUSEPORT` listeners and
//! keeps each connection from accept to close. It serves the HTTP/1.1 forward proxy, CONNECT
//! tunnels and SOCKS5, routes each destination through a compiled route table to a backend, and
//! talks to the tokio control plane only through shared memory: it reads an immutable
//! [`snapshot::Snapshot`] published with `arc_swap`, bumps per-core [`counters`], and pushes
//! [`events`] into a bounded lock-free queue that drops (and counts) when full. Blocking work
//! (DNS resolution, bcrypt) is handed to the control plane's tokio runtime and awaited, so a core
//! never stalls. Protocol parsing lives in the runtime-free `switchyard-proto` crate.

pub mod access_control;
pub mod backend_health;
pub mod backend_stream;
mod balance;
pub mod buffer_pool;
pub mod cache;
pub mod commands;
pub mod connector;
pub mod core_health;
pub mod cores;
pub mod counters;
pub mod credentials;
pub mod engine;
pub mod error;
pub mod events;
mod http_proxy;
pub mod live;
pub mod mesh;
pub mod offload;
pub mod openvpn;
mod origin_pool;
pub mod pem;
mod proxied;
pub mod proxy_auth;
pub mod quic;
pub mod rate_limit;
pub mod resolver;
pub mod snapshot;
mod socks5_server;
mod splice;
mod sys;
pub mod text_pages;
mod trace;
pub mod tun;
mod tunnel;
pub mod wireguard;

pub use engine::{Dataplane, DataplaneOptions};
pub use error::DataplaneError;
pub use snapshot::{Snapshot, SnapshotHandle};

//! `/api/v1/connections` and `/api/v1/connections/clients`: live data from the data plane.

use crate::server::ServerState;
use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use switchyard_api::{ClientList, ConnectedClient, Connection, ConnectionList};

fn client_ip(addr: &std::net::SocketAddr) -> String {
    switchyard_dataplane::access_control::canonical(addr.ip()).to_string()
}

#[utoipa::path(get, path = "/api/v1/connections", tag = "connections", responses((status = 200, body = ConnectionList)))]
pub async fn list(State(state): State<Arc<ServerState>>) -> Json<ConnectionList> {
    let connections: Vec<Connection> = state
        .live
        .list()
        .iter()
        .map(|c| Connection {
            id: format!("{:x}", c.id),
            client_ip: client_ip(&c.client),
            client_port: c.client.port().to_string(),
            host: c.host.clone(),
            backend: c.backend.clone(),
            protocol: c.protocol.as_str().into(),
            start_time: DateTime::<Utc>::from(c.started),
            bytes_sent: c.bytes_sent.load(Relaxed),
            bytes_recv: c.bytes_recv.load(Relaxed),
        })
        .collect();
    Json(ConnectionList {
        count: connections.len() as u64,
        connections,
        time: Utc::now(),
    })
}

#[utoipa::path(get, path = "/api/v1/connections/clients", tag = "connections", responses((status = 200, body = ClientList)))]
pub async fn clients(State(state): State<Arc<ServerState>>) -> Json<ClientList> {
    let mut by_ip: BTreeMap<String, ConnectedClient> = BTreeMap::new();
    for c in state.live.list() {
        let ip = client_ip(&c.client);
        let started = DateTime::<Utc>::from(c.started);
        let e = by_ip.entry(ip.clone()).or_insert_with(|| ConnectedClient {
            client_ip: ip,
            connections: 0,
            bytes_sent: 0,
            bytes_recv: 0,
            first_seen: started,
        });
        e.connections += 1;
        e.bytes_sent += c.bytes_sent.load(Relaxed);
        e.bytes_recv += c.bytes_recv.load(Relaxed);
        e.first_seen = e.first_seen.min(started);
    }
    let clients: Vec<ConnectedClient> = by_ip.into_values().collect();
    Json(ClientList {
        count: clients.len() as u64,
        clients,
        time: Utc::now(),
    })
}

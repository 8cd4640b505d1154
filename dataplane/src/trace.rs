//! What one proxied request did, for the counters and (when `api.enable_request_log` is on) the
//! request log. Filled in as the request proceeds and emitted once when it ends.

use crate::engine::CoreContext;
use crate::events::{Protocol, RequestRecord};
use crate::snapshot::Snapshot;
use std::cell::Cell;
use std::net::IpAddr;
use std::time::{Instant, SystemTime};

pub(crate) struct Trace {
    /// When the request began, for the request log; `None` when made with
    /// [`Trace::unlogged`] (no clock read for a record nobody will read).
    started: Option<(Instant, SystemTime)>,
    pub protocol: Protocol,
    pub method: String,
    /// `host:port`
    pub host: String,
    pub path: String,
    pub url: String,
    pub user_agent: String,
    pub username: String,
    pub backend: String,
    /// HTTP status answered (SOCKS5: 200 on success, the HTTP equivalent of the failure).
    pub status: u16,
    pub error: String,
    /// Bytes from the client.
    pub up: Cell<u64>,
    /// Bytes to the client.
    pub down: Cell<u64>,
}

impl Trace {
    pub fn new(protocol: Protocol, method: &str) -> Self {
        Self {
            started: Some((Instant::now(), SystemTime::now())),
            ..Self::unlogged(protocol)
        }
        .with_method(method)
    }

    /// A trace for the counters only: no clock read, no strings. A record made from it (the
    /// request log switched on while the request ran) has the finish time and no duration.
    pub fn unlogged(protocol: Protocol) -> Self {
        Self {
            started: None,
            protocol,
            method: String::new(),
            host: String::new(),
            path: String::new(),
            url: String::new(),
            user_agent: String::new(),
            username: String::new(),
            backend: String::new(),
            status: 0,
            error: String::new(),
            up: Cell::new(0),
            down: Cell::new(0),
        }
    }

    fn with_method(mut self, method: &str) -> Self {
        self.method = method.to_owned();
        self
    }

    pub fn fail(&mut self, status: u16, error: impl Into<String>) {
        self.status = status;
        self.error = error.into();
    }

    /// Counts the request and, when the request log is on, queues its record.
    pub fn finish(self, ctx: &CoreContext, snapshot: &Snapshot, client_ip: IpAddr) {
        ctx.counters
            .core(ctx.core)
            .request(self.protocol, self.status);
        if !snapshot.request_log {
            return;
        }
        // SOCKS5 and QUIC leave the url to be its destination label, copied only here
        let url =
            if self.url.is_empty() && matches!(self.protocol, Protocol::Socks5 | Protocol::Quic) {
                self.host.clone()
            } else {
                self.url
            };
        let (timestamp, duration_ms) = match self.started {
            Some((started, at)) => (at, started.elapsed().as_millis() as u64),
            None => (SystemTime::now(), 0),
        };
        ctx.requests.push_from(
            ctx.core,
            RequestRecord {
                timestamp,
                duration_ms,
                method: self.method,
                host: self.host,
                path: self.path,
                url,
                user_agent: self.user_agent,
                client_ip,
                username: self.username,
                backend: self.backend,
                status_code: self.status,
                bytes_sent: self.down.get(),
                bytes_recv: self.up.get(),
                error: self.error,
                protocol: self.protocol,
            },
        );
    }
}

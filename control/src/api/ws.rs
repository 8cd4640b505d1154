//! `GET /api/v1/ws`: the server's event stream (and, through [`admit`] and
//! [`Admitted::serve`], the mesh registry's per-network event streams, under the same rules).
//! Each client gets every hub envelope (`{type, timestamp, data}`) as a text message; the text
//! `ping` is answered with the text `pong`.
//!
//! - The upgrade passes the API guard (Host, `super::guard`), the API token check (header,
//!   `?token=` or session cookie), then the Origin/Host policy ([`crate::origin`], 403 with a
//!   log line: a GET's Origin is checked only here), then the client limit:
//!   at most [`MAX_CLIENTS`], the next one gets 503.
//! - A client that sends nothing for `api.ws_read_timeout` (default 60 s) is closed.
//! - Each client reads the hub's broadcast channel on its own task, so a slow client only
//!   falls behind itself: once it lags past the channel's capacity, or one write blocks for
//!   [`WRITE_TIMEOUT`], it is dropped with a logged reason. The sender never waits.
//! - With `api.stats_interval` > 0, [`publish_stats`] emits `stats.update` on that period.

use super::error::ApiError;
use crate::server::ServerState;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{close_code, CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures::{Sink, SinkExt, Stream, StreamExt};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use switchyard_api::EventEnvelope;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Concurrent WebSocket clients (the spec's limit).
pub const MAX_CLIENTS: usize = 100;
/// A single write to a client may block this long before the client is dropped as stalled.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest message or frame a client may send (it only ever needs to send `ping`).
pub const MAX_INCOMING: usize = 64 * 1024;

/// The client slots and the read timeout.
pub struct WsClients {
    slots: Arc<Semaphore>,
    read_timeout: Duration,
}

impl WsClients {
    pub fn new(read_timeout: Duration) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(MAX_CLIENTS)),
            read_timeout,
        }
    }

    /// Clients connected now.
    pub fn connected(&self) -> usize {
        MAX_CLIENTS.saturating_sub(self.slots.available_permits())
    }
}

/// Why a client's session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    ClientClosed,
    ReadTimeout(Duration),
    /// It fell this many events behind the broadcast.
    Lagged(u64),
    WriteTimeout,
    WriteFailed(String),
    ReadFailed(String),
    HubClosed,
}

impl End {
    fn describe(&self) -> String {
        match self {
            End::ClientClosed => "client closed the connection".into(),
            End::ReadTimeout(d) => format!("read timeout: nothing received for {}s", d.as_secs()),
            End::Lagged(n) => format!("client too slow: {n} events behind the broadcast"),
            End::WriteTimeout => format!(
                "client too slow: a write blocked for {}s",
                WRITE_TIMEOUT.as_secs()
            ),
            End::WriteFailed(e) => format!("write failed: {e}"),
            End::ReadFailed(e) => format!("read failed: {e}"),
            End::HubClosed => {
                "event source closed (server stopping, or its mesh network deleted)".into()
            }
        }
    }
}

#[utoipa::path(get, path = "/api/v1/ws", tag = "events",
    params(("token" = Option<String>, Query, description = "API token, for clients that cannot send a header (removed from the URL before logging)")),
    responses(
        (status = 101, description = "WebSocket of `{type, timestamp, data}` text messages (types backend.health, connection.new, connection.close, config.reload, config.saved, stats.update); send the text `ping` to get `pong`; closed after api.ws_read_timeout (default 60s) without a message from the client", body = EventEnvelope),
        (status = 400, description = "not a WebSocket upgrade request", body = switchyard_api::ErrorBody),
        (status = 401, description = "API token required", body = switchyard_api::ErrorBody),
        (status = 403, description = "Origin or Host refused (see api.allowed_origins)", body = switchyard_api::ErrorBody),
        (status = 503, description = "already 100 clients", body = switchyard_api::ErrorBody),
    ))]
pub async fn upgrade(
    State(state): State<Arc<ServerState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    match admit(&state, peer, &headers, ws) {
        Ok(admitted) => admitted.serve(&state, state.hub.subscribe(), "/api/v1/ws"),
        Err(refused) => refused.into_response(),
    }
}

/// An upgrade request that passed the Origin/Host policy and holds a client slot.
pub struct Admitted {
    ws: WebSocketUpgrade,
    slot: OwnedSemaphorePermit,
    peer: SocketAddr,
}

/// The checks every event WebSocket of the server API shares (the token was checked by the
/// auth layer): the Origin/Host policy (403), a real upgrade request (400), a free client
/// slot of the [`MAX_CLIENTS`] all event streams share (503).
pub fn admit(
    state: &ServerState,
    peer: SocketAddr,
    headers: &HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Admitted, ApiError> {
    let text = |name| {
        headers
            .get(name)
            .map(|v| v.to_str().unwrap_or("<not UTF-8>"))
    };
    if let Err(refusal) =
        state
            .origin_policy
            .check(text(header::ORIGIN), text(header::HOST), state.api_tls)
    {
        tracing::warn!(client = %peer, reason = %refusal, "WebSocket upgrade refused (403)");
        let (status, code) = refusal.status_and_code();
        return Err(ApiError::new(
            StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN),
            code,
            refusal.to_string(),
        ));
    }
    let ws = match ws {
        Ok(ws) => ws,
        Err(rejection) => {
            let status = rejection.status();
            let status = if status.is_client_error() {
                status
            } else {
                StatusCode::BAD_REQUEST
            };
            return Err(ApiError::new(
                status,
                "NOT_A_WEBSOCKET",
                rejection.body_text(),
            ));
        }
    };
    let Ok(slot) = state.ws.slots.clone().try_acquire_owned() else {
        tracing::warn!(client = %peer, max = MAX_CLIENTS, "WebSocket upgrade refused (503): client limit reached");
        return Err(ApiError::unavailable(
            "TOO_MANY_CLIENTS",
            format!("the event streams already have {MAX_CLIENTS} clients; try again later"),
        ));
    };
    Ok(Admitted { ws, slot, peer })
}

impl Admitted {
    /// Completes the upgrade and runs a [`session`] forwarding `events`; `stream` names it
    /// in the log.
    pub fn serve(
        self,
        state: &Arc<ServerState>,
        events: broadcast::Receiver<EventEnvelope>,
        stream: &'static str,
    ) -> Response {
        let Admitted { ws, slot, peer } = self;
        let read_timeout = state.ws.read_timeout;
        let clients = state.clone();
        ws.max_message_size(MAX_INCOMING)
            .max_frame_size(MAX_INCOMING)
            .on_failed_upgrade(move |e| tracing::debug!(client = %peer, error = %e, "WebSocket upgrade failed"))
            .on_upgrade(move |socket: WebSocket| async move {
                tracing::info!(client = %peer, stream, clients = clients.ws.connected(), "WebSocket client connected");
                let end = session(socket, events, read_timeout).await;
                drop(slot);
                match end {
                    End::Lagged(_) | End::WriteTimeout => {
                        tracing::warn!(client = %peer, stream, reason = %end.describe(), "dropping slow WebSocket client")
                    }
                    _ => tracing::info!(client = %peer, stream, reason = %end.describe(), "WebSocket client disconnected"),
                }
            })
    }
}

/// Sends one message, giving up after [`WRITE_TIMEOUT`].
async fn send<S>(sink: &mut S, msg: Message) -> Result<(), End>
where
    S: Sink<Message, Error = axum::Error> + Unpin,
{
    match tokio::time::timeout(WRITE_TIMEOUT, sink.send(msg)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(End::WriteFailed(e.to_string())),
        Err(_) => Err(End::WriteTimeout),
    }
}

/// Best-effort close frame (a stalled client may never take it).
async fn close<S>(sink: &mut S, code: u16, reason: &'static str)
where
    S: Sink<Message, Error = axum::Error> + Unpin,
{
    let frame = Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }));
    let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(frame)).await;
}

/// One client: forwards hub events, answers `ping`, enforces the read timeout. Returns why
/// it ended. Generic over the socket so tests drive it without a network.
pub async fn session<S>(
    socket: S,
    mut events: broadcast::Receiver<EventEnvelope>,
    read_timeout: Duration,
) -> End
where
    S: Stream<Item = Result<Message, axum::Error>> + Sink<Message, Error = axum::Error> + Unpin,
{
    let (mut sink, mut incoming) = socket.split();
    let mut deadline = Instant::now() + read_timeout;
    loop {
        tokio::select! {
            received = tokio::time::timeout_at(deadline, incoming.next()) => match received {
                Err(_) => {
                    close(&mut sink, close_code::AWAY, "read timeout").await;
                    return End::ReadTimeout(read_timeout);
                }
                Ok(None) | Ok(Some(Ok(Message::Close(_)))) => return End::ClientClosed,
                Ok(Some(Err(e))) => return End::ReadFailed(e.to_string()),
                Ok(Some(Ok(msg))) => {
                    deadline = Instant::now() + read_timeout;
                    if matches!(&msg, Message::Text(t) if t.as_str() == "ping") {
                        if let Err(end) = send(&mut sink, Message::Text("pong".into())).await {
                            return end;
                        }
                    }
                }
            },
            event = events.recv() => match event {
                Ok(envelope) => {
                    let text = match serde_json::to_string(&envelope) {
                        Ok(t) => t,
                        Err(e) => {
                            tracing::error!(error = %e, kind = %envelope.kind, "cannot encode an event; skipped");
                            continue;
                        }
                    };
                    if let Err(end) = send(&mut sink, Message::Text(text.into())).await {
                        return end;
                    }
                }
                Err(RecvError::Lagged(n)) => {
                    close(&mut sink, close_code::POLICY, "too slow: events were lost").await;
                    return End::Lagged(n);
                }
                Err(RecvError::Closed) => {
                    close(&mut sink, close_code::AWAY, "event source closed").await;
                    return End::HubClosed;
                }
            },
        }
    }
}

/// Publishes `stats.update` every `every` while anyone listens.
pub async fn publish_stats(state: Arc<ServerState>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tick.tick().await;
    loop {
        tick.tick().await;
        if state.hub.subscribers() == 0 {
            continue;
        }
        let t = state.counters.totals();
        state.hub.publish(
            "stats.update",
            json!({
                "active_connections": t.active_connections,
                "total_connections": t.total_connections,
                "bytes_sent": t.bytes_sent,
                "bytes_received": t.bytes_received,
            }),
        );
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::hub::Hub;
    use futures::channel::mpsc;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    /// A socket made of channels: `incoming` feeds the session, `outgoing` takes its writes
    /// (a bounded channel nobody drains stalls them).
    struct FakeSocket {
        incoming: mpsc::UnboundedReceiver<Message>,
        outgoing: mpsc::Sender<Message>,
    }

    impl Stream for FakeSocket {
        type Item = Result<Message, axum::Error>;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            self.incoming.poll_next_unpin(cx).map(|m| m.map(Ok))
        }
    }

    impl Sink<Message> for FakeSocket {
        type Error = axum::Error;
        fn poll_ready(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Result<(), Self::Error>> {
            self.outgoing.poll_ready(cx).map_err(axum::Error::new)
        }
        fn start_send(mut self: Pin<&mut Self>, item: Message) -> Result<(), Self::Error> {
            self.outgoing.start_send(item).map_err(axum::Error::new)
        }
        fn poll_flush(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Result<(), Self::Error>> {
            Pin::new(&mut self.outgoing)
                .poll_flush(cx)
                .map_err(axum::Error::new)
        }
        fn poll_close(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Result<(), Self::Error>> {
            Pin::new(&mut self.outgoing)
                .poll_close(cx)
                .map_err(axum::Error::new)
        }
    }

    fn socket(
        buffer: usize,
    ) -> (
        FakeSocket,
        mpsc::UnboundedSender<Message>,
        mpsc::Receiver<Message>,
    ) {
        let (in_tx, in_rx) = mpsc::unbounded();
        let (out_tx, out_rx) = mpsc::channel(buffer);
        (
            FakeSocket {
                incoming: in_rx,
                outgoing: out_tx,
            },
            in_tx,
            out_rx,
        )
    }

    fn text(m: Option<Message>) -> String {
        match m {
            Some(Message::Text(t)) => t.as_str().to_owned(),
            other => panic!("expected text, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn ping_pong_and_events() {
        let hub = Hub::new();
        let (sock, client, mut out) = socket(16);
        let task = tokio::spawn(session(sock, hub.subscribe(), Duration::from_secs(60)));
        client.unbounded_send(Message::Text("ping".into())).unwrap();
        assert_eq!(text(out.next().await), "pong");
        hub.publish(
            "config.reload",
            json!({"changed_sections": ["routes"], "requires_restart": false}),
        );
        let v: serde_json::Value = serde_json::from_str(&text(out.next().await)).unwrap();
        assert_eq!(v["type"], "config.reload");
        assert_eq!(v["data"]["changed_sections"][0], "routes");
        assert!(v["timestamp"].is_string());
        // Anything else from the client is ignored (but counts as activity).
        client
            .unbounded_send(Message::Text("hello".into()))
            .unwrap();
        client.unbounded_send(Message::Close(None)).unwrap();
        assert_eq!(task.await.unwrap(), End::ClientClosed);
    }

    #[tokio::test(start_paused = true)]
    async fn silent_client_times_out_and_pings_keep_it() {
        let hub = Hub::new();
        let (sock, client, mut out) = socket(16);
        let task = tokio::spawn(session(sock, hub.subscribe(), Duration::from_secs(60)));
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(50)).await;
            client.unbounded_send(Message::Text("ping".into())).unwrap();
            assert_eq!(text(out.next().await), "pong");
        }
        assert_eq!(
            task.await.unwrap(),
            End::ReadTimeout(Duration::from_secs(60))
        );
        assert!(
            matches!(out.next().await, Some(Message::Close(Some(f))) if f.code == close_code::AWAY)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lagging_client_is_dropped_and_the_others_keep_going() {
        let hub = Hub::new();
        let (slow, _slow_client, _slow_out) = socket(16);
        let (fast, _fast_client, mut fast_out) = socket(4096);
        let slow_rx = hub.subscribe();
        let fast_task = tokio::spawn(session(fast, hub.subscribe(), Duration::from_secs(600)));
        let n = crate::hub::CAPACITY + 100;
        for i in 0..n {
            hub.publish("stats.update", json!({"i": i}));
            if i % 64 == 0 {
                tokio::task::yield_now().await;
            }
        }
        // The slow one starts reading only now: it is too far behind.
        let end = session(slow, slow_rx, Duration::from_secs(600)).await;
        assert!(matches!(end, End::Lagged(k) if k >= 100), "{end:?}");
        for i in 0..n {
            let v: serde_json::Value = serde_json::from_str(&text(fast_out.next().await)).unwrap();
            assert_eq!(v["data"]["i"], i);
        }
        fast_task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn stalled_writes_drop_the_client() {
        let hub = Hub::new();
        let (sock, _client, _out) = socket(0);
        let task = tokio::spawn(session(sock, hub.subscribe(), Duration::from_secs(600)));
        for i in 0..4 {
            hub.publish("stats.update", json!({"i": i}));
        }
        assert_eq!(task.await.unwrap(), End::WriteTimeout);
    }

    #[test]
    fn client_slots() {
        let c = WsClients::new(Duration::from_secs(60));
        assert_eq!(c.connected(), 0);
        let held: Vec<_> = (0..MAX_CLIENTS)
            .map(|_| c.slots.clone().try_acquire_owned().unwrap())
            .collect();
        assert_eq!(c.connected(), MAX_CLIENTS);
        assert!(c.slots.clone().try_acquire_owned().is_err());
        drop(held);
        assert_eq!(c.connected(), 0);
    }
}

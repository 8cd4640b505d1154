//! The event hub: data-plane events and control-plane changes become `{type, timestamp, data}`
//! envelopes on one `tokio::sync::broadcast` channel that WebSocket clients subscribe to. A slow
//! subscriber lags and loses events (it is told so); it never slows the sender.

use chrono::Utc;
use serde_json::json;
use switchyard_api::EventEnvelope;
use switchyard_dataplane::events::Event;
use tokio::sync::broadcast;

/// Events kept per subscriber before it starts losing the oldest.
pub const CAPACITY: usize = 1024;

#[derive(Clone)]
pub struct Hub {
    tx: broadcast::Sender<EventEnvelope>,
}

impl Default for Hub {
    fn default() -> Self {
        Self::new()
    }
}

impl Hub {
    pub fn new() -> Self {
        Self {
            tx: broadcast::channel(CAPACITY).0,
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<EventEnvelope> {
        self.tx.subscribe()
    }

    pub fn subscribers(&self) -> usize {
        self.tx.receiver_count()
    }

    /// Publishes an event; without subscribers it is simply dropped.
    pub fn publish(&self, kind: &str, data: serde_json::Value) {
        let _ = self.tx.send(EventEnvelope {
            kind: kind.to_owned(),
            timestamp: Utc::now(),
            data,
        });
    }

    pub fn publish_dataplane(&self, event: &Event) {
        match event {
            Event::ConnectionNew { protocol, host, backend, client } => self.publish(
                "connection.new",
                json!({"protocol": protocol.as_str(), "host": host, "backend": backend, "client_ip": client.ip().to_string()}),
            ),
            Event::ConnectionClose { protocol, host, backend, client, .. } => self.publish(
                "connection.close",
                json!({"protocol": protocol.as_str(), "host": host, "backend": backend, "client_ip": client.ip().to_string()}),
            ),
            Event::BackendHealth { name, healthy } => {
                self.publish("backend.health", json!({"name": name, "healthy": healthy}))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn envelopes_reach_subscribers() {
        let hub = Hub::new();
        let mut rx = hub.subscribe();
        hub.publish_dataplane(&Event::BackendHealth {
            name: "b".into(),
            healthy: false,
        });
        let e = rx.recv().await.expect("event");
        assert_eq!(e.kind, "backend.health");
        assert_eq!(e.data["healthy"], false);
    }
}

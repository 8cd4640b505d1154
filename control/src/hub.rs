//! The event hub: data-plane events and control-plane changes become `{type, timestamp, data}`
//! envelopes on one `tokio::sync::broadcast` channel that WebSocket clients subscribe to. A slow
//! subscriber lags and loses events (it is told so); it never slows the sender.

use chrono::Utc;
use serde_json::json;
use std::sync::Arc;
use switchyard_api::EventEnvelope;
use switchyard_dataplane::events::{Event, EventQueue};
use tokio::sync::broadcast;

/// Events kept per subscriber before it starts losing the oldest.
pub const CAPACITY: usize = 1024;

#[derive(Clone)]
pub struct Hub {
    tx: broadcast::Sender<EventEnvelope>,
    /// The data plane's queue, told when someone subscribes (it builds connection events only
    /// then; [`Hub::release_idle_events`] turns them off again).
    dataplane: Option<Arc<EventQueue>>,
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
            dataplane: None,
        }
    }

    /// A hub whose subscribers switch the data plane's connection events on.
    pub fn for_dataplane(events: Arc<EventQueue>) -> Self {
        Self {
            dataplane: Some(events),
            ..Self::new()
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<EventEnvelope> {
        let rx = self.tx.subscribe();
        if let Some(q) = &self.dataplane {
            q.subscribed();
        }
        rx
    }

    /// Turns the data plane's connection events off when nobody subscribes any more.
    pub fn release_idle_events(&self) {
        if let Some(q) = &self.dataplane {
            let seen = q.interest();
            if self.subscribers() == 0 {
                q.unsubscribed_since(seen);
            }
        }
    }

    pub fn subscribers(&self) -> usize {
        self.tx.receiver_count()
    }

    /// Publishes an event; without subscribers it is simply dropped.
    pub fn publish(&self, kind: &str, data: serde_json::Value) {
        if self.tx.receiver_count() == 0 {
            return;
        }
        let _ = self.tx.send(EventEnvelope {
            kind: kind.to_owned(),
            timestamp: Utc::now(),
            data,
        });
    }

    pub fn publish_dataplane(&self, event: &Event) {
        // nobody to tell: skip building the JSON
        if self.tx.receiver_count() == 0 {
            return;
        }
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

    #[test]
    fn subscribers_switch_the_dataplane_connection_events() {
        let q = Arc::new(EventQueue::new(4));
        let hub = Hub::for_dataplane(q.clone());
        assert!(!q.wants_connection_events());
        let rx = hub.subscribe();
        hub.release_idle_events();
        assert!(q.wants_connection_events());
        drop(rx);
        hub.release_idle_events();
        assert!(!q.wants_connection_events());
    }
}

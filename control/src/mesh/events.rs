//! Peer events per mesh network (`peer.joined`, `peer.left`, `peer.updated`), for the
//! `/api/v1/mesh/networks/{networkID}/events` WebSocket. One broadcast channel per network
//! that has listeners; like the server's hub, a slow listener lags and loses events (and is
//! told so), it never slows the registry.

use chrono::Utc;
use parking_lot::Mutex;
use std::collections::HashMap;
use switchyard_api::EventEnvelope;
use tokio::sync::broadcast;

/// Events kept per listener before it starts losing the oldest.
pub const CAPACITY: usize = 256;

#[derive(Default)]
pub struct NetworkEvents {
    channels: Mutex<HashMap<String, broadcast::Sender<EventEnvelope>>>,
}

impl NetworkEvents {
    /// A receiver of `network`'s events from now on.
    pub fn subscribe(&self, network: &str) -> broadcast::Receiver<EventEnvelope> {
        self.channels
            .lock()
            .entry(network.to_owned())
            .or_insert_with(|| broadcast::channel(CAPACITY).0)
            .subscribe()
    }

    /// Sends an event to `network`'s listeners; a channel nobody listens to any more goes.
    pub fn publish(&self, network: &str, kind: &str, data: serde_json::Value) {
        let mut channels = self.channels.lock();
        let Some(tx) = channels.get(network) else {
            return;
        };
        if tx.receiver_count() == 0 {
            channels.remove(network);
            return;
        }
        let _ = tx.send(EventEnvelope {
            kind: kind.to_owned(),
            timestamp: Utc::now(),
            data,
        });
    }

    /// Ends `network`'s channel (the network was deleted): its listeners see the end.
    pub fn close(&self, network: &str) {
        self.channels.lock().remove(network);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[tokio::test]
    async fn events_stay_in_their_network() {
        let events = NetworkEvents::default();
        let mut a = events.subscribe("a");
        let mut b = events.subscribe("b");
        events.publish("a", "peer.joined", json!({"peer_id": "p1"}));
        events.publish("b", "peer.left", json!({"peer_id": "p2"}));
        let got = a.recv().await.unwrap();
        assert_eq!(
            (got.kind.as_str(), &got.data["peer_id"]),
            ("peer.joined", &json!("p1"))
        );
        assert_eq!(b.recv().await.unwrap().kind, "peer.left");
        assert!(a.try_recv().is_err());
    }

    #[tokio::test]
    async fn close_ends_the_stream_and_unheard_channels_go() {
        let events = NetworkEvents::default();
        let mut a = events.subscribe("a");
        events.close("a");
        assert!(matches!(
            a.recv().await,
            Err(broadcast::error::RecvError::Closed)
        ));
        drop(events.subscribe("x"));
        events.publish("x", "peer.left", json!({}));
        assert!(events.channels.lock().is_empty());
    }
}

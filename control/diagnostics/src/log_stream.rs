//! Live subscribers of the log stream: at most `max_subscribers`, each with a bounded buffer of
//! `buffer` messages. Publishing never blocks and never logs: the subscriber list is an
//! `ArcSwap` snapshot read without a lock, each message is offered with `try_send`, and a
//! subscriber whose buffer is full is removed on the spot (its stream ends after the messages
//! already buffered). Why it was removed is reported through its [`RemovalNotice`], which the
//! HTTP side awaits on its own task and logs — outside the tracing layer, so never recursively.

use arc_swap::ArcSwap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Bounds of the log stream (the specification's: 100 subscribers, 100 buffered messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    pub max_subscribers: usize,
    pub buffer: usize,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            max_subscribers: 100,
            buffer: 100,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeError {
    #[error("the log stream already has its maximum of {max} subscribers")]
    TooManySubscribers { max: usize },
}

/// One message as sent: the JSON text of a log entry, shared by every subscriber.
pub type Message = Arc<str>;

struct Subscriber {
    id: u64,
    tx: mpsc::Sender<Message>,
    dropped_slow: Arc<AtomicBool>,
    /// Dropped with the subscriber, which wakes its [`RemovalNotice`].
    _removed: oneshot::Sender<()>,
}

struct Registry {
    list: ArcSwap<Vec<Arc<Subscriber>>>,
    limits: StreamLimits,
    next_id: AtomicU64,
}

impl Registry {
    fn remove(&self, id: u64) {
        self.list.rcu(|list| {
            list.iter()
                .filter(|s| s.id != id)
                .cloned()
                .collect::<Vec<_>>()
        });
    }
}

/// The set of subscribers; cheap to clone (shared).
#[derive(Clone)]
pub struct LogSubscribers {
    registry: Arc<Registry>,
}

impl LogSubscribers {
    pub fn new(limits: StreamLimits) -> Self {
        Self {
            registry: Arc::new(Registry {
                list: ArcSwap::from_pointee(Vec::new()),
                limits: StreamLimits {
                    max_subscribers: limits.max_subscribers,
                    buffer: limits.buffer.max(1),
                },
                next_id: AtomicU64::new(1),
            }),
        }
    }

    pub fn limits(&self) -> StreamLimits {
        self.registry.limits
    }

    /// Subscribers connected now.
    pub fn count(&self) -> usize {
        self.registry.list.load().len()
    }

    /// Adds a subscriber unless the maximum is reached (checked and added in one atomic step).
    pub fn subscribe(&self) -> Result<Subscription, SubscribeError> {
        let reg = &self.registry;
        let id = reg.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(reg.limits.buffer);
        let (removed_tx, removed_rx) = oneshot::channel();
        let dropped_slow = Arc::new(AtomicBool::new(false));
        let subscriber = Arc::new(Subscriber {
            id,
            tx,
            dropped_slow: dropped_slow.clone(),
            _removed: removed_tx,
        });
        loop {
            let current = reg.list.load_full();
            if current.len() >= reg.limits.max_subscribers {
                return Err(SubscribeError::TooManySubscribers {
                    max: reg.limits.max_subscribers,
                });
            }
            let mut next = Vec::with_capacity(current.len() + 1);
            next.extend(current.iter().cloned());
            next.push(subscriber.clone());
            let previous = reg.list.compare_and_swap(&current, Arc::new(next));
            if Arc::ptr_eq(&previous, &current) {
                break;
            }
        }
        Ok(Subscription {
            id,
            rx,
            registry: self.registry.clone(),
            notice: Some(RemovalNotice {
                id,
                removed: removed_rx,
                dropped_slow,
            }),
        })
    }

    /// Whether anyone listens (lets the publisher skip serialising).
    pub fn is_empty(&self) -> bool {
        self.registry.list.load().is_empty()
    }

    /// Offers `message` to every subscriber without waiting; a subscriber whose buffer is full
    /// is dropped. Never blocks, never logs.
    pub fn publish(&self, message: &Message) {
        let list = self.registry.list.load();
        for s in list.iter() {
            match s.tx.try_send(message.clone()) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    if !s.dropped_slow.swap(true, Ordering::AcqRel) {
                        self.registry.remove(s.id);
                    }
                }
                Err(mpsc::error::TrySendError::Closed(_)) => self.registry.remove(s.id),
            }
        }
    }
}

/// A subscriber's end: its messages, and its removal from the set when dropped.
pub struct Subscription {
    id: u64,
    rx: mpsc::Receiver<Message>,
    registry: Arc<Registry>,
    notice: Option<RemovalNotice>,
}

impl Subscription {
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next message; `None` once the subscriber has been dropped and its buffer is empty.
    pub async fn recv(&mut self) -> Option<Message> {
        self.rx.recv().await
    }

    /// The next message if one is buffered.
    pub fn try_recv(&mut self) -> Option<Message> {
        self.rx.try_recv().ok()
    }

    /// Resolves when this subscriber leaves the set, saying why. Taken once.
    pub fn removal_notice(&mut self) -> Option<RemovalNotice> {
        self.notice.take()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.registry.remove(self.id);
    }
}

/// Why a subscriber left the set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// Its buffer was full when a message was published: it did not keep up.
    TooSlow,
    /// It went away by itself (the client disconnected).
    Unsubscribed,
}

pub struct RemovalNotice {
    id: u64,
    removed: oneshot::Receiver<()>,
    dropped_slow: Arc<AtomicBool>,
}

impl RemovalNotice {
    pub fn subscriber_id(&self) -> u64 {
        self.id
    }

    pub async fn wait(self) -> Removal {
        // The sender is never used: it is dropped with the subscriber, whichever way it left.
        let _ = self.removed.await;
        if self.dropped_slow.load(Ordering::Acquire) {
            Removal::TooSlow
        } else {
            Removal::Unsubscribed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(n: usize) -> Message {
        Arc::from(format!("{{\"n\":{n}}}"))
    }

    #[test]
    fn refuses_the_subscriber_past_the_maximum() {
        let subs = LogSubscribers::new(StreamLimits::default());
        let held: Vec<_> = (0..100)
            .map(|_| subs.subscribe().expect("within the limit"))
            .collect();
        assert_eq!(subs.count(), 100);
        assert_eq!(
            subs.subscribe().err(),
            Some(SubscribeError::TooManySubscribers { max: 100 })
        );
        drop(held);
        assert_eq!(subs.count(), 0);
        assert!(subs.subscribe().is_ok());
    }

    #[test]
    fn concurrent_subscribers_never_exceed_the_maximum() {
        let subs = LogSubscribers::new(StreamLimits {
            max_subscribers: 10,
            buffer: 4,
        });
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let subs = subs.clone();
                std::thread::spawn(move || {
                    (0..5)
                        .filter_map(|_| subs.subscribe().ok())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let held: Vec<_> = threads
            .into_iter()
            .flat_map(|t| t.join().expect("subscriber thread"))
            .collect();
        assert_eq!(held.len(), 10);
        assert_eq!(subs.count(), 10);
    }

    #[tokio::test]
    async fn a_slow_subscriber_is_dropped_and_the_rest_keep_receiving() {
        let subs = LogSubscribers::new(StreamLimits::default());
        let mut slow = subs.subscribe().expect("slow");
        let mut fast = subs.subscribe().expect("fast");
        let slow_notice = slow.removal_notice().expect("notice");
        let fast_notice = fast.removal_notice().expect("notice");
        for n in 0..250 {
            subs.publish(&msg(n));
            // The fast subscriber drains as it goes; the slow one never reads.
            assert_eq!(fast.try_recv().as_deref(), Some(&*msg(n)));
        }
        assert_eq!(subs.count(), 1, "only the fast subscriber remains");
        assert_eq!(slow_notice.wait().await, Removal::TooSlow);
        // The slow one still gets what was buffered before it was dropped, then the end.
        let mut got = 0;
        while let Some(m) = slow.recv().await {
            assert_eq!(m, msg(got));
            got += 1;
        }
        assert_eq!(got, 100);
        drop(fast);
        assert_eq!(fast_notice.wait().await, Removal::Unsubscribed);
        assert_eq!(subs.count(), 0);
    }

    #[test]
    fn publishing_with_no_subscribers_is_a_no_op() {
        let subs = LogSubscribers::new(StreamLimits::default());
        assert!(subs.is_empty());
        subs.publish(&msg(1));
    }
}

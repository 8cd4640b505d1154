//! The resolver behind both listeners: a client's bytes in, the answer's bytes out. Cache first;
//! on a miss one upstream fetch per question however many clients ask at once (coalescing),
//! servers tried in order with failover; SERVFAIL when all fail. Every answer with addresses is
//! reported through `on_resolved` before it is sent, so the split-tunnel maps hold the addresses
//! by the time the application connects.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hickory_proto::op::{Query, ResponseCode};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::cache::{Cache, CacheKey};
use crate::message::{
    answer_of, encode_answer, read_query, resolved_names, Answer, Incoming, Transport,
};
use crate::name::normalise;
use crate::server_order::ServerHealth;
use crate::upstream::{Exchanger, Upstream, UpstreamError};
use crate::{OnResolved, Refuse};

/// Answers kept at most (a client box asks for a few thousand names at most).
pub const CACHE_CAPACITY: usize = 10_000;

/// Counters of the resolver since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResolverStats {
    /// Messages received from clients (UDP datagrams and TCP frames).
    pub queries: u64,
    /// Questions answered from the cache.
    pub cache_hits: u64,
    /// Questions that joined an upstream fetch already running for the same question.
    pub coalesced: u64,
    /// Attempts sent to an upstream server.
    pub upstream_queries: u64,
    /// Attempts that failed (timeout, I/O, proxy refusal, SERVFAIL/REFUSED from the server).
    pub upstream_errors: u64,
    /// Questions answered SERVFAIL because every server failed.
    pub servfail: u64,
    /// Messages answered FORMERR/NOTIMP or dropped as malformed.
    pub malformed: u64,
    /// Questions answered REFUSED because the refusal rule named their name (never forwarded).
    pub refused: u64,
    /// Answers in the cache now (fresh or not yet evicted).
    pub cache_entries: u64,
}

#[derive(Default)]
struct Counters {
    queries: AtomicU64,
    cache_hits: AtomicU64,
    coalesced: AtomicU64,
    upstream_queries: AtomicU64,
    upstream_errors: AtomicU64,
    servfail: AtomicU64,
    malformed: AtomicU64,
    refused: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

pub struct Resolver {
    servers: Vec<SocketAddr>,
    timeout: Duration,
    cache: Mutex<Cache>,
    exchanger: ArcSwap<Exchanger>,
    inflight: Mutex<HashMap<CacheKey, Vec<oneshot::Sender<Answer>>>>,
    health: Mutex<ServerHealth>,
    counters: Counters,
    on_resolved: OnResolved,
    refuse: Mutex<Option<Refuse>>,
}

impl Resolver {
    pub fn new(
        servers: Vec<SocketAddr>,
        timeout: Duration,
        cache_ttl: Duration,
        upstream: Upstream,
        on_resolved: OnResolved,
    ) -> Self {
        Resolver {
            servers,
            timeout,
            cache: Mutex::new(Cache::new(cache_ttl, CACHE_CAPACITY)),
            exchanger: ArcSwap::from_pointee(Exchanger::new(upstream)),
            inflight: Mutex::default(),
            health: Mutex::default(),
            counters: Counters::default(),
            on_resolved,
            refuse: Mutex::new(None),
        }
    }

    pub fn set_refuse(&self, refuse: Option<Refuse>) {
        *self.refuse.lock() = refuse;
    }

    /// The answer to send back for a client's message, `None` to send nothing.
    pub async fn handle(&self, bytes: &[u8], transport: Transport) -> Option<Vec<u8>> {
        bump(&self.counters.queries);
        let q = match read_query(bytes) {
            Incoming::Query(q) => q,
            Incoming::Reject(reply) => {
                bump(&self.counters.malformed);
                return Some(reply);
            }
            Incoming::Drop => {
                bump(&self.counters.malformed);
                return None;
            }
        };
        let refuse = self.refuse.lock().clone();
        if refuse.is_some_and(|refuse| refuse(&normalise(q.query.name()))) {
            // before the cache too: the rule says this name gets no answer at all
            bump(&self.counters.refused);
            return encode_answer(&q, &Answer::refused(), transport);
        }
        let answer = self.answer(&q.query).await;
        if answer.response_code == ResponseCode::NoError {
            for r in resolved_names(q.query.name(), &answer.answers) {
                (self.on_resolved)(&r.name, &r.addresses);
            }
        }
        encode_answer(&q, &answer, transport)
    }

    async fn answer(&self, query: &Query) -> Answer {
        enum Role {
            Cached(Answer),
            /// Another client's fetch for the same question is running: wait for its answer.
            Join(oneshot::Receiver<Answer>),
            Fetch,
        }
        let key = CacheKey::of(query);
        // Cache and fetch table are looked at under one lock, so a fetch finishing in between
        // cannot make this question go upstream a second time.
        let role = {
            let mut inflight = self.inflight.lock();
            match inflight.get_mut(&key) {
                Some(waiters) => {
                    let (tx, rx) = oneshot::channel();
                    waiters.push(tx);
                    Role::Join(rx)
                }
                None => match self.cache.lock().get(&key, Instant::now()) {
                    Some(hit) => Role::Cached(hit),
                    None => {
                        inflight.insert(key.clone(), Vec::new());
                        Role::Fetch
                    }
                },
            }
        };
        match role {
            Role::Fetch => {}
            Role::Cached(hit) => {
                bump(&self.counters.cache_hits);
                return hit;
            }
            Role::Join(rx) => {
                bump(&self.counters.coalesced);
                // The fetch's owner went away without an answer (shutdown): SERVFAIL.
                return rx.await.unwrap_or_else(|_| Answer::servfail());
            }
        }
        let fetch = Fetch {
            inflight: &self.inflight,
            key,
            finished: false,
        };
        let answer = match self.forward(query).await {
            Ok(answer) => self
                .cache
                .lock()
                .insert(fetch.key.clone(), answer, Instant::now()),
            Err(e) => {
                bump(&self.counters.servfail);
                tracing::info!(name = %query.name(), qtype = %query.query_type(), error = %e, "every upstream failed: SERVFAIL");
                Answer::servfail()
            }
        };
        fetch.finish(&answer);
        answer
    }

    /// Asks the servers in order (those that failed lately last) until one answers.
    async fn forward(&self, query: &Query) -> Result<Answer, UpstreamError> {
        let exchanger = self.exchanger.load_full();
        let order = self.health.lock().order(&self.servers, Instant::now());
        let mut last = UpstreamError::NoServers;
        for server in order {
            bump(&self.counters.upstream_queries);
            let outcome =
                match tokio::time::timeout(self.timeout, exchanger.exchange(server, query)).await {
                    Ok(Ok(reply)) => match reply.response_code() {
                        ResponseCode::NoError | ResponseCode::NXDomain => Ok(reply),
                        code => Err(UpstreamError::Rcode(code)),
                    },
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(UpstreamError::Timeout),
                };
            match outcome {
                Ok(reply) => {
                    self.health.lock().succeeded(server);
                    return Ok(answer_of(reply));
                }
                Err(e) => {
                    bump(&self.counters.upstream_errors);
                    tracing::debug!(%server, error = %e, "upstream attempt failed");
                    self.health.lock().failed(server, Instant::now());
                    last = e;
                }
            }
        }
        Err(last)
    }

    pub fn set_upstream(&self, upstream: Upstream) {
        self.exchanger.store(Arc::new(Exchanger::new(upstream)));
    }

    pub fn upstream(&self) -> Upstream {
        self.exchanger.load().upstream().clone()
    }

    pub fn stats(&self) -> ResolverStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ResolverStats {
            queries: get(&c.queries),
            cache_hits: get(&c.cache_hits),
            coalesced: get(&c.coalesced),
            upstream_queries: get(&c.upstream_queries),
            upstream_errors: get(&c.upstream_errors),
            servfail: get(&c.servfail),
            malformed: get(&c.malformed),
            refused: get(&c.refused),
            cache_entries: self.cache.lock().len() as u64,
        }
    }

    pub fn cache(&self) -> &Mutex<Cache> {
        &self.cache
    }
}

/// The running upstream fetch for one question. Finishing hands the answer to every client
/// that joined; dropping it unfinished (cancelled) removes it, so joiners get SERVFAIL instead
/// of waiting forever.
struct Fetch<'a> {
    inflight: &'a Mutex<HashMap<CacheKey, Vec<oneshot::Sender<Answer>>>>,
    key: CacheKey,
    finished: bool,
}

impl Fetch<'_> {
    fn finish(mut self, answer: &Answer) {
        self.finished = true;
        let waiters = self.inflight.lock().remove(&self.key).unwrap_or_default();
        for w in waiters {
            let _ = w.send(answer.clone());
        }
    }
}

impl Drop for Fetch<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.inflight.lock().remove(&self.key);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use hickory_proto::op::Message;
    use hickory_proto::rr::{Name, RecordType};

    fn query(name: &str) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(7)
            .set_recursion_desired(true)
            .add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        m.to_vec().unwrap()
    }

    #[tokio::test]
    async fn refused_names_are_answered_refused_and_never_forwarded() {
        // the one upstream is a closed port: anything forwarded would fail (SERVFAIL)
        let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let server = closed.local_addr().unwrap();
        drop(closed);
        let resolver = Resolver::new(
            vec![server],
            Duration::from_millis(200),
            Duration::from_secs(60),
            Upstream::Direct { mark: None },
            Arc::new(|_, _| {}),
        );
        resolver.set_refuse(Some(Arc::new(|name| name.ends_with("blocked.test"))));
        let code = |reply: Vec<u8>| Message::from_vec(&reply).unwrap().response_code();
        let reply = resolver
            .handle(&query("A.Blocked.Test."), Transport::Udp)
            .await;
        assert_eq!(code(reply.unwrap()), ResponseCode::Refused);
        let stats = resolver.stats();
        assert_eq!((stats.refused, stats.upstream_queries), (1, 0));
        // other names are forwarded as before
        let reply = resolver.handle(&query("other.test."), Transport::Udp).await;
        assert_eq!(code(reply.unwrap()), ResponseCode::ServFail);
        assert_eq!(resolver.stats().upstream_queries, 1);
        // cleared: the name is forwarded too
        resolver.set_refuse(None);
        resolver
            .handle(&query("a.blocked.test."), Transport::Udp)
            .await;
        assert_eq!(resolver.stats().refused, 1);
        assert_eq!(resolver.stats().upstream_queries, 2);
    }
}

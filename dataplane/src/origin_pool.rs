//! Per-core pool of idle keep-alive connections to origins, keyed by backend route and
//! destination. A connection is reused only if it is young enough and a non-blocking peek shows
//! no EOF and no stray bytes.

use crate::backend_stream::BackendStream;
use crate::snapshot::BackendKind;
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Per core and destination. Above the number of clients a core serves at once for one origin,
/// or every response beyond it closes an origin connection that the next request must open
/// again: with 64 keep-alive clients on 2 cores the busier core often has more than 32, and a
/// limit of 32 cost a new origin connection for 2.6 % of the 1 KiB requests (a socket, a
/// `connect` and a `close` each: by estimate a tenth of the proxy's CPU per request).
const MAX_IDLE_PER_KEY: usize = 256;
const MAX_IDLE_TOTAL: usize = 1024;
const MAX_IDLE_AGE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolKey {
    pub backend: BackendKind,
    pub host: String,
    pub port: u16,
}

#[derive(Default)]
struct Pool {
    idle: HashMap<PoolKey, Vec<(BackendStream, Instant)>>,
    total: usize,
}

thread_local! {
    static POOL: RefCell<Pool> = RefCell::new(Pool::default());
}

/// A reusable connection for `key`, if one is idle and healthy. `retryable`: the caller
/// retries on a fresh connection when this one turns out closed (see
/// [`BackendStream::idle_is_clean`]).
pub fn take(key: &PoolKey, retryable: bool) -> Option<BackendStream> {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        let mut found = None;
        let mut dropped = 0;
        if let Some(list) = p.idle.get_mut(key) {
            while let Some((stream, since)) = list.pop() {
                if since.elapsed() < MAX_IDLE_AGE && stream.idle_is_clean(retryable) {
                    found = Some(stream);
                    break;
                }
                dropped += 1;
            }
            if list.is_empty() {
                p.idle.remove(key);
            }
        }
        p.total -= dropped + usize::from(found.is_some());
        found
    })
}

/// Parks a connection whose last response was read completely.
pub fn give(key: PoolKey, stream: BackendStream) {
    POOL.with(|p| {
        let mut p = p.borrow_mut();
        if p.total >= MAX_IDLE_TOTAL {
            // Make room by dropping the stalest connections of every key.
            let now = Instant::now();
            p.idle.retain(|_, list| {
                list.retain(|(_, since)| now.duration_since(*since) < MAX_IDLE_AGE / 4);
                !list.is_empty()
            });
            p.total = p.idle.values().map(Vec::len).sum();
            if p.total >= MAX_IDLE_TOTAL {
                return;
            }
        }
        let list = p.idle.entry(key).or_default();
        if list.len() >= MAX_IDLE_PER_KEY {
            return;
        }
        list.push((stream, Instant::now()));
        p.total += 1;
    });
}

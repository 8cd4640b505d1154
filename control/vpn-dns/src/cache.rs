//! The answer cache and its TTL policy, without I/O or clocks of its own: every call takes `now`,
//! so tests drive time by hand.
//!
//! Positive answers are kept for their smallest TTL, negative ones (NXDOMAIN, or no records of
//! the asked type) for the SOA's negative TTL (RFC 2308: the smaller of the SOA record's TTL
//! and its MINIMUM field); both are capped by `vpn.dns.cache_ttl`. Answers without a TTL to go
//! by (TTL 0, a negative answer without SOA, SERVFAIL) are served but not kept. Served TTLs
//! count down with the time spent in the cache.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use hickory_proto::op::{Query, ResponseCode};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};

use crate::message::Answer;
use crate::name::normalise;

/// What an answer is cached under: the normalised name, type and class of the question.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CacheKey {
    pub name: String,
    pub record_type: RecordType,
    pub class: DNSClass,
}

impl CacheKey {
    pub fn of(query: &Query) -> Self {
        CacheKey {
            name: normalise(query.name()),
            record_type: query.query_type(),
            class: query.query_class(),
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    /// TTLs already capped; served TTLs are these minus the time spent here.
    answer: Answer,
    stored_at: Instant,
    expires_at: Instant,
}

/// A bounded map of fresh answers.
#[derive(Debug)]
pub struct Cache {
    entries: HashMap<CacheKey, Entry>,
    capacity: usize,
    ttl_cap: u32,
}

impl Cache {
    pub fn new(ttl_cap: Duration, capacity: usize) -> Self {
        Cache {
            entries: HashMap::new(),
            capacity: capacity.max(1),
            ttl_cap: secs(ttl_cap),
        }
    }

    /// The fresh answer for `key` with its TTLs counted down, or `None` (an expired entry is
    /// removed on the way).
    pub fn get(&mut self, key: &CacheKey, now: Instant) -> Option<Answer> {
        let entry = self.entries.get(key)?;
        if now >= entry.expires_at {
            self.entries.remove(key);
            return None;
        }
        let elapsed = secs(now.saturating_duration_since(entry.stored_at));
        let mut answer = entry.answer.clone();
        for r in answer.answers.iter_mut().chain(answer.authority.iter_mut()) {
            r.set_ttl(r.ttl().saturating_sub(elapsed));
        }
        Some(answer)
    }

    /// Stores `answer` (from upstream) if it may be kept, and returns it as it is to be served
    /// now: TTLs capped, a negative answer's SOA carrying the negative TTL.
    pub fn insert(&mut self, key: CacheKey, answer: Answer, now: Instant) -> Answer {
        let (answer, keep) = apply_policy(answer, self.ttl_cap);
        let expires_at = keep
            .filter(|&k| k > 0)
            .and_then(|k| now.checked_add(Duration::from_secs(u64::from(k))));
        if let Some(expires_at) = expires_at {
            if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
                self.make_room(now);
            }
            self.entries.insert(
                key,
                Entry {
                    answer: answer.clone(),
                    stored_at: now,
                    expires_at,
                },
            );
        }
        answer
    }

    /// Drops expired entries, then (still full) the one closest to expiry.
    fn make_room(&mut self, now: Instant) {
        self.entries.retain(|_, e| e.expires_at > now);
        if self.entries.len() >= self.capacity {
            let soonest = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.expires_at)
                .map(|(k, _)| k.clone());
            if let Some(k) = soonest {
                self.entries.remove(&k);
            }
        }
    }

    /// Fresh entries with their expiry, in key order.
    pub fn fresh(&self, now: Instant) -> Vec<(&CacheKey, &Answer, Instant)> {
        let mut out: Vec<_> = self
            .entries
            .iter()
            .filter(|(_, e)| e.expires_at > now)
            .map(|(k, e)| (k, &e.answer, e.expires_at))
            .collect();
        out.sort_by(|a, b| a.0.cmp(b.0));
        out
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }
}

fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

/// Caps the answer's TTLs at `cap` and says how long it may be kept (`None`: not at all).
pub fn apply_policy(mut answer: Answer, cap: u32) -> (Answer, Option<u32>) {
    for r in answer.answers.iter_mut().chain(answer.authority.iter_mut()) {
        r.set_ttl(r.ttl().min(cap));
    }
    let keep = match answer.response_code {
        ResponseCode::NoError if !answer.answers.is_empty() => {
            // Authority records of a positive answer are not needed by a stub.
            answer.authority.clear();
            answer.answers.iter().map(Record::ttl).min()
        }
        ResponseCode::NoError | ResponseCode::NXDomain => {
            let negative = negative_ttl(&answer.authority).map(|t| t.min(cap));
            answer
                .authority
                .retain(|r| r.record_type() == RecordType::SOA);
            if let Some(ttl) = negative {
                for r in &mut answer.authority {
                    r.set_ttl(ttl);
                }
            }
            negative
        }
        _ => None,
    };
    (answer, keep)
}

/// RFC 2308 §5: the negative TTL is the smaller of the SOA record's TTL and its MINIMUM field.
fn negative_ttl(authority: &[Record]) -> Option<u32> {
    authority.iter().find_map(|r| match r.data() {
        Some(RData::SOA(soa)) => Some(r.ttl().min(soa.minimum())),
        _ => None,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::{A, SOA};
    use hickory_proto::rr::Name;

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn key(n: &str) -> CacheKey {
        CacheKey::of(&Query::query(name(n), RecordType::A))
    }

    fn positive(ttls: &[u32]) -> Answer {
        Answer {
            response_code: ResponseCode::NoError,
            answers: ttls
                .iter()
                .enumerate()
                .map(|(i, &ttl)| {
                    let ip = std::net::Ipv4Addr::new(10, 0, 0, u8::try_from(i).unwrap());
                    Record::from_rdata(name("www.test."), ttl, RData::A(A::from(ip)))
                })
                .collect(),
            authority: vec![],
        }
    }

    fn negative(code: ResponseCode, soa_ttl: u32, minimum: u32) -> Answer {
        let soa = SOA::new(
            name("ns.test."),
            name("admin.test."),
            1,
            3600,
            600,
            86400,
            minimum,
        );
        Answer {
            response_code: code,
            answers: vec![],
            authority: vec![Record::from_rdata(name("test."), soa_ttl, RData::SOA(soa))],
        }
    }

    fn ttls(a: &Answer) -> Vec<u32> {
        a.answers
            .iter()
            .chain(a.authority.iter())
            .map(Record::ttl)
            .collect()
    }

    #[test]
    fn keys_ignore_case_and_root_dot() {
        assert_eq!(key("WWW.Test."), key("www.test"));
        let aaaa = CacheKey::of(&Query::query(name("www.test."), RecordType::AAAA));
        assert_ne!(key("www.test."), aaaa);
    }

    #[test]
    fn fresh_answers_count_down_and_expire() {
        let t0 = Instant::now();
        let mut cache = Cache::new(Duration::from_secs(300), 100);
        let served = cache.insert(key("www.test."), positive(&[60, 120]), t0);
        assert_eq!(ttls(&served), [60, 120]);
        let hit = cache
            .get(&key("WWW.test."), t0 + Duration::from_secs(15))
            .unwrap();
        assert_eq!(ttls(&hit), [45, 105], "TTLs counted down by 15 s");
        let hit = cache
            .get(&key("www.test."), t0 + Duration::from_millis(59_900))
            .unwrap();
        assert_eq!(ttls(&hit), [1, 61], "never 0 while fresh");
        // Kept for the smallest TTL.
        assert!(cache
            .get(&key("www.test."), t0 + Duration::from_secs(60))
            .is_none());
        assert!(cache.is_empty(), "expired entry removed");
    }

    #[test]
    fn cache_ttl_caps_kept_and_served_ttls() {
        let t0 = Instant::now();
        let mut cache = Cache::new(Duration::from_secs(5), 100);
        let served = cache.insert(key("www.test."), positive(&[3600]), t0);
        assert_eq!(ttls(&served), [5]);
        assert_eq!(
            ttls(
                &cache
                    .get(&key("www.test."), t0 + Duration::from_secs(2))
                    .unwrap()
            ),
            [3]
        );
        assert!(cache
            .get(&key("www.test."), t0 + Duration::from_secs(5))
            .is_none());
    }

    #[test]
    fn negative_answers_use_the_soa_minimum_capped() {
        let t0 = Instant::now();
        let mut cache = Cache::new(Duration::from_secs(300), 100);
        // min(SOA TTL 900, MINIMUM 30) = 30.
        let served = cache.insert(
            key("nx.test."),
            negative(ResponseCode::NXDomain, 900, 30),
            t0,
        );
        assert_eq!(ttls(&served), [30]);
        let hit = cache
            .get(&key("nx.test."), t0 + Duration::from_secs(29))
            .unwrap();
        assert_eq!(hit.response_code, ResponseCode::NXDomain);
        assert_eq!(ttls(&hit), [1]);
        assert!(cache
            .get(&key("nx.test."), t0 + Duration::from_secs(30))
            .is_none());
        // NODATA with the SOA's own TTL smaller than MINIMUM, capped by cache_ttl.
        let mut cache = Cache::new(Duration::from_secs(10), 100);
        let served = cache.insert(
            key("nodata.test."),
            negative(ResponseCode::NoError, 20, 3600),
            t0,
        );
        assert_eq!(ttls(&served), [10]);
        assert!(cache
            .get(&key("nodata.test."), t0 + Duration::from_secs(9))
            .is_some());
        assert!(cache
            .get(&key("nodata.test."), t0 + Duration::from_secs(10))
            .is_none());
    }

    #[test]
    fn answers_without_a_usable_ttl_are_not_kept() {
        let t0 = Instant::now();
        let mut cache = Cache::new(Duration::from_secs(300), 100);
        cache.insert(key("zero.test."), positive(&[0, 60]), t0);
        cache.insert(key("servfail.test."), Answer::servfail(), t0);
        let no_soa = Answer {
            response_code: ResponseCode::NXDomain,
            answers: vec![],
            authority: vec![],
        };
        cache.insert(key("nosoa.test."), no_soa, t0);
        assert!(cache.is_empty());
        // cache_ttl 0 keeps nothing.
        let mut cache = Cache::new(Duration::ZERO, 100);
        let served = cache.insert(key("www.test."), positive(&[60]), t0);
        assert_eq!(ttls(&served), [0]);
        assert!(cache.is_empty());
    }

    #[test]
    fn full_cache_evicts_expired_then_soonest() {
        let t0 = Instant::now();
        let mut cache = Cache::new(Duration::from_secs(300), 2);
        cache.insert(key("short.test."), positive(&[10]), t0);
        cache.insert(key("long.test."), positive(&[200]), t0);
        cache.insert(
            key("new.test."),
            positive(&[100]),
            t0 + Duration::from_secs(1),
        );
        assert_eq!(cache.len(), 2);
        assert!(
            cache.get(&key("short.test."), t0).is_none(),
            "soonest evicted"
        );
        cache.insert(
            key("newer.test."),
            positive(&[100]),
            t0 + Duration::from_secs(150),
        );
        assert!(cache
            .get(&key("long.test."), t0 + Duration::from_secs(150))
            .is_some());
        assert!(cache
            .get(&key("newer.test."), t0 + Duration::from_secs(150))
            .is_some());
        let names: Vec<_> = cache
            .fresh(t0 + Duration::from_secs(150))
            .into_iter()
            .map(|(k, _, _)| k.name.clone())
            .collect();
        assert_eq!(names, ["long.test", "newer.test"]);
    }
}

//! The interception resolver against real peers on loopback: dnsmasq upstream, dig as the
//! application, microsocks as the SOCKS5 tunnel. The proxy path through `switchyard server`
//! itself is in the top-level tests/vpn_dns.rs.

mod peers;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{rdata::A, Name, RData, Record, RecordType};
use peers::{dig, records, status, Dnsmasq, Microsocks, Reports};
use switchyard_vpn_dns::{DnsInterceptor, ProxyProtocol, ResolverConfig, Upstream};
use tokio::net::UdpSocket;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

async fn start(
    servers: Vec<SocketAddr>,
    tweak: impl FnOnce(&mut ResolverConfig),
) -> (DnsInterceptor, Reports) {
    let mut cfg = ResolverConfig {
        servers,
        timeout: Duration::from_millis(500),
        ..ResolverConfig::default()
    };
    tweak(&mut cfg);
    let reports = Reports::default();
    let dns = DnsInterceptor::start(cfg, reports.hook())
        .await
        .expect("start resolver");
    (dns, reports)
}

/// With `listen6` the resolver takes questions on IPv6 loopback too, UDP and TCP, on the IPv4
/// listeners' port, with one cache for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen6_answers_on_ipv6_loopback_from_the_same_cache() {
    let Some(upstream) = peers::dnsmasq_and_dig() else {
        return;
    };
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        eprintln!("SKIP listen6: no IPv6 loopback");
        return;
    }
    let (dns, _reports) = start(vec![upstream.addr], |cfg| {
        cfg.listen6 = Some(SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 0)));
    })
    .await;
    let at6 = dns.local_addr6().expect("IPv6 listeners");
    assert_eq!(at6.ip(), ip("::1"));
    assert_eq!(
        at6.port(),
        dns.local_addr().port(),
        "the same port when free"
    );
    let out = dig(at6, &["a.test", "AAAA", "+short"]).await;
    assert_eq!(out.trim(), "2001:db8::3");
    let out = dig(at6, &["a.test", "A", "+short", "+tcp"]).await;
    assert_eq!(out.trim(), "10.1.2.3");
    upstream.wait_queries("AAAA", "a.test", 1);
    // the IPv4 listener answers the same question from the cache
    let out = dig(dns.local_addr(), &["a.test", "AAAA", "+short"]).await;
    assert_eq!(out.trim(), "2001:db8::3");
    assert_eq!(upstream.queries("AAAA", "a.test"), 1);
    assert_eq!(dns.stats().cache_hits, 1, "{:?}", dns.stats());
}

/// A UDP socket that takes queries and never answers (a dead server that does not even send
/// ICMP errors).
fn silent_server() -> std::net::UdpSocket {
    std::net::UdpSocket::bind("127.0.0.1:0").expect("bind")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_then_serves_repeats_from_the_cache() {
    let Some(upstream) = peers::dnsmasq_and_dig() else {
        return;
    };
    let (dns, reports) = start(vec![upstream.addr], |_| {}).await;
    let out = dig(dns.local_addr(), &["a.test", "A", "+noall", "+answer"]).await;
    let got = records(&out);
    assert_eq!(got.len(), 1, "{out}");
    assert_eq!(
        (got[0].0.as_str(), got[0].2.as_str(), got[0].3.as_str()),
        ("a.test.", "A", "10.1.2.3")
    );
    assert!(got[0].1 <= 300, "TTL capped by cache_ttl (5m): {out}");
    upstream.wait_queries("A", "a.test", 1);

    // The repeat comes from the cache: dnsmasq is not asked again.
    let again = dig(dns.local_addr(), &["A.Test", "A", "+noall", "+answer"]).await;
    assert_eq!(records(&again)[0].3, "10.1.2.3", "{again}");
    let stats = dns.stats();
    assert_eq!(
        (stats.queries, stats.cache_hits, stats.upstream_queries),
        (2, 1, 1),
        "{stats:?}"
    );
    assert_eq!(upstream.queries("A", "a.test"), 1);

    // AAAA is a question of its own.
    let out = dig(dns.local_addr(), &["a.test", "AAAA", "+short"]).await;
    assert_eq!(out.trim(), "2001:db8::3");
    upstream.wait_queries("AAAA", "a.test", 1);

    // Both answers were reported for the split tunnel, and the cache view shows them.
    assert_eq!(
        reports.addresses("a.test"),
        [ip("10.1.2.3"), ip("2001:db8::3")]
    );
    let view = dns.cache_view();
    assert!(view.enabled);
    assert_eq!(view.count, 2);
    let addrs: Vec<&str> = view
        .entries
        .iter()
        .flat_map(|e| e.addresses.iter().map(String::as_str))
        .collect();
    assert_eq!(addrs, ["10.1.2.3", "2001:db8::3"]);
    assert!(view
        .entries
        .iter()
        .all(|e| e.domain == "a.test" && e.expires_at > chrono::Utc::now()));

    // Shutdown closes both listeners: the port is free again for UDP and TCP.
    let addr = dns.local_addr();
    dns.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    UdpSocket::bind(addr).await.expect("UDP port released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_ttl_caps_ttls_and_expired_answers_are_fetched_again() {
    let Some(upstream) = peers::dnsmasq_and_dig() else {
        return;
    };
    let (dns, _) = start(vec![upstream.addr], |c| {
        c.cache_ttl = Duration::from_secs(1)
    })
    .await;
    let out = dig(dns.local_addr(), &["a.test", "+noall", "+answer"]).await;
    assert_eq!(
        records(&out)[0].1,
        1,
        "dnsmasq's TTL 600 capped at 1 s: {out}"
    );
    upstream.wait_queries("A", "a.test", 1);
    // Expiry itself is unit-tested with an injected clock; here one short real wait.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let out = dig(dns.local_addr(), &["a.test", "+short"]).await;
    assert_eq!(out.trim(), "10.1.2.3");
    upstream.wait_queries("A", "a.test", 2);
    assert_eq!(dns.stats().cache_hits, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servfail_when_every_upstream_fails() {
    if peers::require("dig").is_none() {
        return;
    }
    // One server that refuses (nothing bound: ICMP port unreachable), one that stays silent.
    let closed = silent_server().local_addr().expect("addr");
    let silent = silent_server();
    let (dns, reports) = start(vec![closed, silent.local_addr().expect("addr")], |c| {
        c.timeout = Duration::from_millis(300)
    })
    .await;
    let out = dig(dns.local_addr(), &["a.test", "A"]).await;
    assert_eq!(status(&out), "SERVFAIL", "{out}");
    let stats = dns.stats();
    assert_eq!(
        (
            stats.upstream_queries,
            stats.upstream_errors,
            stats.servfail
        ),
        (2, 2, 1),
        "{stats:?}"
    );
    // Failures are not cached: the next query goes upstream again.
    let out = dig(dns.local_addr(), &["a.test", "A", "+tcp"]).await;
    assert_eq!(status(&out), "SERVFAIL", "{out}");
    assert_eq!(dns.stats().upstream_queries, 4);
    assert!(reports.addresses("a.test").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fails_over_to_the_next_server() {
    let Some(upstream) = peers::dnsmasq_and_dig() else {
        return;
    };
    let silent = silent_server();
    let (dns, _) = start(
        vec![silent.local_addr().expect("addr"), upstream.addr],
        |c| c.timeout = Duration::from_millis(300),
    )
    .await;
    let out = dig(dns.local_addr(), &["a.test", "+short"]).await;
    assert_eq!(out.trim(), "10.1.2.3");
    let stats = dns.stats();
    assert_eq!(
        (stats.upstream_queries, stats.upstream_errors),
        (2, 1),
        "{stats:?}"
    );
    // The dead first server now waits at the back: the next question goes to dnsmasq first.
    let out = dig(dns.local_addr(), &["edge.cdn.test", "+short"]).await;
    assert_eq!(out.trim(), "10.9.9.9");
    let stats = dns.stats();
    assert_eq!(
        (stats.upstream_queries, stats.upstream_errors),
        (3, 1),
        "{stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_queries_and_truncated_udp_answers() {
    let Some(upstream) = peers::dnsmasq_and_dig() else {
        return;
    };
    let (dns, _) = start(vec![upstream.addr], |_| {}).await;
    let out = dig(dns.local_addr(), &["a.test", "+tcp", "+short"]).await;
    assert_eq!(out.trim(), "10.1.2.3");

    // dnsmasq truncates the big TXT answer over UDP (more than the 1232 bytes the resolver
    // advertises): the resolver fetches it again over TCP and has all records.
    let out = dig(
        dns.local_addr(),
        &["big.test", "TXT", "+tcp", "+noall", "+answer"],
    )
    .await;
    assert_eq!(records(&out).len(), peers::BIG_TXT_RECORDS, "{out}");
    // A UDP client without EDNS gets the TC bit (and no partial answer), from the cache.
    let out = dig(dns.local_addr(), &["big.test", "TXT", "+noedns", "+ignore"]).await;
    assert_eq!(status(&out), "NOERROR", "{out}");
    assert!(out.contains(" tc"), "TC flag: {out}");
    assert!(records(&out).iter().all(|r| r.2 != "TXT"), "{out}");
    // dig's default (EDNS, retry over TCP on TC) ends with everything.
    let out = dig(dns.local_addr(), &["big.test", "TXT", "+noall", "+answer"]).await;
    assert_eq!(records(&out).len(), peers::BIG_TXT_RECORDS, "{out}");
    assert_eq!(
        upstream.queries("TXT", "big.test"),
        2,
        "UDP (truncated) then TCP, once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cname_chains_are_reported_under_every_name() {
    let Some(upstream) = peers::dnsmasq_and_dig() else {
        return;
    };
    let (dns, reports) = start(vec![upstream.addr], |_| {}).await;
    let out = dig(
        dns.local_addr(),
        &["www.shop.test", "A", "+noall", "+answer"],
    )
    .await;
    let types: Vec<String> = records(&out).into_iter().map(|r| r.2).collect();
    assert_eq!(types, ["CNAME", "CNAME", "A"], "{out}");
    for name in ["www.shop.test", "shop.cdn.test", "edge.cdn.test"] {
        assert_eq!(reports.addresses(name), [ip("10.9.9.9")], "{name}");
    }
    // Answers from the cache are reported too (a domain rule added later still learns them).
    let before = reports.count();
    dig(dns.local_addr(), &["www.shop.test", "A", "+short"]).await;
    assert_eq!(dns.stats().cache_hits, 1);
    assert_eq!(reports.count(), before + 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socks5_proxy_upstream_reuses_one_tcp_connection() {
    let Some(upstream) = peers::dnsmasq_and_dig() else {
        return;
    };
    let Some(proxy) = Microsocks::start("bob", "builder") else {
        return;
    };
    let through = |password: &str| Upstream::Proxy {
        address: proxy.addr.to_string(),
        protocol: ProxyProtocol::Socks5,
        username: Some("bob".into()),
        password: Some(password.into()),
    };
    let (dns, reports) = start(vec![upstream.addr], |c| {
        c.upstream = through("builder");
        c.timeout = Duration::from_secs(3);
    })
    .await;
    let out = dig(dns.local_addr(), &["a.test", "+short"]).await;
    assert_eq!(out.trim(), "10.1.2.3");
    let out = dig(dns.local_addr(), &["www.shop.test", "+short"]).await;
    assert!(out.contains("10.9.9.9"), "{out}");
    assert_eq!(reports.addresses("edge.cdn.test"), [ip("10.9.9.9")]);
    // dnsmasq serves each TCP connection in a child process: both queries came from one child,
    // so they shared one connection through the proxy.
    upstream.wait_queries("A", "www.shop.test", 1);
    let pids = upstream.query_pids();
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert_eq!(pids[0], pids[1], "one reused connection: {pids:?}");
    // Questions asked at once are pipelined on that same connection.
    let resolver = dns.local_addr();
    let asks: Vec<_> = (0..4u16)
        .map(|i| tokio::spawn(async move { ask(resolver, &format!("p{i}.a.test."), i).await }))
        .collect();
    for a in asks {
        assert_eq!(a.await.expect("ask"), [ip("10.1.2.3")]);
    }
    for i in 0..4 {
        upstream.wait_queries("A", &format!("p{i}.a.test"), 1);
    }
    let pids = upstream.query_pids();
    assert_eq!(pids.len(), 6, "{pids:?}");
    assert!(
        pids.iter().all(|p| *p == pids[0]),
        "one connection: {pids:?}"
    );

    // Wrong credentials: the proxy refuses, the client gets SERVFAIL.
    dns.set_upstream(through("wrong"));
    let out = dig(dns.local_addr(), &["edge.cdn.test", "A"]).await;
    assert_eq!(status(&out), "SERVFAIL", "{out}");
    assert_eq!(upstream.queries("A", "edge.cdn.test"), 0);
}

/// NXDOMAIN and NODATA answers of an authoritative dnsmasq zone (SOA TTL and MINIMUM 30 s) are
/// cached for the SOA's negative TTL, capped by cache_ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_answers_are_cached_for_the_soa_ttl() {
    if peers::require("dig").is_none() {
        return;
    }
    let mut zone = peers::test_records();
    zone.extend(
        [
            "--auth-server=ns.neg.test,127.0.0.1",
            "--auth-zone=neg.test",
            "--auth-ttl=30",
            "--auth-soa=1,hostmaster.neg.test,1200,120,1209600",
            "--host-record=h.neg.test,10.5.5.5",
        ]
        .map(String::from),
    );
    let Some(upstream) = Dnsmasq::start(&zone) else {
        return;
    };
    let (dns, reports) = start(vec![upstream.addr], |_| {}).await;
    for round in 1..=2 {
        let out = dig(
            dns.local_addr(),
            &["nx.neg.test", "A", "+noall", "+comments", "+authority"],
        )
        .await;
        assert_eq!(status(&out), "NXDOMAIN", "{out}");
        let soa = records(&out)
            .into_iter()
            .find(|r| r.2 == "SOA")
            .unwrap_or_else(|| panic!("SOA: {out}"));
        assert!(soa.1 <= 30, "round {round}: {out}");
        let out = dig(
            dns.local_addr(),
            &["h.neg.test", "AAAA", "+noall", "+comments", "+answer"],
        )
        .await;
        assert_eq!(status(&out), "NOERROR", "{out}");
        assert!(records(&out).is_empty(), "NODATA: {out}");
    }
    upstream.wait_queries("AAAA", "h.neg.test", 1);
    assert_eq!(upstream.queries("A", "nx.neg.test"), 1);
    assert_eq!(upstream.queries("AAAA", "h.neg.test"), 1);
    assert_eq!(dns.stats().cache_hits, 2);
    assert!(reports.addresses("nx.neg.test").is_empty());

    // cache_ttl below the SOA's negative TTL caps it.
    let (dns, _) = start(vec![upstream.addr], |c| {
        c.cache_ttl = Duration::from_secs(5)
    })
    .await;
    let out = dig(
        dns.local_addr(),
        &["other.neg.test", "A", "+noall", "+authority"],
    )
    .await;
    let soa = records(&out)
        .into_iter()
        .find(|r| r.2 == "SOA")
        .unwrap_or_else(|| panic!("SOA: {out}"));
    assert!(soa.1 <= 5, "{out}");
}

/// IPv6 end to end: the resolver on ::1 (the DNS redirect's `resolver6`), dnsmasq on ::1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_listener_and_upstream() {
    if peers::require("dig").is_none() {
        return;
    }
    let Some(upstream) = Dnsmasq::start_on(ip("::1"), &peers::test_records()) else {
        return;
    };
    let (dns, reports) = start(vec![upstream.addr], |c| {
        c.listen = "[::1]:0".parse().expect("addr")
    })
    .await;
    assert!(dns.local_addr().is_ipv6());
    let out = dig(dns.local_addr(), &["a.test", "AAAA", "+short"]).await;
    assert_eq!(out.trim(), "2001:db8::3");
    let out = dig(dns.local_addr(), &["a.test", "A", "+short", "+tcp"]).await;
    assert_eq!(out.trim(), "10.1.2.3");
    assert_eq!(
        reports.addresses("a.test"),
        [ip("10.1.2.3"), ip("2001:db8::3")]
    );
    upstream.wait_queries("AAAA", "a.test", 1);
}

/// A pooled connection that dies (here: the proxy restarts) is replaced by a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_proxied_connection_is_replaced() {
    let Some(upstream) = peers::dnsmasq_and_dig() else {
        return;
    };
    let Some(proxy) = Microsocks::start("bob", "builder") else {
        return;
    };
    let (dns, _) = start(vec![upstream.addr], |c| {
        c.upstream = Upstream::Proxy {
            address: proxy.addr.to_string(),
            protocol: ProxyProtocol::Socks5,
            username: Some("bob".into()),
            password: Some("builder".into()),
        };
        c.timeout = Duration::from_secs(3);
    })
    .await;
    let out = dig(dns.local_addr(), &["a.test", "+short"]).await;
    assert_eq!(out.trim(), "10.1.2.3");
    let Some(_proxy) = proxy.restart("bob", "builder") else {
        return;
    };
    let out = dig(dns.local_addr(), &["edge.cdn.test", "+short"]).await;
    assert_eq!(out.trim(), "10.9.9.9");
    upstream.wait_queries("A", "edge.cdn.test", 1);
    let pids = upstream.query_pids();
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert_ne!(pids[0], pids[1], "a new connection: {pids:?}");
    assert_eq!(dns.stats().servfail, 0);
}

/// A scripted upstream that answers late, and first with spoofed replies: identical questions
/// asked at once share one upstream query, and only the reply with the right id and question
/// is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_queries_share_one_upstream_query_with_a_checked_id() {
    let upstream = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let (dns, _) = start(vec![upstream.local_addr().expect("addr")], |c| {
        c.timeout = Duration::from_secs(5)
    })
    .await;
    let dns = Arc::new(dns);
    const CLIENTS: u64 = 5;
    let resolver = dns.local_addr();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| tokio::spawn(async move { ask(resolver, "same.test.", 100 + i as u16).await }))
        .collect();

    let mut buf = vec![0u8; 2048];
    let (n, from) = upstream.recv_from(&mut buf).await.expect("upstream query");
    let query = Message::from_vec(&buf[..n]).expect("query");
    // Hold the answer until every client's question has reached the resolver.
    while dns.stats().queries < CLIENTS {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let reply = |id: u16, name: &str, addr: [u8; 4]| {
        let mut m = Message::new();
        m.set_id(id)
            .set_message_type(MessageType::Response)
            .set_recursion_available(true)
            .add_query(Query::query(
                Name::from_ascii(name).expect("name"),
                RecordType::A,
            ))
            .add_answer(Record::from_rdata(
                Name::from_ascii(name).expect("name"),
                60,
                RData::A(A::from(std::net::Ipv4Addr::from(addr))),
            ));
        m.to_vec().expect("encode")
    };
    let id = query.id();
    let spoofs = [
        reply(id.wrapping_add(1), "same.test.", [6, 6, 6, 6]),
        reply(id, "other.test.", [6, 6, 6, 7]),
    ];
    for spoof in spoofs {
        upstream.send_to(&spoof, from).await.expect("send");
    }
    upstream
        .send_to(&reply(id, "same.test.", [10, 0, 0, 5]), from)
        .await
        .expect("send");

    for c in clients {
        let answer = c.await.expect("client");
        assert_eq!(answer, vec![ip("10.0.0.5")]);
    }
    let stats = dns.stats();
    assert_eq!(
        (stats.upstream_queries, stats.coalesced, stats.cache_hits),
        (1, CLIENTS - 1, 0),
        "{stats:?}"
    );
    let more = tokio::time::timeout(Duration::from_millis(200), upstream.recv_from(&mut buf)).await;
    assert!(more.is_err(), "a second upstream query was sent");
}

/// Sends one A query with `id` over UDP and returns the addresses of the answer.
async fn ask(resolver: SocketAddr, name: &str, id: u16) -> Vec<IpAddr> {
    let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let mut m = Message::new();
    m.set_id(id)
        .set_recursion_desired(true)
        .add_query(Query::query(
            Name::from_ascii(name).expect("name"),
            RecordType::A,
        ));
    socket
        .send_to(&m.to_vec().expect("encode"), resolver)
        .await
        .expect("send");
    let mut buf = vec![0u8; 2048];
    let n = tokio::time::timeout(Duration::from_secs(10), socket.recv(&mut buf))
        .await
        .expect("answer in time")
        .expect("recv");
    let reply = Message::from_vec(&buf[..n]).expect("reply");
    assert_eq!(reply.id(), id);
    assert_eq!(reply.response_code(), ResponseCode::NoError);
    reply
        .answers()
        .iter()
        .filter_map(|r| match r.data() {
            Some(RData::A(a)) => Some(IpAddr::V4(a.0)),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_gets_formerr_or_nothing_and_the_listeners_survive() {
    let Some(upstream) = peers::dnsmasq_and_dig() else {
        return;
    };
    let (dns, _) = start(vec![upstream.addr], |_| {}).await;
    let resolver = dns.local_addr();
    let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    // A header announcing one question followed by a broken name: FORMERR with our id.
    let mut bad = vec![0xbe, 0xef, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    bad.extend_from_slice(&[63, b'x']);
    socket.send_to(&bad, resolver).await.expect("send");
    let mut buf = vec![0u8; 2048];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut buf))
        .await
        .expect("FORMERR in time")
        .expect("recv");
    let reply = Message::from_vec(&buf[..n]).expect("reply");
    assert_eq!(
        (reply.id(), reply.response_code()),
        (0xbeef, ResponseCode::FormErr)
    );

    // Random junk over UDP and TCP (a deterministic generator, no crate needed).
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..300 {
        let len = (next() % 200) as usize;
        let junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        socket.send_to(&junk, resolver).await.expect("send");
    }
    for _ in 0..20 {
        use tokio::io::AsyncWriteExt;
        let mut tcp = tokio::net::TcpStream::connect(resolver)
            .await
            .expect("connect");
        let junk: Vec<u8> = (0..(next() % 600)).map(|_| next() as u8).collect();
        let _ = tcp.write_all(&junk).await;
    }
    // Still serving, over both transports.
    let out = dig(resolver, &["a.test", "+short"]).await;
    assert_eq!(out.trim(), "10.1.2.3");
    let out = dig(resolver, &["a.test", "+short", "+tcp"]).await;
    assert_eq!(out.trim(), "10.1.2.3");
    assert!(dns.stats().malformed >= 1);
}

/// An nft table counting the packets sent to one port, by mark; deleted when dropped.
struct MarkCounter {
    table: String,
}

impl MarkCounter {
    fn new(port: u16, mark: u32) -> Option<MarkCounter> {
        let nft = peers::require("nft")?;
        let table = format!("vdns_mark_{port}");
        let script = format!(
            "table inet {table} {{\n chain out {{\n  type filter hook output priority 0; policy accept;\n\
             \x20 udp dport {port} meta mark {mark:#x} counter comment \"udp-marked\"\n\
             \x20 udp dport {port} meta mark != {mark:#x} counter comment \"udp-unmarked\"\n\
             \x20 tcp dport {port} meta mark {mark:#x} counter comment \"tcp-marked\"\n }}\n}}\n"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("rules.nft");
        std::fs::write(&file, script).expect("write rules");
        let ok = std::process::Command::new(nft)
            .arg("-f")
            .arg(&file)
            .status()
            .expect("run nft")
            .success();
        assert!(ok, "nft -f failed");
        Some(MarkCounter { table })
    }

    fn packets(&self, comment: &str) -> u64 {
        let out = std::process::Command::new("nft")
            .args(["list", "table", "inet", &self.table])
            .output()
            .expect("nft list");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = text
            .lines()
            .find(|l| l.contains(&format!("comment \"{comment}\"")))
            .unwrap_or_else(|| panic!("no rule {comment} in {text}"));
        line.split("packets ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no counter in {line}"))
    }
}

impl Drop for MarkCounter {
    fn drop(&mut self) {
        let _ = std::process::Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

/// Direct upstream queries leave from sockets carrying the tunnel's mark (UDP, and the TCP
/// retry of a truncated answer), which is what policy routing sends into the TUN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_upstream_sockets_carry_the_mark() {
    // nft and SO_MARK both need CAP_NET_ADMIN.
    if !peers::is_root() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI runs the tests as root"
        );
        eprintln!("SKIP: not root (SO_MARK and nft need CAP_NET_ADMIN)");
        return;
    }
    let Some(upstream) = peers::dnsmasq_and_dig() else {
        return;
    };
    const MARK: u32 = 0x5359;
    let Some(counter) = MarkCounter::new(upstream.addr.port(), MARK) else {
        return;
    };
    let (dns, _) = start(vec![upstream.addr], |c| {
        c.upstream = Upstream::Direct { mark: Some(MARK) }
    })
    .await;
    let out = dig(dns.local_addr(), &["a.test", "+short"]).await;
    assert_eq!(out.trim(), "10.1.2.3");
    let out = dig(
        dns.local_addr(),
        &["big.test", "TXT", "+tcp", "+noall", "+answer"],
    )
    .await;
    assert_eq!(records(&out).len(), peers::BIG_TXT_RECORDS, "{out}");
    assert!(counter.packets("udp-marked") >= 2, "UDP queries marked");
    assert_eq!(counter.packets("udp-unmarked"), 0, "no unmarked UDP query");
    assert!(counter.packets("tcp-marked") >= 1, "TCP retry marked");
}

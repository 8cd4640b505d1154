//! The VPN's DNS interception resolver (control/vpn-dns) forwarding "through the tunnel": DNS
//! over TCP through a real `switchyard server`'s HTTP CONNECT and SOCKS5 proxies, with the
//! server's proxy authentication on, to a dnsmasq upstream. dig is the application.

#[path = "../control/vpn-dns/tests/peers/mod.rs"]
mod peers;
mod support;

use std::time::Duration;

use peers::{dig, status, Reports};
use support::start_server;
use switchyard_vpn_dns::{DnsInterceptor, ProxyProtocol, ResolverConfig, Upstream};

fn alice_config() -> String {
    let hash = bcrypt::hash("wonderland", 4).expect("hash");
    format!("auth:\n  mode: native\n  native:\n    users:\n      - username: alice\n        password_hash: \"{hash}\"\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolver_forwards_through_switchyard_server_connect_and_socks5() {
    let Some(upstream) = peers::dnsmasq_and_dig() else {
        return;
    };
    let server = start_server(&alice_config());
    let via = |protocol, address: std::net::SocketAddr, password: &str| Upstream::Proxy {
        address: address.to_string(),
        protocol,
        username: Some("alice".into()),
        password: Some(password.into()),
    };
    let reports = Reports::default();
    let dns = DnsInterceptor::start(
        ResolverConfig {
            servers: vec![upstream.addr],
            upstream: via(ProxyProtocol::Http, server.http, "wonderland"),
            timeout: Duration::from_secs(3),
            ..ResolverConfig::default()
        },
        reports.hook(),
    )
    .await
    .expect("start resolver");

    // HTTP CONNECT: two questions over one tunnelled connection (one dnsmasq TCP child).
    let out = dig(dns.local_addr(), &["a.test", "+short"]).await;
    assert_eq!(out.trim(), "10.1.2.3");
    let out = dig(dns.local_addr(), &["www.shop.test", "+short"]).await;
    assert!(out.contains("10.9.9.9"), "{out}");
    upstream.wait_queries("A", "www.shop.test", 1);
    let pids = upstream.query_pids();
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert_eq!(pids[0], pids[1], "one reused CONNECT tunnel: {pids:?}");
    assert_eq!(
        reports.addresses("shop.cdn.test"),
        ["10.9.9.9".parse::<std::net::IpAddr>().expect("ip")]
    );

    // SOCKS5 with the same credentials.
    dns.set_upstream(via(ProxyProtocol::Socks5, server.socks5, "wonderland"));
    let out = dig(dns.local_addr(), &["edge.cdn.test", "AAAA", "+short"]).await;
    assert_eq!(out.trim(), "2001:db8::9");
    upstream.wait_queries("AAAA", "edge.cdn.test", 1);

    // Wrong password on either proxy: the server refuses (407 / RFC 1929 failure) → SERVFAIL.
    for (protocol, address) in [
        (ProxyProtocol::Http, server.http),
        (ProxyProtocol::Socks5, server.socks5),
    ] {
        dns.set_upstream(via(protocol, address, "nope"));
        let out = dig(dns.local_addr(), &["a.test", "TXT"]).await;
        assert_eq!(status(&out), "SERVFAIL", "{protocol:?}: {out}");
    }
    assert_eq!(upstream.queries("TXT", "a.test"), 0);
    dns.shutdown().await;
}

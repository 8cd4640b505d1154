//! switchyard-ice against a real coturn `turnserver` on 127.0.0.1 (random port, long-term user,
//! no TLS): STUN binding, TURN allocate/permission/channel/indications, two agents selecting the
//! direct path, two agents that can only reach each other through the relay, a wrong TURN
//! password. The UDP driver (std sockets, one thread) lives here, not in the library.
//! Without coturn the tests skip with a reason; under `CI` they fail (tests/run installs it).

mod driver;

use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use driver::{require, Coturn, Net};
use switchyard_ice::binding::{BindingClient, BindingEvent};
use switchyard_ice::stun::Message;
use switchyard_ice::turn::{TurnClient, TurnEvent};
use switchyard_ice::{
    classify, CandidateKind, DatagramKind, Event, IceConfig, IceError, PathKind, TurnServerConfig,
    Via,
};

/// A WireGuard-looking datagram (type 4 = transport data, little-endian): neither STUN nor
/// ChannelData, so the endpoint hands it back as data.
fn wg(text: &str) -> Vec<u8> {
    let mut d = vec![4, 0, 0, 0];
    d.extend_from_slice(text.as_bytes());
    d
}

fn coturn() -> Option<Coturn> {
    require("turnserver")?;
    Some(Coturn::start("u", "p"))
}

/// Drives a sans-IO client that talks only to `server` over `socket` until `done` says so.
fn pump<T>(
    socket: &UdpSocket,
    server: SocketAddr,
    mut step: impl FnMut(Option<(&[u8], Instant)>, Instant) -> (Vec<Vec<u8>>, Option<T>),
) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = [0u8; 2048];
    let mut input: Option<Vec<u8>> = None;
    loop {
        assert!(Instant::now() < deadline, "no result within 20 s");
        let now = Instant::now();
        let (out, result) = step(input.as_deref().map(|d| (d, now)), now);
        for bytes in out {
            socket.send_to(&bytes, server).expect("send");
        }
        if let Some(r) = result {
            return r;
        }
        input = match socket.recv_from(&mut buf) {
            Ok((n, from)) if from == server => Some(buf[..n].to_vec()),
            _ => None,
        };
    }
}

#[test]
fn stun_binding_returns_the_mapped_address() {
    let Some(turn) = coturn() else { return };
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_millis(20)))
        .expect("timeout");
    let mut client = BindingClient::new(
        turn.addr,
        Duration::from_secs(5),
        Duration::from_secs(25),
        Instant::now(),
    );
    let mapped = pump(&socket, turn.addr, |input, now| {
        if let Some((d, at)) = input {
            if let Ok(m) = Message::decode(d) {
                client.handle_message(&m, at);
            }
        }
        client.handle_timeout(now);
        let out = std::iter::from_fn(|| client.poll_transmit()).collect();
        let result = match client.poll_event() {
            Some(BindingEvent::Mapped(a)) => Some(a),
            Some(BindingEvent::Failed(e)) => panic!("binding failed: {e}"),
            None => None,
        };
        (out, result)
    });
    assert_eq!(mapped, socket.local_addr().expect("addr"));
}

/// Allocate (401 → realm/nonce → authenticated retry), CreatePermission and a Send indication
/// to a plain UDP peer, its answer as a Data indication, then ChannelBind and ChannelData both
/// ways; finally deallocation.
#[test]
fn turn_allocate_permission_channel_and_indications() {
    let Some(turn) = coturn() else { return };
    let socket = UdpSocket::bind("127.0.0.1:0").expect("bind");
    socket
        .set_read_timeout(Some(Duration::from_millis(20)))
        .expect("timeout");
    let peer = UdpSocket::bind("127.0.0.1:0").expect("bind peer");
    peer.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let peer_addr = peer.local_addr().expect("addr");
    let mut client = TurnClient::new(turn.addr, "u", "p", Duration::from_secs(5), Instant::now());

    let drive = |client: &mut TurnClient, want: &mut dyn FnMut(&mut TurnClient) -> bool| {
        pump(&socket, turn.addr, |input, now| {
            if let Some((d, at)) = input {
                if let Ok(m) = Message::decode(d) {
                    client.handle_message(&m, d, at);
                }
            }
            client.handle_timeout(now);
            let out = std::iter::from_fn(|| client.poll_transmit()).collect();
            (out, want(client).then_some(()))
        })
    };

    let mut allocated = None;
    drive(&mut client, &mut |c| {
        match c.poll_event() {
            Some(TurnEvent::Allocated { relayed, mapped }) => allocated = Some((relayed, mapped)),
            Some(other) => panic!("allocation: {other:?}"),
            None => {}
        }
        allocated.is_some()
    });
    let (relayed, mapped) = allocated.expect("allocated");
    assert_eq!(relayed.ip(), turn.addr.ip());
    assert_ne!(relayed.port(), turn.addr.port());
    assert_eq!(mapped, Some(socket.local_addr().expect("addr")));

    // Without a permission the relay drops the peer's datagrams; with one they pass.
    client.create_permission(peer_addr.ip(), Instant::now());
    let mut pending = true;
    drive(&mut client, &mut |c| {
        // The permission is confirmed when its transaction is answered: then no timer of a
        // pending request remains before the 240 s refresh.
        pending = c
            .poll_timeout()
            .is_some_and(|t| t < Instant::now() + Duration::from_secs(200));
        !pending
    });
    socket
        .send_to(
            &client.wrap(peer_addr, b"send indication").expect("fits"),
            turn.addr,
        )
        .expect("send");
    let mut buf = [0u8; 2048];
    let (n, from) = peer.recv_from(&mut buf).expect("peer receives via relay");
    assert_eq!((&buf[..n], from), (&b"send indication"[..], relayed));
    peer.send_to(b"data indication", relayed)
        .expect("peer answers");
    let data = recv_from_server(&socket, turn.addr, |d| {
        let m = Message::decode(d).ok()?;
        client.handle_message(&m, d, Instant::now())
    });
    assert_eq!(data, (peer_addr, b"data indication".to_vec()));

    client.bind_channel(peer_addr, Instant::now());
    drive(&mut client, &mut |c| {
        classify(&c.wrap(peer_addr, b"x").expect("fits")) == DatagramKind::ChannelData
    });
    socket
        .send_to(
            &client.wrap(peer_addr, b"channel data").expect("fits"),
            turn.addr,
        )
        .expect("send");
    let (n, from) = peer
        .recv_from(&mut buf)
        .expect("peer receives channel data");
    assert_eq!((&buf[..n], from), (&b"channel data"[..], relayed));
    peer.send_to(b"back on the channel", relayed)
        .expect("peer answers");
    let frame = recv_from_server(&socket, turn.addr, |d| {
        (classify(d) == DatagramKind::ChannelData).then(|| d.to_vec())
    });
    assert_eq!(
        client.unwrap_channel(&frame),
        Some((peer_addr, &b"back on the channel"[..]))
    );

    client.deallocate(Instant::now());
    drive(&mut client, &mut |c| {
        matches!(c.state(), switchyard_ice::turn::TurnState::Closed)
    });
    // The server forgets the allocation (coturn does so on its next timer tick, not at once):
    // then the same 5-tuple can allocate again (while it exists, a second Allocate is refused
    // with 437 Allocation Mismatch).
    let started = Instant::now();
    let event = loop {
        let mut again =
            TurnClient::new(turn.addr, "u", "p", Duration::from_secs(5), Instant::now());
        let mut event = None;
        drive(&mut again, &mut |c| {
            event = c.poll_event();
            event.is_some()
        });
        match event {
            Some(TurnEvent::Failed(IceError::TurnRejected { code: 437, .. }))
                if started.elapsed() < Duration::from_secs(10) =>
            {
                std::thread::sleep(Duration::from_millis(200))
            }
            other => break other,
        }
    };
    assert!(
        matches!(event, Some(TurnEvent::Allocated { .. })),
        "{event:?}"
    );
}

/// The first datagram from `server` that `pick` accepts (within 5 s).
fn recv_from_server<T>(
    socket: &UdpSocket,
    server: SocketAddr,
    mut pick: impl FnMut(&[u8]) -> Option<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut buf = [0u8; 2048];
    loop {
        assert!(
            Instant::now() < deadline,
            "nothing from {server} within 5 s"
        );
        if let Ok((n, from)) = socket.recv_from(&mut buf) {
            if from == server {
                if let Some(t) = pick(&buf[..n]) {
                    return t;
                }
            }
        }
    }
}

fn ice_config(id: &str, socket: &UdpSocket, turn: &Coturn, password: &str) -> IceConfig {
    let mut c = IceConfig::new(id, vec![socket.local_addr().expect("addr")]);
    c.stun_servers = vec![turn.addr];
    c.turn_servers = vec![TurnServerConfig {
        addr: turn.addr,
        username: "u".into(),
        password: password.into(),
    }];
    c.agent.stun_timeout = Duration::from_secs(2);
    c.agent.upgrade_interval = Duration::from_secs(2);
    c
}

/// Two agents that can reach each other select the direct path and exchange data on it.
#[test]
fn reachable_agents_select_direct() {
    let Some(turn) = coturn() else { return };
    let mut net = Net::new(&["alpha", "beta"], |id, s| ice_config(id, s, &turn, "p"));
    net.introduce();
    let paths = net.run_until_selected(HashSet::new());
    for (peer, path) in &paths {
        assert_eq!(path.kind, PathKind::Direct, "{peer}: {path:?}");
        assert_eq!(path.via, Via::Direct);
    }
    net.exchange("alpha", "beta", &wg("hello beta"));
    net.exchange("beta", "alpha", &wg("hello alpha"));
}

/// The driver drops every datagram from one agent's socket to the other's: only the TURN
/// relay connects them, and both select a relayed path and exchange data through it.
#[test]
fn agents_without_direct_reachability_select_the_relay() {
    let Some(turn) = coturn() else { return };
    let mut net = Net::new(&["alpha", "beta"], |id, s| ice_config(id, s, &turn, "p"));
    let blocked: HashSet<SocketAddr> = net.socket_addrs();
    net.introduce();
    let paths = net.run_until_selected(blocked.clone());
    for (peer, path) in &paths {
        assert_eq!(path.kind, PathKind::Relayed, "{peer}: {path:?}");
    }
    net.exchange("alpha", "beta", &wg("through the relay"));
    net.exchange("beta", "alpha", &wg("and back"));

    // One side sends through its own allocation (the other's pair is the mirror image: to that
    // relayed address). Its selected path gets a channel, and data then goes as ChannelData.
    let (own, path) = paths
        .iter()
        .find(|(_, p)| matches!(p.via, Via::Relay(_)))
        .expect("a path through our own relay");
    let (from, to) = own.split_once('→').expect("pair name");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    loop {
        let sent = net
            .endpoint(from)
            .encapsulate_into(to, &wg("framed"), &mut out);
        assert_eq!(sent.map(|(addr, _)| addr), Some(turn.addr), "{path:?}");
        if classify(&out) == DatagramKind::ChannelData {
            break;
        }
        assert!(Instant::now() < deadline, "no channel bound within 10 s");
        net.step();
    }
    net.exchange(from, to, &wg("on the channel"));

    // Every direct check has failed by now (the STUN timeout is 2 s) …
    net.run_for(Duration::from_secs(3));
    // … when the direct path opens: the agents check the better pairs again and move to it.
    let paths = net.run_until_paths(HashSet::new(), |p| p.kind == PathKind::Direct);
    assert!(paths.iter().all(|(_, p)| p.via == Via::Direct));
    net.exchange("alpha", "beta", &wg("direct at last"));
}

/// The peers meet only after both relays are allocated: the permissions for the peer's
/// addresses must then come from learning its candidates, not from the allocation.
#[test]
fn relay_works_for_peers_that_meet_after_allocation() {
    let Some(turn) = coturn() else { return };
    let mut net = Net::new(&["alpha", "beta"], |id, s| ice_config(id, s, &turn, "p"));
    net.registry_open = false;
    for id in ["alpha", "beta"] {
        net.run_until_event(id, |e| match e {
            Event::CandidateGathered(c) if c.kind == CandidateKind::Relayed => Some(()),
            _ => None,
        });
    }
    net.registry_open = true;
    net.introduce();
    let blocked: HashSet<SocketAddr> = net.socket_addrs();
    let paths = net.run_until_selected(blocked);
    assert!(paths.iter().all(|(_, p)| p.kind == PathKind::Relayed));
    net.exchange("alpha", "beta", &wg("late but relayed"));
}

/// A wrong TURN password ends in a clear credentials error; no relay candidate appears.
#[test]
fn wrong_turn_password_is_a_clear_error() {
    let Some(turn) = coturn() else { return };
    let mut net = Net::new(&["alpha"], |id, s| ice_config(id, s, &turn, "wrong"));
    let error = net.run_until_event("alpha", |e| match e {
        Event::ServerFailed { error, .. } => Some(error.clone()),
        _ => None,
    });
    assert!(
        matches!(error, IceError::TurnUnauthorized { ref username, .. } if username == "u"),
        "{error}"
    );
    assert!(error
        .to_string()
        .contains("wrong TURN username or password"));
    assert!(net
        .endpoint("alpha")
        .local_endpoints()
        .iter()
        .all(|e| e.kind != "relay"));
}

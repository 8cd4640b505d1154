//! End-to-end: bulk CONNECT and SOCKS5 tunnels through the real `switchyard server`, with the
//! zero-copy relay (`splice(2)`) and with the copy relay (`SWITCHYARD_RELAY=copy`): every byte
//! arrives in order both ways, half-closes pass through, and the byte counters and the
//! spliced-bytes metric say which path moved them. The relay's last direction ends with
//! `close(2)` alone (no `shutdown(2)` first): bytes still queued for a slow client must arrive.

mod support;

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};
use support::*;

/// Bytes each tunnel moves in each direction: well past the 128 KiB after which a direction
/// splices, and past the proxy's 1 MiB pipe.
const PAYLOAD: usize = 8 << 20;

/// Bytes that differ at every offset a relay could shift them by (a multiplicative hash).
fn payload(seed: u32) -> Vec<u8> {
    (0..PAYLOAD as u32)
        .map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect()
}

/// An origin that echoes each connection until EOF, then half-closes; one thread per connection.
fn echo_origin() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut s) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if s.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = s.shutdown(Shutdown::Write);
            });
        }
    });
    addr
}

fn connect_tunnel(proxy: SocketAddr, origin: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(proxy).expect("connect proxy");
    write!(s, "CONNECT {origin} HTTP/1.1\r\nHost: {origin}\r\n\r\n").expect("CONNECT");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).expect("CONNECT answer");
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    s
}

fn socks5_tunnel(proxy: SocketAddr, origin: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(proxy).expect("connect proxy");
    s.write_all(&[5, 1, 0]).expect("greeting");
    let mut reply = [0u8; 2];
    s.read_exact(&mut reply).expect("method");
    assert_eq!(reply, [5, 0]);
    let SocketAddr::V4(v4) = origin else {
        panic!("origin is IPv4")
    };
    let mut req = vec![5, 1, 0, 1];
    req.extend_from_slice(&v4.ip().octets());
    req.extend_from_slice(&v4.port().to_be_bytes());
    s.write_all(&req).expect("CONNECT");
    let mut answer = [0u8; 10];
    s.read_exact(&mut answer).expect("CONNECT answer");
    assert_eq!(answer[1], 0, "SOCKS5 reply {answer:?}");
    s
}

/// Sends `data` and half-closes while reading the echo to EOF; the echo must equal `data`.
fn echo_through(mut s: TcpStream, data: Vec<u8>) {
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut writer = s.try_clone().expect("clone");
    let sent = std::thread::spawn(move || {
        writer.write_all(&data).expect("write through the tunnel");
        writer.shutdown(Shutdown::Write).expect("half-close");
        data
    });
    let mut back = Vec::with_capacity(PAYLOAD);
    s.read_to_end(&mut back)
        .expect("read the echo to EOF (the origin's half-close)");
    let data = sent.join().expect("writer");
    assert_eq!(back.len(), data.len(), "echoed length");
    assert!(back == data, "echoed bytes differ from the bytes sent");
}

fn metrics_addr(s: &Server) -> SocketAddr {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let lines = s.logs.lock().map(|l| l.clone()).unwrap_or_default();
        if let Some(addr) = lines
            .iter()
            .filter(|l| l.contains("\"metrics listening\""))
            .find_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                v["fields"]["listen"].as_str()?.parse().ok()
            })
        {
            return addr;
        }
        assert!(Instant::now() < deadline, "no metrics listener in the log");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metric(addr: SocketAddr, name: &str) -> u64 {
    let out = curl(&["-sS", "--max-time", "10", &format!("http://{addr}/metrics")]);
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{name} missing in\n{text}")) as u64
}

/// Both tunnels through a server with `SWITCHYARD_RELAY=relay`; checks the byte counters and
/// returns the spliced-bytes metric.
fn bulk_tunnels(relay: &str) -> u64 {
    let origin = echo_origin();
    let env = [("SWITCHYARD_RELAY", OsStr::new(relay))];
    let server = start_server_with_yaml_env(
        "metrics: { enabled: true, listen: \"127.0.0.1:0\" }\n",
        &env,
    );
    let metrics = metrics_addr(&server);
    echo_through(connect_tunnel(server.http, origin), payload(1));
    echo_through(socks5_tunnel(server.socks5, origin), payload(2));
    assert_eq!(server.wait_idle(), 0, "tunnels still open after both EOFs");
    let received = metric(metrics, "switchyard_bytes_received_total");
    let sent = metric(metrics, "switchyard_bytes_sent_total");
    let both_tunnels = 2 * PAYLOAD as u64;
    assert!(received >= both_tunnels, "received {received}");
    assert!(sent >= both_tunnels, "sent {sent}");
    let spliced = metric(metrics, "switchyard_relay_spliced_bytes_total");
    assert!(
        spliced <= received + sent,
        "spliced {spliced} of {received} + {sent}"
    );
    spliced
}

#[test]
fn bulk_tunnels_splice_every_byte_in_order() {
    let spliced = bulk_tunnels("splice");
    // Each direction copies until it has moved 128 KiB (at most one 256 KiB read more), then
    // splices the rest: four directions over two tunnels.
    let at_least = 4 * (PAYLOAD as u64 - (512 << 10));
    assert!(spliced >= at_least, "spliced {spliced}, want ≥ {at_least}");
}

#[test]
fn bulk_tunnels_copy_when_splicing_is_off() {
    assert_eq!(bulk_tunnels("copy"), 0);
}

/// An origin that reads each connection to EOF (the client's half-close), then sends
/// [`PAYLOAD`] bytes of `payload(seed)` and closes.
fn closing_origin(seed: u32) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        let body = payload(seed);
        for conn in l.incoming() {
            let Ok(mut s) = conn else { return };
            let body = body.clone();
            std::thread::spawn(move || {
                let mut sink = Vec::new();
                if s.read_to_end(&mut sink).is_ok() {
                    let _ = s.write_all(&body);
                }
            });
        }
    });
    addr
}

/// Half-closes at once, lets the tunnel fill the socket buffers towards it before reading (so
/// that the proxy reaches the origin's EOF, the tunnel's last direction, with bytes still
/// queued for this client), then reads to EOF: every byte, in order, and a clean end.
fn read_all_after_a_pause(mut s: TcpStream, seed: u32) {
    s.set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    s.shutdown(Shutdown::Write).expect("half-close");
    std::thread::sleep(Duration::from_millis(300));
    let mut back = Vec::with_capacity(PAYLOAD);
    s.read_to_end(&mut back)
        .expect("read to EOF (a reset would mean queued bytes were dropped)");
    assert_eq!(back.len(), PAYLOAD, "bytes received");
    assert!(back == payload(seed), "bytes differ from the origin's");
}

fn queued_bytes_survive_the_tunnel_close(relay: &str) {
    let env = [("SWITCHYARD_RELAY", OsStr::new(relay))];
    let server = start_server_with_yaml_env("", &env);
    read_all_after_a_pause(connect_tunnel(server.http, closing_origin(3)), 3);
    read_all_after_a_pause(socks5_tunnel(server.socks5, closing_origin(4)), 4);
    assert_eq!(server.wait_idle(), 0, "tunnels still open after both EOFs");
}

#[test]
fn queued_bytes_survive_the_tunnel_close_when_splicing() {
    queued_bytes_survive_the_tunnel_close("splice");
}

#[test]
fn queued_bytes_survive_the_tunnel_close_when_copying() {
    queued_bytes_survive_the_tunnel_close("copy");
}

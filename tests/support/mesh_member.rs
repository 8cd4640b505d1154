//! A malicious mesh member for the trust tests: it enrolls like any peer (its own X25519 key, a
//! single-use enrollment key), holds a real WireGuard session with a victim peer, and then
//! speaks the mesh protocol with lies in it — forged sources, route and group claims, floods in
//! another member's name, handshake floods, off-path cookie replies, unauthenticated ICE checks.
//! What the victim must do with each is the test's business; this only sends.
#![allow(dead_code)]
#![allow(unsafe_code)] // setns(2) in `udp_socket_in`, the one syscall std does not wrap.

use base64::Engine as _;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use switchyard_dataplane::mesh::wire;
use switchyard_mesh_routing::l2::mac::MacAddr;
use switchyard_mesh_routing::Message;

/// An Ethernet frame from `src` to `dst` carrying IPv4 packet `packet`.
pub fn ipv4_frame(dst: MacAddr, src: MacAddr, packet: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(14 + packet.len());
    frame.extend_from_slice(&dst.0);
    frame.extend_from_slice(&src.0);
    frame.extend_from_slice(&[0x08, 0x00]);
    frame.extend_from_slice(packet);
    frame
}

/// A UDP socket bound to `0.0.0.0:0` inside network namespace `ns`.
pub fn udp_socket_in(ns: &str) -> UdpSocket {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let f = File::open(&path).expect("netns file");
        // SAFETY: setns(2) with a valid namespace fd only moves this short-lived thread, which
        // does nothing but bind the socket, into that network namespace.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        UdpSocket::bind("0.0.0.0:0").expect("bind in netns")
    })
    .join()
    .expect("bind thread")
}

pub fn base64_key(key: &[u8; 32]) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

pub fn key_from_base64(text: &str) -> [u8; 32] {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64 key");
    <[u8; 32]>::try_from(bytes.as_slice()).expect("32-byte key")
}

/// The member: its socket (in its namespace), its key, and its session with one victim.
pub struct Member {
    pub id: String,
    pub socket: UdpSocket,
    pub secret: StaticSecret,
    pub vip: Ipv4Addr,
    pub victim: SocketAddr,
    tunn: Tunn,
    /// Decrypted packets the victim sent us.
    pub received: Vec<Vec<u8>>,
    buf: Vec<u8>,
}

impl Member {
    /// Our public key for the registry.
    pub fn public_key_of(secret: &StaticSecret) -> String {
        base64_key(PublicKey::from(secret).as_bytes())
    }

    /// A member with `secret`, known to the registry at `vip`, with a session (not yet
    /// handshaken) towards the peer whose key is `victim_key` at `victim`.
    pub fn new(
        id: &str,
        socket: UdpSocket,
        secret: StaticSecret,
        vip: Ipv4Addr,
        victim: SocketAddr,
        victim_key: [u8; 32],
        psk: Option<[u8; 32]>,
    ) -> Member {
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        let tunn = Tunn::new(
            secret.clone(),
            PublicKey::from(victim_key),
            psk,
            Some(5),
            0x00a1_1ce0 >> 8,
            None,
        );
        Member {
            id: id.to_owned(),
            socket,
            secret,
            vip,
            victim,
            tunn,
            received: Vec::new(),
            buf: vec![0; 65_536],
        }
    }

    fn send(&self, d: &[u8]) {
        let _ = self.socket.send_to(d, self.victim);
    }

    /// Receives and answers for `time`: handshakes, keepalives, decrypted packets kept.
    pub fn pump(&mut self, time: Duration) {
        let end = Instant::now() + time;
        let mut datagram = vec![0u8; 65_536];
        while Instant::now() < end {
            if let TunnResult::WriteToNetwork(d) = self.tunn.update_timers(&mut self.buf) {
                let d = d.to_vec();
                self.send(&d);
            }
            let Ok((n, from)) = self.socket.recv_from(&mut datagram) else {
                continue;
            };
            if from != self.victim {
                continue;
            }
            let mut src = Some(from.ip());
            loop {
                match self.tunn.decapsulate(src, &datagram[..n], &mut self.buf) {
                    TunnResult::WriteToNetwork(d) => {
                        let d = d.to_vec();
                        self.send(&d);
                        // queued packets follow a handshake: drain them
                        src = None;
                        if self.drain_queued() {
                            break;
                        }
                    }
                    TunnResult::WriteToTunnelV4(p, _) => {
                        self.received.push(p.to_vec());
                        break;
                    }
                    _ => break,
                }
            }
        }
    }

    /// Sends what boringtun queued; true when done.
    fn drain_queued(&mut self) -> bool {
        loop {
            match self.tunn.decapsulate(None, &[], &mut self.buf) {
                TunnResult::WriteToNetwork(d) => {
                    let d = d.to_vec();
                    self.send(&d);
                }
                _ => return true,
            }
        }
    }

    /// Handshakes with the victim (bounded): whether a session is up.
    pub fn connect(&mut self, patience: Duration) -> bool {
        let end = Instant::now() + patience;
        while Instant::now() < end {
            if let TunnResult::WriteToNetwork(d) =
                self.tunn.format_handshake_initiation(&mut self.buf, false)
            {
                let d = d.to_vec();
                self.send(&d);
            }
            self.pump(Duration::from_millis(500));
            if self.tunn.time_since_last_handshake().is_some() {
                return true;
            }
        }
        false
    }

    /// Sends IP packet `packet` through the session (encrypted with our real key).
    pub fn send_packet(&mut self, packet: &[u8]) {
        if let TunnResult::WriteToNetwork(d) = self.tunn.encapsulate(packet, &mut self.buf) {
            let d = d.to_vec();
            self.send(&d);
        }
    }

    /// Sends mesh control message `m` from our address to `to` on the control port.
    pub fn send_control(&mut self, to: Ipv4Addr, m: &Message) {
        let payload = m.encode().expect("encodable message");
        let packet = wire::udp_packet(self.vip, to, wire::CONTROL_PORT, &payload);
        self.send_packet(&packet);
    }

    /// `count` handshake initiations: with a real mac1 (`valid`: each a fresh initiation of
    /// our own session) or 148 bytes of type 1 with garbage after the header.
    pub fn handshake_flood(&mut self, count: usize, valid: bool) {
        for i in 0..count {
            if valid {
                if let TunnResult::WriteToNetwork(d) =
                    self.tunn.format_handshake_initiation(&mut self.buf, true)
                {
                    let d = d.to_vec();
                    self.send(&d);
                }
            } else {
                let mut d = [0u8; 148];
                d[0] = 1;
                d[4..8].copy_from_slice(&(i as u32).to_le_bytes());
                for (j, b) in d.iter_mut().enumerate().skip(8) {
                    *b = (i.wrapping_mul(31) ^ j.wrapping_mul(7)) as u8;
                }
                self.send(&d);
            }
        }
    }

    /// Cookie replies (type 3, 64 bytes) for receiver indexes `indexes`, as an off-path
    /// sender would guess them: their content cannot be right, their arrival is the attack.
    pub fn cookie_replies(&self, indexes: impl Iterator<Item = u32>) {
        for index in indexes {
            let mut d = [0u8; 64];
            d[0] = 3;
            d[4..8].copy_from_slice(&index.to_le_bytes());
            self.send(&d);
        }
    }

    /// A STUN binding request with a USERNAME naming the pair and a MESSAGE-INTEGRITY that no
    /// key made (an outsider's connectivity check).
    pub fn forged_ice_check(&self, username: &str) {
        let mut attrs = Vec::new();
        let user = username.as_bytes();
        attrs.extend_from_slice(&0x0006u16.to_be_bytes());
        attrs.extend_from_slice(&(user.len() as u16).to_be_bytes());
        attrs.extend_from_slice(user);
        while attrs.len() % 4 != 0 {
            attrs.push(0);
        }
        attrs.extend_from_slice(&0x0008u16.to_be_bytes());
        attrs.extend_from_slice(&20u16.to_be_bytes());
        attrs.extend_from_slice(&[0x5a; 20]);
        let mut d = Vec::with_capacity(20 + attrs.len());
        d.extend_from_slice(&0x0001u16.to_be_bytes());
        d.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
        d.extend_from_slice(&[0x21, 0x12, 0xA4, 0x42]);
        d.extend_from_slice(&[0x77; 12]);
        d.extend_from_slice(&attrs);
        self.send(&d);
    }

    /// Any datagram the victim sent to our socket within `time` (answers to forged checks).
    pub fn raw_answers(&self, time: Duration) -> usize {
        let end = Instant::now() + time;
        let mut n = 0;
        let mut buf = [0u8; 2048];
        while Instant::now() < end {
            if let Ok((len, from)) = self.socket.recv_from(&mut buf) {
                // a STUN answer starts with a class/method word and the magic cookie
                if from == self.victim && len >= 20 && buf[4..8] == [0x21, 0x12, 0xA4, 0x42] {
                    n += 1;
                }
            }
        }
        n
    }

    /// TAP mode: sends Ethernet frame `frame` to the member at `to` as EtherIP through the
    /// session (the way a TAP peer's frames travel).
    pub fn send_frame(&mut self, to: Ipv4Addr, frame: &[u8]) {
        let packet = wire::etherip_packet(self.vip, to, frame);
        self.send_packet(&packet);
    }

    /// TAP mode: whether any EtherIP frame we received was addressed to MAC `dst`.
    pub fn got_frame_for(&self, dst: MacAddr) -> bool {
        self.received
            .iter()
            .filter_map(|p| wire::etherip_frame(p))
            .any(|f| MacAddr::destination_of(f) == Some(dst))
    }

    /// Whether any decrypted packet we received was addressed to `dst`.
    pub fn got_packet_for(&self, dst: Ipv4Addr) -> bool {
        self.received
            .iter()
            .any(|p| wire::ipv4_addresses(p).is_some_and(|(_, d)| d == dst))
    }

    pub fn victim_ip(&self) -> IpAddr {
        self.victim.ip()
    }
}

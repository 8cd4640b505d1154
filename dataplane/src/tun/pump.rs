//! The TUN pump: one thread that reads every packet from the TUN device, translates it with
//! the [`Translator`] and writes it straight back into the device. It never touches a flow's
//! payload beyond the NAT rewrite — the TCP connections themselves are terminated by the kernel
//! and served on the glommio cores — and it shares nothing with the control plane but atomics.

use super::frag::{self, Limits, Reassembler, Reassembly};
use super::icmp;
use super::nat::{Drop as Dropped, Outcome, Translator};
use super::vnet::{self, VnetHeader};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

/// Measured traffic of the TUN path (payload bytes of translated TCP segments).
#[derive(Debug, Default)]
pub struct TunStats {
    /// From local applications into the tunnel.
    pub bytes_sent: AtomicU64,
    /// From the tunnel back to local applications.
    pub bytes_received: AtomicU64,
    pub packets: AtomicU64,
    /// Packets the NAT does not handle (ICMP other than echo requests, IPv6 with extension
    /// headers or fragments, IPv6 when the TUN has no IPv6 address, stray segments), and
    /// fragments and incomplete datagrams that reassembly gave up on (also counted in
    /// `fragments_dropped`).
    pub dropped: AtomicU64,
    /// IPv4 datagrams put back together from fragments.
    pub reassembled: AtomicU64,
    /// Fragments reassembly refused (malformed, overlapping, past 64 KiB or its bounds) plus
    /// datagrams freed incomplete after the reassembly timeout.
    pub fragments_dropped: AtomicU64,
    /// ICMP echo requests handed to the cores to be answered ([`super::echo`]).
    pub echo_requests: AtomicU64,
    /// Echo replies written into the TUN (the destination answered a probe over its route).
    pub echo_answered: AtomicU64,
    /// Echo requests answered "host unreachable" (the route's backend cannot reach it).
    pub echo_unreachable: AtomicU64,
    /// Echo requests answered "administratively prohibited" (no route, a route that carries
    /// nothing there, or no core to hand them to).
    pub echo_prohibited: AtomicU64,
    /// Echo requests left unanswered: the probe got no verdict within its bound (`ping` counts
    /// a loss, as for a lost packet).
    pub echo_dropped: AtomicU64,
    /// Echo requests refused by the bounds (probes in flight, requests waiting for one probe,
    /// probes started per second): unanswered too.
    pub echo_limited: AtomicU64,
    /// Flows in the NAT right now.
    pub flows: AtomicU64,
    /// TCP flows the cores reset because their route was blocked (the kill switch).
    pub blocked_tcp: AtomicU64,
    /// TCP flows the eBPF classifier sent to the cores' loopback listeners from `connect(2)`,
    /// past the TUN (their bytes are in `bytes_sent` / `bytes_received` too).
    pub redirected_tcp: AtomicU64,
}

/// A running pump; [`TunPump::stop`] ends the thread and closes the device.
pub struct TunPump {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long a poll waits before the stop flag and flow expiry are checked again.
const POLL_MS: i32 = 200;

impl TunPump {
    pub fn start(
        device: std::fs::File,
        translator: Translator,
        stats: Arc<TunStats>,
    ) -> std::io::Result<TunPump> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("vpn-tun".into())
            .spawn(move || run(device, translator, &stats, &flag))?;
        Ok(TunPump {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it (at most one poll interval).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TunPump {
    fn drop(&mut self) {
        self.halt();
    }
}

fn run(mut device: std::fs::File, mut nat: Translator, stats: &TunStats, stop: &AtomicBool) {
    let started = Instant::now();
    let mut last_sweep = 0;
    let mut frags = Reassembler::new(Limits::default());
    let fd = device.as_raw_fd();
    let vnet_hdr = match crate::sys::tun_has_vnet_hdr(fd) {
        Ok(v) => v,
        Err(e) => {
            tracing::error!(error = %e, "the TUN device's flags cannot be read; the VPN path stops");
            return;
        }
    };
    // the largest IPv4 packet (a 64 KiB TSO super-packet) after the header
    let mut buf = vec![0u8; vnet::LEN + usize::from(u16::MAX)];
    // echo requests go to the cores through the VPN UDP socket, when there is one
    let carrier = nat.echo_carrier();
    // read until EAGAIN and poll only then: one syscall per packet under load instead of two
    if let Err(e) = crate::sys::set_nonblocking(fd) {
        tracing::error!(error = %e, "the TUN device cannot be made non-blocking; the VPN path stops");
        return;
    }
    while !stop.load(Relaxed) {
        let now = started.elapsed().as_secs();
        if now != last_sweep {
            last_sweep = now;
            nat.sweep(now);
            stats.flows.store(nat.open_flows() as u64, Relaxed);
            let timed_out = frags.sweep(now) as u64;
            if timed_out > 0 {
                stats.fragments_dropped.fetch_add(timed_out, Relaxed);
                stats.dropped.fetch_add(timed_out, Relaxed);
                tracing::debug!(timed_out, "incomplete fragmented datagrams freed");
            }
        }
        let n = match device.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Err(e) = crate::sys::wait_readable(fd, POLL_MS) {
                    tracing::error!(error = %e, "polling the TUN device failed; the VPN path stops");
                    return;
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::error!(error = %e, "reading the TUN device failed; the VPN path stops");
                return;
            }
        };
        stats.packets.fetch_add(1, Relaxed);
        let Some(n) = reassemble(&mut frags, &mut buf, n, vnet_hdr, now, stats) else {
            continue;
        };
        let frame = &mut buf[..n];
        if let Some(c) = carrier {
            if write_carried_answer(&mut device, frame, vnet_hdr, &c, stats) {
                continue;
            }
        }
        let translated = if vnet_hdr {
            translate_offloaded(&mut nat, frame, now)
        } else {
            nat.translate(frame, now)
        };
        match translated {
            Outcome::Outbound(payload) => {
                stats.bytes_sent.fetch_add(payload as u64, Relaxed);
            }
            Outcome::Inbound(payload) => {
                stats.bytes_received.fetch_add(payload as u64, Relaxed);
            }
            Outcome::Dropped(why) => {
                if answer_echo(&mut device, frame, vnet_hdr, &nat, stats) {
                    continue;
                }
                stats.dropped.fetch_add(1, Relaxed);
                tracing::trace!(?why, len = n, "TUN packet dropped");
                continue;
            }
        }
        // a full device queue drops the packet, as a router would; TCP retransmits
        if let Err(e) = device.write(frame) {
            tracing::debug!(error = %e, "writing to the TUN device failed");
            stats.dropped.fetch_add(1, Relaxed);
        }
    }
}

/// Hands an echo request to the cores (carried to the VPN UDP socket, [`icmp::carry`]), or,
/// without a VPN UDP socket, answers it "administratively prohibited" so `ping` says the packet
/// was filtered instead of waiting. Whether `frame` was an echo request handled so.
fn answer_echo(
    device: &mut std::fs::File,
    frame: &[u8],
    vnet_hdr: bool,
    nat: &Translator,
    stats: &TunStats,
) -> bool {
    let at = if vnet_hdr { vnet::LEN } else { 0 };
    let Some(packet) = frame.get(at..) else {
        return false;
    };
    if let Some(carried) = nat.echo_carrier().and_then(|c| icmp::carry(packet, &c)) {
        let counter = if write_packet(device, &carried, vnet_hdr) {
            &stats.echo_requests
        } else {
            &stats.echo_dropped
        };
        counter.fetch_add(1, Relaxed);
        return true;
    }
    let reply = match packet.first().map(|b| b >> 4) {
        Some(4) => icmp::filtered_reply(packet, nat.gateway()),
        Some(6) => nat
            .gateway6()
            .and_then(|gateway| icmp::filtered_reply6(packet, gateway)),
        _ => None,
    };
    let Some(reply) = reply else {
        return false;
    };
    if write_packet(device, &reply, vnet_hdr) {
        stats.echo_prohibited.fetch_add(1, Relaxed);
    }
    true
}

/// Writes a core's answer to a carried echo request into the TUN, when `frame` is one
/// ([`icmp::carried_answer`]), and counts it. Whether `frame` was one.
fn write_carried_answer(
    device: &mut std::fs::File,
    frame: &[u8],
    vnet_hdr: bool,
    carrier: &icmp::Carrier,
    stats: &TunStats,
) -> bool {
    let at = if vnet_hdr { vnet::LEN } else { 0 };
    let Some((answer, kind)) = frame
        .get(at..)
        .and_then(|p| icmp::carried_answer(p, carrier))
    else {
        return false;
    };
    if write_packet(device, answer, vnet_hdr) {
        let counter = match kind {
            icmp::Answer::EchoReply => &stats.echo_answered,
            icmp::Answer::Refused(icmp::Refusal::HostUnreachable) | icmp::Answer::Other => {
                &stats.echo_unreachable
            }
            icmp::Answer::Refused(icmp::Refusal::Prohibited) => &stats.echo_prohibited,
        };
        counter.fetch_add(1, Relaxed);
    }
    true
}

/// Writes a packet the pump made into the TUN (after a plain virtio-net header when the device
/// has them); whether the device took it.
fn write_packet(device: &mut std::fs::File, packet: &[u8], vnet_hdr: bool) -> bool {
    let mut out = Vec::with_capacity(vnet::LEN + packet.len());
    if vnet_hdr {
        out.extend_from_slice(&VnetHeader::default().to_bytes());
    }
    out.extend_from_slice(packet);
    // a TUN write takes the whole packet or fails
    match device.write(&out) {
        Ok(n) if n == out.len() => true,
        Ok(n) => {
            tracing::debug!(n, "the TUN device took part of a packet");
            false
        }
        Err(e) => {
            tracing::debug!(error = %e, "writing a packet to the TUN device failed");
            false
        }
    }
}

/// Passes the frame `buf[..n]` through fragment reassembly. `Some(len)`: translate `buf[..len]`
/// — the frame itself when it is no fragment, or the datagram its fragment completed, copied
/// over it (after a plain virtio-net header when the device has them; `buf` holds the largest
/// IPv4 packet). `None`: the fragment is held or dropped (counted).
fn reassemble(
    frags: &mut Reassembler,
    buf: &mut [u8],
    n: usize,
    vnet_hdr: bool,
    now: u64,
    stats: &TunStats,
) -> Option<usize> {
    let at = if vnet_hdr { vnet::LEN } else { 0 };
    let Some(packet) = buf.get(at..n).filter(|p| frag::is_fragment(p)) else {
        return Some(n);
    };
    if vnet_hdr {
        // the kernel completes checksums before it fragments: a fragment with offloads is
        // not one this path produced, and the NAT drops it
        let plain = VnetHeader::parse(buf).is_some_and(|h| {
            h.flags & vnet::F_NEEDS_CSUM == 0 && h.gso_type & !vnet::GSO_ECN == vnet::GSO_NONE
        });
        if !plain {
            return Some(n);
        }
    }
    match frags.add(packet, now) {
        Reassembly::Held => None,
        Reassembly::Dropped(why) => {
            stats.fragments_dropped.fetch_add(1, Relaxed);
            stats.dropped.fetch_add(1, Relaxed);
            tracing::trace!(?why, len = n, "IPv4 fragment dropped");
            None
        }
        Reassembly::Complete(datagram) => {
            let len = at + datagram.len();
            buf.get_mut(at..len)?.copy_from_slice(&datagram);
            if vnet_hdr {
                buf[..at].copy_from_slice(&VnetHeader::default().to_bytes());
            }
            stats.reassembled.fetch_add(1, Relaxed);
            Some(len)
        }
    }
}

/// Translates one frame of a device with virtio-net headers (header, then packet) in place; the
/// frame goes back to the device as it is, header included (a super-packet stays one).
fn translate_offloaded(nat: &mut Translator, frame: &mut [u8], now: u64) -> Outcome {
    let Some(mut hdr) = VnetHeader::parse(frame) else {
        return Outcome::Dropped(Dropped::Unsupported);
    };
    let (head, packet) = frame.split_at_mut(vnet::LEN);
    let Ok(checksum) = vnet::prepare(&mut hdr, packet) else {
        return Outcome::Dropped(Dropped::Unsupported);
    };
    let outcome = nat.translate_with(packet, checksum, now);
    head.copy_from_slice(&hdr.to_bytes());
    outcome
}

#[cfg(test)]
mod tests {
    use super::super::nat::{NatAddresses, NatTable, FIRST_PORT};
    use super::super::packet::tests::{full_checksums, packet, partial};
    use super::super::packet::{self, ACK, SYN};
    use super::super::vnet::{F_NEEDS_CSUM, GSO_TCPV4};
    use super::*;
    use std::net::SocketAddrV4;

    fn sa(s: &str) -> SocketAddrV4 {
        s.parse().expect("address")
    }

    fn frame(hdr: VnetHeader, packet: &[u8]) -> Vec<u8> {
        [&hdr.to_bytes()[..], packet].concat()
    }

    #[test]
    fn fragments_are_reassembled_then_translated_as_one_datagram() {
        use super::super::frag::tests::{datagram, fragments, payload};
        use super::super::udp_nat::{self, UdpNat};
        let addrs = |listen_port| NatAddresses {
            tun_ip: "10.255.0.2".parse().expect("ip"),
            listen_port,
            gateway: "10.255.0.1".parse().expect("ip"),
        };
        let mut nat =
            Translator::new(addrs(7000), Arc::new(NatTable::new(FIRST_PORT, 8))).with_udp(
                UdpNat::new(addrs(7001), Arc::new(NatTable::new(FIRST_PORT, 8))),
            );
        let stats = TunStats::default();
        let body = payload(20_000);
        let whole = datagram(&body);
        for vnet_hdr in [true, false] {
            let at = if vnet_hdr { vnet::LEN } else { 0 };
            let mut frags = Reassembler::new(Limits::default());
            let mut buf = vec![0u8; vnet::LEN + usize::from(u16::MAX)];
            let pieces = fragments(&whole, 1400);
            let (last, rest) = pieces.split_last().expect("fragments");
            for piece in rest {
                buf[at..at + piece.len()].copy_from_slice(piece);
                let n = at + piece.len();
                assert_eq!(
                    reassemble(&mut frags, &mut buf, n, vnet_hdr, 0, &stats),
                    None
                );
            }
            buf[at..at + last.len()].copy_from_slice(last);
            let n = reassemble(&mut frags, &mut buf, at + last.len(), vnet_hdr, 0, &stats)
                .expect("complete");
            assert_eq!(n, at + whole.len());
            let outcome = if vnet_hdr {
                assert_eq!(VnetHeader::parse(&buf), Some(VnetHeader::default()));
                translate_offloaded(&mut nat, &mut buf[..n], 0)
            } else {
                nat.translate(&mut buf[..n], 0)
            };
            assert_eq!(outcome, Outcome::Outbound(body.len()));
            let d = udp_nat::parse(&buf[at..n]).expect("one whole UDP datagram");
            assert_eq!(d.dst, sa("10.255.0.2:7001"));
            assert_eq!(&buf[at + 28..n], &body[..]);
        }
        assert_eq!(stats.reassembled.load(Relaxed), 2);
        // a packet that is no fragment passes untouched
        let mut buf = whole.clone();
        let n = buf.len();
        assert_eq!(
            reassemble(
                &mut Reassembler::new(Limits::default()),
                &mut buf,
                n,
                false,
                0,
                &stats
            ),
            Some(n)
        );
        assert_eq!(buf, whole);
    }

    #[test]
    fn a_super_packet_is_rewritten_once_and_goes_back_with_its_header() {
        let table = Arc::new(NatTable::new(FIRST_PORT, 8));
        let mut nat = Translator::new(
            NatAddresses {
                tun_ip: "10.255.0.2".parse().expect("ip"),
                listen_port: 7000,
                gateway: "10.255.0.1".parse().expect("ip"),
            },
            table,
        );
        let (app, dst) = (sa("10.255.0.2:40000"), sa("192.0.2.9:443"));
        // the SYN arrives with a complete checksum, no offload flags
        let mut syn = frame(VnetHeader::default(), &packet(app, dst, SYN, b""));
        assert_eq!(
            translate_offloaded(&mut nat, &mut syn, 1),
            Outcome::Outbound(0)
        );
        let after = &syn[vnet::LEN..];
        assert_eq!(
            packet::parse(after).expect("tcp").dst,
            sa("10.255.0.2:7000")
        );
        assert_eq!(
            full_checksums(after).1,
            u16::from_be_bytes([after[36], after[37]])
        );
        // then 45 segments' worth of data in one TSO super-packet with a pending checksum
        let gso = VnetHeader {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: 40,
            gso_size: 1380,
            csum_start: 20,
            csum_offset: 16,
        };
        let payload = vec![0xa5; 45 * 1380];
        let mut data = frame(gso, &partial(app, dst, ACK, &payload));
        assert_eq!(
            translate_offloaded(&mut nat, &mut data, 1),
            Outcome::Outbound(payload.len())
        );
        assert_eq!(VnetHeader::parse(&data), Some(gso));
        let expected = partial(sa("10.255.0.1:10000"), sa("10.255.0.2:7000"), ACK, &payload);
        assert_eq!(&data[vnet::LEN..], &expected[..]);
        // a frame shorter than its header is dropped
        let mut short = vec![0u8; vnet::LEN - 1];
        assert_eq!(
            translate_offloaded(&mut nat, &mut short, 1),
            Outcome::Dropped(Dropped::Unsupported)
        );
    }
}

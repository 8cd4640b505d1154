//! The TUN pump: one thread that reads every packet from the TUN device, translates it with
//! the [`Translator`] and writes it straight back into the device. It never touches a flow's
//! payload beyond the NAT rewrite — the TCP connections themselves are terminated by the kernel
//! and served on the glommio cores — and it shares nothing with the control plane but atomics.

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
    /// Packets the NAT does not handle (IPv6, UDP, ICMP, stray segments).
    pub dropped: AtomicU64,
    /// Flows in the NAT right now.
    pub flows: AtomicU64,
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
        let frame = &mut buf[..n];
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

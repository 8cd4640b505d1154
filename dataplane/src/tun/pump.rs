//! The TUN pump: one thread that reads every packet from the TUN device, translates it with
//! the [`Translator`] and writes it straight back into the device. It never touches a flow's
//! payload beyond the NAT rewrite — the TCP connections themselves are terminated by the kernel
//! and served on the glommio cores — and it shares nothing with the control plane but atomics.

use super::nat::{Outcome, Translator};
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
    let mut buf = vec![0u8; 65536];
    let fd = device.as_raw_fd();
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
        let packet = &mut buf[..n];
        match nat.translate(packet, now) {
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
        if let Err(e) = device.write(packet) {
            tracing::debug!(error = %e, "writing to the TUN device failed");
            stats.dropped.fetch_add(1, Relaxed);
        }
    }
}

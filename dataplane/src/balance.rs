//! Which core gets a new connection. Every core listens on its own `SO_REUSEPORT` socket of each
//! port; left to itself the kernel picks one by a hash of the connection's addresses, which
//! splits a few dozen long-lived clients unevenly (wrk's 64 keep-alive connections came out
//! 35/29 on two cores, 40/24 in an earlier run), and every client of the busier core waits
//! longer for each answer. An
//! `sk_reuseport` eBPF program ([`switchyard_ebpf::ReuseportBalancer`]) hands connections to the
//! cores in turn instead. Loading it needs `CAP_BPF`; without it (or with
//! `SWITCHYARD_REUSEPORT=hash`, the bench's comparison) the kernel's hash stays, as before.
//!
//! Only start-up and the core supervisors (control threads) touch this; a data-plane core never
//! does.

use std::os::fd::{AsFd, BorrowedFd};

use socket2::Socket;
use switchyard_ebpf::ReuseportBalancer;

/// How new connections are spread over the cores' listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selection {
    /// The eBPF program: in turn.
    RoundRobin,
    /// The kernel's hash of the 4-tuple (one core, the switch off, or the program not loadable).
    Hash,
}

/// Whether round-robin was asked for: unless `SWITCHYARD_REUSEPORT=hash`.
fn wanted() -> bool {
    !matches!(std::env::var("SWITCHYARD_REUSEPORT").as_deref(), Ok("hash"))
}

/// The balancers of one data plane's listener groups (HTTP, SOCKS5, VPN), in that order.
#[derive(Default)]
pub(crate) struct ListenerBalance {
    groups: Vec<Option<ReuseportBalancer>>,
}

impl ListenerBalance {
    /// Attaches a balancer to each group whose sockets are given in core order (socket `i` is
    /// core `i`'s). A group with one socket, or one the program cannot attach to, keeps the hash.
    pub(crate) fn attach(groups: &[&[Socket]]) -> Self {
        let want = wanted();
        let groups = groups
            .iter()
            .map(|sockets| {
                if !want || sockets.len() < 2 {
                    return None;
                }
                let fds: Vec<BorrowedFd<'_>> = sockets.iter().map(|s| s.as_fd()).collect();
                match ReuseportBalancer::attach(&fds) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        tracing::info!(error = %e, "new connections go to cores by the kernel's hash (round-robin needs the sk_reuseport eBPF program)");
                        None
                    }
                }
            })
            .collect();
        ListenerBalance { groups }
    }

    /// How the group at `group` (0 HTTP, 1 SOCKS5, 2 VPN) selects.
    pub(crate) fn selection(&self, group: usize) -> Selection {
        match self.groups.get(group) {
            Some(Some(_)) => Selection::RoundRobin,
            _ => Selection::Hash,
        }
    }

    /// A restarted core's fresh listeners (`None` where it has none) take its turns again.
    pub(crate) fn replace(&mut self, core: usize, sockets: &[Option<&Socket>]) {
        for (balancer, socket) in self.groups.iter_mut().zip(sockets) {
            if let (Some(b), Some(s)) = (balancer, socket) {
                if let Err(e) = b.replace(core, s.as_fd()) {
                    // its turns fall back to the kernel's hash: connections still arrive
                    tracing::warn!(core, error = %e, "a restarted core's listener is not in the round-robin");
                }
            }
        }
    }
}

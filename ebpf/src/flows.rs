//! [`FlowOrigins`]: the original destinations of TCP connections that `connect4|6` redirected to
//! the data plane's loopback listener, by the client address the listener accepts them from
//! (`sy_tcp_flows`, filled by the `sockops` program at the SYN).
//!
//! Taken with one `BPF_MAP_LOOKUP_AND_DELETE_ELEM` (Linux 5.14 for hash maps): no lock and no
//! second syscall on the data plane's cores, and an entry is handed out once.
#![allow(unsafe_code)]

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use crate::maps::{RawFlowKey, RawOrigDst};

/// `BPF_MAP_LOOKUP_AND_DELETE_ELEM` of `<linux/bpf.h>`.
const BPF_MAP_LOOKUP_AND_DELETE_ELEM: libc::c_long = 21;

/// The map-element member of `union bpf_attr` (the kernel accepts an attr shorter than the union).
#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// Original destinations of redirected TCP connections by the connecting socket's local address.
#[derive(Clone, Debug)]
pub struct FlowOrigins {
    /// `sy_tcp_flows`
    map: Arc<OwnedFd>,
}

impl FlowOrigins {
    pub(crate) fn new(map: OwnedFd) -> Self {
        FlowOrigins { map: Arc::new(map) }
    }

    /// The original destination of the connection whose client (the accepted socket's peer) is
    /// `client`, removed from the map (BPF_MAP_LOOKUP_AND_DELETE_ELEM, one syscall, no lock:
    /// called on the data plane's cores). v4 `client` is looked up as ::ffff:a.b.c.d. A
    /// destination an app gave as v4-mapped IPv6 (a dual-stack socket) comes back as IPv4.
    pub fn take(&self, client: SocketAddr) -> Option<SocketAddr> {
        let key = RawFlowKey::from(client);
        let mut value = RawOrigDst::default();
        let attr = MapElemAttr {
            map_fd: u32::try_from(self.map.as_raw_fd()).ok()?,
            _pad: 0,
            key: (&raw const key) as u64,
            value: (&raw mut value) as u64,
            flags: 0,
        };
        // SAFETY: `attr` is a valid map-element bpf_attr of the size given; the kernel reads
        // `size_of::<RawFlowKey>()` bytes at `key` and writes `size_of::<RawOrigDst>()` bytes at
        // `value` (the map's key and value sizes, checked against BTF when the object loaded),
        // both live for the call; the map descriptor is open for as long as `self`.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_AND_DELETE_ELEM,
                &raw const attr,
                std::mem::size_of::<MapElemAttr>(),
            )
        };
        if rc != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::ENOENT) {
                // every redirected flow would be reset: the operator must see why (once)
                static WARNED: std::sync::atomic::AtomicBool =
                    std::sync::atomic::AtomicBool::new(false);
                if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(%client, %error, "sy_tcp_flows lookup-and-delete failed (needs Linux 5.14): redirected TCP flows are reset; set vpn.tcp_redirect: false");
                } else {
                    tracing::debug!(%client, %error, "sy_tcp_flows lookup-and-delete failed");
                }
            }
            return None;
        }
        value.socket_addr()
    }
}

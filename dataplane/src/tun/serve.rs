//! A flow accepted on the VPN listener: find its original destination in the NAT table, route
//! it with the client's rules and relay it through the chosen backend.

use crate::engine::CoreContext;
use crate::events::Protocol;
use crate::trace::Trace;
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;

/// Ends a flow that cannot be served with a reset: the application sees its connection refused
/// at once (fail closed: an IPv6 flow the server leg cannot carry never goes anywhere else).
fn refuse(stream: &TcpStream) {
    if let Err(e) = crate::sys::set_reset_on_close(stream.as_raw_fd()) {
        tracing::debug!(error = %e, "VPN flow: cannot make its close a reset");
    }
}

pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, ctx: Rc<CoreContext>) {
    let Some(vpn) = ctx.vpn.clone() else {
        return;
    };
    // only the pump's translated flows come from a gateway address
    if !vpn.is_gateway(peer.ip()) {
        tracing::debug!(client = %peer, "VPN listener: not a translated flow");
        return;
    }
    let dst = match vpn.nat.lookup(peer.port()) {
        Some(dst) if dst.is_ipv4() == peer.is_ipv4() => dst,
        _ => {
            tracing::debug!(client = %peer, "VPN listener: no NAT entry");
            return;
        }
    };
    // the flow's client is the application, not the NAT address the kernel shows
    let peer = vpn.nat.app(peer.port()).unwrap_or(peer);
    let ip = dst.ip().to_string();
    // route by the name the application resolved when the resolver saw it, else by address;
    // the dial always goes to the address the application chose
    let host = vpn
        .names
        .load()
        .get(&dst.ip())
        .cloned()
        .unwrap_or_else(|| ip.clone());
    let snapshot = ctx.snapshot.load_full();
    let label = super::host_port(&host, dst.port());
    let mut trace = Trace::new(Protocol::Vpn, "CONNECT");
    trace.host = label.clone();
    trace.url = label.clone();
    let client_ip = peer.ip();
    let Some((_, backend)) = snapshot.select(&host) else {
        refuse(&stream);
        trace.fail(403, format!("no route for {host}"));
        trace.finish(&ctx, &snapshot, client_ip);
        return;
    };
    let backend = backend.clone();
    trace.backend = backend.name.clone();
    let connected = match crate::proxied::dial(&ctx, &snapshot, &backend, &ip, dst.port()).await {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(%host, port = dst.port(), error = %e, "VPN flow: connect failed");
            if matches!(e, crate::error::DataplaneError::Blocked(_)) {
                vpn.stats
                    .blocked_tcp
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            refuse(&stream);
            trace.fail(e.http_status().0, e.to_string());
            trace.finish(&ctx, &snapshot, client_ip);
            return;
        }
    };
    trace.status = 200;
    crate::proxied::run_tunnel(
        &ctx,
        &snapshot,
        RefCell::new(stream),
        connected,
        Vec::new(),
        peer,
        Protocol::Vpn,
        &label,
        &backend,
        trace,
    )
    .await;
}

//! A flow accepted on a VPN listener: find its original destination, route it with the client's
//! rules and relay it through the chosen backend.
//!
//! Two ways in: the TUN path's listener (the pump translated the flow; its destination is in the
//! NAT table, [`serve`]) and the loopback listeners the eBPF classifier redirects tunnelled
//! `connect(2)` calls to (the destination is in the classifier's map, [`serve_redirected`]).

use crate::engine::CoreContext;
use crate::events::Protocol;
use crate::trace::Trace;
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Ends a flow that cannot be served with a reset: the application sees its connection refused
/// at once (fail closed: an IPv6 flow the server leg cannot carry never goes anywhere else).
fn refuse(stream: &TcpStream) {
    if let Err(e) = crate::sys::set_reset_on_close(stream.as_raw_fd()) {
        tracing::debug!(error = %e, "VPN flow: cannot make its close a reset");
    }
}

/// A flow the TUN pump translated: `peer` is its NAT address on the gateway.
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
    let app = vpn.nat.app(peer.port()).unwrap_or(peer);
    serve_flow(stream, app, dst, false, vpn, ctx).await;
}

/// A connection the eBPF classifier redirected to a loopback listener: `peer` is the
/// application's own socket.
pub(crate) async fn serve_redirected(stream: TcpStream, peer: SocketAddr, ctx: Rc<CoreContext>) {
    let Some(vpn) = ctx.vpn.clone() else {
        return;
    };
    let dst = vpn
        .redirect_origins
        .load()
        .as_ref()
        .and_then(|origins| origins.take(peer));
    let Some(dst) = dst else {
        // any local program may connect here; only the classifier's flows are served
        tracing::debug!(client = %peer, "VPN redirect listener: no recorded destination");
        refuse(&stream);
        return;
    };
    vpn.stats.redirected_tcp.fetch_add(1, Relaxed);
    serve_flow(stream, peer, dst, true, vpn, ctx).await;
}

/// Routes and relays one tunnelled flow from application `app` to `dst`. `past_tun`: its bytes
/// do not cross the pump, so the relay counts them in the VPN totals.
async fn serve_flow(
    stream: TcpStream,
    app: SocketAddr,
    dst: SocketAddr,
    past_tun: bool,
    vpn: Arc<super::VpnPath>,
    ctx: Rc<CoreContext>,
) {
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
    let client_ip = app.ip();
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
                vpn.stats.blocked_tcp.fetch_add(1, Relaxed);
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
        app,
        Protocol::Vpn,
        &label,
        &backend,
        trace,
        past_tun.then(|| vpn.stats.clone()),
    )
    .await;
}

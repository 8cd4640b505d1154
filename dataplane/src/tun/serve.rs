//! A flow accepted on the VPN listener: find its original destination in the NAT table, route
//! it with the client's rules and relay it through the chosen backend.

use crate::engine::CoreContext;
use crate::events::Protocol;
use crate::trace::Trace;
use glommio::net::TcpStream;
use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, ctx: Rc<CoreContext>) {
    let Some(vpn) = ctx.vpn.clone() else {
        return;
    };
    // only the pump's translated flows come from the gateway address
    let SocketAddr::V4(from) = peer else {
        return;
    };
    if *from.ip() != vpn.gateway {
        tracing::debug!(client = %peer, "VPN listener: not a translated flow");
        return;
    }
    let Some(dst) = vpn.nat.lookup(from.port()) else {
        tracing::debug!(client = %peer, "VPN listener: no NAT entry");
        return;
    };
    // the flow's client is the application, not the NAT address the kernel shows
    let peer = vpn.nat.app(from.port()).map_or(peer, SocketAddr::V4);
    let ip = dst.ip().to_string();
    // route by the name the application resolved when the resolver saw it, else by address;
    // the dial always goes to the address the application chose
    let host = vpn
        .names
        .load()
        .get(dst.ip())
        .cloned()
        .unwrap_or_else(|| ip.clone());
    let snapshot = ctx.snapshot.load_full();
    let label = format!("{host}:{}", dst.port());
    let mut trace = Trace::new(Protocol::Vpn, "CONNECT");
    trace.host = label.clone();
    trace.url = label.clone();
    let client_ip = peer.ip();
    let Some((_, backend)) = snapshot.select(&host) else {
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

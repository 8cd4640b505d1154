//! Starting the data plane: listener sockets are created up front (so bind errors reach the
//! caller, and port 0 resolves to one port shared by every core), then one pinned glommio
//! executor per core accepts on its own `SO_REUSEPORT` copy and serves each connection to the
//! end on that core.

use crate::commands::{CommandReceiver, CommandSender};
use crate::counters::Counters;
use crate::error::DataplaneError;
use crate::events::{EventQueue, RequestQueue};
use crate::live::LiveTable;
use crate::offload::Offload;
use crate::resolver::Resolver;
use crate::snapshot::SnapshotHandle;
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};
use socket2::{Domain, Protocol, Socket, Type};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::IntoRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Where to listen: `ip: None` means every interface (IPv6 dual-stack, IPv4 if IPv6 is off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenSpec {
    pub ip: Option<IpAddr>,
    pub port: u16,
}

#[derive(Debug, Clone)]
pub struct DataplaneOptions {
    /// Number of cores; 0 = every CPU this process may use.
    pub cores: usize,
    pub http: Option<ListenSpec>,
    pub socks5: Option<ListenSpec>,
    /// The HTTP cache's store when `cache.enabled` (shared by every core).
    pub cache: Option<Arc<crate::cache::CacheStore>>,
}

/// Shared state of one running data plane, readable from the control plane.
pub struct Dataplane {
    pub snapshot: SnapshotHandle,
    pub counters: Arc<Counters>,
    pub events: Arc<EventQueue>,
    pub requests: Arc<RequestQueue>,
    pub live: Arc<LiveTable>,
    pub commands: CommandSender,
    pub cores: Vec<usize>,
    pub http_addr: Option<SocketAddr>,
    pub socks5_addr: Option<SocketAddr>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// What every task on a core needs.
pub(crate) struct CoreContext {
    pub core: usize,
    pub snapshot: SnapshotHandle,
    pub counters: Arc<Counters>,
    pub events: Arc<EventQueue>,
    pub requests: Arc<RequestQueue>,
    pub live: Arc<LiveTable>,
    pub resolver: Resolver,
    pub offload: Offload,
    /// Client connections open across all cores, for `server.max_connections`.
    pub open_connections: Arc<AtomicUsize>,
    /// The SOCKS5 listener's address, used for UDP ASSOCIATE relays.
    pub socks5_ip: Option<IpAddr>,
    pub cache: Option<Arc<crate::cache::CacheStore>>,
}

fn listen_socket(spec: ListenSpec, port: u16) -> std::io::Result<Socket> {
    let (addr, dual) = match spec.ip {
        Some(ip) => (SocketAddr::new(ip, port), false),
        None => (
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
            true,
        ),
    };
    let make = |addr: SocketAddr, dual: bool| -> std::io::Result<Socket> {
        let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
        if dual {
            s.set_only_v6(false)?;
        }
        s.set_reuse_address(true)?;
        s.set_reuse_port(true)?;
        s.set_nonblocking(true)?;
        s.bind(&addr.into())?;
        s.listen(4096)?;
        Ok(s)
    };
    match make(addr, dual) {
        Err(e) if dual && e.raw_os_error() == Some(libc::EAFNOSUPPORT) => make(
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
            false,
        ),
        other => other,
    }
}

/// One socket per core, all on the same port (the first one picks it when `port` is 0).
fn bind_per_core(
    spec: ListenSpec,
    cores: usize,
) -> Result<(Vec<Socket>, SocketAddr), DataplaneError> {
    let describe = |e: std::io::Error| {
        DataplaneError::Start(format!(
            "cannot listen on {}:{}: {e}",
            spec.ip.map_or("*".to_string(), |i| i.to_string()),
            spec.port
        ))
    };
    let first = listen_socket(spec, spec.port).map_err(describe)?;
    let addr = first
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| DataplaneError::Start("listener has no address".into()))?;
    let mut sockets = vec![first];
    for _ in 1..cores {
        sockets.push(listen_socket(spec, addr.port()).map_err(describe)?);
    }
    Ok((sockets, addr))
}

impl Dataplane {
    pub fn start(
        snapshot: SnapshotHandle,
        opts: DataplaneOptions,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self, DataplaneError> {
        let nofile = crate::sys::raise_nofile_limit().unwrap_or(0);
        let allowed = crate::sys::allowed_cpus();
        let cores: Vec<usize> = if opts.cores == 0 {
            allowed
        } else {
            allowed.into_iter().take(opts.cores).collect()
        };
        let counters = Arc::new(Counters::new(cores.len()));
        // Slots are allocated (and touched) up front, so capacity is idle memory: 4096 request
        // records are ~1.2 MiB. The control plane drains both every 25 ms.
        let events = Arc::new(EventQueue::new(4096));
        let requests = Arc::new(RequestQueue::new(4096));
        let live = Arc::new(LiveTable::new(cores.len()));
        let (commands, command_rx) = crate::commands::channel();
        let resolver = Resolver::from_system()?;
        let offload = Offload::new(runtime, 4096);
        let open_connections = Arc::new(AtomicUsize::new(0));

        let mut http = opts
            .http
            .map(|spec| bind_per_core(spec, cores.len()))
            .transpose()?;
        let mut socks = opts
            .socks5
            .map(|spec| bind_per_core(spec, cores.len()))
            .transpose()?;
        let http_addr = http.as_ref().map(|(_, a)| *a);
        let socks5_addr = socks.as_ref().map(|(_, a)| *a);

        let mut threads = Vec::new();
        for (index, &cpu) in cores.iter().enumerate() {
            let http_fd = http
                .as_mut()
                .and_then(|(s, _)| s.pop())
                .map(|s| s.into_raw_fd());
            let socks_fd = socks
                .as_mut()
                .and_then(|(s, _)| s.pop())
                .map(|s| s.into_raw_fd());
            let ctx = (
                snapshot.clone(),
                counters.clone(),
                events.clone(),
                requests.clone(),
                live.clone(),
                resolver.clone(),
                offload.clone(),
                open_connections.clone(),
                opts.cache.clone(),
            );
            // Core 0 serves control-plane commands.
            let command_rx: Option<CommandReceiver> = (index == 0).then(|| command_rx.clone());
            let socks5_ip = socks5_addr.map(|a| a.ip());
            let builder = LocalExecutorBuilder::new(Placement::Fixed(cpu))
                .name(&format!("dataplane-{index}"))
                // Registered I/O memory: small without a cache; cache fills write through DMA
                // buffers (1 MiB, four in flight) and fall back to heap buffers past this.
                .io_memory(if opts.cache.is_some() {
                    4 << 20
                } else {
                    512 << 10
                })
                .ring_depth(512);
            let handle = builder
                .spawn(move || async move {
                    let (
                        snapshot,
                        counters,
                        events,
                        requests,
                        live,
                        resolver,
                        offload,
                        open_connections,
                        cache,
                    ) = ctx;
                    let ctx = Rc::new(CoreContext {
                        core: index,
                        snapshot,
                        counters,
                        events,
                        requests,
                        live,
                        resolver,
                        offload,
                        open_connections,
                        socks5_ip,
                        cache,
                    });
                    let mut tasks = Vec::new();
                    if let Some(rx) = command_rx {
                        tasks.push(glommio::spawn_local(crate::commands::serve(
                            rx,
                            ctx.clone(),
                        )));
                    }
                    if let Some(fd) = http_fd {
                        let listener = crate::sys::listener_from_fd(fd);
                        tasks.push(glommio::spawn_local(accept_loop(
                            listener,
                            ctx.clone(),
                            Service::Http,
                        )));
                    }
                    if let Some(fd) = socks_fd {
                        let listener = crate::sys::listener_from_fd(fd);
                        tasks.push(glommio::spawn_local(accept_loop(
                            listener,
                            ctx.clone(),
                            Service::Socks5,
                        )));
                    }
                    for t in tasks {
                        t.await;
                    }
                })
                .map_err(|e| {
                    DataplaneError::Start(format!("glommio executor on cpu {cpu}: {e}"))
                })?;
            threads.push(std::thread::spawn(move || {
                if let Err(e) = handle.join() {
                    tracing::error!(error = %e, "data-plane core stopped");
                }
            }));
        }
        tracing::info!(
            engine = "glommio (io_uring)",
            cores = ?cores,
            open_files_limit = nofile,
            "data plane started"
        );
        Ok(Self {
            snapshot,
            counters,
            events,
            requests,
            live,
            commands,
            cores,
            http_addr,
            socks5_addr,
            threads,
        })
    }

    /// Blocks until every core stops (they run until the process exits).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

#[derive(Clone, Copy)]
enum Service {
    Http,
    Socks5,
}

/// Releases the global connection slot and the per-core active count when a connection ends.
pub(crate) struct ConnectionSlot {
    ctx: Rc<CoreContext>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.ctx.open_connections.fetch_sub(1, Ordering::AcqRel);
        self.ctx.counters.core(self.ctx.core).closed();
    }
}

async fn accept_loop(listener: TcpListener, ctx: Rc<CoreContext>, service: Service) {
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(peer) = stream.peer_addr() else {
            continue;
        };
        let snapshot = ctx.snapshot.load();
        if !snapshot.access.allows(peer.ip()) {
            tracing::debug!(client = %peer, "refused by access control");
            continue; // dropping the stream closes it
        }
        let open = ctx.open_connections.fetch_add(1, Ordering::AcqRel);
        ctx.counters.core(ctx.core).opened();
        let slot = ConnectionSlot { ctx: ctx.clone() };
        if snapshot.max_connections > 0 && open >= snapshot.max_connections {
            tracing::warn!(client = %peer, limit = snapshot.max_connections, "connection limit reached");
            drop(slot);
            continue;
        }
        drop(snapshot);
        let _ = stream.set_nodelay(true);
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            let _slot = slot;
            match service {
                Service::Http => crate::http_proxy::serve(stream, peer, ctx).await,
                Service::Socks5 => crate::socks5_server::serve(stream, peer, ctx).await,
            }
        })
        .detach();
    }
}

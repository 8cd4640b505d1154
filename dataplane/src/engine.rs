//! Starting the data plane: listener sockets are created up front (so bind errors reach the
//! caller, and port 0 resolves to one port shared by every core), then one pinned glommio
//! executor per core accepts on its own `SO_REUSEPORT` copy and serves each connection to the
//! end on that core. New connections go to the cores in turn where the `sk_reuseport` program
//! loads ([`crate::balance`]), by the kernel's hash otherwise.
//!
//! Start-up is all or nothing: each core reports ready (after its listeners are registered) or
//! failed (its executor could not start: a memlock limit below glommio's 512 KiB, io_uring
//! refused by seccomp) through a channel, and [`Dataplane::start`] returns only when every core
//! is ready. On any failure every listener is shut down and the reason is returned, so the
//! kernel never completes handshakes for a core nobody serves.
//!
//! After start, one supervisor thread per core waits for its executor to end. A core that dies
//! (a panic in a task unwinds its executor) has its listeners shut down at once through
//! descriptors the supervisor kept, is marked down in [`CoreHealth`] (health API, metrics) and is
//! restarted on fresh `SO_REUSEPORT` listeners; after [`MAX_RESTARTS`] the process exits with
//! status 70 so the service manager restarts it whole. A core that is alive but wedged does not
//! end; its [`heartbeat`] task stops, which [`CoreHealth`] reports as a stall (and the server's
//! systemd watchdog turns into a restart).

use crate::commands::{CommandReceiver, CommandSender};
use crate::core_health::CoreHealth;
use crate::cores::{CorePlan, CpuLabel};
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Where to listen: `ip: None` means every interface (IPv6 dual-stack, IPv4 if IPv6 is off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenSpec {
    pub ip: Option<IpAddr>,
    pub port: u16,
}

impl ListenSpec {
    /// A VPN listener on a free port: the TUN address (IPv4, or the IPv6 one for IPv6 flows),
    /// or loopback for the socket redirect.
    fn vpn(ip: IpAddr) -> Self {
        ListenSpec {
            ip: Some(ip),
            port: 0,
        }
    }
}

#[derive(Debug, Clone)]
pub struct DataplaneOptions {
    /// The cores to run on, decided once at start ([`CorePlan::detect`]).
    pub plan: CorePlan,
    pub http: Option<ListenSpec>,
    pub socks5: Option<ListenSpec>,
    /// The HTTP cache's store when `cache.enabled` (shared by every core).
    pub cache: Option<Arc<crate::cache::CacheStore>>,
    /// The client's VPN path: a listener on the TUN address (bound before the device exists)
    /// that serves the flows the TUN pump translates.
    pub vpn: Option<Arc<crate::tun::VpnPath>>,
    /// The server's QUIC listener (`server.quic.listen`, bound by
    /// [`crate::quic::QuicListener::bind`]), run by core 0.
    pub quic: Option<Arc<crate::quic::QuicListener>>,
}

/// Shared state of one running data plane, readable from the control plane.
pub struct Dataplane {
    pub snapshot: SnapshotHandle,
    pub counters: Arc<Counters>,
    pub events: Arc<EventQueue>,
    pub requests: Arc<RequestQueue>,
    pub live: Arc<LiveTable>,
    pub commands: CommandSender,
    /// The CPU of each core (`None`: unpinned).
    pub cores: Vec<Option<usize>>,
    /// Up/down state and failures of each core.
    pub core_health: Arc<CoreHealth>,
    pub http_addr: Option<SocketAddr>,
    pub socks5_addr: Option<SocketAddr>,
    /// The VPN listener's address (the TUN pump translates flows to it).
    pub vpn_addr: Option<SocketAddr>,
    /// The QUIC listener (address, certificate fingerprint, counters).
    pub quic: Option<Arc<crate::quic::QuicListener>>,
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
    /// The SOCKS5 listener's address, used for UDP ASSOCIATE relays.
    pub socks5_ip: Option<IpAddr>,
    pub cache: Option<Arc<crate::cache::CacheStore>>,
    pub vpn: Option<Arc<crate::tun::VpnPath>>,
    /// This core's estimate of the other cores' open connections, for `server.max_connections`.
    pub limit_view: crate::counters::LimitView,
    /// The last snapshot a connection on this core took (see [`CoreContext::current_snapshot`]).
    // Rc<Arc<_>> on purpose: the Rc is cloned per connection without touching the Arc's count.
    #[allow(clippy::redundant_allocation)]
    snapshot_cache: std::cell::RefCell<Option<Rc<Arc<crate::snapshot::Snapshot>>>>,
}

impl CoreContext {
    /// The current configuration snapshot for one connection. The per-core `Rc` is what makes
    /// this cheap: `load_full` would increment the snapshot's `Arc` count, one cache line that
    /// every core writes twice per connection; here a new `Arc` is taken only on a reload.
    #[allow(clippy::redundant_allocation)]
    pub fn current_snapshot(&self) -> Rc<Arc<crate::snapshot::Snapshot>> {
        let current = self.snapshot.load();
        let mut cached = self.snapshot_cache.borrow_mut();
        match &*cached {
            Some(rc) if Arc::ptr_eq(rc, &current) => rc.clone(),
            _ => {
                let rc = Rc::new(arc_swap::Guard::into_inner(current));
                *cached = Some(rc.clone());
                rc
            }
        }
    }
}

/// `freebind`: the address may not exist yet (the VPN listener's TUN address).
fn listen_socket_on(spec: ListenSpec, port: u16, freebind: bool) -> std::io::Result<Socket> {
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
        // accepted sockets inherit it: no setsockopt(2) per connection
        s.set_nodelay(true)?;
        if freebind {
            // the VPN listener binds to the TUN address before the device exists
            crate::sys::set_freebind(std::os::fd::AsRawFd::as_raw_fd(&s))?;
        }
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

/// The VPN UDP socket of one core on `addr` (`SO_REUSEPORT`: every core binds the same port, the
/// kernel keeps each flow on one of them; `freebind`: the TUN address may not exist yet).
fn vpn_udp_socket(addr: SocketAddr) -> std::io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    crate::sys::set_freebind(std::os::fd::AsRawFd::as_raw_fd(&s))?;
    s.bind(&addr.into())?;
    Ok(s)
}

/// One VPN UDP socket per core on the TUN address, all on one free port.
fn bind_vpn_udp(tun_ip: IpAddr, cores: usize) -> Result<(Vec<Socket>, SocketAddr), DataplaneError> {
    let fail =
        |e: std::io::Error| DataplaneError::Start(format!("cannot bind UDP on {tun_ip}: {e}"));
    let first = vpn_udp_socket(SocketAddr::new(tun_ip, 0)).map_err(fail)?;
    let addr = first
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| DataplaneError::Start("VPN UDP socket has no address".into()))?;
    let mut sockets = vec![first];
    for _ in 1..cores {
        sockets.push(vpn_udp_socket(addr).map_err(fail)?);
    }
    Ok((sockets, addr))
}

/// A bound socket as glommio's UDP socket (glommio takes socket2 0.4 sockets).
fn udp_from_socket(socket: Socket) -> glommio::net::UdpSocket {
    let std_socket: std::net::UdpSocket = socket.into();
    glommio::net::UdpSocket::from(socket2_04::Socket::from(std_socket))
}

fn describe_listen(spec: ListenSpec, e: std::io::Error) -> DataplaneError {
    DataplaneError::Start(format!(
        "cannot listen on {}:{}: {e}",
        spec.ip.map_or("*".to_string(), |i| i.to_string()),
        spec.port
    ))
}

/// One socket per core, all on the same port (the first one picks it when `port` is 0).
/// Returns the sockets and the spec with the port filled in.
fn bind_per_core(
    spec: ListenSpec,
    cores: usize,
    freebind: bool,
) -> Result<(Vec<Socket>, ListenSpec, SocketAddr), DataplaneError> {
    let first =
        listen_socket_on(spec, spec.port, freebind).map_err(|e| describe_listen(spec, e))?;
    let addr = first
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or_else(|| DataplaneError::Start("listener has no address".into()))?;
    let bound = ListenSpec {
        ip: spec.ip,
        port: addr.port(),
    };
    let mut sockets = vec![first];
    for _ in 1..cores {
        sockets.push(
            listen_socket_on(bound, bound.port, freebind).map_err(|e| describe_listen(bound, e))?,
        );
    }
    Ok((sockets, bound, addr))
}

/// Ports tried for the VPN's redirect listeners, highest first: privileged, so that no
/// unprivileged program can take the port while the client is down and the classifier's pinned
/// programs (until the next start removes them) still send tunnelled connections there.
const REDIRECT_PORTS: std::ops::RangeInclusive<u16> = 900..=1023;

/// The VPN's redirect listeners on loopback `ip`: a free privileged port (a probe bind without
/// `SO_REUSEPORT` proves no other listener holds it, so the group is ours alone), else — not
/// root, or none free — any free port.
fn bind_redirect(
    ip: IpAddr,
    cores: usize,
) -> Result<(Vec<Socket>, ListenSpec, SocketAddr), DataplaneError> {
    let mut free = None;
    for port in REDIRECT_PORTS.rev() {
        match std::net::TcpListener::bind(SocketAddr::new(ip, port)) {
            Ok(_) => {
                free = Some(port);
                break;
            }
            // not allowed to bind a privileged port: no other one will do either
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => break,
            Err(_) => {}
        }
    }
    if let Some(port) = free {
        if let Ok(bound) = bind_per_core(ListenSpec { ip: Some(ip), port }, cores, false) {
            return Ok(bound);
        }
    }
    if crate::sys::is_root() {
        tracing::warn!(%ip, first = REDIRECT_PORTS.start(), last = REDIRECT_PORTS.end(), "no free privileged port for the VPN redirect listener: a local program could take its port while the client is down");
    } else {
        tracing::debug!(%ip, "not root: the VPN redirect listener takes an unprivileged port");
    }
    bind_per_core(ListenSpec::vpn(ip), cores, false)
}

/// What a core reports to [`Dataplane::start`] while it waits for all of them.
enum CoreReport {
    Ready,
    Failed(usize, String),
}

/// A core's listening sockets, moved into its executor (closed if it never starts).
#[derive(Default)]
struct CoreListeners {
    http: Option<Socket>,
    socks5: Option<Socket>,
    vpn: Option<Socket>,
    vpn_udp: Option<Socket>,
    /// The VPN listener and UDP socket on the TUN's IPv6 address.
    vpn6: Option<Socket>,
    vpn6_udp: Option<Socket>,
    /// The loopback listeners (127.0.0.1, ::1) the eBPF classifier redirects tunnelled TCP to.
    redirect: Option<Socket>,
    redirect6: Option<Socket>,
}

impl CoreListeners {
    /// Duplicates of the descriptors, kept by the supervisor: shutting one down stops the
    /// kernel from queueing connections for this core even if the dead executor leaked its copy.
    fn guards(&self) -> std::io::Result<Vec<Socket>> {
        [
            &self.http,
            &self.socks5,
            &self.vpn,
            &self.vpn_udp,
            &self.vpn6,
            &self.vpn6_udp,
            &self.redirect,
            &self.redirect6,
        ]
        .into_iter()
        .flatten()
        .map(|s| s.try_clone())
        .collect()
    }
}

/// Stops listening on every socket (`shutdown(2)` on a listener takes it out of the
/// `SO_REUSEPORT` group and resets its queued connections).
fn close_listeners(guards: &[Socket]) {
    for s in guards {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
}

/// Everything needed to (re)start a core; cloned into each executor.
#[derive(Clone)]
struct CoreSeed {
    snapshot: SnapshotHandle,
    counters: Arc<Counters>,
    events: Arc<EventQueue>,
    requests: Arc<RequestQueue>,
    live: Arc<LiveTable>,
    resolver: Resolver,
    offload: Offload,
    cache: Option<Arc<crate::cache::CacheStore>>,
    commands: CommandReceiver,
    socks5_ip: Option<IpAddr>,
    health: Arc<CoreHealth>,
    http: Option<ListenSpec>,
    socks5: Option<ListenSpec>,
    vpn: Option<Arc<crate::tun::VpnPath>>,
    vpn_listen: Option<ListenSpec>,
    vpn_udp_listen: Option<SocketAddr>,
    vpn6_listen: Option<ListenSpec>,
    vpn6_udp_listen: Option<SocketAddr>,
    redirect_listen: Option<ListenSpec>,
    redirect6_listen: Option<ListenSpec>,
    /// Bound once; the core running it (0, also after a restart) uses a duplicate of its socket.
    quic: Option<Arc<crate::quic::QuicListener>>,
    /// Round-robin over the listener groups; locked by supervisors only, never by a core.
    balance: Arc<std::sync::Mutex<crate::balance::ListenerBalance>>,
}

/// Restarts allowed per core before the process gives up and exits.
const MAX_RESTARTS: u32 = 3;
/// How long start-up waits for every core to report.
const START_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Why an executor thread ended, in words an operator can act on.
fn describe_core_end(result: glommio::Result<(), ()>) -> String {
    use glommio::{BuilderErrorKind, GlommioError, ReactorErrorKind};
    match result {
        Ok(()) => "its executor ended".to_owned(),
        Err(GlommioError::ReactorError(ReactorErrorKind::MemLockLimit(have, need))) => format!(
            "the locked-memory limit (RLIMIT_MEMLOCK, `ulimit -l`) is {} KiB; glommio needs at \
             least {} KiB for its io_uring buffers: raise the memlock limit (systemd \
             LimitMEMLOCK=, docker --ulimit memlock=)",
            have / 1024,
            need / 1024
        ),
        Err(GlommioError::BuilderError(BuilderErrorKind::ThreadPanic(payload))) => {
            let text = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            format!("panicked: {text}")
        }
        // glommio 0.9 wraps the reactor's MemLockLimit into an I/O error on this path.
        Err(e) if e.to_string().contains("MemLockLimit") => format!(
            "{e}: the locked-memory limit (RLIMIT_MEMLOCK, `ulimit -l`) is below the 512 KiB \
             glommio needs for its io_uring buffers: raise the memlock limit (systemd \
             LimitMEMLOCK=, docker --ulimit memlock=)"
        ),
        Err(e) => format!("glommio executor failed: {e}"),
    }
}

impl CoreSeed {
    fn spawn(
        &self,
        index: usize,
        cpu: Option<usize>,
        listeners: CoreListeners,
        reports: std::sync::mpsc::Sender<CoreReport>,
    ) -> Result<glommio::ExecutorJoinHandle<()>, DataplaneError> {
        let seed = self.clone();
        // Registered I/O memory (pinned, so resident from start): cache fills write through DMA
        // buffers (1 MiB, four in flight). Without a cache only UDP receives use it, and they
        // fall back to heap buffers when it is taken: glommio's minimum, 64 KiB, is enough.
        let io_memory = if self.cache.is_some() {
            4 << 20
        } else {
            64 << 10
        };
        let placement = match cpu {
            Some(cpu) => Placement::Fixed(cpu),
            None => Placement::Unbound,
        };
        LocalExecutorBuilder::new(placement)
            .name(&format!("dataplane-{index}"))
            .io_memory(io_memory)
            .ring_depth(512)
            .spawn(move || async move {
                crate::cores::enter(index);
                let ctx = Rc::new(CoreContext {
                    core: index,
                    snapshot: seed.snapshot,
                    counters: seed.counters,
                    events: seed.events,
                    requests: seed.requests,
                    live: seed.live,
                    resolver: seed.resolver,
                    offload: seed.offload,
                    socks5_ip: seed.socks5_ip,
                    cache: seed.cache,
                    vpn: seed.vpn,
                    limit_view: Default::default(),
                    snapshot_cache: std::cell::RefCell::new(None),
                });
                let mut tasks = Vec::new();
                // Core 0 serves control-plane commands.
                if index == 0 {
                    tasks.push(glommio::spawn_local(crate::commands::serve(
                        seed.commands,
                        ctx.clone(),
                    )));
                    if let Some(quic) = seed.quic.clone() {
                        tasks.push(glommio::spawn_local(crate::quic::server::serve(
                            ctx.clone(),
                            quic,
                        )));
                    }
                }
                for (socket, service) in [
                    (listeners.http, Service::Http),
                    (listeners.socks5, Service::Socks5),
                    (listeners.vpn, Service::Vpn),
                    (listeners.vpn6, Service::Vpn),
                    (listeners.redirect, Service::VpnRedirect),
                    (listeners.redirect6, Service::VpnRedirect),
                ] {
                    if let Some(socket) = socket {
                        // a second descriptor of the same (non-blocking) listener for plain
                        // accept4(2) calls; see `accept_one`
                        let direct = match socket.try_clone() {
                            Ok(d) => Some(d),
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot duplicate a listener; accepting through glommio only");
                                None
                            }
                        };
                        let listener = crate::sys::listener_from_fd(socket.into_raw_fd());
                        tasks.push(glommio::spawn_local(accept_loop(
                            Acceptor { listener, direct },
                            ctx.clone(),
                            service,
                        )));
                    }
                }
                for socket in [listeners.vpn_udp, listeners.vpn6_udp].into_iter().flatten() {
                    tasks.push(glommio::spawn_local(crate::tun::udp_relay::serve(
                        udp_from_socket(socket),
                        ctx.clone(),
                    )));
                }
                tasks.push(glommio::spawn_local(heartbeat(seed.health.clone(), index)));
                seed.health.mark_up(index);
                let _ = reports.send(CoreReport::Ready);
                for t in tasks {
                    t.await;
                }
            })
            .map_err(|e| DataplaneError::Start(format!("glommio executor ({}): {e}", CpuLabel(cpu))))
    }

    /// Fresh listeners for a restarted core, on the ports the data plane already serves.
    fn rebind(&self) -> Result<CoreListeners, DataplaneError> {
        let bind = |spec: Option<ListenSpec>, freebind: bool| {
            spec.map(|s| listen_socket_on(s, s.port, freebind).map_err(|e| describe_listen(s, e)))
                .transpose()
        };
        Ok(CoreListeners {
            http: bind(self.http, false)?,
            socks5: bind(self.socks5, false)?,
            vpn: bind(self.vpn_listen, true)?,
            vpn_udp: self
                .vpn_udp_listen
                .map(|a| vpn_udp_socket(a).map_err(|e| DataplaneError::Start(e.to_string())))
                .transpose()?,
            vpn6: bind(self.vpn6_listen, true)?,
            vpn6_udp: self
                .vpn6_udp_listen
                .map(|a| vpn_udp_socket(a).map_err(|e| DataplaneError::Start(e.to_string())))
                .transpose()?,
            redirect: bind(self.redirect_listen, false)?,
            redirect6: bind(self.redirect6_listen, false)?,
        })
    }

    /// Runs on its own thread for the life of a core: when the executor ends (start-up
    /// failure, panic), closes its listeners, records the failure and, once the data plane has
    /// started, restarts the core — up to [`MAX_RESTARTS`] times, then exits the process.
    fn supervise(
        self,
        index: usize,
        cpu: Option<usize>,
        mut handle: glommio::ExecutorJoinHandle<()>,
        mut guards: Vec<Socket>,
        started: Arc<AtomicBool>,
        reports: std::sync::mpsc::Sender<CoreReport>,
    ) {
        let mut restarts = 0;
        loop {
            let reason = describe_core_end(handle.join());
            close_listeners(&guards);
            drop(std::mem::take(&mut guards));
            self.health.mark_failed(index, &reason);
            if !started.load(Ordering::Acquire) {
                // Start-up still waits for this core: it reports and the start fails.
                let _ = reports.send(CoreReport::Failed(index, reason));
                return;
            }
            let cpu_label = CpuLabel(cpu);
            tracing::error!(core = index, cpu = %cpu_label, reason = %reason, "data-plane core stopped; its listeners are closed");
            restarts += 1;
            if restarts > MAX_RESTARTS {
                tracing::error!(core = index, cpu = %cpu_label, restarts = MAX_RESTARTS,
                    "data-plane core keeps failing; exiting so the service manager restarts the server");
                std::process::exit(70);
            }
            let respawned = self.rebind().and_then(|listeners| {
                let kept = listeners
                    .guards()
                    .map_err(|e| DataplaneError::Start(e.to_string()))?;
                if let Ok(mut balance) = self.balance.lock() {
                    balance.replace(
                        index,
                        &[
                            listeners.http.as_ref(),
                            listeners.socks5.as_ref(),
                            listeners.vpn.as_ref(),
                            listeners.vpn6.as_ref(),
                            listeners.redirect.as_ref(),
                            listeners.redirect6.as_ref(),
                        ],
                    );
                }
                let handle = self.spawn(index, cpu, listeners, reports.clone())?;
                Ok((handle, kept))
            });
            match respawned {
                Ok((h, kept)) => {
                    tracing::warn!(
                        core = index,
                        cpu = %cpu_label,
                        restart = restarts,
                        "data-plane core restarted"
                    );
                    handle = h;
                    guards = kept;
                }
                Err(e) => {
                    tracing::error!(core = index, cpu = %cpu_label, error = %e, "cannot restart a data-plane core; exiting");
                    std::process::exit(70);
                }
            }
        }
    }
}

impl Dataplane {
    /// Starts one executor per core of `opts.plan` and waits until every core reports ready.
    /// If any core fails to start, every listener is closed and the reason is returned.
    pub fn start(
        snapshot: SnapshotHandle,
        opts: DataplaneOptions,
        runtime: tokio::runtime::Handle,
    ) -> Result<Self, DataplaneError> {
        let nofile = crate::sys::raise_nofile_limit().unwrap_or(0);
        let cores = opts.plan.cpus.clone();
        let counters = Arc::new(Counters::new(cores.len()));
        // Slots are allocated (and touched) up front, so capacity is idle memory (16 bytes a
        // slot); the cores share it, a lane each. The control plane drains both every 25 ms.
        let events = Arc::new(EventQueue::per_core(cores.len(), 4096));
        let requests = Arc::new(RequestQueue::new(cores.len(), 4096));
        let live = Arc::new(LiveTable::new(cores.len()));
        let (commands, command_rx) = crate::commands::channel();
        let resolver = Resolver::from_system()?;
        let health = Arc::new(CoreHealth::new(&cores));

        let http = opts
            .http
            .map(|spec| bind_per_core(spec, cores.len(), false))
            .transpose()?;
        let socks = opts
            .socks5
            .map(|spec| bind_per_core(spec, cores.len(), false))
            .transpose()?;
        let vpn_listen = opts
            .vpn
            .as_ref()
            .map(|v| bind_per_core(ListenSpec::vpn(IpAddr::V4(v.tun_ip)), cores.len(), true))
            .transpose()?;
        let vpn_addr = vpn_listen.as_ref().map(|(_, _, a)| *a);
        let vpn_udp = opts
            .vpn
            .as_ref()
            .map(|v| bind_vpn_udp(IpAddr::V4(v.tun_ip), cores.len()))
            .transpose()?;
        if let (Some(vpn), Some((_, addr))) = (&opts.vpn, &vpn_udp) {
            vpn.udp_port.store(addr.port(), Ordering::Release);
        }
        // IPv6 flows meet their own listener and UDP socket on the TUN's IPv6 address
        let vpn6 = opts.vpn.as_ref().and_then(|v| Some((v, v.v6?.tun_ip)));
        let vpn6_listen = vpn6
            .map(|(_, ip)| bind_per_core(ListenSpec::vpn(IpAddr::V6(ip)), cores.len(), true))
            .transpose()?;
        let vpn6_udp = vpn6
            .map(|(_, ip)| bind_vpn_udp(IpAddr::V6(ip), cores.len()))
            .transpose()?;
        if let Some((vpn, _)) = vpn6 {
            if let Some((_, _, addr)) = &vpn6_listen {
                vpn.listen_port6.store(addr.port(), Ordering::Release);
            }
            if let Some((_, addr)) = &vpn6_udp {
                vpn.udp_port6.store(addr.port(), Ordering::Release);
            }
        }
        // tunnelled TCP the eBPF classifier sends here from connect(2), past the TUN; a host
        // without IPv6 on loopback keeps IPv6 flows on the TUN
        let redirect = opts
            .vpn
            .as_ref()
            .map(|_| bind_redirect(IpAddr::V4(Ipv4Addr::LOCALHOST), cores.len()))
            .transpose()?;
        let redirect6 = opts.vpn.as_ref().and_then(|_| {
            bind_redirect(IpAddr::V6(Ipv6Addr::LOCALHOST), cores.len())
                .map_err(|e| tracing::warn!(error = %e, "no VPN redirect listener on ::1: tunnelled IPv6 TCP takes the TUN"))
                .ok()
        });
        if let Some(vpn) = &opts.vpn {
            let port = |l: &Option<(Vec<Socket>, ListenSpec, SocketAddr)>| {
                l.as_ref().map_or(0, |(_, _, a)| a.port())
            };
            vpn.redirect_port4.store(port(&redirect), Ordering::Release);
            vpn.redirect_port6
                .store(port(&redirect6), Ordering::Release);
        }
        let quic = opts.quic.clone();
        let no_sockets: &[Socket] = &[];
        let balance = crate::balance::ListenerBalance::attach(&[
            http.as_ref().map_or(no_sockets, |(s, _, _)| s.as_slice()),
            socks.as_ref().map_or(no_sockets, |(s, _, _)| s.as_slice()),
            vpn_listen
                .as_ref()
                .map_or(no_sockets, |(s, _, _)| s.as_slice()),
            vpn6_listen
                .as_ref()
                .map_or(no_sockets, |(s, _, _)| s.as_slice()),
            redirect
                .as_ref()
                .map_or(no_sockets, |(s, _, _)| s.as_slice()),
            redirect6
                .as_ref()
                .map_or(no_sockets, |(s, _, _)| s.as_slice()),
        ]);
        let http_selection = balance.selection(0);
        let http_addr = http.as_ref().map(|(_, _, a)| *a);
        let socks5_addr = socks.as_ref().map(|(_, _, a)| *a);
        let seed = CoreSeed {
            snapshot: snapshot.clone(),
            counters: counters.clone(),
            events: events.clone(),
            requests: requests.clone(),
            live: live.clone(),
            resolver,
            offload: Offload::new(runtime, 4096),
            cache: opts.cache.clone(),
            commands: command_rx,
            socks5_ip: socks5_addr.map(|a| a.ip()),
            health: health.clone(),
            http: http.as_ref().map(|(_, spec, _)| *spec),
            socks5: socks.as_ref().map(|(_, spec, _)| *spec),
            vpn: opts.vpn.clone(),
            vpn_listen: vpn_listen.as_ref().map(|(_, spec, _)| *spec),
            vpn_udp_listen: vpn_udp.as_ref().map(|(_, a)| *a),
            vpn6_listen: vpn6_listen.as_ref().map(|(_, spec, _)| *spec),
            vpn6_udp_listen: vpn6_udp.as_ref().map(|(_, a)| *a),
            redirect_listen: redirect.as_ref().map(|(_, spec, _)| *spec),
            redirect6_listen: redirect6.as_ref().map(|(_, spec, _)| *spec),
            quic: quic.clone(),
            balance: Arc::new(std::sync::Mutex::new(balance)),
        };
        // core i takes socket i of each group: its index in the round-robin
        let mut vpn_udp_sockets = vpn_udp.map(|(s, _)| s).unwrap_or_default().into_iter();
        let mut vpn_sockets = vpn_listen
            .map(|(s, _, _)| s)
            .unwrap_or_default()
            .into_iter();
        let mut vpn6_udp_sockets = vpn6_udp.map(|(s, _)| s).unwrap_or_default().into_iter();
        let mut vpn6_sockets = vpn6_listen
            .map(|(s, _, _)| s)
            .unwrap_or_default()
            .into_iter();
        let mut redirect_sockets = redirect.map(|(s, _, _)| s).unwrap_or_default().into_iter();
        let mut redirect6_sockets = redirect6.map(|(s, _, _)| s).unwrap_or_default().into_iter();
        let mut http_sockets = http.map(|(s, _, _)| s).unwrap_or_default().into_iter();
        let mut socks_sockets = socks.map(|(s, _, _)| s).unwrap_or_default().into_iter();

        let started = Arc::new(AtomicBool::new(false));
        let (report_tx, reports) = std::sync::mpsc::channel();
        let mut every_listener = Vec::new();
        let mut threads = Vec::new();
        let mut spawn_failure = None;
        for (index, &cpu) in cores.iter().enumerate() {
            let listeners = CoreListeners {
                http: http_sockets.next(),
                socks5: socks_sockets.next(),
                vpn: vpn_sockets.next(),
                vpn_udp: vpn_udp_sockets.next(),
                vpn6: vpn6_sockets.next(),
                vpn6_udp: vpn6_udp_sockets.next(),
                redirect: redirect_sockets.next(),
                redirect6: redirect6_sockets.next(),
            };
            let guards = listeners
                .guards()
                .and_then(|g| {
                    every_listener.extend(listeners.guards()?);
                    Ok(g)
                })
                .map_err(|e| DataplaneError::Start(format!("duplicating a listener: {e}")))?;
            let handle = match seed.spawn(index, cpu, listeners, report_tx.clone()) {
                Ok(h) => h,
                Err(e) => {
                    spawn_failure = Some(e);
                    break;
                }
            };
            let supervisor = seed.clone();
            let (started, reports) = (started.clone(), report_tx.clone());
            threads.push(std::thread::spawn(move || {
                supervisor.supervise(index, cpu, handle, guards, started, reports)
            }));
        }
        drop(report_tx);
        let failure = spawn_failure.or_else(|| wait_for_cores(&reports, &cores).err());
        if let Some(e) = failure {
            // The cores that did start keep running until the process exits; without listeners
            // they accept nothing, so no connection is queued for a server that is not there.
            close_listeners(&every_listener);
            return Err(e);
        }
        started.store(true, Ordering::Release);
        // Late reports (restarted cores) go nowhere.
        drop(reports);
        tracing::info!(
            engine = "glommio (io_uring)",
            cores = cores.len(),
            cpus = %crate::cores::placement(&cores),
            new_connections = ?http_selection,
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
            core_health: health,
            http_addr,
            socks5_addr,
            vpn_addr,
            quic,
            threads,
        })
    }

    /// Blocks until every core's supervisor stops (they run until the process exits).
    pub fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Waits until every core reported ready; the first failure (or silence) is the error.
fn wait_for_cores(
    reports: &std::sync::mpsc::Receiver<CoreReport>,
    cores: &[Option<usize>],
) -> Result<(), DataplaneError> {
    let deadline = std::time::Instant::now() + START_TIMEOUT;
    let mut ready = 0;
    while ready < cores.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match reports.recv_timeout(left) {
            Ok(CoreReport::Ready) => ready += 1,
            Ok(CoreReport::Failed(index, reason)) => {
                return Err(DataplaneError::Start(format!(
                    "data-plane core {index} ({}) failed to start: {reason}",
                    CpuLabel(cores.get(index).copied().flatten())
                )))
            }
            Err(_) => {
                return Err(DataplaneError::Start(format!(
                    "only {ready} of {} data-plane cores reported ready within {}s",
                    cores.len(),
                    START_TIMEOUT.as_secs()
                )))
            }
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Service {
    Http,
    Socks5,
    /// Flows the TUN pump translated.
    Vpn,
    /// Tunnelled TCP the eBPF classifier redirected from connect(2).
    VpnRedirect,
}

/// Proves to the control plane that this core runs tasks: a timer task on the core's default
/// queue, so it runs only when the executor does — a task that never yields or a thread that is
/// blocked or stopped silences it ([`CoreHealth`] names the core after
/// [`crate::core_health::STALL_THRESHOLD`]).
async fn heartbeat(health: Arc<CoreHealth>, index: usize) {
    loop {
        health.beat(index);
        glommio::timer::sleep(crate::core_health::HEARTBEAT_INTERVAL).await;
    }
}

/// Releases the per-core active count when a connection ends.
pub(crate) struct ConnectionSlot {
    ctx: Rc<CoreContext>,
}

impl ConnectionSlot {
    /// Counts a new connection (a TCP accept or a QUIC flow stream) and takes its slot, or
    /// `None` (logged) when `server.max_connections` is reached. The limit adds this core's own
    /// count to its estimate of the others' (no counter that every core writes, and the others'
    /// lines are read at most once a millisecond while far from the limit; see `LimitView`), so
    /// cores accepting at the same instant may overshoot it by one each.
    pub(crate) fn open(
        ctx: &Rc<CoreContext>,
        snapshot: &crate::snapshot::Snapshot,
        peer: SocketAddr,
    ) -> Option<Self> {
        ctx.counters.core(ctx.core).opened();
        let slot = ConnectionSlot { ctx: ctx.clone() };
        if snapshot.max_connections > 0
            && ctx.limit_view.over(
                &ctx.counters,
                ctx.core,
                snapshot.max_connections as u64,
                std::time::Instant::now(),
            )
        {
            tracing::warn!(client = %peer, limit = snapshot.max_connections, "connection limit reached");
            return None;
        }
        Some(slot)
    }

    /// A second slot for a task that outlives the connection's own (a tunnel run as a task of
    /// its own): counted active, not as a new connection.
    pub(crate) fn take_over(ctx: &Rc<CoreContext>) -> Self {
        ctx.counters
            .core(ctx.core)
            .active_connections
            .fetch_add(1, Ordering::Relaxed);
        Self { ctx: ctx.clone() }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.ctx.counters.core(self.ctx.core).closed();
    }
}

/// A fault the supervision tests inject into a running core; compiled into unit tests only, so
/// no production build can kill a core on purpose.
#[cfg(test)]
pub(crate) static PANIC_ON_NEXT_ACCEPT: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// A core's listener: glommio's for waiting, plus a duplicate descriptor for direct accepts.
struct Acceptor {
    listener: TcpListener,
    direct: Option<Socket>,
}

impl Acceptor {
    /// The next connection and its peer. While connections are queued, one `accept4(2)` on the
    /// non-blocking listener takes each one with its peer address; glommio's `accept` costs
    /// three `fcntl(2)` calls around every accept plus a `getpeername(2)` (measured with
    /// `strace`), so when the queue is empty the accept goes straight to the ring (the
    /// vendored glommio's `accept_from_ring`, which also returns the peer's address).
    /// `None`: a connection that went away before its peer could be read (dropped, nothing to
    /// back off from).
    async fn accept_one(&self) -> std::io::Result<Option<(glommio::net::TcpStream, SocketAddr)>> {
        if let Some(direct) = &self.direct {
            match direct.accept() {
                Ok((socket, addr)) => {
                    // keep one core's other tasks running while connections keep coming
                    glommio::yield_if_needed().await;
                    let stream = std::net::TcpStream::from(socket);
                    let Some(peer) = addr.as_socket().or_else(|| stream.peer_addr().ok()) else {
                        return Ok(None);
                    };
                    let stream = glommio::net::TcpStream::from(socket2_04::Socket::from(stream));
                    return Ok(Some((stream, peer)));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        let (stream, peer) = self
            .listener
            .accept_from_ring()
            .await
            .map_err(std::io::Error::from)?;
        // the ring's ACCEPT returns the peer's address; `getpeername(2)` only for a family it
        // does not decode
        let peer = peer.or_else(|| stream.peer_addr().ok());
        Ok(peer.map(|peer| (stream, peer)))
    }
}

async fn accept_loop(acceptor: Acceptor, ctx: Rc<CoreContext>, service: Service) {
    loop {
        let (stream, peer) = match acceptor.accept_one().await {
            Ok(Some(s)) => s,
            Ok(None) => continue,
            Err(e) => {
                // EMFILE and friends: back off briefly instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        #[cfg(test)]
        if PANIC_ON_NEXT_ACCEPT.swap(false, Ordering::AcqRel) {
            panic!("fault injected by a test");
        }
        let snapshot = ctx.snapshot.load();
        // VPN flows come from the NAT's gateway address or the application itself (loopback),
        // which their `serve` functions check
        if !matches!(service, Service::Vpn | Service::VpnRedirect)
            && !snapshot.access.allows(peer.ip())
        {
            tracing::debug!(client = %peer, "refused by access control");
            continue; // dropping the stream closes it
        }
        let Some(slot) = ConnectionSlot::open(&ctx, &snapshot, peer) else {
            continue;
        };
        drop(snapshot);
        let ctx = ctx.clone();
        glommio::spawn_local(async move {
            let _slot = slot;
            match service {
                Service::Http => crate::http_proxy::serve(stream, peer, ctx).await,
                Service::Socks5 => crate::socks5_server::serve(stream, peer, ctx).await,
                Service::Vpn => crate::tun::serve::serve(stream, peer, ctx).await,
                Service::VpnRedirect => {
                    crate::tun::serve::serve_redirected(stream, peer, ctx).await
                }
            }
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    /// As root, each data plane's redirect listeners get a privileged port of their own: a
    /// second one never joins the first's `SO_REUSEPORT` group (it would take half of its
    /// connections, with no record of them).
    #[test]
    fn redirect_listeners_take_a_privileged_port_of_their_own() {
        if !crate::sys::is_root() {
            eprintln!("skipped: binding a privileged port needs root");
            return;
        }
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let (_first, _, a) = bind_redirect(ip, 2).expect("first");
        let (_second, _, b) = bind_redirect(ip, 2).expect("second");
        assert!(REDIRECT_PORTS.contains(&a.port()), "{a}");
        assert!(REDIRECT_PORTS.contains(&b.port()), "{b}");
        assert_ne!(a.port(), b.port());
    }

    /// The vendored glommio keeps its preemption timer armed across reactor turns instead of
    /// re-arming it on every turn (vendor/glommio/PATCHES.md). A task that keeps its core busy,
    /// yielding only when glommio says it has run long enough, must still be preempted, or a
    /// connection on the same core would never be served.
    #[test]
    fn a_busy_task_is_preempted_so_io_on_its_core_is_served() {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let client = std::thread::spawn(move || {
            let addr: SocketAddr = addr_rx.recv().expect("listener address");
            let mut s = std::net::TcpStream::connect(addr).expect("connect");
            s.write_all(b"x").expect("write");
            // hold the connection until the executor has read the byte
            let _ = s.read(&mut [0u8; 1]);
        });
        let served = LocalExecutorBuilder::new(Placement::Unbound)
            .preempt_timer(Duration::from_millis(10))
            .spawn(move || async move {
                let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
                addr_tx
                    .send(listener.local_addr().expect("address"))
                    .expect("send address");
                let served = Rc::new(std::cell::Cell::new(false));
                let io = glommio::spawn_local({
                    let served = served.clone();
                    async move {
                        let mut stream = listener.accept().await.expect("accept");
                        let mut byte = [0u8; 1];
                        futures_lite::io::AsyncReadExt::read(&mut stream, &mut byte)
                            .await
                            .expect("read");
                        served.set(true);
                    }
                });
                // The busy task: a bound on its own running time, not an assertion on it.
                let give_up = Instant::now() + Duration::from_secs(30);
                while !served.get() && Instant::now() < give_up {
                    for i in 0..1000u32 {
                        std::hint::black_box(i);
                    }
                    glommio::yield_if_needed().await;
                }
                let was_served = served.get();
                io.cancel().await;
                was_served
            })
            .expect("executor")
            .join()
            .expect("executor ran");
        client.join().expect("client");
        assert!(
            served,
            "the busy task was never preempted: the connection was not served"
        );
    }

    /// Voluntary context switches of one thread (`/proc/self/task/TID/status`): each is a
    /// sleep of that thread.
    fn voluntary_switches(task: &std::path::Path) -> u64 {
        let status = std::fs::read_to_string(task.join("status")).expect("thread status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("voluntary_ctxt_switches")
    }

    /// The vendored glommio keeps its preemption timer armed while the reactor sleeps
    /// (vendor/glommio/PATCHES.md): a busy core saves a cancel and a re-arm per sleep, and an
    /// executor that goes idle is woken once by that timer, after which it must sleep without
    /// it — not be woken by a fresh one every 100 ms — and still wake for its own timer.
    #[test]
    fn an_idle_executor_sleeps_until_its_timer_without_preemption_wakeups() {
        let (task_tx, task_rx) = std::sync::mpsc::channel();
        let executor = LocalExecutorBuilder::new(Placement::Unbound)
            .spawn(move || async move {
                // some activity first, so a preemption timer is armed when the core goes idle
                for _ in 0..20 {
                    glommio::timer::sleep(Duration::from_millis(1)).await;
                }
                let task = std::fs::read_link("/proc/thread-self").expect("thread-self");
                task_tx.send(task).expect("send task path");
                glommio::timer::sleep(Duration::from_secs(3)).await;
            })
            .expect("executor");
        let task = task_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("executor started");
        let task = std::path::Path::new("/proc").join(task);
        // past the one wake-up by the timer kept from the activity (≤ 100 ms)
        std::thread::sleep(Duration::from_millis(600));
        let before = voluntary_switches(&task);
        std::thread::sleep(Duration::from_millis(1000));
        let after = voluntary_switches(&task);
        executor
            .join()
            .expect("the executor's own timer fired and it finished");
        assert_eq!(
            after,
            before,
            "the idle executor was woken {} times in a second",
            after - before
        );
    }

    #[test]
    fn a_core_that_panics_is_reported_and_restarted_on_a_fresh_listener() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let cfg = switchyard_config::ServerConfig::default();
        let snapshot = crate::snapshot::Snapshot::compile(&cfg, None, 1).expect("snapshot");
        let cpu = crate::sys::allowed_cpus()[0];
        let dataplane = Dataplane::start(
            Arc::new(arc_swap::ArcSwap::from_pointee(snapshot)),
            DataplaneOptions {
                plan: CorePlan {
                    cpus: vec![Some(cpu)],
                    reason: "test".into(),
                },
                http: Some(ListenSpec {
                    ip: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
                    port: 0,
                }),
                socks5: None,
                cache: None,
                vpn: None,
                quic: None,
            },
            runtime.handle().clone(),
        )
        .expect("start");
        let addr = dataplane.http_addr.expect("http address");
        assert!(dataplane.core_health.problems().is_empty());

        PANIC_ON_NEXT_ACCEPT.store(true, Ordering::Release);
        let _victim = std::net::TcpStream::connect(addr).expect("connect");
        let deadline = Instant::now() + Duration::from_secs(20);
        let state = loop {
            let state = dataplane.core_health.states()[0].clone();
            if state.failures == 1 && state.up {
                break state;
            }
            assert!(Instant::now() < deadline, "core not restarted: {state:?}");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            state
                .last_failure
                .as_deref()
                .is_some_and(|r| r.contains("fault injected")),
            "{state:?}"
        );
        // The restarted core accepts on the same port and serves a request.
        let mut client = std::net::TcpStream::connect(addr).expect("connect again");
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        client
            .write_all(b"GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: 127.0.0.1:1\r\nConnection: close\r\n\r\n")
            .expect("write");
        let mut answer = Vec::new();
        let _ = client.read_to_end(&mut answer);
        assert!(
            answer.starts_with(b"HTTP/1.1 "),
            "{}",
            String::from_utf8_lossy(&answer)
        );
    }
}

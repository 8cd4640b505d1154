//! Starting the origin (nginx), the peer proxies and switchyard, each with its own config file in
//! the run's temp dir, on free loopback ports.

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::procs::{free_port, output_of, tail, which, Procs};

/// Where and how peers are started.
pub struct Env {
    /// The run's temp dir (one subdirectory per started program).
    pub dir: PathBuf,
    /// CPUs this process may use (sched_getaffinity).
    pub cpus: usize,
    /// CPUs of the load side: the bench, load generators, origins (all CPUs without a split).
    pub load_cpus: usize,
    /// CPUs of the programs under test (all CPUs without a split).
    pub test_cpus: usize,
    /// `--split-cpus`: which CPUs each side runs on.
    pub split: Option<&'static crate::cpusplit::CpuSplit>,
    /// RLIMIT_NOFILE soft limit children inherit.
    pub nofile: u64,
    /// `server.cores` of the measured switchyard server (0 = every CPU).
    pub switchyard_cores: usize,
}

impl Env {
    /// wrk's `-t`: 2, or with `--split-cpus` one thread per LOAD CPU.
    pub fn wrk_threads(&self) -> u32 {
        self.split.map_or(2, |s| {
            u32::try_from(s.load.len()).unwrap_or(u32::MAX).max(1)
        })
    }

    /// The split for the reports ("split CPUs: load 0, under test 1"), `None` without it.
    pub fn split_note(&self) -> Option<String> {
        self.split.map(|s| s.describe())
    }
}

/// A started program.
#[derive(Debug, Clone)]
pub struct Started {
    pub pid: u32,
    /// The address clients connect to (proxy or origin port).
    pub addr: SocketAddr,
    /// SOCKS5 listener (switchyard only).
    pub socks5: Option<SocketAddr>,
    pub version: Option<String>,
    pub notes: Vec<String>,
}

const START_TIMEOUT: Duration = Duration::from_secs(15);

/// Version of a Debian package, when installed.
pub fn deb_version(pkg: &str) -> Option<String> {
    output_of("dpkg-query", &["-W", "-f=${Version}", pkg])
        .filter(|v| !v.is_empty() && !v.contains("no packages"))
}

fn workdir(env: &Env, name: &str) -> Result<PathBuf> {
    let d = env.dir.join(name);
    fs::create_dir_all(&d)?;
    // Peers that drop privileges (squid, tinyproxy, danted) must write logs and pid files here.
    fs::set_permissions(&d, fs::Permissions::from_mode(0o777))?;
    Ok(d)
}

fn find(program: &str) -> Result<PathBuf> {
    which(program).with_context(|| format!("{program} is not installed"))
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn wait_ready(procs: &mut Procs, pid: u32, addr: SocketAddr, log: &Path) -> Result<()> {
    procs
        .wait_port(pid, addr, START_TIMEOUT)
        .map_err(|e| anyhow::anyhow!("{e}; log: {}", tail(log, 5)))
}

/// nginx serving `www` (1 worker per core, access_log off).
pub fn nginx(procs: &mut Procs, env: &Env, www: &Path) -> Result<Started> {
    let bin = find("nginx")?;
    let d = workdir(env, "nginx")?;
    let port = free_port()?;
    let conf = format!(
        "user root;\nworker_processes {cpus};\ndaemon off;\nmaster_process on;\n\
         pid {d}/nginx.pid;\nerror_log {d}/error.log warn;\nworker_rlimit_nofile {nofile};\n\
         events {{ worker_connections 8192; multi_accept on; }}\n\
         http {{\n  access_log off;\n  sendfile on; tcp_nopush on; tcp_nodelay on;\n\
           keepalive_requests 1000000; keepalive_timeout 120s;\n\
           default_type application/octet-stream;\n\
           client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;\n\
           uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
           server {{ listen 127.0.0.1:{port}; root {www}; }}\n}}\n",
        cpus = env.load_cpus,
        d = d.display(),
        nofile = env.nofile.min(65536),
        www = www.display(),
    );
    let conf_path = d.join("nginx.conf");
    fs::write(&conf_path, conf)?;
    let log = d.join("stderr.log");
    let mut cmd = Command::new(bin);
    cmd.arg("-p")
        .arg(&d)
        .arg("-c")
        .arg(&conf_path)
        .arg("-e")
        .arg(d.join("error.log"));
    let pid = procs.spawn("nginx", cmd, &log)?;
    let addr = loopback(port);
    wait_ready(procs, pid, addr, &d.join("error.log"))?;
    Ok(Started {
        pid,
        addr,
        socks5: None,
        version: deb_version("nginx").or_else(|| output_of("nginx", &["-v"])),
        notes: vec![format!(
            "{} worker processes (1 per core), access_log off, sendfile on",
            env.load_cpus
        )],
    })
}

/// tinyproxy as an HTTP forward proxy (also does CONNECT to any port).
pub fn tinyproxy(procs: &mut Procs, env: &Env) -> Result<Started> {
    let bin = find("tinyproxy")?;
    let d = workdir(env, "tinyproxy")?;
    let port = free_port()?;
    let conf = format!(
        "User nobody\nGroup nogroup\nPort {port}\nListen 127.0.0.1\nTimeout 600\n\
         MaxClients {max}\nLogLevel Error\nLogFile \"{d}/tinyproxy.log\"\nPidFile \"{d}/tinyproxy.pid\"\n\
         Allow 127.0.0.0/8\nDisableViaHeader Yes\n",
        max = env.nofile.saturating_sub(100).max(100),
        d = d.display(),
    );
    let conf_path = d.join("tinyproxy.conf");
    fs::write(&conf_path, conf)?;
    let log = d.join("stderr.log");
    let mut cmd = Command::new(bin);
    cmd.arg("-d").arg("-c").arg(&conf_path);
    let pid = procs.spawn_under_test("tinyproxy", cmd, &log)?;
    let addr = loopback(port);
    wait_ready(procs, pid, addr, &log)?;
    Ok(Started {
        pid,
        addr,
        socks5: None,
        version: deb_version("tinyproxy"),
        notes: vec![],
    })
}

/// squid with caching off (`cache deny all`, no cache_dir), loopback clients only.
pub fn squid(procs: &mut Procs, env: &Env) -> Result<Started> {
    squid_with(procs, env, "squid", "")
}

/// Like [`squid`], in its own directory `name`, with `extra` configuration lines (e.g. a
/// `cache_peer` parent for a chain).
pub fn squid_with(procs: &mut Procs, env: &Env, name: &str, extra: &str) -> Result<Started> {
    let bin = find("squid")?;
    let d = workdir(env, name)?;
    let port = free_port()?;
    let conf = format!(
        "http_port 127.0.0.1:{port}\n\
         acl loopback src 127.0.0.0/8\nhttp_access allow loopback\nhttp_access deny all\n\
         cache deny all\ncache_mem 0 MB\n\
         pid_filename {d}/squid.pid\naccess_log none\ncache_store_log none\n\
         cache_log {d}/cache.log\ncoredump_dir {d}\n\
         max_filedescriptors {nofile}\nshutdown_lifetime 0 seconds\n\
         visible_hostname switchyard-bench\nicp_port 0\nhtcp_port 0\nnetdb_filename none\n\
         logfile_rotate 0\n{extra}",
        nofile = env.nofile,
        d = d.display(),
    );
    let conf_path = d.join("squid.conf");
    fs::write(&conf_path, conf)?;
    let log = d.join("stderr.log");
    let mut cmd = Command::new(bin);
    // -N: no daemon, one process; -d1: errors to stderr.
    cmd.arg("-N").arg("-d1").arg("-f").arg(&conf_path);
    let pid = procs.spawn_under_test("squid", cmd, &log)?;
    let addr = loopback(port);
    wait_ready(procs, pid, addr, &log)?;
    Ok(Started {
        pid,
        addr,
        socks5: None,
        version: deb_version("squid"),
        notes: vec!["no-daemon single process (-N), cache deny all, cache_mem 0".into()],
    })
}

/// Privoxy as a plain forwarding proxy: `toggle 0` (no filtering), no action or filter files,
/// client keep-alive and server connection sharing on, in the foreground.
pub fn privoxy(procs: &mut Procs, env: &Env) -> Result<Started> {
    let bin = find("privoxy")?;
    let d = workdir(env, "privoxy")?;
    let port = free_port()?;
    let conf = format!(
        "confdir {d}\nlogdir {d}\nlisten-address 127.0.0.1:{port}\ntoggle 0\n\
         enable-remote-toggle 0\nenable-edit-actions 0\naccept-intercepted-requests 0\n\
         keep-alive-timeout 300\ndefault-server-timeout 300\nconnection-sharing 1\n\
         socket-timeout 300\nmax-client-connections {max}\n",
        d = d.display(),
        max = env.nofile.saturating_sub(100).clamp(100, 8192),
    );
    let conf_path = d.join("privoxy.conf");
    fs::write(&conf_path, conf)?;
    let log = d.join("stderr.log");
    let mut cmd = Command::new(bin);
    cmd.arg("--no-daemon").arg(&conf_path);
    let pid = procs.spawn_under_test("privoxy", cmd, &log)?;
    let addr = loopback(port);
    wait_ready(procs, pid, addr, &log)?;
    Ok(Started {
        pid,
        addr,
        socks5: None,
        version: deb_version("privoxy"),
        notes: vec![
            "toggle 0 (no filtering), no action files, keep-alive and connection sharing on".into(),
        ],
    })
}

/// microsocks (SOCKS5, no auth).
pub fn microsocks(procs: &mut Procs, env: &Env) -> Result<Started> {
    let bin = find("microsocks")?;
    let d = workdir(env, "microsocks")?;
    let port = free_port()?;
    let log = d.join("stderr.log");
    let mut cmd = Command::new(bin);
    cmd.args(["-i", "127.0.0.1", "-p"]).arg(port.to_string());
    let pid = procs.spawn_under_test("microsocks", cmd, &log)?;
    let addr = loopback(port);
    wait_ready(procs, pid, addr, &log)?;
    Ok(Started {
        pid,
        addr,
        socks5: Some(addr),
        version: deb_version("microsocks"),
        notes: vec![],
    })
}

/// Dante's danted (SOCKS5, method none, loopback only), in the foreground.
pub fn danted(procs: &mut Procs, env: &Env) -> Result<Started> {
    let bin = find("danted")?;
    let d = workdir(env, "danted")?;
    let port = free_port()?;
    let conf = format!(
        "logoutput: {d}/danted.log\n\
         internal: 127.0.0.1 port = {port}\nexternal: 127.0.0.1\n\
         clientmethod: none\nsocksmethod: none\n\
         user.privileged: root\nuser.unprivileged: nobody\n\
         client pass {{ from: 127.0.0.0/8 to: 0.0.0.0/0 }}\n\
         socks pass {{ from: 127.0.0.0/8 to: 0.0.0.0/0 command: connect }}\n",
        d = d.display(),
    );
    let conf_path = d.join("danted.conf");
    fs::write(&conf_path, conf)?;
    let log = d.join("stderr.log");
    let mut cmd = Command::new(bin);
    cmd.arg("-f")
        .arg(&conf_path)
        .args(["-N", &env.test_cpus.to_string(), "-p"])
        .arg(d.join("danted.pid"));
    let pid = procs.spawn_under_test("danted", cmd, &log)?;
    let addr = loopback(port);
    wait_ready(procs, pid, addr, &d.join("danted.log"))?;
    Ok(Started {
        pid,
        addr,
        socks5: Some(addr),
        version: deb_version("dante-server"),
        notes: vec![format!(
            "-N {} (one server process per core)",
            env.test_cpus
        )],
    })
}

/// switchyard `server` with a generated config; ready when the health endpoint answers 200.
pub fn switchyard(procs: &mut Procs, env: &Env, bin: &Path) -> Result<Started> {
    switchyard_with_env(procs, env, bin, &[])
}

/// [`switchyard`] with extra environment variables (e.g. `SWITCHYARD_RELAY=copy`).
pub fn switchyard_with_env(
    procs: &mut Procs,
    env: &Env,
    bin: &Path,
    vars: &[(&str, &str)],
) -> Result<Started> {
    switchyard_server(procs, env, bin, vars, "").map(|(started, _api)| started)
}

/// A `switchyard server` with a QUIC listener, and what its API reported about it.
pub struct QuicServer {
    /// The server; `addr` is its HTTP proxy (the CONNECT leg's address).
    pub started: Started,
    pub quic: SocketAddr,
    pub api: SocketAddr,
    /// SHA-256 fingerprint of its self-signed certificate (`GET /api/v1/quic`), for pinning.
    pub fingerprint: String,
}

/// `switchyard server` with `server.quic.listen` on a free loopback port and `token`; ready
/// when `GET /api/v1/quic` reports the listener enabled with a fingerprint.
pub fn switchyard_quic(
    procs: &mut Procs,
    env: &Env,
    bin: &Path,
    token: &str,
) -> Result<QuicServer> {
    let quic = loopback(free_port()?);
    let (started, api) = switchyard_server(
        procs,
        env,
        bin,
        &[],
        &format!("  quic: {{ listen: \"{quic}\", token: \"{token}\" }}\n"),
    )?;
    let status = api_get(api, "/api/v1/quic")?;
    let fingerprint = match (&status["enabled"], status["fingerprint"].as_str()) {
        (serde_json::Value::Bool(true), Some(f)) if !f.is_empty() => f.to_owned(),
        _ => bail!("GET /api/v1/quic: QUIC listener not enabled: {status}"),
    };
    Ok(QuicServer {
        started,
        quic,
        api,
        fingerprint,
    })
}

/// Starts `switchyard server` with `server_extra` (YAML lines indented under `server:`); the
/// started server and its API address.
fn switchyard_server(
    procs: &mut Procs,
    env: &Env,
    bin: &Path,
    vars: &[(&str, &str)],
    server_extra: &str,
) -> Result<(Started, SocketAddr)> {
    if !bin.is_file() {
        bail!(
            "switchyard binary {} not found (build it: cargo build --release -p switchyard)",
            bin.display()
        );
    }
    let d = workdir(env, "switchyard")?;
    let (http, socks, api) = (free_port()?, free_port()?, free_port()?);
    let conf = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:{http}\" }}\n  socks5: {{ listen: \"127.0.0.1:{socks}\" }}\n  cores: {cores}\n{server_extra}\
         api: {{ listen: \"127.0.0.1:{api}\" }}\nlogging: {{ level: warn }}\n",
        cores = env.switchyard_cores
    );
    let conf_path = d.join("switchyard.yaml");
    fs::write(&conf_path, conf)?;
    let log = d.join("stderr.log");
    let mut cmd = Command::new(bin);
    cmd.arg("server")
        .arg("--config")
        .arg(&conf_path)
        .current_dir(&d)
        .envs(vars.iter().copied());
    let pid = procs.spawn_under_test("switchyard", cmd, &log)?;
    let api_addr = loopback(api);
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(reason) = procs.exited(pid) {
            bail!("{reason}; log: {}", tail(&log, 5));
        }
        match health(api_addr) {
            Ok(true) => break,
            _ if Instant::now() > deadline => {
                bail!(
                    "GET /api/v1/health on {api_addr} not 200 after {START_TIMEOUT:?}; log: {}",
                    tail(&log, 5)
                )
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    let http_addr = loopback(http);
    let socks_addr = loopback(socks);
    for a in [http_addr, socks_addr] {
        wait_ready(procs, pid, a, &log)?;
    }
    let version = output_of(&bin.to_string_lossy(), &["--version"]).filter(|v| !v.is_empty());
    let started = Started {
        pid,
        addr: http_addr,
        socks5: Some(socks_addr),
        version,
        notes: match env.switchyard_cores {
            0 => vec![],
            n => vec![format!("server.cores {n}")],
        },
    };
    Ok((started, api_addr))
}

/// `switchyard client` whose only server is `server` (an HTTP proxy address), connected at
/// start; ready when its API's health answers 200 and its HTTP proxy accepts.
pub fn switchyard_client(
    procs: &mut Procs,
    env: &Env,
    bin: &Path,
    server: SocketAddr,
) -> Result<Started> {
    switchyard_client_with(
        procs,
        env,
        bin,
        "switchyard-client",
        &format!("address: \"{server}\", protocol: HTTP"),
    )
}

/// `switchyard client` in its own directory `name` whose only server is `entry` (the body of a
/// YAML flow mapping: address, protocol and e.g. fingerprint and token of a QUIC leg).
pub fn switchyard_client_with(
    procs: &mut Procs,
    env: &Env,
    bin: &Path,
    name: &str,
    entry: &str,
) -> Result<Started> {
    let d = workdir(env, name)?;
    let (http, socks, api) = (free_port()?, free_port()?, free_port()?);
    let conf = format!(
        "proxy:\n  http: {{ listen: \"127.0.0.1:{http}\" }}\n  socks5: {{ listen: \"127.0.0.1:{socks}\" }}\n  cores: 0\n\
         api: {{ listen: \"127.0.0.1:{api}\" }}\nlogging: {{ level: warn }}\n\
         servers:\n  - {{ name: bench, {entry} }}\n"
    );
    let conf_path = d.join("client.yaml");
    fs::write(&conf_path, conf)?;
    let log = d.join("stderr.log");
    let mut cmd = Command::new(bin);
    cmd.arg("client")
        .arg("--config")
        .arg(&conf_path)
        .arg("--data-dir")
        .arg(d.join("data"))
        .current_dir(&d);
    let pid = procs.spawn_under_test("switchyard-client", cmd, &log)?;
    let api_addr = loopback(api);
    let deadline = Instant::now() + START_TIMEOUT;
    while !matches!(health(api_addr), Ok(true)) {
        if let Some(reason) = procs.exited(pid) {
            bail!("{reason}; log: {}", tail(&log, 5));
        }
        if Instant::now() > deadline {
            bail!(
                "client API health not 200 after {START_TIMEOUT:?}; log: {}",
                tail(&log, 5)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let addr = loopback(http);
    wait_ready(procs, pid, addr, &log)?;
    Ok(Started {
        pid,
        addr,
        socks5: Some(loopback(socks)),
        version: output_of(&bin.to_string_lossy(), &["--version"]).filter(|v| !v.is_empty()),
        notes: vec![],
    })
}

/// `GET path` of an API on loopback, its body as JSON (any status).
pub fn api_get(api: SocketAddr, path: &str) -> Result<serde_json::Value> {
    let mut s = TcpStream::connect_timeout(&api, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {api}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)?;
    let body = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| &answer[i + 4..])
        .with_context(|| format!("GET {path}: no end of the response head"))?;
    serde_json::from_slice(body).with_context(|| {
        format!(
            "GET {path}: not JSON: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        )
    })
}

fn health(api: SocketAddr) -> Result<bool> {
    let mut s = TcpStream::connect_timeout(&api, Duration::from_millis(500))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(
        s,
        "GET /api/v1/health HTTP/1.1\r\nHost: {api}\r\nConnection: close\r\n\r\n"
    )?;
    let mut head = [0u8; 16];
    let n = s.read(&mut head)?;
    let line = String::from_utf8_lossy(&head[..n]);
    Ok(line.starts_with("HTTP/1.1 200") || line.starts_with("HTTP/1.0 200"))
}

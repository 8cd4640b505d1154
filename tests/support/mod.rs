//! Shared pieces of the end-to-end tests: starting the real `switchyard` binary on random ports,
//! real peer programs (nginx, tinyproxy, microsocks) with their own config in a temp dir, and
//! running real clients (curl). Every child is killed by PID when its guard drops.
#![allow(dead_code)]

pub mod browser;
pub mod kdc;
pub mod mesh;
pub mod mesh_member;
pub mod netns;
pub mod oidc;
pub mod ovpn_server;
pub mod slapd;
pub mod ui_shell;
pub mod wg_peer;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_switchyard");

/// A child process killed (by its PID) when dropped.
pub struct Proc {
    pub child: Child,
    pub name: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Finds an executable in PATH or the sbin directories.
pub fn which(cmd: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"])
        .map(|d| Path::new(d).join(cmd))
        .find(|p| p.is_file());
    found
}

/// Returns the program's path, or prints why the test skips and returns None.
/// Under CI (`CI` set) a missing program is a failure, never a skip.
pub fn require(cmd: &str) -> Option<PathBuf> {
    match which(cmd) {
        Some(p) => Some(p),
        None if std::env::var_os("CI").is_some() => {
            panic!("{cmd} is required in CI (tests/run installs it)")
        }
        None => {
            eprintln!("SKIP: {cmd} is not installed (run tests/run as root to install it)");
            None
        }
    }
}

/// A test cannot run here for `reason`: prints `SKIP: reason` and returns, so the caller
/// returns too — except under `CI`, where every test must run, so it fails instead.
pub fn skip_unless_ci(reason: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("required in CI: {reason}");
    }
    eprintln!("SKIP: {reason}");
}

/// An nginx access log. nginx writes a request's line after the response has left, so a client
/// that already has the body may look before the line is there: waits for one line (at most 5 s).
pub fn nginx_access_log(path: &Path) -> String {
    nginx_access_log_lines(path, 1)
}

/// An nginx access log once it has at least `lines` lines (or after 5 s, for the caller's
/// assertion to show what is there): the last request's line may come after its response, so
/// a log read once right after several requests can lack it (issue 37).
pub fn nginx_access_log_lines(path: &Path, lines: usize) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let log = std::fs::read_to_string(path).unwrap_or_default();
        if log.lines().count() >= lines || Instant::now() > deadline {
            return log;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

pub fn wait_for_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nothing listens on 127.0.0.1:{port}");
}

/// A running `switchyard server` and the addresses it reported.
/// Prints how a process ended and the tail of its log when the test drops it while failing:
/// a CI failure then carries its own evidence (a crash, a refusal, a timeout), not only the
/// test's panic. Held as the first field of its owner so it reports before the process is
/// killed.
pub struct FailureReport {
    pub pid: u32,
    pub name: String,
    pub logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// Log lines a failing test prints from its process.
const LOG_TAIL_ON_FAILURE: usize = 80;

impl Drop for FailureReport {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        // Not reaped yet, so an exited child is still listed, as a zombie ("Z").
        let state = match std::fs::read_to_string(format!("/proc/{}/stat", self.pid)) {
            Ok(stat) => match stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next())
            {
                Some('Z') => "had exited".to_owned(),
                Some(c) => format!("running, state {c}"),
                None => "state unreadable".to_owned(),
            },
            Err(e) => format!("state unknown: {e}"),
        };
        let lines = self.logs.lock().map(|l| l.clone()).unwrap_or_default();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL_ON_FAILURE)..];
        eprintln!(
            "--- {} (pid {}) {state} when the failing test ended; last {} of {} log lines:\n{}",
            self.name,
            self.pid,
            tail.len(),
            lines.len(),
            tail.join("\n")
        );
    }
}

pub struct Server {
    pub report: FailureReport,
    pub proc: Proc,
    pub http: SocketAddr,
    pub socks5: SocketAddr,
    pub api: SocketAddr,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// Starts the server with `extra_yaml` appended to a config that listens on port 0 everywhere
/// (the server reports the ports it got in its JSON log).
pub fn start_server(extra_yaml: &str) -> Server {
    start_server_with_yaml_env(extra_yaml, &[])
}

/// [`start_server`] with extra environment variables.
pub fn start_server_with_yaml_env(extra_yaml: &str, env: &[(&str, &std::ffi::OsStr)]) -> Server {
    start_server_with_api(&[], extra_yaml, env)
}

/// [`start_server`] with the request log on (`api.enable_request_log`).
pub fn start_server_with_request_log(extra_yaml: &str) -> Server {
    start_server_with_api(&["enable_request_log: true"], extra_yaml, &[])
}

/// [`start_server_with_yaml_env`] with more keys (`key: value`) in the `api` section.
fn start_server_with_api(
    api_keys: &[&str],
    extra_yaml: &str,
    env: &[(&str, &std::ffi::OsStr)],
) -> Server {
    let dir = tempfile::tempdir().expect("tempdir");
    let config_path = dir.path().join("server.yaml");
    let api: String = api_keys.iter().map(|k| format!(", {k}")).collect();
    let yaml = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n  cores: 2\n\
         api: {{ listen: \"127.0.0.1:0\"{api} }}\nlogging: {{ level: info, format: json }}\n{extra_yaml}"
    );
    std::fs::write(&config_path, yaml).expect("write config");
    start_server_with_env(dir, config_path, env)
}

pub fn start_server_with_file(dir: tempfile::TempDir, config_path: PathBuf) -> Server {
    start_server_with_env(dir, config_path, &[])
}

/// [`start_server_with_file`] with extra environment variables (e.g. `SWITCHYARD_RUN_DIR`).
pub fn start_server_with_env(
    dir: tempfile::TempDir,
    config_path: PathBuf,
    env: &[(&str, &std::ffi::OsStr)],
) -> Server {
    let mut cmd = Command::new(BIN);
    cmd.args(["server", "--config"]).arg(&config_path);
    cmd.envs(env.iter().copied());
    let started = spawn_with_listeners(
        cmd,
        "switchyard",
        &["HTTP proxy", "SOCKS5", "management API"],
    );
    let [http, socks5, api] = started.addrs[..] else {
        unreachable!()
    };
    Server {
        report: FailureReport {
            pid: started.proc.child.id(),
            name: "switchyard server".to_owned(),
            logs: started.logs.clone(),
        },
        proc: started.proc,
        http,
        socks5,
        api,
        dir,
        config_path,
        logs: started.logs,
    }
}

/// A switchyard command started by [`spawn_with_listeners`].
pub struct Listening {
    pub proc: Proc,
    /// The reported addresses, in the order of the messages asked for.
    pub addrs: Vec<SocketAddr>,
    pub logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// Starts `cmd` (a switchyard command logging JSON) with stderr collected and waits (20 s) until
/// it has logged, for each of `messages`, a line whose message starts with it and that carries a
/// `listen` address.
pub fn spawn_with_listeners(mut cmd: Command, name: &str, messages: &[&str]) -> Listening {
    let mut child = cmd
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    let stderr = child.stderr.take().expect("stderr");
    let proc = Proc {
        child,
        name: name.into(),
    };
    let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let sink = logs.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                let msg = v["fields"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if let Some(listen) = v["fields"]["listen"].as_str() {
                    let _ = tx.send((msg, listen.to_owned()));
                }
            }
            if let Ok(mut l) = sink.lock() {
                l.push(line);
            }
        }
    });
    let mut addrs: Vec<Option<SocketAddr>> = vec![None; messages.len()];
    let deadline = Instant::now() + Duration::from_secs(20);
    while addrs.iter().any(Option::is_none) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((msg, listen)) = rx.recv_timeout(left) else {
            let logs = logs.lock().map(|l| l.join("\n")).unwrap_or_default();
            panic!("{name} did not report its listeners; log:\n{logs}");
        };
        if let Some(i) = messages.iter().position(|m| msg.starts_with(m)) {
            addrs[i] = Some(listen.parse().expect("listen addr"));
        }
    }
    Listening {
        proc,
        addrs: addrs.into_iter().flatten().collect(),
        logs,
    }
}

impl Server {
    pub fn api_get(&self, path: &str) -> serde_json::Value {
        let out = curl(&[
            "-sS",
            "--max-time",
            "10",
            &format!("http://{}{}", self.api, path),
        ]);
        assert!(
            out.status.success(),
            "GET {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "GET {path}: not JSON ({e}): {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    }

    pub fn pid(&self) -> u32 {
        self.proc.child.id()
    }

    /// Waits until `/api/v1/stats` shows `active_connections == 0`, returning the last value.
    pub fn wait_idle(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let active = self.api_get("/api/v1/stats")["active_connections"]
                .as_u64()
                .unwrap_or(u64::MAX);
            if active == 0 || Instant::now() > deadline {
                return active;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

pub fn curl(args: &[&str]) -> Output {
    Command::new("curl").args(args).output().expect("run curl")
}

/// nginx serving `files` from a temp dir on loopback, logging `$connection $connection_requests`.
pub struct Nginx {
    pub proc: Proc,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

pub fn start_nginx(files: &[(&str, &[u8])]) -> Option<Nginx> {
    let nginx = require("nginx")?;
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("www");
    std::fs::create_dir_all(&root).expect("www");
    for (name, body) in files {
        std::fs::write(root.join(name), body).expect("file");
    }
    for attempt in 0..5 {
        let port = free_port();
        let d = dir.path().display();
        let conf = format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n  log_format conn '$connection $connection_requests $request';\n  access_log {d}/access.log conn;\n\
               client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;\n\
               uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n  keepalive_requests 10000;\n\
               server {{ listen 127.0.0.1:{port}; root {root}; \n\
                 location /upload/ {{ dav_methods PUT; create_full_put_path on; client_max_body_size 100m; }}\n }}\n}}\n",
            root = root.display()
        );
        let conf_path = dir.path().join(format!("nginx-{attempt}.conf"));
        std::fs::write(&conf_path, conf).expect("nginx conf");
        let child = Command::new(&nginx)
            .arg("-c")
            .arg(&conf_path)
            .arg("-p")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        let proc = Proc {
            child,
            name: "nginx".into(),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(Nginx { proc, port, dir });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("nginx did not start");
}

impl Nginx {
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// (connection id, requests on it) per access-log line, once there are at least `lines`.
    pub fn access_log(&self, lines: usize) -> Vec<(u64, u64, String)> {
        let text = nginx_access_log_lines(&self.dir.path().join("access.log"), lines);
        text.lines()
            .filter_map(|l| {
                let mut it = l.splitn(3, ' ');
                Some((
                    it.next()?.parse().ok()?,
                    it.next()?.parse().ok()?,
                    it.next()?.to_owned(),
                ))
            })
            .collect()
    }
}

/// Spawns a peer program with arguments, waiting until `port` accepts.
pub fn start_peer(program: &Path, args: &[&str], port: u16) -> Proc {
    let child = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", program.display()));
    let proc = Proc {
        child,
        name: program.display().to_string(),
    };
    wait_for_port(port);
    proc
}

/// A JSON API call with curl: (status, body as JSON or Null).
pub fn api_call(
    server: &Server,
    method: &str,
    path: &str,
    body: Option<&str>,
    token: Option<&str>,
) -> (u16, serde_json::Value) {
    let url = format!("http://{}{}", server.api, path);
    let mut args: Vec<String> = vec![
        "-sS".into(),
        "--max-time".into(),
        "30".into(),
        "-X".into(),
        method.into(),
    ];
    args.extend(["-w".into(), "\n%{http_code}".into()]);
    if let Some(b) = body {
        args.extend([
            "-H".into(),
            "Content-Type: application/json".into(),
            "--data-binary".into(),
            b.into(),
        ]);
    }
    if let Some(t) = token {
        args.extend(["-H".into(), format!("Authorization: Bearer {t}")]);
    }
    args.push(url);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = curl(&refs);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let status = code.trim().parse().unwrap_or(0);
    (
        status,
        serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    )
}

/// A service started by [`spawn_reporting`]: its process, the address it reported and its log.
pub struct Reported {
    pub proc: Proc,
    pub addr: SocketAddr,
    pub logs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// Starts `cmd` with stderr collected and waits (30 s) for the "listening on http://ADDR" line
/// that `pkgcache`, `inventory` and `subtitles` log at start.
pub fn spawn_reporting(mut cmd: Command, name: &str) -> Reported {
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {name}: {e}"));
    let stderr = child.stderr.take().expect("stderr");
    let proc = Proc {
        child,
        name: name.to_owned(),
    };
    let logs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = logs.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let addr = line
                .split("listening on http://")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string);
            if let Ok(mut l) = sink.lock() {
                l.push(line);
            }
            if let Some(addr) = addr {
                let _ = tx.send(addr);
            }
        }
    });
    let Ok(addr) = rx.recv_timeout(Duration::from_secs(30)) else {
        let l = logs.lock().map(|l| l.join("\n")).unwrap_or_default();
        panic!("{name} did not report its address; log:\n{l}");
    };
    Reported {
        proc,
        addr: addr.parse().expect("listen address"),
        logs,
    }
}

/// A real S3-compatible server (moto, installed from PyPI by tests/run) on a free loopback port.
pub struct Moto {
    _proc: Proc,
    pub endpoint: String,
}

/// Starts `moto_server`, or prints why the test skips (fails under CI) and returns None.
pub fn start_moto() -> Option<Moto> {
    let bin = require("moto_server")?;
    for _ in 0..5 {
        let port = free_port();
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let proc = Proc {
            child,
            name: "moto_server".into(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(Moto {
                    _proc: proc,
                    endpoint: format!("http://127.0.0.1:{port}"),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("moto_server did not start");
}

/// One request a [`Recorder`] received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub peer: SocketAddr,
    /// Which accepted connection (0, 1, …) carried it.
    pub connection: usize,
    /// The request head as text (request line and headers).
    pub head: String,
}

/// A small HTTP/1.1 server (keep-alive, requests without bodies) that records every request
/// head and answers `peer=<client IP>` with the status `status(head)` chooses. It stands in
/// for an upstream proxy or an origin whose view of the traffic a test must check.
pub struct Recorder {
    pub port: u16,
    pub seen: std::sync::Arc<std::sync::Mutex<Vec<Seen>>>,
}

pub fn start_recorder(status: fn(&str) -> u16) -> Recorder {
    start_recorder_on("127.0.0.1", status)
}

pub fn start_recorder_on(ip: &str, status: fn(&str) -> u16) -> Recorder {
    use std::io::{Read, Write};
    let listener = TcpListener::bind((ip, 0)).expect("recorder bind");
    let port = listener.local_addr().expect("addr").port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for (connection, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { continue };
            let log = log.clone();
            std::thread::spawn(move || {
                let Ok(peer) = stream.peer_addr() else { return };
                let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let end = buf.windows(4).position(|w| w == b"\r\n\r\n");
                    let Some(end) = end else {
                        match stream.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end + 4);
                    let code = status(&head);
                    log.lock().expect("log").push(Seen {
                        peer,
                        connection,
                        head,
                    });
                    let body = format!("peer={}\n", peer.ip());
                    let reply = format!(
                        "HTTP/1.1 {code} Recorded\r\nContent-Length: {}\r\nX-Recorder: yes\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    Recorder { port, seen }
}

impl Recorder {
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("log").clone()
    }
}

/// Runs curl with `args`, discarding the body, and returns the HTTP status it printed.
pub fn http_code(args: &[&str]) -> String {
    let mut all = vec!["-s", "-o", "/dev/null", "-w", "%{http_code}"];
    all.extend_from_slice(args);
    String::from_utf8_lossy(&curl(&all).stdout).into_owned()
}

/// A SOCKS5 UDP association (no authentication): the TCP control connection and the relay's
/// address from the reply.
pub fn socks5_udp_associate(socks5: SocketAddr) -> (std::net::TcpStream, SocketAddr) {
    use std::io::{Read, Write};
    let mut ctl = std::net::TcpStream::connect(socks5).expect("connect");
    ctl.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    ctl.write_all(b"\x05\x01\x00").expect("greeting");
    let mut sel = [0u8; 2];
    ctl.read_exact(&mut sel).expect("method");
    assert_eq!(sel, [5, 0]);
    ctl.write_all(b"\x05\x03\x00\x01\x00\x00\x00\x00\x00\x00")
        .expect("associate");
    let mut rep = [0u8; 10];
    ctl.read_exact(&mut rep).expect("reply");
    assert_eq!(&rep[..4], &[5, 0, 0, 1], "UDP ASSOCIATE refused");
    let relay = SocketAddr::from((
        [rep[4], rep[5], rep[6], rep[7]],
        u16::from_be_bytes([rep[8], rep[9]]),
    ));
    (ctl, relay)
}

/// A UDP echo server in the namespace (every address, port `ECHO_PORT`) that answers each
/// datagram with its payload and the sender's address: what the tests check the route by.
pub const ECHO_PORT: u16 = 7070;
pub const UDP_ECHO: &str = "import socket\n\
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
s.bind(('0.0.0.0', 7070))\n\
while True:\n    d, a = s.recvfrom(65535)\n    s.sendto(d + b' from ' + a[0].encode(), a)\n";

pub fn udp_echo_in(ns: &str) -> Option<Proc> {
    let python = require("python3")?;
    let child = Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(python)
        .args(["-c", UDP_ECHO])
        .stdout(Stdio::null())
        .spawn()
        .expect("udp echo");
    Some(Proc {
        child,
        name: "udp echo".into(),
    })
}

/// Sends `payload` to `dest` through the relay (RFC 1928 §7 header) until a reply comes back
/// (datagrams may be lost while the echo server starts); returns the reply's header and data.
pub fn udp_exchange(
    client: &std::net::UdpSocket,
    relay: SocketAddr,
    dest: std::net::SocketAddrV4,
    payload: &[u8],
) -> (Vec<u8>, String) {
    let mut dgram = vec![0, 0, 0, 1];
    dgram.extend_from_slice(&dest.ip().octets());
    dgram.extend_from_slice(&dest.port().to_be_bytes());
    dgram.extend_from_slice(payload);
    let mut buf = [0u8; 2048];
    for _ in 0..15 {
        client.send_to(&dgram, relay).expect("send");
        if let Ok((n, _)) = client.recv_from(&mut buf) {
            let data = String::from_utf8_lossy(&buf[10.min(n)..n]).into_owned();
            return (buf[..10.min(n)].to_vec(), data);
        }
    }
    panic!("no reply from {dest} through the relay");
}

/// A UDP socket on loopback for a SOCKS5 UDP client (2 s per receive).
pub fn udp_client() -> std::net::UdpSocket {
    let client = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    client
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    client
}

/// Sends `payload` through the relay to the namespace echo at `ip`:[`ECHO_PORT`], checks the
/// reply (header names the echo server, payload echoed) and returns the source address the
/// echo server saw.
pub fn echo_source(
    client: &std::net::UdpSocket,
    relay: SocketAddr,
    ip: &str,
    payload: &str,
) -> String {
    let ip: std::net::Ipv4Addr = ip.parse().expect("ip");
    let dest = std::net::SocketAddrV4::new(ip, ECHO_PORT);
    let (header, data) = udp_exchange(client, relay, dest, payload.as_bytes());
    let mut want = vec![0, 0, 0, 1];
    want.extend_from_slice(&ip.octets());
    want.extend_from_slice(&ECHO_PORT.to_be_bytes());
    assert_eq!(header, want, "the reply's header names the echo server");
    let source = data.strip_prefix(&format!("{payload} from "));
    source
        .unwrap_or_else(|| panic!("not an echo: {data}"))
        .to_owned()
}

/// KiB of `/proc/PID/smaps` `Rss` and `Size` of the switchyard binary's executable mapping(s)
/// in process `pid` (issue 14: start-up code pages given back).
pub fn resident_code_kib(pid: u32) -> (u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let bin = std::fs::canonicalize(BIN).expect("binary path");
    let code = switchyard_dataplane::text_pages::code_residency(&smaps, &bin.to_string_lossy());
    (code.resident_kib, code.size_kib)
}

/// Issue 14: waits (at most 30 s) until the `server` or `client` with these `logs` and `pid`
/// logged "start-up code pages released" and checks the release. The process read its own
/// resident code right before and right after the release, so that ratio does not depend on
/// what else the machine faults in meanwhile (issue 37: a fixed fraction of the text's size,
/// read later from outside, failed under load); from outside, what is resident now must still
/// be below what was resident before the release (a release that drops nothing fails both).
pub fn assert_start_up_code_pages_released(logs: &std::sync::Mutex<Vec<String>>, pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let fields = loop {
        let line = logs.lock().ok().and_then(|l| {
            l.iter()
                .find(|l| l.contains("start-up code pages released"))
                .cloned()
        });
        if let Some(line) = line {
            let v: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
            break v["fields"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "pid {pid} never released its start-up code pages:\n{}",
            logs.lock().map(|l| l.join("\n")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let kib = |name: &str| {
        fields[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no {name} in {fields}"))
    };
    let (before, after) = (
        kib("code_resident_before_kib"),
        kib("code_resident_after_kib"),
    );
    // start-up leaves megabytes of code resident (issue 14, release build: 9.8 of 23.6 MiB)
    assert!(
        after * 2 < before,
        "the release left {after} of {before} KiB of code resident: {fields}"
    );
    let (now, size) = resident_code_kib(pid);
    assert!(size > 0, "no executable mapping of {BIN} found");
    assert!(
        now < before,
        "{now} KiB of code resident after the release, {before} KiB right before it"
    );
}

/// A reqwest client for the tests. The binary's reqwest is built without a bundled TLS
/// provider (one crypto library, ring, for the whole binary: issue 14), so reqwest needs
/// rustls' process default installed before it builds a client, as the binary's `main` does.
pub fn http_client_builder() -> reqwest::ClientBuilder {
    switchyard_service::tls::use_ring_provider();
    reqwest::Client::builder()
}

/// [`http_client_builder`] with reqwest's defaults.
pub fn http_client() -> reqwest::Client {
    http_client_builder()
        .build()
        .expect("reqwest client with the default settings")
}

//! An OpenVPN 2.6 server for end-to-end tests: `openvpn` in a network namespace of its own,
//! reached from the host over a veth pair this module creates, with nginx on port 80 of every
//! address of the namespace (so on the server's tunnel address too). Certificates are made by
//! `openssl` for each server. Two ways to authenticate switchyard's client: peer fingerprints
//! (self-signed certificates on both sides), or as commercial providers do it, a CA-signed
//! server certificate named after the server's host name and a username/password checked by a
//! small `--auth-user-pass-verify` script (no client certificate). Used by the OpenVPN and
//! provider-backend tests. Needs root.

use super::wg_peer::{namespace_with_veth, sh, start_nginx};
use super::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// openvpn, openssl, nginx and ip as root, or None (skip) with the reason printed.
pub fn prerequisites() -> Option<(PathBuf, PathBuf)> {
    if !is_root() {
        if std::env::var_os("CI").is_some() {
            panic!("the OpenVPN tests need root in CI");
        }
        eprintln!("SKIP: the OpenVPN tests need root (network namespaces, TUN)");
        return None;
    }
    require("ip")?;
    require("openssl")?;
    let openvpn = require("openvpn")?;
    let nginx = require("nginx")?;
    Some((openvpn, nginx))
}

/// A self-signed EC certificate and key; returns (cert PEM, key PEM, SHA-256 fingerprint).
pub fn self_signed(dir: &Path, name: &str) -> (String, String, String) {
    let cert = dir.join(format!("{name}.crt"));
    let key = dir.join(format!("{name}.key"));
    sh(
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &key.display().to_string(),
            "-out",
            &cert.display().to_string(),
        ],
    );
    let fp = sh(
        "openssl",
        &[
            "x509",
            "-noout",
            "-fingerprint",
            "-sha256",
            "-in",
            &cert.display().to_string(),
        ],
    );
    let fp = fp.rsplit('=').next().unwrap_or_default().trim().to_owned();
    (
        std::fs::read_to_string(&cert).expect("cert"),
        std::fs::read_to_string(&key).expect("key"),
        fp,
    )
}

/// A namespace with a veth to the host, an `openvpn` server and nginx (port 80 on every
/// address of the namespace). Processes are killed by PID, namespace and veth deleted on drop.
pub struct VpnServer {
    pub ns: String,
    pub host_veth: String,
    pub dir: tempfile::TempDir,
    pub openvpn: PathBuf,
    server_proc: Option<Proc>,
    _nginx: Proc,
    /// The server's UDP endpoint address (namespace side of the veth).
    pub endpoint_ip: String,
    /// The host side of the veth: what the origin sees for direct requests.
    pub host_ip: String,
    /// The server's address inside the tunnel (the origin is reached there).
    pub origin_ip: String,
    /// The address the server assigns to switchyard's client.
    pub client_ip: String,
    pub tun: String,
    /// `udp` or `tcp` (the switchyard settings' `proto`).
    pub proto: &'static str,
    pub server_fp: String,
    pub client_cert: String,
    pub client_key: String,
    pub client_fp: String,
    pub auth: ClientAuth,
    /// The CA that signed the server certificate (PEM; empty in fingerprint mode).
    pub ca_cert: String,
}

/// How the server authenticates switchyard's client.
#[derive(Clone, Debug)]
pub enum ClientAuth {
    /// Self-signed certificates on both sides, each pinned by its SHA-256 fingerprint.
    Fingerprint,
    /// As commercial providers do: a CA-signed server certificate whose CN is `hostname`, and
    /// no client certificate but `username`/`password`, checked by a script.
    Password {
        hostname: String,
        username: String,
        password: String,
    },
}

/// What differs between the tests' servers.
pub struct Options {
    /// Prefix of the namespace and device names (the test file's own).
    pub prefix: &'static str,
    /// The veth is 10.`net_octet`.K.0/30, the tunnel 10.(`net_octet`+1).K.0/24.
    pub net_octet: u8,
    /// `udp` or `tcp`.
    pub proto: &'static str,
    pub auth: ClientAuth,
}

/// A CA and a server certificate it signed with CN `hostname` (server key usage, as
/// `remote-cert-tls server` wants); returns the CA PEM. Writes ca.crt, server.crt, server.key.
fn ca_signed_server(dir: &Path, hostname: &str) -> String {
    let p = |name: &str| dir.join(name).display().to_string();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec![
        "req",
        "-x509",
        "-days",
        "2",
        "-subj",
        "/CN=Switchyard test provider CA",
    ];
    ca.extend(ec);
    let (ca_key, ca_crt) = (p("ca.key"), p("ca.crt"));
    ca.extend(["-keyout", &ca_key, "-out", &ca_crt]);
    sh("openssl", &ca);
    let subject = format!("/CN={hostname}");
    let (key, csr, crt, ext) = (
        p("server.key"),
        p("server.csr"),
        p("server.crt"),
        p("server.ext"),
    );
    let mut req = vec!["req", "-new", "-subj", &subject];
    req.extend(ec);
    req.extend(["-keyout", &key, "-out", &csr]);
    sh("openssl", &req);
    std::fs::write(
        &ext,
        "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyAgreement
extendedKeyUsage=serverAuth
",
    )
    .expect("ext");
    sh(
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-set_serial",
            "2",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ],
    );
    std::fs::read_to_string(&ca_crt).expect("ca")
}

impl VpnServer {
    pub fn start(openvpn: PathBuf, nginx: PathBuf) -> VpnServer {
        Self::start_with(openvpn, nginx, "udp")
    }

    pub fn start_with(openvpn: PathBuf, nginx: PathBuf, proto: &'static str) -> VpnServer {
        let options = Options {
            prefix: "syovpn",
            net_octet: 215,
            proto,
            auth: ClientAuth::Fingerprint,
        };
        Self::start_opts(openvpn, nginx, options)
    }

    pub fn start_opts(openvpn: PathBuf, nginx: PathBuf, options: Options) -> VpnServer {
        let Options {
            prefix,
            net_octet: v,
            proto,
            auth,
        } = options;
        let t = v + 1;
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}{}", std::process::id() % 10_000, n);
        let k = (std::process::id() * 7 + n * 31) % 250 + 1;
        let ns = format!("{prefix}-{id}");
        let host_veth = format!("{prefix}h{id}");
        let ns_veth = format!("{prefix}n{id}");
        let tun = format!("{prefix}t{id}");
        let host_ip = format!("10.{v}.{k}.1");
        let endpoint_ip = format!("10.{v}.{k}.2");
        namespace_with_veth(&ns, &host_veth, &ns_veth, &host_ip, &endpoint_ip);

        let dir = tempfile::tempdir().expect("tempdir");
        let (server_fp, ca_cert) = match &auth {
            ClientAuth::Fingerprint => (self_signed(dir.path(), "server").2, String::new()),
            ClientAuth::Password {
                hostname,
                username,
                password,
            } => {
                let ca = ca_signed_server(dir.path(), hostname);
                // OpenVPN hands the script a file with the username and password on two lines.
                let expected = dir.path().join("credentials");
                std::fs::write(&expected, format!("{username}\n{password}\n")).expect("creds");
                let script = dir.path().join("check-credentials.sh");
                std::fs::write(
                    &script,
                    format!(
                        "#!/bin/sh\n[ \"$(head -n 2 \"$1\")\" = \"$(cat '{}')\" ]\n",
                        expected.display()
                    ),
                )
                .expect("script");
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700))
                    .expect("chmod");
                (String::new(), ca)
            }
        };
        let (client_cert, client_key, client_fp) = self_signed(dir.path(), "client");
        let www = dir.path().join("www");
        std::fs::create_dir_all(&www).expect("www");
        std::fs::write(www.join("hello.txt"), "hello through openvpn\n").expect("file");
        std::fs::write(www.join("big.bin"), vec![7u8; 2 * 1024 * 1024]).expect("file");
        // nginx on every address of the namespace: the tunnel address and the veth address.
        let nginx_proc = start_nginx(&nginx, &ns, dir.path(), "80");
        let mut server = VpnServer {
            ns,
            host_veth,
            openvpn,
            server_proc: None,
            _nginx: nginx_proc,
            origin_ip: format!("10.{t}.{k}.1"),
            client_ip: format!("10.{t}.{k}.2"),
            endpoint_ip,
            host_ip,
            tun,
            proto,
            server_fp,
            client_cert,
            client_key,
            client_fp,
            auth,
            ca_cert,
            dir,
        };
        server.start_openvpn();
        server
    }

    /// Starts the OpenVPN server in the namespace (keepalive pushed to the client: a lost
    /// server is noticed within 6 s).
    pub fn start_openvpn(&mut self) {
        let d = self.dir.path();
        let subnet = self
            .origin_ip
            .rsplit_once('.')
            .map(|(a, _)| a)
            .unwrap_or_default();
        let log = d.join("openvpn-server.log");
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(&self.openvpn)
            .args([
                "--dev",
                &self.tun,
                "--dev-type",
                "tun",
                "--disable-dco",
                "--proto",
                if self.proto == "tcp" {
                    "tcp-server"
                } else {
                    "udp"
                },
                "--local",
                &self.endpoint_ip,
                "--port",
                "1194",
                "--topology",
                "subnet",
                "--server",
                &format!("{subnet}.0"),
                "255.255.255.0",
                "--dh",
                "none",
                "--keepalive",
                "1",
                "6",
                "--verb",
                "3",
            ])
            .args(self.auth_args())
            .arg("--cert")
            .arg(d.join("server.crt"))
            .arg("--key")
            .arg(d.join("server.key"))
            .arg("--log")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openvpn server");
        self.server_proc = Some(Proc {
            child,
            name: "openvpn server".into(),
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Initialization Sequence Completed") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the OpenVPN server did not start:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The server options that authenticate the client.
    fn auth_args(&self) -> Vec<std::ffi::OsString> {
        let d = self.dir.path();
        match &self.auth {
            ClientAuth::Fingerprint => vec!["--peer-fingerprint".into(), (&self.client_fp).into()],
            ClientAuth::Password { .. } => vec![
                "--ca".into(),
                d.join("ca.crt").into(),
                "--verify-client-cert".into(),
                "none".into(),
                "--username-as-common-name".into(),
                "--script-security".into(),
                "2".into(),
                "--auth-user-pass-verify".into(),
                d.join("check-credentials.sh").into(),
                "via-file".into(),
            ],
        }
    }

    pub fn stop_openvpn(&mut self) {
        self.server_proc = None; // killed (SIGKILL) by PID: the client hears nothing
    }

    /// The inline `openvpn:` settings for switchyard (keys as PEM text).
    pub fn settings(&self) -> serde_json::Value {
        serde_json::json!({
            "remote": self.endpoint_ip,
            "port": 1194,
            "proto": self.proto,
            "cert": self.client_cert,
            "key": self.client_key,
            "peer_fingerprint": self.server_fp,
            "extra": ["verb 3"],
        })
    }

    pub fn access_log(&self) -> String {
        self.access_log_lines(1)
    }

    /// The origin's access log once it has at least `lines` lines (at most 5 s).
    pub fn access_log_lines(&self, lines: usize) -> String {
        super::nginx_access_log_lines(&self.dir.path().join("access.log"), lines)
    }
}

impl Drop for VpnServer {
    fn drop(&mut self) {
        self.server_proc = None;
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_veth])
            .status();
    }
}

/// A switchyard server with its own run directory (so its OpenVPN devices and tables are its
/// own). Stopped with SIGTERM on drop, so it removes its processes, devices and rules.
pub struct Gateway {
    pub server: Server,
    pub config_path: PathBuf,
    pub run_dir: PathBuf,
    _dir: tempfile::TempDir,
}

pub fn start_gateway(config_path: &Path, run_dir: &Path) -> Server {
    // The Server's own temp dir is unused: the config and run directory belong to the Gateway.
    let dir = tempfile::tempdir().expect("tempdir");
    start_server_with_env(
        dir,
        config_path.to_owned(),
        &[("SWITCHYARD_RUN_DIR", run_dir.as_os_str())],
    )
}

pub fn gateway(extra_yaml: &str) -> Gateway {
    let dir = tempfile::tempdir().expect("tempdir");
    let run_dir = dir.path().join("run");
    let config_path = dir.path().join("server.yaml");
    let yaml = format!(
        "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n  cores: 2\n\
         api: {{ listen: \"127.0.0.1:0\" }}\nlogging: {{ level: info, format: json }}\n{extra_yaml}"
    );
    std::fs::write(&config_path, yaml).expect("config");
    let server = start_gateway(&config_path, &run_dir);
    Gateway {
        server,
        config_path,
        run_dir,
        _dir: dir,
    }
}

impl Gateway {
    /// SIGTERM, then waits (20 s) for the exit; true when it exited by itself.
    pub fn terminate(&mut self) -> bool {
        let child = &mut self.server.proc.child;
        if child.try_wait().ok().flatten().is_some() {
            return true;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if child.try_wait().ok().flatten().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.terminate();
    }
}

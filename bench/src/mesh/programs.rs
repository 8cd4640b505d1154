//! How each program builds its overlay between the two namespaces: keys, certificates,
//! configuration files, processes; each returns the peers' PIDs and the address of `b`.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::{
    overlay_ip, side_name, Setup, Tracked, Up, CLIENT_API_PORT, NETWORK, OVERLAY_MTU,
    READY_TIMEOUT, REGISTRY_PORT, SWITCHYARD_CIDR, UNDERLAY,
};
use crate::peers::deb_version;
use crate::procs::{output_of, tail, which};
use crate::vpn::{in_ns, sh};
use crate::wireguard::{boringtun_cli, keypair, run_cmd, start_boringtun};

pub(super) fn boringtun(s: &Setup<'_>, threads: Option<u32>, procs: &mut Tracked) -> Result<Up> {
    let bin = boringtun_cli()?;
    which("wg").context("wg (wireguard-tools) is not installed")?;
    let (kind, net) = if threads.is_some() {
        ('w', 1)
    } else {
        ('x', 2)
    };
    let dir = s.workdir(&format!("boringtun-{kind}"))?;
    let keys = [keypair()?, keypair()?];
    let mut peers = Vec::new();
    for side in 0..2 {
        let (ns, tun) = (s.ns(side), s.names.dev(kind, side));
        let key = dir.join(format!("{}.key", side_name(side)));
        write_secret(&key, &keys[side].0)?;
        let log = dir.join(format!("{}.log", side_name(side)));
        let pid = start_boringtun(&mut procs.procs, &bin, &ns, &tun, threads, &log)?;
        procs.track(pid);
        peers.push(pid);
        let other = 1 - side;
        run_cmd(
            "ip",
            &[
                "netns",
                "exec",
                &ns,
                "wg",
                "set",
                &tun,
                "private-key",
                &key.display().to_string(),
                "listen-port",
                "51820",
                "peer",
                &keys[other].1,
                "allowed-ips",
                &format!("{}/32", overlay_ip(net, other)),
                "endpoint",
                &format!("{}:51820", UNDERLAY[other]),
            ],
        )?;
        sh(&format!(
            "set -e; ip -n {ns} addr add {}/24 dev {tun}; ip -n {ns} link set {tun} mtu {OVERLAY_MTU} up",
            overlay_ip(net, side)
        ))?;
    }
    Ok(Up {
        peers,
        target: overlay_ip(net, 1),
        version: output_of(&bin.to_string_lossy(), &["--version"]),
        notes: Vec::new(),
    })
}

/// nebula's configuration for `side` (`a` is the lighthouse, `b` finds it by the static map).
fn nebula_config(dir: &Path, side: usize, dev: &str) -> String {
    let me = side_name(side);
    let lighthouse = overlay_ip(3, 0);
    let (am, hosts) = if side == 0 {
        ("true", "[]".to_string())
    } else {
        ("false", format!("[\"{lighthouse}\"]"))
    };
    let d = dir.display();
    format!(
        "pki: {{ca: \"{d}/ca.crt\", cert: \"{d}/{me}.crt\", key: \"{d}/{me}.key\"}}\n\
         static_host_map: {{\"{lighthouse}\": [\"{}:4242\"]}}\n\
         lighthouse: {{am_lighthouse: {am}, interval: 60, hosts: {hosts}}}\n\
         listen: {{host: 0.0.0.0, port: 4242}}\n\
         punchy: {{punch: false}}\n\
         tun: {{disabled: false, dev: {dev}, mtu: {OVERLAY_MTU}}}\n\
         logging: {{level: info}}\n\
         firewall:\n  outbound: [{{port: any, proto: any, host: any}}]\n  inbound: [{{port: any, proto: any, host: any}}]\n",
        UNDERLAY[0]
    )
}

pub(super) fn nebula(s: &Setup<'_>, procs: &mut Tracked) -> Result<Up> {
    let bin = which("nebula").context("nebula is not installed")?;
    which("nebula-cert").context("nebula-cert is not installed")?;
    let dir = s.workdir("nebula")?;
    let path = |f: &str| dir.join(f).display().to_string();
    run_cmd(
        "nebula-cert",
        &[
            "ca",
            "-name",
            "switchyard bench",
            "-out-crt",
            &path("ca.crt"),
            "-out-key",
            &path("ca.key"),
        ],
    )?;
    let mut peers = Vec::new();
    for side in 0..2 {
        let me = side_name(side);
        run_cmd(
            "nebula-cert",
            &[
                "sign",
                "-ca-crt",
                &path("ca.crt"),
                "-ca-key",
                &path("ca.key"),
                "-name",
                me,
                "-ip",
                &format!("{}/24", overlay_ip(3, side)),
                "-out-crt",
                &path(&format!("{me}.crt")),
                "-out-key",
                &path(&format!("{me}.key")),
            ],
        )?;
        let conf = dir.join(format!("{me}.yml"));
        fs::write(&conf, nebula_config(&dir, side, &s.names.dev('n', side)))?;
        let cmd = in_ns(
            &s.ns(side),
            None,
            false,
            &bin.to_string_lossy(),
            &["-config", &conf.display().to_string()],
        );
        peers.push(procs.spawn_under_test(
            &format!("nebula {me}"),
            cmd,
            &dir.join(format!("{me}.log")),
        )?);
    }
    Ok(Up {
        peers,
        target: overlay_ip(3, 1),
        version: deb_version("nebula"),
        notes: vec!["AES-256-GCM (nebula's default cipher), a is the lighthouse".into()],
    })
}

/// tinc's `tinc.conf`, host file (before the key is appended) and `tinc-up` for `side`.
fn tinc_files(side: usize, dev: &str) -> [String; 3] {
    let me = side_name(side);
    let mut conf = format!("Name = {me}\nInterface = {dev}\nAddressFamily = ipv4\n");
    if side == 1 {
        conf.push_str("ConnectTo = a\n");
    }
    let host = format!(
        "Address = {}\nSubnet = {}/32\n",
        UNDERLAY[side],
        overlay_ip(4, side)
    );
    let up = format!(
        "#!/bin/sh\nip addr add {}/24 dev \"$INTERFACE\"\nip link set \"$INTERFACE\" mtu {OVERLAY_MTU} up\n",
        overlay_ip(4, side)
    );
    [conf, host, up]
}

pub(super) fn tinc(s: &Setup<'_>, procs: &mut Tracked) -> Result<Up> {
    let bin = which("tincd").context("tinc is not installed")?;
    let dir = s.workdir("tinc")?;
    let conf_dirs = [dir.join("a"), dir.join("b")];
    for (side, d) in conf_dirs.iter().enumerate() {
        fs::create_dir_all(d.join("hosts"))?;
        let [conf, host, up] = tinc_files(side, &s.names.dev('t', side));
        fs::write(d.join("tinc.conf"), conf)?;
        fs::write(d.join("hosts").join(side_name(side)), host)?;
        fs::write(d.join("tinc-up"), up)?;
        fs::set_permissions(d.join("tinc-up"), fs::Permissions::from_mode(0o755))?;
        // Not a terminal on stdin: tincd writes the keys to their default places without asking
        // (rsa_key.priv, and the public key appended to hosts/<Name>).
        let out = Command::new(&bin)
            .arg("-c")
            .arg(d)
            .arg("-K2048")
            .stdin(Stdio::null())
            .output()
            .context("tincd -K")?;
        if !out.status.success() || !d.join("rsa_key.priv").exists() {
            bail!(
                "tincd -K failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    for side in 0..2 {
        let me = side_name(side);
        fs::copy(
            conf_dirs[side].join("hosts").join(me),
            conf_dirs[1 - side].join("hosts").join(me),
        )?;
    }
    let mut peers = Vec::new();
    for (side, d) in conf_dirs.iter().enumerate() {
        let me = side_name(side);
        let pidfile = format!("--pidfile={}", d.join("tinc.pid").display());
        let cmd = in_ns(
            &s.ns(side),
            None,
            false,
            &bin.to_string_lossy(),
            &["-c", &d.display().to_string(), "-D", &pidfile],
        );
        peers.push(procs.spawn_under_test(
            &format!("tincd {me}"),
            cmd,
            &dir.join(format!("{me}.log")),
        )?);
    }
    Ok(Up {
        peers,
        target: overlay_ip(4, 1),
        version: deb_version("tinc"),
        notes: vec![
            "router mode, UDP, default Cipher/Digest (tinc 1.0: blowfish-CBC, SHA-1)".into(),
        ],
    })
}

/// An HTTP call made with curl from inside namespace `ns`: the status and the JSON body (Null
/// when empty or not JSON).
fn http(ns: &str, method: &str, url: &str, body: Option<&Value>) -> Result<(u16, Value)> {
    let body = body.map(Value::to_string);
    let mut args = vec!["-sS", "-m", "5", "-X", method, "-w", "\n%{http_code}"];
    if let Some(b) = &body {
        args.extend(["-H", "Content-Type: application/json", "--data", b.as_str()]);
    }
    args.push(url);
    let out = in_ns(ns, None, false, "curl", &args)
        .output()
        .context("curl")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    let code = code.trim().parse().unwrap_or(0);
    if code == 0 {
        bail!(
            "{method} {url}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok((code, serde_json::from_str(body).unwrap_or(Value::Null)))
}

/// The virtual IP the registry leased to the peer named (or with the id) `name`, from
/// `GET /api/v1/mesh/networks/{id}/peers`.
fn leased_ip(peers: &Value, name: &str) -> Option<String> {
    peers["peers"]
        .as_array()?
        .iter()
        .find(|p| p["name"] == name || p["id"] == name)?["virtual_ip"]
        .as_str()
        .filter(|ip| ip.parse::<std::net::Ipv4Addr>().is_ok())
        .map(str::to_string)
}

/// A client's `GET /api/v1/mesh/status` in a few words: its `status` and `enabled`.
fn mesh_state(code: u16, v: &Value) -> String {
    match (code, v["status"].as_str()) {
        (200, Some(status)) => format!("{status} (enabled: {})", v["enabled"]),
        _ => format!("HTTP {code} {v}"),
    }
}

/// `switchyard client`'s configuration: only the mesh, named `name`, its device `dev`, the
/// registry at `registry` (plain HTTP on the bench's private veth: `insecure`), passing other
/// members' envelopes on when `relay`.
fn client_config(name: &str, dev: &str, registry: &str, relay: bool) -> String {
    format!(
        "proxy:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n  cores: 1\n\
         api: {{listen: \"127.0.0.1:{CLIENT_API_PORT}\"}}\nlogging: {{level: info}}\n\
         mesh:\n  enabled: true\n  network_id: {NETWORK}\n  network_cidr: {SWITCHYARD_CIDR}\n  peer_name: {name}\n\
         \x20 device: {{type: tun, name: {dev}, mtu: {OVERLAY_MTU}}}\n\
         \x20 discovery: {{server: \"{registry}\", insecure: true, heartbeat_interval: 5s}}\n\
         \x20 connection: {{relay_via_peers: {relay}}}\n"
    )
}

/// Where switchyard's registry and peers run: the direct row (registry in `a`, peers `a` and
/// `b`) or the relayed one (registry and a relaying peer in `c`, the only namespace `a` and
/// `b` both reach).
pub(super) struct Layout {
    /// The namespace of the registry (`switchyard server`).
    pub registry_ns: String,
    /// Its API's listen address there.
    pub registry_listen: String,
    /// How `a` and `b` reach it.
    pub registry_urls: [String; 2],
    /// The relaying peer: its namespace and how it reaches the registry.
    pub relay: Option<(String, String)>,
    /// The letter of the overlay devices' names.
    pub dev: char,
    /// The workdir's name.
    pub name: &'static str,
}

impl Layout {
    /// The direct row: `a` and `b` over the veth between them.
    pub fn direct(s: &Setup<'_>) -> Layout {
        let url = format!("http://{}:{REGISTRY_PORT}", UNDERLAY[0]);
        Layout {
            registry_ns: s.ns(0),
            registry_listen: format!("{}:{REGISTRY_PORT}", UNDERLAY[0]),
            registry_urls: [url.clone(), url],
            relay: None,
            dev: 'y',
            name: "switchyard",
        }
    }
}

/// The registry's base URL seen from its own namespace.
fn registry_base(layout: &Layout) -> String {
    let port = layout.registry_listen.rsplit(':').next().unwrap_or("0");
    match layout.registry_listen.split(':').next() {
        Some("0.0.0.0") => format!("http://127.0.0.1:{port}"),
        _ => format!("http://{}", layout.registry_listen),
    }
}

pub(super) fn switchyard(s: &Setup<'_>, layout: &Layout, procs: &mut Tracked) -> Result<Up> {
    let bin = s.ctx.switchyard.display().to_string();
    let dir = s.workdir(layout.name)?;
    let home = &layout.registry_ns;
    let registry = registry_base(layout);
    let server_cfg = dir.join("server.yaml");
    fs::write(
        &server_cfg,
        format!(
            "server:\n  http: {{listen: \"127.0.0.1:0\"}}\n  socks5: {{listen: \"127.0.0.1:0\"}}\n  cores: 1\n  data_dir: \"{}\"\n\
             api: {{listen: \"{}\"}}\nlogging: {{level: info}}\n\
             mesh:\n  registry: {{enabled: true, lease_time: 30s}}\n",
            dir.join("server-data").display(),
            layout.registry_listen
        ),
    )?;
    let server_log = dir.join("server.log");
    let server = procs.spawn_under_test(
        "switchyard server (registry)",
        in_ns(
            home,
            None,
            false,
            &bin,
            &["server", "--config", &server_cfg.display().to_string()],
        ),
        &server_log,
    )?;
    let networks = format!("{registry}/api/v1/mesh/networks");
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(reason) = procs.exited(&[server]) {
            bail!("{reason}; log: {}", tail(&server_log, 5));
        }
        match http(home, "GET", &networks, None) {
            Ok((200, _)) => break,
            Ok((status, body)) if Instant::now() > deadline => {
                bail!("registry: GET {networks} answers {status}: {body}")
            }
            Err(e) if Instant::now() > deadline => bail!("registry did not come up: {e:#}"),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
    let (status, body) = http(
        home,
        "POST",
        &networks,
        Some(&json!({"id": NETWORK, "name": "switchyard bench", "cidr": SWITCHYARD_CIDR})),
    )?;
    if status != 201 {
        bail!("registry: creating the network answered {status}: {body}");
    }
    // a and b, then the relay (when there is one): each with its namespace and registry URL
    let mut members: Vec<(String, String, String, bool)> = (0..2)
        .map(|side| {
            (
                side_name(side).to_string(),
                s.ns(side),
                layout.registry_urls[side].clone(),
                false,
            )
        })
        .collect();
    if let Some((ns, url)) = &layout.relay {
        members.push(("c".into(), ns.clone(), url.clone(), true));
    }
    let mut peers = Vec::new();
    let mut logs = Vec::new();
    for (me, ns, url, relay) in &members {
        let cfg = dir.join(format!("client-{me}.yaml"));
        let dev = format!("{}{}{me}", s.names.prefix, layout.dev);
        fs::write(&cfg, client_config(me, &dev, url, *relay))?;
        let log = dir.join(format!("client-{me}.log"));
        let cmd = in_ns(
            ns,
            None,
            false,
            &bin,
            &[
                "client",
                "--config",
                &cfg.display().to_string(),
                "--data-dir",
                &dir.join(format!("client-{me}-data")).display().to_string(),
            ],
        );
        peers.push(procs.spawn_under_test(&format!("switchyard client {me}"), cmd, &log)?);
        logs.push(log);
    }
    // Every peer registered: b's leased address is where a pings it.
    let listed = format!("{networks}/{NETWORK}/peers");
    let deadline = Instant::now() + READY_TIMEOUT;
    let target = loop {
        if let Some(reason) = procs.exited(&peers) {
            bail!(
                "{reason}; logs: a: {} / b: {}",
                tail(&logs[0], 3),
                tail(&logs[1], 3)
            );
        }
        let list = http(home, "GET", &listed, None)
            .map(|(_, v)| v)
            .unwrap_or(Value::Null);
        let all = members
            .iter()
            .all(|(me, ..)| leased_ip(&list, me).is_some());
        if let (true, Some(ip)) = (all, leased_ip(&list, "b")) {
            break ip;
        }
        if Instant::now() > deadline {
            let status = |ns: &str| {
                http(
                    ns,
                    "GET",
                    &format!("http://127.0.0.1:{CLIENT_API_PORT}/api/v1/mesh/status"),
                    None,
                )
                .map(|(code, v)| mesh_state(code, &v))
                .unwrap_or_else(|e| format!("{e:#}"))
            };
            bail!(
                "the peers did not all register within {READY_TIMEOUT:?} (client mesh status a: {}, b: {}; registry lists {}); log a: {}",
                status(&s.ns(0)),
                status(&s.ns(1)),
                list["peers"],
                tail(&logs[0], 3)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let note = match &layout.relay {
        None => format!(
            "`switchyard client` peers (whole client process measured), registry `switchyard server` in {home}, network {SWITCHYARD_CIDR}"
        ),
        Some((ns, _)) => format!(
            "a and b reach only {ns} (their veth down, no IP forwarding in {ns}): `switchyard client` c there passes their end-to-end envelopes on (`relay_via_peers`); registry in {ns}; CPU and memory of a, b and c"
        ),
    };
    Ok(Up {
        peers,
        target,
        version: output_of(&bin, &["--version"]).filter(|v| !v.is_empty()),
        notes: vec![note],
    })
}

/// Writes a key file readable by its owner only.
fn write_secret(path: &Path, text: &str) -> Result<()> {
    fs::write(path, text)?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn leased_ip_finds_a_peer_by_name_or_id() {
        let list = json!({"peers": [
            {"id": "k1", "name": "a", "virtual_ip": "10.219.5.1"},
            {"id": "b", "name": "peer b", "virtual_ip": "10.219.5.2"},
            {"id": "c", "name": "c", "virtual_ip": ""},
        ]});
        assert_eq!(leased_ip(&list, "a").as_deref(), Some("10.219.5.1"));
        assert_eq!(leased_ip(&list, "b").as_deref(), Some("10.219.5.2"));
        assert_eq!(leased_ip(&list, "c"), None);
        assert_eq!(leased_ip(&list, "d"), None);
        assert_eq!(leased_ip(&Value::Null, "a"), None);
    }

    #[test]
    fn mesh_state_names_status_and_enabled() {
        let v = json!({"status": "disabled", "enabled": false, "peer_count": 0});
        assert_eq!(mesh_state(200, &v), "disabled (enabled: false)");
        assert_eq!(mesh_state(404, &Value::Null), "HTTP 404 null");
    }

    #[test]
    fn configs_point_each_side_at_the_other() {
        let neb = nebula_config(Path::new("/x"), 1, "symbnb");
        assert!(neb.contains("am_lighthouse: false"));
        assert!(neb.contains("hosts: [\"10.219.3.1\"]"));
        assert!(neb.contains("\"10.219.3.1\": [\"10.219.0.1:4242\"]"));
        assert!(neb.contains("cert: \"/x/b.crt\""));
        assert!(nebula_config(Path::new("/x"), 0, "symbna").contains("am_lighthouse: true"));
        let [conf, host, up] = tinc_files(1, "symbtb");
        assert!(conf.contains("Name = b\n") && conf.contains("ConnectTo = a\n"));
        assert!(host.contains("Address = 10.219.0.2\n") && host.contains("Subnet = 10.219.4.2/32"));
        assert!(up.contains("10.219.4.2/24") && up.contains("mtu 1400"));
        assert!(!tinc_files(0, "symbta")[0].contains("ConnectTo"));
        let client = client_config("b", "symbyb", "http://10.219.0.1:17390", false);
        assert!(client.contains("peer_name: b\n"));
        assert!(client.contains("server: \"http://10.219.0.1:17390\", insecure: true"));
        assert!(client.contains("name: symbyb"));
        assert!(client.contains("relay_via_peers: false"));
        let relay = client_config("c", "symbzc", "http://127.0.0.1:17390", true);
        assert!(relay.contains("relay_via_peers: true"));
    }
}

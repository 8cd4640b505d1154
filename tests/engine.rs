//! The data-plane engine as an operator meets it: a core that cannot start stops the server
//! with the reason, the core count follows the cgroup CPU quota, and `/api/v1/health` reports
//! measured state (a failing backend makes it `degraded`).

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

fn config(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("server.yaml");
    std::fs::write(
        &path,
        format!(
            "server:\n  http: {{ listen: \"127.0.0.1:0\" }}\n  socks5: {{ listen: \"127.0.0.1:0\" }}\n{extra}\
             api: {{ listen: \"127.0.0.1:0\" }}\nlogging: {{ level: info, format: json }}\n"
        ),
    )
    .expect("write config");
    path
}

/// Runs `cmd` until it exits (at most 30 s); returns (exit code, stderr).
fn run_to_exit(mut cmd: Command) -> (Option<i32>, String) {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stderr = child.stderr.take().expect("stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("switchyard kept running although a core could not start");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (status.code(), reader.join().unwrap_or_default())
}

#[test]
fn a_memlock_limit_below_glommios_minimum_stops_the_start_with_the_reason() {
    let Some(prlimit) = require("prlimit") else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), "  cores: 2\n");
    let mut cmd = Command::new(prlimit);
    // 256 KiB: below the 512 KiB glommio needs for its rings.
    cmd.args(["--memlock=262144:262144", "--"])
        .arg(BIN)
        .args(["server", "--config"])
        .arg(&cfg)
        .env_remove("RUST_LOG");
    let (code, log) = run_to_exit(cmd);
    assert!(
        code.is_some_and(|c| c != 0),
        "exit status {code:?}; log:\n{log}"
    );
    assert!(log.contains("memlock"), "the reason names memlock:\n{log}");
    assert!(
        log.contains("failed to start"),
        "the failing core is named:\n{log}"
    );
    assert!(
        !log.contains("data plane started"),
        "never claims to have started:\n{log}"
    );
}

#[test]
fn health_is_degraded_while_a_backend_fails_and_says_why() {
    let Some(_) = require("curl") else { return };
    let dead = free_port();
    let server = start_server(&format!(
        "backends:\n  - name: direct\n    type: direct\n  - name: up\n    type: httpproxy\n    \
         http_proxy: {{ address: \"127.0.0.1:{dead}\" }}\n"
    ));
    let health = server.api_get("/api/v1/health");
    assert_eq!(health["status"], "healthy", "{health}");
    assert_eq!(
        (health["cores_up"].as_u64(), health["cores_total"].as_u64()),
        (Some(2), Some(2)),
        "{health}"
    );
    assert!(health.get("problems").is_none(), "{health}");

    // Three real connects through the backend to a closed port.
    let target = format!(
        r#"{{"target":"127.0.0.1:{}","timeout":"5s"}}"#,
        server.api.port()
    );
    for _ in 0..3 {
        let (status, v) = api_call(
            &server,
            "POST",
            "/api/v1/backends/up/test",
            Some(&target),
            None,
        );
        assert_eq!(
            (status, &v["healthy"]),
            (200, &serde_json::json!(false)),
            "{v}"
        );
    }
    let health = server.api_get("/api/v1/health");
    assert_eq!(health["status"], "degraded", "{health}");
    let problems = health["problems"].to_string();
    assert!(problems.contains("backend up"), "{health}");
    assert!(!problems.contains("backend direct"), "{health}");

    // A successful connect makes it healthy again.
    let target = format!(
        r#"{{"target":"127.0.0.1:{}","timeout":"5s"}}"#,
        server.api.port()
    );
    let (status, v) = api_call(
        &server,
        "POST",
        "/api/v1/backends/direct/test",
        Some(&target),
        None,
    );
    assert_eq!(status, 200, "{v}");
}

/// The cpu controller directory of a cgroup hierarchy this test can create children in.
fn cpu_hierarchy() -> Option<(PathBuf, bool)> {
    let v1 = Path::new("/sys/fs/cgroup/cpu");
    if v1.join("cpu.cfs_quota_us").exists() {
        return Some((v1.to_owned(), true));
    }
    let v2 = Path::new("/sys/fs/cgroup");
    let controls = std::fs::read_to_string(v2.join("cgroup.subtree_control")).unwrap_or_default();
    controls
        .split_whitespace()
        .any(|c| c == "cpu")
        .then(|| (v2.to_owned(), false))
}

/// A cgroup of this test (named `sygw2-…`), removed on drop.
struct TestCgroup(PathBuf);

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn the_core_count_follows_the_cgroup_cpu_quota() {
    let Some(hierarchy) = cpu_hierarchy() else {
        support::skip_unless_ci("no cgroup cpu controller");
        return;
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        support::skip_unless_ci("one CPU: a quota of one CPU changes nothing");
        return;
    }
    let (root, v1) = hierarchy;
    let group = TestCgroup(root.join(format!("sygw2-engine-{}", std::process::id())));
    if let Err(e) = std::fs::create_dir(&group.0) {
        support::skip_unless_ci(&format!("cannot create {}: {e}", group.0.display()));
        return;
    }
    // One CPU's worth of time per period.
    if v1 {
        std::fs::write(group.0.join("cpu.cfs_period_us"), "100000").expect("period");
        std::fs::write(group.0.join("cpu.cfs_quota_us"), "100000").expect("quota");
    } else {
        std::fs::write(group.0.join("cpu.max"), "100000 100000").expect("cpu.max");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dir.path(), "");
    // The shell moves itself into the cgroup, then becomes the server.
    let child = Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$1/cgroup.procs" && shift && exec "$@""#)
        .arg("sh")
        .arg(&group.0)
        .arg(BIN)
        .args(["server", "--config"])
        .arg(&cfg)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let (proc, decided, log) = wait_until_started(child);
    drop(proc);
    let decided = decided.unwrap_or_else(|| panic!("no core decision logged:\n{log}"));
    assert_eq!(decided["cores"], 1, "{decided}");
    let reason = decided["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("quota") && reason.contains("sygw2-engine"),
        "{decided}"
    );
    assert!(log.contains("data plane started"), "{log}");
}

/// Reads the server's JSON log until "data plane started" (or 100 kB); returns the process, the
/// fields of its "data-plane cores decided" line and the log read.
fn wait_until_started(mut child: std::process::Child) -> (Proc, Option<serde_json::Value>, String) {
    let stderr = child.stderr.take().expect("stderr");
    let proc = Proc {
        child,
        name: "switchyard".into(),
    };
    let mut decided = None;
    let mut log = String::new();
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        log.push_str(&line);
        log.push('\n');
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if v["fields"]["message"] == "data-plane cores decided" {
            decided = Some(v["fields"].clone());
        }
        if v["fields"]["message"] == "data plane started" || log.len() > 100_000 {
            break;
        }
    }
    (proc, decided, log)
}

/// `Cpus_allowed_list` of the data-plane threads of `pid`, by core index (glommio names a core's
/// threads `dataplane-{index}-{executor id}`: the executor's and its blocking pool's).
fn data_plane_affinity(pid: u32) -> Vec<(usize, String)> {
    let mut cores = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("tasks");
    for task in tasks.map_while(Result::ok) {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let Some(index) = comm
            .trim()
            .strip_prefix("dataplane-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|i| i.parse().ok())
        else {
            continue;
        };
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(|l| l.trim().to_owned())
            .unwrap_or_default();
        cores.push((index, allowed));
    }
    cores.sort();
    cores.dedup();
    cores
}

/// Two servers on one box, each given one core (`server.cores: 1`; a client beside a server on a
/// gateway is the same): before, each pinned its core to the first CPU of its mask, so both
/// shared CPU 0 while CPU 1 idled. A plan that takes only part of the mask pins nothing (the
/// thread may run on every CPU of the mask); one that takes the whole mask pins a core to each.
#[test]
fn a_data_plane_given_part_of_the_cpus_is_not_pinned_to_the_first() {
    let own = std::fs::read_to_string("/proc/self/status").expect("status");
    let mask = own
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|l| l.trim().to_owned())
        .expect("Cpus_allowed_list");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        support::skip_unless_ci("one CPU: nothing to choose between");
        return;
    }
    let start = |dir: &Path, extra: &str| {
        let child = Command::new(BIN)
            .args(["server", "--config"])
            .arg(config(dir, extra))
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        wait_until_started(child)
    };
    let (one_dir, all_dir) = (
        tempfile::tempdir().expect("tempdir"),
        tempfile::tempdir().expect("tempdir"),
    );
    let (one, one_decided, one_log) = start(one_dir.path(), "  cores: 1\n");
    let (all, all_decided, all_log) = start(all_dir.path(), "");
    assert!(one_log.contains("data plane started"), "{one_log}");
    assert!(all_log.contains("data plane started"), "{all_log}");
    let one_affinity = data_plane_affinity(one.child.id());
    let all_affinity = data_plane_affinity(all.child.id());
    drop((one, all));
    assert_eq!(
        one_affinity,
        vec![(0, mask.clone())],
        "one core of {cpus}: unpinned; {one_decided:?}"
    );
    assert_eq!(all_affinity.len(), cpus, "{all_affinity:?} {all_decided:?}");
    let mut pinned: Vec<&str> = all_affinity.iter().map(|(_, cpu)| cpu.as_str()).collect();
    assert!(
        pinned.iter().all(|cpu| cpu.parse::<usize>().is_ok()),
        "every core of the whole mask pinned to one CPU: {all_affinity:?}"
    );
    pinned.dedup();
    assert_eq!(pinned.len(), cpus, "{all_affinity:?}");
}

/// Issue 14 (idle RSS): once the server is up it gives back the code pages start-up mapped
/// (megabytes of a binary spread over tens of MB), and the code it runs afterwards faults back
/// in: the proxy still relays a tunnel.
#[test]
fn start_up_code_pages_are_given_back_and_the_proxy_still_relays() {
    let server = start_server("");
    support::assert_start_up_code_pages_released(&server.logs, server.pid());

    // A CONNECT tunnel to a local listener: the relay's code comes back from the file.
    use std::io::{Read, Write};
    let origin = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let target = origin.local_addr().expect("addr");
    let mut client = std::net::TcpStream::connect(server.http).expect("connect");
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        client,
        "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"
    )
    .expect("request");
    let (mut far, _) = origin.accept().expect("accept");
    let mut head = [0u8; 39];
    client.read_exact(&mut head).expect("reply");
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    client.write_all(b"ping").expect("write");
    let mut got = [0u8; 4];
    far.read_exact(&mut got).expect("far end read");
    assert_eq!(&got, b"ping");
    far.write_all(b"pong").expect("far end write");
    client.read_exact(&mut got).expect("read");
    assert_eq!(&got, b"pong");
    assert!(resident_code_kib(server.pid()).0 > 0);
}

/// `switchyard_core_connections_active` of each core, from the metrics endpoint.
fn active_per_core(metrics: u16) -> Vec<u64> {
    let out = curl(&[
        "-sS",
        "--max-time",
        "10",
        &format!("http://127.0.0.1:{metrics}/metrics"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut per_core: Vec<(usize, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("switchyard_core_connections_active{core=\""))
        .filter_map(|rest| {
            let (core, value) = rest.split_once("\"} ")?;
            Some((core.parse().ok()?, value.trim().parse().ok()?))
        })
        .collect();
    per_core.sort();
    per_core.into_iter().map(|(_, v)| v).collect()
}

/// The kernel's hash splits a few dozen keep-alive clients unevenly over the per-core
/// `SO_REUSEPORT` listeners; the `sk_reuseport` program hands them out in turn, so after every
/// new connection the cores' counts differ by at most one (by chance, for 32 hashed connections,
/// about once in 65,000 runs).
#[test]
fn new_connections_go_to_the_cores_in_turn() {
    if !support::ovpn_server::is_root() {
        support::skip_unless_ci("loading the sk_reuseport program needs root (CAP_BPF)");
        return;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        support::skip_unless_ci("one CPU: one core, nothing to balance");
        return;
    }
    let metrics = free_port();
    let s = start_server(&format!(
        "metrics: {{ enabled: true, listen: \"127.0.0.1:{metrics}\" }}\n"
    ));
    let logs = s.logs.lock().map(|l| l.join("\n")).unwrap_or_default();
    assert!(logs.contains("RoundRobin"), "start-up log:\n{logs}");
    let mut clients = Vec::new();
    for n in 1..=32u64 {
        clients.push(std::net::TcpStream::connect(s.http).expect("connect"));
        // the connection counts once its core has accepted it
        let deadline = Instant::now() + Duration::from_secs(10);
        let counts = loop {
            let counts = active_per_core(metrics);
            if counts.iter().sum::<u64>() >= n || Instant::now() > deadline {
                break counts;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(counts.len(), 2, "{counts:?}");
        assert_eq!(counts.iter().sum::<u64>(), n, "{counts:?}");
        let (lo, hi) = (counts[0].min(counts[1]), counts[0].max(counts[1]));
        assert!(
            hi - lo <= 1,
            "after {n} connections the cores hold {counts:?}"
        );
    }
}

//! `switchyard server` under the systemd notify protocol, driven as systemd would: the test binds
//! the notify socket, starts the real binary with `NOTIFY_SOCKET` and `WATCHDOG_USEC`, and reads
//! what arrives. Then it stops one real data-plane thread from outside (ptrace, as a debugger
//! would) and checks that the health endpoint names that core and that the watchdog keep-alives
//! stop, and that both recover when the thread runs again.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

/// Stops the threads given by TID with `PTRACE_SEIZE` + `PTRACE_INTERRUPT`, says `stopped`, and
/// lets them run again (`PTRACE_DETACH`) when a line arrives on stdin (or when this process dies:
/// the kernel detaches then too).
const STOP_THREAD: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_DETACH, WALL = 0x4206, 0x4207, 17, 0x40000000
tids = [int(t) for t in sys.argv[1:]]
for tid in tids:
    if libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
        sys.exit("seize: " + os.strerror(ctypes.get_errno()))
    if libc.ptrace(PTRACE_INTERRUPT, tid, None, None) != 0:
        sys.exit("interrupt: " + os.strerror(ctypes.get_errno()))
    os.waitpid(tid, WALL)
print("stopped", flush=True)
sys.stdin.readline()
for tid in tids:
    if libc.ptrace(PTRACE_DETACH, tid, None, None) != 0:
        sys.exit("detach: " + os.strerror(ctypes.get_errno()))
print("detached", flush=True)
"#;

/// The notify socket's messages, collected on a thread (each datagram is one message).
struct NotifySocket {
    messages: std::sync::Arc<std::sync::Mutex<Vec<(Instant, String)>>>,
}

impl NotifySocket {
    fn bind(path: &std::path::Path) -> Self {
        let socket = UnixDatagram::bind(path).expect("bind notify socket");
        let messages = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = messages.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = socket.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                if let Ok(mut m) = sink.lock() {
                    m.push((Instant::now(), text));
                }
            }
        });
        Self { messages }
    }

    fn all(&self) -> Vec<String> {
        self.messages
            .lock()
            .map(|m| m.iter().map(|(_, t)| t.clone()).collect())
            .unwrap_or_default()
    }

    fn count(&self, prefix: &str) -> usize {
        self.all().iter().filter(|m| m.starts_with(prefix)).count()
    }

    /// Waits (at most `limit`) until `prefix` has arrived `n` times in all.
    fn wait_for(&self, prefix: &str, n: usize, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.count(prefix) >= n {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

/// The TIDs of the threads of process `pid` whose name starts with `prefix`.
fn threads_named(pid: u32, prefix: &str) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.starts_with(prefix))
                })
                .filter_map(|t| t.file_name().to_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// How many of the server's log lines contain `text`.
fn log_lines_with(server: &Server, text: &str) -> usize {
    server
        .logs
        .lock()
        .map(|l| l.iter().filter(|l| l.contains(text)).count())
        .unwrap_or(0)
}

/// `/api/v1/health` until `done` holds (at most 30 s); returns the last answer.
fn health_until(server: &Server, done: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let health = server.api_get("/api/v1/health");
        if done(&health) || Instant::now() > deadline {
            return health;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn systemd_is_told_ready_fed_while_cores_beat_and_starved_while_one_is_stopped() {
    let Some(python) = require("python3") else {
        return;
    };
    let Some(_) = require("curl") else { return };
    // ptrace of another process needs CAP_SYS_PTRACE (or Yama's blessing)
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|u| u.split_whitespace().next().map(|u| u == "0"))
            .unwrap_or(false)
    });
    if !root {
        skip_unless_ci("stopping a data-plane thread with ptrace needs root");
        return;
    }
    let notify_dir = tempfile::tempdir().expect("tempdir");
    let notify_path = notify_dir.path().join("notify");
    let notify = NotifySocket::bind(&notify_path);
    let server = start_server_with_yaml_env(
        "",
        &[
            ("NOTIFY_SOCKET", notify_path.as_os_str()),
            ("WATCHDOG_USEC", std::ffi::OsStr::new("1000000")),
        ],
    );

    // READY=1 arrives, after the proxy accepts connections, with a status naming the listeners
    assert!(
        notify.wait_for("READY=1", 1, Duration::from_secs(20)),
        "no READY=1: {:?}",
        notify.all()
    );
    let all = notify.all();
    let ready = all
        .iter()
        .find(|m| m.starts_with("READY=1"))
        .expect("READY=1");
    assert!(
        ready.contains("STATUS=serving") && ready.contains(&server.http.to_string()),
        "{ready}"
    );
    assert!(std::net::TcpStream::connect(server.http).is_ok());
    // the keep-alives keep coming (every 0.5 s for a 1 s watchdog)
    let before = notify.count("WATCHDOG=1");
    assert!(
        notify.wait_for("WATCHDOG=1", before + 3, Duration::from_secs(20)),
        "WATCHDOG=1 does not keep arriving: {:?}",
        notify.all()
    );
    let health = server.api_get("/api/v1/health");
    assert_eq!(health["status"], "healthy", "{health}");

    // Stop data-plane core 1's threads (glommio names them `dataplane-1-<executor id>`: the
    // executor and its helper for blocking calls), as a debugger would.
    let tids = threads_named(server.pid(), "dataplane-1-");
    assert!(
        !tids.is_empty(),
        "no dataplane-1 thread in {}: {:?}",
        server.pid(),
        threads_named(server.pid(), "")
    );
    let mut stopper = Command::new(&python)
        .args(["-c", STOP_THREAD])
        .args(&tids)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the ptrace helper");
    let mut said = BufReader::new(stopper.stdout.take().expect("stdout"));
    let mut stdin = stopper.stdin.take().expect("stdin");
    let stopper = Proc {
        child: stopper,
        name: "ptrace helper".into(),
    };
    let mut line = String::new();
    said.read_line(&mut line).expect("helper output");
    assert_eq!(
        line.trim(),
        "stopped",
        "the helper could not stop the thread"
    );

    let health = health_until(&server, |h| h["status"] == "degraded");
    assert_eq!(health["status"], "degraded", "{health}");
    let problems = health["problems"].to_string();
    assert!(
        problems.contains("data-plane core 1 (cpu") && problems.contains("not responding for"),
        "{health}"
    );
    assert_eq!(health["cores_up"], 1, "{health}");
    // While it is stopped no keep-alive goes out: none in a window of several intervals.
    std::thread::sleep(Duration::from_millis(700));
    let starved = notify.count("WATCHDOG=1");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        notify.count("WATCHDOG=1"),
        starved,
        "WATCHDOG=1 kept arriving while core 1 was stopped: {:?}",
        notify.all()
    );
    assert!(
        notify
            .all()
            .iter()
            .any(|m| m.starts_with("STATUS=data-plane core 1")),
        "the unit's status names the core: {:?}",
        notify.all()
    );
    assert_eq!(
        log_lines_with(&server, "data-plane core not responding"),
        1,
        "one warning per stall"
    );

    // Let it run again: healthy, and the keep-alives resume.
    writeln!(stdin, "go").expect("tell the helper");
    line.clear();
    said.read_line(&mut line).expect("helper output");
    assert_eq!(line.trim(), "detached");
    drop(stopper);
    let health = health_until(&server, |h| h["status"] == "healthy");
    assert_eq!(health["status"], "healthy", "{health}");
    assert!(
        notify.wait_for("WATCHDOG=1", starved + 2, Duration::from_secs(20)),
        "WATCHDOG=1 did not resume: {:?}",
        notify.all()
    );
    assert_eq!(
        log_lines_with(&server, "data-plane core responding again"),
        1,
        "recovery is logged once"
    );

    // SIGTERM: STOPPING=1, then the process exits.
    let status = Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    assert!(
        notify.wait_for("STOPPING=1", 1, Duration::from_secs(20)),
        "no STOPPING=1: {:?}",
        notify.all()
    );
    let mut server = server;
    let deadline = Instant::now() + Duration::from_secs(20);
    let exited = loop {
        if let Some(s) = server.proc.child.try_wait().expect("wait") {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        exited.is_some_and(|s| s.success()),
        "the server did not exit cleanly on SIGTERM: {exited:?}"
    );
}

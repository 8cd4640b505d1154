//! Child processes (started and stopped by PID), ports, limits and `/proc` readings.

use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// One started child process.
struct Proc {
    name: String,
    child: Child,
}

/// Owns every child process a scenario starts; dropping it stops them all (SIGTERM, then SIGKILL).
#[derive(Default)]
pub struct Procs {
    list: Vec<Proc>,
}

impl Procs {
    /// Starts a support program (origin, load generator, helper) with stdout and stderr appended
    /// to `log`; returns its PID. It runs where the bench runs: the LOAD CPUs with `--split-cpus`.
    pub fn spawn(&mut self, name: &str, mut cmd: Command, log: &Path) -> Result<u32> {
        let out = fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd
            .spawn()
            .with_context(|| format!("start {name}: {cmd:?}"))?;
        let pid = child.id();
        self.list.push(Proc {
            name: name.to_string(),
            child,
        });
        Ok(pid)
    }

    /// Starts a program under test (a proxy, cache or peer compared in a table) as
    /// [`Procs::spawn`] does, but with `--split-cpus` on the TEST CPUs, set in the child before
    /// exec so its threads and children inherit them.
    pub fn spawn_under_test(&mut self, name: &str, mut cmd: Command, log: &Path) -> Result<u32> {
        if let Some(split) = crate::cpusplit::current() {
            crate::cpusplit::run_on(&mut cmd, &split.test);
        }
        self.spawn(name, cmd, log)
    }

    /// `Some(reason)` when the process `pid` has already exited.
    pub fn exited(&mut self, pid: u32) -> Option<String> {
        let p = self.list.iter_mut().find(|p| p.child.id() == pid)?;
        match p.child.try_wait() {
            Ok(Some(status)) => Some(format!("{} exited: {status}", p.name)),
            Ok(None) => None,
            Err(e) => Some(format!("{}: {e}", p.name)),
        }
    }

    /// Waits until `addr` accepts TCP connections, failing early if `pid` exits.
    pub fn wait_port(&mut self, pid: u32, addr: SocketAddr, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(reason) = self.exited(pid) {
                bail!(reason);
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{addr} not accepting connections after {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        while let Some(p) = self.list.pop() {
            terminate(p);
        }
    }
}

fn terminate(mut p: Proc) {
    if let Ok(None) = p.child.try_wait() {
        let pid = i32::try_from(p.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            // The process may exit on its own meanwhile; nothing to do about an error then.
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(p.child.try_wait(), Ok(None)) {
                tracing::debug!("stopped {}", p.name);
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!("{} did not exit within 5 s of SIGTERM; killing it", p.name);
        let _ = p.child.kill();
    }
    let _ = p.child.wait();
}

/// A currently free loopback TCP port, chosen below the kernel's ephemeral range: after a
/// connection-rate run tens of thousands of ephemeral ports sit in TIME_WAIT and `bind(:0)` fails.
pub fn free_port() -> Result<u16> {
    let (low, _) = ephemeral_range();
    let (lo, hi) = if low > 12000 {
        (10000u32, u32::from(low))
    } else {
        (40000, 60000)
    };
    let mut x = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(1)
        ^ std::process::id().rotate_left(16);
    for _ in 0..500 {
        // xorshift32: spreads the tries, no need for a random crate.
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let port = u16::try_from(lo + x % (hi - lo)).unwrap_or(10000);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// The kernel's ephemeral port range.
fn ephemeral_range() -> (u16, u16) {
    let r = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let mut it = r.split_whitespace().filter_map(|v| v.parse::<u16>().ok());
    match (it.next(), it.next()) {
        (Some(lo), Some(hi)) if lo < hi => (lo, hi),
        _ => (32768, 60999),
    }
}

/// Waits (at most `max`) while more than a third of the ephemeral ports sit in TIME_WAIT, so one
/// measurement's leftovers do not starve the next one (and peers that `bind(:0)`) of ports.
pub fn settle(max: Duration) {
    let (lo, hi) = ephemeral_range();
    let limit = usize::from(hi - lo) / 3;
    let deadline = Instant::now() + max;
    loop {
        let tw = ["/proc/net/tcp", "/proc/net/tcp6"]
            .iter()
            .filter_map(|p| fs::read_to_string(p).ok())
            .map(|t| {
                t.lines()
                    .filter(|l| {
                        let mut f = l.split_whitespace();
                        let local_port = f
                            .nth(1)
                            .and_then(|a| a.rsplit(':').next())
                            .and_then(|p| u16::from_str_radix(p, 16).ok());
                        f.nth(1) == Some("06") && local_port.is_some_and(|p| (lo..=hi).contains(&p))
                    })
                    .count()
            })
            .sum::<usize>();
        if tw <= limit || Instant::now() > deadline {
            return;
        }
        tracing::info!("waiting for {tw} ephemeral ports in TIME_WAIT to expire");
        std::thread::sleep(Duration::from_secs(5));
    }
}

/// Raises this process's RLIMIT_NOFILE soft limit to its hard limit (children inherit it).
/// Returns the resulting soft limit.
pub fn raise_nofile() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let cur = getrlimit(Resource::Nofile);
    let want = Rlimit {
        current: cur.maximum,
        maximum: cur.maximum,
    };
    if let Err(e) = setrlimit(Resource::Nofile, want) {
        tracing::warn!("setrlimit(NOFILE): {e}");
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// Resident set size of `pid` in KiB (VmRSS from `/proc/PID/status`).
pub fn rss_kib(pid: u32) -> Result<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS line")
}

/// Fields of `/proc/<pid>/stat` after the command name, or empty when the process is gone.
fn stat_fields(pid: &str) -> Vec<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .map(|(_, rest)| {
            // the state letter is not a number: keep the position by reading it as 0
            rest.split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect()
        })
        .unwrap_or_default()
}

/// Clock ticks per second of `/proc/*/stat` times (USER_HZ, 100 on Linux).
const TICKS_PER_SEC: f64 = 100.0;

// Indices into `stat_fields` (proc(5) field number − 3).
const PPID: usize = 1;
const UTIME: usize = 11;
const STIME: usize = 12;
const CUTIME: usize = 13;
const CSTIME: usize = 14;

fn ticks(fields: &[u64], which: &[usize]) -> u64 {
    which.iter().filter_map(|&i| fields.get(i)).sum()
}

/// The sum of the `/proc/<pid>/stat` times at `which` (indices as in `stat_fields`), in
/// seconds; `pid` may be `self` or `PID/task/TID`.
pub(crate) fn stat_seconds(pid: &str, which: &[usize]) -> f64 {
    ticks(&stat_fields(pid), which) as f64 / TICKS_PER_SEC
}

/// Seconds the whole machine has spent in softirq context (`/proc/stat`, all CPUs). This
/// kernel accounts softirq time on its own (`IRQ_TIME_ACCOUNTING`), not in the utime/stime of
/// the task it interrupted, and on loopback the receive side of every TCP hop runs there: a
/// relay's per-process CPU leaves out the second hop's receive processing it causes.
pub fn softirq_seconds() -> f64 {
    softirq_ticks(&fs::read_to_string("/proc/stat").unwrap_or_default())
        .map_or(0.0, |t| t as f64 / TICKS_PER_SEC)
}

/// The softirq field of `/proc/stat`'s summary line: "cpu  user nice system idle iowait irq
/// softirq …".
fn softirq_ticks(stat: &str) -> Option<u64> {
    let mut fields = stat.lines().next()?.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    fields.nth(6)?.parse().ok()
}

/// CPU seconds (user + system) used so far by process `pid` and every process below it. Forking
/// and pre-forking servers (tinyproxy, squid's helpers, danted) spread a workload over processes:
/// each live one counts its own time, and one that exited counts through the `cutime`/`cstime`
/// of the parent that waited for it. Threads are included in their process's figures.
pub fn tree_cpu_seconds(pid: u32) -> f64 {
    let mut children: std::collections::HashMap<u64, Vec<(u64, Vec<u64>)>> = Default::default();
    let mut root = None;
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = entry.file_name();
        let Some(p) = name.to_str().and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        let fields = stat_fields(&p.to_string());
        let Some(&ppid) = fields.get(PPID) else {
            continue;
        };
        if p == u64::from(pid) {
            root = Some(fields.clone());
        }
        children.entry(ppid).or_default().push((p, fields));
    }
    let Some(root) = root else {
        return 0.0;
    };
    let all = [UTIME, STIME, CUTIME, CSTIME];
    let mut total = ticks(&root, &all);
    let mut todo = vec![u64::from(pid)];
    while let Some(parent) = todo.pop() {
        for (child, fields) in children.get(&parent).into_iter().flatten() {
            total += ticks(fields, &all);
            todo.push(*child);
        }
    }
    total as f64 / TICKS_PER_SEC
}

/// Whose CPU stands for the load generator's.
#[derive(Debug, Clone, Copy)]
pub enum ClientCpu {
    /// This process's own threads (the in-process tunnel-rate client).
    OwnThreads,
    /// Child processes this process waited for (`wrk`).
    WaitedChildren,
}

impl ClientCpu {
    fn seconds(self) -> f64 {
        let which: &[usize] = match self {
            ClientCpu::OwnThreads => &[UTIME, STIME],
            ClientCpu::WaitedChildren => &[CUTIME, CSTIME],
        };
        stat_seconds("self", which)
    }
}

/// CPU (user + system) per unit of work — a tunnel, a request — of each program one measurement
/// involves, in microseconds. On a box whose cores the generator, origin and proxy share, this
/// compares efficiency where rates only show who got the cores.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CpuPerUnit {
    /// The measured proxy's process tree (`None` for the direct ceiling).
    pub proxy_us: Option<f64>,
    /// The origin's process tree (nginx master and workers).
    pub origin_us: f64,
    /// The load generator.
    pub client_us: f64,
}

impl CpuPerUnit {
    /// Proxy + origin + client.
    pub fn total_us(&self) -> f64 {
        self.proxy_us.unwrap_or(0.0) + self.origin_us + self.client_us
    }
}

/// Reads the CPU counters of a proxy, an origin and the load generator at the start of a
/// measurement; [`CpuMeter::per`] divides what they used since by the units of work done.
pub struct CpuMeter {
    proxy: Option<u32>,
    origin: u32,
    client: ClientCpu,
    start: [f64; 3],
}

impl CpuMeter {
    pub fn start(proxy: Option<u32>, origin: u32, client: ClientCpu) -> Self {
        let mut m = CpuMeter {
            proxy,
            origin,
            client,
            start: [0.0; 3],
        };
        m.start = m.now();
        m
    }

    fn now(&self) -> [f64; 3] {
        [
            self.proxy.map(tree_cpu_seconds).unwrap_or(0.0),
            tree_cpu_seconds(self.origin),
            self.client.seconds(),
        ]
    }

    /// CPU per unit since [`CpuMeter::start`]; `None` when no unit of work was done.
    pub fn per(&self, units: u64) -> Option<CpuPerUnit> {
        if units == 0 {
            return None;
        }
        let now = self.now();
        let us = |i: usize| (now[i] - self.start[i]).max(0.0) * 1e6 / units as f64;
        Some(CpuPerUnit {
            proxy_us: self.proxy.map(|_| us(0)),
            origin_us: us(1),
            client_us: us(2),
        })
    }
}

/// Runs a command and returns its trimmed stdout+stderr, or `None` when it cannot run.
pub fn output_of(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    Some(s.trim().to_string())
}

/// Full path of `program` found on PATH (plus the sbin directories).
pub fn which(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/local/sbin"])
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file());
    found
}

/// Last `n` lines of a log file, for error messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softirq_is_the_seventh_figure_of_the_summary_line() {
        let stat = "cpu  1821374 4679747 1217636 1638413 654315 0 149224 7262 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        assert_eq!(softirq_ticks(stat), Some(149_224));
        assert_eq!(softirq_ticks("cpu0 1 2 3 4 5 6 7\n"), None);
        assert_eq!(softirq_ticks("cpu  1 2 3\n"), None);
        assert!(
            softirq_seconds() > 0.0,
            "this machine's /proc/stat has softirq time"
        );
    }

    #[test]
    fn reads_own_rss_and_finds_a_port() {
        assert!(rss_kib(std::process::id()).expect("VmRSS") > 0);
        assert!(free_port().expect("port") > 0);
        assert!(which("sh").is_some());
        let (lo, hi) = ephemeral_range();
        assert!(lo < hi);
        settle(Duration::from_secs(1));
    }

    #[test]
    fn tree_cpu_counts_a_busy_child() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut procs = Procs::default();
        // a shell whose child burns CPU: the time must show up in the shell's tree
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "timeout 2 sh -c 'while :; do :; done'; sleep 30"]);
        let pid = procs
            .spawn("burner", cmd, &dir.path().join("log"))
            .expect("spawn");
        let meter = CpuMeter::start(Some(pid), pid, ClientCpu::OwnThreads);
        std::thread::sleep(Duration::from_millis(1500));
        let live = meter.per(1).expect("one unit");
        assert!(
            live.proxy_us.unwrap_or(0.0) > 300_000.0,
            "busy grandchild not counted: {live:?}"
        );
        // after the burner exits its time stays in the tree (through its parent's cutime)
        std::thread::sleep(Duration::from_millis(1000));
        let after = meter.per(1).expect("one unit");
        assert!(after.proxy_us >= live.proxy_us, "{after:?} < {live:?}");
        assert!(tree_cpu_seconds(u32::MAX) == 0.0);
    }

    fn cpus_allowed_list(pid: &str) -> String {
        fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    }

    // The only test that installs the process-wide split (it pins this test process to LOAD).
    #[test]
    fn split_runs_programs_under_test_on_test_cpus_and_the_rest_on_load() {
        use crate::cpusplit::{self, format_list, CpuSplit};
        let allowed = cpusplit::allowed_cpus().expect("affinity");
        if allowed.len() < 2 {
            let reason = format!("needs 2 CPUs, this process may use {allowed:?}");
            assert!(std::env::var_os("CI").is_none(), "{reason}");
            eprintln!("SKIP: {reason}");
            return;
        }
        let split = cpusplit::install(CpuSplit::new(&allowed, None).expect("split")).expect("pin");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut procs = Procs::default();
        let sleep = || {
            let mut cmd = Command::new("sleep");
            cmd.arg("30");
            cmd
        };
        let tested = procs
            .spawn_under_test("sleep under test", sleep(), &dir.path().join("a"))
            .expect("spawn");
        let support = procs
            .spawn("sleep support", sleep(), &dir.path().join("b"))
            .expect("spawn");
        assert_eq!(
            cpus_allowed_list(&tested.to_string()),
            format_list(&split.test)
        );
        assert_eq!(
            cpus_allowed_list(&support.to_string()),
            format_list(&split.load)
        );
        for task in fs::read_dir("/proc/self/task").expect("tasks").flatten() {
            let tid = task.file_name().to_string_lossy().into_owned();
            assert_eq!(
                cpus_allowed_list(&format!("self/task/{tid}")),
                format_list(&split.load),
                "bench thread {tid} not on the load CPUs"
            );
        }
    }

    #[test]
    fn guard_stops_children_on_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut procs = Procs::default();
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let pid = procs
            .spawn("sleep", cmd, &dir.path().join("log"))
            .expect("spawn");
        assert!(procs.exited(pid).is_none());
        drop(procs);
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z"),
            "sleep {pid} still running: {stat}"
        );
    }
}

//! Child processes (started and stopped by PID), ports, limits and `/proc` readings.

use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

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
    /// Starts `cmd` with stdout and stderr appended to `log`; returns its PID.
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
    fn reads_own_rss_and_finds_a_port() {
        assert!(rss_kib(std::process::id()).expect("VmRSS") > 0);
        assert!(free_port().expect("port") > 0);
        assert!(which("sh").is_some());
        let (lo, hi) = ephemeral_range();
        assert!(lo < hi);
        settle(Duration::from_secs(1));
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

//! iperf3 over loopback: the raw TCP ceiling the `connect` and `socks5` bulk sections compare
//! the relays against (the reference the issue's "≥ 70 % of iperf3" target names), beside the
//! in-process sink's own direct figure.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::load::Bulk;
use crate::procs::{self, Procs};

/// One iperf3 stream for `seconds` after a 1 s warm-up it leaves out of the figure.
pub fn loopback_bulk(procs: &mut Procs, dir: &std::path::Path, seconds: u64) -> Result<Bulk> {
    let port = procs::free_port()?;
    let mut server = Command::new("iperf3");
    server.args([
        "-s",
        "--forceflush",
        "-B",
        "127.0.0.1",
        "-p",
        &port.to_string(),
    ]);
    std::fs::create_dir_all(dir)?;
    let log = dir.join("iperf3-server.log");
    let pid = procs.spawn("iperf3 -s", server, &log)?;
    // Not a probe connection: iperf3 takes any connection for a test's control channel and
    // resets the next client after a probe. Its log says when it listens.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Server listening")) {
        if let Some(reason) = procs.exited(pid) {
            bail!("{reason}");
        }
        if Instant::now() > deadline {
            bail!("iperf3 -s not listening after 5 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let softirq0 = procs::softirq_seconds();
    let out = Command::new("iperf3")
        .args(["-c", "127.0.0.1", "-p", &port.to_string(), "-J", "-O", "1"])
        .args(["-t", &seconds.to_string()])
        .output()
        .context("run iperf3 -c")?;
    let softirq = procs::softirq_seconds() - softirq0;
    let mut b = parse(&out.stdout)
        .with_context(|| format!("iperf3 -c: {}", String::from_utf8_lossy(&out.stderr).trim()))?;
    // The softirq time covers the omitted first second too: spread it over the bytes of the
    // whole run, assuming that second moved as much as an average one.
    let whole_run_gib = b.bytes as f64 * (b.seconds + 1.0) / b.seconds / (1u64 << 30) as f64;
    if whole_run_gib > 0.0 {
        b.softirq_s_per_gib = Some(softirq / whole_run_gib);
    }
    Ok(b)
}

/// The receiver's side of iperf3's JSON report.
fn parse(json: &[u8]) -> Result<Bulk> {
    let v: serde_json::Value = serde_json::from_slice(json).context("iperf3 JSON")?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3: {e}");
    }
    let sum = &v["end"]["sum_received"];
    let (Some(bits), Some(bytes), Some(secs)) = (
        sum["bits_per_second"].as_f64(),
        sum["bytes"].as_u64(),
        sum["seconds"].as_f64(),
    ) else {
        bail!("iperf3: no end.sum_received in its report");
    };
    Ok(Bulk {
        streams: 1,
        seconds: secs,
        bytes,
        gbit_per_sec: bits / 1e9,
        proxy_cpu_s_per_gib: None,
        softirq_s_per_gib: None,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_receivers_sum() {
        let json = br#"{"end":{"sum_received":{"bits_per_second":2.5e10,"bytes":31250000000,"seconds":10.0}}}"#;
        let b = super::parse(json).expect("parse");
        assert_eq!(b.bytes, 31_250_000_000);
        assert!((b.gbit_per_sec - 25.0).abs() < 1e-9);
        assert!(super::parse(br#"{"error":"unable to connect"}"#).is_err());
        assert!(super::parse(br#"{"end":{}}"#).is_err());
    }
}

//! Scenario `tunnels`: the new-tunnel rate — one tunnel + a 1 KiB `GET` + close, 32 in flight —
//! through HTTP `CONNECT` (switchyard, squid, tinyproxy, privoxy) and SOCKS5 (switchyard, microsocks,
//! danted) to an nginx origin, with the same client straight to nginx as its ceiling (measured
//! before and after the proxies, best of the two). The client is [`crate::tunnel_rate`].
//!
//! Each row carries the load average before and after its measurement; a figure taken while the
//! one-minute load average was above [`BUSY_LOAD`] is marked, since other work on the machine
//! then shares the cores with the programs measured.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;
use serde_json::json;

use crate::load::Via;
use crate::peers::{self, Env, Started};
use crate::procs::{self, ClientCpu, CpuMeter, CpuPerUnit, Procs};
use crate::report::{compare, cpu_cell, f, notes, table, verdict, version_cell, Entry, Role};
use crate::scenarios::{files_origin, loadavg, Ctx};
use crate::tunnel_rate::{self, TunnelRate};

/// Iterations in flight, as in issue 14's measurement.
const IN_FLIGHT: u32 = 32;
/// One-minute load average above which a figure is marked as taken on a busy machine.
pub const BUSY_LOAD: f64 = 3.0;

/// A row: the rate and the load average around it.
#[derive(Debug, Clone, Serialize)]
struct Row {
    #[serde(flatten)]
    rate: TunnelRate,
    /// CPU per tunnel of the proxy, the origin and the client during the run.
    cpu: Option<CpuPerUnit>,
    load_before: String,
    load_after: String,
}

impl Row {
    fn busy(&self) -> bool {
        [&self.load_before, &self.load_after]
            .iter()
            .any(|l| one_minute(l) > BUSY_LOAD)
    }
}

/// The first field of a `loadavg()` string.
pub fn one_minute(load: &str) -> f64 {
    load.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

type Start<'a> = Box<dyn Fn(&mut Procs, &Env) -> Result<Started> + 'a>;

struct Program<'a> {
    name: &'static str,
    role: Role,
    start: Start<'a>,
    /// How the client reaches the origin through the started program.
    via: fn(&Started) -> Option<Via>,
}

/// Runs the client through `via`; `proxy` and `origin_pid` are the processes whose CPU per tunnel
/// is recorded beside the rate.
fn measure(
    ctx: &Ctx,
    via: Via,
    origin: SocketAddr,
    proxy: Option<u32>,
    origin_pid: u32,
    e: &mut Entry<Row>,
) {
    procs::settle(Duration::from_secs(20));
    let load_before = loadavg();
    let meter = CpuMeter::start(proxy, origin_pid, ClientCpu::OwnThreads);
    // one client thread per CPU of the load side (all CPUs without --split-cpus)
    let threads = u32::try_from(ctx.env.load_cpus).unwrap_or(1).max(1);
    match tunnel_rate::run(
        via,
        origin,
        "/1k.bin",
        1024,
        IN_FLIGHT,
        threads,
        ctx.seconds,
    ) {
        Ok(rate) => {
            if rate.completed == 0 {
                e.error = Some(format!(
                    "no tunnel completed: {}",
                    rate.first_error.clone().unwrap_or_default()
                ));
            } else if rate.errors > 0 {
                e.notes.push(format!(
                    "{} errors, first: {}",
                    rate.errors,
                    rate.first_error.clone().unwrap_or_default()
                ));
            }
            let row = Row {
                cpu: meter.per(rate.completed),
                rate,
                load_before,
                load_after: loadavg(),
            };
            if row.busy() {
                e.notes.push(format!(
                    "taken under load average > {BUSY_LOAD} ({} → {})",
                    row.load_before, row.load_after
                ));
            }
            e.figures = Some(row);
        }
        Err(err) => e.error = Some(format!("{err:#}")),
    }
}

fn rows(es: &[Entry<Row>]) -> Vec<Vec<String>> {
    es.iter()
        .map(|e| {
            let mut r = vec![e.program.clone(), version_cell(&e.version)];
            match &e.figures {
                Some(x) => r.extend([
                    format!(
                        "{}{}",
                        f(x.rate.tunnels_per_sec, 0),
                        if x.busy() { " (busy)" } else { "" }
                    ),
                    f(x.rate.p50_ms, 2),
                    f(x.rate.p99_ms, 2),
                    x.rate.errors.to_string(),
                    cpu_cell(x.cpu.as_ref().and_then(|c| c.proxy_us)),
                    cpu_cell(x.cpu.as_ref().map(|c| c.client_us)),
                    cpu_cell(x.cpu.as_ref().map(|c| c.origin_us)),
                    format!(
                        "{} → {}",
                        one_minute(&x.load_before),
                        one_minute(&x.load_after)
                    ),
                ]),
                None => r.extend(std::iter::repeat_n("–".to_string(), 8)),
            }
            r.push(e.status());
            r
        })
        .collect()
}

/// The CPU per tunnel of switchyard's run against the best peer's, and what that allows: when
/// the client, nginx and the proxy have the cores to themselves, rates go as the inverse of
/// their summed CPU per tunnel, whatever else shared the cores during the run.
fn cpu_budget(c: &crate::report::Compare<'_, Row>) -> String {
    let (Some(s), Some((peer, p))) = (c.switchyard, c.best_peer) else {
        return String::new();
    };
    let (Some(sc), Some(pc)) = (&s.cpu, &p.cpu) else {
        return String::new();
    };
    let mut md = String::new();
    let line = |name: &str, x: &CpuPerUnit| {
        format!(
            "{name} {:.1} + client {:.1} + nginx {:.1} = {:.1} µs",
            x.proxy_us.unwrap_or(0.0),
            x.client_us,
            x.origin_us,
            x.total_us()
        )
    };
    let _ = writeln!(
        md,
        "- CPU per tunnel: {}; {}",
        line("switchyard", sc),
        line(peer, pc)
    );
    if let (Some(sp), Some(pp)) = (sc.proxy_us, pc.proxy_us) {
        if pp > 0.0 {
            // On a box where the load generator and the origin have cores of their own, the
            // proxies' rates go as the inverse of their own CPU per tunnel.
            let _ = writeln!(
                md,
                "- proxy CPU per tunnel, switchyard / {peer}: {:.2}×; with cores of its own for the proxy (client and origin elsewhere) that is {:.2}× the rate, and 1.5× there needs ≤ {:.1} µs per tunnel",
                sp / pp,
                if sp > 0.0 { pp / sp } else { 0.0 },
                pp / 1.5
            );
        }
    }
    let others = sc.client_us + sc.origin_us;
    if sc.total_us() > 0.0 && others > 0.0 {
        let _ = writeln!(
            md,
            "- on cores shared by these three programs only: switchyard / {peer} ≈ {:.2}× (inverse CPU per tunnel); 1.5× needs switchyard's proxy CPU ≤ {:.1} µs per tunnel; a proxy costing nothing would reach {:.2}×",
            pc.total_us() / sc.total_us(),
            pc.total_us() / 1.5 - others,
            pc.total_us() / others
        );
    }
    md
}

fn section(title: &str, es: &[Entry<Row>]) -> String {
    let mut md = format!("### {title}\n\n");
    md.push_str(&table(
        &[
            "program",
            "version",
            "tunnels/s",
            "p50 ms",
            "p99 ms",
            "errors",
            "proxy CPU µs/tunnel",
            "client CPU µs/tunnel",
            "nginx CPU µs/tunnel",
            "load 1-min before → after",
            "status",
        ],
        &rows(es),
    ));
    md.push_str(&notes(es));
    md.push('\n');
    let c = compare(es, |r| r.rate.tunnels_per_sec);
    let best = match (c.switchyard, c.best_peer) {
        (Some(s), Some((peer, p))) => {
            let r = s.rate.tunnels_per_sec / p.rate.tunnels_per_sec;
            let _ = writeln!(
                md,
                "- switchyard / best peer ({peer}): **{r:.2}×** — target ≥ 1.5×: {}",
                verdict(r >= 1.5)
            );
            Some(s.rate.tunnels_per_sec.max(p.rate.tunnels_per_sec))
        }
        _ => {
            let _ = writeln!(
                md,
                "- switchyard / best peer: n/a (target ≥ 1.5×: **not measured**)"
            );
            None
        }
    };
    md.push_str(&cpu_budget(&c));
    if let Some((name, ceil)) = c.ceiling {
        let _ = write!(
            md,
            "- load generator ceiling ({name}): {:.0} tunnels/s",
            ceil.rate.tunnels_per_sec
        );
        match best {
            Some(b) => {
                let _ = writeln!(
                    md,
                    " = {:.2}× the best result — needs ≥ 2× for the figures to measure the proxies, not the client: {}",
                    ceil.rate.tunnels_per_sec / b,
                    verdict(ceil.rate.tunnels_per_sec >= 2.0 * b)
                );
            }
            None => md.push('\n'),
        }
    }
    md.push('\n');
    md
}

fn connect_via(s: &Started) -> Option<Via> {
    Some(Via::Connect(s.addr))
}

fn socks_via(s: &Started) -> Option<Via> {
    s.socks5.map(Via::Socks5)
}

pub fn run(ctx: &Ctx) -> Result<String> {
    let mut origin_procs = Procs::default();
    let (_, nginx) = files_origin(ctx, "www-tunnels", &mut origin_procs)?;
    let origin = nginx.addr;
    let sy = &ctx.switchyard;
    let connect: Vec<Program<'_>> = vec![
        Program {
            name: "switchyard",
            role: Role::Switchyard,
            start: Box::new(move |p, e| peers::switchyard(p, e, sy)),
            via: connect_via,
        },
        Program {
            name: "squid",
            role: Role::Peer,
            start: Box::new(peers::squid),
            via: connect_via,
        },
        Program {
            name: "tinyproxy",
            role: Role::Peer,
            start: Box::new(peers::tinyproxy),
            via: connect_via,
        },
        Program {
            name: "privoxy",
            role: Role::Peer,
            start: Box::new(peers::privoxy),
            via: connect_via,
        },
    ];
    let socks: Vec<Program<'_>> = vec![
        Program {
            name: "switchyard",
            role: Role::Switchyard,
            start: Box::new(move |p, e| peers::switchyard(p, e, sy)),
            via: socks_via,
        },
        Program {
            name: "microsocks",
            role: Role::Peer,
            start: Box::new(peers::microsocks),
            via: socks_via,
        },
        Program {
            name: "danted",
            role: Role::Peer,
            start: Box::new(peers::danted),
            via: socks_via,
        },
    ];

    let ceiling_name = "direct to nginx (client ceiling)";
    let mut ceiling = Entry::new(ceiling_name, Role::Ceiling);
    tracing::info!("tunnels: {ceiling_name}");
    measure(ctx, Via::Direct, origin, None, nginx.pid, &mut ceiling);

    let run_list = |list: &[Program<'_>], label: &str| -> Vec<Entry<Row>> {
        let mut es = Vec::new();
        for p in list {
            let mut procs = Procs::default();
            let mut e = Entry::new(p.name, p.role);
            match (p.start)(&mut procs, &ctx.env) {
                Ok(s) => {
                    e.version = s.version.clone();
                    e.notes.extend(s.notes.iter().cloned());
                    match (p.via)(&s) {
                        Some(via) => {
                            tracing::info!("tunnels: {label} {}", p.name);
                            measure(ctx, via, origin, Some(s.pid), nginx.pid, &mut e);
                        }
                        None => e.error = Some(format!("{} has no {label} listener", p.name)),
                    }
                }
                Err(err) => e.error = Some(format!("did not start: {err:#}")),
            }
            es.push(e);
        }
        es
    };
    let mut connect_rows = run_list(&connect, "CONNECT");
    let mut socks_rows = run_list(&socks, "SOCKS5");

    // The ceiling again after the proxies; the higher figure is the stricter reference.
    tracing::info!("tunnels: {ceiling_name} again");
    let mut again = Entry::new(ceiling_name, Role::Ceiling);
    measure(ctx, Via::Direct, origin, None, nginx.pid, &mut again);
    if let (Some(a), Some(b)) = (ceiling.valid().cloned(), again.valid().cloned()) {
        ceiling.notes.push(format!(
            "best of 2 runs (before and after the proxies): {:.0} and {:.0} tunnels/s",
            a.rate.tunnels_per_sec, b.rate.tunnels_per_sec
        ));
        if b.rate.tunnels_per_sec > a.rate.tunnels_per_sec {
            ceiling.figures = Some(b);
        }
    } else if ceiling.valid().is_none() {
        ceiling = again;
    }
    drop(origin_procs);
    connect_rows.insert(0, ceiling.clone());
    socks_rows.insert(0, ceiling);

    ctx.write_json(
        "tunnels",
        json!({
            "params": {
                "iteration": "open a tunnel (CONNECT, or SOCKS5 greeting + CONNECT), GET /1k.bin with Connection: close, read to EOF, check the status and the 1024-byte body, close",
                "in_flight": IN_FLIGHT, "seconds": ctx.seconds, "threads": ctx.env.load_cpus,
                "client": "switchyard-bench tunnel_rate: one current-thread tokio runtime per core, request bytes built once",
                "origin": { "program": "nginx", "version": nginx.version },
                "busy_load": BUSY_LOAD,
            },
            "connect": connect_rows,
            "socks5": socks_rows,
        }),
    )?;
    let mut md = format!(
        "## New tunnels/s (one tunnel + 1 KiB GET + close, {IN_FLIGHT} in flight, {}s; origin nginx {})\n\n",
        ctx.seconds,
        version_cell(&nginx.version)
    );
    md.push_str(&section("HTTP CONNECT", &connect_rows));
    md.push_str(&section("SOCKS5", &socks_rows));
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(proxy_us: f64, client_us: f64, origin_us: f64) -> Row {
        Row {
            rate: TunnelRate {
                in_flight: IN_FLIGHT,
                threads: 2,
                seconds: 5.0,
                completed: 1000,
                errors: 0,
                tunnels_per_sec: 200.0,
                p50_ms: 1.0,
                p99_ms: 2.0,
                first_error: None,
            },
            cpu: Some(CpuPerUnit {
                proxy_us: Some(proxy_us),
                origin_us,
                client_us,
            }),
            load_before: "1.00 1.00 1.00".into(),
            load_after: "1.00 1.00 1.00".into(),
        }
    }

    #[test]
    fn cpu_budget_gives_the_shared_and_the_own_cores_ratios() {
        let (s, p) = (row(60.0, 40.0, 30.0), row(90.0, 40.0, 30.0));
        let c = crate::report::Compare {
            switchyard: Some(&s),
            best_peer: Some(("tinyproxy", &p)),
            ceiling: None,
        };
        let md = cpu_budget(&c);
        assert!(
            md.contains("switchyard / tinyproxy: 0.67×; with cores of its own for the proxy (client and origin elsewhere) that is 1.50× the rate, and 1.5× there needs ≤ 60.0 µs"),
            "{md}"
        );
        assert!(
            md.contains("≈ 1.23× (inverse CPU per tunnel); 1.5× needs switchyard's proxy CPU ≤ 36.7 µs per tunnel; a proxy costing nothing would reach 2.29×"),
            "{md}"
        );
    }

    #[test]
    fn load_marks() {
        assert_eq!(one_minute("3.50 2.00 1.00"), 3.5);
        assert_eq!(one_minute(""), 0.0);
    }
}

//! Scenario `client`: `switchyard client` chained to `switchyard server` (client → server →
//! nginx origin) against the origin direct and against a two-squid chain (child squid with the
//! parent squid as `cache_peer`, `never_direct`), in one run: `wrk` requests/s and transfer for a
//! 1 KiB and a 1 MiB file through each, plus the client's idle RSS after start.
//!
//! The client's HTTP server leg forwards plain-HTTP requests to the server as absolute-form
//! requests, pooled and kept alive, as the child squid does to its parent.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::json;

use crate::peers::{self, Started};
use crate::procs::{self, Procs};
use crate::report::{f, notes, table, version_cell, Entry, Role};
use crate::scenarios::{files_origin, measure_http_into, Ctx};
use crate::wrk::HttpFigures;

const FILES: [(&str, &str, usize); 2] = [
    ("1 KiB", "/1k.bin", 1024),
    ("1 MiB", "/1m.bin", 1024 * 1024),
];

/// The chain to measure: its entry point (None = direct to the origin) and idle RSS when known.
struct Chain {
    name: &'static str,
    role: Role,
    proxy: Option<std::net::SocketAddr>,
    version: Option<String>,
    idle_rss_kib: Option<u64>,
}

fn switchyard_chain(procs: &mut Procs, ctx: &Ctx) -> Result<Chain> {
    let server = peers::switchyard(procs, &ctx.env, &ctx.switchyard).context("server")?;
    let client = peers::switchyard_client(procs, &ctx.env, &ctx.switchyard, server.addr)
        .context("client")?;
    // Idle RSS: after start, before any traffic, once allocations settle.
    std::thread::sleep(Duration::from_secs(1));
    let rss = procs::rss_kib(client.pid).ok();
    Ok(Chain {
        name: "switchyard client → switchyard server",
        role: Role::Switchyard,
        proxy: Some(client.addr),
        version: client.version,
        idle_rss_kib: rss,
    })
}

fn squid_chain(procs: &mut Procs, ctx: &Ctx) -> Result<Chain> {
    let parent: Started = peers::squid_with(procs, &ctx.env, "squid-parent", "")?;
    let child = peers::squid_with(
        procs,
        &ctx.env,
        "squid-child",
        &format!(
            // Its own visible_hostname: with the parent's name in Via the parent sees a loop.
            "cache_peer {} parent {} 0 no-query no-digest default\nnever_direct allow all\n\
             visible_hostname switchyard-bench-child\n",
            parent.addr.ip(),
            parent.addr.port()
        ),
    )?;
    std::thread::sleep(Duration::from_secs(1));
    let rss = procs::rss_kib(child.pid).ok();
    Ok(Chain {
        name: "squid → squid",
        role: Role::Peer,
        proxy: Some(child.addr),
        version: child.version,
        idle_rss_kib: rss,
    })
}

pub fn run(ctx: &Ctx) -> Result<String> {
    let mut origin_procs = Procs::default();
    let (bodies, nginx) = files_origin(ctx, "www-client", &mut origin_procs)?;
    let origin = nginx.addr;
    type Start = fn(&mut Procs, &Ctx) -> Result<Chain>;
    let starters: [(&str, Role, Option<Start>); 3] = [
        ("direct (nginx)", Role::Ceiling, None),
        (
            "switchyard client → switchyard server",
            Role::Switchyard,
            Some(switchyard_chain),
        ),
        ("squid → squid", Role::Peer, Some(squid_chain)),
    ];
    let mut entries: Vec<Vec<Entry<HttpFigures>>> = vec![Vec::new(), Vec::new()];
    let mut rss: Vec<(String, Option<u64>)> = Vec::new();
    for (name, role, start) in starters {
        let mut procs = Procs::default();
        let mut proto = Entry::new(name, role);
        let chain = match start {
            None => Some(Chain {
                name,
                role,
                proxy: None,
                version: nginx.version.clone(),
                idle_rss_kib: None,
            }),
            Some(start) => match start(&mut procs, ctx) {
                Ok(c) => Some(c),
                Err(e) => {
                    proto.error = Some(format!("did not start: {e:#}"));
                    None
                }
            },
        };
        if let Some(c) = &chain {
            proto.version = c.version.clone();
            if c.role != Role::Ceiling {
                rss.push((c.name.to_owned(), c.idle_rss_kib));
            }
        }
        for (i, ((label, path, _), body)) in FILES.iter().zip(&bodies).enumerate() {
            let mut e = proto.clone();
            if let Some(c) = &chain {
                tracing::info!("client: {} {label}", c.name);
                procs::settle(Duration::from_secs(10));
                measure_http_into(
                    ctx,
                    origin,
                    c.proxy,
                    path,
                    body,
                    ctx.env.wrk_threads(),
                    &mut e,
                );
            }
            entries[i].push(e);
        }
    }
    drop(origin_procs);

    ctx.write_json(
        "client",
        json!({
            "params": { "tool": "wrk", "threads": ctx.env.wrk_threads(), "connections": ctx.connections, "seconds": ctx.seconds },
            "idle_rss_kib": rss.iter().map(|(n, r)| json!({"program": n, "kib": r})).collect::<Vec<_>>(),
            "files": FILES.iter().zip(&entries).map(|((label, path, len), es)| json!({
                "file": label, "path": path, "bytes": len, "results": es })).collect::<Vec<_>>(),
        }),
    )?;
    let mut md = format!(
        "## Client chain (wrk -t{} -c{} -d{}s)\n\nclient → server → nginx against nginx direct and squid → squid.\n\n",
        ctx.env.wrk_threads(),
        ctx.connections, ctx.seconds
    );
    for ((label, _, _), es) in FILES.iter().zip(&entries) {
        let rows: Vec<Vec<String>> = es
            .iter()
            .map(|e| {
                let mut r = vec![e.program.clone(), version_cell(&e.version)];
                match &e.figures {
                    Some(x) => r.extend([
                        f(x.requests_per_sec, 0),
                        f(x.transfer_mib_per_sec, 1),
                        f(x.p50_ms, 2),
                        f(x.p99_ms, 2),
                    ]),
                    None => r.extend(std::iter::repeat_n("–".to_string(), 4)),
                }
                r.push(e.status());
                r
            })
            .collect();
        let _ = writeln!(md, "### {label} file\n");
        md.push_str(&table(
            &[
                "chain", "version", "req/s", "MiB/s", "p50 ms", "p99 ms", "status",
            ],
            &rows,
        ));
        md.push_str(&notes(es));
        md.push('\n');
    }
    let _ = writeln!(md, "### Idle RSS of the chain's entry program\n");
    let rows: Vec<Vec<String>> = rss
        .iter()
        .map(|(n, r)| vec![n.clone(), r.map_or("–".into(), |k| f(k as f64 / 1024.0, 1))])
        .collect();
    md.push_str(&table(&["program", "idle RSS MiB"], &rows));
    Ok(md)
}

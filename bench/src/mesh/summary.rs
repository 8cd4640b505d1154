//! The Markdown section of the mesh scenario: the table, the target and the ratios.

use std::fmt::Write as _;

use super::{ping_count, MeshFigures, OVERLAY_MTU, REFERENCE, RELAYED, UNDERLAY};
use crate::report::{compare, f, notes, table, verdict, version_cell, Entry, Role};
use crate::tunnels::{one_minute, BUSY_LOAD};

/// One figure of a row, for comparing rows.
type Metric = fn(&MeshFigures) -> f64;

/// `a / b` with one decimal (MiB), or "–".
fn mib_pair(kib: &[u64]) -> String {
    if kib.is_empty() {
        return "–".into();
    }
    kib.iter()
        .map(|k| f(*k as f64 / 1024.0, 1))
        .collect::<Vec<_>>()
        .join(" / ")
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{}×", f(a / b, 2))
    } else {
        "–".into()
    }
}

/// The Markdown section: the table, the ratios to the reference and the best peer.
pub(super) fn section(seconds: u64, entries: &[Entry<MeshFigures>]) -> String {
    let reference = entries
        .iter()
        .find(|e| e.program == REFERENCE)
        .and_then(Entry::valid);
    let mut md = String::from("## mesh\n\n");
    let _ = writeln!(
        md,
        "Two peers in network namespaces joined by a veth pair (underlay {} / {}, MTU 1500); each program builds its overlay over it (every overlay device configured to MTU {OVERLAY_MTU}; the MTU column is what the kernel reports for the device `a` reaches `b` through), one program at a time. From `a` to `b`'s overlay address: iperf3 TCP for {seconds} s with 1 and 4 streams; latency of ICMP echo, `ping -i 0.01 -c {}`, p50/p99 of the per-reply times; peer CPU = CPU-seconds per second of both peer processes per Gbit/s over the two iperf3 runs; memory = VmRSS and PSS of each peer process (a / b) after the runs. Load averages above {BUSY_LOAD} are marked ⚠ (other work shared the 2 cores).\n",
        UNDERLAY[0],
        UNDERLAY[1],
        ping_count(seconds)
    );
    let rows: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let fig = e.figures.as_ref();
            let num = |get: Metric, digits: usize| {
                fig.map(|x| f(get(x), digits)).unwrap_or_else(|| "–".into())
            };
            let vs_ref = match (e.valid(), reference) {
                (Some(x), Some(r)) => ratio(x.tcp_1_stream_gbit_s, r.tcp_1_stream_gbit_s),
                _ => "–".into(),
            };
            let load = fig
                .map(|x| {
                    let busy = [&x.load_before, &x.load_after]
                        .iter()
                        .any(|l| one_minute(l) > BUSY_LOAD);
                    format!(
                        "{} → {}{}",
                        x.load_before.split(' ').next().unwrap_or(""),
                        x.load_after.split(' ').next().unwrap_or(""),
                        if busy { " ⚠" } else { "" }
                    )
                })
                .unwrap_or_else(|| "–".into());
            vec![
                e.program.clone(),
                version_cell(&e.version),
                fig.and_then(|x| x.mtu)
                    .map(|m| m.to_string())
                    .unwrap_or_else(|| "–".into()),
                num(|x| x.tcp_1_stream_gbit_s, 2),
                num(|x| x.tcp_4_streams_gbit_s, 2),
                vs_ref,
                num(|x| x.ping_p50_ms, 3),
                num(|x| x.ping_p99_ms, 3),
                fig.map(|x| format!("{}/{}", x.ping_received, x.ping_sent))
                    .unwrap_or_else(|| "–".into()),
                fig.and_then(|x| x.peer_cpu_per_gbit)
                    .map(|v| f(v, 2))
                    .unwrap_or_else(|| "–".into()),
                fig.map(|x| mib_pair(&x.rss_kib))
                    .unwrap_or_else(|| "–".into()),
                fig.map(|x| mib_pair(&x.pss_kib))
                    .unwrap_or_else(|| "–".into()),
                load,
                e.status(),
            ]
        })
        .collect();
    md.push_str(&table(
        &[
            "program",
            "version",
            "MTU",
            "TCP 1 stream Gbit/s",
            "TCP 4 streams Gbit/s",
            "1 stream vs boringtun-cli --threads 1",
            "ping p50 ms",
            "ping p99 ms",
            "replies",
            "peer CPU s/s per Gbit/s",
            "RSS MiB a / b",
            "PSS MiB a / b",
            "load (1 min)",
            "status",
        ],
        &rows,
    ));
    md.push_str(&notes(entries));
    md.push('\n');
    md.push_str(&targets(entries, reference));
    md
}

/// The target (switchyard ≥ 2× boringtun-cli --threads 1) and the ratios to the best peer and
/// the ceiling.
fn targets(entries: &[Entry<MeshFigures>], reference: Option<&MeshFigures>) -> String {
    let mut md = String::new();
    let Some(sy) = compare(entries, |x| x.tcp_1_stream_gbit_s).switchyard else {
        let why = entries
            .iter()
            .find(|e| e.role == Role::Switchyard)
            .map(Entry::status)
            .unwrap_or_else(|| "not run".into());
        let _ = writeln!(
            md,
            "Target switchyard ≥ 2× {REFERENCE} (TCP throughput): not evaluated, switchyard was not measured ({why}).\n"
        );
        return md;
    };
    let metrics: [(&str, Metric); 2] = [
        ("1 stream", |x| x.tcp_1_stream_gbit_s),
        ("4 streams", |x| x.tcp_4_streams_gbit_s),
    ];
    for (what, get) in metrics {
        let c = compare(entries, get);
        let mine = get(sy);
        let target = match reference.map(get) {
            Some(r) if r > 0.0 => format!("{} ({})", ratio(mine, r), verdict(mine >= 2.0 * r)),
            _ => format!("not evaluated ({REFERENCE} not measured)"),
        };
        let best = c
            .best_peer
            .map(|(name, x)| format!("{} ({name})", ratio(mine, get(x))))
            .unwrap_or_else(|| "–".into());
        let ceiling = c
            .ceiling
            .map(|(_, x)| ratio(mine, get(x)))
            .unwrap_or_else(|| "–".into());
        let _ = writeln!(
            md,
            "- TCP {what}: switchyard / {REFERENCE} {target} (target ≥ 2×); / best peer {best}; / raw underlay {ceiling}"
        );
    }
    if let Some(relayed) = entries
        .iter()
        .find(|e| e.program == RELAYED)
        .and_then(Entry::valid)
    {
        let _ = writeln!(
            md,
            "- relayed through a third member (end to end: c passes ciphertext on) / direct switchyard: {} (1 stream), {} (4 streams); ping p50 {} ms against {} ms",
            ratio(relayed.tcp_1_stream_gbit_s, sy.tcp_1_stream_gbit_s),
            ratio(relayed.tcp_4_streams_gbit_s, sy.tcp_4_streams_gbit_s),
            f(relayed.ping_p50_ms, 3),
            f(sy.ping_p50_ms, 3)
        );
    }
    let best_p99 = entries
        .iter()
        .filter(|e| e.role == Role::Peer)
        .filter_map(|e| e.valid().map(|x| (e.program.as_str(), x.ping_p99_ms)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((name, p99)) = best_p99 {
        let _ = writeln!(
            md,
            "- ping p99: switchyard {} ms, best peer {} ms ({name})",
            f(sy.ping_p99_ms, 3),
            f(p99, 3)
        );
    }
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    fn entry(program: &str, role: Role, gbit: Option<f64>) -> Entry<MeshFigures> {
        let mut e = Entry::new(program, role);
        e.figures = gbit.map(|g| MeshFigures {
            tcp_1_stream_gbit_s: g,
            tcp_4_streams_gbit_s: g * 1.5,
            ping_p99_ms: 1.0 / g,
            load_before: "1.00 1.00 1.00".into(),
            load_after: "4.00 1.00 1.00".into(),
            ..MeshFigures::default()
        });
        if gbit.is_none() {
            e.error = Some("did not start".into());
        }
        e
    }

    #[test]
    fn summary_rates_switchyard_against_the_single_thread_reference() {
        let mut es = vec![
            entry("raw underlay (veth)", Role::Ceiling, Some(10.0)),
            entry(REFERENCE, Role::Peer, Some(1.0)),
            entry("nebula", Role::Peer, Some(1.5)),
            entry("switchyard", Role::Switchyard, Some(2.5)),
        ];
        let md = section(5, &es);
        assert!(
            md.contains("switchyard / boringtun-cli --threads 1 2.50× (**met**)"),
            "{md}"
        );
        assert!(md.contains("/ best peer 1.67× (nebula)"), "{md}");
        assert!(md.contains("/ raw underlay 0.25×"), "{md}");
        assert!(md.contains("1.00 → 4.00 ⚠"), "{md}");
        es[3] = entry("switchyard", Role::Switchyard, Some(1.9));
        assert!(section(5, &es).contains("1.90× (**not met**)"));
        es[3] = entry("switchyard", Role::Switchyard, None);
        let md = section(5, &es);
        assert!(md.contains("| FAILED: did not start |"), "{md}");
        assert!(md.contains("not evaluated, switchyard was not measured (FAILED: did not start)"));
    }
}

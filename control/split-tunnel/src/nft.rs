//! The nftables fallback ruleset: the same classification as the eBPF programs, as one `table inet`
//! replaced atomically on every change. Runtime-free text generation.
//!
//! * `route` chain at the output hook (priority mangle): sockets in the scope cgroup get
//!   `meta mark` = the tunnel mark exactly when the eBPF programs would set SO_MARK; a changed mark
//!   re-routes the packet, so `ip rule fwmark` applies. Packets that already carry another mark
//!   (the proxy's own sockets) are left alone. A marked packet marks its connection (`ct mark`,
//!   chain `connmark`, only a connection without a ct mark: another program's is left alone),
//!   and an unmarked packet of a marked connection is marked again: the kernel's socketless
//!   packets of a tunnelled flow (a TIME_WAIT's ACK) carry no socket mark and the socket's LAN
//!   source, so neither the fwmark nor the TUN-source rule sees them; they follow their flow into
//!   the tunnel instead of the main table (where the kernel refuses the masqueraded flow's
//!   packet: EPERM for a datagram, tests/vpn `sylk_nftables_`).
//! * `postrouting` masquerades marked packets leaving by the tunnel device: the source was chosen
//!   before the mark re-routed the packet (eBPF marks before the route lookup, so needs none).
//! * `dns` at the nat output hook: port-53 TCP/UDP in scope is DNATed to the resolver; conntrack
//!   rewrites the replies' source back to the original server.

use std::fmt::Write;

use ipnet::IpNet;
use switchyard_ebpf::DnsRedirect;

use crate::rules::SplitMode;

/// A cgroup as `socket cgroupv2` names it: (level, path relative to /sys/fs/cgroup).
pub type NftCgroup = (usize, String);

/// Everything the ruleset is generated from.
#[derive(Clone, Debug)]
pub struct NftParams<'a> {
    pub table: &'a str,
    pub mode: SplitMode,
    pub mark: u32,
    pub scope: &'a NftCgroup,
    pub app_cgroups: &'a [NftCgroup],
    pub bypass_cgroups: &'a [NftCgroup],
    pub split: &'a [IpNet],
    pub bypass: &'a [IpNet],
    pub tun_device: &'a str,
    pub dns: Option<DnsRedirect>,
}

fn set(out: &mut String, name: &str, kind: &str, nets: &[IpNet], v4: bool) {
    let elements: Vec<String> = nets
        .iter()
        .filter(|n| matches!(n, IpNet::V4(_)) == v4)
        .map(|n| n.to_string())
        .collect();
    let _ = writeln!(
        out,
        "  set {name} {{\n    type {kind}; flags interval; auto-merge;"
    );
    if !elements.is_empty() {
        let _ = writeln!(out, "    elements = {{ {} }}", elements.join(", "));
    }
    out.push_str("  }\n");
}

fn cgroup_match((level, path): &NftCgroup) -> String {
    format!("socket cgroupv2 level {level} \"{path}\"")
}

/// Whether a name can go into the ruleset text unquoted/quoted without breaking it.
pub fn safe_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | '@' | ':'))
}

/// The complete ruleset text for `nft -f -`: creates the table if missing, deletes it and
/// recreates it in one transaction.
pub fn ruleset(p: &NftParams<'_>) -> String {
    let t = p.table;
    let mark = format!("{:#x}", p.mark);
    let mut out = format!("table inet {t}\ndelete table inet {t}\ntable inet {t} {{\n");
    set(&mut out, "split4", "ipv4_addr", p.split, true);
    set(&mut out, "split6", "ipv6_addr", p.split, false);
    set(&mut out, "bypass4", "ipv4_addr", p.bypass, true);
    set(&mut out, "bypass6", "ipv6_addr", p.bypass, false);

    let _ = writeln!(
        out,
        "  chain route {{\n    type route hook output priority mangle; policy accept;\n    \
         meta mark != 0 return\n    ct mark {mark} meta mark set {mark} return\n    \
         {} goto classify\n  }}",
        cgroup_match(p.scope)
    );
    out.push_str("  chain classify {\n");
    for cg in p.bypass_cgroups {
        let _ = writeln!(out, "    {} return", cgroup_match(cg));
    }
    out.push_str("    ip daddr @bypass4 return\n    ip6 daddr @bypass6 return\n");
    let on_match = match p.mode {
        SplitMode::Include => format!("meta mark set {mark} return"),
        SplitMode::Exclude => "return".to_string(),
    };
    for cg in p.app_cgroups {
        let _ = writeln!(out, "    {} {on_match}", cgroup_match(cg));
    }
    let _ = writeln!(
        out,
        "    ip daddr @split4 {on_match}\n    ip6 daddr @split6 {on_match}"
    );
    if p.mode == SplitMode::Exclude {
        let _ = writeln!(out, "    meta mark set {mark}");
    }
    out.push_str("  }\n");

    // a connection's ct mark is set from its tunnelled packets only while it has none: a
    // conntrack mark another program keeps (a firewall's zones, a container runtime) is theirs
    let _ = writeln!(
        out,
        "  chain connmark {{\n    type filter hook postrouting priority mangle; policy accept;\n    \
         meta mark {mark} ct mark 0 ct mark set {mark}\n  }}"
    );
    let _ = writeln!(
        out,
        "  chain postrouting {{\n    type nat hook postrouting priority srcnat; policy accept;\n    \
         meta mark {mark} oifname \"{}\" masquerade\n  }}",
        p.tun_device
    );

    if let Some(dns) = p.dns {
        let _ = writeln!(
            out,
            "  chain dns {{\n    type nat hook output priority -100; policy accept;\n    \
             meta mark != 0 meta mark != {mark} return\n    {} goto dns_redirect\n  }}",
            cgroup_match(p.scope)
        );
        out.push_str("  chain dns_redirect {\n");
        for cg in p.bypass_cgroups {
            let _ = writeln!(out, "    {} return", cgroup_match(cg));
        }
        let port = dns.intercept_port;
        if let Some(r4) = dns.resolver4 {
            for proto in ["udp", "tcp"] {
                let _ = writeln!(
                    out,
                    "    meta nfproto ipv4 {proto} dport {port} ip daddr != {} dnat ip to {r4}",
                    r4.ip()
                );
            }
        }
        if let Some(r6) = dns.resolver6 {
            for proto in ["udp", "tcp"] {
                let _ = writeln!(
                    out,
                    "    meta nfproto ipv6 {proto} dport {port} ip6 daddr != {} dnat ip6 to [{}]:{}",
                    r6.ip(),
                    r6.ip(),
                    r6.port()
                );
            }
        }
        out.push_str("  }\n");
    }
    out.push_str("}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params<'a>(
        mode: SplitMode,
        scope: &'a NftCgroup,
        apps: &'a [NftCgroup],
        nets: &'a [IpNet],
        dns: Option<DnsRedirect>,
    ) -> NftParams<'a> {
        NftParams {
            table: "syt",
            mode,
            mark: 0x5359,
            scope,
            app_cgroups: apps,
            bypass_cgroups: &[],
            split: nets,
            bypass: &[],
            tun_device: "tun0",
            dns,
        }
    }

    #[test]
    fn include_marks_only_matches() {
        let scope = (1, "unified/s".to_string());
        let apps = [(2, "unified/s/app".to_string())];
        let nets: Vec<IpNet> = vec![
            "10.0.0.0/8".parse().expect("n"),
            "2001:db8::/32".parse().expect("n"),
        ];
        let text = ruleset(&params(SplitMode::Include, &scope, &apps, &nets, None));
        assert!(text.starts_with("table inet syt\ndelete table inet syt\ntable inet syt {\n"));
        assert!(text.contains("socket cgroupv2 level 1 \"unified/s\" goto classify"));
        assert!(
            text.contains("socket cgroupv2 level 2 \"unified/s/app\" meta mark set 0x5359 return")
        );
        assert!(text.contains("    ct mark 0x5359 meta mark set 0x5359 return\n"));
        assert!(text.contains("elements = { 10.0.0.0/8 }"));
        assert!(text.contains("elements = { 2001:db8::/32 }"));
        assert!(text.contains("ip daddr @split4 meta mark set 0x5359 return"));
        // only a connection without a ct mark gets ours
        assert!(text.contains("    meta mark 0x5359 ct mark 0 ct mark set 0x5359\n"));
        assert!(
            !text.contains("    meta mark set 0x5359\n"),
            "include must not mark the rest"
        );
        assert!(!text.contains("chain dns"));
    }

    #[test]
    fn exclude_marks_everything_else_and_dns_is_redirected() {
        let scope = (1, "unified/s".to_string());
        let dns = DnsRedirect {
            intercept_port: 53,
            resolver4: Some("127.0.0.1:5353".parse().expect("a")),
            resolver6: Some("[::1]:5353".parse().expect("a")),
        };
        let text = ruleset(&params(SplitMode::Exclude, &scope, &[], &[], Some(dns)));
        assert!(text.contains("ip daddr @split4 return"));
        assert!(text.contains("    meta mark set 0x5359\n"));
        assert!(
            !text.contains("elements"),
            "empty sets carry no elements line"
        );
        assert!(text.contains("udp dport 53 ip daddr != 127.0.0.1 dnat ip to 127.0.0.1:5353"));
        assert!(text.contains("tcp dport 53 ip6 daddr != ::1 dnat ip6 to [::1]:5353"));
        assert!(text.contains("meta mark 0x5359 oifname \"tun0\" masquerade"));
    }

    #[test]
    fn names_with_quotes_or_spaces_are_unsafe() {
        assert!(safe_name("unified/syebpf-1/inc"));
        assert!(!safe_name("a\"b"));
        assert!(!safe_name("a b"));
        assert!(!safe_name(""));
    }
}

//! Route table vs. a naive reference matcher written here from the spec, independently of the
//! crate's label-based implementation: the compiled lookup must pick the same entry.
#![no_main]

use libfuzzer_sys::fuzz_target;
use switchyard_proto::route_matcher::{DomainPattern, RouteEntry, RouteTable};

/// A small alphabet so patterns and hosts collide often.
const ALPHABET: &[u8] = b"ab*.-A0:[]_ ";

fn text(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect()
}

fn norm(s: &str) -> String {
    let s = s.to_ascii_lowercase();
    let s = s.strip_suffix('.').unwrap_or(&s);
    let s = s
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(s);
    s.to_owned()
}

/// `*` matches any run of non-dot characters.
fn glob(p: &[u8], h: &[u8]) -> bool {
    match p.split_first() {
        None => h.is_empty(),
        Some((b'*', rest)) => {
            let mut k = 0;
            loop {
                if glob(rest, &h[k..]) {
                    return true;
                }
                if k == h.len() || h[k] == b'.' {
                    return false;
                }
                k += 1;
            }
        }
        Some((c, rest)) => h.first() == Some(c) && glob(rest, &h[1..]),
    }
}

/// The spec, character by character: `*` alone = everything; leading `*.` = "anything, a dot,
/// then the rest"; other `*` = any run within one label.
fn reference_match(pattern: &str, host: &str) -> bool {
    let mut p = String::new();
    for c in norm(pattern.trim()).chars() {
        if !(c == '*' && p.ends_with('*')) {
            p.push(c);
        }
    }
    let h = norm(host);
    if p == "*" {
        return true;
    }
    if let Some(rest) = p.strip_prefix("*.") {
        return h
            .match_indices('.')
            .any(|(i, _)| glob(rest.as_bytes(), &h.as_bytes()[i + 1..]));
    }
    glob(p.as_bytes(), h.as_bytes())
}

fuzz_target!(|data: &[u8]| {
    // Records separated by 0xFF: the first byte of a pattern record is its priority (and whether
    // it starts a new entry), the last record is the host.
    let mut records: Vec<&[u8]> = data.split(|&b| b == 0xFF).collect();
    let Some(host_bytes) = records.pop() else {
        return;
    };
    if records.len() > 16 {
        return;
    }
    let host = text(&host_bytes[..host_bytes.len().min(32)]);
    let mut entries: Vec<(Vec<String>, i32)> = Vec::new();
    for rec in records {
        let Some((&meta, rest)) = rec.split_first() else {
            continue;
        };
        let pattern = text(&rest[..rest.len().min(24)]);
        if DomainPattern::parse(&pattern).is_err() {
            continue;
        }
        let prio = i32::from(meta % 4) - 1;
        match entries.last_mut() {
            Some(last) if meta & 0x80 != 0 => last.0.push(pattern),
            _ => entries.push((vec![pattern], prio)),
        }
    }
    let table = RouteTable::build(
        entries
            .iter()
            .enumerate()
            .map(|(i, (patterns, priority))| RouteEntry {
                patterns: patterns.clone(),
                priority: *priority,
                value: i,
            })
            .collect(),
    )
    .expect("valid patterns build");

    let mut want: Option<usize> = None;
    for (i, (patterns, prio)) in entries.iter().enumerate() {
        let better = want.is_none_or(|w| *prio > entries[w].1);
        if better && patterns.iter().any(|p| reference_match(p, &host)) {
            want = Some(i);
        }
    }
    for (patterns, _) in &entries {
        for p in patterns {
            let compiled = DomainPattern::parse(p).expect("parsed above");
            assert_eq!(
                compiled.matches(&host),
                reference_match(p, &host),
                "pattern {p:?} host {host:?}"
            );
        }
    }
    assert_eq!(
        table.lookup_index(&host),
        want,
        "host {host:?} entries {entries:?}"
    );
    assert_eq!(table.lookup(&host).copied(), want);
});

//! Domain patterns and the compiled route table that maps a host name to its route.
//!
//! Pattern semantics (from the product spec):
//!
//! * `example.com` matches exactly `example.com`;
//! * `*.example.com` matches any subdomain at any depth (`a.example.com`, `a.b.example.com`) but
//!   not `example.com` itself;
//! * a `*` inside a label (`cdn*.example.com`, `*cdn.example.com`, `a*b*.x.com`, or a whole
//!   non-leading label as in `www.*.com`) matches any run of characters — possibly empty — within
//!   that one label, never a dot; everything else must match exactly;
//! * `*` alone matches every host.
//!
//! Matching is ASCII case-insensitive; one trailing dot on the host (or pattern) is ignored; IPv6
//! literals may be written with or without brackets; IP literals are compared as exact strings
//! (no canonicalisation). Hosts must not carry a port: callers strip it.
//!
//! [`RouteTable`] is compiled, not scanned: exact names and `*.suffix` patterns live in hash maps
//! (a lookup walks the host's label suffixes, one probe per label), patterns with in-label
//! wildcards are bucketed by their trailing literal labels so only a handful of candidates are
//! tested, and `*` is a fallback. Among all matching entries the winner is the one with the
//! highest priority, then the earliest in configuration order. A lookup allocates only when the
//! host contains upper-case letters. [`crate::pac`] generates a browser PAC script with the very
//! same semantics and index layout.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::net::Ipv6Addr;

/// Longest pattern accepted, in bytes (a DNS name is at most 253 characters).
const MAX_PATTERN_LEN: usize = 255;

/// Why a domain pattern was rejected. The configuration's fault: report it to the operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("empty domain pattern")]
    Empty,
    #[error("invalid domain pattern {pattern:?}: {reason}")]
    Invalid {
        pattern: String,
        reason: &'static str,
    },
}

fn invalid(pattern: &str, reason: &'static str) -> PatternError {
    PatternError::Invalid {
        pattern: pattern.to_owned(),
        reason,
    }
}

/// One label of a pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Label {
    /// Matches exactly this (lowercase) label.
    Lit(String),
    /// `*` inside a label: the parts between the stars, in order (`a*b*` → `["a", "b", ""]`).
    Glob(Vec<String>),
}

impl Label {
    fn matches(&self, label: &str) -> bool {
        match self {
            Label::Lit(l) => l == label,
            Label::Glob(parts) => glob_label(parts, label),
        }
    }

    /// The label as written in the normalised pattern.
    pub(crate) fn text(&self) -> Cow<'_, str> {
        match self {
            Label::Lit(l) => Cow::Borrowed(l),
            Label::Glob(parts) => Cow::Owned(parts.join("*")),
        }
    }
}

/// `*`-glob within one label: first part is a prefix, last part a suffix, middle parts appear in
/// order in between (leftmost match is optimal for `*`-only globs).
fn glob_label(parts: &[String], label: &str) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() < 2 {
        return first == label;
    }
    if label.len() < first.len() + last.len()
        || !label.starts_with(first.as_str())
        || !label.ends_with(last.as_str())
    {
        return false;
    }
    let Some(mut middle) = label.get(first.len()..label.len() - last.len()) else {
        return false;
    };
    for part in parts.iter().skip(1).take(parts.len() - 2) {
        match middle.find(part.as_str()) {
            Some(at) => match middle.get(at + part.len()..) {
                Some(rest) => middle = rest,
                None => return false,
            },
            None => return false,
        }
    }
    true
}

/// A parsed, normalised domain pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainPattern {
    /// Normalised text: lowercase, no trailing dot, no brackets, `**` collapsed.
    text: String,
    /// Leading `*.` (or `*` alone): one or more extra labels in front.
    pub(crate) any_depth: bool,
    /// Labels after the leading `*.`, left to right.
    pub(crate) labels: Vec<Label>,
}

/// Lowercases only when needed and strips one trailing dot and IPv6 brackets.
pub(crate) fn normalize_host(host: &str) -> Cow<'_, str> {
    let h = host.strip_suffix('.').unwrap_or(host);
    let h = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    if h.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(h.to_ascii_lowercase())
    } else {
        Cow::Borrowed(h)
    }
}

impl DomainPattern {
    /// Parses a pattern. Accepted: letters, digits, `-`, `_`, `*` in dot-separated non-empty
    /// labels (one trailing dot allowed), or an IPv6 literal (bracketed or not). Surrounding
    /// whitespace is ignored; anything else — ports, paths, leading dots, empty labels — is
    /// rejected.
    pub fn parse(s: &str) -> Result<Self, PatternError> {
        let raw = s.trim();
        if raw.is_empty() {
            return Err(PatternError::Empty);
        }
        if raw.len() > MAX_PATTERN_LEN {
            return Err(invalid(s, "longer than 255 bytes"));
        }
        let lower = raw.to_ascii_lowercase();
        let body = lower.strip_suffix('.').unwrap_or(&lower);
        if body.is_empty() {
            return Err(invalid(s, "no labels"));
        }
        let unbracketed = body.strip_prefix('[').and_then(|x| x.strip_suffix(']'));
        if unbracketed.is_some() || body.contains(':') {
            let ip = unbracketed.unwrap_or(body);
            if ip.parse::<Ipv6Addr>().is_err() {
                return Err(invalid(
                    s,
                    "':' is only allowed in IPv6 literals (no ports)",
                ));
            }
            return Ok(DomainPattern {
                text: ip.to_owned(),
                any_depth: false,
                labels: ip.split('.').map(|l| Label::Lit(l.to_owned())).collect(),
            });
        }
        if let Some(b) = body
            .bytes()
            .find(|&b| !(b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'*' | b'.')))
        {
            return Err(invalid(
                s,
                if b == b'/' {
                    "patterns name hosts, not URLs"
                } else {
                    "invalid character (allowed: letters, digits, '-', '_', '*', '.')"
                },
            ));
        }
        // Collapse runs of '*': they mean the same as one.
        let mut text = String::with_capacity(body.len());
        for c in body.chars() {
            if !(c == '*' && text.ends_with('*')) {
                text.push(c);
            }
        }
        let mut labels: Vec<&str> = text.split('.').collect();
        if labels.iter().any(|l| l.is_empty()) {
            return Err(invalid(
                s,
                "empty label (write '*.example.com' for subdomains, not '.example.com')",
            ));
        }
        let any_depth = labels.first() == Some(&"*");
        if any_depth {
            labels.remove(0);
        }
        let labels = labels
            .into_iter()
            .map(|l| {
                if l.contains('*') {
                    Label::Glob(l.split('*').map(str::to_owned).collect())
                } else {
                    Label::Lit(l.to_owned())
                }
            })
            .collect();
        Ok(DomainPattern {
            text,
            any_depth,
            labels,
        })
    }

    /// Whether `host` (no port; case and one trailing dot don't matter) matches.
    pub fn matches(&self, host: &str) -> bool {
        self.matches_normalized(&normalize_host(host))
    }

    /// The normalised pattern text.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub(crate) fn matches_normalized(&self, host: &str) -> bool {
        let mut host_labels = host.rsplit('.');
        for p in self.labels.iter().rev() {
            match host_labels.next() {
                Some(h) if p.matches(h) => {}
                _ => return false,
            }
        }
        host_labels.next().is_some() == self.any_depth
    }

    fn kind(&self) -> Kind {
        let literal_tail = self
            .labels
            .iter()
            .rev()
            .take_while(|l| matches!(l, Label::Lit(_)))
            .count();
        let all_literal = literal_tail == self.labels.len();
        match (self.any_depth, all_literal) {
            (true, true) if self.labels.is_empty() => Kind::Any,
            (true, true) => Kind::Suffix,
            (false, true) => Kind::Exact,
            (_, false) => Kind::Complex { literal_tail },
        }
    }

    /// For a complex pattern: its trailing literal labels joined with dots (may be empty).
    fn literal_suffix_key(&self, literal_tail: usize) -> String {
        let start = self.labels.len().saturating_sub(literal_tail);
        let mut key = String::new();
        for l in self.labels.iter().skip(start) {
            if !key.is_empty() {
                key.push('.');
            }
            key.push_str(&l.text());
        }
        key
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::str::FromStr for DomainPattern {
    type Err = PatternError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

enum Kind {
    Any,
    Exact,
    Suffix,
    Complex { literal_tail: usize },
}

/// Candidates sorted by rank.
type Candidates = Vec<(usize, DomainPattern)>;

/// The in-label wildcard patterns sharing one literal suffix, sub-indexed by the fixed start (or
/// end) of their rightmost wildcard label, so a lookup tests only patterns that can match.
#[derive(Debug, Clone, Default)]
pub(crate) struct Bucket {
    /// By the wildcard label's non-empty fixed prefix (`cdn*` → `cdn`).
    by_prefix: HashMap<String, Candidates>,
    max_prefix: usize,
    /// By its non-empty fixed suffix when it has no prefix (`*cdn` → `cdn`).
    by_suffix: HashMap<String, Candidates>,
    max_suffix: usize,
    /// Wildcard labels that start and end with `*`.
    rest: Candidates,
}

impl Bucket {
    fn push(&mut self, rank: usize, pattern: DomainPattern, literal_tail: usize) {
        let glob_at = pattern.labels.len().saturating_sub(literal_tail + 1);
        let (first, last) = match pattern.labels.get(glob_at) {
            Some(Label::Glob(parts)) => (
                parts.first().cloned().unwrap_or_default(),
                parts.last().cloned().unwrap_or_default(),
            ),
            _ => (String::new(), String::new()),
        };
        if !first.is_empty() {
            self.max_prefix = self.max_prefix.max(first.len());
            self.by_prefix
                .entry(first)
                .or_default()
                .push((rank, pattern));
        } else if !last.is_empty() {
            self.max_suffix = self.max_suffix.max(last.len());
            self.by_suffix
                .entry(last)
                .or_default()
                .push((rank, pattern));
        } else {
            self.rest.push((rank, pattern));
        }
    }

    fn finish(&mut self) {
        let tidy = |list: &mut Candidates| {
            list.sort_by_key(|(rank, _)| *rank);
            list.dedup_by(|a, b| a.1 == b.1);
        };
        self.by_prefix.values_mut().for_each(tidy);
        self.by_suffix.values_mut().for_each(tidy);
        tidy(&mut self.rest);
    }

    /// All patterns, for generators that want the flat list (sorted by rank).
    pub(crate) fn all(&self) -> Candidates {
        let mut v: Candidates = self
            .by_prefix
            .values()
            .chain(self.by_suffix.values())
            .flatten()
            .chain(self.rest.iter())
            .cloned()
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.text.cmp(&b.1.text)));
        v
    }

    /// Improves `best` with the best-ranked matching pattern. `label` is the host label that the
    /// patterns' rightmost wildcard label has to match.
    fn lookup(&self, host: &str, label: &str, best: &mut Option<usize>) {
        let scan = |list: &Candidates, best: &mut Option<usize>| {
            for (rank, pattern) in list {
                if best.is_some_and(|b| *rank >= b) {
                    break;
                }
                if pattern.matches_normalized(host) {
                    *best = Some(*rank);
                    break;
                }
            }
        };
        if !self.by_prefix.is_empty() {
            for end in 1..=self.max_prefix.min(label.len()) {
                if let Some(list) = label.get(..end).and_then(|p| self.by_prefix.get(p)) {
                    scan(list, best);
                }
            }
        }
        if !self.by_suffix.is_empty() {
            for len in 1..=self.max_suffix.min(label.len()) {
                let start = label.len() - len;
                if let Some(list) = label.get(start..).and_then(|p| self.by_suffix.get(p)) {
                    scan(list, best);
                }
            }
        }
        scan(&self.rest, best);
    }
}

/// One route as configured: the patterns that select it, its priority and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteEntry<T> {
    pub patterns: Vec<String>,
    pub priority: i32,
    pub value: T,
}

/// A compiled route table. Entries are ranked highest priority first, then in the order given;
/// a lookup returns the best-ranked entry with a matching pattern.
#[derive(Debug, Clone)]
pub struct RouteTable<T> {
    values: Vec<T>,
    /// rank → index into the original entries.
    pub(crate) rank_to_index: Vec<usize>,
    /// Normalised exact name → best rank.
    pub(crate) exact: HashMap<String, usize>,
    /// `*.name` keyed by `name` → best rank.
    pub(crate) suffix: HashMap<String, usize>,
    /// In-label wildcard patterns keyed by their trailing literal labels.
    pub(crate) complex: HashMap<String, Bucket>,
    /// Best rank of a `*` pattern.
    pub(crate) any: Option<usize>,
}

fn last_label(s: &str) -> &str {
    s.rsplit('.').next().unwrap_or(s)
}

fn keep_best(slot: &mut Option<usize>, rank: usize) {
    if slot.is_none_or(|b| rank < b) {
        *slot = Some(rank);
    }
}

impl<T> RouteTable<T> {
    /// Compiles `entries`. Entries are evaluated highest priority first; equal priority → earlier
    /// entry first (config order). Any invalid pattern fails the whole build.
    pub fn build(entries: Vec<RouteEntry<T>>) -> Result<Self, PatternError> {
        let (table, errors) = Self::build_lenient(entries);
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(table),
        }
    }

    /// Like [`RouteTable::build`], but skips invalid patterns (they never match) and returns
    /// their errors alongside the table, in entry order.
    pub fn build_lenient(entries: Vec<RouteEntry<T>>) -> (Self, Vec<PatternError>) {
        let mut order: Vec<usize> = (0..entries.len()).collect();
        // Stable sort: equal priorities keep config order.
        order.sort_by_key(|&i| std::cmp::Reverse(entries.get(i).map_or(i32::MIN, |e| e.priority)));
        let mut rank_of = vec![0usize; entries.len()];
        for (rank, &index) in order.iter().enumerate() {
            if let Some(slot) = rank_of.get_mut(index) {
                *slot = rank;
            }
        }

        let mut table = RouteTable {
            values: Vec::with_capacity(entries.len()),
            rank_to_index: order,
            exact: HashMap::new(),
            suffix: HashMap::new(),
            complex: HashMap::new(),
            any: None,
        };
        let mut errors = Vec::new();
        for (index, entry) in entries.into_iter().enumerate() {
            let rank = rank_of.get(index).copied().unwrap_or(index);
            for raw in &entry.patterns {
                match DomainPattern::parse(raw) {
                    Ok(p) => table.insert(p, rank),
                    Err(e) => errors.push(e),
                }
            }
            table.values.push(entry.value);
        }
        table.complex.values_mut().for_each(Bucket::finish);
        (table, errors)
    }

    fn insert(&mut self, pattern: DomainPattern, rank: usize) {
        fn best(map: &mut HashMap<String, usize>, key: String, rank: usize) {
            let slot = map.entry(key).or_insert(rank);
            *slot = (*slot).min(rank);
        }
        match pattern.kind() {
            Kind::Any => keep_best(&mut self.any, rank),
            Kind::Exact => best(&mut self.exact, pattern.text, rank),
            Kind::Suffix => {
                let key = pattern.literal_suffix_key(pattern.labels.len());
                best(&mut self.suffix, key, rank)
            }
            Kind::Complex { literal_tail } => {
                let key = pattern.literal_suffix_key(literal_tail);
                self.complex
                    .entry(key)
                    .or_default()
                    .push(rank, pattern, literal_tail);
            }
        }
    }

    /// The value of the winning entry for `host`, if any entry matches.
    pub fn lookup(&self, host: &str) -> Option<&T> {
        self.lookup_index(host).and_then(|i| self.values.get(i))
    }

    /// The index (into the entries given to [`RouteTable::build`]) of the winning entry.
    pub fn lookup_index(&self, host: &str) -> Option<usize> {
        let host = normalize_host(host);
        let rank = self.lookup_rank(&host)?;
        self.rank_to_index.get(rank).copied()
    }

    fn lookup_rank(&self, host: &str) -> Option<usize> {
        let mut best = self.any;
        if let Some(&r) = self.exact.get(host) {
            keep_best(&mut best, r);
        }
        // Every proper label suffix: "a.b.c" → "b.c", "c". `head` is what precedes it.
        for (dot, _) in host.match_indices('.') {
            let (Some(head), Some(suffix)) = (host.get(..dot), host.get(dot + 1..)) else {
                continue;
            };
            if let Some(&r) = self.suffix.get(suffix) {
                keep_best(&mut best, r);
            }
            if let Some(bucket) = self.complex.get(suffix) {
                bucket.lookup(host, last_label(head), &mut best);
            }
        }
        if let Some(bucket) = self.complex.get("") {
            bucket.lookup(host, last_label(host), &mut best);
        }
        best
    }

    /// Number of entries (matching or not).
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The entries' values, in the original order.
    pub fn values(&self) -> &[T] {
        &self.values
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use super::*;

    /// An independent reference matcher working on characters (not labels): the leading `*.`
    /// means "anything, then a dot", and `*` elsewhere matches any run of non-dot characters.
    pub(crate) fn reference_match(pattern: &str, host: &str) -> bool {
        fn norm(s: &str) -> String {
            let s = s.to_ascii_lowercase();
            let s = s.strip_suffix('.').unwrap_or(&s);
            let s = s
                .strip_prefix('[')
                .and_then(|x| x.strip_suffix(']'))
                .unwrap_or(s);
            s.to_owned()
        }
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
        let p = norm(pattern.trim());
        let h = norm(host);
        if p.trim_start_matches('*').is_empty() {
            return true;
        }
        let p_collapsed = {
            let mut t = String::new();
            for c in p.chars() {
                if !(c == '*' && t.ends_with('*')) {
                    t.push(c);
                }
            }
            t
        };
        if let Some(rest) = p_collapsed.strip_prefix("*.") {
            return h
                .match_indices('.')
                .any(|(i, _)| glob(rest.as_bytes(), &h.as_bytes()[i + 1..]));
        }
        glob(p_collapsed.as_bytes(), h.as_bytes())
    }

    /// Linear reference lookup: best (priority, order) entry with a matching pattern.
    pub(crate) fn reference_lookup(entries: &[(Vec<&str>, i32)], host: &str) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (i, (patterns, prio)) in entries.iter().enumerate() {
            if best.is_none_or(|b| *prio > entries[b].1)
                && patterns.iter().any(|p| reference_match(p, host))
            {
                best = Some(i);
            }
        }
        best
    }

    fn table(entries: &[(Vec<&str>, i32)]) -> RouteTable<usize> {
        RouteTable::build(
            entries
                .iter()
                .enumerate()
                .map(|(i, (p, prio))| RouteEntry {
                    patterns: p.iter().map(|s| s.to_string()).collect(),
                    priority: *prio,
                    value: i,
                })
                .collect(),
        )
        .unwrap()
    }

    fn m(p: &str, h: &str) -> bool {
        let pat = DomainPattern::parse(p).unwrap();
        let got = pat.matches(h);
        assert_eq!(
            got,
            reference_match(p, h),
            "pattern {p} host {h}: reference disagrees"
        );
        got
    }

    #[test]
    fn exact_patterns() {
        assert!(m("example.com", "example.com"));
        assert!(m("example.com", "EXAMPLE.Com"));
        assert!(m("example.com", "example.com."));
        assert!(m("Example.COM.", "example.com"));
        assert!(!m("example.com", "a.example.com"));
        assert!(!m("example.com", "example.co"));
        assert!(!m("example.com", "xexample.com"));
        assert!(!m("example.com", "example.com.."));
        assert!(!m("example.com", ""));
    }

    #[test]
    fn subdomain_patterns() {
        assert!(m("*.example.com", "a.example.com"));
        assert!(m("*.example.com", "a.b.example.com"));
        assert!(m("*.example.com", "A.B.Example.Com."));
        assert!(!m("*.example.com", "example.com"));
        assert!(!m("*.example.com", "aexample.com"));
        assert!(!m("*.example.com", "example.com.evil"));
        assert!(m("*.com", "x.com"));
        assert!(m("*.*.com", "a.b.com"));
        assert!(!m("*.*.com", "b.com"));
    }

    #[test]
    fn in_label_wildcards() {
        assert!(m("cdn*.example.com", "cdn.example.com"));
        assert!(m("cdn*.example.com", "cdn42.example.com"));
        assert!(!m("cdn*.example.com", "cdn.x.example.com"));
        assert!(!m("cdn*.example.com", "a.cdn1.example.com"));
        assert!(!m("cdn*.example.com", "xcdn1.example.com"));
        assert!(m("*cdn.example.com", "mycdn.example.com"));
        assert!(m("*cdn.example.com", "cdn.example.com"));
        assert!(!m("*cdn.example.com", "a.mycdn.example.com"));
        assert!(m("a*b*.x.com", "ab.x.com"));
        assert!(m("a*b*.x.com", "a1b2.x.com"));
        assert!(m("a*b*.x.com", "abbb.x.com"));
        assert!(!m("a*b*.x.com", "a1.x.com"));
        assert!(!m("a*b*.x.com", "ba.x.com"));
        assert!(m("a*a", "aa"));
        assert!(!m("a*a", "a"));
        assert!(m("a*b*c", "abc"));
        assert!(m("a*b*c", "axbxbxc"));
        assert!(!m("a*b*c", "acb"));
        assert!(m("www.*.com", "www.x.com"));
        assert!(!m("www.*.com", "www.com"));
        assert!(!m("www.*.com", "www.a.b.com"));
        assert!(m("api.*", "api.io"));
        assert!(!m("api.*", "api"));
        assert!(m("*.cdn*.net", "x.y.cdn7.net"));
        assert!(!m("*.cdn*.net", "cdn7.net"));
        assert!(m("a**b.com", "a-b.com"));
    }

    #[test]
    fn star_and_ips() {
        assert!(m("*", "anything.at.all"));
        assert!(m("*", "localhost"));
        assert!(m("*", ""));
        assert!(m("**", "x"));
        assert!(m("10.0.0.1", "10.0.0.1"));
        assert!(!m("10.0.0.1", "10.0.0.10"));
        assert!(m("::1", "::1"));
        assert!(m("[::1]", "::1"));
        assert!(m("::1", "[::1]"));
        assert!(m("2001:DB8::1", "2001:db8::1"));
        // Exact strings: no canonicalisation.
        assert!(!m("::1", "0:0:0:0:0:0:0:1"));
    }

    #[test]
    fn invalid_patterns() {
        assert_eq!(DomainPattern::parse(""), Err(PatternError::Empty));
        assert_eq!(DomainPattern::parse("   "), Err(PatternError::Empty));
        for p in [
            ".",
            ".example.com",
            "a..b",
            "example.com..",
            "example.com:443",
            "http://example.com",
            "example.com/path",
            "exa mple.com",
            "ex\"ample.com",
            "ex'ample.com",
            "a\nb",
            "bücher.de",
            "[example.com]",
            "[::1",
            "1.2.3.4:80",
            "[::1]:80",
            "\\x.com",
        ] {
            assert!(
                matches!(DomainPattern::parse(p), Err(PatternError::Invalid { .. })),
                "{p:?} should be invalid"
            );
        }
        assert!(DomainPattern::parse(&"a".repeat(256)).is_err());
        assert_eq!(
            DomainPattern::parse(" *.A.com ").unwrap().as_str(),
            "*.a.com"
        );
        assert_eq!(DomainPattern::parse("a**.com.").unwrap().as_str(), "a*.com");
        assert_eq!(DomainPattern::parse("[::1]").unwrap().as_str(), "::1");
    }

    #[test]
    fn priority_then_order() {
        let entries = vec![
            (vec!["*.example.com"], 0),
            (vec!["www.example.com"], 0),
            (vec!["*"], -10),
            (vec!["cdn*.example.com"], 5),
            (vec!["*.example.com", "other.org"], 5),
            (vec!["www.example.com"], 5),
        ];
        let t = table(&entries);
        let cases = [
            ("www.example.com", Some(4)),
            ("cdn1.example.com", Some(3)),
            ("a.example.com", Some(4)),
            ("other.org", Some(4)),
            ("nothing.net", Some(2)),
            ("example.com", Some(2)),
        ];
        for (host, want) in cases {
            assert_eq!(t.lookup_index(host), want, "{host}");
            assert_eq!(reference_lookup(&entries, host), want, "{host} (reference)");
            assert_eq!(t.lookup(host).copied(), want);
        }
        assert_eq!(t.len(), 6);
        assert!(!t.is_empty());
        let empty: RouteTable<()> = RouteTable::build(vec![]).unwrap();
        assert!(empty.is_empty());
        assert_eq!(empty.lookup("x"), None);
    }

    #[test]
    fn earlier_entry_wins_on_equal_priority_even_when_less_specific() {
        let entries = vec![(vec!["*"], 1), (vec!["a.com"], 1), (vec!["a.com"], 0)];
        let t = table(&entries);
        assert_eq!(t.lookup_index("a.com"), Some(0));
        let entries = vec![(vec!["a*.com"], 1), (vec!["*.com"], 1), (vec!["ab.com"], 1)];
        let t = table(&entries);
        assert_eq!(t.lookup_index("ab.com"), Some(0));
        assert_eq!(t.lookup_index("x.ab.com"), Some(1));
    }

    #[test]
    fn build_rejects_invalid_patterns() {
        let r = RouteTable::build(vec![RouteEntry {
            patterns: vec!["good.com".into(), "bad..com".into()],
            priority: 0,
            value: (),
        }]);
        assert!(matches!(r, Err(PatternError::Invalid { pattern, .. }) if pattern == "bad..com"));
    }

    /// Deterministic pseudo-random generator for the property tests.
    pub(crate) struct XorShift(pub u64);
    impl XorShift {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        pub(crate) fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
            xs[(self.next() % xs.len() as u64) as usize]
        }
    }

    pub(crate) fn random_name(rng: &mut XorShift, wild: bool) -> String {
        let atoms = ["a", "b", "ab", "ba", "cdn", "x", "A"];
        let n = 1 + rng.next() % 4;
        let mut labels = Vec::new();
        for i in 0..n {
            let mut l = String::new();
            for _ in 0..1 + rng.next() % 3 {
                if wild && rng.next().is_multiple_of(4) {
                    l.push('*');
                } else {
                    l.push_str(rng.pick(&atoms));
                }
            }
            if wild && i == 0 && rng.next().is_multiple_of(4) {
                l = "*".into();
            }
            labels.push(l);
        }
        labels.join(".")
    }

    #[test]
    fn compiled_table_agrees_with_reference_on_random_tables() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        for _ in 0..300 {
            let n = 1 + rng.next() % 8;
            let owned: Vec<(Vec<String>, i32)> = (0..n)
                .map(|_| {
                    let pats = (0..1 + rng.next() % 3)
                        .map(|_| random_name(&mut rng, true))
                        .collect();
                    (pats, (rng.next() % 3) as i32)
                })
                .collect();
            let entries: Vec<(Vec<&str>, i32)> = owned
                .iter()
                .map(|(p, prio)| (p.iter().map(String::as_str).collect(), *prio))
                .collect();
            let t = table(&entries);
            for _ in 0..40 {
                let mut host = random_name(&mut rng, false);
                if rng.next().is_multiple_of(5) {
                    host.push('.');
                }
                assert_eq!(
                    t.lookup_index(&host),
                    reference_lookup(&entries, &host),
                    "host {host} entries {entries:?}"
                );
            }
        }
    }

    #[test]
    fn hundred_thousand_patterns() {
        let n = 100_000;
        let mut owned: Vec<(Vec<String>, i32)> = Vec::with_capacity(n);
        for i in 0..n {
            let p = match i % 5 {
                0 => format!("host{i}.example{}.com", i % 100),
                1 => format!("*.svc{i}.net"),
                2 => format!("cdn{i}*.edge{}.org", i % 50),
                3 => format!("*.a{i}*b.zone{}.io", i % 10),
                _ => format!("*x{i}.wild"),
            };
            owned.push((vec![p], (i % 7) as i32));
        }
        owned.push((vec!["*.example7.com".into()], 3));
        owned.push((vec!["*".into()], -1));
        let entries: Vec<(Vec<&str>, i32)> = owned
            .iter()
            .map(|(p, prio)| (p.iter().map(String::as_str).collect(), *prio))
            .collect();
        let t = table(&entries);
        assert_eq!(t.len(), n + 2);
        let hosts = [
            "host0.example0.com",
            "host7.example7.com",
            "HOST99995.example95.com.",
            "x.host5.example5.com",
            "a.svc1.net",
            "a.b.svc99996.net",
            "svc1.net",
            "cdn2.edge2.org",
            "cdn2999.edge2.org",
            "cdn29992.edge42.org",
            "p.a3bb.zone3.io",
            "a3b.zone3.io",
            "q.a99998zzb.zone8.io",
            "qx4.wild",
            "x99999.wild",
            "unmatched.example",
            "y.example7.com",
        ];
        for host in hosts {
            let want = reference_lookup(&entries, host);
            assert_eq!(t.lookup_index(host), want, "{host}");
        }
        assert_eq!(t.lookup_index("cdn2.edge2.org"), Some(2));
        assert_eq!(t.lookup_index("unmatched.example"), Some(n + 1));
        assert_eq!(t.lookup_index("x99999.wild"), Some(99999));
    }
}

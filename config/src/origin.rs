//! Entries of `api.allowed_origins`, parsed once: validation reports the errors, and the
//! control plane's origin policy (`control/src/origin.rs`) matches requests against the parsed
//! patterns. Syntax (the spec's rules 1, 2, 5 and 6):
//!
//! - `*` alone: origin and Host checks are disabled; it must be the only entry.
//! - `[scheme://]host-pattern[:port]`: the host pattern is letters, digits, `-`, `.`, `_` and the
//!   shell-style wildcards `*` (any run of characters, dots included) and `?` (one character),
//!   or a bracketed IPv6 literal (no wildcards). The port is a literal number 1–65535.
//! - Rejected: a path, query or fragment, whitespace anywhere, an empty host, character classes
//!   (`[a-z]`), escapes or braces (invalid wildcards), wildcards in the scheme or the port.
//!
//! Hosts and schemes are stored lowercase (matching is case-insensitive).

use std::fmt;

/// One parsed `api.allowed_origins` entry other than the lone `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginPattern {
    /// Lowercase scheme when the entry is scheme-qualified (`https://…`).
    pub scheme: Option<String>,
    /// Lowercase host pattern; an IPv6 literal is kept in brackets (`[::1]`).
    pub host: String,
    /// Literal port, when the entry has one.
    pub port: Option<u16>,
}

/// The whole `api.allowed_origins` list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedOrigins {
    /// A lone `*`: no origin or Host verification.
    Any,
    /// Patterns that extend the built-in rules (same origin, IP literals, `localhost`).
    Patterns(Vec<OriginPattern>),
}

/// Why an entry (or the list) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginPatternError {
    #[error("empty entry")]
    Empty,
    #[error("`{0}` contains whitespace")]
    Whitespace(String),
    #[error("`{0}` has an invalid scheme")]
    Scheme(String),
    #[error("`{0}` has a path; give only [scheme://]host[:port]")]
    Path(String),
    #[error("`{0}` has no host")]
    NoHost(String),
    #[error("`{0}` has an invalid IPv6 host (write it as [2001:db8::1], without wildcards)")]
    Ipv6(String),
    #[error("`{0}` has an invalid wildcard: only `*` and `?` are supported (no [...] classes, braces or escapes)")]
    Wildcard(String),
    #[error("`{0}` has an invalid host pattern (letters, digits, `-`, `.`, `_` and the wildcards `*`, `?`)")]
    Host(String),
    #[error("`{0}` has an invalid port (ports are matched literally: a number from 1 to 65535, no wildcards)")]
    Port(String),
    #[error("`*` disables origin and Host checks and must be the only entry")]
    StarNotAlone,
}

impl OriginPattern {
    /// Parses one entry (not the lone `*`, see [`AllowedOrigins::parse`]).
    pub fn parse(entry: &str) -> Result<Self, OriginPatternError> {
        let e = || entry.to_owned();
        if entry.is_empty() {
            return Err(OriginPatternError::Empty);
        }
        if entry.chars().any(char::is_whitespace) {
            return Err(OriginPatternError::Whitespace(e()));
        }
        let (scheme, rest) = match entry.split_once("://") {
            Some((scheme, rest)) => {
                let ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                    && scheme
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
                if !ok {
                    return Err(OriginPatternError::Scheme(e()));
                }
                (Some(scheme.to_ascii_lowercase()), rest)
            }
            None => (None, entry),
        };
        if rest.contains(['/', '#']) {
            return Err(OriginPatternError::Path(e()));
        }
        let (host, port) = if let Some(r) = rest.strip_prefix('[') {
            match r.split_once(']') {
                Some((h, after)) if h.parse::<std::net::Ipv6Addr>().is_ok() => {
                    let port = match after {
                        "" => None,
                        a => Some(
                            a.strip_prefix(':')
                                .ok_or_else(|| OriginPatternError::Ipv6(e()))?,
                        ),
                    };
                    (format!("[{}]", h.to_ascii_lowercase()), port)
                }
                _ => {
                    // `[a-z]` is a character class, `[::*]` a wildcard in an address: both
                    // unsupported wildcard syntax; `[zz::]` just a bad address.
                    let inner = r.split(']').next().unwrap_or_default();
                    return Err(
                        if inner.contains(['*', '?']) || !inner.contains(':') || !r.contains(']') {
                            OriginPatternError::Wildcard(e())
                        } else {
                            OriginPatternError::Ipv6(e())
                        },
                    );
                }
            }
        } else {
            let (h, port) = match rest.rsplit_once(':') {
                Some((h, port)) => (h, Some(port)),
                None => (rest, None),
            };
            if h.is_empty() {
                return Err(OriginPatternError::NoHost(e()));
            }
            if h.contains(['[', ']', '{', '}', '\\', '!', '^']) {
                return Err(OriginPatternError::Wildcard(e()));
            }
            if h.contains(':') {
                return Err(OriginPatternError::Ipv6(e()));
            }
            if !h
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '*' | '?'))
            {
                return Err(OriginPatternError::Host(e()));
            }
            (h.to_ascii_lowercase(), port)
        };
        let port = match port {
            None => None,
            Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
                match p.parse::<u16>() {
                    Ok(n) if n > 0 => Some(n),
                    _ => return Err(OriginPatternError::Port(e())),
                }
            }
            Some(_) => return Err(OriginPatternError::Port(e())),
        };
        Ok(OriginPattern { scheme, host, port })
    }

    /// True when the host part has a wildcard.
    pub fn has_wildcard(&self) -> bool {
        self.host.contains(['*', '?'])
    }
}

impl fmt::Display for OriginPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(s) = &self.scheme {
            write!(f, "{s}://")?;
        }
        f.write_str(&self.host)?;
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

impl AllowedOrigins {
    /// Parses the list; `Err` has every refused entry as (index, error), index `None` for a
    /// problem of the list as a whole (`*` not alone).
    pub fn parse(entries: &[String]) -> Result<Self, Vec<(Option<usize>, OriginPatternError)>> {
        let has_star = entries.iter().any(|o| o == "*");
        let mut errors = Vec::new();
        if has_star && entries.len() > 1 {
            errors.push((None, OriginPatternError::StarNotAlone));
        }
        let mut patterns = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            if entry == "*" {
                continue;
            }
            match OriginPattern::parse(entry) {
                Ok(p) => patterns.push(p),
                Err(e) => errors.push((Some(i), e)),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(if has_star {
            AllowedOrigins::Any
        } else {
            AllowedOrigins::Patterns(patterns)
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn p(s: &str) -> OriginPattern {
        OriginPattern::parse(s).unwrap()
    }

    #[test]
    fn parses_the_forms() {
        let cases: &[(&str, Option<&str>, &str, Option<u16>)] = &[
            ("admin.example.com", None, "admin.example.com", None),
            (
                "Admin.Example.COM:8443",
                None,
                "admin.example.com",
                Some(8443),
            ),
            (
                "HTTPS://admin.example.com",
                Some("https"),
                "admin.example.com",
                None,
            ),
            ("*.ops.example:8443", None, "*.ops.example", Some(8443)),
            ("http://[::1]:8080", Some("http"), "[::1]", Some(8080)),
            ("[2001:DB8::1]", None, "[2001:db8::1]", None),
            ("cdn?.x.y", None, "cdn?.x.y", None),
            ("*:3000", None, "*", Some(3000)),
            (
                "chrome-extension://abcdef",
                Some("chrome-extension"),
                "abcdef",
                None,
            ),
        ];
        for (entry, scheme, host, port) in cases {
            let got = p(entry);
            assert_eq!(got.scheme.as_deref(), *scheme, "{entry}");
            assert_eq!(got.host, *host, "{entry}");
            assert_eq!(got.port, *port, "{entry}");
        }
        assert_eq!(p("HTTPS://A.b:1").to_string(), "https://a.b:1");
    }

    #[test]
    fn rejects_bad_entries_with_the_reason() {
        use OriginPatternError as E;
        type Check = fn(&E) -> bool;
        let cases: &[(&str, Check)] = &[
            ("", |e| matches!(e, E::Empty)),
            (" a.com", |e| matches!(e, E::Whitespace(_))),
            ("a.com ", |e| matches!(e, E::Whitespace(_))),
            ("a .com", |e| matches!(e, E::Whitespace(_))),
            ("a.com\t", |e| matches!(e, E::Whitespace(_))),
            ("a.com/", |e| matches!(e, E::Path(_))),
            ("https://a.com/x", |e| matches!(e, E::Path(_))),
            ("https://a.com#f", |e| matches!(e, E::Path(_))),
            ("://a.com", |e| matches!(e, E::Scheme(_))),
            ("ht*p://a.com", |e| matches!(e, E::Scheme(_))),
            ("1http://a.com", |e| matches!(e, E::Scheme(_))),
            ("https://", |e| matches!(e, E::NoHost(_))),
            (":8080", |e| matches!(e, E::NoHost(_))),
            ("a[b.com", |e| matches!(e, E::Wildcard(_))),
            ("[a-z].example.com", |e| matches!(e, E::Wildcard(_))),
            ("{a,b}.example.com", |e| matches!(e, E::Wildcard(_))),
            ("a\\*.example.com", |e| matches!(e, E::Wildcard(_))),
            ("[::*]:80", |e| matches!(e, E::Wildcard(_))),
            ("a.com:*", |e| matches!(e, E::Port(_))),
            ("a.com:80?", |e| matches!(e, E::Port(_))),
            ("a.com:", |e| matches!(e, E::Port(_))),
            ("a.com:x", |e| matches!(e, E::Port(_))),
            ("a.com:0", |e| matches!(e, E::Port(_))),
            ("a.com:99999", |e| matches!(e, E::Port(_))),
            ("a:b:c", |e| matches!(e, E::Ipv6(_))),
            ("[zz]:1", |e| matches!(e, E::Wildcard(_))),
            ("[zz::]:1", |e| matches!(e, E::Ipv6(_))),
            ("[::1]x", |e| matches!(e, E::Ipv6(_))),
            ("a%.com", |e| matches!(e, E::Host(_))),
            ("user@a.com", |e| matches!(e, E::Host(_))),
        ];
        for (entry, want) in cases {
            let err = OriginPattern::parse(entry).expect_err(entry);
            assert!(want(&err), "{entry:?}: {err:?}");
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn lone_star_and_list_errors() {
        assert_eq!(
            AllowedOrigins::parse(&["*".into()]),
            Ok(AllowedOrigins::Any)
        );
        assert_eq!(
            AllowedOrigins::parse(&[]),
            Ok(AllowedOrigins::Patterns(vec![]))
        );
        let errs = AllowedOrigins::parse(&["*".into(), "a.com".into()]).unwrap_err();
        assert_eq!(errs, vec![(None, OriginPatternError::StarNotAlone)]);
        let errs =
            AllowedOrigins::parse(&["ok.com".into(), "bad/".into(), " x".into()]).unwrap_err();
        assert_eq!(
            errs.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [Some(1), Some(2)]
        );
    }
}

//! Duration and size values as written in configuration files.
//!
//! # Durations
//!
//! [`Duration`] reads Go-style duration strings: a sequence of decimal numbers, each with an
//! optional fraction and a unit, e.g. `300ms`, `30s`, `1m30s`, `1.5h`, `2h45m`. Units:
//! `ns`, `us` (also `µs`/`μs`), `ms`, `s`, `m`, `h`, and — an extension over Go — `d`
//! (24 hours, e.g. `30d`). A bare integer (a YAML/JSON number or a string of digits) is a
//! number of **nanoseconds**, as in Go. Negative durations are rejected.
//!
//! A duration is printed the way Go prints it (`0s`, `300ms`, `1.5µs`, `1m30s`, `720h0m0s`);
//! hours are never folded into days, so output always parses back with Go as well.
//!
//! # Sizes
//!
//! [`Size`] reads byte sizes: a number with an optional unit, e.g. `512MiB`, `2GB`, `64 KiB`,
//! `1.5GiB`. Decimal units `KB`, `MB`, `GB`, `TB` are powers of **1000**; binary units
//! `KiB`, `MiB`, `GiB`, `TiB` (also `Ki`…`Ti`) and the single letters `K`, `M`, `G`, `T` are
//! powers of **1024**. `B` or no unit means bytes. Units are case-insensitive. A fraction is
//! allowed as long as the result is a whole number of bytes.
//!
//! A size is printed with the largest binary unit that divides it exactly (`64KiB`), else the
//! largest decimal unit that does (`2GB`), else as the exact byte count (`1536`). Serialized
//! sizes are always strings; both strings and integers are accepted on input.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A bad duration or size value. The message names the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    /// A duration string that could not be parsed.
    #[error("invalid duration {value:?}: {reason} (examples: 300ms, 30s, 1m30s, 2h45m, 30d)")]
    Duration {
        /// The text as written.
        value: String,
        /// Why it was refused.
        reason: String,
    },
    /// A size string that could not be parsed.
    #[error("invalid size {value:?}: {reason} (examples: 65536, 64KiB, 512MiB, 2GB)")]
    Size {
        /// The text as written.
        value: String,
        /// Why it was refused.
        reason: String,
    },
}

// ---------------------------------------------------------------------------------------------
// Duration
// ---------------------------------------------------------------------------------------------

/// A duration read from a Go-style duration string (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

const NANOS_PER_SEC: u128 = 1_000_000_000;

impl Duration {
    /// Zero duration.
    pub const ZERO: Duration = Duration(std::time::Duration::ZERO);

    /// `secs` seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Duration(std::time::Duration::from_secs(secs))
    }

    /// `ms` milliseconds.
    pub const fn from_millis(ms: u64) -> Self {
        Duration(std::time::Duration::from_millis(ms))
    }

    /// The std duration.
    pub const fn as_std(&self) -> std::time::Duration {
        self.0
    }

    /// True for a zero duration (often meaning "disabled / no limit").
    pub const fn is_zero(&self) -> bool {
        self.0.is_zero()
    }

    /// Parse a Go-style duration string (`1m30s`, `30d`, a bare integer = nanoseconds).
    pub fn parse(s: &str) -> Result<Self, UnitError> {
        parse_duration(s).map_err(|reason| UnitError::Duration {
            value: s.to_string(),
            reason,
        })
    }
}

impl From<std::time::Duration> for Duration {
    fn from(d: std::time::Duration) -> Self {
        Duration(d)
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

impl FromStr for Duration {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Duration::parse(s)
    }
}

fn parse_duration(input: &str) -> Result<Duration, String> {
    let s = input.trim();
    if s.is_empty() {
        return Err("empty value".into());
    }
    let s = match s.strip_prefix('+') {
        Some(rest) => rest,
        None => s,
    };
    if s.starts_with('-') {
        return Err("negative durations are not allowed".into());
    }
    // Bare integer: nanoseconds (Go's own rule for numbers; "0" is the usual case).
    if s.bytes().all(|b| b.is_ascii_digit()) {
        let ns: u128 = s.parse().map_err(|_| "number too large".to_string())?;
        return nanos_to_duration(ns);
    }

    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        // number: digits, optional '.', digits
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        if num.is_empty() {
            return Err(format!("expected a number at {rest:?}"));
        }
        let (int_part, frac_part) = match num.split_once('.') {
            Some((i, f)) => (i, f),
            None => (num, ""),
        };
        if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
            return Err(format!("malformed number {num:?}"));
        }
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let unit_ns: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => NANOS_PER_SEC,
            "m" => 60 * NANOS_PER_SEC,
            "h" => 3_600 * NANOS_PER_SEC,
            "d" => 86_400 * NANOS_PER_SEC,
            "" => return Err(format!("missing unit after {num:?}")),
            other => {
                return Err(format!(
                    "unknown unit {other:?} (use ns, us, ms, s, m, h or d)"
                ))
            }
        };
        let int: u128 = if int_part.is_empty() {
            0
        } else {
            int_part
                .parse()
                .map_err(|_| format!("number {int_part:?} too large"))?
        };
        let mut part = int
            .checked_mul(unit_ns)
            .ok_or_else(|| "value too large".to_string())?;
        if !frac_part.is_empty() {
            // Keep at most 18 fractional digits; beyond that nothing is representable anyway.
            let digits = &frac_part[..frac_part.len().min(18)];
            let frac: u128 = digits
                .parse()
                .map_err(|_| format!("malformed fraction {frac_part:?}"))?;
            let scale = 10u128.pow(digits.len() as u32);
            part = part
                .checked_add(frac * unit_ns / scale)
                .ok_or_else(|| "value too large".to_string())?;
        }
        total = total
            .checked_add(part)
            .ok_or_else(|| "value too large".to_string())?;
        rest = next;
    }
    nanos_to_duration(total)
}

fn nanos_to_duration(ns: u128) -> Result<Duration, String> {
    let secs = u64::try_from(ns / NANOS_PER_SEC).map_err(|_| "value too large".to_string())?;
    // ns % 1e9 < 1e9 always fits in u32.
    let sub = (ns % NANOS_PER_SEC) as u32;
    Ok(Duration(std::time::Duration::new(secs, sub)))
}

/// Write `v / 10^prec` with the fraction's trailing zeros (and a bare '.') removed.
fn write_frac(out: &mut String, v: u128, prec: u32) {
    let scale = 10u128.pow(prec);
    let int = v / scale;
    let frac = v % scale;
    out.push_str(&int.to_string());
    if frac != 0 {
        let mut digits = format!("{frac:0width$}", width = prec as usize);
        while digits.ends_with('0') {
            digits.pop();
        }
        out.push('.');
        out.push_str(&digits);
    }
}

impl fmt::Display for Duration {
    /// Go's `time.Duration.String()` format.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = self.0.as_nanos();
        let mut out = String::new();
        if ns == 0 {
            out.push_str("0s");
        } else if ns < 1_000 {
            out.push_str(&ns.to_string());
            out.push_str("ns");
        } else if ns < 1_000_000 {
            write_frac(&mut out, ns, 3);
            out.push_str("\u{b5}s");
        } else if ns < NANOS_PER_SEC {
            write_frac(&mut out, ns, 6);
            out.push_str("ms");
        } else {
            let secs_total = ns / NANOS_PER_SEC;
            let sub = ns % NANOS_PER_SEC;
            let hours = secs_total / 3600;
            let mins = (secs_total / 60) % 60;
            let secs = secs_total % 60;
            if hours > 0 {
                out.push_str(&format!("{hours}h{mins}m"));
            } else if mins > 0 {
                out.push_str(&format!("{mins}m"));
            }
            write_frac(&mut out, secs * NANOS_PER_SEC + sub, 9);
            out.push('s');
        }
        f.pad(&out)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string such as `30s` or `1m30s`, or an integer number of nanoseconds")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                Duration::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
                Ok(Duration(std::time::Duration::from_nanos(v)))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
                u64::try_from(v)
                    .map(|n| Duration(std::time::Duration::from_nanos(n)))
                    .map_err(|_| {
                        E::custom(format!(
                            "invalid duration {v}: negative durations are not allowed"
                        ))
                    })
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
                Err(E::custom(format!(
                    "invalid duration {v}: a bare number is nanoseconds and must be an integer; write a unit, e.g. `{v}s`"
                )))
            }
        }
        deserializer.deserialize_any(V)
    }
}

// ---------------------------------------------------------------------------------------------
// Size
// ---------------------------------------------------------------------------------------------

/// A byte size read from `2GB` / `512MiB` / a bare number of bytes (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Size(pub u64);

const KIB: u64 = 1024;
const MIB: u64 = KIB * 1024;
const GIB: u64 = MIB * 1024;
const TIB: u64 = GIB * 1024;
const KB: u64 = 1000;
const MB: u64 = KB * 1000;
const GB: u64 = MB * 1000;
const TB: u64 = GB * 1000;

impl Size {
    /// Zero bytes.
    pub const ZERO: Size = Size(0);

    /// `n` bytes.
    pub const fn bytes(n: u64) -> Self {
        Size(n)
    }

    /// `n` KiB.
    pub const fn kib(n: u64) -> Self {
        Size(n * KIB)
    }

    /// `n` MiB.
    pub const fn mib(n: u64) -> Self {
        Size(n * MIB)
    }

    /// `n` GiB.
    pub const fn gib(n: u64) -> Self {
        Size(n * GIB)
    }

    /// The number of bytes.
    pub const fn as_u64(&self) -> u64 {
        self.0
    }

    /// True for zero (often meaning "unlimited").
    pub const fn is_zero(&self) -> bool {
        self.0 == 0
    }

    /// Parse a size string (`64KiB`, `2GB`, `1.5GiB`, a bare number = bytes).
    pub fn parse(s: &str) -> Result<Self, UnitError> {
        parse_size(s).map_err(|reason| UnitError::Size {
            value: s.to_string(),
            reason,
        })
    }
}

impl From<u64> for Size {
    fn from(n: u64) -> Self {
        Size(n)
    }
}

impl FromStr for Size {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Size::parse(s)
    }
}

fn parse_size(input: &str) -> Result<Size, String> {
    let s = input.trim();
    if s.is_empty() {
        return Err("empty value".into());
    }
    if s.starts_with('-') {
        return Err("negative sizes are not allowed".into());
    }
    let num_len = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(num_len);
    let unit = unit.trim();
    if num.is_empty() {
        return Err("expected a number".into());
    }
    let mult = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => KIB,
        "m" | "mi" | "mib" => MIB,
        "g" | "gi" | "gib" => GIB,
        "t" | "ti" | "tib" => TIB,
        "kb" => KB,
        "mb" => MB,
        "gb" => GB,
        "tb" => TB,
        _ => {
            return Err(format!(
                "unknown unit {unit:?} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, K, M, G, T)"
            ))
        }
    };
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if (int_part.is_empty() && frac_part.is_empty()) || frac_part.contains('.') {
        return Err(format!("malformed number {num:?}"));
    }
    if frac_part.len() > 12 {
        return Err("too many fractional digits".into());
    }
    let int: u128 = if int_part.is_empty() {
        0
    } else {
        int_part
            .parse()
            .map_err(|_| "number too large".to_string())?
    };
    let frac: u128 = if frac_part.is_empty() {
        0
    } else {
        frac_part
            .parse()
            .map_err(|_| format!("malformed fraction {frac_part:?}"))?
    };
    let scale = 10u128.pow(frac_part.len() as u32);
    let scaled = int
        .checked_mul(scale)
        .and_then(|v| v.checked_add(frac))
        .and_then(|v| v.checked_mul(u128::from(mult)))
        .ok_or_else(|| "value too large".to_string())?;
    if scaled % scale != 0 {
        return Err("not a whole number of bytes".into());
    }
    u64::try_from(scaled / scale)
        .map(Size)
        .map_err(|_| "value too large".to_string())
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        if n == 0 {
            return f.pad("0");
        }
        let units: [(u64, &str); 8] = [
            (TIB, "TiB"),
            (GIB, "GiB"),
            (MIB, "MiB"),
            (KIB, "KiB"),
            (TB, "TB"),
            (GB, "GB"),
            (MB, "MB"),
            (KB, "KB"),
        ];
        // The exact unit giving the smallest number; binary units win ties.
        let best = units
            .iter()
            .filter(|(mult, _)| n.is_multiple_of(*mult))
            .min_by_key(|(mult, _)| n / mult);
        match best {
            Some((mult, name)) => f.pad(&format!("{}{name}", n / mult)),
            None => f.pad(&n.to_string()),
        }
    }
}

impl Serialize for Size {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a size such as `64KiB` or `2GB`, or an integer number of bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Size, E> {
                Size::parse(v).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Size, E> {
                Ok(Size(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Size, E> {
                u64::try_from(v).map(Size).map_err(|_| {
                    E::custom(format!("invalid size {v}: negative sizes are not allowed"))
                })
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Size, E> {
                Err(E::custom(format!(
                    "invalid size {v}: a bare number is bytes and must be an integer"
                )))
            }
        }
        deserializer.deserialize_any(V)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration as Std;

    fn d(s: &str) -> Std {
        Duration::parse(s).unwrap().0
    }

    #[test]
    fn duration_parse_go_forms() {
        assert_eq!(d("300ms"), Std::from_millis(300));
        assert_eq!(d("30s"), Std::from_secs(30));
        assert_eq!(d("1m30s"), Std::from_secs(90));
        assert_eq!(d("1h"), Std::from_secs(3600));
        assert_eq!(d("2h45m"), Std::from_secs(2 * 3600 + 45 * 60));
        assert_eq!(d("30d"), Std::from_secs(30 * 86_400));
        assert_eq!(d("1.5h"), Std::from_secs(5400));
        assert_eq!(d(".5s"), Std::from_millis(500));
        assert_eq!(d("10us"), Std::from_micros(10));
        assert_eq!(d("10µs"), Std::from_micros(10));
        assert_eq!(d("10μs"), Std::from_micros(10));
        assert_eq!(d("7ns"), Std::from_nanos(7));
        assert_eq!(d("1h1m1s1ms1us1ns"), Std::new(3661, 1_001_001));
        assert_eq!(d(" +5s "), Std::from_secs(5));
    }

    #[test]
    fn duration_bare_number_is_nanoseconds() {
        assert_eq!(d("0"), Std::ZERO);
        assert_eq!(d("1500"), Std::from_nanos(1500));
        assert_eq!(d("30000000000"), Std::from_secs(30));
    }

    #[test]
    fn duration_errors_name_the_value() {
        for bad in [
            "", "abc", "5", "5x", "s", "-5s", "1..5s", "5 s", "1.2.3s", "1e3s",
        ] {
            if bad == "5" {
                continue; // bare integer is valid (nanoseconds)
            }
            let err = Duration::parse(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
        assert!(Duration::parse("99999999999999999999999h").is_err());
    }

    #[test]
    fn duration_display_go_style() {
        let cases: &[(Std, &str)] = &[
            (Std::ZERO, "0s"),
            (Std::from_nanos(7), "7ns"),
            (Std::from_nanos(1500), "1.5µs"),
            (Std::from_micros(10), "10µs"),
            (Std::from_millis(300), "300ms"),
            (Std::from_micros(1500), "1.5ms"),
            (Std::from_secs(1), "1s"),
            (Std::from_millis(1500), "1.5s"),
            (Std::from_secs(90), "1m30s"),
            (Std::from_secs(60), "1m0s"),
            (Std::from_secs(3600), "1h0m0s"),
            (Std::from_secs(30 * 86_400), "720h0m0s"),
            (Std::from_secs(168 * 3600), "168h0m0s"),
            (Std::new(3661, 1), "1h1m1.000000001s"),
        ];
        for (v, want) in cases {
            assert_eq!(Duration(*v).to_string(), *want);
            // and everything printed parses back
            assert_eq!(Duration::parse(want).unwrap().0, *v, "{want}");
        }
    }

    #[test]
    fn duration_serde() {
        let v: Duration = serde_json::from_str("\"1m30s\"").unwrap();
        assert_eq!(v, Duration::from_secs(90));
        let v: Duration = serde_json::from_str("1000000000").unwrap();
        assert_eq!(v, Duration::from_secs(1));
        assert!(serde_json::from_str::<Duration>("-1").is_err());
        assert!(serde_json::from_str::<Duration>("1.5").is_err());
        assert_eq!(
            serde_json::to_string(&Duration::from_secs(90)).unwrap(),
            "\"1m30s\""
        );
    }

    #[test]
    fn size_parse() {
        let s = |t: &str| Size::parse(t).unwrap().0;
        assert_eq!(s("0"), 0);
        assert_eq!(s("1234"), 1234);
        assert_eq!(s("10B"), 10);
        assert_eq!(s("2GB"), 2_000_000_000);
        assert_eq!(s("2gb"), 2_000_000_000);
        assert_eq!(s("50GB"), 50_000_000_000);
        assert_eq!(s("1KB"), 1000);
        assert_eq!(s("1MB"), 1_000_000);
        assert_eq!(s("1TB"), 1_000_000_000_000);
        assert_eq!(s("64KiB"), 65536);
        assert_eq!(s("64 KiB"), 65536);
        assert_eq!(s("512MiB"), 512 << 20);
        assert_eq!(s("1GiB"), 1 << 30);
        assert_eq!(s("1TiB"), 1 << 40);
        assert_eq!(s("1K"), 1024);
        assert_eq!(s("1M"), 1 << 20);
        assert_eq!(s("1G"), 1 << 30);
        assert_eq!(s("1Mi"), 1 << 20);
        assert_eq!(s("1.5GiB"), 3 << 29);
        assert_eq!(s("0.5KB"), 500);
    }

    #[test]
    fn size_errors_name_the_value() {
        for bad in ["", "abc", "12XB", "-1", "1.5B", "1..2KB", "99999999999TB"] {
            let err = Size::parse(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }

    #[test]
    fn size_display() {
        assert_eq!(Size(0).to_string(), "0");
        assert_eq!(Size(65536).to_string(), "64KiB");
        assert_eq!(Size(1 << 30).to_string(), "1GiB");
        assert_eq!(Size(2_000_000_000).to_string(), "2GB");
        assert_eq!(Size(1536).to_string(), "1536");
        assert_eq!(Size(1).to_string(), "1");
        assert_eq!(Size(3 << 40).to_string(), "3TiB");
        assert_eq!(Size(1_024_000).to_string(), "1000KiB");
        assert_eq!(Size(50_000_000_000).to_string(), "50GB");
        assert_eq!(Size(1000).to_string(), "1KB");
        for n in [0u64, 1, 1000, 1024, 1536, 65536, 2_000_000_000, u64::MAX] {
            assert_eq!(Size::parse(&Size(n).to_string()).unwrap(), Size(n));
        }
    }

    #[test]
    fn size_serde() {
        assert_eq!(
            serde_json::from_str::<Size>("\"64KiB\"").unwrap(),
            Size(65536)
        );
        assert_eq!(serde_json::from_str::<Size>("4096").unwrap(), Size(4096));
        assert!(serde_json::from_str::<Size>("-4").is_err());
        assert_eq!(serde_json::to_string(&Size(65536)).unwrap(), "\"64KiB\"");
        assert_eq!(serde_json::to_string(&Size(1536)).unwrap(), "\"1536\"");
    }
}

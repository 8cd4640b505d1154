//! Subtitle file formats: SubRip ([`srt`]) and WebVTT ([`vtt`]), parsed into [`Cue`]s and emitted
//! back. Runtime-free; no I/O.
//!
//! Parsing is lenient where real files are sloppy (BOM, CRLF or CR line ends, `,` or `.` before
//! the milliseconds, one- to three-digit fractions, missing hours, missing blank lines between
//! SRT cues, hours above 99) and strict where guessing would corrupt timing (minutes or seconds
//! above 59, garbage timing lines are skipped with their cue).

pub mod srt;
pub mod vtt;

use serde::Serialize;

/// One timed subtitle: times in milliseconds from the start of the media, text with `\n`
/// between lines (markup removed, entities decoded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cue {
    pub start_ms: u64,
    pub end_ms: u64,
    pub text: String,
}

/// Which format a text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Srt,
    Vtt,
}

/// Largest accepted timestamp (sanity bound: 10 000 hours), so arithmetic never overflows.
pub const MAX_TIMESTAMP_MS: u64 = 10_000 * 3_600_000;

/// Removes a UTF-8 byte order mark and turns CRLF / CR line ends into LF.
pub fn normalize(text: &str) -> String {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.replace("\r\n", "\n").replace('\r', "\n")
}

/// Tells WebVTT (starts with `WEBVTT`) from SubRip (has a `-->` timing line); `None` for
/// anything else.
pub fn detect(text: &str) -> Option<Format> {
    let t = text.strip_prefix('\u{feff}').unwrap_or(text).trim_start();
    if vtt::has_header(t) {
        return Some(Format::Vtt);
    }
    let has_timing = t
        .lines()
        .take(50)
        .any(|l| l.contains("-->") && srt::parse_timing_line(l).is_some());
    has_timing.then_some(Format::Srt)
}

/// Parses either format (detected); empty when neither.
pub fn parse_any(text: &str) -> Option<Vec<Cue>> {
    match detect(text)? {
        Format::Srt => Some(srt::parse(text)),
        Format::Vtt => Some(vtt::parse(text)),
    }
}

/// Parses `[H…:]MM:SS[,.]f` (1–3 fraction digits, any number of hour digits up to the sanity
/// bound) into milliseconds.
pub fn parse_timestamp(s: &str) -> Option<u64> {
    let s = s.trim();
    let (clock, frac) = match s.rfind([',', '.']) {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, ""),
    };
    let has_separator = clock.len() < s.len();
    if (has_separator && frac.is_empty())
        || frac.len() > 3
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let ms = if frac.is_empty() {
        0
    } else {
        // "5" is 500 ms, "05" is 50 ms: a decimal fraction of a second.
        let v: u64 = frac.parse().ok()?;
        v * 10u64.pow(3 - frac.len() as u32)
    };
    let parts: Vec<&str> = clock.split(':').collect();
    let (h, m, sec) = match parts.as_slice() {
        [m, s] => ("0", *m, *s),
        [h, m, s] => (*h, *m, *s),
        _ => return None,
    };
    let digits = |x: &str, max_len: usize| {
        !x.is_empty() && x.len() <= max_len && x.bytes().all(|b| b.is_ascii_digit())
    };
    if !digits(h, 6) || !digits(m, 2) || !digits(sec, 2) {
        return None;
    }
    let (h, m, sec): (u64, u64, u64) = (h.parse().ok()?, m.parse().ok()?, sec.parse().ok()?);
    if m > 59 || sec > 59 {
        return None;
    }
    let total = ((h * 60 + m) * 60 + sec) * 1000 + ms;
    (total <= MAX_TIMESTAMP_MS).then_some(total)
}

/// `HH:MM:SS{sep}mmm`; hours take as many digits as they need (`123:00:00,000`).
pub fn format_timestamp(ms: u64, sep: char) -> String {
    let h = ms / 3_600_000;
    let m = ms / 60_000 % 60;
    let s = ms / 1000 % 60;
    let f = ms % 1000;
    format!("{h:02}:{m:02}:{s:02}{sep}{f:03}")
}

/// Cue text made safe for a block format: no empty lines inside (they would end the cue),
/// no leading/trailing whitespace per line.
fn block_lines(text: &str) -> impl Iterator<Item = &str> {
    text.lines().map(str::trim).filter(|l| !l.is_empty())
}

/// Seconds as the JSON API gives them (`1.5` for 1500 ms).
pub fn ms_to_seconds(ms: u64) -> f64 {
    ms as f64 / 1000.0
}

/// Seconds from a JSON document (e.g. a transcription) to milliseconds; `None` when negative,
/// not finite or beyond the sanity bound.
pub fn seconds_to_ms(s: f64) -> Option<u64> {
    if !s.is_finite() || s < 0.0 {
        return None;
    }
    let ms = (s * 1000.0).round();
    (ms <= MAX_TIMESTAMP_MS as f64).then_some(ms as u64)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_in_every_form() {
        assert_eq!(parse_timestamp("00:00:01,500"), Some(1500));
        assert_eq!(parse_timestamp("00:00:01.500"), Some(1500));
        assert_eq!(parse_timestamp("01:02:03,004"), Some(3_723_004));
        assert_eq!(parse_timestamp("02:03.004"), Some(123_004));
        assert_eq!(parse_timestamp("0:00:01,5"), Some(1500));
        assert_eq!(parse_timestamp("0:00:01,05"), Some(1050));
        assert_eq!(parse_timestamp("00:00:07"), Some(7000));
        assert_eq!(parse_timestamp("123:00:00,000"), Some(123 * 3_600_000));
        assert_eq!(parse_timestamp(" 00:00:01,000 "), Some(1000));
    }

    #[test]
    fn bad_timestamps_are_refused() {
        for bad in [
            "",
            "00:60:00,000",
            "00:00:60,000",
            "00:00:01,0000",
            "aa:00:01,000",
            "1:2:3:4,000",
            "00:00:-1,000",
            "99999999:00:00,000",
            "00:00:01,",
            "5",
        ] {
            assert_eq!(parse_timestamp(bad), None, "{bad:?}");
        }
        assert_eq!(parse_timestamp("10001:00:00.000"), None, "sanity bound");
    }

    #[test]
    fn timestamps_format_with_wide_hours() {
        assert_eq!(format_timestamp(1500, ','), "00:00:01,500");
        assert_eq!(format_timestamp(3_723_004, '.'), "01:02:03.004");
        assert_eq!(format_timestamp(123 * 3_600_000 + 1, ','), "123:00:00,001");
        for ms in [0, 1, 59_999, 3_600_000, 100 * 3_600_000 + 61_001] {
            assert_eq!(parse_timestamp(&format_timestamp(ms, ',')), Some(ms));
        }
    }

    #[test]
    fn detection() {
        assert_eq!(
            detect("\u{feff}WEBVTT\n\n00:01.000 --> 00:02.000\nhi"),
            Some(Format::Vtt)
        );
        assert_eq!(
            detect("1\r\n00:00:01,000 --> 00:00:02,000\r\nhi"),
            Some(Format::Srt)
        );
        assert_eq!(detect("<html><body>nothing</body></html>"), None);
        assert_eq!(detect("WEBVTTX\n"), None);
    }

    #[test]
    fn seconds_conversions() {
        assert_eq!(seconds_to_ms(1.2345), Some(1235));
        assert_eq!(seconds_to_ms(-1.0), None);
        assert_eq!(seconds_to_ms(f64::NAN), None);
        assert_eq!(seconds_to_ms(1e300), None);
        assert_eq!(ms_to_seconds(1500), 1.5);
    }
}

//! Range requests answered from a cached representation (RFC 9110 §14): which bytes to send,
//! the `Content-Range` values, the `multipart/byteranges` layout and `If-Range`.
//!
//! [`evaluate`] decides between a full `200`, a `206` with one or more ranges and a `416`:
//!
//! * no `Range`, a unit other than `bytes` (case-insensitive), or any syntax error in the set
//!   (`bytes=5-1`, `bytes=a-b`, `bytes 0-1`, spaces inside a range) → [`RangeAnswer::Full`]:
//!   the header is ignored, which RFC 9110 always allows;
//! * `first-last` (the end clamped to the last byte), `first-` (to the end) and `-suffix` (the
//!   last `suffix` bytes, the whole representation when longer) are supported; whitespace
//!   around list elements and empty list elements are accepted;
//! * numbers too large for 64 bits saturate: a huge first position is past the end, a huge
//!   last position or suffix means "to the end";
//! * ranges that start past the end and `-0` are unsatisfiable; when none is satisfiable →
//!   [`RangeAnswer::Unsatisfiable`] (`416` with [`unsatisfied_range`]);
//! * the satisfiable ranges are sorted and overlapping or adjacent ones merged (so a client
//!   cannot make the server send bytes twice); parts are therefore sent in ascending order;
//! * more than [`MAX_RANGES`] range specs → [`RangeAnswer::Full`] (range abuse: thousands of
//!   tiny ranges cost far more than one plain response);
//! * an empty representation → [`RangeAnswer::Full`] (an empty `200`).

/// Most range specs honoured in one `Range` header; more → the header is ignored.
pub const MAX_RANGES: usize = 32;

/// Bytes `start..=end` of a representation (both inclusive, `start <= end`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ByteRange {
    /// First byte offset.
    pub start: u64,
    /// Last byte offset, inclusive.
    pub end: u64,
}

impl ByteRange {
    /// Number of bytes in the range.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start).saturating_add(1)
    }

    /// Never true for a well-formed range (`start <= end`); present for API symmetry.
    pub fn is_empty(&self) -> bool {
        self.end < self.start
    }
}

/// How to answer a request given its `Range` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeAnswer {
    /// Send the whole representation with `200`.
    Full,
    /// Send these ranges (sorted, disjoint, non-adjacent, at least one) with `206`: one range
    /// with `Content-Range`, several as `multipart/byteranges`.
    Partial(Vec<ByteRange>),
    /// `416 Range Not Satisfiable` with `Content-Range: bytes */total`.
    Unsatisfiable,
}

/// One parsed range spec.
enum Spec {
    /// `first-` or `first-last`
    From(u64, Option<u64>),
    /// `-suffix`
    Suffix(u64),
}

/// Decides how to answer a `Range` header for a representation of `total_len` bytes. See the
/// [module docs](self).
pub fn evaluate(range_header: Option<&[u8]>, total_len: u64) -> RangeAnswer {
    let Some(value) = range_header else {
        return RangeAnswer::Full;
    };
    let Some(specs) = parse(value) else {
        return RangeAnswer::Full;
    };
    if total_len == 0 {
        return RangeAnswer::Full;
    }
    let last = total_len - 1;
    let mut ranges: Vec<ByteRange> = specs
        .into_iter()
        .filter_map(|spec| match spec {
            Spec::From(first, _) if first > last => None,
            Spec::From(first, end) => Some(ByteRange {
                start: first,
                end: end.map_or(last, |e| e.min(last)),
            }),
            Spec::Suffix(0) => None,
            Spec::Suffix(n) => Some(ByteRange {
                start: total_len.saturating_sub(n),
                end: last,
            }),
        })
        .collect();
    if ranges.is_empty() {
        return RangeAnswer::Unsatisfiable;
    }
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<ByteRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match merged.last_mut() {
            Some(prev) if r.start <= prev.end.saturating_add(1) => {
                prev.end = prev.end.max(r.end);
            }
            _ => merged.push(r),
        }
    }
    RangeAnswer::Partial(merged)
}

/// Parses `bytes=spec, spec…`; `None` for any syntax error, another unit, no specs or more
/// than [`MAX_RANGES`].
fn parse(value: &[u8]) -> Option<Vec<Spec>> {
    let value = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
    let (unit, set) = value.split_once('=')?;
    if !unit.eq_ignore_ascii_case("bytes") {
        return None;
    }
    let mut specs = Vec::new();
    for element in set.split(',') {
        let element = element.trim_matches([' ', '\t']);
        if element.is_empty() {
            continue;
        }
        if specs.len() == MAX_RANGES {
            return None;
        }
        let (first, last) = element.split_once('-')?;
        let spec = match (first.is_empty(), last.is_empty()) {
            (true, true) => return None,
            (true, false) => Spec::Suffix(digits(last)?),
            (false, true) => Spec::From(digits(first)?, None),
            (false, false) => {
                let (f, l) = (digits(first)?, digits(last)?);
                if l < f {
                    return None;
                }
                Spec::From(f, Some(l))
            }
        };
        specs.push(spec);
    }
    if specs.is_empty() {
        None
    } else {
        Some(specs)
    }
}

/// A non-empty run of ASCII digits, saturating at `u64::MAX`.
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(s.bytes().fold(0u64, |n, b| {
        n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
    }))
}

/// The `Content-Range` value of a `206` part: `bytes 0-99/1000`.
pub fn content_range(r: ByteRange, total: u64) -> String {
    format!("bytes {}-{}/{}", r.start, r.end, total)
}

/// The `Content-Range` value of a `416`: `bytes */1000`.
pub fn unsatisfied_range(total: u64) -> String {
    format!("bytes */{total}")
}

/// How to send several ranges as one `multipart/byteranges` body (RFC 9110 §14.6): for each
/// part, send its prefix then the part's bytes; after the last part, send the trailer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultipartPlan {
    /// The response's `Content-Type`: `multipart/byteranges; boundary=…`.
    pub content_type: String,
    /// Per part: the bytes before the part body (delimiter line and part headers), and the
    /// range of the representation to send after them.
    pub parts: Vec<(Vec<u8>, ByteRange)>,
    /// The close delimiter sent after the last part body.
    pub trailer: Vec<u8>,
    /// The whole body's length (the response's `Content-Length`).
    pub content_length: u64,
}

/// Lays out a `multipart/byteranges` body for `ranges` of a `total`-byte representation of
/// type `content_type` (each part gets a `Content-Type` line when given). `boundary` must be
/// 1–70 characters that occur in none of the parts (see [`boundary`]).
///
/// Layout: `--B CRLF Content-Type: … CRLF Content-Range: bytes a-b/total CRLF CRLF <bytes>`,
/// then `CRLF --B CRLF …` for every further part, then `CRLF --B-- CRLF`.
pub fn multipart(
    ranges: &[ByteRange],
    total: u64,
    content_type: Option<&str>,
    boundary: &str,
) -> MultipartPlan {
    let mut parts = Vec::with_capacity(ranges.len());
    let mut content_length: u64 = 0;
    for (i, r) in ranges.iter().enumerate() {
        let mut prefix = Vec::with_capacity(96 + boundary.len());
        if i > 0 {
            prefix.extend_from_slice(b"\r\n");
        }
        prefix.extend_from_slice(b"--");
        prefix.extend_from_slice(boundary.as_bytes());
        prefix.extend_from_slice(b"\r\n");
        if let Some(ct) = content_type {
            prefix.extend_from_slice(b"Content-Type: ");
            prefix.extend_from_slice(ct.as_bytes());
            prefix.extend_from_slice(b"\r\n");
        }
        prefix.extend_from_slice(b"Content-Range: ");
        prefix.extend_from_slice(content_range(*r, total).as_bytes());
        prefix.extend_from_slice(b"\r\n\r\n");
        content_length = content_length
            .saturating_add(prefix.len() as u64)
            .saturating_add(r.len());
        parts.push((prefix, *r));
    }
    let trailer = format!("\r\n--{boundary}--\r\n").into_bytes();
    content_length = content_length.saturating_add(trailer.len() as u64);
    MultipartPlan {
        content_type: format!("multipart/byteranges; boundary={boundary}"),
        parts,
        trailer,
        content_length,
    }
}

/// A multipart boundary from 64 random bits (`sy` + 16 hex digits). A boundary must not
/// occur in the parts; with 64 random bits chosen per response that is not a practical
/// concern.
pub fn boundary(random: u64) -> String {
    format!("sy{random:016x}")
}

/// Whether the range request may be honoured given its `If-Range` (RFC 9110 §13.1.5): no
/// `If-Range` → true; an entity tag → true only if it is strong and byte-equal to the
/// entry's strong `ETag`; a date → true only if it equals the entry's `Last-Modified`.
/// False means: send the full representation with `200`.
pub fn if_range_matches(
    if_range: Option<&[u8]>,
    etag: Option<&[u8]>,
    last_modified: Option<&[u8]>,
) -> bool {
    let Some(cond) = if_range else {
        return true;
    };
    let cond = trim(cond);
    if cond.starts_with(b"\"") || cond.starts_with(b"W/") {
        // Weak tags never match in a strong comparison.
        if cond.starts_with(b"W/") || cond.len() < 2 || !cond.ends_with(b"\"") {
            return false;
        }
        return etag
            .map(trim)
            .is_some_and(|e| e.starts_with(b"\"") && e == cond);
    }
    let Some(lm) = last_modified.map(trim) else {
        return false;
    };
    match (
        super::policy::parse_http_date(cond),
        super::policy::parse_http_date(lm),
    ) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t'));
    let end = v.iter().rposition(|b| !matches!(b, b' ' | b'\t'));
    match (start, end) {
        (Some(s), Some(e)) => v.get(s..=e).unwrap_or_default(),
        _ => &[],
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64) -> ByteRange {
        ByteRange { start, end }
    }

    fn eval(h: &str, total: u64) -> RangeAnswer {
        evaluate(Some(h.as_bytes()), total)
    }

    fn partial(v: &[(u64, u64)]) -> RangeAnswer {
        RangeAnswer::Partial(v.iter().map(|&(s, e)| r(s, e)).collect())
    }

    #[test]
    fn single_ranges() {
        assert_eq!(evaluate(None, 100), RangeAnswer::Full);
        assert_eq!(eval("bytes=0-99", 1000), partial(&[(0, 99)]));
        assert_eq!(eval("bytes=5-", 10), partial(&[(5, 9)]));
        assert_eq!(eval("bytes=0-0", 10), partial(&[(0, 0)]));
        assert_eq!(eval("bytes=9-9", 10), partial(&[(9, 9)]));
        assert_eq!(eval("bytes=5-500", 10), partial(&[(5, 9)]));
        assert_eq!(eval("bytes=-1", 10), partial(&[(9, 9)]));
        assert_eq!(eval("bytes=-3", 10), partial(&[(7, 9)]));
        assert_eq!(eval("bytes=-30", 10), partial(&[(0, 9)]));
        assert_eq!(eval("bytes=0-", 10), partial(&[(0, 9)]));
        assert_eq!(eval("BYTES=1-2", 10), partial(&[(1, 2)]));
    }

    #[test]
    fn unsatisfiable() {
        assert_eq!(eval("bytes=-0", 10), RangeAnswer::Unsatisfiable);
        assert_eq!(eval("bytes=10-", 10), RangeAnswer::Unsatisfiable);
        assert_eq!(eval("bytes=10-20", 10), RangeAnswer::Unsatisfiable);
        assert_eq!(eval("bytes=10-20, -0", 10), RangeAnswer::Unsatisfiable);
        // one satisfiable range is enough
        assert_eq!(eval("bytes=10-20, 2-3", 10), partial(&[(2, 3)]));
        assert_eq!(eval("bytes=0-0,-1", 10), partial(&[(0, 0), (9, 9)]));
        assert_eq!(eval("bytes=0-0,-1", 1), partial(&[(0, 0)]));
    }

    #[test]
    fn invalid_syntax_is_ignored() {
        for h in [
            "",
            "bytes",
            "bytes=",
            "bytes=,",
            "bytes=-",
            "bytes=5-1",
            "bytes=a-b",
            "bytes=1-b",
            "bytes=+1-2",
            "bytes=1--2",
            "bytes=0x10-",
            "bytes 0-1",
            "bytes= 0 - 1",
            "items=0-1",
            "bytes=0-1;x",
            "bytes=1.5-2",
            "bytes==0-1",
        ] {
            assert_eq!(eval(h, 100), RangeAnswer::Full, "{h:?}");
        }
        assert_eq!(evaluate(Some(b"bytes=\xff-1"), 100), RangeAnswer::Full);
        // an empty representation never gets a 206 or 416
        assert_eq!(eval("bytes=0-1", 0), RangeAnswer::Full);
        assert_eq!(eval("bytes=-5", 0), RangeAnswer::Full);
    }

    #[test]
    fn whitespace_and_empty_elements() {
        assert_eq!(
            eval("  bytes=0-1 ,\t 4-5 , ,", 10),
            partial(&[(0, 1), (4, 5)])
        );
        assert_eq!(eval("bytes=, 3-4", 10), partial(&[(3, 4)]));
    }

    #[test]
    fn overflowing_numbers() {
        let huge = "99999999999999999999999999";
        assert_eq!(
            eval(&format!("bytes={huge}-"), 10),
            RangeAnswer::Unsatisfiable
        );
        assert_eq!(eval(&format!("bytes=3-{huge}"), 10), partial(&[(3, 9)]));
        assert_eq!(eval(&format!("bytes=-{huge}"), 10), partial(&[(0, 9)]));
        assert_eq!(
            eval(&format!("bytes={huge}-{huge}"), 10),
            RangeAnswer::Unsatisfiable
        );
        assert_eq!(
            eval("bytes=18446744073709551615-18446744073709551615", u64::MAX),
            RangeAnswer::Unsatisfiable
        );
        assert_eq!(
            eval("bytes=18446744073709551614-", u64::MAX),
            partial(&[(u64::MAX - 1, u64::MAX - 1)])
        );
        assert_eq!(eval("bytes=0-,5-", u64::MAX), partial(&[(0, u64::MAX - 1)]));
    }

    #[test]
    fn merging_and_order() {
        assert_eq!(eval("bytes=0-4,5-9", 100), partial(&[(0, 9)]));
        assert_eq!(eval("bytes=0-4,6-9", 100), partial(&[(0, 4), (6, 9)]));
        assert_eq!(
            eval("bytes=50-60,0-10,5-20", 100),
            partial(&[(0, 20), (50, 60)])
        );
        assert_eq!(eval("bytes=0-,0-,0-", 100), partial(&[(0, 99)]));
        assert_eq!(eval("bytes=-10,85-", 100), partial(&[(85, 99)]));
        assert_eq!(eval("bytes=0-0,0-0", 100), partial(&[(0, 0)]));
    }

    #[test]
    fn too_many_ranges_are_ignored() {
        let specs: Vec<String> = (0..MAX_RANGES as u64)
            .map(|i| format!("{}-{}", i * 3, i * 3))
            .collect();
        let h = format!("bytes={}", specs.join(","));
        match eval(&h, 1000) {
            RangeAnswer::Partial(v) => assert_eq!(v.len(), MAX_RANGES),
            other => panic!("{other:?}"),
        }
        let h = format!("{h},999-999");
        assert_eq!(eval(&h, 1000), RangeAnswer::Full);
    }

    #[test]
    fn header_values() {
        assert_eq!(content_range(r(0, 99), 1000), "bytes 0-99/1000");
        assert_eq!(unsatisfied_range(1000), "bytes */1000");
        assert_eq!(r(5, 5).len(), 1);
        assert_eq!(r(0, 99).len(), 100);
        assert!(!r(0, 0).is_empty());
        assert_eq!(boundary(0xab), "sy00000000000000ab");
    }

    /// Builds the body from the plan and checks it byte for byte against the RFC 9110 §14.6
    /// example layout, and its length against `content_length`.
    #[test]
    fn multipart_body() {
        let data: Vec<u8> = (0..100u8).collect();
        let ranges = [r(0, 9), r(50, 54), r(99, 99)];
        let plan = multipart(
            &ranges,
            100,
            Some("application/octet-stream"),
            "THIS_STRING",
        );
        assert_eq!(
            plan.content_type,
            "multipart/byteranges; boundary=THIS_STRING"
        );
        let mut body = Vec::new();
        for (prefix, range) in &plan.parts {
            body.extend_from_slice(prefix);
            body.extend_from_slice(&data[range.start as usize..=range.end as usize]);
        }
        body.extend_from_slice(&plan.trailer);
        assert_eq!(body.len() as u64, plan.content_length);

        let mut want = Vec::new();
        for (i, rg) in ranges.iter().enumerate() {
            if i > 0 {
                want.extend_from_slice(b"\r\n");
            }
            want.extend_from_slice(
                format!(
                    "--THIS_STRING\r\nContent-Type: application/octet-stream\r\nContent-Range: bytes {}-{}/100\r\n\r\n",
                    rg.start, rg.end
                )
                .as_bytes(),
            );
            want.extend_from_slice(&data[rg.start as usize..=rg.end as usize]);
        }
        want.extend_from_slice(b"\r\n--THIS_STRING--\r\n");
        assert_eq!(body, want);

        // Parse it back as a MIME multipart body: split on the delimiter.
        let text = body.clone();
        let delim = b"--THIS_STRING";
        let mut pieces = Vec::new();
        let mut rest: &[u8] = &text;
        while let Some(pos) = rest.windows(delim.len()).position(|w| w == delim) {
            pieces.push(&rest[..pos]);
            rest = &rest[pos + delim.len()..];
        }
        assert_eq!(rest, b"--\r\n", "close delimiter");
        assert_eq!(pieces.len(), 4, "preamble + 3 parts");
        assert!(pieces[0].is_empty(), "no preamble");
        for (piece, rg) in pieces[1..].iter().zip(ranges) {
            let piece = piece.strip_prefix(b"\r\n").unwrap();
            let split = piece.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
            let headers = std::str::from_utf8(&piece[..split]).unwrap();
            assert!(headers.contains(&format!("Content-Range: bytes {}-{}/100", rg.start, rg.end)));
            let mut part = &piece[split + 4..];
            part = part.strip_suffix(b"\r\n").unwrap_or(part);
            assert_eq!(part, &data[rg.start as usize..=rg.end as usize]);
        }

        let plain = multipart(&[r(1, 2)], 3, None, "b");
        assert_eq!(
            plain.parts[0].0,
            b"--b\r\nContent-Range: bytes 1-2/3\r\n\r\n".to_vec()
        );
        assert_eq!(
            plain.content_length,
            (plain.parts[0].0.len() + 2 + plain.trailer.len()) as u64
        );
    }

    #[test]
    fn if_range() {
        let etag = Some(b"\"v1\"".as_slice());
        let lm = Some(b"Sun, 06 Nov 1994 08:49:37 GMT".as_slice());
        assert!(if_range_matches(None, None, None));
        assert!(if_range_matches(Some(b"\"v1\""), etag, lm));
        assert!(if_range_matches(Some(b" \"v1\" "), etag, None));
        assert!(!if_range_matches(Some(b"\"v2\""), etag, lm));
        assert!(!if_range_matches(Some(b"W/\"v1\""), etag, lm));
        assert!(!if_range_matches(Some(b"\"v1\""), Some(b"W/\"v1\""), lm));
        assert!(!if_range_matches(Some(b"\"v1\""), None, lm));
        assert!(!if_range_matches(Some(b"\""), Some(b"\""), lm));
        assert!(if_range_matches(
            Some(b"Sun, 06 Nov 1994 08:49:37 GMT"),
            etag,
            lm
        ));
        assert!(if_range_matches(
            Some(b"Sunday, 06-Nov-94 08:49:37 GMT"),
            None,
            lm
        ));
        assert!(!if_range_matches(
            Some(b"Sun, 06 Nov 1994 08:49:38 GMT"),
            etag,
            lm
        ));
        assert!(!if_range_matches(
            Some(b"Sun, 06 Nov 1994 08:49:37 GMT"),
            etag,
            None
        ));
        assert!(!if_range_matches(Some(b"garbage"), etag, Some(b"garbage")));
    }
}

//! WebVTT (`.vtt`): a `WEBVTT` header, then blocks separated by blank lines — cues (optional
//! identifier, `start --> end [settings]`, payload), `NOTE` comments, `STYLE` and `REGION`
//! blocks (skipped).

use super::{block_lines, format_timestamp, normalize, parse_timestamp, Cue};

/// The text starts with the `WEBVTT` signature (followed by nothing, a space, a tab or a line
/// end). `text` must not start with a BOM.
pub fn has_header(text: &str) -> bool {
    text.strip_prefix("WEBVTT")
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t', '\n', '\r']))
}

/// `start --> end [settings]`.
fn parse_timing_line(line: &str) -> Option<(u64, u64)> {
    let (a, b) = line.split_once("-->")?;
    let start = parse_timestamp(a)?;
    let end = parse_timestamp(b.split_whitespace().next()?)?;
    Some((start, end.max(start)))
}

fn starts_keyword(line: &str, keyword: &str) -> bool {
    line.strip_prefix(keyword)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

/// Parses WebVTT text; empty when the header is missing. Cue payload markup (`<c.x>`, `<v
/// Name>`, `<i>`, inline `<00:00:01.000>` timestamps) is removed and character references are
/// decoded.
pub fn parse(text: &str) -> Vec<Cue> {
    let text = normalize(text);
    if !has_header(&text) {
        return Vec::new();
    }
    let lines: Vec<&str> = text.lines().collect();
    // the header block runs to the first blank line; a sloppy file that starts its first cue
    // right under the header (no blank line) loses only the identifier, not the cue
    let mut i = lines
        .iter()
        .position(|l| l.trim().is_empty() || l.contains("-->"))
        .unwrap_or(lines.len());
    let mut cues = Vec::new();
    while i < lines.len() {
        if lines[i].trim().is_empty() {
            i += 1;
            continue;
        }
        let first = lines[i];
        let skip_block = !first.contains("-->")
            && (starts_keyword(first, "NOTE")
                || starts_keyword(first, "STYLE")
                || starts_keyword(first, "REGION"));
        if skip_block {
            while i < lines.len() && !lines[i].trim().is_empty() {
                i += 1;
            }
            continue;
        }
        // optional identifier line before the timing line
        let timing_at = if first.contains("-->") { i } else { i + 1 };
        let Some((start_ms, end_ms)) = lines.get(timing_at).and_then(|l| parse_timing_line(l))
        else {
            // not a cue: skip the block
            while i < lines.len() && !lines[i].trim().is_empty() {
                i += 1;
            }
            continue;
        };
        i = timing_at + 1;
        let mut body = Vec::new();
        while i < lines.len() && !lines[i].trim().is_empty() && !lines[i].contains("-->") {
            body.push(payload_text(lines[i]));
            i += 1;
        }
        let text = body
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        cues.push(Cue {
            start_ms,
            end_ms,
            text,
        });
    }
    cues
}

/// Removes every tag (a literal `<` is written `&lt;` in WebVTT, so `<` always opens one) and
/// decodes character references.
fn payload_text(line: &str) -> String {
    let mut stripped = String::with_capacity(line.len());
    let mut in_tag = false;
    for c in line.chars() {
        match (in_tag, c) {
            (false, '<') => in_tag = true,
            (true, '>') => in_tag = false,
            (false, c) => stripped.push(c),
            (true, _) => {}
        }
    }
    decode_entities(&stripped)
}

/// `&amp;` `&lt;` `&gt;` `&nbsp;` `&lrm;` `&rlm;` `&quot;` `&apos;` and numeric references;
/// anything else is kept as written.
pub fn decode_entities(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        let decoded = after.find(';').filter(|&semi| semi <= 10).and_then(|semi| {
            let name = &after[..semi];
            let c = match name {
                "amp" => Some('&'),
                "lt" => Some('<'),
                "gt" => Some('>'),
                "nbsp" => Some('\u{a0}'),
                "lrm" => Some('\u{200e}'),
                "rlm" => Some('\u{200f}'),
                "quot" => Some('"'),
                "apos" => Some('\''),
                _ => {
                    let num = name.strip_prefix('#')?;
                    let code = match num.strip_prefix(['x', 'X']) {
                        Some(hex) => u32::from_str_radix(hex, 16).ok()?,
                        None => num.parse().ok()?,
                    };
                    char::from_u32(code)
                }
            }?;
            Some((c, semi))
        });
        match decoded {
            Some((c, semi)) => {
                out.push(c);
                rest = &after[semi + 1..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn escape(line: &str) -> String {
    line.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Emits WebVTT: header, then each cue as `HH:MM:SS.mmm --> HH:MM:SS.mmm` and its escaped text
/// (so `-->` or a `<` in a translation cannot break the file).
pub fn emit(cues: &[Cue]) -> String {
    let mut out = String::from("WEBVTT\n\n");
    for c in cues {
        out.push_str(&format!(
            "{} --> {}\n",
            format_timestamp(c.start_ms, '.'),
            format_timestamp(c.end_ms, '.')
        ));
        for line in block_lines(&c.text) {
            out.push_str(&escape(line));
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cue(start_ms: u64, end_ms: u64, text: &str) -> Cue {
        Cue {
            start_ms,
            end_ms,
            text: text.into(),
        }
    }

    #[test]
    fn header_is_required() {
        assert!(parse("00:01.000 --> 00:02.000\nhi\n").is_empty());
        assert!(parse("WEBVTTX\n\n00:01.000 --> 00:02.000\nhi\n").is_empty());
        assert_eq!(
            parse("WEBVTT\n\n00:01.000 --> 00:02.000\nhi").len(),
            1,
            "no final newline"
        );
    }

    #[test]
    fn full_featured_file() {
        let text = "\u{feff}WEBVTT - Some title\r\nKind: captions\r\nLanguage: en\r\n\r\n\
            NOTE this is a comment\r\nwith two lines --> even this\r\n\r\n\
            STYLE\r\n::cue { color: red }\r\n\r\n\
            REGION\r\nid:fred width:40%\r\n\r\n\
            intro\r\n00:00:01.000 --> 00:00:02.500 align:start position:10%\r\n<v Bob>Hello</v> <c.yellow>there</c>\r\n<i>second</i> line &amp; more &lt;3\r\n\r\n\
            00:03.000 --> 00:04.000\r\nshort <00:00:03.500>form\r\n\r\n\
            2\r\n101:00:00.000 --> 101:00:01.000\r\nlong\r\n";
        assert_eq!(
            parse(text),
            [
                cue(1000, 2500, "Hello there\nsecond line & more <3"),
                cue(3000, 4000, "short form"),
                cue(101 * 3_600_000, 101 * 3_600_000 + 1000, "long"),
            ]
        );
    }

    #[test]
    fn cue_without_blank_line_before_next_and_bad_blocks() {
        let text = "WEBVTT\n\n00:01.000 --> 00:02.000\none\n00:02.000 --> 00:03.000\ntwo\n\n\
                    id only\nno timing\n\n00:xx.000 --> 00:05.000\nbad\n\nNOTEBOOK\n00:06.000 --> 00:07.000\nnot a note\n";
        assert_eq!(
            parse(text),
            [
                cue(1000, 2000, "one"),
                cue(2000, 3000, "two"),
                cue(6000, 7000, "not a note")
            ]
        );
    }

    #[test]
    fn first_cue_right_under_the_header() {
        assert_eq!(
            parse("WEBVTT\n00:01.000 --> 00:02.000\nhi\n\n00:03.000 --> 00:04.000\nthere\n"),
            [cue(1000, 2000, "hi"), cue(3000, 4000, "there")]
        );
        assert_eq!(
            parse("WEBVTT\r\n1\r\n00:01.000 --> 00:02.000\r\nhi\r\n"),
            [cue(1000, 2000, "hi")]
        );
        // a header with metadata lines still ends at the blank line
        assert_eq!(
            parse("WEBVTT\nKind: captions\nLanguage: en\n\n00:01.000 --> 00:02.000\nhi\n"),
            [cue(1000, 2000, "hi")]
        );
    }

    #[test]
    fn entities() {
        assert_eq!(
            decode_entities("a &amp; b &#65;&#x42; &bogus; & c"),
            "a & b AB &bogus; & c"
        );
        assert_eq!(decode_entities("&nbsp;&lrm;"), "\u{a0}\u{200e}");
        assert_eq!(decode_entities("&#xFFFFFFFF;"), "&#xFFFFFFFF;");
    }

    #[test]
    fn emit_escapes_and_round_trips() {
        let cues = vec![
            cue(0, 1500, "one\ntwo"),
            cue(2000, 3000, "a --> b <i> & c"),
            cue(150 * 3_600_000, 150 * 3_600_000 + 10, "wide"),
        ];
        let text = emit(&cues);
        assert!(text.starts_with("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\none\ntwo\n\n"));
        assert!(text.contains("a --&gt; b &lt;i&gt; &amp; c"));
        assert_eq!(parse(&text), cues);
    }
}

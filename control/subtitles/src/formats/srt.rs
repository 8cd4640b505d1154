//! SubRip (`.srt`): numbered blocks of `start --> end` and text lines, separated by blank lines.

use super::{block_lines, format_timestamp, normalize, parse_timestamp, Cue};

/// `start --> end` with optional trailing coordinates (`X1:… Y2:…`, ignored).
pub fn parse_timing_line(line: &str) -> Option<(u64, u64)> {
    let (a, b) = line.split_once("-->")?;
    let start = parse_timestamp(a)?;
    let end = parse_timestamp(b.split_whitespace().next()?)?;
    Some((start, end.max(start)))
}

fn is_index(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty() && t.len() <= 9 && t.bytes().all(|b| b.is_ascii_digit())
}

/// Parses SubRip text. Blocks without a valid timing line are skipped; a cue whose end is
/// before its start ends where it starts. Cues run to the next blank line, or to the next
/// `index` + timing pair when a file forgot the blank line. Basic markup (`<i>`, `<b>`,
/// `<u>`, `<font …>`, `{\an8}`) is removed.
pub fn parse(text: &str) -> Vec<Cue> {
    let text = normalize(text);
    let lines: Vec<&str> = text.lines().collect();
    let mut cues = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some((start_ms, end_ms)) = parse_timing_line(lines[i]) else {
            i += 1;
            continue;
        };
        i += 1;
        let mut body = Vec::new();
        while i < lines.len() && !lines[i].trim().is_empty() {
            let next_is_cue = is_index(lines[i])
                && lines
                    .get(i + 1)
                    .is_some_and(|l| parse_timing_line(l).is_some());
            if next_is_cue || parse_timing_line(lines[i]).is_some() {
                break;
            }
            body.push(strip_markup(lines[i].trim()));
            i += 1;
        }
        let text = body
            .into_iter()
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

/// Removes HTML-like tags and ASS override blocks (`{\an8}`) from one line.
fn strip_markup(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '<' => {
                let rest: String = chars.clone().take(64).collect();
                let tag_like = rest
                    .trim_start_matches('/')
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic())
                    && rest.contains('>');
                if tag_like {
                    for c in chars.by_ref() {
                        if c == '>' {
                            break;
                        }
                    }
                } else {
                    out.push(c);
                }
            }
            '{' if chars.peek() == Some(&'\\') => {
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
            }
            _ => out.push(c),
        }
    }
    out.trim().to_string()
}

/// Emits SubRip: cues numbered from 1, `HH:MM:SS,mmm`, CRLF-free, one blank line after each.
pub fn emit(cues: &[Cue]) -> String {
    let mut out = String::new();
    for (n, c) in cues.iter().enumerate() {
        out.push_str(&format!(
            "{}\n{} --> {}\n",
            n + 1,
            format_timestamp(c.start_ms, ','),
            format_timestamp(c.end_ms, ',')
        ));
        for line in block_lines(&c.text) {
            out.push_str(line);
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
    fn plain_file_with_multiline_cues() {
        let text = "1\n00:00:01,000 --> 00:00:02,500\nHello\nworld\n\n2\n00:00:03,000 --> 00:00:04,000\nBye\n";
        assert_eq!(
            parse(text),
            [cue(1000, 2500, "Hello\nworld"), cue(3000, 4000, "Bye")]
        );
    }

    #[test]
    fn bom_crlf_dots_and_coordinates() {
        let text =
            "\u{feff}1\r\n00:00:01.000 --> 00:00:02.000 X1:100 X2:200 Y1:1 Y2:2\r\nHi\r\n\r\n";
        assert_eq!(parse(text), [cue(1000, 2000, "Hi")]);
        let cr_only = "1\r00:00:01,000 --> 00:00:02,000\rOld Mac\r\r";
        assert_eq!(parse(cr_only), [cue(1000, 2000, "Old Mac")]);
    }

    #[test]
    fn tricky_files() {
        // no blank line between cues, a number as text, extra blank lines, no index,
        // markup, hours above 99, end before start, a garbage block
        let text = "\n\n1\n00:00:01,000 --> 00:00:02,000\nThe answer is\n42\n2\n00:00:03,000 --> 00:00:04,000\n<i>in</i> {\\an8}<font color=\"red\">tags</font> a < b\n\n\n\n\
                    00:00:05,000 --> 00:00:06,000\nno index\n\n4\nnot a timing line\nlost\n\n\
                    5\n123:00:00,000 --> 123:00:01,000\nlong film\n\n6\n00:00:09,000 --> 00:00:08,000\nbackwards\n";
        assert_eq!(
            parse(text),
            [
                cue(1000, 2000, "The answer is\n42"),
                cue(3000, 4000, "in tags a < b"),
                cue(5000, 6000, "no index"),
                cue(123 * 3_600_000, 123 * 3_600_000 + 1000, "long film"),
                cue(9000, 9000, "backwards"),
            ]
        );
    }

    #[test]
    fn empty_and_garbage_give_nothing() {
        assert!(parse("").is_empty());
        assert!(parse("\u{feff}").is_empty());
        assert!(parse("hello\nworld\n").is_empty());
    }

    #[test]
    fn emit_round_trips_and_keeps_cues_intact() {
        let cues = vec![
            cue(0, 1500, "one\ntwo"),
            cue(100 * 3_600_000, 100 * 3_600_000 + 1, "wide hours"),
            cue(2000, 3000, "blank\n\ninside"),
        ];
        let text = emit(&cues);
        assert!(text.starts_with("1\n00:00:00,000 --> 00:00:01,500\none\ntwo\n\n2\n100:00:00,000"));
        let back = parse(&text);
        assert_eq!(back[0], cues[0]);
        assert_eq!(back[1], cues[1]);
        assert_eq!(back[2], cue(2000, 3000, "blank\ninside"));
    }
}

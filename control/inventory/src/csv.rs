//! Minimal RFC 4180 CSV, runtime-free: quoted fields with `""` escapes and embedded newlines,
//! CRLF or LF line ends. Used for the item export/import.

/// Quote a field when it needs it.
pub fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) || s.starts_with(' ') || s.ends_with(' ') {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// One CSV line (with CRLF) from fields.
pub fn line(fields: &[String]) -> String {
    let mut s = fields
        .iter()
        .map(|f| field(f))
        .collect::<Vec<_>>()
        .join(",");
    s.push_str("\r\n");
    s
}

/// Parse a whole document into records (blank lines skipped). Errors name the line.
pub fn parse(text: &str) -> Result<Vec<Vec<String>>, String> {
    let mut records = Vec::new();
    let mut record: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut line = 1usize;
    let mut chars = text
        .strip_prefix('\u{feff}')
        .unwrap_or(text)
        .chars()
        .peekable();
    let mut field_started = false;
    while let Some(c) = chars.next() {
        if quoted {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    cur.push('"');
                }
                '"' => quoted = false,
                '\n' => {
                    line += 1;
                    cur.push(c);
                }
                _ => cur.push(c),
            }
            continue;
        }
        match c {
            '"' if !field_started => {
                quoted = true;
                field_started = true;
            }
            '"' => return Err(format!("line {line}: stray quote inside an unquoted field")),
            ',' => {
                record.push(std::mem::take(&mut cur));
                field_started = false;
            }
            '\r' => {}
            '\n' => {
                record.push(std::mem::take(&mut cur));
                if !(record.len() == 1 && record[0].is_empty()) {
                    records.push(std::mem::take(&mut record));
                }
                record.clear();
                field_started = false;
                line += 1;
            }
            _ => {
                cur.push(c);
                field_started = true;
            }
        }
    }
    if quoted {
        return Err(format!("line {line}: unterminated quoted field"));
    }
    if field_started || !record.is_empty() || !cur.is_empty() {
        record.push(cur);
        records.push(record);
    }
    Ok(records)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let rows = vec![
            vec![
                "a".to_string(),
                "b,c".into(),
                "say \"hi\"".into(),
                "two\nlines".into(),
                "".into(),
            ],
            vec!["1".into(), " x ".into(), "".into(), "ü".into(), "z".into()],
        ];
        let text: String = rows.iter().map(|r| line(r)).collect();
        assert_eq!(parse(&text).unwrap(), rows);
        assert_eq!(
            parse("a,b\n\nc,d").unwrap(),
            vec![vec!["a", "b"], vec!["c", "d"]]
        );
        assert_eq!(parse("\u{feff}x\r\n").unwrap(), vec![vec!["x"]]);
        assert!(parse("a,\"b").is_err());
        assert!(parse("a,b\"c").is_err());
        assert_eq!(parse("a,\n").unwrap(), vec![vec!["a", ""]]);
    }
}

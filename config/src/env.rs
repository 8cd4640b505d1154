//! `${NAME}` environment expansion of the raw configuration text.
//!
//! Rules:
//! - `${NAME}` is replaced by the value of the environment variable `NAME`
//!   (`NAME` = `[A-Za-z_][A-Za-z0-9_]*`). An unset variable is an error naming it.
//! - `${NAME:-fallback}` uses `fallback` when `NAME` is unset or empty.
//! - `$$` is a literal `$` (so `$${NAME}` is the literal text `${NAME}`).
//! - Any other `$` is kept as is (bcrypt hashes such as `$2b$10$…` need no escaping).
//! - YAML comments are copied verbatim, without expansion, so documentation may mention
//!   `${NAME}` freely. A comment is a `#` at the start of a line or after a space or tab,
//!   outside a single- or double-quoted string on that line. (Inside block scalars such a `#`
//!   is also treated as a comment start and not expanded.)
//!
//! The value is inserted into the text as is: quote the reference (`token: "${API_TOKEN}"`)
//! when the value may contain YAML-significant characters such as `: ` or ` #`.

/// Why expansion failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// `${NAME}` with `NAME` unset (and no `:-` fallback).
    #[error("environment variable `{name}` is not set (referenced as ${{{name}}} on line {line}; write $$ for a literal $)")]
    Missing {
        /// Variable name.
        name: String,
        /// 1-based line of the reference.
        line: usize,
    },
    /// `${` without `}` or with an invalid name.
    #[error("bad environment reference on line {line}: {message}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Expand `${NAME}` references in `text` using `env` (see the [module docs](self)).
pub fn expand_env(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, EnvError> {
    let mut out = String::with_capacity(text.len());
    for (idx, line) in text.split_inclusive('\n').enumerate() {
        expand_line(line, idx + 1, env, &mut out)?;
    }
    Ok(out)
}

fn expand_line(
    line: &str,
    lineno: usize,
    env: &dyn Fn(&str) -> Option<String>,
    out: &mut String,
) -> Result<(), EnvError> {
    let mut quote: Option<char> = None;
    let mut prev: Option<char> = None;
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        match c {
            '#' if quote.is_none() && matches!(prev, None | Some(' ') | Some('\t')) => {
                // Comment: copy the remainder verbatim.
                out.push_str(rest);
                return Ok(());
            }
            '\'' | '"' => {
                match quote {
                    None if matches!(
                        prev,
                        None | Some(' ' | '\t' | ':' | '-' | '[' | '{' | ',')
                    ) =>
                    {
                        quote = Some(c)
                    }
                    Some(q) if q == c => quote = None,
                    _ => {}
                }
                out.push(c);
                rest = &rest[1..];
            }
            '$' => {
                if let Some(after) = rest.strip_prefix("$$") {
                    out.push('$');
                    rest = after;
                } else if let Some(after) = rest.strip_prefix("${") {
                    let Some(end) = after.find('}') else {
                        return Err(EnvError::Syntax {
                            line: lineno,
                            message: "`${` without a closing `}`".into(),
                        });
                    };
                    let inner = &after[..end];
                    let (name, fallback) = match inner.split_once(":-") {
                        Some((n, f)) => (n, Some(f)),
                        None => (inner, None),
                    };
                    if !valid_name(name) {
                        return Err(EnvError::Syntax {
                            line: lineno,
                            message: format!(
                                "`${{{inner}}}`: variable names are letters, digits and _ (not starting with a digit)"
                            ),
                        });
                    }
                    match (env(name), fallback) {
                        (Some(v), Some(f)) if v.is_empty() => out.push_str(f),
                        (Some(v), _) => out.push_str(&v),
                        (None, Some(f)) => out.push_str(f),
                        (None, None) => {
                            return Err(EnvError::Missing {
                                name: name.to_string(),
                                line: lineno,
                            })
                        }
                    }
                    rest = &after[end + 1..];
                } else {
                    out.push('$');
                    rest = &rest[1..];
                }
            }
            _ => {
                out.push(c);
                rest = &rest[c.len_utf8()..];
            }
        }
        prev = Some(c);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("s3cret".into()),
            "EMPTY" => Some(String::new()),
            "PORT" => Some("9000".into()),
            _ => None,
        }
    }

    fn x(s: &str) -> Result<String, EnvError> {
        expand_env(s, &env)
    }

    #[test]
    fn expands_set_variables() {
        assert_eq!(x("token: ${TOKEN}\n").unwrap(), "token: s3cret\n");
        assert_eq!(x("listen: \":${PORT}\"").unwrap(), "listen: \":9000\"");
        assert_eq!(x("a: ${TOKEN}${PORT}").unwrap(), "a: s3cret9000");
    }

    #[test]
    fn missing_variable_is_named() {
        let err = x("a: 1\ntoken: ${NOPE}\n").unwrap_err();
        assert_eq!(
            err,
            EnvError::Missing {
                name: "NOPE".into(),
                line: 2
            }
        );
        assert!(err.to_string().contains("`NOPE`"));
    }

    #[test]
    fn fallback() {
        assert_eq!(x("a: ${NOPE:-dflt}").unwrap(), "a: dflt");
        assert_eq!(x("a: ${EMPTY:-dflt}").unwrap(), "a: dflt");
        assert_eq!(x("a: ${TOKEN:-dflt}").unwrap(), "a: s3cret");
        assert_eq!(x("a: ${NOPE:-}").unwrap(), "a: ");
    }

    #[test]
    fn escapes_and_plain_dollars() {
        assert_eq!(x("a: $${TOKEN}").unwrap(), "a: ${TOKEN}");
        assert_eq!(x("a: cost$$5").unwrap(), "a: cost$5");
        let hash = "h: $2b$10$N9qo8uLOickgx2ZMRZoMyeIjZAgcfl7p92ldGxad68LJZdL17lhWy";
        assert_eq!(x(hash).unwrap(), hash);
        assert_eq!(x("a: $TOKEN").unwrap(), "a: $TOKEN");
    }

    #[test]
    fn comments_are_not_expanded() {
        let t = "# set ${UNSET_IN_COMMENT}\n  # also ${X}\na: 1 # trailing ${Y}\n";
        assert_eq!(x(t).unwrap(), t);
        // '#' inside a quoted value is not a comment
        assert_eq!(x("a: \"x #${TOKEN}\"").unwrap(), "a: \"x #s3cret\"");
        // '#' not preceded by whitespace is not a comment
        assert_eq!(x("a: x#${TOKEN}").unwrap(), "a: x#s3cret");
    }

    #[test]
    fn syntax_errors() {
        assert!(matches!(
            x("a: ${TOKEN"),
            Err(EnvError::Syntax { line: 1, .. })
        ));
        assert!(matches!(
            x("\na: ${1BAD}"),
            Err(EnvError::Syntax { line: 2, .. })
        ));
        assert!(matches!(x("a: ${}"), Err(EnvError::Syntax { .. })));
    }
}

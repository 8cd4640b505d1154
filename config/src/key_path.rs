//! The key path (`server.http.listen`, `backends[2].type`; empty = document root) of a position
//! in YAML or JSON text, found by walking the parser's events up to that position. Parse errors
//! carry only a line and column; this names the key they are about without wrapping every
//! configuration type's deserializer in a path-tracking one (issue 14: the wrapper's bookkeeping
//! around every visit cost ~0.23 MB of the stripped binary).

use serde_saphyr::granit_parser::{Event, Parser};

/// What an error location designates: the walker picks among the nodes that start there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// A mapping key that is itself the problem (an unknown field): the path ends with it.
    Key,
    /// A mapping that is the problem (a missing field, a duplicate key): the location is the
    /// mapping's start or one of its keys, the path is the mapping's.
    Mapping,
    /// A value (wrong type, bad value, custom error): the path of the node starting there.
    Value,
}

/// One level of nesting on the way to the current event.
enum Frame {
    Mapping {
        /// The most recent key (`None` for a complex key the path cannot name).
        key: Option<String>,
        /// `true` between a key and the end of its value.
        in_value: bool,
    },
    Sequence {
        /// Index of the current (or next) item.
        index: usize,
    },
}

/// A node starting at (or before) the location, with what the selection needs.
struct Candidate {
    /// The node's path; for a key, the path of the mapping holding it.
    path: String,
    /// The key text when the node is a mapping key.
    key: Option<String>,
}

impl Candidate {
    fn with_key(self) -> String {
        match self.key {
            Some(key) => join(self.path, &key),
            None => self.path,
        }
    }
}

fn join(mut path: String, key: &str) -> String {
    if !path.is_empty() {
        path.push('.');
    }
    path.push_str(key);
    path
}

/// Path of the node about to start, given the open frames.
fn render(stack: &[Frame]) -> String {
    let mut path = String::new();
    for frame in stack {
        match frame {
            Frame::Mapping {
                key: Some(key),
                in_value: true,
            } => path = join(path, key),
            // A value under a complex key (a mapping or sequence as key): `?` stands for it.
            Frame::Mapping {
                key: None,
                in_value: true,
            } => path = join(path, "?"),
            Frame::Mapping {
                in_value: false, ..
            } => {}
            Frame::Sequence { index } => path.push_str(&format!("[{index}]")),
        }
    }
    path
}

/// The candidate for a node starting now (before its own frame, if any, is pushed).
fn candidate(stack: &[Frame], scalar: Option<&str>) -> Candidate {
    let path = render(stack);
    let key = match stack.last() {
        Some(Frame::Mapping {
            in_value: false, ..
        }) => Some(scalar.unwrap_or("?").to_string()),
        _ => None,
    };
    Candidate { path, key }
}

/// A node (scalar, alias or collection) has ended: its parent moves on.
fn node_done(stack: &mut [Frame], scalar: Option<&str>) {
    match stack.last_mut() {
        Some(Frame::Mapping { key, in_value }) => {
            if *in_value {
                *in_value = false;
            } else {
                *key = scalar.map(str::to_string);
                *in_value = true;
            }
        }
        Some(Frame::Sequence { index }) => *index += 1,
        None => {}
    }
}

/// The key path at 1-based `line` and `column` of `text`, as `target` designates it. Positions
/// that no node starts at resolve to the last node starting before them; text the parser rejects
/// resolves to where the walk got to; the root (or nothing) is the empty path.
pub(crate) fn key_path_at(text: &str, line: u64, column: u64, target: Target) -> String {
    // The parser counts lines from 1 and columns from 0 (characters, like the error location).
    let at = (line, column.saturating_sub(1));
    let mut stack: Vec<Frame> = Vec::new();
    let mut exact: Vec<Candidate> = Vec::new();
    let mut before: Option<Candidate> = None;
    for item in Parser::new_from_str(text) {
        let Ok((event, span)) = item else { break };
        let start = (span.start.line() as u64, span.start.col() as u64);
        if start > at {
            break;
        }
        let scalar = match &event {
            Event::Scalar(value, ..) => Some(value.as_ref()),
            _ => None,
        };
        let begins = matches!(
            event,
            Event::Scalar(..)
                | Event::Alias(..)
                | Event::MappingStart(..)
                | Event::SequenceStart(..)
        );
        if begins {
            let found = candidate(&stack, scalar);
            if start == at {
                exact.push(found);
            } else {
                before = Some(found);
            }
        }
        match event {
            Event::Scalar(..) | Event::Alias(..) => node_done(&mut stack, scalar),
            Event::MappingStart(..) => stack.push(Frame::Mapping {
                key: None,
                in_value: false,
            }),
            Event::SequenceStart(..) => stack.push(Frame::Sequence { index: 0 }),
            Event::MappingEnd | Event::SequenceEnd => {
                stack.pop();
                node_done(&mut stack, None);
            }
            _ => {}
        }
    }
    if exact.is_empty() {
        return before.map(Candidate::with_key).unwrap_or_default();
    }
    match target {
        Target::Key => {
            let first_key = exact.iter().position(|c| c.key.is_some()).unwrap_or(0);
            exact.swap_remove(first_key).with_key()
        }
        // A block mapping starts where its first key does, a flow mapping's error points at a
        // key: either way the mapping's own path.
        Target::Mapping => exact.swap_remove(0).path,
        Target::Value => exact.swap_remove(0).with_key(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The path of the first occurrence of `needle` in `text` (1-based line and column).
    fn at(text: &str, needle: &str, target: Target) -> String {
        let offset = text.find(needle).expect("needle in text");
        let before = &text[..offset];
        let line = before.matches('\n').count() as u64 + 1;
        let column = before.rsplit('\n').next().unwrap_or("").chars().count() as u64 + 1;
        key_path_at(text, line, column, target)
    }

    #[test]
    fn nested_block_mappings() {
        let text = "server:\n  http:\n    listen: \":1\"\n    lisen: 2\n  cores: 3\n";
        assert_eq!(at(text, "lisen", Target::Key), "server.http.lisen");
        assert_eq!(at(text, "\":1\"", Target::Value), "server.http.listen");
        assert_eq!(at(text, "3", Target::Value), "server.cores");
        assert_eq!(at(text, "cores", Target::Key), "server.cores");
        // a block mapping starts where its first key does: a missing field names the mapping
        assert_eq!(at(text, "listen", Target::Mapping), "server.http");
        assert_eq!(at(text, "server", Target::Mapping), "");
        assert_eq!(at(text, "server", Target::Key), "server");
    }

    #[test]
    fn sequences_of_mappings() {
        let text = "backends:\n  - name: a\n    type: direct\n  - name: b\n    http_proxy:\n      adress: x:1\n";
        assert_eq!(
            at(text, "adress", Target::Key),
            "backends[1].http_proxy.adress"
        );
        assert_eq!(at(text, "direct", Target::Value), "backends[0].type");
        assert_eq!(at(text, "name: b", Target::Mapping), "backends[1]");
        assert_eq!(at(text, "b\n", Target::Value), "backends[1].name");
        let text = "whitelist: [10.0.0.0/8, nope, [x, y]]\n";
        assert_eq!(at(text, "nope", Target::Value), "whitelist[1]");
        assert_eq!(at(text, "y", Target::Value), "whitelist[2][1]");
        assert_eq!(at("- a\n- b\n", "b", Target::Value), "[1]");
        assert_eq!(at("- a\n- b\n", "a", Target::Value), "[0]");
        assert_eq!(key_path_at("- a\n- b\n", 1, 1, Target::Value), "");
    }

    #[test]
    fn flow_style_and_json() {
        let text = r#"{"server":{"htttp":{},"cores":"many"},"backends":[{"name":"a"},{"type":"x","n":[1,"z"]}]}"#;
        assert_eq!(at(text, "\"htttp\"", Target::Key), "server.htttp");
        assert_eq!(at(text, "\"many\"", Target::Value), "server.cores");
        assert_eq!(at(text, "\"z\"", Target::Value), "backends[1].n[1]");
        // a flow mapping's missing field is reported at its first key
        assert_eq!(at(text, "\"type\"", Target::Mapping), "backends[1]");
        assert_eq!(at(text, "{\"name\"", Target::Mapping), "backends[0]");
        assert_eq!(at("x: {a: 1, c: 2}\n", "c", Target::Key), "x.c");
    }

    #[test]
    fn multi_line_scalars_and_comments() {
        let text = "# top\nx: # after key\n  # own line\n  a: >\n    folded\n    text\n  b: |\n    one\n    two\n  c: \"quoted\n    on two lines\" # trailing\n  d: 1\n";
        assert_eq!(at(text, "folded", Target::Value), "x.a");
        assert_eq!(at(text, "one", Target::Value), "x.b");
        assert_eq!(at(text, "\"quoted", Target::Value), "x.c");
        assert_eq!(at(text, "d:", Target::Key), "x.d");
        // inside a scalar (not where it starts): the scalar it is in
        assert_eq!(at(text, "text", Target::Value), "x.a");
        assert_eq!(at(text, "two", Target::Value), "x.b");
    }

    #[test]
    fn anchors_and_aliases() {
        // The error location of a problem inside an aliased node is the anchored definition:
        // the path names where the offending text is.
        let text = "x: &base {a: 1, c: 2}\nl: [*base, {<<: *base, d: 3}]\n";
        assert_eq!(at(text, "c", Target::Key), "x.c");
        assert_eq!(at(text, "d", Target::Key), "l[1].d");
        assert_eq!(at(text, "3", Target::Value), "l[1].d");
    }

    #[test]
    fn duplicate_key_names_the_mapping() {
        let text = "server:\n  http:\n    listen: :1\n    listen: :2\n";
        let line4 = key_path_at(text, 4, 5, Target::Mapping);
        assert_eq!(line4, "server.http");
    }

    #[test]
    fn out_of_range_and_broken_text() {
        assert_eq!(key_path_at("a: 1\n", 99, 1, Target::Value), "a");
        assert_eq!(key_path_at("", 1, 1, Target::Value), "");
        assert_eq!(key_path_at("a:\n  b: [\n", 3, 1, Target::Value), "a.b");
        assert_eq!(key_path_at("a: *nope\n", 1, 4, Target::Value), "a");
    }
}

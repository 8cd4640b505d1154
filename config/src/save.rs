//! The text a configuration is saved as, so that the file loads back to exactly that
//! configuration and keeps the `${NAME}` references it was written with.
//!
//! The running configuration holds the expanded values; written as they are, a save from the
//! dashboard would turn `token: "${API_TOKEN}"` into the token itself, in the file and in its
//! backups. [`file_text`] writes every string value whose previous file said `${…}` and whose
//! expansion is still the value being saved as that reference again (double-quoted); list
//! entries are matched by `name` (or `url`), not position. Every other string is written so that
//! loading does not expand it: a `$` before `$` or `{` is doubled (`$${X}` loads as `${X}`), so a
//! value that arrived through the API never reads the server's environment.
//!
//! Only string values keep references: a number written as `port: ${PORT}` is saved as the
//! number.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

use crate::env::expand_env;

/// A YAML document as a tree that keeps the order of mapping keys.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    /// A `${NAME}` reference written back as it was (double-quoted, not escaped).
    Reference(String),
    Seq(Vec<Node>),
    Map(Vec<(String, Node)>),
}

impl Node {
    /// The scalar's text, for comparing a previous expanded value with a new one.
    fn scalar_text(&self) -> Option<String> {
        match self {
            Node::Bool(b) => Some(b.to_string()),
            Node::Int(i) => Some(i.to_string()),
            Node::UInt(u) => Some(u.to_string()),
            Node::Float(f) => Some(f.to_string()),
            Node::Str(s) => Some(s.clone()),
            _ => None,
        }
    }

    fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Node::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The key a list entry is known by: its `name`, else its `url`.
    fn identity(&self) -> Option<&str> {
        match self.get("name").or_else(|| self.get("url")) {
            Some(Node::Str(s)) => Some(s),
            _ => None,
        }
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        Ok(Node::UInt(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some((key, value)) = map.next_entry::<Node, Node>()? {
            let key = key.scalar_text().unwrap_or_default();
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Node, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Null => s.serialize_unit(),
            Node::Bool(b) => s.serialize_bool(*b),
            Node::Int(i) => s.serialize_i64(*i),
            Node::UInt(u) => s.serialize_u64(*u),
            Node::Float(f) => s.serialize_f64(*f),
            Node::Str(v) => s.serialize_str(v),
            Node::Reference(v) => serde_saphyr::DoubleQuoted(v.as_str()).serialize(s),
            Node::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Node::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

/// `text` with every `$` that comes before `$` or `{` doubled, so that loading gives `text`.
pub fn escape_dollars(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        out.push(c);
        if c == '$' && matches!(chars.peek(), Some('$' | '{')) {
            out.push('$');
        }
    }
    out
}

/// Writes the references of the previous file (`raw`, and `expanded` as it loaded) back into
/// `new` wherever their expansion is still the value being saved.
fn restore(new: &mut Node, raw: &Node, expanded: &Node) {
    match (new, raw, expanded) {
        (Node::Map(entries), Node::Map(raw_entries), _) => {
            for (key, raw_value) in raw_entries {
                let (Some(slot), Some(expanded_value)) = (
                    entries.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
                    expanded.get(key),
                ) else {
                    continue;
                };
                restore(slot, raw_value, expanded_value);
            }
        }
        (Node::Seq(items), Node::Seq(raw_items), Node::Seq(expanded_items)) => {
            for (i, (raw_item, expanded_item)) in raw_items.iter().zip(expanded_items).enumerate() {
                let slot = match raw_item.identity() {
                    Some(id) => items.iter_mut().find(|n| n.identity() == Some(id)),
                    None => items.get_mut(i),
                };
                if let Some(slot) = slot {
                    restore(slot, raw_item, expanded_item);
                }
            }
        }
        (slot @ Node::Str(_), Node::Str(reference), expanded) if reference.contains("${") => {
            if let Node::Str(value) = &*slot {
                if expanded.scalar_text().as_deref() == Some(value.as_str()) {
                    *slot = Node::Reference(reference.clone());
                }
            }
        }
        _ => {}
    }
}

fn escape_strings(node: &mut Node) {
    match node {
        Node::Str(s) => *s = escape_dollars(s),
        Node::Seq(items) => items.iter_mut().for_each(escape_strings),
        Node::Map(entries) => entries.iter_mut().for_each(|(_, v)| escape_strings(v)),
        _ => {}
    }
}

/// The YAML text to save `new` as, in place of the file's `previous` text (`None`: no file
/// yet). `env` expands the previous file's references for the comparison (the process
/// environment when saving). See the [module docs](self).
pub fn file_text<T: Serialize>(
    new: &T,
    previous: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let typed = serde_saphyr::to_string(new).map_err(|e| e.to_string())?;
    let mut node: Node = serde_saphyr::from_str(&typed).map_err(|e| e.to_string())?;
    if let Some(previous) = previous {
        // A previous file that does not parse (or no longer expands) has no references to
        // keep: the new text replaces it whole.
        let raw = serde_saphyr::from_str::<Node>(previous).ok();
        let expanded = expand_env(previous, env)
            .ok()
            .and_then(|t| serde_saphyr::from_str::<Node>(&t).ok());
        if let (Some(raw), Some(expanded)) = (raw, expanded) {
            restore(&mut node, &raw, &expanded);
        }
    }
    escape_strings(&mut node);
    serde_saphyr::to_string(&node).map_err(|e| e.to_string())
}

/// The first `${NAME}` reference of configuration text (outside comments; `$$` is no
/// reference): (name, 1-based line). A configuration sent through an API must not have one,
/// since expanding it would hand out the server's environment.
pub fn first_reference(text: &str) -> Option<(String, usize)> {
    let seen = std::cell::RefCell::new(None::<String>);
    let record = |name: &str| {
        seen.borrow_mut().get_or_insert_with(|| name.to_owned());
        Some(String::new())
    };
    for (index, line) in text.split_inclusive('\n').enumerate() {
        // Syntax errors are the loader's to report.
        let _ = expand_env(line, &record);
        if let Some(name) = seen.borrow_mut().take() {
            return Some((name, index + 1));
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::ServerConfig;

    fn env(name: &str) -> Option<String> {
        match name {
            "API_TOKEN" => Some("tok-from-env".into()),
            "PROXY_PASSWORD" => Some("pw-from-env".into()),
            "HOST" => Some("proxy.example".into()),
            _ => None,
        }
    }

    const FILE: &str = r#"# comments go
api:
  token: "${API_TOKEN}"
backends:
  - name: a
    type: httpproxy
    http_proxy: {address: "${HOST}:3128", username: u, password: "${PROXY_PASSWORD}"}
  - name: b
    type: httpproxy
    http_proxy: {address: "b:3128", password: "literal$${NOT_A_REF}"}
routes:
  - {name: r, domains: ["*"], backend: a}
"#;

    fn load(text: &str) -> ServerConfig {
        ServerConfig::from_yaml_str(text, &env).unwrap()
    }

    #[test]
    fn a_save_keeps_the_files_references_and_loads_back_the_same() {
        let running = load(FILE);
        assert_eq!(running.api.token.as_deref(), Some("tok-from-env"));
        // Unchanged, and with the backends reordered: the references stay by name.
        let mut reordered = running.clone();
        reordered.backends.reverse();
        for cfg in [&running, &reordered] {
            let text = file_text(cfg, Some(FILE), &env).unwrap();
            assert!(text.contains("\"${API_TOKEN}\""), "{text}");
            assert!(text.contains("\"${PROXY_PASSWORD}\""), "{text}");
            assert!(text.contains("\"${HOST}:3128\""), "{text}");
            assert!(
                !text.contains("tok-from-env") && !text.contains("pw-from-env"),
                "{text}"
            );
            assert!(text.contains("literal$${NOT_A_REF}"), "{text}");
            assert_eq!(&load(&text), cfg, "{text}");
        }
        // A changed value is written as the value; the other references stay.
        let mut changed = running.clone();
        changed.api.token = Some("new-token".into());
        let text = file_text(&changed, Some(FILE), &env).unwrap();
        assert!(
            text.contains("new-token") && !text.contains("${API_TOKEN}"),
            "{text}"
        );
        assert!(text.contains("\"${PROXY_PASSWORD}\""), "{text}");
        assert_eq!(load(&text), changed);
    }

    #[test]
    fn values_from_the_api_are_written_so_they_never_expand() {
        let mut cfg = load("api: {listen: \"127.0.0.1:0\"}\n");
        cfg.api.token = Some("${API_TOKEN}".into());
        let text = file_text(&cfg, None, &env).unwrap();
        assert!(text.contains("$${API_TOKEN}"), "{text}");
        let back = load(&text);
        assert_eq!(back.api.token.as_deref(), Some("${API_TOKEN}"));
        // The example configuration round-trips as it is.
        let example =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/server.yaml"))
                .unwrap();
        let example = ServerConfig::from_yaml_str(&example, &|_| Some("x".into())).unwrap();
        let text = file_text(&example, None, &env).unwrap();
        assert_eq!(load(&text), example);
    }

    #[test]
    fn dollars_are_escaped_only_where_loading_would_change_them() {
        assert_eq!(escape_dollars("$2b$10$abc"), "$2b$10$abc");
        assert_eq!(escape_dollars("a${B}c"), "a$${B}c");
        assert_eq!(escape_dollars("a$$b"), "a$$$b");
        assert_eq!(escape_dollars("end$"), "end$");
        for s in ["a${B}c", "a$$b", "$${x}", "$", "plain"] {
            let yaml = format!("v: \"{}\"\n", escape_dollars(s));
            let expanded = expand_env(&yaml, &|_| None).unwrap();
            assert_eq!(expanded, format!("v: \"{s}\"\n"));
        }
    }

    #[test]
    fn references_are_found_outside_comments() {
        assert_eq!(
            first_reference("a: 1\n# ${IN_COMMENT}\nb: \"x${SECRET:-d}\"\n"),
            Some(("SECRET".into(), 3))
        );
        assert_eq!(first_reference("a: \"$${LITERAL}\" # ${C}\n"), None);
        assert_eq!(first_reference("a: $2b$10$x\n"), None);
    }
}

//! Result records (written as JSON) and the Markdown summary.

use std::fmt::Write as _;

use serde::Serialize;

/// Which side of the comparison a program is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Switchyard,
    Peer,
    /// The no-proxy baseline (direct to nginx, raw loopback TCP).
    Ceiling,
    /// switchyard in another configuration, shown beside it (e.g. the copy relay), never the
    /// figure a target is judged by.
    Variant,
}

/// One program's outcome in one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Entry<T> {
    pub program: String,
    pub role: Role,
    pub version: Option<String>,
    /// Present when the program ran and was measured.
    pub figures: Option<T>,
    /// Why it was not measured, or what was wrong with the measurement.
    pub error: Option<String>,
    pub notes: Vec<String>,
}

impl<T> Entry<T> {
    pub fn new(program: &str, role: Role) -> Self {
        Entry {
            program: program.to_string(),
            role,
            version: None,
            figures: None,
            error: None,
            notes: Vec::new(),
        }
    }

    /// Figures usable for comparison (measured and without a recorded error).
    pub fn valid(&self) -> Option<&T> {
        self.figures.as_ref().filter(|_| self.error.is_none())
    }

    pub fn status(&self) -> String {
        match (&self.figures, &self.error) {
            (_, Some(e)) => format!("FAILED: {}", one_line(e)),
            (Some(_), None) => "ok".into(),
            (None, None) => "not run".into(),
        }
    }
}

fn one_line(s: &str) -> String {
    let s = s.replace(['\n', '|'], " ");
    if s.chars().count() > 160 {
        format!("{}…", s.chars().take(160).collect::<String>())
    } else {
        s
    }
}

/// The switchyard entry, the best valid peer by `key` (higher is better) and the ceiling.
pub struct Compare<'a, T> {
    pub switchyard: Option<&'a T>,
    pub best_peer: Option<(&'a str, &'a T)>,
    pub ceiling: Option<(&'a str, &'a T)>,
}

pub fn compare<'a, T>(entries: &'a [Entry<T>], key: impl Fn(&T) -> f64) -> Compare<'a, T> {
    let switchyard = entries
        .iter()
        .find(|e| e.role == Role::Switchyard)
        .and_then(|e| e.valid());
    let best_peer = entries
        .iter()
        .filter(|e| e.role == Role::Peer)
        .filter_map(|e| e.valid().map(|f| (e.program.as_str(), f)))
        .max_by(|a, b| key(a.1).total_cmp(&key(b.1)));
    let ceiling = entries
        .iter()
        .filter(|e| e.role == Role::Ceiling)
        .find_map(|e| e.valid().map(|f| (e.program.as_str(), f)));
    Compare {
        switchyard,
        best_peer,
        ceiling,
    }
}

/// "met" / "not met" in bold.
pub fn verdict(met: bool) -> &'static str {
    if met {
        "**met**"
    } else {
        "**not met**"
    }
}

/// A Markdown table.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "| {} |", header.join(" | "));
    let _ = writeln!(
        s,
        "|{}|",
        header.iter().map(|_| "---").collect::<Vec<_>>().join("|")
    );
    for r in rows {
        let _ = writeln!(s, "| {} |", r.join(" | "));
    }
    s
}

pub fn f(v: f64, digits: usize) -> String {
    format!("{v:.digits$}")
}

/// A CPU figure in µs, or "–".
pub fn cpu_cell(us: Option<f64>) -> String {
    us.map(|v| f(v, 1)).unwrap_or_else(|| "–".into())
}

pub fn version_cell(v: &Option<String>) -> String {
    v.as_deref().map(one_line).unwrap_or_else(|| "–".into())
}

/// "- program: note; note" lines for the entries that carry notes.
pub fn notes<T>(entries: &[Entry<T>]) -> String {
    let mut s = String::new();
    for e in entries.iter().filter(|e| !e.notes.is_empty()) {
        let _ = writeln!(s, "- {}: {}", e.program, one_line(&e.notes.join("; ")));
    }
    if !s.is_empty() {
        s.insert(0, '\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(program: &str, role: Role, v: Option<f64>, error: Option<&str>) -> Entry<f64> {
        let mut e = Entry::new(program, role);
        e.figures = v;
        e.error = error.map(str::to_string);
        e
    }

    #[test]
    fn compare_picks_best_valid_peer_and_ceiling() {
        let es = vec![
            entry("direct", Role::Ceiling, Some(100.0), None),
            entry("switchyard", Role::Switchyard, Some(60.0), None),
            entry("a", Role::Peer, Some(30.0), None),
            entry("b", Role::Peer, Some(50.0), Some("3 non-2xx responses")),
            entry("c", Role::Peer, None, Some("did not start")),
        ];
        let c = compare(&es, |v| *v);
        assert_eq!(c.switchyard, Some(&60.0));
        assert_eq!(c.best_peer.map(|p| p.0), Some("a"));
        assert_eq!(c.ceiling.map(|p| *p.1), Some(100.0));
        assert_eq!(es[3].status(), "FAILED: 3 non-2xx responses");
        assert_eq!(es[2].status(), "ok");
    }

    #[test]
    fn table_and_notes_are_markdown() {
        let t = table(&["a", "b"], &[vec!["1".into(), "2".into()]]);
        assert_eq!(t, "| a | b |\n|---|---|\n| 1 | 2 |\n");
        let mut e = entry("squid", Role::Peer, Some(1.0), None);
        e.notes.push("cache | off".into());
        assert_eq!(notes(&[e]), "\n- squid: cache   off\n");
    }
}

//! The journal of host changes: one JSON object per line in `<data_dir>/split-tunnel.journal`,
//! appended and synced BEFORE the change is made (write-ahead), so whatever a crash leaves behind is
//! listed. The next start undoes the entries newest first (each undo tolerates "already gone") and
//! deletes the file. A torn last line (crash mid-write) is skipped.

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const JOURNAL_FILE: &str = "split-tunnel.journal";

/// One change made to the host, with what is needed to undo it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum Change {
    /// `ip -<family> rule add fwmark <fwmark> lookup <table> priority <priority>`
    IpRule {
        netns: Option<String>,
        family: u8,
        fwmark: u32,
        table: u32,
        priority: u32,
    },
    /// `ip -<family> rule add from <from> lookup <table> priority <priority>`
    IpRuleFrom {
        netns: Option<String>,
        family: u8,
        from: IpAddr,
        table: u32,
        priority: u32,
    },
    /// Routes added to `table` (undo flushes the table).
    IpRoutes {
        netns: Option<String>,
        family: u8,
        table: u32,
    },
    /// `table inet <name>` of the nftables fallback.
    NftTable { netns: Option<String>, name: String },
    /// A bpf file system mounted by the client.
    BpffsMount { dir: PathBuf },
    /// Pinned eBPF maps and links under this directory.
    BpfPins { dir: PathBuf },
    /// A cgroup the client created (undo moves its processes to the parent and removes it).
    Cgroup { path: PathBuf },
    /// A private mount of the cgroup2 hierarchy, made when none was visible (undo unmounts it).
    Cgroup2Mount { dir: PathBuf },
}

impl std::fmt::Display for Change {
    /// What the change is on the host, as `vpn-unlock` reports it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ns = |netns: &Option<String>| {
            netns
                .as_ref()
                .map(|n| format!(" (netns {n})"))
                .unwrap_or_default()
        };
        match self {
            Change::IpRule {
                netns,
                family,
                fwmark,
                table,
                priority,
            } => write!(
                f,
                "ip -{family} rule fwmark {fwmark:#x} lookup {table} priority {priority}{}",
                ns(netns)
            ),
            Change::IpRuleFrom {
                netns,
                family,
                from,
                table,
                priority,
            } => write!(
                f,
                "ip -{family} rule from {from} lookup {table} priority {priority}{}",
                ns(netns)
            ),
            Change::IpRoutes {
                netns,
                family,
                table,
            } => {
                write!(f, "ip -{family} routes of table {table}{}", ns(netns))
            }
            Change::NftTable { netns, name } => write!(f, "nft table inet {name}{}", ns(netns)),
            Change::BpffsMount { dir } => write!(f, "bpffs mount {}", dir.display()),
            Change::BpfPins { dir } => {
                write!(f, "eBPF programs and maps pinned in {}", dir.display())
            }
            Change::Cgroup { path } => write!(f, "cgroup {}", path.display()),
            Change::Cgroup2Mount { dir } => write!(f, "cgroup2 mount {}", dir.display()),
        }
    }
}

/// Parses a journal text; unreadable lines (a torn write) are skipped.
pub fn parse(text: &str) -> Vec<Change> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Renders one entry as its journal line (with the newline).
pub fn line(change: &Change) -> String {
    // serialising a plain enum of strings and integers cannot fail
    let mut s = serde_json::to_string(change).unwrap_or_default();
    s.push('\n');
    s
}

/// The journal file of one data directory.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
}

impl Journal {
    pub fn new(data_dir: &Path) -> Self {
        Journal {
            path: data_dir.join(JOURNAL_FILE),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends and syncs one entry.
    pub fn record(&self, change: &Change) -> std::io::Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        file.write_all(line(change).as_bytes())?;
        file.sync_data()
    }

    /// The recorded entries, oldest first (none when there is no journal).
    pub fn entries(&self) -> std::io::Result<Vec<Change>> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => Ok(parse(&text)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Replaces the journal with `changes` (written to a temporary file, synced, then renamed
    /// over it: a crash leaves the old or the new list, never a part).
    pub fn rewrite(&self, changes: &[Change]) -> std::io::Result<()> {
        let tmp = self.path.with_extension("journal.new");
        let mut file = std::fs::File::create(&tmp)?;
        for change in changes {
            file.write_all(line(change).as_bytes())?;
        }
        file.sync_data()?;
        std::fs::rename(&tmp, &self.path)
    }

    /// Removes the journal once everything in it was undone.
    pub fn clear(&self) -> std::io::Result<()> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_torn_lines_are_skipped() {
        let a = Change::IpRule {
            netns: Some("ns1".into()),
            family: 4,
            fwmark: 0x5359,
            table: 5359,
            priority: 5359,
        };
        let b = Change::NftTable {
            netns: None,
            name: "switchyard".into(),
        };
        let c = Change::IpRuleFrom {
            netns: None,
            family: 6,
            from: "fd7a:5359:5400::2".parse().expect("address"),
            table: 5359,
            priority: 5360,
        };
        let text = format!("{}{}{}{{\"change\":\"ip_ro", line(&a), line(&b), line(&c));
        assert_eq!(parse(&text), vec![a, b, c]);
    }

    #[test]
    fn changes_read_as_what_they_are_on_the_host() {
        let rule = Change::IpRule {
            netns: Some("ns1".into()),
            family: 4,
            fwmark: 0x5359,
            table: 0x5359,
            priority: 5359,
        };
        assert_eq!(
            rule.to_string(),
            "ip -4 rule fwmark 0x5359 lookup 21337 priority 5359 (netns ns1)"
        );
        let nft = Change::NftTable {
            netns: None,
            name: "switchyard_split".into(),
        };
        assert_eq!(nft.to_string(), "nft table inet switchyard_split");
    }

    #[test]
    fn line_format_is_tagged_json() {
        let l = line(&Change::BpfPins {
            dir: "/sys/fs/bpf/switchyard".into(),
        });
        assert_eq!(
            l,
            "{\"change\":\"bpf_pins\",\"dir\":\"/sys/fs/bpf/switchyard\"}\n"
        );
    }

    #[test]
    fn a_private_cgroup2_mount_is_journalled_by_its_directory() {
        let c = Change::Cgroup2Mount {
            dir: "/var/lib/sy/cgroup2".into(),
        };
        let l = line(&c);
        assert_eq!(
            l,
            "{\"change\":\"cgroup2_mount\",\"dir\":\"/var/lib/sy/cgroup2\"}\n"
        );
        assert_eq!(parse(&l), vec![c]);
    }

    #[test]
    fn journal_file_records_appends_and_clears() {
        let dir = tempfile::tempdir().expect("tempdir");
        let j = Journal::new(dir.path());
        assert!(j.entries().expect("none").is_empty());
        let c = Change::Cgroup {
            path: "/sys/fs/cgroup/x".into(),
        };
        j.record(&c).expect("record");
        j.record(&c).expect("record");
        assert_eq!(j.entries().expect("entries").len(), 2);
        j.rewrite(std::slice::from_ref(&c)).expect("rewrite");
        assert_eq!(j.entries().expect("entries"), vec![c.clone()]);
        j.clear().expect("clear");
        assert!(!j.path().exists());
        j.clear().expect("clearing twice is fine");
    }
}

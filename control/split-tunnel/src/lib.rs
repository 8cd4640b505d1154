//! Host side of VPN split tunnelling for `switchyard client`: which sockets go into the TUN.
//!
//! [`SplitTunnel::start`] first undoes whatever a previous run left on the host (the journal, see
//! [`journal`]), then classifies the scope cgroup's sockets with the eBPF programs of
//! `switchyard-ebpf` — or, when they cannot load (no CAP_BPF, old kernel), with the nftables
//! fallback ([`nft`]: `socket cgroupv2` + `meta mark`), which behaves the same; [`SplitTunnel::
//! mechanism`] says which is active. Tunnelled sockets carry the tunnel mark, and policy routing
//! (`ip rule fwmark M lookup T`, table T = default route via the TUN device) sends them into the
//! tunnel; so does whatever leaves from the TUN's own addresses (`ip rule from A lookup T`: the
//! kernel's socketless replies of a closed tunnelled flow carry no mark); everything else takes
//! the main table. Rules follow the spec's split-tunnel model
//! ([`rules`]); changes apply live. [`SplitTunnel::on_resolved`] is the DNS path's hook: addresses
//! of names matching a domain rule join the split set. Every host change is journalled before it
//! is made, so a crash (`kill -9`) is cleaned up by the next start or by [`recover`]; disable
//! removes everything. The control plane owns this; the data plane never touches it.
//!
//! It acts in one network namespace only (the current one or [`SplitTunnelConfig::netns`]): the
//! eBPF programs compare each socket's netns cookie with that namespace's, because the cgroup tree
//! is shared by every namespace. When no cgroup2 mount is visible (under `ip netns exec`), the
//! hierarchy is mounted privately under the data directory ([`prepare_cgroup2`]) and unmounted
//! again with everything else.

pub mod cgroup;
pub mod exec_watch;
pub mod host;
pub mod journal;
pub mod nft;
pub mod rules;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ipnet::IpNet;
use serde::Serialize;
use switchyard_ebpf::{AppClass, AppImage, ClassifierConfig, NetList, SplitTunnelProgram};

pub use rules::{AppRule, CompiledRules, RuleError, SplitMode, SplitRules};
pub use switchyard_ebpf::{DnsRedirect, FlowOrigins, TcpRedirect};

use exec_watch::{ExecStats, ExecWatch};
use host::Host;
use journal::{Change, Journal};

/// Errors of the split tunnel.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Rule(#[from] RuleError),
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("eBPF: {0}")]
    Ebpf(#[from] switchyard_ebpf::Error),
    #[error("no cgroup2 mount (split tunnelling by app needs cgroup v2)")]
    NoCgroup2,
    #[error("cgroup {0} is outside the cgroup2 mount or /sys/fs/cgroup")]
    CgroupOutside(PathBuf),
    #[error("`{0}` cannot be used in an nftables ruleset")]
    UnsafeName(String),
    #[error("journal {0}: {1}")]
    Journal(PathBuf, #[source] std::io::Error),
    #[error("undo left {0} change(s) in place: {1}")]
    Undo(usize, String),
}

/// Which classification mechanism to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MechanismChoice {
    /// eBPF when it loads, else nftables.
    #[default]
    Auto,
    Ebpf,
    Nftables,
}

/// The classification mechanism in use (reported by the API).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mechanism {
    Ebpf,
    Nftables,
}

impl Mechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            Mechanism::Ebpf => "ebpf",
            Mechanism::Nftables => "nftables",
        }
    }
}

/// Where and how the split tunnel acts on the host.
#[derive(Clone, Debug)]
pub struct SplitTunnelConfig {
    /// Holds the journal (`split-tunnel.journal`).
    pub data_dir: PathBuf,
    /// Network namespace (`/run/netns/NAME`) for routes, rules and nft; `None` = the current one.
    pub netns: Option<String>,
    /// cgroup v2 directory whose processes (and descendants) are classified. Production: the
    /// cgroup2 root or the user's slice.
    pub scope_cgroup: PathBuf,
    /// Managed cgroup (created below the scope) that apps matched by name/path are moved into.
    pub apps_cgroup_name: String,
    /// cgroups never classified nor DNS-redirected (the client's own).
    pub bypass_cgroups: Vec<PathBuf>,
    /// TUN device that table `table` routes into.
    pub tun_device: String,
    /// The TUN device's own addresses: what leaves from them takes table `table` whatever its
    /// mark (`ip rule from A lookup T`, priority `rule_priority + 1`).
    pub tun_sources: Vec<IpAddr>,
    /// SO_MARK / packet mark of tunnelled traffic.
    pub tunnel_mark: u32,
    pub table: u32,
    pub rule_priority: u32,
    /// bpffs directory for pinned maps and links (mounted if it is not bpffs).
    pub bpf_pin_dir: PathBuf,
    /// Name of the nftables table of the fallback.
    pub nft_table: String,
    pub mechanism: MechanismChoice,
    /// DNS interception; `None` leaves DNS alone.
    pub dns: Option<DnsRedirect>,
    /// eBPF only: where tunnelled TCP goes from `connect(2)` instead of the TUN (the data
    /// plane's loopback listeners); `None` routes it into the TUN like the rest.
    pub tcp_redirect: Option<TcpRedirect>,
    /// Lockdown (issue 36): table `table` also holds `unreachable default` (both families, metric
    /// [`LOCKDOWN_METRIC`], so the TUN's default route wins while the TUN exists): when the TUN
    /// disappears with the client, marked traffic has no route instead of falling through to
    /// the main table. [`SplitTunnel::start`] takes over the state a previous run left instead
    /// of undoing it first.
    pub lockdown: bool,
}

/// Metric of lockdown's `unreachable default` in the tunnel's table: below every other default.
/// Not `u32::MAX`: an IPv6 route of that metric survives `ip -6 route flush table T` (iproute2
/// 6.1, seen), so the undo would leave it.
pub const LOCKDOWN_METRIC: u32 = u32::MAX - 1;

impl SplitTunnelConfig {
    /// Defaults for a client: mark/table/priority 0x5359 ("SY"); pins on a bpffs of its own under
    /// /run (mounted at start, unmounted at cleanup), which works whether or not the host mounts
    /// /sys/fs/bpf.
    pub fn new(data_dir: &Path, scope_cgroup: &Path, tun_device: &str) -> Self {
        SplitTunnelConfig {
            data_dir: data_dir.to_path_buf(),
            netns: None,
            scope_cgroup: scope_cgroup.to_path_buf(),
            apps_cgroup_name: "switchyard-split-apps".into(),
            bypass_cgroups: Vec::new(),
            tun_device: tun_device.into(),
            tun_sources: Vec::new(),
            tunnel_mark: 0x5359,
            table: 0x5359,
            rule_priority: 5359,
            bpf_pin_dir: PathBuf::from("/run/switchyard/bpffs"),
            nft_table: "switchyard_split".into(),
            mechanism: MechanismChoice::Auto,
            dns: None,
            tcp_redirect: None,
            lockdown: false,
        }
    }

    /// The nsfs file of [`SplitTunnelConfig::netns`] (`None`: the current namespace).
    pub fn netns_path(&self) -> Option<PathBuf> {
        self.netns
            .as_ref()
            .map(|name| Path::new("/run/netns").join(name))
    }
}

/// What the API reports about the split tunnel.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SplitTunnelStatus {
    /// `ebpf` or `nftables`
    pub mechanism: &'static str,
    /// Why eBPF is not in use, when the fallback was chosen automatically.
    pub fallback_reason: Option<String>,
    pub mode: SplitMode,
    /// Addresses learnt from DNS answers for domain rules.
    pub resolved_addresses: usize,
}

/// Undoes every change recorded in `data_dir`'s journal, newest first, then deletes the journal.
/// Returns how many entries were undone. Safe to call when there is nothing to undo.
pub fn recover(data_dir: &Path) -> Result<usize, Error> {
    let journal = Journal::new(data_dir);
    let entries = journal
        .entries()
        .map_err(|e| Error::Journal(journal.path().to_path_buf(), e))?;
    remount_private_cgroup2(&entries);
    let mut failures = Vec::new();
    for change in entries.iter().rev() {
        if let Err(e) = undo(change) {
            tracing::warn!(?change, error = %e, "undoing a split-tunnel change failed");
            failures.push(e.to_string());
        }
    }
    if !failures.is_empty() {
        // keep the journal: the next start tries again
        return Err(Error::Undo(failures.len(), failures.join("; ")));
    }
    journal
        .clear()
        .map_err(|e| Error::Journal(journal.path().to_path_buf(), e))?;
    if !entries.is_empty() {
        tracing::info!(undone = entries.len(), "removed split-tunnel leftovers");
    }
    Ok(entries.len())
}

/// Where a split tunnel with data directory `data_dir` mounts the cgroup2 hierarchy when none is
/// visible: an absolute path without symlinks (as /proc/self/mountinfo shows mount points), also
/// for a relative data directory such as the client's default `./data/client`.
pub fn private_cgroup2_dir(data_dir: &Path) -> PathBuf {
    std::fs::canonicalize(data_dir)
        .unwrap_or_else(|_| data_dir.to_path_buf())
        .join("cgroup2")
}

/// The cgroup2 mount to classify in, and whether it is the client's own: the visible mount, or
/// — none visible, as under `ip netns exec`, which remounts /sys — the hierarchy mounted at
/// [`private_cgroup2_dir`]. With `journal`, the private mount is journalled (before it is made),
/// so disable and recovery unmount it; a private mount found in place (made by
/// [`prepare_cgroup2`], or left by a crash) is journalled then.
fn cgroup2_or_private(
    data_dir: &Path,
    journal: Option<&Journal>,
) -> Result<(PathBuf, bool), Error> {
    std::fs::create_dir_all(data_dir)
        .map_err(|e| Error::Io(format!("create {}", data_dir.display()), e))?;
    let private = private_cgroup2_dir(data_dir);
    let record = |journal: Option<&Journal>| -> Result<(), Error> {
        let Some(journal) = journal else {
            return Ok(());
        };
        journal
            .record(&Change::Cgroup2Mount {
                dir: private.clone(),
            })
            .map_err(|e| Error::Journal(journal.path().to_path_buf(), e))
    };
    match cgroup::cgroup2_mount() {
        Ok(mount) if mount == private => {
            record(journal)?;
            Ok((mount, true))
        }
        Ok(mount) => Ok((mount, false)),
        Err(Error::NoCgroup2) => {
            record(journal)?;
            cgroup::mount_cgroup2(&private)?;
            tracing::info!(mount = %private.display(), "no cgroup2 mount is visible (a remounted /sys, as under `ip netns exec`): mounted a private cgroup2 hierarchy for the split tunnel; it is unmounted when the VPN stops");
            Ok((private, true))
        }
        Err(e) => Err(e),
    }
}

/// Prepares a split tunnel's start in `data_dir` for a caller that needs the cgroup2 hierarchy
/// before [`SplitTunnel::start`] (to name the scope and its own bypass cgroup): undoes what a
/// previous run left ([`recover`]), then returns the visible cgroup2 mount or mounts a private one
/// (see [`private_cgroup2_dir`]), which the start then journals, so that disable and recovery
/// unmount it.
///
/// With `take_over` (lockdown), what a previous run left stays in place: the start takes it over.
pub fn prepare_cgroup2(data_dir: &Path, take_over: bool) -> Result<PathBuf, Error> {
    if !take_over {
        recover(data_dir)?;
    }
    cgroup2_or_private(data_dir, None).map(|(mount, _)| mount)
}

/// A private cgroup2 mount that is gone while cgroups created through it are still journalled (a
/// kill -9 under `ip netns exec` ends the mount namespace, and the mount with it, but not the
/// cgroups) is mounted again, so that their undo can remove them; its own undo, which comes last
/// (it was journalled first), unmounts it again.
fn remount_private_cgroup2(entries: &[Change]) {
    for change in entries {
        let Change::Cgroup2Mount { dir } = change else {
            continue;
        };
        let needed = entries
            .iter()
            .any(|c| matches!(c, Change::Cgroup { path } if path.starts_with(dir)));
        if needed && !cgroup::is_cgroup2_mount(dir) {
            if let Err(e) = cgroup::mount_cgroup2(dir) {
                tracing::warn!(mount = %dir.display(), error = %e, "cannot mount the cgroup2 hierarchy again to remove the split tunnel's cgroups");
            }
        }
    }
}

fn undo(change: &Change) -> Result<(), Error> {
    match change {
        Change::IpRule { netns, .. } | Change::IpRuleFrom { netns, .. } => Host {
            netns: netns.clone(),
        }
        .run_undo("ip", &as_strs(&rule_args("del", change))),
        Change::IpRoutes {
            netns,
            family,
            table,
        } => Host {
            netns: netns.clone(),
        }
        .run_undo(
            "ip",
            &[
                &format!("-{family}"),
                "route",
                "flush",
                "table",
                &table.to_string(),
            ],
        ),
        Change::NftTable { netns, name } => Host {
            netns: netns.clone(),
        }
        .run_undo("nft", &["delete", "table", "inet", name]),
        Change::BpfPins { dir } => switchyard_ebpf::remove_pins(dir)
            .map(|_| ())
            .map_err(Error::from),
        Change::BpffsMount { dir } => {
            switchyard_ebpf::unmount_bpffs(dir)?;
            let _ = std::fs::remove_dir(dir);
            Ok(())
        }
        Change::Cgroup { path } => cgroup::remove_cgroup(path),
        Change::Cgroup2Mount { dir } => cgroup::unmount_cgroup2(dir),
    }
}

/// The arguments of `ip -<family> rule <op> <selector> lookup <table> priority <priority>` for
/// a journalled rule (none for other changes).
fn rule_args(op: &str, change: &Change) -> Vec<String> {
    let (family, selector, table, priority) = match change {
        Change::IpRule {
            family,
            fwmark,
            table,
            priority,
            ..
        } => (
            family,
            ["fwmark".to_string(), format!("{fwmark:#x}")],
            table,
            priority,
        ),
        Change::IpRuleFrom {
            family,
            from,
            table,
            priority,
            ..
        } => (
            family,
            ["from".to_string(), from.to_string()],
            table,
            priority,
        ),
        _ => return Vec::new(),
    };
    let [key, value] = selector;
    vec![
        format!("-{family}"),
        "rule".into(),
        op.into(),
        key,
        value,
        "lookup".into(),
        table.to_string(),
        "priority".into(),
        priority.to_string(),
    ]
}

fn as_strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// What the eBPF maps hold now (so updates are diffs).
#[derive(Default)]
struct Installed {
    split: BTreeSet<IpNet>,
    bypass: BTreeSet<IpNet>,
    apps: BTreeMap<u64, AppClass>,
    /// names and paths the exec hook matches
    images: BTreeSet<AppImage>,
}

/// What the exec hook matches for the name/path app rules: a rule's path when it has one (the
/// path decides then, as in [`cgroup::app_matches`]), else its name.
fn app_images(apps: &[AppRule]) -> BTreeSet<AppImage> {
    apps.iter()
        .filter(|a| a.cgroup.is_none())
        .filter_map(|a| match &a.path {
            Some(path) => Some(AppImage::Path(path.clone())),
            None if !a.name.trim().is_empty() => Some(AppImage::Name(a.name.clone())),
            None => None,
        })
        .collect()
}

enum Classifier {
    Ebpf(Box<SplitTunnelProgram>, Installed),
    Nft,
}

/// An active split tunnel.
pub struct SplitTunnel {
    config: SplitTunnelConfig,
    host: Host,
    journal: Journal,
    rules: SplitRules,
    compiled: CompiledRules,
    /// domain → addresses it resolved to, for names matching a domain rule
    resolved: BTreeMap<String, BTreeSet<IpAddr>>,
    classifier: Classifier,
    fallback_reason: Option<String>,
    cgroup_mount: PathBuf,
    /// `cgroup_mount` is the client's own mount of the hierarchy (none was visible).
    private_cgroup2: bool,
    apps_cgroup: PathBuf,
    /// The cookie of the network namespace the tunnel acts in (eBPF only: the programs leave
    /// sockets of every other namespace alone); 0 until the programs load.
    netns_cookie: u64,
    /// pid → the cgroup a process was in before it was moved into the apps cgroup
    moved_from: BTreeMap<u32, PathBuf>,
    /// nftables: moves apps by name/path into the apps cgroup at exec (`None` with eBPF, or
    /// where fanotify permission events are unavailable: the scan alone then)
    exec_watch: Option<ExecWatch>,
    /// Installing over a previous run's lockdown state (see [`SplitTunnel::start`]).
    taking_over: bool,
}

/// The entries of a previous run's journal that a takeover's new state no longer uses (`new`:
/// what the takeover journalled): a rule for another TUN address, the other mechanism's nft
/// table or pins. A cgroup, a cgroup2 mount or a bpffs mount is journalled only by the run that
/// created it, so it stays (a bpffs mount only while the new state uses eBPF).
pub fn stale_entries(old: &[Change], new: &[Change], mechanism: Mechanism) -> Vec<Change> {
    let mut stale: Vec<Change> = Vec::new();
    for change in old {
        let unused = !new.contains(change)
            && match change {
                Change::Cgroup { .. } | Change::Cgroup2Mount { .. } => false,
                Change::BpffsMount { .. } => mechanism == Mechanism::Nftables,
                _ => true,
            };
        if unused && !stale.contains(change) {
            stale.push(change.clone());
        }
    }
    stale
}

impl SplitTunnel {
    /// Cleans up leftovers, chooses the mechanism, installs policy routing and the rules.
    ///
    /// With [`SplitTunnelConfig::lockdown`], the state a previous run left (its journal) is not
    /// undone first: every step re-installs idempotently over it (the classifier is swapped for
    /// the new one), then what the new state no longer uses is removed ([`stale_entries`]), so
    /// tunnelled traffic has no moment without the tunnel's rules. A failed takeover leaves the
    /// state in place (still closed), for the next start or `vpn-unlock`.
    pub fn start(config: SplitTunnelConfig, rules: SplitRules) -> Result<Self, Error> {
        let inherited = if config.lockdown {
            let journal = Journal::new(&config.data_dir);
            journal
                .entries()
                .map_err(|e| Error::Journal(journal.path().to_path_buf(), e))?
        } else {
            recover(&config.data_dir)?;
            Vec::new()
        };
        let compiled = CompiledRules::compile(&rules)?;
        for name in [&config.nft_table, &config.tun_device] {
            if !nft::safe_name(name) {
                return Err(Error::UnsafeName(name.clone()));
            }
        }
        let host = Host {
            netns: config.netns.clone(),
        };
        let journal = Journal::new(&config.data_dir);
        let (cgroup_mount, private_cgroup2) = cgroup2_or_private(&config.data_dir, Some(&journal))?;
        let apps_cgroup = config.scope_cgroup.join(&config.apps_cgroup_name);

        let mut tunnel = SplitTunnel {
            config,
            host,
            journal,
            rules,
            compiled,
            resolved: BTreeMap::new(),
            classifier: Classifier::Nft,
            fallback_reason: None,
            cgroup_mount,
            private_cgroup2,
            apps_cgroup,
            netns_cookie: 0,
            moved_from: BTreeMap::new(),
            exec_watch: None,
            taking_over: !inherited.is_empty(),
        };
        // from here on, a failure undoes what was done so far (unless it was taken over)
        match tunnel.install() {
            Ok(()) if tunnel.taking_over => {
                tunnel.taking_over = false;
                tunnel.reconcile(&inherited)?;
                Ok(tunnel)
            }
            Ok(()) => Ok(tunnel),
            Err(e) if tunnel.taking_over => {
                tracing::error!(error = %e, "taking over the lockdown state failed: it stays installed (tunnelled apps stay blocked) until a start succeeds or `switchyard client vpn-unlock` removes it");
                tunnel.keep();
                Err(e)
            }
            Err(e) => {
                if let Err(undo) = tunnel.disable() {
                    tracing::warn!(error = %undo, "undoing a failed split-tunnel start was incomplete: the next start removes what is left");
                }
                Err(e)
            }
        }
    }

    /// After a takeover: undoes what the previous run installed that the new state does not use,
    /// and rewrites the journal without those entries and without repeats.
    fn reconcile(&self, inherited: &[Change]) -> Result<(), Error> {
        let jerr = |e| Error::Journal(self.journal.path().to_path_buf(), e);
        let all = self.journal.entries().map_err(jerr)?;
        let new = all.get(inherited.len()..).unwrap_or_default();
        let stale = stale_entries(inherited, new, self.mechanism());
        for change in stale.iter().rev() {
            undo(change)?;
        }
        let mut kept: Vec<Change> = Vec::new();
        for change in all {
            if !stale.contains(&change) && !kept.contains(&change) {
                kept.push(change);
            }
        }
        self.journal.rewrite(&kept).map_err(jerr)?;
        tracing::info!(
            kept = kept.len(),
            removed = stale.len(),
            "took over the lockdown state of the previous run"
        );
        Ok(())
    }

    fn record(&self, change: Change) -> Result<(), Error> {
        self.journal
            .record(&change)
            .map_err(|e| Error::Journal(self.journal.path().to_path_buf(), e))
    }

    fn install(&mut self) -> Result<(), Error> {
        if !self.apps_cgroup.exists() {
            self.record(Change::Cgroup {
                path: self.apps_cgroup.clone(),
            })?;
            std::fs::create_dir(&self.apps_cgroup)
                .map_err(|e| Error::Io(format!("create {}", self.apps_cgroup.display()), e))?;
        }
        self.classifier = match self.config.mechanism {
            MechanismChoice::Nftables => Classifier::Nft,
            MechanismChoice::Ebpf => self.load_ebpf()?,
            MechanismChoice::Auto => match self.load_ebpf() {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "eBPF classification unavailable; using the nftables fallback");
                    let _ = switchyard_ebpf::remove_pins(&self.config.bpf_pin_dir);
                    self.fallback_reason = Some(e.to_string());
                    Classifier::Nft
                }
            },
        };
        if matches!(self.classifier, Classifier::Nft) {
            self.record(Change::NftTable {
                netns: self.config.netns.clone(),
                name: self.config.nft_table.clone(),
            })?;
            self.exec_watch = match ExecWatch::start(
                &self.apps_cgroup,
                &self.cgroup_mount,
                self.own_netns(),
            ) {
                Ok(watch) => Some(watch),
                Err(e) => {
                    tracing::warn!(error = %e, "apps by name or path are found by a /proc scan every 2 s only: a process started while the VPN is on may make its first connections (and DNS queries) outside its rule until then");
                    None
                }
            };
        }
        self.install_routing()?;
        self.sync()?;
        self.refresh_apps()?;
        tracing::info!(
            mechanism = self.mechanism().as_str(),
            mode = self.rules.mode.as_str(),
            "split tunnel active"
        );
        Ok(())
    }

    fn load_ebpf(&mut self) -> Result<Classifier, Error> {
        let dir = self.config.bpf_pin_dir.clone();
        let mounted = switchyard_ebpf::ensure_bpffs(&dir)?;
        if mounted {
            self.record(Change::BpffsMount { dir: dir.clone() })?;
        }
        self.record(Change::BpfPins { dir: dir.clone() })?;
        self.netns_cookie = switchyard_ebpf::netns_cookie(self.config.netns_path().as_deref())?;
        if self.taking_over {
            return self.take_over_ebpf(&dir);
        }
        let program =
            SplitTunnelProgram::attach(&self.config.scope_cgroup, &dir, &self.classifier_config())?;
        Ok(Classifier::Ebpf(Box::new(program), Installed::default()))
    }

    /// The previous run's programs keep classifying until the new ones replace them: the new
    /// programs load with fresh maps, the maps are filled by the rules, the old links leave the
    /// file system but stay attached while the new ones attach beside them (each hook runs
    /// both for a moment: the same marks; a TCP connect the old program already sent to loopback
    /// is not redirected again and finds no record: reset), then the old ones detach. A failure
    /// before the attach leaves the old programs attached; a failed attach drops them too (the
    /// VPN reports the error).
    fn take_over_ebpf(&mut self, dir: &Path) -> Result<Classifier, Error> {
        switchyard_ebpf::remove_map_pins(dir)?;
        let program = SplitTunnelProgram::load(dir, &self.classifier_config())?;
        self.classifier = Classifier::Ebpf(Box::new(program), Installed::default());
        self.sync()?;
        let Classifier::Ebpf(mut program, installed) =
            std::mem::replace(&mut self.classifier, Classifier::Nft)
        else {
            unreachable!("set just above");
        };
        // the old links leave the file system but stay attached until the new ones are
        let old = switchyard_ebpf::hold_link_pins(dir)?;
        program.attach_to(&self.config.scope_cgroup)?;
        drop(old);
        Ok(Classifier::Ebpf(program, installed))
    }

    fn classifier_config(&self) -> ClassifierConfig {
        ClassifierConfig {
            mode: match self.rules.mode {
                SplitMode::Exclude => switchyard_ebpf::Mode::Exclude,
                SplitMode::Include => switchyard_ebpf::Mode::Include,
            },
            tunnel_mark: self.config.tunnel_mark,
            dns: self.config.dns,
            netns_cookie: self.netns_cookie,
            tcp_redirect: self.config.tcp_redirect,
        }
    }

    /// `ip <fam> route replace unreachable default [metric M] table <ours>`.
    fn unreachable_default(&mut self, fam: &str, metric: Option<u32>) -> Result<(), Error> {
        let table = self.config.table.to_string();
        let metric = metric.map(|m| m.to_string());
        let mut args = vec![fam, "route", "replace", "unreachable", "default"];
        if let Some(m) = &metric {
            args.extend(["metric", m.as_str()]);
        }
        args.extend(["table", table.as_str()]);
        self.host.run("ip", &args, None).map(|_| ())
    }

    fn install_routing(&mut self) -> Result<(), Error> {
        let table = self.config.table.to_string();
        for family in [4u8, 6] {
            let fam = format!("-{family}");
            self.record(Change::IpRoutes {
                netns: self.config.netns.clone(),
                family,
                table: self.config.table,
            })?;
            let dev = self.host.run(
                "ip",
                &[
                    &fam,
                    "route",
                    "replace",
                    "default",
                    "dev",
                    &self.config.tun_device,
                    "table",
                    &table,
                ],
                None,
            );
            if let Err(e) = dev {
                if family == 4 {
                    return Err(e);
                }
                // no IPv6 on the device: marked IPv6 must not fall through to the main table
                tracing::warn!(error = %e, "no IPv6 route via the tunnel; tunnelled IPv6 is blocked");
                self.unreachable_default(&fam, None)?;
            }
            if self.config.lockdown {
                // when the TUN (and its default route with it) is gone, marked traffic finds
                // this one and fails instead of taking the main table
                self.unreachable_default(&fam, Some(LOCKDOWN_METRIC))?;
            }
            self.add_rule(Change::IpRule {
                netns: self.config.netns.clone(),
                family,
                fwmark: self.config.tunnel_mark,
                table: self.config.table,
                priority: self.config.rule_priority,
            })?;
            // What the kernel sends from a TUN address without a socket's mark — the RST for a
            // tunnelled flow's port that no longer has a socket, a reply to a packet conntrack
            // did not translate — goes into the tunnel too, never out by the main table with
            // the TUN's source. After the fwmark rule: a rule of higher precedence (the host's,
            // the client's own) still decides first.
            for from in self.config.tun_sources.iter().filter(|a| match a {
                IpAddr::V4(_) => family == 4,
                IpAddr::V6(_) => family == 6,
            }) {
                self.add_rule(Change::IpRuleFrom {
                    netns: self.config.netns.clone(),
                    family,
                    from: *from,
                    table: self.config.table,
                    priority: self.config.rule_priority + 1,
                })?;
            }
        }
        Ok(())
    }

    /// Journals a policy rule, then adds it (when taking over, the same rule may be in place).
    fn add_rule(&self, rule: Change) -> Result<(), Error> {
        self.record(rule.clone())?;
        match self
            .host
            .run("ip", &as_strs(&rule_args("add", &rule)), None)
        {
            Err(Error::Command { stderr, .. })
                if self.taking_over && stderr.to_ascii_lowercase().contains("file exists") =>
            {
                Ok(())
            }
            other => other.map(drop),
        }
    }

    /// The active mechanism.
    /// The original destinations of redirected TCP connections, with the eBPF classifier and
    /// [`SplitTunnelConfig::tcp_redirect`] set; `None` otherwise (or when the map cannot be
    /// shared: the listeners then reset what arrives, logged here).
    pub fn flow_origins(&self) -> Option<FlowOrigins> {
        self.config.tcp_redirect?;
        match &self.classifier {
            Classifier::Ebpf(program, _) => program
                .flow_origins()
                .map_err(|e| tracing::error!(error = %e, "redirected TCP flows cannot be served"))
                .ok(),
            _ => None,
        }
    }

    pub fn mechanism(&self) -> Mechanism {
        match self.classifier {
            Classifier::Ebpf(..) => Mechanism::Ebpf,
            Classifier::Nft => Mechanism::Nftables,
        }
    }

    /// Why eBPF was not used, when the fallback is active under [`MechanismChoice::Auto`].
    pub fn fallback_reason(&self) -> Option<&str> {
        self.fallback_reason.as_deref()
    }

    /// Mechanism, fallback reason, mode and DNS-learnt entries, for the API.
    pub fn status(&self) -> SplitTunnelStatus {
        SplitTunnelStatus {
            mechanism: self.mechanism().as_str(),
            fallback_reason: self.fallback_reason.clone(),
            mode: self.rules.mode,
            resolved_addresses: self.resolved.values().map(BTreeSet::len).sum(),
        }
    }

    /// The rules in force (as the API shows them).
    pub fn rules(&self) -> &SplitRules {
        &self.rules
    }

    /// The managed cgroup that apps matched by name/path are moved into.
    pub fn apps_cgroup(&self) -> &Path {
        &self.apps_cgroup
    }

    /// Replaces all rules; applies at once.
    pub fn set_rules(&mut self, rules: SplitRules) -> Result<(), Error> {
        self.compiled = CompiledRules::compile(&rules)?;
        self.rules = rules;
        let compiled = &self.compiled;
        self.resolved
            .retain(|domain, _| compiled.domain_matches(domain));
        self.sync()?;
        self.refresh_apps().map(|_| ())
    }

    fn edit(&mut self, f: impl FnOnce(&mut SplitRules)) -> Result<(), Error> {
        let mut rules = self.rules.clone();
        f(&mut rules);
        self.set_rules(rules)
    }

    pub fn set_mode(&mut self, mode: SplitMode) -> Result<(), Error> {
        self.edit(|r| r.mode = mode)
    }

    pub fn add_ip(&mut self, cidr: &str) -> Result<(), Error> {
        rules::parse_net(cidr)?;
        self.edit(|r| {
            if !r.ips.iter().any(|i| i == cidr) {
                r.ips.push(cidr.to_string())
            }
        })
    }

    /// Removes an `ips` entry; returns whether it was there.
    pub fn remove_ip(&mut self, cidr: &str) -> Result<bool, Error> {
        let present = self.rules.ips.iter().any(|i| i == cidr);
        self.edit(|r| r.ips.retain(|i| i != cidr))?;
        Ok(present)
    }

    pub fn add_domain(&mut self, pattern: &str) -> Result<(), Error> {
        self.edit(|r| {
            if !r.domains.iter().any(|d| d == pattern) {
                r.domains.push(pattern.to_string())
            }
        })
    }

    /// Removes a domain rule and the addresses it contributed; returns whether it was there.
    pub fn remove_domain(&mut self, pattern: &str) -> Result<bool, Error> {
        let present = self.rules.domains.iter().any(|d| d == pattern);
        self.edit(|r| r.domains.retain(|d| d != pattern))?;
        Ok(present)
    }

    pub fn add_app(&mut self, app: AppRule) -> Result<(), Error> {
        self.edit(|r| {
            r.apps.retain(|a| a.name != app.name);
            r.apps.push(app)
        })
    }

    /// Removes an app by name; returns whether it was there. Its processes leave the apps cgroup.
    pub fn remove_app(&mut self, name: &str) -> Result<bool, Error> {
        let present = self.rules.apps.iter().any(|a| a.name == name);
        self.edit(|r| r.apps.retain(|a| a.name != name))?;
        Ok(present)
    }

    /// The resolver hook: when `domain` matches a domain rule, its addresses join the split set
    /// (at once). Returns whether it matched.
    pub fn on_resolved(&mut self, domain: &str, ips: &[IpAddr]) -> Result<bool, Error> {
        if !self.compiled.domain_matches(domain) {
            return Ok(false);
        }
        let entry = self
            .resolved
            .entry(domain.trim_end_matches('.').to_ascii_lowercase())
            .or_default();
        let before = entry.len();
        entry.extend(ips.iter().copied());
        if entry.len() != before {
            self.sync()?;
        }
        Ok(true)
    }

    /// The network namespace the tunnel acts in, as [`cgroup::netns_id`] names it.
    fn own_netns(&self) -> Option<cgroup::NetnsId> {
        cgroup::netns_id(
            &self
                .config
                .netns_path()
                .unwrap_or_else(|| PathBuf::from("/proc/self/ns/net")),
        )
    }

    /// Execs the nftables exec watch saw and processes it moved into the apps cgroup (`None`
    /// with eBPF or where the watch could not start).
    pub fn exec_stats(&self) -> Option<Arc<ExecStats>> {
        self.exec_watch.as_ref().map(ExecWatch::stats)
    }

    /// Moves processes matching name/path app rules into the apps cgroup, and processes there that
    /// no longer match back to where they came from (the scope cgroup after a restart). Returns
    /// how many moved in.
    pub fn refresh_apps(&mut self) -> Result<usize, Error> {
        if let Some(watch) = &mut self.exec_watch {
            self.moved_from.extend(watch.take_moved());
            watch.refresh_marks();
        }
        let apps: Vec<&AppRule> = self
            .rules
            .apps
            .iter()
            .filter(|a| a.cgroup.is_none())
            .collect();
        let inside = cgroup::members(&self.apps_cgroup);
        let own = std::process::id();
        let own_netns = self.own_netns();
        let mut moved = 0;
        let processes = cgroup::processes();
        for p in &processes {
            let matches = p.pid != own
                && p.netns == own_netns
                && apps.iter().any(|a| cgroup::app_matches(a, p));
            let is_inside = inside.contains(&p.pid);
            // a process may exit between the scan and the move: failures are skipped
            if matches && !is_inside {
                let origin = cgroup::cgroup_of(&self.cgroup_mount, p.pid);
                if cgroup::move_process(&self.apps_cgroup, p.pid).is_ok() {
                    if let Some(origin) = origin {
                        self.moved_from.insert(p.pid, origin);
                    }
                    moved += 1;
                }
            } else if !matches && is_inside {
                let back = self
                    .moved_from
                    .remove(&p.pid)
                    .unwrap_or_else(|| self.config.scope_cgroup.clone());
                let _ = cgroup::move_process(&back, p.pid);
            }
        }
        self.moved_from
            .retain(|pid, _| processes.iter().any(|p| p.pid == *pid));
        Ok(moved)
    }

    fn split_nets(&self) -> BTreeSet<IpNet> {
        let mut nets: BTreeSet<IpNet> = self.compiled.nets.iter().copied().collect();
        for ips in self.resolved.values() {
            nets.extend(ips.iter().map(|ip| switchyard_ebpf::host_net(*ip)));
        }
        nets
    }

    /// The cgroups whose processes count as selected apps (those that exist).
    fn app_cgroup_paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.apps_cgroup.clone()];
        for app in &self.rules.apps {
            if let Some(cg) = &app.cgroup {
                let path = cgroup::resolve(&self.cgroup_mount, cg);
                if path.is_dir() {
                    paths.push(path);
                } else {
                    tracing::warn!(app = %app.name, cgroup = %path.display(), "app cgroup does not exist; ignored");
                }
            }
        }
        paths
    }

    /// Brings the active mechanism in line with the rules.
    fn sync(&mut self) -> Result<(), Error> {
        let split = self.split_nets();
        let bypass: BTreeSet<IpNet> = self.compiled.bypass.iter().copied().collect();
        let app_paths = self.app_cgroup_paths();
        let cfg = self.classifier_config();
        match &mut self.classifier {
            Classifier::Ebpf(program, installed) => {
                program.set_config(&cfg)?;
                let mut apps = BTreeMap::new();
                for path in &app_paths {
                    apps.insert(switchyard_ebpf::cgroup_id(path)?, AppClass::Selected);
                }
                for path in &self.config.bypass_cgroups {
                    apps.insert(switchyard_ebpf::cgroup_id(path)?, AppClass::Bypass);
                }
                sync_images(program, &mut installed.images, app_images(&self.rules.apps))?;
                sync_nets(program, NetList::Split, &mut installed.split, &split)?;
                sync_nets(program, NetList::Bypass, &mut installed.bypass, &bypass)?;
                for id in installed.apps.keys().filter(|id| !apps.contains_key(id)) {
                    program.remove_app_cgroup(*id)?;
                }
                for (id, class) in &apps {
                    if installed.apps.get(id) != Some(class) {
                        program.set_app_cgroup(*id, *class)?;
                    }
                }
                installed.apps = apps;
                Ok(())
            }
            Classifier::Nft => {
                let nft_ref = |p: &Path| -> Result<nft::NftCgroup, Error> {
                    let r = cgroup::nft_ref(&self.cgroup_mount, p, self.private_cgroup2)?;
                    if nft::safe_name(&r.1) {
                        Ok(r)
                    } else {
                        Err(Error::UnsafeName(r.1))
                    }
                };
                let scope = nft_ref(&self.config.scope_cgroup)?;
                let apps = app_paths
                    .iter()
                    .map(|p| nft_ref(p))
                    .collect::<Result<Vec<_>, _>>()?;
                let bypass_cgroups = self
                    .config
                    .bypass_cgroups
                    .iter()
                    .map(|p| nft_ref(p))
                    .collect::<Result<Vec<_>, _>>()?;
                let split: Vec<IpNet> = split.into_iter().collect();
                let bypass: Vec<IpNet> = bypass.into_iter().collect();
                let text = nft::ruleset(&nft::NftParams {
                    table: &self.config.nft_table,
                    mode: self.rules.mode,
                    mark: self.config.tunnel_mark,
                    scope: &scope,
                    app_cgroups: &apps,
                    bypass_cgroups: &bypass_cgroups,
                    split: &split,
                    bypass: &bypass,
                    tun_device: &self.config.tun_device,
                    dns: self.config.dns,
                });
                let (program, args) = cgroup::nft_command(
                    self.private_cgroup2.then_some(self.cgroup_mount.as_path()),
                );
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                self.host.run(program, &args, Some(&text))?;
                if let Some(watch) = &mut self.exec_watch {
                    watch.set_rules(&self.rules.apps);
                }
                Ok(())
            }
        }
    }

    /// Lockdown: lets go of the split tunnel without undoing anything (the pinned programs stay
    /// attached, routes, rules and the nft table stay; the journal lists them all).
    pub fn keep(mut self) {
        drop(self.exec_watch.take());
        tracing::info!(journal = %self.journal.path().display(), "lockdown: the split tunnel stays installed; tunnelled apps have no network until the client is back or `switchyard client vpn-unlock` runs");
    }

    /// Removes everything this split tunnel changed on the host.
    pub fn disable(mut self) -> Result<(), Error> {
        // stops the responder and closes the fanotify group, which removes its marks
        drop(self.exec_watch.take());
        if let Classifier::Ebpf(program, _) = self.classifier {
            program.detach()?;
        }
        recover(&self.config.data_dir).map(|_| ())
    }
}

fn sync_images(
    program: &mut SplitTunnelProgram,
    installed: &mut BTreeSet<AppImage>,
    wanted: BTreeSet<AppImage>,
) -> Result<(), Error> {
    let removed: Vec<&AppImage> = installed.difference(&wanted).collect();
    for image in &removed {
        program.remove_app_image(image)?;
    }
    if !removed.is_empty() {
        // a process recorded for a removed rule is no app any more; those still matching another
        // rule are moved into the apps cgroup by the scan that follows every rule change
        program.clear_app_processes()?;
    }
    // two names cut to the same 15-byte comm share one key: after a removal, every wanted image
    // is inserted again
    let inserted: Vec<&AppImage> = if removed.is_empty() {
        wanted.difference(installed).collect()
    } else {
        wanted.iter().collect()
    };
    for image in inserted {
        if !program.insert_app_image(image)? {
            tracing::warn!(
                ?image,
                "app path too long for the exec hook: matched by the /proc scan only"
            );
        }
    }
    *installed = wanted;
    Ok(())
}

fn sync_nets(
    program: &mut SplitTunnelProgram,
    list: NetList,
    installed: &mut BTreeSet<IpNet>,
    wanted: &BTreeSet<IpNet>,
) -> Result<(), Error> {
    for net in installed.difference(wanted) {
        program.remove_net(list, *net)?;
    }
    for net in wanted.difference(installed) {
        program.insert_net(list, *net)?;
    }
    *installed = wanted.clone();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_tunnel_can_move_to_the_control_plane_runtime() {
        // the client keeps it behind an async mutex on tokio worker threads
        fn send_and_sync<T: Send + Sync>() {}
        send_and_sync::<SplitTunnel>();
        send_and_sync::<SplitTunnelStatus>();
    }

    #[test]
    fn the_private_cgroup2_dir_is_absolute_for_a_relative_data_dir() {
        // mountinfo lists mount points absolute: a relative one would never be found mounted
        let dir = private_cgroup2_dir(Path::new("."));
        assert!(dir.is_absolute(), "{}", dir.display());
        assert!(dir.ends_with("cgroup2"));
    }

    #[test]
    fn exec_hook_matches_a_rule_by_path_when_it_has_one_else_by_name() {
        let app = |name: &str, path: Option<&str>, cgroup: Option<&str>| AppRule {
            name: name.into(),
            path: path.map(str::to_string),
            cgroup: cgroup.map(str::to_string),
            bundle_id: None,
        };
        let images = app_images(&[
            app("curl", None, None),
            app("tb", Some("/usr/lib/thunderbird/thunderbird-bin"), None),
            app("inc-app", None, Some("inc")),
            app(" ", None, None),
        ]);
        let want: BTreeSet<AppImage> = [
            AppImage::Name("curl".into()),
            AppImage::Path("/usr/lib/thunderbird/thunderbird-bin".into()),
        ]
        .into();
        assert_eq!(images, want);
    }

    #[test]
    fn a_takeover_removes_what_the_new_state_does_not_use_and_keeps_created_objects() {
        let rule = |from: &str| Change::IpRuleFrom {
            netns: None,
            family: 4,
            from: from.parse().expect("address"),
            table: 0x5359,
            priority: 5360,
        };
        let routes = Change::IpRoutes {
            netns: None,
            family: 4,
            table: 0x5359,
        };
        let nft = Change::NftTable {
            netns: None,
            name: "switchyard_split".into(),
        };
        let cgroup = Change::Cgroup {
            path: "/sys/fs/cgroup/s/apps".into(),
        };
        let bpffs = Change::BpffsMount {
            dir: "/var/lib/sy/bpffs".into(),
        };
        let pins = Change::BpfPins {
            dir: "/var/lib/sy/bpffs".into(),
        };
        let old = vec![
            cgroup.clone(),
            bpffs.clone(),
            pins.clone(),
            routes.clone(),
            rule("10.255.0.2"),
            rule("10.255.0.2"),
        ];
        // the same state again: nothing is stale
        let same = vec![pins.clone(), routes.clone(), rule("10.255.0.2")];
        assert!(stale_entries(&old, &same, Mechanism::Ebpf).is_empty());
        // a new TUN address and the nftables fallback this time
        let new = vec![nft, routes, rule("10.255.0.9")];
        assert_eq!(
            stale_entries(&old, &new, Mechanism::Nftables),
            vec![bpffs, pins, rule("10.255.0.2")]
        );
    }

    #[test]
    fn rule_arguments_name_selector_table_and_priority() {
        let from = Change::IpRuleFrom {
            netns: None,
            family: 6,
            from: "fd7a::2".parse().expect("address"),
            table: 0x5359,
            priority: 5360,
        };
        assert_eq!(
            rule_args("add", &from).join(" "),
            "-6 rule add from fd7a::2 lookup 21337 priority 5360"
        );
        let fwmark = Change::IpRule {
            netns: None,
            family: 4,
            fwmark: 0x5359,
            table: 0x5359,
            priority: 5359,
        };
        assert_eq!(
            rule_args("del", &fwmark).join(" "),
            "-4 rule del fwmark 0x5359 lookup 21337 priority 5359"
        );
        assert!(rule_args("del", &Change::BpfPins { dir: "/x".into() }).is_empty());
    }

    #[test]
    fn client_defaults_use_one_mark_for_rule_and_table() {
        let c =
            SplitTunnelConfig::new(Path::new("/var/lib/sy"), Path::new("/sys/fs/cgroup"), "sy0");
        assert_ne!(c.tunnel_mark, 0);
        assert_eq!(c.table, c.tunnel_mark);
        assert!(nft::safe_name(&c.nft_table));
        assert_eq!(Mechanism::Nftables.as_str(), "nftables");
        assert_eq!(Mechanism::Ebpf.as_str(), "ebpf");
    }
}

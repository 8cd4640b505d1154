//! eBPF split-tunnel classification and DNS interception for `switchyard client`, and the only
//! crate that touches raw bpf.
//!
//! The programs are C (`src/split_tunnel.bpf.c`), compiled by build.rs with clang when present,
//! otherwise taken from the checked-in `prebuilt/` object (a test fails when that object is stale).
//! [`SplitTunnelProgram`] loads them with aya, attaches them to one cgroup (the scope: every
//! process in it or below is classified), pins maps and links under a bpffs directory so they
//! outlive a crash and the next start can remove them ([`remove_pins`]), and updates the maps live:
//! the mode and tunnel mark, the destination LPM tries (split nets and `always_bypass`), the app
//! cgroups, the names and paths of apps, the DNS resolver redirect, and the TCP redirect: a
//! tunnelled TCP connect() goes straight to the data plane's loopback listener
//! ([`TcpRedirect`]), whose accepted connections' original destinations a `sockops` program
//! records by client address for [`FlowOrigins::take`]. Apps by name or path are
//! followed from exec by three BTF tracepoint programs (exec, fork, exit) that record a matching
//! process's tgid, so its sockets are classified from the first one; without kernel BTF they are
//! left out and the client's /proc scan alone moves such apps into the apps cgroup. The programs
//! act only on sockets of one network namespace (the client's, by its cookie: [`netns_cookie`]);
//! cgroup hooks would otherwise see the sockets of every namespace whose processes share the
//! cgroup tree. Policy routing, nftables and the rule model live in `switchyard-split-tunnel`,
//! which drives this crate.
//!
//! The second program, `src/reuseport_balance.bpf.c` ([`ReuseportBalancer`]), is the server's: it
//! hands new connections to the data plane's per-core `SO_REUSEPORT` listeners in turn.

mod bpffs;
mod flows;
mod maps;
mod netns;
mod reuseport;

use std::fs::File;
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::{Key, LpmTrie};
use aya::maps::{Array, HashMap, MapData};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::{BtfTracePoint, CgroupAttachMode, CgroupSock, CgroupSockAddr, SockOps};
use ipnet::IpNet;

pub use bpffs::{ensure_bpffs, fs_type_of, is_bpffs, unescape_mountinfo, unmount_bpffs};
pub use flows::FlowOrigins;
use maps::{comm_key, path_key, NetKey, RawConfig};
pub use maps::{
    host_net, AppClass, AppImage, ClassifierConfig, DnsRedirect, Mode, TcpRedirect, COMM_LEN,
    PATH_LEN,
};
pub use netns::netns_cookie;
pub use reuseport::{ReuseportBalancer, MAX_CORES, REUSEPORT_BALANCE_OBJECT};

#[cfg(test)]
mod prebuilt_tests;
#[cfg(test)]
mod stamp;

/// The compiled split-tunnel object linked into the binary.
pub const SPLIT_TUNNEL_OBJECT: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/split_tunnel.bpf.o"));

/// `built` when build.rs compiled the C source, `prebuilt` when it used `prebuilt/`.
pub const OBJECT_SOURCE: &str = env!("SWITCHYARD_EBPF_OBJECT_SOURCE");

/// The `cgroup/*4|6` socket-address programs of the object, attached after `sy_sock_create`.
const SOCK_ADDR_PROGRAMS: &[&str] = &[
    "sy_connect4",
    "sy_sendmsg4",
    "sy_recvmsg4",
    "sy_getpeername4",
    "sy_connect6",
    "sy_sendmsg6",
    "sy_recvmsg6",
    "sy_getpeername6",
];
const SOCK_CREATE_PROGRAM: &str = "sy_sock_create";
/// The `sockops` program recording redirected TCP connections for the listener, attached last.
const SOCK_OPS_PROGRAM: &str = "sy_tcp_connect";

/// The BTF tracepoint programs following apps by name or path, with their tracepoints; fork and
/// exit are attached before exec so that no record is made that they would not carry or remove.
const EXEC_HOOKS: &[(&str, &str)] = &[
    ("sy_app_fork", "sched_process_fork"),
    ("sy_app_exit", "sched_process_exit"),
    ("sy_app_exec", "sched_process_exec"),
];

/// Errors of loading, attaching and map updates.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    #[error("{0} is not on a bpf file system and mounting one failed")]
    Bpffs(PathBuf),
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("program {0}: {1}")]
    Program(&'static str, #[source] aya::programs::ProgramError),
    #[error("link of {0}: {1}")]
    Link(&'static str, #[source] aya::programs::links::LinkError),
    #[error("map {0}: {1}")]
    Map(&'static str, #[source] aya::maps::MapError),
    #[error("the object has no {0}")]
    Missing(&'static str),
    #[error("pinning {0}: {1}")]
    Pin(PathBuf, #[source] aya::pin::PinError),
    #[error("the tunnel mark must not be 0")]
    ZeroMark,
    #[error("the netns cookie must not be 0 (the programs would act on no socket)")]
    ZeroNetnsCookie,
    #[error("kernel BTF: {0}")]
    Btf(#[source] aya::BtfError),
    #[error("{0} listeners cannot be balanced (1 to {max})", max = reuseport::MAX_CORES)]
    Cores(usize),
}

/// The loaded, attached split-tunnel programs and their maps.
pub struct SplitTunnelProgram {
    pin_dir: PathBuf,
    links: Vec<PinnedLink>,
    config: Array<MapData, RawConfig>,
    split_v4: LpmTrie<MapData, u32, u32>,
    split_v6: LpmTrie<MapData, [u32; 4], u32>,
    bypass_v4: LpmTrie<MapData, u32, u32>,
    bypass_v6: LpmTrie<MapData, [u32; 4], u32>,
    apps: HashMap<MapData, u64, u32>,
    app_names: HashMap<MapData, [u8; COMM_LEN], u32>,
    app_paths: HashMap<MapData, [u8; PATH_LEN], u32>,
    app_tgids: HashMap<MapData, u32, u32>,
    /// `sy_tcp_flows`, read by [`FlowOrigins`].
    tcp_flows: MapData,
    /// The exec hooks are attached (apps by name/path are classified from exec).
    exec_hooks: bool,
    // keeps the programs loaded for as long as the links need them
    _ebpf: aya::Ebpf,
}

/// The destination tries: nets named by the rules, or `always_bypass`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetList {
    Split,
    Bypass,
}

fn maps_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("maps")
}

fn links_dir(pin_dir: &Path) -> PathBuf {
    pin_dir.join("links")
}

/// The cgroup v2 id of a cgroup directory (its kernfs inode number), as
/// `bpf_get_current_cgroup_id()` reports it.
pub fn cgroup_id(path: &Path) -> Result<u64, Error> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| m.ino())
        .map_err(|e| Error::Io(format!("stat {}", path.display()), e))
}

/// Removes every pinned map and link under `pin_dir` (left by a crash or a previous run); a
/// pinned cgroup link detaches when its pin is removed and no process holds it. Returns how many
/// pins were removed.
pub fn remove_pins(pin_dir: &Path) -> Result<usize, Error> {
    Ok(remove_link_pins(pin_dir)? + remove_map_pins(pin_dir)?)
}

/// Removes the pinned links under `pin_dir`: programs no process holds detach.
pub fn remove_link_pins(pin_dir: &Path) -> Result<usize, Error> {
    remove_pins_in(&links_dir(pin_dir))
}

/// Takes the pinned links under `pin_dir` off the file system but keeps them, and so their
/// programs, attached until the returned links drop: a takeover attaches the new programs
/// (pinned at the same paths) beside the old ones first, so no socket meets a hook without one.
pub fn hold_link_pins(pin_dir: &Path) -> Result<Vec<FdLink>, Error> {
    let dir = links_dir(pin_dir);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::Io(format!("read {}", dir.display()), e)),
    };
    let mut held = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let link = PinnedLink::from_pin(&path).map_err(|e| Error::Link("a pinned link", e))?;
        held.push(
            link.unpin()
                .map_err(|e| Error::Io(format!("unpin {}", path.display()), e))?,
        );
    }
    Ok(held)
}

/// Removes the pinned maps under `pin_dir` (attached programs keep theirs), so that the next
/// [`SplitTunnelProgram::load`] creates empty ones.
pub fn remove_map_pins(pin_dir: &Path) -> Result<usize, Error> {
    remove_pins_in(&maps_dir(pin_dir))
}

fn remove_pins_in(dir: &Path) -> Result<usize, Error> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::Io(format!("read {}", dir.display()), e)),
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        std::fs::remove_file(entry.path())
            .map_err(|e| Error::Io(format!("unpin {}", entry.path().display()), e))?;
        removed += 1;
    }
    let _ = std::fs::remove_dir(dir);
    Ok(removed)
}

/// Names of the pins present under `pin_dir` (`links/<program>`, `maps/<map>`).
pub fn list_pins(pin_dir: &Path) -> Vec<String> {
    let mut pins = Vec::new();
    for (kind, dir) in [("links", links_dir(pin_dir)), ("maps", maps_dir(pin_dir))] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                pins.push(format!("{kind}/{}", entry.file_name().to_string_lossy()));
            }
        }
    }
    pins.sort();
    pins
}

fn take_map(ebpf: &mut aya::Ebpf, name: &'static str) -> Result<aya::maps::Map, Error> {
    ebpf.take_map(name).ok_or(Error::Missing(name))
}

/// Loads, attaches and pins (under `links`) one BTF tracepoint program.
fn attach_tracepoint(
    ebpf: &mut aya::Ebpf,
    btf: &aya::Btf,
    links: &Path,
    name: &'static str,
    tracepoint: &str,
) -> Result<PinnedLink, Error> {
    let wrap = |e| Error::Program(name, e);
    let prog: &mut BtfTracePoint = ebpf
        .program_mut(name)
        .ok_or(Error::Missing(name))?
        .try_into()
        .map_err(wrap)?;
    prog.load(tracepoint, btf).map_err(wrap)?;
    let id = prog.attach().map_err(wrap)?;
    let link = FdLink::from(prog.take_link(id).map_err(wrap)?);
    let path = links.join(name);
    link.pin(&path).map_err(|e| Error::Pin(path, e))
}

/// Attaches every [`EXEC_HOOKS`] program, or none.
fn attach_exec_hooks(ebpf: &mut aya::Ebpf, links: &Path) -> Result<Vec<PinnedLink>, Error> {
    let btf = aya::Btf::from_sys_fs().map_err(Error::Btf)?;
    let mut pinned = Vec::new();
    for (name, tracepoint) in EXEC_HOOKS {
        match attach_tracepoint(ebpf, &btf, links, name, tracepoint) {
            Ok(link) => pinned.push(link),
            Err(e) => {
                for link in pinned {
                    let _ = link.unpin();
                }
                return Err(e);
            }
        }
    }
    Ok(pinned)
}

impl SplitTunnelProgram {
    /// Loads the programs with `config`, attaches them to the cgroup directory `scope` and pins
    /// maps and links under `pin_dir` (which must be on bpffs, see [`ensure_bpffs`], and should
    /// be empty: call [`remove_pins`] first).
    /// On failure nothing stays attached or pinned.
    pub fn attach(scope: &Path, pin_dir: &Path, config: &ClassifierConfig) -> Result<Self, Error> {
        let attached = Self::load(pin_dir, config).and_then(|mut program| {
            program.attach_to(scope)?;
            Ok(program)
        });
        attached.inspect_err(|_| {
            // links already pinned would keep programs attached after this process exits
            let _ = remove_pins(pin_dir);
        })
    }

    /// Loads the programs with `config` and pins their maps under `pin_dir` (reusing maps
    /// pinned there: call [`remove_map_pins`] first for empty ones), without attaching them:
    /// the maps can be filled first, then [`SplitTunnelProgram::attach_to`] attaches.
    pub fn load(pin_dir: &Path, config: &ClassifierConfig) -> Result<Self, Error> {
        config.check()?;
        let maps = maps_dir(pin_dir);
        let links = links_dir(pin_dir);
        for dir in [&maps, &links] {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::Io(format!("create {}", dir.display()), e))?;
        }
        let mut ebpf = aya::EbpfLoader::new()
            .default_map_pin_directory(&maps)
            .load(SPLIT_TUNNEL_OBJECT)?;
        let mut config_map: Array<MapData, RawConfig> =
            Array::try_from(take_map(&mut ebpf, "sy_config")?)
                .map_err(|e| Error::Map("sy_config", e))?;
        // the config is in place before any program can run
        config_map
            .set(0, RawConfig::from(config), 0)
            .map_err(|e| Error::Map("sy_config", e))?;
        let mut trie =
            |name: &'static str| -> Result<aya::maps::Map, Error> { take_map(&mut ebpf, name) };
        let split_v4 =
            LpmTrie::try_from(trie("sy_split_v4")?).map_err(|e| Error::Map("sy_split_v4", e))?;
        let split_v6 =
            LpmTrie::try_from(trie("sy_split_v6")?).map_err(|e| Error::Map("sy_split_v6", e))?;
        let bypass_v4 =
            LpmTrie::try_from(trie("sy_bypass_v4")?).map_err(|e| Error::Map("sy_bypass_v4", e))?;
        let bypass_v6 =
            LpmTrie::try_from(trie("sy_bypass_v6")?).map_err(|e| Error::Map("sy_bypass_v6", e))?;
        let apps = HashMap::try_from(trie("sy_app_cgroups")?)
            .map_err(|e| Error::Map("sy_app_cgroups", e))?;
        let app_names =
            HashMap::try_from(trie("sy_app_names")?).map_err(|e| Error::Map("sy_app_names", e))?;
        let app_paths =
            HashMap::try_from(trie("sy_app_paths")?).map_err(|e| Error::Map("sy_app_paths", e))?;
        let app_tgids =
            HashMap::try_from(trie("sy_app_tgids")?).map_err(|e| Error::Map("sy_app_tgids", e))?;
        let tcp_flows = match trie("sy_tcp_flows")? {
            aya::maps::Map::LruHashMap(data) => data,
            _ => return Err(Error::Missing("LRU hash sy_tcp_flows")),
        };
        Ok(SplitTunnelProgram {
            pin_dir: pin_dir.to_path_buf(),
            links: Vec::new(),
            config: config_map,
            split_v4,
            split_v6,
            bypass_v4,
            bypass_v6,
            apps,
            app_names,
            app_paths,
            app_tgids,
            tcp_flows,
            exec_hooks: false,
            _ebpf: ebpf,
        })
    }

    /// Attaches the loaded programs to the cgroup directory `scope` (beside any others there; the
    /// link pins must be free, see [`remove_link_pins`] and [`hold_link_pins`]) and the exec
    /// hooks, pinning every link.
    pub fn attach_to(&mut self, scope: &Path) -> Result<(), Error> {
        let links = links_dir(&self.pin_dir);
        std::fs::create_dir_all(&links)
            .map_err(|e| Error::Io(format!("create {}", links.display()), e))?;
        let cgroup =
            File::open(scope).map_err(|e| Error::Io(format!("open {}", scope.display()), e))?;
        let ebpf = &mut self._ebpf;

        // CgroupSock, CgroupSockAddr and SockOps share no trait: one macro loads, attaches and
        // pins any of them
        macro_rules! attach_pinned {
            ($ty:ty, $name:expr) => {{
                let name: &'static str = $name;
                let wrap = |e| Error::Program(name, e);
                let prog: &mut $ty = ebpf
                    .program_mut(name)
                    .ok_or(Error::Missing(name))?
                    .try_into()
                    .map_err(wrap)?;
                prog.load().map_err(wrap)?;
                // attached as a link (the kernel makes cgroup links "multi": a lockdown takeover
                // runs the new program beside the old one for a moment, see [`hold_link_pins`])
                let id = prog
                    .attach(&cgroup, CgroupAttachMode::Single)
                    .map_err(wrap)?;
                let link = FdLink::try_from(prog.take_link(id).map_err(wrap)?)
                    .map_err(|e| Error::Link(name, e))?;
                let path = links.join(name);
                link.pin(&path).map_err(|e| Error::Pin(path, e))?
            }};
        }
        let mut pinned = vec![attach_pinned!(CgroupSock, SOCK_CREATE_PROGRAM)];
        for name in SOCK_ADDR_PROGRAMS {
            pinned.push(attach_pinned!(CgroupSockAddr, name));
        }
        pinned.push(attach_pinned!(SockOps, SOCK_OPS_PROGRAM));

        let exec_hooks = match attach_exec_hooks(ebpf, &links) {
            Ok(hooks) => {
                pinned.extend(hooks);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "the exec hooks did not attach: apps by name or path are classified only once the /proc scan moved them into the apps cgroup");
                false
            }
        };
        tracing::info!(scope = %scope.display(), pins = %self.pin_dir.display(), object = OBJECT_SOURCE, exec_hooks, "eBPF split tunnel attached");
        self.links.extend(pinned);
        self.exec_hooks = exec_hooks;
        Ok(())
    }

    /// Replaces the classification settings; applies to the next connect/send.
    pub fn set_config(&mut self, config: &ClassifierConfig) -> Result<(), Error> {
        config.check()?;
        self.config
            .set(0, RawConfig::from(config), 0)
            .map_err(|e| Error::Map("sy_config", e))
    }

    /// Adds a destination network to one list; applies at once.
    pub fn insert_net(&mut self, list: NetList, net: IpNet) -> Result<(), Error> {
        match (NetKey::from(net), list) {
            (NetKey::V4 { prefix, addr }, NetList::Split) => self
                .split_v4
                .insert(&Key::new(prefix, addr), 1, 0)
                .map_err(|e| Error::Map("sy_split_v4", e)),
            (NetKey::V4 { prefix, addr }, NetList::Bypass) => self
                .bypass_v4
                .insert(&Key::new(prefix, addr), 1, 0)
                .map_err(|e| Error::Map("sy_bypass_v4", e)),
            (NetKey::V6 { prefix, addr }, NetList::Split) => self
                .split_v6
                .insert(&Key::new(prefix, addr), 1, 0)
                .map_err(|e| Error::Map("sy_split_v6", e)),
            (NetKey::V6 { prefix, addr }, NetList::Bypass) => self
                .bypass_v6
                .insert(&Key::new(prefix, addr), 1, 0)
                .map_err(|e| Error::Map("sy_bypass_v6", e)),
        }
    }

    /// Removes a destination network from one list; absent entries are not an error.
    pub fn remove_net(&mut self, list: NetList, net: IpNet) -> Result<(), Error> {
        let result = match (NetKey::from(net), list) {
            (NetKey::V4 { prefix, addr }, NetList::Split) => {
                self.split_v4.remove(&Key::new(prefix, addr))
            }
            (NetKey::V4 { prefix, addr }, NetList::Bypass) => {
                self.bypass_v4.remove(&Key::new(prefix, addr))
            }
            (NetKey::V6 { prefix, addr }, NetList::Split) => {
                self.split_v6.remove(&Key::new(prefix, addr))
            }
            (NetKey::V6 { prefix, addr }, NetList::Bypass) => {
                self.bypass_v6.remove(&Key::new(prefix, addr))
            }
        };
        match result {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(Error::Map("lpm trie", e)),
        }
    }

    /// Classifies the sockets of processes in the cgroup with this id.
    pub fn set_app_cgroup(&mut self, cgroup_id: u64, class: AppClass) -> Result<(), Error> {
        self.apps
            .insert(cgroup_id, class as u32, 0)
            .map_err(|e| Error::Map("sy_app_cgroups", e))
    }

    /// Forgets a cgroup; absent entries are not an error.
    pub fn remove_app_cgroup(&mut self, cgroup_id: u64) -> Result<(), Error> {
        match self.apps.remove(&cgroup_id) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(Error::Map("sy_app_cgroups", e)),
        }
    }

    /// Whether the exec hooks are attached: apps by name or path are then classified from exec.
    pub fn exec_hooks(&self) -> bool {
        self.exec_hooks
    }

    /// Adds a name or path that the exec hook matches; applies to the next exec. Returns false
    /// (and changes nothing) for one the hook cannot compare: a path longer than [`PATH_LEN`]
    /// bytes, an empty name.
    pub fn insert_app_image(&mut self, image: &AppImage) -> Result<bool, Error> {
        let inserted = match image {
            AppImage::Name(name) => comm_key(name).map(|key| {
                self.app_names
                    .insert(key, 1, 0)
                    .map_err(|e| Error::Map("sy_app_names", e))
            }),
            AppImage::Path(path) => path_key(path).map(|key| {
                self.app_paths
                    .insert(key, 1, 0)
                    .map_err(|e| Error::Map("sy_app_paths", e))
            }),
        };
        inserted.transpose().map(|done| done.is_some())
    }

    /// Removes a name or path of the exec hook; absent entries are not an error.
    pub fn remove_app_image(&mut self, image: &AppImage) -> Result<(), Error> {
        let result = match image {
            AppImage::Name(name) => comm_key(name).map(|key| self.app_names.remove(&key)),
            AppImage::Path(path) => path_key(path).map(|key| self.app_paths.remove(&key)),
        };
        match result {
            None | Some(Ok(())) | Some(Err(aya::maps::MapError::KeyNotFound)) => Ok(()),
            Some(Err(e)) => Err(Error::Map("sy_app_names/sy_app_paths", e)),
        }
    }

    /// Forgets every process the exec hook recorded (after the names or paths changed: a process
    /// recorded for a removed rule must not stay an app). Processes still matching are caught by
    /// the /proc scan, which moves them into the apps cgroup.
    pub fn clear_app_processes(&mut self) -> Result<usize, Error> {
        let tgids: Vec<u32> = self.app_tgids.keys().filter_map(Result::ok).collect();
        let mut removed = 0;
        for tgid in tgids {
            match self.app_tgids.remove(&tgid) {
                Ok(()) => removed += 1,
                // it exited meanwhile
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(Error::Map("sy_app_tgids", e)),
            }
        }
        Ok(removed)
    }

    /// The original destinations of redirected TCP connections, for the data plane's listener
    /// (see [`TcpRedirect`]); a handle of its own, usable on any thread.
    pub fn flow_origins(&self) -> Result<FlowOrigins, Error> {
        use std::os::fd::AsFd;
        let fd = self
            .tcp_flows
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| Error::Io("dup sy_tcp_flows".into(), e))?;
        Ok(FlowOrigins::new(fd))
    }

    /// The bpffs directory holding this instance's pins.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Detaches every program and removes every pin.
    pub fn detach(self) -> Result<(), Error> {
        for link in self.links {
            // unpinning and dropping the last fd detaches the link
            drop(
                link.unpin()
                    .map_err(|e| Error::Io("unpin link".into(), e))?,
            );
        }
        remove_pins(&self.pin_dir)?;
        Ok(())
    }
}

//! cgroup v2 helpers: where the hierarchy is mounted, how nftables names a cgroup, and apps by
//! process name or path.
//!
//! Apps matched by name or path are moved into one managed cgroup (the "apps" cgroup under the
//! scope) whose id the classifier knows — the way production split-tunnel tools do it — by the
//! [`crate::SplitTunnel::refresh_apps`] scan. A process started later is classified from its exec
//! on: with eBPF the exec hook records it (see `switchyard-ebpf`), with nftables the exec watch
//! ([`crate::exec_watch`], fanotify) moves it into the apps cgroup before its exec returns. So the
//! scan matters for processes that were running before the VPN came up (and, with nftables, for
//! all of them where fanotify permission events are unavailable). Only processes of the tunnel's
//! own network namespace are moved: one of a container or another `ip netns` with the same name
//! is none of the tunnel's business. Sockets a process opened before the move keep their mark
//! until their next connect/send.

use std::path::{Path, PathBuf};

use crate::exec_watch::comm_cut;
use crate::rules::AppRule;
use crate::Error;

/// Where nftables resolves `socket cgroupv2` paths from.
const NFT_CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The cgroup2 mount point in a `/proc/self/mountinfo` text.
pub fn cgroup2_mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-")?;
        if fields.get(sep + 1) != Some(&"cgroup2") {
            return None;
        }
        Some(PathBuf::from(switchyard_ebpf::unescape_mountinfo(
            fields.get(4)?,
        )))
    })
}

fn mountinfo() -> Result<String, Error> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::Io("read /proc/self/mountinfo".into(), e))
}

pub fn cgroup2_mount() -> Result<PathBuf, Error> {
    cgroup2_mount_in(&mountinfo()?).ok_or(Error::NoCgroup2)
}

/// Whether `dir` is a mount point of the cgroup2 hierarchy.
pub fn is_cgroup2_mount(dir: &Path) -> bool {
    let Ok(info) = mountinfo() else {
        return false;
    };
    info.lines().any(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        let sep = fields.iter().position(|f| *f == "-");
        sep.is_some_and(|sep| fields.get(sep + 1) == Some(&"cgroup2"))
            && fields
                .get(4)
                .is_some_and(|p| Path::new(&switchyard_ebpf::unescape_mountinfo(p)) == dir)
    })
}

/// Mounts the cgroup2 hierarchy (of this cgroup namespace) at `dir`, creating it: the same tree
/// as every other mount of it, seen through a mount of the client's own.
pub fn mount_cgroup2(dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("create {}", dir.display()), e))?;
    let out = std::process::Command::new("mount")
        .args(["-t", "cgroup2", "cgroup2"])
        .arg(dir)
        .output()
        .map_err(|e| Error::Io("run mount".into(), e))?;
    if out.status.success() && is_cgroup2_mount(dir) {
        Ok(())
    } else {
        Err(Error::Command {
            cmd: format!("mount -t cgroup2 cgroup2 {}", dir.display()),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Unmounts a cgroup2 mount made by [`mount_cgroup2`] and removes its directory; nothing to do
/// when it is not mounted (any more: a kill -9 under `ip netns exec` takes the mount namespace,
/// and the mount, with it). The cgroups themselves stay: they belong to the hierarchy.
pub fn unmount_cgroup2(dir: &Path) -> Result<(), Error> {
    if is_cgroup2_mount(dir) {
        let out = std::process::Command::new("umount")
            .arg(dir)
            .output()
            .map_err(|e| Error::Io("run umount".into(), e))?;
        if !out.status.success() {
            return Err(Error::Command {
                cmd: format!("umount {}", dir.display()),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        tracing::info!(mount = %dir.display(), "unmounted the private cgroup2 hierarchy");
    }
    // an empty directory left by the mount; anything else in it is not ours to remove
    let _ = std::fs::remove_dir(dir);
    Ok(())
}

/// Resolves an app rule's cgroup (absolute, or relative to the cgroup2 mount).
pub fn resolve(mount: &Path, cgroup: &str) -> PathBuf {
    let p = Path::new(cgroup);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        mount.join(p)
    }
}

/// How `socket cgroupv2 level L "PATH"` names a cgroup: L is its depth below the cgroup2 root,
/// PATH is relative to /sys/fs/cgroup (which nft prefixes, also on hybrid hosts where cgroup2 is
/// at /sys/fs/cgroup/unified). With `private` (the client's own mount of the hierarchy, see
/// [`mount_cgroup2`]) PATH is relative to `mount`, which nft then sees at /sys/fs/cgroup (see
/// `nft_command`).
pub fn nft_ref(mount: &Path, cgroup: &Path, private: bool) -> Result<(usize, String), Error> {
    let level = cgroup
        .strip_prefix(mount)
        .map_err(|_| Error::CgroupOutside(cgroup.to_path_buf()))?
        .components()
        .count();
    let root = if private {
        mount
    } else {
        Path::new(NFT_CGROUP_ROOT)
    };
    let rel = cgroup
        .strip_prefix(root)
        .map_err(|_| Error::CgroupOutside(cgroup.to_path_buf()))?;
    Ok((level, rel.to_string_lossy().into_owned()))
}

/// The program and arguments that load an nftables ruleset from stdin. nft resolves `socket
/// cgroupv2` paths below /sys/fs/cgroup only; with a private mount of the hierarchy it runs in a
/// mount namespace of its own where that mount is bound at /sys/fs/cgroup (the client's own mount
/// namespace stays as it is).
pub fn nft_command(private_mount: Option<&Path>) -> (&'static str, Vec<String>) {
    match private_mount {
        None => ("nft", vec!["-f".into(), "-".into()]),
        Some(mount) => (
            "unshare",
            vec![
                "--mount".into(),
                "--propagation".into(),
                "private".into(),
                "sh".into(),
                "-c".into(),
                format!("mount --bind \"$0\" {NFT_CGROUP_ROOT} && exec nft -f -"),
                mount.to_string_lossy().into_owned(),
            ],
        ),
    }
}

/// What identifies a process for app rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    /// `/proc/PID/comm` (the kernel truncates it to 15 bytes).
    pub name: String,
    /// `/proc/PID/exe`, when readable.
    pub exe: Option<String>,
    /// Its network namespace ([`netns_id`] of `/proc/PID/ns/net`), when readable.
    pub netns: Option<NetnsId>,
}

/// A network namespace as (device, inode) of its nsfs file: equal for `/proc/PID/ns/net` of every
/// process in it and for a `/run/netns/NAME` bind mount of it.
pub type NetnsId = (u64, u64);

/// The namespace of an nsfs file (`/proc/PID/ns/net`, `/run/netns/NAME`).
pub fn netns_id(path: &Path) -> Option<NetnsId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Whether a process belongs to an app rule matched by name/path (cgroup rules match by cgroup).
pub fn app_matches(app: &AppRule, p: &ProcessInfo) -> bool {
    if app.cgroup.is_some() {
        return false;
    }
    if let Some(path) = &app.path {
        return p.exe.as_deref() == Some(path.as_str());
    }
    // comm is cut at 15 bytes: compare against the same cut of the rule's name. The base name
    // of the executable counts too, cut the same way: it is what the nftables exec watch sees
    // (the file the kernel opened, symlinks resolved; see `exec_watch`), and a process it moved
    // into the apps cgroup must not be moved out again by the scan.
    let name = comm_cut(app.name.as_bytes());
    let exe_name = p
        .exe
        .as_deref()
        .and_then(|e| e.rsplit('/').next())
        .map(|b| comm_cut(b.as_bytes()));
    !name.is_empty() && (p.name.as_bytes() == name || exe_name == Some(name))
}

/// Every process visible in /proc.
pub fn processes() -> Vec<ProcessInfo> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let name = std::fs::read_to_string(e.path().join("comm")).ok()?;
            let exe = std::fs::read_link(e.path().join("exe"))
                .ok()
                .map(|p| p.to_string_lossy().into_owned());
            Some(ProcessInfo {
                pid,
                name: name.trim_end_matches('\n').to_string(),
                exe,
                netns: netns_id(&e.path().join("ns/net")),
            })
        })
        .collect()
}

/// The cgroup v2 directory of a process, from `/proc/PID/cgroup` (`0::/path`).
pub fn cgroup_of(mount: &Path, pid: u32) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    parse_v2_cgroup(&text).map(|rel| mount.join(rel))
}

/// The cgroup v2 path in a `/proc/PID/cgroup` text, relative to the cgroup2 mount.
pub fn parse_v2_cgroup(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim_start_matches('/'))
}

/// The processes in a cgroup (not its descendants).
pub fn members(cgroup: &Path) -> std::collections::BTreeSet<u32> {
    std::fs::read_to_string(cgroup.join("cgroup.procs"))
        .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// Moves a process into a cgroup.
pub fn move_process(cgroup: &Path, pid: u32) -> Result<(), Error> {
    std::fs::write(cgroup.join("cgroup.procs"), pid.to_string())
        .map_err(|e| Error::Io(format!("move {pid} into {}", cgroup.display()), e))
}

/// Moves every process of `cgroup` to its parent and removes it (undo of a managed cgroup).
pub fn remove_cgroup(cgroup: &Path) -> Result<(), Error> {
    if !cgroup.exists() {
        return Ok(());
    }
    if let (Some(parent), Ok(procs)) = (
        cgroup.parent(),
        std::fs::read_to_string(cgroup.join("cgroup.procs")),
    ) {
        for pid in procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            // a process that exited meanwhile is fine
            let _ = move_process(parent, pid);
        }
    }
    std::fs::remove_dir(cgroup).map_err(|e| Error::Io(format!("remove {}", cgroup.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_cgroup2_on_hybrid_and_unified_hosts() {
        let hybrid = "25 22 0:22 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n\
                      26 25 0:23 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount_in(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "25 22 0:22 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount_in(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            cgroup2_mount_in("1 2 0:1 / / rw - ext4 /dev/sda rw\n"),
            None
        );
    }

    #[test]
    fn nft_names_cgroups_by_level_and_sysfs_relative_path() {
        let mount = Path::new("/sys/fs/cgroup/unified");
        let (level, path) =
            nft_ref(mount, Path::new("/sys/fs/cgroup/unified/a/b"), false).expect("ref");
        assert_eq!((level, path.as_str()), (2, "unified/a/b"));
        let mount = Path::new("/sys/fs/cgroup");
        let (level, path) =
            nft_ref(mount, Path::new("/sys/fs/cgroup/user.slice"), false).expect("ref");
        assert_eq!((level, path.as_str()), (1, "user.slice"));
        assert!(nft_ref(mount, Path::new("/tmp/x"), false).is_err());
        // a private mount: nft sees it at /sys/fs/cgroup
        let private = Path::new("/var/lib/sy/cgroup2");
        let (level, path) =
            nft_ref(private, Path::new("/var/lib/sy/cgroup2/a/b"), true).expect("ref");
        assert_eq!((level, path.as_str()), (2, "a/b"));
        assert_eq!(nft_command(None).0, "nft");
        let (program, args) = nft_command(Some(private));
        assert_eq!(program, "unshare");
        assert_eq!(args.last().map(String::as_str), Some("/var/lib/sy/cgroup2"));
        assert_eq!(resolve(mount, "a/b"), PathBuf::from("/sys/fs/cgroup/a/b"));
        assert_eq!(resolve(mount, "/x/y"), PathBuf::from("/x/y"));
    }

    #[test]
    fn reads_the_v2_line_of_proc_pid_cgroup() {
        let text = "12:pids:/user.slice\n1:name=systemd:/user.slice/x.scope\n0::/syebpf1/inc\n";
        assert_eq!(parse_v2_cgroup(text), Some("syebpf1/inc"));
        assert_eq!(parse_v2_cgroup("0::/\n"), Some(""));
        assert_eq!(parse_v2_cgroup("1:name=systemd:/\n"), None);
    }

    #[test]
    fn apps_match_by_path_or_truncated_name() {
        let p = ProcessInfo {
            pid: 7,
            name: "thunderbird-bin".into(),
            exe: Some("/usr/lib/thunderbird/thunderbird-bin".into()),
            netns: None,
        };
        let by_name = |n: &str| AppRule {
            name: n.into(),
            ..AppRule::default()
        };
        assert!(app_matches(&by_name("thunderbird-binary"), &p));
        assert!(!app_matches(&by_name("thunderbird"), &p));
        // started through a symlink of another name: comm is the link's name, the exe is the
        // file's; either name matches
        let linked = ProcessInfo {
            name: "python3".into(),
            exe: Some("/usr/bin/python3.11".into()),
            ..p.clone()
        };
        assert!(app_matches(&by_name("python3"), &linked));
        assert!(app_matches(&by_name("python3.11"), &linked));
        assert!(!app_matches(&by_name("python"), &linked));
        let by_path = AppRule {
            name: "tb".into(),
            path: Some("/usr/lib/thunderbird/thunderbird-bin".into()),
            ..AppRule::default()
        };
        assert!(app_matches(&by_path, &p));
        let other_path = AppRule {
            path: Some("/usr/bin/curl".into()),
            ..by_path.clone()
        };
        assert!(!app_matches(&other_path, &p));
        let by_cgroup = AppRule {
            cgroup: Some("x".into()),
            ..by_name("thunderbird-bin")
        };
        assert!(!app_matches(&by_cgroup, &p));
    }
}

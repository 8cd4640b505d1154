//! Apps by name or path caught at exec for the nftables fallback (issue 38 item 2): fanotify
//! permission events on exec (`FAN_OPEN_EXEC_PERM`). The kernel holds an execing process inside
//! `execve` until the responder answers; the responder moves a process whose image matches a
//! name/path app rule into the apps cgroup first, so its first connection and its first DNS
//! query already come from that cgroup (`socket cgroupv2` of the nft rules). The /proc scan
//! ([`crate::SplitTunnel::refresh_apps`]) stays as the backstop for processes that were running
//! before, and it alone moves processes out again (an exec event cannot tell the image from the
//! ELF interpreter the kernel opens next, so no exec event ever moves a process out).
//!
//! Marks: a path rule's file gets an inode mark; name rules need every exec seen, so each real
//! filesystem of the mount table gets a filesystem mark (`FAN_MARK_FILESYSTEM`: a mount mark
//! would miss execs through the same filesystem mounted elsewhere, and the client may run in a
//! mount namespace of its own under `ip netns exec` whose mounts are copies; tmpfs takes
//! filesystem marks too). [`ExecWatch::refresh_marks`] re-adds them with every scan, for
//! filesystems mounted later and files replaced at a rule's path (a new inode).
//!
//! Every event is answered `FAN_ALLOW`, errors included: the responder decides where a process
//! goes, never whether it runs. It runs on its own OS thread and takes no lock the control plane
//! holds for long (the rules are an [`ArcSwap`] snapshot), so an exec on the host never waits on
//! the client's other work. When the client exits or crashes, the kernel closes the fanotify fd,
//! which removes the marks and allows every pending event.
//!
//! The syscalls need `unsafe` (libc); the rule matching, mount filtering and event parsing are
//! plain code with unit tests.
#![allow(unsafe_code)]

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;

use crate::cgroup::{self, NetnsId};
use crate::rules::AppRule;

/// Errors of the exec watch.
#[derive(Debug, thiserror::Error)]
pub enum ExecWatchError {
    #[error("fanotify_init (needs CAP_SYS_ADMIN and CONFIG_FANOTIFY_ACCESS_PERMISSIONS): {0}")]
    Init(#[source] std::io::Error),
    #[error("eventfd: {0}")]
    EventFd(#[source] std::io::Error),
    #[error("starting the exec responder thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// The kernel cuts comm at 15 bytes (TASK_COMM_LEN 16 with its NUL).
const COMM_LEN: usize = 15;

/// A name as comm shows it: cut at 15 bytes.
pub fn comm_cut(name: &[u8]) -> &[u8] {
    &name[..name.len().min(COMM_LEN)]
}

/// What an exec must match to be an app: the name/path app rules, as
/// [`cgroup::app_matches`] matches them (a rule's path when it has one, else its name).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecMatcher {
    /// name rules, cut at 15 bytes like comm
    names: BTreeSet<Vec<u8>>,
    /// path rules: absolute executable paths
    paths: BTreeSet<String>,
}

impl ExecMatcher {
    pub fn new(apps: &[AppRule]) -> ExecMatcher {
        let mut m = ExecMatcher::default();
        for app in apps.iter().filter(|a| a.cgroup.is_none()) {
            match &app.path {
                Some(path) => {
                    m.paths.insert(path.clone());
                }
                None if !app.name.is_empty() => {
                    m.names.insert(comm_cut(app.name.as_bytes()).to_vec());
                }
                None => {}
            }
        }
        m
    }

    /// Whether the executed file at `path` (the file the kernel opened for the exec, symlinks
    /// resolved) is an app's: a path rule's exact path, or a name rule equal to its base name cut
    /// at 15 bytes. comm after exec is the base name of the path given to execve; for a symlink
    /// with a name of its own (`python3` → `python3.11`) that is the link's name, which the event
    /// does not carry: the scan, which also matches comm, catches such a process instead.
    pub fn matches(&self, path: &[u8]) -> bool {
        if std::str::from_utf8(path).is_ok_and(|p| self.paths.contains(p)) {
            return true;
        }
        let base = path.rsplit(|b| *b == b'/').next().unwrap_or(path);
        !base.is_empty() && self.names.contains(comm_cut(base))
    }

    /// Whether any name rule needs every exec (filesystem marks).
    pub fn has_names(&self) -> bool {
        !self.names.is_empty()
    }

    pub fn paths(&self) -> &BTreeSet<String> {
        &self.paths
    }
}

/// Filesystem types that hold no executables of apps (kernel interfaces, device nodes): never
/// marked.
const PSEUDO_FILESYSTEMS: &[&str] = &[
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "bpf",
    "devpts",
    "devtmpfs",
    "debugfs",
    "tracefs",
    "securityfs",
    "mqueue",
    "pstore",
    "configfs",
    "fusectl",
    "hugetlbfs",
    "autofs",
    "binfmt_misc",
    "nsfs",
    "rpc_pipefs",
    "efivarfs",
    "selinuxfs",
];

/// The mount points of a `/proc/self/mountinfo` text whose filesystems get a filesystem mark:
/// every mount of a real filesystem (disk, tmpfs, overlay, fuse...). A filesystem mounted at
/// several points is marked through each (the same mark, added again).
pub fn markable_mounts(mountinfo: &str) -> BTreeSet<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let sep = fields.iter().position(|f| *f == "-")?;
            let fstype = *fields.get(sep + 1)?;
            if PSEUDO_FILESYSTEMS.contains(&fstype) {
                return None;
            }
            Some(PathBuf::from(switchyard_ebpf::unescape_mountinfo(
                fields.get(4)?,
            )))
        })
        .collect()
}

/// One fanotify event: `fd` of the file (or `FAN_NOFD`), the process (tgid) and what happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub fd: RawFd,
    pub pid: i32,
    pub mask: u64,
}

/// The events of one read of a fanotify fd (`struct fanotify_event_metadata` records, each
/// `event_len` long). A record of an unknown version or a cut one ends the list.
pub fn parse_events(buf: &[u8]) -> Vec<Event> {
    let mut events = Vec::new();
    let mut rest = buf;
    // event_len u32, vers u8, reserved u8, metadata_len u16, mask u64, fd i32, pid i32
    const META: usize = 24;
    while rest.len() >= META {
        let u32_at =
            |at: usize| u32::from_ne_bytes([rest[at], rest[at + 1], rest[at + 2], rest[at + 3]]);
        let event_len = u32_at(0) as usize;
        if rest[4] != libc::FANOTIFY_METADATA_VERSION || event_len < META || event_len > rest.len()
        {
            break;
        }
        let mut mask = [0u8; 8];
        mask.copy_from_slice(&rest[8..16]);
        events.push(Event {
            mask: u64::from_ne_bytes(mask),
            fd: u32_at(16) as i32,
            pid: u32_at(20) as i32,
        });
        rest = &rest[event_len..];
    }
    events
}

/// Execs seen and processes moved into the apps cgroup by the responder, since the start.
#[derive(Debug, Default)]
pub struct ExecStats {
    pub seen: AtomicU64,
    pub moved: AtomicU64,
}

/// What the responder needs besides the rules.
struct Responder {
    fan: Arc<OwnedFd>,
    stop: Arc<OwnedFd>,
    matcher: Arc<ArcSwap<ExecMatcher>>,
    apps_cgroup: PathBuf,
    cgroup_mount: PathBuf,
    own_netns: Option<NetnsId>,
    own_pid: i32,
    stats: Arc<ExecStats>,
    moved: Arc<Mutex<Vec<(u32, PathBuf)>>>,
}

/// The running exec watch: the fanotify group, its marks and its responder thread. Dropping it
/// stops the thread and closes the group (which removes every mark).
pub struct ExecWatch {
    fan: Arc<OwnedFd>,
    stop: Arc<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
    matcher: Arc<ArcSwap<ExecMatcher>>,
    stats: Arc<ExecStats>,
    moved: Arc<Mutex<Vec<(u32, PathBuf)>>>,
    /// mount points with a filesystem mark (tried: one that refuses it is not tried again)
    marked_mounts: BTreeSet<PathBuf>,
    marked_paths: BTreeSet<String>,
}

fn last_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// `fanotify_mark` on `path` (no dirfd: absolute paths).
fn mark(fan: RawFd, flags: libc::c_uint, path: &Path) -> std::io::Result<()> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a valid fd number and a NUL-terminated path that lives through the call
    let rc = unsafe {
        libc::fanotify_mark(
            fan,
            flags,
            libc::FAN_OPEN_EXEC_PERM,
            libc::AT_FDCWD,
            path.as_ptr(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(last_error())
    }
}

impl ExecWatch {
    /// Creates the fanotify group and starts the responder (no marks yet: see
    /// [`ExecWatch::set_rules`]). Fails without CAP_SYS_ADMIN or on a kernel without
    /// permission events.
    pub fn start(
        apps_cgroup: &Path,
        cgroup_mount: &Path,
        own_netns: Option<NetnsId>,
    ) -> Result<ExecWatch, ExecWatchError> {
        // SAFETY: plain syscall; the fd it returns is owned below
        let fan = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC,
                (libc::O_RDONLY | libc::O_CLOEXEC) as libc::c_uint,
            )
        };
        if fan < 0 {
            return Err(ExecWatchError::Init(last_error()));
        }
        // SAFETY: a fresh fd nobody else owns
        let fan = Arc::new(unsafe { OwnedFd::from_raw_fd(fan) });
        // SAFETY: plain syscall; the fd it returns is owned below
        let stop = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        if stop < 0 {
            return Err(ExecWatchError::EventFd(last_error()));
        }
        // SAFETY: a fresh fd nobody else owns
        let stop = Arc::new(unsafe { OwnedFd::from_raw_fd(stop) });
        let matcher = Arc::new(ArcSwap::from_pointee(ExecMatcher::default()));
        let stats = Arc::new(ExecStats::default());
        let moved = Arc::new(Mutex::new(Vec::new()));
        let responder = Responder {
            fan: fan.clone(),
            stop: stop.clone(),
            matcher: matcher.clone(),
            apps_cgroup: apps_cgroup.to_path_buf(),
            cgroup_mount: cgroup_mount.to_path_buf(),
            own_netns,
            own_pid: std::process::id() as i32,
            stats: stats.clone(),
            moved: moved.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("sy-exec-watch".into())
            .spawn(move || responder.run())
            .map_err(ExecWatchError::Thread)?;
        Ok(ExecWatch {
            fan,
            stop,
            thread: Some(thread),
            matcher,
            stats,
            moved,
            marked_mounts: BTreeSet::new(),
            marked_paths: BTreeSet::new(),
        })
    }

    /// Follows the name/path app rules: the responder matches the new ones from its next event
    /// on, and the marks follow (see [`ExecWatch::refresh_marks`]).
    pub fn set_rules(&mut self, apps: &[AppRule]) {
        let wanted = ExecMatcher::new(apps);
        if **self.matcher.load() == wanted {
            return;
        }
        let fan = self.fan.as_raw_fd();
        for path in self.marked_paths.difference(wanted.paths()) {
            // the file may be gone (its mark with it) or replaced: nothing to remove then
            let _ = mark(fan, libc::FAN_MARK_REMOVE, Path::new(path));
        }
        self.marked_paths.retain(|p| wanted.paths().contains(p));
        if !wanted.has_names() && !self.marked_mounts.is_empty() {
            if let Err(e) = mark(
                fan,
                libc::FAN_MARK_FLUSH | libc::FAN_MARK_FILESYSTEM,
                Path::new("/"),
            ) {
                tracing::warn!(error = %e, "removing the exec watch's filesystem marks failed");
            }
            self.marked_mounts.clear();
        }
        self.matcher.store(Arc::new(wanted));
        self.refresh_marks();
    }

    /// Adds the marks the rules need and are not there yet: an inode mark on each path rule's
    /// file (a file created or replaced at that path since gets it now), a filesystem mark on
    /// each real filesystem mounted since (name rules). Adding a mark that exists is a no-op.
    pub fn refresh_marks(&mut self) {
        let matcher = self.matcher.load_full();
        let fan = self.fan.as_raw_fd();
        for path in matcher.paths() {
            match mark(fan, libc::FAN_MARK_ADD, Path::new(path)) {
                Ok(()) => {
                    if self.marked_paths.insert(path.clone()) {
                        tracing::debug!(%path, "exec watch: marked an app's file");
                    }
                }
                Err(e) => {
                    self.marked_paths.remove(path);
                    tracing::debug!(%path, error = %e, "exec watch: an app's file cannot be marked (yet): the scan matches it");
                }
            }
        }
        if !matcher.has_names() {
            return;
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for mount in markable_mounts(&mountinfo) {
            if self.marked_mounts.contains(&mount) {
                continue;
            }
            if let Err(e) = mark(fan, libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM, &mount) {
                tracing::debug!(mount = %mount.display(), error = %e, "exec watch: no filesystem mark here: execs from it are matched by the scan only");
            }
            self.marked_mounts.insert(mount);
        }
    }

    /// The processes the responder moved into the apps cgroup since the last call, with the
    /// cgroup each came from.
    pub fn take_moved(&self) -> Vec<(u32, PathBuf)> {
        std::mem::take(&mut *self.moved.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn stats(&self) -> Arc<ExecStats> {
        self.stats.clone()
    }
}

impl Drop for ExecWatch {
    fn drop(&mut self) {
        let one: u64 = 1;
        // SAFETY: an 8-byte write from a live u64 to our eventfd
        let _ = unsafe {
            libc::write(
                self.stop.as_raw_fd(),
                (&one as *const u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // the fanotify fd closes with the last Arc: the marks go, pending events are allowed
    }
}

impl Responder {
    fn run(self) {
        let fan = self.fan.as_raw_fd();
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: fan,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.stop.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two pollfds that live through the call
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if rc < 0 {
                let e = last_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::warn!(error = %e, "exec watch: poll failed");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                continue;
            }
            if fds[1].revents != 0 {
                return;
            }
            if fds[0].revents == 0 {
                continue;
            }
            // SAFETY: reads into a buffer of its length
            let n = unsafe { libc::read(fan, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = last_error();
                if !matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                ) {
                    tracing::warn!(error = %e, "exec watch: reading events failed");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                continue;
            }
            for event in parse_events(&buf[..n as usize]) {
                if event.fd < 0 {
                    continue; // FAN_Q_OVERFLOW: no file, nothing to answer
                }
                // SAFETY: the kernel opened this fd for us with the event; owned from here on
                let file = unsafe { OwnedFd::from_raw_fd(event.fd) };
                let answered = Allow { fan, file: &file };
                self.classify(event, &file);
                drop(answered);
            }
        }
    }

    /// Moves the execing process into the apps cgroup when its image is an app's and it lives
    /// in the client's network namespace (a process of another namespace is not ours to move).
    fn classify(&self, event: Event, file: &OwnedFd) {
        self.stats.seen.fetch_add(1, Ordering::Relaxed);
        if event.mask & libc::FAN_OPEN_EXEC_PERM == 0 || event.pid <= 0 || event.pid == self.own_pid
        {
            return;
        }
        let Ok(path) = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) else {
            return;
        };
        if !self.matcher.load().matches(path.as_os_str().as_bytes()) {
            return;
        }
        let pid = event.pid as u32;
        if cgroup::netns_id(Path::new(&format!("/proc/{pid}/ns/net"))) != self.own_netns {
            return;
        }
        let origin = cgroup::cgroup_of(&self.cgroup_mount, pid);
        if origin.as_deref() == Some(self.apps_cgroup.as_path()) {
            return;
        }
        match cgroup::move_process(&self.apps_cgroup, pid) {
            Ok(()) => {
                self.stats.moved.fetch_add(1, Ordering::Relaxed);
                if let Some(origin) = origin {
                    self.moved
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((pid, origin));
                }
                tracing::debug!(pid, image = %path.display(), "exec watch: app moved into the apps cgroup at exec");
            }
            Err(e) => {
                tracing::debug!(pid, image = %path.display(), error = %e, "exec watch: moving an app at exec failed: the scan tries again");
            }
        }
    }
}

/// Answers its event `FAN_ALLOW` when dropped (also when classifying unwinds): the kernel holds
/// the execing process until then. The event's fd closes after it.
struct Allow<'a> {
    fan: RawFd,
    file: &'a OwnedFd,
}

impl Drop for Allow<'_> {
    fn drop(&mut self) {
        let response = libc::fanotify_response {
            fd: self.file.as_raw_fd(),
            response: libc::FAN_ALLOW,
        };
        // SAFETY: writes the response struct, which lives through the call
        let rc = unsafe {
            libc::write(
                self.fan,
                (&response as *const libc::fanotify_response).cast(),
                std::mem::size_of::<libc::fanotify_response>(),
            )
        };
        if rc < 0 {
            tracing::warn!(error = %last_error(), "exec watch: answering an exec failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(name: &str, path: Option<&str>, cgroup: Option<&str>) -> AppRule {
        AppRule {
            name: name.into(),
            path: path.map(str::to_string),
            cgroup: cgroup.map(str::to_string),
            bundle_id: None,
        }
    }

    #[test]
    fn execs_match_a_path_rule_exactly_and_a_name_rule_by_base_name_cut_like_comm() {
        let m = ExecMatcher::new(&[
            app("thunderbird-binary", None, None),
            app("tb", Some("/opt/tb/tb-bin"), None),
            app("inc", None, Some("inc")),
            app("", None, None),
        ]);
        assert!(m.has_names());
        assert!(m.matches(b"/usr/lib/thunderbird/thunderbird-bin"));
        assert!(m.matches(b"/opt/tb/tb-bin"));
        // a path rule decides by path: its name is no name rule
        assert!(!m.matches(b"/usr/bin/tb"));
        assert!(!m.matches(b"/other/tb-bin"));
        // cgroup rules match by cgroup, and an empty name matches nothing
        assert!(!m.matches(b"/usr/bin/inc"));
        assert!(!m.matches(b"/usr/bin/"));
        assert!(!m.matches(b""));
        let paths_only = ExecMatcher::new(&[app("tb", Some("/opt/tb/tb-bin"), None)]);
        assert!(!paths_only.has_names());
        assert_eq!(ExecMatcher::new(&[]), ExecMatcher::default());
    }

    #[test]
    fn every_real_filesystem_is_marked_and_kernel_interfaces_are_not() {
        let info = "\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
23 22 0:5 / /proc rw - proc proc rw
24 22 0:6 / /sys rw - sysfs sysfs rw
25 24 0:22 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
26 22 0:7 / /dev rw - devtmpfs devtmpfs rw
27 26 0:23 / /dev/shm rw shared:3 - tmpfs tmpfs rw
28 22 0:24 / /run/user/1000 rw - tmpfs tmpfs rw
29 22 0:25 / /media/my\\040disk rw - vfat /dev/sdb1 rw
30 22 0:26 / /tmp/.mount_app rw - fuse.squashfuse squashfuse rw
31 24 0:27 / /sys/fs/bpf rw - bpf bpf rw
32 22 0:28 / /run/netns/x rw - nsfs nsfs rw
";
        let mounts: Vec<String> = markable_mounts(info)
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(
            mounts,
            [
                "/",
                "/dev/shm",
                "/media/my disk",
                "/run/user/1000",
                "/tmp/.mount_app"
            ]
        );
        assert!(markable_mounts("garbage\n\n").is_empty());
    }

    fn record(mask: u64, fd: i32, pid: i32, extra: usize) -> Vec<u8> {
        let len = 24 + extra;
        let mut r = Vec::new();
        r.extend_from_slice(&(len as u32).to_ne_bytes());
        r.push(libc::FANOTIFY_METADATA_VERSION);
        r.push(0);
        r.extend_from_slice(&24u16.to_ne_bytes());
        r.extend_from_slice(&mask.to_ne_bytes());
        r.extend_from_slice(&fd.to_ne_bytes());
        r.extend_from_slice(&pid.to_ne_bytes());
        r.resize(len, 0xee);
        r
    }

    #[test]
    fn events_are_parsed_record_by_record_and_a_bad_record_ends_the_list() {
        let mut buf = record(libc::FAN_OPEN_EXEC_PERM, 7, 4242, 0);
        // a record with info after the metadata: skipped by its event_len
        buf.extend(record(libc::FAN_OPEN_EXEC_PERM, 8, 4243, 16));
        buf.extend(record(libc::FAN_Q_OVERFLOW, libc::FAN_NOFD, 0, 0));
        assert_eq!(
            parse_events(&buf),
            [
                Event {
                    fd: 7,
                    pid: 4242,
                    mask: libc::FAN_OPEN_EXEC_PERM
                },
                Event {
                    fd: 8,
                    pid: 4243,
                    mask: libc::FAN_OPEN_EXEC_PERM
                },
                Event {
                    fd: libc::FAN_NOFD,
                    pid: 0,
                    mask: libc::FAN_Q_OVERFLOW
                },
            ]
        );
        // cut short, another version, a length below the metadata's
        let whole = record(libc::FAN_OPEN_EXEC_PERM, 7, 1, 0);
        assert!(parse_events(&whole[..20]).is_empty());
        let mut other = whole.clone();
        other[4] = 2;
        assert!(parse_events(&other).is_empty());
        let mut short = whole.clone();
        short[0] = 8;
        assert!(parse_events(&short).is_empty());
        let mut long = whole;
        long[0] = 200;
        assert!(parse_events(&long).is_empty());
    }

    #[test]
    fn comm_is_cut_at_fifteen_bytes() {
        assert_eq!(comm_cut(b"thunderbird-binary"), b"thunderbird-bin");
        assert_eq!(comm_cut(b"curl"), b"curl");
    }
}

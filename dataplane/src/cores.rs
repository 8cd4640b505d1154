//! How many data-plane cores to run, decided once at start from everything that limits the
//! process: the CPU affinity mask, the CPU quota of its cgroup (and of every ancestor cgroup:
//! a container's `--cpus` is a quota, not a mask) and the operator's `server.cores`. The same
//! [`CorePlan`] sizes the executors, the per-core counters and the live tables, and is logged with
//! its reason, so a container limited to 1.5 CPUs on a 64-CPU host runs 2 cores, not 64.
//!
//! Pinning: when the plan takes every CPU of the mask (a dedicated box, or a mask the operator
//! set with `taskset` or systemd's `CPUAffinity=`), each executor is pinned to one of them. When
//! it takes only some (`server.cores` below the mask, or a cgroup quota), nothing says *which*
//! CPUs are free: pinning to the first ones would put every such process on the host — a
//! server and a client on one gateway, ten containers each given 1.5 CPUs — on CPU 0 and 1, so
//! those executors run unpinned and the kernel places them within the mask.
//!
//! A data-plane thread also records which core it runs ([`current`]), so that tables with a
//! slot per core can pick theirs without every caller passing its core along.
//!
//! The parsers of `/proc/self/cgroup`, `/proc/self/mountinfo`, `cpu.max` (cgroup v2) and
//! `cpu.cfs_quota_us`/`cpu.cfs_period_us` (cgroup v1) are plain functions over text; only
//! [`CorePlan::detect`] reads files.

use std::path::{Path, PathBuf};

/// The cores the data plane runs on and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorePlan {
    /// One entry per executor: the CPU it is pinned to, or `None` where the kernel places it
    /// within the affinity mask (the plan takes only part of the mask). Never empty; either
    /// every executor is pinned or none is.
    pub cpus: Vec<Option<usize>>,
    /// Human-readable reason for the count (logged at start).
    pub reason: String,
}

/// An executor's CPU in words: `cpu 3`, or `unpinned`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuLabel(pub Option<usize>);

impl std::fmt::Display for CpuLabel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(cpu) => write!(f, "cpu {cpu}"),
            None => f.write_str("unpinned"),
        }
    }
}

thread_local! {
    /// The data-plane core index of this thread, set by its executor at start; `None` on every
    /// other thread.
    static CURRENT: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Marks this thread as data-plane core `index` (its executor calls this once at start).
pub(crate) fn enter(index: usize) {
    CURRENT.with(|c| c.set(Some(index)));
}

/// The data-plane core index of this thread, if it is a data-plane thread.
pub fn current() -> Option<usize> {
    CURRENT.with(std::cell::Cell::get)
}

/// A CPU bandwidth limit: `quota` microseconds of CPU time per `period`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuQuota {
    pub quota: u64,
    pub period: u64,
}

impl CpuQuota {
    /// Whole CPUs the quota can keep busy, rounded up (1.5 CPUs → 2), at least 1.
    pub fn cores(self) -> usize {
        let n = self.quota.div_ceil(self.period.max(1));
        usize::try_from(n).unwrap_or(usize::MAX).max(1)
    }
}

/// `cpu.max` of cgroup v2: `"max 100000"` (no limit) or `"150000 100000"`.
pub fn parse_cpu_max(text: &str) -> Option<CpuQuota> {
    let mut parts = text.split_whitespace();
    let quota = parts.next()?;
    let period = parts.next().map_or(Some(100_000), |p| p.parse().ok())?;
    if quota == "max" {
        return None;
    }
    let quota: u64 = quota.parse().ok()?;
    (quota > 0 && period > 0).then_some(CpuQuota { quota, period })
}

/// `cpu.cfs_quota_us` and `cpu.cfs_period_us` of cgroup v1; a quota of `-1` means no limit.
pub fn parse_cfs(quota: &str, period: &str) -> Option<CpuQuota> {
    let quota: i64 = quota.trim().parse().ok()?;
    let period: u64 = period.trim().parse().ok()?;
    let quota = u64::try_from(quota).ok()?;
    (quota > 0 && period > 0).then_some(CpuQuota { quota, period })
}

/// Which cgroup the process is in, per hierarchy that can limit CPU time.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OwnCgroups {
    /// The cgroup v2 path (`0::/path`).
    pub unified: Option<String>,
    /// The cgroup v1 path of the hierarchy carrying the `cpu` controller.
    pub cpu_v1: Option<String>,
}

/// Parses `/proc/self/cgroup` (`id:controllers:path` per line).
pub fn parse_proc_cgroup(text: &str) -> OwnCgroups {
    let mut own = OwnCgroups::default();
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            own.unified = Some(path.to_owned());
        } else if controllers.split(',').any(|c| c == "cpu") {
            own.cpu_v1 = Some(path.to_owned());
        }
    }
    own
}

/// A cgroup file system mount: where it is and which part of its hierarchy it shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// The hierarchy path at the mount point (`/` unless a container sees a sub-tree).
    pub root: String,
    pub mount_point: PathBuf,
}

/// The cgroup v2 mount and the v1 mount carrying the `cpu` controller, from
/// `/proc/self/mountinfo`.
pub fn parse_mountinfo(text: &str) -> (Option<CgroupMount>, Option<CgroupMount>) {
    let (mut unified, mut cpu_v1) = (None, None);
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split_whitespace().collect();
        let right: Vec<&str> = right.split_whitespace().collect();
        let (Some(root), Some(point), Some(fs)) = (left.get(3), left.get(4), right.first()) else {
            continue;
        };
        let mount = CgroupMount {
            root: switchyard_ebpf::unescape_mountinfo(root),
            mount_point: PathBuf::from(switchyard_ebpf::unescape_mountinfo(point)),
        };
        match *fs {
            "cgroup2" if unified.is_none() => unified = Some(mount),
            "cgroup"
                if cpu_v1.is_none()
                    && right
                        .get(2)
                        .is_some_and(|opts| opts.split(',').any(|o| o == "cpu")) =>
            {
                cpu_v1 = Some(mount)
            }
            _ => {}
        }
    }
    (unified, cpu_v1)
}

/// The directories of the process's cgroup and its ancestors up to the mount point, innermost
/// first. `None` when the cgroup lies outside what the mount shows.
pub fn cgroup_dirs(mount: &CgroupMount, cgroup: &str) -> Option<Vec<PathBuf>> {
    let root = mount.root.trim_end_matches('/');
    let relative = cgroup.strip_prefix(root)?;
    if !(relative.is_empty() || relative.starts_with('/')) {
        return None;
    }
    let mut dirs = Vec::new();
    let mut rel = relative.trim_matches('/').to_owned();
    loop {
        dirs.push(if rel.is_empty() {
            mount.mount_point.clone()
        } else {
            mount.mount_point.join(&rel)
        });
        if rel.is_empty() {
            break;
        }
        rel = rel
            .rsplit_once('/')
            .map_or(String::new(), |(p, _)| p.to_owned());
    }
    Some(dirs)
}

/// The tightest quota along `dirs` (a parent's quota limits its children), with the directory
/// that sets it. `read` returns a file's text.
pub fn tightest_quota(
    dirs: &[PathBuf],
    v1: bool,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<(CpuQuota, PathBuf)> {
    dirs.iter()
        .filter_map(|dir| {
            let quota = if v1 {
                parse_cfs(
                    &read(&dir.join("cpu.cfs_quota_us"))?,
                    &read(&dir.join("cpu.cfs_period_us"))?,
                )
            } else {
                parse_cpu_max(&read(&dir.join("cpu.max"))?)
            }?;
            Some((quota, dir.clone()))
        })
        .min_by_key(|(q, _)| q.cores())
}

/// Decides the plan: `configured` cores (`server.cores`, 0 = automatic) taken from `allowed`
/// (the affinity mask), otherwise as many as both the mask and the quota allow; pinned one to a
/// CPU only when the plan takes the whole mask (see the module's notes).
pub fn decide(
    allowed: &[usize],
    quota: Option<(CpuQuota, PathBuf)>,
    configured: usize,
) -> CorePlan {
    let allowed: Vec<usize> = if allowed.is_empty() {
        vec![0]
    } else {
        allowed.to_vec()
    };
    let (count, reason) = if configured > 0 {
        if configured > allowed.len() {
            (
                allowed.len(),
                format!(
                    "server.cores asks for {configured}, the affinity mask allows {}",
                    allowed.len()
                ),
            )
        } else {
            (configured, format!("server.cores: {configured}"))
        }
    } else {
        match quota {
            Some((q, dir)) if q.cores() < allowed.len() => (
                q.cores(),
                format!(
                    "cgroup CPU quota {}/{} µs ({}) allows {} of {} CPUs in the affinity mask",
                    q.quota,
                    q.period,
                    dir.display(),
                    q.cores(),
                    allowed.len()
                ),
            ),
            _ => (
                allowed.len(),
                format!(
                    "{} CPUs in the affinity mask, no tighter cgroup CPU quota",
                    allowed.len()
                ),
            ),
        }
    };
    let count = count.max(1);
    if count >= allowed.len() {
        CorePlan {
            cpus: allowed.into_iter().map(Some).collect(),
            reason: format!("{reason}; one pinned to each CPU"),
        }
    } else {
        CorePlan {
            cpus: vec![None; count],
            reason: format!(
                "{reason}; unpinned, the kernel places them on CPUs {}",
                cpu_list(&allowed)
            ),
        }
    }
}

/// Where the executors run, for logs: the pinned CPUs as a list (`0-1`), or `unpinned`.
pub fn placement(cpus: &[Option<usize>]) -> String {
    let pinned: Vec<usize> = cpus.iter().flatten().copied().collect();
    if pinned.is_empty() {
        "unpinned".to_owned()
    } else {
        cpu_list(&pinned)
    }
}

/// `0-3,6` style, as `taskset` and `/proc/*/status` print CPU lists.
fn cpu_list(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for cpu in sorted {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == cpu => *end = cpu,
            _ => ranges.push((cpu, cpu)),
        }
    }
    ranges
        .iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl CorePlan {
    /// Reads the affinity mask and the cgroup files of this process and decides.
    pub fn detect(configured: usize) -> CorePlan {
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        let own = read(Path::new("/proc/self/cgroup"))
            .map(|t| parse_proc_cgroup(&t))
            .unwrap_or_default();
        let (unified, cpu_v1) = read(Path::new("/proc/self/mountinfo"))
            .map(|t| parse_mountinfo(&t))
            .unwrap_or((None, None));
        let v2 = unified
            .zip(own.unified)
            .and_then(|(m, path)| cgroup_dirs(&m, &path))
            .and_then(|dirs| tightest_quota(&dirs, false, read));
        let v1 = cpu_v1
            .zip(own.cpu_v1)
            .and_then(|(m, path)| cgroup_dirs(&m, &path))
            .and_then(|dirs| tightest_quota(&dirs, true, read));
        let quota = [v2, v1]
            .into_iter()
            .flatten()
            .min_by_key(|(q, _)| q.cores());
        decide(&crate::sys::allowed_cpus(), quota, configured)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_max_and_cfs() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        let q = parse_cpu_max("150000 100000\n").expect("quota");
        assert_eq!(q.cores(), 2);
        assert_eq!(parse_cpu_max("50000 100000").map(CpuQuota::cores), Some(1));
        assert_eq!(parse_cpu_max("garbage"), None);
        assert_eq!(parse_cfs("-1\n", "100000\n"), None);
        assert_eq!(
            parse_cfs("100000\n", "100000\n").map(CpuQuota::cores),
            Some(1)
        );
        assert_eq!(parse_cfs("250000", "100000").map(CpuQuota::cores), Some(3));
        assert_eq!(parse_cfs("x", "100000"), None);
    }

    #[test]
    fn proc_cgroup_v1_v2_and_hybrid() {
        let hybrid = "9:name=systemd:/\n4:memory:/a\n2:cpuacct:/\n1:cpu:/sygw2-x\n0::/\n";
        let own = parse_proc_cgroup(hybrid);
        assert_eq!(own.cpu_v1.as_deref(), Some("/sygw2-x"));
        assert_eq!(own.unified.as_deref(), Some("/"));
        let v1 = parse_proc_cgroup("3:cpu,cpuacct:/docker/abc\n");
        assert_eq!(v1.cpu_v1.as_deref(), Some("/docker/abc"));
        assert_eq!(v1.unified, None);
        assert_eq!(
            parse_proc_cgroup("0::/system.slice/x.service")
                .unified
                .as_deref(),
            Some("/system.slice/x.service")
        );
    }

    #[test]
    fn mountinfo_finds_the_cpu_hierarchies() {
        let text = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
            32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
            33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n\
            41 31 0:38 /docker/abc /sys/fs/cgroup/unified\\040x rw,relatime - cgroup2 cgroup2 rw\n";
        let (unified, cpu) = parse_mountinfo(text);
        let cpu = cpu.expect("cpu mount");
        assert_eq!(cpu.mount_point, PathBuf::from("/sys/fs/cgroup/cpu"));
        let unified = unified.expect("v2 mount");
        assert_eq!(unified.root, "/docker/abc");
        assert_eq!(
            unified.mount_point,
            PathBuf::from("/sys/fs/cgroup/unified x")
        );
    }

    #[test]
    fn ancestors_up_to_the_mount_and_the_tightest_quota() {
        let mount = CgroupMount {
            root: "/docker/abc".into(),
            mount_point: "/cg".into(),
        };
        let dirs = cgroup_dirs(&mount, "/docker/abc/a/b").expect("inside");
        assert_eq!(
            dirs,
            vec![PathBuf::from("/cg/a/b"), "/cg/a".into(), "/cg".into()]
        );
        assert_eq!(cgroup_dirs(&mount, "/docker/abcd"), None);
        assert_eq!(
            cgroup_dirs(&mount, "/docker/abc"),
            Some(vec![PathBuf::from("/cg")])
        );
        let read = |p: &Path| match p.to_str()? {
            "/cg/a/cpu.max" => Some("200000 100000".to_owned()),
            "/cg/a/b/cpu.max" => Some("max 100000".to_owned()),
            "/cg/cpu.max" => Some("400000 100000".to_owned()),
            _ => None,
        };
        let (q, dir) = tightest_quota(&dirs, false, read).expect("quota");
        assert_eq!((q.cores(), dir), (2, PathBuf::from("/cg/a")));
    }

    #[test]
    fn decision_takes_the_smallest_limit_and_the_override() {
        let quota = |q, p| {
            Some((
                CpuQuota {
                    quota: q,
                    period: p,
                },
                PathBuf::from("/cg"),
            ))
        };
        let pinned = |cpus: &[usize]| cpus.iter().copied().map(Some).collect::<Vec<_>>();
        let plan = decide(&[0, 1, 2, 3], quota(150_000, 100_000), 0);
        assert_eq!(plan.cpus, vec![None, None]);
        assert!(plan.reason.contains("quota"), "{}", plan.reason);
        assert!(plan.reason.contains("CPUs 0-3"), "{}", plan.reason);
        assert_eq!(
            decide(&[0, 1], quota(800_000, 100_000), 0).cpus,
            pinned(&[0, 1])
        );
        assert_eq!(decide(&[2, 3], None, 0).cpus, pinned(&[2, 3]));
        assert_eq!(decide(&[0, 1, 2, 3], quota(1, 100_000), 0).cpus, vec![None]);
        // The operator's choice wins over the quota, within the mask.
        assert_eq!(
            decide(&[0, 1, 2, 3], quota(100_000, 100_000), 3).cpus,
            vec![None; 3]
        );
        let capped = decide(&[0, 1], None, 8);
        assert_eq!(capped.cpus, pinned(&[0, 1]));
        assert!(capped.reason.contains("affinity"), "{}", capped.reason);
        assert_eq!(decide(&[5], None, 1).cpus, pinned(&[5]));
        assert_eq!(decide(&[], None, 0).cpus, pinned(&[0]));
    }

    /// Two processes given one core each on a two-CPU box (a server and a client on one
    /// gateway) must not both be pinned to CPU 0: nothing pins them, the kernel spreads them.
    #[test]
    fn a_plan_that_takes_part_of_the_mask_pins_nothing() {
        let first = decide(&[0, 1], None, 1);
        assert_eq!(first.cpus, vec![None]);
        assert!(first.reason.contains("unpinned"), "{}", first.reason);
        assert!(first.reason.contains("CPUs 0-1"), "{}", first.reason);
        assert_eq!(cpu_list(&[0, 1, 2, 3, 6, 8, 9]), "0-3,6,8-9");
        assert_eq!(placement(&first.cpus), "unpinned");
        assert_eq!(placement(&decide(&[0, 1], None, 0).cpus), "0-1");
    }
}

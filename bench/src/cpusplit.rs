//! `--split-cpus`: the CPUs this process may use are split into a LOAD set (the bench itself,
//! its load generators, origins and helpers) and a TEST set (every program under test). On a
//! box where the generators share the cores with the proxy, the rates show who got the cores;
//! with the split each side has its own, as on a bench box with spare cores.
//!
//! The split is set once at start ([`install`]): the bench process is pinned to LOAD (every
//! thread it already has; later threads and children inherit it), and
//! [`Procs::spawn_under_test`](crate::procs::Procs::spawn_under_test) sets TEST in the child
//! before exec.

use std::fmt::Write as _;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{bail, Context, Result};
use rustix::thread::CpuSet;

/// The two CPU sets of a split run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuSplit {
    /// The bench, load generators, origins, helpers.
    pub load: Vec<usize>,
    /// The programs under test.
    pub test: Vec<usize>,
}

impl CpuSplit {
    /// Splits `allowed` into LOAD and TEST: `test` when given (it must be a proper, non-empty
    /// subset of `allowed`), else the second half (the larger half when odd goes to LOAD).
    pub fn new(allowed: &[usize], test: Option<&[usize]>) -> Result<CpuSplit> {
        let mut allowed = allowed.to_vec();
        allowed.sort_unstable();
        allowed.dedup();
        if allowed.len() < 2 {
            bail!(
                "--split-cpus needs at least 2 CPUs, this process may use {} ({})",
                allowed.len(),
                format_list(&allowed)
            );
        }
        let test: Vec<usize> = match test {
            Some(t) => {
                if let Some(c) = t.iter().find(|c| !allowed.contains(c)) {
                    bail!(
                        "--test-cpus: CPU {c} is not one this process may use ({})",
                        format_list(&allowed)
                    );
                }
                allowed.iter().copied().filter(|c| t.contains(c)).collect()
            }
            None => allowed[allowed.len().div_ceil(2)..].to_vec(),
        };
        let load: Vec<usize> = allowed
            .iter()
            .copied()
            .filter(|c| !test.contains(c))
            .collect();
        if test.is_empty() {
            bail!("--split-cpus: the under-test CPU set would be empty");
        }
        if load.is_empty() {
            bail!(
                "--split-cpus: the load CPU set would be empty (--test-cpus takes every allowed CPU: {})",
                format_list(&allowed)
            );
        }
        Ok(CpuSplit { load, test })
    }

    /// "split CPUs: load 0, under test 1", for the reports.
    pub fn describe(&self) -> String {
        format!(
            "split CPUs: load {}, under test {}",
            format_list(&self.load),
            format_list(&self.test)
        )
    }
}

/// A CPU list given on the command line (`--test-cpus`); a newtype, as clap reads a `Vec` field
/// as repeated values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

impl std::str::FromStr for CpuList {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<CpuList> {
        parse_cpu_list(s).map(CpuList)
    }
}

/// Parses a CPU list as the kernel prints it (`Cpus_allowed_list`, taskset -c): "1", "4-15",
/// "0,2-3". Sorted, without duplicates.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim) {
        if part.is_empty() {
            bail!("CPU list {s:?}: empty element");
        }
        let num = |v: &str| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|&c| c < CpuSet::MAX_CPU)
                .with_context(|| format!("CPU list {s:?}: {v:?} is not a CPU number"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    bail!("CPU list {s:?}: range {part:?} runs backwards");
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(num(part)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// The kernel's list form of sorted `cpus`: [0, 1, 2, 5] → "0-2,5".
pub fn format_list(cpus: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        while i + 1 < cpus.len() && cpus[i + 1] == cpus[i] + 1 {
            i += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        let _ = if cpus[i] == start {
            write!(out, "{start}")
        } else {
            write!(out, "{start}-{}", cpus[i])
        };
        i += 1;
    }
    out
}

fn cpu_set(cpus: &[usize]) -> CpuSet {
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c);
    }
    set
}

/// The CPUs this process may run on (sched_getaffinity).
pub fn allowed_cpus() -> Result<Vec<usize>> {
    let set = rustix::thread::sched_getaffinity(None).context("sched_getaffinity")?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

/// Pins every thread of this process to `cpus`; threads and children started later inherit it.
fn pin_this_process(cpus: &[usize]) -> Result<()> {
    let set = cpu_set(cpus);
    // The calling thread first, so a thread it starts meanwhile already inherits the mask.
    rustix::thread::sched_setaffinity(None, &set).context("sched_setaffinity")?;
    for entry in std::fs::read_dir("/proc/self/task").context("read /proc/self/task")? {
        let name = entry?.file_name();
        let Some(tid) = name
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw)
        else {
            continue;
        };
        match rustix::thread::sched_setaffinity(Some(tid), &set) {
            // a thread that exited since the listing
            Err(rustix::io::Errno::SRCH) => {}
            r => r.with_context(|| format!("sched_setaffinity of thread {tid:?}"))?,
        }
    }
    Ok(())
}

static SPLIT: OnceLock<CpuSplit> = OnceLock::new();

/// Makes `split` the run's setting and pins this process to its LOAD set. Once per process.
pub fn install(split: CpuSplit) -> Result<&'static CpuSplit> {
    pin_this_process(&split.load)?;
    if SPLIT.set(split).is_err() {
        bail!("the CPU split is already set");
    }
    SPLIT.get().context("the CPU split was just set")
}

/// The run's split, if `--split-cpus` was given.
pub fn current() -> Option<&'static CpuSplit> {
    SPLIT.get()
}

/// Makes `cmd`'s child run on `cpus` from before its exec, so its threads and children inherit it.
#[allow(unsafe_code)]
pub fn run_on(cmd: &mut Command, cpus: &[usize]) {
    use std::os::unix::process::CommandExt;
    let set = cpu_set(cpus);
    // SAFETY: the closure runs in the forked child before exec; it makes one syscall on a
    // CpuSet built (and copied in) before the fork: no allocation, no lock.
    unsafe {
        cmd.pre_exec(move || {
            rustix::thread::sched_setaffinity(None, &set).map_err(std::io::Error::from)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_cpu_lists() {
        assert_eq!(parse_cpu_list("1").expect("one"), vec![1]);
        assert_eq!(parse_cpu_list("4-7").expect("range"), vec![4, 5, 6, 7]);
        assert_eq!(
            parse_cpu_list("3, 0,1-2,2").expect("mixed"),
            vec![0, 1, 2, 3]
        );
        for bad in ["", "a", "1,", "3-1", "-1", "1-", "99999"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn formats_lists_as_the_kernel_does() {
        assert_eq!(format_list(&[0, 1, 2, 5]), "0-2,5");
        assert_eq!(format_list(&[1]), "1");
        assert_eq!(format_list(&[0, 2, 4, 5]), "0,2,4-5");
        assert_eq!(format_list(&[]), "");
        for s in ["0", "4-15", "0-2,5,7-8"] {
            assert_eq!(format_list(&parse_cpu_list(s).expect("parse")), s);
        }
    }

    #[test]
    fn default_split_gives_the_second_half_to_the_programs_under_test() {
        let two = CpuSplit::new(&[0, 1], None).expect("2 CPUs");
        assert_eq!((two.load, two.test), (vec![0], vec![1]));
        let odd = CpuSplit::new(&[0, 1, 2], None).expect("3 CPUs");
        assert_eq!((odd.load, odd.test), (vec![0, 1], vec![2]));
        let sparse = CpuSplit::new(&[8, 2, 4, 6], None).expect("4 CPUs");
        assert_eq!(sparse.describe(), "split CPUs: load 2,4, under test 6,8");
        assert_eq!((sparse.load, sparse.test), (vec![2, 4], vec![6, 8]));
    }

    #[test]
    fn explicit_test_set_takes_the_rest_as_load() {
        let all: Vec<usize> = (0..16).collect();
        let s = CpuSplit::new(&all, Some(&[4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15])).expect("ok");
        assert_eq!(s.load, vec![0, 1, 2, 3]);
        assert_eq!(s.describe(), "split CPUs: load 0-3, under test 4-15");
        let s = CpuSplit::new(&[0, 1], Some(&[0])).expect("ok");
        assert_eq!((s.load, s.test), (vec![1], vec![0]));
    }

    #[test]
    fn refuses_splits_with_an_empty_side() {
        let err = CpuSplit::new(&[3], None).expect_err("1 CPU");
        assert!(err.to_string().contains("at least 2 CPUs"), "{err}");
        assert!(CpuSplit::new(&[], None).is_err());
        let err = CpuSplit::new(&[0, 1], Some(&[0, 1])).expect_err("no load CPU");
        assert!(
            err.to_string().contains("load CPU set would be empty"),
            "{err}"
        );
        let err = CpuSplit::new(&[0, 1], Some(&[])).expect_err("no test CPU");
        assert!(err.to_string().contains("under-test"), "{err}");
        let err = CpuSplit::new(&[0, 1], Some(&[2])).expect_err("CPU not allowed");
        assert!(err.to_string().contains("CPU 2"), "{err}");
    }

    #[test]
    fn this_process_may_use_some_cpu() {
        assert!(!allowed_cpus().expect("affinity").is_empty());
    }
}

//! `GET /api/v1/debug/memory`: the specification's Go-named memory figures filled from real
//! sources of this process (see the crate documentation for the field-by-field mapping).

use crate::sys::{self, MallInfo};
use crate::threads;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use switchyard_api::diagnostics::MemoryStats;

/// Bytes of thread stacks: what is resident and what is reserved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackUsage {
    pub resident: u64,
    pub reserved: u64,
    /// Threads whose stack was found (a thread running on a CPU at that instant has no stack
    /// pointer in `/proc` and is not counted).
    pub threads_measured: u64,
}

/// Collects every figure now. `log_subscribers` comes from the caller's log store.
pub fn collect(log_subscribers: usize) -> MemoryStats {
    let heap = sys::mallinfo().unwrap_or_default();
    let stacks = measure_stacks();
    let thread_count = threads::thread_ids().map(|t| t.len()).unwrap_or(0);
    from_parts(&heap, &stacks, thread_count, log_subscribers)
}

/// The mapping itself, kept apart from the sources so a test can check it.
pub fn from_parts(
    heap: &MallInfo,
    stacks: &StackUsage,
    threads: usize,
    log_subscribers: usize,
) -> MemoryStats {
    let in_use = heap.in_use_bytes + heap.mmapped_bytes;
    let sys = heap.arena + heap.mmapped_bytes;
    MemoryStats {
        heap_alloc: in_use,
        heap_sys: sys,
        heap_idle: heap.free_bytes,
        heap_inuse: sys.saturating_sub(heap.free_bytes),
        heap_released: 0,
        heap_objects: 0,
        stack_inuse: stacks.resident,
        stack_sys: stacks.reserved,
        num_gc: 0,
        last_gc_pause_ns: 0,
        total_gc_pause_ns: 0,
        gc_cpu_fraction: 0.0,
        num_goroutines: threads as u64,
        log_subscribers: log_subscribers as u64,
    }
}

/// Finds each thread's stack through its saved stack pointer (`/proc/self/task/*/syscall`)
/// and sums the `Rss` and `Size` of the mappings in `/proc/self/smaps` that hold them.
pub fn measure_stacks() -> StackUsage {
    let Ok(ids) = threads::thread_ids() else {
        return StackUsage::default();
    };
    let pointers: Vec<u64> = ids
        .iter()
        .filter_map(|tid| {
            let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall")).ok()?;
            stack_pointer(&text)
        })
        .collect();
    match std::fs::read_to_string("/proc/self/smaps") {
        Ok(smaps) => stack_usage(&smaps, &pointers),
        Err(_) => StackUsage::default(),
    }
}

/// The stack pointer in a `/proc/<pid>/task/<tid>/syscall` line: `NR a1..a6 SP PC` while in a
/// system call, `-1 SP PC` when blocked outside one, `running` when on a CPU (no pointer).
pub fn stack_pointer(syscall: &str) -> Option<u64> {
    let tokens: Vec<&str> = syscall.split_whitespace().collect();
    if tokens.len() < 3 {
        return None;
    }
    let sp = tokens[tokens.len() - 2];
    u64::from_str_radix(sp.strip_prefix("0x")?, 16).ok()
}

/// One mapping of `/proc/self/smaps`: its range and sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Mapping {
    start: u64,
    end: u64,
    size: u64,
    rss: u64,
}

fn parse_smaps(smaps: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if let Some((start, end)) = first.split_once('-') {
            if let (Ok(start), Ok(end)) =
                (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
            {
                out.push(Mapping {
                    start,
                    end,
                    size: 0,
                    rss: 0,
                });
                continue;
            }
        }
        let mut kib = || {
            words
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        };
        match (first, out.last_mut()) {
            ("Size:", Some(m)) => m.size = kib(),
            ("Rss:", Some(m)) => m.rss = kib(),
            _ => {}
        }
    }
    out
}

/// Sums the mappings that contain the stack pointers, each mapping once.
pub fn stack_usage(smaps: &str, stack_pointers: &[u64]) -> StackUsage {
    let mappings = parse_smaps(smaps);
    let mut found: BTreeMap<u64, Mapping> = BTreeMap::new();
    let mut threads_measured = 0;
    for &sp in stack_pointers {
        if let Some(m) = mappings.iter().find(|m| m.start <= sp && sp < m.end) {
            found.insert(m.start, *m);
            threads_measured += 1;
        }
    }
    StackUsage {
        resident: found.values().map(|m| m.rss).sum(),
        reserved: found.values().map(|m| m.size).sum(),
        threads_measured,
    }
}

/// The text of `/debug/pprof/heap`: the allocator's statistics, said plainly to be no
/// allocation-site profile.
pub fn heap_report(heap: Option<MallInfo>, status: Option<&str>) -> String {
    let mut out = String::from(
        "heap profile: not available as allocation sites\n\
         # This Rust binary uses the C library's allocator, which samples no allocation stacks,\n\
         # so there is no pprof heap profile to give. These are the allocator's own figures.\n",
    );
    match heap {
        Some(m) => {
            let _ = write!(
                out,
                "#\n# glibc mallinfo2 (all arenas)\n\
                 # arena (bytes from the system, non-mmapped) = {}\n\
                 # uordblks (bytes in use) = {}\n\
                 # fordblks (bytes free in arenas) = {}\n\
                 # ordblks (free chunks) = {}\n\
                 # smblks (free fastbin chunks) = {}\n\
                 # fsmblks (bytes in free fastbin chunks) = {}\n\
                 # hblks (mmapped blocks) = {}\n\
                 # hblkhd (bytes in mmapped blocks) = {}\n\
                 # keepcost (releasable bytes at the top) = {}\n",
                m.arena,
                m.in_use_bytes,
                m.free_bytes,
                m.free_chunks,
                m.fastbin_chunks,
                m.fastbin_free_bytes,
                m.mmapped_blocks,
                m.mmapped_bytes,
                m.top_releasable
            );
        }
        None => {
            out.push_str("#\n# allocator statistics: not available (the C library is not glibc)\n")
        }
    }
    if let Some(status) = status {
        out.push_str("#\n# /proc/self/status\n");
        for line in status.lines().filter(|l| {
            [
                "VmPeak", "VmSize", "VmHWM", "VmRSS", "RssAnon", "RssFile", "VmData", "VmStk",
            ]
            .iter()
            .any(|k| l.starts_with(&format!("{k}:")))
        }) {
            let (k, v) = line.split_once(':').unwrap_or((line, ""));
            let _ = writeln!(out, "# {k} = {}", v.trim());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
7f0000000000-7f0000200000 rw-p 00000000 00:00 0 
Size:               2048 kB
KernelPageSize:        4 kB
Rss:                  16 kB
Pss:                  16 kB
7f0000200000-7f0000201000 ---p 00000000 00:00 0 
Size:                  4 kB
Rss:                   0 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Size:                132 kB
Rss:                  40 kB
";

    #[test]
    fn parses_stack_pointers_of_every_syscall_form() {
        assert_eq!(
            stack_pointer("202 0x1 0x2 0x3 0x4 0x5 0x6 0x7ffd00000100 0x7f00deadbeef\n"),
            Some(0x7ffd_0000_0100)
        );
        assert_eq!(
            stack_pointer("-1 0x7f0000100000 0x7f00deadbeef\n"),
            Some(0x7f00_0010_0000)
        );
        assert_eq!(stack_pointer("running\n"), None);
        assert_eq!(stack_pointer(""), None);
        assert_eq!(stack_pointer("1 2 3"), None);
    }

    #[test]
    fn sums_each_stack_mapping_once() {
        let u = stack_usage(
            SMAPS,
            &[0x7f00_0010_0000, 0x7f00_0010_0100, 0x7ffd_0000_0100, 0x1000],
        );
        assert_eq!(u.reserved, (2048 + 132) * 1024);
        assert_eq!(u.resident, (16 + 40) * 1024);
        assert_eq!(u.threads_measured, 3);
    }

    #[test]
    fn maps_allocator_figures_onto_the_go_names() {
        let heap = MallInfo {
            arena: 1000,
            in_use_bytes: 700,
            free_bytes: 300,
            mmapped_bytes: 4096,
            ..MallInfo::default()
        };
        let stacks = StackUsage {
            resident: 10,
            reserved: 20,
            threads_measured: 1,
        };
        let m = from_parts(&heap, &stacks, 7, 3);
        assert_eq!(m.heap_alloc, 4796);
        assert_eq!(m.heap_sys, 5096);
        assert_eq!(m.heap_idle, 300);
        assert_eq!(m.heap_inuse, 4796);
        assert_eq!((m.stack_inuse, m.stack_sys), (10, 20));
        assert_eq!((m.num_goroutines, m.log_subscribers), (7, 3));
        assert_eq!((m.num_gc, m.heap_released, m.heap_objects), (0, 0, 0));
    }

    #[test]
    fn measures_this_process() {
        let keep: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 4096]).collect();
        let m = collect(0);
        assert!(m.heap_inuse > 0 && m.heap_alloc > 0, "{m:?}");
        assert!(m.heap_sys >= m.heap_inuse);
        assert!(m.num_goroutines >= 1);
        // This thread reads its own syscall file from inside a system call, so at least its
        // own stack is found.
        assert!(m.stack_sys > 0 && m.stack_inuse > 0, "{m:?}");
        assert!(m.stack_inuse <= m.stack_sys);
        drop(keep);
    }
}

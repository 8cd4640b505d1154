//! Code pages that start-up touched, given back once a service is up (issue 14: idle RSS).
//!
//! Start-up runs code spread over the whole binary (configuration, the API router, the OpenAPI
//! document, runtimes), and the kernel maps file pages around every page fault (fault-around),
//! so after start a third or more of the binary's text counts in the process's RSS although an
//! idle server runs a few hundred KiB of it. [`release_code_pages`] drops the process's mapping
//! of its executable code (the binary's and the shared libraries'): the pages stay in the page
//! cache, shared and clean, and whatever runs afterwards faults its pages back in (a minor
//! fault per 64 KiB window, no disk read while the page cache holds them). Only read-only,
//! executable, private file mappings are touched: their pages are never written, so dropping
//! them loses nothing.

use std::io;

/// One executable file mapping of `/proc/self/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeMapping {
    pub start: usize,
    pub end: usize,
    pub path: String,
}

/// The read-only, executable, private mappings of files in a `/proc/PID/maps` text (not the
/// vdso/vsyscall pseudo-mappings, not anonymous or writable ones).
pub fn code_mappings(maps: &str) -> Vec<CodeMapping> {
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            // offset, device and inode come before the path, which starts with the first
            // " /" (no earlier field contains a slash) and may contain spaces
            let path = &line[line.find(" /")? + 1..];
            if perms != "r-xp" {
                return None;
            }
            let (start, end) = range.split_once('-')?;
            let start = usize::from_str_radix(start, 16).ok()?;
            let end = usize::from_str_radix(end, 16).ok()?;
            (end > start).then(|| CodeMapping {
                start,
                end,
                path: path.to_owned(),
            })
        })
        .collect()
}

/// KiB of `/proc/PID/smaps` `Size` and `Rss` of the read-only executable private mappings of
/// the file `exe` (the binary's code, not its libraries').
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeResidency {
    pub size_kib: u64,
    pub resident_kib: u64,
}

/// The [`CodeResidency`] of `exe` in a `/proc/PID/smaps` text; malformed lines count nothing.
pub fn code_residency(smaps: &str, exe: &str) -> CodeResidency {
    let mut in_code = false;
    let mut found = CodeResidency::default();
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(first), second) = (fields.next(), fields.next()) else {
            continue;
        };
        // a mapping's header line ("start-end perms offset dev inode path"); its fields follow
        if first.contains('-') && !first.ends_with(':') {
            let path = line.find(" /").map(|at| &line[at + 1..]);
            in_code = second == Some("r-xp") && path == Some(exe);
            continue;
        }
        if !in_code {
            continue;
        }
        let kib = second.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match first {
            "Size:" => found.size_kib += kib,
            "Rss:" => found.resident_kib += kib,
            _ => {}
        }
    }
    found
}

/// This process's own [`CodeResidency`] (its executable as `/proc/self/exe` names it, the same
/// text `/proc/self/smaps` shows, a " (deleted)" suffix included); `None` when either is
/// unreadable.
pub fn own_code_residency() -> Option<CodeResidency> {
    let exe = std::fs::read_link("/proc/self/exe").ok()?;
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    Some(code_residency(&smaps, exe.to_str()?))
}

/// The heap pages start-up freed, given back with the code pages (glibc keeps freed memory
/// resident otherwise); returns whether any was released.
pub fn release_freed_heap() -> bool {
    crate::sys::trim_heap()
}

/// Drops this process's mapping of every code page (see the module documentation); returns how
/// many bytes of mappings were released.
pub fn release_code_pages() -> io::Result<usize> {
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut released = 0;
    for m in code_mappings(&maps) {
        crate::sys::drop_file_pages(m.start, m.end - m.start)?;
        released += m.end - m.start;
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a08000 r--p 00000000 fe:01 123 /usr/bin/switchyard
55d0c0a08000-55d0c2000000 r-xp 00008000 fe:01 123 /usr/bin/switchyard
55d0c2000000-55d0c2100000 r--p 01600000 fe:01 123 /usr/bin/switchyard
55d0c2100000-55d0c2110000 rw-p 01700000 fe:01 123 /usr/bin/switchyard
55d0c3000000-55d0c3100000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000020000 r-xp 00000000 00:00 0
7f1000000000-7f1000180000 r-xp 00028000 fe:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
7f2000000000-7f2000001000 rwxp 00000000 fe:01 78 /opt/jit code/x.so
7f3000000000-7f3000001000 r-xs 00000000 fe:01 79 /dev/shm/shared code
7f4000000000-7f4000002000 r-xp 00000000 fe:01 80 /opt/with space/lib.so
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]
";

    #[test]
    fn only_private_read_only_executable_file_mappings_are_code() {
        let found = code_mappings(MAPS);
        assert_eq!(
            found,
            vec![
                CodeMapping {
                    start: 0x55d0c0a08000,
                    end: 0x55d0c2000000,
                    path: "/usr/bin/switchyard".into()
                },
                CodeMapping {
                    start: 0x7f1000000000,
                    end: 0x7f1000180000,
                    path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into()
                },
                CodeMapping {
                    start: 0x7f4000000000,
                    end: 0x7f4000002000,
                    path: "/opt/with space/lib.so".into()
                },
            ]
        );
    }

    #[test]
    fn malformed_lines_are_skipped() {
        assert!(code_mappings("zz-yy r-xp 0 0 0 /x\n\nfoo\n10-5 r-xp 0 0 0 /y\n").is_empty());
    }

    const SMAPS: &str = "\
55d0c0a00000-55d0c0a08000 r--p 00000000 fe:01 123 /usr/bin/switchyard
Size:                 32 kB
Rss:                  32 kB
55d0c0a08000-55d0c2000000 r-xp 00008000 fe:01 123 /usr/bin/switchyard
Size:              22496 kB
KernelPageSize:        4 kB
Rss:                9800 kB
Pss:                9800 kB
VmFlags: rd ex mr mw me dw
7f1000000000-7f1000180000 r-xp 00028000 fe:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6
Size:               1536 kB
Rss:                1200 kB
7f4000000000-7f4000002000 r-xp 00000000 fe:01 80 /usr/bin/switchyard (deleted)
Size:                  8 kB
Rss:                   8 kB
7f5000000000-7f5000002000 r-xp 00000000 fe:01 81 /usr/bin/switchyard
Size:                  8 kB
Rss:               bogus kB
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]
Size:                  8 kB
Rss:                   4 kB
";

    #[test]
    fn code_residency_counts_the_executables_code_mappings_only() {
        assert_eq!(
            code_residency(SMAPS, "/usr/bin/switchyard"),
            CodeResidency {
                size_kib: 22504,
                resident_kib: 9800
            }
        );
        assert_eq!(
            code_residency(SMAPS, "/usr/bin/switchyard (deleted)"),
            CodeResidency {
                size_kib: 8,
                resident_kib: 8
            }
        );
        assert_eq!(code_residency("", "/x"), CodeResidency::default());
    }

    /// Released code runs again: the pages come back from the file on the next call.
    #[test]
    fn code_runs_after_its_pages_are_released() {
        let released = release_code_pages().expect("release");
        assert!(released > 0, "no code mapping found in /proc/self/maps");
        let text: String = code_mappings("1-2 r-xp 0 0 0 /a\n")
            .iter()
            .map(|m| m.path.clone())
            .collect();
        assert_eq!(text, "/a");
    }
}

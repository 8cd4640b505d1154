//! The process's threads from `/proc/self/task`: ids, names, states and CPU times. Serves
//! `num_goroutines` (the thread count) and the text of `/debug/pprof/goroutine`.

use std::fmt::Write as _;
use std::io;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadInfo {
    pub tid: u32,
    /// `comm`: the thread name (at most 15 bytes, as the kernel keeps it).
    pub name: String,
    /// Scheduler state letter: R running, S sleeping, D disk wait...
    pub state: char,
    pub user_ticks: u64,
    pub system_ticks: u64,
}

/// Thread ids of this process.
pub fn thread_ids() -> io::Result<Vec<u32>> {
    let mut ids: Vec<u32> = std::fs::read_dir("/proc/self/task")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    ids.sort_unstable();
    Ok(ids)
}

/// Every thread that still exists when it is read (threads may end meanwhile).
pub fn list() -> io::Result<Vec<ThreadInfo>> {
    Ok(thread_ids()?
        .into_iter()
        .filter_map(|tid| {
            let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
            parse_stat(tid, &stat)
        })
        .collect())
}

/// Parses `/proc/<pid>/task/<tid>/stat`. The name sits in parentheses and may itself hold
/// spaces and parentheses, so the fields are counted from the last `)`.
pub fn parse_stat(tid: u32, stat: &str) -> Option<ThreadInfo> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let name = stat.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    // After the name: state (field 3), ... utime (field 14), stime (field 15).
    let state = rest.first()?.chars().next()?;
    let user_ticks = rest.get(11)?.parse().ok()?;
    let system_ticks = rest.get(12)?.parse().ok()?;
    Some(ThreadInfo {
        tid,
        name,
        state,
        user_ticks,
        system_ticks,
    })
}

/// The thread list as text, Go's `goroutine?debug=1` counterpart for a Rust process.
pub fn render(threads: &[ThreadInfo], ticks_per_second: u64) -> String {
    let tps = ticks_per_second.max(1) as f64;
    let mut out = format!(
        "threads profile: total {}\n\
         # Rust has no goroutines: these are the operating-system threads of the process\n\
         # (/proc/self/task). Stacks are not sampled; use /debug/pprof/profile for where time goes.\n\
         #\n# tid\tstate\tuser_s\tsystem_s\tname\n",
        threads.len()
    );
    for t in threads {
        let _ = writeln!(
            out,
            "{}\t{}\t{:.2}\t{:.2}\t{}",
            t.tid,
            t.state,
            t.user_ticks as f64 / tps,
            t.system_ticks as f64 / tps,
            t.name
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_stat_line_with_a_tricky_name() {
        let stat = "4242 (tok (io) 1) S 1 4242 4242 0 -1 4194624 120 0 0 0 37 12 0 0 20 0 9 0 \
                    100 1000000 500 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 -1 1 0 0 0 0 0";
        let t = parse_stat(4242, stat).expect("parsed");
        assert_eq!(t.name, "tok (io) 1");
        assert_eq!(t.state, 'S');
        assert_eq!((t.user_ticks, t.system_ticks), (37, 12));
        assert!(parse_stat(1, "garbage").is_none());
        assert!(parse_stat(1, "1 (x) S 1").is_none());
    }

    #[test]
    fn sees_a_named_thread_of_this_process() {
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("sydiag-probe".into())
            .spawn(move || {
                let _ = ready_tx.send(());
                let _ = stop_rx.recv();
            })
            .expect("spawn");
        ready_rx.recv().expect("thread started");
        let threads = list().expect("proc");
        assert!(threads.iter().any(|t| t.name == "sydiag-probe"));
        assert!(thread_ids().expect("proc").len() >= 2);
        let text = render(&threads, 100);
        assert!(text.contains("sydiag-probe"));
        drop(stop_tx);
        worker.join().expect("join");
    }
}

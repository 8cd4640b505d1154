//! Helpers of the namespace tests (root): the privilege/tool check, shell commands, running this
//! test binary in helper mode inside a network namespace and a cgroup, reading its `RESULT`
//! lines, and removing test cgroups. Shared by `tests/vpn.rs` (through `support`) and
//! `control/split-tunnel/tests/netns.rs` (by path); std only.
#![allow(dead_code)]

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Runs only the `helper` test of a test binary, its output uncaptured.
pub const HELPER_ARGS: [&str; 4] = ["helper", "--exact", "--nocapture", "--test-threads=1"];

/// Whether the test can run: root and every tool of `tools` present. Otherwise prints why and
/// returns false — or, under `CI`, fails.
pub fn root_with_tools_or_skip(what: &str, tools: &[&str]) -> bool {
    // the effective uid is the second field of the Uid: line
    let euid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(String::from))
        })
        .unwrap_or_default();
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|c| {
            !["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
                .iter()
                .any(|d| Path::new(d).join(c).exists())
        })
        .collect();
    let reason = if euid != "0" {
        Some("needs root".to_string())
    } else if !missing.is_empty() {
        Some(format!("missing {}", missing.join(", ")))
    } else {
        None
    };
    match reason {
        None => true,
        Some(r) if std::env::var_os("CI").is_some() => {
            panic!("{what}: {r} (CI must not skip; tests/run installs the tools)")
        }
        Some(r) => {
            eprintln!("SKIP {what}: {r}");
            false
        }
    }
}

/// Runs `cmd` with `sh -c`; its stdout, or a failure naming the command and its stderr.
pub fn sh(cmd: &str) -> String {
    let out = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    assert!(
        out.status.success(),
        "`{cmd}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Like [`sh`], ignoring failures (stdout, possibly empty).
pub fn sh_quiet(cmd: &str) -> String {
    Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// `program` run inside `netns` after joining `cgroup` (when given), so its sockets are created
/// there.
pub fn in_netns(netns: &str, cgroup: Option<&Path>, program: &Path) -> Command {
    let join = cgroup
        .map(|cg| format!("echo $$ > '{}/cgroup.procs' && ", cg.display()))
        .unwrap_or_default();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(format!(
            "{join}exec nsenter --net=/run/netns/{netns} \"$@\""
        ))
        .arg("sh")
        .arg(program);
    cmd
}

/// This test binary in helper mode inside `netns` (and `cgroup`): `env` names its action and
/// argument variables, e.g. `("SYVPN_HELPER", "SYVPN_ARG")`.
pub fn helper_in(
    netns: &str,
    cgroup: Option<&Path>,
    env: (&str, &str),
    action: &str,
    arg: &str,
) -> Command {
    let exe = std::env::current_exe().expect("test exe");
    helper_copy_in(netns, cgroup, &exe, env, action, arg)
}

/// Like [`helper_in`] with `program`, a copy of this test binary (under another name or path).
pub fn helper_copy_in(
    netns: &str,
    cgroup: Option<&Path>,
    program: &Path,
    env: (&str, &str),
    action: &str,
    arg: &str,
) -> Command {
    let mut cmd = in_netns(netns, cgroup, program);
    cmd.args(HELPER_ARGS)
        .env(env.0, action)
        .env(env.1, arg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    cmd
}

/// The next `RESULT …` line of a helper's output.
pub fn next_result(out: &mut impl BufRead) -> String {
    let mut lines = out.lines();
    loop {
        match lines.next() {
            // libtest prints "test helper ... " without a newline before the helper's output
            Some(Ok(l)) if l.contains("RESULT ") => {
                return l.split("RESULT ").nth(1).unwrap_or_default().to_string()
            }
            Some(Ok(_)) => continue,
            _ => panic!("helper ended without a result"),
        }
    }
}

/// Ends the processes of each cgroup (a failed test's probes) and removes the directories, in
/// order (children first).
pub fn remove_cgroups(dirs: &[&Path]) {
    for dir in dirs {
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
        for _ in 0..50 {
            if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

//! Running `ip` and `nft` on the host, optionally inside a named network namespace (entered with
//! `nsenter --net`, which, unlike `ip netns exec`, keeps /sys and so the cgroup paths nft resolves).

use std::io::Write;
use std::process::{Command, Stdio};

use crate::Error;

#[derive(Clone, Debug, Default)]
pub struct Host {
    pub netns: Option<String>,
}

impl Host {
    fn command(&self, program: &str) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg(program);
                c
            }
            None => Command::new(program),
        }
    }

    /// Runs a command with optional stdin; returns stdout, or the command line and its stderr.
    pub fn run(&self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, Error> {
        let cmdline = format!("{program} {}", args.join(" "));
        let mut cmd = self.command(program);
        cmd.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| Error::Command {
            cmd: cmdline.clone(),
            stderr: e.to_string(),
        })?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())
                .map_err(|e| Error::Command {
                    cmd: cmdline.clone(),
                    stderr: e.to_string(),
                })?;
        }
        let out = child.wait_with_output().map_err(|e| Error::Command {
            cmd: cmdline.clone(),
            stderr: e.to_string(),
        })?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(Error::Command {
                cmd: cmdline,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }

    /// Like [`Host::run`] for undo steps: "not there" counts as done.
    pub fn run_undo(&self, program: &str, args: &[&str]) -> Result<(), Error> {
        match self.run(program, args, None) {
            Ok(_) => Ok(()),
            Err(Error::Command { stderr, .. }) if is_already_gone(&stderr) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// Whether an `ip`/`nft` error says the object does not exist.
pub fn is_already_gone(stderr: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    s.contains("no such file or directory")
        || s.contains("does not exist")
        || s.contains("not found")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_objects_are_recognised() {
        assert!(is_already_gone(
            "RTNETLINK answers: No such file or directory"
        ));
        assert!(is_already_gone(
            "Error: Could not process rule: No such file or directory"
        ));
        assert!(!is_already_gone(
            "RTNETLINK answers: Operation not permitted"
        ));
    }
}

//! External programs (`yt-dlp`, `ffmpeg`): found at start (a name is looked up in `PATH`),
//! asked for their version, reported by `/health`, and run with a time limit. A child is
//! killed when its job is cancelled (the future is dropped).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Serialize;

/// A program that answered its version query.
#[derive(Debug, Clone, Serialize)]
pub struct Tool {
    pub path: PathBuf,
    pub version: String,
}

/// What was found at start.
#[derive(Debug, Clone, Default)]
pub struct Tools {
    pub yt_dlp: Option<Tool>,
    pub ffmpeg: Option<Tool>,
}

fn find_program(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        let p = PathBuf::from(name);
        return p.is_file().then_some(p);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

async fn probe(configured: &str, version_arg: &str) -> Option<Tool> {
    if configured.trim().is_empty() {
        return None;
    }
    let path = find_program(configured.trim())?;
    let out = run(&path, &[version_arg], Duration::from_secs(20))
        .await
        .ok()?;
    let version = String::from_utf8_lossy(&out)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    Some(Tool { path, version })
}

impl Tools {
    /// Probes the configured programs (empty name = disabled).
    pub async fn detect(yt_dlp: &str, ffmpeg: &str) -> Tools {
        let tools = Tools {
            yt_dlp: probe(yt_dlp, "--version").await,
            ffmpeg: probe(ffmpeg, "-version").await,
        };
        for (name, t) in [("yt-dlp", &tools.yt_dlp), ("ffmpeg", &tools.ffmpeg)] {
            match t {
                Some(t) => {
                    tracing::info!(path = %t.path.display(), version = %t.version, "{name} found")
                }
                None => tracing::warn!("{name} not available: features needing it are off"),
            }
        }
        tools
    }
}

/// Runs a program; its standard output on exit status 0, else the last lines of its standard
/// error (or why it could not run).
pub async fn run(program: &Path, args: &[&str], limit: Duration) -> Result<Vec<u8>, String> {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let out = match tokio::time::timeout(limit, child.wait_with_output()).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(format!("{}: {e}", program.display())),
        Err(_) => return Err(format!("{} ran longer than {limit:?}", program.display())),
    };
    if out.status.success() {
        return Ok(out.stdout);
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .rev()
        .take(2)
        .collect();
    Err(tail.into_iter().rev().collect::<Vec<_>>().join(" / "))
}

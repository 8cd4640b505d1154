//! Embeds build information for `GET /api/v1/version`.
use std::process::Command;

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    let commit =
        output("git", &["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = output(&rustc, &["--version"]).unwrap_or_else(|| "rustc unknown".into());
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    println!("cargo:rustc-env=SWITCHYARD_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=SWITCHYARD_RUSTC_VERSION={rustc_version}");
    println!("cargo:rustc-env=SWITCHYARD_BUILD_EPOCH={secs}");
    // Where HEAD and the branch refs are: `.git/` in a checkout, `.git/worktrees/NAME/` and the
    // common directory in a worktree (where `.git` is a file, and naming `../../.git/HEAD` made
    // every build rerun this script and recompile the crate). Outside git: never rerun.
    println!("cargo:rerun-if-changed=build.rs");
    for (arg, sub) in [("--git-path", "HEAD"), ("--git-common-dir", "refs/heads")] {
        let dir = if arg == "--git-path" {
            output("git", &["rev-parse", arg, sub])
        } else {
            output("git", &["rev-parse", arg]).map(|d| format!("{d}/{sub}"))
        };
        if let Some(path) = dir.filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

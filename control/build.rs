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
    // Release links only (the linker is LLD, rustc's default here): RELR packs the ~50,000
    // relative relocations of the position-independent binary — 1.2 MB of `.rela.dyn` that the
    // dynamic loader reads at every start — into a few KiB (needs glibc >= 2.36, Debian 12), and
    // identical code folding merges functions that compiled to the same bytes. The symbol
    // ordering file puts the functions `server` runs from start to idle (and on its first
    // requests) first and together: every page of the binary start-up touches stays resident,
    // and that code is ~1 MB scattered over ~30 MB otherwise (link-order/regenerate.sh).
    if std::env::var("PROFILE").as_deref() == Ok("release") {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
        println!("cargo:rustc-link-arg-bins=-Wl,--icf=safe");
        if let Ok(dir) = std::env::var("CARGO_MANIFEST_DIR") {
            println!(
                "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={dir}/link-order/symbols.txt"
            );
            // names that no longer exist (code changed since the file was made) are skipped
            println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
        }
        println!("cargo:rerun-if-changed=link-order/symbols.txt");
    }
    println!("cargo:rerun-if-changed=../.git/HEAD");
    println!("cargo:rerun-if-changed=../.git/refs/heads");
}

//! Issue 30: the build needs only the Rust toolchain and a C compiler, and the authentication
//! modes that use system libraries find them at run time.
//!
//! - `the_workspace_builds_without_dev_headers_or_clang`: in a private mount namespace,
//!   `/usr/include` is replaced by the headers of the C compiler's own packages (libc6-dev,
//!   linux-libc-dev, libcrypt-dev, libnsl-dev, libstdc++-dev: what build-essential brings), and
//!   every `/usr/lib/llvm-*` (clang and libclang) is hidden; then `cargo check --workspace`
//!   runs every build script of the tree from a fresh target directory. A crate that needs
//!   PAM's or GSS-API's headers, libbpf's, or bindgen's libclang fails it. The binary the
//!   suite built must not link libpam or libgssapi (they are opened at run time).
//! - `a_missing_libpam_disables_the_system_mode_and_names_the_package`: the server started
//!   where `libpam.so.0` cannot be loaded reports `system` as `build_disabled` with the reason,
//!   and `config validate` refuses a `system` configuration naming the package.
//!
//! Both need root (mount namespaces).

mod support;

use std::process::Command;
use support::*;

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Runs `script` with `sh` in a private mount namespace; returns its output.
fn in_private_mounts(script: &str, args: &[&str]) -> std::process::Output {
    Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .args(args)
        .output()
        .expect("run unshare")
}

#[test]
fn the_workspace_builds_without_dev_headers_or_clang() {
    if !is_root() {
        skip_unless_ci("needs root for a private mount namespace");
        return;
    }
    let workspace = env!("CARGO_MANIFEST_DIR");
    let scratch = tempfile::tempdir().expect("tempdir");
    let include = scratch.path().join("include");
    let target = scratch.path().join("target");
    std::fs::create_dir_all(&include).expect("mkdir");
    // The compiler's own headers, copied with their paths; then the swap, the proof that the
    // hidden things are gone, and the build.
    let script = r#"
set -eu
include="$1"; target="$2"; workspace="$3"
dev=$(dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n' 'libc6-dev' 'linux-libc-dev' 'libcrypt-dev' 'libnsl-dev' 'libstdc++-*-dev' 2>/dev/null | awk '$1 == "ii" {print $2}')
dpkg -L $dev | grep '^/usr/include/' | while read -r f; do [ -d "$f" ] || echo "$f"; done |
  xargs -d '\n' cp -P --parents -t "$include"
mount --bind "$include/usr/include" /usr/include
for d in /usr/lib/llvm-*; do [ -d "$d" ] && mount -t tmpfs -o ro,size=64k none "$d"; done
for h in /usr/include/security/pam_appl.h /usr/include/gssapi/gssapi.h /usr/include/bpf/libbpf.h; do
  if [ -e "$h" ]; then echo "still visible: $h" >&2; exit 90; fi
done
[ -f /usr/include/stdio.h ] || { echo "libc headers missing from the copy" >&2; exit 91; }
if clang --version >/dev/null 2>&1; then echo "clang still runs" >&2; exit 92; fi
if ls /usr/lib/llvm-*/lib/libclang* >/dev/null 2>&1; then echo "libclang still visible" >&2; exit 93; fi
cd "$workspace"
exec nice cargo check --workspace --locked --offline --quiet --target-dir "$target"
"#;
    let include = include.to_string_lossy();
    let target = target.to_string_lossy();
    let out = in_private_mounts(script, &[&include, &target, workspace]);
    assert!(
        out.status.success(),
        "the workspace needs more than the Rust toolchain and a C compiler (exit {:?}):\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    // every build script ran: the eBPF objects fell back to the checked-in ones
    let ebpf_fallback = std::fs::read_dir(scratch.path().join("target/debug/build"))
        .expect("build dir")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("switchyard-ebpf-")
        })
        .any(|e| {
            std::fs::read_to_string(e.path().join("output"))
                .is_ok_and(|o| o.contains("SWITCHYARD_EBPF_OBJECT_SOURCE=prebuilt"))
        });
    assert!(
        ebpf_fallback,
        "the eBPF build script did not fall back to the prebuilt objects without clang"
    );

    // Linking: the binary names no PAM or GSS-API library (they are dlopen'ed).
    let needed = Command::new("readelf")
        .args(["-d", BIN])
        .output()
        .expect("run readelf");
    let dynamic = String::from_utf8_lossy(&needed.stdout);
    assert!(dynamic.contains("(NEEDED)"), "readelf -d {BIN}: {dynamic}");
    for lib in ["libpam", "libgssapi", "libkrb5", "libclang"] {
        assert!(
            !dynamic
                .lines()
                .any(|l| l.contains("(NEEDED)") && l.contains(lib)),
            "{BIN} links {lib} at load time:\n{dynamic}"
        );
    }
}

/// The real file behind `libpam.so.0` (what the dynamic loader opens).
fn libpam_file() -> Option<String> {
    let out = Command::new("sh")
        .args([
            "-c",
            "ldconfig -p | awk '/libpam.so.0 .*x86-64/ {print $NF; exit}'",
        ])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let real = std::fs::canonicalize(&path).ok()?;
    Some(real.to_string_lossy().into_owned())
}

#[test]
fn a_missing_libpam_disables_the_system_mode_and_names_the_package() {
    if !is_root() {
        skip_unless_ci("needs root for a private mount namespace");
        return;
    }
    let Some(libpam) = libpam_file() else {
        skip_unless_ci("libpam.so.0 is not installed");
        return;
    };
    // /dev/null over the library: dlopen finds the file and cannot load it
    let hide = r#"mount --bind /dev/null "$1" && shift && exec "$@""#;
    let dir = tempfile::tempdir().expect("tempdir");
    let system = dir.path().join("system.yaml");
    std::fs::write(&system, "auth:\n  mode: system\n").expect("write");

    let out = in_private_mounts(
        hide,
        &[
            &libpam,
            BIN,
            "config",
            "validate",
            &system.to_string_lossy(),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "validate accepted system mode without libpam:\n{text}"
    );
    assert!(
        text.contains("[auth] auth.mode: libpam.so.0 could not be loaded")
            && text.contains("install the libpam0g package"),
        "{text}"
    );
    // with the library present the same file is valid
    let out = Command::new(BIN)
        .args(["config", "validate"])
        .arg(&system)
        .output()
        .expect("run validate");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // The server itself runs (native mode) and reports the mode's state.
    let config = dir.path().join("server.yaml");
    std::fs::write(
        &config,
        "server:\n  http: { listen: \"127.0.0.1:0\" }\n  socks5: { listen: \"127.0.0.1:0\" }\n  cores: 1\n\
         api: { listen: \"127.0.0.1:0\" }\nlogging: { level: info, format: json }\n",
    )
    .expect("write");
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        hide,
        "sh",
        &libpam,
        BIN,
        "server",
        "--config",
    ])
    .arg(&config);
    let started = spawn_with_listeners(cmd, "switchyard server", &["management API"]);
    let api = started.addrs[0];
    let out = curl(&[
        "-sS",
        "--max-time",
        "10",
        &format!("http://{api}/api/v1/auth/plugins"),
    ]);
    let plugins: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let system = plugins["plugins"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "system"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        system["availability"]["state"], "build_disabled",
        "{plugins}"
    );
    let reason = system["availability"]["reason"]
        .as_str()
        .unwrap_or_default();
    assert!(reason.contains("libpam0g"), "{reason}");
    drop(started);
}

//! Compiles `src/*.bpf.c` with clang when it is installed and works; otherwise (or with
//! `SWITCHYARD_EBPF_PREBUILT=1`) copies the checked-in object from `prebuilt/`. The choice is
//! exported as `SWITCHYARD_EBPF_OBJECT_SOURCE` (`built` | `prebuilt`) for the loader to report.

use std::path::{Path, PathBuf};
use std::process::Command;

#[allow(dead_code)] // source_stamp is for the staleness test
mod stamp {
    include!("src/stamp.rs");
}

/// Per-target include dir (for `asm/types.h`) and the libbpf arch define.
fn arch_args(arch: &str) -> Vec<String> {
    let (triple, define) = match arch {
        "x86_64" => ("x86_64-linux-gnu", "x86"),
        "aarch64" => ("aarch64-linux-gnu", "arm64"),
        "arm" => ("arm-linux-gnueabihf", "arm"),
        "riscv64" => ("riscv64-linux-gnu", "riscv"),
        "powerpc64" => ("powerpc64le-linux-gnu", "powerpc"),
        other => (other, other),
    };
    let mut args = vec![format!("-D__TARGET_ARCH_{define}")];
    let include = format!("/usr/include/{triple}");
    if Path::new(&include).is_dir() {
        args.push(format!("-I{include}"));
    } else {
        // a build host of another arch: its own asm headers define the same __u32 types
        args.push(format!(
            "-I/usr/include/{}-linux-gnu",
            std::env::consts::ARCH
        ));
    }
    args
}

fn compile(clang: &str, src: &Path, out: &Path, arch: &str) -> Result<(), String> {
    let output = Command::new(clang)
        .args(stamp::CLANG_FLAGS)
        .args(arch_args(arch))
        .arg("-c")
        .arg(src)
        .arg("-o")
        .arg(out)
        .output()
        .map_err(|e| format!("{clang}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

fn main() {
    let manifest =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    let clang = std::env::var("SWITCHYARD_CLANG").unwrap_or_else(|_| "clang".into());
    let force_prebuilt = std::env::var_os("SWITCHYARD_EBPF_PREBUILT").is_some();
    println!("cargo:rerun-if-env-changed=SWITCHYARD_CLANG");
    println!("cargo:rerun-if-env-changed=SWITCHYARD_EBPF_PREBUILT");

    let mut source = "built";
    for name in stamp::PROGRAMS {
        let src = manifest.join("src").join(format!("{name}.bpf.c"));
        let prebuilt = manifest.join("prebuilt").join(format!("{name}.bpf.o"));
        let out = out_dir.join(format!("{name}.bpf.o"));
        println!("cargo:rerun-if-changed={}", src.display());
        println!("cargo:rerun-if-changed={}", prebuilt.display());
        let built = if force_prebuilt {
            Err("SWITCHYARD_EBPF_PREBUILT is set".to_string())
        } else {
            compile(&clang, &src, &out, &arch)
        };
        if let Err(why) = built {
            println!(
                "cargo:warning=eBPF {name}: using prebuilt object ({})",
                why.lines().next().unwrap_or("")
            );
            std::fs::copy(&prebuilt, &out)
                .unwrap_or_else(|e| panic!("no clang and no {}: {e}", prebuilt.display()));
            source = "prebuilt";
        }
    }
    println!("cargo:rustc-env=SWITCHYARD_EBPF_OBJECT_SOURCE={source}");
}

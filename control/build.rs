//! Link options of the release binary (its build information is embedded by
//! control/plane/build.rs, the library's).

fn main() {
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
    println!("cargo:rerun-if-changed=build.rs");
}

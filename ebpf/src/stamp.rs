// Shared by build.rs (via include!) and the staleness test: what the checked-in object is a
// function of. The stamp hashes the C source and the architecture-independent compiler flags, not
// the object bytes, so a different clang version producing different (equally valid) bytes does not
// count as stale, while any edit of the source or of the flags does.

/// The eBPF programs compiled by the build, each `src/<name>.bpf.c` → `<name>.bpf.o`.
pub const PROGRAMS: &[&str] = &["split_tunnel", "reuseport_balance"];

/// Compiler flags common to every target architecture (the per-arch include dir and
/// `__TARGET_ARCH_*` define are added by build.rs and do not change the object for these programs,
/// which read no architecture-specific registers).
pub const CLANG_FLAGS: &[&str] = &["-O2", "-g", "-target", "bpfel", "-Wall", "-Werror"];

/// Hex SHA-256 over the flags and the source text, as written to `prebuilt/<name>.bpf.o.stamp`.
pub fn source_stamp(source: &[u8]) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    for flag in CLANG_FLAGS {
        hasher.update(flag.as_bytes());
        hasher.update([0u8]);
    }
    hasher.update(source);
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

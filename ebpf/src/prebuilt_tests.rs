//! The checked-in objects in `prebuilt/` must match the sources: each carries a stamp (hash of
//! the source and the compiler flags, see `stamp.rs`). A stale stamp fails here. To refresh after
//! editing a `.bpf.c`: `SWITCHYARD_EBPF_UPDATE_PREBUILT=1 cargo test -p switchyard-ebpf prebuilt`
//! (needs clang; copies the object build.rs just compiled and writes the new stamp).

use std::path::PathBuf;

use crate::stamp::{source_stamp, PROGRAMS};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The object build.rs produced for `name`, as linked into the binary.
fn compiled(name: &str) -> &'static [u8] {
    match name {
        "split_tunnel" => crate::SPLIT_TUNNEL_OBJECT,
        "reuseport_balance" => crate::REUSEPORT_BALANCE_OBJECT,
        other => panic!("no object constant for {other}"),
    }
}

#[test]
fn prebuilt_objects_match_their_sources() {
    let update = std::env::var_os("SWITCHYARD_EBPF_UPDATE_PREBUILT").is_some();
    for name in PROGRAMS {
        let source = std::fs::read(crate_dir().join(format!("src/{name}.bpf.c"))).expect("source");
        let object_path = crate_dir().join(format!("prebuilt/{name}.bpf.o"));
        let stamp_path = crate_dir().join(format!("prebuilt/{name}.bpf.o.stamp"));
        let expected = source_stamp(&source);
        if update {
            assert_eq!(
                crate::OBJECT_SOURCE,
                "built",
                "refreshing needs clang to have built the object"
            );
            std::fs::write(&object_path, compiled(name)).expect("write object");
            std::fs::write(&stamp_path, format!("{expected}\n")).expect("write stamp");
        }
        let recorded = std::fs::read_to_string(&stamp_path).unwrap_or_default();
        assert_eq!(
            recorded.trim(),
            expected,
            "prebuilt/{name}.bpf.o is stale against src/{name}.bpf.c; refresh it with \
             SWITCHYARD_EBPF_UPDATE_PREBUILT=1 cargo test -p switchyard-ebpf prebuilt"
        );
        let object = std::fs::read(&object_path).expect("prebuilt object");
        // ELF, 64-bit, e_machine EM_BPF (247)
        assert_eq!(&object[..4], b"\x7fELF");
        assert_eq!(
            u16::from_le_bytes([object[18], object[19]]),
            247,
            "{name} is not a BPF object"
        );
    }
}

#[test]
fn stamp_changes_with_the_source() {
    assert_ne!(source_stamp(b"int a;"), source_stamp(b"int b;"));
    assert_eq!(source_stamp(b"int a;"), source_stamp(b"int a;"));
}

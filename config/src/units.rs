//! Duration and size strings (`30s`, `1m30s`, bare number = nanoseconds; `2GB`, `512MiB`).
// TODO(config helper): parsing, Display (Go style, e.g. `1m30s`), serde impls, tests.

/// A duration read from a Go-style duration string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

/// A byte size read from `2GB` / `512MiB` / a bare number of bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Size(pub u64);

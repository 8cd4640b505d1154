//! End-to-end tests of `switchyard pkgcache` (work in progress).

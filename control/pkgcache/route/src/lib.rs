//! The package cache's request paths, as plain code: what a valid package address is ([`key`])
//! and which endpoint a path names ([`route`]). The pkgcache server dispatches every request
//! and decides authentication from [`route::resolve`]'s answer, so the handler that runs and the
//! credentials it needs can never disagree. No I/O and no runtime: unit-tested here and fuzzed
//! from `control/pkgcache/fuzz`.
#![forbid(unsafe_code)]

pub mod key;
pub mod route;

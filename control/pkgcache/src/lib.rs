//! `switchyard pkgcache` (work in progress).

/// Command-line arguments of `switchyard pkgcache`.
#[derive(clap::Args, Debug, Clone)]
pub struct PkgcacheArgs {}

pub fn run(_args: PkgcacheArgs) -> anyhow::Result<()> {
    anyhow::bail!("pkgcache is not built yet")
}

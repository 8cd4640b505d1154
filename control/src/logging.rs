//! Log setup from the `logging` section: level (overridable with `RUST_LOG`), text or JSON,
//! stderr or a file.

use anyhow::Context as _;
use switchyard_config::{LogFormat, LoggingConfig};
use tracing_subscriber::EnvFilter;

pub fn init(cfg: &LoggingConfig) -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&cfg.level));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let result = match (&cfg.output, cfg.format) {
        (Some(path), format) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("opening log file {path}"))?;
            let b = builder
                .with_writer(std::sync::Mutex::new(file))
                .with_ansi(false);
            match format {
                LogFormat::Json => b.json().try_init(),
                LogFormat::Text => b.try_init(),
            }
        }
        (None, LogFormat::Json) => builder.json().with_writer(std::io::stderr).try_init(),
        (None, LogFormat::Text) => builder.with_writer(std::io::stderr).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("initialising logging: {e}"))
}

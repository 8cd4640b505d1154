//! Log set-up from a `logging` section: level (overridable with `RUST_LOG`), text or JSON,
//! standard error or a file (appended, no colours).

use std::io::IsTerminal as _;
use switchyard_config::{LogFormat, LoggingConfig};
use tracing_subscriber::EnvFilter;

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("opening log file {path}: {source}")]
    File {
        path: String,
        source: std::io::Error,
    },
    #[error("initialising logging: {0}")]
    Init(String),
}

/// Installs the global subscriber. `extra_directives` (e.g. `",sqlx=warn"`) are appended to the
/// configured level when `RUST_LOG` is not set.
pub fn init(cfg: &LoggingConfig, extra_directives: &str) -> Result<(), LoggingError> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{}{extra_directives}", cfg.level)));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let result = match (&cfg.output, cfg.format) {
        (Some(path), format) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| LoggingError::File {
                    path: path.clone(),
                    source,
                })?;
            let b = builder
                .with_writer(std::sync::Mutex::new(file))
                .with_ansi(false);
            match format {
                LogFormat::Json => b.json().try_init(),
                LogFormat::Text => b.try_init(),
            }
        }
        (None, LogFormat::Json) => builder.json().with_writer(std::io::stderr).try_init(),
        (None, LogFormat::Text) => builder
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
    };
    result.map_err(|e| LoggingError::Init(e.to_string()))
}

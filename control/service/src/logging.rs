//! Log set-up from a `logging` section: level (overridable with `RUST_LOG`), text or JSON,
//! standard error or a file (appended, no colours), plus optionally one extra layer a command
//! brings (e.g. the client's in-memory log capture for its API).

use std::io::IsTerminal as _;
use switchyard_config::{LogFormat, LoggingConfig};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

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

/// A layer added beside the formatter; it sees the events the level filter lets through.
pub type ExtraLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Installs the global subscriber. `extra_directives` (e.g. `",sqlx=warn"`) are appended to the
/// configured level when `RUST_LOG` is not set.
pub fn init(cfg: &LoggingConfig, extra_directives: &str) -> Result<(), LoggingError> {
    init_with_layer(cfg, extra_directives, None)
}

/// [`init`] plus `extra`, which receives every event that passes the same level filter.
pub fn init_with_layer(
    cfg: &LoggingConfig,
    extra_directives: &str,
    extra: Option<ExtraLayer>,
) -> Result<(), LoggingError> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("{}{extra_directives}", cfg.level)));
    let base = tracing_subscriber::registry().with(extra).with(filter);
    let fmt = tracing_subscriber::fmt::layer();
    let formatter = match (&cfg.output, cfg.format) {
        (Some(path), format) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|source| LoggingError::File {
                    path: path.clone(),
                    source,
                })?;
            let f = fmt
                .with_writer(std::sync::Mutex::new(file))
                .with_ansi(false);
            match format {
                LogFormat::Json => f.json().boxed(),
                LogFormat::Text => f.boxed(),
            }
        }
        (None, LogFormat::Json) => fmt.json().with_writer(std::io::stderr).boxed(),
        (None, LogFormat::Text) => fmt
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .boxed(),
    };
    base.with(formatter)
        .try_init()
        .map_err(|e| LoggingError::Init(e.to_string()))
}

//! `switchyard subtitles`: the subtitle transcription and translation service (spec Part B).
//!
//! Given a video URL and a target language it obtains subtitles — existing caption tracks
//! (direct `.vtt`/`.srt`, HTML `<track>`, video sites through `yt-dlp`) or a transcription of
//! the audio through an OpenAI-compatible `/v1/audio/transcriptions` backend — translates them
//! in numbered batches through an OpenAI-compatible chat-completions provider, and returns timed
//! segments in one response (`POST /api/translate`) or as server-sent events (`POST
//! /api/stream`). Jobs and a translation cache persist in SQLite under the data directory.
//!
//! Runtime-free parts (unit-tested without sockets): [`formats`] (SRT, WebVTT), [`languages`],
//! [`request`] (validation, tiers), [`batching`] and [`reply`], [`retry`], [`ratelimit`],
//! [`html`], [`media`] (container sniffing), the address policy of [`fetch_guard`].
//! I/O at the edges: [`providers`], [`source`], [`tools`], [`store`], [`pipeline`], [`http`],
//! the guarded resolver of [`fetch_guard`] and yt-dlp's [`guard_proxy`].
//!
//! URLs a caller names (the video, what its page links to, a tier 1–2 `api_url`) are fetched
//! only at public addresses unless `fetch:` allows more ([`fetch_guard`]); endpoints from the
//! configuration are trusted and use a plain client.
//!
//! It shares nothing with the data plane: its own tokio runtime and router, started by
//! `switchyard subtitles`. Configuration:
//! [`switchyard_config::subtitles::SubtitlesConfig`] from `--config`, overridden by environment
//! variables and flags ([`SubtitlesArgs`], [`effective_config`]).
#![forbid(unsafe_code)]

pub mod batching;
pub mod error;
pub mod fetch_guard;
pub mod formats;
pub mod guard_proxy;
pub mod html;
pub mod http;
pub mod languages;
pub mod media;
pub mod pipeline;
pub mod providers;
pub mod ratelimit;
pub mod reply;
pub mod request;
pub mod retry;
pub mod source;
pub mod store;
pub mod tools;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use switchyard_config::subtitles::{validate_subtitles, SubtitlesConfig};

use crate::providers::TranscriptionTarget;
use crate::ratelimit::WindowLimiter;
use crate::request::{Provider, ProviderDefaults, Secret};
use crate::retry::RetryPolicy;

/// Command-line arguments of `switchyard subtitles`. Flags and the environment variables named
/// beside them override the config file; provider keys come only from the environment
/// (`SERVER_API_KEY`, `SERVERLESS_HOST_API_KEY`) or the file, never from flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SubtitlesArgs {
    /// YAML configuration (every key: config/examples/subtitles.yaml); default: built-in
    #[arg(long, short, env = "SWITCHYARD_SUBTITLES_CONFIG")]
    pub config: Option<PathBuf>,
    /// listen address, e.g. 0.0.0.0:5001, 127.0.0.1:0
    #[arg(long, env = "SWITCHYARD_SUBTITLES_LISTEN")]
    pub listen: Option<String>,
    /// data directory: subtitles.db (jobs, translation cache), temporary media (default ./data/subtitles)
    #[arg(long, env = "SWITCHYARD_SUBTITLES_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
}

/// The effective configuration: file (or built-in default), then `env` (the process
/// environment in production) and flags.
pub fn effective_config(
    args: &SubtitlesArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<SubtitlesConfig> {
    let mut cfg = match &args.config {
        Some(path) => SubtitlesConfig::load_file(path)?,
        None => SubtitlesConfig::default(),
    };
    if let Some(l) = &args.listen {
        cfg.listen = l.clone();
    }
    if let Some(d) = &args.data_dir {
        cfg.data_dir = d.display().to_string();
    }
    let set = |name: &str| {
        env(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if let Some(k) = set("SERVER_API_KEY") {
        cfg.translation.server.api_key = Some(k);
    }
    if let Some(u) = set("SERVER_API_URL") {
        cfg.translation.server.api_url = u;
    }
    if let Some(m) = set("SERVER_MODEL") {
        cfg.translation.server.model = m;
    }
    if let Some(k) = set("SERVERLESS_HOST_API_KEY") {
        cfg.transcription.api_key = Some(k);
    }
    if let Some(o) = set("CORS_ORIGINS") {
        cfg.cors_origins = o
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
    }
    let problems = validate_subtitles(&cfg);
    if !problems.is_empty() {
        let list: Vec<String> = problems.iter().map(|p| format!("  {p}")).collect();
        bail!("invalid subtitles configuration:\n{}", list.join("\n"));
    }
    Ok(cfg)
}

/// Everything a request handler needs.
pub struct App {
    pub cfg: SubtitlesConfig,
    /// For endpoints from the configuration (server provider, transcription backend, default
    /// provider URL).
    pub http: reqwest::Client,
    /// For caller-named URLs: guarded resolver and redirects ([`fetch_guard`]).
    pub fetch_http: reqwest::Client,
    pub fetch_policy: Arc<fetch_guard::FetchPolicy>,
    /// yt-dlp's proxy (`None` with `fetch.allow_private`, when there is nothing to guard).
    pub guard_proxy: Option<guard_proxy::GuardProxy>,
    pub tools: tools::Tools,
    pub store: store::Store,
    pub defaults: ProviderDefaults,
    pub server_transcription: Option<TranscriptionTarget>,
    pub retry: RetryPolicy,
    pub job_slots: tokio::sync::Semaphore,
    pub media_dir: PathBuf,
    pub cors_origins: Vec<String>,
    pub ip_limiter: parking_lot::Mutex<WindowLimiter>,
    pub key_limiter: parking_lot::Mutex<WindowLimiter>,
}

/// Runs `switchyard subtitles` until SIGINT/SIGTERM. Builds its own tokio runtime.
pub fn run(args: SubtitlesArgs) -> anyhow::Result<()> {
    let cfg = effective_config(&args, &|name| std::env::var(name).ok())?;
    let logging = cfg.logging.clone();
    switchyard_service::run(
        "subtitles",
        &logging,
        ",sqlx=warn,reqwest=warn,hyper=warn",
        serve(cfg),
    )?
}

/// Removes what a previous run left in the media directory.
fn clean_media_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        if let Err(e) = removed {
            tracing::warn!(path = %path.display(), "cannot remove a leftover media file: {e}");
        }
    }
    Ok(())
}

/// The application state from a configuration (opens the store, probes the tools).
pub async fn build_app(cfg: SubtitlesConfig) -> anyhow::Result<App> {
    let data_dir = PathBuf::from(&cfg.data_dir);
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating the data directory {}", data_dir.display()))?;
    let media_dir = data_dir.join("media");
    clean_media_dir(&media_dir)?;
    let store = store::Store::open(&data_dir)
        .await
        .with_context(|| format!("opening {}", data_dir.join("subtitles.db").display()))?;
    let tools = tools::Tools::detect(&cfg.tools.yt_dlp, &cfg.tools.ffmpeg).await;
    let user_agent = concat!("switchyard-subtitles/", env!("CARGO_PKG_VERSION"));
    let connect_timeout = Duration::from_secs(15);
    switchyard_service::tls::use_ring_provider();
    let http = reqwest::Client::builder()
        .user_agent(user_agent)
        .connect_timeout(connect_timeout)
        .build()
        .context("building the HTTP client")?;
    let fetch_policy = Arc::new(fetch_guard::FetchPolicy::from_config(&cfg.fetch));
    let fetch_http = fetch_guard::guarded_client(fetch_policy.clone(), user_agent, connect_timeout)
        .context("building the guarded HTTP client")?;
    let guard_proxy = if fetch_policy.allows_private() || tools.yt_dlp.is_none() {
        None
    } else {
        Some(
            guard_proxy::GuardProxy::start(fetch_policy.clone(), connect_timeout)
                .await
                .context("starting the fetch guard proxy for yt-dlp")?,
        )
    };
    tracing::info!(
        allow_private = cfg.fetch.allow_private,
        allow = ?cfg.fetch.allow,
        "fetch guard: caller-named URLs at internal addresses are {}",
        if cfg.fetch.allow_private { "allowed" } else { "refused unless listed in fetch.allow" }
    );
    let server = cfg.translation.server.api_key.as_ref().map(|k| Provider {
        api_url: cfg.translation.server.api_url.clone(),
        model: cfg.translation.server.model.clone(),
        api_key: Some(Secret::new(k.clone())),
        url_from_caller: false,
    });
    let defaults = ProviderDefaults {
        default_api_url: cfg.translation.default_api_url.clone(),
        default_model: cfg.translation.default_model.clone(),
        server,
    };
    let server_transcription = cfg
        .transcription
        .url
        .as_ref()
        .map(|url| TranscriptionTarget {
            url: url.clone(),
            url_from_caller: false,
            api_key: cfg.transcription.api_key.clone().map(Secret::new),
            model: cfg.transcription.model.clone(),
            format: cfg.transcription.response_format,
            timeout: cfg.transcription.timeout.0,
        });
    tracing::info!(
        server_key_configured = defaults.server.is_some(),
        transcription_backend = server_transcription.is_some(),
        "providers"
    );
    let r = &cfg.translation.retry;
    let retry = RetryPolicy {
        max_attempts: r.max_attempts,
        base_delay: r.base_delay.0,
        max_delay: r.max_delay.0,
    };
    Ok(App {
        http,
        fetch_http,
        fetch_policy,
        guard_proxy,
        tools,
        store,
        defaults,
        server_transcription,
        retry,
        job_slots: tokio::sync::Semaphore::new(cfg.jobs.max_concurrent as usize),
        media_dir,
        cors_origins: cfg.cors_origins.clone(),
        ip_limiter: parking_lot::Mutex::new(WindowLimiter::new(
            cfg.rate_limit.per_ip,
            cfg.rate_limit.window.0,
        )),
        key_limiter: parking_lot::Mutex::new(WindowLimiter::new(
            cfg.rate_limit.per_key,
            cfg.rate_limit.window.0,
        )),
        cfg,
    })
}

async fn serve(cfg: SubtitlesConfig) -> anyhow::Result<()> {
    let listen = cfg.listen.clone();
    let app = Arc::new(build_app(cfg).await?);
    let listener = switchyard_service::bind(&listen).await?;
    let local: SocketAddr = listener.local_addr()?;
    tracing::info!(
        listen = %local,
        data_dir = %app.cfg.data_dir,
        "subtitles listening on http://{local}"
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        switchyard_service::shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let mut graceful_rx = stop_rx.clone();
    let server = axum::serve(
        listener,
        http::router(app.clone()).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        let _ = graceful_rx.wait_for(|stop| *stop).await;
    });
    let mut deadline_rx = stop_rx;
    // open streams and running jobs get a grace period, then the process stops anyway (the
    // jobs are marked failed at the next start)
    tokio::select! {
        r = server => r.context("serving")?,
        _ = async {
            let _ = deadline_rx.wait_for(|stop| *stop).await;
            tokio::time::sleep(Duration::from_secs(10)).await;
        } => tracing::warn!("requests still running after 10 s; stopping"),
    }
    app.store.close().await;
    tracing::info!("subtitles stopped");
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn environment_and_flags_override_the_file() {
        let args = SubtitlesArgs {
            listen: Some("127.0.0.1:0".into()),
            data_dir: Some("/tmp/x".into()),
            ..SubtitlesArgs::default()
        };
        let env = |name: &str| match name {
            "SERVER_API_KEY" => Some("sk-server".to_string()),
            "SERVER_MODEL" => Some("m2".to_string()),
            "CORS_ORIGINS" => Some("https://a.example, https://b.example".to_string()),
            "SERVERLESS_HOST_API_KEY" => Some(" ".to_string()),
            _ => None,
        };
        let cfg = effective_config(&args, &env).unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:0");
        assert_eq!(cfg.data_dir, "/tmp/x");
        assert_eq!(cfg.translation.server.api_key.as_deref(), Some("sk-server"));
        assert_eq!(cfg.translation.server.model, "m2");
        assert_eq!(cfg.transcription.api_key, None, "blank values are ignored");
        assert_eq!(cfg.cors_origins, ["https://a.example", "https://b.example"]);
        let bad = |name: &str| (name == "CORS_ORIGINS").then(|| "nope".to_string());
        assert!(effective_config(&SubtitlesArgs::default(), &bad).is_err());
    }
}

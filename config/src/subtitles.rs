//! Configuration of `switchyard subtitles`, the subtitle transcription and translation service.
//!
//! Same loading rules as the other commands: `${NAME}` expansion ([`crate::env`]), strict YAML
//! (unknown keys are errors naming their path), defaults for every missing key. An empty file (or
//! no file) is the embedded default: listen `0.0.0.0:5001`, data directory `./data/subtitles`
//! (SQLite jobs and translation cache), `yt-dlp` and `ffmpeg` looked up in `PATH`, no server key
//! (tiers 3–4 off), no transcription backend for tiers 2–4, no rate limits, CORS `*`.
//! `config/examples/subtitles.yaml` documents every key.
//!
//! Command-line flags and environment variables (`SWITCHYARD_SUBTITLES_*`, `SERVER_API_KEY`,
//! `SERVER_API_URL`, `SERVER_MODEL`, `SERVERLESS_HOST_API_KEY`, `CORS_ORIGINS`) override the file;
//! that merging lives in the subtitles crate. [`validate_subtitles`] reports semantic problems.

use serde::{Deserialize, Serialize};

use crate::listen::parse_listen;
use crate::model::LoggingConfig;
use crate::units::{Duration, Size};
use crate::validate::Problem;

/// The whole `subtitles` configuration file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubtitlesConfig {
    /// Listen address (`:5001`, `127.0.0.1:5001`, `[::1]:5001`; port 0 = any free port).
    pub listen: String,
    /// Directory of the SQLite database (jobs, translation cache) and temporary media files.
    pub data_dir: String,
    /// Origins allowed by CORS; empty = every origin (`*`). `CORS_ORIGINS` (comma-separated)
    /// overrides it.
    pub cors_origins: Vec<String>,
    pub tools: SubtitlesTools,
    pub transcription: SubtitlesTranscription,
    pub translation: SubtitlesTranslation,
    pub jobs: SubtitlesJobs,
    pub limits: SubtitlesLimits,
    pub rate_limit: SubtitlesRateLimit,
    pub fetch: SubtitlesFetch,
    pub logging: LoggingConfig,
}

impl Default for SubtitlesConfig {
    fn default() -> Self {
        SubtitlesConfig {
            listen: "0.0.0.0:5001".into(),
            data_dir: "./data/subtitles".into(),
            cors_origins: Vec::new(),
            tools: SubtitlesTools::default(),
            transcription: SubtitlesTranscription::default(),
            translation: SubtitlesTranslation::default(),
            jobs: SubtitlesJobs::default(),
            limits: SubtitlesLimits::default(),
            rate_limit: SubtitlesRateLimit::default(),
            fetch: SubtitlesFetch::default(),
            logging: LoggingConfig::default(),
        }
    }
}

/// `tools:` — external programs, detected at start and reported by `/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubtitlesTools {
    /// `yt-dlp` program (name looked up in `PATH`, or a path); empty = never use it.
    pub yt_dlp: String,
    /// `ffmpeg` program (name or path); empty = never use it (media is uploaded as fetched).
    pub ffmpeg: String,
    /// Hosts whose pages are read through yt-dlp instead of being fetched directly (subdomains
    /// included).
    pub video_sites: Vec<String>,
    /// Longest run of one yt-dlp or ffmpeg invocation.
    pub timeout: Duration,
}

impl Default for SubtitlesTools {
    fn default() -> Self {
        SubtitlesTools {
            yt_dlp: "yt-dlp".into(),
            ffmpeg: "ffmpeg".into(),
            video_sites: [
                "youtube.com",
                "youtu.be",
                "vimeo.com",
                "dailymotion.com",
                "twitch.tv",
            ]
            .map(String::from)
            .to_vec(),
            timeout: Duration::from_secs(600),
        }
    }
}

/// Answer format asked of the transcription endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum TranscriptionFormat {
    /// JSON with timed `segments` (and the detected `language`).
    #[default]
    VerboseJson,
    /// SubRip text.
    Srt,
    /// WebVTT text.
    Vtt,
}

/// `transcription:` — the server's OpenAI-compatible `/v1/audio/transcriptions` backend, used by
/// tiers 2–4 (tier 1 transcribes with the caller's provider and key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubtitlesTranscription {
    /// Base URL (`https://api.openai.com/v1`) or the full `…/audio/transcriptions` URL; unset =
    /// no server transcription backend.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Sent as `Authorization: Bearer …`. `SERVERLESS_HOST_API_KEY` overrides it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// `model` form field.
    pub model: String,
    pub response_format: TranscriptionFormat,
    /// Largest audio upload; longer media fails with TRANSCRIPTION_FAILED.
    pub max_upload: Size,
    /// Longest transcription request.
    pub timeout: Duration,
}

impl Default for SubtitlesTranscription {
    fn default() -> Self {
        SubtitlesTranscription {
            url: None,
            api_key: None,
            model: "whisper-1".into(),
            response_format: TranscriptionFormat::VerboseJson,
            max_upload: Size(25 * 1024 * 1024),
            timeout: Duration::from_secs(600),
        }
    }
}

/// `translation:` — the OpenAI-compatible chat-completions provider.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubtitlesTranslation {
    /// Provider for tiers 1–2 when the request names no `api_url`.
    pub default_api_url: String,
    /// Model for tiers 1–2 when the request names none.
    pub default_model: String,
    /// The server's provider for tiers 3–4.
    pub server: SubtitlesServerProvider,
    /// Segments per chat request.
    pub batch_size: u32,
    /// Source lines before and after a batch sent as context (not translated).
    pub context_lines: u32,
    /// Longest single chat request.
    pub timeout: Duration,
    pub retry: SubtitlesRetry,
}

impl Default for SubtitlesTranslation {
    fn default() -> Self {
        SubtitlesTranslation {
            default_api_url: "https://api.openai.com/v1".into(),
            default_model: "gpt-4o-mini".into(),
            server: SubtitlesServerProvider::default(),
            batch_size: 20,
            context_lines: 2,
            timeout: Duration::from_secs(120),
            retry: SubtitlesRetry::default(),
        }
    }
}

/// `translation.server:` — tiers 3–4 are available only when `api_key` is set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubtitlesServerProvider {
    /// `SERVER_API_URL` overrides it.
    pub api_url: String,
    /// `SERVER_MODEL` overrides it.
    pub model: String,
    /// `SERVER_API_KEY` overrides it; unset = tiers 3–4 refused with MISSING_API_KEY.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
}

impl Default for SubtitlesServerProvider {
    fn default() -> Self {
        SubtitlesServerProvider {
            api_url: "https://api.openai.com/v1".into(),
            model: "gpt-4o-mini".into(),
            api_key: None,
        }
    }
}

/// `translation.retry:` — retries of 429, 5xx and connection failures (exponential backoff with
/// jitter, `Retry-After` honoured up to `max_delay`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubtitlesRetry {
    /// Tries in all (1 = no retry).
    pub max_attempts: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl Default for SubtitlesRetry {
    fn default() -> Self {
        SubtitlesRetry {
            max_attempts: 4,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(30),
        }
    }
}

/// `jobs:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubtitlesJobs {
    /// Jobs processed at once; later ones wait as `pending`.
    pub max_concurrent: u32,
}

impl Default for SubtitlesJobs {
    fn default() -> Self {
        SubtitlesJobs { max_concurrent: 2 }
    }
}

/// `limits:`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubtitlesLimits {
    /// Largest request body.
    pub max_body_size: Size,
    /// Largest page or subtitle file fetched.
    pub max_page_size: Size,
    /// Largest media file downloaded for transcription.
    pub max_media_size: Size,
    /// Most segments one job translates.
    pub max_segments: u32,
    /// Longest fetch of a page, subtitle file or media file.
    pub fetch_timeout: Duration,
}

impl Default for SubtitlesLimits {
    fn default() -> Self {
        SubtitlesLimits {
            max_body_size: Size(64 * 1024),
            max_page_size: Size(10 * 1024 * 1024),
            max_media_size: Size(1024 * 1024 * 1024),
            max_segments: 10_000,
            fetch_timeout: Duration::from_secs(120),
        }
    }
}

/// `rate_limit:` — off by default (the spec leaves rate limiting to deployments). A limit of 0 is
/// off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubtitlesRateLimit {
    /// Translation requests per client IP within `window`.
    pub per_ip: u32,
    /// Translation requests per provider key (`api_key` of tiers 1–2) within `window`.
    pub per_key: u32,
    pub window: Duration,
}

impl Default for SubtitlesRateLimit {
    fn default() -> Self {
        SubtitlesRateLimit {
            per_ip: 0,
            per_key: 0,
            window: Duration::from_secs(60),
        }
    }
}

/// `fetch:` — which addresses the service may fetch from when a caller names the URL (the video
/// page, its caption tracks and media, redirects, yt-dlp's traffic, and a tier 1–2 `api_url`).
/// By default loopback, private, link-local, unique-local, carrier-grade NAT, multicast and
/// unspecified addresses are refused, so a caller cannot make the appliance reach its own
/// services or its LAN. Endpoints from this file (`transcription.url`, `translation.*api_url`)
/// are trusted and not checked.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SubtitlesFetch {
    /// `true` = fetch from internal addresses too (only for a service that trusts its callers).
    pub allow_private: bool,
    /// Exceptions to the refusal: host names (exact, case-insensitive: every address they
    /// resolve to is allowed), IP addresses and CIDR networks (`127.0.0.1`, `10.1.0.0/16`,
    /// `fd00::/8`).
    pub allow: Vec<String>,
}

/// An entry of `fetch.allow`: an IP network (an address is its own /32 or /128) or a host name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchAllow {
    Net(ipnet::IpNet),
    Host(String),
}

impl FetchAllow {
    /// Parses one entry; `Err` says why it is neither a network nor a host name.
    pub fn parse(entry: &str) -> Result<FetchAllow, String> {
        let e = entry.trim();
        if let Ok(net) = e.parse::<ipnet::IpNet>() {
            return Ok(FetchAllow::Net(net.trunc()));
        }
        let bare = e.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
            return Ok(FetchAllow::Net(ipnet::IpNet::from(ip)));
        }
        let host = e.trim_end_matches('.').to_ascii_lowercase();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(label_ok)
            && !host.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        {
            return Ok(FetchAllow::Host(host));
        }
        Err(format!(
            "{entry:?}: expected a host name, an IP address or a CIDR network"
        ))
    }
}

crate::load::strict_yaml_entry_points!(SubtitlesConfig);

fn is_http_url(s: &str) -> bool {
    let lower = s.to_ascii_lowercase();
    (lower.starts_with("http://") && s.len() > 7) || (lower.starts_with("https://") && s.len() > 8)
}

/// Semantic problems of a subtitles configuration (empty = valid).
pub fn validate_subtitles(cfg: &SubtitlesConfig) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut problem = |section: &str, field: &str, message: String| {
        out.push(Problem {
            section: section.to_string(),
            field: field.to_string(),
            message,
        });
    };
    if let Err(e) = parse_listen(&cfg.listen) {
        problem("listen", "listen", e.to_string());
    }
    if cfg.data_dir.trim().is_empty() {
        problem("data_dir", "data_dir", "must not be empty".into());
    }
    for (i, o) in cfg.cors_origins.iter().enumerate() {
        if o != "*" && !is_http_url(o) {
            problem(
                "cors_origins",
                &format!("cors_origins[{i}]"),
                format!("{o:?}: expected an origin such as https://app.example.com"),
            );
        }
    }
    if !crate::model::LOG_LEVELS.contains(&cfg.logging.level.as_str()) {
        problem(
            "logging",
            "logging.level",
            format!(
                "unknown level {:?} (one of {})",
                cfg.logging.level,
                crate::model::LOG_LEVELS.join(", ")
            ),
        );
    }
    if cfg.tools.timeout.0.is_zero() {
        problem("tools", "tools.timeout", "must be positive".into());
    }
    let t = &cfg.transcription;
    if let Some(url) = &t.url {
        if !is_http_url(url) {
            problem(
                "transcription",
                "transcription.url",
                format!("{url:?}: expected an http(s) URL"),
            );
        }
    }
    if t.model.trim().is_empty() {
        problem(
            "transcription",
            "transcription.model",
            "must not be empty".into(),
        );
    }
    if t.max_upload.0 == 0 {
        problem(
            "transcription",
            "transcription.max_upload",
            "must be positive".into(),
        );
    }
    if t.timeout.0.is_zero() {
        problem(
            "transcription",
            "transcription.timeout",
            "must be positive".into(),
        );
    }
    let tr = &cfg.translation;
    for (field, url) in [
        ("translation.default_api_url", &tr.default_api_url),
        ("translation.server.api_url", &tr.server.api_url),
    ] {
        if !is_http_url(url) {
            problem(
                "translation",
                field,
                format!("{url:?}: expected an http(s) URL"),
            );
        }
    }
    for (field, model) in [
        ("translation.default_model", &tr.default_model),
        ("translation.server.model", &tr.server.model),
    ] {
        if model.trim().is_empty() {
            problem("translation", field, "must not be empty".into());
        }
    }
    if tr.batch_size == 0 || tr.batch_size > 200 {
        problem(
            "translation",
            "translation.batch_size",
            "must be between 1 and 200".into(),
        );
    }
    if tr.context_lines > 20 {
        problem(
            "translation",
            "translation.context_lines",
            "must be at most 20".into(),
        );
    }
    if tr.timeout.0.is_zero() {
        problem(
            "translation",
            "translation.timeout",
            "must be positive".into(),
        );
    }
    if tr.retry.max_attempts == 0 {
        problem(
            "translation",
            "translation.retry.max_attempts",
            "must be at least 1".into(),
        );
    }
    if tr.retry.max_delay.0 < tr.retry.base_delay.0 {
        problem(
            "translation",
            "translation.retry.max_delay",
            "must be at least translation.retry.base_delay".into(),
        );
    }
    if cfg.jobs.max_concurrent == 0 {
        problem("jobs", "jobs.max_concurrent", "must be at least 1".into());
    }
    let l = &cfg.limits;
    if l.max_body_size.0 < 1024 {
        problem(
            "limits",
            "limits.max_body_size",
            "must be at least 1KiB".into(),
        );
    }
    for (field, v) in [
        ("limits.max_page_size", l.max_page_size.0),
        ("limits.max_media_size", l.max_media_size.0),
        ("limits.max_segments", u64::from(l.max_segments)),
    ] {
        if v == 0 {
            problem("limits", field, "must be positive".into());
        }
    }
    if l.fetch_timeout.0.is_zero() {
        problem("limits", "limits.fetch_timeout", "must be positive".into());
    }
    if cfg.rate_limit.window.0.is_zero() {
        problem("rate_limit", "rate_limit.window", "must be positive".into());
    }
    for (i, entry) in cfg.fetch.allow.iter().enumerate() {
        if let Err(e) = FetchAllow::parse(entry) {
            problem("fetch", &format!("fetch.allow[{i}]"), e);
        }
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_default_and_defaults_are_valid() {
        let cfg = SubtitlesConfig::from_yaml_str("# nothing\n", &|_| None).unwrap();
        assert_eq!(cfg, SubtitlesConfig::default());
        assert!(validate_subtitles(&cfg).is_empty());
        assert_eq!(cfg.listen, "0.0.0.0:5001");
        assert_eq!(cfg.rate_limit.per_ip, 0, "rate limits are off by default");
    }

    #[test]
    fn problems_are_named() {
        let cfg = SubtitlesConfig::from_yaml_str(
            "listen: nope\ncors_origins: [example.com]\ntranscription: {url: 'ftp://x'}\n\
             translation: {batch_size: 0, retry: {max_attempts: 0}}\n",
            &|_| None,
        )
        .unwrap();
        let fields: Vec<String> = validate_subtitles(&cfg)
            .into_iter()
            .map(|p| p.field)
            .collect();
        assert_eq!(
            fields,
            [
                "listen",
                "cors_origins[0]",
                "transcription.url",
                "translation.batch_size",
                "translation.retry.max_attempts"
            ]
        );
        assert!(SubtitlesConfig::from_yaml_str("bogus: 1\n", &|_| None).is_err());
        assert!(SubtitlesConfig::from_yaml_str(
            "transcription: {response_format: text}\n",
            &|_| None
        )
        .is_err());
    }

    #[test]
    fn fetch_guard_is_safe_by_default_and_allow_entries_parse() {
        let cfg = SubtitlesConfig::default();
        assert!(
            !cfg.fetch.allow_private,
            "internal addresses refused by default"
        );
        assert!(cfg.fetch.allow.is_empty());
        let cfg = SubtitlesConfig::from_yaml_str(
            "fetch: {allow_private: false, allow: ['127.0.0.1', '10.1.2.3/16', '[::1]', 'Media.LAN.', 'fd00::/8', 'not a host', '300.1.1.1', '']}\n",
            &|_| None,
        )
        .unwrap();
        let parsed: Vec<Result<FetchAllow, String>> = cfg
            .fetch
            .allow
            .iter()
            .map(|e| FetchAllow::parse(e))
            .collect();
        let net = |s: &str| Ok(FetchAllow::Net(s.parse().unwrap()));
        assert_eq!(parsed[0], net("127.0.0.1/32"));
        assert_eq!(parsed[1], net("10.1.0.0/16"), "host bits dropped");
        assert_eq!(parsed[2], net("::1/128"));
        assert_eq!(parsed[3], Ok(FetchAllow::Host("media.lan".into())));
        assert_eq!(parsed[4], net("fd00::/8"));
        assert!(parsed[5].is_err() && parsed[6].is_err() && parsed[7].is_err());
        let fields: Vec<String> = validate_subtitles(&cfg)
            .into_iter()
            .map(|p| p.field)
            .collect();
        assert_eq!(
            fields,
            ["fetch.allow[5]", "fetch.allow[6]", "fetch.allow[7]"]
        );
        assert!(
            SubtitlesConfig::from_yaml_str("fetch: {allow_privat: true}\n", &|_| None).is_err()
        );
    }
}

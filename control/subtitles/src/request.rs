//! Translate-request validation (runtime-free): the JSON body → a [`Validated`] request with the
//! tier resolved to a provider (endpoint, model, key) and a transcription route, or the spec's
//! error code. Order of checks: body shape, `video_url` (INVALID_URL), `target_language` then
//! `source_language` (INVALID_LANGUAGE), other field types and `tier` (INVALID_REQUEST), keys
//! (MISSING_API_KEY).
//!
//! Tiers (the spec names 1–4 and says 1–2 need the caller's key; the rest is ours, documented in
//! the README):
//!
//! | tier | translation | transcription |
//! |---|---|---|
//! | 1 | caller's `api_key` at `api_url` (default provider) with `model` | the same provider and key |
//! | 2 | caller's `api_key` at `api_url` with `model` | the server's backend |
//! | 3 | the server's key, URL and model | the server's backend |
//! | 4 | as 3; meant for `/api/stream` | the server's backend |
//!
//! Without `tier`: 1 when `api_key` is given, else 3 on `/api/translate` and 4 on `/api/stream`.
//! Tiers 3–4 ignore `api_key`, `api_url` and `model` from the body, so the server's key is
//! never sent to an endpoint the caller chose.

use std::fmt;

use serde_json::Value;

use crate::error::{Error, ErrorCode};
use crate::languages;

/// A secret (provider key) that never prints.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Secret(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Which endpoint received the request (decides the default tier).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Translate,
    Stream,
}

/// An OpenAI-compatible provider to call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    /// Base URL (`…/v1`) or a full endpoint URL.
    pub api_url: String,
    pub model: String,
    pub api_key: Option<Secret>,
    /// `api_url` came from the request (tiers 1–2): fetched through the guard.
    pub url_from_caller: bool,
}

/// Where speech is transcribed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TranscriptionRoute {
    /// Tier 1: the caller's provider and key (`{api_url}/audio/transcriptions`).
    Caller(Provider),
    /// Tiers 2–4: the server's configured backend.
    Server,
}

/// What the server offers, for resolving tiers.
#[derive(Debug, Clone)]
pub struct ProviderDefaults {
    pub default_api_url: String,
    pub default_model: String,
    /// The server's own provider; `None` when no server key is configured.
    pub server: Option<Provider>,
}

/// A request that passed validation.
#[derive(Debug, Clone)]
pub struct Validated {
    /// Canonical video URL (a bare YouTube id becomes its watch URL).
    pub video_url: String,
    pub target_language: &'static str,
    pub source_language: Option<&'static str>,
    pub tier: u8,
    pub force_whisper: bool,
    pub translation: Provider,
    pub transcription: TranscriptionRoute,
    /// The caller's key (tiers 1–2), for per-key rate limits.
    pub caller_key: Option<Secret>,
}

const MAX_URL_LEN: usize = 2048;

fn bad(code: ErrorCode, msg: impl Into<String>) -> Error {
    Error::new(code, msg)
}

/// A YouTube video id (11 characters of `[A-Za-z0-9_-]`).
fn is_youtube_id(s: &str) -> bool {
    s.len() == 11
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `video_url`: an http(s) URL with a host, a bare YouTube id, or a scheme-less YouTube URL.
pub fn canonical_video_url(raw: &str) -> Result<String, Error> {
    let s = raw.trim();
    if s.is_empty() {
        return Err(bad(ErrorCode::InvalidUrl, "video_url is required"));
    }
    if s.len() > MAX_URL_LEN {
        return Err(bad(ErrorCode::InvalidUrl, "video_url is too long"));
    }
    if is_youtube_id(s) {
        return Ok(format!("https://www.youtube.com/watch?v={s}"));
    }
    let lower = s.to_ascii_lowercase();
    let with_scheme = if lower.starts_with("http://") || lower.starts_with("https://") {
        s.to_string()
    } else if [
        "youtube.com/",
        "www.youtube.com/",
        "m.youtube.com/",
        "youtu.be/",
    ]
    .iter()
    .any(|p| lower.starts_with(p))
    {
        format!("https://{s}")
    } else {
        return Err(bad(
            ErrorCode::InvalidUrl,
            "video_url must be an http(s) URL or a YouTube video id",
        ));
    };
    match url::Url::parse(&with_scheme) {
        Ok(u) if u.host_str().is_some_and(|h| !h.is_empty()) => Ok(u.to_string()),
        _ => Err(bad(
            ErrorCode::InvalidUrl,
            "video_url is not a valid http(s) URL",
        )),
    }
}

fn opt_string(body: &serde_json::Map<String, Value>, field: &str) -> Result<Option<String>, Error> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad(
            ErrorCode::InvalidRequest,
            format!("{field} must be a string"),
        )),
    }
}

fn is_http_url(s: &str) -> bool {
    url::Url::parse(s)
        .is_ok_and(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
}

/// Validates a parsed JSON body.
pub fn validate(
    body: &Value,
    endpoint: Endpoint,
    defaults: &ProviderDefaults,
) -> Result<Validated, Error> {
    let Some(obj) = body.as_object() else {
        return Err(bad(
            ErrorCode::InvalidRequest,
            "the body must be a JSON object",
        ));
    };
    let video_url = match obj.get("video_url") {
        Some(Value::String(s)) => canonical_video_url(s)?,
        None | Some(Value::Null) => {
            return Err(bad(ErrorCode::InvalidUrl, "video_url is required"))
        }
        Some(_) => return Err(bad(ErrorCode::InvalidUrl, "video_url must be a string")),
    };
    let supported_list = languages::SUPPORTED.join(", ");
    let target_language = match obj.get("target_language") {
        Some(Value::String(s)) => languages::supported(s).ok_or_else(|| {
            bad(
                ErrorCode::InvalidLanguage,
                format!("unsupported target_language {s:?} (supported: {supported_list})"),
            )
        })?,
        None | Some(Value::Null) => {
            return Err(bad(
                ErrorCode::InvalidLanguage,
                format!("target_language is required (supported: {supported_list})"),
            ))
        }
        Some(_) => {
            return Err(bad(
                ErrorCode::InvalidLanguage,
                "target_language must be a string",
            ))
        }
    };
    let source_language = match obj.get("source_language") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() || s == "auto" => None,
        Some(Value::String(s)) => Some(languages::supported(s).ok_or_else(|| {
            bad(
                ErrorCode::InvalidLanguage,
                format!("unsupported source_language {s:?} (supported: {supported_list})"),
            )
        })?),
        Some(_) => {
            return Err(bad(
                ErrorCode::InvalidLanguage,
                "source_language must be a string",
            ))
        }
    };
    let api_key = opt_string(obj, "api_key")?.filter(|k| !k.trim().is_empty());
    let api_url = opt_string(obj, "api_url")?.filter(|u| !u.trim().is_empty());
    let model = opt_string(obj, "model")?.filter(|m| !m.trim().is_empty());
    let force_whisper = match obj.get("force_whisper") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(bad(
                ErrorCode::InvalidRequest,
                "force_whisper must be a boolean",
            ))
        }
    };
    let tier = match obj.get("tier") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && (1.0..=4.0).contains(&f) => Some(f as u8),
            _ => return Err(bad(ErrorCode::InvalidRequest, "tier must be 1, 2, 3 or 4")),
        },
        Some(_) => {
            return Err(bad(
                ErrorCode::InvalidRequest,
                "tier must be a number from 1 to 4",
            ))
        }
    };
    let tier = tier.unwrap_or(match (&api_key, endpoint) {
        (Some(_), _) => 1,
        (None, Endpoint::Translate) => 3,
        (None, Endpoint::Stream) => 4,
    });
    if let Some(u) = &api_url {
        if tier <= 2 && !is_http_url(u) {
            return Err(bad(
                ErrorCode::InvalidRequest,
                "api_url must be an http(s) URL",
            ));
        }
    }
    let (translation, transcription, caller_key) = if tier <= 2 {
        let Some(key) = api_key else {
            return Err(bad(
                ErrorCode::MissingApiKey,
                format!("tier {tier} needs the provider key in api_key"),
            ));
        };
        let key = Secret::new(key);
        let url_from_caller = api_url.is_some();
        let provider = Provider {
            url_from_caller,
            api_url: api_url.unwrap_or_else(|| defaults.default_api_url.clone()),
            model: model.unwrap_or_else(|| defaults.default_model.clone()),
            api_key: Some(key.clone()),
        };
        let transcription = if tier == 1 {
            TranscriptionRoute::Caller(provider.clone())
        } else {
            TranscriptionRoute::Server
        };
        (provider, transcription, Some(key))
    } else {
        let Some(server) = &defaults.server else {
            return Err(bad(
                ErrorCode::MissingApiKey,
                format!(
                    "tier {tier} uses the server's provider key, and this server has none \
                     (SERVER_API_KEY); send api_key with tier 1 or 2"
                ),
            ));
        };
        (server.clone(), TranscriptionRoute::Server, None)
    };
    Ok(Validated {
        video_url,
        target_language,
        source_language,
        tier,
        force_whisper,
        translation,
        transcription,
        caller_key,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn defaults(server: bool) -> ProviderDefaults {
        ProviderDefaults {
            default_api_url: "https://api.example/v1".into(),
            default_model: "small".into(),
            server: server.then(|| Provider {
                api_url: "https://server.example/v1".into(),
                model: "server-model".into(),
                api_key: Some(Secret::new("server-secret")),
                url_from_caller: false,
            }),
        }
    }

    fn code(body: Value, ep: Endpoint, server: bool) -> &'static str {
        validate(&body, ep, &defaults(server))
            .unwrap_err()
            .code
            .as_str()
    }

    #[test]
    fn video_urls() {
        assert_eq!(
            canonical_video_url("dQw4w9WgXcQ").unwrap(),
            "https://www.youtube.com/watch?v=dQw4w9WgXcQ"
        );
        assert_eq!(
            canonical_video_url("youtu.be/dQw4w9WgXcQ").unwrap(),
            "https://youtu.be/dQw4w9WgXcQ"
        );
        assert_eq!(
            canonical_video_url(" http://127.0.0.1:8080/a b.html ").unwrap(),
            "http://127.0.0.1:8080/a%20b.html"
        );
        for bad in [
            "",
            "ftp://x/y",
            "javascript:alert(1)",
            "http://",
            "not a url",
            "dQw4w9WgXc",
            "file:///etc/passwd",
            "//example.com/x",
        ] {
            assert!(canonical_video_url(bad).is_err(), "{bad:?}");
        }
        assert!(canonical_video_url(&format!("https://x.example/{}", "a".repeat(3000))).is_err());
    }

    #[test]
    fn error_codes_in_order() {
        let t = Endpoint::Translate;
        assert_eq!(code(json!([1]), t, true), "INVALID_REQUEST");
        assert_eq!(
            code(json!({"target_language": "xx"}), t, true),
            "INVALID_URL"
        );
        assert_eq!(
            code(json!({"video_url": 5, "target_language": "es"}), t, true),
            "INVALID_URL"
        );
        assert_eq!(
            code(
                json!({"video_url": "nope", "target_language": "xx"}),
                t,
                true
            ),
            "INVALID_URL"
        );
        assert_eq!(
            code(json!({"video_url": "https://v.example/1"}), t, true),
            "INVALID_LANGUAGE"
        );
        assert_eq!(
            code(
                json!({"video_url": "https://v.example/1", "target_language": "EN"}),
                t,
                true
            ),
            "INVALID_LANGUAGE"
        );
        assert_eq!(
            code(
                json!({"video_url": "https://v.example/1", "target_language": "es", "source_language": "xx"}),
                t,
                true
            ),
            "INVALID_LANGUAGE"
        );
        assert_eq!(
            code(
                json!({"video_url": "https://v.example/1", "target_language": "es", "tier": 5}),
                t,
                true
            ),
            "INVALID_REQUEST"
        );
        assert_eq!(
            code(
                json!({"video_url": "https://v.example/1", "target_language": "es", "tier": 1.5}),
                t,
                true
            ),
            "INVALID_REQUEST"
        );
        assert_eq!(
            code(
                json!({"video_url": "https://v.example/1", "target_language": "es", "tier": "2"}),
                t,
                true
            ),
            "INVALID_REQUEST"
        );
        assert_eq!(
            code(
                json!({"video_url": "https://v.example/1", "target_language": "es", "tier": 1}),
                t,
                true
            ),
            "MISSING_API_KEY"
        );
        assert_eq!(
            code(
                json!({"video_url": "https://v.example/1", "target_language": "es", "tier": 2, "api_key": " "}),
                t,
                true
            ),
            "MISSING_API_KEY"
        );
        assert_eq!(
            code(
                json!({"video_url": "https://v.example/1", "target_language": "es"}),
                t,
                false
            ),
            "MISSING_API_KEY",
            "tier 3 without a server key"
        );
        assert_eq!(
            code(
                json!({"video_url": "https://v.example/1", "target_language": "es", "api_key": "k", "api_url": "nope"}),
                t,
                false
            ),
            "INVALID_REQUEST"
        );
    }

    #[test]
    fn tiers_resolve_providers() {
        let d = defaults(true);
        let v = validate(
            &json!({"video_url": "https://v.example/1", "target_language": "zh-TW", "source_language": "auto", "api_key": "sk-1"}),
            Endpoint::Translate,
            &d,
        )
        .unwrap();
        assert_eq!(v.tier, 1);
        assert_eq!(v.source_language, None);
        assert_eq!(v.translation.api_url, "https://api.example/v1");
        assert_eq!(v.translation.model, "small");
        assert!(!v.translation.url_from_caller, "the default URL is trusted");
        assert!(matches!(v.transcription, TranscriptionRoute::Caller(_)));
        assert!(!format!("{v:?}").contains("sk-1"), "keys never print");

        let v = validate(
            &json!({"video_url": "https://v.example/1", "target_language": "es", "source_language": "en", "api_key": "sk-1", "tier": 2, "api_url": "http://127.0.0.1:9/v1", "model": "m", "force_whisper": true}),
            Endpoint::Translate,
            &d,
        )
        .unwrap();
        assert_eq!(
            (v.tier, v.source_language, v.force_whisper),
            (2, Some("en"), true)
        );
        assert_eq!(v.translation.api_url, "http://127.0.0.1:9/v1");
        assert!(v.translation.url_from_caller, "a caller's URL is guarded");
        assert_eq!(v.transcription, TranscriptionRoute::Server);

        // tiers 3-4 never send the server key where the caller points
        let v = validate(
            &json!({"video_url": "https://v.example/1", "target_language": "es", "api_url": "http://evil.example/v1", "model": "x"}),
            Endpoint::Stream,
            &d,
        )
        .unwrap();
        assert_eq!(v.tier, 4);
        assert_eq!(v.translation.api_url, "https://server.example/v1");
        assert_eq!(v.translation.model, "server-model");
        assert!(!v.translation.url_from_caller);
        assert_eq!(v.caller_key, None);
        let v = validate(
            &json!({"video_url": "https://v.example/1", "target_language": "es", "tier": 3.0}),
            Endpoint::Stream,
            &d,
        )
        .unwrap();
        assert_eq!(v.tier, 3);
    }
}

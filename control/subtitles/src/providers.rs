//! OpenAI-compatible providers over HTTP: chat completions (translation) and audio
//! transcriptions (speech to text), with the [`retry`](crate::retry) policy. Keys go only into
//! the `Authorization` header and are scrubbed from any provider text we repeat.

use std::time::Duration;

use serde_json::{json, Value};
use switchyard_config::subtitles::TranscriptionFormat;

use crate::batching::Message;
use crate::error::{Error, ErrorCode};
use crate::formats::{self, Cue};
use crate::request::Secret;
use crate::retry::{parse_retry_after, Failure, RetryPolicy};

/// `base` when it already ends with `suffix` (a full endpoint URL), else `base/suffix`.
pub fn endpoint(base: &str, suffix: &str) -> String {
    let b = base.trim().trim_end_matches('/');
    if b.ends_with(suffix) {
        b.to_string()
    } else {
        format!("{b}/{suffix}")
    }
}

/// A provider's identity for the translation cache: the SHA-256 (hex) of its normalised
/// chat-completions endpoint URL (scheme and host lower-cased, default port dropped, trailing
/// slash and a spelled-out `/chat/completions` folded). A digest, so credentials or tokens in the
/// URL are never stored; the key itself is not part of it.
pub fn provider_identity(api_url: &str) -> String {
    use sha2::{Digest as _, Sha256};
    let url = endpoint(api_url, "chat/completions");
    let normalised = url::Url::parse(&url).map_or(url, |u| u.to_string());
    Sha256::digest(normalised.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Replaces every occurrence of the key with `***` and cuts to `max` characters.
pub fn scrub(text: &str, key: Option<&Secret>, max: usize) -> String {
    let mut s = text.to_string();
    if let Some(k) = key.map(Secret::expose).filter(|k| k.len() >= 4) {
        s = s.replace(k, "***");
    }
    let s: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.chars().count() > max {
        format!("{}…", s.chars().take(max).collect::<String>())
    } else {
        s
    }
}

/// One HTTP attempt's result: the body of a 2xx answer, or how it failed (with a scrubbed
/// excerpt of the provider's error text).
async fn attempt(
    request: reqwest::RequestBuilder,
    key: Option<&Secret>,
) -> Result<Vec<u8>, (Failure, String)> {
    let resp = match request.send().await {
        Ok(r) => r,
        Err(e) => {
            if let Some(r) = crate::fetch_guard::refused_in(&e) {
                return Err((Failure::Refused, r.to_string()));
            }
            let what = if e.is_timeout() {
                "timed out".to_string()
            } else if e.is_connect() {
                "connection failed".to_string()
            } else {
                "request failed".to_string()
            };
            return Err((Failure::Transport, what));
        }
    };
    let status = resp.status();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_retry_after);
    let body = match resp.bytes().await {
        Ok(b) => b.to_vec(),
        Err(_) => return Err((Failure::Transport, "the answer was cut off".into())),
    };
    if status.is_success() {
        return Ok(body);
    }
    let text = String::from_utf8_lossy(&body);
    let detail = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
        .unwrap_or_else(|| text.into_owned());
    Err((
        Failure::Status {
            status: status.as_u16(),
            retry_after,
        },
        format!("HTTP {}: {}", status.as_u16(), scrub(&detail, key, 200)),
    ))
}

/// Sends with retries; `build` makes a fresh request for every try.
async fn with_retries(
    policy: &RetryPolicy,
    key: Option<&Secret>,
    what: &str,
    mut build: impl FnMut() -> reqwest::RequestBuilder,
) -> Result<Vec<u8>, String> {
    let mut tries = 0u32;
    loop {
        tries += 1;
        match attempt(build(), key).await {
            Ok(body) => return Ok(body),
            Err((failure, detail)) => {
                let jitter = {
                    let mut b = [0u8; 1];
                    getrandom::fill(&mut b).map_or(0.5, |()| f64::from(b[0]) / 255.0)
                };
                match policy.next_delay(tries, &failure, jitter) {
                    Some(delay) => {
                        tracing::info!(what, tries, ?delay, "{detail}; retrying");
                        tokio::time::sleep(delay).await;
                    }
                    None => {
                        tracing::warn!(what, tries, "{detail}; giving up");
                        return Err(format!("{detail} (after {tries} tries)"));
                    }
                }
            }
        }
    }
}

/// Where and how to call chat completions.
#[derive(Debug, Clone)]
pub struct ChatTarget {
    pub api_url: String,
    pub model: String,
    pub api_key: Option<Secret>,
    pub timeout: Duration,
}

/// One chat completion; the assistant's text. Provider failures are API_ERROR (502).
pub async fn chat(
    http: &reqwest::Client,
    policy: &RetryPolicy,
    target: &ChatTarget,
    messages: &[Message],
) -> Result<String, Error> {
    let url = endpoint(&target.api_url, "chat/completions");
    let body = json!({
        "model": target.model,
        "messages": messages,
        "temperature": 0.2,
    });
    let answer = with_retries(policy, target.api_key.as_ref(), "chat", || {
        let mut r = http.post(&url).timeout(target.timeout).json(&body);
        if let Some(k) = &target.api_key {
            r = r.bearer_auth(k.expose());
        }
        r
    })
    .await
    .map_err(|e| Error::new(ErrorCode::ApiError, format!("translation provider: {e}")))?;
    let v: Value = serde_json::from_slice(&answer).map_err(|_| {
        Error::new(
            ErrorCode::ApiError,
            "translation provider: the answer is not JSON",
        )
    })?;
    v["choices"][0]["message"]["content"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| {
            Error::new(
                ErrorCode::ApiError,
                "translation provider: the answer has no choices[0].message.content",
            )
        })
}

/// Where and how to call audio transcriptions.
#[derive(Debug, Clone)]
pub struct TranscriptionTarget {
    pub url: String,
    /// `url` came from the request (tier 1's `api_url`): sent through the guarded client.
    pub url_from_caller: bool,
    pub api_key: Option<Secret>,
    pub model: String,
    pub format: TranscriptionFormat,
    pub timeout: Duration,
}

/// A transcription: timed cues and the language the backend detected.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcript {
    pub cues: Vec<Cue>,
    pub language: Option<String>,
}

fn format_name(f: TranscriptionFormat) -> &'static str {
    match f {
        TranscriptionFormat::VerboseJson => "verbose_json",
        TranscriptionFormat::Srt => "srt",
        TranscriptionFormat::Vtt => "vtt",
    }
}

/// Parses a transcription answer in the asked format.
pub fn parse_transcription(format: TranscriptionFormat, body: &[u8]) -> Result<Transcript, String> {
    let text = String::from_utf8_lossy(body);
    match format {
        TranscriptionFormat::Srt | TranscriptionFormat::Vtt => {
            let cues = formats::parse_any(&text).ok_or("the answer is not SRT or WebVTT")?;
            Ok(Transcript {
                cues,
                language: None,
            })
        }
        TranscriptionFormat::VerboseJson => {
            let v: Value = serde_json::from_str(&text).map_err(|_| "the answer is not JSON")?;
            let language = v["language"].as_str().map(str::to_string);
            let mut cues = Vec::new();
            if let Some(segments) = v["segments"].as_array() {
                for s in segments {
                    let (Some(start), Some(end), Some(t)) =
                        (s["start"].as_f64(), s["end"].as_f64(), s["text"].as_str())
                    else {
                        return Err("a segment lacks start, end or text".into());
                    };
                    let (Some(start_ms), Some(end_ms)) =
                        (formats::seconds_to_ms(start), formats::seconds_to_ms(end))
                    else {
                        return Err("a segment has an invalid time".into());
                    };
                    cues.push(Cue {
                        start_ms,
                        end_ms: end_ms.max(start_ms),
                        text: t.trim().to_string(),
                    });
                }
            } else if let (Some(t), Some(d)) = (v["text"].as_str(), v["duration"].as_f64()) {
                // no segments: one cue over the whole duration
                cues.push(Cue {
                    start_ms: 0,
                    end_ms: formats::seconds_to_ms(d).ok_or("invalid duration")?,
                    text: t.trim().to_string(),
                });
            } else {
                return Err("the answer has no segments".into());
            }
            Ok(Transcript { cues, language })
        }
    }
}

/// Uploads audio (multipart `file`, `model`, `response_format`, optional `language`).
/// Every failure is TRANSCRIPTION_FAILED.
pub async fn transcribe(
    http: &reqwest::Client,
    policy: &RetryPolicy,
    target: &TranscriptionTarget,
    audio: Vec<u8>,
    file_name: &str,
    language: Option<&str>,
) -> Result<Transcript, Error> {
    let url = endpoint(&target.url, "audio/transcriptions");
    let fail = |m: String| {
        Error::new(
            ErrorCode::TranscriptionFailed,
            format!("transcription: {m}"),
        )
    };
    let answer = with_retries(policy, target.api_key.as_ref(), "transcription", || {
        let part = reqwest::multipart::Part::bytes(audio.clone()).file_name(file_name.to_string());
        let mut form = reqwest::multipart::Form::new()
            .part("file", part)
            .text("model", target.model.clone())
            .text("response_format", format_name(target.format));
        if let Some(l) = language {
            form = form.text("language", crate::languages::iso639_1(l).to_string());
        }
        let mut r = http.post(&url).timeout(target.timeout).multipart(form);
        if let Some(k) = &target.api_key {
            r = r.bearer_auth(k.expose());
        }
        r
    })
    .await
    .map_err(fail)?;
    parse_transcription(target.format, &answer).map_err(|m| fail(m.to_string()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            endpoint("https://api.x/v1", "chat/completions"),
            "https://api.x/v1/chat/completions"
        );
        assert_eq!(
            endpoint("https://api.x/v1/", "chat/completions"),
            "https://api.x/v1/chat/completions"
        );
        assert_eq!(
            endpoint("http://h/v1/chat/completions", "chat/completions"),
            "http://h/v1/chat/completions"
        );
    }

    #[test]
    fn provider_identities() {
        let id = provider_identity("https://API.example:443/v1/");
        assert_eq!(id.len(), 64);
        assert_eq!(id, provider_identity("https://api.example/v1"));
        assert_eq!(
            id,
            provider_identity("https://api.example/v1/chat/completions")
        );
        for other in [
            "http://api.example/v1",
            "https://api.example/v2",
            "https://api.example:8443/v1",
            "https://evil.example/v1",
            "https://api.example/v1?tenant=a",
        ] {
            assert_ne!(id, provider_identity(other), "{other}");
        }
        assert!(!provider_identity("https://u:secret@api.example/v1").contains("secret"));
    }

    #[test]
    fn scrubbing() {
        let k = Secret::new("sk-secret-123");
        assert_eq!(
            scrub("Incorrect API key provided:\n sk-secret-123", Some(&k), 100),
            "Incorrect API key provided: ***"
        );
        assert_eq!(scrub("abcdef", None, 3), "abc…");
    }

    #[test]
    fn transcription_answers() {
        let body = br#"{"language":"english","duration":4.0,"segments":[{"start":0.0,"end":1.5,"text":" Hello"},{"start":1.5,"end":3.25,"text":"world "}]}"#;
        let t = parse_transcription(TranscriptionFormat::VerboseJson, body).unwrap();
        assert_eq!(t.language.as_deref(), Some("english"));
        assert_eq!(t.cues.len(), 2);
        assert_eq!(
            (
                t.cues[1].start_ms,
                t.cues[1].end_ms,
                t.cues[1].text.as_str()
            ),
            (1500, 3250, "world")
        );
        let t = parse_transcription(
            TranscriptionFormat::VerboseJson,
            br#"{"text":"hi","duration":2}"#,
        )
        .unwrap();
        assert_eq!(t.cues[0].end_ms, 2000);
        assert!(parse_transcription(TranscriptionFormat::VerboseJson, b"{}").is_err());
        assert!(parse_transcription(TranscriptionFormat::VerboseJson, b"nope").is_err());
        assert!(parse_transcription(
            TranscriptionFormat::VerboseJson,
            br#"{"segments":[{"start":-1,"end":1,"text":"x"}]}"#
        )
        .is_err());
        let t = parse_transcription(
            TranscriptionFormat::Srt,
            b"1\n00:00:01,000 --> 00:00:02,000\nHi\n",
        )
        .unwrap();
        assert_eq!(t.cues.len(), 1);
        assert!(parse_transcription(TranscriptionFormat::Vtt, b"garbage").is_err());
    }
}

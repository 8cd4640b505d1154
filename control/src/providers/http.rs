//! HTTP calls to provider APIs with one error vocabulary: unreachable, too slow, an error
//! status, or a body that is not what the provider publishes. Every call has a deadline.

use std::time::Duration;

/// Longest wait for one provider API call (connect and whole answer).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(8);

/// Largest answer read from a provider API (NordVPN's full list is a few MB).
const MAX_BODY: usize = 64 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    #[error("{url}: unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{url}: no answer within {}s", CALL_TIMEOUT.as_secs())]
    Timeout { url: String },
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("{url}: unexpected answer: {reason}")]
    Garbage { url: String, reason: String },
    #[error("{0}")]
    Refused(String),
}

/// The URL without its query (which may carry tokens) for messages and logs.
pub fn shown(url: &str) -> String {
    url.split('?').next().unwrap_or(url).to_owned()
}

/// An error with its source chain, which names the cause (connection refused, TLS, DNS) that
/// reqwest's own message leaves out.
pub(crate) fn with_sources(e: &dyn std::error::Error) -> String {
    let mut reason = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        reason = format!("{reason}: {s}");
        source = s.source();
    }
    reason
}

fn send_error(url: &str, e: reqwest::Error) -> ApiError {
    // reqwest's message names the full URL, whose query may carry a token: drop it.
    let e = e.without_url();
    if e.is_timeout() {
        ApiError::Timeout { url: shown(url) }
    } else {
        ApiError::Unreachable {
            url: shown(url),
            reason: with_sources(&e),
        }
    }
}

/// Sends `req` and returns the body of a 2xx answer.
pub async fn body(url: &str, req: reqwest::RequestBuilder) -> Result<Vec<u8>, ApiError> {
    let mut resp = req
        .timeout(CALL_TIMEOUT)
        .send()
        .await
        .map_err(|e| send_error(url, e))?;
    let status = resp.status();
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| send_error(url, e))? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(ApiError::Garbage {
                url: shown(url),
                reason: format!("answer larger than {} MiB", MAX_BODY >> 20),
            });
        }
        body.extend_from_slice(&chunk);
    }
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body);
        let text: String = text.chars().take(200).collect();
        return Err(ApiError::Status {
            url: shown(url),
            status: status.as_u16(),
            body: text.trim().to_owned(),
        });
    }
    Ok(body)
}

/// Sends `req` and reads a JSON answer of type `T`.
pub async fn json<T: serde::de::DeserializeOwned>(
    url: &str,
    req: reqwest::RequestBuilder,
) -> Result<T, ApiError> {
    let bytes = body(url, req).await?;
    parse(url, &bytes)
}

/// Reads `bytes` as `T`, naming the URL and the JSON problem when it is not.
pub fn parse<T: serde::de::DeserializeOwned>(url: &str, bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::Garbage {
        url: shown(url),
        reason: format!("not the published JSON shape ({e})"),
    })
}

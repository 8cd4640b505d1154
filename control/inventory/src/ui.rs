//! The web UI: one HTML page, a stylesheet and an ES module, embedded in the binary
//! (`include_str!` of `control/inventory/ui/`), so an appliance without internet serves them.
//! No CDN, no build step. The page talks to the JSON API with `fetch`; the session is the
//! HttpOnly cookie, the CSRF token is held in memory (never in localStorage).

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("../ui/index.html");
const APP_JS: &str = include_str!("../ui/app.js");
const STYLE_CSS: &str = include_str!("../ui/style.css");

/// Only our own scripts, styles and images (thumbnails come from `/api/images`), no framing,
/// no inline script or style (swatch colours are set through the CSSOM, which CSP allows).
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                   img-src 'self' data: blob:; connect-src 'self'; form-action 'self'; \
                   base-uri 'none'; frame-ancestors 'none'";

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Assets change with the binary: revalidate instead of serving a stale UI after an upgrade.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

/// `GET /`: the single page.
pub async fn index() -> Response {
    let mut resp = asset(INDEX_HTML, "text/html; charset=utf-8");
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    resp
}

/// `GET /assets/app.js`.
pub async fn app_js() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8")
}

/// `GET /assets/style.css`.
pub async fn style_css() -> Response {
    asset(STYLE_CSS, "text/css; charset=utf-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every asset the page references is one we serve, and nothing is loaded from elsewhere.
    #[test]
    fn page_references_only_embedded_assets() {
        for href in ["/assets/style.css", "/assets/app.js"] {
            assert!(INDEX_HTML.contains(href), "{href}");
        }
        for text in [INDEX_HTML, APP_JS, STYLE_CSS] {
            assert!(!text.contains("http://") && !text.contains("https://"));
            assert!(!text.contains("localStorage") && !text.contains("sessionStorage"));
        }
        assert!(APP_JS.contains("X-CSRF-Token"));
    }
}

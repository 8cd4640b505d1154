//! Embedded web UIs: static pages compiled into the binary (`include_bytes!`), served by the
//! control plane with a strict Content-Security-Policy, so an appliance without internet access
//! serves them and nothing is fetched at run time. [`EmbeddedUi`] is the reusable piece (the
//! server dashboard now, the client web UI later); [`dashboard`] is the server's UI.

pub mod dashboard;

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

/// Our own scripts, styles and images only; `connect-src 'self'` covers fetch and the
/// same-origin WebSocket (ws:/wss: of the page's own origin); no inline script or style, no
/// framing, no foreign form targets.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
                       img-src 'self' data:; connect-src 'self'; form-action 'self'; \
                       base-uri 'none'; object-src 'none'; frame-ancestors 'none'";

/// One embedded file.
pub struct Asset {
    /// File name under the UI's prefix (`index.html`, `app.js`, ...).
    pub name: &'static str,
    pub content_type: &'static str,
    pub body: &'static [u8],
}

/// A single-page UI: its assets, served under `prefix` (e.g. `/ui`), `index.html` at
/// `prefix/`.
pub struct EmbeddedUi {
    pub prefix: &'static str,
    pub assets: &'static [Asset],
}

impl EmbeddedUi {
    pub fn find(&self, name: &str) -> Option<&'static Asset> {
        self.assets.iter().find(|a| a.name == name)
    }

    /// Routes `prefix` (redirect), `prefix/` (the page), `prefix/{file}` (assets), and `/`
    /// redirecting to the page. Stateless, so it merges into any router.
    pub fn router<S: Clone + Send + Sync + 'static>(&'static self) -> Router<S> {
        let page = format!("{}/", self.prefix);
        let to_page = page.clone();
        let to_page2 = page.clone();
        Router::new()
            .route("/", get(move || async move { Redirect::to(&to_page) }))
            .route(
                self.prefix,
                get(move || async move { Redirect::to(&to_page2) }),
            )
            .route(&page, get(move || async move { self.serve("index.html") }))
            .route(
                &format!("{}/{{file}}", self.prefix),
                get(move |Path(file): Path<String>| async move { self.serve(&file) }),
            )
    }

    /// The asset's response with the security headers every UI response carries.
    pub fn serve(&self, name: &str) -> Response {
        let Some(asset) = self.find(name) else {
            return (StatusCode::NOT_FOUND, "no such file").into_response();
        };
        let mut resp = asset.body.into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        );
        // Assets change with the binary: revalidate instead of serving a stale UI after an upgrade.
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        );
        resp
    }

    /// Size of all assets gzip-compressed (what a browser downloads), for the size budget.
    #[cfg(test)]
    pub fn gzip_size(&self) -> usize {
        use std::io::Write;
        let mut total = 0;
        for a in self.assets {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            enc.write_all(a.body).unwrap_or_default();
            total += enc.finish().map(|v| v.len()).unwrap_or(usize::MAX / 16);
        }
        total
    }
}

//! Embedded web UIs: static pages compiled into the binary (`include_bytes!`), served by the
//! control plane with a strict Content-Security-Policy, so an appliance without internet access
//! serves them and nothing is fetched at run time. [`EmbeddedUi`] is the reusable piece;
//! [`dashboard`] is the server's UI, [`client`] the client's. Both serve the same shared ES
//! module (`control/ui/common/common.js`: DOM helpers, the API call with the CSRF token, the
//! sign-in shell) and stylesheet.

pub mod client;
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

/// The module both UIs import (`./common.js`).
pub const COMMON_SCRIPT: Asset = Asset {
    name: "common.js",
    content_type: "text/javascript; charset=utf-8",
    body: include_bytes!("../../ui/common/common.js"),
};

/// The stylesheet both UIs link.
pub const STYLESHEET: Asset = Asset {
    name: "style.css",
    content_type: "text/css; charset=utf-8",
    body: include_bytes!("../../ui/common/style.css"),
};

/// The `index.html` of the UI in `control/ui/<dir>/`, assembled at compile time: its head (up
/// to its `<h1>`), the sign-in shell `common.js` drives (`control/ui/common/shell.html`, shared),
/// and its panels.
macro_rules! page {
    ($dir:literal) => {
        $crate::web_ui::Asset {
            name: "index.html",
            content_type: "text/html; charset=utf-8",
            body: concat!(
                include_str!(concat!("../../ui/", $dir, "/head.html")),
                include_str!("../../ui/common/shell.html"),
                include_str!(concat!("../../ui/", $dir, "/panels.html")),
            )
            .as_bytes(),
        }
    };
}
pub(crate) use page;

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

/// Checks every embedded UI must pass.
#[cfg(test)]
mod checks {
    use super::EmbeddedUi;

    const ALL: [&EmbeddedUi; 2] = [&super::dashboard::DASHBOARD, &super::client::CLIENT_UI];

    /// The budget of issue 16: at most 300 KiB gzip per UI.
    const MAX_GZIP_BYTES: usize = 300 * 1024;

    #[test]
    fn assets_fit_the_gzip_budget() {
        for ui in ALL {
            let size = ui.gzip_size();
            assert!(size > 0 && size <= MAX_GZIP_BYTES, "{size} bytes gzip");
        }
    }

    #[test]
    fn pages_reference_only_embedded_assets() {
        ALL.into_iter()
            .for_each(page_references_only_embedded_assets);
    }

    /// Every asset the page references is embedded; nothing comes from elsewhere; no inline
    /// script or style (the CSP would block them); no token in web storage; state changes
    /// carry the CSRF header.
    fn page_references_only_embedded_assets(ui: &EmbeddedUi) {
        let text = |n: &str| {
            String::from_utf8_lossy(ui.find(n).map(|a| a.body).unwrap_or_default()).into_owned()
        };
        let html = text("index.html");
        for file in ["style.css", "app.js"] {
            let href = format!("{}/{file}", ui.prefix);
            assert!(html.contains(&href), "{href}");
        }
        assert!(html.contains("type=\"module\""));
        assert!(!html.contains("<style") && !html.contains(" style="));
        let inline_handler = html.split(" on").skip(1).any(|rest| {
            let name: String = rest.chars().take_while(char::is_ascii_lowercase).collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        });
        assert!(!inline_handler, "inline event handler in index.html");
        // the ES modules it imports are embedded too
        for a in ui.assets.iter().filter(|a| a.name.ends_with(".js")) {
            for import in String::from_utf8_lossy(a.body).split("from './").skip(1) {
                let name = import.split('\'').next().unwrap_or_default();
                assert!(ui.find(name).is_some(), "{} imports {name}", a.name);
            }
        }
        for a in ui.assets {
            let t = String::from_utf8_lossy(a.body);
            assert!(
                !t.contains("http://") && !t.contains("https://"),
                "{}",
                a.name
            );
            assert!(
                !t.contains("localStorage") && !t.contains("sessionStorage"),
                "{}",
                a.name
            );
        }
        assert!(text("common.js").contains("X-CSRF-Token"));
    }

    #[test]
    fn unknown_files_are_404() {
        for ui in ALL {
            assert_eq!(ui.serve("nope.js").status(), 404);
            for a in ui.assets {
                let ok = ui.serve(a.name);
                assert_eq!(ok.status(), 200);
                assert_eq!(ok.headers()["content-security-policy"], super::CSP);
            }
        }
    }
}

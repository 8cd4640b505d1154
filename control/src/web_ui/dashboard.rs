//! The server dashboard (`/ui/` on the API listener): one HTML page, a stylesheet and an ES
//! module from `control/ui/dashboard/`. It uses only the public management API: sign-in through
//! `POST /api/v1/login` (HttpOnly cookie), the CSRF token from the `X-CSRF-Token` response
//! header (kept in memory), live events over `/api/v1/ws`.

use super::{Asset, EmbeddedUi};

pub static DASHBOARD: EmbeddedUi = EmbeddedUi {
    prefix: "/ui",
    assets: &[
        Asset {
            name: "index.html",
            content_type: "text/html; charset=utf-8",
            body: include_bytes!("../../ui/dashboard/index.html"),
        },
        Asset {
            name: "app.js",
            content_type: "text/javascript; charset=utf-8",
            body: include_bytes!("../../ui/dashboard/app.js"),
        },
        Asset {
            name: "style.css",
            content_type: "text/css; charset=utf-8",
            body: include_bytes!("../../ui/dashboard/style.css"),
        },
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The budget of issue 16: at most 300 KiB gzip per UI.
    const MAX_GZIP_BYTES: usize = 300 * 1024;

    #[test]
    fn assets_fit_the_gzip_budget() {
        let size = DASHBOARD.gzip_size();
        assert!(size > 0 && size <= MAX_GZIP_BYTES, "{size} bytes gzip");
    }

    /// Every asset the page references is embedded; nothing comes from elsewhere; no inline
    /// script or style (the CSP would block them); no token in web storage.
    #[test]
    fn page_references_only_embedded_assets() {
        let text = |n: &str| {
            String::from_utf8_lossy(DASHBOARD.find(n).map(|a| a.body).unwrap_or_default())
                .into_owned()
        };
        let html = text("index.html");
        for href in ["/ui/style.css", "/ui/app.js"] {
            assert!(html.contains(href), "{href}");
        }
        assert!(html.contains("type=\"module\""));
        assert!(!html.contains("<style") && !html.contains(" style="));
        let inline_handler = html.split(" on").skip(1).any(|rest| {
            let name: String = rest.chars().take_while(char::is_ascii_lowercase).collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        });
        assert!(!inline_handler, "inline event handler in index.html");
        for a in DASHBOARD.assets {
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
        assert!(text("app.js").contains("X-CSRF-Token"));
    }

    #[test]
    fn unknown_files_are_404() {
        assert_eq!(DASHBOARD.serve("nope.js").status(), 404);
        let ok = DASHBOARD.serve("app.js");
        assert_eq!(ok.status(), 200);
        assert_eq!(ok.headers()["content-security-policy"], super::super::CSP);
    }
}

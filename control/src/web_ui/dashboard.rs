//! The server dashboard (`/ui/` on the API listener): one HTML page, a stylesheet and an ES
//! module from `control/ui/dashboard/`. It uses only the public management API: sign-in through
//! `POST /api/v1/login` (HttpOnly cookie), the CSRF token from the `X-CSRF-Token` response
//! header (kept in memory), live events over `/api/v1/ws`.

use super::{Asset, EmbeddedUi, COMMON_SCRIPT, STYLESHEET};

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
        COMMON_SCRIPT,
        STYLESHEET,
    ],
};

#[cfg(test)]
mod tests {
    use super::super::checks;
    use super::DASHBOARD;

    #[test]
    fn assets_fit_the_gzip_budget() {
        checks::fits_the_gzip_budget(&DASHBOARD);
    }

    #[test]
    fn page_references_only_embedded_assets() {
        checks::page_references_only_embedded_assets(&DASHBOARD);
    }

    #[test]
    fn unknown_files_are_404() {
        checks::unknown_files_are_404(&DASHBOARD);
    }
}

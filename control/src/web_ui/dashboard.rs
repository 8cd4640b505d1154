//! The server dashboard (`/ui/` on the API listener): one HTML page, a stylesheet and an ES
//! module from `control/ui/dashboard/`. It uses only the public management API: sign-in through
//! `POST /api/v1/login` (HttpOnly cookie), the CSRF token from the `X-CSRF-Token` response
//! header (kept in memory), live events over `/api/v1/ws`.

use super::{page, Asset, EmbeddedUi, COMMON_SCRIPT, STYLESHEET};

pub static DASHBOARD: EmbeddedUi = EmbeddedUi {
    prefix: "/ui",
    assets: &[
        page!("dashboard"),
        Asset {
            name: "app.js",
            content_type: "text/javascript; charset=utf-8",
            body: include_bytes!("../../ui/dashboard/app.js"),
        },
        COMMON_SCRIPT,
        STYLESHEET,
    ],
};

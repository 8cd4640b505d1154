//! The client web UI (`web_ui.listen`, off by default): one HTML page and an ES module from
//! `control/ui/client/` with the shared module and stylesheet. The listener answers these files
//! under `/ui/` and the client API itself, so the page talks to its own origin only (CSP
//! `connect-src 'self'`, no CORS) and needs no second address: sign-in through the client's
//! `POST /api/v1/login` (HttpOnly cookie), the CSRF token from the `X-CSRF-Token` response
//! header, the live log over `/api/v1/logs/stream`.

use super::{page, Asset, EmbeddedUi, COMMON_SCRIPT, STYLESHEET};
use crate::client::state::ClientState;
use axum::Router;
use std::sync::Arc;

pub static CLIENT_UI: EmbeddedUi = EmbeddedUi {
    prefix: "/ui",
    assets: &[
        page!("client"),
        Asset {
            name: "app.js",
            content_type: "text/javascript; charset=utf-8",
            body: include_bytes!("../../ui/client/app.js"),
        },
        COMMON_SCRIPT,
        STYLESHEET,
    ],
};

/// The web UI listener's routes: the page and the client API (same token, same sessions, the
/// same guard around both).
pub fn router(state: Arc<ClientState>) -> Router {
    let routes = crate::client::api::routes(state.clone()).merge(CLIENT_UI.router());
    crate::client::api::finish(routes, state)
}

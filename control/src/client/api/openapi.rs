//! The OpenAPI 3 document of the client API, generated like the server's.

use crate::api::openapi::BearerAuth;
use utoipa::OpenApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "Switchyard client API", version = "1.0.0",
         description = "Management API of `switchyard client`. With `api.token` set, every endpoint except health, login and logout needs the token: `Authorization: Bearer <token>`, a `token` query parameter, or the session cookie of `POST /api/v1/login`. Every endpoint (and the web UI) answers 403 `HOST_NOT_ALLOWED` when the Host is not an IP literal, `localhost` (or a name under `.localhost`) or listed in `api.allowed_origins`; every state-changing request answers 403 `ORIGIN_NOT_ALLOWED` for an Origin other than the API's own or a listed one, 403 `CROSS_SITE_REQUEST` for `Sec-Fetch-Site: cross-site` from an unlisted Origin, and 415 `UNSUPPORTED_MEDIA_TYPE` for a `text/plain`, form or untyped body."),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    paths(
        super::system::health, super::system::version, super::system::status,
        super::system::connect, super::system::disconnect, super::system::servers,
        super::system::select, super::system::select_by_id, super::system::settings,
        super::system::update_settings, super::system::login, super::system::logout,
        super::config::get, super::config::put, super::config::reload, super::config::validate,
        super::config::defaults, super::config::export, super::config::import,
        super::routes::list, super::routes::create, super::routes::remove, super::routes::test,
        super::debug::entries, super::debug::last, super::debug::clear, super::debug::errors,
        super::cache::stats, super::cache::entries, super::cache::delete_entry, super::cache::clear,
        super::vpn::status, super::vpn::enable, super::vpn::disable, super::vpn::connections,
        super::vpn::split_rules, super::vpn::split_mode, super::vpn::add_app, super::vpn::remove_app,
        super::vpn::add_domain, super::vpn::remove_domain, super::vpn::add_ip, super::vpn::remove_ip,
        super::vpn::dns_cache,
        super::mesh::status, super::mesh::stats, super::mesh::enable, super::mesh::disable,
        super::mesh::peers, super::mesh::connected_peers, super::mesh::peer, super::mesh::routes,
        super::mesh::network,
        openapi_json,
    )
)]
pub struct ClientApiDoc;

/// The client API's document with the diagnostics endpoints merged in.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ClientApiDoc::openapi();
    doc.merge(switchyard_diagnostics::DiagnosticsApiDoc::openapi());
    doc
}

#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "system", responses((status = 200, description = "this document")))]
pub async fn openapi_json() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(document())
}

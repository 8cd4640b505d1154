//! The OpenAPI 3 document of the server API, generated from the handlers' annotations and the
//! `switchyard-api` types.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// Adds the `bearer` security scheme (shared with the client API's document).
pub(crate) struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Switchyard server API", version = "1.0.0",
         description = "Management API of `switchyard server`. With `api.token` set, every endpoint except health, the PAC file, login and logout needs the token: `Authorization: Bearer <token>`, a `token` query parameter, or the session cookie of `POST /api/v1/login`. Every endpoint (and the web UI) answers 403 `HOST_NOT_ALLOWED` when the Host is not an IP literal, `localhost` (or a name under `.localhost`) or listed in `api.allowed_origins`; every state-changing request answers 403 `ORIGIN_NOT_ALLOWED` for an Origin other than the API's own or a listed one, 403 `CROSS_SITE_REQUEST` for `Sec-Fetch-Site: cross-site` from an unlisted Origin, and 415 `UNSUPPORTED_MEDIA_TYPE` for a `text/plain`, form or untyped body."),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
    paths(
        super::system::health, super::system::version, super::system::status, super::system::stats,
        super::system::quic,
        super::backends::list, super::backends::create, super::backends::get_one, super::backends::delete,
        super::backends::stats, super::backends::test,
        super::routes::list, super::routes::create, super::routes::delete, super::routes::test,
        super::requests::list, super::requests::stats, super::requests::clear,
        super::connections::list, super::connections::clients,
        super::config::get_sanitized, super::config::get_full, super::config::meta, super::config::save,
        super::config::validate, super::config::reload, super::config::auth_plugins,
        super::config::get_yaml, super::config::save_yaml, super::config::validate_yaml,
        crate::pac::serve, crate::pac::serve_wpad, openapi_json,
        super::auth::login, super::auth::logout, super::ws::upgrade,
        super::cache::stats, super::cache::entries, super::cache::clear, super::cache::entry,
        super::cache::delete_entry, super::cache::delete_domain, super::cache::rules,
        super::cache::create_rule, super::cache::update_rule, super::cache::delete_rule,
        super::cache::presets_list, super::cache::toggle_preset, super::cache::enable_preset,
        super::cache::disable_preset,
        super::providers::refresh_all, super::providers::refresh_one,
        super::mesh::list_networks, super::mesh::create_network, super::mesh::get_network,
        super::mesh::delete_network, super::mesh::register, super::mesh::list_peers,
        super::mesh::get_peer, super::mesh::update_peer, super::mesh::delete_peer,
        super::mesh::heartbeat, super::mesh::events, super::mesh::create_enrollment_key,
        super::mesh::list_enrollment_keys, super::mesh::revoke_enrollment_key,
    )
)]
pub struct ServerApiDoc;

#[utoipa::path(get, path = "/api/v1/openapi.json", tag = "system", responses((status = 200, description = "this document")))]
pub async fn openapi_json() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(ServerApiDoc::openapi())
}

//! `GET /openapi.json`: the OpenAPI description of every endpoint and JSON
//! shape, generated from the handlers' `#[utoipa::path]` annotations and the
//! types' `ToSchema` derives, so it follows the code. Served without auth;
//! it holds no secrets.

use actix_web::HttpResponse;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{admin, buyers, health, intake, leads, report, spool, status, status_page};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "leadrouter",
        description = "Store-first lead intake and ping/post routing. Admin endpoints need `Authorization: Bearer <server.admin_token>`."
    ),
    paths(
        intake::submit,
        intake::submit_batch,
        leads::status,
        leads::show,
        leads::list,
        leads::review,
        spool::refused,
        spool::import,
        admin::fix,
        admin::reroute,
        admin::resolve,
        admin::return_lead,
        admin::retry,
        admin::alerts,
        report::report,
        admin::reload,
        buyers::list,
        buyers::set_circuit,
        status::status,
        status::metrics,
        health::healthz,
        health::readyz,
        status_page::status_page,
        status_page::lead_page,
        status_page::asset,
        openapi_json,
    ),
    modifiers(&AdminToken)
)]
pub struct ApiDoc;

/// The `admin` bearer scheme the admin endpoints name.
struct AdminToken;

impl Modify for AdminToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// This description.
#[utoipa::path(get, path = "/openapi.json", tag = "status",
    responses((status = 200, description = "OpenAPI 3.1", body = Object)))]
pub async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok().json(ApiDoc::openapi())
}

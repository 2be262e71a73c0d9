//! `GET /openapi.json`: the OpenAPI description of every endpoint and JSON
//! shape, generated from the handlers' `#[utoipa::path]` annotations and the
//! types' `ToSchema` derives, so it follows the code. Served without auth;
//! it holds no secrets.

use actix_web::HttpResponse;
use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use super::{admin, buyers, health, intake, leads, report, spool, status, status_page};
use crate::domain::Contract;

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

/// `POST /v1/leads/batch`'s body. (The handler reads each lead as raw JSON
/// so its bytes are kept exactly; this type only describes the shape.)
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct BatchRequest {
    #[schema(value_type = Vec<Object>)]
    leads: Vec<Value>,
}

/// One lead's answer in a batch: its contract, or an error object for a lead
/// over `server.max_body_bytes`. (Describes the JSON the handler builds.)
#[derive(serde::Serialize, ToSchema)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum BatchResult {
    Contract(Contract),
    Error(super::error::ErrorBody),
}

/// This description.
#[utoipa::path(get, path = "/openapi.json", tag = "status",
    responses((status = 200, description = "OpenAPI 3.1", body = Object)))]
pub async fn openapi_json() -> HttpResponse {
    HttpResponse::Ok().json(ApiDoc::openapi())
}

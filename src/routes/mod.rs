//! The HTTP API (SPEC section 5), one module per resource, the state every
//! handler shares (`state`), and the table of routes.

mod admin;
mod auth;
mod buyers;
mod cors;
mod error;
mod figures;
mod form_page;
mod health;
mod intake;
mod leads;
mod openapi;
mod report;
mod spool;
mod state;
mod status;
mod status_page;
mod status_render;

use actix_web::{web, HttpResponse};

pub use auth::{secrets_equal, Admin};
pub use error::ApiError;
pub use figures::FiguresCache;
pub use form_page::escape as escape_html;
pub use openapi::ApiDoc;
pub use state::AppState;

use crate::config::SharedSettings;

/// The form helper, served from the binary (SPEC section 5).
const FORM_JS: &str = include_str!("../form.js");

/// Registers every route; used by the server and by nothing else.
pub fn configure(config: &mut web::ServiceConfig, settings: &SharedSettings) {
    config
        .app_data(web::QueryConfig::default().error_handler(|error, _| {
            ApiError::BadRequest(format!("bad query string: {error}")).into()
        }))
        .app_data(web::JsonConfig::default().error_handler(|error, _| {
            ApiError::BadRequest(format!("bad JSON body: {error}")).into()
        }))
        .route("/healthz", web::get().to(health::healthz))
        .route("/readyz", web::get().to(health::readyz))
        .route("/form.js", web::get().to(form_js))
        .service(
            web::resource("/v1/leads")
                .wrap(cors::for_forms(settings.clone()))
                .route(web::post().to(intake::submit))
                .route(web::get().to(leads::list)),
        )
        .route("/v1/leads/batch", web::post().to(intake::submit_batch))
        .route("/v1/leads/{id}", web::get().to(leads::show))
        .route("/v1/leads/{id}", web::patch().to(admin::fix))
        .route("/v1/leads/{id}/reroute", web::post().to(admin::reroute))
        .route("/v1/leads/{id}/resolve", web::post().to(admin::resolve))
        .route("/v1/leads/{id}/return", web::post().to(admin::return_lead))
        .route("/v1/attempts/{id}/retry", web::post().to(admin::retry))
        .route("/v1/alerts", web::get().to(admin::alerts))
        .route("/v1/report", web::get().to(report::report))
        .route("/v1/admin/reload", web::post().to(admin::reload))
        .service(
            web::resource("/v1/leads/{id}/status")
                .wrap(cors::for_forms(settings.clone()))
                .route(web::get().to(leads::status)),
        )
        .route("/v1/review", web::get().to(leads::review))
        .route("/v1/spool/refused", web::get().to(spool::refused))
        .route(
            "/v1/spool/refused/{id}/import",
            web::post().to(spool::import),
        )
        .route("/v1/status", web::get().to(status::status))
        .route("/metrics", web::get().to(status::metrics))
        .route("/openapi.json", web::get().to(openapi::openapi_json))
        .route("/status", web::get().to(status_page::status_page))
        .route("/status/leads/{id}", web::get().to(status_page::lead_page))
        .route("/status/assets/{name}", web::get().to(status_page::asset))
        .route("/v1/buyers", web::get().to(buyers::list))
        .route(
            "/v1/buyers/{id}/circuit",
            web::post().to(buyers::set_circuit),
        )
        .default_service(web::to(not_found));
}

async fn form_js() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/javascript; charset=utf-8")
        .insert_header(("Cache-Control", "public, max-age=300"))
        .body(FORM_JS)
}

async fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(serde_json::json!({
        "error": "not_found",
        "message": "no such endpoint"
    }))
}

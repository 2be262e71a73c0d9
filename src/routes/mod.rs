//! The HTTP API (SPEC section 5), one module per resource, and the state
//! every handler shares.

mod auth;
mod buyers;
mod error;
mod form_page;
mod health;
mod intake;
mod leads;
mod status;

use std::sync::Arc;

use actix_web::{web, HttpResponse};

pub use auth::{secrets_equal, Admin};
pub use error::ApiError;

use crate::actors::Tree;
use crate::config::Settings;
use crate::rate_limit::RateLimiter;
use crate::store::Store;

/// What handlers share: settings, the store, the actors, the rate limiter.
pub struct AppState {
    pub settings: Arc<Settings>,
    pub store: Store,
    pub tree: Tree,
    pub limiter: RateLimiter,
}

impl AppState {
    /// True while some required notify channel must confirm before `accepted`.
    pub fn awaiting_required_notify(&self) -> bool {
        self.settings.notify.iter().any(|channel| channel.required)
    }
}

/// Registers every route; used by the server and by nothing else.
pub fn configure(config: &mut web::ServiceConfig) {
    config
        .app_data(web::QueryConfig::default().error_handler(|error, _| {
            ApiError::BadRequest(format!("bad query string: {error}")).into()
        }))
        .app_data(web::JsonConfig::default().error_handler(|error, _| {
            ApiError::BadRequest(format!("bad JSON body: {error}")).into()
        }))
        .route("/healthz", web::get().to(health::healthz))
        .route("/readyz", web::get().to(health::readyz))
        .route("/v1/leads", web::post().to(intake::submit))
        .route("/v1/leads", web::get().to(leads::list))
        .route("/v1/leads/batch", web::post().to(intake::submit_batch))
        .route("/v1/leads/{id}", web::get().to(leads::show))
        .route("/v1/leads/{id}/status", web::get().to(leads::status))
        .route("/v1/review", web::get().to(leads::review))
        .route("/v1/status", web::get().to(status::status))
        .route("/v1/buyers", web::get().to(buyers::list))
        .route(
            "/v1/buyers/{id}/circuit",
            web::post().to(buyers::set_circuit),
        )
        .default_service(web::to(not_found));
}

async fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(serde_json::json!({
        "error": "not_found",
        "message": "no such endpoint"
    }))
}

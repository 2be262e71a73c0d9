//! `/healthz` (the process answers) and `/readyz` (the database answers too).

use actix_web::{web, HttpResponse};
use serde_json::json;

use super::AppState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    if state.store.is_reachable().await {
        HttpResponse::Ok().json(json!({"status": "ready", "database": "ok"}))
    } else {
        HttpResponse::ServiceUnavailable().json(json!({
            "error": "not_ready",
            "message": "the database does not answer",
            "database": "unreachable"
        }))
    }
}

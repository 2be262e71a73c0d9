//! `/healthz` (the process answers) and `/readyz` (ready for leads: the
//! database answers, the spool is usable, and we are not shutting down).

use std::sync::atomic::Ordering;

use actix_web::{web, HttpResponse};
use serde_json::json;

use super::AppState;

pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let database = if state.store.is_reachable().await {
        "ok"
    } else {
        "unreachable"
    };
    let spool = state.tree.spool.problem();
    let shutting_down = state.tree.draining.load(Ordering::Relaxed);
    let mut problems = Vec::new();
    if shutting_down {
        problems.push("shutting down".to_string());
    }
    if database != "ok" {
        problems.push("the database does not answer".to_string());
    }
    if let Some(problem) = &spool {
        problems.push(problem.clone());
    }
    let report = json!({
        "database": database,
        "spool": spool.as_deref().unwrap_or("ok"),
        "spool_pending": state.tree.spool.pending(),
        "shutting_down": shutting_down,
    });
    if problems.is_empty() {
        let mut body = report;
        body["status"] = json!("ready");
        return HttpResponse::Ok().json(body);
    }
    let mut body = report;
    body["error"] = json!("not_ready");
    body["message"] = json!(problems.join("; "));
    HttpResponse::ServiceUnavailable().json(body)
}

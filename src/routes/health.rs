//! `/healthz` (the process answers) and `/readyz` (ready for leads: the
//! database answers, the spool is usable, and we are not shutting down).

use std::sync::atomic::Ordering;

use actix_web::{web, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use super::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    status: String,
}

/// The process answers.
#[utoipa::path(get, path = "/healthz", tag = "status",
    responses((status = 200, description = "Alive", body = Health)))]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health {
        status: "ok".into(),
    })
}

/// Whether the service can take leads now.
#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    /// `ready` when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<String>,
    /// `not_ready` when it is not.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// Every problem, when not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// `ok` or `unreachable`.
    database: String,
    /// `ok`, or why the spool cannot be used.
    spool: String,
    spool_pending: u64,
    shutting_down: bool,
}

#[utoipa::path(get, path = "/readyz", tag = "status",
    responses(
        (status = 200, description = "Ready for leads", body = Readiness),
        (status = 503, description = "Not ready: the database, the spool, or shutting down", body = Readiness),
    ))]
pub async fn readyz(state: web::Data<AppState>) -> HttpResponse {
    let database_ok = state.store.is_reachable().await;
    let spool = state.tree.spool.problem();
    let shutting_down = state.tree.draining.load(Ordering::Relaxed);
    let mut problems = Vec::new();
    if shutting_down {
        problems.push("shutting down".to_string());
    }
    if !database_ok {
        problems.push("the database does not answer".to_string());
    }
    if let Some(problem) = &spool {
        problems.push(problem.clone());
    }
    let ready = problems.is_empty();
    let report = Readiness {
        status: ready.then(|| "ready".into()),
        error: (!ready).then(|| "not_ready".into()),
        message: (!ready).then(|| problems.join("; ")),
        database: if database_ok { "ok" } else { "unreachable" }.into(),
        spool: spool.unwrap_or_else(|| "ok".into()),
        spool_pending: state.tree.spool.pending() as u64,
        shutting_down,
    };
    if ready {
        HttpResponse::Ok().json(report)
    } else {
        HttpResponse::ServiceUnavailable().json(report)
    }
}

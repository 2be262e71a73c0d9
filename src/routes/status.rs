//! `GET /v1/status`: every buyer (as `/v1/buyers`), lead counts by state and
//! the spool backlog; and `GET /metrics`. Public unless
//! `server.status_public = false`; they hold no personal data. While the
//! database is down they still answer, with the buyers' live state and the
//! spool (and `leads: null`).

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Map, Value};

use super::buyers::live_buyer_views;
use super::{Admin, ApiError, AppState};
use crate::domain::LeadState;
use crate::metrics::Snapshot;

pub async fn status(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    if !state.settings().server.status_public {
        Admin::check(&request)?;
    }
    let (buyers, database) = live_buyer_views(&state).await;
    let mut review = Value::Null;
    let leads = match state.store.lead_counts().await {
        Ok(mut counts) => {
            let waiting =
                |lead_state: LeadState| counts.get(lead_state.as_str()).copied().unwrap_or(0);
            review = json!({"pending": waiting(LeadState::Invalid) + waiting(LeadState::Unknown)});
            let by_state: Map<String, Value> = LeadState::ALL
                .into_iter()
                .map(|lead_state| {
                    let count = counts.remove(lead_state.as_str()).unwrap_or_default();
                    (lead_state.as_str().to_string(), json!(count))
                })
                .collect();
            Value::Object(by_state)
        }
        Err(error) => {
            tracing::warn!(%error, "status without lead counts: database unreachable");
            Value::Null
        }
    };
    Ok(HttpResponse::Ok().json(json!({
        "buyers": buyers,
        "leads": leads,
        "review": review,
        "spool": {"pending": state.tree.spool.pending()},
        "database": database,
    })))
}

/// `GET /metrics`: OpenMetrics text for Prometheus.
pub async fn metrics(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    check_access(&request, &state)?;
    let circuits = state
        .settings()
        .buyers
        .iter()
        .filter_map(|buyer| state.tree.board.get(&buyer.id))
        .map(|status| (status.id, status.circuit))
        .collect();
    let leads = state
        .store
        .lead_counts()
        .await
        .ok()
        .map(|counts| counts.into_iter().collect());
    let text = state.metrics.render(Snapshot {
        circuits,
        leads,
        spool_pending: state.tree.spool.pending(),
    });
    Ok(HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(text))
}

/// The status data is public unless `server.status_public = false`.
fn check_access(request: &HttpRequest, state: &AppState) -> Result<(), ApiError> {
    if !state.settings().server.status_public {
        Admin::check(request)?;
    }
    Ok(())
}

//! `GET /v1/status`: every buyer (as `/v1/buyers`), lead counts by state and
//! the spool backlog. Public unless `server.status_public = false`; it holds
//! no personal data. While the database is down it still answers, with the
//! buyers' live state and the spool, and `leads: null`.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Map, Value};

use super::buyers::live_buyer_views;
use super::{Admin, ApiError, AppState};
use crate::domain::LeadState;

pub async fn status(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    if !state.settings().server.status_public {
        Admin::check(&request)?;
    }
    let (buyers, database) = live_buyer_views(&state).await;
    let leads = match state.store.lead_counts().await {
        Ok(mut counts) => {
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
        "spool": {"pending": state.tree.spool.pending()},
        "database": database,
    })))
}

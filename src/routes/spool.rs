//! Spooled leads the database refused (`spool_dir/refused/`), for
//! operators: `GET /v1/spool/refused` lists them, `POST
//! /v1/spool/refused/{id}/import` stores one once the cause is fixed
//! (intake log first, then the lead, as intake writes it), routes it and
//! hands it to the notify channels. Until then its id answers
//! `/v1/leads/{id}/status` as `pending`.

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::auth::Admin;
use super::error::{ApiError, ErrorBody};
use super::state::AppState;
use crate::actors::router::RouteLeads;
use crate::domain::{Contract, LeadId, LeadState};
use crate::store::{contract_of_row, is_unreachable, PersistOutcome};

/// One refused lead, without its personal data.
#[derive(Debug, Serialize, ToSchema)]
pub struct RefusedView {
    id: String,
    source: String,
    received_at: DateTime<Utc>,
    /// What the database said.
    reason: String,
    refused_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RefusedList {
    refused: Vec<RefusedView>,
}

/// Spooled leads the database refused, oldest first.
#[utoipa::path(get, path = "/v1/spool/refused", tag = "leads", security(("admin" = [])),
    responses(
        (status = 200, description = "Refused spooled leads", body = RefusedList),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
    ))]
pub async fn refused(_: Admin, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let refused = state
        .tree
        .spool
        .refused()
        .map_err(|error| ApiError::Unavailable(format!("the spool cannot be read: {error}")))?;
    Ok(HttpResponse::Ok().json(RefusedList {
        refused: refused
            .into_iter()
            .map(|refused| RefusedView {
                id: refused.spooled.lead.id.clone(),
                source: refused.spooled.lead.source_id.clone(),
                received_at: refused.spooled.lead.received_at,
                reason: refused.reason,
                refused_at: refused.refused_at,
            })
            .collect(),
    }))
}

/// Stores a refused spooled lead again; answers its contract.
#[utoipa::path(post, path = "/v1/spool/refused/{id}/import", tag = "leads", security(("admin" = [])),
    params(("id" = String, Path, description = "The refused lead's submission_id")),
    responses(
        (status = 200, description = "Stored: the lead's contract", body = Contract),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "No such refused lead", body = ErrorBody),
        (status = 422, description = "The database still refuses it", body = ErrorBody),
    ))]
pub async fn import(
    _: Admin,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let spool = &state.tree.spool;
    let refused = spool
        .refused_lead(&path)
        .map_err(|error| ApiError::Unavailable(format!("the spool cannot be read: {error}")))?
        .ok_or_else(|| ApiError::NotFound(format!("refused lead {:?}", path.as_str())))?;
    let lead = std::slice::from_ref(&refused.spooled.lead);
    let settings = state.settings();
    let stored = async {
        state.store.log_arrivals(lead).await?;
        state
            .store
            .persist_leads(lead, &settings.duplicate_rule())
            .await
    }
    .await
    .map_err(|error| {
        if is_unreachable(&error) {
            ApiError::Database(error)
        } else {
            ApiError::Refused(format!("the database still refuses it: {error}"))
        }
    })?;
    let Some(outcome) = stored.into_iter().next() else {
        return Err(ApiError::Unavailable("nothing was stored".into()));
    };
    let row = match &outcome {
        PersistOutcome::Inserted(row) | PersistOutcome::Existing(row) => row.clone(),
    };
    if let PersistOutcome::Existing(existing) = &outcome {
        if existing.id != refused.spooled.lead.id {
            state
                .store
                .record_aliases(&[(refused.spooled.lead.id.clone(), existing.id.clone())])
                .await?;
        }
    }
    spool
        .remove_refused(&refused.spooled.lead.id)
        .map_err(|error| {
            ApiError::Unavailable(format!("stored, but the spool file stays: {error}"))
        })?;
    if matches!(outcome, PersistOutcome::Inserted(_)) && row.state == LeadState::Received.as_str() {
        state.tree.router.do_send(RouteLeads {
            lead_ids: vec![LeadId::from(row.id.as_str())],
        });
    }
    state.tree.couriers.deliver(std::slice::from_ref(&row.id));
    Ok(HttpResponse::Ok().json(contract_of_row(&row)))
}

//! The admin API's changes (SPEC section 5): fix an invalid lead, reroute,
//! resolve an `unknown` lead, retry an attempt from its snapshot, record a
//! return, list alerts, reload the configuration. Each answers the lead (or
//! the new attempt) as it is afterwards; a state that does not allow the
//! change is 409.

use std::sync::Arc;

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::leads::{find, full_view, AttemptView};
use super::{Admin, ApiError, AppState};
use crate::actors::buyer::{OfferLead, Offered, Retry};
use crate::actors::router::RouteLeads;
use crate::buyer::request::{LeadOffer, PingResult};
use crate::buyer::{CallKind, CallOutcome};
use crate::config::buyer_from_snapshot;
use crate::domain::{check_fields, LeadState};
use crate::reload::{reload as reload_settings, ReloadError};
use crate::store::Settlement;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldsFix {
    /// Normalised fields to set; `null` removes one.
    fields: Map<String, Value>,
}

/// `PATCH /v1/leads/{id}`: merges the fields into an invalid lead's
/// normalised fields and validates again; valid, it is routed. 422 while
/// still invalid. The raw payload never changes.
pub async fn fix(
    _: Admin,
    path: web::Path<String>,
    body: web::Json<FieldsFix>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let row = find(&state, &path).await?;
    let mut merged = row.fields.as_object().cloned().unwrap_or_default();
    for (name, value) in body.into_inner().fields {
        match value {
            Value::Null => merged.remove(&name),
            value => merged.insert(name, value),
        };
    }
    let required = state
        .settings()
        .sources
        .iter()
        .find(|source| source.id == row.source_id)
        .map(|source| source.required.clone())
        .unwrap_or_default();
    let (fields, errors) = check_fields(merged.iter().map(|(k, v)| (k.as_str(), v)), &required);
    let fixed = state
        .store
        .fix_invalid_lead(&row.id, fields, &errors)
        .await?;
    let valid = errors.is_empty();
    if valid {
        route(&state, &fixed.id);
    }
    let view = full_view(&state, fixed).await?;
    Ok(if valid {
        HttpResponse::Ok().json(view)
    } else {
        HttpResponse::UnprocessableEntity().json(view)
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerouteRequest {
    #[serde(default)]
    include_tried: bool,
}

/// `POST /v1/leads/{id}/reroute`: an `unsold` or `unknown` lead is routed
/// again, skipping buyers it was posted to unless `include_tried`.
pub async fn reroute(
    _: Admin,
    path: web::Path<String>,
    body: Option<web::Json<RerouteRequest>>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let include_tried = body.is_some_and(|body| body.include_tried);
    let row = state.store.reroute_lead(&path, include_tried).await?;
    route(&state, &row.id);
    Ok(HttpResponse::Ok().json(full_view(&state, row).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveRequest {
    buyer_id: String,
    sold: bool,
    price: Option<f64>,
}

/// `POST /v1/leads/{id}/resolve`: settles an `unknown` lead by hand.
pub async fn resolve(
    _: Admin,
    path: web::Path<String>,
    body: web::Json<ResolveRequest>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    if body
        .price
        .is_some_and(|price| !price.is_finite() || price < 0.0)
    {
        return Err(ApiError::BadRequest("price must be a number ≥ 0".into()));
    }
    let settlement = Settlement {
        buyer_id: &body.buyer_id,
        sold: body.sold,
        price: body.price,
    };
    let row = state.store.resolve_unknown_lead(&path, settlement).await?;
    Ok(HttpResponse::Ok().json(full_view(&state, row).await?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReturnRequest {
    reason: String,
    #[serde(default)]
    reroute: bool,
}

/// `POST /v1/leads/{id}/return`: the buyer returned a sold lead; with
/// `reroute` it is offered to the other buyers.
pub async fn return_lead(
    _: Admin,
    path: web::Path<String>,
    body: web::Json<ReturnRequest>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    if body.reason.trim().is_empty() {
        return Err(ApiError::BadRequest("a return needs a reason".into()));
    }
    let row = state
        .store
        .return_lead(&path, body.reason.trim(), body.reroute)
        .await?;
    if body.reroute {
        route(&state, &row.id);
    }
    Ok(HttpResponse::Ok().json(full_view(&state, row).await?))
}

/// `POST /v1/attempts/{id}/retry`: replays a ping or post with the buyer
/// settings its snapshot froze (whatever the configuration says now), as a
/// new attempt with `retry_of`. An accepted post makes the sale, still at
/// most one. Answers the new attempt.
pub async fn retry(
    _: Admin,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let original = state
        .store
        .find_attempt(&path)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("attempt {:?}", path.as_str())))?;
    let kind = match original.kind.as_str() {
        "ping" => CallKind::Ping,
        "post" => CallKind::Post,
        other => {
            return Err(ApiError::Conflict(format!(
                "a {other} attempt cannot be retried, only pings and posts"
            )))
        }
    };
    if original.outcome == "in_flight" {
        return Err(ApiError::Conflict("the attempt is still in flight".into()));
    }
    let lead = find(&state, &original.lead_id).await?;
    match LeadState::parse(&lead.state) {
        Some(LeadState::Routing) => {
            return Err(ApiError::Conflict(
                "the lead is being routed; retry once it is settled".into(),
            ))
        }
        Some(LeadState::Sold) if kind == CallKind::Post => {
            return Err(ApiError::Conflict(
                "the lead is already sold; a retried post could sell it twice".into(),
            ))
        }
        _ => {}
    }
    let settings = buyer_from_snapshot(&original.snapshot).map_err(|problems| {
        let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
        ApiError::Conflict(format!(
            "the snapshot cannot be replayed: {}",
            listed.join("; ")
        ))
    })?;
    let buyer = state.tree.buyers.get(&original.buyer_id).ok_or_else(|| {
        ApiError::Conflict(format!(
            "buyer {:?} is no longer configured",
            original.buyer_id
        ))
    })?;
    let ping = match kind {
        CallKind::Post => accepted_ping(&state, &original.lead_id, &original.buyer_id).await?,
        CallKind::Ping => PingResult::default(),
    };
    let bid = ping.bid;
    let offered = buyer
        .addr
        .send(OfferLead {
            lead: Arc::new(LeadOffer::of(&lead)),
            kind,
            ping,
            instance_id: state.tree.instance_id.clone(),
            retry: Some(Retry {
                of: original.id.clone(),
                settings: Arc::new(settings),
            }),
        })
        .await
        .map_err(|error| ApiError::Unavailable(format!("buyer actor: {error}")))?;
    match &offered {
        Offered::Called(report)
            if kind == CallKind::Post && report.outcome == CallOutcome::Accepted =>
        {
            let price = report.price.or(bid).or(buyer.settings.price);
            let sold = state
                .store
                .record_sale(
                    &lead.id,
                    &original.buyer_id,
                    Some(&report.attempt_id),
                    price,
                )
                .await?;
            if sold {
                state.store.mark_sold(&lead.id).await?;
            } else {
                tracing::warn!(lead_id = %lead.id, "retried post accepted, but the lead was already sold: no second sale");
            }
        }
        Offered::NotRecorded | Offered::Crashed => {
            return Err(ApiError::Unavailable(
                "the retry could not be recorded or the buyer actor crashed".into(),
            ))
        }
        _ => {}
    }
    let retried = state
        .store
        .attempts_of(&lead.id)
        .await?
        .into_iter()
        .rev()
        .find(|attempt| attempt.retry_of.as_deref() == Some(original.id.as_str()))
        .ok_or_else(|| ApiError::Unavailable("the retry left no attempt row".into()))?;
    Ok(HttpResponse::Ok().json(AttemptView::from(retried)))
}

/// The ping this buyer accepted for the lead, for a retried post.
async fn accepted_ping(
    state: &AppState,
    lead_id: &str,
    buyer_id: &str,
) -> Result<PingResult, ApiError> {
    let attempts = state.store.attempts_of(lead_id).await?;
    Ok(attempts
        .into_iter()
        .rev()
        .find(|attempt| {
            attempt.buyer_id == buyer_id && attempt.kind == "ping" && attempt.outcome == "accepted"
        })
        .map(|ping| PingResult {
            ping_id: ping.ping_id,
            bid: ping.bid,
        })
        .unwrap_or_default())
}

#[derive(Debug, Deserialize)]
pub struct AlertQuery {
    limit: Option<u64>,
}

/// `GET /v1/alerts`: alerts, newest first (`limit`, default 100, at most 1000).
pub async fn alerts(
    _: Admin,
    query: web::Query<AlertQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let limit = query.limit.unwrap_or(100).clamp(1, 1000);
    let alerts = state.store.recent_alerts(limit).await?;
    let alerts: Vec<Value> = alerts
        .into_iter()
        .map(|alert| {
            json!({
                "id": alert.id,
                "kind": alert.kind,
                "buyer_id": alert.buyer_id,
                "lead_id": alert.lead_id,
                "message": alert.message,
                "created_at": alert.created_at,
                "notified": alert.notified,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({ "alerts": alerts })))
}

/// `POST /v1/admin/reload`: reloads the configuration file; an invalid one
/// is refused (422, every problem listed) and the running one kept.
pub async fn reload(_: Admin, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    match reload_settings(&state.settings, &state.tree).await {
        Ok(report) => Ok(HttpResponse::Ok().json(report)),
        Err(ReloadError::Invalid(problems)) => {
            let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
            Ok(HttpResponse::UnprocessableEntity().json(json!({
                "error": "invalid_config",
                "message": "the configuration file is invalid; the running configuration is kept",
                "problems": listed,
            })))
        }
        Err(ReloadError::NoFile) => Err(ApiError::Conflict(
            "the service was not started from a configuration file".into(),
        )),
        Err(error) => Err(ApiError::Unavailable(error.to_string())),
    }
}

/// Hands a lead to the router; the sweep finds it anyway should this be lost.
fn route(state: &AppState, lead_id: &str) {
    state.tree.router.do_send(RouteLeads {
        lead_ids: vec![lead_id.to_string()],
    });
}

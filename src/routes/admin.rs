//! The admin API's changes (SPEC section 5): fix an invalid lead, reroute,
//! resolve an `unknown` lead, retry an attempt from its snapshot, record a
//! return, list alerts, reload the configuration. Each answers the lead (or
//! the new attempt) as it is afterwards; a state that does not allow the
//! change is 409, a resolve that breaks one of its rules 422.

use actix_web::{web, HttpResponse};
use entity::attempt;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use super::auth::Admin;
use super::error::{ApiError, ErrorBody};
use super::leads::{attempt_views, find, full_view, AttemptView, LeadView};
use super::state::AppState;
use crate::actors::retry::{RetryAttempt, RetryError};
use crate::actors::router::RouteLeads;
use crate::domain::{check_fields, AttemptKind, LeadId};
use crate::reload::{reload as reload_settings, ReloadError, ReloadReport};
use crate::store::Settlement;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldsFix {
    /// Normalised fields to set; `null` removes one.
    #[schema(value_type = Object)]
    fields: Map<String, Value>,
}

/// `PATCH /v1/leads/{id}`: merges the fields into an invalid lead's
/// normalised fields and validates again; valid, it is routed. 422 while
/// still invalid. The raw payload never changes.
#[utoipa::path(patch, path = "/v1/leads/{id}", tag = "leads", security(("admin" = [])),
    params(("id" = String, Path, description = "The lead's submission_id")),
    request_body = FieldsFix,
    responses(
        (status = 200, description = "Valid now: the lead, on its way to be routed", body = LeadView),
        (status = 422, description = "Still invalid: the lead with its errors", body = LeadView),
        (status = 400, description = "A malformed request", body = ErrorBody),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "No such lead", body = ErrorBody),
        (status = 409, description = "The lead is not invalid", body = ErrorBody),
    ))]
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
    let (fields, errors) = check_fields(
        merged.iter().map(|(k, v)| (k.as_str(), v)),
        &required,
        state.settings().intake.max_field_chars,
    );
    let fixed = state
        .store
        .fix_invalid_lead(
            &row.id,
            fields,
            &errors,
            &state.settings().duplicate_rule(),
            !state.settings().has_required_channel(),
        )
        .await?;
    let valid = errors.is_empty();
    if valid {
        route(&state, &fixed.id);
        state.tree.couriers.deliver(std::slice::from_ref(&fixed.id));
    }
    let view = full_view(&state, fixed).await?;
    Ok(if valid {
        HttpResponse::Ok().json(view)
    } else {
        HttpResponse::UnprocessableEntity().json(view)
    })
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RerouteRequest {
    #[serde(default)]
    include_tried: bool,
}

/// `POST /v1/leads/{id}/reroute`: an `unsold` or `unknown` lead is routed
/// again, skipping buyers it was posted to unless `include_tried`.
#[utoipa::path(post, path = "/v1/leads/{id}/reroute", tag = "leads", security(("admin" = [])),
    params(("id" = String, Path, description = "The lead's submission_id")),
    request_body(content = Option<RerouteRequest>, description = "Optional"),
    responses(
        (status = 200, description = "The lead, back in `received`", body = LeadView),
        (status = 400, description = "A malformed request", body = ErrorBody),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "No such lead", body = ErrorBody),
        (status = 409, description = "Only an unsold or unknown lead can be rerouted", body = ErrorBody),
    ))]
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

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveRequest {
    buyer_id: String,
    sold: bool,
    #[schema(minimum = 0.0)]
    price: Option<f64>,
}

/// `POST /v1/leads/{id}/resolve`: settles an `unknown` lead by hand: sold
/// to the buyer of the post whose outcome is unknown (at `price`, else that
/// post's bid or the buyer's fixed price), or not sold to a buyer it was
/// posted to. Anything else is 422 with the rule as `error`
/// (`not_unknown`, `unknown_buyer`, `buyer_not_posted`,
/// `not_the_unknown_post`, `bad_price`, `price_needed`), nothing changed.
/// Recorded as a `resolve` attempt.
#[utoipa::path(post, path = "/v1/leads/{id}/resolve", tag = "leads", security(("admin" = [])),
    params(("id" = String, Path, description = "The lead's submission_id")),
    request_body = ResolveRequest,
    responses(
        (status = 200, description = "The lead, now sold or unsold", body = LeadView),
        (status = 400, description = "A malformed request", body = ErrorBody),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "No such lead", body = ErrorBody),
        (status = 409, description = "The lead is already sold", body = ErrorBody),
        (status = 422, description = "A rule of resolve is broken (named in `error`); nothing changed", body = ErrorBody),
    ))]
pub async fn resolve(
    _: Admin,
    path: web::Path<String>,
    body: web::Json<ResolveRequest>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let settings = state.settings();
    let source = state
        .store
        .find_lead(&path)
        .await?
        .map(|lead| lead.source_id)
        .unwrap_or_default();
    let settlement = Settlement {
        buyer_id: &body.buyer_id,
        sold: body.sold,
        price: body.price,
        payout: settings.payout_rule(&source),
        buyer_configured: settings
            .buyers
            .iter()
            .any(|buyer| buyer.id == body.buyer_id),
    };
    let row = state.store.resolve_unknown_lead(&path, settlement).await?;
    Ok(HttpResponse::Ok().json(full_view(&state, row).await?))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReturnRequest {
    /// Why the buyer returned it.
    #[schema(min_length = 1, pattern = "\\S")]
    reason: String,
    #[serde(default)]
    reroute: bool,
}

/// `POST /v1/leads/{id}/return`: the buyer returned a sold lead; with
/// `reroute` it is offered to the other buyers.
#[utoipa::path(post, path = "/v1/leads/{id}/return", tag = "leads", security(("admin" = [])),
    params(("id" = String, Path, description = "The lead's submission_id")),
    request_body = ReturnRequest,
    responses(
        (status = 200, description = "The lead, unsold or back in `received`", body = LeadView),
        (status = 400, description = "A malformed request or no reason", body = ErrorBody),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "No such lead", body = ErrorBody),
        (status = 409, description = "Only a sold lead can be returned", body = ErrorBody),
    ))]
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
/// new attempt with `retry_of`, for an `unsold` or `unknown` lead, which is
/// held (leased) meanwhile. The router owns the retry (see
/// `actors::retry`), so a client that goes away changes nothing. An
/// accepted post makes the sale, still at most one; a timed-out post
/// leaves the lead `unknown`. Answers the new attempt.
#[utoipa::path(post, path = "/v1/attempts/{id}/retry", tag = "leads", security(("admin" = [])),
    params(("id" = String, Path, description = "The attempt to replay")),
    responses(
        (status = 200, description = "The new attempt (with `retry_of`)", body = AttemptView),
        (status = 202, description = "A notify or event try: its delivery is due again (`{lead_id, delivery, state}`)", body = Object),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "No such attempt", body = ErrorBody),
        (status = 409, description = "The lead is not unsold or unknown, the buyer is gone, or the delivery is already confirmed", body = ErrorBody),
        (status = 503, description = "The retry could not be recorded", body = ErrorBody),
    ))]
pub async fn retry(
    _: Admin,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let attempt_id = path.into_inner();
    if let Some(delivery) = state.store.find_attempt(&attempt_id).await? {
        if matches!(
            AttemptKind::parse(&delivery.kind),
            Some(AttemptKind::Notify | AttemptKind::Event)
        ) {
            return redeliver(&state, delivery).await;
        }
    }
    let retried = state
        .tree
        .router
        .send(RetryAttempt { attempt_id })
        .await
        .map_err(|error| ApiError::Unavailable(format!("router: {error}")))?
        .map_err(|error| match error {
            RetryError::NotFound(what) => ApiError::NotFound(what),
            RetryError::Conflict(why) => ApiError::Conflict(why),
            RetryError::Unavailable(why) => ApiError::Unavailable(why),
        })?;
    let shown = attempt_views(&state, vec![retried]).await?.remove(0);
    Ok(HttpResponse::Ok().json(shown))
}

/// The retry of a notify or event try: its delivery, unless confirmed, is
/// due again at once (a given-up one gets a new day of tries); 202, and
/// the courier sends it as a new attempt row.
async fn redeliver(state: &AppState, attempt: attempt::Model) -> Result<HttpResponse, ApiError> {
    let target = match serde_json::from_str::<serde_json::Value>(
        attempt.request["body"].as_str().unwrap_or_default(),
    )
    .ok()
    .and_then(|body| body["event"].as_str().map(str::to_string))
    {
        Some(event) if attempt.kind == AttemptKind::Event.as_str() => {
            format!("{}:{event}", attempt.buyer_id)
        }
        _ => attempt.buyer_id.clone(),
    };
    let due = state
        .store
        .deliver_again_now(&attempt.lead_id, Some(&target))
        .await?;
    if due == 0 {
        return Err(ApiError::Conflict(format!(
            "{target} already confirmed lead {}: it is never sent again",
            attempt.lead_id
        )));
    }
    state
        .tree
        .couriers
        .deliver(std::slice::from_ref(&attempt.lead_id));
    Ok(HttpResponse::Accepted().json(serde_json::json!({
        "lead_id": attempt.lead_id,
        "delivery": target,
        "state": "pending",
    })))
}

#[derive(Debug, Deserialize, IntoParams)]
pub struct AlertQuery {
    /// How many, 1 to 1000 (default 100).
    limit: Option<u64>,
}

/// One alert as kept.
#[derive(Debug, Serialize, ToSchema)]
pub struct AlertView {
    id: String,
    /// `circuit_opened`, `circuit_closed`, `post_timeout`, `spool_in_use`,
    /// `intake_failed` or `all_buyers_failed`.
    kind: String,
    buyer_id: Option<String>,
    lead_id: Option<String>,
    message: String,
    created_at: chrono::DateTime<chrono::Utc>,
    /// False when `alerts.min_interval` held it back from the log and webhook.
    notified: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AlertList {
    alerts: Vec<AlertView>,
}

/// `GET /v1/alerts`: alerts, newest first (`limit`, default 100, at most 1000).
#[utoipa::path(get, path = "/v1/alerts", tag = "operations", security(("admin" = [])),
    params(AlertQuery),
    responses(
        (status = 200, description = "Alerts, newest first", body = AlertList),
        (status = 400, description = "A bad query", body = ErrorBody),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
    ))]
pub async fn alerts(
    _: Admin,
    query: web::Query<AlertQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let limit = query.limit.unwrap_or(100).clamp(1, 1000);
    let alerts = state.store.recent_alerts(limit).await?;
    let alerts = alerts
        .into_iter()
        .map(|alert| AlertView {
            id: alert.id,
            kind: alert.kind,
            buyer_id: alert.buyer_id,
            lead_id: alert.lead_id,
            message: alert.message,
            created_at: alert.created_at,
            notified: alert.notified,
        })
        .collect();
    Ok(HttpResponse::Ok().json(AlertList { alerts }))
}

/// `POST /v1/admin/reload`: reloads the configuration file; an invalid one
/// is refused (422, every problem listed) and the running one kept.
#[utoipa::path(post, path = "/v1/admin/reload", tag = "operations", security(("admin" = [])),
    responses(
        (status = 200, description = "Reloaded: what changed", body = ReloadReport),
        (status = 422, description = "The file is invalid; the running configuration is kept", body = ReloadRefused),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
        (status = 409, description = "Not started from a configuration file", body = ErrorBody),
        (status = 503, description = "The file cannot be read", body = ErrorBody),
    ))]
pub async fn reload(_: Admin, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    match reload_settings(&state.settings, &state.tree).await {
        Ok(report) => Ok(HttpResponse::Ok().json(report)),
        Err(ReloadError::Invalid(problems)) => {
            let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
            Ok(HttpResponse::UnprocessableEntity().json(ReloadRefused {
                error: "invalid_config".into(),
                message: "the configuration file is invalid; the running configuration is kept"
                    .into(),
                problems: listed,
            }))
        }
        Err(ReloadError::NoFile) => Err(ApiError::Conflict(
            "the service was not started from a configuration file".into(),
        )),
        Err(error) => Err(ApiError::Unavailable(error.to_string())),
    }
}

/// A refused reload.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReloadRefused {
    error: String,
    message: String,
    /// Each problem with its key path.
    problems: Vec<String>,
}

/// Hands a lead to the router; the sweep finds it anyway should this be lost.
fn route(state: &AppState, lead_id: &str) {
    state.tree.router.do_send(RouteLeads {
        lead_ids: vec![LeadId::from(lead_id)],
    });
}

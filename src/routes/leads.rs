//! Reading leads: the public status (the contract, no personal data), and for
//! admins the full lead with its attempts, the filtered list and the review
//! queue.

use actix_web::{web, HttpResponse};
use base64::Engine;
use chrono::{DateTime, Utc};
use entity::{attempt, delivery, lead, sale};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::auth::Admin;
use super::error::{ApiError, ErrorBody};
use super::state::AppState;
use crate::domain::{AttemptKind, AttemptOutcome, CallOutcome, Contract, FieldError, LeadState};
use crate::store::{contract_of_row, DeliveryState, LeadFilter, LeadPage};

const DEFAULT_PAGE: u64 = 50;
const MAX_PAGE: u64 = 500;

/// `GET /v1/leads/{id}/status`: public, so only the contract (also of a
/// lead still in the spool).
#[utoipa::path(get, path = "/v1/leads/{id}/status", tag = "intake",
    params(("id" = String, Path, description = "The lead's submission_id")),
    responses(
        (status = 200, description = "The acceptance contract; no personal data", body = Contract),
        (status = 404, description = "No such lead", body = ErrorBody),
    ))]
pub async fn status(
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    // A spooled lead is not in the database yet (which may be down).
    if let Some(contract) = state.tree.spool.contract_of(&path) {
        return Ok(HttpResponse::Ok().json(contract));
    }
    match find(&state, &path).await {
        Ok(row) => Ok(HttpResponse::Ok().json(contract_of_row(&row))),
        // Refused by the database after it was spooled: still safe on disk.
        Err(ApiError::NotFound(what)) => match state.tree.spool.refused_lead(&path) {
            Ok(Some(refused)) => Ok(HttpResponse::Ok().json(refused.spooled.contract)),
            _ => Err(ApiError::NotFound(what)),
        },
        Err(error) => Err(error),
    }
}

/// `GET /v1/leads/{id}`: everything about the lead, attempts in order.
#[utoipa::path(get, path = "/v1/leads/{id}", tag = "leads", security(("admin" = [])),
    params(("id" = String, Path, description = "The lead's submission_id")),
    responses(
        (status = 200, description = "The lead, its attempts and why it is in its state", body = LeadView),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "No such lead", body = ErrorBody),
    ))]
pub async fn show(
    _: Admin,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let row = find(&state, &path).await?;
    Ok(HttpResponse::Ok().json(full_view(&state, row).await?))
}

/// The lead with its attempts and why it is where it is.
pub async fn full_view(state: &AppState, row: lead::Model) -> Result<LeadView, ApiError> {
    let attempts = state.store.attempts_of(&row.id).await?;
    let sale = state
        .store
        .sales_of(std::slice::from_ref(&row.id))
        .await?
        .remove(&row.id);
    let why = explain(&row, sale.as_ref(), &attempts);
    let returns = state.store.returns_of(&row.id).await?;
    let deliveries = state.store.deliveries_of(&row.id).await?;
    let mut view = LeadView::new(row, sale);
    view.why = Some(why);
    view.returns = Some(
        returns
            .into_iter()
            .map(|sale| ReturnView {
                buyer_id: sale.buyer_id,
                reason: sale.return_reason.unwrap_or_default(),
                at: sale.returned_at.unwrap_or(sale.sold_at),
            })
            .collect(),
    );
    view.attempts = Some(attempt_views(state, attempts).await?);
    view.deliveries = Some(deliveries.into_iter().map(DeliveryView::from).collect());
    Ok(view)
}

/// Why the lead is in its state, in plain words, from its row and history.
fn explain(row: &lead::Model, sale: Option<&sale::Model>, attempts: &[attempt::Model]) -> String {
    let current: Vec<&attempt::Model> = attempts
        .iter()
        .filter(|attempt| {
            row.history_from
                .is_none_or(|from| attempt.started_at >= from)
        })
        .collect();
    let rerouted = if row.history_from.is_some() {
        " (since an operator's reroute, return or resolve)"
    } else {
        ""
    };
    match LeadState::parse(&row.state) {
        Some(LeadState::Received) => match (&row.set_aside_reason, row.route_after) {
            (Some(reason), _) => format!(
                "set aside for review after {} routing failures (the last: {reason}); reroute it once the cause is fixed",
                row.route_failures
            ),
            (None, Some(after)) if after > Utc::now() => format!(
                "waiting to be routed again after {} routing failure(s), not before {}",
                row.route_failures,
                after.to_rfc3339()
            ),
            _ => format!("stored and waiting to be routed{rerouted}"),
        },
        Some(LeadState::Routing) => format!(
            "being routed by instance {} (lease until {}){rerouted}",
            row.lease_owner.as_deref().unwrap_or("?"),
            row.lease_until
                .map(|until| until.to_rfc3339())
                .unwrap_or_default()
        ),
        Some(LeadState::Sold) => match sale {
            Some(sale) => format!(
                "sold to {} at {}{}",
                sale.buyer_id,
                sale.sold_at.to_rfc3339(),
                sale.price
                    .map(|price| format!(" for {price}"))
                    .unwrap_or_default()
            ),
            None => "sold".into(),
        },
        Some(LeadState::Unknown) => {
            let timeout = AttemptOutcome::Call(CallOutcome::Timeout);
            let post = current.iter().rev().find(|attempt| {
                AttemptKind::parse(&attempt.kind) == Some(AttemptKind::POST)
                    && AttemptOutcome::parse(&attempt.outcome) == Some(timeout)
            });
            match post {
                Some(post) => format!(
                    "the post to {} got no answer ({}): the buyer may have accepted it; it is not re-sent — check with the buyer, then resolve or reroute",
                    post.buyer_id,
                    post.reason.as_deref().unwrap_or("timeout")
                ),
                None => "a post's fate is unknown; resolve or reroute".into(),
            }
        }
        Some(LeadState::Unsold) => {
            let mut last_by_buyer: Vec<(&str, String)> = Vec::new();
            for attempt in &current {
                let verdict = match (AttemptKind::parse(&attempt.kind), &attempt.reason) {
                    (Some(AttemptKind::Skip), _) => format!("skipped: {}", attempt.outcome),
                    (_, Some(reason)) => format!("{} {} ({reason})", attempt.kind, attempt.outcome),
                    (_, None) => format!("{} {}", attempt.kind, attempt.outcome),
                };
                match last_by_buyer
                    .iter_mut()
                    .find(|(buyer, _)| *buyer == attempt.buyer_id)
                {
                    Some(entry) => entry.1 = verdict,
                    None => last_by_buyer.push((&attempt.buyer_id, verdict)),
                }
            }
            if last_by_buyer.is_empty() {
                return if row.history_from.is_some() {
                    "no buyer took it since an operator's reroute, return or resolve; reroute it (include_tried offers it to the buyers tried before)".into()
                } else {
                    "no buyer was eligible".into()
                };
            }
            let each: Vec<String> = last_by_buyer
                .into_iter()
                .map(|(buyer, verdict)| format!("{buyer}: {verdict}"))
                .collect();
            format!("no buyer bought it — {}", each.join("; "))
        }
        Some(LeadState::Invalid) => {
            let errors: Vec<FieldError> =
                serde_json::from_value(row.errors.clone()).unwrap_or_default();
            let each: Vec<String> = errors
                .iter()
                .map(|error| format!("{}: {}", error.field, error.message))
                .collect();
            format!(
                "failed validation ({}); fix it with PATCH /v1/leads/{{id}}",
                each.join("; ")
            )
        }
        Some(LeadState::Duplicate) => format!(
            "the same person as lead {} within the duplicate window; never routed",
            row.duplicate_of.as_deref().unwrap_or("?")
        ),
        None => format!("unrecognised state {:?}", row.state),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
pub struct ListQuery {
    /// One lead state.
    state: Option<String>,
    /// A source id.
    source: Option<String>,
    /// Page size, 1 to 500 (default 50).
    limit: Option<u64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// `GET /v1/leads?state=&source=&limit=&cursor=`: newest first.
#[utoipa::path(get, path = "/v1/leads", tag = "leads", security(("admin" = [])),
    params(ListQuery),
    responses(
        (status = 200, description = "Leads, newest first", body = LeadPageView),
        (status = 400, description = "Unknown state or a bad query", body = ErrorBody),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
    ))]
pub async fn list(
    _: Admin,
    query: web::Query<ListQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let query = query.into_inner();
    let states = match query.state.as_deref() {
        None | Some("") => Vec::new(),
        Some(name) => vec![LeadState::parse(name).ok_or_else(|| {
            ApiError::BadRequest(format!(
                "unknown state {name:?}; one of {}",
                LeadState::ALL.map(LeadState::as_str).join(", ")
            ))
        })?],
    };
    let filter = LeadFilter {
        states,
        set_aside: false,
        undelivered: false,
        source: query.source.filter(|source| !source.is_empty()),
        limit: page_size(query.limit),
        cursor: query.cursor,
        oldest_first: false,
    };
    page_response(&state, state.store.list_leads(&filter).await?).await
}

#[derive(Debug, Deserialize, IntoParams)]
pub struct ReviewQuery {
    /// Page size, 1 to 500 (default 50).
    limit: Option<u64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// `GET /v1/review`: invalid and unknown leads, and leads set aside after
/// repeated routing failures, oldest first.
#[utoipa::path(get, path = "/v1/review", tag = "leads", security(("admin" = [])),
    params(ReviewQuery),
    responses(
        (status = 200, description = "The review queue, oldest first", body = LeadPageView),
        (status = 400, description = "A bad query", body = ErrorBody),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
    ))]
pub async fn review(
    _: Admin,
    query: web::Query<ReviewQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let query = query.into_inner();
    let filter = LeadFilter {
        states: vec![LeadState::Invalid, LeadState::Unknown],
        set_aside: true,
        undelivered: true,
        source: None,
        limit: page_size(query.limit),
        cursor: query.cursor,
        oldest_first: true,
    };
    page_response(&state, state.store.list_leads(&filter).await?).await
}

fn page_size(requested: Option<u64>) -> u64 {
    requested.unwrap_or(DEFAULT_PAGE).clamp(1, MAX_PAGE)
}

async fn page_response(state: &AppState, page: LeadPage) -> Result<HttpResponse, ApiError> {
    let ids: Vec<String> = page.leads.iter().map(|lead| lead.id.clone()).collect();
    let mut sales = state.store.sales_of(&ids).await?;
    let leads: Vec<LeadView> = page
        .leads
        .into_iter()
        .map(|row| {
            let sale = sales.remove(&row.id);
            LeadView::new(row, sale)
        })
        .collect();
    Ok(HttpResponse::Ok().json(LeadPageView {
        leads,
        next_cursor: page.next_cursor,
    }))
}

pub async fn find(state: &AppState, id: &str) -> Result<lead::Model, ApiError> {
    state
        .store
        .find_lead(id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("lead {id:?}")))
}

/// A lead as the admin API shows it (SPEC section 5).
#[derive(Debug, Serialize, ToSchema)]
pub struct LeadView {
    id: String,
    source: String,
    external_id: Option<String>,
    lead_state: String,
    contract: Contract,
    #[schema(value_type = Object)]
    fields: Value,
    #[schema(value_type = Object)]
    attribution: Value,
    test: bool,
    /// The body as text (lossy where it is not UTF-8).
    raw: String,
    /// The exact body, when it is not valid UTF-8.
    raw_base64: Option<String>,
    raw_content_type: String,
    received_at: DateTime<Utc>,
    sold_to: Option<String>,
    price: Option<f64>,
    errors: Vec<FieldError>,
    duplicate_of: Option<String>,
    /// Why the lead is where it is (the single-lead view only).
    #[serde(skip_serializing_if = "Option::is_none")]
    why: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempts: Option<Vec<AttemptView>>,
    /// Sales of this lead that their buyers returned (the single-lead view only).
    #[serde(skip_serializing_if = "Option::is_none")]
    returns: Option<Vec<ReturnView>>,
    /// Where each notify channel and event stands for this lead (the
    /// single-lead view only).
    #[serde(skip_serializing_if = "Option::is_none")]
    deliveries: Option<Vec<DeliveryView>>,
}

/// One notify channel's (or event's) delivery of the lead.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryView {
    /// `notify` or `event`.
    kind: String,
    /// The channel's or event sink's id.
    channel: String,
    event: Option<String>,
    /// `pending`, `confirmed` or `abandoned`.
    state: String,
    tries: i32,
    next_try_at: Option<DateTime<Utc>>,
    confirmed_at: Option<DateTime<Utc>>,
    last_error: Option<String>,
}

impl From<delivery::Model> for DeliveryView {
    fn from(row: delivery::Model) -> Self {
        let pending = row.state == DeliveryState::Pending.as_str();
        Self {
            kind: row.kind,
            channel: row.channel,
            event: row.event,
            state: row.state,
            tries: row.tries,
            next_try_at: pending.then_some(row.next_try_at),
            confirmed_at: row.confirmed_at,
            last_error: row.last_error,
        }
    }
}

/// A buyer returned the lead it bought.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReturnView {
    buyer_id: String,
    reason: String,
    at: DateTime<Utc>,
}

impl LeadView {
    fn new(row: lead::Model, sale: Option<sale::Model>) -> Self {
        let contract = contract_of_row(&row);
        let (raw, raw_base64) = match String::from_utf8(row.raw) {
            Ok(text) => (text, None),
            Err(error) => {
                let bytes = error.into_bytes();
                (
                    String::from_utf8_lossy(&bytes).into_owned(),
                    Some(base64::engine::general_purpose::STANDARD.encode(&bytes)),
                )
            }
        };
        Self {
            errors: contract.errors.clone(),
            contract,
            id: row.id,
            source: row.source_id,
            external_id: row.external_id,
            lead_state: row.state,
            fields: row.fields,
            attribution: row.attribution,
            test: row.is_test,
            raw,
            raw_base64,
            raw_content_type: row.raw_content_type,
            received_at: row.received_at,
            sold_to: sale.as_ref().map(|sale| sale.buyer_id.clone()),
            price: sale.and_then(|sale| sale.price),
            duplicate_of: row.duplicate_of,
            why: None,
            attempts: None,
            returns: None,
            deliveries: None,
        }
    }
}

/// One attempt as the admin API shows it; secrets were redacted when stored.
#[derive(Debug, Serialize, ToSchema)]
pub struct AttemptView {
    id: String,
    lead_id: String,
    kind: String,
    buyer_id: String,
    outcome: String,
    reason: Option<String>,
    http_status: Option<i32>,
    started_at: DateTime<Utc>,
    duration_ms: Option<i64>,
    retry_of: Option<String>,
    /// `{url, method, headers, body}`; null for a skip.
    request: Value,
    response_body: Option<String>,
    /// The buyer's configuration the attempt used, `${VAR}` secrets as references.
    #[schema(value_type = Object)]
    snapshot: Value,
}

/// A page of leads.
#[derive(Debug, Serialize, ToSchema)]
pub struct LeadPageView {
    leads: Vec<LeadView>,
    /// Pass as `cursor` for the next page; null on the last.
    next_cursor: Option<String>,
}

/// The attempts as shown, each with the configuration it used (read once
/// per distinct one). Also the answer of `POST /v1/attempts/{id}/retry`.
pub async fn attempt_views(
    state: &AppState,
    rows: Vec<attempt::Model>,
) -> Result<Vec<AttemptView>, ApiError> {
    let ids = rows.iter().map(|row| row.snapshot_id.as_str());
    let snapshots = state.store.config_snapshots(ids).await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let snapshot = snapshots.get(&row.snapshot_id).unwrap_or(&Value::Null);
            AttemptView::new(row, snapshot)
        })
        .collect())
}

impl AttemptView {
    fn new(row: attempt::Model, snapshot: &Value) -> Self {
        Self {
            id: row.id,
            lead_id: row.lead_id,
            kind: row.kind,
            buyer_id: row.buyer_id,
            outcome: row.outcome,
            reason: row.reason,
            http_status: row.http_status,
            started_at: row.started_at,
            duration_ms: row.duration_ms,
            retry_of: row.retry_of,
            request: crate::redact::request(&row.request),
            response_body: row.response_body,
            snapshot: crate::redact::snapshot(snapshot),
        }
    }
}

//! `POST /v1/leads` and `POST /v1/leads/batch`: identify the source, read the
//! body, build the lead, hand it to the `Intake` actor, answer the contract.
//! Nothing here waits for a buyer.

use std::net::IpAddr;
use std::sync::atomic::Ordering;

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use super::auth::secrets_equal;
use super::error::{ApiError, ErrorBody};
use super::form_page;
use super::state::AppState;
use crate::actors::{IntakeError, SubmitLead};
use crate::config::{Settings, SourceKind, SourceSettings};
use crate::domain::{
    keyed_lead_id, new_id, normalize_parsed, parse_body, Acceptance, BodyError, BodyFormat,
    Contract, LeadState, RequestMeta,
};
use crate::store::{contract_of_row, NewLead};

/// `POST /v1/leads/batch`'s body. (The handler reads each lead as raw JSON
/// so its bytes are kept exactly; this type only describes the shape.)
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct BatchRequest {
    #[schema(value_type = Vec<Object>)]
    leads: Vec<Value>,
}

/// One lead's answer in a batch: its contract, or an error object for a lead
/// over `server.max_body_bytes`. (Describes the JSON the handler builds.)
#[derive(serde::Serialize, ToSchema)]
#[allow(dead_code)]
#[serde(untagged)]
pub enum BatchResult {
    Contract(Contract),
    Error(ErrorBody),
}

/// Most leads in one batch request (SPEC section 5).
const MAX_BATCH_LEADS: usize = 1000;
/// A batch body may be this many times `server.max_body_bytes`; each lead in
/// it is still held to `max_body_bytes`.
const BATCH_BODY_FACTOR: usize = 64;

#[derive(Debug, Deserialize)]
pub struct SourceQuery {
    source: Option<String>,
}

/// Stores one lead and answers with its contract (or an HTML page for forms).
#[utoipa::path(post, path = "/v1/leads", tag = "intake",
    params(
        ("source" = Option<String>, Query, description = "A form source's id (or a `source` body field)"),
        ("X-Api-Key" = Option<String>, Header, description = "A feed source's key"),
        ("Idempotency-Key" = Option<String>, Header, description = "The dedupe key"),
        ("X-Test-Lead" = Option<String>, Header, description = "`1`: a test lead, never sold"),
    ),
    request_body(description = "The lead: a JSON object, or an urlencoded form", content(
        (Object = "application/json"),
        (Object = "application/x-www-form-urlencoded"),
    )),
    responses(
        (status = 200, description = "Stored and accepted, or a replay", body = Contract),
        (status = 202, description = "Safe, not yet accepted (a required notify channel, or the spool)", body = Contract),
        (status = 303, description = "A browser form post, redirected to the source's thank_you_url"),
        (status = 401, description = "No source named, an unknown source or key", body = ErrorBody),
        (status = 413, description = "Larger than server.max_body_bytes", body = ErrorBody),
        (status = 415, description = "An unsupported content type; stored for review", body = Contract),
        (status = 422, description = "Stored, but invalid: in the review queue", body = Contract),
        (status = 429, description = "Over a rate limit; see Retry-After", body = ErrorBody),
        (status = 503, description = "Not stored (`failed`): send it again with the same key", body = Contract),
    ))]
pub async fn submit(
    request: HttpRequest,
    payload: web::Payload,
    query: web::Query<SourceQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let settings = state.settings();
    let body = read_body(&request, payload, settings.server.max_body_bytes).await?;
    let content_type = header_text(&request, header::CONTENT_TYPE.as_str());
    let format = BodyFormat::of(content_type.as_deref());
    let parsed = format.clone().and_then(|format| parse_body(format, &body));
    let body_source = parsed
        .as_ref()
        .ok()
        .and_then(|map| map.get("source"))
        .and_then(Value::as_str);
    let source = identify_source(&request, &settings, query.source.as_deref().or(body_source))?;
    admit(&state, source, client_ip(&request, &settings))?;

    let header_key = header_text(&request, "idempotency-key").filter(|key| !key.trim().is_empty());
    let lead = build_lead(
        source,
        body.to_vec(),
        content_type,
        parsed.clone(),
        request_meta(&request, &settings),
        header_key,
        IntakeLimits::of(&settings),
    );
    let contract = store_lead(&state, lead).await;

    if wants_html(&request) && source.kind == SourceKind::Form {
        let entered = parsed.unwrap_or_default();
        return Ok(form_page::answer(source, &contract, &entered));
    }
    let status = match format {
        Err(BodyError::Unsupported(_)) if contract.server_recorded && !contract.replayed => {
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        }
        _ => status_of(&contract),
    };
    let mut answer = HttpResponse::build(status);
    if contract.acceptance == Acceptance::Failed {
        // Nothing was kept: send it again (same key) shortly.
        answer.insert_header((header::RETRY_AFTER, RETRY_FAILED_AFTER_SECS.to_string()));
    }
    Ok(answer.json(contract_json(&contract, status)))
}

/// What a `failed` answer's `Retry-After` says (seconds).
const RETRY_FAILED_AFTER_SECS: u64 = 1;

/// One answer per lead of a batch, in order.
#[derive(Serialize, ToSchema)]
pub struct BatchAnswer {
    #[schema(value_type = Vec<BatchResult>)]
    results: Vec<Value>,
}

#[derive(Deserialize)]
struct BatchEnvelope<'a> {
    #[serde(borrow)]
    leads: Vec<&'a RawValue>,
}

/// Stores up to 1000 leads from a feed; each is judged on its own.
#[utoipa::path(post, path = "/v1/leads/batch", tag = "intake",
    params(("X-Api-Key" = String, Header, description = "The feed source's key")),
    request_body(content = BatchRequest, description = "Up to 1000 leads"),
    responses(
        (status = 200, description = "One answer per lead, in order", body = BatchAnswer),
        (status = 400, description = "More than 1000 leads", body = ErrorBody),
        (status = 401, description = "No or an unknown X-Api-Key", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
        (status = 422, description = "The envelope is not {\"leads\": [...]}; stored whole for review", body = Contract),
        (status = 429, description = "Over a rate limit; see Retry-After", body = ErrorBody),
        (status = 503, description = "The broken envelope could not be stored", body = Contract),
    ))]
pub async fn submit_batch(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let settings = state.settings();
    let max_lead_bytes = settings.server.max_body_bytes;
    let limits = IntakeLimits::of(&settings);
    let body = read_body(&request, payload, max_lead_bytes * BATCH_BODY_FACTOR).await?;
    let source = match header_text(&request, "x-api-key") {
        Some(key) => feed_for_key(&settings, &key)?,
        None => {
            return Err(ApiError::Unauthorized(
                "batch intake is for feeds: send X-Api-Key".into(),
            ))
        }
    };
    let meta = request_meta(&request, &settings);
    let ip = client_ip(&request, &settings);

    let envelope = std::str::from_utf8(&body)
        .map_err(|error| error.to_string())
        .and_then(|text| {
            serde_json::from_str::<BatchEnvelope>(text).map_err(|error| error.to_string())
        });
    let elements = match envelope {
        Ok(envelope) => envelope.leads,
        Err(error) => {
            // Keep what arrived: a broken envelope is stored whole for review.
            admit(&state, source, ip)?;
            let broken = Err(BodyError::Unparsable(format!(
                "malformed batch, expected {{\"leads\": [...]}}: {error}"
            )));
            let lead = build_lead(
                source,
                body.to_vec(),
                Some("application/json".into()),
                broken,
                meta,
                None,
                limits,
            );
            let contract = store_lead(&state, lead).await;
            let status = status_of(&contract);
            return Ok(HttpResponse::build(status).json(contract_json(&contract, status)));
        }
    };
    if elements.len() > MAX_BATCH_LEADS {
        return Err(ApiError::BadRequest(format!(
            "a batch holds at most {MAX_BATCH_LEADS} leads, this one has {}",
            elements.len()
        )));
    }
    for _ in &elements {
        admit(&state, source, ip)?;
    }

    let results = elements.into_iter().map(|element| {
        let raw = element.get().as_bytes().to_vec();
        let state = state.clone();
        let meta = meta.clone();
        async move {
            if raw.len() > max_lead_bytes {
                return json!({
                    "error": "payload_too_large",
                    "message": format!("this lead is larger than {max_lead_bytes} bytes"),
                });
            }
            let parsed = parse_body(BodyFormat::Json, &raw);
            let lead = build_lead(
                source,
                raw,
                Some("application/json".into()),
                parsed,
                meta,
                None,
                limits,
            );
            let contract = store_lead(&state, lead).await;
            contract_json(&contract, status_of(&contract))
        }
    });
    let results = futures_util::future::join_all(results).await;
    Ok(HttpResponse::Ok().json(BatchAnswer { results }))
}

/// Reads the body, refusing more than `limit` bytes with 413.
async fn read_body(
    request: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::Bytes, ApiError> {
    let declared = header_text(request, header::CONTENT_LENGTH.as_str())
        .and_then(|length| length.parse::<usize>().ok());
    if declared.is_some_and(|length| length > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk
            .map_err(|error| ApiError::BadRequest(format!("could not read the body: {error}")))?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// A feed by its `X-Api-Key`, else a form by name; anything else is 401.
fn identify_source<'a>(
    request: &HttpRequest,
    settings: &'a Settings,
    form_name: Option<&str>,
) -> Result<&'a SourceSettings, ApiError> {
    if let Some(key) = header_text(request, "x-api-key") {
        return feed_for_key(settings, &key);
    }
    let Some(name) = form_name else {
        return Err(ApiError::Unauthorized(
            "name a form source (?source= or a source field) or send a feed's X-Api-Key".into(),
        ));
    };
    match settings.sources.iter().find(|source| source.id == name) {
        Some(source) if source.kind == SourceKind::Form => Ok(source),
        Some(_) => Err(ApiError::Unauthorized(format!(
            "source {name:?} is a feed: send its X-Api-Key"
        ))),
        None => Err(ApiError::Unauthorized(format!("unknown source {name:?}"))),
    }
}

/// Compares the key with every feed's key in constant time, so timing does
/// not reveal which feed (or how much of a key) matched.
fn feed_for_key<'a>(settings: &'a Settings, key: &str) -> Result<&'a SourceSettings, ApiError> {
    let mut found = None;
    for source in &settings.sources {
        if let Some(expected) = &source.api_key {
            if secrets_equal(key, expected.expose()) {
                found = Some(source);
            }
        }
    }
    found.ok_or_else(|| ApiError::Unauthorized("unknown API key".into()))
}

fn admit(state: &AppState, source: &SourceSettings, ip: Option<IpAddr>) -> Result<(), ApiError> {
    state
        .limiter
        .admit(source, ip)
        .map_err(|wait| ApiError::RateLimited {
            retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
        })
}

/// What of the configuration shapes a new lead.
#[derive(Debug, Clone, Copy)]
struct IntakeLimits {
    max_field_chars: usize,
    /// No notify channel is required: stored and valid is accepted.
    accept_on_store: bool,
}

impl IntakeLimits {
    fn of(settings: &Settings) -> Self {
        Self {
            max_field_chars: settings.intake.max_field_chars,
            accept_on_store: !settings.has_required_channel(),
        }
    }
}

/// Builds the lead row from what arrived; a body that could not be parsed
/// becomes an `invalid` lead holding the raw bytes.
fn build_lead(
    source: &SourceSettings,
    raw: Vec<u8>,
    content_type: Option<String>,
    parsed: Result<Map<String, Value>, BodyError>,
    meta: RequestMeta,
    header_key: Option<String>,
    limits: IntakeLimits,
) -> NewLead {
    let IntakeLimits {
        max_field_chars,
        accept_on_store,
    } = limits;
    let normalized = normalize_parsed(&parsed, source, &meta, max_field_chars);
    let errors = normalized.errors.clone();
    let idempotency_key = header_key
        .or(normalized.submission_id)
        .or_else(|| normalized.external_id.clone());
    NewLead {
        id: idempotency_key
            .as_deref()
            .map_or_else(new_id, |key| keyed_lead_id(&source.id, key)),
        source_id: source.id.clone(),
        idempotency_key,
        external_id: normalized.external_id,
        raw,
        raw_content_type: content_type.unwrap_or_default(),
        remote_ip: meta.client_ip.clone(),
        fields: normalized.fields,
        attribution: normalized.attribution,
        is_test: normalized.is_test,
        errors,
        received_at: meta.received_at,
        accept_on_store,
    }
}

/// Hands the lead to the `Intake` actor; if it cannot be stored, `failed`.
/// A replay of a lead still in the spool gets the spooled contract; while
/// shutting down every lead is refused (`failed`, to be sent again).
async fn store_lead(state: &AppState, lead: NewLead) -> Contract {
    let started = std::time::Instant::now();
    let contract = contract_for(state, lead).await;
    state
        .metrics
        .intake(outcome_label(&contract), started.elapsed().as_secs_f64());
    contract
}

/// The intake outcome as `/metrics` counts it.
fn outcome_label(contract: &Contract) -> &'static str {
    match (contract.acceptance, contract.replayed, contract.lead_state) {
        (Acceptance::Failed, ..) => "failed",
        (_, true, _) => "replayed",
        (_, _, Some(LeadState::Invalid)) => "invalid",
        (_, _, Some(LeadState::Duplicate)) => "duplicate",
        (Acceptance::Accepted, ..) => "accepted",
        (Acceptance::Pending, ..) => "pending",
    }
}

async fn contract_for(state: &AppState, lead: NewLead) -> Contract {
    let lead_id = lead.id.clone();
    let source = lead.source_id.clone();
    if state.tree.draining.load(Ordering::Relaxed) {
        tracing::warn!(%lead_id, %source, "lead refused: shutting down");
        return Contract::failed(lead_id);
    }
    let spooled = lead
        .idempotency_key
        .as_deref()
        .and_then(|key| state.tree.spool.replay_of(&source, key));
    if let Some(contract) = spooled {
        return contract;
    }
    match state.tree.intake.send(SubmitLead { lead }).await {
        Ok(Ok(contract)) => {
            tracing::info!(
                lead_id = %contract.submission_id,
                %source,
                state = %contract.lead_state.map_or("pending", LeadState::as_str),
                replayed = contract.replayed,
                "lead stored"
            );
            deliver(state, contract).await
        }
        Ok(Err(error @ IntakeError::Full(_))) => {
            tracing::warn!(%lead_id, %source, %error, "lead refused: intake.max_pending reached");
            Contract::failed(lead_id)
        }
        Ok(Err(error)) => {
            tracing::error!(%lead_id, %source, %error, "intake could not store a lead");
            Contract::failed(lead_id)
        }
        Err(error) => {
            tracing::error!(%lead_id, %source, %error, "intake actor unavailable");
            Contract::failed(lead_id)
        }
    }
}

/// Hands a stored lead to the notify channels (a replay: its unconfirmed
/// deliveries are tried again at once) and, with a required channel and
/// `intake.accept_wait`, waits that long for a confirmation before
/// answering the contract as it then stands.
async fn deliver(state: &AppState, contract: Contract) -> Contract {
    let couriers = &state.tree.couriers;
    let lead_id = contract.submission_id.clone();
    // A lead in the spool is handed over when the drainer stores it; a
    // sender never waits on a database that is down.
    let spooled = state.tree.spool.database_down();
    if couriers.channels.is_empty() || spooled || contract.lead_state == Some(LeadState::Invalid) {
        return contract;
    }
    if contract.replayed {
        if let Err(error) = state.store.deliver_again_now(&lead_id, None).await {
            tracing::warn!(%lead_id, %error, "replay: deliveries not made due again");
        }
    }
    let wait = state.settings().intake.accept_wait;
    if contract.acceptance != Acceptance::Pending || wait.is_zero() {
        couriers.deliver(std::slice::from_ref(&lead_id));
        return contract;
    }
    let watch = couriers.confirmations.watch(&lead_id);
    couriers.deliver(std::slice::from_ref(&lead_id));
    let deadline = std::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // This instance's confirmation wakes us at once; another
        // instance's shows in the row.
        let woken = actix_web::rt::time::timeout(left.min(CONFIRMATION_POLL), watch.confirmed())
            .await
            .is_ok();
        let row = state.store.find_lead(&lead_id).await;
        if let Ok(Some(row)) = &row {
            if woken || row.accepted_at.is_some() || left <= CONFIRMATION_POLL {
                return Contract {
                    replayed: contract.replayed,
                    ..contract_of_row(row)
                };
            }
        } else if left <= CONFIRMATION_POLL {
            return contract;
        }
    }
}

/// While intake waits for a confirmation, how often it looks at the row.
const CONFIRMATION_POLL: std::time::Duration = std::time::Duration::from_millis(250);

fn status_of(contract: &Contract) -> StatusCode {
    StatusCode::from_u16(contract.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

/// The contract as JSON; error answers also carry `error` and `message`.
fn contract_json(contract: &Contract, status: StatusCode) -> Value {
    let mut body = serde_json::to_value(contract).unwrap_or_default();
    let explanation = match (status.as_u16(), contract.acceptance, contract.lead_state) {
        (415, ..) => Some((
            "unsupported_media_type",
            "the body's content type is not supported; it was stored for review".to_string(),
        )),
        (_, Acceptance::Failed, _) => Some((
            "store_unavailable",
            "the lead could not be stored; send it again with the same idempotency key".to_string(),
        )),
        (422, _, Some(LeadState::Invalid)) => Some((
            "invalid_lead",
            format!(
                "the lead was stored for review but is not valid: {}",
                contract
                    .errors
                    .iter()
                    .map(|error| format!("{}: {}", error.field, error.message))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        )),
        _ => None,
    };
    if let (Some((code, message)), Value::Object(map)) = (explanation, &mut body) {
        map.insert("error".into(), Value::String(code.into()));
        map.insert("message".into(), Value::String(message));
    }
    body
}

fn request_meta(request: &HttpRequest, settings: &Settings) -> RequestMeta {
    RequestMeta {
        referer: header_text(request, header::REFERER.as_str()),
        user_agent: header_text(request, header::USER_AGENT.as_str()),
        client_ip: client_ip(request, settings).map(|ip| ip.to_string()),
        received_at: chrono::Utc::now(),
        test_header: header_text(request, "x-test-lead")
            .is_some_and(|value| matches!(value.trim(), "1" | "true" | "yes")),
    }
}

/// The peer, or the client a trusted proxy names (see `client_ip`).
fn client_ip(request: &HttpRequest, settings: &Settings) -> Option<IpAddr> {
    crate::client_ip::client_ip(
        request.peer_addr().map(|address| address.ip()),
        request.headers(),
        &settings.server.trusted_proxies,
    )
}

fn header_text(request: &HttpRequest, name: &str) -> Option<String> {
    request
        .headers()
        .get(name)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
}

/// A plain browser form post: it asked for HTML and not for JSON.
fn wants_html(request: &HttpRequest) -> bool {
    let accept = header_text(request, header::ACCEPT.as_str()).unwrap_or_default();
    accept.contains("text/html") && !accept.contains("application/json")
}

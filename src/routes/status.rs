//! `GET /v1/status`: every buyer (as `/v1/buyers`), lead counts by state,
//! the spool backlog and routing's width; and `GET /metrics`. Public unless
//! `server.status_public = false`; they hold no personal data. While the
//! database is down they still answer, with the buyers' live state and the
//! spool (and `leads: null`).

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use utoipa::ToSchema;

use chrono::{DateTime, Utc};

use super::auth::Admin;
use super::buyers::{buyer_views, BuyerView};
use super::error::{ApiError, ErrorBody};
use super::figures::{start_of_day, Figures};
use super::state::AppState;
use crate::actors::courier::ChannelHealth;
use crate::domain::LeadState;
use crate::metrics::Snapshot;
use crate::store::Money;

/// Leads by state.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct LeadCounts {
    received: u64,
    routing: u64,
    sold: u64,
    unsold: u64,
    unknown: u64,
    invalid: u64,
    duplicate: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Backlog {
    pending: u64,
}

/// How many waterfalls routing may run now: `widest` (twice the enabled
/// buyers' slots, 256 to 4096) with no lead arriving; while leads arrive
/// at most half of it (or 256), and down to 32 while routing yields to
/// intake.
#[derive(Debug, Serialize, ToSchema)]
pub struct RoutingWidth {
    width: u64,
    widest: u64,
}

/// `GET /v1/status`.
#[derive(Debug, Serialize, ToSchema)]
pub struct StatusView {
    buyers: Vec<BuyerView>,
    /// Each notify channel and event sink: failures since its last
    /// confirmation, deliveries waiting and given up.
    notify: Vec<ChannelHealth>,
    /// Null while the database is unreachable.
    leads: Option<LeadCounts>,
    /// When the lead counts (and the buyers' sales and outcome counts)
    /// were read: at most a second ago, longer under a backlog large
    /// enough to make counting slow (see `figures`). Null while the
    /// database is unreachable.
    counted_at: Option<DateTime<Utc>>,
    /// Invalid and unknown leads; null while the database is unreachable.
    review: Option<Backlog>,
    /// Leads in the spool, waiting for the database.
    spool: Backlog,
    /// Routing's width: narrower while it yields to intake.
    routing: RoutingWidth,
    /// `ok` or `unreachable`.
    database: String,
    /// Sales made today (UTC) and not returned: revenue, payout, margin.
    /// Business figures: only with the admin token (null without it, and
    /// while the database is unreachable).
    today: Option<Money>,
}

/// Buyers, lead counts, the review queue and the spool backlog.
#[utoipa::path(get, path = "/v1/status", tag = "status",
    responses(
        (status = 200, description = "The status page's data; no personal data", body = StatusView),
        (status = 401, description = "status_public = false and no admin token", body = ErrorBody),
    ))]
pub async fn status(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    check_access(&request, &state)?;
    Ok(HttpResponse::Ok().json(build(&request, &state).await))
}

/// What `/v1/status` answers, as JSON, or `None` when the request may not
/// see it (`status_public = false` and no admin token).
pub async fn status_view(request: &HttpRequest, state: &AppState) -> Option<serde_json::Value> {
    check_access(request, state).ok()?;
    serde_json::to_value(build(request, state).await).ok()
}

async fn build(request: &HttpRequest, state: &AppState) -> StatusView {
    let settings = state.settings();
    let figures = state.figures.get(&state.store, &settings).await;
    if let Err(error) = &figures {
        tracing::warn!(%error, "status without database figures: database unreachable");
    }
    let database = if figures.is_ok() { "ok" } else { "unreachable" };
    let figures = figures.ok();
    let buyers = buyer_views(state, figures.as_deref().unwrap_or(&Figures::default()));
    let leads = figures.as_ref().map(|figures| {
        let count =
            |lead_state: LeadState| figures.leads.get(lead_state.as_str()).copied().unwrap_or(0);
        LeadCounts {
            received: count(LeadState::Received),
            routing: count(LeadState::Routing),
            sold: count(LeadState::Sold),
            unsold: count(LeadState::Unsold),
            unknown: count(LeadState::Unknown),
            invalid: count(LeadState::Invalid),
            duplicate: count(LeadState::Duplicate),
        }
    });
    let set_aside = figures.as_ref().map_or(0, |figures| figures.set_aside);
    let today = match Admin::check(request) {
        Ok(_) => state.store.money_since(start_of_day(Utc::now())).await.ok(),
        Err(_) => None,
    };
    let review = leads.as_ref().map(|leads| Backlog {
        pending: leads.invalid + leads.unknown + set_aside,
    });
    StatusView {
        buyers,
        notify: state.tree.couriers.health(&state.settings()),
        leads,
        counted_at: figures.as_ref().map(|figures| figures.read_at),
        review,
        spool: Backlog {
            pending: state.tree.spool.pending() as u64,
        },
        routing: RoutingWidth {
            width: state.metrics.routing_width_now(),
            widest: state.metrics.routing_widest_now(),
        },
        database: database.into(),
        today,
    }
}

/// `GET /metrics`: OpenMetrics text for Prometheus.
#[utoipa::path(get, path = "/metrics", tag = "status",
    responses(
        (status = 200, description = "Intake, attempts, circuits, leads by state, spool backlog", body = String, content_type = "application/openmetrics-text"),
        (status = 401, description = "status_public = false and no admin token", body = ErrorBody),
    ))]
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
        .figures
        .get(&state.store, &state.settings())
        .await
        .ok()
        .map(|figures| figures.leads.clone().into_iter().collect());
    let text = state.metrics.render(Snapshot {
        circuits,
        leads,
        spool_pending: state.tree.spool.pending(),
        rate_limit_addresses: state.limiter.addresses(),
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

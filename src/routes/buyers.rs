//! `GET /v1/buyers` (each buyer's circuit, load, cap use and recent outcomes) and
//! `POST /v1/buyers/{id}/circuit` (an operator opens or closes a circuit).

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::auth::Admin;
use super::error::{ApiError, ErrorBody};
use super::figures::Figures;
use super::state::AppState;
use crate::actors::buyer::ForceCircuit;
use crate::buyer::board::BuyerStatus;
use crate::buyer::breaker::CircuitState;
use crate::buyer::schedule::takes_leads;
use crate::store::{CapUse, OutcomeCounts};

#[derive(Debug, Serialize, ToSchema)]
pub struct BuyerView {
    #[serde(flatten)]
    status: BuyerStatus,
    sold_today: u64,
    counts: OutcomeCounts,
    /// Each configured cap in its current UTC period: posts reserved
    /// (sold, in flight, or of unknown fate) against the limit.
    caps: Vec<CapUse>,
    /// Whether its `schedule` takes leads now (true without a schedule).
    open_now: bool,
}

#[utoipa::path(get, path = "/v1/buyers", tag = "buyers", security(("admin" = [])),
    responses(
        (status = 200, description = "Each buyer's circuit, load, sales today and 24 h outcome counts", body = Vec<BuyerView>),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ))]
pub async fn list(_: Admin, state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let figures = Figures::read(&state.store, &state.settings()).await?;
    Ok(HttpResponse::Ok().json(buyer_views(&state, &figures)))
}

/// Every configured buyer as `/v1/buyers` and `/v1/status` show it: its
/// live state from the board, with `figures` from the database.
pub fn buyer_views(state: &AppState, figures: &Figures) -> Vec<BuyerView> {
    let settings = state.settings();
    let now = settings.clock.now();
    settings
        .buyers
        .iter()
        .filter_map(|buyer| Some((buyer, state.tree.board.get(&buyer.id)?)))
        .map(|(buyer, status)| BuyerView {
            sold_today: figures
                .sold_today
                .get(&status.id)
                .copied()
                .unwrap_or_default(),
            counts: figures
                .outcomes
                .get(&status.id)
                .cloned()
                .unwrap_or_default(),
            caps: figures.caps.get(&status.id).cloned().unwrap_or_default(),
            open_now: takes_leads(buyer, now),
            status,
        })
        .collect()
}

/// The circuit states an operator can set.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CircuitOverride {
    Open,
    Closed,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct CircuitRequest {
    state: CircuitOverride,
}

/// An operator opens or closes a buyer's circuit.
#[utoipa::path(post, path = "/v1/buyers/{id}/circuit", tag = "buyers", security(("admin" = [])),
    params(("id" = String, Path, description = "The buyer id")),
    request_body = CircuitRequest,
    responses(
        (status = 200, description = "The buyer's status after the change", body = BuyerStatus),
        (status = 400, description = "state is not open or closed", body = ErrorBody),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
        (status = 404, description = "No such buyer", body = ErrorBody),
    ))]
pub async fn set_circuit(
    _: Admin,
    path: web::Path<String>,
    body: web::Json<CircuitRequest>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let wanted = match body.state {
        CircuitOverride::Open => CircuitState::Open,
        CircuitOverride::Closed => CircuitState::Closed,
    };
    let buyer = state
        .tree
        .buyers
        .get(path.as_str())
        .ok_or_else(|| ApiError::NotFound(format!("buyer {:?}", path.as_str())))?;
    let status = buyer
        .addr
        .send(ForceCircuit { state: wanted })
        .await
        .map_err(|error| ApiError::Unavailable(format!("buyer actor: {error}")))?;
    Ok(HttpResponse::Ok().json(status))
}

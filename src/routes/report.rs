//! `GET /v1/report?from=&to=&by=source|buyer` (admin): leads, valid, sold,
//! sell-through, revenue, payout and margin per source or buyer for a
//! period (RFC 3339 bounds, UTC; by default today so far), computed in the
//! database (see `store::report`).

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::auth::Admin;
use super::error::{ApiError, ErrorBody};
use super::figures::start_of_day;
use super::state::AppState;
use crate::store::{ReportBy, ReportRow};

#[derive(Debug, Deserialize, IntoParams)]
pub struct ReportQuery {
    /// Start of the period (inclusive), RFC 3339; default: today 00:00 UTC.
    from: Option<DateTime<Utc>>,
    /// End of the period (exclusive), RFC 3339; default: now.
    to: Option<DateTime<Utc>>,
    /// `source` (default) or `buyer`.
    by: Option<Grouping>,
}

/// What the report is grouped by.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Grouping {
    Source,
    Buyer,
}

/// The report.
#[derive(Debug, Serialize, ToSchema)]
pub struct Report {
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    by: Grouping,
    /// One row per source or buyer, by id.
    rows: Vec<ReportRow>,
}

#[utoipa::path(get, path = "/v1/report", tag = "operations", security(("admin" = [])),
    params(ReportQuery),
    responses(
        (status = 200, description = "Figures per source or buyer for the period", body = Report),
        (status = 400, description = "A bad period or grouping", body = ErrorBody),
        (status = 401, description = "Missing or wrong admin token", body = ErrorBody),
        (status = 503, description = "The database is unavailable", body = ErrorBody),
    ))]
pub async fn report(
    _: Admin,
    query: web::Query<ReportQuery>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let query = query.into_inner();
    let grouping = query.by.unwrap_or(Grouping::Source);
    let by = match grouping {
        Grouping::Source => ReportBy::Source,
        Grouping::Buyer => ReportBy::Buyer,
    };
    let to = query.to.unwrap_or_else(Utc::now);
    let from = query.from.unwrap_or_else(|| start_of_day(to));
    if from > to {
        return Err(ApiError::BadRequest("from must not be after to".into()));
    }
    let rows = state.store.report(from, to, by).await?;
    Ok(HttpResponse::Ok().json(Report {
        from,
        to,
        by: grouping,
        rows,
    }))
}

//! Money per source or buyer (`GET /v1/report`), summed in the database:
//! leads received in the period (and of them the valid ones: neither
//! invalid nor duplicate; for a buyer, the leads it was pinged or posted),
//! and the sales made in the period that were not returned, their revenue
//! (sale prices) and payout (what their sources are paid, fixed on each
//! sale). A return reverses its sale's revenue and payout.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use entity::{attempt, lead, sale};
use sea_orm::sea_query::{Alias, Expr, Func, Query, SelectStatement};
use sea_orm::{ConnectionTrait, DbErr, ExprTrait};
use serde::Serialize;

use super::handle::Store;
use crate::domain::{AttemptKind, LeadState};

/// What a report is grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportBy {
    Source,
    Buyer,
}

/// One source's or buyer's figures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ReportRow {
    /// The source or buyer id.
    pub id: String,
    pub leads: u64,
    pub valid: u64,
    pub sold: u64,
    /// `sold / valid` (0 without valid leads).
    pub sell_through: f64,
    pub revenue: f64,
    pub payout: f64,
    /// `revenue - payout`.
    pub margin: f64,
}

/// The sales (not returned) made in a period, as totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Money {
    pub revenue: f64,
    pub payout: f64,
    pub margin: f64,
}

impl Store {
    /// The report for `[from, to)`, one row per source or buyer, by id.
    pub async fn report(
        &self,
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        by: ReportBy,
    ) -> Result<Vec<ReportRow>, DbErr> {
        let mut rows: BTreeMap<String, ReportRow> = BTreeMap::new();
        fn row(rows: &mut BTreeMap<String, ReportRow>, id: String) -> &mut ReportRow {
            rows.entry(id.clone()).or_insert_with(|| ReportRow {
                id,
                ..ReportRow::default()
            })
        }
        for counted in self.query(lead_counts(from, to, by)).await? {
            let entry = row(&mut rows, counted.try_get::<String>("", "id")?);
            entry.leads = count(&counted, "leads")?;
            entry.valid = count(&counted, "valid")?;
        }
        for sold in self.query(sales(from, to, Some(by))).await? {
            let entry = row(&mut rows, sold.try_get::<String>("", "id")?);
            entry.sold = count(&sold, "sold")?;
            entry.revenue = amount(&sold, "revenue")?;
            entry.payout = amount(&sold, "payout")?;
        }
        Ok(rows
            .into_values()
            .map(|mut row| {
                row.margin = row.revenue - row.payout;
                row.sell_through = if row.valid == 0 {
                    0.0
                } else {
                    row.sold as f64 / row.valid as f64
                };
                row
            })
            .collect())
    }

    /// Revenue, payout and margin of the sales made since `since`.
    pub async fn money_since(&self, since: DateTime<Utc>) -> Result<Money, DbErr> {
        let totals = self.query(sales(since, Utc::now(), None)).await?;
        let Some(totals) = totals.first() else {
            return Ok(Money::default());
        };
        let (revenue, payout) = (amount(totals, "revenue")?, amount(totals, "payout")?);
        Ok(Money {
            revenue,
            payout,
            margin: revenue - payout,
        })
    }

    async fn query(&self, statement: SelectStatement) -> Result<Vec<sea_orm::QueryResult>, DbErr> {
        self.db.query_all(&statement).await
    }
}

/// Leads received in the period per source (`leads`, `valid`), or per
/// buyer the leads it was pinged or posted (both counts alike).
fn lead_counts(from: DateTime<Utc>, to: DateTime<Utc>, by: ReportBy) -> SelectStatement {
    match by {
        ReportBy::Source => {
            let valid = Expr::case(
                Expr::col(lead::Column::State)
                    .is_not_in([LeadState::Invalid.as_str(), LeadState::Duplicate.as_str()]),
                1,
            )
            .finally(0);
            Query::select()
                .expr_as(Expr::col(lead::Column::SourceId), Alias::new("id"))
                .expr_as(Expr::col(lead::Column::Id).count(), Alias::new("leads"))
                .expr_as(Func::sum(valid), Alias::new("valid"))
                .from(lead::Entity)
                .and_where(Expr::col(lead::Column::ReceivedAt).gte(from))
                .and_where(Expr::col(lead::Column::ReceivedAt).lt(to))
                .group_by_col(lead::Column::SourceId)
                .to_owned()
        }
        ReportBy::Buyer => {
            let offered = Func::count_distinct(Expr::col(attempt::Column::LeadId));
            Query::select()
                .expr_as(Expr::col(attempt::Column::BuyerId), Alias::new("id"))
                .expr_as(offered.clone(), Alias::new("leads"))
                .expr_as(offered, Alias::new("valid"))
                .from(attempt::Entity)
                .and_where(
                    Expr::col(attempt::Column::Kind)
                        .is_in([AttemptKind::PING.as_str(), AttemptKind::POST.as_str()]),
                )
                .and_where(Expr::col(attempt::Column::StartedAt).gte(from))
                .and_where(Expr::col(attempt::Column::StartedAt).lt(to))
                .group_by_col(attempt::Column::BuyerId)
                .to_owned()
        }
    }
}

/// Sales made in the period and not returned (`sold`, `revenue`,
/// `payout`), per source or buyer, or in total.
fn sales(from: DateTime<Utc>, to: DateTime<Utc>, by: Option<ReportBy>) -> SelectStatement {
    let mut query = Query::select();
    query
        .expr_as(
            Expr::col((sale::Entity, sale::Column::Id)).count(),
            Alias::new("sold"),
        )
        .expr_as(
            Func::sum(Expr::col((sale::Entity, sale::Column::Price))),
            Alias::new("revenue"),
        )
        .expr_as(
            Func::sum(Expr::col((sale::Entity, sale::Column::Payout))),
            Alias::new("payout"),
        )
        .from(sale::Entity)
        .and_where(Expr::col((sale::Entity, sale::Column::SoldAt)).gte(from))
        .and_where(Expr::col((sale::Entity, sale::Column::SoldAt)).lt(to))
        .and_where(Expr::col((sale::Entity, sale::Column::ReturnedAt)).is_null());
    match by {
        Some(ReportBy::Source) => {
            query
                .expr_as(
                    Expr::col((lead::Entity, lead::Column::SourceId)),
                    Alias::new("id"),
                )
                .inner_join(
                    lead::Entity,
                    Expr::col((lead::Entity, lead::Column::Id))
                        .equals((sale::Entity, sale::Column::LeadId)),
                )
                .group_by_col((lead::Entity, lead::Column::SourceId));
        }
        Some(ReportBy::Buyer) => {
            query
                .expr_as(
                    Expr::col((sale::Entity, sale::Column::BuyerId)),
                    Alias::new("id"),
                )
                .group_by_col((sale::Entity, sale::Column::BuyerId));
        }
        None => {}
    }
    query.to_owned()
}

fn count(row: &sea_orm::QueryResult, column: &str) -> Result<u64, DbErr> {
    Ok(u64::try_from(row.try_get::<Option<i64>>("", column)?.unwrap_or(0)).unwrap_or(0))
}

fn amount(row: &sea_orm::QueryResult, column: &str) -> Result<f64, DbErr> {
    let sum = row.try_get::<Option<f64>>("", column)?.unwrap_or(0.0);
    Ok(if sum.is_finite() { sum } else { 0.0 })
}

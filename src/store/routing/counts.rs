//! What the buyers endpoint and the status page count per buyer (attempt
//! outcomes, sales), and the alerts kept.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use entity::{alert, attempt, sale};
use sea_orm::{ActiveValue::Set, ColumnTrait, DbErr, EntityTrait, QueryFilter, QuerySelect};

use super::requeue::BUYER_KINDS;
use crate::domain::{new_id, AttemptOutcome, CallOutcome};
use crate::store::handle::Store;

/// Outcome counts of one buyer's attempts.
#[derive(Debug, Clone, Default, serde::Serialize, utoipa::ToSchema)]
pub struct OutcomeCounts {
    pub accepted: u64,
    pub rejected: u64,
    pub error: u64,
    pub timeout: u64,
    pub skipped: u64,
}

impl Store {
    /// Sales per buyer since `since`.
    pub async fn sales_by_buyer(
        &self,
        since: DateTime<Utc>,
    ) -> Result<HashMap<String, u64>, DbErr> {
        let rows: Vec<(String, i64)> = sale::Entity::find()
            .select_only()
            .column(sale::Column::BuyerId)
            .column_as(sale::Column::Id.count(), "sales")
            .filter(sale::Column::SoldAt.gte(since))
            .filter(sale::Column::ReturnedAt.is_null())
            .group_by(sale::Column::BuyerId)
            .into_tuple()
            .all(&self.db)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(buyer, count)| (buyer, count as u64))
            .collect())
    }

    /// Attempt outcomes per buyer since `since`.
    pub async fn outcome_counts(
        &self,
        since: DateTime<Utc>,
    ) -> Result<HashMap<String, OutcomeCounts>, DbErr> {
        let rows: Vec<(String, String, i64)> = attempt::Entity::find()
            .select_only()
            .column(attempt::Column::BuyerId)
            .column(attempt::Column::Outcome)
            .column_as(attempt::Column::Id.count(), "attempts")
            .filter(attempt::Column::StartedAt.gte(since))
            .filter(attempt::Column::Kind.is_in(BUYER_KINDS))
            .group_by(attempt::Column::BuyerId)
            .group_by(attempt::Column::Outcome)
            .into_tuple()
            .all(&self.db)
            .await?;
        let mut counts: HashMap<String, OutcomeCounts> = HashMap::new();
        for (buyer, outcome, count) in rows {
            let entry = counts.entry(buyer).or_default();
            let count = count as u64;
            match AttemptOutcome::parse(&outcome) {
                Some(AttemptOutcome::Call(CallOutcome::Accepted)) => entry.accepted += count,
                Some(AttemptOutcome::Call(CallOutcome::Rejected)) => entry.rejected += count,
                Some(AttemptOutcome::Call(CallOutcome::Error)) => entry.error += count,
                Some(AttemptOutcome::Call(CallOutcome::Timeout)) => entry.timeout += count,
                Some(AttemptOutcome::Skip(_)) => entry.skipped += count,
                Some(AttemptOutcome::InFlight) | None => {}
            }
        }
        Ok(counts)
    }

    /// Keeps an alert.
    pub async fn record_alert(
        &self,
        kind: &str,
        buyer_id: Option<&str>,
        lead_id: Option<&str>,
        message: &str,
        notified: bool,
    ) -> Result<(), DbErr> {
        alert::Entity::insert(alert::ActiveModel {
            notified: Set(notified),
            id: Set(new_id()),
            kind: Set(kind.into()),
            buyer_id: Set(buyer_id.map(str::to_string)),
            lead_id: Set(lead_id.map(str::to_string)),
            message: Set(message.into()),
            created_at: Set(Utc::now()),
        })
        .exec_without_returning(&self.db)
        .await?;
        Ok(())
    }
}

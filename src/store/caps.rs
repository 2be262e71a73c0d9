//! Caps as reservations (SPEC section 7): a post that could become a sale
//! first takes a slot of each of its buyer's caps (`cap_use`, one counter
//! per buyer and UTC hour, day or month) with a conditional upsert, in the
//! same commit as its attempt row. A rejected or failed post gives its
//! slots back with its answer; a sale, a timed-out post (it may have sold)
//! and an interrupted one keep them, until an operator decides the lead: a
//! resolve keeps one slot for the sale it records and gives the other
//! unanswered posts' back, and a retried post that sells gives back those
//! of the earlier unanswered posts. So caps hold exactly, with any number
//! of leads in flight on any number of instances. How full the counters
//! are, and their reconciling with the slots held, is `cap_counters`.

use chrono::{DateTime, Datelike, Timelike, Utc};
use entity::{attempt, cap_use};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, ExprTrait, QueryFilter, Set};
use serde::Serialize;

use super::snapshots;
use crate::config::{buyer_from_snapshot, BuyerSettings};

/// The periods a cap counts sales in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CapPeriod {
    Hour,
    Day,
    Month,
}

impl CapPeriod {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::Hour => "hour",
            Self::Day => "day",
            Self::Month => "month",
        }
    }

    /// The start of the period (UTC) that holds `at`.
    pub(super) fn start(self, at: DateTime<Utc>) -> DateTime<Utc> {
        let hour = at
            .with_minute(0)
            .and_then(|t| t.with_second(0))
            .and_then(|t| t.with_nanosecond(0))
            .unwrap_or(at);
        let day = hour.with_hour(0).unwrap_or(hour);
        match self {
            Self::Hour => hour,
            Self::Day => day,
            Self::Month => day.with_day(1).unwrap_or(day),
        }
    }
}

/// One cap of one buyer in the period that holds a moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapSlot {
    pub buyer_id: String,
    pub period: CapPeriod,
    pub start: DateTime<Utc>,
    pub limit: u32,
}

impl CapSlot {
    /// The caps a post to this buyer at `at` takes a slot of (caps of 0 are off).
    pub fn for_post(settings: &BuyerSettings, at: DateTime<Utc>) -> Vec<CapSlot> {
        [
            (CapPeriod::Hour, settings.hourly_cap),
            (CapPeriod::Day, settings.daily_cap),
            (CapPeriod::Month, settings.monthly_cap),
        ]
        .into_iter()
        .filter(|(_, limit)| *limit > 0)
        .map(|(period, limit)| CapSlot {
            buyer_id: settings.id.clone(),
            period,
            start: period.start(at),
            limit,
        })
        .collect()
    }
}

/// The slots a post took: its snapshot's caps in the periods that held its
/// start (reservations are made at the row's `started_at`). None when the
/// snapshot cannot be read: its slots then stay taken.
pub(super) async fn slots_of_post(
    db: &impl ConnectionTrait,
    post: &attempt::Model,
) -> Result<Vec<CapSlot>, DbErr> {
    let settings = snapshots::read_one(db, &post.snapshot_id)
        .await?
        .map(|snapshot| buyer_from_snapshot(&snapshot));
    Ok(match settings {
        Some(Ok(settings)) => CapSlot::for_post(&settings, post.started_at),
        _ => Vec::new(),
    })
}

/// Takes a slot of every cap, or of none: false when one is full.
pub(super) async fn reserve(db: &impl ConnectionTrait, slots: &[CapSlot]) -> Result<bool, DbErr> {
    for (taken, slot) in slots.iter().enumerate() {
        let used = Expr::col((cap_use::Entity, cap_use::Column::Used));
        let reserved = cap_use::Entity::insert(cap_use::ActiveModel {
            buyer_id: Set(slot.buyer_id.clone()),
            period: Set(slot.period.as_str().into()),
            period_start: Set(slot.start),
            used: Set(1),
        })
        .on_conflict(
            OnConflict::columns([
                cap_use::Column::BuyerId,
                cap_use::Column::Period,
                cap_use::Column::PeriodStart,
            ])
            .value(cap_use::Column::Used, used.clone().add(1))
            .action_and_where(used.lt(i64::from(slot.limit)))
            .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
        if reserved == 0 {
            release(db, &slots[..taken]).await?;
            return Ok(false);
        }
    }
    Ok(true)
}

/// Gives slots back (a post that was rejected or failed, a returned sale).
pub(super) async fn release(db: &impl ConnectionTrait, slots: &[CapSlot]) -> Result<(), DbErr> {
    for slot in slots {
        cap_use::Entity::update_many()
            .col_expr(
                cap_use::Column::Used,
                Expr::col(cap_use::Column::Used).sub(1),
            )
            .filter(cap_use::Column::BuyerId.eq(slot.buyer_id.as_str()))
            .filter(cap_use::Column::Period.eq(slot.period.as_str()))
            .filter(cap_use::Column::PeriodStart.eq(slot.start))
            .filter(cap_use::Column::Used.gt(0))
            .exec(db)
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_start_at_the_utc_hour_day_and_month() {
        let at: DateTime<Utc> = "2026-12-17T15:42:07.5Z".parse().unwrap();
        let start = |period: CapPeriod| period.start(at).to_rfc3339();
        assert_eq!(start(CapPeriod::Hour), "2026-12-17T15:00:00+00:00");
        assert_eq!(start(CapPeriod::Day), "2026-12-17T00:00:00+00:00");
        assert_eq!(start(CapPeriod::Month), "2026-12-01T00:00:00+00:00");
    }
}

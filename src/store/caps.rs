//! Caps as reservations (SPEC section 7): a post that could become a sale
//! first takes a slot of each of its buyer's caps (`cap_use`, one counter
//! per buyer and UTC hour, day or month) with a conditional upsert, in the
//! same commit as its attempt row. A rejected or failed post gives its
//! slots back with its answer; a sale, a timed-out post (it may have sold)
//! and an interrupted one keep them, until an operator decides the lead: a
//! resolve keeps one slot for the sale it records and gives the other
//! unanswered posts' back, and a retried post that sells gives back those
//! of the earlier unanswered posts. So caps hold exactly, with any number
//! of leads in flight on any number of instances. A buyer's counters are
//! reconciled with the slots held in the database when its actor starts
//! and at each reload that changes it (`reconcile_caps`): a cap that was
//! off took no slots meanwhile.

use chrono::{DateTime, Datelike, Timelike, Utc};
use entity::{attempt, cap_use, lead, sale};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DatabaseTransaction, DbErr, EntityTrait, ExprTrait,
    JoinType, PaginatorTrait, QueryFilter, QuerySelect, Set, TransactionTrait,
};
use serde::Serialize;

use super::{snapshots, Store};
use crate::config::{buyer_from_snapshot, BuyerSettings};
use crate::domain::{AttemptKind, AttemptOutcome, CallOutcome, LeadState};

/// The periods a cap counts sales in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CapPeriod {
    Hour,
    Day,
    Month,
}

impl CapPeriod {
    fn as_str(self) -> &'static str {
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

/// A cap's use now, for the buyers endpoint and the status page.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CapUse {
    pub period: CapPeriod,
    pub used: u32,
    pub limit: u32,
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

/// The counter row of a slot.
fn counter_of(slot: &CapSlot) -> Condition {
    Condition::all()
        .add(cap_use::Column::BuyerId.eq(slot.buyer_id.as_str()))
        .add(cap_use::Column::Period.eq(slot.period.as_str()))
        .add(cap_use::Column::PeriodStart.eq(slot.start))
}

/// Creates the slot's counter if missing, and locks it until the commit
/// either way: a no-op upsert (on SQLite, the write lock at once).
async fn lock_counter(txn: &DatabaseTransaction, slot: &CapSlot) -> Result<(), DbErr> {
    let used = Expr::col((cap_use::Entity, cap_use::Column::Used));
    cap_use::Entity::insert(cap_use::ActiveModel {
        buyer_id: Set(slot.buyer_id.clone()),
        period: Set(slot.period.as_str().into()),
        period_start: Set(slot.start),
        used: Set(0),
    })
    .on_conflict(
        OnConflict::columns([
            cap_use::Column::BuyerId,
            cap_use::Column::Period,
            cap_use::Column::PeriodStart,
        ])
        .value(cap_use::Column::Used, used)
        .to_owned(),
    )
    .exec_without_returning(txn)
    .await?;
    Ok(())
}

/// The slots of the buyer's cap held in the slot's period (see
/// `Store::reconcile_caps`).
async fn held_slots(txn: &DatabaseTransaction, slot: &CapSlot) -> Result<u64, DbErr> {
    let sales = sale::Entity::find()
        .filter(sale::Column::BuyerId.eq(slot.buyer_id.as_str()))
        .filter(sale::Column::SoldAt.gte(slot.start))
        .filter(sale::Column::ReturnedAt.is_null())
        .count(txn)
        .await?;
    let posts = || {
        attempt::Entity::find()
            .filter(attempt::Column::BuyerId.eq(slot.buyer_id.as_str()))
            .filter(attempt::Column::Kind.eq(AttemptKind::POST.as_str()))
            .filter(attempt::Column::StartedAt.gte(slot.start))
    };
    let in_flight = posts()
        .filter(attempt::Column::Outcome.eq(AttemptOutcome::InFlight.as_str()))
        .count(txn)
        .await?;
    let kept = [CallOutcome::Timeout, CallOutcome::Accepted]
        .map(|outcome| AttemptOutcome::Call(outcome).as_str());
    let started = Expr::col((attempt::Entity, attempt::Column::StartedAt));
    let history_from = Expr::col((lead::Entity, lead::Column::HistoryFrom));
    let undecided = posts()
        .filter(attempt::Column::Outcome.is_in(kept))
        .join(
            JoinType::InnerJoin,
            attempt::Entity::belongs_to(lead::Entity)
                .from(attempt::Column::LeadId)
                .to(lead::Column::Id)
                .into(),
        )
        .filter(lead::Column::State.ne(LeadState::Sold.as_str()))
        .filter(
            Condition::any()
                .add(history_from.clone().is_null())
                .add(started.gte(history_from)),
        )
        .count(txn)
        .await?;
    Ok(sales + in_flight + undecided)
}

impl Store {
    /// How full each of these caps is.
    pub async fn cap_use(&self, slots: &[CapSlot]) -> Result<Vec<CapUse>, DbErr> {
        let mut uses = Vec::with_capacity(slots.len());
        for slot in slots {
            let used = cap_use::Entity::find()
                .filter(cap_use::Column::BuyerId.eq(slot.buyer_id.as_str()))
                .filter(cap_use::Column::Period.eq(slot.period.as_str()))
                .filter(cap_use::Column::PeriodStart.eq(slot.start))
                .one(&self.db)
                .await?
                .map_or(0, |row| std::cmp::max(row.used, 0) as u32);
            uses.push(CapUse {
                period: slot.period,
                used,
                limit: slot.limit,
            });
        }
        Ok(uses)
    }

    /// Sets each cap's counter for its current period to the slots the
    /// database says are held in it, whatever the configuration did in
    /// between (a cap removed, restored, raised or lowered: posts made
    /// while a cap was off took no slot of it). Held: the sales not
    /// returned, the posts in flight, and the posts that got no answer (or
    /// whose acceptance has no sale yet) in the current history of a lead
    /// not sold. Each counter is locked first (an upsert), then counted,
    /// then set, in one transaction: a post reserving at the same time
    /// either committed before the lock (and is counted) or waits for it
    /// (and then counts on from the reconciled value). A counter above the
    /// cap (a cap lowered below the sales made) refuses every post.
    pub async fn reconcile_caps(&self, slots: &[CapSlot]) -> Result<(), DbErr> {
        for slot in slots {
            let txn = self.db.begin().await?;
            lock_counter(&txn, slot).await?;
            let held = held_slots(&txn, slot).await?;
            cap_use::Entity::update_many()
                .col_expr(
                    cap_use::Column::Used,
                    Expr::value(i32::try_from(held).unwrap_or(i32::MAX)),
                )
                .filter(counter_of(slot))
                .exec(&txn)
                .await?;
            txn.commit().await?;
        }
        Ok(())
    }

    /// Whether a cap is full already (a read, to skip a buyer before its
    /// ping; the reservation before the post is what holds).
    pub async fn cap_reached(&self, slots: &[CapSlot]) -> Result<bool, DbErr> {
        Ok(self
            .cap_use(slots)
            .await?
            .iter()
            .any(|cap| cap.used >= cap.limit))
    }
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

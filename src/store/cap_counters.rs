//! Buyers' cap counters (`cap_use` rows): how full they are (for the
//! buyers endpoint, the status page and a walk's check before a ping), and
//! reconciling a buyer's counters with the slots the database says are
//! held, when its actor starts and at each reload that changes it
//! (`reconcile_caps`): a cap that was off took no slots meanwhile.

use entity::{attempt, cap_use, lead, sale};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{
    ColumnTrait, Condition, DatabaseTransaction, DbErr, EntityTrait, ExprTrait, JoinType,
    PaginatorTrait, QueryFilter, QuerySelect, Set, TransactionTrait,
};
use serde::Serialize;

use super::attempt_writer::AttemptWrite;
use super::caps::{CapPeriod, CapSlot};
use super::handle::Store;
use crate::domain::{AttemptKind, AttemptOutcome, CallOutcome, LeadState};

/// A cap's use now, for the buyers endpoint and the status page.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CapUse {
    pub period: CapPeriod,
    pub used: u32,
    pub limit: u32,
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
    /// (and then counts on from the reconciled value). Posts made under
    /// the settings before are committed first (the writer's barrier). A counter above the
    /// cap (a cap lowered below the sales made) refuses every post.
    pub async fn reconcile_caps(&self, slots: &[CapSlot]) -> Result<(), DbErr> {
        // A post whose row was made under the settings before this change
        // (a cap that was off took no slot) may still be on its way to
        // the database: counted once committed, so wait for every write
        // queued so far.
        self.attempts.write(AttemptWrite::Barrier).await?;
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

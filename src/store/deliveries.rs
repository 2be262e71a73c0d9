//! Deliveries' rows (SPEC section 7, notify channels and events): one
//! `deliveries` row per lead and target decides in the database whether the
//! lead may still be sent there. Planning inserts the rows a target is owed
//! (`ON CONFLICT DO NOTHING`, so every instance and sweep may plan the same
//! lead); a claim takes due rows under a lease with one conditional
//! `UPDATE … RETURNING`, so two instances never send one row at once; each
//! try is an attempt row written before the call; a confirmation is one
//! commit with the attempt's answer and the lead's flags, after which the
//! row is never claimed again.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use entity::{attempt, delivery, lead};
use sea_orm::sea_query::{Expr, LockBehavior, LockType, OnConflict, Query};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DbErr, EntityTrait, ExprTrait,
    QueryFilter, QueryOrder, QuerySelect, QueryTrait, TransactionTrait,
};
use serde_json::Value;

use super::among::among;
use super::handle::Store;
use crate::domain::{
    new_id, AttemptKind, AttemptOutcome, CallOutcome, ConfigSnapshot, INTERRUPTED,
};

/// Where a delivery row stands (`deliveries.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// May be sent (when due and not leased).
    Pending,
    /// The target confirmed it: never sent again.
    Confirmed,
    /// Given up after a day of tries: left for an operator.
    Abandoned,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Confirmed => "confirmed",
            Self::Abandoned => "abandoned",
        }
    }
}

/// One destination of deliveries: a notify channel, or one event of a sink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryTarget {
    pub kind: AttemptKind,
    /// The channel's or sink's id (also the attempt rows' `buyer_id`).
    pub channel: String,
    /// The event name, for an event sink.
    pub event: Option<String>,
}

impl DeliveryTarget {
    pub fn notify(channel: &str) -> Self {
        Self {
            kind: AttemptKind::Notify,
            channel: channel.to_string(),
            event: None,
        }
    }

    pub fn event(sink: &str, event: &str) -> Self {
        Self {
            kind: AttemptKind::Event,
            channel: sink.to_string(),
            event: Some(event.to_string()),
        }
    }

    /// The row's `target`: the channel id, or `sink:event`.
    pub fn key(&self) -> String {
        match &self.event {
            Some(event) => format!("{}:{event}", self.channel),
            None => self.channel.clone(),
        }
    }
}

/// A delivery this instance holds a lease on, with its lead.
#[derive(Debug, Clone)]
pub struct HeldDelivery {
    pub lead: lead::Model,
    /// Tries so far, this one included.
    pub tries: i32,
    pub created_at: DateTime<Utc>,
    /// The claim: a failed try lets the row go only while it still holds.
    pub token: String,
    /// When the lease began (this process's clock).
    pub claimed_at: Instant,
}

/// The answer to one try.
#[derive(Debug, Clone)]
pub struct DeliveryAnswer {
    pub outcome: CallOutcome,
    pub http_status: Option<u16>,
    pub duration: Duration,
    pub response_body: Option<String>,
    /// Why it failed, in plain words (kept on the row for operators).
    pub error: Option<String>,
}

/// What a confirmation does to the lead (a notify channel's role).
#[derive(Debug, Clone, Copy, Default)]
pub struct ConfirmEffect {
    pub manager_notified: bool,
    pub crm_synced: bool,
    /// A required channel: the contract becomes `accepted`.
    pub accepts: bool,
}

/// What to do after a failed try.
#[derive(Debug, Clone, Copy)]
pub enum AfterFailure {
    RetryAt(DateTime<Utc>),
    Abandon,
}

/// How many deliveries of a target stand where, for the status page.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryBacklog {
    pub pending: u64,
    pub abandoned: u64,
}

/// Most leads planned or claimed by one statement.
pub const PLAN_PAGE: u64 = 500;

/// How far one plan got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Planned {
    /// Rows inserted.
    pub rows: u64,
    /// The page was full: leads changed from this time on (the page's
    /// last) may still be owed.
    pub more_from: Option<DateTime<Utc>>,
}

fn due(target: &str, now: DateTime<Utc>) -> Condition {
    Condition::all()
        .add(delivery::Column::Target.eq(target))
        .add(delivery::Column::State.eq(DeliveryState::Pending.as_str()))
        .add(delivery::Column::NextTryAt.lte(now))
        .add(
            Condition::any()
                .add(delivery::Column::LeaseUntil.is_null())
                .add(delivery::Column::LeaseUntil.lt(now)),
        )
}

impl Store {
    /// Inserts the rows `target` is owed: leads matching `owed` that have
    /// none yet, at most a page, the least recently `changed` first (so a
    /// caller pages on from `more_from` and skips none). Looks first (a
    /// read), so an idle courier takes no write lock.
    pub async fn plan_deliveries(
        &self,
        target: &DeliveryTarget,
        owed: Condition,
        changed: lead::Column,
    ) -> Result<Planned, DbErr> {
        let key = target.key();
        let now = Utc::now();
        let has_row = Query::select()
            .expr(Expr::val(1))
            .from(delivery::Entity)
            .and_where(
                Expr::col((delivery::Entity, delivery::Column::LeadId))
                    .equals((lead::Entity, lead::Column::Id)),
            )
            .and_where(Expr::col((delivery::Entity, delivery::Column::Target)).eq(key.as_str()))
            .to_owned();
        let page: Vec<(String, DateTime<Utc>)> = lead::Entity::find()
            .select_only()
            .column(lead::Column::Id)
            .column(changed)
            .filter(owed.clone())
            .filter(Expr::exists(has_row.clone()).not())
            .order_by_asc(changed)
            .limit(PLAN_PAGE)
            .into_tuple()
            .all(&self.db)
            .await?;
        let Some((_, last)) = page.last() else {
            return Ok(Planned::default());
        };
        let more_from = (page.len() as u64 == PLAN_PAGE).then_some(*last);
        let owed_leads = Query::select()
            .column((lead::Entity, lead::Column::Id))
            .exprs([
                Expr::val(key.as_str()),
                Expr::val(target.kind.as_str()),
                Expr::val(target.channel.as_str()),
                Expr::val(target.event.clone()),
                Expr::val(DeliveryState::Pending.as_str()),
                Expr::val(0),
                Expr::val(now),
                Expr::val(now),
            ])
            .from(lead::Entity)
            .cond_where(owed)
            .and_where(super::any_of::any_of(
                self.db.get_database_backend(),
                lead::Column::Id,
                page.iter().map(|(id, _)| id.as_str()),
            ))
            .and_where(Expr::exists(has_row).not())
            .to_owned();
        let insert = Query::insert()
            .into_table(delivery::Entity)
            .columns([
                delivery::Column::LeadId,
                delivery::Column::Target,
                delivery::Column::Kind,
                delivery::Column::Channel,
                delivery::Column::Event,
                delivery::Column::State,
                delivery::Column::Tries,
                delivery::Column::NextTryAt,
                delivery::Column::CreatedAt,
            ])
            .select_from(owed_leads)
            .map_err(|error| DbErr::Custom(error.to_string()))?
            .on_conflict(
                OnConflict::columns([delivery::Column::LeadId, delivery::Column::Target])
                    .do_nothing()
                    .to_owned(),
            )
            .to_owned();
        let rows = self.db.execute(&insert).await?.rows_affected();
        Ok(Planned { rows, more_from })
    }

    /// Takes up to `limit` due rows of `target` (only these leads, if
    /// given) under a lease of `lease` and a fresh claim token, counting
    /// the try, and answers them with their leads. On PostgreSQL instances
    /// skip each other's rows (`SKIP LOCKED`); the UPDATE re-checks that
    /// each row is still due. Looks first (a read), so an idle courier
    /// takes no write lock.
    pub async fn claim_deliveries(
        &self,
        target: &DeliveryTarget,
        only: Option<&[String]>,
        limit: u64,
        lease: Duration,
    ) -> Result<Vec<HeldDelivery>, DbErr> {
        let key = target.key();
        let now = Utc::now();
        let mut candidates = delivery::Entity::find()
            .select_only()
            .column(delivery::Column::LeadId)
            .filter(due(&key, now));
        if let Some(lead_ids) = only {
            candidates = candidates
                .filter(delivery::Column::LeadId.is_in(lead_ids.iter().map(String::as_str)));
        }
        if candidates
            .clone()
            .into_tuple::<String>()
            .one(&self.db)
            .await?
            .is_none()
        {
            return Ok(Vec::new());
        }
        let token = crate::domain::new_id();
        let claimed_at = Instant::now();
        let candidates = candidates
            .order_by_asc(delivery::Column::NextTryAt)
            .limit(limit)
            .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
            .into_query();
        let until = now + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::MAX);
        let mut claim = delivery::Entity::update_many()
            .col_expr(delivery::Column::LeaseUntil, Expr::value(until))
            .col_expr(delivery::Column::ClaimToken, Expr::value(token.as_str()))
            .col_expr(
                delivery::Column::Tries,
                Expr::col(delivery::Column::Tries).add(1),
            )
            .filter(among(
                Expr::col((delivery::Entity, delivery::Column::LeadId)),
                candidates,
                self.db.get_database_backend(),
            ))
            .filter(due(&key, now))
            .into_query();
        claim.returning(Query::returning().columns([
            delivery::Column::LeadId,
            delivery::Column::Tries,
            delivery::Column::CreatedAt,
        ]));
        let claimed = self.db.query_all(&claim).await?;
        let mut held = Vec::with_capacity(claimed.len());
        let mut tries = std::collections::HashMap::new();
        for row in &claimed {
            let lead_id: String = row.try_get("", "lead_id")?;
            let count: i32 = row.try_get("", "tries")?;
            let created_at: DateTime<Utc> = row.try_get("", "created_at")?;
            tries.insert(lead_id, (count, created_at));
        }
        if tries.is_empty() {
            return Ok(held);
        }
        let leads = lead::Entity::find()
            .filter(lead::Column::Id.is_in(tries.keys().map(String::as_str)))
            .all(&self.db)
            .await?;
        for lead in leads {
            if let Some((count, created_at)) = tries.remove(&lead.id) {
                held.push(HeldDelivery {
                    lead,
                    tries: count,
                    created_at,
                    token: token.clone(),
                    claimed_at,
                });
            }
        }
        Ok(held)
    }

    /// Writes the attempt row of a try before it is sent; its id.
    pub async fn begin_delivery_attempt(
        &self,
        target: &DeliveryTarget,
        lead_id: &str,
        request: Value,
        snapshot: ConfigSnapshot,
        instance_id: &str,
    ) -> Result<String, DbErr> {
        let id = new_id();
        // The configuration first, in a commit of its own: it is never
        // changed, and the row that names it then never lacks it.
        let new_snapshot = self
            .snapshots
            .write_new(&self.db, std::iter::once(&snapshot))
            .await?;
        self.snapshots.committed(new_snapshot);
        attempt::Entity::insert(attempt::ActiveModel {
            id: Set(id.clone()),
            lead_id: Set(lead_id.to_string()),
            buyer_id: Set(target.channel.clone()),
            kind: Set(target.kind.as_str().to_string()),
            outcome: Set(AttemptOutcome::InFlight.as_str().to_string()),
            reason: Set(None),
            http_status: Set(None),
            started_at: Set(Utc::now()),
            duration_ms: Set(None),
            retry_of: Set(None),
            request: Set(request),
            response_body: Set(None),
            snapshot_id: Set(snapshot.id),
            bid: Set(None),
            ping_id: Set(None),
            instance_id: Set(Some(instance_id.to_string())),
        })
        .exec_without_returning(&self.db)
        .await?;
        Ok(id)
    }

    /// Records a confirmed try: the attempt's answer, the row `confirmed`
    /// (never claimed again) and the lead's flags, in one commit.
    pub async fn confirm_delivery(
        &self,
        target: &DeliveryTarget,
        lead_id: &str,
        attempt_id: &str,
        answer: &DeliveryAnswer,
        effect: ConfirmEffect,
    ) -> Result<(), DbErr> {
        let now = Utc::now();
        let txn = self.db.begin().await?;
        finish_attempt(&txn, attempt_id, answer).await?;
        delivery::Entity::update_many()
            .col_expr(
                delivery::Column::State,
                Expr::value(DeliveryState::Confirmed.as_str()),
            )
            .col_expr(delivery::Column::ConfirmedAt, Expr::value(now))
            .col_expr(
                delivery::Column::LeaseUntil,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .col_expr(
                delivery::Column::LastError,
                Expr::value(Option::<String>::None),
            )
            .filter(delivery::Column::LeadId.eq(lead_id))
            .filter(delivery::Column::Target.eq(target.key()))
            .exec(&txn)
            .await?;
        let mut flags = lead::Entity::update_many();
        if effect.manager_notified {
            flags = flags.col_expr(lead::Column::ManagerNotified, Expr::value(true));
        }
        if effect.crm_synced {
            flags = flags.col_expr(lead::Column::CrmSynced, Expr::value(true));
        }
        if effect.accepts {
            flags = flags.col_expr(
                lead::Column::AcceptedAt,
                Expr::col(lead::Column::AcceptedAt).if_null(now),
            );
        }
        if effect.manager_notified || effect.crm_synced || effect.accepts {
            flags
                .filter(lead::Column::Id.eq(lead_id))
                .exec(&txn)
                .await?;
        }
        txn.commit().await
    }

    /// Records a failed try: the attempt's answer, and the row let go until
    /// its next try, or abandoned.
    pub async fn delivery_failed(
        &self,
        target: &DeliveryTarget,
        held: &HeldDelivery,
        attempt_id: &str,
        answer: &DeliveryAnswer,
        after: AfterFailure,
    ) -> Result<(), DbErr> {
        let txn = self.db.begin().await?;
        finish_attempt(&txn, attempt_id, answer).await?;
        let mut row = delivery::Entity::update_many()
            .col_expr(
                delivery::Column::LeaseUntil,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .col_expr(
                delivery::Column::LastError,
                Expr::value(answer.error.clone()),
            );
        row = match after {
            AfterFailure::RetryAt(at) => row.col_expr(delivery::Column::NextTryAt, Expr::value(at)),
            AfterFailure::Abandon => row.col_expr(
                delivery::Column::State,
                Expr::value(DeliveryState::Abandoned.as_str()),
            ),
        };
        // Only while our claim holds: a late answer never lets go of a row
        // another instance took over.
        row.filter(delivery::Column::LeadId.eq(held.lead.id.as_str()))
            .filter(delivery::Column::Target.eq(target.key()))
            .filter(delivery::Column::State.eq(DeliveryState::Pending.as_str()))
            .filter(delivery::Column::ClaimToken.eq(held.token.as_str()))
            .exec(&txn)
            .await?;
        txn.commit().await
    }

    /// Settles the tries of a channel (or sink) left `in_flight` by an
    /// instance that stopped mid-call, for leads whose rows of it are no
    /// longer leased: `error`, reason `interrupted` (the row is tried again).
    pub async fn settle_interrupted_deliveries(
        &self,
        kind: AttemptKind,
        channel: &str,
    ) -> Result<u64, DbErr> {
        let leased = delivery::Entity::find()
            .select_only()
            .column(delivery::Column::LeadId)
            .filter(delivery::Column::Kind.eq(kind.as_str()))
            .filter(delivery::Column::Channel.eq(channel))
            .filter(delivery::Column::LeaseUntil.gt(Utc::now()))
            .into_query();
        let settled = attempt::Entity::update_many()
            .col_expr(
                attempt::Column::Outcome,
                Expr::value(AttemptOutcome::Call(CallOutcome::Error).as_str()),
            )
            .col_expr(attempt::Column::Reason, Expr::value(INTERRUPTED))
            .filter(attempt::Column::Kind.eq(kind.as_str()))
            .filter(attempt::Column::BuyerId.eq(channel))
            .filter(attempt::Column::Outcome.eq(AttemptOutcome::InFlight.as_str()))
            .filter(attempt::Column::LeadId.not_in_subquery(leased))
            .exec(&self.db)
            .await?;
        Ok(settled.rows_affected)
    }

    /// Makes this lead's unconfirmed deliveries (of `target` only, if
    /// given) due now; a given-up one starts a new day of tries.
    pub async fn deliver_again_now(
        &self,
        lead_id: &str,
        target: Option<&str>,
    ) -> Result<u64, DbErr> {
        let now = Utc::now();
        let rows = |state: DeliveryState| {
            let mut rows = delivery::Entity::update_many()
                .col_expr(
                    delivery::Column::State,
                    Expr::value(DeliveryState::Pending.as_str()),
                )
                .col_expr(delivery::Column::NextTryAt, Expr::value(now))
                .filter(delivery::Column::LeadId.eq(lead_id))
                .filter(delivery::Column::State.eq(state.as_str()));
            if let Some(target) = target {
                rows = rows.filter(delivery::Column::Target.eq(target));
            }
            rows
        };
        let revived = rows(DeliveryState::Abandoned)
            .col_expr(delivery::Column::CreatedAt, Expr::value(now))
            .exec(&self.db)
            .await?
            .rows_affected;
        let hurried = rows(DeliveryState::Pending)
            .exec(&self.db)
            .await?
            .rows_affected;
        Ok(revived + hurried)
    }

    /// Every delivery row of a lead.
    pub async fn deliveries_of(&self, lead_id: &str) -> Result<Vec<delivery::Model>, DbErr> {
        delivery::Entity::find()
            .filter(delivery::Column::LeadId.eq(lead_id))
            .order_by_asc(delivery::Column::Target)
            .all(&self.db)
            .await
    }

    /// Unconfirmed deliveries of a target, by state.
    pub async fn delivery_backlog(
        &self,
        target: &DeliveryTarget,
    ) -> Result<DeliveryBacklog, DbErr> {
        let rows: Vec<(String, i64)> = delivery::Entity::find()
            .select_only()
            .column(delivery::Column::State)
            .column_as(delivery::Column::LeadId.count(), "count")
            .filter(delivery::Column::Target.eq(target.key()))
            .filter(delivery::Column::State.is_in([
                DeliveryState::Pending.as_str(),
                DeliveryState::Abandoned.as_str(),
            ]))
            .group_by(delivery::Column::State)
            .into_tuple()
            .all(&self.db)
            .await?;
        let mut backlog = DeliveryBacklog::default();
        for (state, count) in rows {
            let count = u64::try_from(count).unwrap_or(0);
            if state == DeliveryState::Pending.as_str() {
                backlog.pending = count;
            } else if state == DeliveryState::Abandoned.as_str() {
                backlog.abandoned = count;
            }
        }
        Ok(backlog)
    }
}

async fn finish_attempt(
    txn: &impl ConnectionTrait,
    attempt_id: &str,
    answer: &DeliveryAnswer,
) -> Result<(), DbErr> {
    attempt::Entity::update_many()
        .col_expr(
            attempt::Column::Outcome,
            Expr::value(AttemptOutcome::Call(answer.outcome).as_str()),
        )
        .col_expr(
            attempt::Column::HttpStatus,
            Expr::value(answer.http_status.map(i32::from)),
        )
        .col_expr(
            attempt::Column::DurationMs,
            Expr::value(i64::try_from(answer.duration.as_millis()).unwrap_or(i64::MAX)),
        )
        .col_expr(
            attempt::Column::ResponseBody,
            Expr::value(answer.response_body.clone()),
        )
        .filter(attempt::Column::Id.eq(attempt_id))
        .exec(txn)
        .await?;
    Ok(())
}

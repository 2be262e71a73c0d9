//! Routing's rows: claiming a lead under a lease, attempts written before
//! each call and completed after it, the one sale per lead, alerts, and the
//! counts the buyers endpoint shows.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::{alert, attempt, lead, sale};
use sea_orm::sea_query::Expr;
use sea_orm::sea_query::{LockBehavior, LockType};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, DbErr, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect, QueryTrait, SqlErr, TransactionTrait,
};
use serde_json::Value;

use super::attempt_writer::AttemptWrite;
use super::operations::new_sale;
use super::Store;
use crate::domain::{new_id, LeadState};

/// An attempt about to be made (a call), or a skip.
#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub lead_id: String,
    pub buyer_id: String,
    pub kind: String,
    pub request: Value,
    pub snapshot: Value,
    pub retry_of: Option<String>,
    pub instance_id: String,
}

/// How an attempt ended.
#[derive(Debug, Clone)]
pub struct AttemptEnd {
    pub outcome: String,
    pub reason: Option<String>,
    pub http_status: Option<u16>,
    pub duration: Duration,
    pub response_body: Option<String>,
    pub bid: Option<f64>,
    pub ping_id: Option<String>,
}

/// Outcome counts of one buyer's attempts.
#[derive(Debug, Clone, Default, serde::Serialize, utoipa::ToSchema)]
pub struct OutcomeCounts {
    pub accepted: u64,
    pub rejected: u64,
    pub error: u64,
    pub timeout: u64,
    pub skipped: u64,
}

fn attempt_row(
    id: &str,
    new: NewAttempt,
    outcome: &str,
    reason: Option<&str>,
) -> attempt::ActiveModel {
    attempt::ActiveModel {
        id: Set(id.to_string()),
        lead_id: Set(new.lead_id),
        buyer_id: Set(new.buyer_id),
        kind: Set(new.kind),
        outcome: Set(outcome.to_string()),
        reason: Set(reason.map(str::to_string)),
        http_status: Set(None),
        started_at: Set(Utc::now()),
        // A skip is over the moment it is written; a call is timed later.
        duration_ms: Set((outcome == "skipped").then_some(0)),
        retry_of: Set(new.retry_of),
        request: Set(new.request),
        response_body: Set(None),
        snapshot: Set(new.snapshot),
        bid: Set(None),
        ping_id: Set(None),
        instance_id: Set(Some(new.instance_id)),
    }
}

/// Leads in `received`, or in `routing` with a lease that ran out by `now`.
fn waiting_to_be_routed(now: DateTime<Utc>) -> Condition {
    Condition::any()
        .add(lead::Column::State.eq(LeadState::Received.as_str()))
        .add(
            Condition::all()
                .add(lead::Column::State.eq(LeadState::Routing.as_str()))
                .add(lead::Column::LeaseUntil.lt(now)),
        )
}

/// `UPDATE leads SET state = 'routing', lease… WHERE id IN (SELECT id …
/// waiting … ORDER BY received_at LIMIT n FOR UPDATE SKIP LOCKED) AND
/// waiting` (the lock clause is left out on SQLite).
fn claim_statement(
    pick: sea_orm::Select<lead::Entity>,
    limit: u64,
    owner: &str,
    until: DateTime<Utc>,
    now: DateTime<Utc>,
) -> sea_orm::UpdateMany<lead::Entity> {
    let candidates = pick
        .select_only()
        .column(lead::Column::Id)
        .filter(waiting_to_be_routed(now))
        .order_by_asc(lead::Column::ReceivedAt)
        .limit(limit)
        .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
        .into_query();
    lead::Entity::update_many()
        .col_expr(
            lead::Column::State,
            Expr::value(LeadState::Routing.as_str()),
        )
        .col_expr(lead::Column::LeaseOwner, Expr::value(owner))
        .col_expr(lead::Column::LeaseUntil, Expr::value(until))
        .col_expr(lead::Column::UpdatedAt, Expr::value(now))
        .filter(lead::Column::Id.in_subquery(candidates))
        .filter(waiting_to_be_routed(now))
}

pub(super) fn lease_end(lease: Duration) -> DateTime<Utc> {
    Utc::now() + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::MAX)
}

impl Store {
    /// Takes these leads for routing where they wait (or their lease ran
    /// out). Returns the ids now held by `owner`.
    pub async fn claim_leads(
        &self,
        lead_ids: &[String],
        owner: &str,
        lease: Duration,
    ) -> Result<Vec<String>, DbErr> {
        if lead_ids.is_empty() {
            return Ok(Vec::new());
        }
        let ids = lead_ids.iter().map(String::as_str);
        let pick = lead::Entity::find().filter(lead::Column::Id.is_in(ids));
        self.claim(pick, lead_ids.len() as u64, owner, lease).await
    }

    /// The reconciliation sweep: takes up to `limit` of the oldest leads in
    /// `received`, or in `routing` with a lease that ran out.
    pub async fn claim_waiting(
        &self,
        limit: u64,
        owner: &str,
        lease: Duration,
    ) -> Result<Vec<String>, DbErr> {
        self.claim(lead::Entity::find(), limit, owner, lease).await
    }

    /// One atomic claim: `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP
    /// LOCKED)` on PostgreSQL, so instances claiming at once skip each
    /// other's rows instead of queueing on them; on SQLite (one writer at a
    /// time, and sea-query drops the lock clause) the conditional UPDATE is
    /// atomic by itself. Either way the UPDATE re-checks that each lead is
    /// still waiting, and we read back what carries our owner and lease end.
    async fn claim(
        &self,
        pick: sea_orm::Select<lead::Entity>,
        limit: u64,
        owner: &str,
        lease: Duration,
    ) -> Result<Vec<String>, DbErr> {
        let now = Utc::now();
        let until = lease_end(lease);
        claim_statement(pick, limit, owner, until, now)
            .exec(&self.db)
            .await?;
        lead::Entity::find()
            .select_only()
            .column(lead::Column::Id)
            .filter(lead::Column::State.eq(LeadState::Routing.as_str()))
            .filter(lead::Column::LeaseOwner.eq(owner))
            .filter(lead::Column::LeaseUntil.eq(until))
            .into_tuple()
            .all(&self.db)
            .await
    }

    /// Extends our leases on the leads we are routing (a heartbeat, so a
    /// lease can be shorter than a buyer's timeouts). Returns how many we
    /// still hold.
    pub async fn renew_leases(
        &self,
        lead_ids: &[String],
        owner: &str,
        lease: Duration,
    ) -> Result<u64, DbErr> {
        let mut held = 0;
        for chunk in lead_ids.chunks(500) {
            held += lead::Entity::update_many()
                .col_expr(lead::Column::LeaseUntil, Expr::value(lease_end(lease)))
                .filter(lead::Column::Id.is_in(chunk.iter().map(String::as_str)))
                .filter(lead::Column::State.eq(LeadState::Routing.as_str()))
                .filter(lead::Column::LeaseOwner.eq(owner))
                .exec(&self.db)
                .await?
                .rows_affected;
        }
        Ok(held)
    }

    /// Settles the attempts of a lead that were `in_flight` when the
    /// instance routing it stopped: a post becomes `timeout` (it may have
    /// been accepted: the lead goes to `unknown`, never re-sent), any other
    /// call an `error` (abandoned; the waterfall goes on). Reason
    /// `interrupted`. Returns (posts, other calls) settled.
    pub async fn settle_interrupted_attempts(&self, lead_id: &str) -> Result<(u64, u64), DbErr> {
        let settle = |posts: bool, outcome: &'static str| {
            let kind = if posts {
                attempt::Column::Kind.eq("post")
            } else {
                attempt::Column::Kind.ne("post")
            };
            attempt::Entity::update_many()
                .col_expr(attempt::Column::Outcome, Expr::value(outcome))
                .col_expr(attempt::Column::Reason, Expr::value("interrupted"))
                .filter(attempt::Column::LeadId.eq(lead_id))
                .filter(attempt::Column::Outcome.eq("in_flight"))
                .filter(kind)
                .exec(&self.db)
        };
        let posts = settle(true, "timeout").await?.rows_affected;
        let others = settle(false, "error").await?.rows_affected;
        Ok((posts, others))
    }

    /// Whether we still hold the lead's lease (a read: the router's
    /// heartbeat extends it).
    pub async fn holds_lease(&self, lead_id: &str, owner: &str) -> Result<bool, DbErr> {
        let held = lead::Entity::find()
            .filter(lead::Column::Id.eq(lead_id))
            .filter(lead::Column::State.eq(LeadState::Routing.as_str()))
            .filter(lead::Column::LeaseOwner.eq(owner))
            .filter(lead::Column::LeaseUntil.gt(Utc::now()))
            .count(&self.db)
            .await?;
        Ok(held == 1)
    }

    /// Puts leads we hold into their final states and releases their
    /// leases: one UPDATE per state, in one transaction. Returns how many
    /// leads were settled (a lead whose lease another instance took is not).
    pub async fn settle_leads(
        &self,
        owner: &str,
        settled: &[(String, LeadState)],
    ) -> Result<u64, DbErr> {
        let txn = self.db.begin().await?;
        let mut changed = 0;
        for state in LeadState::ALL {
            let ids: Vec<&str> = settled
                .iter()
                .filter(|(_, final_state)| *final_state == state)
                .map(|(id, _)| id.as_str())
                .collect();
            if ids.is_empty() {
                continue;
            }
            changed += lead::Entity::update_many()
                .col_expr(lead::Column::State, Expr::value(state.as_str()))
                .col_expr(
                    lead::Column::LeaseOwner,
                    Expr::value(Option::<String>::None),
                )
                .col_expr(
                    lead::Column::LeaseUntil,
                    Expr::value(Option::<DateTime<Utc>>::None),
                )
                .col_expr(lead::Column::UpdatedAt, Expr::value(Utc::now()))
                .filter(lead::Column::Id.is_in(ids))
                .filter(lead::Column::State.eq(LeadState::Routing.as_str()))
                .filter(lead::Column::LeaseOwner.eq(owner))
                .exec(&txn)
                .await?
                .rows_affected;
        }
        txn.commit().await?;
        Ok(changed)
    }

    /// Puts back to `received` the unsold leads (arrived after `since`) that
    /// this buyer skipped for its circuit or load, or failed with an error.
    /// Leads an operator rerouted or that were returned are left to the
    /// operator. Returns how many were requeued.
    pub async fn requeue_unsold_for(
        &self,
        buyer_id: &str,
        since: DateTime<Utc>,
        limit: u64,
    ) -> Result<u64, DbErr> {
        let retryable = Condition::any()
            .add(attempt::Column::Outcome.eq("error"))
            .add(
                Condition::all()
                    .add(attempt::Column::Outcome.eq("skipped"))
                    .add(attempt::Column::Reason.is_in(["circuit_open", "busy"])),
            );
        let candidates: Vec<String> = attempt::Entity::find()
            .select_only()
            .column(attempt::Column::LeadId)
            .distinct()
            .filter(attempt::Column::BuyerId.eq(buyer_id))
            .filter(retryable)
            .filter(attempt::Column::StartedAt.gte(since))
            .into_tuple()
            .all(&self.db)
            .await?;
        let mut requeued = 0;
        for chunk in candidates.chunks(500) {
            if requeued >= limit {
                break;
            }
            let ids: Vec<String> = lead::Entity::find()
                .select_only()
                .column(lead::Column::Id)
                .filter(lead::Column::Id.is_in(chunk.iter().map(String::as_str)))
                .filter(lead::Column::State.eq(LeadState::Unsold.as_str()))
                .filter(lead::Column::ReceivedAt.gte(since))
                .filter(lead::Column::HistoryFrom.is_null())
                .order_by_asc(lead::Column::ReceivedAt)
                .limit(limit - requeued)
                .into_tuple()
                .all(&self.db)
                .await?;
            let result = lead::Entity::update_many()
                .col_expr(
                    lead::Column::State,
                    Expr::value(LeadState::Received.as_str()),
                )
                .col_expr(lead::Column::UpdatedAt, Expr::value(Utc::now()))
                .filter(lead::Column::Id.is_in(ids.iter().map(String::as_str)))
                .filter(lead::Column::State.eq(LeadState::Unsold.as_str()))
                .exec(&self.db)
                .await?;
            requeued += result.rows_affected;
        }
        Ok(requeued)
    }

    /// Writes an attempt row as `in_flight`, before the call is made.
    pub async fn begin_attempt(&self, new: NewAttempt) -> Result<String, DbErr> {
        let id = new_id();
        let row = attempt_row(&id, new, "in_flight", None);
        self.attempts
            .write(AttemptWrite::Insert(Box::new(row)))
            .await?;
        Ok(id)
    }

    /// Completes an attempt row with what happened.
    pub async fn finish_attempt(&self, attempt_id: &str, end: AttemptEnd) -> Result<(), DbErr> {
        let id = attempt_id.to_string();
        self.attempts.write(AttemptWrite::Finish { id, end }).await
    }

    /// A skip: an attempt row of kind `skip` with no call behind it,
    /// written whole in one statement.
    pub async fn record_skip(&self, new: NewAttempt, reason: &str) -> Result<(), DbErr> {
        let new = NewAttempt {
            kind: "skip".into(),
            ..new
        };
        let row = attempt_row(&new_id(), new, "skipped", Some(reason));
        self.attempts
            .write(AttemptWrite::Insert(Box::new(row)))
            .await
    }

    /// Records the sale; false when the lead was already sold (the unique
    /// index on `sales.lead_id`, among sales not returned, makes a second
    /// sale impossible).
    pub async fn record_sale(
        &self,
        lead_id: &str,
        buyer_id: &str,
        attempt_id: Option<&str>,
        price: Option<f64>,
    ) -> Result<bool, DbErr> {
        let sale = new_sale(lead_id, buyer_id, attempt_id.map(str::to_string), price);
        let inserted = sale::Entity::insert(sale)
            .exec_without_returning(&self.db)
            .await;
        match inserted {
            Ok(_) => Ok(true),
            Err(error) if matches!(error.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) => {
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Sales to a buyer since `since` (for caps), returns not counted.
    pub async fn sales_since(&self, buyer_id: &str, since: DateTime<Utc>) -> Result<u64, DbErr> {
        sale::Entity::find()
            .filter(sale::Column::BuyerId.eq(buyer_id))
            .filter(sale::Column::SoldAt.gte(since))
            .filter(sale::Column::ReturnedAt.is_null())
            .count(&self.db)
            .await
    }

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
            .group_by(attempt::Column::BuyerId)
            .group_by(attempt::Column::Outcome)
            .into_tuple()
            .all(&self.db)
            .await?;
        let mut counts: HashMap<String, OutcomeCounts> = HashMap::new();
        for (buyer, outcome, count) in rows {
            let entry = counts.entry(buyer).or_default();
            let count = count as u64;
            match outcome.as_str() {
                "accepted" => entry.accepted += count,
                "rejected" => entry.rejected += count,
                "error" => entry.error += count,
                "timeout" => entry.timeout += count,
                "skipped" => entry.skipped += count,
                _ => {}
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

#[cfg(test)]
mod tests {
    use sea_orm::{DbBackend, QueryTrait};

    use super::*;

    #[test]
    fn postgres_claims_skip_locked_rows_and_sqlite_relies_on_its_single_writer() {
        let claim = |backend| {
            claim_statement(lead::Entity::find(), 10, "me", Utc::now(), Utc::now())
                .build(backend)
                .to_string()
        };
        let postgres = claim(DbBackend::Postgres);
        assert!(postgres.contains("FOR UPDATE SKIP LOCKED"), "{postgres}");
        assert!(
            postgres.contains("\"lease_until\" <"),
            "expired leases are claimable: {postgres}"
        );
        let sqlite = claim(DbBackend::Sqlite);
        assert!(!sqlite.contains("FOR UPDATE"), "{sqlite}");
        assert!(sqlite.contains("LIMIT"), "{sqlite}");
    }
}

//! Claiming leads for routing under a lease and a fencing token: by id
//! (leads just stored), by the sweep (the oldest waiting, and leases that
//! ran out), a settled lead for an operator's retry; renewing the leases
//! of the claims held.

use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::{attempt, lead};
use sea_orm::sea_query::{Expr, LockBehavior, LockType, Query};
use sea_orm::{
    ColumnTrait, Condition, ConnectionTrait, DbBackend, DbErr, EntityTrait, FromQueryResult,
    Iterable, QueryFilter, QueryOrder, QuerySelect, QueryTrait,
};

use crate::domain::{ClaimToken, LeadId, LeadState};
use crate::store::among::among;
use crate::store::any_of::any_of;
use crate::store::handle::Store;
use crate::store::state_is::state_is;

/// Leads just claimed, and the token that fences every write made for them.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub token: ClaimToken,
    pub leads: Vec<ClaimedLead>,
}

/// A lead as its claim left it, with its attempts so far (oldest first),
/// read once for the whole claim so that a walk starts without a query.
#[derive(Debug, Clone)]
pub struct ClaimedLead {
    pub row: lead::Model,
    pub history: Vec<attempt::Model>,
}

/// How a condition on a lead's state is used.
#[derive(Debug, Clone, Copy)]
enum Found {
    /// To find the leads: the `(state, received_at)` index serves it.
    ByState,
    /// To check leads found by key (id, claim token): see [`state_is`].
    ByKey,
}

/// Leads in `received` (not set aside, past any backoff), or in `routing`
/// with a lease that ran out by `now`, found by key.
fn waiting_to_be_routed(now: DateTime<Utc>) -> Condition {
    Condition::any()
        .add(received_and_due(now, Found::ByKey))
        .add(lease_ran_out(now, Found::ByKey))
}

/// Leads in `received`, not set aside, past any backoff.
fn received_and_due(now: DateTime<Utc>, found: Found) -> Condition {
    Condition::all()
        .add(state_test(LeadState::Received, found))
        .add(lead::Column::SetAsideReason.is_null())
        .add(
            Condition::any()
                .add(lead::Column::RouteAfter.is_null())
                .add(lead::Column::RouteAfter.lte(now)),
        )
}

/// Leads in `routing` whose lease ran out by `now`.
fn lease_ran_out(now: DateTime<Utc>, found: Found) -> Condition {
    Condition::all()
        .add(state_test(LeadState::Routing, found))
        .add(lead::Column::LeaseUntil.lt(now))
}

/// `state = <state>`, written for how the leads are found.
fn state_test(state: LeadState, found: Found) -> Expr {
    match found {
        Found::ByState => lead::Column::State.eq(state.as_str()),
        Found::ByKey => state_is(state),
    }
}

/// `UPDATE leads SET state = 'routing', lease…, claim_token WHERE id
/// among (SELECT id FROM <candidates> FOR UPDATE SKIP LOCKED) AND
/// <waiting>` (see `among`; SQLite has no lock clause, sea-query leaves it
/// out).
fn claim_statement(
    candidates: sea_orm::Select<lead::Entity>,
    waiting: Condition,
    holder: &Holder<'_>,
    now: DateTime<Utc>,
    backend: DbBackend,
) -> sea_orm::UpdateMany<lead::Entity> {
    let candidates = candidates
        .select_only()
        .column(lead::Column::Id)
        .lock_with_behavior(LockType::Update, LockBehavior::SkipLocked)
        .into_query();
    held_by(lead::Entity::update_many(), holder, now)
        .filter(among(
            Expr::col((lead::Entity, lead::Column::Id)),
            candidates,
            backend,
        ))
        .filter(waiting)
}

/// Up to `limit` of the oldest leads in `waiting`: one condition without
/// OR at the top, so that the `(state, received_at)` index yields them in
/// order and the scan stops at `limit` (an OR of two states is a scan and
/// a sort of the whole backlog, at every claim).
fn oldest(waiting: Condition, limit: u64) -> sea_orm::Select<lead::Entity> {
    lead::Entity::find()
        .filter(waiting)
        .order_by_asc(lead::Column::ReceivedAt)
        .limit(limit)
}

/// The rows a claim took so far.
#[derive(Default)]
struct Taken {
    rows: Vec<lead::Model>,
}

/// Who takes leads, under which token, until when.
struct Holder<'a> {
    owner: &'a str,
    token: ClaimToken,
    until: DateTime<Utc>,
}

impl<'a> Holder<'a> {
    fn new(owner: &'a str, lease: Duration) -> Self {
        Self {
            owner,
            token: ClaimToken::fresh(),
            until: lease_end(lease),
        }
    }
}

fn held_by(
    update: sea_orm::UpdateMany<lead::Entity>,
    holder: &Holder<'_>,
    now: DateTime<Utc>,
) -> sea_orm::UpdateMany<lead::Entity> {
    update
        .col_expr(
            lead::Column::State,
            Expr::value(LeadState::Routing.as_str()),
        )
        .col_expr(lead::Column::LeaseOwner, Expr::value(holder.owner))
        .col_expr(lead::Column::LeaseUntil, Expr::value(holder.until))
        .col_expr(lead::Column::ClaimToken, Expr::value(holder.token.as_str()))
        .col_expr(lead::Column::UpdatedAt, Expr::value(now))
}

fn lease_end(lease: Duration) -> DateTime<Utc> {
    Utc::now() + chrono::Duration::from_std(lease).unwrap_or(chrono::Duration::MAX)
}

impl Store {
    /// Takes these leads for routing where they wait (or their lease ran
    /// out). Returns the ids now held by `owner` and their token.
    pub async fn claim_leads(
        &self,
        lead_ids: &[LeadId],
        owner: &str,
        lease: Duration,
    ) -> Result<Claimed, DbErr> {
        // By primary key alone: whether each is still waiting is checked by
        // the UPDATE, row by row (given the state too, a planner without
        // statistics scans the state index, dead entries and all).
        let ids = lead_ids.iter().map(LeadId::as_str);
        let backend = self.routing.get_database_backend();
        let candidates = lead::Entity::find().filter(any_of(backend, lead::Column::Id, ids));
        let (now, holder) = (Utc::now(), Holder::new(owner, lease));
        let mut taken = Taken::default();
        self.take(
            &mut taken,
            candidates,
            waiting_to_be_routed(now),
            &holder,
            now,
        )
        .await?;
        self.claimed(holder, taken).await
    }

    /// The reconciliation sweep: takes up to `limit` leads, those in
    /// `routing` whose lease ran out (an instance stopped while routing
    /// them) first, at most every `LEASE_SEARCH_EVERY`, then the oldest in
    /// `received`.
    pub async fn claim_waiting(
        &self,
        limit: u64,
        owner: &str,
        lease: Duration,
    ) -> Result<Claimed, DbErr> {
        let (now, holder) = (Utc::now(), Holder::new(owner, lease));
        let mut taken = Taken::default();
        let searches: Vec<fn(DateTime<Utc>, Found) -> Condition> = if self.lease_search.due() {
            vec![lease_ran_out, received_and_due]
        } else {
            vec![received_and_due]
        };
        for waiting in searches {
            let room = limit.saturating_sub(taken.rows.len() as u64);
            if room == 0 {
                break;
            }
            let candidates = oldest(waiting(now, Found::ByState), room);
            let waiting = waiting(now, Found::ByKey);
            self.take(&mut taken, candidates, waiting, &holder, now)
                .await?;
        }
        if taken.rows.len() as u64 == limit {
            self.statistics.backlog_found(&self.db);
        }
        self.claimed(holder, taken).await
    }

    /// One atomic claim: `UPDATE … WHERE id IN (SELECT … FOR UPDATE SKIP
    /// LOCKED)` on PostgreSQL, so instances claiming at once skip each
    /// other's rows instead of queueing on them; on SQLite (one writer at a
    /// time, and sea-query drops the lock clause) the conditional UPDATE is
    /// atomic by itself. Either way the UPDATE re-checks that each lead is
    /// still `waiting`, and answers (`RETURNING`) the rows it gave the
    /// holder's token.
    async fn take(
        &self,
        taken: &mut Taken,
        candidates: sea_orm::Select<lead::Entity>,
        waiting: Condition,
        holder: &Holder<'_>,
        now: DateTime<Utc>,
    ) -> Result<(), DbErr> {
        let backend = self.routing.get_database_backend();
        let mut statement = claim_statement(candidates, waiting, holder, now, backend).into_query();
        statement.returning(Query::returning().columns(lead::Column::iter()));
        for returned in self.routing.query_all(&statement).await? {
            taken
                .rows
                .push(lead::Model::from_query_result(&returned, "")?);
        }
        Ok(())
    }

    /// The leads taken under the holder's token, with their attempts, read
    /// by a statement of their own once the claim is committed. Not by the
    /// claim's statement: on PostgreSQL it reads the database as it was
    /// when it began, and a lead's previous owner (its lease just run out)
    /// may commit its last rows after that and before the claim locks the
    /// lead (it skips the lead while the commit holds it, not after): the
    /// claim would then see a post in flight as no history at all, and the
    /// walk offer the lead again. Only what the lead's row itself holds
    /// (a sale's `sold`) the claim re-reads as it locks it.
    async fn claimed(&self, holder: Holder<'_>, taken: Taken) -> Result<Claimed, DbErr> {
        let ids: Vec<&str> = taken.rows.iter().map(|row| row.id.as_str()).collect();
        let mut histories = self.attempts_of_leads(&ids).await?;
        let leads = taken
            .rows
            .into_iter()
            .map(|row| ClaimedLead {
                history: histories.remove(&row.id).unwrap_or_default(),
                row,
            })
            .collect();
        Ok(Claimed {
            token: holder.token,
            leads,
        })
    }

    /// Holds a settled lead (in `from`) for an operator's retry, as a claim
    /// like any other; the token, or `None` when its state changed.
    pub async fn claim_settled(
        &self,
        lead_id: &LeadId,
        from: LeadState,
        owner: &str,
        lease: Duration,
    ) -> Result<Option<ClaimToken>, DbErr> {
        let holder = Holder::new(owner, lease);
        let held = held_by(lead::Entity::update_many(), &holder, Utc::now())
            .filter(lead::Column::Id.eq(lead_id.as_str()))
            .filter(lead::Column::State.eq(from.as_str()))
            .exec(&self.routing)
            .await?
            .rows_affected;
        Ok((held == 1).then_some(holder.token))
    }

    /// Extends the leases of the claims behind these tokens (a heartbeat,
    /// so a lease can be shorter than a buyer's timeouts), only where the
    /// claim is still current and its lease has not run out: after a cut
    /// longer than the lease another instance may hold the lead. Returns
    /// how many leads are still held.
    pub async fn renew_leases(&self, tokens: &[ClaimToken], lease: Duration) -> Result<u64, DbErr> {
        let mut held = 0;
        for chunk in tokens.chunks(500) {
            held += lead::Entity::update_many()
                .col_expr(lead::Column::LeaseUntil, Expr::value(lease_end(lease)))
                .filter(any_of(
                    self.routing.get_database_backend(),
                    lead::Column::ClaimToken,
                    chunk.iter().map(ClaimToken::as_str),
                ))
                .filter(lead::Column::State.eq(LeadState::Routing.as_str()))
                .filter(lead::Column::LeaseUntil.gt(Utc::now()))
                .exec(&self.routing)
                .await?
                .rows_affected;
        }
        Ok(held)
    }
}

#[cfg(test)]
mod tests {
    use sea_orm::QueryTrait;

    use super::*;

    #[test]
    fn postgres_claims_skip_locked_rows_and_sqlite_relies_on_its_single_writer() {
        let now = Utc::now();
        let sweep = |waiting: fn(DateTime<Utc>, Found) -> Condition, backend| {
            let holder = Holder::new("me", Duration::from_secs(60));
            claim_statement(
                oldest(waiting(now, Found::ByState), 10),
                waiting(now, Found::ByKey),
                &holder,
                now,
                backend,
            )
            .build(backend)
            .to_string()
        };
        let postgres = sweep(received_and_due, DbBackend::Postgres);
        assert!(postgres.contains("FOR UPDATE SKIP LOCKED"), "{postgres}");
        assert!(postgres.contains("LIMIT"), "{postgres}");
        assert!(postgres.contains("= ANY(ARRAY((SELECT"), "{postgres}");
        let sqlite = sweep(received_and_due, DbBackend::Sqlite);
        assert!(!sqlite.contains("FOR UPDATE"), "{sqlite}");
        assert!(sqlite.contains("LIMIT"), "{sqlite}");
    }

    #[test]
    fn each_sweep_search_is_one_state_so_its_index_yields_the_oldest_first() {
        let now = Utc::now();
        let sweep = |waiting: fn(DateTime<Utc>, Found) -> Condition| {
            let holder = Holder::new("me", Duration::from_secs(60));
            let postgres = DbBackend::Postgres;
            claim_statement(
                oldest(waiting(now, Found::ByState), 10),
                waiting(now, Found::ByKey),
                &holder,
                now,
                postgres,
            )
            .build(postgres)
            .to_string()
        };
        let received = sweep(received_and_due);
        assert!(!received.contains(" OR \"leads\".\"state\""), "{received}");
        assert!(!received.contains("\"lease_until\" <"), "{received}");
        let expired = sweep(lease_ran_out);
        assert!(expired.contains("\"lease_until\" <"), "{expired}");
        assert!(!expired.contains("'received'"), "{expired}");
    }

    #[test]
    fn leads_found_by_key_have_their_state_checked_where_no_index_serves_it() {
        let now = Utc::now();
        let holder = Holder::new("me", Duration::from_secs(60));
        for backend in [DbBackend::Postgres, DbBackend::Sqlite] {
            let claim = claim_statement(
                lead::Entity::find().filter(lead::Column::Id.is_in(["a", "b"])),
                waiting_to_be_routed(now),
                &holder,
                now,
                backend,
            )
            .build(backend)
            .to_string();
            for state in ["received", "routing"] {
                let checked = format!(r#"("leads"."state" || '') = '{state}'"#);
                assert!(claim.contains(&checked), "{claim}");
            }
            assert!(!claim.contains(r#""leads"."state" = "#), "{claim}");
        }
        // A sweep's search still finds its leads by the state's index.
        let sweep = oldest(received_and_due(now, Found::ByState), 10)
            .build(DbBackend::Postgres)
            .to_string();
        assert!(sweep.contains(r#""leads"."state" = 'received'"#), "{sweep}");
    }
}

//! Routing's rows: claiming a lead under a lease and a fencing token,
//! attempts written before each call and completed after it, the one door
//! for a sale, letting leads go (final, backoff, set aside), requeueing for
//! a recovered buyer, alerts, and the counts the buyers endpoint shows.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::{alert, attempt, lead, sale};
use sea_orm::sea_query::{Expr, LockBehavior, LockType, Query};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DbBackend, DbErr, EntityTrait,
    ExprTrait, FromQueryResult, Iterable, QueryFilter, QueryOrder, QuerySelect, QueryTrait,
    TransactionTrait,
};
use serde_json::Value;

use super::among::among;
use super::any_of::any_of;
use super::attempt_end::{AttemptEnd, Unwritten};
use super::attempt_writer::{insert_sale, mark_sold, AttemptWrite, Fence, Written};
use super::caps::CapSlot;
use super::handle::Store;
use super::operations::new_sale;
use super::state_is::state_is;
use crate::domain::{
    new_id, AttemptKind, AttemptOutcome, CallOutcome, ClaimToken, ConfigSnapshot, LeadId,
    LeadState, SkipReason, INTERRUPTED,
};

/// The attempt kinds whose `buyer_id` is a buyer (not a notify channel or
/// an event sink).
const BUYER_KINDS: [&str; 3] = ["ping", "post", "skip"];

/// An attempt about to be made (a call), or a skip.
#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub lead_id: LeadId,
    pub buyer_id: String,
    pub kind: AttemptKind,
    pub request: Value,
    pub snapshot: ConfigSnapshot,
    pub retry_of: Option<String>,
    pub instance_id: String,
    /// The claim the lead is held under: the row is written only while it holds.
    pub claim_token: ClaimToken,
    /// For a post: the cap slots it takes (see `store::caps`).
    pub caps: Vec<CapSlot>,
    /// The walk's previous call's answer, not yet written: it goes in the
    /// same commit as this row (see `Unwritten`).
    pub answered: Option<Unwritten>,
}

/// What became of writing a call's row before the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begun {
    /// Written, with the cap slots it took: make the call.
    Call(String, Vec<CapSlot>),
    /// The lead's claim is gone: no call.
    Fenced,
    /// A cap is full: written as a `capped` skip, no call.
    Capped,
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

/// How a held lead is let go.
#[derive(Debug, Clone)]
pub struct HeldLead {
    pub lead_id: LeadId,
    pub token: ClaimToken,
    pub end: LeadEnd,
}

#[derive(Debug, Clone)]
pub enum LeadEnd {
    /// A final state, or `received` to be routed again at once.
    State(LeadState),
    /// Routing failed on our side: back to `received` after a backoff, or
    /// set aside for an operator once `failures_before + 1` reaches the limit.
    Failed {
        reason: String,
        failures_before: u32,
    },
}

/// Routing failures allowed per lead, and the first backoff (it doubles).
#[derive(Debug, Clone, Copy)]
pub struct FailurePolicy {
    pub limit: u32,
    pub backoff: Duration,
}

/// The longest backoff between two routings of a failing lead.
const MAX_FAILURE_BACKOFF: Duration = Duration::from_secs(3600);

impl FailurePolicy {
    fn backoff_after(&self, failures: u32) -> chrono::Duration {
        let factor = 2u32.saturating_pow(Ord::min(failures.saturating_sub(1), 20));
        let wait = self.backoff.saturating_mul(factor).min(MAX_FAILURE_BACKOFF);
        chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::MAX)
    }
}

fn attempt_row(
    id: &str,
    new: NewAttempt,
    outcome: AttemptOutcome,
    started_at: DateTime<Utc>,
) -> attempt::ActiveModel {
    let skip = match outcome {
        AttemptOutcome::Skip(reason) => Some(reason),
        _ => None,
    };
    attempt::ActiveModel {
        id: Set(id.to_string()),
        lead_id: Set(new.lead_id.to_string()),
        buyer_id: Set(new.buyer_id),
        kind: Set(new.kind.as_str().into()),
        outcome: Set(outcome.as_str().into()),
        reason: Set(skip.map(|reason| reason.as_str().into())),
        http_status: Set(None),
        started_at: Set(started_at),
        // A skip is over the moment it is written; a call is timed later.
        duration_ms: Set(skip.map(|_| 0)),
        retry_of: Set(new.retry_of),
        request: Set(new.request),
        response_body: Set(None),
        snapshot_id: Set(new.snapshot.id),
        bid: Set(None),
        ping_id: Set(None),
        instance_id: Set(Some(new.instance_id)),
    }
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

/// Retryable outcomes as stored.
fn retryable_outcomes() -> [&'static str; 3] {
    AttemptOutcome::RETRYABLE.map(AttemptOutcome::as_str)
}

/// Outcomes after which a buyer is done with a lead, whatever it does next.
fn final_outcomes() -> [&'static str; 6] {
    [
        AttemptOutcome::Call(CallOutcome::Rejected),
        AttemptOutcome::Call(CallOutcome::Timeout),
        AttemptOutcome::Skip(SkipReason::Filtered),
        AttemptOutcome::Skip(SkipReason::Capped),
        AttemptOutcome::Skip(SkipReason::TestLead),
        AttemptOutcome::Skip(SkipReason::BelowMinBid),
    ]
    .map(AttemptOutcome::as_str)
}

/// Leads requeued per statement when a buyer recovers.
const REQUEUE_PAGE: u64 = 1000;

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

    /// Settles the attempts of a lead that were `in_flight` when the
    /// instance routing it stopped: a post becomes `timeout` (it may have
    /// been accepted: the lead goes to `unknown`, never re-sent), any other
    /// call an `error` (abandoned; the waterfall goes on). Reason
    /// `interrupted`. Returns (posts, other calls) settled.
    pub async fn settle_interrupted_attempts(&self, lead_id: &str) -> Result<(u64, u64), DbErr> {
        let settle = |posts: bool, outcome: CallOutcome| {
            // Deliveries (notify, event) settle on their own, see `deliveries`.
            let kind = if posts {
                attempt::Column::Kind.eq(AttemptKind::POST.as_str())
            } else {
                attempt::Column::Kind
                    .is_in([AttemptKind::PING.as_str(), AttemptKind::Skip.as_str()])
            };
            attempt::Entity::update_many()
                .col_expr(
                    attempt::Column::Outcome,
                    Expr::value(AttemptOutcome::Call(outcome).as_str()),
                )
                .col_expr(attempt::Column::Reason, Expr::value(INTERRUPTED))
                .filter(attempt::Column::LeadId.eq(lead_id))
                .filter(attempt::Column::Outcome.eq(AttemptOutcome::InFlight.as_str()))
                .filter(kind)
                .exec(&self.routing)
        };
        let posts = settle(true, CallOutcome::Timeout).await?.rows_affected;
        let others = settle(false, CallOutcome::Error).await?.rows_affected;
        Ok((posts, others))
    }

    /// Lets go of held leads: final states (one UPDATE per state), and
    /// failed routings (backoff, or set aside past the limit), in one
    /// transaction, each only while its claim is current. Returns how many
    /// were let go and the ids set aside.
    pub async fn settle_leads(
        &self,
        held: &[HeldLead],
        policy: FailurePolicy,
    ) -> Result<(u64, Vec<LeadId>), DbErr> {
        let txn = self.routing.begin().await?;
        let now = Utc::now();
        let backend = txn.get_database_backend();
        let release = |update: sea_orm::UpdateMany<lead::Entity>| {
            update
                .col_expr(
                    lead::Column::LeaseOwner,
                    Expr::value(Option::<String>::None),
                )
                .col_expr(
                    lead::Column::LeaseUntil,
                    Expr::value(Option::<DateTime<Utc>>::None),
                )
                .col_expr(
                    lead::Column::ClaimToken,
                    Expr::value(Option::<String>::None),
                )
                .col_expr(lead::Column::UpdatedAt, Expr::value(now))
                .filter(state_is(LeadState::Routing))
        };
        let mut changed = 0;
        for state in LeadState::ALL {
            let settled: Vec<&HeldLead> = held
                .iter()
                .filter(|lead| matches!(lead.end, LeadEnd::State(to) if to == state))
                .collect();
            if settled.is_empty() {
                continue;
            }
            changed += release(lead::Entity::update_many())
                .col_expr(lead::Column::State, Expr::value(state.as_str()))
                .filter(any_of(
                    backend,
                    lead::Column::Id,
                    settled.iter().map(|lead| lead.lead_id.as_str()),
                ))
                .filter(any_of(
                    backend,
                    lead::Column::ClaimToken,
                    settled.iter().map(|lead| lead.token.as_str()),
                ))
                .exec(&txn)
                .await?
                .rows_affected;
        }
        let mut set_aside = Vec::new();
        for lead in held {
            let LeadEnd::Failed {
                reason,
                failures_before,
            } = &lead.end
            else {
                continue;
            };
            let failures = failures_before + 1;
            let mut update = release(lead::Entity::update_many())
                .col_expr(
                    lead::Column::State,
                    Expr::value(LeadState::Received.as_str()),
                )
                .col_expr(lead::Column::RouteFailures, Expr::value(failures as i32));
            let aside = failures >= policy.limit;
            update = if aside {
                update.col_expr(lead::Column::SetAsideReason, Expr::value(reason.as_str()))
            } else {
                let after = now + policy.backoff_after(failures);
                update.col_expr(lead::Column::RouteAfter, Expr::value(after))
            };
            let let_go = update
                .filter(lead::Column::Id.eq(lead.lead_id.as_str()))
                .filter(lead::Column::ClaimToken.eq(lead.token.as_str()))
                .exec(&txn)
                .await?
                .rows_affected;
            changed += let_go;
            if aside && let_go == 1 {
                set_aside.push(lead.lead_id.clone());
            }
        }
        txn.commit().await?;
        Ok((changed, set_aside))
    }

    /// The buyers each of `leads` failed with an error or was skipped for
    /// (circuit, load), each with those of the leads it failed: the only
    /// buyers [`Store::requeue_for_buyer`] could put them back for, found
    /// by the attempts' lead index. Most leads end unsold without such a
    /// failure, and then no requeue statement (planned for each run) is
    /// needed at all.
    pub async fn buyers_failed_for(
        &self,
        leads: &[LeadId],
    ) -> Result<HashMap<String, Vec<LeadId>>, DbErr> {
        let failures: Vec<(String, String)> = attempt::Entity::find()
            .select_only()
            .column(attempt::Column::BuyerId)
            .column(attempt::Column::LeadId)
            .distinct()
            .filter(any_of(
                self.routing.get_database_backend(),
                attempt::Column::LeadId,
                leads.iter().map(LeadId::as_str),
            ))
            .filter(attempt::Column::Kind.is_in(BUYER_KINDS))
            .filter(attempt::Column::Outcome.is_in(retryable_outcomes()))
            .into_tuple()
            .all(&self.routing)
            .await?;
        let mut by_buyer: HashMap<String, Vec<LeadId>> = HashMap::new();
        for (buyer_id, lead_id) in failures {
            by_buyer.entry(buyer_id).or_default().push(lead_id.into());
        }
        Ok(by_buyer)
    }

    /// Puts back to `received` the unsold leads (arrived after `since`,
    /// not rerouted or returned: those are the operator's) that this buyer
    /// failed with an error or was skipped for (circuit, load) before
    /// `answered_at`, when it was seen answering again, and that it never
    /// gave a final answer (a rejection, a timeout) nor failed since. A
    /// page at a time, all of them (each once: those let go before the
    /// call began), or at most `limit` (probes); among `only` these leads
    /// if given. Returns how many were requeued.
    pub async fn requeue_for_buyer(
        &self,
        buyer_id: &str,
        since: DateTime<Utc>,
        answered_at: DateTime<Utc>,
        limit: Option<u64>,
        only: Option<&[LeadId]>,
    ) -> Result<u64, DbErr> {
        let at_buyer = |outcomes: Condition| {
            attempt::Entity::find()
                .select_only()
                .column(attempt::Column::Id)
                .filter(
                    Expr::col((attempt::Entity, attempt::Column::LeadId))
                        .equals((lead::Entity, lead::Column::Id)),
                )
                .filter(attempt::Column::BuyerId.eq(buyer_id))
                .filter(attempt::Column::Kind.is_in(BUYER_KINDS))
                .filter(outcomes)
                .into_query()
        };
        let retryable = Condition::all().add(attempt::Column::Outcome.is_in(retryable_outcomes()));
        // A final answer of this buyer (or a skip that a recovery does not
        // change), or a failure after it answered again: not this time.
        let final_or_later = Condition::any()
            .add(attempt::Column::Outcome.is_in(final_outcomes()))
            .add(
                Condition::all()
                    .add(attempt::Column::Outcome.is_in(retryable_outcomes()))
                    .add(attempt::Column::StartedAt.gte(answered_at)),
            );
        // Leads this call put back, routed and let go unsold again while it
        // pages on, are not put back twice.
        let started = Utc::now();
        let mut requeued = 0;
        loop {
            let page = limit.map_or(REQUEUE_PAGE, |limit| {
                std::cmp::min(limit - requeued, REQUEUE_PAGE)
            });
            if page == 0 {
                break;
            }
            let mut candidates = lead::Entity::find();
            if let Some(only) = only {
                let only = only.iter().map(LeadId::as_str);
                let backend = self.routing.get_database_backend();
                candidates = candidates.filter(any_of(backend, lead::Column::Id, only));
            }
            let candidates = candidates
                .select_only()
                .column(lead::Column::Id)
                .filter(lead::Column::State.eq(LeadState::Unsold.as_str()))
                .filter(lead::Column::ReceivedAt.gte(since))
                .filter(lead::Column::HistoryFrom.is_null())
                .filter(lead::Column::UpdatedAt.lt(started))
                .filter(Expr::exists(at_buyer(retryable.clone())))
                .filter(Expr::exists(at_buyer(final_or_later.clone())).not())
                .order_by_asc(lead::Column::ReceivedAt)
                .limit(page)
                .into_query();
            let moved = lead::Entity::update_many()
                .col_expr(
                    lead::Column::State,
                    Expr::value(LeadState::Received.as_str()),
                )
                .col_expr(lead::Column::UpdatedAt, Expr::value(Utc::now()))
                .filter(among(
                    Expr::col((lead::Entity, lead::Column::Id)),
                    candidates,
                    self.routing.get_database_backend(),
                ))
                .filter(lead::Column::State.eq(LeadState::Unsold.as_str()))
                .exec(&self.routing)
                .await?
                .rows_affected;
            requeued += moved;
            // Only a page that moved nothing ends it: a lead of a full page
            // taken meanwhile (a probe's requeue, a sweep) moves one fewer,
            // and thousands more may still wait behind it.
            if moved == 0 {
                break;
            }
        }
        Ok(requeued)
    }

    /// Writes a call's row as `in_flight`, before the call is made, while
    /// the lead's claim holds and (a post) with its cap slots reserved.
    pub async fn begin_attempt(&self, mut new: NewAttempt) -> Result<Begun, DbErr> {
        let id = new_id();
        let (fence, mut caps, answered) = fence_of(&mut new);
        // Slots are taken in the periods that hold the row's start, so a
        // return finds them again from the row.
        let started_at = Utc::now();
        for slot in &mut caps {
            slot.start = slot.period.start(started_at);
        }
        let snapshot = new.snapshot.clone();
        let row = attempt_row(&id, new, AttemptOutcome::InFlight, started_at);
        let written = self
            .attempts
            .write(AttemptWrite::Insert {
                row: Box::new(row),
                snapshot,
                fence,
                caps: caps.clone(),
                answered,
            })
            .await?;
        Ok(match written {
            Written::Fenced => Begun::Fenced,
            Written::Capped => Begun::Capped,
            _ => Begun::Call(id, caps),
        })
    }

    /// Completes a call's row with what happened (`Stale` when recovery
    /// settled it meanwhile); `release` gives a post's cap slots back.
    pub async fn finish_attempt(
        &self,
        attempt_id: &str,
        end: AttemptEnd,
        release: Vec<CapSlot>,
    ) -> Result<Written, DbErr> {
        let id = attempt_id.to_string();
        self.attempts
            .write(AttemptWrite::Finish { id, end, release })
            .await
    }

    /// A call's row that never went out (its buyer had no free slot in
    /// time), rewritten as the `busy` skip it became while still
    /// `in_flight` (`Stale` when recovery settled it meanwhile); `release`
    /// gives a post's cap slots back.
    pub async fn call_skipped_as_busy(
        &self,
        attempt_id: &str,
        release: Vec<CapSlot>,
    ) -> Result<Written, DbErr> {
        let id = attempt_id.to_string();
        self.attempts
            .write(AttemptWrite::Busy { id, release })
            .await
    }

    /// The one door for a sale made by a call: the accepted post's answer,
    /// its sale row and the lead's `sold`, in one commit. `AlreadySold`
    /// when the lead had a sale (the unique index), `Stale` when recovery
    /// had settled the post as interrupted (nothing written then).
    pub async fn sell(
        &self,
        attempt_id: &str,
        end: AttemptEnd,
        sale: SaleOf<'_>,
    ) -> Result<Written, DbErr> {
        self.attempts
            .write(AttemptWrite::Sell {
                id: attempt_id.to_string(),
                end,
                lead_id: sale.lead_id.to_string(),
                sale: Box::new(sale.row(attempt_id)),
            })
            .await
    }

    /// A post whose acceptance is in the lead's history but whose sale
    /// never got written (its commit failed): the sale and `sold` now.
    /// False when the lead had a sale already.
    pub async fn sell_from_history(
        &self,
        attempt_id: &str,
        sale: SaleOf<'_>,
    ) -> Result<bool, DbErr> {
        let txn = self.routing.begin().await?;
        let sold = insert_sale(&txn, sale.row(attempt_id)).await?;
        mark_sold(&txn, &[sale.lead_id]).await?;
        txn.commit().await?;
        Ok(sold)
    }

    /// A skip: an attempt row of kind `skip` whose outcome is the reason,
    /// written whole in one statement while the claim holds.
    pub async fn record_skip(&self, new: NewAttempt, reason: SkipReason) -> Result<Written, DbErr> {
        let mut new = NewAttempt {
            kind: AttemptKind::Skip,
            caps: Vec::new(),
            ..new
        };
        let (fence, caps, answered) = fence_of(&mut new);
        let snapshot = new.snapshot.clone();
        let row = attempt_row(&new_id(), new, AttemptOutcome::Skip(reason), Utc::now());
        self.attempts
            .write(AttemptWrite::Insert {
                row: Box::new(row),
                snapshot,
                fence,
                caps,
                answered,
            })
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

/// The sale a call or a history makes.
pub struct SaleOf<'a> {
    pub lead_id: &'a str,
    pub buyer_id: &'a str,
    pub price: Option<f64>,
    /// What the lead's source is paid for it.
    pub payout: Option<f64>,
}

impl SaleOf<'_> {
    /// The sale row, made by the post `attempt_id`.
    fn row(&self, attempt_id: &str) -> entity::sale::ActiveModel {
        new_sale(
            self.lead_id,
            self.buyer_id,
            Some(attempt_id.to_string()),
            self.price,
            self.payout,
        )
    }
}

/// The write's conditions, its cap slots, and the answer it brings (taken:
/// the row itself does not hold it).
fn fence_of(new: &mut NewAttempt) -> (Fence, Vec<CapSlot>, Option<Unwritten>) {
    let fence = Fence {
        lead_id: new.lead_id.clone(),
        token: new.claim_token.clone(),
    };
    (fence, new.caps.clone(), new.answered.take())
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

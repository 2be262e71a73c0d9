//! Putting unsold leads back to be routed for a buyer seen answering
//! again: the buyers a set of leads failed at, and the requeue itself, a
//! page at a time.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use entity::{attempt, lead};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, Condition, DbErr, EntityTrait, ExprTrait, QueryFilter, QueryOrder, QuerySelect,
    QueryTrait,
};

use crate::domain::{AttemptOutcome, CallOutcome, LeadId, LeadState, SkipReason};
use crate::store::among::among;
use crate::store::any_of::any_of;
use crate::store::handle::Store;

/// The attempt kinds whose `buyer_id` is a buyer (not a notify channel or
/// an event sink).
pub(super) const BUYER_KINDS: [&str; 3] = ["ping", "post", "skip"];

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
}

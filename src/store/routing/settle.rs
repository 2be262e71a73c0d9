//! Letting held leads go: a final state, or a routing that failed on our
//! side (back after a backoff, or set aside for an operator past the
//! limit), each only while its claim is current; and settling the
//! attempts an instance left `in_flight` when it stopped.

use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::{attempt, lead};
use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, TransactionTrait};

use crate::domain::{
    AttemptKind, AttemptOutcome, CallOutcome, ClaimToken, LeadId, LeadState, INTERRUPTED,
};
use crate::store::any_of::any_of;
use crate::store::handle::Store;
use crate::store::state_is::state_is;

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

impl Store {
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
}

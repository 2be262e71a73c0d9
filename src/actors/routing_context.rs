//! What every walk of a lead works with and how it ends, shared by the
//! `Waterfall` actor, the walks themselves (`walk.rs`, `auction.rs`), the
//! router that lets leads go and the operator's retries: the
//! `RoutingContext` all of them hold, `WalkEnd` (how a walk lets its lead
//! go) and `RouteError` (what stops a walk on our side).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use actix::MailboxError;

use super::directory::BuyerDirectory;
use crate::alerts::{AlertKind, Alerts};
use crate::buyer::recorded_call::Offered;
use crate::clock::Clock;
use crate::config::{RoutingMode, SharedSettings};
use crate::domain::LeadState;
use crate::store::{is_unreachable, FailurePolicy, LeadEnd, Store};

/// Everything a waterfall needs, shared by all of them.
pub struct RoutingContext {
    pub store: Store,
    pub directory: BuyerDirectory,
    pub lease: Duration,
    pub reserve_price: Option<f64>,
    pub instance_id: Arc<str>,
    /// Set at shutdown: waterfalls stop before their next buyer.
    pub draining: Arc<AtomicBool>,
    pub alerts: Alerts,
    /// Routing failures (ours, not a buyer's answer) a lead may have.
    pub failures: FailurePolicy,
    /// What buyer schedules are read against.
    pub clock: Clock,
    /// `routing.mode`, and how long an auction waits for its pings.
    pub mode: RoutingMode,
    pub auction_window: Duration,
    /// The live configuration (reloads): what each source is paid.
    pub settings: SharedSettings,
}

impl RoutingContext {
    /// Tells the operator a post's fate is unknown (`what`: "post" or
    /// "retried post"; `why`: what became of it): the lead goes `unknown`,
    /// and the post is never re-sent.
    pub(super) async fn alert_post_unknown(
        &self,
        what: &str,
        lead_id: &str,
        buyer_id: &str,
        why: &str,
    ) {
        let message = format!(
            "{what} of lead {lead_id} to buyer {buyer_id} {why}: lead unknown, not re-sent"
        );
        self.alerts
            .raise(
                AlertKind::PostTimeout,
                Some(buyer_id),
                Some(lead_id),
                &message,
            )
            .await;
    }
}

/// How a walk let its lead go.
#[derive(Debug, Clone)]
pub enum WalkEnd {
    /// The router writes this (final states in groups, failures with backoff).
    LetGo(LeadEnd),
    /// Already written: a sale commits the lead's `sold` with it.
    Settled,
    /// The claim is gone (another instance holds the lead): nothing to write.
    Lost,
}

/// As the log shows it: the state the lead is let go in (`received` again
/// after a failure of ours, whose reason is logged where it happened).
impl std::fmt::Display for WalkEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::LetGo(LeadEnd::State(state)) => state.as_str(),
            Self::LetGo(LeadEnd::Failed { .. }) => "failed",
            Self::Settled => "sold",
            Self::Lost => "claim lost",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub(super) enum RouteError {
    #[error("database: {0}")]
    Database(#[from] sea_orm::DbErr),
    #[error("buyer actor unavailable: {0}")]
    Mailbox(#[from] MailboxError),
    #[error("an attempt could not be recorded, so no call was made")]
    NotRecorded,
    #[error("a buyer's answer could not be recorded: nothing more is sent for this lead")]
    AnswerNotRecorded,
    #[error("the claim was taken over")]
    ClaimLost,
    #[error("the buyer actor crashed during the call")]
    BuyerCrashed,
    #[error("shutting down")]
    ShuttingDown,
}

impl RouteError {
    /// How the lead is let go after this error.
    pub(super) fn end(self, failures_before: u32) -> WalkEnd {
        match self {
            Self::ClaimLost => WalkEnd::Lost,
            // Not the lead's fault: routed again at once.
            Self::ShuttingDown => WalkEnd::LetGo(LeadEnd::State(LeadState::Received)),
            Self::Database(ref error) if is_unreachable(error) => {
                tracing::warn!(%self, "routing stopped; the lead is routed again");
                WalkEnd::LetGo(LeadEnd::State(LeadState::Received))
            }
            error => {
                tracing::error!(%error, "routing failed; the lead is routed again after a backoff");
                WalkEnd::LetGo(LeadEnd::Failed {
                    reason: error.to_string(),
                    failures_before,
                })
            }
        }
    }

    /// The offers that stop a walk.
    pub(super) fn of(offered: &Offered) -> Option<Self> {
        match offered {
            Offered::Unrecorded(_) => Some(Self::AnswerNotRecorded),
            Offered::NotRecorded => Some(Self::NotRecorded),
            Offered::Fenced => Some(Self::ClaimLost),
            Offered::Crashed => Some(Self::BuyerCrashed),
            Offered::Called(_) | Offered::Sold(_) | Offered::Skipped(_) => None,
        }
    }
}

//! An operator's retry (`POST /v1/attempts/{id}/retry`), owned by the
//! `Router` so that the caller going away changes nothing: the lead (unsold
//! or unknown) is held under a claim like a walk, the attempt's snapshot is
//! replayed through the buyer's actor as a new row with `retry_of`, and the
//! call follows the routing table: an accepted post is the sale (committed
//! with its answer, never a second one), a timed-out post leaves the lead
//! `unknown` with an alert (as does one cut off by its buyer actor's
//! crash), an answer that could not be recorded leaves the lead to be
//! routed again from its history.

use std::sync::Arc;

use actix::prelude::*;
use entity::{attempt, lead};

use super::buyer::{OfferLead, Retry};
use super::directory::BuyerHandle;
use super::routing_context::RoutingContext;
use crate::buyer::recorded_call::Offered;
use crate::buyer::request::{LeadOffer, PingResult};
use crate::config::{buyer_from_snapshot, BuyerSettings};
use crate::domain::{
    AttemptKind, AttemptOutcome, CallKind, CallOutcome, ClaimToken, LeadId, LeadState,
};
use crate::store::{HeldLead, LeadEnd};
use crate::telemetry;

/// Replay this attempt; answers the new attempt row.
#[derive(Message)]
#[rtype(result = "Result<attempt::Model, RetryError>")]
pub struct RetryAttempt {
    pub attempt_id: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RetryError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unavailable(String),
}

impl From<sea_orm::DbErr> for RetryError {
    fn from(error: sea_orm::DbErr) -> Self {
        Self::Unavailable(format!("database: {error}"))
    }
}

/// A lead held for a retry.
pub struct Held {
    lead: lead::Model,
    original: attempt::Model,
    kind: CallKind,
    buyer: BuyerHandle,
    settings: BuyerSettings,
    token: ClaimToken,
    /// The state the lead goes back to when the retry decides nothing.
    previous: LeadState,
}

impl Held {
    pub fn lead_id(&self) -> LeadId {
        LeadId::from(self.lead.id.as_str())
    }

    pub fn token(&self) -> &ClaimToken {
        &self.token
    }
}

/// Checks the attempt can be retried and holds its lead.
pub async fn hold(routing: &RoutingContext, attempt_id: &str) -> Result<Held, RetryError> {
    let store = &routing.store;
    let original = store
        .find_attempt(attempt_id)
        .await?
        .ok_or_else(|| RetryError::NotFound(format!("attempt {attempt_id:?}")))?;
    let kind = match AttemptKind::parse(&original.kind) {
        Some(AttemptKind::Call(kind)) => kind,
        _ => {
            return Err(RetryError::Conflict(format!(
                "a {} attempt cannot be retried, only pings and posts",
                original.kind
            )))
        }
    };
    if AttemptOutcome::parse(&original.outcome) == Some(AttemptOutcome::InFlight) {
        return Err(RetryError::Conflict(
            "the attempt is still in flight".into(),
        ));
    }
    let lead = store
        .find_lead(&original.lead_id)
        .await?
        .ok_or_else(|| RetryError::NotFound(format!("lead {:?}", original.lead_id)))?;
    let previous = match LeadState::parse(&lead.state) {
        Some(settled @ (LeadState::Unsold | LeadState::Unknown)) => settled,
        Some(LeadState::Sold) => {
            return Err(RetryError::Conflict(
                "the lead is already sold; a retry could sell it twice".into(),
            ))
        }
        _ => {
            return Err(RetryError::Conflict(format!(
                "only the attempts of an unsold or unknown lead can be retried; this one is {}",
                lead.state
            )))
        }
    };
    if previous == LeadState::Unknown {
        only_the_unknown_post(store, &lead, &original).await?;
    }
    let snapshot = store
        .config_snapshot(&original.snapshot_id)
        .await?
        .ok_or_else(|| RetryError::Conflict("the attempt's snapshot is missing".into()))?;
    let settings = buyer_from_snapshot(&snapshot).map_err(|problems| {
        let listed: Vec<String> = problems.iter().map(ToString::to_string).collect();
        RetryError::Conflict(format!(
            "the snapshot cannot be replayed: {}",
            listed.join("; ")
        ))
    })?;
    let buyer = routing.directory.get(&original.buyer_id).ok_or_else(|| {
        RetryError::Conflict(format!(
            "buyer {:?} is no longer configured",
            original.buyer_id
        ))
    })?;
    let owner = format!("{}:retry", routing.instance_id);
    let token = store
        .claim_settled(
            &LeadId::from(lead.id.as_str()),
            previous,
            &owner,
            routing.lease,
        )
        .await?
        .ok_or_else(|| RetryError::Conflict("the lead changed meanwhile; try again".into()))?;
    Ok(Held {
        lead,
        original,
        kind,
        buyer,
        settings,
        token,
        previous,
    })
}

/// An `unknown` lead may have been sold by its unanswered post: a retry
/// may only ask that same buyer again (the buyer dedupes on the same
/// Idempotency-Key), never offer the lead to another one.
async fn only_the_unknown_post(
    store: &crate::store::Store,
    lead: &lead::Model,
    original: &attempt::Model,
) -> Result<(), RetryError> {
    let timeout = Some(AttemptOutcome::Call(CallOutcome::Timeout));
    let unanswered: Vec<String> = store
        .attempts_of(&lead.id)
        .await?
        .into_iter()
        .filter(|attempt| {
            AttemptKind::parse(&attempt.kind) == Some(AttemptKind::POST)
                && AttemptOutcome::parse(&attempt.outcome) == timeout
        })
        .map(|attempt| attempt.buyer_id)
        .collect();
    if unanswered.iter().all(|buyer| *buyer == original.buyer_id) {
        return Ok(());
    }
    Err(RetryError::Conflict(format!(
        "the lead is unknown: its post to {} may have sold it; retry that post or resolve the lead first",
        unanswered.join(", ")
    )))
}

/// Makes the retried call, lets the lead go, and answers the new row.
pub async fn replay(routing: &RoutingContext, held: Held) -> Result<attempt::Model, RetryError> {
    let store = &routing.store;
    let lead_id = held.lead.id.clone();
    let ping = match held.kind {
        CallKind::Post => accepted_ping(routing, &lead_id, &held.original.buyer_id).await?,
        CallKind::Ping => PingResult::default(),
    };
    let offered = held
        .buyer
        .addr
        .send(OfferLead {
            lead: Arc::new(LeadOffer::of(&held.lead)),
            kind: held.kind,
            ping,
            instance_id: routing.instance_id.clone(),
            claim_token: held.token.clone(),
            payout: routing.settings.current().payout_rule(&held.lead.source_id),
            retry: Some(Retry {
                of: held.original.id.clone(),
                settings: Arc::new(held.settings),
            }),
            answered: None,
            hold_answer: false,
            span: telemetry::lead_span(&lead_id, &held.lead.source_id),
        })
        .await;
    let (end, failure) = match &offered {
        Ok(Offered::Sold(_)) => {
            // Earlier posts of the lead to this buyer that got no answer
            // kept their cap slots in case they sold: this sale holds its own.
            let released = store
                .release_earlier_unanswered_posts(&lead_id, &held.original.buyer_id)
                .await;
            if let Err(error) = released {
                tracing::error!(%error, %lead_id, "cap slots of unanswered posts not given back");
            }
            (None, None)
        }
        Ok(Offered::Called(report))
            if held.kind == CallKind::Post && report.outcome == CallOutcome::Timeout =>
        {
            let why = "got no answer in time";
            routing
                .alert_post_unknown("retried post", &lead_id, &held.original.buyer_id, why)
                .await;
            (Some(LeadState::Unknown), None)
        }
        Ok(Offered::Called(_) | Offered::Skipped(_)) => (Some(held.previous), None),
        // Its fate is in its history now: routed again, which settles it.
        Ok(Offered::Unrecorded(_)) => (
            Some(LeadState::Received),
            Some("the buyer answered, but the answer could not be recorded".to_string()),
        ),
        // Nothing was written: the lead is as it was.
        Ok(Offered::NotRecorded | Offered::Fenced) => (
            Some(held.previous),
            Some("the retry could not be recorded".to_string()),
        ),
        // The actor went down, perhaps after the row was written and the
        // call sent. Settled here, under the retry's claim, as recovery
        // settles a call left in flight: a post as a timeout (the lead
        // `unknown`, never re-sent), a ping as an error (the lead as it
        // was). Never routed on to other buyers: one retry was asked for.
        Ok(Offered::Crashed) | Err(_) => {
            let (posts, _) = store.settle_interrupted_attempts(&lead_id).await?;
            let state = if posts > 0 {
                let why = "was cut off when the buyer actor crashed";
                routing
                    .alert_post_unknown("retried post", &lead_id, &held.original.buyer_id, why)
                    .await;
                LeadState::Unknown
            } else {
                held.previous
            };
            let failure = match &offered {
                Err(error) => format!("buyer actor: {error}"),
                Ok(_) => "the buyer actor crashed during the retry".to_string(),
            };
            (Some(state), Some(failure))
        }
    };
    if let Some(state) = end {
        let release = HeldLead {
            lead_id: LeadId::from(lead_id.as_str()),
            token: held.token,
            end: LeadEnd::State(state),
        };
        store
            .settle_leads(std::slice::from_ref(&release), routing.failures)
            .await?;
    }
    if let Some(failure) = failure {
        return Err(RetryError::Unavailable(failure));
    }
    store
        .attempts_of(&lead_id)
        .await?
        .into_iter()
        .rev()
        .find(|attempt| attempt.retry_of.as_deref() == Some(held.original.id.as_str()))
        .ok_or_else(|| RetryError::Unavailable("the retry left no attempt row".into()))
}

/// The ping this buyer accepted for the lead, for a retried post.
async fn accepted_ping(
    routing: &RoutingContext,
    lead_id: &str,
    buyer_id: &str,
) -> Result<PingResult, RetryError> {
    let accepted = Some(AttemptOutcome::Call(CallOutcome::Accepted));
    let attempts = routing.store.attempts_of(lead_id).await?;
    Ok(attempts
        .into_iter()
        .rev()
        .find(|attempt| {
            attempt.buyer_id == buyer_id
                && AttemptKind::parse(&attempt.kind) == Some(AttemptKind::PING)
                && AttemptOutcome::parse(&attempt.outcome) == accepted
        })
        .map(|ping| PingResult {
            ping_id: ping.ping_id,
            bid: ping.bid,
        })
        .unwrap_or_default())
}

//! One walk of a lead over its buyers, shared by the two orders a lead is
//! offered in: the waterfall (`routing.mode = "waterfall"`: by priority,
//! ping then post, one buyer at a time) here, and the auction in
//! `auction.rs`. Every row a walk writes carries its claim token; the
//! buyers' skips and calls, the post (whose sale the buyer actor commits
//! with its answer), the end of an unsold walk and its alert are here.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use chrono::Utc;
use entity::lead;
use serde_json::Value;

use super::buyer::OfferLead;
use super::directory::BuyerHandle;
use super::waterfall::{RouteError, RoutingContext, WalkEnd};
use crate::alerts::AlertKind;
use crate::buyer::recorded_call::Offered;
use crate::buyer::request::{LeadOffer, PingResult};
use crate::buyer::schedule::takes_leads;
use crate::config::{BuyerSettings, PayoutRule};
use crate::domain::{
    AttemptKind, CallKind, CallOutcome, ClaimToken, LeadId, LeadState, SkipReason,
};
use crate::store::{CapSlot, LeadEnd, NewAttempt, Written};

/// A lead being offered under one claim.
pub(super) struct Walk<'a> {
    pub(super) routing: &'a RoutingContext,
    pub(super) row: &'a lead::Model,
    token: &'a ClaimToken,
    offer: Arc<LeadOffer>,
    /// What the lead's source is paid if it sells (read once per walk).
    payout: PayoutRule,
    tally: Tally,
}

impl<'a> Walk<'a> {
    pub(super) fn new(
        routing: &'a RoutingContext,
        row: &'a lead::Model,
        token: &'a ClaimToken,
    ) -> Self {
        Self {
            routing,
            row,
            token,
            offer: Arc::new(LeadOffer::of(row)),
            payout: routing.settings.current().payout_rule(&row.source_id),
            tally: Tally::default(),
        }
    }

    /// The waterfall: buyers by priority, each pinged (if it has a ping)
    /// and posted, until the first accepted post.
    pub(super) async fn waterfall(
        mut self,
        finished: &HashSet<String>,
    ) -> Result<WalkEnd, RouteError> {
        let buyers = self.routing.directory.all();
        for buyer in buyers.iter().filter(|buyer| buyer.settings.enabled) {
            if finished.contains(&buyer.settings.id) || !self.eligible(&buyer.settings).await? {
                continue;
            }
            let mut ping = PingResult::default();
            if buyer.settings.ping.is_some() {
                self.still_going()?;
                let offered = self
                    .call(buyer, CallKind::Ping, PingResult::default())
                    .await?;
                match offered {
                    Offered::Called(report) if report.outcome == CallOutcome::Accepted => {
                        ping = PingResult {
                            ping_id: report.ping_id,
                            bid: report.bid,
                        };
                    }
                    _ => continue,
                }
                if ping
                    .bid
                    .is_some_and(|bid| bid < self.floor(&buyer.settings))
                {
                    self.skip(&buyer.settings, SkipReason::BelowMinBid).await?;
                    continue;
                }
            }
            if let Some(end) = self.post(buyer, ping).await? {
                return Ok(end);
            }
        }
        Ok(self.unsold().await)
    }

    /// A skip row (its outcome the reason), while the claim holds.
    pub(super) async fn skip(
        &self,
        settings: &BuyerSettings,
        reason: SkipReason,
    ) -> Result<(), RouteError> {
        let attempt = NewAttempt {
            lead_id: LeadId::from(self.row.id.as_str()),
            buyer_id: settings.id.clone(),
            kind: AttemptKind::Skip,
            request: Value::Null,
            snapshot: settings.snapshot.clone(),
            retry_of: None,
            instance_id: self.routing.instance_id.to_string(),
            claim_token: self.token.clone(),
            caps: Vec::new(),
        };
        match self.routing.store.record_skip(attempt, reason).await? {
            Written::Fenced => Err(RouteError::ClaimLost),
            _ => Ok(()),
        }
    }

    /// Whether the buyer may be offered the lead: not a test lead it does
    /// not take, its filters pass, it is open, its caps are not full;
    /// otherwise the skip is written and false answered.
    pub(super) async fn eligible(&self, settings: &BuyerSettings) -> Result<bool, RouteError> {
        let caps = CapSlot::for_post(settings, Utc::now());
        let reason = if self.row.is_test && !settings.accept_test_leads {
            SkipReason::TestLead
        } else if !filters_pass(settings, &self.offer) {
            SkipReason::Filtered
        } else if !takes_leads(settings, self.routing.clock.now()) {
            SkipReason::ClosedHours
        } else if !caps.is_empty() && self.routing.store.cap_reached(&caps).await? {
            SkipReason::Capped
        } else {
            return Ok(true);
        };
        self.skip(settings, reason).await?;
        Ok(false)
    }

    /// The lowest bid this buyer is posted for: its `min_bid`, and the
    /// routing `reserve_price`.
    pub(super) fn floor(&self, settings: &BuyerSettings) -> f64 {
        settings
            .min_bid
            .into_iter()
            .chain(self.routing.reserve_price)
            .fold(f64::MIN, f64::max)
    }

    /// The offer of one call.
    pub(super) fn offer(&self, kind: CallKind, ping: PingResult) -> OfferLead {
        OfferLead {
            lead: self.offer.clone(),
            kind,
            ping,
            instance_id: self.routing.instance_id.clone(),
            claim_token: self.token.clone(),
            payout: self.payout,
            retry: None,
        }
    }

    /// Counts an offer's result; an error when it stops the walk.
    pub(super) fn note(&mut self, offered: Offered) -> Result<Offered, RouteError> {
        self.tally.note(&offered);
        match RouteError::of(&offered) {
            Some(stop) => Err(stop),
            None => Ok(offered),
        }
    }

    /// Calls that never answered in time count as failed (for the alert).
    pub(super) fn note_unanswered(&mut self) {
        self.tally.failed = true;
    }

    /// One call through the buyer's actor.
    async fn call(
        &mut self,
        buyer: &BuyerHandle,
        kind: CallKind,
        ping: PingResult,
    ) -> Result<Offered, RouteError> {
        let offered = buyer.addr.send(self.offer(kind, ping)).await?;
        self.note(offered)
    }

    /// Posts to the buyer; `Some` ends the walk (sold, or unknown after a
    /// post that got no answer: never re-sent, an alert kept).
    pub(super) async fn post(
        &mut self,
        buyer: &BuyerHandle,
        ping: PingResult,
    ) -> Result<Option<WalkEnd>, RouteError> {
        // A ping can take long: shutdown stops the post too (and the
        // post's row is written only while our claim holds).
        self.still_going()?;
        match self.call(buyer, CallKind::Post, ping).await? {
            Offered::Sold(_) => Ok(Some(WalkEnd::Settled)),
            Offered::Called(report) if report.outcome == CallOutcome::Timeout => {
                let (lead_id, buyer_id) = (&self.row.id, &buyer.settings.id);
                let message = format!(
                    "post of lead {lead_id} to buyer {buyer_id} got no answer in time: lead unknown, not re-sent"
                );
                self.routing
                    .alerts
                    .raise(
                        AlertKind::PostTimeout,
                        Some(buyer_id),
                        Some(lead_id),
                        &message,
                    )
                    .await;
                Ok(Some(WalkEnd::LetGo(LeadEnd::State(LeadState::Unknown))))
            }
            _ => Ok(None),
        }
    }

    /// No buyer bought it; when none even answered, an alert says so.
    pub(super) async fn unsold(&self) -> WalkEnd {
        if self.tally.failed && !self.tally.rejected {
            let message = format!(
                "lead {} unsold: no buyer rejected it, every call failed or was skipped for a circuit or load",
                self.row.id
            );
            self.routing
                .alerts
                .raise(
                    AlertKind::AllBuyersFailed,
                    None,
                    Some(&self.row.id),
                    &message,
                )
                .await;
        }
        WalkEnd::LetGo(LeadEnd::State(LeadState::Unsold))
    }

    /// Before each call: not shutting down.
    pub(super) fn still_going(&self) -> Result<(), RouteError> {
        if self.routing.draining.load(Ordering::Relaxed) {
            return Err(RouteError::ShuttingDown);
        }
        Ok(())
    }
}

/// What the buyers offered a lead made of it, for the "every buyer failed" alert.
#[derive(Default)]
struct Tally {
    rejected: bool,
    failed: bool,
}

impl Tally {
    fn note(&mut self, offered: &Offered) {
        match offered {
            Offered::Called(report) => match report.outcome {
                CallOutcome::Rejected => self.rejected = true,
                CallOutcome::Error | CallOutcome::Timeout => self.failed = true,
                CallOutcome::Accepted => {}
            },
            Offered::Skipped(SkipReason::CircuitOpen | SkipReason::Busy) => self.failed = true,
            _ => {}
        }
    }
}

/// `filters = { state = ["CA", "TX"] }`: every named field must hold one of
/// its values (compared without regard to case).
fn filters_pass(settings: &BuyerSettings, offer: &LeadOffer) -> bool {
    settings.filters.iter().all(|(field, allowed)| {
        offer
            .fields
            .get(field)
            .and_then(Value::as_str)
            .is_some_and(|value| allowed.iter().any(|ok| ok.eq_ignore_ascii_case(value)))
    })
}

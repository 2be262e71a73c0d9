//! One walk of a lead over its buyers, shared by the two orders a lead is
//! offered in: the waterfall (`routing.mode = "waterfall"`: by priority,
//! ping then post, one buyer at a time) here, and the auction in
//! `auction.rs`. Every row a walk writes carries its claim token; the
//! buyers' skips and calls, the post (whose sale the buyer actor commits
//! with its answer), the end of an unsold walk and its alert are here.
//! A waterfall ping's answer is held until the walk's next row, which
//! writes it in its own commit (one commit wait per call, not two); a walk
//! that has no next row writes it on its own before it ends.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use chrono::Utc;
use entity::lead;
use serde_json::Value;

use super::buyer::OfferLead;
use super::directory::BuyerHandle;
use super::routing_context::{RouteError, RoutingContext, WalkEnd};
use crate::alerts::AlertKind;
use crate::buyer::recorded_call::{CallReport, Offered};
use crate::buyer::request::{LeadOffer, PingResult};
use crate::buyer::schedule::takes_leads;
use crate::config::{BuyerSettings, PayoutRule};
use crate::domain::{
    AttemptKind, CallKind, CallOutcome, ClaimToken, LeadId, LeadState, SkipReason,
};
use crate::store::{CapSlot, LeadEnd, NewAttempt, Unwritten, Written};

/// A lead being offered under one claim.
pub(super) struct Walk<'a> {
    pub(super) routing: &'a RoutingContext,
    pub(super) row: &'a lead::Model,
    token: &'a ClaimToken,
    offer: Arc<LeadOffer>,
    /// What the lead's source is paid if it sells (read once per walk).
    payout: PayoutRule,
    tally: Tally,
    /// The last ping's answer, until a row's commit brings it.
    unwritten: Option<Unwritten>,
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
            unwritten: None,
        }
    }

    /// The waterfall: buyers by priority, each pinged (if it has a ping)
    /// and posted, until the first accepted post; then the last ping's
    /// answer, if no row brought it.
    pub(super) async fn waterfall(
        mut self,
        finished: &HashSet<String>,
    ) -> Result<WalkEnd, RouteError> {
        let end = self.walk_by_priority(finished).await;
        let Some(unwritten) = self.unwritten.take() else {
            return end;
        };
        let store = &self.routing.store;
        // Written only onto a row still `in_flight`: one a row did bring
        // (its commit unconfirmed) is not written twice.
        match store
            .finish_attempt(&unwritten.attempt_id, unwritten.end, Vec::new())
            .await
        {
            Ok(_) => end,
            // As when an answer cannot be written at once: the lead is
            // routed again, and its ping then settled as interrupted.
            Err(error) => end.and(Err(RouteError::Database(error))),
        }
    }

    async fn walk_by_priority(
        &mut self,
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
        &mut self,
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
            answered: self.unwritten.clone(),
        };
        let written = self.routing.store.record_skip(attempt, reason).await?;
        self.unwritten = None;
        match written {
            Written::Fenced => Err(RouteError::ClaimLost),
            _ => Ok(()),
        }
    }

    /// Whether the buyer may be offered the lead: not a test lead it does
    /// not take, its filters pass, it is open, its caps are not full;
    /// otherwise the skip is written and false answered.
    pub(super) async fn eligible(&mut self, settings: &BuyerSettings) -> Result<bool, RouteError> {
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
            answered: None,
            hold_answer: false,
            span: tracing::Span::current(),
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

    /// One call through the buyer's actor, one at a time: it brings the
    /// last ping's answer into its row's commit, and a ping's own answer
    /// comes back unwritten, for the next row.
    async fn call(
        &mut self,
        buyer: &BuyerHandle,
        kind: CallKind,
        ping: PingResult,
    ) -> Result<Offered, RouteError> {
        let offer = OfferLead {
            answered: self.unwritten.clone(),
            hold_answer: kind == CallKind::Ping,
            ..self.offer(kind, ping)
        };
        let offered = buyer.addr.send(offer).await?;
        if row_committed(&offered) {
            self.unwritten = None;
        }
        if let Offered::Called(CallReport {
            unwritten: Some(unwritten),
            ..
        }) = &offered
        {
            self.unwritten = Some(unwritten.clone());
        }
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
                let why = "got no answer in time";
                self.routing
                    .alert_post_unknown("post", lead_id, buyer_id, why)
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

/// Whether the offer's row was committed, and with it the answer it
/// brought. A buyer's own skip (circuit, load) may have failed to write:
/// its answer is brought again by the next row (a no-op if it was written).
fn row_committed(offered: &Offered) -> bool {
    matches!(
        offered,
        Offered::Called(_)
            | Offered::Sold(_)
            | Offered::Unrecorded(_)
            | Offered::Fenced
            | Offered::Skipped(SkipReason::Capped)
    )
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

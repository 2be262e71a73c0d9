//! `Waterfall`: routes one lead. Started by the `Router` for a lead it has
//! claimed (lease + claim token); it walks the eligible buyers (`walk.rs`:
//! by priority, ping then post; or `auction.rs`: pinged at once, posted by
//! bid) and stops at the first accepted post (whose sale the buyer actor
//! commits together with the answer), a post timeout, an answer that could
//! not be recorded, or the end of the list; then it tells the router how
//! to let the lead go and stops. It holds nothing
//! that is not in the database: every row it makes is written only while
//! its claim token is the lead's, so a walk whose claim was taken over
//! stops before its next call. A lead picked up again first has its
//! interrupted calls settled (an `in_flight` post becomes a timeout: lead
//! `unknown`, never re-sent; a ping an error: the walk goes on), and a
//! history that already decides it (an accepted post: sold, with its sale
//! written now if its commit had failed; an unanswered post: unknown)
//! ends the walk before any call.

use std::cell::Cell;
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::Arc;

use actix::prelude::*;
use entity::{attempt, lead};
use tracing::Instrument;

use super::routing_context::{RouteError, RoutingContext, WalkEnd};
use super::supervision::guarded;
use super::walk::Walk;
use crate::alerts::AlertKind;
use crate::buyer::recorded_call::sale_price;
use crate::config::{buyer_from_snapshot, RoutingMode};
use crate::domain::{AttemptKind, AttemptOutcome, CallOutcome, ClaimToken, LeadId, LeadState};
use crate::store::{ClaimedLead, LeadEnd, SaleOf, Store};
use crate::telemetry;

/// Sent to the router when a waterfall ends.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WaterfallFinished {
    pub lead_id: LeadId,
    pub end: WalkEnd,
}

pub struct Waterfall {
    lead_id: LeadId,
    /// The lead and its history as claimed (taken when the walk starts).
    claimed: Option<ClaimedLead>,
    claim_token: ClaimToken,
    routing: Arc<RoutingContext>,
    router: Recipient<WaterfallFinished>,
    end: Option<WalkEnd>,
    /// The lead's routing failures before this walk, once read (a walk
    /// that panics counts as one more).
    failures_before: Rc<Cell<u32>>,
}

impl Waterfall {
    pub fn new(
        claimed: ClaimedLead,
        claim_token: ClaimToken,
        routing: Arc<RoutingContext>,
        router: Recipient<WaterfallFinished>,
    ) -> Self {
        Self {
            lead_id: LeadId::from(claimed.row.id.clone()),
            claimed: Some(claimed),
            claim_token,
            routing,
            router,
            end: None,
            failures_before: Rc::default(),
        }
    }
}

impl Actor for Waterfall {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Taken once: a walk starts only once.
        let Some(claimed) = self.claimed.take() else {
            ctx.stop();
            return;
        };
        let routing = self.routing.clone();
        let token = self.claim_token.clone();
        let failures_before = self.failures_before.clone();
        let span = telemetry::lead_span(&claimed.row.id, &claimed.row.source_id);
        let walk = async move {
            let end = route(&routing, claimed, &token, &failures_before).await;
            tracing::info!(%end, "walk ended");
            end
        };
        ctx.spawn(guarded::<Self, _>("waterfall", walk.instrument(span)).map(
            |end, waterfall, ctx| {
                waterfall.end = end;
                ctx.stop()
            },
        ));
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        // A panicked walk is a routing failure like any other. Should this
        // message be lost, the lease runs out and the sweep routes the
        // lead again; its history then decides what is left to do.
        let end = self.end.take().unwrap_or(WalkEnd::LetGo(LeadEnd::Failed {
            reason: "the waterfall panicked".into(),
            failures_before: self.failures_before.get(),
        }));
        self.router.do_send(WaterfallFinished {
            lead_id: self.lead_id.clone(),
            end,
        });
    }
}

/// Routes a lead the router claimed for us under `token`.
async fn route(
    routing: &RoutingContext,
    claimed: ClaimedLead,
    token: &ClaimToken,
    failures: &Cell<u32>,
) -> WalkEnd {
    let failures_before = u32::try_from(claimed.row.route_failures).unwrap_or(0);
    failures.set(failures_before);
    match route_claimed(routing, &claimed.row, claimed.history, token).await {
        Ok(end) => end,
        Err(error) => error.end(failures_before),
    }
}

async fn route_claimed(
    routing: &RoutingContext,
    row: &lead::Model,
    mut history: Vec<attempt::Model>,
    token: &ClaimToken,
) -> Result<WalkEnd, RouteError> {
    let store = &routing.store;
    // Calls left in flight by a routing that stopped (a crash, a restart,
    // an answer that could not be written): settle them first. A fresh
    // lead has no history, so no extra query.
    if history
        .iter()
        .any(|attempt| outcome_of(attempt) == Some(AttemptOutcome::InFlight))
    {
        let (posts, _) = store.settle_interrupted_attempts(&row.id).await?;
        history = store.attempts_of(&row.id).await?;
        if posts > 0 {
            // Whatever history it belongs to: the buyer may have taken it.
            if let Some(end) = sold_by_history(routing, row, &history).await? {
                return Ok(end);
            }
            let message = format!(
                "a post of lead {} was in flight when routing stopped: lead unknown, not re-sent",
                row.id
            );
            routing
                .alerts
                .raise(AlertKind::PostTimeout, None, Some(&row.id), &message)
                .await;
            return Ok(WalkEnd::LetGo(LeadEnd::State(LeadState::Unknown)));
        }
    }
    // An accepted post whose sale never got written sells the lead, in
    // whichever history it is (a reroute cannot hide it).
    if let Some(end) = sold_by_history(routing, row, &history).await? {
        return Ok(end);
    }
    // After a reroute only the attempts since decide the lead.
    let (earlier, current): (Vec<attempt::Model>, Vec<attempt::Model>) =
        history.into_iter().partition(|attempt| {
            row.history_from
                .is_some_and(|from| attempt.started_at < from)
        });
    if let Some(end) = settled_by_history(store, &row.id, &current).await? {
        return Ok(end);
    }
    let mut finished = finished_buyers(&current);
    if !row.offer_tried {
        finished.extend(posted_to(&earlier));
    }
    let walk = Walk::new(routing, row, token);
    match routing.mode {
        RoutingMode::Waterfall => walk.waterfall(&finished).await,
        RoutingMode::Auction => walk.auction(&finished, &current).await,
    }
}

pub(super) fn kind_of(attempt: &attempt::Model) -> Option<AttemptKind> {
    AttemptKind::parse(&attempt.kind)
}

pub(super) fn outcome_of(attempt: &attempt::Model) -> Option<AttemptOutcome> {
    AttemptOutcome::parse(&attempt.outcome)
}

fn is_post(attempt: &attempt::Model) -> bool {
    kind_of(attempt) == Some(AttemptKind::POST)
}

/// Buyers a post went out to.
fn posted_to(history: &[attempt::Model]) -> impl Iterator<Item = String> + '_ {
    history
        .iter()
        .filter(|attempt| is_post(attempt))
        .map(|attempt| attempt.buyer_id.clone())
}

/// An accepted post in the lead's history that has no sale row (its
/// commit failed): the sale is written now, to that buyer.
async fn sold_by_history(
    routing: &RoutingContext,
    row: &lead::Model,
    history: &[attempt::Model],
) -> Result<Option<WalkEnd>, RouteError> {
    let (store, lead_id) = (&routing.store, row.id.as_str());
    let accepted = Some(AttemptOutcome::Call(CallOutcome::Accepted));
    let mut accepted_posts = history
        .iter()
        .filter(|attempt| is_post(attempt) && outcome_of(attempt) == accepted)
        .peekable();
    if accepted_posts.peek().is_none() {
        return Ok(None);
    }
    // Sales returned since still count: their post was sold once.
    let sold_by = store.sale_attempts_of(lead_id).await?;
    let Some(post) = accepted_posts.find(|post| !sold_by.contains(&post.id)) else {
        return Ok(None);
    };
    let snapshot = store.config_snapshot(&post.snapshot_id).await?;
    let price = price_of(post, snapshot.as_ref(), history);
    let sale = SaleOf {
        lead_id,
        buyer_id: &post.buyer_id,
        price,
        payout: routing
            .settings
            .current()
            .payout_rule(&row.source_id)
            .amount(price),
    };
    if store.sell_from_history(&post.id, sale).await? {
        tracing::warn!(%lead_id, buyer_id = %post.buyer_id, "an accepted post had no sale: sold from its history");
    }
    Ok(Some(WalkEnd::Settled))
}

/// A lead routed before (a restart, a lost settle) whose current history
/// already decides it: a sale makes it sold, an unanswered post unknown.
async fn settled_by_history(
    store: &Store,
    lead_id: &str,
    history: &[attempt::Model],
) -> Result<Option<WalkEnd>, RouteError> {
    let posts: Vec<&attempt::Model> = history.iter().filter(|attempt| is_post(attempt)).collect();
    if posts.is_empty() {
        // No post ever went out: nothing is sold or unknown yet.
        return Ok(None);
    }
    if !store.sales_of(&[lead_id.to_string()]).await?.is_empty() {
        return Ok(Some(WalkEnd::LetGo(LeadEnd::State(LeadState::Sold))));
    }
    let timeout = AttemptOutcome::Call(CallOutcome::Timeout);
    let unanswered_post = posts.iter().any(|post| outcome_of(post) == Some(timeout));
    Ok(unanswered_post.then_some(WalkEnd::LetGo(LeadEnd::State(LeadState::Unknown))))
}

/// The price of an accepted post, read again from its answer with the
/// buyer settings its snapshot froze (the ping's bid without them).
fn price_of(
    post: &attempt::Model,
    snapshot: Option<&serde_json::Value>,
    history: &[attempt::Model],
) -> Option<f64> {
    let bid = history
        .iter()
        .filter(|ping| ping.buyer_id == post.buyer_id && kind_of(ping) == Some(AttemptKind::PING))
        .filter_map(|ping| ping.bid)
        .next_back();
    match snapshot.map(buyer_from_snapshot) {
        Some(Ok(settings)) => sale_price(&settings, post.response_body.as_deref(), bid),
        _ => bid,
    }
}

/// Buyers this lead is never offered again: they rejected it, or a post
/// went out to them (accepted, in flight, or its fate unknown).
fn finished_buyers(history: &[attempt::Model]) -> HashSet<String> {
    let rejected = Some(AttemptOutcome::Call(CallOutcome::Rejected));
    let failed_post = Some(AttemptOutcome::Call(CallOutcome::Error));
    history
        .iter()
        .filter(|attempt| {
            outcome_of(attempt) == rejected
                || (is_post(attempt) && outcome_of(attempt) != failed_post)
        })
        .map(|attempt| attempt.buyer_id.clone())
        .collect()
}

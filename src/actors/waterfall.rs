//! `Waterfall`: routes one lead. Started by the `Router` for a lead it has
//! claimed (lease); it walks the eligible buyers by priority (ping, then post) and
//! stops at the first accepted post, a post timeout, or the end of the
//! list; then it hands the final state to the router (which writes
//! settles in groups) and stops. It holds nothing that is not in
//! the database: a waterfall that dies leaves a lease that runs out, and
//! the router's sweep starts the lead again (already-rejected buyers and
//! already-posted buyers are not offered it twice). A lead picked up again
//! first has its interrupted calls settled: an `in_flight` post becomes a
//! timeout (lead `unknown`, never re-sent), an `in_flight` ping an error
//! (the walk goes on).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Datelike, Timelike, Utc};
use entity::{attempt, lead};
use serde_json::Value;

use super::buyer::{OfferLead, Offered};
use super::directory::BuyerDirectory;
use super::supervision::guarded;
use crate::alerts::{AlertKind, Alerts};
use crate::buyer::request::{LeadOffer, PingResult};
use crate::buyer::{CallKind, CallOutcome, SkipReason};
use crate::config::BuyerSettings;
use crate::domain::LeadState;
use crate::store::{NewAttempt, Store};

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
}

/// Sent to the router when a waterfall ends; `state` is the lead's final
/// state to write, if it reached one.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WaterfallFinished {
    pub lead_id: String,
    pub state: Option<LeadState>,
}

pub struct Waterfall {
    lead_id: String,
    routing: Arc<RoutingContext>,
    router: Recipient<WaterfallFinished>,
    outcome: Option<LeadState>,
}

impl Waterfall {
    pub fn new(
        lead_id: String,
        routing: Arc<RoutingContext>,
        router: Recipient<WaterfallFinished>,
    ) -> Self {
        Self {
            lead_id,
            routing,
            router,
            outcome: None,
        }
    }
}

impl Actor for Waterfall {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let routing = self.routing.clone();
        let lead_id = self.lead_id.clone();
        ctx.spawn(
            guarded::<Self, _>("waterfall", async move {
                match route(&routing, &lead_id).await {
                    Ok(Some(state)) => {
                        tracing::info!(%lead_id, state = state.as_str(), "lead routed");
                        Some(state)
                    }
                    Ok(None) => {
                        tracing::warn!(%lead_id, "claimed lead not found");
                        None
                    }
                    Err(RouteError::ShuttingDown) => None,
                    Err(error) => {
                        tracing::error!(%lead_id, %error, "routing stopped; the lead is released and routed again");
                        None
                    }
                }
            })
            .map(|outcome, waterfall, ctx| {
                waterfall.outcome = outcome.flatten();
                ctx.stop()
            }),
        );
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        // Should this message be lost, the lease runs out and the sweep
        // routes the lead again; `settled_by_history` then finishes it.
        self.router.do_send(WaterfallFinished {
            lead_id: self.lead_id.clone(),
            state: self.outcome,
        });
    }
}

#[derive(Debug, thiserror::Error)]
enum RouteError {
    #[error("database: {0}")]
    Database(#[from] sea_orm::DbErr),
    #[error("buyer actor unavailable: {0}")]
    Mailbox(#[from] MailboxError),
    #[error("an attempt could not be recorded, so no call was made")]
    NotRecorded,
    #[error("the lease was lost to another instance")]
    LeaseLost,
    #[error("the buyer actor crashed during the call")]
    BuyerCrashed,
    #[error("shutting down")]
    ShuttingDown,
}

/// Routes a lead the router claimed for us; `None` when it vanished.
async fn route(routing: &RoutingContext, lead_id: &str) -> Result<Option<LeadState>, RouteError> {
    let store = &routing.store;
    let Some(row) = store.find_lead(lead_id).await? else {
        return Ok(None);
    };
    let mut history = store.attempts_of(lead_id).await?;
    // Calls left in flight by a routing that stopped (a crash, a restart):
    // settle them first. A fresh lead has no history, so no extra query.
    if history.iter().any(|attempt| attempt.outcome == "in_flight") {
        let (posts, _) = store.settle_interrupted_attempts(lead_id).await?;
        if posts > 0 {
            let message = format!(
                "a post of lead {lead_id} was in flight when routing stopped: lead unknown, not re-sent"
            );
            routing
                .alerts
                .raise(AlertKind::PostTimeout, None, Some(lead_id), &message)
                .await;
        }
        history = store.attempts_of(lead_id).await?;
    }
    // After a reroute only the attempts since decide the lead.
    let (earlier, current): (Vec<attempt::Model>, Vec<attempt::Model>) =
        history.into_iter().partition(|attempt| {
            row.history_from
                .is_some_and(|from| attempt.started_at < from)
        });
    if let Some(state) = settled_by_history(store, lead_id, &current).await? {
        return Ok(Some(state));
    }
    let mut finished = finished_buyers(&current);
    if !row.offer_tried {
        finished.extend(posted_to(&earlier));
    }
    Ok(Some(walk(routing, &row, &finished).await?))
}

/// Buyers a post went out to.
fn posted_to(history: &[attempt::Model]) -> impl Iterator<Item = String> + '_ {
    history
        .iter()
        .filter(|attempt| attempt.kind == "post")
        .map(|attempt| attempt.buyer_id.clone())
}

/// A lead routed before (a restart, a lost settle) whose history already
/// decides it: sold if it has a sale, unknown if a post went out unanswered.
async fn settled_by_history(
    store: &Store,
    lead_id: &str,
    history: &[attempt::Model],
) -> Result<Option<LeadState>, RouteError> {
    let mut posts = history
        .iter()
        .filter(|attempt| attempt.kind == "post")
        .peekable();
    if posts.peek().is_none() {
        // No post ever went out: nothing is sold or unknown yet.
        return Ok(None);
    }
    if !store.sales_of(&[lead_id.to_string()]).await?.is_empty() {
        return Ok(Some(LeadState::Sold));
    }
    let unanswered_post = posts.any(|attempt| attempt.outcome == "timeout");
    Ok(unanswered_post.then_some(LeadState::Unknown))
}

/// Buyers this lead is never offered again: they rejected it, or a post
/// went out to them (accepted, in flight, or its fate unknown).
fn finished_buyers(history: &[attempt::Model]) -> HashSet<String> {
    history
        .iter()
        .filter(|attempt| {
            attempt.outcome == "rejected" || (attempt.kind == "post" && attempt.outcome != "error")
        })
        .map(|attempt| attempt.buyer_id.clone())
        .collect()
}

async fn walk(
    routing: &RoutingContext,
    row: &lead::Model,
    finished: &HashSet<String>,
) -> Result<LeadState, RouteError> {
    let store = &routing.store;
    let offer = Arc::new(LeadOffer::of(row));
    let mut tally = Tally::default();
    let buyers = routing.directory.all();
    for buyer in buyers.iter().filter(|buyer| buyer.settings.enabled) {
        let settings = &buyer.settings;
        if finished.contains(&settings.id) {
            continue;
        }
        let skip = |reason: SkipReason| {
            let attempt = NewAttempt {
                lead_id: row.id.clone(),
                buyer_id: settings.id.clone(),
                kind: "skip".into(),
                request: Value::Null,
                snapshot: settings.snapshot.clone(),
                retry_of: None,
                instance_id: routing.instance_id.to_string(),
            };
            async move { store.record_skip(attempt, reason.as_str()).await }
        };
        if row.is_test && !settings.accept_test_leads {
            skip(SkipReason::TestLead).await?;
            continue;
        }
        if !filters_pass(settings, &offer) {
            skip(SkipReason::Filtered).await?;
            continue;
        }
        if is_capped(store, settings, Utc::now()).await? {
            skip(SkipReason::Capped).await?;
            continue;
        }
        still_ours(routing, &row.id).await?;
        let offer_call = |kind, ping: PingResult| OfferLead {
            lead: offer.clone(),
            kind,
            ping,
            instance_id: routing.instance_id.clone(),
            retry: None,
        };

        let mut ping = PingResult::default();
        if settings.ping.is_some() {
            let offered = buyer
                .addr
                .send(offer_call(CallKind::Ping, PingResult::default()))
                .await?;
            tally.note(&offered);
            match offered {
                Offered::Called(report) if report.outcome == CallOutcome::Accepted => {
                    ping = PingResult {
                        ping_id: report.ping_id,
                        bid: report.bid,
                    };
                }
                Offered::NotRecorded => return Err(RouteError::NotRecorded),
                Offered::Crashed => return Err(RouteError::BuyerCrashed),
                Offered::Called(_) | Offered::Skipped(_) => continue,
            }
            let floor = settings
                .min_bid
                .into_iter()
                .chain(routing.reserve_price)
                .fold(f64::MIN, f64::max);
            if ping.bid.is_some_and(|bid| bid < floor) {
                skip(SkipReason::BelowMinBid).await?;
                continue;
            }
        }

        // A ping can take long: shutdown or a lost lease stop the post too.
        still_ours(routing, &row.id).await?;
        let bid = ping.bid;
        let offered = buyer.addr.send(offer_call(CallKind::Post, ping)).await?;
        tally.note(&offered);
        match offered {
            Offered::Called(report) => match report.outcome {
                CallOutcome::Accepted => {
                    let price = report.price.or(bid).or(settings.price);
                    if !store
                        .record_sale(&row.id, &settings.id, Some(&report.attempt_id), price)
                        .await?
                    {
                        tracing::warn!(lead_id = %row.id, buyer_id = %settings.id, "a second accepted post: the lead was already sold, no second sale");
                    }
                    return Ok(LeadState::Sold);
                }
                CallOutcome::Timeout => {
                    let message = format!(
                        "post of lead {} to buyer {} got no answer in time: lead unknown, not re-sent",
                        row.id, settings.id
                    );
                    routing
                        .alerts
                        .raise(
                            AlertKind::PostTimeout,
                            Some(&settings.id),
                            Some(&row.id),
                            &message,
                        )
                        .await;
                    return Ok(LeadState::Unknown);
                }
                CallOutcome::Rejected | CallOutcome::Error => continue,
            },
            Offered::NotRecorded => return Err(RouteError::NotRecorded),
            Offered::Crashed => return Err(RouteError::BuyerCrashed),
            Offered::Skipped(_) => continue,
        }
    }
    if tally.failed && !tally.rejected {
        let message = format!(
            "lead {} unsold: no buyer rejected it, every call failed or was skipped for a circuit or load",
            row.id
        );
        routing
            .alerts
            .raise(AlertKind::AllBuyersFailed, None, Some(&row.id), &message)
            .await;
    }
    Ok(LeadState::Unsold)
}

/// Before each call: not shutting down, and the lease (kept by the
/// router's heartbeat) is still ours.
async fn still_ours(routing: &RoutingContext, lead_id: &str) -> Result<(), RouteError> {
    if routing.draining.load(Ordering::Relaxed) {
        return Err(RouteError::ShuttingDown);
    }
    if !routing
        .store
        .holds_lease(lead_id, &routing.instance_id)
        .await?
    {
        return Err(RouteError::LeaseLost);
    }
    Ok(())
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

/// Whether an hourly, daily or monthly cap (UTC periods) is reached.
async fn is_capped(
    store: &Store,
    settings: &BuyerSettings,
    now: DateTime<Utc>,
) -> Result<bool, sea_orm::DbErr> {
    let hour = now
        .with_minute(0)
        .and_then(|t| t.with_second(0))
        .and_then(|t| t.with_nanosecond(0))
        .unwrap_or(now);
    let day = hour.with_hour(0).unwrap_or(hour);
    let month = day.with_day(1).unwrap_or(day);
    for (cap, since) in [
        (settings.hourly_cap, hour),
        (settings.daily_cap, day),
        (settings.monthly_cap, month),
    ] {
        if cap > 0 && store.sales_since(&settings.id, since).await? >= u64::from(cap) {
            return Ok(true);
        }
    }
    Ok(false)
}

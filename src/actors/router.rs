//! `Router`: decides which leads are being routed. Queued leads are rows,
//! not live actors: the router starts at most `MAX_ACTIVE_WATERFALLS`
//! waterfalls, fewer while intake's leads wait longer than usual for their
//! commit (`yielding`: routing narrows, and starts at most its width of
//! walks per window; intake goes first), and its sweep
//! (every `routing.sweep_interval`, and at start) picks up leads in
//! `received` and leads whose lease ran out.
//!
//! Started by the `Overseer`; it starts the `Buyer` actors (the overseer's
//! closure does, once). Handles `RouteLeads` (from intake),
//! `WaterfallFinished`, `RetryAttempt` (an operator's retry, held and
//! settled here like a walk), and `ReofferLeads` (from buyers): when a
//! buyer answers again (or half-opens, or is probed after a start), the
//! unsold leads it failed or was skipped for (circuit open, busy), within
//! a day of arrival, are put back to be routed, all of them page by page;
//! each request is kept until its requeue succeeded (one that a restart
//! dropped or whose statement failed runs again at the next sweep tick).
//! Every claim carries a token; a walk's writes and its settle hold only
//! while the token is the lead's. A walk that failed on our side has its
//! lead let go with a backoff, and set aside for an operator (with an
//! alert) after `routing.failure_limit` failures, so it never starves the
//! others. While routing, it renews the leases of its leads every third of
//! `routing.lease`. `Drain` (graceful shutdown) stops new routing, waits
//! for the waterfalls, and releases what is still held. A restart loses
//! nothing: the next sweep finds every waiting lead in the database.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::buyer::{start_buyer, BuyerEnvironment, InjectedPanics, Reconfigure, ReofferLeads};
use super::directory::BuyerHandle;
use super::retry::{self, RetryAttempt, RetryError};
use super::routing_context::{RoutingContext, WalkEnd};
use super::supervision::{guarded, RestartLog};
use super::waterfall::{Waterfall, WaterfallFinished};
use super::yielding::{IntakeDelay, RoutingYield, WINDOW};
use crate::alerts::AlertKind;
use crate::config::BuyerSettings;
use crate::domain::{ClaimToken, LeadId, LeadState};
use crate::store::{Claimed, HeldLead, LeadEnd};

/// Waterfalls one instance runs at once, at least and at most (each walk
/// holds its lead in memory).
const FEWEST_WATERFALLS: usize = 256;
const MOST_WATERFALLS: usize = 4096;
/// Stored leads that found no room, kept by id for a claim by id (a
/// primary-key lookup) at most; beyond it they are left to the sweep.
const MAX_QUEUED: usize = 8192;
/// Free slots a claim of queued leads, or a sweep, waits for while
/// waterfalls run, so that under load one claim takes many leads.
const CLAIM_CHUNK: usize = 32;
/// Leads stored this recently are still on their way here in a
/// `RouteLeads`: a sweep that reaches them has found no older backlog.
const JUST_STORED: chrono::Duration = chrono::Duration::seconds(1);
/// Unsold leads are offered again to a recovered buyer within this time of arrival.
const REROUTE_WITHIN: chrono::Duration = chrono::Duration::days(1);

/// Route these freshly stored leads.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RouteLeads {
    pub lead_ids: Vec<LeadId>,
}

/// Graceful shutdown: stop routing, give the waterfalls `grace` to end,
/// then release every lead still held.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain {
    pub grace: Duration,
}

/// A reload: these are the buyers now (added ones get an actor, changed
/// ones are reconfigured, removed ones are dropped from the directory;
/// their actors end once no waterfall holds them).
#[derive(Message)]
#[rtype(result = "()")]
pub struct ApplyBuyers {
    pub buyers: Vec<Arc<BuyerSettings>>,
}

pub struct Router {
    routing: Arc<RoutingContext>,
    sweep_interval: Duration,
    restarts: RestartLog,
    /// For buyers a reload adds.
    environment: BuyerEnvironment,
    /// Leads held now (walks and retries), with their claim tokens.
    active: HashMap<LeadId, ClaimToken>,
    /// Those of `active` held by a retry (a future of ours: a restart drops it).
    retrying: HashSet<LeadId>,
    /// Leads a claim by id is being made for.
    claiming: HashSet<LeadId>,
    /// Stored leads waiting for room, oldest first (their rows are the
    /// truth: a restart forgets this and the sweep finds them).
    queued: VecDeque<LeadId>,
    /// More leads wait in the database than were started or queued.
    backlog: bool,
    sweeping: bool,
    /// A sweep was asked for while one ran: run another when it ends.
    sweep_again: bool,
    /// Leads waiting to be let go, written in groups (one write at a time).
    to_settle: Vec<HeldLead>,
    settling: bool,
    /// Each buyer's requests to put its failed leads back, kept until
    /// their requeue succeeded: one that a restart dropped or whose
    /// statement failed is run again (`retry_reoffers`).
    reoffers: HashMap<String, Reoffers>,
    /// When each buyer was last seen answering again (a full re-offer):
    /// leads still being walked then, that end unsold with an earlier
    /// failure at it, are put back when they settle.
    answered_at: HashMap<String, chrono::DateTime<chrono::Utc>>,
    /// Told when the last waterfall ends while draining.
    drained: Vec<oneshot::Sender<()>>,
    /// How many waterfalls may run now.
    width: RoutingYield,
    /// Fault injection (`[faults] router_panics`): full re-offers still to panic.
    requeue_panics: u32,
}

impl Router {
    pub fn new(
        routing: Arc<RoutingContext>,
        sweep_interval: Duration,
        restarts: RestartLog,
        environment: BuyerEnvironment,
        intake_delay: IntakeDelay,
        widest: usize,
        requeue_panics: u32,
    ) -> Self {
        Self {
            routing,
            sweep_interval,
            restarts,
            environment,
            active: HashMap::new(),
            retrying: HashSet::new(),
            claiming: HashSet::new(),
            queued: VecDeque::new(),
            backlog: false,
            sweeping: false,
            sweep_again: false,
            to_settle: Vec::new(),
            settling: false,
            reoffers: HashMap::new(),
            answered_at: HashMap::new(),
            drained: Vec::new(),
            width: RoutingYield::new(intake_delay, widest),
            requeue_panics,
        }
    }

    fn draining(&self) -> bool {
        self.routing.draining.load(Ordering::Relaxed)
    }

    /// Claims the leads that fit (one UPDATE for all), then starts a
    /// waterfall for each lead claimed; the rest are queued by id.
    fn claim_and_start(&mut self, lead_ids: Vec<LeadId>, ctx: &mut Context<Self>) {
        if self.draining() {
            return;
        }
        let room = self.room();
        let mut wanted: Vec<LeadId> = lead_ids
            .into_iter()
            .filter(|id| !self.active.contains_key(id) && !self.claiming.contains(id))
            .collect();
        if wanted.len() > room {
            let overflow = wanted.split_off(room);
            self.queue(overflow);
        }
        if wanted.is_empty() {
            return;
        }
        self.width.started(wanted.len());
        self.claiming.extend(wanted.iter().cloned());
        let routing = self.routing.clone();
        ctx.spawn(
            async move {
                let claimed = routing
                    .store
                    .claim_leads(&wanted, &routing.instance_id, routing.lease)
                    .await;
                (wanted, claimed)
            }
            .into_actor(self)
            .map(|(wanted, claimed), router, ctx| {
                let claimed = claimed.unwrap_or_else(|error| {
                    tracing::error!(%error, "could not claim leads; the sweep will try again");
                    Claimed {
                        token: ClaimToken::fresh(),
                        leads: Vec::new(),
                    }
                });
                for lead_id in &wanted {
                    router.claiming.remove(lead_id);
                }
                router.start_waterfalls(claimed, ctx);
                // Slots this claim held but did not fill go to queued leads.
                router.fill_room(ctx);
                router.check_drained();
            }),
        );
    }

    /// Waterfalls that may still start (`RoutingYield::room`).
    fn room(&self) -> usize {
        self.width.room(self.active.len() + self.claiming.len())
    }

    /// Room enough for a claim while waterfalls run: `CLAIM_CHUNK` slots
    /// (the whole width, if narrower), or all of them when fewer leads wait.
    fn room_for(&self, waiting: usize) -> bool {
        let room = self.room();
        let chunk = CLAIM_CHUNK.min(self.width.width());
        room > 0 && room >= waiting.min(chunk)
    }

    /// Sets the width from intake's delay for a new window, whose room
    /// (wider, or a narrower one's starts renewed) it fills.
    fn yield_to_intake(&mut self, ctx: &mut Context<Self>) {
        let width = self.width.adjust(std::time::Instant::now());
        self.environment.metrics.routing_width(width);
        self.fill_room(ctx);
    }

    /// Keeps stored leads that found no room, up to `MAX_QUEUED`; the rest
    /// are left to the sweep.
    fn queue(&mut self, lead_ids: Vec<LeadId>) {
        for lead_id in lead_ids {
            if self.queued.len() >= MAX_QUEUED {
                self.backlog = true;
                return;
            }
            self.queued.push_back(lead_id);
        }
    }

    /// After a waterfall ended: claims queued leads once there is room for
    /// a chunk of them, else sweeps for a backlog left in the database.
    fn fill_room(&mut self, ctx: &mut Context<Self>) {
        if !self.queued.is_empty() {
            if self.room_for(self.queued.len()) {
                let take = self.room().min(self.queued.len());
                let lead_ids: Vec<LeadId> = self.queued.drain(..take).collect();
                self.claim_and_start(lead_ids, ctx);
            }
            return;
        }
        if self.backlog && self.room_for(CLAIM_CHUNK) {
            self.sweep(ctx);
        }
    }

    /// Starts a waterfall for each lead we now hold, unless one runs for it.
    /// (A sweep may claim a lead that a claim by id still waits for; that
    /// one then finds it taken and leaves it to the sweep.)
    fn start_waterfalls(&mut self, claimed: Claimed, ctx: &mut Context<Self>) {
        for lead in claimed.leads {
            let lead_id = LeadId::from(lead.row.id.clone());
            if self.active.contains_key(&lead_id) {
                continue;
            }
            self.active.insert(lead_id, claimed.token.clone());
            let router = ctx.address().recipient();
            Waterfall::new(lead, claimed.token.clone(), self.routing.clone(), router).start();
        }
    }

    /// Claims leads waiting in the database (received, or with a lease
    /// that ran out), as many as there is room for.
    fn sweep(&mut self, ctx: &mut Context<Self>) {
        if self.draining() {
            return;
        }
        if self.sweeping {
            self.sweep_again = true;
            return;
        }
        let room = self.room() as u64;
        if room == 0 {
            self.backlog = true;
            return;
        }
        self.sweeping = true;
        self.backlog = false;
        self.width.started(room as usize);
        let routing = self.routing.clone();
        ctx.spawn(
            guarded::<Self, _>("router", async move {
                routing
                    .store
                    .claim_waiting(room, &routing.instance_id, routing.lease)
                    .await
            })
            .map(move |claimed, router, ctx| {
                router.sweeping = false;
                match claimed {
                    Some(Ok(claimed)) => {
                        // Oldest first: a full claim that reached leads just
                        // stored left no older one behind.
                        let just_stored = chrono::Utc::now() - JUST_STORED;
                        let reached_new = claimed
                            .leads
                            .iter()
                            .any(|lead| lead.row.received_at > just_stored);
                        router.backlog |= claimed.leads.len() as u64 == room && !reached_new;
                        router.start_waterfalls(claimed, ctx);
                    }
                    Some(Err(error)) => {
                        tracing::error!(%error, "sweep could not claim waiting leads")
                    }
                    None => return,
                }
                if std::mem::take(&mut router.sweep_again) {
                    router.sweep(ctx);
                }
            }),
        );
    }

    /// The lease heartbeat for every lead we are routing.
    fn renew_leases(&mut self, ctx: &mut Context<Self>) {
        if self.active.is_empty() {
            return;
        }
        let tokens: HashSet<&ClaimToken> = self.active.values().collect();
        let tokens: Vec<ClaimToken> = tokens.into_iter().cloned().collect();
        let held = self.active.len();
        let routing = self.routing.clone();
        ctx.spawn(actix::fut::wrap_future(async move {
            match routing.store.renew_leases(&tokens, routing.lease).await {
                Ok(renewed) if renewed < held as u64 => tracing::debug!(
                    renewed,
                    routing = held,
                    "some leads finished or were taken over before their lease was renewed"
                ),
                Ok(_) => {}
                Err(error) => tracing::error!(%error, "could not renew leases"),
            }
        }));
    }

    /// While draining: tells `Drain` once no waterfall runs and every
    /// final state is written.
    fn check_drained(&mut self) {
        if self.draining()
            && self.active.is_empty()
            && self.claiming.is_empty()
            && self.to_settle.is_empty()
            && !self.settling
        {
            for waiter in self.drained.drain(..) {
                let _ = waiter.send(());
            }
        }
    }
}

impl Router {
    /// Writes the waiting final states; states arriving meanwhile wait for
    /// the next write, so under load many leads share one commit.
    fn settle(&mut self, ctx: &mut Context<Self>) {
        if self.settling || self.to_settle.is_empty() {
            return;
        }
        self.settling = true;
        let batch = std::mem::take(&mut self.to_settle);
        let routing = self.routing.clone();
        let answered: Vec<(String, chrono::DateTime<chrono::Utc>)> = self
            .answered_at
            .iter()
            .map(|(buyer, at)| (buyer.clone(), *at))
            .collect();
        ctx.spawn(
            async move {
                let written = routing.store.settle_leads(&batch, routing.failures).await;
                let again = match written {
                    Ok(_) => offer_again_to_recovered(&routing, &batch, &answered).await,
                    Err(_) => 0,
                };
                if let Ok((_, set_aside)) = &written {
                    for lead_id in set_aside {
                        let message = format!(
                            "lead {lead_id} set aside for review after {} routing failures",
                            routing.failures.limit
                        );
                        routing
                            .alerts
                            .raise(AlertKind::RoutingFailed, None, Some(lead_id.as_str()), &message)
                            .await;
                    }
                }
                (written, batch.len(), again)
            }
                .into_actor(self)
                .map(|(written, wanted, again), router, ctx| {
                    router.settling = false;
                    if again > 0 {
                        router.sweep(ctx);
                    }
                    match written {
                        Ok((count, _)) if count as usize != wanted => {
                            tracing::warn!(wanted, count, "some leads were taken over before they were settled")
                        }
                        Ok(_) => {}
                        Err(error) => {
                            tracing::error!(%error, "could not settle leads; their leases run out and they are routed again")
                        }
                    }
                    router.settle(ctx);
                    router.check_drained();
                }),
        );
    }
}

impl Actor for Router {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(4096);
        self.environment.metrics.routing_widest(self.width.widest());
        self.environment.metrics.routing_width(self.width.width());
        self.sweep(ctx);
        ctx.run_interval(self.sweep_interval, |router, ctx| {
            router.sweep(ctx);
            router.retry_reoffers(ctx);
        });
        self.retry_reoffers(ctx);
        ctx.run_interval(WINDOW, |router, ctx| router.yield_to_intake(ctx));
        ctx.run_interval(self.routing.lease / 3, |router, ctx| {
            router.renew_leases(ctx)
        });
    }
}

impl Supervised for Router {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.restarts.restarted("router");
        // Waterfalls outlive a router restart: keep them in `active` so
        // their leases are still renewed and no second one starts. Claims
        // in flight were dropped; their leads come back through the sweep.
        self.claiming.clear();
        self.sweeping = false;
        self.settling = false;
        // Retries and requeues were futures of ours: gone. A retried lead's
        // lease runs out and the sweep settles its call from its history;
        // a requeue runs again once the router has started.
        for lead_id in self.retrying.drain() {
            self.active.remove(&lead_id);
        }
        for reoffers in self.reoffers.values_mut() {
            reoffers.stopped();
        }
    }
}

impl Handler<RouteLeads> for Router {
    type Result = ();

    /// Starts a waterfall per lead while there is room; the rest wait as rows.
    fn handle(&mut self, message: RouteLeads, ctx: &mut Context<Self>) {
        self.claim_and_start(message.lead_ids, ctx);
    }
}

impl Handler<WaterfallFinished> for Router {
    type Result = ();

    /// Lets the lead go as the walk said (nothing to write when a sale
    /// settled it or its claim was taken over).
    fn handle(&mut self, message: WaterfallFinished, ctx: &mut Context<Self>) {
        let token = self.active.remove(&message.lead_id);
        if let (Some(token), WalkEnd::LetGo(end)) = (token, message.end) {
            self.to_settle.push(HeldLead {
                lead_id: message.lead_id,
                token,
                end,
            });
        }
        self.settle(ctx);
        self.fill_room(ctx);
        self.check_drained();
    }
}

/// A buyer's requests to put its failed leads back: the one whose requeue
/// runs now, and one (the later requests, merged) waiting to run.
#[derive(Default)]
struct Reoffers {
    running: Option<ReofferLeads>,
    waiting: Option<ReofferLeads>,
}

impl Reoffers {
    /// The running request's future is gone (a restart): it waits again.
    fn stopped(&mut self) {
        if let Some(running) = self.running.take() {
            self.wait(running);
        }
    }

    fn wait(&mut self, request: ReofferLeads) {
        self.waiting = Some(merged(self.waiting.take(), request));
    }
}

impl Router {
    /// Puts back the buyer's failed leads, one request per buyer at a time
    /// (a request arriving meanwhile runs after it), then sweeps them up.
    fn reoffer(&mut self, request: ReofferLeads, ctx: &mut Context<Self>) {
        if request.limit.is_none() {
            self.answered_at
                .insert(request.buyer_id.clone(), request.failed_before);
        }
        let buyer_id = request.buyer_id.clone();
        self.reoffers
            .entry(buyer_id.clone())
            .or_default()
            .wait(request);
        self.run_reoffer(buyer_id, ctx);
    }

    /// Runs the buyer's waiting request, unless one runs now.
    fn run_reoffer(&mut self, buyer_id: String, ctx: &mut Context<Self>) {
        if self.draining() {
            return;
        }
        let Some(reoffers) = self.reoffers.get_mut(&buyer_id) else {
            return;
        };
        if reoffers.running.is_some() {
            return;
        }
        let Some(request) = reoffers.waiting.take() else {
            self.reoffers.remove(&buyer_id);
            return;
        };
        reoffers.running = Some(request.clone());
        let store = self.routing.store.clone();
        let since = chrono::Utc::now() - REROUTE_WITHIN;
        let inject_panic = request.limit.is_none() && self.requeue_panics > 0;
        if inject_panic {
            self.requeue_panics -= 1;
        }
        ctx.spawn(
            guarded::<Self, _>("router", async move {
                assert!(!inject_panic, "injected router panic ([faults] router_panics)");
                store
                    .requeue_for_buyer(
                        &request.buyer_id,
                        since,
                        request.failed_before,
                        request.limit,
                        None,
                    )
                    .await
            })
            .map(move |requeued, router, ctx| {
                // None: it panicked, and the restart runs the request again.
                let Some(requeued) = requeued else {
                    return;
                };
                let Some(reoffers) = router.reoffers.get_mut(&buyer_id) else {
                    return;
                };
                let Some(ran) = reoffers.running.take() else {
                    return;
                };
                match requeued {
                    Ok(0) => {}
                    Ok(count) => {
                        tracing::info!(%buyer_id, count, "leads put back for a buyer answering again");
                        router.sweep(ctx);
                    }
                    Err(error) => {
                        tracing::error!(%error, %buyer_id, "could not put leads back; trying again");
                        reoffers.wait(ran);
                        return;
                    }
                }
                router.run_reoffer(buyer_id, ctx);
            }),
        );
    }

    /// Runs again the requests a restart or a failed statement left waiting.
    fn retry_reoffers(&mut self, ctx: &mut Context<Self>) {
        let waiting: Vec<String> = self
            .reoffers
            .iter()
            .filter(|(_, reoffers)| reoffers.running.is_none())
            .map(|(buyer_id, _)| buyer_id.clone())
            .collect();
        for buyer_id in waiting {
            self.run_reoffer(buyer_id, ctx);
        }
    }
}

/// Leads that just ended unsold after failing at a buyer that has been
/// seen answering again since: back to be routed (the next sweep takes them).
/// Only the buyers they failed at are asked about, each for the leads it
/// failed.
async fn offer_again_to_recovered(
    routing: &RoutingContext,
    settled: &[HeldLead],
    answered: &[(String, chrono::DateTime<chrono::Utc>)],
) -> u64 {
    let unsold: Vec<LeadId> = settled
        .iter()
        .filter(|lead| matches!(lead.end, LeadEnd::State(LeadState::Unsold)))
        .map(|lead| lead.lead_id.clone())
        .collect();
    if unsold.is_empty() || answered.is_empty() {
        return 0;
    }
    let failed = match routing.store.buyers_failed_for(&unsold).await {
        Ok(failed) => failed,
        Err(error) => {
            tracing::error!(%error, "could not read which buyers unsold leads failed at");
            return 0;
        }
    };
    let since = chrono::Utc::now() - REROUTE_WITHIN;
    let mut requeued = 0;
    for (buyer_id, at) in answered {
        let Some(leads) = failed.get(buyer_id) else {
            continue;
        };
        match routing
            .store
            .requeue_for_buyer(buyer_id, since, *at, None, Some(leads))
            .await
        {
            Ok(count) => requeued += count,
            Err(error) => tracing::error!(%error, %buyer_id, "could not put leads back"),
        }
    }
    requeued
}

/// Two waiting requests for one buyer as one: the later moment, and all
/// leads if either wanted all.
fn merged(waiting: Option<ReofferLeads>, request: ReofferLeads) -> ReofferLeads {
    match waiting {
        None => request,
        Some(earlier) => ReofferLeads {
            failed_before: earlier.failed_before.max(request.failed_before),
            limit: earlier.limit.zip(request.limit).map(|(a, b)| a.max(b)),
            ..request
        },
    }
}

impl Handler<ReofferLeads> for Router {
    type Result = ();

    fn handle(&mut self, message: ReofferLeads, ctx: &mut Context<Self>) {
        self.reoffer(message, ctx);
    }
}

impl Handler<RetryAttempt> for Router {
    type Result = ResponseActFuture<Self, Result<entity::attempt::Model, RetryError>>;

    /// Holds the lead under a claim (renewed like a walk's), makes the
    /// call through the buyer's actor, settles, and answers the new
    /// attempt. A caller that goes away changes nothing.
    fn handle(&mut self, message: RetryAttempt, _ctx: &mut Context<Self>) -> Self::Result {
        let routing = self.routing.clone();
        Box::pin(
            async move { retry::hold(&routing, &message.attempt_id).await }
                .into_actor(self)
                .then(|held, router, _ctx| {
                    let routing = router.routing.clone();
                    let held = match held {
                        Ok(held) => held,
                        Err(error) => {
                            return Box::pin(actix::fut::ready(Err(error)))
                                as ResponseActFuture<Self, _>;
                        }
                    };
                    let lead_id = held.lead_id();
                    router.active.insert(lead_id.clone(), held.token().clone());
                    router.retrying.insert(lead_id.clone());
                    Box::pin(
                        async move { retry::replay(&routing, held).await }
                            .into_actor(router)
                            .map(move |result, router, _ctx| {
                                router.active.remove(&lead_id);
                                router.retrying.remove(&lead_id);
                                result
                            }),
                    )
                }),
        )
    }
}

impl Handler<Drain> for Router {
    type Result = ResponseActFuture<Self, ()>;

    /// Stops routing; waits up to `grace` for the waterfalls (each stops
    /// before its next buyer), then releases every lead still held, so
    /// another instance or the next start routes it at once.
    fn handle(&mut self, message: Drain, _ctx: &mut Context<Self>) -> Self::Result {
        self.routing.draining.store(true, Ordering::Relaxed);
        let (drained, done) = oneshot::channel();
        self.drained.push(drained);
        self.check_drained();
        let grace = message.grace;
        Box::pin(
            async move {
                let finished = actix_web::rt::time::timeout(grace, done).await.is_ok();
                if !finished {
                    tracing::warn!("calls still in flight after the shutdown grace; releasing their leads");
                }
            }
            .into_actor(self)
            .then(|(), router, _ctx| {
                let mut held = std::mem::take(&mut router.to_settle);
                held.extend(router.active.drain().map(|(lead_id, token)| HeldLead {
                    lead_id,
                    token,
                    end: LeadEnd::State(LeadState::Received),
                }));
                let routing = router.routing.clone();
                async move {
                    if held.is_empty() {
                        return;
                    }
                    match routing.store.settle_leads(&held, routing.failures).await {
                        Ok((count, _)) => tracing::info!(count, "leases released at shutdown"),
                        Err(error) => tracing::error!(%error, "could not release leases at shutdown; they run out instead"),
                    }
                }
                .into_actor(router)
            }),
        )
    }
}

impl Handler<ApplyBuyers> for Router {
    type Result = ();

    fn handle(&mut self, message: ApplyBuyers, _ctx: &mut Context<Self>) {
        let directory = &self.routing.directory;
        let running = directory.all();
        let buyers = message
            .buyers
            .into_iter()
            .map(|settings| {
                match running
                    .iter()
                    .find(|buyer| buyer.settings.id == settings.id)
                {
                    Some(existing) if existing.settings.snapshot == settings.snapshot => {
                        existing.clone()
                    }
                    Some(existing) => {
                        existing.addr.do_send(Reconfigure {
                            settings: settings.clone(),
                        });
                        BuyerHandle {
                            settings,
                            addr: existing.addr.clone(),
                        }
                    }
                    None => BuyerHandle {
                        addr: start_buyer(
                            settings.clone(),
                            self.environment.clone(),
                            InjectedPanics::default(),
                        ),
                        settings,
                    },
                }
            })
            .collect();
        directory.replace(buyers);
        let widest = widest(directory.all().iter().map(|buyer| &*buyer.settings));
        self.width.set_widest(widest);
        self.environment.metrics.routing_widest(widest);
    }
}

/// Waterfalls an instance may run at once: twice its enabled buyers'
/// slots, within `FEWEST_WATERFALLS..=MOST_WATERFALLS`. A walk is in one
/// call at a time, and between calls it waits for its own writes: with
/// fewer walks than the buyers' slots, the walks, not the slots, bound the
/// routed rate, the more so the more buyers a lead is walked through (the
/// routing bench's three 64-slot buyers answering in 20 ms were held to
/// 0.74x what their slots allow by 256 walks).
pub fn widest<'a>(buyers: impl IntoIterator<Item = &'a BuyerSettings>) -> usize {
    let slots: usize = buyers
        .into_iter()
        .filter(|buyer| buyer.enabled)
        .map(|buyer| buyer.max_concurrency as usize)
        .sum();
    slots
        .saturating_mul(2)
        .clamp(FEWEST_WATERFALLS, MOST_WATERFALLS)
}

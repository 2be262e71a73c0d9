//! The `Router` actor: its messages, its state and their handlers. What
//! the handlers start lives beside it: taking leads (`claims`), letting
//! them go (`settle`) and re-offers (`requeue`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;

use super::reoffers::Reoffers;
use super::widest::widest;
use crate::actors::buyer::{
    start_buyer, BuyerEnvironment, InjectedPanics, Reconfigure, ReofferLeads,
};
use crate::actors::directory::BuyerHandle;
use crate::actors::retry::{self, RetryAttempt, RetryError};
use crate::actors::routing_context::{RoutingContext, WalkEnd};
use crate::actors::supervision::RestartLog;
use crate::actors::waterfall::WaterfallFinished;
use crate::actors::yielding::{IntakeDelay, RoutingYield, WINDOW};
use crate::config::BuyerSettings;
use crate::domain::{ClaimToken, LeadId, LeadState};
use crate::store::{HeldLead, LeadEnd};

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
    pub(super) routing: Arc<RoutingContext>,
    sweep_interval: Duration,
    restarts: RestartLog,
    /// For buyers a reload adds.
    pub(super) environment: BuyerEnvironment,
    /// Leads held now (walks and retries), with their claim tokens.
    pub(super) active: HashMap<LeadId, ClaimToken>,
    /// Those of `active` held by a retry (a future of ours: a restart drops it).
    retrying: HashSet<LeadId>,
    /// Leads a claim by id is being made for.
    pub(super) claiming: HashSet<LeadId>,
    /// Stored leads waiting for room, oldest first (their rows are the
    /// truth: a restart forgets this and the sweep finds them).
    pub(super) queued: VecDeque<LeadId>,
    /// More leads wait in the database than were started or queued.
    pub(super) backlog: bool,
    pub(super) sweeping: bool,
    /// A sweep was asked for while one ran: run another when it ends.
    pub(super) sweep_again: bool,
    /// Leads waiting to be let go, written in groups (one write at a time).
    pub(super) to_settle: Vec<HeldLead>,
    pub(super) settling: bool,
    /// Each buyer's requests to put its failed leads back, kept until
    /// their requeue succeeded: one that a restart dropped or whose
    /// statement failed is run again (`retry_reoffers`).
    pub(super) reoffers: HashMap<String, Reoffers>,
    /// When each buyer was last seen answering again (a full re-offer):
    /// leads still being walked then, that end unsold with an earlier
    /// failure at it, are put back when they settle.
    pub(super) answered_at: HashMap<String, chrono::DateTime<chrono::Utc>>,
    /// Told when the last waterfall ends while draining.
    drained: Vec<oneshot::Sender<()>>,
    /// How many waterfalls may run now.
    pub(super) width: RoutingYield,
    /// Fault injection (`[faults] router_panics`): full re-offers still to panic.
    pub(super) requeue_panics: u32,
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

    pub(super) fn draining(&self) -> bool {
        self.routing.draining.load(Ordering::Relaxed)
    }

    /// While draining: tells `Drain` once no waterfall runs and every
    /// final state is written.
    pub(super) fn check_drained(&mut self) {
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

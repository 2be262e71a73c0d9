//! `Router`: decides which leads are being routed. Queued leads are rows,
//! not live actors: the router starts at most `MAX_ACTIVE_WATERFALLS`
//! waterfalls, and its sweep (every `routing.sweep_interval`, and at start)
//! picks up leads in `received` and leads whose lease ran out.
//!
//! Started by the `Overseer`; it starts the `Buyer` actors. Handles
//! `RouteLeads` (from intake), `WaterfallFinished`, and `CircuitChanged`
//! (from buyers): when a circuit half-opens or closes, unsold leads that
//! buyer skipped (circuit open, busy) or failed with an error, within a day
//! of arrival, are put back to be routed. A restart loses nothing: the
//! next sweep finds every waiting lead in the database.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use super::buyer::CircuitChanged;
use super::waterfall::{RoutingContext, Waterfall, WaterfallFinished};
use crate::buyer::breaker::CircuitState;
use crate::domain::LeadState;

/// Waterfalls running at once in one instance.
const MAX_ACTIVE_WATERFALLS: usize = 256;
/// Unsold leads are offered again to a recovered buyer within this time of arrival.
const REROUTE_WITHIN: chrono::Duration = chrono::Duration::days(1);
/// At most this many leads are put back per circuit close; later closes
/// and sweeps pick up the rest.
const REQUEUE_PER_CLOSE: u64 = 10_000;

/// Route these freshly stored leads.
#[derive(Message)]
#[rtype(result = "()")]
pub struct RouteLeads {
    pub lead_ids: Vec<String>,
}

pub struct Router {
    routing: Arc<RoutingContext>,
    sweep_interval: Duration,
    active: HashSet<String>,
    /// More leads wait in the database than were started.
    backlog: bool,
    sweeping: bool,
    /// A sweep was asked for while one ran: run another when it ends.
    sweep_again: bool,
    /// Final states waiting to be written, in groups (one write at a time).
    to_settle: Vec<(String, LeadState)>,
    settling: bool,
}

impl Router {
    pub fn new(routing: Arc<RoutingContext>, sweep_interval: Duration) -> Self {
        Self {
            routing,
            sweep_interval,
            active: HashSet::new(),
            backlog: false,
            sweeping: false,
            sweep_again: false,
            to_settle: Vec::new(),
            settling: false,
        }
    }

    /// Claims the leads that fit (one UPDATE for all), then starts a
    /// waterfall for each lead claimed; the rest wait as rows.
    fn claim_and_start(&mut self, lead_ids: Vec<String>, ctx: &mut Context<Self>) {
        let room = MAX_ACTIVE_WATERFALLS.saturating_sub(self.active.len());
        let fresh: Vec<String> = lead_ids
            .into_iter()
            .filter(|id| !self.active.contains(id))
            .collect();
        if fresh.len() > room {
            self.backlog = true;
        }
        let wanted: Vec<String> = fresh.into_iter().take(room).collect();
        if wanted.is_empty() {
            return;
        }
        self.active.extend(wanted.iter().cloned());
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
                    Vec::new()
                });
                for lead_id in &wanted {
                    if !claimed.contains(lead_id) {
                        router.active.remove(lead_id);
                    }
                }
                for lead_id in claimed {
                    Waterfall::new(lead_id, router.routing.clone(), ctx.address().recipient())
                        .start();
                }
            }),
        );
    }

    /// Looks in the database for leads waiting to be routed.
    fn sweep(&mut self, ctx: &mut Context<Self>) {
        if self.sweeping {
            self.sweep_again = true;
            return;
        }
        let room = MAX_ACTIVE_WATERFALLS.saturating_sub(self.active.len());
        if room == 0 {
            self.backlog = true;
            return;
        }
        self.sweeping = true;
        self.backlog = false;
        let store = self.routing.store.clone();
        let limit = (room + self.active.len()) as u64;
        ctx.spawn(
            async move { store.routable_leads(limit).await }
                .into_actor(self)
                .map(move |found, router, ctx| {
                    router.sweeping = false;
                    match found {
                        Ok(ids) => {
                            router.backlog |= ids.len() as u64 == limit;
                            router.claim_and_start(ids, ctx);
                        }
                        Err(error) => tracing::error!(%error, "sweep could not read waiting leads"),
                    }
                    if std::mem::take(&mut router.sweep_again) {
                        router.sweep(ctx);
                    }
                }),
        );
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
        ctx.spawn(
            async move { (routing.store.settle_leads(&routing.instance_id, &batch).await, batch.len()) }
                .into_actor(self)
                .map(|(written, wanted), router, ctx| {
                    router.settling = false;
                    match written {
                        Ok(count) if count as usize != wanted => {
                            tracing::warn!(wanted, count, "some leads were taken over before they were settled")
                        }
                        Ok(_) => {}
                        Err(error) => {
                            tracing::error!(%error, "could not settle leads; their leases run out and they are routed again")
                        }
                    }
                    router.settle(ctx);
                }),
        );
    }
}

impl Actor for Router {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(4096);
        self.sweep(ctx);
        ctx.run_interval(self.sweep_interval, |router, ctx| router.sweep(ctx));
    }
}

impl Supervised for Router {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        tracing::warn!(
            active = self.active.len(),
            "router restarting; the sweep recovers waiting leads"
        );
        self.active.clear();
        self.sweeping = false;
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

    fn handle(&mut self, message: WaterfallFinished, ctx: &mut Context<Self>) {
        self.active.remove(&message.lead_id);
        if let Some(state) = message.state {
            self.to_settle.push((message.lead_id, state));
            self.settle(ctx);
        }
        if self.backlog {
            self.sweep(ctx);
        }
    }
}

impl Handler<CircuitChanged> for Router {
    type Result = ();

    /// Half-open: put back as many leads as there are probes. Closed: put
    /// back the buyer's skipped and failed leads. Then sweep them up.
    fn handle(&mut self, message: CircuitChanged, ctx: &mut Context<Self>) {
        let limit = match message.state {
            CircuitState::HalfOpen => u64::from(message.half_open_probes),
            CircuitState::Closed => REQUEUE_PER_CLOSE,
            CircuitState::Open => return,
        };
        let store = self.routing.store.clone();
        let since = chrono::Utc::now() - REROUTE_WITHIN;
        let buyer_id = message.buyer_id;
        ctx.spawn(
            async move {
                (
                    store.requeue_unsold_for(&buyer_id, since, limit).await,
                    buyer_id,
                )
            }
            .into_actor(self)
            .map(|(requeued, buyer_id), router, ctx| match requeued {
                Ok(0) => {}
                Ok(count) => {
                    tracing::info!(%buyer_id, count, "leads put back for a recovered buyer");
                    router.sweep(ctx);
                }
                Err(error) => tracing::error!(%error, %buyer_id, "could not put leads back"),
            }),
        );
    }
}

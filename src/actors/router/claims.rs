//! Taking leads for the router: claims by id of leads just stored (the
//! rest queued by id while there is no room), the sweep for leads waiting
//! in the database, the room the routing width leaves, and the lease
//! heartbeat of the leads held.

use std::collections::HashSet;

use actix::prelude::*;

use super::actor::Router;
use crate::actors::supervision::guarded;
use crate::actors::waterfall::Waterfall;
use crate::domain::{ClaimToken, LeadId};
use crate::store::Claimed;

/// Stored leads that found no room, kept by id for a claim by id (a
/// primary-key lookup) at most; beyond it they are left to the sweep.
const MAX_QUEUED: usize = 8192;
/// Free slots a claim of queued leads, or a sweep, waits for while
/// waterfalls run, so that under load one claim takes many leads.
const CLAIM_CHUNK: usize = 32;
/// Leads stored this recently are still on their way here in a
/// `RouteLeads`: a sweep that reaches them has found no older backlog.
const JUST_STORED: chrono::Duration = chrono::Duration::seconds(1);

impl Router {
    /// Claims the leads that fit (one UPDATE for all), then starts a
    /// waterfall for each lead claimed; the rest are queued by id.
    pub(super) fn claim_and_start(&mut self, lead_ids: Vec<LeadId>, ctx: &mut Context<Self>) {
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
    pub(super) fn yield_to_intake(&mut self, ctx: &mut Context<Self>) {
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
    pub(super) fn fill_room(&mut self, ctx: &mut Context<Self>) {
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
    pub(super) fn sweep(&mut self, ctx: &mut Context<Self>) {
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
    pub(super) fn renew_leases(&mut self, ctx: &mut Context<Self>) {
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
}

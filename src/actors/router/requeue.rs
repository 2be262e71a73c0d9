//! Putting leads back for a buyer answering again: the router's re-offers
//! (one requeue per buyer at a time, each request kept until its requeue
//! succeeded), and the leads a settle just let go unsold at a buyer seen
//! answering since.

use actix::prelude::*;

use super::actor::Router;
use crate::actors::buyer::ReofferLeads;
use crate::actors::routing_context::RoutingContext;
use crate::actors::supervision::guarded;
use crate::domain::{LeadId, LeadState};
use crate::store::{HeldLead, LeadEnd};

/// Unsold leads are offered again to a recovered buyer within this time of arrival.
const REROUTE_WITHIN: chrono::Duration = chrono::Duration::days(1);

impl Router {
    /// Puts back the buyer's failed leads, one request per buyer at a time
    /// (a request arriving meanwhile runs after it), then sweeps them up.
    pub(super) fn reoffer(&mut self, request: ReofferLeads, ctx: &mut Context<Self>) {
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
    pub(super) fn retry_reoffers(&mut self, ctx: &mut Context<Self>) {
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
pub(super) async fn offer_again_to_recovered(
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

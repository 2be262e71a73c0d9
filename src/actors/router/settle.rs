//! Letting the router's leads go: the final states walks end with, written
//! in groups, and leads that just ended unsold put back for a buyer seen
//! answering again.

use actix::prelude::*;

use super::actor::Router;
use super::requeue::offer_again_to_recovered;
use crate::alerts::AlertKind;

impl Router {
    /// Writes the waiting final states; states arriving meanwhile wait for
    /// the next write, so under load many leads share one commit.
    pub(super) fn settle(&mut self, ctx: &mut Context<Self>) {
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

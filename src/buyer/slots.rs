//! A buyer's concurrency limit: `max_concurrency` calls in flight, offers
//! beyond it wait (oldest first) at most `queue_timeout` for a free slot,
//! else the buyer is skipped as `busy`.

use std::collections::VecDeque;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;
use tokio::sync::oneshot;

#[derive(Debug, Default)]
pub struct Slots {
    in_flight: u32,
    /// Offers waiting for a slot, oldest first.
    waiting: VecDeque<oneshot::Sender<()>>,
}

impl Slots {
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// A slot now, or a wait of at most `patience` for one; true when taken.
    pub fn take(&mut self, limit: u32, patience: Duration) -> LocalBoxFuture<'static, bool> {
        if self.in_flight < limit {
            self.in_flight += 1;
            return futures_util::future::ready(true).boxed_local();
        }
        let (handover, slot) = oneshot::channel();
        self.waiting.push_back(handover);
        async move {
            matches!(
                actix_web::rt::time::timeout(patience, slot).await,
                Ok(Ok(()))
            )
        }
        .boxed_local()
    }

    /// Hands the slot to the oldest offer still waiting, or frees it.
    pub fn release(&mut self) {
        while let Some(next) = self.waiting.pop_front() {
            if next.send(()).is_ok() {
                return;
            }
        }
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// After a restart: the calls that held slots are gone.
    pub fn reset(&mut self) {
        self.in_flight = 0;
        self.waiting.clear();
    }
}

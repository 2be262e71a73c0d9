//! A buyer's concurrency limit: `max_concurrency` calls in flight, calls
//! beyond it wait at most `queue_timeout` for a free slot, else the buyer
//! is skipped as `busy`. Posts waiting are handed a freed slot before
//! pings (oldest first within each): a waiting post follows a ping the
//! buyer accepted, and the buyer is waiting for it. A slot is a `Slot`
//! guard: it is given back when dropped, which a call does as soon as the
//! buyer has answered (writing the answer down is our work, not the
//! buyer's). A ping takes its slot only once its row is written, for the
//! same reason; a post before its row (`recorded_call::CallSlot`).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;
use tokio::sync::oneshot;

use crate::domain::CallKind;

/// Clones share the same slots.
#[derive(Debug, Default, Clone)]
pub struct Slots {
    state: Rc<RefCell<State>>,
}

#[derive(Debug, Default)]
struct State {
    in_flight: u32,
    /// Posts waiting for a slot, oldest first: served before `pings`.
    posts: VecDeque<oneshot::Sender<Slot>>,
    /// Pings waiting for a slot, oldest first.
    pings: VecDeque<oneshot::Sender<Slot>>,
    /// Bumped by `reset`: slots of calls from before it count no more.
    generation: u64,
}

/// One taken slot; dropping it hands it to the oldest post still waiting,
/// else the oldest ping, or frees it.
#[derive(Debug)]
pub struct Slot {
    state: Rc<RefCell<State>>,
    generation: u64,
}

impl Slots {
    pub fn in_flight(&self) -> u32 {
        self.state.borrow().in_flight
    }

    /// A slot now, or a wait of at most `patience` for one (in the queue of
    /// `kind`); `None` when none freed in time.
    pub fn take(
        &self,
        kind: CallKind,
        limit: u32,
        patience: Duration,
    ) -> LocalBoxFuture<'static, Option<Slot>> {
        let mut state = self.state.borrow_mut();
        if state.in_flight < limit {
            state.in_flight += 1;
            let slot = Slot {
                state: self.state.clone(),
                generation: state.generation,
            };
            return futures_util::future::ready(Some(slot)).boxed_local();
        }
        let (handover, slot) = oneshot::channel();
        match kind {
            CallKind::Post => state.posts.push_back(handover),
            CallKind::Ping => state.pings.push_back(handover),
        }
        async move {
            actix_web::rt::time::timeout(patience, slot)
                .await
                .ok()
                .and_then(Result::ok)
        }
        .boxed_local()
    }

    /// After a restart: the calls that held slots are gone (their guards,
    /// should any still drop, give nothing back).
    pub fn reset(&self) {
        let mut state = self.state.borrow_mut();
        state.in_flight = 0;
        state.posts.clear();
        state.pings.clear();
        state.generation += 1;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.state.borrow_mut();
        if state.generation != self.generation {
            return;
        }
        while let Some(next) = state.posts.pop_front().or_else(|| state.pings.pop_front()) {
            // Waiters that gave up are passed over here, not one drop each.
            if next.is_closed() {
                continue;
            }
            let handed = Slot {
                state: self.state.clone(),
                generation: self.generation,
            };
            if let Err(unsent) = next.send(handed) {
                // That waiter gave up: the slot is back in `unsent`, whose
                // drop (once this borrow ends) offers it to the next one.
                drop(state);
                drop(unsent);
            }
            return;
        }
        state.in_flight = state.in_flight.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATIENCE: Duration = Duration::from_secs(5);
    const PING: CallKind = CallKind::Ping;
    const POST: CallKind = CallKind::Post;

    #[actix_web::test]
    async fn a_dropped_slot_goes_to_the_oldest_offer_still_waiting() {
        let slots = Slots::default();
        let held = slots.take(PING, 1, PATIENCE).await.expect("a free slot");
        let gave_up = slots.take(PING, 1, Duration::from_millis(1));
        assert!(gave_up.await.is_none(), "no slot freed in time");
        let oldest = slots.take(PING, 1, PATIENCE);
        let newest = slots.take(PING, 1, PATIENCE);
        drop(held);
        let oldest = oldest.await.expect("the oldest waiter gets the slot");
        assert_eq!(slots.in_flight(), 1);
        drop(oldest);
        let newest = newest.await.expect("then the next one");
        drop(newest);
        assert_eq!(slots.in_flight(), 0);
    }

    #[actix_web::test]
    async fn a_waiting_post_gets_a_freed_slot_before_older_pings() {
        let slots = Slots::default();
        let held = slots.take(PING, 1, PATIENCE).await.expect("a free slot");
        let ping = slots.take(PING, 1, PATIENCE);
        let first_post = slots.take(POST, 1, PATIENCE);
        let second_post = slots.take(POST, 1, PATIENCE);
        drop(held);
        let first_post = first_post.await.expect("the oldest post goes first");
        drop(first_post);
        let second_post = second_post.await.expect("then the next post");
        drop(second_post);
        let ping = ping.await.expect("the ping once no post waits");
        assert_eq!(slots.in_flight(), 1);
        drop(ping);
        assert_eq!(slots.in_flight(), 0);
    }

    #[actix_web::test]
    async fn slots_taken_before_a_reset_give_nothing_back() {
        let slots = Slots::default();
        let before = slots.take(PING, 2, PATIENCE).await.unwrap();
        slots.reset();
        let after = slots.take(POST, 2, PATIENCE).await.unwrap();
        drop(before);
        assert_eq!(slots.in_flight(), 1, "only the slot taken since counts");
        drop(after);
        assert_eq!(slots.in_flight(), 0);
    }
}

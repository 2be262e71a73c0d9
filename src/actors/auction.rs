//! The ping auction (`routing.mode = "auction"`): every eligible buyer with
//! a ping is pinged at once, for at most `routing.auction_window` (each ping
//! also within its own timeout); buyers without a ping take part at their
//! fixed `price` (as does a ping accepted without a bid); bids under a
//! buyer's `min_bid` or the `reserve_price` are never posted; then the posts
//! go in descending bid order (ties keep priority order) until the first
//! accept, each carrying that buyer's own `ping_id` and `bid`. A ping
//! answering after the window still completes its row (its buyer actor
//! writes it) but is neither waited for nor posted. A lead walked again
//! after a crash reuses the accepted pings its history holds (no buyer that
//! answered is pinged twice); a ping that failed or was cut off is asked
//! again, under the same Idempotency-Key.

use std::collections::HashSet;

use entity::attempt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::{timeout_at, Instant};

use super::directory::BuyerHandle;
use super::routing_context::{RouteError, WalkEnd};
use super::walk::Walk;
use super::waterfall::{kind_of, outcome_of};
use crate::buyer::recorded_call::Offered;
use crate::buyer::request::PingResult;
use crate::domain::{AttemptKind, AttemptOutcome, CallKind, CallOutcome, SkipReason};

/// What a buyer offers for the lead: its ping's bid, or its fixed price.
struct Bid<'b> {
    buyer: &'b BuyerHandle,
    /// Its place in priority order, for equal bids.
    rank: usize,
    amount: f64,
    ping: PingResult,
}

impl Walk<'_> {
    /// Pings every eligible buyer at once, then posts by bid.
    pub(super) async fn auction(
        mut self,
        finished: &HashSet<String>,
        history: &[attempt::Model],
    ) -> Result<WalkEnd, RouteError> {
        let buyers = self.routing.directory.all();
        let mut bids = Vec::new();
        let mut to_ping = Vec::new();
        let enabled = buyers.iter().filter(|buyer| buyer.settings.enabled);
        for (rank, buyer) in enabled.enumerate() {
            if finished.contains(&buyer.settings.id) || !self.eligible(&buyer.settings).await? {
                continue;
            }
            // A ping this lead's history already has an answer to is not
            // asked again; one that failed or was interrupted is.
            if let Some(ping) = accepted_before(history, &buyer.settings.id) {
                bids.push(Bid::of(buyer, rank, ping));
            } else if buyer.settings.ping.is_some() {
                to_ping.push((rank, buyer));
            } else {
                bids.push(Bid::of(buyer, rank, PingResult::default()));
            }
        }
        self.still_going()?;
        bids.extend(self.ping_all(&to_ping).await?);

        let mut posted = Vec::with_capacity(bids.len());
        for bid in bids {
            if bid.amount < self.floor(&bid.buyer.settings) {
                self.skip(&bid.buyer.settings, SkipReason::BelowMinBid)
                    .await?;
            } else {
                posted.push(bid);
            }
        }
        posted.sort_by(|a, b| b.amount.total_cmp(&a.amount).then(a.rank.cmp(&b.rank)));
        for bid in posted {
            if let Some(end) = self.post(bid.buyer, bid.ping).await? {
                return Ok(end);
            }
        }
        Ok(self.unsold().await)
    }

    /// The accepted pings that answer within the auction window.
    async fn ping_all<'b>(
        &mut self,
        buyers: &[(usize, &'b BuyerHandle)],
    ) -> Result<Vec<Bid<'b>>, RouteError> {
        let mut pending: FuturesUnordered<_> = buyers
            .iter()
            .map(|&(rank, buyer)| {
                let call = buyer
                    .addr
                    .send(self.offer(CallKind::Ping, PingResult::default()));
                async move { (rank, buyer, call.await) }
            })
            .collect();
        let closes = Instant::now() + self.routing.auction_window;
        let mut bids = Vec::new();
        while let Ok(Some((rank, buyer, offered))) = timeout_at(closes, pending.next()).await {
            if let Offered::Called(report) = self.note(offered?)? {
                if report.outcome == CallOutcome::Accepted {
                    let ping = PingResult {
                        ping_id: report.ping_id,
                        bid: report.bid,
                    };
                    bids.push(Bid::of(buyer, rank, ping));
                }
            }
        }
        // Past the window the rest are dropped unanswered (their buyer
        // actors still finish and record the calls already made).
        if !pending.is_empty() {
            self.note_unanswered();
        }
        Ok(bids)
    }
}

impl<'b> Bid<'b> {
    /// A ping's bid; without one (or without a ping), the buyer's `price`.
    fn of(buyer: &'b BuyerHandle, rank: usize, ping: PingResult) -> Self {
        Self {
            buyer,
            rank,
            amount: ping.bid.or(buyer.settings.price).unwrap_or(0.0),
            ping,
        }
    }
}

/// This buyer's accepted ping in the lead's current history, if any.
fn accepted_before(history: &[attempt::Model], buyer_id: &str) -> Option<PingResult> {
    let accepted = Some(AttemptOutcome::Call(CallOutcome::Accepted));
    history
        .iter()
        .filter(|attempt| {
            attempt.buyer_id == buyer_id && kind_of(attempt) == Some(AttemptKind::PING)
        })
        .rfind(|ping| outcome_of(ping) == accepted)
        .map(|ping| PingResult {
            ping_id: ping.ping_id.clone(),
            bid: ping.bid,
        })
}

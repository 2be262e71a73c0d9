//! The ping auction (`routing.mode = "auction"`): every eligible buyer with
//! a ping is pinged at once, for at most `routing.auction_window` (each ping
//! also within its own timeout); buyers without a ping take part at their
//! fixed `price`; bids under a buyer's `min_bid` or the `reserve_price` are
//! never posted; then the posts go in descending bid order (ties keep
//! priority order) until the first accept, each carrying that buyer's own
//! `ping_id` and `bid`. A ping answering after the window still completes
//! its row (its buyer actor writes it) but is neither waited for nor
//! posted. A lead walked again after a crash reuses the pings its history
//! holds and pings nobody twice.

use std::collections::HashSet;

use entity::attempt;
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::time::{timeout_at, Instant};

use super::directory::BuyerHandle;
use super::walk::Walk;
use super::waterfall::{kind_of, outcome_of, RouteError, WalkEnd};
use crate::buyer::recorded_call::Offered;
use crate::buyer::request::PingResult;
use crate::domain::{AttemptKind, AttemptOutcome, CallKind, CallOutcome, SkipReason};

/// What a buyer offers for the lead: its ping's bid, or its fixed price.
struct Bid<'b> {
    buyer: &'b BuyerHandle,
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
        for buyer in buyers.iter().filter(|buyer| buyer.settings.enabled) {
            if finished.contains(&buyer.settings.id) {
                continue;
            }
            if let Some(earlier) = pinged_before(history, &buyer.settings.id) {
                bids.extend(earlier.map(|ping| Bid {
                    buyer,
                    amount: ping.bid.unwrap_or(0.0),
                    ping,
                }));
                continue;
            }
            if !self.eligible(&buyer.settings).await? {
                continue;
            }
            if buyer.settings.ping.is_some() {
                to_ping.push(buyer);
            } else {
                bids.push(Bid {
                    buyer,
                    amount: buyer.settings.price.unwrap_or(0.0),
                    ping: PingResult::default(),
                });
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
        // Stable: equal bids keep priority order.
        posted.sort_by(|a, b| b.amount.total_cmp(&a.amount));
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
        buyers: &[&'b BuyerHandle],
    ) -> Result<Vec<Bid<'b>>, RouteError> {
        let mut pending: FuturesUnordered<_> = buyers
            .iter()
            .map(|buyer| {
                let call = buyer
                    .addr
                    .send(self.offer(CallKind::Ping, PingResult::default()));
                async move { (*buyer, call.await) }
            })
            .collect();
        let closes = Instant::now() + self.routing.auction_window;
        let mut bids = Vec::new();
        // Past the window the rest are dropped: their buyer actors still
        // finish and record the calls already made.
        while let Ok(Some((buyer, offered))) = timeout_at(closes, pending.next()).await {
            if let Offered::Called(report) = self.note(offered?)? {
                if report.outcome == CallOutcome::Accepted {
                    bids.push(Bid {
                        buyer,
                        amount: report.bid.unwrap_or(0.0),
                        ping: PingResult {
                            ping_id: report.ping_id,
                            bid: report.bid,
                        },
                    });
                }
            }
        }
        Ok(bids)
    }
}

/// A buyer this walk's history pinged already: `Some(Some(ping))` with its
/// accepted answer, `Some(None)` when it did not accept (not asked again).
fn pinged_before(history: &[attempt::Model], buyer_id: &str) -> Option<Option<PingResult>> {
    let accepted = Some(AttemptOutcome::Call(CallOutcome::Accepted));
    let mut pings = history
        .iter()
        .filter(|attempt| {
            attempt.buyer_id == buyer_id && kind_of(attempt) == Some(AttemptKind::PING)
        })
        .peekable();
    pings.peek()?;
    Some(
        pings
            .rfind(|ping| outcome_of(ping) == accepted)
            .map(|ping| PingResult {
                ping_id: ping.ping_id.clone(),
                bid: ping.bid,
            }),
    )
}

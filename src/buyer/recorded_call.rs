//! One call as history: its attempt row first (under the lead's claim, a
//! post with its cap slots), then the exchange (holding one of the buyer's
//! concurrency slots, given back once the buyer answered; see `CallSlot`
//! for when it is taken: a post's before its row, a ping's after), then
//! the answer written onto the row, and for an accepted post its sale in the same commit (the
//! one door for a sale, used by waterfalls and retries alike). An answer
//! that cannot be written is reported as such: the walk must stop, since
//! the call's fate is then only in the buyer's hands. A waterfall's ping
//! answer is instead handed back unwritten, for the walk's next row to
//! bring into its commit (`store::Unwritten`).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use super::accept::{number_at, text_at, AcceptCheck};
use super::call::{exchange, Exchange};
use super::request::{BuyerRequest, PingResult};
use super::slots::Slots;
use crate::config::{BuyerSettings, PayoutRule};
use crate::domain::{AttemptKind, CallKind, CallOutcome, SkipReason};
use crate::metrics::Metrics;
use crate::store::{AttemptEnd, Begun, CapSlot, NewAttempt, SaleOf, Store, Unwritten, Written};
use crate::telemetry;

/// What became of an offer.
#[derive(Debug, Clone)]
pub enum Offered {
    Skipped(SkipReason),
    /// Answered, and the answer recorded.
    Called(CallReport),
    /// An accepted post, recorded with its sale: the lead is sold.
    Sold(CallReport),
    /// Answered, but the answer could not be recorded: what the buyer made
    /// of it is unknown to us, so nothing more may be sent for this lead.
    Unrecorded(CallReport),
    /// The attempt row could not be written, so nothing was sent.
    NotRecorded,
    /// The lead's claim is gone (taken over, or the lease ran out): nothing sent.
    Fenced,
    /// The buyer actor crashed during the call (it is being restarted);
    /// the attempt row, if written, stays `in_flight` for recovery.
    Crashed,
}

#[derive(Debug, Clone)]
pub struct CallReport {
    pub attempt_id: String,
    pub outcome: CallOutcome,
    pub bid: Option<f64>,
    pub ping_id: Option<String>,
    pub took: Duration,
    /// The answer, when the plan held it back (`CallPlan::hold_answer`).
    pub unwritten: Option<Unwritten>,
}

/// Everything one call needs, prepared by the buyer actor.
pub struct CallPlan {
    pub kind: CallKind,
    /// The settings whose caps a post reserves, read when its row is
    /// written (the buyer's as they are then; a retry's snapshot).
    pub caps_of: Rc<RefCell<Arc<BuyerSettings>>>,
    pub settings: Arc<BuyerSettings>,
    pub request: BuyerRequest,
    pub timeout: Duration,
    pub check: AcceptCheck,
    pub attempt: NewAttempt,
    /// The accepted ping's answer, for a post's price.
    pub ping: PingResult,
    /// What the lead's source is paid if the post sells it.
    pub payout: PayoutRule,
    pub client: awc::Client,
    /// The buyer's slot this call takes once its row is written.
    pub slot: CallSlot,
    /// Fault injection for supervision tests: panic after the row is written.
    pub inject_panic: bool,
    /// A ping's answer is handed back unwritten, for the walk's next row.
    pub hold_answer: bool,
}

/// The buyer's slot a call holds for its exchange. A ping takes it once
/// its row is written, so that the slot is held for the exchange alone (a
/// row's group commit took 4 of the 26 ms a slot was held at 20 ms
/// buyers): a ping interrupted while it waits is harmless (recovery
/// settles it as an `error`, and the walk goes on). A post takes it before
/// its row: recovery reads a post row left `in_flight` as sent (its lead
/// `unknown`), so the row must not exist while the post merely waits
/// (SPEC section 9). None free within `patience`, and the offer is a
/// `busy` skip.
pub struct CallSlot {
    pub slots: Slots,
    pub limit: u32,
    pub patience: Duration,
    /// Called when the slot is taken (the buyer's status counts the calls
    /// in flight).
    pub taken: Box<dyn FnOnce()>,
}

/// The call: attempt row first, then the request, then the row's end.
pub async fn make_call(store: Store, metrics: Metrics, plan: CallPlan) -> Offered {
    let CallPlan {
        kind,
        caps_of,
        settings,
        request,
        timeout,
        check,
        mut attempt,
        ping,
        payout,
        client,
        slot,
        inject_panic,
        hold_answer,
    } = plan;
    let lead_id = attempt.lead_id.clone();
    let CallSlot {
        slots,
        limit,
        patience,
        taken,
    } = slot;
    // A post's row says "sent, fate unknown" to recovery: it is written
    // only once the post holds its slot, when the request is about to
    // leave (SPEC section 9). A ping's row may wait: an interrupted ping
    // is settled as an `error` and harms nothing.
    let (slot, attempt_id, cap_slots) = if kind == CallKind::Post {
        let Some(slot) = slots.take(kind, limit, patience).await else {
            return post_skipped_as_busy(&store, &metrics, &settings.id, attempt).await;
        };
        attempt.caps = CapSlot::for_post(&caps_of.borrow(), chrono::Utc::now());
        let (attempt_id, cap_slots) = match begin(&store, &metrics, &settings.id, attempt).await {
            Ok(begun) => begun,
            Err(offered) => return offered,
        };
        (slot, attempt_id, cap_slots)
    } else {
        let (attempt_id, cap_slots) = match begin(&store, &metrics, &settings.id, attempt).await {
            Ok(begun) => begun,
            Err(offered) => return offered,
        };
        let Some(slot) = slots.take(kind, limit, patience).await else {
            return ping_skipped_as_busy(&store, &metrics, &settings.id, &attempt_id).await;
        };
        (slot, attempt_id, cap_slots)
    };
    if inject_panic {
        panic!("injected fault: buyer {} panics during a call", settings.id);
    }
    taken();
    let answer = exchange(&client, kind, &request, timeout, &check).await;
    drop(slot);
    metrics.attempt(&settings.id, kind.as_str(), answer.outcome.as_str());
    telemetry::record_answer(answer.outcome, answer.duration);
    tracing::info!(
        status = answer.http_status,
        detail = answer.detail.as_deref(),
        "buyer answered"
    );
    let mut report = report_of(&settings, kind, attempt_id, &answer);
    let end = AttemptEnd {
        outcome: answer.outcome,
        reason: answer.detail.clone(),
        http_status: answer.http_status,
        duration: answer.duration,
        response_body: answer.body.clone(),
        bid: report.bid,
        ping_id: report.ping_id.clone(),
    };
    let recorded = match (kind, answer.outcome) {
        (CallKind::Post, CallOutcome::Accepted) => {
            let price = sale_price(&settings, answer.body.as_deref(), ping.bid);
            let sale = SaleOf {
                lead_id: lead_id.as_str(),
                buyer_id: &settings.id,
                price,
                payout: payout.amount(price),
            };
            return sell(&store, report, end, sale).await;
        }
        (CallKind::Ping, _) if hold_answer => {
            let attempt_id = report.attempt_id.clone();
            report.unwritten = Some(Unwritten { attempt_id, end });
            return Offered::Called(report);
        }
        // A post that cannot have sold gives its cap slots back.
        (CallKind::Post, CallOutcome::Rejected | CallOutcome::Error) => {
            store
                .finish_attempt(&report.attempt_id, end, cap_slots)
                .await
        }
        _ => {
            store
                .finish_attempt(&report.attempt_id, end, Vec::new())
                .await
        }
    };
    match recorded {
        Ok(Written::Done) => Offered::Called(report),
        Ok(written) => {
            tracing::warn!(%lead_id, written = written.as_str(), "the answer was not recorded: recovery had settled the call");
            Offered::Unrecorded(report)
        }
        Err(error) => {
            tracing::error!(%error, %lead_id, "could not complete the attempt row");
            Offered::Unrecorded(report)
        }
    }
}

/// The call's attempt row (with a post's cap slots), or what the offer
/// became instead: fenced, capped, or not recorded (nothing is sent).
async fn begin(
    store: &Store,
    metrics: &Metrics,
    buyer_id: &str,
    attempt: NewAttempt,
) -> Result<(String, Vec<CapSlot>), Offered> {
    let lead_id = attempt.lead_id.clone();
    match store.begin_attempt(attempt).await {
        Ok(Begun::Call(id, cap_slots)) => {
            telemetry::record_attempt_id(&id);
            Ok((id, cap_slots))
        }
        Ok(Begun::Fenced) => Err(Offered::Fenced),
        Ok(Begun::Capped) => {
            let reason = SkipReason::Capped;
            metrics.attempt(buyer_id, AttemptKind::Skip.as_str(), reason.as_str());
            Err(Offered::Skipped(reason))
        }
        Err(error) => {
            tracing::error!(%error, %lead_id, %buyer_id, "attempt not recorded; not calling");
            Err(Offered::NotRecorded)
        }
    }
}

/// A post that found no free slot in time: its row was never written, so
/// the offer is recorded as the `busy` skip it is.
async fn post_skipped_as_busy(
    store: &Store,
    metrics: &Metrics,
    buyer_id: &str,
    attempt: NewAttempt,
) -> Offered {
    let reason = SkipReason::Busy;
    metrics.attempt(buyer_id, AttemptKind::Skip.as_str(), reason.as_str());
    match store.record_skip(attempt, reason).await {
        Ok(Written::Fenced) => Offered::Fenced,
        Ok(_) => Offered::Skipped(reason),
        Err(error) => {
            tracing::error!(%error, %buyer_id, "could not record a busy skip");
            Offered::Skipped(reason)
        }
    }
}

/// A ping whose row is written found no free slot in time: the row
/// becomes the `busy` skip it is. Should that fail, nothing more is sent
/// for the lead (the row stays `in_flight`, and recovery settles it).
async fn ping_skipped_as_busy(
    store: &Store,
    metrics: &Metrics,
    buyer_id: &str,
    attempt_id: &str,
) -> Offered {
    let reason = SkipReason::Busy;
    metrics.attempt(buyer_id, AttemptKind::Skip.as_str(), reason.as_str());
    match store.call_skipped_as_busy(attempt_id, Vec::new()).await {
        Ok(_) => Offered::Skipped(reason),
        Err(error) => {
            tracing::error!(%error, %attempt_id, "could not turn the call's row into a busy skip");
            Offered::NotRecorded
        }
    }
}

/// Records an accepted post with its sale; if that commit fails, the
/// acceptance alone, so that the lead's history sells it on recovery.
async fn sell(store: &Store, report: CallReport, end: AttemptEnd, sale: SaleOf<'_>) -> Offered {
    let (lead_id, buyer_id) = (sale.lead_id, sale.buyer_id);
    match store.sell(&report.attempt_id, end.clone(), sale).await {
        Ok(Written::Done) => return Offered::Sold(report),
        Ok(Written::AlreadySold) => {
            tracing::warn!(%lead_id, %buyer_id, "a second accepted post: the lead was already sold, no second sale");
            return Offered::Sold(report);
        }
        Ok(written) => {
            tracing::warn!(%lead_id, written = written.as_str(), "accepted post not recorded: recovery had settled it");
            return Offered::Unrecorded(report);
        }
        Err(error) => {
            tracing::error!(%error, %lead_id, %buyer_id, "could not record the sale; keeping the acceptance alone")
        }
    }
    if let Err(error) = store
        .finish_attempt(&report.attempt_id, end, Vec::new())
        .await
    {
        tracing::error!(%error, %lead_id, "could not record the accepted post either");
    }
    Offered::Unrecorded(report)
}

/// What a sale is worth: the post's price, else the ping's bid, else the
/// buyer's fixed price.
pub fn sale_price(
    settings: &BuyerSettings,
    post_answer: Option<&str>,
    bid: Option<f64>,
) -> Option<f64> {
    number_at(
        post_answer.unwrap_or_default(),
        settings.post.price_path.as_deref(),
    )
    .or(bid)
    .or(settings.price)
}

fn report_of(
    settings: &BuyerSettings,
    kind: CallKind,
    attempt_id: String,
    answer: &Exchange,
) -> CallReport {
    let body = answer.body.as_deref().unwrap_or_default();
    let accepted = answer.outcome == CallOutcome::Accepted;
    let (bid, ping_id) = match (kind, &settings.ping) {
        (CallKind::Ping, Some(ping)) if accepted => (
            number_at(body, ping.bid_path.as_deref()),
            text_at(body, ping.ping_id_path.as_deref()),
        ),
        _ => (None, None),
    };
    CallReport {
        attempt_id,
        outcome: answer.outcome,
        bid,
        ping_id,
        took: answer.duration,
        unwritten: None,
    }
}

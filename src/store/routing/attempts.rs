//! Attempt rows through the attempt writer: a call's row written
//! `in_flight` before the call (while the claim holds, with a post's cap
//! slots) and completed after it, a call that never went out, skips, and
//! the one door for a sale.

use chrono::{DateTime, Utc};
use entity::attempt;
use sea_orm::{ActiveValue::Set, DbErr, TransactionTrait};
use serde_json::Value;

use crate::domain::{
    new_id, AttemptKind, AttemptOutcome, ClaimToken, ConfigSnapshot, LeadId, SkipReason,
};
use crate::store::attempt_end::{AttemptEnd, Unwritten};
use crate::store::attempt_writer::{insert_sale, mark_sold, AttemptWrite, Fence, Written};
use crate::store::caps::CapSlot;
use crate::store::handle::Store;
use crate::store::operations::new_sale;

/// An attempt about to be made (a call), or a skip.
#[derive(Debug, Clone)]
pub struct NewAttempt {
    pub lead_id: LeadId,
    pub buyer_id: String,
    pub kind: AttemptKind,
    pub request: Value,
    pub snapshot: ConfigSnapshot,
    pub retry_of: Option<String>,
    pub instance_id: String,
    /// The claim the lead is held under: the row is written only while it holds.
    pub claim_token: ClaimToken,
    /// For a post: the cap slots it takes (see `store::caps`).
    pub caps: Vec<CapSlot>,
    /// The walk's previous call's answer, not yet written: it goes in the
    /// same commit as this row (see `Unwritten`).
    pub answered: Option<Unwritten>,
}

/// What became of writing a call's row before the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begun {
    /// Written, with the cap slots it took: make the call.
    Call(String, Vec<CapSlot>),
    /// The lead's claim is gone: no call.
    Fenced,
    /// A cap is full: written as a `capped` skip, no call.
    Capped,
}

fn attempt_row(
    id: &str,
    new: NewAttempt,
    outcome: AttemptOutcome,
    started_at: DateTime<Utc>,
) -> attempt::ActiveModel {
    let skip = match outcome {
        AttemptOutcome::Skip(reason) => Some(reason),
        _ => None,
    };
    attempt::ActiveModel {
        id: Set(id.to_string()),
        lead_id: Set(new.lead_id.to_string()),
        buyer_id: Set(new.buyer_id),
        kind: Set(new.kind.as_str().into()),
        outcome: Set(outcome.as_str().into()),
        reason: Set(skip.map(|reason| reason.as_str().into())),
        http_status: Set(None),
        started_at: Set(started_at),
        // A skip is over the moment it is written; a call is timed later.
        duration_ms: Set(skip.map(|_| 0)),
        retry_of: Set(new.retry_of),
        request: Set(new.request),
        response_body: Set(None),
        snapshot_id: Set(new.snapshot.id),
        bid: Set(None),
        ping_id: Set(None),
        instance_id: Set(Some(new.instance_id)),
    }
}

impl Store {
    /// Writes a call's row as `in_flight`, before the call is made, while
    /// the lead's claim holds and (a post) with its cap slots reserved.
    pub async fn begin_attempt(&self, mut new: NewAttempt) -> Result<Begun, DbErr> {
        let id = new_id();
        let (fence, mut caps, answered) = fence_of(&mut new);
        // Slots are taken in the periods that hold the row's start, so a
        // return finds them again from the row.
        let started_at = Utc::now();
        for slot in &mut caps {
            slot.start = slot.period.start(started_at);
        }
        let snapshot = new.snapshot.clone();
        let row = attempt_row(&id, new, AttemptOutcome::InFlight, started_at);
        let written = self
            .attempts
            .write(AttemptWrite::Insert {
                row: Box::new(row),
                snapshot,
                fence,
                caps: caps.clone(),
                answered,
            })
            .await?;
        Ok(match written {
            Written::Fenced => Begun::Fenced,
            Written::Capped => Begun::Capped,
            _ => Begun::Call(id, caps),
        })
    }

    /// Completes a call's row with what happened (`Stale` when recovery
    /// settled it meanwhile); `release` gives a post's cap slots back.
    pub async fn finish_attempt(
        &self,
        attempt_id: &str,
        end: AttemptEnd,
        release: Vec<CapSlot>,
    ) -> Result<Written, DbErr> {
        let id = attempt_id.to_string();
        self.attempts
            .write(AttemptWrite::Finish { id, end, release })
            .await
    }

    /// A call's row that never went out (its buyer had no free slot in
    /// time), rewritten as the `busy` skip it became while still
    /// `in_flight` (`Stale` when recovery settled it meanwhile); `release`
    /// gives a post's cap slots back.
    pub async fn call_skipped_as_busy(
        &self,
        attempt_id: &str,
        release: Vec<CapSlot>,
    ) -> Result<Written, DbErr> {
        let id = attempt_id.to_string();
        self.attempts
            .write(AttemptWrite::Busy { id, release })
            .await
    }

    /// The one door for a sale made by a call: the accepted post's answer,
    /// its sale row and the lead's `sold`, in one commit. `AlreadySold`
    /// when the lead had a sale (the unique index), `Stale` when recovery
    /// had settled the post as interrupted (nothing written then).
    pub async fn sell(
        &self,
        attempt_id: &str,
        end: AttemptEnd,
        sale: SaleOf<'_>,
    ) -> Result<Written, DbErr> {
        self.attempts
            .write(AttemptWrite::Sell {
                id: attempt_id.to_string(),
                end,
                lead_id: sale.lead_id.to_string(),
                sale: Box::new(sale.row(attempt_id)),
            })
            .await
    }

    /// A post whose acceptance is in the lead's history but whose sale
    /// never got written (its commit failed): the sale and `sold` now.
    /// False when the lead had a sale already.
    pub async fn sell_from_history(
        &self,
        attempt_id: &str,
        sale: SaleOf<'_>,
    ) -> Result<bool, DbErr> {
        let txn = self.routing.begin().await?;
        let sold = insert_sale(&txn, sale.row(attempt_id)).await?;
        mark_sold(&txn, &[sale.lead_id]).await?;
        txn.commit().await?;
        Ok(sold)
    }

    /// A skip: an attempt row of kind `skip` whose outcome is the reason,
    /// written whole in one statement while the claim holds.
    pub async fn record_skip(&self, new: NewAttempt, reason: SkipReason) -> Result<Written, DbErr> {
        let mut new = NewAttempt {
            kind: AttemptKind::Skip,
            caps: Vec::new(),
            ..new
        };
        let (fence, caps, answered) = fence_of(&mut new);
        let snapshot = new.snapshot.clone();
        let row = attempt_row(&new_id(), new, AttemptOutcome::Skip(reason), Utc::now());
        self.attempts
            .write(AttemptWrite::Insert {
                row: Box::new(row),
                snapshot,
                fence,
                caps,
                answered,
            })
            .await
    }
}

/// The sale a call or a history makes.
pub struct SaleOf<'a> {
    pub lead_id: &'a str,
    pub buyer_id: &'a str,
    pub price: Option<f64>,
    /// What the lead's source is paid for it.
    pub payout: Option<f64>,
}

impl SaleOf<'_> {
    /// The sale row, made by the post `attempt_id`.
    fn row(&self, attempt_id: &str) -> entity::sale::ActiveModel {
        new_sale(
            self.lead_id,
            self.buyer_id,
            Some(attempt_id.to_string()),
            self.price,
            self.payout,
        )
    }
}

/// The write's conditions, its cap slots, and the answer it brings (taken:
/// the row itself does not hold it).
fn fence_of(new: &mut NewAttempt) -> (Fence, Vec<CapSlot>, Option<Unwritten>) {
    let fence = Fence {
        lead_id: new.lead_id.clone(),
        token: new.claim_token.clone(),
    };
    (fence, new.caps.clone(), new.answered.take())
}

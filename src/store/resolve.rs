//! Settling an `unknown` lead by hand (SPEC section 5, `resolve`): its
//! rules, checked in the transaction that makes the change once the lead's
//! state is taken (so two resolves cannot both pass, and a refused one
//! changes nothing), and the `resolve` attempt row that records it in the
//! lead's history.

use chrono::{DateTime, Utc};
use entity::{attempt, lead, sale};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, DatabaseTransaction, EntityTrait, QueryFilter, QueryOrder,
    SqlErr, TransactionTrait,
};
use serde_json::json;

use super::handle::Store;
use super::operations::{
    new_history, new_sale, release_unanswered_posts, transition, GiveBack, OperationError,
};
use super::snapshots;
use crate::config::{buyer_from_snapshot, PayoutRule};
use crate::domain::{new_id, AttemptKind, AttemptOutcome, CallOutcome, LeadState};

/// How a hand settlement of an `unknown` lead ends.
pub struct Settlement<'a> {
    pub buyer_id: &'a str,
    pub sold: bool,
    /// None for a sale: the bid of the post's ping, or the buyer's fixed
    /// price in the post's snapshot.
    pub price: Option<f64>,
    /// What the lead's source is paid if sold, of the sale's price.
    pub payout: PayoutRule,
    /// Whether the running configuration has the buyer: one that neither
    /// has it nor was posted the lead is refused as unknown.
    pub buyer_configured: bool,
}

/// The rules a resolve is refused by (the `error` of its 422).
pub mod rule {
    pub const NOT_UNKNOWN: &str = "not_unknown";
    pub const UNKNOWN_BUYER: &str = "unknown_buyer";
    pub const BUYER_NOT_POSTED: &str = "buyer_not_posted";
    pub const NOT_THE_UNKNOWN_POST: &str = "not_the_unknown_post";
    pub const BAD_PRICE: &str = "bad_price";
    pub const PRICE_NEEDED: &str = "price_needed";
}

/// What a resolve that passes its rules settles: the post it decides (for
/// a sale, the unanswered post that made it; not sold, the newest post to
/// the buyer) and the sale's price.
struct Decision {
    post: attempt::Model,
    price: Option<f64>,
}

impl Store {
    /// Settles an `unknown` lead by hand: sold to the buyer of a post whose
    /// outcome is unknown (a sale row tied to that post, which keeps its
    /// cap slots), or not sold (`unsold`) to a buyer it was posted to. Not
    /// sold, it is the operator's from then on, as a returned lead is: a
    /// new history begins, so no re-offer to a buyer that recovers puts it
    /// back to be routed, where the old unanswered post would make it
    /// `unknown` again (undoing the operator's word, and giving back the
    /// post's cap slot a second time at the next resolve). Either way the
    /// other unanswered posts give their cap slots back, and a `resolve`
    /// attempt row records it. Refused (`OperationError::Refused`, nothing
    /// changed) when the rules in `rule` are not met.
    pub async fn resolve_unknown_lead(
        &self,
        lead_id: &str,
        settlement: Settlement<'_>,
    ) -> Result<lead::Model, OperationError> {
        check_price(&settlement)?;
        let txn = self.db.begin().await?;
        let state = if settlement.sold {
            LeadState::Sold
        } else {
            LeadState::Unsold
        };
        // The state is taken first: a second resolve waits for this one,
        // then finds the lead settled (and SQLite's write lock is held).
        let changed = transition(lead_id, &[LeadState::Unknown.as_str()], state.as_str())
            .exec(&txn)
            .await?
            .rows_affected;
        if changed == 0 {
            drop(txn);
            let row = self
                .find_lead(lead_id)
                .await?
                .ok_or(OperationError::NotFound)?;
            return Err(refused(
                rule::NOT_UNKNOWN,
                format!(
                    "only an unknown lead can be resolved; this one is {}",
                    row.state
                ),
            ));
        }
        // A refusal drops the transaction: the state goes back.
        let decision = decide(&txn, lead_id, &settlement).await?;
        let give_back = if settlement.sold {
            GiveBack::AllButTheSaleOf(settlement.buyer_id)
        } else {
            GiveBack::All
        };
        release_unanswered_posts(&txn, lead_id, give_back).await?;
        attempt::Entity::insert(resolve_row(&settlement, &decision, Utc::now()))
            .exec_without_returning(&txn)
            .await?;
        if settlement.sold {
            let inserted = sale::Entity::insert(new_sale(
                lead_id,
                settlement.buyer_id,
                Some(decision.post.id.clone()),
                decision.price,
                settlement.payout.amount(decision.price),
            ))
            .exec_without_returning(&txn)
            .await;
            if let Err(error) = inserted {
                return Err(match error.sql_err() {
                    Some(SqlErr::UniqueConstraintViolation(_)) => {
                        OperationError::Conflict("the lead is already sold".into())
                    }
                    _ => error.into(),
                });
            }
        } else {
            new_history(lead_id, false).exec(&txn).await?;
        }
        txn.commit().await?;
        self.after_change(lead_id, 1, "").await
    }
}

fn refused(rule: &'static str, message: String) -> OperationError {
    OperationError::Refused { rule, message }
}

/// A price is a number ≥ 0, and only a sale has one.
fn check_price(settlement: &Settlement<'_>) -> Result<(), OperationError> {
    match settlement.price {
        Some(_) if !settlement.sold => Err(refused(
            rule::BAD_PRICE,
            "a resolve that is not sold takes no price".into(),
        )),
        Some(price) if !price.is_finite() || price < 0.0 => Err(refused(
            rule::BAD_PRICE,
            "price must be a number ≥ 0".into(),
        )),
        _ => Ok(()),
    }
}

/// Checks the settlement against the lead's posts (read in `txn`, after
/// its state was taken) and finds the post it decides and the price.
async fn decide(
    txn: &DatabaseTransaction,
    lead_id: &str,
    settlement: &Settlement<'_>,
) -> Result<Decision, OperationError> {
    let history_from = lead::Entity::find_by_id(lead_id)
        .one(txn)
        .await?
        .and_then(|row| row.history_from);
    let calls = attempt::Entity::find()
        .filter(attempt::Column::LeadId.eq(lead_id))
        .filter(
            attempt::Column::Kind.is_in([AttemptKind::PING.as_str(), AttemptKind::POST.as_str()]),
        )
        .order_by_desc(attempt::Column::StartedAt)
        .all(txn)
        .await?;
    let posts = || {
        calls
            .iter()
            .filter(|call| call.kind == AttemptKind::POST.as_str())
    };
    let buyer = settlement.buyer_id;
    let Some(newest) = posts().find(|post| post.buyer_id == buyer) else {
        return Err(if settlement.buyer_configured {
            refused(
                rule::BUYER_NOT_POSTED,
                format!("{buyer} was never posted this lead; name a buyer it was posted to"),
            )
        } else {
            refused(
                rule::UNKNOWN_BUYER,
                format!("no buyer {buyer:?} is configured or was posted this lead"),
            )
        });
    };
    if !settlement.sold {
        return Ok(Decision {
            post: newest.clone(),
            price: None,
        });
    }
    let timeout = AttemptOutcome::Call(CallOutcome::Timeout).as_str();
    let unknown = posts().filter(|post| {
        post.outcome == timeout && history_from.is_none_or(|from| post.started_at >= from)
    });
    let Some(post) = unknown.clone().find(|post| post.buyer_id == buyer) else {
        let mut owners: Vec<&str> = unknown.map(|post| post.buyer_id.as_str()).collect();
        owners.dedup();
        return Err(refused(
            rule::NOT_THE_UNKNOWN_POST,
            format!(
                "only the buyer of the post whose outcome is unknown ({}) can have bought the lead, not {buyer}",
                owners.join(", ")
            ),
        ));
    };
    let price = match settlement.price {
        Some(price) => price,
        None => found_price(txn, &calls, post).await?.ok_or_else(|| {
            refused(
                rule::PRICE_NEEDED,
                format!(
                    "the post to {buyer} had no bid and the buyer no fixed price: name the price"
                ),
            )
        })?,
    };
    Ok(Decision {
        post: post.clone(),
        price: Some(price),
    })
}

/// The price of a sale the post made: the bid of the buyer's accepted
/// ping before it (`calls`, newest first), else the buyer's fixed price in
/// the post's snapshot.
async fn found_price(
    txn: &DatabaseTransaction,
    calls: &[attempt::Model],
    post: &attempt::Model,
) -> Result<Option<f64>, OperationError> {
    let accepted = AttemptOutcome::Call(CallOutcome::Accepted).as_str();
    let bid = calls
        .iter()
        .filter(|call| {
            call.kind == AttemptKind::PING.as_str()
                && call.buyer_id == post.buyer_id
                && call.outcome == accepted
                && call.started_at <= post.started_at
        })
        .find_map(|ping| ping.bid);
    if bid.is_some() {
        return Ok(bid);
    }
    let snapshot = snapshots::read_one(txn, &post.snapshot_id).await?;
    Ok(snapshot
        .and_then(|snapshot| buyer_from_snapshot(&snapshot).ok())
        .and_then(|settings| settings.price))
}

/// The attempt row that records the settlement in the lead's history: kind
/// `resolve`, outcome `accepted` (sold) or `rejected` (not sold), with the
/// decided post's snapshot, the price as `bid`, and what the operator sent.
fn resolve_row(
    settlement: &Settlement<'_>,
    decision: &Decision,
    at: DateTime<Utc>,
) -> attempt::ActiveModel {
    let outcome = if settlement.sold {
        CallOutcome::Accepted
    } else {
        CallOutcome::Rejected
    };
    let post = &decision.post;
    attempt::ActiveModel {
        id: Set(new_id()),
        lead_id: Set(post.lead_id.clone()),
        buyer_id: Set(settlement.buyer_id.into()),
        kind: Set(AttemptKind::Resolve.as_str().into()),
        outcome: Set(AttemptOutcome::Call(outcome).as_str().into()),
        reason: Set(Some("settled by an operator".into())),
        http_status: Set(None),
        started_at: Set(at),
        duration_ms: Set(Some(0)),
        retry_of: Set(None),
        request: Set(json!({
            "method": "POST",
            "url": format!("/v1/leads/{}/resolve", post.lead_id),
            "body": {
                "buyer_id": settlement.buyer_id,
                "sold": settlement.sold,
                "price": decision.price,
                "post_id": post.id,
            },
        })),
        response_body: Set(None),
        snapshot_id: Set(post.snapshot_id.clone()),
        bid: Set(decision.price),
        ping_id: Set(None),
        instance_id: Set(None),
    }
}

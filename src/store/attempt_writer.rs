//! Group commit for attempt rows. Every outbound call writes its attempt
//! before sending and completes it after; one commit (one fsync) each would
//! make the database the bottleneck of selling. Writes from concurrent
//! calls wait in a queue and share a transaction; each caller is answered
//! after the commit that holds its write.
//!
//! Each write carries its own conditions, checked inside the commit: a new
//! row only while its lead's claim (token, unexpired lease) holds, a post
//! only with its cap slots reserved, an answer only onto a row still
//! `in_flight`, a sale together with its accepted post.

use std::panic::AssertUnwindSafe;

use chrono::Utc;
use futures_util::FutureExt;
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{
    ColumnTrait, DatabaseConnection, DatabaseTransaction, DbErr, EntityTrait, QueryFilter,
    TransactionTrait,
};
use tokio::sync::{mpsc, oneshot};

use entity::{attempt, lead, sale};

use super::caps::{self, CapSlot};
use super::AttemptEnd;
use crate::domain::{AttemptKind, AttemptOutcome, ClaimToken, LeadId, LeadState, SkipReason};

/// Most writes in one transaction.
const MAX_WRITES: usize = 256;

/// The claim a write is made under: lead id and claim token.
#[derive(Debug, Clone)]
pub struct Fence {
    pub lead_id: LeadId,
    pub token: ClaimToken,
}

/// One change to the attempts table.
pub(super) enum AttemptWrite {
    /// A new row (a call about to be made, or a skip), written only while
    /// `fence` holds; a post's `caps` are reserved with it, else the row is
    /// written as a `capped` skip instead.
    Insert {
        row: Box<attempt::ActiveModel>,
        fence: Fence,
        caps: Vec<CapSlot>,
    },
    /// A call's answer onto its `in_flight` row; `release` gives back the
    /// cap slots of a post that cannot have sold.
    Finish {
        id: String,
        end: AttemptEnd,
        release: Vec<CapSlot>,
    },
    /// An accepted post's answer, its sale and the lead's `sold`, as one.
    Sell {
        id: String,
        end: AttemptEnd,
        lead_id: String,
        sale: Box<sale::ActiveModel>,
    },
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Done,
    /// The claim is gone (another holder, or the lease ran out): nothing written.
    Fenced,
    /// A cap was full: the row was written as a `capped` skip.
    Capped,
    /// The row was no longer `in_flight` (recovery settled it): nothing written.
    Stale,
    /// The post is recorded accepted, but the lead already had its sale.
    AlreadySold,
}

type Request = (AttemptWrite, oneshot::Sender<Result<Written, String>>);

#[derive(Debug, Clone)]
pub(super) struct AttemptWriter {
    queue: mpsc::UnboundedSender<Request>,
}

impl AttemptWriter {
    /// Starts the writer task on the current actix/tokio runtime.
    pub(super) fn start(db: DatabaseConnection) -> Self {
        let (queue, mut requests) = mpsc::unbounded_channel();
        actix_web::rt::spawn(async move {
            // A panic drops the batch it held (those callers see the writer
            // gone: their calls count as not recorded) and the loop goes on.
            while AssertUnwindSafe(write_forever(&db, &mut requests))
                .catch_unwind()
                .await
                .is_err()
            {
                tracing::error!("the attempt writer panicked; restarting it");
            }
        });
        Self { queue }
    }

    /// Queues the write and waits for the commit that holds it.
    pub(super) async fn write(&self, write: AttemptWrite) -> Result<Written, DbErr> {
        let stopped = || DbErr::Custom("the attempt writer has stopped".into());
        let (reply, answer) = oneshot::channel();
        self.queue.send((write, reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?.map_err(DbErr::Custom)
    }
}

async fn write_forever(db: &DatabaseConnection, requests: &mut mpsc::UnboundedReceiver<Request>) {
    while let Some(first) = requests.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_WRITES {
            match requests.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (writes, replies): (Vec<AttemptWrite>, Vec<_>) = batch.into_iter().unzip();
        match commit(db, &writes).await {
            Ok(results) => replies
                .into_iter()
                .zip(results)
                .for_each(|(reply, result)| {
                    let _ = reply.send(Ok(result));
                }),
            // One bad write must not fail its neighbours: retry each alone.
            Err(_) if writes.len() > 1 => {
                for (write, reply) in writes.into_iter().zip(replies) {
                    let result = commit(db, std::slice::from_ref(&write)).await;
                    let result = result.map(|mut results| results.remove(0));
                    let _ = reply.send(result.map_err(|error| error.to_string()));
                }
            }
            Err(error) => replies.into_iter().for_each(|reply| {
                let _ = reply.send(Err(error.to_string()));
            }),
        }
    }
}

async fn commit(db: &DatabaseConnection, writes: &[AttemptWrite]) -> Result<Vec<Written>, DbErr> {
    // Cap counters are locked in buyer order, the same in every instance's
    // batches, so two batches never wait on each other in a cycle.
    let mut order: Vec<usize> = (0..writes.len()).collect();
    order.sort_by_key(|&index| cap_buyer(&writes[index]));
    let txn = db.begin().await?;
    let mut results = vec![Written::Done; writes.len()];
    for index in order {
        results[index] = apply(&txn, &writes[index]).await?;
    }
    txn.commit().await?;
    Ok(results)
}

/// The buyer whose cap counters a write locks, if any.
fn cap_buyer(write: &AttemptWrite) -> Option<&str> {
    let slots = match write {
        AttemptWrite::Insert { caps, .. } => caps,
        AttemptWrite::Finish { release, .. } => release,
        AttemptWrite::Sell { .. } => return None,
    };
    slots.first().map(|slot| slot.buyer_id.as_str())
}

async fn apply(txn: &DatabaseTransaction, write: &AttemptWrite) -> Result<Written, DbErr> {
    match write {
        AttemptWrite::Insert { row, fence, caps } => {
            if !holds(txn, fence).await? {
                return Ok(Written::Fenced);
            }
            if !caps::reserve(txn, caps).await? {
                let mut skip = (**row).clone();
                skip.kind = sea_orm::Set(AttemptKind::Skip.as_str().into());
                skip.outcome =
                    sea_orm::Set(AttemptOutcome::Skip(SkipReason::Capped).as_str().into());
                skip.reason = sea_orm::Set(Some(SkipReason::Capped.as_str().into()));
                skip.duration_ms = sea_orm::Set(Some(0));
                attempt::Entity::insert(skip)
                    .exec_without_returning(txn)
                    .await?;
                return Ok(Written::Capped);
            }
            attempt::Entity::insert((**row).clone())
                .exec_without_returning(txn)
                .await?;
            Ok(Written::Done)
        }
        AttemptWrite::Finish { id, end, release } => {
            if !finish(txn, id, end).await? {
                return Ok(Written::Stale);
            }
            caps::release(txn, release).await?;
            Ok(Written::Done)
        }
        AttemptWrite::Sell {
            id,
            end,
            lead_id,
            sale,
        } => {
            if !finish(txn, id, end).await? {
                return Ok(Written::Stale);
            }
            if !insert_sale(txn, (**sale).clone()).await? {
                return Ok(Written::AlreadySold);
            }
            mark_sold(txn, lead_id).await?;
            Ok(Written::Done)
        }
    }
}

/// Whether the claim still holds, checked with an UPDATE: on PostgreSQL
/// it locks the lead's row until the commit, so a claim by another
/// instance either waits for us (and then sees our row) or has already
/// changed the token (and we write nothing); SQLite has one writer.
async fn holds(txn: &DatabaseTransaction, fence: &Fence) -> Result<bool, DbErr> {
    let held = lead::Entity::update_many()
        .col_expr(
            lead::Column::LeaseUntil,
            Expr::col(lead::Column::LeaseUntil),
        )
        .filter(lead::Column::Id.eq(fence.lead_id.as_str()))
        .filter(lead::Column::ClaimToken.eq(fence.token.as_str()))
        .filter(lead::Column::State.eq(LeadState::Routing.as_str()))
        .filter(lead::Column::LeaseUntil.gt(Utc::now()))
        .exec(txn)
        .await?
        .rows_affected;
    Ok(held == 1)
}

/// Writes a call's answer onto its row if the row is still `in_flight`.
async fn finish(txn: &DatabaseTransaction, id: &str, end: &AttemptEnd) -> Result<bool, DbErr> {
    let finished = attempt::Entity::update_many()
        .col_expr(
            attempt::Column::Outcome,
            Expr::value(AttemptOutcome::Call(end.outcome).as_str()),
        )
        .col_expr(attempt::Column::Reason, Expr::value(end.reason.clone()))
        .col_expr(
            attempt::Column::HttpStatus,
            Expr::value(end.http_status.map(i32::from)),
        )
        .col_expr(
            attempt::Column::DurationMs,
            Expr::value(end.duration.as_millis() as i64),
        )
        .col_expr(
            attempt::Column::ResponseBody,
            Expr::value(end.response_body.clone()),
        )
        .col_expr(attempt::Column::Bid, Expr::value(end.bid))
        .col_expr(attempt::Column::PingId, Expr::value(end.ping_id.clone()))
        .filter(attempt::Column::Id.eq(id))
        .filter(attempt::Column::Outcome.eq(AttemptOutcome::InFlight.as_str()))
        .exec(txn)
        .await?
        .rows_affected;
    Ok(finished == 1)
}

/// Inserts the sale unless the lead has one (the partial unique index on
/// sales not returned decides; `DO NOTHING` keeps the transaction usable).
pub(super) async fn insert_sale(
    txn: &DatabaseTransaction,
    sale: sale::ActiveModel,
) -> Result<bool, DbErr> {
    let inserted = sale::Entity::insert(sale)
        .on_conflict(OnConflict::new().do_nothing().to_owned())
        .exec_without_returning(txn)
        .await?;
    Ok(inserted == 1)
}

/// The lead is sold: whoever held it lets go (its settle finds the token gone).
pub(super) async fn mark_sold(txn: &DatabaseTransaction, lead_id: &str) -> Result<(), DbErr> {
    lead::Entity::update_many()
        .col_expr(lead::Column::State, Expr::value(LeadState::Sold.as_str()))
        .col_expr(
            lead::Column::LeaseOwner,
            Expr::value(Option::<String>::None),
        )
        .col_expr(
            lead::Column::LeaseUntil,
            Expr::value(Option::<chrono::DateTime<Utc>>::None),
        )
        .col_expr(
            lead::Column::ClaimToken,
            Expr::value(Option::<String>::None),
        )
        .col_expr(lead::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(lead::Column::Id.eq(lead_id))
        .exec(txn)
        .await?;
    Ok(())
}

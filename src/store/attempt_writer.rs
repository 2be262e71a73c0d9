//! Group commit for attempt rows. Every outbound call writes its attempt
//! before sending and completes it after; one commit (one fsync) each would
//! make the database the bottleneck of selling. Writes from concurrent
//! calls wait in a queue and share a transaction; each caller is answered
//! after the commit that holds its write.

use sea_orm::sea_query::Expr;
use sea_orm::{ColumnTrait, DatabaseConnection, DbErr, EntityTrait, QueryFilter, TransactionTrait};
use tokio::sync::{mpsc, oneshot};

use entity::attempt;

use super::AttemptEnd;

/// Most writes in one transaction.
const MAX_WRITES: usize = 256;

/// One change to the attempts table.
pub(super) enum AttemptWrite {
    Insert(Box<attempt::ActiveModel>),
    Finish { id: String, end: AttemptEnd },
}

type Request = (AttemptWrite, oneshot::Sender<Result<(), String>>);

#[derive(Debug, Clone)]
pub(super) struct AttemptWriter {
    queue: mpsc::UnboundedSender<Request>,
}

impl AttemptWriter {
    /// Starts the writer task on the current actix/tokio runtime.
    pub(super) fn start(db: DatabaseConnection) -> Self {
        let (queue, requests) = mpsc::unbounded_channel();
        actix_web::rt::spawn(write_forever(db, requests));
        Self { queue }
    }

    /// Queues the write and waits for the commit that holds it.
    pub(super) async fn write(&self, write: AttemptWrite) -> Result<(), DbErr> {
        let stopped = || DbErr::Custom("the attempt writer has stopped".into());
        let (reply, answer) = oneshot::channel();
        self.queue.send((write, reply)).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?.map_err(DbErr::Custom)
    }
}

async fn write_forever(db: DatabaseConnection, mut requests: mpsc::UnboundedReceiver<Request>) {
    while let Some(first) = requests.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_WRITES {
            match requests.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (writes, replies): (Vec<AttemptWrite>, Vec<_>) = batch.into_iter().unzip();
        match commit(&db, &writes).await {
            Ok(()) => replies.into_iter().for_each(|reply| {
                let _ = reply.send(Ok(()));
            }),
            // One bad write must not fail its neighbours: retry each alone.
            Err(_) if writes.len() > 1 => {
                for (write, reply) in writes.into_iter().zip(replies) {
                    let result = commit(&db, std::slice::from_ref(&write)).await;
                    let _ = reply.send(result.map_err(|error| error.to_string()));
                }
            }
            Err(error) => replies.into_iter().for_each(|reply| {
                let _ = reply.send(Err(error.to_string()));
            }),
        }
    }
}

async fn commit(db: &DatabaseConnection, writes: &[AttemptWrite]) -> Result<(), DbErr> {
    let txn = db.begin().await?;
    for write in writes {
        match write {
            AttemptWrite::Insert(row) => {
                attempt::Entity::insert((**row).clone())
                    .exec_without_returning(&txn)
                    .await?;
            }
            AttemptWrite::Finish { id, end } => {
                attempt::Entity::update_many()
                    .col_expr(attempt::Column::Outcome, Expr::value(end.outcome.clone()))
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
                    .filter(attempt::Column::Id.eq(id.as_str()))
                    .exec(&txn)
                    .await?;
            }
        }
    }
    txn.commit().await
}

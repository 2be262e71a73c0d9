//! Group commit for attempt rows. Every outbound call writes its attempt
//! before sending and completes it after; one commit (one fsync) each would
//! make the database the bottleneck of selling. Writes from concurrent
//! calls wait in a queue and share a transaction, written with a few
//! statements whatever their number (one per kind of change, not one per
//! write: one writer's round trips would otherwise bound the calls made);
//! each caller is answered after the commit that holds its write.
//!
//! Each write carries its own conditions, checked inside the commit: a new
//! row only while its lead's claim (token, unexpired lease) holds, a post
//! only with its cap slots reserved, an answer (or the skip a call that
//! never went out became) only onto a row still `in_flight`, a sale
//! together with its accepted post. A new row may bring
//! the walk's previous ping's answer (`Unwritten`): written first, in the
//! same commit. A new row's configuration (`snapshots`) is written in the
//! commit of the first row that names it.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use actix::ArbiterHandle;
use chrono::Utc;
use futures_util::FutureExt;
use sea_orm::sea_query::{
    Alias, Expr, ExprTrait, IntoIden, OnConflict, Query, TableRef, ValueTuple,
};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, ConnectionTrait, DatabaseConnection,
    DatabaseTransaction, DbBackend, DbErr, EntityTrait, Iterable, QueryFilter, QuerySelect,
    QueryTrait, Set, TransactionTrait,
};
use tokio::sync::{mpsc, oneshot, Semaphore};

use entity::{attempt, lead, sale};

use super::any_of::any_of;
use super::attempt_end::{AttemptEnd, Unwritten};
use super::caps::{self, CapSlot};
use super::intake_first::{IntakeFirst, LONGEST_YIELD};
use super::snapshots::StoredSnapshots;
use super::state_is::state_is;
use super::unreachable::is_unreachable;
use crate::domain::{
    AttemptKind, AttemptOutcome, ClaimToken, ConfigSnapshot, LeadId, LeadState, SkipReason,
};

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
    /// written as a `capped` skip instead. `answered`, the walk's previous
    /// ping's answer, is written onto its row whatever becomes of this one
    /// (the row's result is its own).
    Insert {
        row: Box<attempt::ActiveModel>,
        /// The configuration the row names, written with it if new.
        snapshot: ConfigSnapshot,
        fence: Fence,
        caps: Vec<CapSlot>,
        answered: Option<Unwritten>,
    },
    /// A call's answer onto its `in_flight` row; `release` gives back the
    /// cap slots of a post that cannot have sold.
    Finish {
        id: String,
        end: AttemptEnd,
        release: Vec<CapSlot>,
    },
    /// A call's `in_flight` row that never went out (no free slot in
    /// time), turned into the `busy` skip it became; `release` gives back
    /// a post's cap slots.
    Busy { id: String, release: Vec<CapSlot> },
    /// An accepted post's answer, its sale and the lead's `sold`, as one.
    Sell {
        id: String,
        end: AttemptEnd,
        lead_id: String,
        sale: Box<sale::ActiveModel>,
    },
    /// Nothing to write: answered once every write queued before it is
    /// committed. That holds while groups commit one after another, in
    /// queue order: the writer has one connection (`ROUTING_CONNECTIONS`).
    Barrier,
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

impl Written {
    /// As the log shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Fenced => "fenced",
            Self::Capped => "capped",
            Self::Stale => "stale",
            Self::AlreadySold => "already_sold",
        }
    }
}

type Request = (AttemptWrite, oneshot::Sender<Result<Written, String>>);

#[derive(Debug, Clone)]
pub(super) struct AttemptWriter {
    queue: mpsc::UnboundedSender<Request>,
}

impl AttemptWriter {
    /// Starts the writer task on `thread` (whose own pool `db` is: the
    /// commits' round trips are then never queued behind the routing
    /// thread's work), with at most `groups_in_flight` group commits
    /// running at once (the store runs one; on PostgreSQL more overlap
    /// their commits, but one group gathering while the previous commits
    /// costs the database less per write). Each walk awaits one write
    /// before it sends the next, so a lead's writes never race each other across
    /// groups; groups lock cap counters in buyer order, so overlapping
    /// groups cannot deadlock on them. With `intake_first` (SQLite), each
    /// group waits first for intake's writes under way (`intake_first`).
    pub(super) fn start(
        thread: &ArbiterHandle,
        db: DatabaseConnection,
        groups_in_flight: usize,
        intake_first: Option<Arc<IntakeFirst>>,
        snapshots: Arc<StoredSnapshots>,
    ) -> Self {
        let (queue, mut requests) = mpsc::unbounded_channel();
        let turns = Turns {
            in_flight: Arc::new(Semaphore::new(groups_in_flight.max(1))),
            connections: groups_in_flight.max(1),
            intake_first,
            snapshots,
        };
        thread.spawn(async move {
            // A panic drops the batch it held (those callers see the writer
            // gone: their calls count as not recorded) and the loop goes on.
            while AssertUnwindSafe(write_forever(&db, &turns, &mut requests))
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

/// When a group may begin, and what every group shares.
struct Turns {
    /// A permit per group commit that may run at once (one per connection).
    in_flight: Arc<Semaphore>,
    connections: usize,
    /// Intake's writes go first (SQLite).
    intake_first: Option<Arc<IntakeFirst>>,
    /// The configurations known to be stored already.
    snapshots: Arc<StoredSnapshots>,
}

/// Takes the writes queued so far as one group once a group may start,
/// and commits it in a task of its own.
async fn write_forever(
    db: &DatabaseConnection,
    turns: &Turns,
    requests: &mut mpsc::UnboundedReceiver<Request>,
) {
    while let Some(first) = requests.recv().await {
        let Ok(permit) = turns.in_flight.clone().acquire_owned().await else {
            return;
        };
        if let Some(intake_first) = &turns.intake_first {
            intake_first.yield_to_intake(LONGEST_YIELD).await;
        }
        let mut batch = vec![first];
        while batch.len() < MAX_WRITES {
            match requests.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let db = db.clone();
        let connections = turns.connections;
        let snapshots = turns.snapshots.clone();
        actix_web::rt::spawn(async move {
            // A panic drops this group's replies: its callers see the
            // writer gone, and their calls count as not recorded.
            if AssertUnwindSafe(commit_group(&db, &snapshots, batch, connections))
                .catch_unwind()
                .await
                .is_err()
            {
                tracing::error!("an attempt group commit panicked");
            }
            drop(permit);
        });
    }
}

/// Commits one group and answers each caller. A connection that died while
/// idle (the pool does not test one before use) fails only its own try: a
/// group that finds the database unreachable goes again on another
/// connection, up to `connections` more times (the pool's every connection
/// may have died together), and fails as a whole only when the database
/// really is gone. A group the database refuses is tried write by write,
/// so that one bad write does not fail its neighbours.
async fn commit_group(
    db: &DatabaseConnection,
    snapshots: &StoredSnapshots,
    batch: Vec<Request>,
    connections: usize,
) {
    let (writes, replies): (Vec<AttemptWrite>, Vec<_>) = batch.into_iter().unzip();
    let mut committed = commit(db, snapshots, &writes).await;
    for _ in 0..connections {
        match &committed {
            Err(error) if is_unreachable(error) => committed = commit(db, snapshots, &writes).await,
            _ => break,
        }
    }
    match committed {
        Ok(results) => replies
            .into_iter()
            .zip(results)
            .for_each(|(reply, result)| {
                let _ = reply.send(Ok(result));
            }),
        Err(error) if writes.len() > 1 && !is_unreachable(&error) => {
            for (write, reply) in writes.into_iter().zip(replies) {
                let result = commit(db, snapshots, std::slice::from_ref(&write)).await;
                let result = result.map(|mut results| results.remove(0));
                let _ = reply.send(result.map_err(|error| error.to_string()));
            }
        }
        Err(error) => replies.into_iter().for_each(|reply| {
            let _ = reply.send(Err(error.to_string()));
        }),
    }
}

/// One transaction: the new rows' configurations not stored yet, then the
/// writes.
async fn commit(
    db: &DatabaseConnection,
    snapshots: &StoredSnapshots,
    writes: &[AttemptWrite],
) -> Result<Vec<Written>, DbErr> {
    let txn = db.begin().await?;
    let named = writes.iter().filter_map(|write| match write {
        AttemptWrite::Insert { snapshot, .. } => Some(snapshot),
        _ => None,
    });
    let new_snapshots = snapshots.write_new(&txn, named).await?;
    let results = apply(&txn, writes).await?;
    txn.commit().await?;
    snapshots.committed(new_snapshots);
    Ok(results)
}

/// A group's writes in a few statements, however many there are: the
/// answers (one UPDATE), calls that never went out turned into `busy`
/// skips (one UPDATE, when there are any), the sales the answers make and
/// their leads' `sold` (one INSERT, one UPDATE), the claims new rows are
/// written under (one locking read), cap slots (in buyer order) and the
/// new rows (one INSERT).
/// Each write's own conditions decide its result, as if it were alone.
async fn apply(txn: &DatabaseTransaction, writes: &[AttemptWrite]) -> Result<Vec<Written>, DbErr> {
    let mut results = vec![Written::Done; writes.len()];
    answer(txn, writes, &mut results).await?;
    skip_busy_calls(txn, writes, &mut results).await?;
    sell(txn, writes, &mut results).await?;
    fence(txn, writes, &mut results).await?;
    take_cap_slots(txn, writes, &mut results).await?;
    insert_rows(txn, writes, &results).await?;
    Ok(results)
}

/// What `pick` takes of the group's writes, each with its place in the
/// group (where its result goes).
fn of_kind<'a, T>(
    writes: &'a [AttemptWrite],
    pick: impl Fn(&'a AttemptWrite) -> Option<T>,
) -> Vec<(usize, T)> {
    writes
        .iter()
        .enumerate()
        .filter_map(|(index, write)| Some((index, pick(write)?)))
        .collect()
}

/// The answers, each onto its row if still `in_flight` (else `Stale`),
/// with the pings' answers new rows bring (whose rows' results are their own).
async fn answer(
    txn: &DatabaseTransaction,
    writes: &[AttemptWrite],
    results: &mut [Written],
) -> Result<(), DbErr> {
    let answers = of_kind(writes, |write| match write {
        AttemptWrite::Finish { id, end, .. } | AttemptWrite::Sell { id, end, .. } => {
            Some((id.as_str(), end))
        }
        AttemptWrite::Insert { .. } | AttemptWrite::Busy { .. } | AttemptWrite::Barrier => None,
    });
    let brought = writes.iter().filter_map(|write| match write {
        AttemptWrite::Insert {
            answered: Some(answered),
            ..
        } => Some((answered.attempt_id.as_str(), &answered.end)),
        _ => None,
    });
    let all = answers.iter().map(|&(_, answer)| answer).chain(brought);
    let finished = finish(txn, all).await?;
    for &(index, (id, _)) in &answers {
        if !finished.contains(id) {
            results[index] = Written::Stale;
        }
    }
    Ok(())
}

/// Rows of calls that never went out, each turned into the `busy` skip
/// while still `in_flight` (else `Stale`), in one UPDATE.
async fn skip_busy_calls(
    txn: &DatabaseTransaction,
    writes: &[AttemptWrite],
    results: &mut [Written],
) -> Result<(), DbErr> {
    let busy = of_kind(writes, |write| match write {
        AttemptWrite::Busy { id, .. } => Some(id.as_str()),
        _ => None,
    });
    if busy.is_empty() {
        return Ok(());
    }
    let reason = SkipReason::Busy;
    let mut statement = Query::update();
    statement
        .table(attempt::Entity)
        .values([
            (attempt::Column::Kind, AttemptKind::Skip.as_str().into()),
            (
                attempt::Column::Outcome,
                AttemptOutcome::Skip(reason).as_str().into(),
            ),
            (attempt::Column::Reason, reason.as_str().into()),
            (attempt::Column::DurationMs, 0i64.into()),
        ])
        .and_where(any_of(
            txn.get_database_backend(),
            attempt::Column::Id,
            busy.iter().map(|&(_, id)| id),
        ))
        .and_where(Expr::col(attempt::Column::Outcome).eq(AttemptOutcome::InFlight.as_str()))
        .returning(Query::returning().column(attempt::Column::Id));
    let skipped: HashSet<String> = txn
        .query_all(&statement)
        .await?
        .iter()
        .map(|row| row.try_get("", "id"))
        .collect::<Result<_, _>>()?;
    for (index, id) in busy {
        if !skipped.contains(id) {
            results[index] = Written::Stale;
        }
    }
    Ok(())
}

/// New rows whose lead's claim no longer holds are `Fenced`.
async fn fence(
    txn: &DatabaseTransaction,
    writes: &[AttemptWrite],
    results: &mut [Written],
) -> Result<(), DbErr> {
    let fences = of_kind(writes, |write| match write {
        AttemptWrite::Insert { fence, .. } => Some(fence),
        _ => None,
    });
    let held = claims_held(txn, fences.iter().map(|&(_, fence)| fence)).await?;
    for &(index, fence) in &fences {
        if held.get(fence.lead_id.as_str()).map(String::as_str) != Some(fence.token.as_str()) {
            results[index] = Written::Fenced;
        }
    }
    Ok(())
}

/// The new rows that may be written, the capped ones as skips, in one
/// INSERT built from the rows where they are. Each row's request goes as
/// its JSON text (cast to `jsonb` on PostgreSQL): `insert_many` would copy
/// every request's tree three times (the rows it takes, the statement it
/// builds, the driver's binding) only to serialize it at the end.
async fn insert_rows(
    txn: &DatabaseTransaction,
    writes: &[AttemptWrite],
    results: &[Written],
) -> Result<(), DbErr> {
    let backend = txn.get_database_backend();
    let mut insert = Query::insert();
    insert
        .into_table(attempt::Entity)
        .columns(attempt::Column::iter());
    let mut rows = 0;
    for (write, result) in writes.iter().zip(results) {
        let row = match (write, result) {
            (AttemptWrite::Insert { row, .. }, Written::Done) => Cow::Borrowed(&**row),
            (AttemptWrite::Insert { row, .. }, Written::Capped) => Cow::Owned(capped_skip(row)),
            _ => continue,
        };
        let values = attempt::Column::iter()
            .map(|column| column_value(&row, column, backend))
            .collect::<Result<Vec<_>, _>>()?;
        insert
            .values(values)
            .map_err(|error| DbErr::Custom(error.to_string()))?;
        rows += 1;
    }
    if rows > 0 {
        txn.execute(&insert).await?;
    }
    Ok(())
}

/// One column of a new attempt row, as the INSERT's value: the request as
/// JSON text, every other column as it is set.
fn column_value(
    row: &attempt::ActiveModel,
    column: attempt::Column,
    backend: DbBackend,
) -> Result<Expr, DbErr> {
    let unset = || DbErr::Custom(format!("a new attempt row has no {column:?}"));
    if matches!(column, attempt::Column::Request) {
        let text = Expr::val(row.request.try_as_ref().ok_or_else(unset)?.to_string());
        return Ok(match backend {
            DbBackend::Postgres => text.cast_as(Alias::new("jsonb")),
            _ => text,
        });
    }
    let value = row.get(column).into_value().ok_or_else(unset)?;
    Ok(Expr::val(value))
}

/// Writes each answer onto its row if the row is still `in_flight`, in one
/// `UPDATE … FROM (VALUES …)`; the ids of the rows written.
async fn finish<'a>(
    txn: &DatabaseTransaction,
    answers: impl Iterator<Item = (&'a str, &'a AttemptEnd)>,
) -> Result<HashSet<String>, DbErr> {
    let answers: Vec<ValueTuple> = answers
        .map(|(id, end)| {
            ValueTuple::Many(vec![
                id.into(),
                AttemptOutcome::Call(end.outcome).as_str().into(),
                end.reason.clone().into(),
                end.http_status.map(i32::from).into(),
                (end.duration.as_millis() as i64).into(),
                end.response_body.clone().into(),
                end.bid.into(),
                end.ping_id.clone().into(),
            ])
        })
        .collect();
    if answers.is_empty() {
        return Ok(HashSet::new());
    }
    // A VALUES list's columns are `column1`, `column2`, … on both databases.
    let answer = Alias::new("answer");
    let column = |n: usize| Expr::col((answer.clone(), Alias::new(format!("column{n}"))));
    let mut statement = Query::update();
    statement
        .table(attempt::Entity)
        .values([
            (attempt::Column::Outcome, column(2)),
            (attempt::Column::Reason, column(3)),
            (attempt::Column::HttpStatus, column(4)),
            (attempt::Column::DurationMs, column(5)),
            (attempt::Column::ResponseBody, column(6)),
            (attempt::Column::Bid, column(7)),
            (attempt::Column::PingId, column(8)),
        ])
        .from(TableRef::ValuesList(answers, answer.clone().into_iden()))
        .and_where(
            Expr::col((attempt::Entity, attempt::Column::Id))
                .equals((answer, Alias::new("column1"))),
        )
        .and_where(
            Expr::col((attempt::Entity, attempt::Column::Outcome))
                .eq(AttemptOutcome::InFlight.as_str()),
        )
        .returning(Query::returning().column(attempt::Column::Id));
    txn.query_all(&statement)
        .await?
        .iter()
        .map(|row| row.try_get("", "id"))
        .collect()
}

/// The sales of the accepted posts whose answers were written, unless
/// their lead has one (`AlreadySold`), and the `sold` of their leads.
async fn sell(
    txn: &DatabaseTransaction,
    writes: &[AttemptWrite],
    results: &mut [Written],
) -> Result<(), DbErr> {
    let mut sales = of_kind(writes, |write| match write {
        AttemptWrite::Sell { id, sale, .. } => Some((id.as_str(), &**sale)),
        _ => None,
    });
    sales.retain(|&(index, _)| results[index] == Written::Done);
    let made = insert_sales(txn, sales.iter().map(|&(_, (_, sale))| sale.clone())).await?;
    let mut sold = Vec::new();
    for &(index, (attempt_id, _)) in &sales {
        match (&writes[index], made.contains(attempt_id)) {
            (AttemptWrite::Sell { lead_id, .. }, true) => sold.push(lead_id.as_str()),
            _ => results[index] = Written::AlreadySold,
        }
    }
    mark_sold(txn, &sold).await
}

/// Reserves the cap slots of the new rows whose claim holds (a row whose
/// cap is full is written as a `capped` skip) and gives back the slots of
/// the answers and `busy` skips written: in buyer order, the same in every instance's
/// groups, so two groups never wait on each other's counters in a cycle.
async fn take_cap_slots(
    txn: &DatabaseTransaction,
    writes: &[AttemptWrite],
    results: &mut [Written],
) -> Result<(), DbErr> {
    let mut order: Vec<usize> = (0..writes.len()).collect();
    order.sort_by_key(|&index| cap_buyer(&writes[index]));
    for index in order {
        if results[index] != Written::Done {
            continue;
        }
        match &writes[index] {
            AttemptWrite::Insert { caps, .. } => {
                if !caps::reserve(txn, caps).await? {
                    results[index] = Written::Capped;
                }
            }
            AttemptWrite::Finish { release, .. } | AttemptWrite::Busy { release, .. } => {
                caps::release(txn, release).await?
            }
            AttemptWrite::Sell { .. } | AttemptWrite::Barrier => {}
        }
    }
    Ok(())
}

/// The buyer whose cap counters a write locks, if any.
fn cap_buyer(write: &AttemptWrite) -> Option<&str> {
    let slots = match write {
        AttemptWrite::Insert { caps, .. } => caps,
        AttemptWrite::Finish { release, .. } | AttemptWrite::Busy { release, .. } => release,
        AttemptWrite::Sell { .. } | AttemptWrite::Barrier => return None,
    };
    slots.first().map(|slot| slot.buyer_id.as_str())
}

/// A new row written as the `capped` skip it became.
fn capped_skip(row: &attempt::ActiveModel) -> attempt::ActiveModel {
    let mut skip = row.clone();
    skip.kind = Set(AttemptKind::Skip.as_str().into());
    skip.outcome = Set(AttemptOutcome::Skip(SkipReason::Capped).as_str().into());
    skip.reason = Set(Some(SkipReason::Capped.as_str().into()));
    skip.duration_ms = Set(Some(0));
    skip
}

/// Which of these claims still hold, checked with one statement that
/// locks the leads' rows until the commit, so a claim by another instance
/// either waits for us (and then sees our rows) or has already changed the
/// token (and we write nothing). On PostgreSQL a `SELECT … FOR UPDATE`: a
/// row lock, where an UPDATE would write a new version of every lead row
/// (raw payload and all) in every group. SQLite has one writer and no row
/// locks: a no-op UPDATE takes its write lock at once, so no other write
/// can come between this check and the group's commit. The token each
/// lead is held under, of those that hold.
async fn claims_held<'a>(
    txn: &DatabaseTransaction,
    fences: impl Iterator<Item = &'a Fence>,
) -> Result<HashMap<String, String>, DbErr> {
    let (leads, tokens): (HashSet<&str>, HashSet<&str>) = fences
        .map(|fence| (fence.lead_id.as_str(), fence.token.as_str()))
        .unzip();
    if leads.is_empty() {
        return Ok(HashMap::new());
    }
    let backend = txn.get_database_backend();
    let holding = Condition::all()
        .add(any_of(backend, lead::Column::Id, leads))
        .add(any_of(backend, lead::Column::ClaimToken, tokens))
        .add(state_is(LeadState::Routing))
        .add(lead::Column::LeaseUntil.gt(Utc::now()));
    let held = [lead::Column::Id, lead::Column::ClaimToken];
    let rows = if txn.get_database_backend() == DbBackend::Postgres {
        let statement = lead::Entity::find()
            .select_only()
            .columns(held)
            .filter(holding)
            .lock_exclusive()
            .into_query();
        txn.query_all(&statement).await?
    } else {
        let mut statement = lead::Entity::update_many()
            .col_expr(
                lead::Column::LeaseUntil,
                Expr::col(lead::Column::LeaseUntil),
            )
            .filter(holding)
            .into_query();
        statement.returning(Query::returning().columns(held));
        txn.query_all(&statement).await?
    };
    rows.iter()
        .map(|row| Ok((row.try_get("", "id")?, row.try_get("", "claim_token")?)))
        .collect()
}

/// Inserts the sale unless the lead has one; see `insert_sales`.
pub(super) async fn insert_sale(
    txn: &DatabaseTransaction,
    sale: sale::ActiveModel,
) -> Result<bool, DbErr> {
    Ok(!insert_sales(txn, std::iter::once(sale)).await?.is_empty())
}

/// Inserts each sale unless its lead has one (the partial unique index on
/// sales not returned decides; `DO NOTHING` keeps the transaction usable):
/// the attempt ids of the sales made.
async fn insert_sales(
    txn: &DatabaseTransaction,
    sales: impl Iterator<Item = sale::ActiveModel>,
) -> Result<HashSet<String>, DbErr> {
    let sales: Vec<sale::ActiveModel> = sales.collect();
    if sales.is_empty() {
        return Ok(HashSet::new());
    }
    let mut statement = sale::Entity::insert_many(sales)
        .on_conflict(OnConflict::new().do_nothing().to_owned())
        .into_query();
    statement.returning(Query::returning().column(sale::Column::AttemptId));
    let made = txn.query_all(&statement).await?;
    let attempt_ids = made
        .iter()
        .map(|row| row.try_get::<Option<String>>("", "attempt_id"));
    attempt_ids.filter_map(Result::transpose).collect()
}

/// The leads are sold: whoever held them lets go (its settle finds the token gone).
pub(super) async fn mark_sold(txn: &DatabaseTransaction, lead_ids: &[&str]) -> Result<(), DbErr> {
    if lead_ids.is_empty() {
        return Ok(());
    }
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
        .filter(any_of(
            txn.get_database_backend(),
            lead::Column::Id,
            lead_ids.iter().copied(),
        ))
        .exec(txn)
        .await?;
    Ok(())
}

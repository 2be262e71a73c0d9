//! `Intake`: stores submitted leads with group commit.
//!
//! Started by the `Overseer` on a thread of its own, so its commits never
//! wait behind routing's actors for their turn. Handles `SubmitLead`: the
//! lead joins the buffer; while one batch is being written the next one
//! fills, so under load many leads share a transaction, and each sender is
//! answered only after the commit that holds its lead. A batch is one
//! transaction holding its intake log rows and its leads (one commit per
//! batch). SQLite writes one batch at a time. PostgreSQL may write a second
//! batch while the first commits, but only once `SECOND_BATCH_FROM` leads
//! wait: started eagerly, second batches split a light load into smaller
//! batches and cost more CPU per lead (the intake bench), while under a
//! heavy load the serial cycle of one batch (build, send, execute, commit)
//! left a core idle. A batch the database refuses is
//! retried lead by lead, each lead's log row committed before it, so one
//! bad row cannot fail its neighbours. A batch the database cannot take
//! (unreachable, or no answer within `write_deadline`) goes to the spool,
//! fsynced, and its senders are answered `pending`; if the spool cannot
//! take it either, `failed`. On restart, leads still buffered are written;
//! leads whose write was interrupted were answered `failed` (their senders
//! retry with the same key).

use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;

use super::router::RouteLeads;
use super::supervision::{guarded, RestartLog};
use super::yielding::IntakeDelay;
use crate::alerts::{AlertKind, Alerts};
use crate::config::DuplicateRule;
use crate::domain::{Contract, LeadId, LeadState};
use crate::spool::{Spool, SpooledLead};
use crate::store::{contract_of_row, is_unreachable, NewLead, PersistOutcome, Store};

/// Most leads written in one transaction.
const MAX_BATCH: usize = 512;
/// Leads that must wait before a second batch starts beside the one being
/// written (PostgreSQL).
const SECOND_BATCH_FROM: usize = 16;
/// Senders beyond this wait (back-pressure); the default 16 would park
/// most HTTP workers under load and starve group commit of leads.
const MAILBOX_CAPACITY: usize = 4096;

/// Intake settings the actor needs.
#[derive(Debug, Clone)]
pub struct IntakeRules {
    pub duplicates: DuplicateRule,
    /// A batch not committed by then goes to the spool.
    pub write_deadline: Duration,
    /// Leads waiting for their commit at most (`intake.max_pending`);
    /// beyond it a lead is refused at once (`Full`), nothing kept.
    pub max_pending: usize,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum IntakeError {
    #[error("the lead could not be stored: {0}")]
    Store(String),
    #[error("the intake actor stopped before the lead was stored")]
    Interrupted,
    #[error("intake has {0} leads waiting for their commit; try again shortly")]
    Full(usize),
}

/// Store this lead and answer with its contract.
#[derive(Message)]
#[rtype(result = "Result<Contract, IntakeError>")]
pub struct SubmitLead {
    pub lead: NewLead,
}

struct Waiting {
    lead: NewLead,
    /// When intake was handed the lead.
    since: Instant,
    reply: oneshot::Sender<Result<Contract, IntakeError>>,
}

/// Where intake puts leads: the database, else the spool; and who routes them.
#[derive(Clone)]
pub struct IntakeTargets {
    pub store: Store,
    pub spool: Spool,
    /// Where stored, routable leads go (the router).
    pub route_to: Recipient<RouteLeads>,
    /// Where intake's backlog (`leadrouter_intake_pending`) is shown.
    pub metrics: crate::metrics::Metrics,
    /// The notify channels, for leads the spool drainer stores (intake's
    /// own are handed over by the HTTP handler, which may wait for them).
    pub couriers: super::courier::Couriers,
    pub alerts: Alerts,
    /// How long leads wait for their commit, which routing yields to.
    pub delay: IntakeDelay,
}

pub struct Intake {
    targets: IntakeTargets,
    rules: IntakeRules,
    restarts: RestartLog,
    buffer: Vec<Waiting>,
    /// Leads of the batches being written; new leads wait for the next one.
    writing: usize,
    /// For each batch being written, when its first lead was handed to
    /// intake.
    batches_since: Vec<Instant>,
}

impl Intake {
    pub fn new(targets: IntakeTargets, rules: IntakeRules, restarts: RestartLog) -> Self {
        Self {
            targets,
            rules,
            restarts,
            buffer: Vec::new(),
            writing: 0,
            batches_since: Vec::new(),
        }
    }

    fn write_next_batch(&mut self, ctx: &mut Context<Self>) {
        self.targets
            .metrics
            .intake_pending(self.buffer.len() + self.writing);
        if self.may_start_batch() {
            self.start_batch(ctx);
        }
        let oldest = self
            .batches_since
            .iter()
            .min()
            .copied()
            .or_else(|| self.buffer.first().map(|waiting| waiting.since));
        self.targets.delay.waiting_since(oldest);
    }

    /// A first batch as soon as a lead waits; a second (PostgreSQL) only
    /// once enough wait to fill it.
    fn may_start_batch(&self) -> bool {
        match self.batches_since.len() {
            0 => !self.buffer.is_empty(),
            1 => {
                self.targets.store.intake_batches_at_once() > 1
                    && self.buffer.len() >= SECOND_BATCH_FROM
            }
            _ => false,
        }
    }

    fn start_batch(&mut self, ctx: &mut Context<Self>) {
        let take = self.buffer.len().min(MAX_BATCH);
        let since = self.buffer[0].since;
        self.writing += take;
        self.batches_since.push(since);
        let batch: Vec<Waiting> = self.buffer.drain(..take).collect();
        let targets = self.targets.clone();
        let rules = self.rules.clone();
        ctx.spawn(
            guarded::<Self, _>("intake", write_batch(targets, rules, batch)).map(
                move |done, actor, ctx| {
                    if done.is_some() {
                        actor.targets.delay.answered(since.elapsed());
                        if let Some(index) = actor.batches_since.iter().position(|s| *s == since) {
                            actor.batches_since.swap_remove(index);
                        }
                        actor.writing = actor.writing.saturating_sub(take);
                        actor.write_next_batch(ctx);
                    }
                },
            ),
        );
    }
}

impl Actor for Intake {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(MAILBOX_CAPACITY);
        // After a restart: write what is still buffered.
        self.write_next_batch(ctx);
    }
}

impl Supervised for Intake {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.restarts.restarted("intake");
        self.writing = 0;
        self.batches_since.clear();
    }
}

impl Handler<SubmitLead> for Intake {
    type Result = ResponseFuture<Result<Contract, IntakeError>>;

    /// Buffers the lead and answers once its batch has committed.
    fn handle(&mut self, message: SubmitLead, ctx: &mut Context<Self>) -> Self::Result {
        let pending = self.buffer.len() + self.writing;
        if pending >= self.rules.max_pending {
            return Box::pin(async move { Err(IntakeError::Full(pending)) });
        }
        let (reply, answer) = oneshot::channel();
        self.buffer.push(Waiting {
            lead: message.lead,
            since: Instant::now(),
            reply,
        });
        self.write_next_batch(ctx);
        Box::pin(async move { answer.await.unwrap_or(Err(IntakeError::Interrupted)) })
    }
}

async fn write_batch(targets: IntakeTargets, rules: IntakeRules, batch: Vec<Waiting>) {
    if targets.spool.database_down() {
        return spool_batch(&targets, batch).await;
    }
    let store = &targets.store;
    let leads: Vec<NewLead> = batch.iter().map(|waiting| waiting.lead.clone()).collect();
    let written = actix_web::rt::time::timeout(
        rules.write_deadline,
        store.log_and_persist_leads(&leads, &rules.duplicates),
    )
    .await;
    match written {
        Ok(Ok(outcomes)) => {
            let routable = outcomes.iter().filter_map(routable_id).collect();
            for (waiting, outcome) in batch.into_iter().zip(outcomes) {
                let _ = waiting.reply.send(Ok(contract_of(&outcome)));
            }
            // Losing this message only delays routing to the next sweep.
            targets.route_to.do_send(RouteLeads { lead_ids: routable });
        }
        Ok(Err(error)) if !is_unreachable(&error) => {
            tracing::error!(%error, leads = batch.len(), "lead insert failed; trying lead by lead");
            write_one_by_one(&targets, &rules, batch).await;
        }
        Ok(Err(error)) => {
            tracing::error!(%error, leads = batch.len(), "database unreachable; spooling until the drainer reaches it");
            spool_batch(&targets, batch).await;
        }
        Err(_) => {
            tracing::error!(
                leads = batch.len(),
                "database did not answer in time; spooling until the drainer reaches it"
            );
            spool_batch(&targets, batch).await;
        }
    }
}

/// After a batch the database refused (nothing of it kept): each lead on
/// its own, so one bad row cannot fail its neighbours, each within the
/// write deadline and with its intake log row committed first, so a lead
/// refused still leaves its log row; from the first lead the database
/// cannot be reached for (or not in time), the rest go to the spool.
async fn write_one_by_one(targets: &IntakeTargets, rules: &IntakeRules, batch: Vec<Waiting>) {
    let mut routable = Vec::new();
    let mut unreachable = Vec::new();
    let mut failed = Vec::new();
    for waiting in batch {
        // Once the database is out of reach, the rest go to the spool
        // without waiting for it again, lead after lead.
        if !unreachable.is_empty() {
            unreachable.push(waiting);
            continue;
        }
        let lead = std::slice::from_ref(&waiting.lead);
        let stored = actix_web::rt::time::timeout(rules.write_deadline, async {
            targets.store.log_arrivals(lead).await?;
            targets.store.persist_leads(lead, &rules.duplicates).await
        })
        .await;
        let Ok(stored) = stored else {
            unreachable.push(waiting);
            continue;
        };
        match stored.map(|outcomes| outcomes.into_iter().next()) {
            Ok(Some(outcome)) => {
                routable.extend(routable_id(&outcome));
                let _ = waiting.reply.send(Ok(contract_of(&outcome)));
            }
            Ok(None) => {
                let _ = waiting.reply.send(Err(IntakeError::Interrupted));
            }
            Err(error) if is_unreachable(&error) => unreachable.push(waiting),
            Err(error) => {
                tracing::error!(%error, lead_id = %waiting.lead.id, "intake could not store a lead");
                failed.push(error.to_string());
                let _ = waiting
                    .reply
                    .send(Err(IntakeError::Store(error.to_string())));
            }
        }
    }
    targets.route_to.do_send(RouteLeads { lead_ids: routable });
    if !failed.is_empty() {
        let message = format!(
            "intake could not store {} leads: {}",
            failed.len(),
            failed[0]
        );
        raise_later(&targets.alerts, AlertKind::IntakeFailed, message);
    }
    if !unreachable.is_empty() {
        spool_batch(targets, unreachable).await;
    }
}

/// Journals the batch in the spool (fsync) and answers `pending`; if the
/// spool cannot take it either, `failed`.
async fn spool_batch(targets: &IntakeTargets, batch: Vec<Waiting>) {
    let entries: Vec<SpooledLead> = batch
        .iter()
        .map(|waiting| SpooledLead {
            contract: Contract::spooled(waiting.lead.id.clone(), waiting.lead.errors.clone()),
            lead: waiting.lead.clone(),
        })
        .collect();
    let spool = targets.spool.clone();
    let first_in_spool = spool.pending() == 0;
    let appended =
        actix_web::rt::task::spawn_blocking(move || spool.append(&entries).map(|()| entries))
            .await
            .map_err(std::io::Error::other)
            .and_then(|result| result);
    let (kind, message) = match appended {
        Ok(entries) => {
            // Until the drainer reaches the database, later batches go
            // straight to the spool.
            targets.spool.mark_database_down();
            for (waiting, entry) in batch.into_iter().zip(entries) {
                let _ = waiting.reply.send(Ok(entry.contract));
            }
            if !first_in_spool {
                return;
            }
            (
                AlertKind::SpoolInUse,
                "database unreachable: intake is writing leads to the spool".to_string(),
            )
        }
        Err(error) => {
            let failure =
                IntakeError::Store(format!("database unreachable and spool failed: {error}"));
            let count = batch.len();
            for waiting in batch {
                let _ = waiting.reply.send(Err(failure.clone()));
            }
            (
                AlertKind::IntakeFailed,
                format!("intake could not store {count} leads: database unreachable and spool failed ({error})"),
            )
        }
    };
    raise_later(&targets.alerts, kind, message);
}

/// Raises an alert without holding up the senders' answers.
fn raise_later(alerts: &Alerts, kind: AlertKind, message: String) {
    let alerts = alerts.clone();
    actix::spawn(async move { alerts.raise(kind, None, None, &message).await });
}

/// A newly stored lead that waits to be routed.
pub(super) fn routable_id(outcome: &PersistOutcome) -> Option<LeadId> {
    match outcome {
        PersistOutcome::Inserted(row) if row.state == LeadState::Received.as_str() => {
            Some(LeadId::from(row.id.as_str()))
        }
        _ => None,
    }
}

/// The contract of a stored (or replayed) lead row.
fn contract_of(outcome: &PersistOutcome) -> Contract {
    let (row, replayed) = match outcome {
        PersistOutcome::Inserted(row) => (row, false),
        PersistOutcome::Existing(row) => (row, true),
    };
    let mut contract = contract_of_row(row);
    contract.replayed = replayed;
    contract
}

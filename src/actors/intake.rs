//! `Intake`: stores submitted leads with group commit.
//!
//! Started by the `Overseer`. Handles `SubmitLead`: the lead joins the
//! buffer; while one batch is being written the next one fills, so under
//! load many leads share a transaction, and each sender is answered only
//! after the commit that holds its lead. Per batch: the intake log rows are
//! committed first, then the leads. A batch that fails is retried lead by
//! lead, so one bad row cannot fail its neighbours. On restart, leads still
//! buffered are written; leads whose write was interrupted were answered
//! `failed` (their senders retry with the same key).

use actix::prelude::*;
use tokio::sync::oneshot;

use super::router::RouteLeads;
use crate::domain::{Contract, LeadState};
use crate::store::{contract_of_row, DuplicateRule, NewLead, PersistOutcome, Store};

/// Most leads written in one transaction.
const MAX_BATCH: usize = 512;
/// Senders beyond this wait (back-pressure); the default 16 would park
/// most HTTP workers under load and starve group commit of leads.
const MAILBOX_CAPACITY: usize = 4096;

/// Intake settings the actor needs.
#[derive(Debug, Clone)]
pub struct IntakeRules {
    pub duplicates: DuplicateRule,
    /// A required notify channel exists, so stored leads stay `pending`.
    pub awaiting_required_notify: bool,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum IntakeError {
    #[error("the lead could not be stored: {0}")]
    Store(String),
    #[error("the intake actor stopped before the lead was stored")]
    Interrupted,
}

/// Store this lead and answer with its contract.
#[derive(Message)]
#[rtype(result = "Result<Contract, IntakeError>")]
pub struct SubmitLead {
    pub lead: NewLead,
}

struct Waiting {
    lead: NewLead,
    reply: oneshot::Sender<Result<Contract, IntakeError>>,
}

pub struct Intake {
    store: Store,
    rules: IntakeRules,
    /// Where stored, routable leads go (the router).
    route_to: Recipient<RouteLeads>,
    buffer: Vec<Waiting>,
    /// A batch is being written; new leads wait for the next one.
    writing: bool,
}

impl Intake {
    pub fn new(store: Store, rules: IntakeRules, route_to: Recipient<RouteLeads>) -> Self {
        Self {
            store,
            rules,
            route_to,
            buffer: Vec::new(),
            writing: false,
        }
    }

    fn write_next_batch(&mut self, ctx: &mut Context<Self>) {
        if self.writing || self.buffer.is_empty() {
            return;
        }
        self.writing = true;
        let take = self.buffer.len().min(MAX_BATCH);
        let batch: Vec<Waiting> = self.buffer.drain(..take).collect();
        let store = self.store.clone();
        let rules = self.rules.clone();
        let route_to = self.route_to.clone();
        ctx.spawn(
            write_batch(store, rules, batch, route_to)
                .into_actor(self)
                .map(|(), actor, ctx| {
                    actor.writing = false;
                    actor.write_next_batch(ctx);
                }),
        );
    }
}

impl Actor for Intake {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(MAILBOX_CAPACITY);
    }
}

impl Supervised for Intake {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        tracing::warn!(buffered = self.buffer.len(), "intake actor restarting");
        self.writing = false;
    }
}

impl Handler<SubmitLead> for Intake {
    type Result = ResponseFuture<Result<Contract, IntakeError>>;

    /// Buffers the lead and answers once its batch has committed.
    fn handle(&mut self, message: SubmitLead, ctx: &mut Context<Self>) -> Self::Result {
        let (reply, answer) = oneshot::channel();
        self.buffer.push(Waiting {
            lead: message.lead,
            reply,
        });
        self.write_next_batch(ctx);
        Box::pin(async move { answer.await.unwrap_or(Err(IntakeError::Interrupted)) })
    }
}

async fn write_batch(
    store: Store,
    rules: IntakeRules,
    batch: Vec<Waiting>,
    route_to: Recipient<RouteLeads>,
) {
    let leads: Vec<NewLead> = batch.iter().map(|waiting| waiting.lead.clone()).collect();
    if let Err(error) = store.log_arrivals(&leads).await {
        tracing::error!(%error, leads = leads.len(), "intake could not write the intake log");
        let failure = IntakeError::Store(error.to_string());
        for waiting in batch {
            let _ = waiting.reply.send(Err(failure.clone()));
        }
        return;
    }
    match store.persist_leads(&leads, &rules.duplicates).await {
        Ok(outcomes) => {
            let routable = outcomes.iter().filter_map(routable_id).collect();
            for (waiting, outcome) in batch.into_iter().zip(outcomes) {
                let _ = waiting.reply.send(Ok(contract_of(&outcome, &rules)));
            }
            // Losing this message only delays routing to the next sweep.
            route_to.do_send(RouteLeads { lead_ids: routable });
        }
        Err(error) => {
            tracing::error!(%error, leads = batch.len(), "lead insert failed; trying lead by lead");
            let lone = batch.len() == 1;
            let mut routable = Vec::new();
            for waiting in batch {
                let stored = if lone {
                    Err(IntakeError::Store(error.to_string()))
                } else {
                    persist_alone(&store, &waiting.lead, &rules).await
                };
                routable.extend(stored.as_ref().ok().and_then(routable_id));
                let _ = waiting
                    .reply
                    .send(stored.map(|outcome| contract_of(&outcome, &rules)));
            }
            route_to.do_send(RouteLeads { lead_ids: routable });
        }
    }
}

/// A newly stored lead that waits to be routed.
fn routable_id(outcome: &PersistOutcome) -> Option<String> {
    match outcome {
        PersistOutcome::Inserted(row) if row.state == LeadState::Received.as_str() => {
            Some(row.id.clone())
        }
        _ => None,
    }
}

async fn persist_alone(
    store: &Store,
    lead: &NewLead,
    rules: &IntakeRules,
) -> Result<PersistOutcome, IntakeError> {
    match store
        .persist_leads(std::slice::from_ref(lead), &rules.duplicates)
        .await
    {
        Ok(outcomes) => outcomes.into_iter().next().ok_or(IntakeError::Interrupted),
        Err(error) => {
            tracing::error!(%error, lead_id = %lead.id, "intake could not store a lead");
            Err(IntakeError::Store(error.to_string()))
        }
    }
}

/// The contract of a stored (or replayed) lead row.
fn contract_of(outcome: &PersistOutcome, rules: &IntakeRules) -> Contract {
    let (row, replayed) = match outcome {
        PersistOutcome::Inserted(row) => (row, false),
        PersistOutcome::Existing(row) => (row, true),
    };
    let mut contract = contract_of_row(row, rules.awaiting_required_notify);
    contract.replayed = replayed;
    contract
}

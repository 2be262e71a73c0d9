//! `SpoolDrainer`: moves spooled leads into the database once it answers
//! again, oldest journal first, and hands the routable ones to the router.
//!
//! Started by the `Overseer`; ticks every second while the spool holds
//! leads. Idempotency holds across the move: a lead whose id is already in
//! the database (its write had committed after all) is not written again,
//! and a (source, key) already taken makes the spooled lead that key's
//! replay, as at intake. A journal is deleted only after its leads are
//! committed, so a crash mid-drain repeats the move, never loses it; a lead
//! the database refuses on its own is kept in the spool's `refused/` with
//! an alert. The drainer also tells intake when the database answers again.

use std::path::PathBuf;
use std::time::Duration;

use actix::prelude::*;

use super::intake::{routable_id, IntakeRules, IntakeTargets};
use super::router::RouteLeads;
use super::supervision::{guarded, RestartLog};
use crate::alerts::AlertKind;
use crate::spool::{read_journal, SpooledLead};
use crate::store::{is_unreachable, NewLead, PersistOutcome};

const DRAIN_EVERY: Duration = Duration::from_secs(1);

pub struct SpoolDrainer {
    targets: IntakeTargets,
    rules: IntakeRules,
    restarts: RestartLog,
    busy: bool,
}

impl SpoolDrainer {
    pub fn new(targets: IntakeTargets, rules: IntakeRules, restarts: RestartLog) -> Self {
        Self {
            targets,
            rules,
            restarts,
            busy: false,
        }
    }

    fn drain(&mut self, ctx: &mut Context<Self>) {
        let spool = &self.targets.spool;
        if self.busy || (spool.pending() == 0 && !spool.database_down()) {
            return;
        }
        self.busy = true;
        let (targets, rules) = (self.targets.clone(), self.rules.clone());
        ctx.spawn(
            guarded::<Self, _>("spool drainer", drain_journals(targets, rules))
                .map(|_, drainer, _ctx| drainer.busy = false),
        );
    }
}

impl Actor for SpoolDrainer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.drain(ctx);
        ctx.run_interval(DRAIN_EVERY, |drainer, ctx| drainer.drain(ctx));
    }
}

impl Supervised for SpoolDrainer {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.restarts.restarted("spool drainer");
        self.busy = false;
    }
}

/// Moves every journal it can; stops at the first sign the database is
/// still unreachable. With nothing to move (or a spool that cannot be
/// listed), it only checks whether the database answers again.
async fn drain_journals(targets: IntakeTargets, rules: IntakeRules) {
    let journals = match targets.spool.journals() {
        Ok(journals) => journals,
        Err(error) => {
            tracing::error!(%error, "cannot list the spool directory");
            Vec::new()
        }
    };
    if journals.is_empty() {
        if targets.store.is_reachable().await {
            targets.spool.mark_database_up();
        }
        return;
    }
    for journal in journals {
        match drain_journal(&targets, &rules, journal.clone()).await {
            Ok(moved) => {
                targets.spool.mark_database_up();
                tracing::info!(
                    moved,
                    pending = targets.spool.pending(),
                    "spooled leads moved into the database"
                )
            }
            Err(DrainError::Unreachable(error)) => {
                tracing::warn!(%error, pending = targets.spool.pending(), "database still unreachable; the spool waits");
                return;
            }
            Err(error) => {
                tracing::error!(%error, journal = %journal.display(), "spool journal not moved; trying the next")
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum DrainError {
    #[error("database unreachable: {0}")]
    Unreachable(sea_orm::DbErr),
    #[error("database refused the leads: {0}")]
    Refused(sea_orm::DbErr),
    #[error("journal file: {0}")]
    File(#[from] std::io::Error),
}

impl From<sea_orm::DbErr> for DrainError {
    fn from(error: sea_orm::DbErr) -> Self {
        if is_unreachable(&error) {
            Self::Unreachable(error)
        } else {
            Self::Refused(error)
        }
    }
}

/// Writes one journal's leads (those not already in the database), routes
/// the new ones, then deletes the journal. A batch the database refuses is
/// written lead by lead; a lead refused on its own is set aside in the
/// spool's `refused/` with an alert, never dropped. Returns how many leads
/// were written.
async fn drain_journal(
    targets: &IntakeTargets,
    rules: &IntakeRules,
    journal: PathBuf,
) -> Result<usize, DrainError> {
    let read = journal.clone();
    let spooled: Vec<SpooledLead> = blocking(move || read_journal(&read)).await?;
    let ids: Vec<String> = spooled.iter().map(|entry| entry.lead.id.clone()).collect();
    let already_stored = targets.store.existing_lead_ids(&ids).await?;
    let fresh: Vec<&SpooledLead> = spooled
        .iter()
        .filter(|entry| !already_stored.contains(&entry.lead.id))
        .collect();
    let leads: Vec<NewLead> = fresh.iter().map(|entry| entry.lead.clone()).collect();
    if !leads.is_empty() {
        // The journal itself is the evidence of arrival should the log fail.
        match targets
            .store
            .log_arrivals(&leads)
            .await
            .map_err(DrainError::from)
        {
            Err(DrainError::Refused(error)) => {
                tracing::warn!(%error, "spooled leads' intake log not written")
            }
            logged => logged?,
        }
        let mut routable = Vec::new();
        let mut aliases = Vec::new();
        let mut take = |lead: &NewLead, outcome: &PersistOutcome| {
            routable.extend(routable_id(outcome));
            aliases.extend(alias_of(lead, outcome));
        };
        match targets.store.persist_leads(&leads, &rules.duplicates).await {
            Ok(outcomes) => {
                for (lead, outcome) in leads.iter().zip(&outcomes) {
                    take(lead, outcome);
                }
            }
            Err(error) if is_unreachable(&error) => return Err(DrainError::Unreachable(error)),
            Err(_) => {
                for entry in fresh {
                    let lead = std::slice::from_ref(&entry.lead);
                    match targets.store.persist_leads(lead, &rules.duplicates).await {
                        Ok(outcomes) => {
                            for outcome in &outcomes {
                                take(&entry.lead, outcome);
                            }
                        }
                        Err(error) if is_unreachable(&error) => {
                            return Err(DrainError::Unreachable(error))
                        }
                        Err(error) => set_aside(targets, entry, &error).await?,
                    }
                }
            }
        }
        // Before the journal goes: the ids senders were given keep working.
        targets.store.record_aliases(&aliases).await?;
        targets.route_to.do_send(RouteLeads { lead_ids: routable });
        let stored: Vec<String> = leads.iter().map(|lead| lead.id.clone()).collect();
        targets.couriers.deliver(&stored);
    }
    let moved = leads.len();
    let spool = targets.spool.clone();
    blocking(move || spool.remove(&journal, &spooled)).await?;
    Ok(moved)
}

/// A spooled lead whose key turned out to be stored already: its id (the
/// one its sender was given) becomes an alias of that lead.
fn alias_of(lead: &NewLead, outcome: &PersistOutcome) -> Option<(String, String)> {
    match outcome {
        PersistOutcome::Existing(row) if row.id != lead.id => {
            Some((lead.id.clone(), row.id.clone()))
        }
        _ => None,
    }
}

/// Keeps a lead the database refuses in the spool's `refused/` and alerts.
async fn set_aside(
    targets: &IntakeTargets,
    entry: &SpooledLead,
    error: &sea_orm::DbErr,
) -> Result<(), DrainError> {
    let (spool, kept, reason) = (targets.spool.clone(), entry.clone(), error.to_string());
    blocking(move || spool.set_aside(&kept, &reason)).await?;
    let message = format!(
        "spooled lead {} was refused by the database ({error}); kept in the spool's refused/ for an operator",
        entry.lead.id
    );
    targets
        .alerts
        .raise(
            AlertKind::IntakeFailed,
            None,
            Some(&entry.lead.id),
            &message,
        )
        .await;
    Ok(())
}

/// Runs file I/O off the arbiter the actors share.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    actix_web::rt::task::spawn_blocking(work)
        .await
        .map_err(std::io::Error::other)?
}

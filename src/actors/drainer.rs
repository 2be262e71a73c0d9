//! `SpoolDrainer`: moves spooled leads into the database once it answers
//! again, oldest journal first, and hands the routable ones to the router.
//!
//! Started by the `Overseer`; ticks every second while the spool holds
//! leads. Idempotency holds across the move: a lead whose id is already in
//! the database (its write had committed after all) is not written again,
//! and a (source, key) already taken makes the spooled lead that key's
//! replay, as at intake. A journal is deleted only after its leads are
//! committed, so a crash mid-drain repeats the move, never loses it.

use std::path::Path;
use std::time::Duration;

use actix::prelude::*;

use super::intake::{routable_id, IntakeRules, IntakeTargets};
use super::router::RouteLeads;
use super::supervision::{guarded, RestartLog};
use crate::spool::{read_journal, SpooledLead};
use crate::store::{is_unreachable, NewLead};

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
/// still unreachable.
async fn drain_journals(targets: IntakeTargets, rules: IntakeRules) {
    let journals = match targets.spool.journals() {
        Ok(journals) => journals,
        Err(error) => {
            tracing::error!(%error, "cannot list the spool directory");
            return;
        }
    };
    if journals.is_empty() {
        // Intake spooled nothing it could not write (the spool failed too):
        // see whether the database answers again.
        if targets.store.is_reachable().await {
            targets.spool.mark_database_up();
        }
        return;
    }
    for journal in journals {
        match drain_journal(&targets, &rules, &journal).await {
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
                if matches!(error, DrainError::Refused(_)) {
                    targets.spool.mark_database_up();
                }
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
/// the new ones, then deletes the journal. Returns how many were written.
async fn drain_journal(
    targets: &IntakeTargets,
    rules: &IntakeRules,
    journal: &Path,
) -> Result<usize, DrainError> {
    let spooled: Vec<SpooledLead> = read_journal(journal)?;
    let ids: Vec<String> = spooled.iter().map(|entry| entry.lead.id.clone()).collect();
    let already_stored = targets.store.existing_lead_ids(&ids).await?;
    let fresh: Vec<NewLead> = spooled
        .iter()
        .filter(|entry| !already_stored.contains(&entry.lead.id))
        .map(|entry| entry.lead.clone())
        .collect();
    if !fresh.is_empty() {
        targets.store.log_arrivals(&fresh).await?;
        let outcomes = targets
            .store
            .persist_leads(&fresh, &rules.duplicates)
            .await?;
        let routable = outcomes.iter().filter_map(routable_id).collect();
        targets.route_to.do_send(RouteLeads { lead_ids: routable });
    }
    targets.spool.remove(journal, &spooled)?;
    Ok(fresh.len())
}

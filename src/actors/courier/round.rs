//! One round of a courier on the database side: the leads its targets are
//! owed planned (those handed over, and each target's window of recent
//! changes, a page at a time), then due rows claimed for its free slots.

use std::time::Duration;

use chrono::{DateTime, Utc};
use entity::lead;
use sea_orm::{ColumnTrait, Condition};

use crate::domain::LeadState;
use crate::notify::Destination;
use crate::store::{DeliveryTarget, HeldDelivery, Planned, Store, PLAN_PAGE};

/// The event sent once a lead's contract is accepted.
const ACCEPTED: &str = "lead.accepted";
/// A tick plans the leads changed since the last complete plan, with this
/// overlap (clock skew between instances, commits that took long).
const PLAN_OVERLAP: Duration = Duration::from_secs(10);

/// Where a tick plans each target from (in `targets`' order), and when
/// it started.
pub(super) struct Windows {
    pub(super) from: Vec<DateTime<Utc>>,
    pub(super) started: DateTime<Utc>,
}

/// What a round claimed, and where each target's next plan starts (if it
/// planned them).
#[derive(Default)]
pub(super) struct Done {
    pub(super) claimed: Vec<(DeliveryTarget, HeldDelivery)>,
    pub(super) plan_from: Option<Vec<DateTime<Utc>>>,
}

/// The database side of one round, on its own so it can run as a future.
pub(super) struct Round {
    pub(super) store: Store,
    pub(super) destination: Destination,
    pub(super) targets: Vec<DeliveryTarget>,
    pub(super) free: usize,
    pub(super) lease: Duration,
    pub(super) sweep_interrupted: bool,
}

impl Round {
    pub(super) async fn run(self, handed: Vec<String>, windows: Option<Windows>) -> Done {
        if self.sweep_interrupted {
            if let Err(error) = self
                .store
                .settle_interrupted_deliveries(self.destination.kind(), self.destination.id())
                .await
            {
                tracing::warn!(channel = self.destination.id(), %error, "settling interrupted deliveries");
            }
        }
        let mut claimed = Vec::new();
        let mut plan_from = Vec::new();
        for (index, target) in self.targets.iter().enumerate() {
            let owed = owed_by(target);
            for page in handed.chunks(PLAN_PAGE as usize) {
                let only = lead::Column::Id.is_in(page.iter().map(String::as_str));
                let plan = owed.clone().add(only);
                self.plan(target, plan, lead::Column::UpdatedAt).await;
            }
            if let Some(windows) = &windows {
                plan_from.push(self.plan_window(target, owed, windows, index).await);
            }
            // The leads just handed over first (a sender may be waiting
            // for them), then whatever else is due, oldest first.
            let first = (!handed.is_empty()).then_some(handed.as_slice());
            for only in [first, None] {
                let room = self.free.saturating_sub(claimed.len());
                if room == 0 {
                    break;
                }
                match self
                    .store
                    .claim_deliveries(target, only, room as u64, self.lease)
                    .await
                {
                    Ok(held) => claimed.extend(held.into_iter().map(|held| (target.clone(), held))),
                    Err(error) => {
                        tracing::warn!(channel = self.destination.id(), %error, "claiming deliveries")
                    }
                }
            }
        }
        Done {
            claimed,
            plan_from: windows.is_some().then_some(plan_from),
        }
    }

    /// Plans a page of the leads owed to `target` that changed since its
    /// window's start; answers where its next plan starts: on from this
    /// page's last lead if the page was full, else from this tick (with
    /// the overlap), or from the same place if it failed.
    async fn plan_window(
        &self,
        target: &DeliveryTarget,
        owed: Condition,
        windows: &Windows,
        index: usize,
    ) -> DateTime<Utc> {
        let from = windows.from[index];
        let changed = changed_at(target);
        match self
            .plan(target, owed.add(changed.gte(from)), changed)
            .await
        {
            Some(planned) => planned.more_from.unwrap_or_else(|| {
                windows.started - chrono::Duration::from_std(PLAN_OVERLAP).unwrap_or_default()
            }),
            None => from,
        }
    }

    async fn plan(
        &self,
        target: &DeliveryTarget,
        owed: Condition,
        changed: lead::Column,
    ) -> Option<Planned> {
        match self.store.plan_deliveries(target, owed, changed).await {
            Ok(planned) => Some(planned),
            Err(error) => {
                tracing::warn!(channel = self.destination.id(), %error, "planning deliveries");
                None
            }
        }
    }
}

/// Which leads a target is owed: every stored valid lead for a notify
/// channel; the leads whose contract is accepted for `lead.accepted`; the
/// leads in the event's state for the other events.
fn owed_by(target: &DeliveryTarget) -> Condition {
    let owed = match target.event.as_deref() {
        None => lead::Column::State.ne(LeadState::Invalid.as_str()),
        Some(ACCEPTED) => lead::Column::AcceptedAt.is_not_null(),
        Some(event) => lead::Column::State.eq(event.strip_prefix("lead.").unwrap_or(event)),
    };
    Condition::all().add(owed)
}

/// When a lead last changed in a way that may have made it owed to
/// `target`: its acceptance for `lead.accepted`, else its last change
/// (its storing included).
fn changed_at(target: &DeliveryTarget) -> lead::Column {
    match target.event.as_deref() {
        Some(ACCEPTED) => lead::Column::AcceptedAt,
        _ => lead::Column::UpdatedAt,
    }
}

//! The `Courier` actor: its message, its state, its rounds (planned and
//! claimed by `round`) and the tries it sends (`delivery`), and the
//! health it publishes.

use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};
use tracing::Instrument;

use super::delivery::{OneDelivery, GIVE_UP_AFTER, LEASE_MARGIN};
use super::round::{Done, Round, Windows};
use super::shared::{ChannelHealth, CourierEnvironment};
use crate::actors::supervision::guarded;
use crate::domain::ConfigSnapshot;
use crate::notify::{Destination, Transport};
use crate::store::{DeliveryTarget, HeldDelivery};
use crate::telemetry;

/// How often a courier plans and claims on its own.
const TICK: Duration = Duration::from_secs(1);
/// Every this many ticks, a plan looks back `WIDE_PLAN` (commits that took
/// longer than the overlap); at start, a whole day.
const FULL_PLAN_EVERY: u64 = 60;
const WIDE_PLAN: Duration = Duration::from_secs(600);

/// Deliver these stored leads as soon as a slot is free.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Deliver {
    pub lead_ids: Vec<String>,
}

pub struct Courier {
    destination: Destination,
    /// The configuration its tries' attempt rows name (made once).
    snapshot: ConfigSnapshot,
    targets: Vec<DeliveryTarget>,
    environment: CourierEnvironment,
    transport: Option<Rc<Transport>>,
    /// Leads handed over and not yet planned and claimed.
    handed: BTreeSet<String>,
    in_flight: usize,
    /// A plan-and-claim round is running.
    pumping: bool,
    /// Per target (in `targets`' order), where its next plan starts: leads
    /// changed since may be owed and not planned yet. Empty before the
    /// first plan.
    plan_from: Vec<DateTime<Utc>>,
    ticks: u64,
}

impl Courier {
    pub(super) fn new(destination: Destination, environment: CourierEnvironment) -> Self {
        Self {
            targets: destination.targets(),
            snapshot: destination.snapshot(),
            destination,
            environment,
            transport: None,
            handed: BTreeSet::new(),
            in_flight: 0,
            pumping: false,
            plan_from: Vec::new(),
            ticks: 0,
        }
    }

    fn free_slots(&self) -> usize {
        self.destination
            .max_concurrency()
            .saturating_sub(self.in_flight)
    }

    /// One round: plan what is owed, claim due rows for the free slots,
    /// send each. `look_back`: plan recent leads too (a tick), not only
    /// the ones handed over.
    fn pump(&mut self, look_back: bool, ctx: &mut Context<Self>) {
        if self.transport.is_none() {
            // Nothing can be sent; the rows wait in the database.
            self.handed.clear();
            return;
        }
        if self.pumping {
            return;
        }
        let handed: Vec<String> = std::mem::take(&mut self.handed).into_iter().collect();
        let windows = look_back.then(|| self.plan_windows());
        if handed.is_empty() && windows.is_none() && self.free_slots() == 0 {
            return;
        }
        self.pumping = true;
        let round = Round {
            store: self.environment.store.clone(),
            targets: self.targets.clone(),
            free: self.free_slots(),
            lease: self.destination.timeout() + LEASE_MARGIN,
            sweep_interrupted: self.ticks % FULL_PLAN_EVERY == 1,
            destination: self.destination.clone(),
        };
        let future = round.run(handed, windows);
        ctx.spawn(
            guarded::<Self, _>("courier", future).map(|done, courier, ctx| {
                courier.pumping = false;
                let Done { claimed, plan_from } = done.unwrap_or_default();
                if let Some(plan_from) = plan_from {
                    courier.plan_from = plan_from;
                }
                for (target, held) in claimed {
                    courier.send(target, held, ctx);
                }
                // Leads handed over while this round ran.
                if !courier.handed.is_empty() {
                    courier.pump(false, ctx);
                }
            }),
        );
    }

    /// Where this tick's plan of each target starts.
    fn plan_windows(&mut self) -> Windows {
        let now = Utc::now();
        self.ticks += 1;
        let back = |window: Duration| now - chrono::Duration::from_std(window).unwrap_or_default();
        let from = if self.plan_from.is_empty() {
            // At start: the whole day (what a crash may have left).
            vec![back(GIVE_UP_AFTER); self.targets.len()]
        } else if self.ticks.is_multiple_of(FULL_PLAN_EVERY) {
            let wide = back(WIDE_PLAN);
            self.plan_from.iter().map(|&from| from.min(wide)).collect()
        } else {
            self.plan_from.clone()
        };
        Windows { from, started: now }
    }

    fn send(&mut self, target: DeliveryTarget, held: HeldDelivery, ctx: &mut Context<Self>) {
        let Some(transport) = self.transport.clone() else {
            return;
        };
        self.in_flight += 1;
        self.publish(|health| health.in_flight += 1);
        let lead = telemetry::lead_span(&held.lead.id, &held.lead.source_id);
        let span = telemetry::attempt_span(&lead, &target.channel, target.kind.as_str());
        let delivery = OneDelivery {
            environment: self.environment.clone(),
            destination: self.destination.clone(),
            snapshot: self.snapshot.clone(),
            target,
            held,
        };
        let delivery = delivery.run(transport).instrument(span);
        ctx.spawn(
            guarded::<Self, _>("courier", delivery).map(|confirmed, courier, ctx| {
                courier.in_flight = courier.in_flight.saturating_sub(1);
                let now = Utc::now();
                courier.publish(|health| {
                    health.in_flight = health.in_flight.saturating_sub(1);
                    match confirmed {
                        Some(true) => {
                            health.consecutive_failures = 0;
                            health.last_confirmed_at = Some(now);
                        }
                        _ => {
                            health.consecutive_failures += 1;
                            health.last_failed_at = Some(now);
                        }
                    }
                });
                // A slot is free: more may be due.
                courier.pump(false, ctx);
            }),
        );
    }

    fn publish(&self, change: impl FnOnce(&mut ChannelHealth)) {
        let mut entry = self
            .environment
            .board
            .entry(self.destination.id().to_string())
            .or_insert_with(|| initial_health(&self.destination));
        change(&mut entry);
    }

    fn refresh_backlog(&self, ctx: &mut Context<Self>) {
        let store = self.environment.store.clone();
        let targets = self.targets.clone();
        let future = async move {
            let mut total = crate::store::DeliveryBacklog::default();
            for target in &targets {
                let backlog = store.delivery_backlog(target).await.ok()?;
                total.pending += backlog.pending;
                total.abandoned += backlog.abandoned;
            }
            Some(total)
        };
        ctx.spawn(future.into_actor(self).map(|total, courier, _| {
            if let Some(total) = total {
                courier.publish(|health| {
                    health.pending = total.pending;
                    health.abandoned = total.abandoned;
                });
            }
        }));
    }
}

fn initial_health(destination: &Destination) -> ChannelHealth {
    let (kind, role, required) = match destination {
        Destination::Channel(channel) => (
            channel.kind.as_str().to_string(),
            Some(channel.role.as_str().to_string()),
            channel.required,
        ),
        Destination::Sink(_) => ("events".to_string(), None, false),
    };
    ChannelHealth {
        id: destination.id().to_string(),
        kind,
        role,
        required,
        ..ChannelHealth::default()
    }
}

impl Actor for Courier {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        match Transport::for_destination(&self.destination) {
            Ok(transport) => self.transport = Some(Rc::new(transport)),
            Err(error) => {
                tracing::error!(channel = self.destination.id(), %error, "delivery channel cannot start")
            }
        }
        self.publish(|_| {});
        ctx.run_interval(TICK, |courier, ctx| {
            courier.pump(true, ctx);
            if courier.ticks.is_multiple_of(5) {
                courier.refresh_backlog(ctx);
            }
        });
    }
}

impl Supervised for Courier {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.environment.restarts.restarted("courier");
        // Tries in flight were dropped; their rows' leases run out and
        // they are tried again.
        self.in_flight = 0;
        self.pumping = false;
        self.publish(|health| health.in_flight = 0);
    }
}

impl Handler<Deliver> for Courier {
    type Result = ();

    fn handle(&mut self, message: Deliver, ctx: &mut Context<Self>) {
        self.handed.extend(message.lead_ids);
        self.pump(false, ctx);
    }
}

//! `Courier`: one supervised actor per notify channel and per event sink,
//! owning its transport (HTTP client or SMTP pool), timeout and concurrency,
//! independent of routing (a lead is sold while its manager is down).
//!
//! Intake hands it every stored lead at once (`Deliver`); every second it
//! also plans what leads changed since its last plan are owed (so a crash
//! between the lead's commit and that message loses nothing, and events
//! follow state changes), then claims due rows with free slots and sends
//! them. Each target's plan pages on in order of change from where the last
//! one stopped, a page per tick: however many leads a drained spool stores
//! at once, and however long ago they arrived, none is skipped. The
//! database decides what may be sent (`store::deliveries`): a confirmed row
//! is never sent again, by any instance. A failed try is retried with
//! backoff for a day, then abandoned with an alert, for an operator.

use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use chrono::{DateTime, Utc};
use dashmap::DashMap;
use entity::lead;
use sea_orm::{ColumnTrait, Condition};
use tokio::sync::Notify;
use tracing::Instrument;

use super::supervision::{guarded, RestartLog};
use crate::alerts::{AlertKind, Alerts};
use crate::config::SharedSettings;
use crate::domain::{CallOutcome, ConfigSnapshot, LeadState};
use crate::notify::{self, Destination, SaleFacts, Transport};
use crate::store::{
    AfterFailure, DeliveryAnswer, DeliveryTarget, HeldDelivery, Planned, Store, PLAN_PAGE,
};
use crate::telemetry;

/// The event sent once a lead's contract is accepted.
const ACCEPTED: &str = "lead.accepted";
/// How often a courier plans and claims on its own.
const TICK: Duration = Duration::from_secs(1);
/// A tick plans the leads changed since the last complete plan, with this
/// overlap (clock skew between instances, commits that took long).
const PLAN_OVERLAP: Duration = Duration::from_secs(10);
/// Every this many ticks, a plan looks back `WIDE_PLAN` (commits that took
/// longer than the overlap); at start, a whole day.
const FULL_PLAN_EVERY: u64 = 60;
const WIDE_PLAN: Duration = Duration::from_secs(600);
/// Deliveries are tried for this long after the row was made.
const GIVE_UP_AFTER: Duration = Duration::from_secs(24 * 3600);
/// A backoff never grows past this.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);
/// A claim outlives its try's timeout by this much. A try whose claim is
/// older than half of it when the attempt row is written is not sent (its
/// lease could run out mid-call), and a confirmation's write is retried
/// within it.
const LEASE_MARGIN: Duration = Duration::from_secs(15);

/// Wakes intake waiting (`intake.accept_wait`) for a lead's required
/// channel to confirm.
#[derive(Clone, Default)]
pub struct Confirmations(Arc<DashMap<String, Arc<Notify>>>);

impl Confirmations {
    /// Notified when a required channel of this instance confirms
    /// `lead_id` from now on; forgotten when dropped.
    pub fn watch(&self, lead_id: &str) -> Watch {
        Watch {
            notify: self.0.entry(lead_id.to_string()).or_default().clone(),
            lead_id: lead_id.to_string(),
            all: self.clone(),
        }
    }

    fn confirmed(&self, lead_id: &str) {
        if let Some(notify) = self.0.get(lead_id) {
            notify.notify_waiters();
            notify.notify_one();
        }
    }
}

/// One request waiting for a lead's confirmation.
pub struct Watch {
    notify: Arc<Notify>,
    lead_id: String,
    all: Confirmations,
}

impl Watch {
    pub async fn confirmed(&self) {
        self.notify.notified().await
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // The map's handle and ours: nobody else waits for this lead.
        self.all
            .0
            .remove_if(&self.lead_id, |_, notify| Arc::strong_count(notify) <= 2);
    }
}

/// A channel's health as the status page shows it.
#[derive(Debug, Clone, Default, serde::Serialize, utoipa::ToSchema)]
pub struct ChannelHealth {
    pub id: String,
    /// `webhook`, `slack`, `telegram`, `email`, or `events` for a sink.
    pub kind: String,
    pub role: Option<String>,
    pub required: bool,
    /// Tries that failed since the last confirmation.
    pub consecutive_failures: u32,
    pub in_flight: usize,
    pub last_confirmed_at: Option<DateTime<Utc>>,
    pub last_failed_at: Option<DateTime<Utc>>,
    /// Deliveries waiting for a (next) try, and given up ones.
    pub pending: u64,
    pub abandoned: u64,
}

/// Every courier's health, by destination id.
pub type DeliveryBoard = Arc<DashMap<String, ChannelHealth>>;

/// The couriers, for intake and the status views.
#[derive(Clone, Default)]
pub struct Couriers {
    pub channels: Vec<Addr<Courier>>,
    pub sinks: Vec<Addr<Courier>>,
    pub confirmations: Confirmations,
    pub board: DeliveryBoard,
}

impl Couriers {
    /// Starts one courier per notify channel and event sink.
    pub fn start(shared: &SharedSettings, environment: CourierEnvironment) -> Self {
        let settings = shared.current();
        let channels: Vec<Destination> = settings
            .notify
            .iter()
            .cloned()
            .map(|channel| Destination::Channel(Arc::new(channel)))
            .collect();
        let sinks: Vec<Destination> = settings
            .events
            .iter()
            .cloned()
            .map(|sink| Destination::Sink(Arc::new(sink)))
            .collect();
        let start = |destination: Destination| {
            let environment = environment.clone();
            Supervisor::start(move |_| Courier::new(destination, environment))
        };
        Self {
            channels: channels.into_iter().map(start).collect(),
            sinks: sinks.into_iter().map(start).collect(),
            confirmations: environment.confirmations.clone(),
            board: environment.board.clone(),
        }
    }

    /// Every channel's and sink's health, in configuration order.
    pub fn health(&self, settings: &crate::config::Settings) -> Vec<ChannelHealth> {
        let ids = settings
            .notify
            .iter()
            .map(|channel| channel.id.as_str())
            .chain(settings.events.iter().map(|sink| sink.id.as_str()));
        ids.filter_map(|id| self.board.get(id).map(|health| health.clone()))
            .collect()
    }

    /// Hands stored leads to every notify channel now.
    pub fn deliver(&self, lead_ids: &[String]) {
        if lead_ids.is_empty() {
            return;
        }
        for channel in &self.channels {
            channel.do_send(Deliver {
                lead_ids: lead_ids.to_vec(),
            });
        }
    }
}

/// What couriers share.
#[derive(Clone)]
pub struct CourierEnvironment {
    pub store: Store,
    pub instance_id: Arc<str>,
    pub alerts: Alerts,
    pub restarts: RestartLog,
    pub confirmations: Confirmations,
    pub board: DeliveryBoard,
}

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
    fn new(destination: Destination, environment: CourierEnvironment) -> Self {
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

/// Where a tick plans each target from (in `targets`' order), and when
/// it started.
struct Windows {
    from: Vec<DateTime<Utc>>,
    started: DateTime<Utc>,
}

/// What a round claimed, and where each target's next plan starts (if it
/// planned them).
#[derive(Default)]
struct Done {
    claimed: Vec<(DeliveryTarget, HeldDelivery)>,
    plan_from: Option<Vec<DateTime<Utc>>>,
}

/// The database side of one round, on its own so it can run as a future.
struct Round {
    store: Store,
    destination: Destination,
    targets: Vec<DeliveryTarget>,
    free: usize,
    lease: Duration,
    sweep_interrupted: bool,
}

impl Round {
    async fn run(self, handed: Vec<String>, windows: Option<Windows>) -> Done {
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

/// One try of one delivery, from its attempt row to its answer's commit.
/// Yields whether it was confirmed.
struct OneDelivery {
    environment: CourierEnvironment,
    destination: Destination,
    snapshot: ConfigSnapshot,
    target: DeliveryTarget,
    held: HeldDelivery,
}

impl OneDelivery {
    async fn run(self, transport: Rc<Transport>) -> bool {
        let store = &self.environment.store;
        let lead = &self.held.lead;
        let channel = self.destination.id();
        let sale = if self.target.event.as_deref() == Some("lead.sold") {
            sale_facts(store, &lead.id).await
        } else {
            SaleFacts::default()
        };
        let prepared =
            notify::prepare(&self.destination, lead, self.target.event.as_deref(), &sale);
        let shown = match &prepared {
            Ok(prepared) => prepared.shown.clone(),
            Err(error) => serde_json::json!({ "error": error }),
        };
        let attempt_id = match store
            .begin_delivery_attempt(
                &self.target,
                &lead.id,
                shown,
                self.snapshot.clone(),
                &self.environment.instance_id,
            )
            .await
        {
            Ok(id) => {
                telemetry::record_attempt_id(&id);
                id
            }
            Err(error) => {
                // Not sent: the row's lease runs out and it is tried again.
                tracing::warn!(lead_id = %lead.id, channel, %error, "delivery not recorded, so not sent");
                return false;
            }
        };
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                tracing::error!(lead_id = %lead.id, channel, %error, "delivery cannot be built");
                return self.failed(&attempt_id, not_sent(error)).await;
            }
        };
        if self.held.claimed_at.elapsed() > LEASE_MARGIN / 2 {
            // Its lease could run out mid-call and another instance send it.
            let late = "the claim was too old to send under; tried again".to_string();
            return self.failed(&attempt_id, not_sent(late)).await;
        }
        let answer = transport.send(prepared, self.destination.timeout()).await;
        // The lead, channel, kind and outcome are the span's.
        telemetry::record_answer(answer.outcome, answer.duration);
        tracing::info!(
            event = %self.target.event.as_deref().unwrap_or_default(),
            status = answer.http_status,
            "delivery tried"
        );
        if answer.outcome == CallOutcome::Accepted {
            self.confirmed(&attempt_id, &answer).await;
            true
        } else {
            self.failed(&attempt_id, answer).await
        }
    }

    /// Records the confirmation, retrying the write while the lease lasts
    /// (after it, the row may be sent again: at least once, never lost).
    async fn confirmed(&self, attempt_id: &str, answer: &DeliveryAnswer) {
        let store = &self.environment.store;
        let lead_id = self.held.lead.id.as_str();
        let effect = self.destination.confirm_effect();
        loop {
            match store
                .confirm_delivery(&self.target, lead_id, attempt_id, answer, effect)
                .await
            {
                Ok(()) => {
                    if effect.accepts {
                        self.environment.confirmations.confirmed(lead_id);
                    }
                    return;
                }
                Err(error)
                    if self.held.claimed_at.elapsed()
                        < self.destination.timeout() + LEASE_MARGIN =>
                {
                    tracing::warn!(lead_id, channel = self.destination.id(), %error, "confirmation not recorded yet; retrying");
                    actix_web::rt::time::sleep(Duration::from_millis(500)).await;
                }
                Err(error) => {
                    let message = format!(
                        "{} {} confirmed lead {lead_id} but the confirmation could not be recorded ({error}); it may be sent again",
                        self.target.kind.as_str(),
                        self.target.key()
                    );
                    self.environment
                        .alerts
                        .raise(
                            AlertKind::DeliveryFailed,
                            Some(self.destination.id()),
                            Some(lead_id),
                            &message,
                        )
                        .await;
                    return;
                }
            }
        }
    }

    /// Records a failed try: retried after a backoff, or given up (with an
    /// alert) a day after the row was made. Yields `false` (not confirmed).
    async fn failed(&self, attempt_id: &str, answer: DeliveryAnswer) -> bool {
        let lead_id = self.held.lead.id.as_str();
        let channel = self.destination.id();
        let gave_up = Utc::now() - self.held.created_at
            >= chrono::Duration::from_std(GIVE_UP_AFTER).unwrap_or_default();
        let after = if gave_up {
            AfterFailure::Abandon
        } else {
            AfterFailure::RetryAt(
                Utc::now() + backoff(self.destination.retry_backoff(), self.held.tries),
            )
        };
        if let Err(error) = self
            .environment
            .store
            .delivery_failed(&self.target, &self.held, attempt_id, &answer, after)
            .await
        {
            tracing::warn!(lead_id, channel, %error, "failed delivery not recorded");
        }
        if gave_up {
            let message = format!(
                "{} {} of lead {lead_id} given up after a day of tries: {}",
                self.target.kind.as_str(),
                self.target.key(),
                answer.error.as_deref().unwrap_or("no confirmation")
            );
            self.environment
                .alerts
                .raise(
                    AlertKind::DeliveryFailed,
                    Some(channel),
                    Some(lead_id),
                    &message,
                )
                .await;
        }
        false
    }
}

/// A try that was not sent, as its attempt row records it.
fn not_sent(error: String) -> DeliveryAnswer {
    DeliveryAnswer {
        outcome: CallOutcome::Error,
        http_status: None,
        duration: Duration::ZERO,
        response_body: None,
        error: Some(error),
    }
}

/// `first` doubled for each try after the first, at most an hour.
fn backoff(first: Duration, tries: i32) -> chrono::Duration {
    let doublings = u32::try_from(tries.saturating_sub(1)).unwrap_or(0).min(20);
    let wait = first.saturating_mul(2u32.saturating_pow(doublings));
    chrono::Duration::from_std(std::cmp::min(wait, MAX_BACKOFF)).unwrap_or_default()
}

async fn sale_facts(store: &Store, lead_id: &str) -> SaleFacts {
    match store.sales_of(&[lead_id.to_string()]).await {
        Ok(sales) => sales
            .get(lead_id)
            .map(|sale| SaleFacts {
                buyer_id: Some(sale.buyer_id.clone()),
                price: sale.price,
            })
            .unwrap_or_default(),
        Err(_) => SaleFacts::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_an_hour() {
        let first = Duration::from_secs(30);
        assert_eq!(backoff(first, 1).num_seconds(), 30);
        assert_eq!(backoff(first, 3).num_seconds(), 120);
        assert_eq!(backoff(first, 40).num_seconds(), 3600);
    }
}

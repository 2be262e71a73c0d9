//! `Buyer`: one per configured buyer; every call to that buyer goes through
//! it. It owns the buyer's awc client, its concurrency slots (wait at most
//! `queue_timeout` for one, else `busy`), its circuit breaker, and the
//! separate ping and post timeouts; the call itself, recorded as history,
//! is `buyer::recorded_call`.
//!
//! Started by the `Router` (under `actix::Supervisor`), which receives its
//! `ReofferLeads` requests. Handles `OfferLead` (one ping or post),
//! `ForceCircuit`, `Reconfigure`, and `SlotTaken` (a call's slot, shown
//! in the status). Calls run concurrently
//! (the mailbox keeps draining while requests are out). Nothing durable
//! lives here: after a restart, slots, probes and counters start again,
//! and the attempts already written stay in the database for recovery.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use chrono::{DateTime, Utc};
use tracing::Instrument;

use super::supervision::{guarded, RestartLog};
use crate::alerts::{AlertKind, Alerts};
use crate::buyer::accept::AcceptCheck;
use crate::buyer::board::{Board, BuyerStatus};
use crate::buyer::breaker::{Admission, Breaker, CircuitState};
use crate::buyer::latency::Latencies;
use crate::buyer::recorded_call::{make_call, CallPlan, CallSlot, Offered};
use crate::buyer::request::{self, LeadOffer, PingResult};
use crate::buyer::slots::Slots;
use crate::config::{BuyerSettings, PayoutRule};
use crate::domain::{AttemptKind, CallKind, CallOutcome, ClaimToken, LeadId, SkipReason};
use crate::metrics::Metrics;
use crate::store::{CapSlot, NewAttempt, Store, Unwritten, Written};
use crate::telemetry;

/// Idle connections are dropped before common server keep-alives (5 s)
/// would close them under us: a post on a dead pooled connection would
/// otherwise look like "sent, no answer".
const CONNECTION_KEEP_ALIVE: Duration = Duration::from_secs(4);
/// A half-open probe that has not reported this long after its timeout
/// (its call was lost) is counted as failed. Generous: the call also waits
/// for its attempt row's commits, which a slow database stretches.
const PROBE_GRACE: Duration = Duration::from_secs(30);

/// Offer a lead to this buyer: one ping or one post.
#[derive(Message)]
#[rtype(result = "Offered")]
pub struct OfferLead {
    pub lead: Arc<LeadOffer>,
    pub kind: CallKind,
    /// From the accepted ping, for a post.
    pub ping: PingResult,
    pub instance_id: Arc<str>,
    /// The claim the lead is held under; the call is made only while it holds.
    pub claim_token: ClaimToken,
    /// What the lead's source is paid if this call sells it.
    pub payout: PayoutRule,
    /// An operator's retry: the attempt replayed, with the settings its
    /// snapshot froze (used instead of the buyer's current ones).
    pub retry: Option<Retry>,
    /// The walk's previous ping's answer, written in this offer's row's
    /// commit (its call's, or its skip's).
    pub answered: Option<Unwritten>,
    /// A ping's answer is handed back unwritten (`CallReport::unwritten`),
    /// for the walk's next row.
    pub hold_answer: bool,
    /// The lead's span (the walk's, a retry's): the attempt's is its child.
    pub span: tracing::Span,
}

#[derive(Clone)]
pub struct Retry {
    pub of: String,
    pub settings: Arc<BuyerSettings>,
}

/// An operator's circuit override.
#[derive(Message)]
#[rtype(result = "BuyerStatus")]
pub struct ForceCircuit {
    pub state: CircuitState,
}

/// Sent to the router: offer this buyer again the unsold leads it failed
/// or was skipped for (circuit, load) before `failed_before`, all of them
/// or at most `limit` (probes).
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct ReofferLeads {
    pub buyer_id: String,
    pub failed_before: DateTime<Utc>,
    pub limit: Option<u64>,
}

/// A reload changed this buyer: new attempts use `settings`. The breaker
/// keeps its state unless the circuit settings changed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reconfigure {
    pub settings: Arc<BuyerSettings>,
}

/// A call took its slot: the status counts it.
#[derive(Message)]
#[rtype(result = "()")]
struct SlotTaken;

pub struct Buyer {
    settings: Arc<BuyerSettings>,
    /// The same settings, shared with the calls: a post reserves the caps
    /// they hold when its row is written, after a reload that came while
    /// it waited for its slot (and the reconcile that followed it).
    current_settings: Rc<RefCell<Arc<BuyerSettings>>>,
    pii_fields: Arc<Vec<String>>,
    ping_check: AcceptCheck,
    post_check: AcceptCheck,
    /// Created in `started` (awc clients are not `Send`); one per buyer.
    client: Option<awc::Client>,
    breaker: Breaker,
    circuit_changed_at: DateTime<Utc>,
    slots: Slots,
    /// Half-open probes not yet reported (each also has a deadline).
    open_probes: HashSet<u64>,
    next_probe: u64,
    /// Whether the buyer answered since the actor started: its first
    /// answer offers its failed leads again (an outage may have outlived a
    /// crash). After that, a circuit closing does.
    answered_since_start: bool,
    latencies: Latencies,
    store: Store,
    board: Board,
    router: Recipient<ReofferLeads>,
    restarts: RestartLog,
    alerts: Alerts,
    metrics: Metrics,
    /// Fault injection: calls and half-open probes still to panic.
    panics_left: InjectedPanics,
}

/// Fault injection for supervision tests (`[faults]`): how many calls
/// (`buyer_panics`) and half-open probes (`probe_panics`) panic after their
/// attempt row is written. Zero in production.
#[derive(Debug, Clone, Copy, Default)]
pub struct InjectedPanics {
    pub calls: u32,
    pub probes: u32,
}

impl InjectedPanics {
    /// Whether this call panics; counts it down.
    fn take(&mut self, probe: bool) -> bool {
        if self.calls > 0 {
            self.calls -= 1;
            return true;
        }
        if probe && self.probes > 0 {
            self.probes -= 1;
            return true;
        }
        false
    }
}

/// What a buyer actor is given besides its own settings.
#[derive(Clone)]
pub struct BuyerEnvironment {
    pub pii_fields: Arc<Vec<String>>,
    pub store: Store,
    pub board: Board,
    pub router: Recipient<ReofferLeads>,
    pub restarts: RestartLog,
    pub alerts: Alerts,
    pub metrics: Metrics,
}

impl Buyer {
    pub fn new(
        settings: Arc<BuyerSettings>,
        environment: BuyerEnvironment,
        panics: InjectedPanics,
    ) -> Self {
        let BuyerEnvironment {
            pii_fields,
            store,
            board,
            router,
            restarts,
            alerts,
            metrics,
        } = environment;
        Self {
            ping_check: accept_check(&settings, CallKind::Ping),
            post_check: accept_check(&settings, CallKind::Post),
            breaker: Breaker::new(settings.circuit.clone()),
            current_settings: Rc::new(RefCell::new(settings.clone())),
            settings,
            pii_fields,
            client: None,
            circuit_changed_at: Utc::now(),
            slots: Slots::default(),
            open_probes: HashSet::new(),
            next_probe: 0,
            answered_since_start: false,
            latencies: Latencies::default(),
            store,
            board,
            router,
            restarts,
            alerts,
            metrics,
            panics_left: panics,
        }
    }

    fn publish(&self) {
        self.board.publish(self.status());
    }

    fn status(&self) -> BuyerStatus {
        BuyerStatus {
            id: self.settings.id.clone(),
            name: self.settings.display_name().to_string(),
            enabled: self.settings.enabled,
            circuit: self.breaker.state(),
            circuit_changed_at: self.circuit_changed_at,
            consecutive_failures: self.breaker.consecutive_failures(),
            in_flight: self.slots.in_flight(),
            max_concurrency: self.settings.max_concurrency,
            ping_latency: self.latencies.percentiles(CallKind::Ping),
            post_latency: self.latencies.percentiles(CallKind::Post),
        }
    }

    /// The settings this offer is made with: a retry's snapshot, else ours.
    fn settings_for(&self, offer: &OfferLead) -> Arc<BuyerSettings> {
        offer
            .retry
            .as_ref()
            .map_or_else(|| self.settings.clone(), |retry| retry.settings.clone())
    }

    fn attempt(&self, offer: &OfferLead, kind: AttemptKind) -> NewAttempt {
        NewAttempt {
            lead_id: LeadId::from(offer.lead.lead_id.as_str()),
            buyer_id: self.settings.id.clone(),
            kind,
            request: serde_json::Value::Null,
            snapshot: self.settings_for(offer).snapshot.clone(),
            retry_of: offer.retry.as_ref().map(|retry| retry.of.clone()),
            instance_id: offer.instance_id.to_string(),
            claim_token: offer.claim_token.clone(),
            caps: Vec::new(),
            answered: offer.answered.clone(),
        }
    }

    /// The span of this offer's attempt, in its lead's.
    fn attempt_span(&self, offer: &OfferLead, kind: &str) -> tracing::Span {
        telemetry::attempt_span(&offer.span, &self.settings.id, kind)
    }

    fn skip(&self, offer: &OfferLead, reason: SkipReason) -> ResponseActFuture<Self, Offered> {
        self.metrics.attempt(
            &self.settings.id,
            AttemptKind::Skip.as_str(),
            reason.as_str(),
        );
        let store = self.store.clone();
        let attempt = self.attempt(offer, AttemptKind::Skip);
        let span = self.attempt_span(offer, AttemptKind::Skip.as_str());
        Box::pin(
            async move {
                match store.record_skip(attempt, reason).await {
                    Ok(Written::Fenced) => Offered::Fenced,
                    Ok(_) => Offered::Skipped(reason),
                    Err(error) => {
                        tracing::error!(%error, reason = reason.as_str(), "could not record a skip");
                        Offered::Skipped(reason)
                    }
                }
            }
            .instrument(span)
            .into_actor(self),
        )
    }

    /// Everything the call needs, from the offer and our settings.
    fn plan(&self, offer: OfferLead, slot: CallSlot, inject_panic: bool) -> Option<CallPlan> {
        let client = self.client.clone()?;
        let settings = self.settings_for(&offer);
        let request = request::build(
            offer.kind,
            &settings,
            &offer.lead,
            &offer.ping,
            &self.pii_fields,
        );
        let timeout = call_timeout(&settings, offer.kind);
        let check = match (&offer.retry, offer.kind) {
            (Some(_), kind) => accept_check(&settings, kind),
            (None, CallKind::Ping) => self.ping_check.clone(),
            (None, CallKind::Post) => self.post_check.clone(),
        };
        let mut attempt = self.attempt(&offer, AttemptKind::Call(offer.kind));
        attempt.request = request.shown.clone();
        // A retry reserves the caps of the settings it replays.
        let caps_of = match &offer.retry {
            Some(retry) => Rc::new(RefCell::new(retry.settings.clone())),
            None => self.current_settings.clone(),
        };
        Some(CallPlan {
            kind: offer.kind,
            caps_of,
            settings,
            request,
            timeout,
            check,
            attempt,
            ping: offer.ping,
            payout: offer.payout,
            client,
            slot,
            inject_panic,
            hold_answer: offer.hold_answer,
        })
    }

    /// A half-open probe gets a deadline: lost (its call never reports),
    /// it counts as failed, so the circuit cannot stay half-open for good.
    fn watch_probe(&mut self, timeout: Duration, ctx: &mut Context<Self>) -> u64 {
        let probe = self.next_probe;
        self.next_probe += 1;
        self.open_probes.insert(probe);
        ctx.run_later(timeout + PROBE_GRACE, move |buyer, ctx| {
            if buyer.open_probes.remove(&probe) {
                tracing::warn!(buyer_id = %buyer.settings.id, "a half-open probe never reported: counted as failed");
                buyer.record_result(Admission::Probe, CallOutcome::Timeout, ctx);
            }
        });
        probe
    }

    /// Counts the call in the breaker and acts on a change of state.
    fn record_result(
        &mut self,
        admission: Admission,
        outcome: CallOutcome,
        ctx: &mut Context<Self>,
    ) {
        let now = Instant::now();
        let success = !outcome.is_failure();
        if let Some(state) = self.breaker.record(admission, success, now) {
            self.circuit_changed(state, ctx);
        }
        if success && !self.answered_since_start {
            self.answered_since_start = true;
            self.reoffer(None);
        }
        self.publish();
    }

    /// Sets each cap's counter to the slots the database says are held in
    /// its period (a cap just configured, restored, raised or lowered, the
    /// first start). Offers wait meanwhile (`ctx.wait`), so no post is
    /// planned against a counter that forgot the sales made while its cap
    /// was off.
    fn reconcile_caps(&self, ctx: &mut Context<Self>) {
        let slots = CapSlot::for_post(&self.settings, Utc::now());
        if slots.is_empty() {
            return;
        }
        let store = self.store.clone();
        let buyer_id = self.settings.id.clone();
        ctx.wait(actix::fut::wrap_future(async move {
            if let Err(error) = store.reconcile_caps(&slots).await {
                tracing::warn!(%buyer_id, %error, "could not reconcile the cap counters with the sales; they count on from where they were");
            }
        }));
    }

    /// Asks the router to offer this buyer its failed leads again: queued
    /// however full the router's mailbox (nothing asks again once the
    /// buyer has answered), and kept by the router until it is done.
    fn reoffer(&self, limit: Option<u64>) {
        self.router.do_send(ReofferLeads {
            buyer_id: self.settings.id.clone(),
            failed_before: Utc::now(),
            limit,
        });
    }

    fn circuit_changed(&mut self, state: CircuitState, ctx: &mut Context<Self>) {
        self.metrics.circuit_changed(&self.settings.id, state);
        self.circuit_changed_at = Utc::now();
        self.publish();
        let buyer_id = self.settings.id.clone();
        let failures = self.breaker.consecutive_failures();
        let alert = match state {
            CircuitState::Open => {
                if let Some(until) = self.breaker.open_until() {
                    ctx.run_later(
                        until.saturating_duration_since(Instant::now()),
                        |buyer, ctx| {
                            if let Some(state) = buyer.breaker.tick(Instant::now()) {
                                buyer.circuit_changed(state, ctx);
                            }
                        },
                    );
                }
                Some((
                    AlertKind::CircuitOpened,
                    format!(
                        "circuit of buyer {buyer_id} opened after {failures} consecutive failures"
                    ),
                ))
            }
            CircuitState::Closed => {
                // Closed (by a probe or an operator): the buyer is back.
                self.reoffer(None);
                Some((
                    AlertKind::CircuitClosed,
                    format!("circuit of buyer {buyer_id} closed"),
                ))
            }
            CircuitState::HalfOpen => {
                tracing::info!(buyer_id, "circuit half-open: probing");
                // Leads it failed are the probes.
                self.reoffer(Some(u64::from(self.breaker.half_open_probes())));
                None
            }
        };
        if let Some((kind, message)) = alert {
            let alerts = self.alerts.clone();
            actix::spawn(async move { alerts.raise(kind, Some(&buyer_id), None, &message).await });
        }
    }
}

/// Starts a buyer's actor under supervision; `panics` is fault injection.
pub fn start_buyer(
    settings: Arc<BuyerSettings>,
    environment: BuyerEnvironment,
    panics: InjectedPanics,
) -> Addr<Buyer> {
    Supervisor::start(move |_| Buyer::new(settings, environment, panics))
}

/// The buyer's HTTP client: pool limit above its concurrency (awc's timeout
/// covers pool waits), idle connections dropped before the buyer drops them.
fn client_for(settings: &BuyerSettings) -> awc::Client {
    let connections = (settings.max_concurrency as usize) * 2;
    let connector = awc::Connector::new()
        .limit(connections)
        .conn_keep_alive(CONNECTION_KEEP_ALIVE);
    awc::Client::builder()
        .connector(connector)
        .disable_redirects()
        .finish()
}

impl Actor for Buyer {
    type Context = Context<Self>;

    /// Also after a restart: until the buyer is seen answering, one of the
    /// leads it failed is offered again now and every `circuit.open_for`,
    /// so an outage that outlived a crash still ends in its leads being
    /// sold, even with no new lead arriving.
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(1024);
        self.client = Some(client_for(&self.settings));
        self.publish();
        self.reconcile_caps(ctx);
        self.reoffer(Some(1));
        ctx.run_interval(self.settings.circuit.open_for, |buyer, _ctx| {
            if !buyer.answered_since_start && buyer.breaker.state() != CircuitState::Open {
                buyer.reoffer(Some(1));
            }
        });
    }
}

impl Supervised for Buyer {
    /// The calls in flight were dropped: their slots and probes with them.
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.restarts
            .restarted(&format!("buyer {}", self.settings.id));
        self.slots.reset();
        self.breaker.reset_probes();
        self.open_probes.clear();
        self.answered_since_start = false;
        self.publish();
    }
}

impl Handler<OfferLead> for Buyer {
    type Result = ResponseActFuture<Self, Offered>;

    /// Skips when the circuit is open; otherwise makes the recorded call
    /// (which takes a slot, a ping's once its row is written, a post's
    /// before it, or becomes a `busy` skip).
    fn handle(&mut self, offer: OfferLead, ctx: &mut Context<Self>) -> Self::Result {
        if let Some(state) = self.breaker.tick(Instant::now()) {
            self.circuit_changed(state, ctx);
        }
        if self.breaker.state() == CircuitState::Open {
            return self.skip(&offer, SkipReason::CircuitOpen);
        }
        let admission = self.breaker.admit(Instant::now());
        if admission == Admission::Refused {
            return self.skip(&offer, SkipReason::CircuitOpen);
        }
        let kind = offer.kind;
        let probe = (admission == Admission::Probe)
            .then(|| self.watch_probe(call_timeout(&self.settings_for(&offer), kind), ctx));
        let inject_panic = self.panics_left.take(admission == Admission::Probe);
        let address = ctx.address();
        let slot = CallSlot {
            slots: self.slots.clone(),
            limit: self.settings.max_concurrency,
            patience: self.settings.queue_timeout,
            taken: Box::new(move || address.do_send(SlotTaken)),
        };
        let span = self.attempt_span(&offer, kind.as_str());
        let Some(plan) = self.plan(offer, slot, inject_panic) else {
            self.breaker.cancel(admission);
            return Box::pin(actix::fut::ready(Offered::NotRecorded));
        };
        let call = make_call(self.store.clone(), self.metrics.clone(), plan).instrument(span);
        Box::pin(
            guarded::<Buyer, _>("buyer", call).map(move |offered, buyer, ctx| {
                let Some(offered) = offered else {
                    // Stopping: `restarting` resets slots and probes.
                    return Offered::Crashed;
                };
                // A probe past its deadline was counted already.
                let counted = probe.is_some_and(|probe| !buyer.open_probes.remove(&probe));
                match &offered {
                    Offered::Called(call) | Offered::Sold(call) | Offered::Unrecorded(call) => {
                        buyer.latencies.record(kind, call.took);
                        if !counted {
                            buyer.record_result(admission, call.outcome, ctx);
                        }
                    }
                    _ if !counted => buyer.breaker.cancel(admission),
                    _ => {}
                }
                buyer.publish();
                offered
            }),
        )
    }
}

impl Handler<SlotTaken> for Buyer {
    type Result = ();

    fn handle(&mut self, _: SlotTaken, _: &mut Context<Self>) {
        self.publish();
    }
}

impl Handler<Reconfigure> for Buyer {
    type Result = ();

    fn handle(&mut self, message: Reconfigure, ctx: &mut Context<Self>) {
        let settings = message.settings;
        tracing::info!(buyer_id = %settings.id, "buyer reconfigured");
        self.ping_check = accept_check(&settings, CallKind::Ping);
        self.post_check = accept_check(&settings, CallKind::Post);
        if settings.circuit != self.settings.circuit {
            self.breaker = Breaker::new(settings.circuit.clone());
            self.open_probes.clear();
            self.circuit_changed_at = Utc::now();
        }
        self.client = Some(client_for(&settings));
        *self.current_settings.borrow_mut() = settings.clone();
        self.settings = settings;
        self.publish();
        self.reconcile_caps(ctx);
    }
}

impl Handler<ForceCircuit> for Buyer {
    type Result = MessageResult<ForceCircuit>;

    fn handle(&mut self, message: ForceCircuit, ctx: &mut Context<Self>) -> Self::Result {
        tracing::warn!(buyer_id = %self.settings.id, state = message.state.as_str(), "circuit set by an operator");
        if let Some(state) = self.breaker.force(message.state, Instant::now()) {
            self.circuit_changed(state, ctx);
        }
        MessageResult(self.status())
    }
}

/// The accept rule of a buyer's ping or post, compiled.
fn accept_check(settings: &BuyerSettings, kind: CallKind) -> AcceptCheck {
    AcceptCheck::compile(match kind {
        CallKind::Ping => settings.ping.as_ref().and_then(|ping| ping.accept.as_ref()),
        CallKind::Post => settings.post.accept.as_ref(),
    })
}

/// The separate ping and post timeouts.
fn call_timeout(settings: &BuyerSettings, kind: CallKind) -> Duration {
    match kind {
        CallKind::Ping => settings
            .ping
            .as_ref()
            .map_or(settings.post.timeout, |ping| ping.timeout),
        CallKind::Post => settings.post.timeout,
    }
}

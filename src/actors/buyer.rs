//! `Buyer`: one per configured buyer; every call to that buyer goes through
//! it. It owns the buyer's awc client, its concurrency limit (wait at most
//! `queue_timeout` for a slot, else `busy`), its circuit breaker, and the
//! separate ping and post timeouts.
//!
//! Started by the `Router` (which receives its `CircuitChanged` events).
//! Handles `OfferLead` (one ping or post, written as an attempt row before
//! the request is sent and completed after it) and `ForceCircuit`. Calls run
//! concurrently (the mailbox keeps draining while requests are out). Nothing
//! durable lives here: after a restart, counters start again from zero and
//! the attempts already written stay in the database.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use chrono::{DateTime, Utc};
use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;
use tokio::sync::oneshot;

use super::supervision::{guarded, RestartLog};
use crate::alerts::{AlertKind, Alerts};
use crate::buyer::accept::{number_at, text_at, AcceptCheck};
use crate::buyer::board::{Board, BuyerStatus};
use crate::buyer::breaker::{Admission, Breaker, CircuitState};
use crate::buyer::call::{exchange, Exchange};
use crate::buyer::latency::Latencies;
use crate::buyer::request::{self, LeadOffer, PingResult};
use crate::buyer::{CallKind, CallOutcome, SkipReason};
use crate::config::BuyerSettings;
use crate::metrics::Metrics;
use crate::store::{AttemptEnd, NewAttempt, Store};

/// Idle connections are dropped before common server keep-alives (5 s)
/// would close them under us: a post on a dead pooled connection would
/// otherwise look like "sent, no answer".
const CONNECTION_KEEP_ALIVE: Duration = Duration::from_secs(4);

/// Offer a lead to this buyer: one ping or one post.
#[derive(Message)]
#[rtype(result = "Offered")]
pub struct OfferLead {
    pub lead: Arc<LeadOffer>,
    pub kind: CallKind,
    /// From the accepted ping, for a post.
    pub ping: PingResult,
    pub instance_id: Arc<str>,
    /// An operator's retry: the attempt replayed, with the settings its
    /// snapshot froze (used instead of the buyer's current ones).
    pub retry: Option<Retry>,
}

#[derive(Clone)]
pub struct Retry {
    pub of: String,
    pub settings: Arc<BuyerSettings>,
}

/// What became of an offer.
#[derive(Debug, Clone)]
pub enum Offered {
    Skipped(SkipReason),
    Called(CallReport),
    /// The attempt row could not be written, so nothing was sent.
    NotRecorded,
    /// The buyer actor crashed during the call (it is being restarted);
    /// the attempt row, if written, stays `in_flight` for recovery.
    Crashed,
}

#[derive(Debug, Clone)]
pub struct CallReport {
    pub attempt_id: String,
    pub outcome: CallOutcome,
    pub bid: Option<f64>,
    pub ping_id: Option<String>,
    pub price: Option<f64>,
    pub took: Duration,
}

/// An operator's circuit override.
#[derive(Message)]
#[rtype(result = "BuyerStatus")]
pub struct ForceCircuit {
    pub state: CircuitState,
}

/// Sent to the router when this buyer's circuit changes state.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct CircuitChanged {
    pub buyer_id: String,
    pub state: CircuitState,
    pub half_open_probes: u32,
}

pub struct Buyer {
    settings: Arc<BuyerSettings>,
    pii_fields: Arc<Vec<String>>,
    ping_check: AcceptCheck,
    post_check: AcceptCheck,
    /// Created in `started` (awc clients are not `Send`); one per buyer.
    client: Option<awc::Client>,
    breaker: Breaker,
    circuit_changed_at: DateTime<Utc>,
    in_flight: u32,
    latencies: Latencies,
    /// Offers waiting for a slot, oldest first.
    waiting: VecDeque<oneshot::Sender<()>>,
    store: Store,
    board: Board,
    router: Recipient<CircuitChanged>,
    restarts: RestartLog,
    alerts: Alerts,
    metrics: Metrics,
    /// Fault injection (`faults.buyer_panics`): calls still to panic.
    panics_left: u32,
}

/// What a buyer actor is given besides its own settings.
#[derive(Clone)]
pub struct BuyerEnvironment {
    pub pii_fields: Arc<Vec<String>>,
    pub store: Store,
    pub board: Board,
    pub router: Recipient<CircuitChanged>,
    pub restarts: RestartLog,
    pub alerts: Alerts,
    pub metrics: Metrics,
}

impl Buyer {
    pub fn new(settings: Arc<BuyerSettings>, environment: BuyerEnvironment, panics: u32) -> Self {
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
            settings,
            pii_fields,
            client: None,
            circuit_changed_at: Utc::now(),
            in_flight: 0,
            latencies: Latencies::default(),
            waiting: VecDeque::new(),
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
            in_flight: self.in_flight,
            max_concurrency: self.settings.max_concurrency,
            ping_latency: self.latencies.percentiles(CallKind::Ping),
            post_latency: self.latencies.percentiles(CallKind::Post),
        }
    }

    /// A slot now, or a wait of at most `queue_timeout` for one.
    fn take_slot(&mut self) -> LocalBoxFuture<'static, bool> {
        if self.in_flight < self.settings.max_concurrency {
            self.in_flight += 1;
            self.publish();
            return FutureExt::boxed_local(futures_util::future::ready(true));
        }
        let (handover, slot) = oneshot::channel();
        self.waiting.push_back(handover);
        let patience = self.settings.queue_timeout;
        FutureExt::boxed_local(async move {
            matches!(
                actix_web::rt::time::timeout(patience, slot).await,
                Ok(Ok(()))
            )
        })
    }

    /// Hands the slot to the oldest offer still waiting, or frees it.
    fn release_slot(&mut self) {
        while let Some(next) = self.waiting.pop_front() {
            if next.send(()).is_ok() {
                return;
            }
        }
        self.in_flight = self.in_flight.saturating_sub(1);
        self.publish();
    }

    /// The settings this offer is made with: a retry's snapshot, else ours.
    fn settings_for(&self, offer: &OfferLead) -> Arc<BuyerSettings> {
        offer
            .retry
            .as_ref()
            .map_or_else(|| self.settings.clone(), |retry| retry.settings.clone())
    }

    fn attempt(&self, offer: &OfferLead, kind: &str) -> NewAttempt {
        NewAttempt {
            lead_id: offer.lead.lead_id.clone(),
            buyer_id: self.settings.id.clone(),
            kind: kind.to_string(),
            request: serde_json::Value::Null,
            snapshot: self.settings_for(offer).snapshot.clone(),
            retry_of: offer.retry.as_ref().map(|retry| retry.of.clone()),
            instance_id: offer.instance_id.to_string(),
        }
    }

    fn skip(&self, offer: &OfferLead, reason: SkipReason) -> ResponseActFuture<Self, Offered> {
        self.metrics
            .attempt(&self.settings.id, "skip", reason.as_str());
        let store = self.store.clone();
        let attempt = self.attempt(offer, "skip");
        Box::pin(
            async move {
                if let Err(error) = store.record_skip(attempt, reason.as_str()).await {
                    tracing::error!(%error, "could not record a skip");
                }
                Offered::Skipped(reason)
            }
            .into_actor(self),
        )
    }

    /// Counts the call in the breaker and acts on a change of state.
    fn record_result(
        &mut self,
        admission: Admission,
        outcome: CallOutcome,
        ctx: &mut Context<Self>,
    ) {
        let now = Instant::now();
        if let Some(state) = self.breaker.record(admission, !outcome.is_failure(), now) {
            self.circuit_changed(state, ctx);
        }
        self.publish();
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
            CircuitState::Closed => Some((
                AlertKind::CircuitClosed,
                format!("circuit of buyer {buyer_id} closed"),
            )),
            CircuitState::HalfOpen => {
                tracing::info!(buyer_id, "circuit half-open: probing");
                None
            }
        };
        if let Some((kind, message)) = alert {
            let alerts = self.alerts.clone();
            let buyer = buyer_id.clone();
            actix::spawn(async move { alerts.raise(kind, Some(&buyer), None, &message).await });
        }
        self.router.do_send(CircuitChanged {
            buyer_id,
            state,
            half_open_probes: self.breaker.half_open_probes(),
        });
    }
}

/// Starts a buyer's actor under supervision; `panics` is fault injection.
pub fn start_buyer(
    settings: Arc<BuyerSettings>,
    environment: BuyerEnvironment,
    panics: u32,
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

/// A reload changed this buyer: new attempts use `settings`. The breaker
/// keeps its state unless the circuit settings changed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Reconfigure {
    pub settings: Arc<BuyerSettings>,
}

impl Handler<Reconfigure> for Buyer {
    type Result = ();

    fn handle(&mut self, message: Reconfigure, _ctx: &mut Context<Self>) {
        let settings = message.settings;
        tracing::info!(buyer_id = %settings.id, "buyer reconfigured");
        self.ping_check = accept_check(&settings, CallKind::Ping);
        self.post_check = accept_check(&settings, CallKind::Post);
        if settings.circuit != self.settings.circuit {
            self.breaker = Breaker::new(settings.circuit.clone());
            self.circuit_changed_at = Utc::now();
        }
        self.client = Some(client_for(&settings));
        self.settings = settings;
        self.publish();
    }
}

impl Actor for Buyer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(1024);
        self.client = Some(client_for(&self.settings));
        self.publish();
    }
}

impl Supervised for Buyer {
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.restarts
            .restarted(&format!("buyer {}", self.settings.id));
        self.in_flight = 0;
        self.waiting.clear();
        self.publish();
    }
}

impl Handler<OfferLead> for Buyer {
    type Result = ResponseActFuture<Self, Offered>;

    /// Skips when the circuit is open or no slot frees in time; otherwise
    /// writes the attempt, calls the buyer and completes the attempt.
    fn handle(&mut self, offer: OfferLead, ctx: &mut Context<Self>) -> Self::Result {
        if let Some(state) = self.breaker.tick(Instant::now()) {
            self.circuit_changed(state, ctx);
        }
        if self.breaker.state() == CircuitState::Open {
            return self.skip(&offer, SkipReason::CircuitOpen);
        }
        Box::pin(
            self.take_slot()
                .into_actor(self)
                .then(move |got_slot, buyer, _ctx| {
                    if !got_slot {
                        return buyer.skip(&offer, SkipReason::Busy);
                    }
                    let admission = buyer.breaker.admit(Instant::now());
                    if admission == Admission::Refused {
                        buyer.release_slot();
                        return buyer.skip(&offer, SkipReason::CircuitOpen);
                    }
                    let inject_panic = buyer.panics_left > 0;
                    buyer.panics_left = buyer.panics_left.saturating_sub(1);
                    let kind = offer.kind;
                    let call = buyer.call(offer, inject_panic);
                    Box::pin(
                        guarded::<Buyer, _>("buyer", call).map(move |report, buyer, ctx| {
                            let Some(report) = report else {
                                // Stopping: `restarting` resets slots and counters.
                                return Offered::Crashed;
                            };
                            buyer.release_slot();
                            match &report {
                                Offered::Called(call) => {
                                    buyer.latencies.record(kind, call.took);
                                    buyer.record_result(admission, call.outcome, ctx)
                                }
                                _ => buyer.breaker.cancel(admission),
                            }
                            report
                        }),
                    )
                }),
        )
    }
}

impl Buyer {
    /// The call itself: attempt row first, then the request, then the row's end.
    /// `inject_panic`: fault injection for supervision tests.
    fn call(&self, offer: OfferLead, inject_panic: bool) -> LocalBoxFuture<'static, Offered> {
        let Some(client) = self.client.clone() else {
            return FutureExt::boxed_local(futures_util::future::ready(Offered::NotRecorded));
        };
        let settings = self.settings_for(&offer);
        let request = request::build(
            offer.kind,
            &settings,
            &offer.lead,
            &offer.ping,
            &self.pii_fields,
        );
        let (mut check, timeout) = match offer.kind {
            CallKind::Ping => (
                self.ping_check.clone(),
                settings
                    .ping
                    .as_ref()
                    .map_or(settings.post.timeout, |ping| ping.timeout),
            ),
            CallKind::Post => (self.post_check.clone(), settings.post.timeout),
        };
        if offer.retry.is_some() {
            check = accept_check(&settings, offer.kind);
        }
        let mut attempt = self.attempt(&offer, offer.kind.as_str());
        attempt.request = request.shown.clone();
        let (store, metrics) = (self.store.clone(), self.metrics.clone());
        async move {
            let lead_id = attempt.lead_id.clone();
            let attempt_id = match store.begin_attempt(attempt).await {
                Ok(id) => id,
                Err(error) => {
                    tracing::error!(%error, %lead_id, buyer_id = %settings.id, "attempt not recorded; not calling");
                    return Offered::NotRecorded;
                }
            };
            if inject_panic {
                panic!("injected fault: buyer {} panics during a call", settings.id);
            }
            let span = tracing::info_span!("attempt", %lead_id, buyer_id = %settings.id, kind = offer.kind.as_str(), %attempt_id);
            let outcome = exchange(&client, offer.kind, &request, timeout, &check).await;
            metrics.attempt(&settings.id, offer.kind.as_str(), outcome.outcome.as_str());
            let report = report_of(&settings, offer.kind, attempt_id, &outcome);
            span.in_scope(|| {
                tracing::info!(
                    outcome = outcome.outcome.as_str(),
                    status = outcome.http_status,
                    latency_ms = outcome.duration.as_millis() as u64,
                    detail = outcome.detail.as_deref(),
                    "buyer answered"
                )
            });
            let end = AttemptEnd {
                outcome: outcome.outcome.as_str().into(),
                reason: outcome.detail.clone(),
                http_status: outcome.http_status,
                duration: outcome.duration,
                response_body: outcome.body.clone(),
                bid: report.bid,
                ping_id: report.ping_id.clone(),
            };
            if let Err(error) = store.finish_attempt(&report.attempt_id, end).await {
                tracing::error!(%error, %lead_id, "could not complete the attempt row");
            }
            Offered::Called(report)
        }
        .boxed_local()
    }
}

/// The accept rule of a buyer's ping or post, compiled.
fn accept_check(settings: &BuyerSettings, kind: CallKind) -> AcceptCheck {
    AcceptCheck::compile(match kind {
        CallKind::Ping => settings.ping.as_ref().and_then(|ping| ping.accept.as_ref()),
        CallKind::Post => settings.post.accept.as_ref(),
    })
}

fn report_of(
    settings: &BuyerSettings,
    kind: CallKind,
    attempt_id: String,
    outcome: &Exchange,
) -> CallReport {
    let body = outcome.body.as_deref().unwrap_or_default();
    let accepted = outcome.outcome == CallOutcome::Accepted;
    let (bid, ping_id, price) = match (kind, &settings.ping) {
        (CallKind::Ping, Some(ping)) if accepted => (
            number_at(body, ping.bid_path.as_deref()),
            text_at(body, ping.ping_id_path.as_deref()),
            None,
        ),
        (CallKind::Post, _) if accepted => (
            None,
            None,
            number_at(body, settings.post.price_path.as_deref()),
        ),
        _ => (None, None, None),
    };
    CallReport {
        attempt_id,
        outcome: outcome.outcome,
        bid,
        ping_id,
        price,
        took: outcome.duration,
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

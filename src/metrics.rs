//! Metrics for `GET /metrics` (OpenMetrics text, which Prometheus reads):
//! intake by outcome and its latency histogram, attempts by buyer, kind and
//! outcome, circuit transitions, intake's waiting leads, routing's width
//! (see `actors::yielding`), and, read at scrape time, each buyer's circuit
//! state, leads by state, the spool backlog and the addresses the rate
//! limiter holds. Labels carry ids and
//! outcomes only, never personal data.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::buyer::breaker::CircuitState;
use crate::rate_limit::MAX_ADDRESSES;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    buyer: String,
    kind: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuyerLabel {
    buyer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    buyer: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

/// The service's metrics; cheap to clone, usable from any thread.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    intake: Family<OutcomeLabel, Counter>,
    intake_seconds: Histogram,
    attempts: Family<AttemptLabels, Counter>,
    circuit_transitions: Family<TransitionLabels, Counter>,
    circuit_state: Family<BuyerLabel, Gauge>,
    leads: Family<StateLabel, Gauge>,
    spool_pending: Gauge,
    rate_limit_addresses: Gauge,
    intake_pending: Gauge,
    routing_width: Gauge,
    routing_widest: Gauge,
}

/// What `/metrics` reads at scrape time.
pub struct Snapshot {
    pub circuits: Vec<(String, CircuitState)>,
    /// Leads by state; `None` while the database is unreachable.
    pub leads: Option<Vec<(String, u64)>>,
    pub spool_pending: usize,
    /// Client addresses with a rate-limit bucket.
    pub rate_limit_addresses: usize,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("leadrouter");
        let intake = Family::<OutcomeLabel, Counter>::default();
        registry.register(
            "intake_leads",
            "Leads answered by intake, by outcome (accepted, pending, invalid, duplicate, replayed, failed)",
            intake.clone(),
        );
        // 0.5 ms to about 4 s.
        let intake_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "intake_seconds",
            "Time from request to intake answer",
            intake_seconds.clone(),
        );
        let attempts = Family::<AttemptLabels, Counter>::default();
        registry.register(
            "attempts",
            "Attempts by buyer, kind (ping, post, skip) and outcome",
            attempts.clone(),
        );
        let circuit_transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "circuit_transitions",
            "Circuit breaker transitions by buyer and new state",
            circuit_transitions.clone(),
        );
        let circuit_state = Family::<BuyerLabel, Gauge>::default();
        registry.register(
            "circuit_state",
            "Circuit state per buyer: 0 closed, 1 half open, 2 open",
            circuit_state.clone(),
        );
        let leads = Family::<StateLabel, Gauge>::default();
        registry.register("leads", "Stored leads by state", leads.clone());
        let spool_pending = Gauge::default();
        registry.register(
            "spool_pending",
            "Leads waiting in the spool for the database",
            spool_pending.clone(),
        );
        let rate_limit_addresses = Gauge::default();
        registry.register(
            "rate_limit_addresses",
            format!(
                "Client addresses the rate limiter holds a bucket for: at most {MAX_ADDRESSES}, the least recently seen making room for a new one"
            ),
            rate_limit_addresses.clone(),
        );
        let intake_pending = Gauge::default();
        registry.register(
            "intake_pending",
            "Leads waiting for their commit (at most intake.max_pending)",
            intake_pending.clone(),
        );
        let routing_width = Gauge::default();
        registry.register(
            "routing_width",
            "Waterfalls routing may run now: fewer while intake's leads wait longer than usual for their commit",
            routing_width.clone(),
        );
        let routing_widest = Gauge::default();
        registry.register(
            "routing_widest",
            "Waterfalls routing runs when intake does not compete: twice the enabled buyers' slots, 256 to 4096",
            routing_widest.clone(),
        );
        Self {
            inner: Arc::new(Inner {
                registry,
                intake,
                intake_seconds,
                attempts,
                circuit_transitions,
                circuit_state,
                leads,
                spool_pending,
                rate_limit_addresses,
                intake_pending,
                routing_width,
                routing_widest,
            }),
        }
    }
}

impl Metrics {
    /// Leads buffered or being written by intake now.
    pub fn intake_pending(&self, leads: usize) {
        set_count(&self.inner.intake_pending, leads);
    }

    /// Waterfalls the router may run now.
    pub fn routing_width(&self, waterfalls: usize) {
        set_count(&self.inner.routing_width, waterfalls);
    }

    /// The width last set (`routing_width`).
    pub fn routing_width_now(&self) -> u64 {
        count_of(&self.inner.routing_width)
    }

    /// Waterfalls routing runs at full width (`router::widest`).
    pub fn routing_widest(&self, waterfalls: usize) {
        set_count(&self.inner.routing_widest, waterfalls);
    }

    /// The widest last set (`routing_widest`).
    pub fn routing_widest_now(&self) -> u64 {
        count_of(&self.inner.routing_widest)
    }

    pub fn intake(&self, outcome: &str, seconds: f64) {
        self.inner
            .intake
            .get_or_create(&OutcomeLabel {
                outcome: outcome.into(),
            })
            .inc();
        self.inner.intake_seconds.observe(seconds);
    }

    pub fn attempt(&self, buyer: &str, kind: &str, outcome: &str) {
        self.inner
            .attempts
            .get_or_create(&AttemptLabels {
                buyer: buyer.into(),
                kind: kind.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    pub fn circuit_changed(&self, buyer: &str, state: CircuitState) {
        self.inner
            .circuit_transitions
            .get_or_create(&TransitionLabels {
                buyer: buyer.into(),
                state: state.as_str().into(),
            })
            .inc();
    }

    /// The text exposition, with the scrape-time values set first.
    pub fn render(&self, snapshot: Snapshot) -> String {
        let inner = &self.inner;
        for (buyer, state) in snapshot.circuits {
            let value = match state {
                CircuitState::Closed => 0,
                CircuitState::HalfOpen => 1,
                CircuitState::Open => 2,
            };
            inner
                .circuit_state
                .get_or_create(&BuyerLabel { buyer })
                .set(value);
        }
        for (state, count) in snapshot.leads.unwrap_or_default() {
            inner
                .leads
                .get_or_create(&StateLabel { state })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        set_count(&inner.spool_pending, snapshot.spool_pending);
        set_count(&inner.rate_limit_addresses, snapshot.rate_limit_addresses);
        let mut text = String::new();
        if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &inner.registry) {
            tracing::error!(%error, "metrics could not be encoded");
        }
        text
    }
}

/// A gauge that counts things.
fn set_count(gauge: &Gauge, count: usize) {
    gauge.set(i64::try_from(count).unwrap_or(i64::MAX));
}

fn count_of(gauge: &Gauge) -> u64 {
    u64::try_from(gauge.get()).unwrap_or(0)
}

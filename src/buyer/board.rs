//! The status board: each buyer actor publishes its circuit and load here
//! (a `DashMap`), and the buyers and status endpoints read it without
//! asking the actors.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use serde::Serialize;

use super::breaker::CircuitState;
use super::latency::Percentiles;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct BuyerStatus {
    pub id: String,
    pub name: String,
    pub enabled: bool,
    pub circuit: CircuitState,
    pub circuit_changed_at: DateTime<Utc>,
    pub consecutive_failures: u32,
    pub in_flight: u32,
    pub max_concurrency: u32,
    /// Over the recent calls; `null` before the first.
    pub ping_latency: Option<Percentiles>,
    pub post_latency: Option<Percentiles>,
}

#[derive(Debug, Clone, Default)]
pub struct Board {
    buyers: Arc<DashMap<String, BuyerStatus>>,
}

impl Board {
    pub fn publish(&self, status: BuyerStatus) {
        self.buyers.insert(status.id.clone(), status);
    }

    pub fn get(&self, buyer_id: &str) -> Option<BuyerStatus> {
        self.buyers.get(buyer_id).map(|entry| entry.clone())
    }
}

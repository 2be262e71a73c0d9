//! What every courier shares: the store and alerts (`CourierEnvironment`),
//! the confirmations intake waits for (`Confirmations`), and the board of
//! each channel's health the status views read (`DeliveryBoard`).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use dashmap::DashMap;
use tokio::sync::Notify;

use crate::actors::supervision::RestartLog;
use crate::alerts::Alerts;
use crate::store::Store;

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

    pub(super) fn confirmed(&self, lead_id: &str) {
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

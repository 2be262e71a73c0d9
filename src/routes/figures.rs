//! The database figures the polled views show (`/v1/status`, `/metrics`,
//! the status page): lead counts, the review backlog, each buyer's sales
//! today, recent outcomes and cap use. Read at most once a second whatever
//! the number of pollers (concurrent requests wait for the one read in
//! flight), so a wall of open dashboards costs the database one query set
//! per second, not one per tab.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use sea_orm::DbErr;
use tokio::sync::Mutex;

use super::report::start_of_day;
use crate::config::Settings;
use crate::store::{CapSlot, CapUse, OutcomeCounts, Store};

/// How long one read of the figures is shown.
const FRESH_FOR: Duration = Duration::from_secs(1);
/// "Recent" outcome counts cover this much time.
pub const RECENT: chrono::Duration = chrono::Duration::hours(24);

/// One read of the figures.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    /// Leads by state.
    pub leads: HashMap<String, u64>,
    /// Set aside or with a delivery given up (besides invalid and unknown).
    pub set_aside: u64,
    /// Per buyer: sales today (UTC), outcomes of the last day, cap use.
    pub sold_today: HashMap<String, u64>,
    pub outcomes: HashMap<String, OutcomeCounts>,
    pub caps: HashMap<String, Vec<CapUse>>,
}

impl Figures {
    /// Reads them now.
    pub async fn read(store: &Store, settings: &Settings) -> Result<Self, DbErr> {
        let now = Utc::now();
        let mut caps = HashMap::new();
        for buyer in &settings.buyers {
            let slots = CapSlot::for_post(buyer, now);
            if !slots.is_empty() {
                caps.insert(buyer.id.clone(), store.cap_use(&slots).await?);
            }
        }
        Ok(Self {
            leads: store.lead_counts().await?,
            set_aside: store.set_aside_count().await?,
            sold_today: store.sales_by_buyer(start_of_day(now)).await?,
            outcomes: store.outcome_counts(now - RECENT).await?,
            caps,
        })
    }
}

/// The last read, shared by every poller. A failed read is remembered as
/// long as a good one, so while the database is down the pollers do not
/// wait for it one after another.
#[derive(Default)]
pub struct FiguresCache {
    last: Mutex<Option<LastRead>>,
}

/// When the figures were last read, and what came of it.
type LastRead = (Instant, Result<Arc<Figures>, String>);

impl FiguresCache {
    /// The figures, read again when the last read is older than a second.
    pub async fn get(&self, store: &Store, settings: &Settings) -> Result<Arc<Figures>, DbErr> {
        let mut last = self.last.lock().await;
        if let Some((read_at, read)) = last.as_ref() {
            if read_at.elapsed() < FRESH_FOR {
                return read.clone().map_err(DbErr::Custom);
            }
        }
        let read = Figures::read(store, settings)
            .await
            .map(Arc::new)
            .map_err(|error| error.to_string());
        *last = Some((Instant::now(), read.clone()));
        read.map_err(DbErr::Custom)
    }
}

//! The database figures the polled views show (`/v1/status`, `/metrics`,
//! the status page): lead counts, the review backlog, each buyer's sales
//! today, recent outcomes and cap use. Read at most once a second whatever
//! the number of pollers (concurrent requests wait for the one read in
//! flight), so a wall of open dashboards costs the database one query set
//! per second, not one per tab. The counts scan their tables, so under a
//! large backlog one read takes long: a read is then shown for ten times
//! as long as it took, and the figures never take more than about a tenth
//! of the database's time, however many leads wait.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Timelike, Utc};
use sea_orm::DbErr;
use tokio::sync::Mutex;

use crate::config::Settings;
use crate::store::{CapSlot, CapUse, OutcomeCounts, Store};

/// How long one read of the figures is shown at least.
const FRESH_FOR: Duration = Duration::from_secs(1);
/// A read is shown at least this many times as long as it took.
const SHOWN_PER_READ_TIME: u32 = 10;
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
    /// When they were read.
    pub read_at: DateTime<Utc>,
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
            read_at: now,
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

/// When the figures were last read, until when they are shown, and what
/// came of the read.
struct LastRead {
    shown_until: Instant,
    read: Result<Arc<Figures>, String>,
}

impl FiguresCache {
    /// The figures, read again once the last read's time is up.
    pub async fn get(&self, store: &Store, settings: &Settings) -> Result<Arc<Figures>, DbErr> {
        let mut last = self.last.lock().await;
        if let Some(last) = last.as_ref() {
            if Instant::now() < last.shown_until {
                return last.read.clone().map_err(DbErr::Custom);
            }
        }
        let started = Instant::now();
        let read = Figures::read(store, settings)
            .await
            .map(Arc::new)
            .map_err(|error| error.to_string());
        let read_at = Instant::now();
        *last = Some(LastRead {
            shown_until: read_at + shown_for(read_at - started),
            read: read.clone(),
        });
        read.map_err(DbErr::Custom)
    }
}

/// How long a read that took `took` is shown.
fn shown_for(took: Duration) -> Duration {
    FRESH_FOR.max(took * SHOWN_PER_READ_TIME)
}

/// 00:00 UTC of the day that holds `at`.
pub fn start_of_day(at: DateTime<Utc>) -> DateTime<Utc> {
    at.with_hour(0)
        .and_then(|t| t.with_minute(0))
        .and_then(|t| t.with_second(0))
        .and_then(|t| t.with_nanosecond(0))
        .unwrap_or(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quick_read_is_shown_a_second_and_a_slow_one_ten_times_as_long_as_it_took() {
        assert_eq!(shown_for(Duration::from_millis(20)), FRESH_FOR);
        assert_eq!(shown_for(Duration::from_millis(100)), FRESH_FOR);
        assert_eq!(
            shown_for(Duration::from_millis(340)),
            Duration::from_millis(3400)
        );
    }
}

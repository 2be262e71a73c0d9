//! Planner statistics kept fresh when a backlog builds up (PostgreSQL).
//!
//! PostgreSQL's row estimates come from `ANALYZE`, which autovacuum runs
//! only after a tenth of a table changed and its next round came (a minute
//! apart by default). A backlog (every buyer down for a while, then back)
//! builds up faster than that, while the statistics still say that hardly
//! any lead waits: the planner then fetches and sorts every waiting lead at
//! each claim, and reads a claim's attempt histories by scanning the whole
//! table, so the drain slows down as the backlog grows. When a sweep finds
//! a backlog, the store analyzes `leads` and `attempts` at once, in the
//! background, at most once per `EVERY`. SQLite plans without them.

use std::time::{Duration, Instant};

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend};

use super::at_most_every::AtMostEvery;

/// Statistics are refreshed at most this often.
const EVERY: Duration = Duration::from_secs(300);

/// When the statistics were last refreshed by this store.
#[derive(Debug)]
pub(super) struct Statistics {
    refresh: AtMostEvery,
}

impl Default for Statistics {
    fn default() -> Self {
        Self {
            refresh: AtMostEvery::new(EVERY),
        }
    }
}

impl Statistics {
    /// A claim found more waiting leads than it could take: analyzes the
    /// routing tables unless that was done within `EVERY`.
    pub(super) fn backlog_found(&self, db: &DatabaseConnection) {
        if db.get_database_backend() != DbBackend::Postgres || !self.refresh.due() {
            return;
        }
        let db = db.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            match db.execute_unprepared("ANALYZE leads, attempts").await {
                Ok(_) => tracing::info!(
                    took_ms = started.elapsed().as_millis() as u64,
                    "backlog found: planner statistics of leads and attempts refreshed"
                ),
                Err(error) => tracing::warn!(%error, "could not refresh planner statistics"),
            }
        });
    }
}

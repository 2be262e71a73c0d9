//! [`Store`], the handle on the database: connecting (SQLite or
//! PostgreSQL through the same sea-orm code) with its pools and threads,
//! migrating, and closing. The queries are `impl Store` blocks beside it.

use std::sync::Arc;
use std::time::Duration;

use actix::{Arbiter, ArbiterHandle};
use migration::{Migrator, MigratorTrait};
use sea_orm::sqlx::postgres::PgConnectOptions;
use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};
use tokio::sync::oneshot;

use super::at_most_every::AtMostEvery;
use super::attempt_writer::AttemptWriter;
use super::earlier_keys::EarlierKeys;
use super::intake_first::IntakeFirst;
use super::loopback_tls::plain_on_loopback;
use super::snapshots::StoredSnapshots;
use super::statistics::Statistics;
use super::{sqlite_lock, tcp_nodelay};
use crate::config::DatabaseSettings;

/// How long a SQLite writer waits for the file lock before failing.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Routing's own pools: the attempt writer's, and the one for claims,
/// settles and requeues. One connection each: routing's statements then
/// wait in our (niced) threads rather than as database backends that
/// each run a full time slice while intake's leads wait for a core, and
/// a group that gathers while the previous one commits is larger and
/// cheaper per write. Measured on PostgreSQL against 2 + 4 connections,
/// 10 and 8 paired runs: intake p99 at 1,000 leads/s with routing on
/// lower in 8 pairs of 10 (median 9.9 against 11.4 ms), routed leads/s
/// 1.08x, PostgreSQL's CPU per routed lead 0.90x.
/// (The attempt writer's barrier, which a cap's recount waits behind, also
/// relies on its groups committing one at a time.)
const ROUTING_CONNECTIONS: u32 = 1;

/// A sweep looks for leases that ran out at most this often: they are
/// rare (an instance stopped while routing), and until the table is
/// vacuumed the search walks an index entry for every lead that was
/// routed lately, which under a draining backlog made it the costliest
/// statement of a claim although it found nothing.
const LEASE_SEARCH_EVERY: Duration = Duration::from_secs(1);

/// A handle on the database, cheap to clone (the pool is shared).
#[derive(Clone, Debug)]
pub struct Store {
    /// Everything else: reads, operators' writes, notify deliveries.
    pub(super) db: DatabaseConnection,
    /// Routing's claims, settles and requeues.
    pub(super) routing: DatabaseConnection,
    /// Intake's and the spool drainer's own pool: routing load and readers
    /// can never take the connections a lead needs to be stored.
    pub(super) intake: DatabaseConnection,
    /// The thread intake and the spool drainer run on, and that opened the
    /// intake pool. A PostgreSQL connection's socket is served by the
    /// thread that opened it, so a lead's commit never waits for the
    /// routing thread (busy with hundreds of waterfalls) to read its answer.
    intake_thread: ArbiterHandle,
    /// Attempt rows go through one group-committing writer.
    pub(super) attempts: AttemptWriter,
    /// The attempt writer's own pool, opened on (and served by) its own
    /// thread, as intake's is.
    writer: DatabaseConnection,
    writer_thread: ArbiterHandle,
    /// Intake's writes under way, which the attempt writer lets go first
    /// on SQLite.
    pub(super) intake_first: Arc<IntakeFirst>,
    /// When the routing tables were last analyzed for a backlog.
    pub(super) statistics: Arc<Statistics>,
    /// When a sweep last looked for leases that ran out.
    pub(super) lease_search: Arc<AtMostEvery>,
    /// The attempts' configurations known to be stored.
    pub(super) snapshots: Arc<StoredSnapshots>,
    /// Whether leads stored with random ids and keys may exist.
    pub(super) earlier_keys: Arc<EarlierKeys>,
}

impl Store {
    /// Connects (inside an actix system: it starts the intake and writer
    /// threads) with durable commits: SQLite in WAL mode with
    /// `synchronous = FULL` (fsync on every commit), PostgreSQL with its
    /// defaults.
    /// `database.max_connections` is split: a quarter (at least 2) is
    /// intake's own pool, one connection the attempt writer's, one
    /// routing's, the rest (at least 2) serves reads and operators.
    pub async fn connect(settings: &DatabaseSettings) -> Result<Self, DbErr> {
        if settings.is_sqlite() {
            create_sqlite_parent_dir(settings.url.expose());
        }
        let intake_connections = (settings.max_connections / 4).max(2);
        let other_connections = settings
            .max_connections
            .saturating_sub(intake_connections + 2 * ROUTING_CONNECTIONS)
            .max(2);
        let intake_thread = Arbiter::new().handle();
        intake_thread.spawn_fn(crate::threads::become_intake);
        let writer_thread = Arbiter::new().handle();
        // Attempt rows are routing's writes: their CPU yields to intake's.
        writer_thread.spawn_fn(crate::threads::become_attempt_writer);
        // A store that cannot connect leaves no thread behind.
        let stop_threads = |_: &DbErr| {
            intake_thread.stop();
            writer_thread.stop();
        };
        let intake = pool_opened_on(&intake_thread, settings.clone(), intake_connections)
            .await
            .inspect_err(stop_threads)?;
        let writer = pool_opened_on(&writer_thread, settings.clone(), ROUTING_CONNECTIONS)
            .await
            .inspect_err(stop_threads)?;
        let db = pool(settings, other_connections, PoolUse::Reads)
            .await
            .inspect_err(stop_threads)?;
        let routing = pool(settings, ROUTING_CONNECTIONS, PoolUse::Routing)
            .await
            .inspect_err(stop_threads)?;
        let intake_first = Arc::new(IntakeFirst::default());
        let snapshots = Arc::new(StoredSnapshots::default());
        Ok(Self {
            attempts: AttemptWriter::start(
                &writer_thread,
                writer.clone(),
                ROUTING_CONNECTIONS as usize,
                settings.is_sqlite().then(|| intake_first.clone()),
                snapshots.clone(),
            ),
            db,
            routing,
            intake,
            intake_thread,
            writer,
            writer_thread,
            intake_first,
            statistics: Arc::default(),
            lease_search: Arc::new(AtMostEvery::new(LEASE_SEARCH_EVERY)),
            snapshots,
            earlier_keys: Arc::default(),
        })
    }

    /// Applies pending migrations, then looks whether leads stored before
    /// keyed ids were derived exist (`earlier_keys`).
    pub async fn migrate(&self) -> Result<(), DbErr> {
        Migrator::up(&self.db, None).await?;
        self.earlier_keys.look(&self.db).await
    }

    /// True when the database answers.
    pub async fn is_reachable(&self) -> bool {
        self.db.ping().await.is_ok()
    }

    /// Intake batches that may be written at once: one on SQLite (one
    /// writer), two on PostgreSQL (one commits while the next is sent).
    pub fn intake_batches_at_once(&self) -> usize {
        match self.intake.get_database_backend() {
            sea_orm::DbBackend::Sqlite => 1,
            _ => 2,
        }
    }

    /// The thread for intake and the spool drainer (see `intake_thread`).
    pub fn intake_thread(&self) -> ArbiterHandle {
        self.intake_thread.clone()
    }

    /// Closes the pools: new queries fail, and this waits until every query
    /// in flight has given its connection back; then the intake and
    /// writer threads end. Run before the runtime stops, so no connection is dropped
    /// outside it.
    pub async fn close(&self) {
        for pool in [&self.db, &self.routing, &self.intake, &self.writer] {
            if let Err(error) = pool.close_by_ref().await {
                tracing::warn!(%error, "closing the database pool");
            }
        }
        self.intake_thread.stop();
        self.writer_thread.stop();
    }

    /// The connection, for tests and tools that inspect rows directly.
    pub fn connection(&self) -> &DatabaseConnection {
        &self.db
    }
}

/// [`pool`], connected from `thread`: connections it opens belong there.
async fn pool_opened_on(
    thread: &ArbiterHandle,
    settings: DatabaseSettings,
    connections: u32,
) -> Result<DatabaseConnection, DbErr> {
    let (reply, answer) = oneshot::channel();
    thread.spawn(async move {
        let _ = reply.send(pool(&settings, connections, PoolUse::Writes).await);
    });
    answer
        .await
        .map_err(|_| DbErr::Custom("the intake thread stopped".into()))?
}

/// What a pool serves, which sets how PostgreSQL plans its prepared
/// statements and whether a connection is tested before each use.
#[derive(Debug, Clone, Copy)]
enum PoolUse {
    /// Intake's and the attempt writer's writes by key, which plan alike
    /// whatever their values: PostgreSQL's default planning (after five
    /// runs a statement may keep one generic plan).
    Writes,
    /// Routing's claims, each planned for its values: under a generic plan
    /// the claims' `LIMIT $n` is guessed at a tenth of the table, and
    /// PostgreSQL then joins a scan of the whole backlog at every claim.
    Routing,
    /// Reads and operators' writes, planned as routing's are. Each
    /// connection is pinged before use: a connection that died while idle
    /// (a database restart, a cut network) would otherwise fail the first
    /// reads after an outage, a sender's status poll among them. Reads are
    /// few; on the other pools a ping would add a round trip to every
    /// batch, and their writers try a dead connection's work again.
    Reads,
}

/// One pool of `connections` on the configured database.
async fn pool(
    settings: &DatabaseSettings,
    connections: u32,
    serves: PoolUse,
) -> Result<DatabaseConnection, DbErr> {
    let url = settings.url.expose().to_string();
    let mut options = ConnectOptions::new(url.clone());
    // One function per pool maps its PostgreSQL options (a second would
    // replace the first).
    options.map_sqlx_postgres_opts(move |options| {
        let options = plain_on_loopback(&url, options);
        match serves {
            PoolUse::Routing | PoolUse::Reads => {
                options.options([("plan_cache_mode", "force_custom_plan")])
            }
            PoolUse::Writes => options,
        }
    });
    options
        .max_connections(connections)
        .acquire_timeout(settings.acquire_timeout)
        .connect_timeout(settings.acquire_timeout)
        .sqlx_logging(false)
        .test_before_acquire(matches!(serves, PoolUse::Reads))
        // No `mmap_size`: the pages a connection maps count in the
        // service's RSS, once per connection (436 MiB at peak in the
        // backlog bench's 100,000 leads, against 23 MiB unmapped), and the
        // reads it saves did not show in the intake or routing bench.
        .map_sqlx_sqlite_opts(|options| {
            options
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(SQLITE_BUSY_TIMEOUT)
        })
        // Once connected, `busy_timeout`'s wait for the write lock is
        // replaced by one that tries again in short steps (`sqlite_lock`).
        .map_sqlx_sqlite_pool_opts(|options| {
            options.after_connect(|connection, _| {
                Box::pin(sqlite_lock::wait_in_short_steps(
                    connection,
                    SQLITE_BUSY_TIMEOUT,
                ))
            })
        });
    // Each new PostgreSQL connection sends small messages at once
    // (`tcp_nodelay`).
    let url = settings.url.expose();
    let postgres = url
        .starts_with("postgres")
        .then(|| url.parse::<PgConnectOptions>());
    if let Some(Ok(postgres)) = postgres {
        let port = postgres.get_port();
        options.map_sqlx_postgres_pool_opts(move |options| {
            options.after_connect(move |_, _| {
                tcp_nodelay::set_on_connections_to(port);
                Box::pin(async { Ok(()) })
            })
        });
    }
    Database::connect(options).await
}

/// `sqlite://data/x.db?mode=rwc` needs `data/` to exist before it can create the file.
fn create_sqlite_parent_dir(url: &str) {
    let path = url
        .trim_start_matches("sqlite:")
        .trim_start_matches("//")
        .split('?')
        .next()
        .unwrap_or_default();
    if path.is_empty() || path.starts_with(":memory:") {
        return;
    }
    if let Some(parent) = std::path::Path::new(path).parent() {
        if !parent.as_os_str().is_empty() {
            if let Err(error) = std::fs::create_dir_all(parent) {
                tracing::warn!(%error, dir = %parent.display(), "cannot create the SQLite directory");
            }
        }
    }
}

//! Intake benchmark: real HTTP load at `POST /v1/leads` of `leadrouter
//! serve` (a child process), next to the raw single-row insert rate of the
//! same database measured in the same run.
//!
//! Per database: the raw rate (autocommit INSERTs of a lead-shaped row, one
//! connection per client on PostgreSQL, the one writer on SQLite; on
//! PostgreSQL also over one connection, the cost of a durable commit on
//! this machine, which decides what group commit can gain); intake in
//! a closed loop (leads/s, p50/p99, CPU per lead in the service, in
//! PostgreSQL and on the whole machine); intake at a fixed rate alone (once
//! the closed loop's leads are routed); the
//! same fixed rate while a second service routes every lead to three mock
//! buyers and pollers read `/v1/status`; for both fixed-rate phases also
//! the p99 inside the service (its `leadrouter_intake_seconds` histogram:
//! from the lead handed to intake to its answer), so that the database's
//! share of a latency tail is told from the machine's. On PostgreSQL a
//! last phase makes the database unreachable (no new connections, the open
//! ones terminated) while the load goes on: intake answers from the spool;
//! then the database comes back and the bench times the drain. Every request is accounted for
//! (a run that lost one is void), and every acknowledged lead must be stored.
//!
//! `cargo bench --bench intake` — both databases. Environment:
//! `BENCH_DB` (`sqlite`, `postgres` or `both`), `BENCH_SECONDS` (10),
//! `BENCH_CLIENTS` (64), `BENCH_FIXED_RATE` (1000 leads/s), `LEADROUTER_BIN`
//! (another build of the service to measure, e.g. the one before a change).

#[path = "../tests/it/scratch_db.rs"]
mod scratch_db;
mod support;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use actix_web::rt::System;
use scratch_db::{Backend, TestDatabase};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DbBackend, Statement};
use support::{
    bases, buyers_toml, closed_loop, env_u64, fixed_rate, intake_histogram, lead_body, mock_buyer,
    p99_bound_ms, serve, CpuUse, PageReads, Process,
};

const SOURCE: &str = r#"
[[sources]]
id = "bench"
kind = "form"
required = ["email"]
"#;

struct Settings {
    seconds: u64,
    clients: usize,
    fixed_rate: u64,
}

fn main() {
    let bench = Settings {
        seconds: env_u64("BENCH_SECONDS", 10),
        clients: env_u64("BENCH_CLIENTS", 64) as usize,
        fixed_rate: env_u64("BENCH_FIXED_RATE", 1000),
    };
    let which = std::env::var("BENCH_DB").unwrap_or_else(|_| "both".into());
    let backends = match which.as_str() {
        "sqlite" => vec![Backend::Sqlite],
        "postgres" => vec![Backend::Postgres],
        _ => vec![Backend::Sqlite, Backend::Postgres],
    };
    for backend in backends {
        run(backend, &bench);
    }
}

fn run(backend: Backend, bench: &Settings) {
    println!(
        "== {backend:?}: {} clients, {} s per phase ==",
        bench.clients, bench.seconds
    );
    let (raw, connections) =
        System::new().block_on(raw_insert_rate(backend, bench.clients, bench.seconds));
    println!("raw single-row inserts ({connections} connections, autocommit): {raw:>8.0} rows/s");
    if backend == Backend::Postgres {
        // What one durable commit costs here tells how much group commit
        // can save: where a commit's flush is cheap, many connections
        // committing at once come near intake's batches.
        let (serial, _) = System::new().block_on(raw_insert_rate(backend, 1, bench.seconds.min(3)));
        println!(
            "raw single-row inserts (1 connection, autocommit):   {serial:>8.0} rows/s = {:.3} ms per durable commit, its round trip included",
            1000.0 / serial
        );
    }

    let database = System::new().block_on(TestDatabase::create(backend));
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let service = serve(
        dir.path(),
        &database.url,
        &format!("[intake]\nspool_dir = \"{}\"\n{SOURCE}", spool.display()),
    );
    let url = format!("{}/v1/leads?source=bench", service.base());

    let cpu = CpuUse::start(&service, &[]);
    let closed = System::new()
        .block_on(closed_loop(&url, bench.clients, bench.seconds))
        .accounted("closed loop");
    println!(
        "intake, closed loop:        {:>8.0} leads/s  p50 {:>6.2} ms  p99 {:>6.2} ms  ({:.2}x the raw insert rate)  {}",
        closed.rate,
        closed.p50_ms,
        closed.p99_ms,
        closed.rate / raw,
        closed.tally()
    );
    println!(
        "                            {}",
        cpu.per_lead(&service, &[], closed.acknowledged)
    );

    // Alone means alone: the closed loop's leads are routed first (no
    // buyers here: each ends unsold), or their routing would share the
    // machine with the fixed rate.
    let waited = Instant::now();
    System::new().block_on(async {
        while count_leads_where(&database.url, "state IN ('received', 'routing')").await > 0 {
            actix_web::rt::time::sleep(Duration::from_millis(200)).await;
        }
    });
    println!(
        "                            (its leads routed, to unsold, {:.1} s after it ended)",
        waited.elapsed().as_secs_f64()
    );
    let histogram = System::new().block_on(intake_histogram(&service.base()));
    let page_reads = PageReads::start();
    let alone = System::new()
        .block_on(fixed_rate(
            &url,
            bench.clients,
            bench.fixed_rate,
            bench.seconds,
        ))
        .accounted("fixed rate");
    println!(
        "intake at {} leads/s alone:         p50 {:>6.2} ms  p99 {:>6.2} ms  {}",
        bench.fixed_rate,
        alone.p50_ms,
        alone.p99_ms,
        alone.tally()
    );
    println!("                            {page_reads}");
    let alone_in_service = p99_bound_ms(
        &histogram,
        &System::new().block_on(intake_histogram(&service.base())),
    );
    let (routing, routing_in_service) = routing_phase(backend, bench);
    println!(
        "intake at {} leads/s, routing on:   p50 {:>6.2} ms  p99 {:>6.2} ms  ({:.2}x the p99 alone)  {}",
        bench.fixed_rate,
        routing.p50_ms,
        routing.p99_ms,
        routing.p99_ms / alone.p99_ms,
        routing.tally()
    );
    println!(
        "                            inside the service (handed to intake until answered): p99 <= {alone_in_service} ms alone, <= {routing_in_service} ms with routing"
    );

    let mut acknowledged = closed.acknowledged + alone.acknowledged;
    if backend == Backend::Postgres {
        let spooled = System::new().block_on(spool_phase(&database.url, &service, bench));
        println!(
            "intake, database unreachable (spool): {:>8.0} leads/s  p50 {:>6.2} ms  p99 {:>6.2} ms  ({:.2}x intake with the database)  {}",
            spooled.rate,
            spooled.p50_ms,
            spooled.p99_ms,
            spooled.rate / closed.rate,
            spooled.tally()
        );
        acknowledged += spooled.acknowledged;
    }
    drop(service);
    let stored = System::new().block_on(count_leads(&database.url));
    println!("acknowledged {acknowledged} leads, {stored} stored");
    assert_eq!(
        stored, acknowledged as u64,
        "every acknowledged lead is stored"
    );
}

/// The fixed rate against a second service whose every lead is routed to
/// three mock buyers (20 ms each, many slots), while four pollers read
/// `/v1/status` without pause: routing and readers load the database as
/// hard as they can while intake goes on. Also answers the service's own
/// p99 bound (ms) over the phase.
fn routing_phase(backend: Backend, bench: &Settings) -> (support::LoadResult, f64) {
    let buyers = [
        mock_buyer(&["--accept-rate", "0.3", "--latency", "20ms"]),
        mock_buyer(&["--accept-rate", "0.5", "--latency", "20ms"]),
        mock_buyer(&["--accept-rate", "0.9", "--latency", "20ms"]),
    ];
    let database = System::new().block_on(TestDatabase::create(backend));
    let dir = tempfile::tempdir().unwrap();
    let service = serve(
        dir.path(),
        &database.url,
        &format!(
            "[intake]\nspool_dir = \"{}\"\n{SOURCE}{}",
            dir.path().join("spool").display(),
            buyers_toml(&bases(&buyers), "")
        ),
    );
    let url = format!("{}/v1/leads?source=bench", service.base());
    let status = format!("{}/v1/status", service.base());
    let cpu = CpuUse::start(&service, &[]);
    let histogram = System::new().block_on(intake_histogram(&service.base()));
    let page_reads = PageReads::start();
    let load = System::new().block_on(async {
        let polling = Rc::new(Cell::new(true));
        let pollers: Vec<_> = (0..4)
            .map(|_| actix_web::rt::spawn(poll(status.clone(), polling.clone())))
            .collect();
        let load = fixed_rate(&url, bench.clients, bench.fixed_rate, bench.seconds).await;
        polling.set(false);
        let polls: usize = futures_util::future::join_all(pollers)
            .await
            .into_iter()
            .map(Result::unwrap)
            .sum();
        println!("                            ({polls} reads of /v1/status meanwhile)");
        load
    });
    println!(
        "                            with routing: {}",
        cpu.per_lead(&service, &[], load.acknowledged)
    );
    println!("                            {page_reads}");
    let in_service = p99_bound_ms(
        &histogram,
        &System::new().block_on(intake_histogram(&service.base())),
    );
    let load = load.accounted("fixed rate with routing");
    let stored = System::new().block_on(count_leads(&database.url));
    assert_eq!(
        stored, load.acknowledged as u64,
        "every acknowledged lead is stored"
    );
    (load, in_service)
}

/// Reads `url` every 100 ms while `polling` (four pollers: as 80 open
/// status pages polling every 2 s); answers how many reads it made.
async fn poll(url: String, polling: Rc<Cell<bool>>) -> usize {
    let client = awc::Client::default();
    let mut reads = 0;
    let mut every = actix_web::rt::time::interval(Duration::from_millis(100));
    while polling.get() {
        every.tick().await;
        if let Ok(mut response) = client.get(&url).send().await {
            let _ = response.body().await;
        }
        reads += 1;
    }
    reads
}

/// Closed-loop load while PostgreSQL refuses the service, then the drain.
async fn spool_phase(url: &str, service: &Process, bench: &Settings) -> support::LoadResult {
    let (server, name) = url.rsplit_once('/').unwrap();
    let admin = Database::connect(format!("{server}/postgres"))
        .await
        .unwrap();
    let allow = |allowed: bool| format!("ALTER DATABASE {name} ALLOW_CONNECTIONS {allowed}");
    admin.execute_unprepared(&allow(false)).await.unwrap();
    admin
        .execute_unprepared(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"
        ))
        .await
        .unwrap();
    let intake = format!("{}/v1/leads?source=bench", service.base());
    let spooled = closed_loop(&intake, bench.clients, bench.seconds)
        .await
        .accounted("spool phase");
    admin.execute_unprepared(&allow(true)).await.unwrap();
    let back = Instant::now();
    let status = format!("{}/v1/status", service.base());
    let client = awc::Client::default();
    loop {
        let pending = match client.get(&status).send().await {
            Ok(mut response) => response
                .json::<serde_json::Value>()
                .await
                .ok()
                .and_then(|status| status["spool"]["pending"].as_u64()),
            Err(_) => None,
        };
        if pending == Some(0) {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "spool drained {} leads in {:.2} s after the database came back",
        spooled.acknowledged,
        back.elapsed().as_secs_f64()
    );
    spooled
}

/// The baseline: `clients` tasks doing one autocommit INSERT of a
/// lead-shaped row after another for `seconds`, durably (SQLite in WAL
/// with `synchronous = FULL`, as the service), over one connection per
/// client on PostgreSQL and SQLite's one writer. Answers the rate and the
/// connections used.
async fn raw_insert_rate(backend: Backend, clients: usize, seconds: u64) -> (f64, usize) {
    use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};

    let database = TestDatabase::create(backend).await;
    let connections = match backend {
        Backend::Sqlite => 1,
        Backend::Postgres => clients,
    };
    let mut options = ConnectOptions::new(database.url.clone());
    // Connected as the service connects (no TLS to this machine's server).
    let url = database.url.clone();
    options
        .map_sqlx_postgres_opts(move |options| leadrouter::store::plain_on_loopback(&url, options))
        .max_connections(connections as u32)
        .sqlx_logging(false)
        .map_sqlx_sqlite_opts(|options| {
            options
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
        });
    let db = Database::connect(options).await.unwrap();
    let bytes = match backend {
        Backend::Sqlite => "BLOB",
        Backend::Postgres => "BYTEA",
    };
    db.execute_unprepared(&format!(
        "CREATE TABLE bench_raw (id TEXT PRIMARY KEY, source_id TEXT NOT NULL, \
         idempotency_key TEXT, state TEXT NOT NULL, fields TEXT NOT NULL, raw {bytes} NOT NULL, \
         received_at TEXT NOT NULL, UNIQUE (source_id, idempotency_key))"
    ))
    .await
    .unwrap();
    let sql = match db.get_database_backend() {
        DbBackend::Postgres => {
            "INSERT INTO bench_raw (id, source_id, idempotency_key, state, fields, raw, received_at) \
             VALUES ($1, 'bench', $2, 'received', $3, $4, $5)"
        }
        _ => {
            "INSERT INTO bench_raw (id, source_id, idempotency_key, state, fields, raw, received_at) \
             VALUES (?, 'bench', ?, 'received', ?, ?, ?)"
        }
    };
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let tasks = (0..clients).map(|_| {
        let db = db.clone();
        actix_web::rt::spawn(async move {
            let mut rows = 0u64;
            while Instant::now() < deadline {
                let body = lead_body();
                let id = leadrouter::domain::new_id();
                let statement = Statement::from_sql_and_values(
                    db.get_database_backend(),
                    sql,
                    [
                        id.clone().into(),
                        id.into(),
                        body.clone().into(),
                        body.into_bytes().into(),
                        chrono::Utc::now().to_rfc3339().into(),
                    ],
                );
                db.execute_raw(statement).await.unwrap();
                rows += 1;
            }
            rows
        })
    });
    let started = Instant::now();
    let mut total = 0;
    for task in futures_util::future::join_all(tasks).await {
        total += task.unwrap();
    }
    (total as f64 / started.elapsed().as_secs_f64(), connections)
}

async fn count_leads(url: &str) -> u64 {
    count_leads_where(url, "TRUE").await
}

async fn count_leads_where(url: &str, condition: &str) -> u64 {
    let db = Database::connect(url).await.unwrap();
    let row = db
        .query_one_raw(Statement::from_string(
            db.get_database_backend(),
            format!("SELECT COUNT(*) AS n FROM leads WHERE {condition}"),
        ))
        .await
        .unwrap()
        .unwrap();
    row.try_get::<i64>("", "n").unwrap() as u64
}

//! Intake benchmark: real HTTP load at `POST /v1/leads`, next to the raw
//! single-row insert rate of the same database measured in the same run.
//!
//! On PostgreSQL a last phase makes the database unreachable (no new
//! connections, the open ones terminated) while the load goes on: intake
//! answers from the spool; then the database comes back and the bench times
//! the drain and checks every acknowledged lead is stored once.
//!
//! `cargo bench --bench intake` — both databases. Environment:
//! `BENCH_DB` (`sqlite`, `postgres` or `both`), `BENCH_SECONDS` (10),
//! `BENCH_CLIENTS` (64), `BENCH_FIXED_RATE` (1000 leads/s).

#[path = "../tests/it/scratch_db.rs"]
mod scratch_db;
mod support;

use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::rt::System;
use leadrouter::config::{self, DatabaseSettings, Secret};
use leadrouter::startup::Application;
use leadrouter::store::Store;
use scratch_db::{Backend, TestDatabase};
use sea_orm::{ConnectionTrait, DbBackend, Statement};
use support::{closed_loop, env_u64, fixed_rate, lead_body};

const CONFIG: &str = r#"
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
    let raw = System::new().block_on(raw_insert_rate(backend, bench));
    println!("raw single-row inserts (autocommit, 8 connections): {raw:>8.0} rows/s");

    let database = System::new().block_on(TestDatabase::create(backend));
    let (port, server_handle, server) = start_server(&database.url);
    let url = format!("http://127.0.0.1:{port}/v1/leads?source=bench");
    let closed = System::new().block_on(closed_loop(&url, bench.clients, bench.seconds));
    println!(
        "intake, closed loop:        {:>8.0} leads/s  p50 {:>6.2} ms  p99 {:>6.2} ms  ({:.2}x the raw insert rate)",
        closed.rate,
        closed.p50_ms,
        closed.p99_ms,
        closed.rate / raw
    );
    let fixed = System::new().block_on(fixed_rate(
        &url,
        bench.clients,
        bench.fixed_rate,
        bench.seconds,
    ));
    println!(
        "intake at {} leads/s:       {:>8.0} leads/s  p50 {:>6.2} ms  p99 {:>6.2} ms",
        bench.fixed_rate, fixed.rate, fixed.p50_ms, fixed.p99_ms
    );
    let mut acknowledged = closed.acknowledged + fixed.acknowledged;
    if backend == Backend::Postgres {
        let spooled = System::new().block_on(spool_phase(&database.url, port, bench));
        println!(
            "intake, database unreachable (spool): {:>8.0} leads/s  p50 {:>6.2} ms  p99 {:>6.2} ms  ({:.2}x intake with the database)",
            spooled.rate,
            spooled.p50_ms,
            spooled.p99_ms,
            spooled.rate / closed.rate
        );
        acknowledged += spooled.acknowledged;
    }
    System::new().block_on(server_handle.stop(true));
    let _ = server.join();
    let stored = System::new().block_on(count_leads(&database.url));
    println!("acknowledged {acknowledged} leads, {stored} stored");
    assert_eq!(
        stored, acknowledged as u64,
        "every acknowledged lead is stored"
    );
}

/// Closed-loop load while PostgreSQL refuses the service, then the drain.
async fn spool_phase(url: &str, port: u16, bench: &Settings) -> support::LoadResult {
    let (server, name) = url.rsplit_once('/').unwrap();
    let admin = sea_orm::Database::connect(format!("{server}/postgres"))
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
    let intake = format!("http://127.0.0.1:{port}/v1/leads?source=bench");
    let spooled = closed_loop(&intake, bench.clients, bench.seconds).await;
    admin.execute_unprepared(&allow(true)).await.unwrap();
    let back = Instant::now();
    let status = format!("http://127.0.0.1:{port}/v1/status");
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

fn database_settings(url: &str) -> DatabaseSettings {
    DatabaseSettings {
        url: Secret::new(url),
        ..DatabaseSettings::default()
    }
}

/// The baseline: `clients` tasks doing one autocommit INSERT after another.
async fn raw_insert_rate(backend: Backend, bench: &Settings) -> f64 {
    let database = TestDatabase::create(backend).await;
    let store = Store::connect(&database_settings(&database.url))
        .await
        .unwrap();
    let db = store.connection().clone();
    db.execute_unprepared("CREATE TABLE bench_raw (id TEXT PRIMARY KEY, body TEXT NOT NULL)")
        .await
        .unwrap();
    let sql = match db.get_database_backend() {
        DbBackend::Postgres => "INSERT INTO bench_raw (id, body) VALUES ($1, $2)",
        _ => "INSERT INTO bench_raw (id, body) VALUES (?, ?)",
    };
    let deadline = Instant::now() + Duration::from_secs(bench.seconds);
    let tasks = (0..bench.clients).map(|_| {
        let db = db.clone();
        actix_web::rt::spawn(async move {
            let mut rows = 0u64;
            while Instant::now() < deadline {
                let statement = Statement::from_sql_and_values(
                    db.get_database_backend(),
                    sql,
                    [leadrouter::domain::new_id().into(), lead_body(rows).into()],
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
    total as f64 / started.elapsed().as_secs_f64()
}

fn start_server(database_url: &str) -> (u16, ServerHandle, std::thread::JoinHandle<()>) {
    let mut settings = config::parse(CONFIG, |_| None).unwrap();
    settings.database = database_settings(database_url);
    settings.server.listen = "127.0.0.1:0".into();
    settings.intake.spool_dir = std::env::temp_dir().join(format!(
        "leadrouter-bench-spool-{}",
        leadrouter::domain::new_id()
    ));
    let (ready, port) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        System::new().block_on(async move {
            let application = Application::build(settings).await.unwrap();
            ready
                .send((application.port(), application.handle()))
                .unwrap();
            let _ = application.run_until_stopped().await;
        })
    });
    let (port, handle) = port.recv().unwrap();
    (port, handle, server)
}

async fn count_leads(url: &str) -> u64 {
    use sea_orm::{EntityTrait, PaginatorTrait};
    let store = Store::connect(&database_settings(url)).await.unwrap();
    entity::lead::Entity::find()
        .count(store.connection())
        .await
        .unwrap()
}

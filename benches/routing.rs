//! Routing benchmark: leadrouter (`serve`, a child process) selling leads to
//! three `leadrouter mock-buyer` processes, against an intake-only run of
//! the same binary measured in the same run. Reports routed leads/s, the
//! server's CPU time per outbound call, and intake latency with healthy and
//! with hanging buyers; then the same buyers sold to by auction, against the
//! waterfall run (leads/s, median time from arrival to sale, calls per lead).
//!
//! `cargo bench --bench routing` — environment: `BENCH_DB` (`sqlite` or
//! `postgres`, default sqlite), `BENCH_LEADS` (2000), `BENCH_CLIENTS` (32).

#[path = "../tests/it/scratch_db.rs"]
mod scratch_db;
mod support;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use actix_web::rt::System;
use std::collections::HashMap;

use chrono::{DateTime, Utc};
use entity::{attempt, lead, sale};
use leadrouter::config::{DatabaseSettings, Secret};
use leadrouter::store::Store;
use scratch_db::{Backend, TestDatabase};
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use support::{client, env_u64, post_lead, summarize, LoadResult};

const BINARY: &str = env!("CARGO_BIN_EXE_leadrouter");

fn main() {
    let leads = env_u64("BENCH_LEADS", 2000);
    let clients = env_u64("BENCH_CLIENTS", 32) as usize;
    let backend = match std::env::var("BENCH_DB").as_deref() {
        Ok("postgres") => Backend::Postgres,
        _ => Backend::Sqlite,
    };
    println!("== routing on {backend:?}: {leads} leads, {clients} clients ==");

    let healthy = [
        mock_buyer(&["--accept-rate", "0.3", "--latency", "20ms"]),
        mock_buyer(&["--accept-rate", "0.5", "--latency", "20ms"]),
        mock_buyer(&["--accept-rate", "0.9", "--latency", "20ms"]),
    ];
    let hanging = [
        mock_buyer(&["--hang"]),
        mock_buyer(&["--hang"]),
        mock_buyer(&["--hang"]),
    ];

    let intake_only = run_phase(backend, "", "", leads, clients, false);
    println!(
        "intake only:      {:>7.0} leads/s acknowledged, p50 {:>5.2} ms, p99 {:>6.2} ms, server CPU {:>6.3} ms per lead",
        intake_only.load.rate, intake_only.load.p50_ms, intake_only.load.p99_ms, intake_only.cpu_ms / leads as f64
    );
    let routed = run_phase(backend, "", &buyers_toml(&healthy), leads, clients, true);
    let routing_cpu_ms = routed.cpu_ms - intake_only.cpu_ms;
    println!(
        "with 3 buyers:    {:>7.0} leads/s routed to a final state ({:.2}x the intake-only rate), {} outbound calls",
        routed.routed_rate,
        routed.routed_rate / intake_only.load.rate,
        routed.calls
    );
    println!(
        "                  server CPU {:>6.3} ms per outbound call (routing's share: total minus the intake-only run)",
        routing_cpu_ms / routed.calls.max(1) as f64
    );
    println!(
        "intake latency:   healthy buyers p50 {:>5.2} ms p99 {:>6.2} ms",
        routed.load.p50_ms, routed.load.p99_ms
    );
    let stalled = run_phase(backend, "", &buyers_toml(&hanging), leads, clients, false);
    println!(
        "                  hanging buyers p50 {:>5.2} ms p99 {:>6.2} ms ({:.2}x the healthy p99)",
        stalled.load.p50_ms,
        stalled.load.p99_ms,
        stalled.load.p99_ms / routed.load.p99_ms
    );
    let auction = run_phase(
        backend,
        "mode = \"auction\"\nauction_window = \"500ms\"",
        &buyers_toml(&healthy),
        leads,
        clients,
        true,
    );
    for (mode, phase) in [("waterfall", &routed), ("auction", &auction)] {
        println!(
            "{mode:<9}         {:>7.0} leads/s routed, median {:>6.1} ms from arrival to sale, {:>4.2} calls per lead, {} sold",
            phase.routed_rate,
            phase.median_to_sale_ms,
            phase.calls as f64 / leads as f64,
            phase.sold
        );
    }
    println!(
        "auction / waterfall: {:.2}x leads/s, {:.2}x median time to sale, {:.2}x calls per lead",
        auction.routed_rate / routed.routed_rate,
        auction.median_to_sale_ms / routed.median_to_sale_ms,
        auction.calls as f64 / routed.calls.max(1) as f64
    );
}

struct MockBuyer {
    base: String,
    child: Child,
}

impl Drop for MockBuyer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

fn mock_buyer(args: &[&str]) -> MockBuyer {
    let address = free_address();
    let child = Command::new(BINARY)
        .args(["mock-buyer", "--listen", &address])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_port(&address);
    MockBuyer {
        base: format!("http://{address}"),
        child,
    }
}

fn wait_for_port(address: &str) {
    let started = Instant::now();
    while std::net::TcpStream::connect(address).is_err() {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{address} never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn buyers_toml(buyers: &[MockBuyer; 3]) -> String {
    buyers
        .iter()
        .enumerate()
        .map(|(index, buyer)| {
            format!(
                "[[buyers]]\nid = \"b{index}\"\npriority = {index}\nmax_concurrency = 64\n\
                 [buyers.ping]\nurl = \"{base}/ping\"\naccept = {{ path = \"/response\", equals = \"success\" }}\nbid_path = \"/bid\"\nping_id_path = \"/leadAuctionId\"\n\
                 [buyers.post]\nurl = \"{base}/post\"\naccept = {{ path = \"/response\", equals = \"success\" }}\nprice_path = \"/price\"\n",
                base = buyer.base
            )
        })
        .collect()
}

struct Phase {
    load: LoadResult,
    routed_rate: f64,
    calls: u64,
    cpu_ms: f64,
    sold: u64,
    median_to_sale_ms: f64,
}

/// What a routed run ended as.
#[derive(Default)]
struct Routed {
    rate: f64,
    calls: u64,
    sold: u64,
    median_to_sale_ms: f64,
}

/// Runs `serve` on a fresh database, submits `leads`, and (if `wait`) waits
/// until every lead is final. CPU is the server process's user + system time.
fn run_phase(
    backend: Backend,
    routing: &str,
    buyers: &str,
    leads: u64,
    clients: usize,
    wait: bool,
) -> Phase {
    let database = System::new().block_on(TestDatabase::create(backend));
    let dir = tempfile::tempdir().unwrap();
    let address = free_address();
    let config = dir.path().join("leadrouter.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nlisten = \"{address}\"\n[database]\nurl = \"{url}\"\n[routing]\nsweep_interval = \"1s\"\n{routing}\n\
             [[sources]]\nid = \"bench\"\nkind = \"form\"\nrequired = [\"email\"]\n{buyers}",
            url = database.url
        ),
    )
    .unwrap();
    let mut server = Command::new(BINARY)
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_port(&address);
    let cpu_before = cpu_ms(server.id());
    let url = format!("http://{address}/v1/leads?source=bench");
    let started = Instant::now();
    let load = System::new().block_on(submit(&url, leads, clients));
    let routed = if wait {
        System::new().block_on(wait_until_final(&database.url, started))
    } else {
        Routed::default()
    };
    let cpu_ms = cpu_ms(server.id()) - cpu_before;
    let _ = server.kill();
    let _ = server.wait();
    Phase {
        load,
        routed_rate: routed.rate,
        calls: routed.calls,
        cpu_ms,
        sold: routed.sold,
        median_to_sale_ms: routed.median_to_sale_ms,
    }
}

/// Submits `total` leads over `clients` connections.
async fn submit(url: &str, total: u64, clients: usize) -> LoadResult {
    let client = client(clients);
    let next = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let latencies = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let started = Instant::now();
    let workers = (0..clients).map(|_| {
        let (client, url, next, latencies) = (
            client.clone(),
            url.to_string(),
            next.clone(),
            latencies.clone(),
        );
        async move {
            loop {
                let n = next.get();
                if n >= total {
                    break;
                }
                next.set(n + 1);
                if let Some(latency) = post_lead(&client, &url, n).await {
                    latencies.borrow_mut().push(latency);
                }
            }
        }
    });
    futures_util::future::join_all(workers).await;
    summarize(latencies.take(), started.elapsed())
}

async fn wait_until_final(url: &str, started: Instant) -> Routed {
    let store = Store::connect(&DatabaseSettings {
        url: Secret::new(url),
        ..DatabaseSettings::default()
    })
    .await
    .unwrap();
    let db = store.connection();
    loop {
        let waiting = lead::Entity::find()
            .filter(lead::Column::State.is_in(["received", "routing"]))
            .count(db)
            .await
            .unwrap();
        if waiting == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "{waiting} leads never finished"
        );
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    let elapsed = started.elapsed();
    let total = lead::Entity::find().count(db).await.unwrap();
    let calls = attempt::Entity::find()
        .filter(attempt::Column::Kind.is_in(["ping", "post"]))
        .count(db)
        .await
        .unwrap();
    let arrived: HashMap<String, DateTime<Utc>> = lead::Entity::find()
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .map(|lead| (lead.id, lead.received_at))
        .collect();
    let mut to_sale: Vec<f64> = sale::Entity::find()
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|sale| {
            let arrived = arrived.get(&sale.lead_id)?;
            Some((sale.sold_at - *arrived).num_microseconds()? as f64 / 1000.0)
        })
        .collect();
    to_sale.sort_by(f64::total_cmp);
    Routed {
        rate: total as f64 / elapsed.as_secs_f64(),
        calls,
        sold: to_sale.len() as u64,
        median_to_sale_ms: to_sale.get(to_sale.len() / 2).copied().unwrap_or(f64::NAN),
    }
}

/// User + system CPU time of a process, from /proc (clock ticks of 10 ms).
fn cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default();
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // After the name: state is field 0, utime field 11, stime field 12.
    (ticks(11) + ticks(12)) * 10.0
}

//! Backlog benchmark: `BENCH_LEADS` (100,000) leads stored by `leadrouter
//! serve` while every buyer is down (nothing listens at their addresses),
//! the service's resident memory sampled throughout; then the buyers come
//! up, their circuits close, and the bench times the drain of the backlog.
//! Next to it, the routed rate of a fresh run (the same buyers up from the
//! start, `BENCH_FRESH_LEADS` leads) measured in the same run; and how long
//! a fresh read of the status figures takes with the backlog stored, next
//! to the same read on the empty database.
//!
//! `cargo bench --bench backlog` — environment: `BENCH_DB` (`sqlite` or
//! `postgres`, default sqlite), `BENCH_LEADS` (100000), `BENCH_FRESH_LEADS`
//! (10000), `BENCH_CLIENTS` (32).

#[path = "../tests/it/scratch_db.rs"]
mod scratch_db;
mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::rt::System;
use scratch_db::{Backend, TestDatabase};
use serde_json::Value;
use support::{buyers_toml, env_u64, free_address, mock_buyer_at, serve, submit_count, Process};

/// Buyers' circuits: open after 5 failures, probe again after a second.
const CIRCUIT: &str =
    "[buyers.circuit]\nfailure_threshold = 5\nopen_for = \"1s\"\nmax_open_for = \"2s\"";
const SOURCE: &str = "[[sources]]\nid = \"bench\"\nkind = \"form\"\nrequired = [\"email\"]\n";
/// The mock buyers' behaviour once they are up.
const BUYERS: [&[&str]; 3] = [
    &["--accept-rate", "0.3", "--latency", "20ms"],
    &["--accept-rate", "0.5", "--latency", "20ms"],
    &["--accept-rate", "0.9", "--latency", "20ms"],
];

fn main() {
    let leads = env_u64("BENCH_LEADS", 100_000);
    let fresh_leads = env_u64("BENCH_FRESH_LEADS", 10_000);
    let clients = env_u64("BENCH_CLIENTS", 32) as usize;
    let backend = match std::env::var("BENCH_DB").as_deref() {
        Ok("postgres") => Backend::Postgres,
        _ => Backend::Sqlite,
    };
    println!(
        "== backlog on {backend:?}: {leads} leads while every buyer is down, {clients} clients =="
    );

    let fresh = fresh_run(backend, fresh_leads, clients);
    println!(
        "fresh run:   {fresh_leads} leads routed to a final state at {fresh:>6.0} leads/s (buyers up from the start)"
    );

    let addresses: Vec<String> = (0..3).map(|_| free_address()).collect();
    let bases: Vec<String> = addresses.iter().map(|a| format!("http://{a}")).collect();
    let (_database, _dir, service) = start_service(backend, &bases);
    let status = format!("{}/v1/status", service.base());
    let empty_read_ms = System::new().block_on(figures_read_ms(&status));
    let memory = RssSampler::start(service.pid());
    let idle_mib = service.rss_mib();
    let url = format!("{}/v1/leads?source=bench", service.base());
    let started = Instant::now();
    let load = System::new().block_on(submit_count(&url, leads, clients));
    println!(
        "outage:      {} leads acknowledged in {:.1} s ({:.0} leads/s), {}",
        load.acknowledged,
        started.elapsed().as_secs_f64(),
        load.rate,
        load.tally()
    );
    System::new().block_on(wait_for(&status, "every lead walked to unsold", |status| {
        waiting(status) == 0 && count(status, "unsold") == load.acknowledged as u64
    }));
    println!(
        "             every lead unsold after {:.1} s; RSS idle {idle_mib:.0} MiB, peak so far {:.0} MiB",
        started.elapsed().as_secs_f64(),
        memory.peak_mib(0)
    );

    let stored_read_ms = System::new().block_on(figures_read_ms(&status));
    println!(
        "status:      a fresh read of the figures /v1/status shows takes {stored_read_ms:.1} ms with {} leads stored, {empty_read_ms:.1} ms with none ({:.1}x)",
        load.acknowledged,
        stored_read_ms / empty_read_ms
    );

    let back = Instant::now();
    let buyers: Vec<Process> = addresses
        .into_iter()
        .zip(BUYERS)
        .map(|(address, args)| mock_buyer_at(address, args))
        .collect();
    System::new().block_on(wait_for(&status, "the backlog drained", |status| {
        let closed = status["buyers"]
            .as_array()
            .is_some_and(|buyers| buyers.iter().all(|buyer| buyer["circuit"] == "closed"));
        closed && waiting(status) == 0 && count(status, "sold") > 0
    }));
    let drained = back.elapsed().as_secs_f64();
    let final_status = System::new().block_on(read_status(&status));
    println!(
        "drain:       {} leads in {drained:.1} s = {:>6.0} leads/s ({:.2}x the fresh run), {} sold, {} unsold",
        load.acknowledged,
        load.acknowledged as f64 / drained,
        load.acknowledged as f64 / drained / fresh,
        count(&final_status, "sold"),
        count(&final_status, "unsold")
    );
    println!(
        "memory:      peak RSS {:.0} MiB over the whole run ({} samples), {:.0} MiB at the end; its parts' peaks: the service's own memory {:.0} MiB, mapped files {:.0} MiB",
        memory.peak_mib(0),
        memory.samples(),
        service.rss_mib(),
        memory.peak_mib(1),
        memory.peak_mib(2)
    );
    drop(buyers);
}

/// Routed leads/s with the buyers up from the start.
fn fresh_run(backend: Backend, leads: u64, clients: usize) -> f64 {
    let addresses: Vec<String> = (0..3).map(|_| free_address()).collect();
    let buyers: Vec<Process> = addresses
        .iter()
        .cloned()
        .zip(BUYERS)
        .map(|(address, args)| mock_buyer_at(address, args))
        .collect();
    let bases: Vec<String> = buyers.iter().map(Process::base).collect();
    let (_database, _dir, service) = start_service(backend, &bases);
    let url = format!("{}/v1/leads?source=bench", service.base());
    let status = format!("{}/v1/status", service.base());
    let started = Instant::now();
    System::new().block_on(async {
        let load = submit_count(&url, leads, clients).await;
        wait_for(&status, "the fresh leads final", |status| {
            waiting(status) == 0 && final_count(status) == load.acknowledged as u64
        })
        .await;
    });
    leads as f64 / started.elapsed().as_secs_f64()
}

/// `serve` on a fresh database selling to the buyers at `bases` (the
/// database and the configuration's directory live as long as it runs).
fn start_service(backend: Backend, bases: &[String]) -> (TestDatabase, tempfile::TempDir, Process) {
    let database = System::new().block_on(TestDatabase::create(backend));
    let dir = tempfile::tempdir().unwrap();
    let service = serve(
        dir.path(),
        &database.url,
        &format!("{SOURCE}{}", buyers_toml(bases, CIRCUIT)),
    );
    (database, dir, service)
}

/// Leads still to be routed: `received` and `routing`.
fn waiting(status: &Value) -> u64 {
    count(status, "received") + count(status, "routing")
}

fn final_count(status: &Value) -> u64 {
    ["sold", "unsold", "unknown"]
        .iter()
        .map(|state| count(status, state))
        .sum()
}

fn count(status: &Value, state: &str) -> u64 {
    status["leads"][state].as_u64().unwrap_or(0)
}

async fn read_status(url: &str) -> Value {
    let mut response = awc::Client::default().get(url).send().await.unwrap();
    response.json::<Value>().limit(1 << 20).await.unwrap()
}

/// How long a `/v1/status` request takes when it reads the figures afresh
/// (its `counted_at` is new; the others are answered from the cache): the
/// median of three such reads, in ms.
async fn figures_read_ms(url: &str) -> f64 {
    let client = awc::Client::default();
    let mut last_counted = None;
    let mut fresh = Vec::new();
    while fresh.len() < 3 {
        let started = Instant::now();
        let mut response = client.get(url).send().await.unwrap();
        let status: Value = response.json().limit(1 << 20).await.unwrap();
        let took = started.elapsed().as_secs_f64() * 1000.0;
        let counted = status["counted_at"].as_str().map(str::to_string);
        if last_counted.is_some() && counted != last_counted {
            fresh.push(took);
        }
        last_counted = counted;
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    fresh.sort_by(f64::total_cmp);
    fresh[1]
}

/// Polls `/v1/status` every half second until `done` holds for two reads
/// whose counts were taken (`counted_at`) a second or more apart: a
/// requeue may land between two counts, and under a backlog the service
/// shows one count for longer than a second.
async fn wait_for(url: &str, what: &str, done: impl Fn(&Value) -> bool) {
    let started = Instant::now();
    let mut held_since: Option<chrono::DateTime<chrono::Utc>> = None;
    loop {
        let status = read_status(url).await;
        let counted_at = status["counted_at"]
            .as_str()
            .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
            .map(|at| at.to_utc());
        match (done(&status).then_some(counted_at).flatten(), held_since) {
            (Some(at), Some(since)) if at - since >= chrono::Duration::seconds(1) => return,
            (Some(at), None) => held_since = Some(at),
            (Some(_), Some(_)) => {}
            (None, _) => held_since = None,
        }
        assert!(
            started.elapsed() < Duration::from_secs(1800),
            "{what}: not after 30 minutes: {status}"
        );
        actix_web::rt::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What a sampler reads: the whole resident set, then its two parts.
const RESIDENT: [&str; 3] = ["VmRSS", "RssAnon", "RssFile"];

/// Samples a process's resident memory (each of [`RESIDENT`]) every 100
/// ms on a thread of its own, keeping each one's peak.
struct RssSampler {
    peak_kib: Arc<[std::sync::atomic::AtomicU64; 3]>,
    samples: Arc<std::sync::atomic::AtomicU64>,
    running: Arc<AtomicBool>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let sampler = Self {
            peak_kib: Arc::default(),
            samples: Arc::default(),
            running: Arc::new(AtomicBool::new(true)),
        };
        let (peak, samples, running) = (
            sampler.peak_kib.clone(),
            sampler.samples.clone(),
            sampler.running.clone(),
        );
        std::thread::spawn(move || {
            while running.load(Ordering::Relaxed) {
                for (field, peak) in RESIDENT.iter().zip(peak.iter()) {
                    let kib = (support::resident_mib_of(pid, field) * 1024.0) as u64;
                    peak.fetch_max(kib, Ordering::Relaxed);
                }
                samples.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        sampler
    }

    /// The peak of `RESIDENT[part]` (MiB).
    fn peak_mib(&self, part: usize) -> f64 {
        self.peak_kib[part].load(Ordering::Relaxed) as f64 / 1024.0
    }

    fn samples(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.running.store(false, Ordering::Relaxed);
    }
}

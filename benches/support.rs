//! Load helpers shared by the benchmarks: an HTTP client, lead bodies,
//! closed-loop and fixed-rate load, and latency percentiles. Each benchmark
//! uses a part of them.
#![allow(dead_code)]

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

pub struct LoadResult {
    pub rate: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub acknowledged: usize,
}

pub fn client(clients: usize) -> awc::Client {
    awc::Client::builder()
        .connector(awc::Connector::new().limit(clients * 2))
        .timeout(Duration::from_secs(30))
        .finish()
}

pub fn lead_body(n: u64) -> String {
    let id = leadrouter::domain::new_id();
    format!(
        r#"{{"email":"bench-{id}@example.com","phone":"555{:07}","first_name":"Bench","state":"CA","utm_source":"bench","consent_text":"I agree to be contacted."}}"#,
        n % 10_000_000
    )
}

pub async fn post_lead(client: &awc::Client, url: &str, n: u64) -> Option<Duration> {
    let started = Instant::now();
    let response = client
        .post(url)
        .insert_header(("Content-Type", "application/json"))
        .send_body(lead_body(n))
        .await
        .ok()?;
    // 200 accepted, 202 pending (e.g. held in the spool): both acknowledged.
    matches!(response.status().as_u16(), 200 | 202).then(|| started.elapsed())
}

/// `clients` connections sending one lead after another, as fast as answered.
pub async fn closed_loop(url: &str, clients: usize, seconds: u64) -> LoadResult {
    let client = client(clients);
    let latencies = Rc::new(RefCell::new(Vec::new()));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let tasks = (0..clients).map(|worker| {
        let (client, url, latencies) = (client.clone(), url.to_string(), latencies.clone());
        async move {
            let mut n = worker as u64 * 1_000_000;
            while Instant::now() < deadline {
                if let Some(latency) = post_lead(&client, &url, n).await {
                    latencies.borrow_mut().push(latency);
                }
                n += 1;
            }
        }
    });
    futures_util::future::join_all(tasks).await;
    summarize(latencies.take(), started.elapsed())
}

/// An open loop: one lead every 1/`fixed_rate` s, whatever the answers do.
pub async fn fixed_rate(url: &str, clients: usize, per_second: u64, seconds: u64) -> LoadResult {
    let client = client(clients);
    let latencies = Rc::new(RefCell::new(Vec::new()));
    let total = per_second * seconds;
    let interval = Duration::from_secs_f64(1.0 / per_second as f64);
    let started = Instant::now();
    let mut requests = Vec::with_capacity(total as usize);
    for n in 0..total {
        let due = started + interval * n as u32;
        actix_web::rt::time::sleep_until(due.into()).await;
        let (client, url, latencies) = (client.clone(), url.to_string(), latencies.clone());
        requests.push(actix_web::rt::spawn(async move {
            if let Some(latency) = post_lead(&client, &url, 50_000_000 + n).await {
                latencies.borrow_mut().push(latency);
            }
        }));
    }
    futures_util::future::join_all(requests).await;
    summarize(latencies.take(), started.elapsed())
}

pub fn summarize(mut latencies: Vec<Duration>, elapsed: Duration) -> LoadResult {
    latencies.sort();
    let percentile = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    LoadResult {
        rate: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50_ms: percentile(0.50),
        p99_ms: percentile(0.99),
        acknowledged: latencies.len(),
    }
}

/// A number from the environment, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

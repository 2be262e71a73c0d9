//! Rate-limiter benchmark: the time of 10,000 `admit` calls from addresses
//! not seen before, once 10,000, 100,000 and 1,000,000 addresses have been
//! seen, as ratios against the first; with the buckets held and the
//! process's own memory (`RssAnon`) at each step. No database, no HTTP: the
//! limiter alone, as each intake request calls it.
//!
//! `cargo bench --bench rate_limit`. Environment: `BENCH_REQUESTS` (10000,
//! the calls timed per step), `BENCH_ROUNDS` (5, timed runs per step; the
//! median is reported; each run on a fresh limiter), `BENCH_CAPACITY`
//! (100000, the addresses the limiter holds: a table small enough for the
//! CPU's cache shows what eviction itself costs).

mod support;

use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;
use std::time::{Duration, Instant};

use leadrouter::config::{RateLimitSettings, SourceKind, SourceSettings};
use leadrouter::rate_limit::{RateLimiter, MAX_ADDRESSES};
use support::{env_u64, resident_mib_of};

/// Addresses seen before each step is timed.
const STEPS: [u32; 3] = [10_000, 100_000, 1_000_000];

fn main() {
    let requests = env_u64("BENCH_REQUESTS", 10_000) as u32;
    let rounds = env_u64("BENCH_ROUNDS", 5) as usize;
    let capacity = env_u64("BENCH_CAPACITY", MAX_ADDRESSES as u64) as usize;
    let source = web_source();
    println!(
        "rate limiter: {requests} admit() calls from new addresses, median of {rounds} fresh limiters"
    );
    let mut baseline = None;
    for seen in STEPS {
        let mut times = Vec::with_capacity(rounds);
        let mut held = (0, 0, 0.0);
        for _ in 0..rounds {
            let limiter = RateLimiter::with_capacity(capacity);
            admit_new(&limiter, &source, 0..seen);
            let started = Instant::now();
            admit_new(&limiter, &source, seen..seen + requests);
            times.push(started.elapsed());
            held = (
                limiter.addresses(),
                limiter.capacity(),
                resident_mib_of(std::process::id(), "RssAnon"),
            );
        }
        times.sort();
        let median = times[rounds / 2];
        let baseline = *baseline.get_or_insert(median);
        let (addresses, bound, rss_mib) = held;
        println!(
            "{seen:>9} addresses seen: {:>9.2} ms ({:.2}x), buckets held {addresses} of at most {bound}, RssAnon {rss_mib:.1} MiB",
            ms(median),
            median.as_secs_f64() / baseline.as_secs_f64(),
        );
    }
}

/// One `admit` from each address numbered in `addresses`; each is new, so
/// each is admitted.
fn admit_new(limiter: &RateLimiter, source: &SourceSettings, addresses: Range<u32>) {
    for n in addresses {
        let ip = IpAddr::from(Ipv4Addr::from(n));
        assert!(limiter.admit(source, Some(ip)).is_ok());
    }
}

fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// A form source limited per address, as `sources.rate_limit` gives it.
fn web_source() -> SourceSettings {
    SourceSettings {
        id: "web".into(),
        kind: SourceKind::Form,
        api_key: None,
        external_id: None,
        required: vec![],
        thank_you_url: String::new(),
        allowed_origins: Vec::new(),
        rate_limit: Some(RateLimitSettings {
            per_ip: Some("30/min".parse().unwrap()),
            total: None,
        }),
        payout: None,
        payout_share: None,
        fields: None,
    }
}

//! Token buckets for `sources.rate_limit`: one per source (`total`) and one
//! per source and client IP (`per_ip`), held in a `DashMap`.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use dashmap::DashMap;

use crate::config::{Rate, SourceSettings};

/// Past this many buckets, idle ones are dropped so memory stays bounded.
const MAX_BUCKETS: usize = 100_000;
const IDLE_BUCKET: Duration = Duration::from_secs(3600);

#[derive(Debug, Default)]
pub struct RateLimiter {
    buckets: DashMap<(String, Option<IpAddr>), Bucket>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

impl RateLimiter {
    /// Takes a token from each bucket that applies, or says how long to wait.
    pub fn admit(&self, source: &SourceSettings, ip: Option<IpAddr>) -> Result<(), Duration> {
        let Some(limits) = &source.rate_limit else {
            return Ok(());
        };
        let now = Instant::now();
        if self.buckets.len() > MAX_BUCKETS {
            self.buckets
                .retain(|_, bucket| now.duration_since(bucket.updated) < IDLE_BUCKET);
        }
        let mut checks = Vec::with_capacity(2);
        if let Some(rate) = limits.total {
            checks.push(((source.id.clone(), None), rate));
        }
        if let (Some(rate), Some(ip)) = (limits.per_ip, ip) {
            checks.push(((source.id.clone(), Some(ip)), rate));
        }
        let mut wait = Duration::ZERO;
        for (key, rate) in &checks {
            let mut bucket = self.buckets.entry(key.clone()).or_insert(Bucket {
                tokens: f64::from(rate.count),
                updated: now,
            });
            refill(&mut bucket, *rate, now);
            if bucket.tokens < 1.0 {
                wait = wait.max(time_for_one_token(bucket.tokens, *rate));
            }
        }
        if wait > Duration::ZERO {
            return Err(wait);
        }
        for (key, _) in checks {
            if let Some(mut bucket) = self.buckets.get_mut(&key) {
                bucket.tokens -= 1.0;
            }
        }
        Ok(())
    }
}

fn refill(bucket: &mut Bucket, rate: Rate, now: Instant) {
    let per_second = f64::from(rate.count) / rate.per.as_secs_f64();
    let elapsed = now.duration_since(bucket.updated).as_secs_f64();
    bucket.tokens = (bucket.tokens + elapsed * per_second).min(f64::from(rate.count));
    bucket.updated = now;
}

fn time_for_one_token(tokens: f64, rate: Rate) -> Duration {
    let per_second = f64::from(rate.count) / rate.per.as_secs_f64();
    Duration::from_secs_f64(((1.0 - tokens) / per_second).max(0.001))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RateLimitSettings, SourceKind};

    #[test]
    fn a_source_gets_its_burst_then_is_told_to_wait() {
        let source = SourceSettings {
            id: "web".into(),
            kind: SourceKind::Form,
            api_key: None,
            external_id: None,
            required: vec![],
            thank_you_url: String::new(),
            allowed_origins: Vec::new(),
            rate_limit: Some(RateLimitSettings {
                per_ip: Some("2/min".parse().unwrap()),
                total: None,
            }),
            payout: None,
            payout_share: None,
            fields: None,
        };
        let limiter = RateLimiter::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(limiter.admit(&source, Some(ip)).is_ok());
        assert!(limiter.admit(&source, Some(ip)).is_ok());
        let wait = limiter.admit(&source, Some(ip)).unwrap_err();
        assert!(
            wait > Duration::from_secs(20) && wait <= Duration::from_secs(30),
            "{wait:?}"
        );
        assert!(limiter.admit(&source, Some(other)).is_ok());
    }
}

//! Token buckets for `sources.rate_limit`: one per source (`total`) and one
//! per source and client IP (`per_ip`). The per-IP buckets live in a fixed
//! number of shards, each an LRU table of fixed capacity, so a request costs
//! the same whatever the number of addresses seen, and memory is bounded:
//! a new address takes the place of its shard's least recently seen one.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use hashlink::LruCache;

use crate::config::{Rate, SourceSettings};

/// At most this many (source, address) buckets are held at once.
pub const MAX_ADDRESSES: usize = 100_000;
/// Shards of the address table: requests of different addresses rarely
/// wait for one another.
const SHARDS: usize = 64;

/// The buckets of every source and of the addresses that sent to it.
pub struct RateLimiter {
    /// By source id (sources come from the configuration, never from a
    /// request): its `total` bucket and the number its addresses are filed
    /// under.
    sources: DashMap<String, SourceBuckets>,
    next_source: AtomicU32,
    addresses: Box<[Mutex<LruCache<AddressKey, Bucket>>]>,
    /// Picks an address's shard; seeded per process, so a sender cannot aim
    /// a flood at the shard of one address.
    shard_of: RandomState,
}

/// A source's number and an address that sent to it.
type AddressKey = (u32, IpAddr);

struct SourceBuckets {
    number: u32,
    total: Option<Bucket>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::with_capacity(MAX_ADDRESSES)
    }
}

impl RateLimiter {
    /// A limiter holding at most `addresses` per-IP buckets (rounded down to
    /// a multiple of the shard count, at least one per shard).
    pub fn with_capacity(addresses: usize) -> Self {
        let per_shard = (addresses / SHARDS).max(1);
        Self {
            sources: DashMap::new(),
            next_source: AtomicU32::new(0),
            addresses: (0..SHARDS)
                .map(|_| Mutex::new(LruCache::new(per_shard)))
                .collect(),
            shard_of: RandomState::new(),
        }
    }

    /// The most per-IP buckets this limiter holds.
    pub fn capacity(&self) -> usize {
        self.addresses
            .iter()
            .map(|shard| lock(shard).capacity())
            .sum()
    }

    /// The per-IP buckets held now.
    pub fn addresses(&self) -> usize {
        self.addresses.iter().map(|shard| lock(shard).len()).sum()
    }

    /// Takes a token from each bucket that applies, or says how long to wait.
    /// A request over its source's `total` is refused before anything is
    /// kept for its address.
    pub fn admit(&self, source: &SourceSettings, ip: Option<IpAddr>) -> Result<(), Duration> {
        let Some(limits) = &source.rate_limit else {
            return Ok(());
        };
        let now = Instant::now();
        let mut buckets = match self.sources.get_mut(source.id.as_str()) {
            Some(buckets) => buckets,
            None => self
                .sources
                .entry(source.id.clone())
                .or_insert_with(|| SourceBuckets {
                    number: self.next_source.fetch_add(1, Ordering::Relaxed),
                    total: None,
                }),
        };
        let per_ip = (limits.per_ip.zip(ip)).map(|(rate, ip)| ((buckets.number, ip), rate));
        let Some(total_rate) = limits.total else {
            drop(buckets);
            return per_ip.map_or(Ok(()), |(key, rate)| self.take_from_address(key, rate, now));
        };
        let total = buckets
            .total
            .get_or_insert_with(|| Bucket::full(total_rate, now));
        total.refill(total_rate, now);
        if total.tokens < 1.0 {
            // Say the longer wait of the two, without keeping anything.
            let address_wait = per_ip.map_or(Duration::ZERO, |(key, rate)| {
                self.address_wait(&key, rate, now)
            });
            return Err(total.wait(total_rate).max(address_wait));
        }
        if let Some((key, rate)) = per_ip {
            self.take_from_address(key, rate, now)?;
        }
        total.tokens -= 1.0;
        Ok(())
    }

    /// Takes a token from the address's bucket; a new address gets a full
    /// bucket in place of its shard's least recently seen one.
    fn take_from_address(&self, key: AddressKey, rate: Rate, now: Instant) -> Result<(), Duration> {
        let mut shard = lock(self.shard(&key));
        if let Some(bucket) = shard.get_mut(&key) {
            bucket.refill(rate, now);
            if bucket.tokens < 1.0 {
                return Err(bucket.wait(rate));
            }
            bucket.tokens -= 1.0;
            return Ok(());
        }
        if shard.len() == shard.capacity() {
            shard.remove_lru();
        }
        let mut bucket = Bucket::full(rate, now);
        bucket.tokens -= 1.0;
        shard.insert(key, bucket);
        Ok(())
    }

    /// How long the address must wait for a token, looked up only.
    fn address_wait(&self, key: &AddressKey, rate: Rate, now: Instant) -> Duration {
        let shard = lock(self.shard(key));
        shard.peek(key).map_or(Duration::ZERO, |held| {
            let mut held = *held;
            held.refill(rate, now);
            held.wait(rate)
        })
    }

    fn shard(&self, key: &AddressKey) -> &Mutex<LruCache<AddressKey, Bucket>> {
        let hash = self.shard_of.hash_one(key);
        &self.addresses[(hash % SHARDS as u64) as usize]
    }
}

/// A shard's table; a panic while it was held cannot leave a bucket half
/// written (each update is one assignment), so a poisoned lock is used as is.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Bucket {
    fn full(rate: Rate, now: Instant) -> Self {
        Self {
            tokens: f64::from(rate.count),
            updated: now,
        }
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_second(rate)).min(f64::from(rate.count));
        self.updated = now;
    }

    /// How long until this bucket holds one token (zero if it does).
    fn wait(&self, rate: Rate) -> Duration {
        if self.tokens >= 1.0 {
            return Duration::ZERO;
        }
        Duration::from_secs_f64(((1.0 - self.tokens) / per_second(rate)).max(0.001))
    }
}

fn per_second(rate: Rate) -> f64 {
    f64::from(rate.count) / rate.per.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RateLimitSettings, SourceKind};

    fn source(per_ip: Option<&str>, total: Option<&str>) -> SourceSettings {
        SourceSettings {
            id: "web".into(),
            kind: SourceKind::Form,
            api_key: None,
            external_id: None,
            required: vec![],
            thank_you_url: String::new(),
            allowed_origins: Vec::new(),
            rate_limit: Some(RateLimitSettings {
                per_ip: per_ip.map(|rate| rate.parse().unwrap()),
                total: total.map(|rate| rate.parse().unwrap()),
            }),
            payout: None,
            payout_share: None,
            fields: None,
        }
    }

    /// The `n`th address of 10.0.0.0/8.
    fn address(n: u32) -> IpAddr {
        std::net::Ipv4Addr::from(0x0a00_0000 + n).into()
    }

    #[test]
    fn a_source_gets_its_burst_then_is_told_to_wait() {
        let source = source(Some("2/min"), None);
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

    #[test]
    fn a_request_over_the_sources_total_keeps_no_bucket_for_its_address() {
        let source = source(Some("10/min"), Some("2/min"));
        let limiter = RateLimiter::default();
        assert!(limiter.admit(&source, Some(address(1))).is_ok());
        assert!(limiter.admit(&source, Some(address(2))).is_ok());
        assert_eq!(limiter.addresses(), 2);
        for n in 3..1_003 {
            let wait = limiter.admit(&source, Some(address(n))).unwrap_err();
            assert!(wait > Duration::from_secs(20), "{wait:?}");
        }
        assert_eq!(limiter.addresses(), 2, "refused requests kept nothing");
    }

    #[test]
    fn over_both_limits_the_longer_wait_is_said() {
        let source = source(Some("1/h"), Some("2/min"));
        let limiter = RateLimiter::default();
        assert!(limiter.admit(&source, Some(address(1))).is_ok());
        assert!(limiter.admit(&source, Some(address(2))).is_ok());
        let wait = limiter.admit(&source, Some(address(1))).unwrap_err();
        assert!(wait > Duration::from_secs(3000), "{wait:?}");
    }

    #[test]
    fn a_flood_of_new_addresses_stays_within_the_capacity_and_a_busy_address_keeps_its_limit() {
        let source = source(Some("2/min"), None);
        let limiter = RateLimiter::with_capacity(SHARDS * 16);
        let busy = address(0);
        assert!(limiter.admit(&source, Some(busy)).is_ok());
        assert!(limiter.admit(&source, Some(busy)).is_ok());
        for n in 1..=20_000 {
            assert!(
                limiter.admit(&source, Some(address(n))).is_ok(),
                "a new address is admitted"
            );
            if n % 10 == 0 {
                // Fewer than a shard's 16 addresses arrive between two of
                // these: the busy address is never the least recently seen.
                assert!(limiter.admit(&source, Some(busy)).is_err());
            }
        }
        assert_eq!(limiter.capacity(), SHARDS * 16);
        assert!(
            limiter.addresses() <= limiter.capacity(),
            "{} buckets",
            limiter.addresses()
        );
    }
}

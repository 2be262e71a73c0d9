//! Recent call latencies of one buyer, for the status page's p50 and p95:
//! the last `WINDOW` pings and posts, kept by the buyer's actor.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Serialize;

use crate::domain::CallKind;

/// Calls of each kind the percentiles are taken over.
const WINDOW: usize = 200;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Percentiles {
    pub p50_ms: u64,
    pub p95_ms: u64,
}

#[derive(Debug, Default)]
pub struct Latencies {
    ping: VecDeque<u64>,
    post: VecDeque<u64>,
}

impl Latencies {
    pub fn record(&mut self, kind: CallKind, took: Duration) {
        let window = match kind {
            CallKind::Ping => &mut self.ping,
            CallKind::Post => &mut self.post,
        };
        if window.len() == WINDOW {
            window.pop_front();
        }
        window.push_back(took.as_millis() as u64);
    }

    /// p50 and p95 of the recent calls of `kind`; `None` before any.
    pub fn percentiles(&self, kind: CallKind) -> Option<Percentiles> {
        let window = match kind {
            CallKind::Ping => &self.ping,
            CallKind::Post => &self.post,
        };
        if window.is_empty() {
            return None;
        }
        let mut sorted: Vec<u64> = window.iter().copied().collect();
        sorted.sort_unstable();
        let at = |share: f64| sorted[((sorted.len() - 1) as f64 * share).round() as usize];
        Some(Percentiles {
            p50_ms: at(0.5),
            p95_ms: at(0.95),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_cover_the_recent_window_only() {
        let mut latencies = Latencies::default();
        assert_eq!(latencies.percentiles(CallKind::Post), None);
        for ms in 1..=100 {
            latencies.record(CallKind::Post, Duration::from_millis(ms));
        }
        let post = latencies.percentiles(CallKind::Post).unwrap();
        assert_eq!((post.p50_ms, post.p95_ms), (51, 95));
        for _ in 0..WINDOW {
            latencies.record(CallKind::Post, Duration::from_millis(7));
        }
        let post = latencies.percentiles(CallKind::Post).unwrap();
        assert_eq!(
            (post.p50_ms, post.p95_ms),
            (7, 7),
            "old calls left the window"
        );
        assert_eq!(latencies.percentiles(CallKind::Ping), None);
    }
}

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
    ping: Window,
    post: Window,
}

/// One kind's recent calls and their percentiles, taken when a call is
/// recorded: the status is published far more often than calls end.
#[derive(Debug, Default)]
struct Window {
    calls: VecDeque<u64>,
    percentiles: Option<Percentiles>,
}

impl Latencies {
    pub fn record(&mut self, kind: CallKind, took: Duration) {
        let window = match kind {
            CallKind::Ping => &mut self.ping,
            CallKind::Post => &mut self.post,
        };
        if window.calls.len() == WINDOW {
            window.calls.pop_front();
        }
        window.calls.push_back(took.as_millis() as u64);
        let mut sorted: Vec<u64> = window.calls.iter().copied().collect();
        sorted.sort_unstable();
        let at = |share: f64| sorted[((sorted.len() - 1) as f64 * share).round() as usize];
        window.percentiles = Some(Percentiles {
            p50_ms: at(0.5),
            p95_ms: at(0.95),
        });
    }

    /// p50 and p95 of the recent calls of `kind`; `None` before any.
    pub fn percentiles(&self, kind: CallKind) -> Option<Percentiles> {
        match kind {
            CallKind::Ping => self.ping.percentiles,
            CallKind::Post => self.post.percentiles,
        }
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

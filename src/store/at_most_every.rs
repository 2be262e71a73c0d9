//! `AtMostEvery`: lets a store's occasional work through at most once per
//! period, however often it is asked for (refreshing planner statistics,
//! looking for leases that ran out).

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub(super) struct AtMostEvery {
    period: Duration,
    last: Mutex<Option<Instant>>,
}

impl AtMostEvery {
    pub(super) const fn new(period: Duration) -> Self {
        Self {
            period,
            last: Mutex::new(None),
        }
    }

    /// True (and the period starts again) when the last time was at least
    /// a period ago, or never.
    pub(super) fn due(&self) -> bool {
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if last.is_some_and(|at| at.elapsed() < self.period) {
            return false;
        }
        *last = Some(Instant::now());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_once_per_period() {
        let every = AtMostEvery::new(Duration::from_secs(60));
        assert!(every.due(), "never done: due");
        assert!(!every.due(), "just done: not due");
        let every = AtMostEvery::new(Duration::ZERO);
        assert!(every.due() && every.due(), "a zero period is always due");
    }
}

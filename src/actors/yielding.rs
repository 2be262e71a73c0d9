//! Routing yields the machine to intake. A sender waits for intake; a lead
//! waiting to be sold waits for no one, so when both want the CPU and the
//! database, intake goes first.
//!
//! Intake publishes how long its leads wait for their commit (`IntakeDelay`:
//! the longest wait answered in the current window, and the age of the
//! oldest lead still waiting). Every `WINDOW` the router's `RoutingYield`
//! compares that delay with the lowest one seen lately (the base: what this
//! database and machine give intake when nothing competes) and sets how
//! many waterfalls may run, as a congestion window does (LEDBAT-like):
//! halved, down to `FLOOR`, in a window whose delay rose more than `TARGET`
//! above the base; grown by `STEP` in a window within it; doubled in a
//! window without any lead. While narrower than full width, routing also
//! starts at most its width of walks per window: walks that end at once
//! (no buyer takes the lead, every circuit open) would otherwise start
//! again as fast as they end, and their claims and settles take the
//! database from intake whatever the width. Routing never stops (the
//! floor), and with no intake it runs at full width, unpaced. While leads
//! arrive it runs at most half its full width (as many walks as its
//! buyers have slots: `router::widest`), or `BESIDE_INTAKE` if that is
//! more: its full width beside intake (384 walks at the routing bench's
//! fast buyers, against 256) raised the intake bench's p99 at 1,000
//! leads/s from 6.9–12.7 ms to 9.3–23.3 ms, with no window's delay over
//! the target.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the router sets its width again.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Delay above the base that makes routing narrow. At 10 ms the intake
/// bench's p99 at 1,000 leads/s with routing on was 10.8-16.1 ms (median
/// 13.5, 6 runs) and its p50 2.8-3.7 ms; at 4 ms 8.5-18.5 ms (median 10.7)
/// and 2.0-3.2 ms (the p50 lower in every pair), while the routing bench's routed
/// rates stayed within a run's noise. At 2 ms the tail was no better
/// (10.8-25.9 ms in 3 runs).
const TARGET: Duration = Duration::from_millis(4);
/// Waterfalls routing keeps whatever intake's delay: a claim's worth (a
/// narrower router claims in smaller groups, and its many small writes
/// cost intake more than the walks they hold back: with a floor of 8 the
/// intake bench's closed loop on SQLite, whose leads are routed meanwhile,
/// ran 2-3x slower).
const FLOOR: usize = 32;
/// Waterfalls added after a window within the target.
const STEP: usize = 8;
/// Waterfalls routing may run while leads arrive, at least (if its full
/// width is wider): what it ran before its width followed its buyers.
const BESIDE_INTAKE: usize = 256;
/// How long a window's lowest delay counts toward the base.
const BASE_HISTORY: Duration = Duration::from_secs(60);

/// No lead is waiting (`oldest_waiting`), or none was answered (`longest`).
const NONE: u64 = 0;

/// Intake's delay, written by the intake actor and read by the router.
#[derive(Clone)]
pub struct IntakeDelay {
    inner: Arc<Delays>,
}

struct Delays {
    /// Instants are kept as microseconds since this one (plus one, so that
    /// `NONE` is never a real instant).
    epoch: Instant,
    /// The oldest lead waiting for its commit now.
    oldest_waiting: AtomicU64,
    /// The longest and shortest waits answered since the router last read.
    longest: AtomicU64,
    shortest: AtomicU64,
}

impl Default for IntakeDelay {
    fn default() -> Self {
        Self {
            inner: Arc::new(Delays {
                epoch: Instant::now(),
                oldest_waiting: AtomicU64::new(NONE),
                longest: AtomicU64::new(NONE),
                shortest: AtomicU64::new(u64::MAX),
            }),
        }
    }
}

impl IntakeDelay {
    /// The oldest lead intake holds now arrived at `since` (`None`: it holds none).
    pub fn waiting_since(&self, since: Option<Instant>) {
        let micros = since.map_or(NONE, |since| self.micros(since));
        self.inner.oldest_waiting.store(micros, Ordering::Relaxed);
    }

    /// A lead was answered after waiting this long.
    pub fn answered(&self, waited: Duration) {
        let micros = (waited.as_micros() as u64).max(1);
        self.inner.longest.fetch_max(micros, Ordering::Relaxed);
        self.inner.shortest.fetch_min(micros, Ordering::Relaxed);
    }

    /// The window's longest delay (answered, or of the lead still
    /// waiting) and shortest answered one, and starts the next window;
    /// `None` when no lead was answered or waits.
    fn take_window(&self, now: Instant) -> Option<(Duration, Option<Duration>)> {
        let longest = self.inner.longest.swap(NONE, Ordering::Relaxed);
        let shortest = self.inner.shortest.swap(u64::MAX, Ordering::Relaxed);
        let oldest = self.inner.oldest_waiting.load(Ordering::Relaxed);
        let waiting = if oldest == NONE {
            NONE
        } else {
            self.micros(now).saturating_sub(oldest)
        };
        let longest = longest.max(waiting);
        (longest != NONE).then(|| {
            (
                Duration::from_micros(longest),
                (shortest != u64::MAX).then(|| Duration::from_micros(shortest)),
            )
        })
    }

    fn micros(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.inner.epoch).as_micros() as u64 + 1
    }
}

/// How many waterfalls the router may run now.
pub struct RoutingYield {
    delay: IntakeDelay,
    widest: usize,
    width: usize,
    /// Each window's shortest delay, for the base.
    lows: VecDeque<(Instant, Duration)>,
    /// Walks started in this window.
    started: usize,
}

impl RoutingYield {
    /// Starts at full width (`widest` waterfalls).
    pub fn new(delay: IntakeDelay, widest: usize) -> Self {
        Self {
            delay,
            widest,
            width: widest,
            lows: VecDeque::new(),
            started: 0,
        }
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn widest(&self) -> usize {
        self.widest
    }

    /// A reload changed the buyers, and with them the widest routing
    /// runs: narrower at once, wider as the next windows allow.
    pub fn set_widest(&mut self, widest: usize) {
        self.widest = widest;
        self.width = self.width.min(widest);
    }

    /// The widest routing runs while leads arrive (see the module doc).
    fn widest_beside_intake(&self) -> usize {
        (self.widest / 2).max(BESIDE_INTAKE).min(self.widest)
    }

    /// Walks that may start now, with `held` leads held or being claimed:
    /// the width's free places, and while narrower than its width beside
    /// intake no more than what is left of this window's width of starts.
    pub fn room(&self, held: usize) -> usize {
        let free = self.width.saturating_sub(held);
        if self.width < self.widest_beside_intake() {
            free.min(self.width.saturating_sub(self.started))
        } else {
            free
        }
    }

    /// Counts walks started (or claims asked for) in this window.
    pub fn started(&mut self, walks: usize) {
        self.started += walks;
    }

    /// Ends a window: reads intake's delay and sets the width.
    pub fn adjust(&mut self, now: Instant) -> usize {
        self.started = 0;
        let floor = FLOOR.min(self.widest);
        let (width, widest) = match self.delay.take_window(now) {
            None => (self.width.saturating_mul(2), self.widest),
            Some((longest, shortest)) => {
                self.lows.extend(shortest.map(|low| (now, low)));
                while self
                    .lows
                    .front()
                    .is_some_and(|(at, _)| now.duration_since(*at) > BASE_HISTORY)
                {
                    self.lows.pop_front();
                }
                // No lead answered lately: any wait counts as delay.
                let base = self.lows.iter().map(|(_, low)| *low).min();
                let base = base.unwrap_or(Duration::ZERO);
                let width = if longest > base + TARGET {
                    self.width / 2
                } else {
                    self.width + STEP
                };
                (width, self.widest_beside_intake())
            }
        };
        self.width = width.clamp(floor, widest);
        self.width
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(millis: u64) -> Duration {
        Duration::from_millis(millis)
    }

    /// Intake's delay, a router's width over it (up to `widest`), and now.
    fn yielding(widest: usize) -> (IntakeDelay, RoutingYield, Instant) {
        let delay = IntakeDelay::default();
        let routing = RoutingYield::new(delay.clone(), widest);
        (delay, routing, Instant::now())
    }

    #[test]
    fn a_delay_over_the_target_halves_routing_down_to_the_floor() {
        let (delay, mut routing, start) = yielding(256);
        delay.answered(ms(2));
        assert_eq!(
            routing.adjust(start),
            256,
            "within the target at full width"
        );
        for (window, expected) in [128, 64, 32, 32].into_iter().enumerate() {
            delay.answered(ms(2));
            delay.answered(ms(2) + TARGET + ms(1));
            assert_eq!(
                routing.adjust(start + WINDOW * (window as u32 + 1)),
                expected
            );
        }
    }

    #[test]
    fn routing_widens_step_by_step_within_the_target_and_doubles_without_intake() {
        let (delay, mut routing, start) = yielding(256);
        delay.answered(ms(3));
        routing.adjust(start);
        delay.answered(ms(40));
        delay.waiting_since(None);
        assert_eq!(routing.adjust(start + WINDOW), 128);
        delay.answered(ms(3) + TARGET);
        assert_eq!(
            routing.adjust(start + WINDOW * 2),
            128 + STEP,
            "at the target is within it"
        );
        assert_eq!(
            routing.adjust(start + WINDOW * 3),
            256,
            "no lead: doubled, at most the widest"
        );
    }

    #[test]
    fn beside_intake_routing_runs_half_its_full_width_or_256() {
        let (delay, mut routing, start) = yielding(1024);
        assert_eq!(routing.adjust(start), 1024, "no intake: full width");
        delay.answered(ms(3));
        assert_eq!(routing.adjust(start + WINDOW), 512, "leads arrive: half");
        assert_eq!(routing.room(0), 512, "not paced at it");
        assert_eq!(routing.adjust(start + WINDOW * 2), 1024, "no lead again");

        let (delay, mut routing, start) = yielding(384);
        delay.answered(ms(3));
        assert_eq!(routing.adjust(start), 256, "at least 256");
        let (delay, mut routing, start) = yielding(64);
        delay.answered(ms(3));
        assert_eq!(routing.adjust(start), 64, "at most the full width");
    }

    #[test]
    fn a_lead_still_waiting_counts_before_it_is_answered() {
        let (delay, mut routing, start) = yielding(64);
        delay.answered(ms(1));
        routing.adjust(start);
        delay.waiting_since(Some(start));
        assert_eq!(
            routing.adjust(start + ms(5)),
            64,
            "waiting 5 ms: within the target"
        );
        assert_eq!(
            routing.adjust(start + ms(50)),
            32,
            "waiting 50 ms, nothing answered"
        );
        delay.waiting_since(None);
        assert_eq!(
            routing.adjust(start + ms(150)),
            64,
            "none waits: no lead in the window"
        );
    }

    #[test]
    fn the_first_lead_stuck_narrows_routing_before_any_was_answered() {
        let (delay, mut routing, start) = yielding(256);
        delay.waiting_since(Some(start));
        assert_eq!(routing.adjust(start + ms(50)), 128);
        assert_eq!(routing.adjust(start + ms(150)), 64);
    }

    #[test]
    fn a_narrower_router_starts_at_most_its_width_of_walks_per_window() {
        let (delay, mut routing, start) = yielding(256);
        routing.started(1000);
        assert_eq!(routing.room(10), 246, "full width: unpaced");
        delay.answered(ms(1));
        routing.adjust(start);
        delay.answered(ms(50));
        assert_eq!(routing.adjust(start + WINDOW), 128);
        assert_eq!(routing.room(0), 128);
        routing.started(100);
        assert_eq!(routing.room(0), 28, "100 of this window's 128 started");
        assert_eq!(routing.room(110), 18, "and the width's free places");
        routing.started(28);
        assert_eq!(routing.room(0), 0);
        delay.answered(ms(1));
        routing.adjust(start + WINDOW * 2);
        assert_eq!(routing.room(0), 128 + STEP, "a new window");
    }

    #[test]
    fn the_base_is_the_lowest_delay_of_the_last_minute() {
        let (delay, mut routing, start) = yielding(256);
        delay.answered(ms(1));
        routing.adjust(start);
        // A slower database from now on: 30 ms is 29 over the base of 1 ms.
        delay.answered(ms(30));
        assert_eq!(routing.adjust(start + ms(100)), 128);
        // A minute later the 1 ms is forgotten: 30 ms is the base, and
        // 30 ms plus the target within it again.
        delay.answered(ms(30));
        routing.adjust(start + BASE_HISTORY + ms(50));
        delay.answered(ms(30) + TARGET);
        assert_eq!(
            routing.adjust(start + BASE_HISTORY + ms(150)),
            128 + STEP + STEP
        );
    }
}

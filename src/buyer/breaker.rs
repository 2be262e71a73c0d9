//! The per-buyer circuit breaker (SPEC section 7): `closed` → `open` after
//! `failure_threshold` consecutive failures; after `open_for` it is
//! `half_open` and lets `half_open_probes` calls through; a success closes
//! it, a failure re-opens it for twice as long, up to `max_open_for`.
//!
//! Pure bookkeeping: every method takes `now`, so tests drive the clock.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::CircuitSettings;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    Closed,
    Open,
    HalfOpen,
}

impl CircuitState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }
}

/// May a call go through now?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Call,
    /// A half-open probe: report its result like any call.
    Probe,
    Refused,
}

#[derive(Debug, Clone)]
pub struct Breaker {
    settings: CircuitSettings,
    state: CircuitState,
    consecutive_failures: u32,
    /// When the current open period ends.
    open_until: Option<Instant>,
    /// Length of the last open period (doubles on each re-open).
    last_open_for: Option<Duration>,
    probes_in_flight: u32,
    /// Opened by an operator: stays open until an operator closes it.
    forced_open: bool,
}

impl Breaker {
    pub fn new(settings: CircuitSettings) -> Self {
        Self {
            settings,
            state: CircuitState::Closed,
            consecutive_failures: 0,
            open_until: None,
            last_open_for: None,
            probes_in_flight: 0,
            forced_open: false,
        }
    }

    pub fn state(&self) -> CircuitState {
        self.state
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// When an open circuit is due to half-open (for a timer).
    pub fn open_until(&self) -> Option<Instant> {
        (self.state == CircuitState::Open && !self.forced_open)
            .then_some(self.open_until)
            .flatten()
    }

    /// Moves an open circuit whose time is up to half-open; returns the new
    /// state when it changed.
    pub fn tick(&mut self, now: Instant) -> Option<CircuitState> {
        match self.open_until() {
            Some(until) if now >= until => {
                self.state = CircuitState::HalfOpen;
                self.probes_in_flight = 0;
                Some(CircuitState::HalfOpen)
            }
            _ => None,
        }
    }

    pub fn admit(&mut self, now: Instant) -> Admission {
        self.tick(now);
        match self.state {
            CircuitState::Closed => Admission::Call,
            CircuitState::Open => Admission::Refused,
            CircuitState::HalfOpen if self.probes_in_flight < self.settings.half_open_probes => {
                self.probes_in_flight += 1;
                Admission::Probe
            }
            CircuitState::HalfOpen => Admission::Refused,
        }
    }

    /// Records a call's result; returns the new state when it changed.
    pub fn record(
        &mut self,
        admission: Admission,
        success: bool,
        now: Instant,
    ) -> Option<CircuitState> {
        if admission == Admission::Probe {
            self.probes_in_flight = self.probes_in_flight.saturating_sub(1);
        }
        if success {
            self.consecutive_failures = 0;
            if self.state == CircuitState::HalfOpen && admission == Admission::Probe {
                return Some(self.close());
            }
            return None;
        }
        self.consecutive_failures += 1;
        match self.state {
            CircuitState::HalfOpen if admission == Admission::Probe => Some(self.open(now)),
            CircuitState::Closed
                if self.consecutive_failures >= self.settings.failure_threshold =>
            {
                Some(self.open(now))
            }
            _ => None,
        }
    }

    /// Gives back an admission whose call was never made (no result to count).
    pub fn cancel(&mut self, admission: Admission) {
        if admission == Admission::Probe {
            self.probes_in_flight = self.probes_in_flight.saturating_sub(1);
        }
    }

    /// Forgets the probes in flight (their calls were lost in a restart),
    /// so a half-open circuit lets new probes through.
    pub fn reset_probes(&mut self) {
        self.probes_in_flight = 0;
    }

    /// Calls that may probe a half-open circuit at once.
    pub fn half_open_probes(&self) -> u32 {
        self.settings.half_open_probes
    }

    /// An operator's override (`POST /v1/buyers/{id}/circuit`).
    pub fn force(&mut self, state: CircuitState, now: Instant) -> Option<CircuitState> {
        let before = self.state;
        match state {
            CircuitState::Open => {
                self.forced_open = true;
                self.state = CircuitState::Open;
                self.open_until = Some(now);
            }
            _ => {
                self.close();
            }
        }
        (self.state != before).then_some(self.state)
    }

    fn open(&mut self, now: Instant) -> CircuitState {
        let open_for = match self.last_open_for {
            Some(last) if self.state == CircuitState::HalfOpen => {
                (last * 2).min(self.settings.max_open_for)
            }
            _ => self.settings.open_for,
        };
        self.last_open_for = Some(open_for);
        self.open_until = Some(now + open_for);
        self.state = CircuitState::Open;
        self.probes_in_flight = 0;
        CircuitState::Open
    }

    fn close(&mut self) -> CircuitState {
        self.state = CircuitState::Closed;
        self.consecutive_failures = 0;
        self.open_until = None;
        self.last_open_for = None;
        self.probes_in_flight = 0;
        self.forced_open = false;
        CircuitState::Closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker() -> Breaker {
        Breaker::new(CircuitSettings {
            failure_threshold: 3,
            open_for: Duration::from_secs(30),
            max_open_for: Duration::from_secs(100),
            half_open_probes: 1,
        })
    }

    fn fail(breaker: &mut Breaker, now: Instant) -> Option<CircuitState> {
        let admission = breaker.admit(now);
        breaker.record(admission, false, now)
    }

    #[test]
    fn opens_after_the_threshold_of_consecutive_failures() {
        let (mut breaker, t0) = (breaker(), Instant::now());
        assert_eq!(fail(&mut breaker, t0), None);
        let admission = breaker.admit(t0);
        assert_eq!(
            breaker.record(admission, true, t0),
            None,
            "a success resets the count"
        );
        assert_eq!(fail(&mut breaker, t0), None);
        assert_eq!(fail(&mut breaker, t0), None);
        assert_eq!(fail(&mut breaker, t0), Some(CircuitState::Open));
        assert_eq!(
            breaker.admit(t0 + Duration::from_secs(29)),
            Admission::Refused
        );
    }

    #[test]
    fn half_opens_after_open_for_and_a_good_probe_closes_it() {
        let (mut breaker, t0) = (breaker(), Instant::now());
        for _ in 0..3 {
            fail(&mut breaker, t0);
        }
        let later = t0 + Duration::from_secs(30);
        assert_eq!(breaker.tick(later), Some(CircuitState::HalfOpen));
        assert_eq!(breaker.admit(later), Admission::Probe);
        assert_eq!(
            breaker.admit(later),
            Admission::Refused,
            "one probe at a time"
        );
        assert_eq!(
            breaker.record(Admission::Probe, true, later),
            Some(CircuitState::Closed)
        );
        assert_eq!(breaker.admit(later), Admission::Call);
    }

    #[test]
    fn a_failed_probe_reopens_for_twice_as_long_up_to_the_cap() {
        let (mut breaker, mut now) = (breaker(), Instant::now());
        for _ in 0..3 {
            fail(&mut breaker, now);
        }
        for expected in [60, 100, 100] {
            now += Duration::from_secs(200);
            assert_eq!(breaker.admit(now), Admission::Probe);
            assert_eq!(
                breaker.record(Admission::Probe, false, now),
                Some(CircuitState::Open)
            );
            assert_eq!(
                breaker.open_until(),
                Some(now + Duration::from_secs(expected))
            );
        }
    }

    #[test]
    fn probes_lost_in_a_restart_are_forgotten_and_new_ones_admitted() {
        let (mut breaker, t0) = (breaker(), Instant::now());
        for _ in 0..3 {
            fail(&mut breaker, t0);
        }
        let later = t0 + Duration::from_secs(30);
        assert_eq!(breaker.admit(later), Admission::Probe);
        assert_eq!(breaker.admit(later), Admission::Refused);
        breaker.reset_probes();
        assert_eq!(breaker.admit(later), Admission::Probe);
    }

    #[test]
    fn an_operator_open_holds_until_an_operator_closes() {
        let (mut breaker, t0) = (breaker(), Instant::now());
        assert_eq!(
            breaker.force(CircuitState::Open, t0),
            Some(CircuitState::Open)
        );
        assert_eq!(breaker.tick(t0 + Duration::from_secs(3600)), None);
        assert_eq!(
            breaker.admit(t0 + Duration::from_secs(3600)),
            Admission::Refused
        );
        assert_eq!(
            breaker.force(CircuitState::Closed, t0),
            Some(CircuitState::Closed)
        );
        assert_eq!(breaker.admit(t0), Admission::Call);
    }
}

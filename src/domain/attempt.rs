//! An attempt's vocabulary (SPEC section 7): what kind of row it is and how
//! it ended. Enums everywhere inside; the pinned strings only where rows
//! are stored or shown.

use serde::Serialize;

/// A call to a buyer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    Ping,
    Post,
}

impl CallKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ping => "ping",
            Self::Post => "post",
        }
    }
}

/// What an attempt row is (`attempts.kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptKind {
    Call(CallKind),
    /// A buyer passed over without a call.
    Skip,
    /// A delivery to a notify channel.
    Notify,
    /// An event postback.
    Event,
    /// An operator's settlement of an `unknown` lead (no call): outcome
    /// `accepted` (sold to the buyer) or `rejected` (not sold).
    Resolve,
}

impl AttemptKind {
    pub const PING: Self = Self::Call(CallKind::Ping);
    pub const POST: Self = Self::Call(CallKind::Post);

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Call(kind) => kind.as_str(),
            Self::Skip => "skip",
            Self::Notify => "notify",
            Self::Event => "event",
            Self::Resolve => "resolve",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::PING,
            Self::POST,
            Self::Skip,
            Self::Notify,
            Self::Event,
            Self::Resolve,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == text)
    }
}

/// How a call ended (SPEC section 7), as stored in `attempts.outcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CallOutcome {
    Accepted,
    Rejected,
    /// Failed in a way that is safe to move on from (the request never
    /// left, or the buyer answered 5xx / 429 / unreadably).
    Error,
    /// No answer in time, or the connection dropped after sending: for a
    /// post the buyer may have taken the lead.
    Timeout,
}

impl CallOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::Rejected => "rejected",
            Self::Error => "error",
            Self::Timeout => "timeout",
        }
    }

    /// Whether the breaker counts it as a failure.
    pub fn is_failure(self) -> bool {
        matches!(self, Self::Error | Self::Timeout)
    }
}

/// Why a buyer was passed over without a call: a skip row's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    CircuitOpen,
    Busy,
    Filtered,
    Capped,
    TestLead,
    BelowMinBid,
    /// Outside the buyer's `schedule`.
    ClosedHours,
}

impl SkipReason {
    const ALL: [Self; 7] = [
        Self::CircuitOpen,
        Self::Busy,
        Self::Filtered,
        Self::Capped,
        Self::TestLead,
        Self::BelowMinBid,
        Self::ClosedHours,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::CircuitOpen => "circuit_open",
            Self::Busy => "busy",
            Self::Filtered => "filtered",
            Self::Capped => "capped",
            Self::TestLead => "test_lead",
            Self::BelowMinBid => "below_min_bid",
            Self::ClosedHours => "closed_hours",
        }
    }
}

/// Where an attempt row stands (`attempts.outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// Written before the call; the answer is not in yet.
    InFlight,
    Call(CallOutcome),
    Skip(SkipReason),
}

impl AttemptOutcome {
    /// The outcomes after which a lead left unsold is offered to that buyer
    /// again once it answers again (SPEC section 7).
    pub const RETRYABLE: [Self; 3] = [
        Self::Call(CallOutcome::Error),
        Self::Skip(SkipReason::CircuitOpen),
        Self::Skip(SkipReason::Busy),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Call(outcome) => outcome.as_str(),
            Self::Skip(reason) => reason.as_str(),
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        let calls = [
            CallOutcome::Accepted,
            CallOutcome::Rejected,
            CallOutcome::Error,
            CallOutcome::Timeout,
        ]
        .map(Self::Call);
        std::iter::once(Self::InFlight)
            .chain(calls)
            .chain(SkipReason::ALL.map(Self::Skip))
            .find(|outcome| outcome.as_str() == text)
    }
}

/// The `reason` of a call settled on recovery: its instance stopped mid-call.
pub const INTERRUPTED: &str = "interrupted";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stored_outcome_and_kind_reads_back_as_itself() {
        for outcome in AttemptOutcome::RETRYABLE
            .into_iter()
            .chain([AttemptOutcome::InFlight])
            .chain(SkipReason::ALL.map(AttemptOutcome::Skip))
            .chain([CallOutcome::Accepted, CallOutcome::Timeout].map(AttemptOutcome::Call))
        {
            assert_eq!(AttemptOutcome::parse(outcome.as_str()), Some(outcome));
        }
        for kind in [
            AttemptKind::PING,
            AttemptKind::POST,
            AttemptKind::Skip,
            AttemptKind::Notify,
            AttemptKind::Event,
            AttemptKind::Resolve,
        ] {
            assert_eq!(AttemptKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(AttemptOutcome::parse("skipped"), None);
    }
}

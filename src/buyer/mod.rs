//! What one call to a buyer is: the request, the verdict on the answer, the
//! circuit breaker, and the shared status board. The `Buyer` actor in
//! `actors::buyer` puts these together.

pub mod accept;
pub mod board;
pub mod breaker;
pub mod call;
pub mod latency;
pub mod request;

use serde::Serialize;

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

/// Why a buyer was passed over without a call (`attempts.reason` of a skip).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    CircuitOpen,
    Busy,
    Filtered,
    Capped,
    TestLead,
    BelowMinBid,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CircuitOpen => "circuit_open",
            Self::Busy => "busy",
            Self::Filtered => "filtered",
            Self::Capped => "capped",
            Self::TestLead => "test_lead",
            Self::BelowMinBid => "below_min_bid",
        }
    }

    /// Skips after which the lead is offered again when the buyer recovers.
    pub fn is_retryable(self) -> bool {
        matches!(self, Self::CircuitOpen | Self::Busy)
    }
}

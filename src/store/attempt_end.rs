//! A call's answer as the attempt writer writes it onto its row: how the
//! call ended ([`AttemptEnd`]), and a ping's answer held back to share the
//! commit of the walk's next row ([`Unwritten`]).

use std::time::Duration;

use crate::domain::CallOutcome;

/// A waterfall ping's answer held back to share the commit of the walk's
/// next row (a post, a ping, a skip), which spares one commit wait per
/// call. Safe to hold for a ping only: until it is written the row stays
/// `in_flight`, and recovery settles an interrupted ping as an `error`
/// after which the walk goes on (an unwritten post's answer would make its
/// lead `unknown`). Written onto its row only while the row is still
/// `in_flight`, so writing it twice is harmless; the walk writes it on its
/// own when no row follows.
#[derive(Debug, Clone)]
pub struct Unwritten {
    pub attempt_id: String,
    pub end: AttemptEnd,
}

/// How a call ended.
#[derive(Debug, Clone)]
pub struct AttemptEnd {
    pub outcome: CallOutcome,
    pub reason: Option<String>,
    pub http_status: Option<u16>,
    pub duration: Duration,
    pub response_body: Option<String>,
    pub bid: Option<f64>,
    pub ping_id: Option<String>,
}

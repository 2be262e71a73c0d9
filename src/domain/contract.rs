//! Lead states (SPEC section 6) and the acceptance contract every intake
//! answer carries (SPEC section 5).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LeadState {
    Received,
    Routing,
    Sold,
    Unsold,
    Unknown,
    Invalid,
    Duplicate,
}

impl LeadState {
    pub const ALL: [LeadState; 7] = [
        Self::Received,
        Self::Routing,
        Self::Sold,
        Self::Unsold,
        Self::Unknown,
        Self::Invalid,
        Self::Duplicate,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Received => "received",
            Self::Routing => "routing",
            Self::Sold => "sold",
            Self::Unsold => "unsold",
            Self::Unknown => "unknown",
            Self::Invalid => "invalid",
            Self::Duplicate => "duplicate",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == text)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Acceptance {
    /// Stored, and every required notify channel (if any) confirmed.
    Accepted,
    /// Safe, but not accepted yet (required notify outstanding, invalid, spooled).
    Pending,
    /// Not safely retained: the sender must try again.
    Failed,
}

/// One validation problem, addressed to a normalised field (or `body`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// What the sender is told about a lead: how safe it is, machine-readably.
/// Error answers (4xx/5xx) also carry `error` and `message`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Contract {
    pub submission_id: String,
    pub acceptance: Acceptance,
    pub accepted: bool,
    pub server_recorded: bool,
    pub manager_notified: bool,
    pub crm_synced: bool,
    pub lead_state: Option<LeadState>,
    pub replayed: bool,
    pub duplicate_of: Option<String>,
    pub errors: Vec<FieldError>,
}

impl Contract {
    /// The contract of a stored lead. `awaiting_required_notify` is true while
    /// a required notify channel has not confirmed (SPEC: then `pending`).
    pub fn for_stored(
        submission_id: String,
        state: LeadState,
        duplicate_of: Option<String>,
        errors: Vec<FieldError>,
        awaiting_required_notify: bool,
    ) -> Self {
        let acceptance = if state == LeadState::Invalid || awaiting_required_notify {
            Acceptance::Pending
        } else {
            Acceptance::Accepted
        };
        Self {
            submission_id,
            acceptance,
            accepted: acceptance == Acceptance::Accepted,
            server_recorded: true,
            manager_notified: false,
            crm_synced: false,
            lead_state: Some(state),
            replayed: false,
            duplicate_of,
            errors,
        }
    }

    /// The contract of a lead held in the spool (the database was
    /// unreachable): safe on disk, so `pending`; an invalid one still 422.
    pub fn spooled(submission_id: String, errors: Vec<FieldError>) -> Self {
        let state = if errors.is_empty() {
            LeadState::Received
        } else {
            LeadState::Invalid
        };
        Self {
            acceptance: Acceptance::Pending,
            accepted: false,
            ..Self::for_stored(submission_id, state, None, errors, true)
        }
    }

    /// The contract when the request could not be retained.
    pub fn failed(submission_id: String) -> Self {
        Self {
            submission_id,
            acceptance: Acceptance::Failed,
            accepted: false,
            server_recorded: false,
            manager_notified: false,
            crm_synced: false,
            lead_state: None,
            replayed: false,
            duplicate_of: None,
            errors: Vec::new(),
        }
    }

    /// HTTP status of an intake answer carrying this contract.
    pub fn http_status(&self) -> u16 {
        match (self.replayed, self.acceptance, self.lead_state) {
            (true, _, _) => 200,
            (_, Acceptance::Failed, _) => 503,
            (_, _, Some(LeadState::Invalid)) => 422,
            (_, Acceptance::Accepted, _) => 200,
            (_, Acceptance::Pending, _) => 202,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_the_contract() {
        let stored = |state, awaiting| {
            Contract::for_stored("id".into(), state, None, vec![], awaiting).http_status()
        };
        assert_eq!(stored(LeadState::Received, false), 200);
        assert_eq!(stored(LeadState::Received, true), 202);
        assert_eq!(stored(LeadState::Invalid, false), 422);
        assert_eq!(Contract::failed("id".into()).http_status(), 503);
        let mut replay = Contract::for_stored("id".into(), LeadState::Invalid, None, vec![], false);
        replay.replayed = true;
        assert_eq!(replay.http_status(), 200);
    }

    #[test]
    fn states_round_trip_through_their_names() {
        for state in LeadState::ALL {
            assert_eq!(LeadState::parse(state.as_str()), Some(state));
        }
    }
}

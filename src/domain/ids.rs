//! Typed ids carried between actors and the store, so a lead id, a claim
//! token and any other string cannot be swapped by mistake. The database
//! keeps them as text.

use std::fmt;

/// A lead's server-issued id: its `submission_id` everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeadId(String);

impl LeadId {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for LeadId {
    fn from(id: String) -> Self {
        Self(id)
    }
}

impl From<&str> for LeadId {
    fn from(id: &str) -> Self {
        Self(id.to_string())
    }
}

impl fmt::Display for LeadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Fences the writes made for a claimed lead: a fresh random value on
/// every claim, compared in each conditional write of the walk.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ClaimToken(String);

impl ClaimToken {
    /// A new token, never issued before.
    pub fn fresh() -> Self {
        Self(super::new_id())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

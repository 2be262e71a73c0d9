//! sea-orm entities of leadrouter: one module per table, shared by the
//! service's store and by the tests that look at rows directly.

pub mod alert;
pub mod attempt;
pub mod cap_use;
pub mod config_snapshot;
pub mod delivery;
pub mod intake_log;
pub mod lead;
pub mod lead_alias;
pub mod person_key;
pub mod sale;

//! The only place that talks to the database: connecting (SQLite or
//! PostgreSQL through the same sea-orm code), migrating, and the queries.
//! [`Store`] (`handle`) is the handle every query is a method of; each
//! other module holds the queries of one concern.

mod among;
mod any_of;
mod at_most_every;
mod attempt_end;
mod attempt_writer;
mod batch_statement;
mod cap_counters;
mod caps;
mod deliveries;
mod earlier_keys;
mod handle;
mod intake_first;
mod lead_insert;
mod leads;
mod loopback_tls;
mod operations;
mod person;
mod report;
mod resolve;
mod routing;
mod snapshot_reads;
mod snapshots;
mod sqlite_lock;
mod state_is;
mod statistics;
mod tcp_nodelay;
mod unreachable;

pub use attempt_end::{AttemptEnd, Unwritten};
pub use attempt_writer::Written;
pub use cap_counters::CapUse;
pub use caps::{CapPeriod, CapSlot};
pub use deliveries::{
    AfterFailure, ConfirmEffect, DeliveryAnswer, DeliveryBacklog, DeliveryState, DeliveryTarget,
    HeldDelivery, Planned, PLAN_PAGE,
};
pub use handle::Store;
pub use leads::{contract_of_row, LeadFilter, LeadPage, NewLead, PersistOutcome};
pub use loopback_tls::plain_on_loopback;
pub use operations::OperationError;
pub use report::{Money, ReportBy, ReportRow};
pub use resolve::Settlement;
pub use routing::{
    Begun, Claimed, ClaimedLead, FailurePolicy, HeldLead, LeadEnd, NewAttempt, OutcomeCounts,
    SaleOf,
};
pub use unreachable::is_unreachable;

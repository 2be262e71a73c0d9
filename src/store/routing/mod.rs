//! Routing's rows: claiming leads under a lease and a fencing token
//! (`claim`), attempts written before each call and completed after it,
//! with the one door for a sale (`attempts`), letting leads go (final,
//! backoff, set aside: `settle`), requeueing for a recovered buyer
//! (`requeue`), and the counts the buyers endpoint shows, with alerts
//! (`counts`).

mod attempts;
mod claim;
mod counts;
mod requeue;
mod settle;

pub use attempts::{Begun, NewAttempt, SaleOf};
pub use claim::{Claimed, ClaimedLead};
pub use counts::OutcomeCounts;
pub use settle::{FailurePolicy, HeldLead, LeadEnd};

//! The actor tree. Every actor keeps its durable state in the database, so a
//! restarted actor recovers from rows, never from a lost mailbox.
//!
//! ```text
//! Overseer (starts the others under actix supervision)
//! ├── Router   (which leads are routed now; sweeps for waiting leads)
//! │   ├── Buyer × each configured buyer (client, slots, breaker, timeouts)
//! │   └── Waterfall × each lead being routed (claims, walks buyers, settles)
//! └── Intake   (intake log + group commit of leads; hands ids to Router)
//! ```

pub mod buyer;
mod intake;
mod overseer;
pub mod router;
pub mod waterfall;

pub use intake::{Intake, IntakeError, IntakeRules, SubmitLead};
pub use overseer::{Overseer, Tree};

//! The actor tree. Every actor keeps its durable state in the database, so a
//! restarted actor recovers from rows, never from a lost mailbox.
//!
//! ```text
//! Overseer (starts the others under supervision, restart intensity)
//! ├── Router   (which leads are routed now; sweeps, leases, drains)
//! │   ├── Buyer × each configured buyer (client, slots, breaker, timeouts)
//! │   └── Waterfall × each lead being routed (walks buyers, recovers history)
//! ├── Intake   (intake log + group commit of leads, else the spool)
//! └── SpoolDrainer (spooled leads into the database when it is back)
//! ```

pub mod buyer;
pub mod directory;
mod drainer;
mod intake;
mod overseer;
pub mod retry;
pub mod router;
pub mod supervision;
pub mod waterfall;

pub use intake::{Intake, IntakeError, IntakeRules, SubmitLead};
pub use overseer::{Overseer, Services, Tree};

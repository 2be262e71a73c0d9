//! The actor tree. Every actor keeps its durable state in the database, so a
//! restarted actor recovers from rows, never from a lost mailbox.
//!
//! ```text
//! Overseer (starts and supervises the others)
//! └── Intake   (intake log + group commit of leads; answers SubmitLead)
//! ```

mod intake;
mod overseer;

pub use intake::{Intake, IntakeError, IntakeRules, SubmitLead};
pub use overseer::{Overseer, Tree};

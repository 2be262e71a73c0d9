//! The actor tree. Every actor keeps its durable state in the database, so a
//! restarted actor recovers from rows, never from a lost mailbox.
//!
//! ```text
//! Application::build (startup.rs) starts, in this order:
//! ├── Store: the pool, and the attempt writer task (group commit of attempt
//! │   rows; a panic restarts its loop, and the writes it held fail, which
//! │   the callers treat as calls not recorded)
//! ├── Alerts: the webhook sender task (deliveries only; every alert is
//! │   also kept in the database)
//! └── Overseer::start: actix::Supervisor children, one-for-one, restart
//!     intensity kept by RestartLog (exceeded: the service stops)
//!     ├── Router (supervised): claims, sweeps, leases, settles, re-offers;
//!     │   owns operators' retries (retry.rs) as futures of its own
//!     │   ├── Buyer × each buyer (supervised; started once by the router's
//!     │   │   start closure, and by reloads: client, slots, breaker, timeouts)
//!     │   └── Waterfall × each lead being routed (temporary: never
//!     │       restarted; a dead walk's lead is let go and swept up again)
//!     │   (its width yields to intake's delay: yielding.rs)
//!     ├── Intake (supervised): intake log + group commit of leads, else the spool
//!     ├── SpoolDrainer (supervised): spooled leads into the database when it is back
//!     └── Courier × each notify channel and event sink (supervised): plans,
//!         claims and sends deliveries, independent of routing
//! ```

mod auction;
pub mod buyer;
pub mod courier;
pub mod directory;
mod drainer;
mod intake;
mod overseer;
pub mod retry;
pub mod router;
pub mod routing_context;
pub mod supervision;
mod walk;
pub mod waterfall;
mod yielding;

pub use intake::{Intake, IntakeError, IntakeRules, SubmitLead};
pub use overseer::{Overseer, Services, Tree};

//! `Courier`: one supervised actor per notify channel and per event sink,
//! owning its transport (HTTP client or SMTP pool), timeout and concurrency,
//! independent of routing (a lead is sold while its manager is down).
//!
//! Intake hands it every stored lead at once (`Deliver`); every second it
//! also plans what leads changed since its last plan are owed (so a crash
//! between the lead's commit and that message loses nothing, and events
//! follow state changes), then claims due rows with free slots and sends
//! them. Each target's plan pages on in order of change from where the last
//! one stopped, a page per tick: however many leads a drained spool stores
//! at once, and however long ago they arrived, none is skipped. The
//! database decides what may be sent (`store::deliveries`): a confirmed row
//! is never sent again, by any instance. A failed try is retried with
//! backoff for a day, then abandoned with an alert, for an operator.
//!
//! The actor, its message and handlers are `actor`; one round of planning
//! and claiming is `round`, one try of one delivery `delivery`; `couriers`
//! starts them all, and `shared` holds what they share (the store, the
//! confirmations intake waits for, the health board).

mod actor;
mod couriers;
mod delivery;
mod round;
mod shared;

pub use actor::{Courier, Deliver};
pub use couriers::Couriers;
pub use shared::{ChannelHealth, Confirmations, CourierEnvironment, DeliveryBoard, Watch};

//! `Router`: decides which leads are being routed. Queued leads are rows,
//! not live actors: the router starts at most `MAX_ACTIVE_WATERFALLS`
//! waterfalls, fewer while intake's leads wait longer than usual for their
//! commit (`yielding`: routing narrows, and starts at most its width of
//! walks per window; intake goes first), and its sweep
//! (every `routing.sweep_interval`, and at start) picks up leads in
//! `received` and leads whose lease ran out.
//!
//! Started by the `Overseer`; it starts the `Buyer` actors (the overseer's
//! closure does, once). Handles `RouteLeads` (from intake),
//! `WaterfallFinished`, `RetryAttempt` (an operator's retry, held and
//! settled here like a walk), and `ReofferLeads` (from buyers): when a
//! buyer answers again (or half-opens, or is probed after a start), the
//! unsold leads it failed or was skipped for (circuit open, busy), within
//! a day of arrival, are put back to be routed, all of them page by page;
//! each request is kept until its requeue succeeded (one that a restart
//! dropped or whose statement failed runs again at the next sweep tick).
//! Every claim carries a token; a walk's writes and its settle hold only
//! while the token is the lead's. A walk that failed on our side has its
//! lead let go with a backoff, and set aside for an operator (with an
//! alert) after `routing.failure_limit` failures, so it never starves the
//! others. While routing, it renews the leases of its leads every third of
//! `routing.lease`. `Drain` (graceful shutdown) stops new routing, waits
//! for the waterfalls, and releases what is still held. A restart loses
//! nothing: the next sweep finds every waiting lead in the database.
//!
//! The actor, its messages and handlers are `actor`; taking leads (claims
//! by id, sweeps, leases) is `claims`, letting them go `settle`, re-offers
//! `requeue` (with their bookkeeping, `reoffers`), and the most waterfalls
//! at once `widest`.

mod actor;
mod claims;
mod reoffers;
mod requeue;
mod settle;
mod widest;

pub use actor::{ApplyBuyers, Drain, RouteLeads, Router};
pub use widest::widest;

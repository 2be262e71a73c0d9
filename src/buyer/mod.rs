//! What one call to a buyer is: the request, the verdict on the answer, the
//! call recorded as history, the concurrency slots, opening hours, the
//! circuit breaker,
//! and the shared status board. The `Buyer` actor in
//! `actors::buyer` puts these together.

pub mod accept;
pub mod board;
pub mod breaker;
pub mod call;
pub mod latency;
pub mod recorded_call;
pub mod request;
pub mod schedule;
pub mod slots;

//! leadrouter: store-first lead intake and ping/post routing.
//!
//! A lead is written to the database before anything else happens, the
//! sender is answered at once with an acceptance contract, and only then is
//! the lead offered to buyers.
//!
//! # Layout
//! - [`config`]: settings from `leadrouter.toml`, validation, env overrides.
//! - [`demo`]: `leadrouter demo`, the embedded demo set-up.
//! - [`demo_inbox`]: the demo's manager inbox, a notify channel with a page.
//! - [`mock_buyer`]: `leadrouter mock-buyer`, a buyer API simulator.
//! - [`startup`]: [`startup::Application`] wires the store, actors and server.
//! - [`domain`]: lead states, the acceptance contract, parsing and normalising.
//! - [`store`]: every database query (sea-orm), SQLite and PostgreSQL alike.
//! - [`buyer`]: one call to a buyer: request, verdict, circuit breaker, schedule.
//! - [`clock`]: the time routing decisions are made at (fixed in tests).
//! - [`actors`]: the supervision tree: intake, router, buyers, waterfalls.
//! - [`spool`]: the durable journal intake uses while the database is down.
//! - [`notify`]: what a notify channel or event sink is sent, and how.
//! - [`alerts`]: alerts to the error log and the database.
//! - [`redact`]: what views show of configuration that may hold secrets.
//! - [`renormalize`]: `leadrouter renormalize`, fields re-derived from raw payloads.
//! - [`reload`]: configuration reload (admin endpoint and SIGHUP).
//! - [`routes`]: the HTTP API, one module per resource.
//! - [`metrics`]: the `/metrics` counters, histogram and gauges.
//! - [`client_ip`]: the client's address: the peer, or forwarded by a trusted proxy.
//! - [`rate_limit`]: token buckets per source and client IP, a bounded table.
//! - [`telemetry`]: tracing set-up (text or JSON on stderr) and the lead
//!   and attempt spans.
//! - [`threads`]: names the service's threads; routing's yield the CPU to intake's.
//! - [`verify_release`]: `leadrouter verify-release`, release evidence after a deploy.

pub mod actors;
pub mod alerts;
pub mod buyer;
pub mod client_ip;
pub mod clock;
pub mod config;
pub mod demo;
pub mod demo_inbox;
pub mod domain;
pub mod metrics;
pub mod mock_buyer;
pub mod notify;
pub mod rate_limit;
pub mod redact;
pub mod reload;
pub mod renormalize;
pub mod routes;
pub mod spool;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod threads;
pub mod verify_release;

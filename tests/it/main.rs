//! leadrouter's integration tests: one binary, a module per area. Every
//! scenario that touches the database runs on SQLite and on PostgreSQL
//! through one parameter (see `on_both_databases!`).

mod browser;
mod buyers;
mod helpers;
mod inbox;
mod process;
mod scratch_db;

mod admin;
mod claims;
mod config;
mod connections;
mod distribution;
mod form_helper;
mod group_commit;
mod intake;
mod intake_batches;
mod logs;
mod notify;
mod rate_limits;
mod reads;
mod recovery;
mod release;
mod resolve;
mod routing;
mod secrets;
mod selling;
mod snapshots;
mod status_page;

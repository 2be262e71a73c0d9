//! Database migrations of leadrouter, one file per change, run at start-up by
//! `leadrouter serve` and `leadrouter migrate` on SQLite and PostgreSQL alike.

pub use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

mod m20261129_000001_create_store;
mod m20261129_000002_create_alerts;
mod m20261129_000003_operations;
mod m20261201_000004_selling_invariants;
mod m20261201_000005_money;
mod m20261201_000006_deliveries;
mod m20261201_000007_lead_aliases;
mod m20261204_000008_status_figure_indexes;
mod m20261204_000009_attempts_fillfactor;
mod m20261205_000010_config_snapshots;
mod m20261206_000011_payload_statistics;
mod m20261207_000012_key_digests;
mod m20261207_000013_leads_accepted_at;
mod m20261207_000014_keys_unique_by_id;

/// Every migration, oldest first.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261129_000001_create_store::Migration),
            Box::new(m20261129_000002_create_alerts::Migration),
            Box::new(m20261129_000003_operations::Migration),
            Box::new(m20261201_000004_selling_invariants::Migration),
            Box::new(m20261201_000005_money::Migration),
            Box::new(m20261201_000006_deliveries::Migration),
            Box::new(m20261201_000007_lead_aliases::Migration),
            Box::new(m20261204_000008_status_figure_indexes::Migration),
            Box::new(m20261204_000009_attempts_fillfactor::Migration),
            Box::new(m20261205_000010_config_snapshots::Migration),
            Box::new(m20261206_000011_payload_statistics::Migration),
            Box::new(m20261207_000012_key_digests::Migration),
            Box::new(m20261207_000013_leads_accepted_at::Migration),
            Box::new(m20261207_000014_keys_unique_by_id::Migration),
        ]
    }
}

/// Runs `sql` on PostgreSQL only: storage parameters and planner settings
/// that SQLite does not have.
async fn on_postgres(manager: &SchemaManager<'_>, sql: &str) -> Result<(), DbErr> {
    if manager.get_database_backend() == DbBackend::Postgres {
        manager.get_connection().execute_unprepared(sql).await?;
    }
    Ok(())
}

//! PostgreSQL collects no planner statistics for the payload columns: the
//! raw bodies, normalised fields, attribution and errors of leads, the
//! requests and answers of attempts, and the bodies of the intake log. No
//! query filters, sorts or joins on them, so their statistics only cost:
//! `ANALYZE` (autovacuum's, and the one the store runs when a backlog
//! builds up) sorted and compared thousands of sampled JSON documents and
//! bodies, most of its time (measured on 48,000 leads and 192,000
//! attempts: 0.35x the time with them left out), and kept their most
//! common values, personal data among them, in `pg_statistic`. SQLite
//! keeps no such statistics: nothing to do there.

use sea_orm_migration::prelude::*;

use crate::on_postgres;

/// Each table's payload columns.
const PAYLOADS: [(&str, &[&str]); 3] = [
    ("leads", &["raw", "fields", "attribution", "errors"]),
    ("attempts", &["request", "response_body"]),
    ("intake_log", &["body"]),
];

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        set_statistics_target(manager, 0).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        set_statistics_target(manager, -1).await
    }
}

/// Sets the payload columns' statistics target: 0 collects none, -1 is
/// the default.
async fn set_statistics_target(manager: &SchemaManager<'_>, target: i32) -> Result<(), DbErr> {
    for (table, columns) in PAYLOADS {
        let alters: Vec<String> = columns
            .iter()
            .map(|column| format!("ALTER COLUMN {column} SET STATISTICS {target}"))
            .collect();
        on_postgres(
            manager,
            &format!("ALTER TABLE {table} {}", alters.join(", ")),
        )
        .await?;
    }
    Ok(())
}

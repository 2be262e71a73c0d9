//! PostgreSQL keeps room in each page of `attempts` (fillfactor 70) for the
//! one update every call's row gets: its answer, onto the `in_flight` row
//! written before the call. With full pages (the default) the new version
//! went to another page, and each answer wrote a new entry into every index
//! of `attempts` (86% of answers in a routing bench run); kept on its page,
//! the update is a heap-only tuple, and no index changes (no indexed column
//! does). SQLite updates rows in place: nothing to do there.

use sea_orm_migration::prelude::*;

use crate::on_postgres;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_postgres(manager, "ALTER TABLE attempts SET (fillfactor = 70)").await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        on_postgres(manager, "ALTER TABLE attempts RESET (fillfactor)").await
    }
}

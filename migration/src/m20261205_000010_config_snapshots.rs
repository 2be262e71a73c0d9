//! Each configuration an attempt used is stored once, in `config_snapshots`,
//! and attempts name it (`snapshot_id`) instead of each carrying a copy: a
//! buyer's table is the same for every call made to it until the
//! configuration changes, and the copy was a third of every attempt row
//! (about 384 of 1,156 bytes), parsed, written to the log and copied again
//! at each answer. The attempts already stored keep their configurations:
//! each distinct one becomes a row, named by the first attempt that used it
//! (new ones are named by the SHA-256 of their JSON text).

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::{json_binary, string};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(ConfigSnapshots::Table)
                    .col(string(ConfigSnapshots::Id).primary_key())
                    .col(json_binary(ConfigSnapshots::Snapshot))
                    .to_owned(),
            )
            .await?;
        // Every row is given its name below; the default is only what
        // adding a NOT NULL column to a filled table takes on SQLite.
        manager
            .alter_table(
                Table::alter()
                    .table(Attempts::Table)
                    .add_column(string(Attempts::SnapshotId).default(""))
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        db.execute_unprepared(
            "INSERT INTO config_snapshots (id, snapshot) \
             SELECT MIN(id), snapshot FROM attempts GROUP BY snapshot",
        )
        .await?;
        db.execute_unprepared(
            "UPDATE attempts SET snapshot_id = config_snapshots.id FROM config_snapshots \
             WHERE config_snapshots.snapshot = attempts.snapshot",
        )
        .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Attempts::Table)
                    .drop_column(Attempts::Snapshot)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Attempts::Table)
                    .add_column(json_binary(Attempts::Snapshot).default("{}"))
                    .to_owned(),
            )
            .await?;
        manager
            .get_connection()
            .execute_unprepared(
                "UPDATE attempts SET snapshot = config_snapshots.snapshot FROM config_snapshots \
                 WHERE config_snapshots.id = attempts.snapshot_id",
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Attempts::Table)
                    .drop_column(Attempts::SnapshotId)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(ConfigSnapshots::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum ConfigSnapshots {
    Table,
    Id,
    Snapshot,
}

#[derive(DeriveIden)]
enum Attempts {
    Table,
    Snapshot,
    SnapshotId,
}

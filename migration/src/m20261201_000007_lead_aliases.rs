//! `lead_aliases`: an id a sender was given for a lead held in the spool
//! that, when the spool drained, turned out to be a replay of a key already
//! stored. The id stays a working handle: it names that lead.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(LeadAliases::Table)
                    .col(string(LeadAliases::AliasId).primary_key())
                    .col(string(LeadAliases::LeadId))
                    .col(timestamp_with_time_zone(LeadAliases::CreatedAt))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(LeadAliases::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum LeadAliases {
    Table,
    AliasId,
    LeadId,
    CreatedAt,
}

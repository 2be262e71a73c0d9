//! `alerts`: every alert raised (circuit changes, post timeouts, ...), kept
//! so operators can list them even when no webhook is configured.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Alerts::Table)
                    .if_not_exists()
                    .col(string(Alerts::Id).primary_key())
                    .col(string(Alerts::Kind))
                    .col(string_null(Alerts::BuyerId))
                    .col(string_null(Alerts::LeadId))
                    .col(text(Alerts::Message))
                    .col(timestamp_with_time_zone(Alerts::CreatedAt))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(Alerts::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Alerts {
    Table,
    Id,
    Kind,
    BuyerId,
    LeadId,
    Message,
    CreatedAt,
}

//! `leads_accepted_at`: leads by when their contract was accepted. The
//! couriers of `lead.accepted` events plan a page at a time in that order
//! from where they stopped, every second; without it each plan read every
//! lead ever stored.

use sea_orm_migration::prelude::*;

const ACCEPTED_AT: &str = "leads_accepted_at";

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name(ACCEPTED_AT)
                    .table(Leads::Table)
                    .col(Leads::AcceptedAt)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name(ACCEPTED_AT)
                    .table(Leads::Table)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Leads {
    Table,
    AcceptedAt,
}

//! `sales.payout`: what the lead's source is paid for the sale (its
//! `payout`, or its `payout_share` of the price), fixed when the sale is
//! made, so reports sum it in the database whatever the configuration
//! says later. A return reverses it with the sale.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(Sales::Table)
                    .add_column(double_null(Sales::Payout))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("sales_sold_at")
                    .table(Sales::Table)
                    .col(Sales::SoldAt)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("sales_sold_at")
                    .table(Sales::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Sales::Table)
                    .drop_column(Sales::Payout)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Sales {
    Table,
    Payout,
    SoldAt,
}

//! `leads_set_aside`: the leads set aside for an operator, indexed on their
//! own. The review count the status views read every second found them by
//! scanning every lead ever stored (about 120 ms at 500,000 leads on
//! PostgreSQL); with this partial index it reads only them.

use sea_orm_migration::prelude::*;

const NAME: &str = "leads_set_aside";

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name(NAME)
                    .table(Leads::Table)
                    .col(Leads::Id)
                    .and_where(Expr::col(Leads::SetAsideReason).is_not_null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name(NAME).table(Leads::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Leads {
    Table,
    Id,
    SetAsideReason,
}

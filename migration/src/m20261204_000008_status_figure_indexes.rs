//! Indexes for the figures the status views read every second, so that
//! they grow with the day's work, not with everything ever stored:
//! - `leads_set_aside`: the leads set aside for an operator, on their own
//!   (the review count scanned every lead: about 120 ms at 500,000 leads
//!   on PostgreSQL);
//! - `attempts_started_at`: attempts by the time they began (each buyer's
//!   outcome counts of the last day read every attempt ever made: 285-375
//!   ms at 2,000,000 attempts, 25 ms with it).

use sea_orm_migration::prelude::*;

const SET_ASIDE: &str = "leads_set_aside";
const STARTED_AT: &str = "attempts_started_at";

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                Index::create()
                    .name(SET_ASIDE)
                    .table(Leads::Table)
                    .col(Leads::Id)
                    .and_where(Expr::col(Leads::SetAsideReason).is_not_null())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name(STARTED_AT)
                    .table(Attempts::Table)
                    .col(Attempts::StartedAt)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name(SET_ASIDE).table(Leads::Table).to_owned())
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name(STARTED_AT)
                    .table(Attempts::Table)
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum Leads {
    Table,
    Id,
    SetAsideReason,
}

#[derive(DeriveIden)]
enum Attempts {
    Table,
    StartedAt,
}

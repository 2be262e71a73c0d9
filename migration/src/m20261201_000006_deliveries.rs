//! Accountable delivery (SPEC section 7, notify channels and events):
//! `deliveries`, one row per lead and notify channel (or per lead, event
//! sink and event), which decides in the database that a confirmed
//! delivery is never sent again; and `leads.accepted_at`, when the lead's
//! contract became `accepted`, so `lead.accepted` is sent only then.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Deliveries::Table)
                    .col(string(Deliveries::LeadId))
                    .col(string(Deliveries::Target))
                    .col(string(Deliveries::Kind))
                    .col(string(Deliveries::Channel))
                    .col(string_null(Deliveries::Event))
                    .col(string(Deliveries::State))
                    .col(integer(Deliveries::Tries).default(0))
                    .col(timestamp_with_time_zone(Deliveries::NextTryAt))
                    .col(timestamp_with_time_zone_null(Deliveries::LeaseUntil))
                    .col(string_null(Deliveries::ClaimToken))
                    .col(timestamp_with_time_zone(Deliveries::CreatedAt))
                    .col(timestamp_with_time_zone_null(Deliveries::ConfirmedAt))
                    .col(string_null(Deliveries::LastError))
                    .primary_key(
                        Index::create()
                            .col(Deliveries::LeadId)
                            .col(Deliveries::Target),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("deliveries_due")
                    .table(Deliveries::Table)
                    .col(Deliveries::Target)
                    .col(Deliveries::State)
                    .col(Deliveries::NextTryAt)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("deliveries_state")
                    .table(Deliveries::Table)
                    .col(Deliveries::State)
                    .col(Deliveries::LeadId)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Leads::Table)
                    .add_column(timestamp_with_time_zone_null(Leads::AcceptedAt))
                    .to_owned(),
            )
            .await?;
        // Leads stored before notify channels worked were answered
        // `accepted` when valid: keep that.
        manager
            .exec_stmt(
                Query::update()
                    .table(Leads::Table)
                    .value(Leads::AcceptedAt, Expr::col(Leads::ReceivedAt))
                    .and_where(Expr::col(Leads::State).ne("invalid"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("leads_updated_at")
                    .table(Leads::Table)
                    .col(Leads::UpdatedAt)
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("leads_updated_at")
                    .table(Leads::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Leads::Table)
                    .drop_column(Leads::AcceptedAt)
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(Deliveries::Table).to_owned())
            .await
    }
}

#[derive(DeriveIden)]
enum Deliveries {
    Table,
    LeadId,
    Target,
    Kind,
    Channel,
    Event,
    State,
    Tries,
    NextTryAt,
    LeaseUntil,
    ClaimToken,
    CreatedAt,
    ConfirmedAt,
    LastError,
}

#[derive(DeriveIden)]
enum Leads {
    Table,
    AcceptedAt,
    ReceivedAt,
    State,
    UpdatedAt,
}

//! The store: intake log, leads, same-person match keys, attempts and sales.
//!
//! Dedupe lives here, not in code: `leads (source_id, idempotency_key)` and
//! `sales (lead_id)` are unique indexes, so a duplicate is a database answer.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(IntakeLog::Table)
                    .if_not_exists()
                    .col(string(IntakeLog::Id).primary_key())
                    .col(string(IntakeLog::LeadId))
                    .col(string_null(IntakeLog::SourceId))
                    .col(string(IntakeLog::ContentType))
                    .col(string_null(IntakeLog::RemoteIp))
                    .col(string_null(IntakeLog::IdempotencyKey))
                    .col(blob(IntakeLog::Body))
                    .col(timestamp_with_time_zone(IntakeLog::ReceivedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("intake_log_lead_id")
                    .table(IntakeLog::Table)
                    .col(IntakeLog::LeadId)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Leads::Table)
                    .if_not_exists()
                    .col(string(Leads::Id).primary_key())
                    .col(string(Leads::SourceId))
                    .col(string_null(Leads::IdempotencyKey))
                    .col(string_null(Leads::ExternalId))
                    .col(string(Leads::State))
                    .col(blob(Leads::Raw))
                    .col(string(Leads::RawContentType))
                    .col(json_binary(Leads::Fields))
                    .col(json_binary(Leads::Attribution))
                    .col(boolean(Leads::IsTest))
                    .col(json_binary(Leads::Errors))
                    .col(string_null(Leads::DuplicateOf))
                    .col(boolean(Leads::ManagerNotified))
                    .col(boolean(Leads::CrmSynced))
                    .col(string_null(Leads::LeaseOwner))
                    .col(timestamp_with_time_zone_null(Leads::LeaseUntil))
                    .col(timestamp_with_time_zone(Leads::ReceivedAt))
                    .col(timestamp_with_time_zone(Leads::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("leads_source_idempotency_key")
                    .table(Leads::Table)
                    .col(Leads::SourceId)
                    .col(Leads::IdempotencyKey)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("leads_state_received_at")
                    .table(Leads::Table)
                    .col(Leads::State)
                    .col(Leads::ReceivedAt)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(LeadMatchKeys::Table)
                    .if_not_exists()
                    .col(string(LeadMatchKeys::Name))
                    .col(string(LeadMatchKeys::Value))
                    .col(string(LeadMatchKeys::LeadId))
                    .col(timestamp_with_time_zone(LeadMatchKeys::ReceivedAt))
                    .primary_key(
                        Index::create()
                            .col(LeadMatchKeys::Name)
                            .col(LeadMatchKeys::Value)
                            .col(LeadMatchKeys::LeadId),
                    )
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Attempts::Table)
                    .if_not_exists()
                    .col(string(Attempts::Id).primary_key())
                    .col(string(Attempts::LeadId))
                    .col(string(Attempts::BuyerId))
                    .col(string(Attempts::Kind))
                    .col(string(Attempts::Outcome))
                    .col(string_null(Attempts::Reason))
                    .col(integer_null(Attempts::HttpStatus))
                    .col(timestamp_with_time_zone(Attempts::StartedAt))
                    .col(big_integer_null(Attempts::DurationMs))
                    .col(string_null(Attempts::RetryOf))
                    .col(json_binary(Attempts::Request))
                    .col(text_null(Attempts::ResponseBody))
                    .col(json_binary(Attempts::Snapshot))
                    .col(double_null(Attempts::Bid))
                    .col(string_null(Attempts::PingId))
                    .col(string_null(Attempts::InstanceId))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("attempts_lead_id_started_at")
                    .table(Attempts::Table)
                    .col(Attempts::LeadId)
                    .col(Attempts::StartedAt)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Sales::Table)
                    .if_not_exists()
                    .col(string(Sales::Id).primary_key())
                    .col(string(Sales::LeadId))
                    .col(string(Sales::BuyerId))
                    .col(string_null(Sales::AttemptId))
                    .col(double_null(Sales::Price))
                    .col(timestamp_with_time_zone(Sales::SoldAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("sales_lead_id")
                    .table(Sales::Table)
                    .col(Sales::LeadId)
                    .unique()
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            Sales::Table.into_iden(),
            Attempts::Table.into_iden(),
            LeadMatchKeys::Table.into_iden(),
            Leads::Table.into_iden(),
            IntakeLog::Table.into_iden(),
        ] {
            manager
                .drop_table(Table::drop().table(table).to_owned())
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum IntakeLog {
    Table,
    Id,
    LeadId,
    SourceId,
    ContentType,
    RemoteIp,
    IdempotencyKey,
    Body,
    ReceivedAt,
}

#[derive(DeriveIden)]
enum Leads {
    Table,
    Id,
    SourceId,
    IdempotencyKey,
    ExternalId,
    State,
    Raw,
    RawContentType,
    Fields,
    Attribution,
    IsTest,
    Errors,
    DuplicateOf,
    ManagerNotified,
    CrmSynced,
    LeaseOwner,
    LeaseUntil,
    ReceivedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum LeadMatchKeys {
    Table,
    Name,
    Value,
    LeadId,
    ReceivedAt,
}

#[derive(DeriveIden)]
enum Attempts {
    Table,
    Id,
    LeadId,
    BuyerId,
    Kind,
    Outcome,
    Reason,
    HttpStatus,
    StartedAt,
    DurationMs,
    RetryOf,
    Request,
    ResponseBody,
    Snapshot,
    Bid,
    PingId,
    InstanceId,
}

#[derive(DeriveIden)]
enum Sales {
    Table,
    Id,
    LeadId,
    BuyerId,
    AttemptId,
    Price,
    SoldAt,
}

//! What the selling invariants need: a fencing token on each claim
//! (`leads.claim_token`), the routing-failure count, backoff and set-aside
//! reason of poison leads, cap counters that posts reserve (`cap_use`), and
//! `person_keys`, one row per duplicate-key value naming the routable lead
//! that owns it (a unique claim, so same-person matching is decided by the
//! database). Skip rows keep their reason as their outcome.

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite adds one at a time.
        for column in [
            string_null(Leads::ClaimToken),
            integer(Leads::RouteFailures).default(0).to_owned(),
            timestamp_with_time_zone_null(Leads::RouteAfter),
            text_null(Leads::SetAsideReason),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Leads::Table)
                        .add_column(column)
                        .to_owned(),
                )
                .await?;
        }

        manager
            .create_table(
                Table::create()
                    .table(CapUse::Table)
                    .if_not_exists()
                    .col(string(CapUse::BuyerId))
                    .col(string(CapUse::Period))
                    .col(timestamp_with_time_zone(CapUse::PeriodStart))
                    .col(integer(CapUse::Used))
                    .primary_key(
                        Index::create()
                            .col(CapUse::BuyerId)
                            .col(CapUse::Period)
                            .col(CapUse::PeriodStart),
                    )
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(PersonKeys::Table)
                    .if_not_exists()
                    .col(string(PersonKeys::Name))
                    .col(string(PersonKeys::Value))
                    .col(string(PersonKeys::LeadId))
                    .col(timestamp_with_time_zone(PersonKeys::ReceivedAt))
                    .primary_key(Index::create().col(PersonKeys::Name).col(PersonKeys::Value))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("person_keys_lead_id")
                    .table(PersonKeys::Table)
                    .col(PersonKeys::LeadId)
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        // Each value is owned by the latest routable lead that had it.
        db.execute_unprepared(
            "INSERT INTO person_keys (name, value, lead_id, received_at) \
             SELECT m.name, m.value, m.lead_id, m.received_at FROM lead_match_keys m \
             WHERE NOT EXISTS (SELECT 1 FROM lead_match_keys o WHERE o.name = m.name \
               AND o.value = m.value AND (o.received_at > m.received_at \
               OR (o.received_at = m.received_at AND o.lead_id > m.lead_id)))",
        )
        .await?;
        manager
            .drop_table(Table::drop().table(LeadMatchKeys::Table).to_owned())
            .await?;
        db.execute_unprepared(
            "UPDATE attempts SET outcome = reason WHERE kind = 'skip' AND outcome = 'skipped' \
             AND reason IS NOT NULL",
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared("UPDATE attempts SET outcome = 'skipped' WHERE kind = 'skip'")
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
        db.execute_unprepared(
            "INSERT INTO lead_match_keys (name, value, lead_id, received_at) \
             SELECT name, value, lead_id, received_at FROM person_keys",
        )
        .await?;
        for table in [PersonKeys::Table.into_iden(), CapUse::Table.into_iden()] {
            manager
                .drop_table(Table::drop().table(table).to_owned())
                .await?;
        }
        for column in [
            Leads::ClaimToken.into_iden(),
            Leads::RouteFailures.into_iden(),
            Leads::RouteAfter.into_iden(),
            Leads::SetAsideReason.into_iden(),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table(Leads::Table)
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Leads {
    Table,
    ClaimToken,
    RouteFailures,
    RouteAfter,
    SetAsideReason,
}

#[derive(DeriveIden)]
enum CapUse {
    Table,
    BuyerId,
    Period,
    PeriodStart,
    Used,
}

#[derive(DeriveIden)]
enum PersonKeys {
    Table,
    Name,
    Value,
    LeadId,
    ReceivedAt,
}

#[derive(DeriveIden)]
enum LeadMatchKeys {
    Table,
    Name,
    Value,
    LeadId,
    ReceivedAt,
}

//! What operators need: `leads.history_from` (a reroute starts a new routing
//! history; older attempts no longer decide the lead) and
//! `leads.offer_tried` (that reroute may offer the lead again to buyers it
//! was posted to before), returns on `sales`
//! (`returned_at`, `return_reason`; the one-sale rule now holds among sales
//! not returned, through a partial unique index), and `alerts.notified`
//! (false when the alert was held back by `alerts.min_interval`).

use sea_orm_migration::{prelude::*, schema::*};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column per statement: SQLite adds one at a time.
        let add = |table: TableRef, column: ColumnDef| {
            Table::alter().table(table).add_column(column).to_owned()
        };
        manager
            .alter_table(add(
                Leads::Table.into_table_ref(),
                timestamp_with_time_zone_null(Leads::HistoryFrom),
            ))
            .await?;
        manager
            .alter_table(add(
                Leads::Table.into_table_ref(),
                boolean(Leads::OfferTried).default(false).to_owned(),
            ))
            .await?;
        manager
            .alter_table(add(
                Sales::Table.into_table_ref(),
                timestamp_with_time_zone_null(Sales::ReturnedAt),
            ))
            .await?;
        manager
            .alter_table(add(
                Sales::Table.into_table_ref(),
                text_null(Sales::ReturnReason),
            ))
            .await?;
        manager
            .alter_table(add(
                Alerts::Table.into_table_ref(),
                boolean(Alerts::Notified).default(true).to_owned(),
            ))
            .await?;
        manager
            .drop_index(
                Index::drop()
                    .name("sales_lead_id")
                    .table(Sales::Table)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("sales_lead_id_not_returned")
                    .table(Sales::Table)
                    .col(Sales::LeadId)
                    .unique()
                    .and_where(Expr::col(Sales::ReturnedAt).is_null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("sales_lead_id_not_returned")
                    .table(Sales::Table)
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
            .await?;
        for (table, column) in [
            (Leads::Table.into_iden(), Leads::HistoryFrom.into_iden()),
            (Leads::Table.into_iden(), Leads::OfferTried.into_iden()),
            (Sales::Table.into_iden(), Sales::ReturnedAt.into_iden()),
            (Sales::Table.into_iden(), Sales::ReturnReason.into_iden()),
            (Alerts::Table.into_iden(), Alerts::Notified.into_iden()),
        ] {
            manager
                .alter_table(Table::alter().table(table).drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Leads {
    Table,
    HistoryFrom,
    OfferTried,
}

#[derive(DeriveIden)]
enum Sales {
    Table,
    LeadId,
    ReturnedAt,
    ReturnReason,
}

#[derive(DeriveIden)]
enum Alerts {
    Table,
    Notified,
}
